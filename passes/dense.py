"""Dense layers with constant weights: the weights packed into column panels at compile time.

A matmul ``x @ W`` with a constant ``W`` (K x N) (ONNX MatMul, Gemm after its transpose is folded,
every projection of a transformer) reads W column-wise: each output tile needs a K-long strip of
``panel`` adjacent columns, rows N floats apart. Re-laid as ``[N / panel, K, panel]`` (the weight
layout ``KN{panel}n``, converted once here, at compile time) each strip is one contiguous block that
the hardware prefetcher streams and that stays in L2 while every row tile of x is multiplied with
it (``schedules/cpu/dense.py`` orders the loops that way). Measured on a 2-core AVX-512 VM for
192x3072 by 3072x768: 35 GFLOP/s unpacked, 160 GFLOP/s packed.

The kernel is emitted here as a TE compute (``dense_packed``) so FuseOps fuses its epilogue (bias,
GELU, residual add) into it as for any matmul. Rows (the product of x's leading dims) that no good
register tile divides (ViT's 197 tokens), and dynamic ones (a sequence length), are padded inside
the kernel to the tile's multiple; the padding never leaves it. The panel width and the tile's rows fit the target's vector registers
(``register_tile``: 8 rows by 3 vectors on AVX-512, 6 by 2 on AVX2, where N allows); an N that no
panel divides (a language model's 50,257-word vocabulary) gets zero weight columns up to the next
panel, computed and never stored. A single-row product (a CNN's classifier head, batch 1) stays as
it is: it reads every weight once in any layout, and the ``Tiled`` rule reads 8 adjacent vectors of
a weight row at a time; so does an outer product (K = 1). Where no vector divides such a product's
N (21,841 classes), its weight gets zero columns up to whole vectors and the product is sliced back.
"""

from __future__ import annotations

import math
from typing import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te

from relaxc.passes.ir import (OUT_ELEMWISE_FUSABLE, aligned_empty, batched_shape, constant, constant_array, dims_of,
                              is_op, rewrite_emitting, static_shape)
from relaxc.support.targets import ByteDot, accumulators

ROW_TILE_MAX = 8  # rows of a register tile: more rows means more broadcast streams than L1 serves
PRODUCT_FEWEST_ROWS = 6  # a product of computed operands (Tiled's tiles) keeps rows that 8, 7 or 6 divide
SHORTEST_VECTOR = 4  # a single-row product whose N no vector this long divides is padded to whole vectors
TILE_VECTORS = (3, 4, 2, 1)  # panel widths in vectors, preferred in this order (measured below)
TILE_VECTORS_BYTES = (4, 2, 1)  # uint8 x int8: panel widths in vectors of int32 lanes (byte_tile)
PANEL_ATTR = "relaxc.panel"  # on the dense_packed block: columns per weight panel, for its schedule
ROW_TILE_ATTR = "relaxc.row_tile"  # on the dense_packed block: rows of its register tile
TILE_ALIGNED_ATTR = "relaxc.tile_aligned"  # 1 if x is one matrix: a tile of flattened rows is a tile of x


@dataclass(frozen=True)
class Tile:
    """A register tile: ``rows`` rows of x by a panel of ``vectors`` vectors of weight columns."""

    rows: int
    vectors: int


