"""Rewrite importer idioms into the plain operators later passes understand.

TVM's ONNX importer turns ``Sum(a, b, ...)`` (ResNet-50's residual additions, ShuffleNet's) into
``sum(stack(broadcast_to(a, S), broadcast_to(b, S)), axis=0)``. That is an n-ary add, but
``stack`` and a reduction over the new axis hide it: the layout pass must treat them as
layout-sensitive, and they cost a copy of every operand. Here they become a chain of ``add``.

``Dropout`` is the identity at inference, and TVM legalises it so, as a copy plus a mask of ones;
its output is replaced by its input (the mask, if anything reads it, is left to TVM).

A ``split`` along C (MixNet's groups of depthwise kernels of different sizes) becomes one
``strided_slice`` a part, which the layout pass takes on blocked data: the split ran on NCHW, so
every part went back to the blocked layout through a converter (a fifth of MixNet's kernel time).

A channel shuffle (ShuffleNet: ``reshape`` to N x g x C/g x H x W, swap the two channel axes,
``reshape`` back) is a permutation of the channels: it becomes ``take`` along C with the permutation
as a constant, which the layout pass runs on blocked data instead of converting to NCHW and back.
A slice of such a take is a take of the sliced indices: ShuffleNetV2 chunks each shuffle's output
in two halves, which then gather straight from the shuffle's input, and the shuffle itself goes
(one pass over the feature map fewer per unit).

Division by a constant becomes multiplication by its reciprocal: a vector division costs about
ten FMAs (hard-swish's ``/ 6``, in every MobileNetV3 block, made 21 ``vdivps`` in one conv's
epilogue; GELU's ``/ sqrt(2)``). Exact for powers of two, otherwise within an ulp of the division
(ONNX's own HardSigmoid and HardSwish are defined with the multiplication by 1/6); constants whose
reciprocal is not a normal float, and half types (where an ulp is 2^-11 or 2^-8), keep the division.

A 1-D convolution (``conv1d``, NCW: audio front ends, temporal and positional convolutions) becomes
a 2-D one over a height of 1 between an ``expand_dims`` and a ``squeeze``, so it takes the blocked
convolution path, its schedules and records (TOPI's conv1d has no rule of its own in relaxc).

A depthwise 1x1 convolution (stride 1, no padding: FastViT's RepMixer, a train-time branch that an
export keeps) multiplies each channel by one weight: it becomes that ``multiply`` (plus its bias),
which fuses with the elementwise ops around it. As a convolution it ended a fused kernel whose
prologue also fed its epilogue, which no convolution rule takes (4 % of its roofline, FastViT-T8's
worst kernel).

A group norm over NCHW data (``GroupNormalization``, opset 18 on) becomes what torch's export of
GroupNorm computes: the data reshaped to (N, groups, rest), mean and variance over the rest, then
the scale and shift per channel. TOPI's group norm copied the data into groups and ran at 7 % of its
roofline; the reshaped form is a row reduction, which the ``Rows`` rule takes.

A matmul by constant weights of rows flattened from dynamic leading dims and reshaped back
(``x.view(-1, K)`` then a Linear's ``addmm`` and ``view``: GPT-2's Conv1D) becomes the matmul of
the unflattened rows: the reshapes of a dynamic size fuse with nothing, so the bias, GELU and
residual add after each ran as kernels of their own (GPT-2 at 16 tokens: 1.23x its static build).

The importer also lowers ``Clip`` straight to TIR (``call_tir`` of TOPI's maximum and minimum against a
scalar bound), which no Relax pass can see through; those calls become ``R.maximum`` and
``R.minimum`` again, so ReLU6 and friends stay in the blocked layout.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, s_tir, tirx
from tvm.ir import GenericConst
from tvm.ir.expr import TensorLoad
from tvm.sym.analyzer import Analyzer

from relaxc.passes.ir import constant_array, dims_of, is_op, map_relax_functions, static_shape


@relax.expr_functor.mutator
class _SumOfStack(relax.PyExprMutator):
    def _bound(self, expr: relax.Expr) -> relax.Expr:
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return bound if bound is not None else expr

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not is_op(call, "relax.sum") or call.attrs.keepdims \
                or call.attrs.axis is None or [int(a) for a in call.attrs.axis] != [0]:
            return call
        stacked = self._bound(call.args[0])
        if not (is_op(stacked, "relax.stack") and int(stacked.attrs.axis) == 0):
            return call
        parts = self._bound(stacked.args[0])
        if not isinstance(parts, relax.Tuple) or len(parts.fields) < 2:
            return call
        target = static_shape(call)
        operands = []
        for part in parts.fields:
            bound = self._bound(part)
            is_noop_broadcast = target is not None and is_op(bound, "relax.broadcast_to") \
                and static_shape(bound.args[0]) == target
            operands.append(bound.args[0] if is_noop_broadcast else part)
        total = operands[0]
        for operand in operands[1:]:
            total = self.builder_.normalize(relax.op.add(total, operand))
        return total


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
class _DropoutOutput(relax.PyExprMutator):
    def visit_tuple_getitem_(self, item: relax.TupleGetItem) -> relax.Expr:
        item = self.visit_expr_post_order(item)
        source = self.lookup_binding(item.tuple_value) if isinstance(item.tuple_value, relax.Var) else None
        if item.index == 0 and is_op(source, "relax.nn.dropout"):
            return source.args[0]
        return item


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


UNARY = ("relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.sigmoid", "relax.tanh",
         "relax.clip")  # elementwise ops a squeezed convolution's epilogue passes through
BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


@relax.expr_functor.mutator
class _Conv1dAs2d(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        lifted = self._through_squeeze(call)
        if lifted is not None:
            return lifted
        if not is_op(call, "relax.nn.conv1d") or call.attrs.data_layout != "NCW" \
                or call.attrs.kernel_layout != "OIW" or call.attrs.out_layout not in ("NCW", ""):
            return call
        attrs, (data, weight) = call.attrs, call.args
        constant = constant_array(weight)
        kernel = (relax.const(constant[:, :, None, :]) if constant is not None
                  else self.builder_.normalize(relax.op.expand_dims(weight, axis=2)))
        width = int(call.ty.shape[2]) if isinstance(call.ty.shape[2], tirx.IntImm) else None
        extra = _row_tile_width(width) - width if width is not None else 0
        conv = relax.op.nn.conv2d(self.builder_.normalize(relax.op.expand_dims(data, axis=2)), kernel,
                                  strides=(1, int(attrs.strides[0])),
                                  padding=(0, int(attrs.padding[0]), 0, int(attrs.padding[1]) + extra * int(attrs.strides[0])),
                                  dilation=(1, int(attrs.dilation[0])), groups=int(attrs.groups),
                                  out_dtype=_dtype(call))
        if extra:
            conv = relax.op.strided_slice(self.builder_.normalize(conv), axes=[3], begin=[0], end=[width])
        return relax.op.squeeze(self.builder_.normalize(conv), axis=[2])

    def _through_squeeze(self, call: relax.Call) -> relax.Expr | None:
        """``op(squeeze(x, [2]))`` and ``squeeze(x, [2]) op constant`` as ``squeeze(op(x))``, so the
        epilogue of a 1-D convolution (bias, activation) stays with it in 4-D, fusable and blocked."""
        if not call.args or not isinstance(call.args[0], relax.Var):
            return None
        squeezed = self.lookup_binding(call.args[0])
        if not is_op(squeezed, "relax.squeeze") or squeezed.attrs.axis is None \
                or [int(a) for a in squeezed.attrs.axis] != [2] or len(static_shape(squeezed.args[0]) or ()) != 4:
            return None
        if any(is_op(call, op) for op in UNARY):
            inner = relax.Call(call.op, [squeezed.args[0], *call.args[1:]], call.attrs, call.ty_args)
        elif any(is_op(call, op) for op in BINARY) and len(call.args) == 2:
            constant = constant_array(call.args[1])
            if constant is None or constant.ndim > 3:
                return None
            padded = constant.reshape((1,) * (3 - constant.ndim) + constant.shape) if constant.ndim else constant
            operand = relax.const(padded[:, :, None, :] if constant.ndim else constant)
            inner = relax.Call(call.op, [squeezed.args[0], operand], call.attrs, call.ty_args)
        else:
            return None
        return relax.op.squeeze(self.builder_.normalize(inner), axis=[2])


ROW_TILES = range(4, 9)  # the register tiles along an output row of the convolution schedules (schedules/cpu/tiled.py)
SHORT_ROW = 14  # tiled whole


def _row_tile_width(width: int) -> int:
    """The output width to compute a 1-D convolution over: its own where a row tile divides it (or
    it is short), else the next multiple of the largest tile, the extra columns computed from the
    zero padding and sliced off. An audio front end's widths (3199, 799, 399: odd, often prime)
    otherwise leave the schedule a tile of one column: wav2vec2's second convolution ran at 20 %
    of its roofline."""
    if width <= SHORT_ROW or any(width % tile == 0 for tile in ROW_TILES):
        return width
    return -(-width // ROW_TILES[-1]) * ROW_TILES[-1]


def _dtype(call: relax.Call) -> str:
    """The element type of what ``call`` (normalised) gives."""
    return str(call.ty.dtype)


@tvm.transform.module_pass(opt_level=0, name="relaxc.Conv1dAsConv2d")
class Conv1dAsConv2d:
    """``conv1d`` (NCW) as ``conv2d`` over a height of 1."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _Conv1dAs2d(mod).visit_expr)


