"""The layout algebra: NCHW and the blocked NCHW{b}c layouts, each registered with its converters
to and from the standard layout (Relax ``layout_transform`` with an index map and a pad value), and
the compile-time packing of weights and constants into a blocked layout, channels zero-padded to
the block. ``passes/layout.py`` rewrites a graph with it; ``passes/layout_choice.py`` prices it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from tvm import relax


@dataclass(frozen=True)
class Layout:
    """A registered activation layout and its converters; ``block == 0`` is standard NCHW."""

    name: str
    block: int = 0

    @property
    def standard(self) -> bool:
        return self.block == 0

    def padded(self, channels: int) -> int:
        """Channels as stored: rounded up to a whole number of blocks."""
        return channels if self.standard else -(-channels // self.block) * self.block

    def from_standard_map(self) -> Callable:
        b = self.block
        return lambda n, c, h, w: (n, c // b, h, w, c % b)

    def to_standard_map(self) -> Callable:
        b = self.block
        return lambda n, co, h, w, ci: (n, co * b + ci, h, w)

    def from_standard(self, x: relax.Expr) -> relax.Expr:
        """NCHW to this layout; the channels missing from the last block are zeros."""
        return relax.op.layout_transform(x, self.from_standard_map(), pad_value=0)

    def to_standard(self, x: relax.Expr, channels: int) -> relax.Expr:
        """This layout to NCHW, slicing the padded channels off."""
        full = relax.op.layout_transform(x, self.to_standard_map())
        if channels == self.padded(channels):
            return full
        return relax.op.strided_slice(full, axes=[1], begin=[0], end=[channels])


STANDARD = Layout("NCHW")
REGISTRY: dict[str, Layout] = {STANDARD.name: STANDARD}


def blocked(block: int) -> Layout:
    """The NCHW{block}c layout, registered on first use."""
    return REGISTRY.setdefault(f"NCHW{block}c", Layout(f"NCHW{block}c", block))


def pad_channels(array: np.ndarray, axis: int, to: int, value: float = 0.0) -> np.ndarray:
    """``array`` with ``axis`` padded at the end up to ``to`` entries of ``value``."""
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, to - array.shape[axis])
    return np.pad(array, widths, constant_values=value)


def pack_conv_weight(weight: np.ndarray, groups: int, in_block: int,
                     out_block: int) -> tuple[np.ndarray, str, int] | None:
    """OIHW weight to the blocked kernel layout: (kernel, kernel layout, groups), None if unsupported.

    Dense and grouped convs (whole blocks per group) use OIHW{i}i{o}o; depthwise convs use
    OIHW1i{b}o with one group per padded channel. Groups narrower than a block (RegNet's 8
    channels, ResNeXt's 4) are merged into block-wide groups first (``merge_groups``) where the
    merged conv has as many output blocks as the padded original (5 groups of 8 channels merged by
    4 would write 8 blocks for 5: such convs take the windowed form, ``None`` here). Padded
    output channels get zero weights, so they compute zeros; padded input channels get zero
    weights, so whatever they hold is ignored.
    """
    out_ch, in_per_group, kh, kw = weight.shape
    if groups > 1 and in_per_group > 1 and in_block == out_block and in_block % in_per_group == 0 \
            and in_per_group < in_block:
        merged, merged_groups = merge_groups(weight, groups, in_block // in_per_group)
        if -(-merged.shape[0] // out_block) == -(-out_ch // out_block):  # else the zero groups add blocks
            weight, groups = merged, merged_groups
            out_ch, in_per_group, kh, kw = weight.shape
    if groups > 1 and in_per_group == 1 and out_ch == groups:  # depthwise
        if in_block != out_block:
            return None
        padded = -(-out_ch // out_block) * out_block
        kernel = pad_channels(weight, 0, padded).reshape(padded // out_block, out_block, 1, kh, kw)
        return (np.ascontiguousarray(kernel.transpose(0, 2, 3, 4, 1)[:, :, :, :, None, :]),
                f"OIHW1i{out_block}o", padded)
    if groups > 1 and (in_per_group % in_block or (out_ch // groups) % out_block):
        return None  # a group boundary inside a block: keep the standard layout
    out_pad = -(-out_ch // out_block) * out_block
    in_pad = -(-in_per_group // in_block) * in_block
    kernel = pad_channels(pad_channels(weight, 0, out_pad), 1, in_pad)
    kernel = kernel.reshape(out_pad // out_block, out_block, in_pad // in_block, in_block, kh, kw)
    return np.ascontiguousarray(kernel.transpose(0, 2, 4, 5, 3, 1)), f"OIHW{in_block}i{out_block}o", groups


def window_firsts(out_channels: int, groups: int, in_per_group: int, block: int, in_blocks: int) -> tuple[list[int], int]:
    """Per output block of a grouped conv, the first input block it reads, and how many it reads.

    An output block's channels belong to one or more consecutive groups; it reads the input blocks
    holding their input channels. The first block is ``conv2d_nchwc``'s formula (the two must
    agree): the one holding the block's first group's first channel, moved back where the window
    would run past the last input block."""
    out_per_group = out_channels // groups
    spans = []
    for first_channel in range(0, out_channels, block):
        first_group = first_channel // out_per_group
        last_group = (min(first_channel + block, out_channels) - 1) // out_per_group
        start = first_group * in_per_group // block
        spans.append((start, ((last_group + 1) * in_per_group - 1) // block - start + 1))
    width = min(in_blocks, max(n for _, n in spans))
    return [min(start, in_blocks - width) for start, _ in spans], width


def pack_windowed_conv_weight(weight: np.ndarray, groups: int, block: int, in_blocks: int) -> np.ndarray:
    """OIHW weight of a grouped conv whose groups do not align with the blocks, as the
    OIHW{b}i{b}o kernel of ``conv2d_nchwc(window=...)``: for each output block, its window of
    input blocks, zero outside each output channel's group. Multiply-adds: the window's, not the
    whole input's (ShuffleNet's 4 groups of 34 of 136 channels: windows of 5 of 9 blocks)."""
    out_channels, in_per_group, kh, kw = weight.shape
    firsts, width = window_firsts(out_channels, groups, in_per_group, block, in_blocks)
    kernel = np.zeros((len(firsts), width, kh, kw, block, block), weight.dtype)
    offsets = np.arange(in_per_group)
    for channel in range(out_channels):
        o, lane = divmod(channel, block)
        inputs = channel // (out_channels // groups) * in_per_group + offsets
        kernel[o, inputs // block - firsts[o], :, :, inputs % block, lane] = weight[channel]
    return kernel


def merge_groups(weight: np.ndarray, groups: int, factor: int) -> tuple[np.ndarray, int]:
    """The OIHW weight of a grouped conv as one with ``factor`` times wider groups: (weight, groups).

    Each merged group's weight is block-diagonal (zeros between the groups it merges), and a last
    merged group short of ``factor`` groups gets zero output channels, so the conv computes the
    same values; its groups now fill the channel block, so it runs blocked instead of in NCHW, at
    ``factor`` times the multiply-adds (RegNetY-400MF's group-8 convs on 16-lane blocks: its kernels
    7.7 ms blocked, 15.3 ms in NCHW at about 5 GFLOP/s).
    """
    out_ch, in_per_group, kh, kw = weight.shape
    out_per_group = out_ch // groups
    merged_groups = -(-groups // factor)
    merged = np.zeros((merged_groups * factor * out_per_group, factor * in_per_group, kh, kw), weight.dtype)
    for group in range(groups):
        rows = slice(group * out_per_group, (group + 1) * out_per_group)
        offset = (group % factor) * in_per_group
        merged[rows, offset:offset + in_per_group] = weight[rows]
    return merged, merged_groups


def input_block(channels: int, block: int, multiple: int = 1) -> int:
    """Block of a convolution's input: ``block``, or all the channels in one block when they are
    few (at most half a block): an RGB stem's input is then its 3 channels at each pixel, unpadded.

    Padded to ``block`` lanes a 3-channel stem would do 16/3 of the work, padded to a 4-lane block
    4/3: ResNet-50's 7x7 stem took 1.09-1.35 ms that way and 0.83-1.01 ms on 3 channels (in the
    model, 2 cores). The convolution still writes ``block``-wide output vectors. 8-bit data takes
    a ``multiple`` of 4 channels, the depth of VNNI's dot products.
    """
    return -(-channels // multiple) * multiple if channels <= block // 2 else block


def block_constant(value: np.ndarray, channels: int, layout: Layout, pad_value: float) -> np.ndarray | None:
    """A constant broadcast against an NCHW tensor, re-laid out to broadcast against ``layout``."""
    if value.ndim == 0:
        return value
    if value.ndim > 4:
        return None
    value = value.reshape((1,) * (4 - value.ndim) + value.shape)
    n, c, h, w = value.shape
    if c == 1:
        return value.reshape(n, 1, h, w, 1)
    if c != channels:
        return None
    b = layout.block
    padded = pad_channels(value, 1, layout.padded(c), pad_value)
    return np.ascontiguousarray(padded.reshape(n, -1, b, h, w).transpose(0, 1, 3, 4, 2))
