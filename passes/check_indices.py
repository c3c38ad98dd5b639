"""Bounds checks on every index a model reads or writes at (Gather, GatherElements, GatherND,
ScatterElements, ScatterND): an index outside the data raises ``InputError`` instead of reading
arbitrary memory.

The indices pass through a small kernel that copies them and asserts that each is inside
``[-extent, extent)`` (``[0, extent)`` when unsigned); a failed assert raises ``InputError`` from the
compiled code, naming the node, the input the indices come from and the valid range (the runtime
adds the offending value, ``support/index_checks.py``). The kernels downstream read the copy, so
they keep their form and their tuning records; negative indices are then wrapped as before (by the
importer's ``where``, or inside TOPI's ScatterElements). Indices known at compile time are
checked now (``ModelError``) and cost nothing at run time; a take in "clip" or "wrap" mode cannot
read outside and is left alone.

On CPU the check is a plain loop marked scheduled (label ``index-check``): no tuning task. GPU
targets get no run-time check (``CheckIndices``).
"""

from __future__ import annotations

import logging
from typing import Mapping

import numpy as np
import tvm
from tvm import relax
from tvm.script import tirx as T

from relaxc.passes.ir import IS_SCHEDULED, SCHEDULE_ATTR, constant_array, is_op, rewrite_emitting, static_shape
from relaxc.support.errors import ModelError
from relaxc.support.index_checks import message

log = logging.getLogger("relaxc")
ONNX_OPS = {"relax.take": "Gather", "relax.gather_elements": "GatherElements", "relax.gather_nd": "GatherND",
            "relax.scatter_elements": "ScatterElements", "relax.scatter_nd": "ScatterND"}
ND_OPS = ("relax.gather_nd", "relax.scatter_nd")
VALUE_KEEPING_OPS = ("relax.astype", "relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.flatten")
LABEL = "index-check"


def _extents(call: relax.Call, data: tuple[int, ...], indices: tuple[int, ...]) -> list[int] | None:
    """The valid extent of each index coordinate: one for the element forms, one per entry of
    the last axis for the ND forms."""
    if call.op.name in ND_OPS:
        start = int(call.attrs.batch_dims) if call.op.name == "relax.gather_nd" else 0
        return list(data[start:start + indices[-1]]) if indices else None
    axis = call.attrs.axis
    return [int(np.prod(data))] if axis is None else [data[int(axis) % len(data)]]  # None: flattened


def _ranges(extents: list[int], dtype: str) -> list[tuple[int, int]]:
    """Each coordinate's valid ``[low, high)``: negative indices count from the end, as ONNX defines."""
    return [(0 if dtype.startswith("uint") else -extent, extent) for extent in extents]


def check_kernel(shape: tuple[int, ...], dtype: str, ranges: list[tuple[int, int]], text: str) -> tvm.tirx.PrimFunc:
    """A kernel copying ``indices`` to ``checked`` that raises ``InputError(text)`` on an index outside
    ``ranges`` (one range, or one per entry of the last axis)."""
    loops = ", ".join(f"i{n}" for n in range(len(shape)))
    coords = [f"v{n}" for n in range(len(shape))]
    at = f"[{', '.join(coords)}]" if shape else "[()]"

    info = np.iinfo(dtype)  # bounds the type cannot exceed are left out of the test
    inclusive = [(max(low, int(info.min)), min(high - 1, int(info.max))) for low, high in ranges]

    def bound(side: int) -> str:  # the bound of the coordinate that the last axis selects
        expr = f"T.{dtype}({inclusive[-1][side]})"
        for j in range(len(inclusive) - 2, -1, -1):
            expr = f"T.Select({coords[-1]} == {j}, T.{dtype}({inclusive[j][side]}), {expr})"
        return expr

    lines = ["@T.prim_func(s_tir=True)",
             f"def main(indices: T.Buffer({shape!r}, {dtype!r}), checked: T.Buffer({shape!r}, {dtype!r})):",
             "    T.func_attr({'tirx.noalias': True, 'op_pattern': 8})"]  # opaque: never fused
    indent = "    "
    if shape:
        lines.append(f"{indent}for {loops} in T.grid({', '.join(map(str, shape))}):")
        indent += "    "
    lines.append(f'{indent}with T.sblock("check"):')
    indent += "    "
    if shape:
        lines.append(f"{indent}{', '.join(coords)} = T.axis.remap({'S' * len(shape)!r}, [{loops}])")
    lines.append(f"{indent}assert {bound(0)} <= indices{at} and indices{at} <= {bound(1)}, "
                 f"('InputError', [{text!r}])")
    lines.append(f"{indent}checked{at} = indices{at}")
    return tvm.script.from_source("\n".join(lines), extra_vars={"T": T})


