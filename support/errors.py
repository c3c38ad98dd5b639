"""Errors relaxc raises on purpose.

Every `UserError` describes something the caller can fix (a bad path, a wrong input shape, an
unsupported operator); the CLI prints its message on one line and exits with status 2. Anything else
that escapes is a bug in relaxc or TVM and keeps its traceback.

Each class is registered with tvm-ffi, so one raised inside a pass (a Python callback of TVM's pass
infrastructure) reaches the caller as itself, not as the ``RuntimeError`` the FFI would make of it.

``DoesNotFit`` is no error of the caller's: a schedule rule raises it on purpose for a kernel it does
not apply to, and the next rule is tried. Any other error inside a rule is a bug, which
``ScheduleRuleError`` reports with the kernel and the rule. ``message`` is the one way a handler
quotes an error it caught.
"""

import tvm_ffi


def message(err: BaseException | str, last: bool = False) -> str:
    """The first (``last``: the last) non-empty line of an error's text, where Python and TVM say
    what went wrong (TVM puts it last, after its traceback), at most 300 characters; the error's
    type name if its text is empty."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__ if isinstance(err, BaseException) else ""
    return (lines[-1] if last else lines[0])[:300]


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


class DoesNotFit(Exception):
    """A schedule rule does not apply to a kernel, and why: raised by the rule's own checks."""


@tvm_ffi.register_error
class ScheduleRuleError(RuntimeError):
    """A schedule rule failed on a kernel with an error other than ``DoesNotFit``: a bug in relaxc."""
