"""Accuracy mechanisms of the quantizer: output and int16 headroom, cross-layer equalization (small synthetic models)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mblt_compile, quantize
from compiler_core.calibration.statistics import StatisticsSet, TensorStats
from compiler_core.config import resolve_config
from compiler_core.mblt.io import load_mblt
from compiler_core.quantization import executor
from compiler_core.quantization.decisions import OUTPUT_MIN_SQNR_DB, headroom_factor, output_head
from compiler_core.quantization.equalize import equalize, find_pairs
from compiler_core.quantization.graph import GraphView, build_groups
from compiler_core.quantization.pipeline import quantize_graph
from compiler_core.quantization.qdq import export_qdq

RNG = np.random.default_rng(7)


def _model(nodes, inputs: dict[str, list[int]], outputs: dict[str, list[int]], initializers: dict) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "test", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v) if np.asarray(v).dtype == np.int64 else np.asarray(v, dtype=np.float32), n)
         for n, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _mblt(tmp_path: Path, model: onnx.ModelProto) -> Path:
    source = tmp_path / "model.onnx"
    onnx.save(model, str(source))
    return mblt_compile(source, tmp_path / "model.mblt", backend="onnx")


def _fp32(path: Path | bytes, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(path if isinstance(path, bytes) else str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _sqnr(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(((reference.astype(np.float64) - test) ** 2).sum())
    return 10 * np.log10(float((reference.astype(np.float64) ** 2).sum()) / max(noise, 1e-30))


# -- output headroom -------------------------------------------------------------------------------


def _head_model() -> onnx.ModelProto:
    """Two conv heads -> Reshape -> Concat (a detector's output), after an inner conv."""
    return _model(
        [helper.make_node("Conv", ["x", "w0"], ["inner"], name="conv0"),
         helper.make_node("Relu", ["inner"], ["act"], name="relu0"),
         helper.make_node("Conv", ["act", "w1"], ["h1"], name="conv1"),
         helper.make_node("Conv", ["act", "w2"], ["h2"], name="conv2"),
         helper.make_node("Reshape", ["h1", "shape"], ["r1"], name="reshape1"),
         helper.make_node("Reshape", ["h2", "shape"], ["r2"], name="reshape2"),
         helper.make_node("Concat", ["r1", "r2"], ["out"], name="concat", axis=1)],
        {"x": [1, 4, 6, 6]}, {"out": [1, 144]},
        {"w0": RNG.standard_normal((4, 4, 1, 1)), "w1": RNG.standard_normal((2, 4, 1, 1)),
         "w2": RNG.standard_normal((2, 4, 1, 1)), "shape": np.array([1, 72], dtype=np.int64)})


def test_output_head_reaches_back_through_movement_and_concat(tmp_path):
    view = GraphView(load_mblt(_mblt(tmp_path, _head_model())))
    head = output_head(view, build_groups(view))
    producers = {value.name: node for node in view.nodes for value in node.outputs}
    ops = sorted(producers[name].op_type for name in head)
    assert ops == ["Concat", "Conv", "Conv", "Reshape", "Reshape"]
    first_conv = next(node for node in view.nodes if node.op_type == "Conv")
    assert first_conv.outputs[0].name not in head and view.graph.inputs[0].name not in head


def _quantized_with_range(mblt: Path, high: float, **config_args):
    """The program of ``mblt`` as if calibration had seen the inputs within ±2 and other tensors within ±``high``."""
    config = resolve_config(**config_args)
    graph = load_mblt(mblt)
    inputs = {value.name for value in graph.graph.inputs}
    return quantize_graph(graph, lambda names, bits: {n: (-2.0, 2.0) if n in inputs else (-high, high) for n in names},
                          config)


def test_output_headroom_keeps_outputs_past_the_calibrated_range(tmp_path):
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], {"x": [1, 2, 4, 4]},
                   {"y": [1, 2, 4, 4]}, {"w": np.eye(2).reshape(2, 2, 1, 1)})
    mblt = _mblt(tmp_path, model)
    feeds = {"x": np.full((1, 2, 4, 4), 0.9, dtype=np.float32)}
    feeds["x"][0, 0] = 1.8  # an output 1.8x past the calibrated range of y (the inputs' range is 2)
    reference = _fp32(mblt, feeds)
    clipped = executor.run(_quantized_with_range(mblt, 1.0, calibration_config={"output_headroom": 1}), feeds)["y"]
    program = _quantized_with_range(mblt, 1.0)
    kept = executor.run(program, feeds)["y"]
    assert np.abs(clipped - reference).max() > 0.7
    assert program.params("y").bits == 8
    assert np.abs(kept - reference).max() < 2 / 127  # one step of the int8 input and output
    wide = _quantized_with_range(mblt, 1.0, bit_config={"output_bits": 16})
    assert wide.params("y").bits == 16


