"""Convolutions in the forms relaxc's fast paths take.

A 1-D convolution (``conv1d``, NCW: audio front ends, temporal and positional convolutions) becomes
a 2-D one over a height of 1 between an ``expand_dims`` and a ``squeeze``, so it takes the blocked
convolution path, its schedules and records (TOPI's conv1d has no rule of its own in relaxc).

A depthwise 1x1 convolution (stride 1, no padding: FastViT's RepMixer, a train-time branch that an
export keeps) multiplies each channel by one weight: it becomes that ``multiply`` (plus its bias),
which fuses with the elementwise ops around it. As a convolution it ended a fused kernel whose
prologue also fed its epilogue, which no convolution rule takes (4 % of its roofline, FastViT-T8's
worst kernel).
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from relaxc.passes.ir import constant_array, is_op, MutatorPass, static_shape


UNARY = ("relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.sigmoid", "relax.tanh",
         "relax.clip")  # elementwise ops a squeezed convolution's epilogue passes through
BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


@relax.expr_functor.mutator
class _Conv1dAs2d(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        lifted = self._through_squeeze(call)
        if lifted is not None:
            return lifted
        if not is_op(call, "relax.nn.conv1d") or call.attrs.data_layout != "NCW" \
                or call.attrs.kernel_layout != "OIW" or call.attrs.out_layout not in ("NCW", ""):
            return call
        attrs, (data, weight) = call.attrs, call.args
        constant = constant_array(weight)
        kernel = (relax.const(constant[:, :, None, :]) if constant is not None
                  else self.builder_.normalize(relax.op.expand_dims(weight, axis=2)))
        width = int(call.ty.shape[2]) if isinstance(call.ty.shape[2], tirx.IntImm) else None
        extra = _row_tile_width(width) - width if width is not None else 0
        conv = relax.op.nn.conv2d(self.builder_.normalize(relax.op.expand_dims(data, axis=2)), kernel,
                                  strides=(1, int(attrs.strides[0])),
                                  padding=(0, int(attrs.padding[0]), 0, int(attrs.padding[1]) + extra * int(attrs.strides[0])),
                                  dilation=(1, int(attrs.dilation[0])), groups=int(attrs.groups),
                                  out_dtype=_dtype(call))
        if extra:
            conv = relax.op.strided_slice(self.builder_.normalize(conv), axes=[3], begin=[0], end=[width])
        return relax.op.squeeze(self.builder_.normalize(conv), axis=[2])

    def _through_squeeze(self, call: relax.Call) -> relax.Expr | None:
        """``op(squeeze(x, [2]))`` and ``squeeze(x, [2]) op constant`` as ``squeeze(op(x))``, so the
        epilogue of a 1-D convolution (bias, activation) stays with it in 4-D, fusable and blocked."""
        if not call.args or not isinstance(call.args[0], relax.Var):
            return None
        squeezed = self.lookup_binding(call.args[0])
        if not is_op(squeezed, "relax.squeeze") or squeezed.attrs.axis is None \
                or [int(a) for a in squeezed.attrs.axis] != [2] or len(static_shape(squeezed.args[0]) or ()) != 4:
            return None
        if any(is_op(call, op) for op in UNARY):
            inner = relax.Call(call.op, [squeezed.args[0], *call.args[1:]], call.attrs, call.ty_args)
        elif any(is_op(call, op) for op in BINARY) and len(call.args) == 2:
            constant = constant_array(call.args[1])
            if constant is None or constant.ndim > 3:
                return None
            padded = constant.reshape((1,) * (3 - constant.ndim) + constant.shape) if constant.ndim else constant
            operand = relax.const(padded[:, :, None, :] if constant.ndim else constant)
            inner = relax.Call(call.op, [squeezed.args[0], operand], call.attrs, call.ty_args)
        else:
            return None
        return relax.op.squeeze(self.builder_.normalize(inner), axis=[2])


ROW_TILES = range(4, 9)  # the register tiles along an output row of the convolution schedules (schedules/cpu/tile_plan.py)
SHORT_ROW = 14  # tiled whole


def _row_tile_width(width: int) -> int:
    """The output width to compute a 1-D convolution over: its own where a row tile divides it (or
    it is short), else the next multiple of the largest tile, the extra columns computed from the
    zero padding and sliced off. An audio front end's widths (3199, 799, 399: odd, often prime)
    otherwise leave the schedule a tile of one column: wav2vec2's second convolution ran at 20 %
    of its roofline."""
    if width <= SHORT_ROW or any(width % tile == 0 for tile in ROW_TILES):
        return width
    return -(-width // ROW_TILES[-1]) * ROW_TILES[-1]


def _dtype(call: relax.Call) -> str:
    """The element type of what ``call`` (normalised) gives."""
    return str(call.ty.dtype)


@tvm.transform.module_pass(opt_level=0, name="relaxc.Conv1dAsConv2d")
class Conv1dAsConv2d(MutatorPass):
    """``conv1d`` (NCW) as ``conv2d`` over a height of 1."""

    mutator = _Conv1dAs2d


@relax.expr_functor.mutator
class _DepthwisePointwise(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not is_op(call, "relax.nn.conv2d"):
            return call
        attrs, (data, weight) = call.attrs, call.args
        shape, kernel = static_shape(data), static_shape(weight)
        if shape is None or kernel is None or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" \
                or attrs.out_layout not in ("NCHW", "") or _dtype(call) != str(data.ty.dtype) \
                or int(attrs.groups) != shape[1] or kernel != (shape[1], 1, 1, 1) \
                or any(int(s) != 1 for s in attrs.strides) or any(int(p) != 0 for p in attrs.padding):
            return call
        constant = constant_array(weight)
        scale = (relax.const(constant.reshape(1, -1, 1, 1)) if constant is not None
                 else self.builder_.normalize(relax.op.reshape(weight, (1, shape[1], 1, 1))))
        return relax.op.multiply(data, scale)


@tvm.transform.module_pass(opt_level=0, name="relaxc.DepthwisePointwiseToMultiply")
class DepthwisePointwiseToMultiply(MutatorPass):
    """A depthwise 1x1 ``conv2d`` with stride 1 and no padding to a multiplication by its weights."""

    mutator = _DepthwisePointwise
