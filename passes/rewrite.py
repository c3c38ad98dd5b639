"""The one way relaxc's module passes change functions: on a copy of the module.

``mod[gvar] = func`` updates an IRModule in place, and the pipeline keeps the module after each
phase for ``Artifact.ir(phase)``: a pass that assigned into its input would rewrite the snapshots
of earlier phases too (the layout pass's blocked convs showed up in the "simplify" IR).
"""

from __future__ import annotations

from typing import Callable

import tvm
from tvm import relax


def map_relax_functions(mod: tvm.IRModule, rewrite: Callable[[relax.Function], relax.Function]) -> tvm.IRModule:
    """A copy of ``mod`` with every Relax function replaced by ``rewrite(function)``."""
    new = mod.clone()
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new[gvar] = rewrite(func)
    return new
