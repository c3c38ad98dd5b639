"""schedules/sequence.py's parts on stand-in kernels (Python callables): a candidate whose outputs
differ is dropped, and candidates take turns inside the model's sequence, each timed as the sum of
its kernel's calls. The whole selection on a tuned model is in tests/test_tuning.py."""

import numpy as np
import pytest
import tvm

from relaxc.schedules import sequence
from relaxc.schedules.selection import Candidate
from tests.helpers import FakeClock


def _tensor(values) -> tvm.runtime.Tensor:
    return tvm.runtime.tensor(np.asarray(values, "float32"), tvm.cpu())


def _kernel(functions: dict, calls: list[int], current: int = 0) -> sequence.Kernel:
    return sequence.Kernel("k", "hash", records=len(functions), calls=calls,
                           candidates=[Candidate(label, schedule=None) for label in functions],
                           functions=list(functions.values()), current=current)


def test_a_candidate_whose_outputs_differ_is_dropped():
    x, out = _tensor([0, 0]), _tensor([0, 0])

    def producer(a):  # the call before the kernel: its input is written again before each candidate
        a.copyfrom(np.array([1, 2], "float32"))

    def in_place(a, o):  # writes its input too: without the producer run again, the next would differ
        o.copyfrom(a.numpy() * 2)
        a.copyfrom(a.numpy() * 2)

    def rounded(a, o):
        o.copyfrom(a.numpy() * 2 * (1 + 1e-6))
        a.copyfrom(o.numpy())

    def wrong(a, o):
        o.copyfrom(a.numpy() * 2 + 1)
        a.copyfrom(o.numpy())

    calls = [("producer", producer, [x]), ("k", in_place, [x, out])]
    kernel = _kernel({"record 1": wrong, "default": in_place, "record 2": rounded}, [1], current=1)
    sequence._drop_wrong(kernel, calls)
    assert [c.label for c in kernel.candidates] == ["default", "record 2"]
    assert kernel.functions == [in_place, rounded] and kernel.current == 0


def test_candidates_take_turns_in_the_sequence_and_count_every_call_of_their_kernel(monkeypatch):
    """Stand-in kernels that move a fake clock: each candidate's time is exactly the sum of its
    kernel's two calls, whatever the machine's load."""
    clock, ran = FakeClock(), []
    monkeypatch.setattr(sequence, "time", clock)

    def step(name: str, seconds: float):
        def run(*_):
            ran.append(name)
            clock.sleep(seconds)
        return run

    def builtin(*_):
        raise AssertionError("builtins allocate; they are not replayed")

    calls = [("producer", step("producer", 0.001), []), ("k", step("k", 0), []),
             ("vm.builtin.alloc_tensor", builtin, []), ("k", step("k", 0), [])]
    kernel = _kernel({"fast": step("fast", 0.0002), "slow": step("slow", 0.002)}, [1, 3])
    sequence._time([kernel], calls, runs=5)
    fast, slow = kernel.candidates
    assert len(fast.runs_ms) >= 5 and len(slow.runs_ms) >= 5
    assert "k" not in ran and ran[0] == "producer" and ran[1] == ran[2]  # one candidate for both calls
    assert fast.runs_ms == pytest.approx([0.4] * len(fast.runs_ms))  # two calls, the producer not counted
    assert slow.runs_ms == pytest.approx([4.0] * len(slow.runs_ms))
    assert sum(r == "producer" for r in ran) == 2 + 10  # warm-up: each candidate once; then 5 per candidate


@pytest.mark.parametrize("kind", ["cuda"])
def test_gpu_kernels_keep_their_best_record(kind):
    result = sequence.select_in_sequence([], {}, store=None, target=tvm.target.Target(kind))
    assert result["selected"] == 0 and "CPU" in result["skipped"]