def test_headroom_is_capped_where_the_values_are_narrow_for_their_range():
    """ddddocr_rec's logits: RMS 1/22 of the range; headroom 2 cost 0.004 cosine (0.9933 -> 0.9890)."""
    logits = headroom_factor(-45.8, 45.8, 8, rms=2.06, headroom=2.0, symmetric=True)
    assert 1.0 <= logits < 1.2
    assert headroom_factor(-143.8, 143.8, 8, rms=19.7, headroom=2.0, symmetric=True) == 2.0  # palm regressors
    assert headroom_factor(-45.8, 45.8, 16, rms=2.06, headroom=2.0, symmetric=True) == 2.0  # int16: steps to spare
    assert headroom_factor(-45.8, 45.8, 8, rms=None, headroom=2.0, symmetric=True) == 2.0
    assert headroom_factor(-45.8, 45.8, 8, rms=0.001, headroom=2.0, symmetric=True) == 1.0
    # the rounding noise of the widened step stays OUTPUT_MIN_SQNR_DB below the mean square
    step = 2 * 45.8 * logits / 255
    assert 10 * np.log10(2.06 ** 2 / (step ** 2 / 12)) == pytest.approx(OUTPUT_MIN_SQNR_DB)


def test_quantize_graph_caps_the_headroom_of_a_narrow_output(tmp_path):
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], {"x": [1, 2, 4, 4]},
                   {"y": [1, 2, 4, 4]}, {"w": np.eye(2).reshape(2, 2, 1, 1)})
    graph = load_mblt(_mblt(tmp_path, model))
    ranges = lambda names, bits: {n: (-2.0, 2.0) if n == "x" else (-1.0, 1.0) for n in names}  # noqa: E731
    full = quantize_graph(graph, ranges, resolve_config(), signal_rms={"y": 0.5})
    narrow = quantize_graph(load_mblt(tmp_path / "model.mblt"), ranges, resolve_config(), signal_rms={"y": 0.01})
    assert float(full.params("y").scale) == pytest.approx(2.0 / 127)
    assert float(narrow.params("y").scale) == pytest.approx(1.0 / 127)


def test_int16_headroom_keeps_inner_int16_tensors_past_the_calibrated_range(tmp_path):
    """BlazeFace on a held-out face: inner activations 20-80 % past the calibrated range; int16 has steps to spare."""
    model = _model([helper.make_node("Conv", ["x", "w0"], ["inner"], name="conv0"),
                    helper.make_node("Conv", ["inner", "w1"], ["y"], name="conv1")],
                   {"x": [1, 2, 4, 4]}, {"y": [1, 2, 4, 4]},
                   {"w0": np.eye(2).reshape(2, 2, 1, 1), "w1": 0.5 * np.eye(2).reshape(2, 2, 1, 1)})
    mblt = _mblt(tmp_path, model)
    feeds = {"x": np.full((1, 2, 4, 4), 0.5, dtype=np.float32)}
    feeds["x"][0, 0] = 1.8  # "inner" 1.8x past its calibrated range of ±1
    reference = _fp32(mblt, feeds)
    int16 = {"bit_config": {"layer_overrides": {"activation16_bits": ["*"]}}}
    clipped = executor.run(_quantized_with_range(mblt, 1.0, **int16), feeds)["y"]
    program = _quantized_with_range(mblt, 1.0, calibration_config={"int16_headroom": 2}, **int16)
    kept = executor.run(program, feeds)["y"]
    assert np.abs(clipped - reference).max() > 0.3  # clipped at the inner tensor: 0.5 * 1.0 instead of 0.5 * 1.8
    assert float(program.params("Conv_0").scale) == pytest.approx(2.0 / 32767)
    assert np.abs(kept - reference).max() < 1e-3
    int8 = _quantized_with_range(mblt, 1.0, calibration_config={"int16_headroom": 2})
    assert float(int8.params("Conv_0").scale) == pytest.approx(1.0 / 127)  # int8 tensors keep their range


def _cache_model() -> onnx.ModelProto:
    """A streaming layer: Concat(previous cache, new frame) feeds the next conv and, sliced, the next cache."""
    return _model(
        [helper.make_node("Conv", ["x", "w0"], ["frame"], name="conv0"),
         helper.make_node("Concat", ["cache", "frame"], ["window"], name="concat", axis=2),
         helper.make_node("Conv", ["window", "w1"], ["y"], name="conv1"),
         helper.make_node("Slice", ["window", "starts", "ends", "axes"], ["next_cache"], name="slice")],
        {"x": [1, 4, 1, 6], "cache": [1, 4, 2, 6]}, {"y": [1, 4, 1, 6], "next_cache": [1, 4, 2, 6]},
        {"w0": RNG.standard_normal((4, 4, 1, 1)), "w1": RNG.standard_normal((4, 4, 3, 1)),
         "starts": np.array([1], np.int64), "ends": np.array([3], np.int64), "axes": np.array([2], np.int64)})


