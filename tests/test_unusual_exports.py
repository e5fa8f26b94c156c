"""Exports users bring that stress the model interface: float16/float64 compute, unused and empty inputs.

Each goes the whole way (parse, calibrate on .npy files, compile, run the MXQ) and is compared with
onnxruntime on the source file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from corpus import write_manifest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mxq_compile
from compiler_core.runtime import Accelerator, Model

RNG = np.random.default_rng(0)


def _compile_and_run(source: Path, calibration: list[dict], feeds: dict, tmp_path: Path) -> list[np.ndarray]:
    mxq_compile(str(source), target_device="aries-rb", save_path=tmp_path / "model.mxq",
                calib_data_path=str(write_manifest(tmp_path / "calib", calibration)), analysis_holdout=0)
    model = Model(str(tmp_path / "model.mxq"), input_layout="NCHW")
    model.launch(Accelerator("aries-rb"))
    return model.infer(feeds)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_a_float16_classifier_compiles_and_takes_float16_arrays(tmp_path):
    """A ``model.half()``-style export: float16 input, weights and compute; the MXQ follows it."""
    weights = [numpy_helper.from_array((RNG.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float16), "w"),
               numpy_helper.from_array((RNG.standard_normal((8 * 4 * 4, 10)) * 0.1).astype(np.float16), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 10])], weights)
    source = tmp_path / "half.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    samples = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float16)} for _ in range(8)]
    feeds = {"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float16)}
    (output,) = _compile_and_run(source, samples, feeds, tmp_path)
    (reference,) = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert output.dtype == np.float32 and output.shape == (1, 10)
    assert _cosine(output, reference) > 0.99


def test_unused_and_empty_inputs_do_not_stop_a_compile(tmp_path):
    """An input nothing reads (an exporter leftover) and one with no elements still compile; ``y`` is right."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
              helper.make_tensor_value_info("unused", TensorProto.FLOAT, [1, 4]),
              helper.make_tensor_value_info("empty", TensorProto.FLOAT, [0])]
    weights = [numpy_helper.from_array(RNG.standard_normal((4, 4)).astype(np.float32), "w")]
    graph = helper.make_graph(nodes, "leftovers", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              weights)
    source = tmp_path / "leftovers.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    sample = lambda: {"x": RNG.standard_normal((1, 4)).astype(np.float32),  # noqa: E731
                      "unused": RNG.standard_normal((1, 4)).astype(np.float32), "empty": np.zeros(0, np.float32)}
    feeds = sample()
    (output,) = _compile_and_run(source, [sample() for _ in range(8)], feeds, tmp_path)
    (reference,) = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert _cosine(output, reference) > 0.99
