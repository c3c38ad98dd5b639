"""Tuning through TVM's RPC tracker on loopback (docs/rpc.md): a tracker and two servers started
here, one of which dies at its third tuning candidate; the run still ends with every kernel
measured and names what it lost. Then the fleet checks and sharding."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc.schedules import cache, tuning
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
    """``relaxc tune --rpc`` of _mlp through the fleet: its summary, records root and servers."""
    address, servers = fleet
    folder = tmp_path_factory.mktemp("records")
    onnx.save(_mlp(), folder / "mlp.onnx")
    done = run_cli("tune", folder / "mlp.onnx", "--trials", 12, "--trials-per-task", 4, "--log-dir", folder / "store",
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
    art = relaxc.compile(_mlp(), target=device.target(), tuning="strict", cache_dir=log_dir)
    assert art.report()["tuning"]["missing"] == []
    inputs = reference.random_inputs(art.inputs)
    reference.assert_matches(art.run(inputs), reference.ort_run(_mlp(), inputs))


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
    cache.merge(halves[1], halves[0])
    summary = relaxc.tune(_mlp(), trials=0, cache_dir=halves[0])  # the selection, after the merge
    assert summary["selection"]["kernels_with_choice"] == summary["tasks"]
    assert relaxc.compile(_mlp(), tuning="strict", cache_dir=halves[0]).report()["tuning"]["missing"] == []
