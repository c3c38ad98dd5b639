"""Operator dispatch: each blocked convolution gets the implementation measured fastest for it.

A 3x3 stride-1 convolution can run as the direct blocked convolution (``passes/legalize.py``) or
as Winograd F(2x2, 3x3) or F(4x4, 3x3) (``passes/winograd.py``); which is faster depends on the
shape (Winograd's transforms are memory-bound, its product compute-bound) and on the CPU, so the
choice is measured, not ruled: ``choose`` maps each workload and its candidates to one.
All candidates consume and produce the same blocked layout, so per-operator choices are also
the graph's best choice (no converter is ever needed between them).
"""

from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.ir import GenericConst

from relaxc.passes import winograd
from relaxc.passes.dense import Tile, register_tile, round_up
from relaxc.passes.ir import (OUT_ELEMWISE_FUSABLE, aligned_empty, batched_shape, constant, constant_array, is_op,
                              rewrite_emitting, static_shape)

log = logging.getLogger("relaxc")
DIRECT = "direct"
WINOGRAD = {m: f"winograd{m}" for m in winograd.TILE_SIZES}


@dataclass(frozen=True)
class ConvWorkload:
    """What a convolution's cost depends on: shapes and padding (not the weights' values)."""

    data: tuple[int, ...]  # N, C/b, H, W, b
    kernel: tuple[int, ...]  # O/ob, I/ib, kh, kw, ib, ob
    padding: tuple[int, int, int, int]
    dtype: str = "float32"  # the data's: uint8 for a quantized convolution

    @property
    def key(self) -> str:
        return "conv2d_nchwc-" + "x".join(map(str, self.data)) + "-" + "x".join(map(str, self.kernel)) + \
            "-p" + "_".join(map(str, self.padding)) + ("" if self.dtype == "float32" else f"-{self.dtype}")


# (workload, its candidates, the call) -> (the chosen candidate, how it was chosen: for the report)
Chooser = Callable[[ConvWorkload, list[str], relax.Call], tuple[str, dict]]


def candidates(call: relax.Call) -> tuple[ConvWorkload, list[str]] | None:
    """The workload of a blocked float convolution and the implementations that apply to it, or
    None when only the direct one does (a quantized one: ``schedules/cpu/int8.py``). A dynamic
    batch is decided as batch 1 is: the choice follows the image and the channels."""
    if not is_op(call, "relax.nn.conv2d") or not call.attrs.data_layout.endswith("c"):
        return None
    attrs = call.attrs
    data, kernel = batched_shape(call.args[0]), static_shape(call.args[1])
    dtype = str(call.args[0].ty.dtype)
    if data is None or kernel is None or len(kernel) != 6 or dtype != "float32":
        return None
    data = data if isinstance(data[0], int) else (1, *data[1:])
    if (kernel[2:4] != (3, 3) or int(attrs.groups) != 1 or any(int(s) != 1 for s in attrs.strides)
            or any(int(d) != 1 for d in attrs.dilation) or not isinstance(call.args[1], GenericConst)):
        return None
    return ConvWorkload(data, kernel, tuple(int(p) for p in attrs.padding), dtype), [DIRECT, *WINOGRAD.values()]


def blocked_taps(kernel: np.ndarray, panel: int) -> np.ndarray:
    """OIHW{i}i{o}o 3x3 weights (padded channels included) as the nine taps' matrices in column
    panels, (9, ceil(O / panel), I, panel), the columns past O zero: what the weight transform
    multiplies. One copy, in runs of whole channel blocks (unblocking to OIHW, then packing, copied
    every weight twice: ResNet-50's dispatch phase 0.065 s)."""
    outer, inner, kh, kw, ib, ob = kernel.shape
    out_channels = outer * ob
    panels = round_up(out_channels, panel) // panel
    taps = aligned_empty((kh * kw, panels, inner * ib, panel), kernel.dtype)
    taps[:, -1, :, out_channels % panel or panel:] = 0
    split = taps.reshape(kh * kw, panels, inner, ib, panel)  # a view: I split as the kernel splits it
    run = math.gcd(ob, panel)  # output channels that stay together in a block and in a panel
    for first in range(0, out_channels, run):
        block, lane = divmod(first, ob)
        panel_index, column = divmod(first, panel)
        source = kernel[block, :, :, :, :, lane:lane + run].transpose(1, 2, 0, 3, 4)  # (kh, kw, I / ib, ib, run)
        split[:, panel_index, :, :, column:column + run] = source.reshape(kh * kw, inner, ib, run)
    return taps