@tvm.transform.module_pass(opt_level=0, name="relaxc.SplitAlongChannelsToSlices")
class SplitAlongChannelsToSlices:
    """Each part of a ``split`` of NCHW data along C as a ``strided_slice``."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _SplitAsSlices(mod).visit_expr)


@tvm.transform.module_pass(opt_level=0, name="relaxc.SumOfStackToAdd")
class SumOfStackToAdd:
    """``sum(stack((a, b, ...)), axis=0)`` to ``a + b + ...`` (no-op broadcasts dropped)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _SumOfStack(mod).visit_expr)


@tvm.transform.module_pass(opt_level=0, name="relaxc.ChannelShuffleToTake")
class ChannelShuffleToTake:
    """A reshape-transpose-reshape channel shuffle to ``take`` of the permuted channels; slices of a
    constant-index take to takes of the sliced indices."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _ChannelShuffle(mod).visit_expr)


@tvm.transform.module_pass(opt_level=0, name="relaxc.DropoutToIdentity")
class DropoutToIdentity:
    """The output of an inference-time dropout is its input."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _DropoutOutput(mod).visit_expr)


def _same_dims(a: list, b: list) -> bool:
    analyzer = Analyzer()
    return len(a) == len(b) and all(analyzer.can_prove_equal(x, y) for x, y in zip(a, b))


