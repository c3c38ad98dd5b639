"""Charts of compile reports (matplotlib, an optional dependency: ``pip install relaxc[chart]``)."""

from __future__ import annotations

import os

from relaxc.build.report import mib
from relaxc.support.errors import UserError


def memory_chart(memory: dict, path: str, title: str = "") -> str:
    """Write tensors as rectangles over (binding index, arena offset) to ``path``; returns the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError:
        raise UserError("the lifetime chart needs matplotlib: pip install relaxc[chart]") from None
    path = os.path.abspath(path)
    if not os.path.isdir(os.path.dirname(path)):
        raise UserError(f"cannot write {path}: directory {os.path.dirname(path)} does not exist")
    fig, ax = plt.subplots(figsize=(12, 6))
    cmap = plt.get_cmap("tab20")
    tensors = memory["tensors"]
    for index, t in enumerate(tensors):
        ax.add_patch(Rectangle((t["first"], t["offset"] / 2**20), t["last"] - t["first"] + 1, t["bytes"] / 2**20,
                               facecolor=cmap(index % 20), edgecolor="black", linewidth=0.3))
    end = max((t["last"] + 1 for t in tensors), default=1)
    ax.axhline(memory["arena_bytes"] / 2**20, color="black", linewidth=1, label="arena")
    ax.axhline(memory["lower_bound_bytes"] / 2**20, color="green", linestyle="--", linewidth=1, label="lower bound")
    ax.axhline(memory["tvm_static_plan_bytes"] / 2**20, color="red", linestyle=":", linewidth=1,
               label="TVM StaticPlanBlockMemory")
    ax.set_xlim(0, end)
    ax.set_ylim(0, max(memory["arena_bytes"], memory["tvm_static_plan_bytes"]) / 2**20 * 1.05 or 1)
    ax.set_xlabel("binding (execution order)")
    ax.set_ylabel("arena offset (MiB)")
    ax.set_title(f"{title} memory plan: {memory['planner']}, {mib(memory['arena_bytes'])}")
    ax.legend(loc="upper right")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as err:
        raise UserError(f"cannot write {path}: {err}") from None
    finally:
        plt.close(fig)
    return path
