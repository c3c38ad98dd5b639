"""Code generation on every core: the kernels of a CPU module are built by LLVM in parallel.

``tvm.compile`` hands every kernel to one LLVM module, optimised and turned into machine code on one
core (ResNet-50 with tuned kernels: 4 s of a 6 s compile, 1.6 s of it when the VM first loads the
code). Here the lowered module's kernels are split into groups, each group built by ``tvm.tirx.build``
into an LLVM module of its own in a thread pool (TVM releases the GIL while LLVM works), its machine
code generated right there, and the modules linked into one VM executable, as ``tvm.compile`` would
link its one. The kernels' code does not depend on the grouping: no kernel calls another. The VM
bytecode is generated while the kernels build: TVM hashes every constant's bytes there to share
equal ones (about 1.2 ms per MB; VGG-19's 575 MB of weights, 0.7 s), and running it beside LLVM
took VGG-19's build phase from 1.95 to 1.73 s (2.79 to 2.44 s with Winograd dispatch).

Uses TVM's Relax VM build steps, which are private to ``tvm.relax.vm_build`` (fenced in
``support/tvm_internals.py``); the tests check the result is the same as ``tvm.compile``'s.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import tvm
from tvm import relax
from tvm.target import Target

from relaxc.passes.tir import tir_pipeline
from relaxc.support import tvm_internals
from relaxc.support.threads import physical_cores

GROUPS_PER_JOB = 4  # small groups, taken by whichever thread is free, balance uneven kernels


def build(mod: tvm.IRModule, target: Target, jobs: int | None = None) -> relax.VMExecutable:
    """Build the lowered ``mod`` into a VM executable, its CPU kernels on ``jobs`` threads (default:
    the physical cores). GPU targets and single jobs go through ``tvm.compile`` as they are."""
    jobs = jobs or physical_cores()
    kernels = [gv for gv, func in mod.functions.items() if isinstance(func, tvm.tirx.PrimFunc)]
    if target.kind.name != "llvm" or jobs < 2 or len(kernels) < 2:
        return tvm.compile(mod, target=target, relax_pipeline=None, tir_pipeline=tir_pipeline.pipeline(target))
    attrs = dict(mod.attrs) if mod.attrs else {}
    builder = relax.ExecBuilder()
    groups = kernel_groups(tvm_internals.kernels_only(mod), jobs)
    with ThreadPoolExecutor(jobs) as pool:
        built = pool.map(lambda group: _build_group(group, target), groups)
        tvm_internals.vm_codegen(builder, mod)  # meanwhile: it hashes every constant (VGG-19: 0.7 s)
        libs = list(built)
    for lib in libs[1:]:
        libs[0].import_module(lib)
    return tvm_internals.vm_link(builder, target, libs[0], attrs)


def kernel_groups(tir: tvm.IRModule, jobs: int) -> list[tvm.IRModule]:
    """The kernels of ``tir`` dealt round-robin, by name, into at most ``jobs * GROUPS_PER_JOB``
    modules: deterministic, and each group a mix of big and small kernels."""
    names = sorted(gv.name_hint for gv in tir.get_global_vars())
    count = min(len(names), jobs * GROUPS_PER_JOB)
    return [tvm.IRModule({tir.get_global_var(n): tir[n] for n in names[i::count]}, attrs=tir.attrs)
            for i in range(count)]


def _build_group(group: tvm.IRModule, target: Target) -> tvm.runtime.Module:
    lib = tvm.tirx.build(group, target=target, pipeline=tir_pipeline.pipeline(target))
    lib.get_function(group.get_global_vars()[0].name_hint)  # LLVM emits machine code at the first lookup
    return lib
