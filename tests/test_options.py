"""Each option is defined once (compiler/build/options.py): the CLI offers exactly the API's options, with
the same defaults and choices, and both refuse the same values."""

import dataclasses

import pytest

import relaxc
from relaxc.benchmarks.bench import build_parser as bench_parser
from relaxc.cli import build_parser, option_values
from relaxc.build.options import Options, TuneOptions
from relaxc.passes.memory import PLANNERS
from relaxc.schedules.replay import MODES, ApplyTuningRecords
from relaxc.schedules.tuning import DEFAULT_TRIALS


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _dests(parser, *argv) -> set[str]:
    args = parser.parse_args([*argv])
    return set(vars(args))


def test_each_command_offers_the_api_options():
    parser = build_parser()
    own = {"command", "quiet", "model", "target", "shape", "constant", "dim_bound", "func"}
    decoder = {"max_length", "all_logits"}  # relaxc.compile's own arguments, as dim_bound is
    assert _dests(parser, "compile", "m.onnx") - own - decoder - {"output"} == _names(Options)
    assert _dests(parser, "inspect", "m.onnx") - own - decoder - {"phase", "memory", "show_dispatch", "plan",
                                                                   "json"} == _names(Options)
    assert _dests(parser, "run", "m.onnx") - own - {"input", "dim", "repeat", "seed", "report", "json", "device"} == _names(Options)
    assert _dests(parser, "profile", "m.onnx") - own - {"input", "dim", "seed", "top", "json", "worst", "measure_machine",
                                                        "max_length", "cached"} == _names(Options)
    assert _dests(parser, "tune", "m.onnx") - own - {"tune_sizes"} == (_names(Options) - {"tuning"}) | _names(TuneOptions)
    bench_own = {"models", "target", "repeat", "threads", "quiet", "markdown", "quantized", "form", "activations"}
    assert _dests(bench_parser()) - bench_own == _names(Options)


def test_cli_defaults_are_the_api_defaults():
    args = build_parser().parse_args(["tune", "m.onnx"])
    assert TuneOptions(**option_values(args, TuneOptions)) == TuneOptions()
    assert Options(**option_values(build_parser().parse_args(["compile", "m.onnx"]), Options)) == Options()


def test_tuning_runs_the_same_budget_from_compile_and_from_tune():
    assert TuneOptions().trials == DEFAULT_TRIALS == ApplyTuningRecords("tune", None).trials


@pytest.mark.parametrize("field, choices", [("tuning", MODES), ("memory_planner", PLANNERS)])
def test_cli_and_api_accept_the_same_choices(field, choices):
    flag = "--" + field.replace("_", "-")
    for choice in choices:
        args = build_parser().parse_args(["compile", "m.onnx", flag, choice])
        options = Options(**option_values(args, Options))
        assert getattr(options, field) == choice
        assert getattr(options.resolve("cpu"), field) == choice
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["compile", "m.onnx", flag, "bogus"])
    assert exit_info.value.code == 2
    with pytest.raises(relaxc.UserError, match=f"{field} must be one of {', '.join(choices)}, not 'bogus'"):
        Options(**{field: "bogus"}).resolve("cpu")


def test_list_options_arrive_as_tuples():
    args = build_parser().parse_args(["compile", "m.onnx", "--unshared", "conv*", "dense*"])
    assert Options(**option_values(args, Options)).resolve("cpu").unshared == ("conv*", "dense*")


def test_resolve_fills_in_the_target_defaults():
    cpu = Options().resolve("cpu")
    assert cpu.layout_block in (4, 8, 16) and cpu.memory_planner == "arena"
    assert cpu.layout_why == "the target's fp32 vector lanes"
    assert Options(layout_block=0).resolve("cpu").layout_why == "given by the caller"
    with pytest.raises(relaxc.UserError, match="layout_block must be 0"):
        Options(layout_block=1).resolve("cpu")


def test_an_unknown_option_is_refused_by_the_api():
    with pytest.raises(TypeError, match="bogus"):
        relaxc.compile("onnx:squeezenet", bogus=1)
