"""compiler/build/codegen/parallel.py: kernels built in groups on every core give what tvm.compile gives."""

import numpy as np
import tvm

import relaxc
import relaxc.runtime.runner
from relaxc.build.codegen import parallel
from relaxc.support import tvm_internals
from tests import reference


def test_groups_hold_every_kernel_once_in_a_fixed_order():
    art = relaxc.compile(reference.branchy_cnn(), tuning="off")
    tir = tvm_internals.kernels_only(art.module("final"))
    names = sorted(gv.name_hint for gv in tir.get_global_vars())
    for jobs in (1, 2, 8):
        groups = parallel.kernel_groups(tir, jobs)
        assert len(groups) == min(len(names), jobs * parallel.GROUPS_PER_JOB)
        grouped = [gv.name_hint for g in groups for gv in g.get_global_vars()]
        assert sorted(grouped) == names
        assert [[gv.name_hint for gv in g.get_global_vars()] for g in parallel.kernel_groups(tir, jobs)] == \
            [[gv.name_hint for gv in g.get_global_vars()] for g in groups]


def test_parallel_build_runs_like_a_single_build():
    art = relaxc.compile(reference.branchy_cnn(), tuning="off")
    mod, target = art.module("final"), art.target
    inputs = reference.random_inputs(art.inputs)
    outputs = []
    for jobs in (1, 2):
        runner = relaxc.runtime.runner.Runner(parallel.build(mod, target, jobs), tvm.cpu(), art.inputs, art.outputs)
        outputs.append(runner.run(inputs))
    for single, grouped in zip(*outputs):
        np.testing.assert_array_equal(single, grouped)
