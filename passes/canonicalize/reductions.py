"""Group norms and whole-tensor reductions as reductions the ``Rows`` rule runs in parallel.

A group norm over NCHW data (``GroupNormalization``, opset 18 on) becomes what torch's export of
GroupNorm computes: the data reshaped to (N, groups, rest), mean and variance over the rest, then
the scale and shift per channel. TOPI's group norm copied the data into groups and ran at 7 % of its
roofline; the reshaped form is a row reduction, which the ``Rows`` rule takes.

A max, min or sum over a whole tensor runs in two steps, parallel slabs of vectors first
(``WholeReductionsInSlabs``), instead of one reduction to a scalar on one core.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from relaxc.passes.ir import is_op, MutatorPass, static_shape


@relax.expr_functor.mutator
class _GroupNorm(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not is_op(call, "relax.nn.group_norm"):
            return call
        attrs, (data, gamma, beta) = call.attrs, call.args
        shape = static_shape(data)
        if shape is None or len(shape) < 3 or str(data.ty.dtype) != "float32" \
                or int(attrs.channel_axis) % len(shape) != 1 \
                or sorted(int(a) % len(shape) for a in attrs.axes) != list(range(2, len(shape))) \
                or static_shape(gamma) != (shape[1],) or static_shape(beta) != (shape[1],):
            return call
        emit = self.builder_.emit
        grouped = emit(relax.op.reshape(data, [shape[0], int(attrs.num_groups), -1]))
        mean = emit(relax.op.mean(grouped, axis=[2], keepdims=True))
        variance = emit(relax.op.variance(grouped, axis=[2], keepdims=True))
        deviation = emit(relax.op.sqrt(relax.op.add(variance, relax.const(float(attrs.epsilon), "float32"))))
        normalized = emit(relax.op.reshape(relax.op.divide(relax.op.subtract(grouped, mean), deviation), shape))
        per_channel = [1, shape[1]] + [1] * (len(shape) - 2)
        if bool(attrs.scale):
            normalized = emit(relax.op.multiply(normalized, relax.op.reshape(gamma, per_channel)))
        return relax.op.add(normalized, relax.op.reshape(beta, per_channel)) if bool(attrs.center) else normalized


WHOLE_REDUCTIONS = {"relax.max": relax.op.max, "relax.min": relax.op.min, "relax.sum": relax.op.sum}
PARTS = 64  # a whole-tensor reduction's slabs, at most: parallel, each a contiguous run of vectors
PART_LANES = 16  # the partial results of a slab: one vector
FEWEST_SPLIT = 1 << 14  # elements: a smaller whole reduction takes microseconds as it is


@relax.expr_functor.mutator
class _WholeReduction(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in WHOLE_REDUCTIONS:
            return call
        data = call.args[0]
        shape = static_shape(data)
        if shape is None or (call.attrs.axis is not None and len(call.attrs.axis) != len(shape)):
            return call
        size = math.prod(shape)
        parts = next((p for p in range(PARTS, 1, -1) if size % (p * PART_LANES) == 0), 0)
        if not parts or size < FEWEST_SPLIT:
            return call
        reduce = WHOLE_REDUCTIONS[call.op.name]
        slabs = self.builder_.normalize(relax.op.reshape(data, [parts, size // parts // PART_LANES, PART_LANES]))
        whole = self.builder_.normalize(reduce(self.builder_.normalize(reduce(slabs, axis=[1])), axis=None))
        return relax.op.reshape(whole, static_shape(call)) if bool(call.attrs.keepdims) else whole


@tvm.transform.module_pass(opt_level=0, name="relaxc.GroupNormAsRows")
class GroupNormAsRows(MutatorPass):
    """``group_norm`` of NCHW float32 data as mean and variance over (N, groups, rest), then scale and shift."""

    mutator = _GroupNorm


@tvm.transform.module_pass(opt_level=0, name="relaxc.WholeReductionsInSlabs")
class WholeReductionsInSlabs(MutatorPass):
    """A max, min or sum over a whole tensor as one over the middle axis of (up to ``PARTS`` slabs,
    rows, ``PART_LANES``), then over the slabs' vectors of partial results: the first runs in
    parallel slabs, a vector of lanes a step (``Rows``'s columns); as one reduction to a scalar it
    ran on one core, an element at a time (0.2 ms, 2.5 GB/s, for each of ``DynamicQuantizeLinear``'s
    max and min of a BERT activation: rfactor, which would split it, knows no max from -inf)."""

    mutator = _WholeReduction