@dataclass(frozen=True)
class WinogradPlan:
    """The shapes of a Winograd convolution: tile size, product rows and columns, register tile."""

    m: int
    rows: int | tvm.tirx.PrimExpr  # tiles, padded to whole register tiles (V's extra rows are cheap)
    columns: int  # output channels, padded to whole weight panels
    tile: Tile

    @classmethod
    def of(cls, workload: ConvWorkload, m: int, lanes: int, registers: int,
           batch: int | tvm.tirx.PrimExpr | None = None) -> "WinogradPlan":
        """The plan of ``workload``, at ``batch`` images (an expression of a dynamic batch) if given."""
        _, _, height, width, _ = workload.data
        batch = workload.data[0] if batch is None else batch
        top, left, bottom, right = workload.padding
        th, tw = winograd.tiles(height + top + bottom - 2, width + left + right - 2, m)
        out_channels = workload.kernel[0] * workload.kernel[5]
        tile = register_tile(out_channels, lanes, registers)
        panel = tile.vectors * lanes
        rows = (round_up(batch * th * tw, tile.rows) if isinstance(batch, int)
                else (batch * th * tw + tile.rows - 1) // tile.rows * tile.rows)
        return cls(m, rows, round_up(out_channels, panel), tile)

    def scratch_bytes(self, channels: int) -> int:
        """Bytes of V and M, the intermediate tensors."""
        return 4 * (self.m + 2) ** 2 * self.rows * (channels + self.columns)


def tile_size(name: str) -> int:
    return next(m for m, n in WINOGRAD.items() if n == name)


def scratch_bytes(workload: ConvWorkload, name: str, lanes: int, registers: int) -> int:
    """Bytes of intermediate tensors the candidate ``name`` adds (none for the direct convolution)."""
    if name == DIRECT:
        return 0
    channels = workload.data[1] * workload.data[4]
    return WinogradPlan.of(workload, tile_size(name), lanes, registers).scratch_bytes(channels)


class Kernels:
    """``BlockBuilder.call_te`` made once per kernel and argument shapes: every convolution of a
    workload shares its transforms' PrimFuncs (ResNet-50's 13 Winograd convolutions are 4 workloads;
    DenseNet-121's 58 are 4), made by TE once instead of per convolution."""

    def __init__(self, bb: relax.BlockBuilder) -> None:
        self.bb = bb
        self.made: dict[tuple, tuple[relax.GlobalVar, relax.StructInfo]] = {}

    def call(self, function: Callable, tensors: list[relax.Expr], *params,
             pattern: int | None = None) -> relax.Expr:
        """``function``'s kernel applied to ``tensors``; ``pattern``, if given, is the kernel's
        fusion pattern (``op_pattern``), which AnnotateTIROpPattern then keeps instead of deriving it."""
        key = (function.__name__, tuple((str(t.ty.shape), t.ty.dtype) for t in tensors), str(params))
        if key not in self.made:
            func, arguments, output = relax.utils.gen_call_tir_inputs(function, *tensors, *params)
            if pattern is not None:
                func = func.with_attr("op_pattern", pattern)
            dims = arguments[len(tensors):]  # a dynamic dim the kernel reads but no shape of its own gives
            self.made[key] = (self.bb.add_func(func, function.__name__), output, dims)
        gvar, output, dims = self.made[key]
        return relax.call_tir(gvar, [*tensors, *dims], output)


def emit_winograd(kernels: Kernels, call: relax.Call, workload: ConvWorkload, m: int, lanes: int,
                  registers: int) -> relax.Expr:
    """The three Winograd kernels for the blocked 3x3 convolution ``call`` of ``workload`` (its
    batch perhaps dynamic)."""
    plan = WinogradPlan.of(workload, m, lanes, registers, batched_shape(call.args[0])[0])
    taps = blocked_taps(constant_array(call.args[1]), plan.tile.vectors * lanes)
    packed = winograd.transform_weight(taps, m)
    bb = kernels.bb
    v = bb.emit(kernels.call(winograd.winograd_input, [call.args[0]], m, workload.padding, plan.rows))
    product = bb.emit(kernels.call(winograd.winograd_product, [v, constant(packed)], plan.tile.rows))
    # OUT_ELEMWISE_FUSABLE: the output transform takes its elementwise epilogue (bias, activation, residual
    # add) as the direct convolution it replaces does, and is never fused into what follows (a concat,
    # the next convolution's input transform). Derived from its TE compute it would be injective, and
    # those fused kernels are slow to build (VGG-19's compile 11.2 s with them, 8.8 without; Inception
    # v2's 10.2 and 8.3) for no run time gained; the cost is the copy a concat makes of the output
    # transform's tensor (SqueezeNet about 5 %).
    return kernels.call(winograd.winograd_output, [product], m, batched_shape(call), pattern=OUT_ELEMWISE_FUSABLE)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, choose: Chooser, lanes: int, registers: int) -> None:
        super().__init__(mod)
        self.choose = choose
        self.lanes = lanes
        self.registers = registers
        self.choices: list[dict] = []
        self.kernels = Kernels(self.builder_)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        found = candidates(call)
        if found is None:
            return call
        workload, options = found
        choice, how = self.choose(workload, options, call)
        self.choices.append({"workload": workload.key, "choice": choice, **how})
        if choice == DIRECT:
            return call
        return emit_winograd(self.kernels, call, workload, tile_size(choice), self.lanes, self.registers)


@tvm.transform.module_pass(opt_level=0, name="relaxc.Dispatch")
class Dispatch:
    """Give each blocked convolution the implementation ``choose`` picks among its candidates.

    ``summary()`` (``report()["dispatch"]``): per convolution its workload, candidates and choice,
    and the count of each choice."""

    report_key = "dispatch"

    def __init__(self, choose: Chooser, lanes: int, registers: int, measurable: bool = True) -> None:
        self.choose = choose
        self.measurable = measurable  # whether a rule's choice is worth a log line (not with dispatch="rule")
        self.lanes = lanes
        self.registers = registers
        self.choices: list[dict] = []

    def summary(self) -> dict:
        return {"choices": dict(collections.Counter(c["choice"] for c in self.choices)),
                "sources": dict(collections.Counter(c["source"] for c in self.choices)),
                "convolutions": self.choices}

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _Rewriter(mod.clone(), self.choose, self.lanes, self.registers)
        mod = rewrite_emitting(mod, rewriter)
        self.choices = rewriter.choices
        ruled = sum(c["source"] == "rule" for c in self.choices)
        if ruled and self.measurable:
            log.info("dispatch: %d of %d convolutions chosen by rule, not by measurement on this CPU; compile with "
                     "dispatch='measure' once (or run `relaxc tune`) to measure them", ruled, len(self.choices))
        return mod
