"""Tuning through TVM's RPC tracker on loopback (docs/rpc.md): a tracker and two servers started
here, one of which dies at its third tuning candidate; the run still ends with every kernel
measured and names what it lost. Then the fleet checks and sharding. Last, one stock TVM server
started by docs/rpc.md's commands: each measurement's session ends before the next is requested,
and a run goes on through the server's restart."""

import dataclasses
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc.schedules import cache, maintenance, tuning
from relaxc.support import remote, targets, versions
from relaxc.support.errors import RemoteError, TargetError, UserError
from relaxc.support.threads import physical_cores
from tests import reference
from tests.helpers import ROOT, env, run_cli

pytest.importorskip("tornado", reason="the RPC tracker needs tornado (pip install 'relaxc[rpc]')")
from tvm.rpc.tracker import Tracker  # noqa: E402 - after the skip: it imports tornado

KEY = "relaxc-test"
DIE_AT = 3  # the dying server's tuning candidate at which it kills itself


def _mlp(seed: int = 0) -> onnx.ModelProto:
    """x @ W + b, ReLU, softmax: three kernels, quick to tune."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.standard_normal((64, 48)).astype("float32"), "w"),
               numpy_helper.from_array(rng.standard_normal(48).astype("float32"), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 48])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _server(tracker: Tracker, *extra) -> subprocess.Popen:
    threads = {"TVM_NUM_THREADS": str(physical_cores()), "TVM_BIND_THREADS": "0"}  # as docs/rpc.md starts them
    return subprocess.Popen([sys.executable, "-m", "tests.rpc_device", "--tracker", f"127.0.0.1:{tracker.port}",
                             "--key", KEY, *map(str, extra)], cwd=ROOT, env={**env(), **threads}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _wait_for(tracker: remote.Tracker, count: int) -> None:
    deadline = time.time() + 60
    while tracker.servers() != count:
        assert time.time() < deadline, f"{count} RPC servers did not register in a minute"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A tracker on a free loopback port with two servers under KEY, the second dying at DIE_AT."""
    tracker = Tracker("127.0.0.1", port=9190, port_end=9990, silent=True)
    address, servers = remote.Tracker("127.0.0.1", tracker.port, KEY), []
    count_file = tmp_path_factory.mktemp("device") / "candidates"
    try:
        servers += [_server(tracker), _server(tracker, "--die-at-candidate", DIE_AT, "--count-file", count_file)]
        _wait_for(address, 2)
        yield address, servers
    finally:
        for server in servers:
            server.kill()
            server.wait()
        tracker.terminate()


@pytest.fixture(scope="module")
def tuned_remotely(fleet, tmp_path_factory):
    """``relaxc tune --rpc`` of _mlp through the fleet: its summary, cache and servers."""
    address, servers = fleet
    folder = tmp_path_factory.mktemp("records")
    onnx.save(_mlp(), folder / "mlp.onnx")
    done = run_cli("tune", folder / "mlp.onnx", "--trials", 12, "--trials-per-task", 4, "--cache-dir", folder / "store",
                  "--rpc", f"127.0.0.1:{address.port}", "--rpc-key", KEY, "-q")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), str(folder / "store"), servers


def test_a_server_dying_mid_run_loses_only_its_measurement(tuned_remotely):
    summary, _, servers = tuned_remotely
    assert servers[1].wait(timeout=5) != 0  # it did die, at its DIE_AT-th candidate, with the run going on
    assert servers[0].poll() is None
    assert summary["measured_on"].startswith("RPC tracker 127.0.0.1:")
    assert summary["stopped"] == "done"
    assert summary["trials"] == summary["trials_budget"]  # the lost trial was measured again on the other server
    assert [entry["trials"] for entry in summary["lost"]] == [1]
    assert "RPC" in summary["lost"][0]["error"]
    assert summary["records_after"] == summary["defaults_recorded"] + summary["trials"]
    assert summary["selection"]["kernels_with_choice"] == summary["tasks"]  # selected on the servers too


