"""Tuning throughput here and through TVM's RPC tracker on loopback (``python -m relaxc.benchmarks.rpc_tuning``).

    .venv/bin/python -m relaxc.benchmarks.rpc_tuning onnx:resnet50 [--trials 128] [--servers 0 1 2]

Tunes the same kernels of a model (its convolutions, unless ``--kernels`` says) from an empty store
once per setting: measured on this machine
(0 servers), then through a tracker with 1 and 2 servers on this machine, and prints the tuning
rate (trials per minute of the tuning rounds: search, build, measurement) and where a trial's time
went, from MetaSchedule's profiler: choosing candidates (search) and building them stay on the
build machine; measuring them is what RPC servers share. On N devices a trial then costs about
search + build + measure / N (while N is below the batch of 64). On loopback the servers share
this machine's cores with the build, which bounds what a second server can add.
"""

from __future__ import annotations

import argparse
import json
import tempfile

from tvm import rpc
from tvm.rpc.tracker import Tracker
from tvm.s_tir import meta_schedule as ms

import relaxc
from relaxc.benchmarks.bench import cpu_model
from relaxc.support.targets import host_cpu
from relaxc.support.threads import configure_threads

KEY = "relaxc-bench"
# the part of a trial -> the prefixes of MetaSchedule's profiler scopes that time it (a local runner
# measures while it is sent candidates, an RPC runner while its futures are joined)
PARTS = {"search": ("EvoSearch/", "MeasureCallback/UpdateCostModel"), "build": ("SendToBuilder",),
         "measure": ("SendToRunner", "JoinRunnerFutures")}
DEVICES = (1, 2, 4, 8, 16)  # fleets the rate is predicted for


def tune_once(model: str, trials: int, kernels: list[str], servers: int) -> dict:
    """One tuning run from an empty store, measured here (``servers`` 0) or through a loopback tracker
    with that many servers; its summary and MetaSchedule's profile."""
    tracker = Tracker("127.0.0.1", port=9190, port_end=9990, silent=True) if servers else None
    started = [rpc.Server("127.0.0.1", port=9100, port_end=9990, key=KEY, tracker_addr=("127.0.0.1", tracker.port),
                          silent=True) for _ in range(servers)]
    options = {"rpc": f"127.0.0.1:{tracker.port}", "rpc_key": KEY} if servers else {}
    try:
        with tempfile.TemporaryDirectory() as store, ms.Profiler() as profiler:
            summary = relaxc.tune(model, trials=trials, kernels=kernels, cache_dir=store, **options)
        profile = {name: float(seconds) for name, seconds in profiler.get().items()}
    finally:
        for server in started:
            server.terminate()
        if tracker is not None:
            tracker.terminate()
    return {"summary": summary, "profile": profile}


def split(result: dict) -> dict[str, float]:
    """Seconds per trial in each part (``PARTS``) and in all."""
    trials = max(1, result["summary"]["trials"])
    parts = {part: sum(seconds for scope, seconds in result["profile"].items() if scope.startswith(prefixes))
                   / trials for part, prefixes in PARTS.items()}
    rate = result["summary"].get("trials_per_minute")
    parts["all"] = 60.0 / rate if rate else float("nan")  # nothing tuned: no rate
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--servers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--kernels", nargs="+", default=["fused_conv2d*"], help="kernels to tune (globs)")
    parser.add_argument("--json", help="also write every run's summary and profile here")
    args = parser.parse_args()
    configure_threads()  # the servers inherit relaxc's thread settings, as docs/rpc.md starts them
    results = {n: tune_once(args.model, args.trials, args.kernels, n) for n in args.servers}
    print(f"{args.model} ({' '.join(args.kernels)}), {args.trials} trials from an empty store; build machine "
          f"{cpu_model()} (LLVM {host_cpu()}), servers on the same machine (loopback)\n")
    print("| measured on | trials | trials/min | s/trial | search | build | measure |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, result in results.items():
        parts, summary = split(result), result["summary"]
        where = "this machine" if n == 0 else f"{n} RPC server{'s' if n > 1 else ''}"
        print(f"| {where} | {summary['trials']} | {summary.get('trials_per_minute') or 0:.1f} | {parts['all']:.2f} | "
              f"{parts['search']:.2f} | {parts['build']:.2f} | {parts['measure']:.2f} |")
    if 1 in results:
        one = split(results[1])
        local = one["search"] + one["build"]
        print(f"\nPredicted on N devices, from the 1-server run: 60 / ({local:.2f} s search and build here "
              f"+ {one['measure']:.2f} s measurement / N) trials per minute:\n")
        print("| devices | " + " | ".join(str(n) for n in DEVICES) + " |")
        print("| --- |" + " ---: |" * len(DEVICES))
        print("| trials/min | " + " | ".join(f"{60 / (local + one['measure'] / n):.0f}" for n in DEVICES) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(n): r for n, r in results.items()}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