def test_output_head_leaves_out_tensors_that_other_layers_also_read(tmp_path):
    """fsmn_vad's caches: widening the Concat for the next-cache output also coarsened the next layer's input."""
    view = GraphView(load_mblt(_mblt(tmp_path, _cache_model())))
    head = output_head(view, build_groups(view))
    producers = {value.name: node.op_type for node in view.nodes for value in node.outputs}
    assert sorted(producers.get(name, "input") for name in head) == ["Conv"]  # only y's conv


# -- cross-layer equalization ----------------------------------------------------------------------


def _depthwise_model(channels: int = 8) -> onnx.ModelProto:
    """Depthwise 3x3 -> 1x1 conv with no activation between; channel 0 is 200x wider than the rest."""
    depthwise = RNG.standard_normal((channels, 1, 3, 3)) * 0.2
    depthwise[0] *= 200.0
    pointwise = RNG.standard_normal((4, channels, 1, 1))
    pointwise[:, 0] *= 0.01  # the wide channel contributes like the others downstream
    return _model([helper.make_node("Conv", ["x", "dw", "db"], ["d"], name="dw", group=channels, pads=[1, 1, 1, 1]),
                   helper.make_node("Conv", ["d", "pw"], ["y"], name="pw")],
                  {"x": [1, channels, 8, 8]}, {"y": [1, 4, 8, 8]},
                  {"dw": depthwise, "db": RNG.standard_normal(channels) * 0.1, "pw": pointwise})


def test_equalization_finds_depthwise_pairs_and_keeps_the_float_function(tmp_path):
    mblt = _mblt(tmp_path, _depthwise_model())
    graph = load_mblt(mblt)
    (depthwise, pointwise), = find_pairs(graph)
    assert depthwise.attributes["group"].as_int() == 8 and pointwise.op_type == "Conv"
    middle = depthwise.outputs[0].name
    feeds = {"x": RNG.standard_normal((1, 8, 8, 8)).astype(np.float32)}
    before = _fp32(mblt, feeds)
    per_channel = np.abs(_fp32(_only_output(graph, middle), feeds)).max(axis=(0, 2, 3)).astype(np.float64)
    stats = StatisticsSet({middle: TensorStats(middle, (1, 8, 8, 8), 1, -per_channel.max(), per_channel.max(), 512,
                                               0.0, 1.0, -per_channel, per_channel, np.zeros(8), np.zeros(16), 1.0,
                                               np.array([per_channel.max()]))}, 1, "", "", 0.0)
    (pair,) = equalize(graph, stats)
    assert pair.scales.max() / pair.scales.min() > 10
    np.testing.assert_allclose(_fp32(ir.to_proto(graph).SerializeToString(), feeds), before, rtol=1e-4, atol=1e-4)


def _only_output(graph: ir.Model, name: str) -> bytes:
    """The model with tensor ``name`` as its only output."""
    proto = ir.to_proto(graph)
    del proto.graph.output[:]
    proto.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return proto.SerializeToString()


def test_equalization_lifts_the_quantized_depthwise_pair(tmp_path):
    mblt = _mblt(tmp_path, _depthwise_model())
    feeds = [{"x": RNG.standard_normal((1, 8, 8, 8)).astype(np.float32)} for _ in range(4)]
    results = {}
    for apply in (False, True):
        program = quantize(mblt, use_random_calib=True, analysis=False,
                           cross_layer_equalization_config={"apply": apply}).model
        results[apply] = np.mean([_sqnr(_fp32(mblt, f), executor.run(program, f)["y"]) for f in feeds])
    assert results[True] > results[False] + 10
    assert results[True] > 25
    qdq = ir.to_proto(export_qdq(mblt, program)).SerializeToString()  # the equalized weights' codes
    name = program.outputs[0].name
    for sample in feeds:
        reference = program.params(name).quantize(_fp32(qdq, sample))
        assert np.abs(reference - executor.run_codes(program, sample)[name]).max() <= 1


# -- int16 layers widen the model input they read --------------------------------------------------


def test_int16_first_layer_reads_an_int16_model_input(tmp_path):
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], {"x": [1, 2, 4, 4]},
                   {"y": [1, 2, 4, 4]}, {"w": np.eye(2).reshape(2, 2, 1, 1)})
    mblt = _mblt(tmp_path, model)
    graph = load_mblt(mblt)
    name = graph.graph.inputs[0].name
    int8 = _quantized_with_range(mblt, 2.0)
    int16 = _quantized_with_range(mblt, 2.0, bit_config={"layer_overrides": {"activation16_bits": ["*"]}})
    assert int8.params(name).bits == 8 and int16.params(name).bits == 16
    feeds = {name: np.linspace(-1.9, 1.9, 32, dtype=np.float32).reshape(1, 2, 4, 4)}
    error = np.abs(executor.run(int16, feeds)["y"] - _fp32(mblt, feeds)).max()
    assert error < 2 * 2.0 / 32767
