"""Channel movements as operators the layout pass runs on blocked data.

A ``split`` along C (MixNet's groups of depthwise kernels of different sizes) becomes one
``strided_slice`` a part, which the layout pass takes on blocked data: the split ran on NCHW, so
every part went back to the blocked layout through a converter (a fifth of MixNet's kernel time).

A channel shuffle (ShuffleNet: ``reshape`` to N x g x C/g x H x W, swap the two channel axes,
``reshape`` back) is a permutation of the channels: it becomes ``take`` along C with the permutation
as a constant, which the layout pass runs on blocked data instead of converting to NCHW and back.
A slice of such a take is a take of the sliced indices: ShuffleNetV2 chunks each shuffle's output
in two halves, which then gather straight from the shuffle's input, and the shuffle itself goes
(one pass over the feature map fewer per unit).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

from relaxc.passes.ir import constant_array, is_op, MutatorPass, static_shape


@relax.expr_functor.mutator
class _ChannelShuffle(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        shuffle = _channel_shuffle(call, self.lookup_binding)
        if shuffle is not None:
            source, permutation = shuffle
            return relax.op.take(source, relax.const(permutation, "int64"), axis=1)
        sliced = _slice_of_take(call, self.lookup_binding)
        if sliced is not None:
            source, indices, axis = sliced
            return relax.op.take(source, relax.const(indices, "int64"), axis=axis)
        return call


def _slice_of_take(call: relax.Call, lookup) -> tuple[relax.Expr, np.ndarray, int] | None:
    """(source, indices, axis) if ``call`` slices a ``take`` of constant indices along the take's
    axis only: the slice is a take of the sliced indices from the take's source."""
    if not is_op(call, "relax.strided_slice"):
        return None
    taken = lookup(call.args[0]) if isinstance(call.args[0], relax.Var) else None
    shape = static_shape(taken) if is_op(taken, "relax.take") else None
    indices = constant_array(taken.args[1]) if shape is not None else None
    if indices is None or taken.attrs.axis is None:
        return None
    axis = int(taken.attrs.axis) % len(shape)
    axes, begin, end, *strides = ([int(i) for i in arg.fields] if isinstance(arg, relax.Tuple) else None
                                  for arg in call.args[1:])
    if indices.ndim != 1 or None in (axes, begin, end) or [a % len(shape) for a in axes] != [axis]:
        return None
    step = strides[0][0] if strides and strides[0] is not None else 1
    return taken.args[0], indices[begin[0]:end[0]:step], axis


def _channel_shuffle(call: relax.Call, lookup) -> tuple[relax.Expr, np.ndarray] | None:
    """(shuffled tensor, channel permutation) if ``call`` ends a reshape-transpose-reshape shuffle."""
    if not is_op(call, "relax.reshape"):
        return None
    swapped = lookup(call.args[0]) if isinstance(call.args[0], relax.Var) else None
    if not is_op(swapped, "relax.permute_dims") or swapped.attrs.axes is None \
            or [int(a) for a in swapped.attrs.axes] != [0, 2, 1, 3, 4]:
        return None
    split = lookup(swapped.args[0]) if isinstance(swapped.args[0], relax.Var) else None
    if not is_op(split, "relax.reshape"):
        return None
    source, inner, out = static_shape(split.args[0]), static_shape(split), static_shape(call)
    if source is None or inner is None or len(source) != 4 or source != out \
            or inner != (source[0], inner[1], source[1] // inner[1], *source[2:]) or inner[1] * inner[2] != source[1]:
        return None
    groups, per_group = inner[1], inner[2]
    return split.args[0], np.arange(source[1]).reshape(groups, per_group).T.reshape(-1)  # output -> input channel


@relax.expr_functor.mutator
class _SplitAsSlices(relax.PyExprMutator):
    def visit_tuple_getitem_(self, item: relax.TupleGetItem) -> relax.Expr:
        item = self.visit_expr_post_order(item)
        split = self.lookup_binding(item.tuple_value) if isinstance(item.tuple_value, relax.Var) else None
        shape = static_shape(split.args[0]) if is_op(split, "relax.split") else None
        if shape is None or len(shape) != 4 or int(split.attrs.axis) % 4 != 1:
            return item
        sections = split.attrs.indices_or_sections
        if isinstance(sections, tirx.IntImm):  # equal parts
            bounds = list(range(0, shape[1] + 1, shape[1] // int(sections)))
        else:
            bounds = [0, *(int(i) for i in sections), shape[1]]
        return relax.op.strided_slice(split.args[0], axes=[1], begin=[bounds[item.index]], end=[bounds[item.index + 1]])


@tvm.transform.module_pass(opt_level=0, name="relaxc.SplitAlongChannelsToSlices")
class SplitAlongChannelsToSlices(MutatorPass):
    """Each part of a ``split`` of NCHW data along C as a ``strided_slice``."""

    mutator = _SplitAsSlices


@tvm.transform.module_pass(opt_level=0, name="relaxc.ChannelShuffleToTake")
class ChannelShuffleToTake(MutatorPass):
    """A reshape-transpose-reshape channel shuffle to ``take`` of the permuted channels; slices of a
    constant-index take to takes of the sliced indices."""

    mutator = _ChannelShuffle
