"""Integer convolutions summed as onnxruntime sums them where the byte dot product saturates pairs
of products to int16 (``vpmaddubsw``: no VNNI), or summed exactly despite it.

onnxruntime's kernels there saturate too, so the sums are made to pair the same products: an odd
number of input channels' convolution over its taps as channels (``taps_as_channels``), a grouped
one's risky pairs computed apart (``grouped_in_pairs``). What onnxruntime sums exactly there (its
depthwise kernel, ``ConvInteger``, unrequantized results, int8 activations: its int8 kernels) is
summed exactly, as two nibbles' sums (``nibbles``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from tvm import relax, s_tir, te, tirx

from relaxc.passes.ir import IS_SCHEDULED, OUT_ELEMWISE_FUSABLE, SCHEDULE_ATTR, static_shape
from relaxc.passes.quantized.common import FLOAT_EXACT

RISKY_PAIR = 129  # |w0| + |w1| of same-sign weights from which 255 (|w0| + |w1|) leaves int16


def nibbles(builder: relax.BlockBuilder, data: relax.Expr, conv: Callable[[relax.Expr], relax.Expr]) -> relax.Expr:
    """``conv`` (or a matmul) of uint8 ``data`` summed exactly on a byte dot product that
    saturates pairs of products: 16 conv(data >> 4) + conv(data & 15), whose pairs stay within
    int16 (15 x 128 x 2)."""
    norm = builder.normalize
    high = conv(norm(relax.op.right_shift(data, relax.const(4, "uint8"))))
    low = conv(norm(relax.op.bitwise_and(data, relax.const(15, "uint8"))))
    return norm(relax.op.add(norm(relax.op.multiply(high, relax.const(16, "int32"))), low))


def taps_as_channels(builder: relax.BlockBuilder, data: relax.Expr, weights: np.ndarray, strides: list[int],
                     dilation: list[int], out: tuple[int, ...], groups: int) -> tuple[relax.Expr, np.ndarray]:
    """A convolution of an odd number of input channels (an image's 3), or a grouped one, over
    padded ``data`` as a 1x1 one over its taps' channels, ordered (row, column, channel) by
    group (im2col), for a byte dot product that saturates pairs of products: onnxruntime
    flattens the taps so, so the pairs are its pairs (per tap, the third channel's product would
    pair with a padded zero: ResNet-18 then equalled onnxruntime on 73 % of its outputs, 100 %
    so). Costs ResNet-18's stem 0.5 ms on Zen 3 (the copies of the taps, 1.8 MB, and their
    blocking)."""
    rows, columns = weights.shape[2:]
    flat = weights.transpose(0, 2, 3, 1).reshape(weights.shape[0], -1, 1, 1)
    shape = static_shape(data)
    kernel = _taps(shape, str(data.ty.dtype), rows, columns, strides, dilation, out)
    taps = builder.normalize(relax.call_tir(builder.add_func(kernel, "taps"), [data], relax.TensorType(
        (shape[0], rows, columns, shape[1], *out), data.ty.dtype)))
    if groups > 1:  # (N, rows, columns, C, ...) to (N, groups, rows, columns, C / groups, ...)
        taps = builder.normalize(relax.op.permute_dims(builder.normalize(relax.op.reshape(
            taps, (shape[0], rows * columns, groups, shape[1] // groups, *out))), [0, 2, 1, 3, 4, 5]))
    return builder.normalize(relax.op.reshape(taps, (shape[0], -1, *out))), flat


def grouped_in_pairs(builder: relax.BlockBuilder, data: relax.Expr, weights: np.ndarray, groups: int,
                     strides: list[int]) -> relax.Expr:
    """A grouped 1x1 convolution of uint8 ``data`` summed as a byte dot product that saturates
    pairs of products does (onnxruntime's grouped convolutions without VNNI), in int32: the
    exact sum (in float32), less what saturation takes off the few pairs that can saturate.
    Only a pair of weights of one sign with |w0| + |w1| >= 129 can (255 (|w0| + |w1|) > 32767;
    of opposite signs the sum stays within 255 x 128): each such pair's product is computed
    apart (its two channels gathered, a convolution of groups of 2) and its excess over int16
    subtracted from its output channel. RegNet-X-400MF on Zen 3: 71.6 ms when every pair was
    computed apart."""
    norm = builder.normalize
    outputs, depth = weights.shape[:2]
    flat = weights.reshape(outputs, depth).astype(np.int64)
    total = _grouped_exactly(builder, data, weights, groups, strides)
    paired = np.pad(flat, ((0, 0), (0, depth % 2))).reshape(outputs, -1, 2)
    risky = (paired[..., 0] * paired[..., 1] > 0) & (np.abs(paired).sum(axis=2) >= RISKY_PAIR)
    if not risky.any():
        return total
    output, pair = np.nonzero(risky)
    first = output // (outputs // groups) * depth + 2 * pair
    channels = np.stack([first, first + 1], axis=1).reshape(-1)
    gathered = norm(relax.op.astype(norm(relax.op.take(data, relax.const(channels.astype(np.int64)), axis=1)),
                                    "float32"))
    products = norm(relax.op.nn.conv2d(gathered, relax.const(paired[output, pair].reshape(-1, 2, 1, 1).astype(
        np.float32)), strides=strides, groups=len(output)))
    excess = norm(relax.op.subtract(products, norm(relax.op.clip(products, -32768, 32767))))
    owners = np.zeros((outputs, len(output), 1, 1), np.float32)
    owners[output, np.arange(len(output))] = 1
    lost = norm(relax.op.nn.conv2d(excess, relax.const(owners)))  # each excess to its output channel
    return norm(relax.op.subtract(total, norm(relax.op.astype(lost, "int32"))))


def _grouped_exactly(builder: relax.BlockBuilder, data: relax.Expr, weights: np.ndarray, groups: int,
                     strides: list[int]) -> relax.Expr:
    """The exact int32 sum of a grouped 1x1 convolution of uint8 ``data``: in float32 where
    every partial sum is an integer below ``FLOAT_EXACT``, else as its two nibbles' sums."""
    norm = builder.normalize

    def summed(data: relax.Expr) -> relax.Expr:
        return norm(relax.op.astype(norm(relax.op.nn.conv2d(
            norm(relax.op.astype(data, "float32")), relax.const(weights.astype(np.float32)), strides=strides,
            groups=groups)), "int32"))

    if 255 * int(np.abs(weights).reshape(len(weights), -1).sum(axis=1).max()) < FLOAT_EXACT:
        return summed(data)
    return nibbles(builder, data, summed)


def _taps(shape: tuple[int, ...], dtype: str, rows: int, columns: int, strides: list[int], dilation: list[int],
          out: tuple[int, ...]) -> tirx.PrimFunc:
    """The kernel copying the taps of a ``rows`` x ``columns`` convolution over padded NCHW data of
    ``shape``: (N, rows, columns, C, out height, out width), one output row an iteration of one
    parallel loop (scheduled here: the default rule's 8-lane tiles recomputed five divisions each,
    1.4 ms for ResNet-18's stem where this takes 0.1)."""
    data = te.placeholder(shape, dtype, "data")
    taps = te.compute((shape[0], rows, columns, shape[1], *out), lambda n, r, c, channel, y, x: data[
        n, channel, y * strides[0] + r * dilation[0], x * strides[1] + c * dilation[1]], name="taps")
    sch = s_tir.Schedule(te.create_prim_func([data, taps]))
    *outer, _ = sch.get_loops(sch.get_sblock("taps"))
    sch.parallel(sch.fuse(*outer))
    return sch.mod["main"].with_attrs({IS_SCHEDULED: True, SCHEDULE_ATTR: "taps", "op_pattern": OUT_ELEMWISE_FUSABLE})
