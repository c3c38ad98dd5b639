"""Code generation on every core: the kernels of a CPU module are built by LLVM in parallel.

``tvm.compile`` hands every kernel to one LLVM module, optimised and turned into machine code on one
core (ResNet-50 with tuned kernels: 4 s of a 6 s compile, 1.6 s of it when the VM first loads the
code). Here the lowered module's kernels are split into groups, each group built by ``tvm.tirx.build``
into an LLVM module of its own in a thread pool (TVM releases the GIL while LLVM works), its machine
code generated right there, and the modules linked into one VM executable, as ``tvm.compile`` would
link its one. The kernels' code does not depend on the grouping: no kernel calls another.

Uses TVM's Relax VM build steps (``_vmcodegen``, ``_filter_tir``, ``VMLink``), which are private
to ``tvm.relax.vm_build``: TVM is pinned (pyproject.toml), and the tests check the result.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import tvm
from tvm import relax
from tvm.relax import vm_build
from tvm.target import Target

from compiler.targets import physical_cores

GROUPS_PER_JOB = 4  # small groups, taken by whichever thread is free, balance uneven kernels


def build(mod: tvm.IRModule, target: Target, jobs: int | None = None) -> relax.VMExecutable:
    """Build the lowered ``mod`` into a VM executable, its CPU kernels on ``jobs`` threads (default:
    the physical cores). GPU targets and single jobs go through ``tvm.compile`` as they are."""
    jobs = jobs or physical_cores()
    kernels = [gv for gv, func in mod.functions.items() if isinstance(func, tvm.tirx.PrimFunc)]
    if target.kind.name != "llvm" or jobs < 2 or len(kernels) < 2:
        return tvm.compile(mod, target=target, relax_pipeline=None)
    attrs = dict(mod.attrs) if mod.attrs else {}
    builder = relax.ExecBuilder()
    lowered = vm_build._vmcodegen(builder, mod, "bytecode")
    tir = vm_build._filter_tir(lowered)
    names = sorted(gv.name_hint for gv in tir.get_global_vars())
    count = min(len(names), jobs * GROUPS_PER_JOB)
    groups = [tvm.IRModule({tir.get_global_var(n): tir[n] for n in names[i::count]}, attrs=tir.attrs)
              for i in range(count)]
    with ThreadPoolExecutor(jobs) as pool:
        libs = list(pool.map(lambda group: _build_group(group, target), groups))
    for lib in libs[1:]:
        libs[0].import_module(lib)
    return relax.VMExecutable(vm_build._ffi_api.VMLink(builder, target, libs[0],
                                                        list(attrs.get("external_mods", [])),
                                                        dict(attrs.get("const_name_to_constant", {}))))


def _build_group(group: tvm.IRModule, target: Target) -> tvm.runtime.Module:
    lib = tvm.tirx.build(group, target=target)
    lib.get_function(group.get_global_vars()[0].name_hint)  # LLVM emits machine code at the first lookup
    return lib