@relax.expr_functor.mutator
class _FlattenedMatmul(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        target = dims_of(call)
        if not is_op(call, "relax.reshape") or target is None or static_shape(call) is not None:
            return call
        value = self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) else None
        bias = None
        if is_op(value, "relax.add") and isinstance(value.args[1], GenericConst) \
                and len(value.args[1].ty.shape.values) <= 2:  # a bias, (N,) or (1, N)
            bias, value = value.args[1], (self.lookup_binding(value.args[0]) if isinstance(value.args[0], relax.Var)
                                          else None)
        if not is_op(value, "relax.matmul") or not isinstance(value.args[1], GenericConst) \
                or len(value.args[1].ty.shape.values) != 2 or not isinstance(value.args[0], relax.Var):
            return call
        flatten = self.lookup_binding(value.args[0])
        rows = dims_of(flatten) if is_op(flatten, "relax.reshape") else None
        if rows is None or len(rows) != 2 or not _same_dims([rows[0]], [math.prod(target[:-1])]):
            return call  # not the rows of the leading dims the reshape restores
        x = flatten.args[0]
        if not _same_dims(dims_of(x), [*target[:-1], rows[1]]):  # (b, s, heads, d) flattened to (b s, heads d)
            x = self.builder_.emit(relax.op.reshape(x, [*target[:-1], rows[1]]))
        product = relax.op.matmul(x, value.args[1], out_dtype=value.attrs.out_dtype)
        return relax.op.add(self.builder_.emit(product), bias) if bias is not None else product


@relax.expr_functor.mutator
class _DivideByConstant(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        divisor = constant_array(call.args[1]) if is_op(call, "relax.divide") else None
        if divisor is None or divisor.dtype not in (np.float32, np.float64):
            return call  # a half type's reciprocal is off by up to 2^-11 (bfloat16: 2^-8)
        if is_op(self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) else None,
                 "relax.nn.avg_pool2d"):
            return call  # quantizing an average (passes/quantized/pooling.py): rounds the quotient onnxruntime rounds
        with np.errstate(all="ignore"):
            reciprocal = (1 / divisor).astype(divisor.dtype)
        if not (np.abs(reciprocal) >= np.finfo(divisor.dtype).tiny).all() or not np.isfinite(reciprocal).all():
            return call
        return relax.op.multiply(call.args[0], relax.const(reciprocal, str(divisor.dtype)))


