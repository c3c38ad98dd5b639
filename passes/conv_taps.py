"""Convolution taps that read only padding are dropped from the kernel at compile time.

A dilated convolution on a small feature map reads, for some kernel rows or columns, nothing but
the zero padding at every output position: DeepLabV3's ASPP convolutions (3x3, rates 24 and 36,
padding equal to the rate) on its 14x14 map have one useful tap out of nine, and every other tap
multiplies zeros. The useful taps form one contiguous range per axis, so the convolution becomes
a smaller one (a 1x1 where only the centre is left) with the padding that keeps every output where
it was, or a crop of the input where the first or last rows are never read. Exact: the dropped
products were all zero (for finite weights). onnxruntime's NCHWc convolution skips such taps at
run time; here they are gone before layout, so the smaller convolution is what gets blocked.

A tap that reads the input at some outputs but padding at most (DeepLabV3's rate-12 ASPP
convolution on its 14x14 map: 18 % of its multiply-adds read input) is dropped region by region:
the outputs split, per axis, into runs that use the same taps (rows 0-1 use the centre and the
tap below, rows 2-11 only the centre, rows 12-13 the centre and the tap above), each pair of runs
is a convolution of its own over a crop of the input with only its taps and no padding, and the
pieces are concatenated back (``MAX_REGION_SHARE`` and ``MAX_REGIONS_PER_AXIS`` say when: a 7x7
depthwise conv on a 7x7 map, as in ConvNeXt's last stage, has a different tap set at every output
and would become 49 tiny convolutions).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from relaxc.passes.ir import constant_array, is_op, map_relax_functions, static_shape


MAX_REGION_SHARE = 0.6  # split into regions when at most this share of the multiply-adds read input
MAX_REGIONS_PER_AXIS = 3  # the borders and the interior; more runs are kernels too small to pay


class _Axis(NamedTuple):
    """One spatial axis of a convolution: the input position of tap t at output o is
    o * stride - pad + t * dilation."""

    size: int
    out: int
    kernel: int
    stride: int
    dilation: int
    pad: int  # before the input


def _taps(axis: _Axis, o: int) -> tuple[int, ...]:
    """The kernel indices that read an input element (not padding) at output ``o``."""
    return tuple(t for t in range(axis.kernel) if 0 <= o * axis.stride - axis.pad + t * axis.dilation < axis.size)


def _useful_taps(axis: _Axis) -> tuple[int, int]:
    """First and last kernel index that reads an input element (not padding) at some output."""
    useful = set().union(*(_taps(axis, o) for o in range(axis.out)))
    return (min(useful), max(useful)) if useful else (0, axis.kernel - 1)


def _regions(axis: _Axis) -> list[tuple[int, int]]:
    """The runs of outputs that use the same taps, as (first output, outputs in the run)."""
    runs: list[tuple[int, int]] = []
    for o in range(axis.out):
        if runs and _taps(axis, o) == _taps(axis, runs[-1][0]):
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((o, 1))
    return runs


def _input_share(axis: _Axis) -> float:
    """The share of this axis's (output, tap) pairs that read input rather than padding."""
    return sum(len(_taps(axis, o)) for o in range(axis.out)) / (axis.out * axis.kernel)


def _region(axis: _Axis, start: int, count: int) -> _Axis:
    """The axis of the convolution computing only outputs ``start .. start + count - 1``."""
    return axis._replace(out=count, pad=axis.pad - start * axis.stride)


def _shrunk(axis: _Axis, first: int, last: int) -> tuple[int, int, int, int]:
    """(input rows cropped before, kept input rows, padding before, padding after) of the smaller
    convolution over taps ``first..last`` with the same outputs."""
    kept = last - first + 1
    pad_before = axis.pad - first * axis.dilation
    crop = max(0, -pad_before)
    pad_before += crop
    rows = axis.size - crop
    pad_after = (axis.out - 1) * axis.stride + (kept - 1) * axis.dilation + 1 - rows - pad_before
    if pad_after < 0:
        rows += pad_after
        pad_after = 0
    return crop, rows, pad_before, pad_after


