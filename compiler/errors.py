"""Errors relaxc raises on purpose.

Every `UserError` describes something the caller can fix (a bad path, a wrong input shape, an
unsupported operator); the CLI prints its message on one line and exits with status 2. Anything else
that escapes is a bug in relaxc or TVM and keeps its traceback.
"""


class UserError(Exception):
    """Base class of errors caused by the caller's input, reported without a traceback."""


class ModelError(UserError):
    """The model file is missing, unreadable, not ONNX, or fails the ONNX checker."""


class UnsupportedOperatorError(UserError):
    """The model uses operators the importer cannot convert; the message lists all of them."""


class ShapeError(UserError):
    """An input has dynamic dimensions that were not bound, or a binding does not fit the model."""


class TargetError(UserError):
    """The target is unknown or malformed."""


class InputError(UserError):
    """Run-time inputs do not match the compiled model (name, shape or dtype)."""


class ExportError(UserError):
    """An artifact cannot be written or read at the given path."""