@relax.expr_functor.mutator
class _DepthwisePointwise(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not is_op(call, "relax.nn.conv2d"):
            return call
        attrs, (data, weight) = call.attrs, call.args
        shape, kernel = static_shape(data), static_shape(weight)
        if shape is None or kernel is None or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" \
                or attrs.out_layout not in ("NCHW", "") or _dtype(call) != str(data.ty.dtype) \
                or int(attrs.groups) != shape[1] or kernel != (shape[1], 1, 1, 1) \
                or any(int(s) != 1 for s in attrs.strides) or any(int(p) != 0 for p in attrs.padding):
            return call
        constant = constant_array(weight)
        scale = (relax.const(constant.reshape(1, -1, 1, 1)) if constant is not None
                 else self.builder_.normalize(relax.op.reshape(weight, (1, shape[1], 1, 1))))
        return relax.op.multiply(data, scale)


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


def _max_or_min_with_scalar(func: tirx.PrimFunc) -> str | None:
    """``"relax.maximum"``/``"relax.minimum"`` if ``func`` is out[i] = max/min(a[i], b[]), else None."""
    if len(func.params) != 3:
        return None
    sch = s_tir.Schedule(func)
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except (s_tir.ScheduleError, ValueError):
        return None
    store = sch.get(blocks[0]).body if len(blocks) == 1 else None
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, (tirx.Max, tirx.Min)):
        return None
    lhs, rhs = store.value.a, store.value.b
    data, bound, out = func.params
    if not (isinstance(lhs, TensorLoad) and isinstance(rhs, TensorLoad)
            and lhs.source.same_as(data) and rhs.source.same_as(bound) and store.buffer.same_as(out)
            and len(rhs.indices) == 0 and len(lhs.indices) == len(store.indices)
            and all(a.same_as(b) for a, b in zip(lhs.indices, store.indices))):
        return None
    return "relax.maximum" if isinstance(store.value, tirx.Max) else "relax.minimum"


@relax.expr_functor.mutator
class _CallTIRToOp(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.ops = {gvar: op for gvar, func in mod.functions_items()
                    if isinstance(func, tirx.PrimFunc) and (op := _max_or_min_with_scalar(func))}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not is_op(call, "relax.call_tir") \
                or call.args[0] not in self.ops or not isinstance(call.args[1], relax.Tuple):
            return call
        data, bound = call.args[1].fields
        return relax.Call(tvm.ir.Op.get(self.ops[call.args[0]]), [data, bound])


@tvm.transform.module_pass(opt_level=0, name="relaxc.MatmulOfFlattenedRows")
class MatmulOfFlattenedRows:
    """``reshape(matmul(reshape(x, (rows, K)), W) [+ b], dims + (N,))`` to ``matmul(x, W) [+ b]``
    (x viewed as ``dims + (K,)``) where the dims are dynamic."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _FlattenedMatmul(mod).visit_expr)


@tvm.transform.module_pass(opt_level=0, name="relaxc.DivideByConstantToMultiply")
class DivideByConstantToMultiply:
    """``x / c`` for a float constant c to ``x * (1 / c)`` where 1 / c is a normal float."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _DivideByConstant(mod).visit_expr)


@tvm.transform.module_pass(opt_level=0, name="relaxc.DepthwisePointwiseToMultiply")
class DepthwisePointwiseToMultiply:
    """A depthwise 1x1 ``conv2d`` with stride 1 and no padding to a multiplication by its weights."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _DepthwisePointwise(mod).visit_expr)


@tvm.transform.module_pass(opt_level=0, name="relaxc.GroupNormAsRows")
class GroupNormAsRows:
    """``group_norm`` of NCHW float32 data as mean and variance over (N, groups, rest), then scale and shift."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _GroupNorm(mod).visit_expr)


@tvm.transform.module_pass(opt_level=0, name="relaxc.WholeReductionsInSlabs")
class WholeReductionsInSlabs:
    """A max, min or sum over a whole tensor as one over the middle axis of (up to ``PARTS`` slabs,
    rows, ``PART_LANES``), then over the slabs' vectors of partial results: the first runs in
    parallel slabs, a vector of lanes a step (``Rows``'s columns); as one reduction to a scalar it
    ran on one core, an element at a time (0.2 ms, 2.5 GB/s, for each of ``DynamicQuantizeLinear``'s
    max and min of a BERT activation: rfactor, which would split it, knows no max from -inf)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_relax_functions(mod, _WholeReduction(mod).visit_expr)


@tvm.transform.module_pass(opt_level=0, name="relaxc.ClipFromTIR")
class ClipFromTIR:
    """``call_tir`` of an elementwise max/min against a scalar back to ``R.maximum``/``R.minimum``."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _CallTIRToOp(mod)
        if not rewriter.ops:
            return mod
        return relax.transform.DeadCodeElimination()(map_relax_functions(mod, rewriter.visit_expr))
