"""benchmarks/by_op.py: relaxc's kernels and onnxruntime's nodes land in the same kinds."""

from relaxc.benchmarks import by_op
from tests import reference


def test_both_runtimes_convolutions_are_grouped_alike():
    ours, theirs, our_total, their_total = by_op.compare(reference.small_cnn(), rounds=1, tuning="off")
    convs = {kind for kind in ours if kind.startswith("conv")}
    assert convs == {"conv 3x3 s1", "conv 1x1 s1"}
    assert convs <= set(theirs)  # onnxruntime fuses its convolutions' epilogues: no other conv kind
    assert our_total >= sum(ours[k] for k in convs) > 0 and their_total > 0
