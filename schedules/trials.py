"""How tuning trials are searched for and timed: MetaSchedule's search space and strategy as relaxc
sets them for CPUs, the runner that times each candidate (here or on RPC servers), and the
arguments it runs them on."""

from __future__ import annotations

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from relaxc.support import remote

RUNS_PER_TRIAL = 5  # cold runs timed per candidate
UNROLL_STEPS = (0, 16, 64)  # explicit unrolling MetaSchedule may choose on CPU (its default adds 512)
POPULATION_PER_TRIAL = 8  # evolutionary search population per candidate a batch measures (MetaSchedule: 512)
RPC_TIMEOUT_S = 60  # one candidate's session on an RPC server: upload, load, timed runs


def make_runner(target: Target) -> ms.runner.Runner | str:
    """How trials are timed: on this machine, or on the servers of ``remote.measuring_on``'s tracker,
    one candidate per session, as many at once as there are servers. On CPU each run starts with every
    argument but the first flushed from the caches, as in the model, where each weight is read once per
    inference: timed hot, the records of ResNet-50 promised kernels 2.3x faster than the defaults, and
    the model ran 5% faster."""
    if target.kind.name != "llvm":
        return "local"
    evaluator = ms.runner.EvaluatorConfig(number=1, repeat=RUNS_PER_TRIAL, min_repeat_ms=0, enable_cpu_cache_flush=True)
    tracker = remote.measuring_tracker()
    if tracker is None:
        return ms.runner.LocalRunner(evaluator_config=evaluator, f_alloc_argument=alloc_arguments)
    config = ms.runner.RPCConfig(tracker.host, tracker.port, tracker.key, session_timeout_sec=RPC_TIMEOUT_S)
    return ms.runner.RPCRunner(config, evaluator, f_create_session=remote.runner_session,
                               f_alloc_argument=alloc_remote_arguments, f_cleanup=remote.runner_cleanup,
                               max_workers=max(1, tracker.servers()))


def alloc_arguments(device: tvm.runtime.Device, args_info: list, alloc_repeat: int) -> list[list]:
    """MetaSchedule's random arguments, but integer tensors all zero: they are indices (token ids, a
    gather's positions), and random ones read outside the data, so BERT's embedding lookups (``take``)
    crashed in every trial and never got a record (``tuning="strict"`` then failed on a new CPU).
    Runs in the measuring worker."""
    return _arguments(tvm.get_global_func("tvm.contrib.random.random_fill_for_measure"), device, args_info,
                      alloc_repeat)


def alloc_remote_arguments(session, device: tvm.runtime.Device, args_info: list, alloc_repeat: int) -> list[list]:
    """``alloc_arguments`` on an RPC server."""
    return _arguments(session.get_function("tvm.contrib.random.random_fill_for_measure"), device, args_info,
                      alloc_repeat)


def _arguments(random_fill, device: tvm.runtime.Device, args_info: list, alloc_repeat: int) -> list[list]:
    def fill(tensor: tvm.runtime.Tensor) -> None:
        if tensor.dtype.startswith(("int", "uint")):
            tensor.copyfrom(np.zeros(tensor.shape, tensor.dtype))
        else:
            random_fill(tensor)

    return ms.runner.utils.alloc_argument_common(fill, device, args_info, alloc_repeat)


def search_strategy(size: int) -> ms.search_strategy.EvolutionarySearch:
    """MetaSchedule's evolutionary search with a population in proportion to the batch it picks (512,
    its default, for a batch of 64): sampling 512 schedules of a Winograd input transform took 64 s
    on 2 cores, and a batch of 2 needs no such choice."""
    population = max(16, min(512, POPULATION_PER_TRIAL * size))
    return ms.search_strategy.EvolutionarySearch(population_size=population,
                                                 init_min_unmeasured=min(50, population // 2))


def search_space(target: Target) -> ms.space_generator.SpaceGenerator | str:
    """MetaSchedule's search space; on CPU with explicit unrolling limited to 64 steps, because 512
    made single kernels take LLVM up to 5 s to build and load, for no speed."""
    if target.kind.name != "llvm":
        return "post-order-apply"
    rules = [ms.schedule_rule.ParallelizeVectorizeUnroll(max_jobs_per_core=16, max_vectorize_extent=64,
                                                        unroll_max_steps=list(UNROLL_STEPS), unroll_explicit=True)
             if isinstance(rule, ms.schedule_rule.ParallelizeVectorizeUnroll) else rule
             for rule in ms.ScheduleRule.create("llvm")]
    return ms.space_generator.PostOrderApply(sch_rules=rules, postprocs="llvm", mutator_probs="llvm")