@relax.expr_functor.mutator
class _DropTaps(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, stats: dict) -> None:
        super().__init__(mod)
        self.stats = stats

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not is_op(call, "relax.nn.conv2d"):
            return call
        attrs = call.attrs
        data_shape, out_shape = static_shape(call.args[0]), static_shape(call)
        if data_shape is None or out_shape is None or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
            return call
        weight = constant_array(call.args[1])
        if weight is None:
            return call
        geometry = [_Axis(data_shape[2 + i], out_shape[2 + i], weight.shape[2 + i], int(attrs.strides[i]),
                          int(attrs.dilation[i]), int(attrs.padding[i])) for i in range(2)]
        regions = [_regions(axis) for axis in geometry]
        if _input_share(geometry[0]) * _input_share(geometry[1]) <= MAX_REGION_SHARE \
                and 1 < len(regions[0]) * len(regions[1]) and max(map(len, regions)) <= MAX_REGIONS_PER_AXIS:
            self.stats["regions"] += len(regions[0]) * len(regions[1])
            rows = [self._concat([self._shrunk_conv(call, weight, [_region(geometry[0], *ry), _region(geometry[1], *rx)])
                                  for rx in regions[1]], axis=3) for ry in regions[0]]
            return self._concat(rows, axis=2)
        shrunk = self._shrunk_conv(call, weight, geometry)
        return call if shrunk is None else shrunk

    def _concat(self, parts: list[relax.Expr], axis: int) -> relax.Expr:
        if len(parts) == 1:
            return parts[0]
        return relax.op.concat([self.builder_.emit(p) for p in parts], axis=axis)

    def _shrunk_conv(self, call: relax.Call, weight: np.ndarray, geometry: list[_Axis]) -> relax.Expr | None:
        """``call`` over the outputs of ``geometry`` with only the taps that read input; None if
        that is all of them and ``geometry`` covers all outputs (nothing to change)."""
        attrs = call.attrs
        spans = [_useful_taps(axis) for axis in geometry]
        full = static_shape(call)[2:] == tuple(axis.out for axis in geometry)
        if full and all(span == (0, axis.kernel - 1) for axis, span in zip(geometry, spans)):
            return None
        (crop_y, rows_y, top, bottom), (crop_x, rows_x, left, right) = (
            _shrunk(axis, *span) for axis, span in zip(geometry, spans))
        data = call.args[0]
        if (crop_y, rows_y, crop_x, rows_x) != (0, geometry[0].size, 0, geometry[1].size):
            data = self.builder_.emit(relax.op.strided_slice(
                data, [2, 3], [crop_y, crop_x], [crop_y + rows_y, crop_x + rows_x]))
        (y0, y1), (x0, x1) = spans
        kept = np.ascontiguousarray(weight[:, :, y0:y1 + 1, x0:x1 + 1])
        self.stats["convolutions"] += 1
        self.stats["taps_dropped"] += weight.shape[2] * weight.shape[3] - kept.shape[2] * kept.shape[3]
        return relax.op.nn.conv2d(
            data, relax.const(kept), strides=[axis.stride for axis in geometry], padding=[top, left, bottom, right],
            dilation=[axis.dilation if k > 1 else 1 for axis, k in zip(geometry, kept.shape[2:])],
            groups=int(attrs.groups), data_layout="NCHW", kernel_layout="OIHW", out_layout=attrs.out_layout,
            out_dtype=attrs.out_dtype)


@tvm.transform.module_pass(opt_level=0, name="relaxc.DropPaddingTaps")
class DropPaddingTaps:
    """Shrink every NCHW convolution with constant weights to the taps that read its input.

    ``summary()`` (``report()["conv_taps"]``): ``convolutions`` shrunk (a region counts as one),
    ``taps_dropped`` in all, ``regions`` the split convolutions became."""

    report_key = "conv_taps"

    def __init__(self) -> None:
        self.stats = {"convolutions": 0, "taps_dropped": 0, "regions": 0}

    def summary(self) -> dict:
        return dict(self.stats)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.stats = {"convolutions": 0, "taps_dropped": 0, "regions": 0}
        return map_relax_functions(mod, _DropTaps(mod, self.stats).visit_expr)