def test_records_tuned_remotely_replay_strictly(tuned_remotely, fleet):
    """The store is that of the devices' target (here: this machine), and replays with tuning='strict'."""
    summary, log_dir, _ = tuned_remotely
    address, _ = fleet
    device = remote.probe(address)
    assert os.path.basename(summary["cache_dir"]) == cache.target_key(device.target())
    art = relaxc.compile(_mlp(), target=device.target(), tuning="strict", backends="relaxc", cache_dir=log_dir)
    assert art.report()["tuning"]["missing"] == []
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(_mlp(), inputs))


def test_probe_names_the_devices_cpu_cores_and_versions(fleet):
    address, _ = fleet
    device = remote.probe(address)
    assert device.cpu == targets.host_cpu()  # loopback: the devices are this machine
    assert device.cores == targets.cpuinfo_cores(open("/proc/cpuinfo").read())
    assert device.versions == {k: versions.code_versions()[k] for k in remote.CHECKED}
    assert (device.threads, device.bound) == (physical_cores(), False)


def test_a_fleet_of_two_kinds_or_other_versions_is_refused():
    tracker = remote.Tracker("127.0.0.1", 1, KEY)
    here = {k: versions.code_versions()[k] for k in remote.CHECKED}
    zen3, zen4 = (remote.Device(cpu, 2, targets.isa("llvm", cpu), here, 2, False) for cpu in ("znver3", "znver4"))
    assert remote.one_kind([zen3, zen3], tracker) == zen3
    with pytest.raises(RemoteError, match="not one kind of machine.*znver3 with 2 cores.*znver4"):
        remote.one_kind([zen3, zen4], tracker)
    with pytest.raises(RemoteError, match="with 2 cores.*with 4 cores"):
        remote.one_kind([zen3, dataclasses.replace(zen3, cores=4, threads=4)], tracker)
    with pytest.raises(RemoteError, match="runs 1 threads on 2 cores.*TVM_NUM_THREADS=2 TVM_BIND_THREADS=0"):
        remote.one_kind([dataclasses.replace(zen3, threads=1)], tracker)
    with pytest.raises(RemoteError, match="pinned to cores"):
        remote.one_kind([dataclasses.replace(zen3, bound=True)], tracker)
    older = dataclasses.replace(zen3, versions={**here, "tvm": "0.26.0"})
    with pytest.raises(RemoteError, match="runs tvm 0.26.0.*apache-tvm=="):
        remote.one_kind([zen3, older], tracker)


def test_rpc_mistakes_are_clear_errors(fleet, monkeypatch):
    address, _ = fleet
    with pytest.raises(RemoteError, match="no RPC server is registered under key 'nobody'"):
        relaxc.compile(_mlp(), rpc=f"127.0.0.1:{address.port}", rpc_key="nobody")
    with pytest.raises(UserError, match="give the tracker too"):
        relaxc.compile(_mlp(), rpc_key=KEY)
    for address_text in ("localhost", "localhost:0", "localhost:70000"):
        with pytest.raises(RemoteError, match="HOST:PORT"):
            relaxc.compile(_mlp(), rpc=address_text, rpc_key=KEY)
    other = "znver4" if targets.host_cpu() != "znver4" else "znver3"
    with pytest.raises(TargetError, match="belongs in that target's store"):
        relaxc.compile(_mlp(), target={"kind": "llvm", "mcpu": other}, rpc=f"127.0.0.1:{address.port}",
                         rpc_key=KEY)
    with pytest.raises(UserError, match="selection='sequence'"):
        relaxc.tune(_mlp(), trials=0, selection="sequence", rpc=f"127.0.0.1:{address.port}", rpc_key=KEY)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        nobody = closed.getsockname()[1]
    monkeypatch.setattr(remote.rpc, "connect_tracker", lambda *a: pytest.fail("TVM's connect retries for a minute"))
    with pytest.raises(RemoteError, match="cannot reach the RPC tracker"):
        relaxc.tune(_mlp(), trials=0, rpc=f"127.0.0.1:{nobody}", rpc_key=KEY)


