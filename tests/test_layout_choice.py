"""The graph-level layout choice on real graphs: any plan it can produce compiles to the right
result, its choice on a model equals brute force, it converts where converting is cheaper than
staying, and the measured times are stored once and replayed."""

import itertools
import json

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper

import relaxc
from relaxc import frontend
from relaxc.build import pipeline
from relaxc.passes import layout_choice
from relaxc.passes.layout_algebra import STANDARD, blocked
from relaxc.schedules import cache
from relaxc.support.store_files import LAYOUT_FILE
from relaxc.support import targets
from tests import reference

LAYOUTS = [blocked(16), blocked(8), STANDARD]


class MadeUpCosts:
    """Convolution times per layout name and one converter time, or random ones (seeded)."""

    def __init__(self, conv: dict[str, float] | None = None, convert: float = 1.0, seed: int | None = None):
        self.conv_ms, self.convert_ms = conv, convert
        self.rng = np.random.default_rng(seed)

    def ms(self, key, module):
        assert isinstance(module(), tvm.IRModule)
        if key.startswith("conv2d"):
            return self.conv_ms[key.rsplit("-", 1)[1]] if self.conv_ms else float(self.rng.uniform(0, 2))
        return self.convert_ms if self.conv_ms else float(self.rng.uniform(0, 0.5))


def softmax_between_convs() -> onnx.ModelProto:
    """conv -> softmax over the channels (NCHW only) -> conv -> relu: the second conv either stays
    in NCHW or pays two converters to run blocked."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((16, 3, 3, 3)) * 0.3, rng.standard_normal((24, 16, 3, 3)) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Softmax", ["c1"], ["s"], axis=1),
             helper.make_node("Conv", ["s", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"])]
    return reference._model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 16, 16])],
                            [reference._const("w1", w1), reference._const("w2", w2)])


def simplified(model: onnx.ModelProto):
    """The model's Relax module as the layout phase receives it."""
    config = relaxc.Options(layout_block=16).resolve("cpu")
    imported = frontend.import_model(model)
    simplify = next(phase for phase in pipeline.PHASES if phase.name == "simplify")
    return simplify.run(pipeline.Compilation(config, model=imported, mod=imported.module))


def brute_force(problem) -> float:
    names = [op.name for op in problem.operators]
    return min(problem.total(dict(zip(names, choice)))
               for choice in itertools.product(*(list(op.costs) for op in problem.operators)))


@pytest.mark.parametrize("converter_ms, converts", [(0.5, True), (3.0, False)])
def test_converts_where_converting_is_cheaper_than_staying(converter_ms, converts):
    """Blocked convs at 1 ms, NCHW at 4: with 0.5 ms converters the second conv runs blocked
    between two converters (2 ms < 3 ms saved); with 3 ms ones it stays in NCHW. Both equal brute force."""
    mod = simplified(softmax_between_convs())
    costs = MadeUpCosts({"NCHW16c": 1.0, "NCHW8c": 1.5, "NCHW": 4.0}, converter_ms)
    problem = layout_choice.build_problem(mod, LAYOUTS, costs).problem
    choice = layout_choice.choose(mod, LAYOUTS, costs)
    assert choice.solution.method == "exact"
    assert choice.solution.cost == pytest.approx(brute_force(problem))
    second = [op.name for op in problem.operators if len(op.costs) == 3 and op.costs["NCHW"] == 4.0][1]
    assert (choice.solution.choice[second] == "NCHW16c") == converts


@pytest.mark.parametrize("model", [reference.blocked_paths_cnn, reference.branchy_cnn, softmax_between_convs])
@pytest.mark.parametrize("seed", [0, 1])
def test_any_chosen_plan_matches_onnxruntime(monkeypatch, model, seed):
    """Plans chosen under random times mix NCHW16c, NCHW8c and NCHW with converters between
    them; every one compiles to the onnxruntime result."""
    onnx_model = model()
    chosen = {}

    def plan(mod, _c):
        choice = layout_choice.choose(mod, LAYOUTS, MadeUpCosts(seed=seed))
        chosen.update(choice.plan)
        return choice.plan, choice.summary()

    monkeypatch.setattr(pipeline, "_plan_layouts", plan)
    art = relaxc.compile(onnx_model, tuning="off", layouts="replay")
    assert len({layout.name for layout in chosen.values()}) >= 2  # a mixed plan, not one layout
    x = np.random.default_rng(seed).standard_normal(
        [d.dim_value for d in onnx_model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    reference.assert_matches(reference.relaxc_run(art, x), reference.ort_run(onnx_model, {"x": x}))


def test_times_measured_once_then_replayed(tmp_path):
    model = reference.conv3x3(16, 16, 12, 12, 1)
    first = relaxc.compile(model, tuning="off", layouts="measure", cache_dir=str(tmp_path)).report()["layout"]
    assert first["choice"]["source"] == "measured" and first["choice"]["method"] == "exact"
    assert first["choice"]["ms"] <= first["choice"]["default_ms"] + 1e-9
    stored = json.loads((tmp_path / cache.target_key(targets.resolve("cpu")) / LAYOUT_FILE).read_text())["workloads"]
    assert {key.rsplit("-", 1)[1] for key in stored if key.startswith("conv2d")} == {"NCHW", "NCHW8c", "NCHW16c"}
    assert all(entry["ms"] > 0 for entry in stored.values())
    again = relaxc.compile(model, tuning="off", layouts="replay", cache_dir=str(tmp_path)).report()["layout"]
    assert again["choice"]["source"] == "stored" and again["choice"]["ms"] == first["choice"]["ms"]
    empty = relaxc.compile(model, tuning="off", layouts="replay", cache_dir=str(tmp_path / "none")).report()["layout"]
    assert empty["choice"]["source"] == "rule" and "layouts='measure'" in empty["choice"]["why"]
    default = relaxc.compile(model, tuning="off", cache_dir=str(tmp_path)).report()["layout"]
    assert "choice" not in default  # the rule, no choice made
