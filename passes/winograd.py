"""Winograd convolution F(m x m, 3 x 3) for blocked NCHW{b}c data: three kernels instead of one.

A 3x3 stride-1 convolution computes each m x m output tile from an (m + 2)^2 input tile. Winograd's
minimal filtering (Lavin and Gray, 2016) does it with (m + 2)^2 multiplications per input and output
channel pair instead of 9 m^2: 2.25x fewer for F(2x2, 3x3), 4x fewer for F(4x4, 3x3). Here:

1. ``winograd_input``: every input tile d (alpha x alpha, alpha = m + 2) becomes V = B^T d B,
   stored as alpha^2 matrices V[t] of (tiles x input channels);
2. ``winograd_product``: alpha^2 independent matrix products M[t] = V[t] U[t], with the weights
   U = G g G^T transformed at compile time and packed in column panels as ``passes/dense.py``
   packs dense weights (the ``Dense`` schedule rule tiles it the same way);
3. ``winograd_output``: every output tile Y = A^T M A, in the blocked output layout; FuseOps fuses
   the bias, activation and residual add into it.

Each transform runs in two stages, as it is separable (d B, then B^T (d B); M A, then A^T (M A)),
the first a stage of its own (``STAGE_ATTR``) that the schedule computes per tile in registers.
Each stage's element is one expression with only the nonzero coefficients of the matrices (a
multiplication by 0 is not folded away by LLVM: IEEE says 0 * inf is nan), selected by the
element's position among alpha (or m) expressions; the schedules unroll the positions, so the
selection is resolved at compile time. (One expression selecting among all alpha^2 positions ran
as fast but took TVM 0.46 s to build per F(4x4) input transform against 0.11 s: every unrolled
position is a copy of the whole selection until the simplifier folds it.)

The error grows with the tile: the transforms multiply by up to 8 (F(4x4)) and subtract. Dispatch
measures it against the direct convolution for every workload and refuses a candidate above the
project tolerance (``schedules/dispatch.py``); measured values per tile size in docs/winograd.md.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te, topi

from relaxc.passes.dense import PANEL_ATTR, ROW_TILE_ATTR, TILE_ALIGNED_ATTR
from relaxc.passes.ir import aligned_empty
from relaxc.passes.legalize import STAGE_ATTR

INPUT_ATTR = "relaxc.winograd_input"  # on the input transform's block: the output tile size m
OUTPUT_ATTR = "relaxc.winograd_output"  # on the output transform's block: m

# (A^T, G, B^T) for F(m x m, 3 x 3), from Lavin and Gray, "Fast Algorithms for Convolutional Neural
# Networks" (2016): points 0, -1, 1 (F(2)) and 0, +-1, +-2 (F(4)), and infinity
MATRICES: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {
    2: (np.array([[1, 1, 1, 0],
                  [0, 1, -1, -1]], dtype=np.float64),
        np.array([[1, 0, 0],
                  [1 / 2, 1 / 2, 1 / 2],
                  [1 / 2, -1 / 2, 1 / 2],
                  [0, 0, 1]], dtype=np.float64),
        np.array([[1, 0, -1, 0],
                  [0, 1, 1, 0],
                  [0, -1, 1, 0],
                  [0, 1, 0, -1]], dtype=np.float64)),
    4: (np.array([[1, 1, 1, 1, 1, 0],
                  [0, 1, -1, 2, -2, 0],
                  [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], dtype=np.float64),
        np.array([[1 / 4, 0, 0],
                  [-1 / 6, -1 / 6, -1 / 6],
                  [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6],
                  [0, 0, 1]], dtype=np.float64),
        np.array([[4, 0, -5, 0, 1, 0],
                  [0, -4, -4, 1, 1, 0],
                  [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0],
                  [0, 2, -1, -2, 1, 0],
                  [0, 4, 0, -5, 0, 1]], dtype=np.float64)),
}
TILE_SIZES = tuple(MATRICES)


def tiles(out_h: int, out_w: int, m: int) -> tuple[int, int]:
    """Output tiles along the height and the width (the last ones may stick out of the output)."""
    return -(-out_h // m), -(-out_w // m)


def _combine(coefficients, values):
    """sum(c * v) over the nonzero coefficients, without multiplying by +-1."""
    total = None
    for c, v in zip(coefficients, values):
        if c == 0:
            continue
        term = v if c == 1 else -v if c == -1 else v * float(c)
        total = term if total is None else total + term
    return total


def _select(index: tvm.tirx.PrimExpr, choices: list) -> tvm.tirx.PrimExpr:
    """choices[index] for an index the schedule unrolls (the conditions become constants).

    ``if_then_else``, not ``Select``: TVM vectorises before it unrolls, and a vectorised Select gets
    a broadcast condition that its simplifier does not fold once constant; every unrolled position
    then kept all alpha^2 expressions (F(4x4)'s input transform: 3.3 MB of TIR, 7.4 s to build).
    ``if_then_else`` keeps its scalar condition and folds (1.0 s)."""
    value = choices[-1]
    for i in range(len(choices) - 2, -1, -1):
        value = tvm.tirx.if_then_else(index == i, choices[i], value)
    return value


def transform_weight(taps: np.ndarray, m: int) -> np.ndarray:
    """The nine taps of 3x3 weights packed as the product reads them, (9, ceil(O / panel), I,
    panel) (``passes/dispatch.blocked_taps``), to U = G g G^T in float32, packed the same way:
    (alpha^2, ceil(O / panel), I, panel).

    One matrix product for all channel pairs: U[a alpha + b] = sum G[a, k] G[b, l] g[k, l] is
    kron(G, G) times the nine taps, and with the taps packed first, U lands packed (a 512x512 layer:
    an einsum took 0.2-0.5 s, a float64 product then packing U 49 ms for F(2x2) and 99 ms for F(4x4),
    this 17 and 32 ms; the results within 5e-7 of those, for values up to 5)."""
    _, g, _ = MATRICES[m]
    packed = aligned_empty(((m + 2) ** 2, *taps.shape[1:]))  # (alpha^2, O/p, I, p), for ir.constant
    np.matmul(np.kron(g, g).astype(np.float32), taps.reshape(9, -1), out=packed.reshape(len(packed), -1))
    return packed


def winograd_input(data: te.Tensor, m: int, padding: tuple[int, int, int, int],
                   rows: int | tvm.tirx.PrimExpr) -> te.Tensor:
    """NCHW{b}c data to V: (alpha^2, ``rows``, C), tile p = (n, tile row, tile column) row-major;
    rows past the real tiles repeat the last one (the product pads its rows to a register tile)."""
    batch, (outer, height, width, block) = data.shape[0], (int(d) for d in data.shape[1:])  # a batch may be dynamic
    top, left, bottom, right = padding
    out_h, out_w = height + top + bottom - 2, width + left + right - 2
    th, tw = tiles(out_h, out_w, m)
    alpha = m + 2
    # padded so that every tile is whole: the last tiles read zeros past the convolution's padding
    pad = topi.nn.pad(data, [0, 0, top, left, 0],
                      [0, 0, th * m + 2 - height - top, tw * m + 2 - width - left, 0], name="data_pad")
    _, _, bt = MATRICES[m]
    count = batch * th * tw

    def row_times_b(i, col, p, c):  # (d B)[i, col] of tile p
        p = te.min(p, count - 1)
        n, y, x = p // (th * tw), p % (th * tw) // tw * m, p % tw * m
        d = [pad[n, c // block, y + i, x + j, c % block] for j in range(alpha)]
        return _select(col, [_combine(bt[k], d) for k in range(alpha)])

    db = te.compute((alpha, alpha, rows, outer * block), row_times_b, name="winograd_input_rows",
                    attrs={STAGE_ATTR: 1})
    return te.compute((alpha * alpha, rows, outer * block), lambda t, p, c: _select(
        t // alpha, [_combine(bt[r], [db[i, t % alpha, p, c] for i in range(alpha)]) for r in range(alpha)]),
        name="winograd_input", attrs={INPUT_ATTR: m})


def winograd_product(v: te.Tensor, packed: te.Tensor, tile_rows: int) -> te.Tensor:
    """M[t] = V[t] U[t] for every t, with U packed as (alpha^2, K / panel, C, panel)."""
    positions, rows, depth = int(v.shape[0]), v.shape[1], int(v.shape[2])  # rows: of a dynamic batch, an expression
    k = te.reduce_axis((0, depth), name="k")
    _, panels, _, panel = (int(d) for d in packed.shape)
    return te.compute((positions, rows, panels * panel), lambda t, r, j: te.sum(
        v[t, r, k] * packed[t, j // panel, k, j % panel], axis=k),
                      name="dense_packed", attrs={PANEL_ATTR: panel, ROW_TILE_ATTR: tile_rows, TILE_ALIGNED_ATTR: 0})


def winograd_output(product: te.Tensor, m: int, shape: tuple[int, int, int, int, int]) -> te.Tensor:
    """M (alpha^2, rows, K) to the NCHW{b}c output of ``shape``: Y = A^T M A per tile, in two
    stages as the input transform: M A (a stage of its own), then A^T (M A)."""
    batch, outer, out_h, out_w, block = shape
    th, tw = tiles(out_h, out_w, m)
    alpha = m + 2
    at, _, _ = MATRICES[m]
    _, rows, columns = product.shape
    ma = te.compute((alpha, m, rows, columns), lambda a, col, p, c: _select(
        col, [_combine(at[k], [product[a * alpha + b, p, c] for b in range(alpha)]) for k in range(m)]),
        name="winograd_output_columns", attrs={STAGE_ATTR: 1})

    def element(n, o, y, x, i):
        p = n * th * tw + y // m * tw + x // m
        return _select(y % m, [_combine(at[r], [ma[a, x % m, p, o * block + i] for a in range(alpha)])
                               for r in range(m)])

    return te.compute(shape, element, name="winograd_output", attrs={OUTPUT_ATTR: m})
