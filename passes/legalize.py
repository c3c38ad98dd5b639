"""Legalisation of the blocked operators the layout pass emits, and of operators TVM leaves out.

TVM's ``LegalizeOps`` lowers ``relax.nn.conv2d`` only in plain layouts ("CodeGenVM cannot emit this
Relax operator directly" for NCHW{b}c), so blocked convolutions get the TE compute below; every
other operator keeps TVM's legalisation (pooling, reductions and pointwise ops already handle the
blocked layout, since they index it like any 5-D tensor).

The compute reduces over (input block index, kernel row, kernel column, lane within the block), in
that order: the innermost reduction walks contiguous input lanes, the output block is the vector.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.target import Target

from relaxc.passes.ir import dims_of, static_shape
from relaxc.support.errors import UnsupportedOperatorError
from relaxc.support import targets

STAGE_ATTR = "relaxc.stage"  # on a TE block that schedules keep as a stage of its own (not inlined)


def conv2d_nchwc(data: te.Tensor, kernel: te.Tensor, strides, padding, dilation, groups: int,
                 window: tuple[int, int] | None = None, out_dtype: str | None = None) -> te.Tensor:
    """Convolution of NCHW{b}c data with an OIHW{i}i{o}o kernel (OIHW1i{b}o for depthwise).

    ``window`` = (input, output) channels per group of a grouped conv whose groups do not align
    with the blocks (ShuffleNet's 34 channels on 16-lane blocks): each output block reads the
    kernel's I input blocks from the one holding its first group's first channel (moved back where
    that would run past the last block), and the kernel is zero outside its groups
    (``passes/layout_algebra.py``, ``pack_windowed_conv_weight``).

    8-bit data sums in ``out_dtype`` (int32); its kernel may be packed ``OIHW{i/d}i{o}o{d}i``
    (``kernel_grouped``), ``d`` input channels of each output lane together, as the target's byte
    dot product reads them (``schedules/cpu/int8.py``).
    """
    batch, data_outer, height, width, block = (d if i == 0 and not isinstance(d, tvm.tirx.IntImm) else int(d)
                                               for i, d in enumerate(data.shape))  # a batch may be dynamic
    out_outer, in_outer, kh, kw = (int(d) for d in kernel.shape[:4])
    in_block, out_block = int(kernel.shape[4]) * (int(kernel.shape[6]) if len(kernel.shape) == 7 else 1), int(kernel.shape[5])
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    top, left, bottom, right = (int(p) for p in padding)
    out_h = (height + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (width + left + right - (kw - 1) * dw - 1) // sw + 1
    padded = bool(top or left or bottom or right)
    if padded:
        data = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name="data_pad")
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")
    shape = (batch, out_outer, out_h, out_w, out_block)
    summed = (lambda v: v.astype(out_dtype)) if out_dtype not in (None, data.dtype) else (lambda v: v)  # noqa: E731
    if in_outer == 1 and in_block == 1 and groups == out_outer * out_block:  # depthwise
        return te.compute(shape, lambda n, o, y, x, i: te.sum(
            summed(data[n, o, y * sh + rh * dh, x * sw + rw * dw, i]) * summed(kernel[o, 0, rh, rw, 0, i]),
            axis=[rh, rw]), name="conv2d_NCHWc")
    if window is not None:
        in_per_group, out_per_group = window
        first = lambda o: te.min(o * out_block // out_per_group * in_per_group // block, data_outer - in_outer)  # noqa: E731
    elif groups > 1:
        first = lambda o: o // (out_outer // groups) * in_outer  # noqa: E731
    else:
        first = lambda _o: 0  # noqa: E731
    ric = te.reduce_axis((0, in_outer), name="ric")
    rib = te.reduce_axis((0, block), name="rib")
    weight = lambda o, c, y, x, b, i: kernel[o, c, y, x, b, i]  # noqa: E731
    if len(kernel.shape) == 7:  # OIHW{i/d}i{o}o{d}i
        depth = int(kernel.shape[6])
        weight = lambda o, c, y, x, b, i: kernel[o, c, y, x, b // depth, i, b % depth]  # noqa: E731
    return te.compute(shape, lambda n, o, y, x, i: te.sum(
        summed(data[n, first(o) + ric, y * sh + rh * dh, x * sw + rw * dw, rib]) * summed(weight(o, ric, rh, rw, rib, i)),
        axis=[ric, rh, rw, rib]), name="conv2d_NCHWc")


def kernel_grouped(kernel: te.Tensor, depth: int, dtype: str) -> te.Tensor:
    """An OIHW{i}i{o}o kernel packed OIHW{i/depth}i{o}o{depth}i, as ``dtype``."""
    o, i, kh, kw, ib, ob = kernel.shape
    return te.compute((o, i, kh, kw, ib // depth, ob, depth),
                      lambda a, b, y, x, g, j, l: kernel[a, b, y, x, g * depth + l, j].astype(dtype), name="kernel_grouped")


def channel_tables(channels: list[int], source: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The tables ``gather_channels_nchwc`` reads: output lane ``l`` holds channel ``source[l]`` of
    the concatenation of parts of ``channels`` each. ``part[l]`` is the part it reads (-1 past the
    last output channel: padding, a zero), ``local[k, l]`` the channel it reads in part k, clamped
    into that part for the parts it does not read, so every load is in bounds in every lane."""
    lanes = -(-len(source) // block) * block
    starts = np.cumsum([0] + channels[:-1])
    padded = np.concatenate([source, np.full(lanes - len(source), source[-1])]).astype(np.int64)
    part = np.searchsorted(starts, padded, side="right") - 1
    part[len(source):] = -1
    local = np.stack([np.clip(padded - start, 0, count - 1) for start, count in zip(starts, channels)])
    return part.astype("int32"), local.astype("int32")


def gather_channels_nchwc(parts: list[te.Tensor], part: te.Tensor, local: te.Tensor) -> te.Tensor:
    """NCHW{b}c channels gathered from NCHW{b}c ``parts`` by the tables of ``channel_tables``: a
    concat along C, a ``take`` of channels, or a take from a concat without making it.

    Selects between loads that are all in bounds, where a guard per lane (``if_then_else``) made
    TVM scalarise the whole kernel, epilogue included (MixNet's concats: 1 % of their roofline).
    The bounds live in the tables, not in clamps: TVM simplifies a clamp away inside a select
    whose condition implies it, though both sides of a select are evaluated."""
    batch, _, height, width, block = (int(d) for d in parts[0].shape)
    lanes = int(part.shape[0])

    def element(n, o, y, x, i):
        lane = o * block + i
        value = tvm.tirx.const(0.0, parts[0].dtype)
        for k, data in enumerate(parts):
            channel = local[k, lane]
            value = tvm.tirx.Select(part[lane] == k, data[n, channel // block, y, x, channel % block], value)
        return value

    return te.compute((batch, lanes // block, height, width, block), element, name="gather_channels")


def _conv2d(dot: targets.ByteDot | None):
    """Blocked convolutions; int8 kernels packed for ``dot``, the target's byte dot product."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        attrs = call.attrs
        if not attrs.data_layout.endswith("c"):  # plain layouts: TVM's own legalisation
            return _DEFAULT_CONV2D(bb, call)
        kernel = call.args[1]
        if dot is not None and str(kernel.ty.dtype) == "int8" and int(static_shape(kernel)[4]) % dot.depth == 0:
            kernel = bb.emit_te(kernel_grouped, kernel, dot.depth, dot.weights,  # a constant: folded
                                primfunc_name_hint="kernel_grouped")
        return bb.call_te(conv2d_nchwc, call.args[0], kernel, attrs.strides, attrs.padding, attrs.dilation,
                          int(attrs.groups), None, str(call.ty.dtype), primfunc_name_hint="conv2d_NCHWc")
    return legalize


def cumsum(data: te.Tensor, axis: int, dtype: str, exclusive: bool) -> te.Tensor:
    """Cumulative sum along ``axis`` as a masked reduction: quadratic in the axis length, which is
    a sequence length where models use it, and a plain compute every schedule rule understands
    (TOPI's sequential form declares buffers the arena planner cannot offset)."""
    axis = axis % len(data.shape)
    k = te.reduce_axis((0, data.shape[axis]), name="k")

    def element(*index):
        source = list(index)
        source[axis] = k
        keep = k < index[axis] if exclusive else k <= index[axis]
        return te.sum(te.if_then_else(keep, data[tuple(source)].astype(dtype), tvm.tirx.const(0, dtype)), axis=k)

    return te.compute(data.shape, element, name="cumsum")


def _cumsum(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """TVM 0.27 has no legalisation of cumsum (RoBERTa's position ids are a cumsum of the mask)."""
    attrs = call.attrs
    data = call.args[0]
    dtype = str(attrs.dtype) if attrs.dtype is not None and str(attrs.dtype) not in ("", "void") else str(data.ty.dtype)
    if attrs.axis is None:
        data = bb.normalize(relax.op.reshape(data, [-1]))
    return bb.call_te(cumsum, data, 0 if attrs.axis is None else int(attrs.axis), dtype, bool(attrs.exclusive),
                      primfunc_name_hint="cumsum")


def resize2d_separable(data: te.Tensor, size: tuple[int, int], method: str, mode: str, alpha: float,
                       exclude: int, extrapolation: float) -> te.Tensor:
    """NCHW linear or cubic resize as two 1-D passes: along the width for the input's rows (a
    stage of its own, ``STAGE_ATTR``), then along the height, reading whole rows of it.

    The interpolation is separable and TOPI's 2-D form interpolates along the width first too, so
    the values are the same; but each output element no longer gathers 4 (16 for cubic) inputs
    with their coordinates computed per element: DeepLabV3's 21 x 14 x 14 -> 224 x 224 upsampling
    took 2.0 ms in the 2-D form.
    """
    batch, channels, height, width = (int(d) for d in data.shape)
    out_h, out_w = size
    options = dict(method=method, coordinate_transformation_mode=mode, bicubic_alpha=alpha,
                   bicubic_exclude=exclude, extrapolation_value=extrapolation)
    # the views between the passes index directly: topi.reshape's flattened indices made TVM 0.27's
    # reverse_compute_inline fail internally ("Cannot dispatch a null expression")
    rows = te.compute((batch, channels * height, width), lambda b, r, x: data[b, r // height, r % height, x],
                      name="resize_rows")
    wide = topi.image.resize1d(rows, (0.0, 0.0), (out_w,), layout="NCW", **options)
    planes = te.compute((batch * channels, height, out_w),
                        lambda p, y, x: wide[p // channels, p % channels * height + y, x],
                        name="resize_width", attrs={STAGE_ATTR: 1})
    tall = topi.image.resize1d(planes, (0.0, 0.0), (out_h,), layout="NWC", **options)  # W: height, C: width
    return te.compute((batch, channels, out_h, out_w), lambda b, c, y, x: tall[b * channels + c, y, x],
                      name="resize_height")


def _resize2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Linear and cubic float32 NCHW resizes with static shapes run separably (above); others as TVM
    legalises them, and so does a resize of single-pixel rows or columns (a broadcast: the schedule's
    reverse_compute_inline fails inside TVM 0.27 on its unit axis)."""
    attrs = call.attrs
    shape, size = static_shape(call.args[0]), static_shape(call)
    if (shape is None or size is None or min(shape[2:]) == 1 or attrs.layout != "NCHW"
            or attrs.method not in ("linear", "cubic")
            or attrs.coordinate_transformation_mode == "tf_crop_and_resize"
            or call.args[0].ty.dtype != "float32" or call.ty.dtype != "float32"):
        return _DEFAULT_RESIZE2D(bb, call)
    return bb.call_te(resize2d_separable, call.args[0], tuple(size[2:]), str(attrs.method),
                      str(attrs.coordinate_transformation_mode), float(attrs.cubic_alpha),
                      int(attrs.cubic_exclude), float(attrs.extrapolation_value), primfunc_name_hint="resize2d")


_DEFAULT_CONV2D = tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")
def extremum(data: te.Tensor, axes: list[int] | None, keepdims: bool, largest: bool) -> te.Tensor:
    """Max (or min) over ``axes`` starting from -inf (+inf): TOPI starts from the dtype's lowest
    finite value, so the max of a row of -inf came out as -3.4e38 and a test ``max == -inf`` (an
    attention mask's fully masked row) never held."""
    ndim = len(data.shape)
    reduced = sorted({a % ndim for a in axes}) if axes is not None else list(range(ndim))
    identity = float("-inf") if largest else float("inf")
    reducer = te.comm_reducer(lambda x, y: te.max(x, y) if largest else te.min(x, y),
                              lambda dtype: tvm.tirx.const(identity, dtype), name="max" if largest else "min")
    ks = {a: te.reduce_axis((0, data.shape[a]), name=f"k{a}") for a in reduced}
    shape = [1 if a in ks else data.shape[a] for a in range(ndim) if keepdims or a not in ks]

    def element(*index):
        out = iter(index)
        source = []
        for a in range(ndim):
            if a in ks and keepdims:
                next(out)  # the kept axis of size 1
            source.append(ks[a] if a in ks else next(out))
        return reducer(data[tuple(source)], axis=list(ks.values()))

    return te.compute(shape, element, name="max" if largest else "min")


def _extremum(largest: bool):
    op = "relax.max" if largest else "relax.min"
    default = tvm.ir.Op.get(op).get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if not str(call.args[0].ty.dtype).startswith(("float", "bfloat")):
            return default(bb, call)
        axes = None if call.attrs.axis is None else [int(a) for a in call.attrs.axis]
        return bb.call_te(extremum, call.args[0], axes, bool(call.attrs.keepdims), largest,
                          primfunc_name_hint="max" if largest else "min")
    return legalize


_DEFAULT_RESIZE2D = tvm.ir.Op.get("relax.image.resize2d").get_attr("FLegalize")


def softmax_padded_rows(data: te.Tensor, multiple: int) -> te.Tensor:
    """Softmax over the last axis whose two reductions (max, sum of exponentials) run over the row
    padded to a ``multiple`` of the vector width, the padding read as the reduction's identity
    through an index clamped to the row (no load leaves it). The ``Rows`` schedule can then split
    each reduction into vector-wide partial results, as it does for rows that divide: a 197-token
    row (ViT) was one chain of dependent scalar maxima and sums, 4x slower. A single row (a
    classifier's 1,000 classes) keeps TOPI's form: one chain costs microseconds there, and its kernel
    keeps the workload of the committed tuning records. The rows may be dynamic (a batch), the
    row's length is a constant."""
    *rows, length = data.shape
    length = int(length)
    padded = -(-length // multiple) * multiple
    last = lambda k: te.min(k, length - 1)  # noqa: E731 - the clamped index
    k = te.reduce_axis((0, padded), name="k")
    lowest = tvm.tirx.min_value(data.dtype)
    maxelem = te.compute(rows, lambda *i: te.max(tvm.tirx.Select(k < length, data[(*i, last(k))], lowest), axis=k),
                         name="T_softmax_maxelem")
    exp = te.compute(data.shape, lambda *i: te.exp(data[i] - maxelem[i[:-1]]), name="T_softmax_exp")
    k = te.reduce_axis((0, padded), name="k")
    zero = tvm.tirx.const(0, data.dtype)
    expsum = te.compute(rows, lambda *i: te.sum(tvm.tirx.Select(k < length, exp[(*i, last(k))], zero), axis=k),
                        name="T_softmax_expsum")
    return te.compute(data.shape, lambda *i: exp[i] / expsum[i[:-1]], name="T_softmax_norm")


def _softmax(multiple: int):
    default = tvm.ir.Op.get("relax.nn.softmax").get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        shape = dims_of(call.args[0])  # rows of a dynamic batch too: Whisper's 1500 keys, 2.2x slower unpadded
        if (shape is None or not isinstance(shape[-1], int) or int(call.attrs.axis) % len(shape) != len(shape) - 1
                or shape[-1] % multiple == 0 or shape[-1] < 2 * multiple
                or all(isinstance(d, int) for d in shape[:-1]) and np.prod(shape[:-1]) == 1):
            return default(bb, call)
        return bb.call_te(softmax_padded_rows, call.args[0], multiple, primfunc_name_hint="softmax")
    return legalize


def layer_norm(data: te.Tensor, gamma: te.Tensor, beta: te.Tensor, axes: list[int], epsilon: float) -> te.Tensor:
    """TOPI's LayerNorm (stages and names alike) with the mean taken as each row's first element
    plus the mean of the differences from it. A row of equal values then has its value as its mean
    exactly, and the output is ``beta``: with TOPI's plain sum the mean's last-bit rounding, times
    ``1 / sqrt(epsilon)`` (316 for 1e-5), moved such rows by 0.5 % from what onnxruntime gives."""
    ndim = len(data.shape)
    axes = sorted(int(a) % ndim for a in axes)
    kept = [d for d in range(ndim) if d not in axes]
    count = tvm.tirx.const(float(np.prod([int(data.shape[a]) for a in axes])), data.dtype)
    reduced = [te.reduce_axis((0, data.shape[a]), name=f"k{a}") for a in axes]

    def at(outer, inner) -> list:
        outer, inner = iter(outer), iter(inner)
        return [next(inner) if d in axes else next(outer) for d in range(ndim)]

    first = lambda outer: data(*at(outer, [0] * len(axes)))  # noqa: E731
    rows = [data.shape[d] for d in kept]
    name = data.op.name
    total = te.compute(rows, lambda *o: te.sum(data(*at(o, reduced)) - first(o), axis=reduced), name=f"{name}_sum")
    mean = te.compute(rows, lambda *o: first(o) + total(*o) / count, name=f"{name}_mean")
    spread = te.compute(rows, lambda *o: te.sum((data(*at(o, reduced)) - mean(*o)) * (data(*at(o, reduced)) - mean(*o)),
                                                axis=reduced), name=f"{name}_var_sum")
    eps = tvm.tirx.const(epsilon, data.dtype)

    def normalised(*i):
        o, r = [i[d] for d in kept], [i[d] for d in axes]
        return (data(*i) - mean(*o)) * te.rsqrt(spread(*o) / count + eps) * gamma(*r) + beta(*r)
    return te.compute(data.shape, normalised, name="T_layer_norm")


def _layer_norm(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    if call.args[0].ty.dtype != "float32" or static_shape(call.args[0]) is None:
        return _DEFAULT_LAYER_NORM(bb, call)
    return bb.call_te(layer_norm, *call.args, [int(a) for a in call.attrs.axes], float(call.attrs.epsilon),
                      primfunc_name_hint="layer_norm")


_DEFAULT_LAYER_NORM = tvm.ir.Op.get("relax.nn.layer_norm").get_attr("FLegalize")


def bit_shift(x: te.Tensor, amount: te.Tensor, left: bool) -> te.Tensor:
    """ONNX's BitShift of integers, an amount out of range (negative, or the bit width or more)
    included: it shifts every bit out, giving 0, or the sign (-1 or 0) for a signed right shift.
    TOPI's shift leaves that to LLVM, where it is poison (int8 came out shifted modulo 8)."""
    bits = tvm.DataType(x.dtype).bits
    signed = tvm.DataType(x.dtype).type_code == tvm.DataTypeCode.INT
    zero, top = tvm.tirx.const(0, amount.dtype), tvm.tirx.const(bits - 1, amount.dtype)
    unsigned = f"uint{tvm.DataType(amount.dtype).bits}"  # a negative amount as a large one
    clamped = topi.cast(topi.minimum(topi.cast(amount, unsigned), tvm.tirx.const(bits - 1, unsigned)), amount.dtype)
    if not left and signed:
        return topi.right_shift(x, clamped)  # out of range: bits - 1, which gives the sign
    shifted = topi.left_shift(x, clamped) if left else topi.right_shift(x, clamped)
    in_range = topi.logical_and(topi.greater_equal(amount, zero), topi.less_equal(amount, top))
    return topi.multiply(shifted, topi.cast(in_range, x.dtype))  # 0 out of range; broadcast, as the shift is


def _shift(left: bool):
    default = tvm.ir.Op.get("relax.left_shift" if left else "relax.right_shift").get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if tvm.DataType(str(call.args[0].ty.dtype)).type_code not in (tvm.DataTypeCode.INT, tvm.DataTypeCode.UINT):
            return default(bb, call)
        return bb.call_te(bit_shift, *call.args, left, primfunc_name_hint="left_shift" if left else "right_shift")
    return legalize


SORTABLE = ("float16", "float32", "float64", "int32", "int64")  # what TVM's runtime sort takes


def _sortable(call: relax.Call) -> None:
    dtype = str(call.args[0].ty.dtype)
    if dtype not in SORTABLE:
        raise UnsupportedOperatorError(f"{call.op.name[6:]} of {dtype} data: TVM's runtime sort takes "
                                       f"{', '.join(SORTABLE)}")


def _topk(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """TOPI's top-k for CPUs: a call of TVM's runtime sort (``tvm.contrib.sort.topk``), as TVM 0.27
    registers no legalisation for ``relax.topk`` (it reached code generation and crashed there)."""
    _sortable(call)
    attrs = call.attrs
    return bb.call_te(topi.topk, call.args[0], int(attrs.k), int(attrs.axis), str(attrs.ret_type),
                      not bool(attrs.largest), str(attrs.dtype), primfunc_name_hint="topk")


def _sort(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    _sortable(call)
    return bb.call_te(topi.sort, call.args[0], int(call.attrs.axis), not bool(call.attrs.descending),
                      primfunc_name_hint="sort")


def _argsort(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    _sortable(call)
    return bb.call_te(topi.argsort, call.args[0], int(call.attrs.axis), not bool(call.attrs.descending),
                      str(call.attrs.dtype), primfunc_name_hint="argsort")


def legalize_ops(target: Target) -> tvm.transform.Pass:
    """TVM's LegalizeOps with the blocked convolution, separable resizes, cumsum, float max/min
    reductions that start from infinity, LayerNorm exact on rows of equal values, bit shifts by
    any amount, and on CPU softmax rows padded to the vector width and the runtime's sort."""
    ops = {"relax.nn.conv2d": _conv2d(targets.byte_dot(target)), "relax.image.resize2d": _resize2d, "relax.cumsum": _cumsum,
           "relax.max": _extremum(True), "relax.min": _extremum(False), "relax.nn.layer_norm": _layer_norm,
           "relax.left_shift": _shift(True), "relax.right_shift": _shift(False)}
    if target.kind.name == "llvm":
        ops["relax.nn.softmax"] = _softmax(targets.vector_lanes(target))
        ops.update({"relax.topk": _topk, "relax.sort": _sort, "relax.argsort": _argsort})  # the runtime's sort
    return relax.transform.LegalizeOps(ops)
