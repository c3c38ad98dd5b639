"""Legalisation of the blocked operators the layout pass emits, and of operators TVM leaves out.

TVM's ``LegalizeOps`` lowers ``relax.nn.conv2d`` only in plain layouts ("CodeGenVM cannot emit this
Relax operator directly" for NCHW{b}c), so blocked convolutions get the TE compute below; every
other operator keeps TVM's legalisation (pooling, reductions and pointwise ops already handle the
blocked layout, since they index it like any 5-D tensor).

The compute reduces over (input block index, kernel row, kernel column, lane within the block), in
that order: the innermost reduction walks contiguous input lanes, the output block is the vector.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, topi


def conv2d_nchwc(data: te.Tensor, kernel: te.Tensor, strides, padding, dilation, groups: int) -> te.Tensor:
    """Convolution of NCHW{b}c data with an OIHW{i}i{o}o kernel (OIHW1i{b}o for depthwise)."""
    batch, _, height, width, block = (int(d) for d in data.shape)
    out_outer, in_outer, kh, kw, in_block, out_block = (int(d) for d in kernel.shape)
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    top, left, bottom, right = (int(p) for p in padding)
    out_h = (height + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (width + left + right - (kw - 1) * dw - 1) // sw + 1
    if top or left or bottom or right:
        data = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name="data_pad")
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")
    shape = (batch, out_outer, out_h, out_w, out_block)
    if in_outer == 1 and in_block == 1 and groups == out_outer * out_block:  # depthwise
        return te.compute(shape, lambda n, o, y, x, i: te.sum(
            data[n, o, y * sh + rh * dh, x * sw + rw * dw, i] * kernel[o, 0, rh, rw, 0, i],
            axis=[rh, rw]), name="conv2d_NCHWc")
    outer_per_group = out_outer // groups
    ric = te.reduce_axis((0, in_outer), name="ric")
    rib = te.reduce_axis((0, block), name="rib")
    return te.compute(shape, lambda n, o, y, x, i: te.sum(
        data[n, (o // outer_per_group) * in_outer + ric if groups > 1 else ric,
             y * sh + rh * dh, x * sw + rw * dw, rib] * kernel[o, ric, rh, rw, rib, i],
        axis=[ric, rh, rw, rib]), name="conv2d_NCHWc")


def _conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    attrs = call.attrs
    if not attrs.data_layout.endswith("c"):  # plain layouts: TVM's own legalisation
        return _DEFAULT_CONV2D(bb, call)
    return bb.call_te(conv2d_nchwc, call.args[0], call.args[1], attrs.strides, attrs.padding,
                      attrs.dilation, int(attrs.groups), primfunc_name_hint="conv2d_NCHWc")


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


_DEFAULT_CONV2D = tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")


def legalize_ops() -> tvm.transform.Pass:
    """TVM's LegalizeOps with the blocked convolution and cumsum added."""
    return relax.transform.LegalizeOps({"relax.nn.conv2d": _conv2d, "relax.cumsum": _cumsum})