def test_shards_split_the_kernels_and_select_after_the_merge(tmp_path):
    model = reference.small_cnn()
    tasks = tuning.tuning_tasks(relaxc.compile(model, tuning="off").module("fuse"), targets.resolve("cpu"))
    shares = [tuning.shard_of(tasks, i, 3) for i in range(3)]
    assert set().union(*shares) == {t.task_name for t in tasks}
    assert sum(len(share) for share in shares) == len(tasks)  # disjoint
    assert shares == [tuning.shard_of(list(reversed(tasks)), i, 3) for i in range(3)]  # by workload, not order
    with pytest.raises(UserError, match="I/N"):
        relaxc.tune(_mlp(), trials=0, shard="2/2")
    with pytest.raises(UserError, match="is empty"):
        relaxc.tune(_mlp(), trials=0, shard="7/8")

    halves = [str(tmp_path / f"shard{i}") for i in range(2)]
    for i, log_dir in enumerate(halves):
        summary = relaxc.tune(_mlp(), trials=4, trials_per_task=1, shard=f"{i}/2", cache_dir=log_dir)
        assert summary["selection"]["selected"] == 0
    maintenance.merge(halves[1], halves[0])
    summary = relaxc.tune(_mlp(), trials=0, cache_dir=halves[0])  # the selection, after the merge
    assert summary["selection"]["kernels_with_choice"] == summary["tasks"]
    assert relaxc.compile(_mlp(), tuning="strict", backends="relaxc",
                          cache_dir=halves[0]).report()["tuning"]["missing"] == []


def _documented_commands(port: int) -> dict[str, list[str]]:
    """docs/rpc.md's commands starting the tracker and a device, as they are written there, on ``port``
    and KEY, the device's threads this machine's cores."""
    with open(os.path.join(ROOT, "docs", "rpc.md")) as f:
        text = f.read()
    commands = {}
    for name, module in (("tracker", "tvm.exec.rpc_tracker"), ("server", "tvm.exec.rpc_server")):
        line = next(line for line in text.splitlines() if f"python -m {module} " in line)
        line = line.replace("9190", str(port)).replace("9191", str(port + 1)).replace("zen4-16c", KEY)
        commands[name] = line.replace("TVM_NUM_THREADS=16", f"TVM_NUM_THREADS={physical_cores()}").split()
    return commands


