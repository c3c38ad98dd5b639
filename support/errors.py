"""Errors relaxc raises on purpose.

Every `UserError` describes something the caller can fix (a bad path, a wrong input shape, an
unsupported operator); the CLI prints its message on one line and exits with status 2. Anything else
that escapes is a bug in relaxc or TVM and keeps its traceback.

Each class is registered with tvm-ffi, so one raised inside a pass (a Python callback of TVM's pass
infrastructure) reaches the caller as itself, not as the ``RuntimeError`` the FFI would make of it.
"""

import tvm_ffi


@tvm_ffi.register_error
class UserError(Exception):
    """Base class of errors caused by the caller's input, reported without a traceback."""


@tvm_ffi.register_error
class ModelError(UserError):
    """The model file is missing, unreadable, not ONNX, or fails the ONNX checker."""


@tvm_ffi.register_error
class UnsupportedOperatorError(UserError):
    """The model uses operators the importer cannot convert; the message lists all of them."""


@tvm_ffi.register_error
class ShapeError(UserError):
    """An input has dynamic dimensions that were not bound, or a binding does not fit the model."""


@tvm_ffi.register_error
class TargetError(UserError):
    """The target is unknown or malformed."""


@tvm_ffi.register_error
class RemoteError(UserError):
    """An RPC tracker cannot be reached, has no server under the key, or its servers differ."""


@tvm_ffi.register_error
class InputError(UserError):
    """Run-time inputs do not match the compiled model (name, shape or dtype)."""


@tvm_ffi.register_error
class ExportError(UserError):
    """An artifact cannot be written or read at the given path."""


@tvm_ffi.register_error
class ImportFailure(UnsupportedOperatorError):
    """TVM's importer failed on the model (a node form it cannot convert, never named by it)."""


@tvm_ffi.register_error
class DynamicOutputError(ShapeError):
    """An output's shape depends on input values: relaxc's own kernels compile static shapes only."""
