"""What relaxc builds, as digests: to show that a change of the code leaves every build bit-identical.

    .venv/bin/python -m relaxc.benchmarks.digest before.json                     # on the old tree
    .venv/bin/python -m relaxc.benchmarks.digest after.json --compare before.json  # on the new one

For each bundled model (weights randomised with a fixed seed, so outputs differ from model to model)
with the default options, and for the models with committed tuning records replayed strictly on
their target: sha256 of the final IR (TVMScript), of the outputs on a fixed input, and of the report
without timings. ``--compare`` prints SAME or DIFF per case and exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import onnx

import relaxc
from relaxc.frontend import models
from relaxc.runtime.runner import random_inputs
from relaxc.benchmarks.reference import randomize_weights

ZNVER3 = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}  # the target of tuning_logs/llvm-znver3-2c
CASES = ([(f"onnx:{name}", "cpu", "replay") for name in models.BUNDLED]
         + [(f"onnx:{name}", ZNVER3, "strict") for name in ("resnet50", "squeezenet", "inception_v2")])


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def digest(spec: str, target, tuning: str) -> dict[str, str]:
    backends = "rule" if tuning == "strict" else "replay"  # strict: the committed stores hold no partitions
    art = relaxc.compile(randomize_weights(onnx.load(models.bundled_path(spec))), target=target, tuning=tuning,
                         backends=backends)
    outputs = art.run(random_inputs(art.inputs))
    report = art.report()
    for timing in ("phases", "compile_seconds"):
        report.pop(timing)
    for where in ("cache_dir", "shipped"):  # where the records are: the user's cache, the checkout
        report["tuning"].pop(where, None)
    return {"ir": _sha(art.ir("final").encode()), "outputs": _sha(b"".join(o.tobytes() for o in outputs)),
            "report": _sha(json.dumps(report, sort_keys=True).encode())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="JSON file to write the digests to")
    parser.add_argument("--compare", metavar="JSON", help="digests of another tree to compare with")
    args = parser.parse_args(argv)
    results = {}
    for spec, target, tuning in CASES:
        key = f"{spec} {json.dumps(target)} {tuning}"
        results[key] = digest(spec, target, tuning)
        print(key, *results[key].values(), flush=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    if not args.compare:
        return 0
    with open(args.compare) as f:
        other = json.load(f)
    differ = [key for key in results
              if any(other.get(key, {}).get(field) != value for field, value in results[key].items())]
    for key in results:
        print("DIFF" if key in differ else "SAME", key)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
