"""ResNet-50's pointwise convolutions as relaxc runs them (blocked conv) against the same product as a
packed GEMM on (H*W, C) rows (``python -m tools.experiments.pointwise_gemm``).

    .venv/bin/python -m tools.experiments.pointwise_gemm [--tuning off]

Why: "1x1 as a packed GEMM" is one of the implementations dispatch could choose from; this
measures whether the ``Dense`` rule's packed product beats the ``Tiled`` rule's blocked conv on the
real shapes before anyone builds the candidate. Each shape is two one-layer models compiled by
relaxc (Conv + bias + ReLU on NCHW, and MatMul + bias + ReLU on rows), and each model's main kernel
timed alone by ``relaxc.build.profile`` (warm caches); layout converters around the conv are not counted.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import relaxc
from relaxc.build import profile
from relaxc.runtime.runner import random_inputs

# (input channels, output channels, height = width): ResNet-50's pointwise layers, stride 1
SHAPES = ((1024, 256, 14), (256, 1024, 14), (512, 128, 28), (128, 512, 28), (256, 64, 56), (64, 256, 56),
          (2048, 512, 7), (512, 2048, 7))


def one_layer(cin: int, cout: int, size: int, as_gemm: bool) -> onnx.ModelProto:
    """The pointwise layer with seeded weights: a Conv on NCHW, or a MatMul on (size^2, cin) rows."""
    rng = np.random.default_rng(cin * cout + size)
    weight = (rng.standard_normal((cout, cin)) * 0.05).astype(np.float32)
    bias = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")
    if as_gemm:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["a"])]
        x, y, w = [size * size, cin], [size * size, cout], weight.T.copy()
    else:
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["a"])]
        x, y, w = [1, cin, size, size], [1, cout, size, size], weight.reshape(cout, cin, 1, 1)
    graph = helper.make_graph(nodes + [helper.make_node("Relu", ["a"], ["y"])], "pointwise",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)],
                              [numpy_helper.from_array(w, "w"), bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main_kernel_ms(model: onnx.ModelProto, tuning: str) -> tuple[str, float]:
    """The name and time of the model's conv or dense kernel."""
    art = relaxc.compile(model, tuning=tuning)
    kernels = profile.profile(art, random_inputs(art.inputs)).kernels
    main = next(k for k in kernels if "conv" in k.name or "dense" in k.name)
    return main.name, main.ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tuning", default="off", choices=("off", "replay"))
    args = parser.parse_args()
    print("| layer | blocked conv, ms (GFLOP/s) | packed GEMM, ms (GFLOP/s) | GEMM / conv |")
    print("| --- | ---: | ---: | ---: |")
    for cin, cout, size in SHAPES:
        gflop = 2 * cin * cout * size * size / 1e9
        _, conv = main_kernel_ms(one_layer(cin, cout, size, False), args.tuning)
        _, gemm = main_kernel_ms(one_layer(cin, cout, size, True), args.tuning)
        print(f"| {cin} -> {cout} at {size}x{size} | {conv:.3f} ({gflop / conv * 1e3:.0f}) | "
              f"{gemm:.3f} ({gflop / gemm * 1e3:.0f}) | {gemm / conv:.2f} |", flush=True)


if __name__ == "__main__":
    main()
