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
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float16), "w"),
               numpy_helper.from_array((rng.standard_normal((8 * 4 * 4, 10)) * 0.1).astype(np.float16), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 10])], weights)
    source = tmp_path / "half.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    samples = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float16)} for _ in range(8)]
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float16)}
    (output,) = _compile_and_run(source, samples, feeds, tmp_path)
    (reference,) = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert output.dtype == np.float32 and output.shape == (1, 10)
    assert _cosine(output, reference) > 0.99


def test_unused_and_empty_inputs_do_not_stop_a_compile(tmp_path):
    """An input nothing reads (an exporter leftover) and one with no elements still compile; ``y`` is right."""
    rng = np.random.default_rng(11)  # its own: the module's generator depends on which tests ran before (xdist)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
              helper.make_tensor_value_info("unused", TensorProto.FLOAT, [1, 4]),
              helper.make_tensor_value_info("empty", TensorProto.FLOAT, [0])]
    weights = [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")]
    graph = helper.make_graph(nodes, "leftovers", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              weights)
    source = tmp_path / "leftovers.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    sample = lambda: {"x": rng.standard_normal((1, 4)).astype(np.float32),  # noqa: E731
                      "unused": rng.standard_normal((1, 4)).astype(np.float32), "empty": np.zeros(0, np.float32)}
    feeds = sample()
    (output,) = _compile_and_run(source, [sample() for _ in range(8)], feeds, tmp_path)
    (reference,) = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.abs(reference).max() > 0 and _cosine(output, reference) > 0.99


def test_a_float16_export_with_its_casts_out_of_order_folds_its_resize_sizes(tmp_path):
    """onnxconverter-common's float16 conversion appends its Casts after every other node (the graph is out of
    order; onnxruntime runs it, ONNX's checker refuses it). ISNet (imgly background removal) sizes each upsampling from
    Shape/Slice/Concat of the tensor it joins: its 37 Shape nodes stayed unfolded because ONNX's inference, reading the
    nodes in order, gave no shape after the first misplaced Cast (the optimizer's rounds then resolved a few levels)."""
    levels = 6  # more than the optimizer's rounds
    rng = np.random.default_rng(12)
    weights = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float16), "w0"),
               numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float16), "w1"),
               numpy_helper.from_array(np.array([2], np.int64), "two"),
               numpy_helper.from_array(np.array([4], np.int64), "four"),
               numpy_helper.from_array(np.array([1, 4], np.int64), "batch_channels")]
    nodes = [helper.make_node("Conv", ["x16", "w0"], ["level0"], pads=[1, 1, 1, 1])]
    casts = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16)]
    for level in range(levels):
        here, below, up = f"level{level}", f"low{level}", f"up{level}"
        nodes += [helper.make_node("MaxPool", [here], [f"pooled{level}"], kernel_shape=[2, 2], strides=[2, 2]),
                  helper.make_node("Conv", [f"pooled{level}", "w1"], [below], pads=[1, 1, 1, 1]),
                  helper.make_node("Shape", [here], [f"shape{level}"]),
                  helper.make_node("Slice", [f"shape{level}", "two", "four"], [f"hw{level}"]),
                  helper.make_node("Concat", ["batch_channels", f"hw{level}"], [f"sizes{level}"], axis=0),
                  helper.make_node("Resize", [f"{below}_32", "", "", f"sizes{level}"], [f"{up}_32"], mode="linear"),
                  helper.make_node("Add", [f"{up}_16", here], [f"level{level + 1}"])]
        casts += [helper.make_node("Cast", [below], [f"{below}_32"], to=TensorProto.FLOAT),
                  helper.make_node("Cast", [f"{up}_32"], [f"{up}_16"], to=TensorProto.FLOAT16)]
    casts.append(helper.make_node("Cast", [f"level{levels}"], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(nodes + casts, "unsorted_half",  # the converter's Casts, appended last
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], weights)
    source = tmp_path / "unsorted_half.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), source)
    samples = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(8)]
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    (output,) = _compile_and_run(source, samples, feeds, tmp_path)
    (reference,) = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert output.shape == (1, 4, 8, 8) and _cosine(output, reference) > 0.99