def register_tile(columns: int, lanes: int, registers: int) -> Tile:
    """The register tile for an N = ``columns`` product on a CPU with ``registers`` vector registers.

    Three quarters of the registers hold accumulators, the rest the panel's vectors and a broadcast
    of x. Wide panels win: each broadcast of x feeds ``vectors`` FMAs. Measured (2 cores, hot
    weights, GFLOP/s for 197x3072 by 3072x768 and 197x768 by 768x768): AVX-512 8x2 242/210, 8x3
    302/230, 6x4 278/243, 12x2 222; AVX2 (16 registers) 8x2 86/41 (spilled), 6x2 164/146, 4x3
    167/149, 3x4 127/117. Chosen: the first preferred width that needs no column padding, else the
    first whose padding stays within 3 % of N, else the one padding least."""
    budget = accumulators(registers)
    tiles = [Tile(min(ROW_TILE_MAX, budget // v), v) for v in TILE_VECTORS if budget // v >= 4]
    waste = {t: round_up(columns, t.vectors * lanes) - columns for t in tiles}
    return min(tiles, key=lambda t: (waste[t] > 0, waste[t] * 32 > columns,  # min keeps the first of equals
                                     waste[t] if waste[t] * 32 > columns else 0))


def row_tile(rows: int, limit: int = ROW_TILE_MAX, fewest: int | None = None) -> int:
    """Rows of a register tile of at most ``limit`` rows for a ``rows``-row product: all of them
    when few, else the most from ``limit`` down to ``fewest`` (one fewer by default) that divide
    ``rows``, else ``limit`` (the kernel pads rows up to it). Two fewer gave AVX2's 6 x 2 tile 4
    rows, 8 accumulators: 196 x 512 by 512 x 2048 (MLP-Mixer's MLP) took 4.5 ms against 3.7 padded
    to 198 rows, 50 x 768 by 768 x 3072 2.8 against 2.4 (Zen 3, 2 threads)."""
    if rows <= limit:
        return rows
    fewest = limit - 1 if fewest is None else fewest
    return next((t for t in range(limit, fewest - 1, -1) if rows % t == 0), limit)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pack_panels(weights: np.ndarray, panel: int) -> np.ndarray:
    """Weights (..., K, N) in column panels (..., ceil(N / panel), K, panel), the columns past N
    zero: each panel contiguous (the ``KN{panel}n`` layout), in memory ``ir.constant`` shares."""
    *lead, depth, columns = weights.shape
    padded = round_up(columns, panel)
    if padded != columns:
        weights = np.pad(weights, [(0, 0)] * (len(lead) + 1) + [(0, padded - columns)])
    panels = np.swapaxes(weights.reshape(*lead, depth, padded // panel, panel), -3, -2)
    packed = aligned_empty(panels.shape, weights.dtype)
    packed[...] = panels
    return packed


def pack_bytes(weights: np.ndarray, dot: ByteDot, panel: int) -> np.ndarray:
    """int8 weights (K, N) packed (ceil(N / panel), ceil(K / depth), panel, depth) as ``dot.weights``:
    each column's ``depth`` consecutive rows of K together (``K{k/d}N{panel}n{d}k``), as one byte dot
    product instruction reads them for a vector of columns, a panel's vectors side by side (one
    contiguous strip per register tile, as ``pack_panels`` lays float weights); the columns and rows
    past N and K zero."""
    depth, columns = weights.shape
    group = dot.depth
    padded = np.pad(weights, ((0, round_up(depth, group) - depth), (0, round_up(columns, panel) - columns)))
    groups = padded.reshape(-1, group, padded.shape[1] // panel, panel).transpose(2, 0, 3, 1)
    packed = aligned_empty(groups.shape, dot.weights)
    packed[...] = groups
    return packed


def byte_tile(rows: int, blocks: int, registers: int) -> Tile:
    """The register tile of a uint8 x int8 product with ``blocks`` vectors of columns: the most of 4
    that divides them (each broadcast group of a row's bytes feeds one instruction a vector), rows
    as many as the accumulators leave, down to half as many that divide the product's rows.
    Measured (2 threads, AVX-512 VNNI, 128 x 768 x 768): 4 x 4 485 GOPS, 8 x 4 354 (spilled), 8 x 2 331."""
    vectors = next(v for v in TILE_VECTORS_BYTES if blocks % v == 0)
    limit = min(ROW_TILE_MAX, accumulators(registers) // vectors)
    return Tile(row_tile(rows, limit, max(1, limit // 2)), vectors)


def padded_rows(rows: int, limit: int = ROW_TILE_MAX, fewest: int | None = None) -> int:
    """Rows as the kernel computes them: a whole number of register tiles."""
    return round_up(rows, row_tile(rows, limit, fewest))


def dense_packed(data: te.Tensor, packed: te.Tensor, columns: int, tile_rows: int) -> te.Tensor:
    """``data`` (..., M, K) times the packed weights (ceil(N / panel), K, panel): (..., M, N), in
    register tiles of at most ``tile_rows`` rows; uint8 data times int8 weights ``pack_bytes``
    packed, summed in int32. With dynamic dims (M's, or the matrices' before it) the product is
    computed per matrix, M padded to whole tiles (``_dense_dynamic``)."""
    if not all(isinstance(d, tvm.tirx.IntImm) for d in data.shape):
        return _dense_dynamic(data, packed, columns, tile_rows)
    *lead, depth = (int(d) for d in data.shape)
    rows = math.prod(lead)
    padded = padded_rows(rows, tile_rows)
    if len(packed.shape) == 4:  # pack_bytes
        blocks, groups, panel, group = (int(d) for d in packed.shape)
        width, reach = blocks * panel, groups * group
        weight = lambda k, j: packed[j // panel, k // group, j % panel, k % group].astype("int32")  # noqa: E731
        widened = lambda value: value.astype("int32")  # noqa: E731
    else:
        blocks, reach, panel = (int(d) for d in packed.shape)
        width = blocks * panel
        weight = lambda k, j: packed[j // panel, k, j % panel]  # noqa: E731
        widened = lambda value: value  # noqa: E731

    def unflatten(r):
        index = []
        for size in reversed(lead):
            index.append(r % size)
            r = r // size
        return index[::-1]

    if (padded, reach) == (rows, depth):
        source = lambda r, k: data[(*unflatten(r), k)]  # noqa: E731
    else:  # rows padded, K to whole byte groups (only K's padding adds to the test: records match)
        inside = (lambda r, k: r < rows) if reach == depth else (lambda r, k: tvm.tirx.all(r < rows, k < depth))
        column = (lambda k: k) if reach == depth else (lambda k: te.min(k, depth - 1))
        pad = te.compute((padded, reach), lambda r, k: te.if_then_else(
            inside(r, k), data[(*unflatten(te.min(r, rows - 1)), column(k))],
            tvm.tirx.const(0, data.dtype)), name="dense_rows_pad")
        source = lambda r, k: pad[r, k]  # noqa: E731
    k = te.reduce_axis((0, reach), name="k")
    aligned = int(math.prod(lead[:-1]) == 1)
    product = te.compute((padded, width), lambda r, j: te.sum(
        widened(source(r, k)) * weight(k, j), axis=k), name="dense_packed",
        attrs={PANEL_ATTR: panel, ROW_TILE_ATTR: row_tile(rows, tile_rows), TILE_ALIGNED_ATTR: aligned})

    def unpadded(*index):
        flat = 0
        for i, size in zip(index[:-1], lead):
            flat = flat * size + i
        return product[flat, index[-1]]

    return te.compute((*lead, columns), unpadded, name="dense_unpad")


def _dense_dynamic(data: te.Tensor, packed: te.Tensor, columns: int, tile_rows: int) -> te.Tensor:
    """``dense_packed`` of data whose leading dims are dynamic: the matrices (the dims before M,
    flattened) by M padded up to a multiple of ``tile_rows``, each register tile within one matrix,
    so that the epilogue computed on a tile reads that tile alone (a tile of flattened rows may
    straddle two matrices: ``schedules/cpu/dense.py``). The padding rows read the last row again
    (their products are never stored): a padded copy of the rows cost every size a pass over x
    (BERT at 384 tokens: 0.4 ms of 8.8). Float weights only.

    One row per matrix (a decode step's ``[batch, 1, K]``) is one matrix of ``batch`` rows: padded
    per matrix, batch 4 computed 4 tiles for 4 rows (GPT-2's LM head: 20.3 ms a step against 5.8 at
    batch 1)."""
    *lead, rows, depth = data.shape
    blocks, reach, panel = (int(d) for d in packed.shape)
    if len(lead) == 1 and isinstance(rows, tvm.tirx.IntImm) and int(rows) == 1:
        return _dense_rows(data, packed, columns, tile_rows)
    matrices = math.prod(lead) if lead else tvm.tirx.const(1, "int64")
    padded = (rows + tile_rows - 1) // tile_rows * tile_rows

    def unflatten(m):  # the outermost index as it is: TVM reads no op pattern through a % of a dynamic dim
        index = []
        for size in reversed(lead[1:]):
            index.append(m % size)
            m = m // size
        return [m, *index[::-1]] if lead else []

    k = te.reduce_axis((0, reach), name="k")
    product = te.compute((matrices, padded, blocks * panel), lambda m, r, j: te.sum(
        data[(*unflatten(m), te.min(r, rows - 1), k)] * packed[j // panel, k, j % panel], axis=k), name="dense_packed",
        attrs={PANEL_ATTR: panel, ROW_TILE_ATTR: tile_rows, TILE_ALIGNED_ATTR: 1})

    def unpadded(*index):
        flat = 0
        for i, size in zip(index[:-2], lead):
            flat = flat * size + i
        return product[flat, index[-2], index[-1]]

    return te.compute((*lead, rows, columns), unpadded, name="dense_unpad")


def _dense_rows(data: te.Tensor, packed: te.Tensor, columns: int, tile_rows: int) -> te.Tensor:
    """``_dense_dynamic`` of ``[batch, 1, K]`` data: its ``batch`` rows padded up to whole tiles."""
    batch, _, _ = data.shape
    blocks, reach, panel = (int(d) for d in packed.shape)
    k = te.reduce_axis((0, reach), name="k")
    product = te.compute(((batch + tile_rows - 1) // tile_rows * tile_rows, blocks * panel), lambda r, j: te.sum(
        data[te.min(r, batch - 1), 0, k] * packed[j // panel, k, j % panel], axis=k), name="dense_packed",
        attrs={PANEL_ATTR: panel, ROW_TILE_ATTR: tile_rows, TILE_ALIGNED_ATTR: 1})
    return te.compute((batch, 1, columns), lambda b, _, j: product[b, j], name="dense_unpad")


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, lanes: int, registers: int, dot: ByteDot | None, stats: dict) -> None:
        super().__init__(mod)
        self.lanes = lanes
        self.registers = registers
        self.dot = dot
        self.stats = stats
        self.packed: dict[tuple, relax.Expr] = {}  # each weight packed once: a decoder's two steps share it

    def _shared(self, weight: relax.Expr, panel: int, pack: Callable[[], np.ndarray]) -> relax.Expr:
        """``constant(pack())``, made once for each weight and panel width."""
        key = (weight, panel)
        if key not in self.packed:
            self.packed[key] = constant(pack())
        return self.packed[key]

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not is_op(call, "relax.matmul"):
            return call
        data, weight = call.args
        shape = static_shape(data)
        if shape is None:
            return self._dynamic(call)
        if len(shape) >= 2 and data.ty.dtype == "uint8" and self.dot is not None:
            return self._bytes(call, shape)
        if len(shape) < 2 or data.ty.dtype != "float32":
            return call
        w = constant_array(weight)
        if w is None:
            return self._pad(call, shape, static_shape(weight))
        if w.dtype != np.float32 or w.ndim != 2:
            return call
        depth, columns = w.shape
        rows = math.prod(shape[:-1])
        tile = register_tile(columns, self.lanes, self.registers)
        panel = tile.vectors * self.lanes
        if depth != shape[-1] or rows == 1 or depth == 1:
            self.stats["unpacked"] += 1
            return call if depth != shape[-1] or depth == 1 else self._whole_vectors(call, w)  # one row
        packed = self._shared(weight, panel, lambda: pack_panels(w, panel))
        self.stats["packed"] += 1
        self.stats["padded_rows"] += padded_rows(rows, tile.rows) - rows
        self.stats["padded_columns"] += int(packed.ty.shape.values[0]) * panel - columns
        return self.builder_.call_te(dense_packed, data, packed, columns, tile.rows,
                                     primfunc_name_hint="dense_packed")

    def _dynamic(self, call: relax.Call) -> relax.Expr:
        """A float matmul by constant weights whose rows are dynamic: packed as a static one,
        its rows in whole register tiles of the most rows the target's registers allow."""
        data, weight = call.args
        shape, w = dims_of(data), constant_array(weight)
        if w is None and data.ty.dtype == "float32":  # attention's products, over a dynamic batch (ViT's 197 tokens)
            a, b = batched_shape(data), batched_shape(weight)
            return call if a is None or b is None else self._pad(call, a, b)
        if shape is None or len(shape) < 2 or not isinstance(shape[-1], int) or data.ty.dtype != "float32" \
                or w is None or w.dtype != np.float32 or w.ndim != 2 or w.shape[0] != shape[-1] or 1 in w.shape:
            return call
        tile = register_tile(w.shape[1], self.lanes, self.registers)
        panel = tile.vectors * self.lanes
        packed = self._shared(weight, panel, lambda: pack_panels(w, panel))
        self.stats["packed"] += 1
        self.stats["padded_columns"] += int(packed.ty.shape.values[0]) * panel - w.shape[1]
        return self.builder_.call_te(dense_packed, data, packed, w.shape[1], tile.rows,
                                     primfunc_name_hint="dense_packed",  # TVM reads opaque through its clamped rows
                                     primfunc_attrs={"op_pattern": OUT_ELEMWISE_FUSABLE})

    def _bytes(self, call: relax.Call, shape: tuple[int, ...]) -> relax.Expr:
        """A uint8 x int8 product summed in int32 (``passes/integer_matmul.py``): its weights
        ``pack_bytes`` packed for the target's byte dot product, in panels of ``byte_tile``'s vectors."""
        w = constant_array(call.args[1])
        rows = math.prod(shape[:-1])
        if w is None or w.dtype != np.int8 or w.ndim != 2 or call.ty.dtype != "int32" \
                or (rows == 1 and self.dot.pairs is None):  # saturated pairs: onnxruntime's single rows have them
            self.stats["unpacked"] += 1
            return call
        depth, columns = w.shape
        lanes = self.dot.lanes
        tile = byte_tile(rows, -(-columns // lanes), self.registers)
        panel = tile.vectors * lanes
        packed = self._shared(call.args[1], panel, lambda: pack_bytes(w, self.dot, panel))
        self.stats["packed"] += 1
        self.stats["padded_rows"] += padded_rows(rows, tile.rows) - rows
        self.stats["padded_columns"] += int(packed.ty.shape.values[0]) * panel - columns
        return self.builder_.call_te(dense_packed, call.args[0], packed, columns, tile.rows,
                                     primfunc_name_hint="dense_packed")

    def _whole_vectors(self, call: relax.Call, w: np.ndarray) -> relax.Expr:
        """A single-row product whose N no vector of ``SHORTEST_VECTOR`` lanes divides: zero weight
        columns up to whole vectors, then sliced back. Unpadded, its columns ran one at a time, each
        a strided walk down the row-major weight (TinyViT's 320 x 21,841 ImageNet-22k head: 40 ms,
        0.54 ms padded, on Zen 3)."""
        columns = w.shape[1]
        if math.gcd(columns, self.lanes) >= SHORTEST_VECTOR:  # 1,000 classes: vectors of 8 on AVX-512
            return call
        padded = np.pad(w, ((0, 0), (0, round_up(columns, self.lanes) - columns)))
        self.stats["padded_columns"] += padded.shape[1] - columns
        product = self.builder_.emit(relax.op.matmul(call.args[0], constant(padded)))
        ndim = len(static_shape(call.args[0]))
        return relax.op.strided_slice(product, [ndim - 1], [0], [columns])

    def _pad(self, call: relax.Call, a: tuple[int, ...], b: tuple[int, ...] | None) -> relax.Expr:
        """A product of two computed operands (attention) whose rows or columns no register tile or
        vector divides (ViT's 197 tokens): computed on zero-padded operands, then sliced back."""
        if b is None or len(a) != len(b) or len(a) < 3:
            return call
        rows, columns = a[-2], b[-1]
        new_rows = padded_rows(rows, fewest=PRODUCT_FEWEST_ROWS)
        new_columns = columns if columns < self.lanes else round_up(columns, self.lanes)
        if (new_rows, new_columns) == (rows, columns):
            return call
        self.stats["padded_matmuls"] += 1
        zeros = [0] * (2 * len(a))
        a_pad = relax.op.nn.pad(call.args[0], zeros[:-3] + [new_rows - rows, 0, 0])
        b_pad = relax.op.nn.pad(call.args[1], zeros[:-1] + [new_columns - columns])
        product = self.builder_.emit(relax.op.matmul(a_pad, b_pad))
        return relax.op.strided_slice(product, [len(a) - 2, len(a) - 1], [0, 0], [rows, columns])


@tvm.transform.module_pass(opt_level=0, name="relaxc.PackDenseWeights")
class PackDenseWeights:
    """Rewrite matmuls with a constant 2-D weight into ``dense_packed`` kernels with packed weights
    (uint8 x int8 ones too, for ``dot``, the target's byte dot product, where it has one).

    Products of two computed operands (attention scores and context) whose rows or columns no
    register tile or vector divides are computed on zero-padded operands and sliced back.

    ``summary()`` (``report()["dense"]``): ``packed`` matmuls, ``unpacked`` ones (single rows,
    K = 1), ``padded_rows`` and ``padded_columns`` added in all, ``padded_matmuls`` (products of
    computed operands padded)."""

    report_key = "dense"

    def __init__(self, lanes: int, registers: int, dot: ByteDot | None = None) -> None:
        self.lanes = lanes
        self.registers = registers
        self.dot = dot
        self.stats = {"packed": 0, "unpacked": 0, "padded_rows": 0, "padded_columns": 0, "padded_matmuls": 0}

    def summary(self) -> dict:
        return dict(self.stats)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        self.stats = {"packed": 0, "unpacked": 0, "padded_rows": 0, "padded_columns": 0, "padded_matmuls": 0}
        return rewrite_emitting(mod, _Rewriter(mod.clone(), self.lanes, self.registers, self.dot, self.stats))
