"""TVM's ONNX importer called as relaxc needs it: inputs renamed to identifiers, one variable per dynamic
dim (a dim that is others' sum, as that sum), each dim's bounds on ``main``; the results' shapes read back.
"""

from __future__ import annotations

import functools
import operator
import re
import warnings
from typing import Mapping, Sequence

import onnx
import tvm
from tvm import IRModule
from tvm.relax.frontend.onnx import from_onnx
from tvm.sym.analyzer import Analyzer

from relaxc.frontend import prepare
from relaxc.support.errors import DynamicOutputError, ImportFailure, message
from relaxc.support.tensors import TensorSpec


def output_specs(names: list[str], module: IRModule) -> list[TensorSpec]:
    """The imported ``main``'s results as (name, shape, dtype): sizes and expressions of its dynamic dims; a
    DynamicOutputError where the input values decide a shape."""
    ret = module["main"].ret_ty
    fields = list(ret.fields) if hasattr(ret, "fields") else [ret]
    dims = {str(v) for p in module["main"].params for v in tvm.relax.analysis.tir_vars_in_type(p.ty)}
    shapes = [_shape_of(ty, dims) for ty in fields]
    dynamic = [name for name, shape in zip(names, shapes) if shape is None]
    if dynamic:
        raise DynamicOutputError(f"output(s) {dynamic} have no static shape after import: their shape depends "
                                 f"on input values (NonZero, Unique, Compress, or a shape computed from an "
                                 f"input); relaxc compiles shapes that inputs' shapes decide only (constants= "
                                 f"fixes shape-deciding inputs)")
    return [(name, shape, str(ty.dtype)) for name, shape, ty in zip(names, shapes, fields)]


def _shape_of(ty, dims: set[str]) -> tuple[int | str, ...] | None:
    """A tensor type's shape: sizes, and expressions of the inputs' dynamic dims (None where a dim
    is neither)."""
    values = getattr(getattr(ty, "shape", None), "values", None)
    if values is None:
        return None
    shape: list[int | str] = []
    for d in values:
        if isinstance(d, tvm.tirx.IntImm):
            shape.append(int(d))
        elif {str(v) for v in tvm.tirx.analysis.undefined_vars(d)} <= dims:
            shape.append(str(Analyzer().simplify(d)))  # "sequence", not "past + sequence - past"
        else:
            return None
    return tuple(shape)


def identifier_inputs(proto: onnx.ModelProto, names: list[str]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy whose graph inputs are C identifiers, and the renaming. The importer names kernel
    parameters after them, and CUDA C cannot declare ``gpu_0/data_0_ptr`` (ResNet-50's input).
    Names do not enter structural hashes, so fingerprints and tuning records are unaffected."""
    taken = {n for node in prepare.all_nodes(proto.graph) for n in list(node.input) + list(node.output)} | set(names)
    renames = {}
    for name in names:
        if name.isidentifier():
            continue
        new = re.sub(r"\W", "_", name)
        new = new if new[:1].isalpha() or new[:1] == "_" else f"_{new}"
        while new in taken:
            new += "_"
        taken.add(new)
        renames[name] = new
    mapping = {name: renames.get(name, name) for name in names}
    if not renames:
        return proto, mapping
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for value in list(copy.graph.input) + list(copy.graph.output):
        value.name = renames.get(value.name, value.name)
    for node in prepare.all_nodes(copy.graph):
        node.input[:] = [renames.get(n, n) for n in node.input]
    return copy, mapping


def from_onnx_model(proto: onnx.ModelProto, inputs: list[TensorSpec], bounds: Mapping[str, int],
                    empty: Sequence[str] = (), sums: Mapping[str, Sequence[str]] | None = None
                    ) -> tuple[IRModule, dict[str, str]]:
    """TVM's import of ``proto`` with these input shapes, and the inputs' Relax names; ``main``
    carries each dynamic dim's bounds (``tir_var_upper_bound``, as TVM's memory planning reads it;
    a lower bound of 0 for the ``empty`` dims, else 1); a dim of ``sums`` is its parts' sum."""
    dims: dict[str, tvm.tirx.Var] = {}  # one variable per dynamic dim, whichever inputs have it

    def dim(name: str) -> tvm.tirx.PrimExpr:
        if name in (sums or {}):
            return functools.reduce(operator.add, map(dim, sums[name]))
        return dims.setdefault(name, tvm.tirx.Var(name, "int64"))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the importer re-runs the checker and warns on IR v3 quirks
        try:
            renamed, names = identifier_inputs(proto, [n for n, _, _ in inputs])
            shape_dict = {names[n]: [dim(d) if isinstance(d, str) else d for d in s] for n, s, _ in inputs}
            module = from_onnx(renamed, shape_dict=shape_dict, dtype_dict={names[n]: d for n, _, d in inputs},
                               keep_params_in_input=False)
        except Exception as err:  # the importer raises bare Python errors for unconvertible nodes
            raise ImportFailure(f"TVM's ONNX importer cannot convert this model: "
                                f"{type(err).__name__}: {message(err)}") from err
    if dims:
        module["main"] = module["main"].with_attrs({
            "tir_var_upper_bound": {d: bounds[d] for d in dims},
            "tir_var_lower_bound": {d: int(d not in empty) for d in dims}})
    return module, names
