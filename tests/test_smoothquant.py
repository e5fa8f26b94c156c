"""SmoothQuant and residual-branch widths on small synthetic transformer blocks.

- The per-feature activation maxima of MatMul inputs are collected (and only for those tensors).
- Pre-norm block (LayerNorm -> Q/K/V-style MatMuls): the smoothed float graph gives the same outputs
  (1e-4 relative), the int8 program gets closer to FP32, and the QDQ export follows the smoothed norm.
- Post-norm block (LayerNorm output also read by the residual Add): skipped, with the reason.
- ``bit.residualBits`` widens exactly the linear outputs that a residual Add feeds into a norm.
- ``bit.residualScales: channel`` gives such an output (with outlier features) one int8 scale per feature:
  closer to FP32 than one scale, the golden executor, the fast executor and the QDQ export agree, and
  the per-feature maxima of linear outputs are collected for it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mblt_compile, quantize
from compiler_core.calibration.statistics import collect_statistics
from compiler_core.config import resolve_config
from compiler_core.errors import ArgumentError
from compiler_core.mblt.io import load_mblt
from compiler_core.quantization import executor
from compiler_core.quantization.decisions import residual_branches
from compiler_core.quantization.graph import GraphView
from compiler_core.quantization.qdq import export_qdq
from compiler_core.quantization.run import quantize_from_statistics
from compiler_core.quantization.smoothquant import smooth

RNG = np.random.default_rng(12)
TOKENS, HIDDEN, OUT = 16, 32, 24
OUTLIERS = (3, 17)


def _block(post_norm: bool) -> onnx.ModelProto:
    """x -> LayerNorm (gamma 200x on two features, whose weight rows are 200x smaller) -> two MatMul+bias -> Mul -> y.

    ``post_norm`` adds the norm's output to the sum (a residual read of the norm output).
    """
    gamma = np.ones(HIDDEN)
    gamma[list(OUTLIERS)] = 200.0
    weights = {f"w{i}": RNG.standard_normal((HIDDEN, OUT if not post_norm else HIDDEN)) * 0.2 for i in range(2)}
    for weight in weights.values():
        weight[list(OUTLIERS)] /= 200.0  # the wide features contribute like the others downstream
    width = HIDDEN if post_norm else OUT
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], name="norm", axis=-1),
             helper.make_node("MatMul", ["n", "w0"], ["m0"], name="mm0"),
             helper.make_node("Add", ["m0", "b0"], ["a0"], name="bias0"),
             helper.make_node("MatMul", ["n", "w1"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="bias1"),
             helper.make_node("Mul", ["a0", "a1"], ["y" if not post_norm else "p"], name="mix")]
    if post_norm:
        nodes += [helper.make_node("Add", ["p", "n"], ["r"], name="residual"),
                  helper.make_node("LayerNormalization", ["r", "gamma2", "beta2"], ["y"], name="norm2", axis=-1)]
    initializers = {"gamma": gamma, "beta": RNG.standard_normal(HIDDEN) * 0.1, **weights,
                    "b0": RNG.standard_normal(width) * 0.1, "b1": RNG.standard_normal(width) * 0.1,
                    "gamma2": np.ones(HIDDEN), "beta2": np.zeros(HIDDEN)}
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, width])],
        [numpy_helper.from_array(np.asarray(v, dtype=np.float32), n) for n, v in initializers.items()
         if post_norm or not n.endswith("2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _mblt(tmp_path: Path, post_norm: bool) -> Path:
    source = tmp_path / "block.onnx"
    onnx.save(_block(post_norm), str(source))
    return mblt_compile(source, tmp_path / "block.mblt", backend="onnx")


def _samples(count: int) -> list[dict[str, np.ndarray]]:
    return [{"x": RNG.standard_normal((1, TOKENS, HIDDEN)).astype(np.float32)} for _ in range(count)]


def _run(model: ir.Model | Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    data = ir.to_proto(model).SerializeToString() if isinstance(model, ir.Model) else str(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # QDQ models run as written
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _sqnr(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(((reference.astype(np.float64) - test) ** 2).sum())
    return 10 * np.log10(float((reference.astype(np.float64) ** 2).sum()) / max(noise, 1e-30))


def test_feature_maxima_are_collected_for_matmul_inputs_and_linear_outputs_only(tmp_path):
    graph = load_mblt(_mblt(tmp_path, post_norm=False))
    samples = _samples(4)
    stats = collect_statistics(graph, samples, num_samples=4)
    name = _norm_output(graph)
    norm = stats[name]
    expected = np.max([np.abs(_run(_with_output(graph, name), s)).reshape(-1, HIDDEN).max(0) for s in samples], 0)
    np.testing.assert_allclose(norm.feature_absmax, expected, rtol=1e-6)
    assert set(np.argsort(norm.feature_absmax)[-2:]) == set(OUTLIERS)
    assert norm.channel_axis == 1  # [1, 16, 32] is read on the tokens: the per-channel arrays cannot serve
    assert stats[graph.graph.outputs[0].name].feature_absmax.size == 0  # a Mul's output
    bias_output = next(node.outputs[0].name for node in graph.graph if node.op_type == "Add" and any(
        value.producer() is not None and value.producer().op_type == "MatMul" for value in node.inputs))
    assert stats[bias_output].feature_absmax.size == OUT  # a linear layer's output, through its bias Add


def _norm_output(graph: ir.Model) -> str:
    return next(node.outputs[0].name for node in graph.graph if node.op_type == "LayerNormalization")


def _with_output(graph: ir.Model, name: str) -> ir.Model:
    copy = ir.serde.deserialize_model(ir.serde.serialize_model(graph))
    value = next(node.outputs[0] for node in copy.graph if node.outputs[0].name == name)
    copy.graph.outputs.clear()
    copy.graph.outputs.append(value)
    return copy


def test_smoothing_a_pre_norm_block_keeps_the_float_function(tmp_path):
    graph = load_mblt(_mblt(tmp_path, post_norm=False))
    stats = collect_statistics(graph, _samples(8), num_samples=8)
    feeds = _samples(3)
    before = [_run(graph, sample) for sample in feeds]
    result = smooth(graph, stats, alpha=0.5)
    (item,) = result.smoothed
    assert item.tensor == _norm_output(graph)
    assert len(item.consumers) == 2 and not result.skipped
    assert item.scales[list(OUTLIERS)].min() > 3 * np.median(item.scales)
    for sample, reference in zip(feeds, before):
        np.testing.assert_allclose(_run(graph, sample), reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())


def test_smoothquant_lifts_the_int8_block_and_the_qdq_export_follows(tmp_path):
    mblt = _mblt(tmp_path, post_norm=False)
    graph = load_mblt(mblt)
    stats = collect_statistics(graph, _samples(16), num_samples=16)
    feeds = _samples(4)
    sqnr, programs = {}, {}
    for apply in (False, True):
        config = resolve_config(calibration_config={"method": 1, "mode": 0},
                                equivalent_transformation_config={"apply": apply})
        _, programs[apply] = quantize_from_statistics(graph, stats, config)
        sqnr[apply] = np.mean([_sqnr(_run(graph, f), executor.run(programs[apply], f)[graph.graph.outputs[0].name]) for f in feeds])
    assert sqnr[True] > sqnr[False] + 3, sqnr
    qdq = export_qdq(mblt, programs[True])
    output = graph.graph.outputs[0].name
    params = programs[True].params(output)
    for sample in feeds:
        reference = params.quantize(_run(qdq, sample))
        assert np.abs(reference - executor.run_codes(programs[True], sample)[output]).max() <= 1


def test_post_norm_block_is_skipped_with_the_reason(tmp_path):
    graph = load_mblt(_mblt(tmp_path, post_norm=True))
    stats = collect_statistics(graph, _samples(4), num_samples=4)
    weights = {node.name: node.inputs[1].const_value.numpy().copy() for node in graph.graph if node.op_type == "MatMul"}
    result = smooth(graph, stats)
    assert not result.smoothed
    (skip,) = result.skipped
    assert "residual" in skip.reason and "Add" in skip.reason
    for node in graph.graph:
        if node.op_type == "MatMul":
            np.testing.assert_array_equal(node.inputs[1].const_value.numpy(), weights[node.name])


def test_post_norm_block_gets_a_smoothed_norm_copy_with_duplicate_norms(tmp_path):
    mblt = _mblt(tmp_path, post_norm=True)
    graph = load_mblt(mblt)
    stats = collect_statistics(graph, _samples(16), num_samples=16)
    feeds = _samples(3)
    copy = ir.serde.deserialize_model(ir.serde.serialize_model(graph))
    result = smooth(copy, stats, duplicate_norms=True)
    (item,) = result.smoothed
    assert item.source == _norm_output(graph) and item.tensor != item.source and not result.skipped
    assert sum(node.op_type == "LayerNormalization" for node in copy.graph) == 3  # two norms and the copy
    for sample in feeds:
        reference = _run(graph, sample)
        np.testing.assert_allclose(_run(copy, sample), reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())
    widths = {}
    for patterns in (["LayerNormalization*"], []):
        config = resolve_config(calibration_config={"method": 1, "mode": 0},
                                equivalent_transformation_config={"apply": True, "duplicateNorms": True},
                                bit_config={"layerOverrides": {"activation16Bits": patterns}})
        _, program = quantize_from_statistics(graph, stats, config)
        widths[bool(patterns)] = (program.params(item.tensor).bits, program.params(item.source).bits)
    assert widths == {True: (8, 16), False: (8, 8)}  # the copy feeds int8 MatMuls even when its norm is int16
    output = graph.graph.outputs[0].name
    qdq = export_qdq(mblt, program)  # the int8 program: int16 norm outputs differ from QDQ by more than a step
    steps = np.concatenate([np.abs(program.params(output).quantize(_run(qdq, sample))
                                   - executor.run_codes(program, sample)[output]).ravel() for sample in feeds])
    assert np.mean(steps <= 1) >= 0.995 and steps.max() <= 3


def test_a_mul_by_a_per_feature_constant_absorbs_the_scale(tmp_path):
    """A decomposed RMSNorm ends in ``x * weight``: the weight takes ``1 / s``."""
    weight = np.ones(HIDDEN)
    weight[list(OUTLIERS)] = 100.0
    graph_proto = helper.make_graph(  # two norms share one weight, as exporters merge equal initializers
        [helper.make_node("Mul", ["x", "g"], ["n"], name="rms_weight"),
         helper.make_node("MatMul", ["n", "w"], ["m"], name="mm"),
         helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("Mul", ["r", "g"], ["n2"], name="rms_weight2"),
         helper.make_node("MatMul", ["n2", "w2"], ["m2"], name="mm2"),
         helper.make_node("Add", ["m", "m2"], ["y"], name="sum")],
        "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, OUT])],
        [numpy_helper.from_array(weight.astype(np.float32), "g"),
         numpy_helper.from_array(RNG.standard_normal((HIDDEN, OUT)).astype(np.float32), "w"),
         numpy_helper.from_array(RNG.standard_normal((HIDDEN, OUT)).astype(np.float32), "w2")])
    source = tmp_path / "rms.onnx"
    onnx.save(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), str(source))
    graph = load_mblt(mblt_compile(source, tmp_path / "rms.mblt", backend="onnx"))
    stats = collect_statistics(graph, _samples(8), num_samples=8)
    feeds = _samples(2)
    before = [_run(graph, sample) for sample in feeds]
    result = smooth(graph, stats)
    muls = [node for node in graph.graph if node.op_type == "Mul"]
    assert sorted(item.producer for item in result.smoothed) == sorted(node.name for node in muls)
    assert muls[0].inputs[1] is not muls[1].inputs[1]  # each got its own copy of the shared weight
    for mul in muls:
        assert np.ptp(mul.inputs[1].const_value.numpy()) < np.ptp(weight) / 5  # the outliers moved into the MatMul
    for sample, reference in zip(feeds, before):
        np.testing.assert_allclose(_run(graph, sample), reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())


def test_alpha_outside_zero_one_is_rejected(tmp_path):
    graph = load_mblt(_mblt(tmp_path, post_norm=False))
    stats = collect_statistics(graph, _samples(2), num_samples=2)
    with pytest.raises(ArgumentError):
        smooth(graph, stats, alpha=1.5)


def _residual_block() -> onnx.ModelProto:
    """Post-norm: n = LN(x); r = (n @ w + b) + n; y = LN(r)."""
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], name="norm", axis=-1),
             helper.make_node("MatMul", ["n", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["a"], name="bias"),
             helper.make_node("Add", ["a", "n"], ["r"], name="residual"),
             helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], name="norm2", axis=-1)]
    initializers = {"gamma": np.ones(HIDDEN), "beta": np.zeros(HIDDEN), "w": RNG.standard_normal((HIDDEN, HIDDEN)),
                    "b": RNG.standard_normal(HIDDEN)}
    graph = helper.make_graph(
        nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, HIDDEN])],
        [numpy_helper.from_array(np.asarray(v, dtype=np.float32), n) for n, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_residual_bits_widen_the_branch_outputs_that_feed_a_norm(tmp_path):
    source = tmp_path / "residual.onnx"
    onnx.save(_residual_block(), str(source))
    mblt = mblt_compile(source, tmp_path / "residual.mblt", backend="onnx")
    view = GraphView(load_mblt(mblt))
    (branch,) = residual_branches(view)
    producer = next(node for node in view.nodes if node.outputs[0].name == branch)
    assert producer.op_type == "Add" and any(v.producer() is not None and v.producer().op_type == "MatMul"
                                             for v in producer.inputs)
    widths = {}
    for bits in (8, 16):
        program = quantize(mblt, use_random_calib=True, analysis=False, bit_config={"residualBits": bits}).model
        widths[bits] = {name: params.bits for name, params in program.tensors.items()}
    assert widths[8][branch] == 8 and widths[16][branch] == 16
    assert {name for name in widths[16] if widths[16][name] != widths[8][name]} == {branch}


def _outlier_residual_block() -> onnx.ModelProto:
    """As :func:`_residual_block`, with the branch's output features ``OUTLIERS`` 100x the others."""
    model = _residual_block()
    weight = next(item for item in model.graph.initializer if item.name == "w")
    array = numpy_helper.to_array(weight).copy() * 0.2
    array[:, list(OUTLIERS)] *= 100.0
    weight.CopyFrom(numpy_helper.from_array(array.astype(np.float32), "w"))
    return model


