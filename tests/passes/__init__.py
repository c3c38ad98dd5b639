"""Tests of the Relax and TIR passes; ``relax_ops`` lists what a rewritten module calls."""

import tvm


def relax_ops(mod: tvm.IRModule) -> list[str]:
    """The Relax operators ``main`` calls, in post order."""
    found = []
    tvm.relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(e.op.name) if isinstance(e, tvm.relax.Call)
        and isinstance(e.op, tvm.ir.Op) else None)
    return found
