"""Every use of TVM's private names, in one place.

TVM is pinned (``apache-tvm==0.27.0.post1``, pyproject.toml), so these are stable for relaxc; a TVM
upgrade starts here, and the tests that exercise each caller (named below) say when one broke.
Each entry says why it is needed and what public API would replace it.
"""

from __future__ import annotations

import sys
import types

import tvm
from tvm import relax, s_tir
from tvm.target import Target


def onnx_converters() -> set[str]:
    """The ONNX op types TVM's importer converts (``compiler/frontend/`` refuses the others up
    front, all at once, with node names). Private: ``onnx_frontend._get_convert_map``. Public
    replacement: none; ``from_onnx`` fails at the first unknown op only."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return set(_get_convert_map())


def vm_codegen(builder: relax.ExecBuilder, mod: tvm.IRModule) -> tvm.IRModule:
    """The Relax VM bytecode of ``mod``'s Relax functions, emitted into ``builder``; returns the
    module with its TIR kernels left to build (``compiler/build/codegen/parallel.py`` builds them in
    parallel). Private: ``vm_build._vmcodegen``. Public replacement: ``tvm.compile``, which builds
    every kernel in one LLVM module on one core."""
    from tvm.relax import vm_build

    return vm_build._vmcodegen(builder, mod, "bytecode")


def kernels_only(mod: tvm.IRModule) -> tvm.IRModule:
    """The TIR kernels of ``mod``. Private: ``vm_build._filter_tir``."""
    from tvm.relax import vm_build

    return vm_build._filter_tir(mod)


def vm_link(builder: relax.ExecBuilder, target: Target, library: tvm.runtime.Module,
            attrs: dict) -> relax.VMExecutable:
    """Link built kernels with the bytecode in ``builder`` into a VM executable, as ``tvm.compile``
    does. Private: ``vm_build._ffi_api.VMLink``."""
    from tvm.relax import vm_build

    return relax.VMExecutable(vm_build._ffi_api.VMLink(builder, target, library,
                                                        list(attrs.get("external_mods", [])),
                                                        dict(attrs.get("const_name_to_constant", {}))))


def kernel_module(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    """A kernel as MetaSchedule keys it in a tuning database: alone in a module as ``main``, marked
    no-alias. Private: ``tune_context._normalize_mod``. Public replacement: none (the key must
    match MetaSchedule's own, byte for byte)."""
    from tvm.s_tir.meta_schedule import tune_context

    return tune_context._normalize_mod(func)


INTRIN_MODULE = "tvm.s_tir.tensor_intrin"


def skip_tensor_intrinsics(target: Target) -> None:
    """Let MetaSchedule's TuneContext import the tensor-intrinsics module as an empty one, for LLVM.

    The real import parses the tensor intrinsics of every target as TVMScript: 38 s on this
    machine, paid again in every builder worker. The default LLVM schedule rules use no tensor
    intrinsic (those are for int8 dot products and GPU tensor cores), so nothing is lost there;
    other targets keep the real import. Private: a ``sys.modules`` entry. Public replacement: none.
    """
    if target.kind.name == "llvm" and INTRIN_MODULE not in sys.modules:
        sys.modules[INTRIN_MODULE] = types.ModuleType(INTRIN_MODULE, "skipped by relaxc for LLVM tuning")


def _without_type_checks(cls: type) -> type:
    for name, method in vars(s_tir.Schedule).items():
        code = getattr(method, "__code__", None)
        if code is not None and code.co_filename.endswith("_type_checker.py"):  # a ``type_checked`` wrapper
            setattr(cls, name, method.__wrapped__)
    return cls


@_without_type_checks
class UncheckedSchedule(s_tir.Schedule):
    """``s_tir.Schedule`` whose methods skip TVM's Python check of their arguments' types.

    Every ``Schedule`` method is wrapped in ``type_checked``, which binds the call's signature and
    walks its type hints on each call (building the error text of every member of a ``Union`` it
    does not match), in Python: 0.2 of SqueezeNet's 0.53 s of default schedules. The schedule
    rules' calls are the same code on every compile and the C++ side still refuses a wrong
    argument, so relaxc's own schedules call the methods underneath. Private: the wrapper's
    ``__wrapped__`` (``s_tir/schedule/_type_checker.py``). Public replacement: none."""


def serve_rpc(sock, key: str, tracker: tuple[str, int], on_session=None) -> None:
    """TVM's Python RPC server on the listening socket ``sock``, registered with ``tracker`` under
    ``key``, serving until killed; ``on_session`` (if given) runs in each session's process after
    TVM set it up (``tests/rpc_device.py``: a server that dies at a chosen point of its work); each
    session is a forked process (Linux's start method), which inherits the hook.
    Private: ``rpc.server._listen_loop`` and ``_server_env``. Public replacement: ``rpc.Server``,
    which runs the loop in a fresh process that no hook reaches."""
    from tvm.rpc import server

    if on_session is not None:
        set_up = server._server_env

        def hooked(load_library, work_path=None):
            temp = set_up(load_library, work_path)
            on_session()
            return temp

        server._server_env = hooked
    server._listen_loop(sock, sock.getsockname()[1], key, tracker, None, "127.0.0.1")