def test_per_feature_residual_scales_hold_the_outlier_features(tmp_path):
    from compiler_core.runtime.fastpath.plan import executor_for

    source = tmp_path / "outliers.onnx"
    onnx.save(_outlier_residual_block(), str(source))
    mblt = mblt_compile(source, tmp_path / "outliers.mblt", backend="onnx")
    (branch,) = residual_branches(GraphView(load_mblt(mblt)))
    programs = {scales: quantize(mblt, use_random_calib=True, analysis=False,
                                 bit_config={"residualScales": scales}).model for scales in ("tensor", "channel")}
    per_tensor, per_feature = programs["tensor"], programs["channel"]
    params = per_feature.params(branch)
    assert params.bits == 8 and params.axis == 2 and np.size(params.scale) == HIDDEN
    assert set(np.argsort(params.scale)[-2:]) == set(OUTLIERS)
    assert per_tensor.params(branch).axis is None
    (add,) = [op for op in per_feature.ops if op.kind == "add" and branch in op.inputs]
    assert add.consts["multipliers"].shape == (2, HIDDEN)
    qdq, fast = export_qdq(mblt, per_feature), executor_for(per_feature)
    branch_graph = _with_output(load_mblt(mblt), branch)
    others = [index for index in range(HIDDEN) if index not in OUTLIERS]  # the features one scale rounds away
    gains = []
    for sample in _samples(3):
        golden = executor.run(per_feature, sample)["y"]
        np.testing.assert_array_equal(fast.run(sample)["y"], golden)
        assert np.abs(_run(qdq, sample) - golden).max() <= 1.01 * float(per_feature.params("y").scale)
        reference = _run(branch_graph, sample)[..., others]
        sqnr = {scales: _sqnr(reference, _branch_values(program, sample, branch)[..., others])
                for scales, program in programs.items()}
        gains.append(sqnr["channel"] - sqnr["tensor"])
    assert min(gains) > 20.0, gains  # 100x outliers: 30-34 dB measured


def _branch_values(program, sample: dict[str, np.ndarray], name: str) -> np.ndarray:
    env = executor.execute(program, executor.quantize_inputs(program, sample), keep=[name])
    return program.params(name).dequantize(env[name])
