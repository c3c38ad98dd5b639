"""The TIR pipeline relaxc builds CPU kernels with (``relaxc``): TVM's default lowering, then
relaxc's kernel-level passes, in this order:

1. ``DropVerifiedArgChecks`` (``passes/tir/arg_checks.py``): the argument checks the VM makes redundant
   (ndim, dtype, shape): 20-40 % of LLVM's time on a model's kernels;
2. ``StackBuffers`` (``passes/tir/stack_buffers.py``): small kernel-local buffers on the stack instead
   of TVM's workspace pool;
3. ``BindExpandedArguments`` (``passes/tir/fast_math.py``): the argument of each exp, tanh, erf and
   sigmoid bound to a variable, as their expansions read it several times;
4. ``Avx512Sigmoid`` (``passes/tir/avx512_math.py``): AVX-512 kernels' vectorised sigmoid in AVX-512
   instructions (it needs the vectorised calls and each kernel's target, which this point has);
5. ``PrefetchNextPanel (``passes/tir/prefetch.py``): the loops a schedule marked prefetch the next
   parallel iteration's weights (it needs the flattened buffers and the parallel loop's variable);
6. ``NaNThroughBounds`` (``passes/tir/nan_bounds.py``): a max or min against a constant (ReLU, Clip)
   written so that a NaN input stays NaN, as in onnxruntime;
7. ``FillScratch`` (``passes/tir/poison.py``): in ``validate_memory`` mode, every kernel-local buffer
   filled with garbage where it is allocated.

Every CPU build goes through it: the model's code generation, the tuning builder and the schedule
selection, so that what is measured is what ships. Other targets use TVM's default pipeline.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import pipeline as s_tir_pipeline
from tvm.target import Target

from relaxc.passes.tir.arg_checks import DropVerifiedArgChecks
from relaxc.passes.tir.avx512_math import Avx512Sigmoid
from relaxc.passes.tir.fast_math import BindExpandedArguments
from relaxc.passes.tir.nan_bounds import NaNThroughBounds
from relaxc.passes.tir.poison import FillScratch
from relaxc.passes.tir.prefetch import PrefetchNextPanel
from relaxc.passes.tir.stack_buffers import StackBuffers

NAME = "relaxc"


def _relaxc_pipeline():
    lower, finalize_host, finalize_device = s_tir_pipeline.default_s_tir_pipeline()
    passes = [lower, DropVerifiedArgChecks, StackBuffers, BindExpandedArguments, Avx512Sigmoid, PrefetchNextPanel,
              NaNThroughBounds, FillScratch]
    return tvm.transform.Sequential(passes), finalize_host, finalize_device


def pipeline(target: Target) -> str:
    """The TIR pipeline to build ``target``'s kernels with (registered on first use)."""
    if target.kind.name != "llvm":
        return "default"
    tvm.tirx.compilation_pipeline.register_tir_pipeline(NAME, _relaxc_pipeline)
    return NAME