@relax.expr_functor.mutator
class _Checks(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, on_cpu: bool, readers: Mapping[str, str], names: Mapping[str, str]) -> None:
        super().__init__(mod)
        self.on_cpu = on_cpu
        self.readers = readers  # Relax parameter -> the ONNX nodes that index with it (ImportedModel)
        self.names = names  # Relax parameter -> its ONNX name, where they differ
        self.checked = 0
        self.unchecked: list[str] = []

    def _bound(self, expr: relax.Expr) -> relax.Expr | None:
        return self.lookup_binding(expr) if isinstance(expr, relax.Var) else None

    def _unwrapped(self, indices: relax.Expr) -> tuple[relax.Expr, relax.Expr | None]:
        """(the indices before the importer's ``where(i < 0, i + extent, i)``, that wrapping's
        ``i + extent``), or (indices, None) where it did not wrap them."""
        wrap = self._bound(indices)
        if not is_op(wrap, "relax.where"):
            return indices, None
        raw = wrap.args[2]
        less, add = self._bound(wrap.args[0]), self._bound(wrap.args[1])
        if is_op(less, "relax.less") and less.args[0].same_as(raw) and is_op(add, "relax.add") \
                and add.args[0].same_as(raw):
            return raw, add.args[1]
        return indices, None

    def _source(self, raw: relax.Expr) -> relax.Expr:
        """Where the indices come from, through ops that keep their values (GPT-2 reshapes its
        token ids first)."""
        while (bound := self._bound(raw)) is not None and isinstance(bound, relax.Call) \
                and isinstance(bound.op, tvm.ir.Op) and bound.op.name in VALUE_KEEPING_OPS \
                and "int" in str(bound.args[0].ty.dtype.dtype):
            raw = bound.args[0]
        return raw

    def _describe(self, call: relax.Call, raw: relax.Expr) -> tuple[str, str | None]:
        """(the node, the graph input its indices come from or None)."""
        source = self._source(raw)
        if not isinstance(source, relax.Var) or isinstance(source, relax.DataflowVar):
            return ONNX_OPS[call.op.name], None
        return self.readers.get(source.name, ONNX_OPS[call.op.name]), self.names.get(source.name, source.name)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in ONNX_OPS \
                or (call.op.name == "relax.take" and call.attrs.mode != "fast"):
            return call
        raw, wrap_extent = self._unwrapped(call.args[1])
        data, shape = static_shape(call.args[0]), static_shape(raw)
        extents = _extents(call, data, shape) if data is not None and shape is not None else None
        if extents is None:
            return call
        dtype = str(raw.ty.dtype.dtype)
        ranges = _ranges(extents, dtype)
        info = np.iinfo(dtype)
        if all(low <= info.min and high > info.max for low, high in ranges):
            return call  # every value of the type is a valid index (uint8 into 256 rows or more)
        what, source = self._describe(call, raw)
        known = constant_array(raw)
        if known is not None:
            _check_now(known, ranges, call.op.name in ND_OPS, what)
            return call
        if not self.on_cpu:  # TVM writes a kernel's assert as host code, which no GPU compiler takes
            self.unchecked.append(what)
            return call
        kernel = check_kernel(shape, dtype, ranges, message(what, source, ranges))
        kernel = kernel.with_attr(IS_SCHEDULED, True).with_attr(SCHEDULE_ATTR, LABEL)  # a plain loop, no tuning
        checked = self.builder_.emit(relax.call_tir(self.builder_.add_func(kernel, "check_indices"), [raw],
                                                    relax.TensorType(shape, dtype)))
        if wrap_extent is not None:  # the importer's wrapping of negative indices, on the checked ones
            checked = self.builder_.emit(relax.op.where(relax.op.less(checked, relax.const(0, dtype)),
                                                        relax.op.add(checked, wrap_extent), checked))
        self.checked += 1
        return relax.Call(call.op, [call.args[0], checked, *call.args[2:]], call.attrs, call.ty_args)


def _check_now(known: np.ndarray, ranges: list[tuple[int, int]], per_coordinate: bool, what: str) -> None:
    """Raise ModelError if a constant index is outside ``ranges``."""
    values = known.reshape(-1, len(ranges)) if per_coordinate else known.reshape(-1, 1)
    low, high = np.array([r[0] for r in ranges]), np.array([r[1] for r in ranges])
    outside = np.argwhere((values < low) | (values >= high))
    if len(outside):
        row, column = outside[0]
        raise ModelError(f"{what}: constant index {values[row, column]} is outside the valid range "
                         f"[{low[column]}, {high[column]})")


@tvm.transform.module_pass(opt_level=0, name="relaxc.CheckIndices")
class CheckIndices:
    """Check every data-dependent index at run time (``InputError``) on CPU, constant ones now
    (``ModelError``). On GPUs the run-time checks are not made (TVM emits a kernel's assert as host
    code, which CUDA's compiler refuses); each unchecked op is named in a warning and the summary."""

    report_key = "index_checks"

    def __init__(self, on_cpu: bool, readers: Mapping[str, str], names: Mapping[str, str]) -> None:
        self.on_cpu = on_cpu
        self.readers = readers
        self.names = names
        self.report: dict = {}

    def summary(self) -> dict:
        return self.report

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = _Checks(mod.clone(), self.on_cpu, self.readers, self.names)
        mod = rewrite_emitting(mod, rewriter)
        self.report = {"checked": rewriter.checked, "unchecked": rewriter.unchecked}
        if rewriter.unchecked:
            log.warning("indices are not checked at run time on this GPU target: an out-of-range index reads "
                        "outside the data (%s)", ", ".join(rewriter.unchecked))
        return mod
