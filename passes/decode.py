"""A decoder's one-token step as a program of its own (a pass of the layout phase, for a decoder
compiled with ``max_length``).

Generation runs the prompt once, then one token per step: ``main`` (any sequence length) serves
the prompt, and ``decode``, ``main`` with the sequence length bound to 1, each step. Its kernels
are built for one query, so attention pads no query rows to whole register tiles
(``passes/attention.py``): with 1,024 tokens cached, GPT-2 small's attention kernels computed 8
rows for the 1 each step needs. The two functions share every weight (the same constants).
"""

from __future__ import annotations

import tvm
from tvm.relax.utils import copy_with_new_vars


@tvm.transform.module_pass(opt_level=0, name="relaxc.DecodeStep")
class DecodeStep:
    """Add ``decode``: ``main`` with its dynamic dim ``sequence`` (a name) bound to 1."""

    def __init__(self, sequence: str) -> None:
        self.sequence = sequence

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        main = mod["main"]
        bound = copy_with_new_vars(main).bind_symbolic_vars({self.sequence: 1})  # variables of its own
        upper = {name: value for name, value in (main.attrs.get("tir_var_upper_bound") or {}).items()
                 if name != self.sequence}
        mod = mod.clone()
        mod["decode"] = bound.with_attrs({"global_symbol": "decode", "tir_var_upper_bound": upper})
        return mod