def _start(command: list[str]) -> subprocess.Popen:
    """``VAR=VALUE ... python ARGS`` run as the shell would, with this Python."""
    start = next(i for i, word in enumerate(command) if word == "python")
    variables = dict(word.split("=", 1) for word in command[:start])
    return subprocess.Popen([sys.executable, *command[start + 1:]], cwd=ROOT, env={**env(), **variables},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _kill(process: subprocess.Popen) -> None:
    """The process and those it started (TVM's server listens in a child of its own)."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture
def one_device():
    """A tracker and exactly one stock TVM RPC server, started by docs/rpc.md's commands; the server
    can be replaced (``restart``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    commands = _documented_commands(port)
    address, processes = remote.Tracker("127.0.0.1", port, KEY), {"tracker": _start(commands["tracker"])}

    def restart() -> None:
        if "server" in processes:
            _kill(processes["server"])
            _wait_for(address, 0)
        processes["server"] = _start(commands["server"])
        _wait_for(address, 1)

    try:
        deadline = time.time() + 30
        while True:
            try:
                address.connect()
                break
            except RemoteError:
                assert time.time() < deadline, "the tracker did not start in 30 s"
                time.sleep(0.2)
        restart()
        yield address, restart
    finally:
        for process in processes.values():
            _kill(process)


def _free(address: remote.Tracker, within_s: float = 10) -> bool:
    """Whether the one server under the key is free again (its session ended) within ``within_s``."""
    deadline = time.time() + within_s
    while time.time() < deadline:
        if address.connect().summary()["queue_info"].get(KEY, {}).get("free") == 1:
            return True
        time.sleep(0.1)
    return False


def test_a_measurement_ends_its_session_however_it_ends(one_device):
    """Without the garbage collector, and with what was put on the server held by a reference cycle
    or by the traceback of the error the measurement raised: the server is free again as soon as
    on_bench returns, so the next measurement gets it; the same after the server was replaced."""
    address, restart = one_device

    def kept_in_a_cycle(bench: remote.Bench) -> int:
        bench.evict_caches()  # a kernel and its tensor on the server, held by the bench
        cycle = [tvm.runtime.empty((4,), "float32", bench.device)]
        cycle.append(cycle)
        return 1

    def raising(bench: remote.Bench) -> int:
        held = tvm.runtime.empty((4,), "float32", bench.device)  # noqa: F841 - in the traceback's frame
        raise ValueError("the kernel's own error")

    enabled = gc.isenabled()
    gc.disable()
    try:
        with remote.measuring_on(address):
            for replaced in (False, True):
                if replaced:
                    restart()
                assert remote.on_bench(kept_in_a_cycle, "a kernel") == 1
                assert _free(address)
                with pytest.raises(ValueError, match="own error"):
                    remote.on_bench(raising, "a kernel")
                assert _free(address)
        assert remote.probe(address).cores == physical_cores()
        assert _free(address)
    finally:
        if enabled:
            gc.enable()


@pytest.mark.slow
def test_tuning_with_one_device_measures_everything_and_replays(one_device, tmp_path):
    """``relaxc tune --rpc`` of a model with 3x3 convolutions (their dispatch measured) on one server,
    the tuner's garbage collector off: every session (probe, dispatch, defaults, trials, selection)
    ends before the next is requested. The server is killed and restarted after the first dispatch
    measurement: the run waits for it and goes on."""
    address, restart = one_device
    model = reference.small_cnn()
    onnx.save(model, tmp_path / "cnn.onnx")
    store = tmp_path / "store"
    command = ["tune", tmp_path / "cnn.onnx", "--trials", 6, "--trials-per-task", 2, "--cache-dir", store,
               "--rpc", f"127.0.0.1:{address.port}", "--rpc-key", KEY, "-q"]
    without_gc = "import gc, sys; gc.disable(); from relaxc.cli import main; sys.exit(main(sys.argv[1:]))"
    with open(tmp_path / "stdout", "w+") as out, open(tmp_path / "stderr", "w+") as err:
        tuner = subprocess.Popen([sys.executable, "-c", without_gc, *map(str, command)], cwd=ROOT, env=env(),
                                 stdout=out, stderr=err)
        try:
            deadline = time.time() + 120
            while not list(store.glob("*/dispatch.json")) and tuner.poll() is None:
                assert time.time() < deadline, "no dispatch measurement in 2 minutes"
                time.sleep(0.1)
            restart()
            assert tuner.wait(timeout=300) == 0, err.seek(0) or err.read()[-3000:]
        finally:
            tuner.kill()
        out.seek(0)
        summary = json.loads(out.read())
    assert (summary["stopped"], summary["trials"]) == ("done", 6)
    assert summary["records_after"] == summary["defaults_recorded"] + summary["trials"]
    art = relaxc.compile(model, target=remote.probe(address).target(), tuning="strict", backends="relaxc",
                         cache_dir=str(store))
    assert art.report()["tuning"]["missing"] == []
    assert len(art.report()["dispatch"]["convolutions"]) == 2  # both 3x3 convolutions, dispatch replayed
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(reference.relaxc_run(art, inputs), reference.ort_run(model, inputs))
