"""Sensitivity analysis and automatic mixed precision on small models with a known weak layer.

The outlier model has one convolution (``conv1``) whose output carries one channel 1000x wider than
the others; the next convolution ignores that channel. With int8 per-tensor codes the useful
channels of ``conv1``'s output get a handful of codes, so ``conv1`` is the layer that loses the
accuracy and the one whose int16 promotion restores it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.analysis.sensitivity import ProxyRunner, analyze_sensitivity, build_proxy
from compiler_core.api import mblt_compile, mxq_compile, quantize, sensitivity
from compiler_core.calibration.cache import CACHE_DIR_ENV
from compiler_core.cli import run as cli_main
from compiler_core.errors import CancelledError
from compiler_core.mblt.io import load_mblt
from compiler_core.progress import CancelToken
from compiler_core.quantization import executor
from compiler_core.quantization.mixed_precision import exact_pattern, target_metric

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def statistics_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def _outlier_model(factor: float = 1000.0) -> onnx.ModelProto:
    w0 = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    w1 = RNG.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.3
    w1[0] *= factor  # channel 0 of conv1's output: 1000x wider than the rest
    w2 = RNG.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.3
    w2[:, 0] = 0.0  # ... and nothing reads it
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"], name="relu0"),
             helper.make_node("Conv", ["b", "w1"], ["c"], name="conv1"),
             helper.make_node("Conv", ["c", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [numpy_helper.from_array(w, n) for n, w in (("w0", w0), ("w1", w1), ("w2", w2))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _model_and_data(tmp_path: Path, factor: float) -> tuple[Path, Path]:
    source = tmp_path / "outlier.onnx"
    onnx.save(_outlier_model(factor), str(source))
    mblt = mblt_compile(source, tmp_path / "outlier.mblt", backend="onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(24):
        np.save(calib / f"{index:02d}.npy", RNG.standard_normal((1, 3, 8, 8)).astype(np.float32))
    return mblt, calib


@pytest.fixture
def outlier(tmp_path) -> tuple[Path, Path]:
    """The outlier model's MBLT and a folder of 24 calibration samples (.npy)."""
    return _model_and_data(tmp_path, 1000.0)


def _conv_names(mblt: Path) -> list[str]:
    return [node.name for node in load_mblt(mblt).graph if node.op_type == "Conv"]


def test_proxy_is_exact_in_float_and_agrees_with_the_integer_program(tmp_path):
    mblt, calib = _model_and_data(tmp_path, 1.0)  # no outlier: int8 keeps a meaningful output to compare
    result = quantize(mblt, calib, target_device="aries-rb", cross_layer_equalization_config={"apply": False},
                      analysis=False)
    graph = load_mblt(mblt)
    proxy = build_proxy(graph, result.model)
    sample = {"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    runner = ProxyRunner(proxy, [sample])
    session_fp32 = ir.to_proto(graph).SerializeToString()
    import onnxruntime as ort

    fp32 = ort.InferenceSession(session_fp32, providers=["CPUExecutionProvider"]).run(None, sample)[0]
    assert np.array_equal(runner.run(proxy.mask(), sample)[0], fp32)  # every switch on "float": the model itself
    params = result.model.params("y")
    golden = params.dequantize(executor.run_codes(result.model, sample)["y"])
    fake = runner.run(proxy.all_low(), sample)[0]
    steps = np.abs(golden - fake) / float(params.scale)
    print(f"proxy vs integer program: {np.mean(steps <= 1):.4f} within one step, max {steps.max():.1f} steps; "
          f"|y| max {np.abs(golden).max():.3f}, FP32 {np.abs(fp32).max():.3f}")
    assert np.mean(steps <= 1.01) >= 0.99  # fake quantization with the program's parameters tracks the program


def test_sensitivity_ranks_the_outlier_layer_first_and_int16_recovers_it(outlier):
    mblt, calib = outlier
    events = []
    report = sensitivity(mblt, calib, target_device="aries-rb", samples=2, split=True, callback=events.append)
    conv1 = _conv_names(mblt)[1]
    top = report.layers[0]
    assert top["layer"] == conv1
    assert top["gain_db"] == max(row["gain_db"] for row in report.layers if row["gain_db"] is not None)
    assert top["gain_db"] > 10.0
    assert top["activation_alone"]["sqnr_db"] < top["weights_alone"]["sqnr_db"]  # the activation is the culprit
    assert top["point"]["rmse_over_scale"] < 0.35 and top["point"]["clip_ratio"] < 0.01  # resolution, not clipping
    assert report.statistics_from_cache is False
    assert any(e.stage == "sensitivity" and e.done == e.total for e in events)
    again = sensitivity(mblt, calib, target_device="aries-rb", samples=2)
    assert again.statistics_from_cache is True  # the second analysis reuses the calibration
    assert [row["layer"] for row in again.layers][:1] == [conv1]


def test_sensitivity_of_a_model_with_a_one_value_output(tmp_path):
    """A face mesh's face-flag logit ([1, 1, 1, 1]) has no cosine (only its sign); `qbcompiler analyze` stopped with
    INTERNAL_ERROR "'<' not supported between 'NoneType' and 'float'"."""
    model = _outlier_model(1.0)
    graph = model.graph
    graph.node.append(helper.make_node("ReduceMax", ["y"], ["flag"], keepdims=1, name="flag_head"))
    graph.output.append(helper.make_tensor_value_info("flag", TensorProto.FLOAT, [1, 1, 1, 1]))
    source = tmp_path / "flagged.onnx"
    onnx.save(model, str(source))
    mblt = mblt_compile(source, tmp_path / "flagged.mblt", backend="onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(12):
        np.save(calib / f"{index:02d}.npy", RNG.standard_normal((1, 3, 8, 8)).astype(np.float32))
    report = sensitivity(mblt, calib, target_device="aries-rb", samples=2)
    assert report.baseline["cosine"] is not None and report.baseline["sqnr_db"] is not None and report.layers


def test_sensitivity_stops_when_cancelled(outlier):
    mblt, calib = outlier
    token = CancelToken()

    def cancel_on_variants(event):
        if event.stage == "sensitivity" and event.done >= 2:
            token.cancel()

    with pytest.raises(CancelledError):
        sensitivity(mblt, calib, target_device="aries-rb", callback=cancel_on_variants, cancel_token=token)


def test_mixed_precision_promotes_the_weak_layer_and_the_saved_config_reproduces_the_mxq(outlier, tmp_path):
    mblt, calib = outlier
    saved = tmp_path / "chosen.json"
    result = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "amp.mxq",
                         analysis_holdout=6, config_save_path=saved,
                         mixed_precision_config={"apply": True, "target": {"kind": "sqnrDb", "value": 20.0},
                                                 "maxInt16Fraction": 0.7, "channelScales": False})
    mixed = result.mixed_precision
    conv1 = _conv_names(mblt)[1]
    assert mixed["target_met"]
    base, chosen = mixed["points"][0], mixed["points"][mixed["chosen"]]
    assert base["metric"] < 20.0 <= chosen["metric"]
    assert exact_pattern(conv1) in mixed["overrides"]["activation16Bits"]
    assert chosen["int16_fraction"] <= 0.7  # conv1 and conv2, which reads its int16 output
    assert target_metric(result.quantize.analysis, "sqnrDb") >= 20.0  # the compiled program, not only the search
    config = json.loads(saved.read_text())
    assert config["mixedPrecision"]["apply"] is False
    assert exact_pattern(conv1) in config["bit"]["layerOverrides"]["activation16Bits"]
    analysis = json.loads(result.analysis_path.read_text())
    assert analysis["mixed_precision"]["chosen"] == mixed["chosen"]
    assert any(point["pareto"] for point in analysis["mixed_precision"]["points"])
    first = (tmp_path / "amp.mxq").read_bytes()
    again = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "amp.mxq",
                        compile_config=saved)
    assert again.mixed_precision == {}  # no search: the saved overrides say it all
    assert (tmp_path / "amp.mxq").read_bytes() == first


def test_mixed_precision_measures_channel_scales_before_promoting_layers(outlier, tmp_path):
    """Per-channel 8-bit scales give conv1's output channels their own ranges: the target holds without int16."""
    mblt, calib = outlier
    saved = tmp_path / "chosen.json"
    result = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "amp.mxq",
                         analysis_holdout=6, config_save_path=saved,
                         mixed_precision_config={"apply": True, "target": {"kind": "sqnrDb", "value": 20.0},
                                                 "maxInt16Fraction": 0.7})
    mixed = result.mixed_precision
    chosen = mixed["points"][mixed["chosen"]]
    assert mixed["target_met"] and chosen["channel_scales"] and chosen["int16_layers"] == 0
    assert all(not point["channel_scales"] and point["metric"] < 20.0 for point in mixed["points"][:mixed["chosen"]])
    assert target_metric(result.quantize.analysis, "sqnrDb") >= 20.0
    assert json.loads(saved.read_text())["bit"]["activationScales"] == "channel"
    conv1_output = next(node.outputs[0].name for node in load_mblt(mblt).graph if node.name == _conv_names(mblt)[1])
    assert result.quantize.model.params(conv1_output).axis == 1


def test_mixed_precision_keeps_an_int8_program_that_already_meets_the_target(tmp_path):
    mblt, calib = _model_and_data(tmp_path, 1.0)
    result = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "m.mxq",
                         analysis_holdout=6, mixed_precision_config={"apply": True,
                                                                     "target": {"kind": "cosine", "value": 0.99}})
    mixed = result.mixed_precision
    assert mixed["target_met"] and len(mixed["points"]) == 1 and mixed["sensitivity"] is None
    assert mixed["overrides"] == {"activation16Bits": [], "weight16Bits": []}


def test_mixed_precision_respects_the_int16_fraction_and_says_when_the_target_is_not_met(outlier, tmp_path):
    mblt, calib = outlier
    result = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "m.mxq",
                         analysis_holdout=6, mixed_precision_config={"apply": True, "maxInt16Fraction": 0.0,
                                                                     "target": {"kind": "sqnrDb", "value": 30.0},
                                                                     "channelScales": False})
    mixed = result.mixed_precision
    assert not mixed["target_met"]
    assert {point["units"] for point in mixed["points"]} == {0}  # nothing may be promoted: only the base point(s)


def test_top1_target_needs_classifier_outputs(outlier, tmp_path):
    from compiler_core.errors import ConfigError

    mblt, calib = outlier
    with pytest.raises(ConfigError, match="top1"):
        mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "m.mxq",
                    analysis_holdout=6, mixed_precision_config={"apply": True, "target": {"kind": "top1",
                                                                                          "value": 0.9}})


def test_cli_analyze_writes_the_report_and_compile_rejects_a_bad_target(outlier, tmp_path, capsys):
    mblt, calib = outlier
    output = tmp_path / "sensitivity.json"
    code = cli_main(["analyze", "--mblt", str(mblt), "--calib-data-path", str(calib), "--target-device", "aries-rb",
                     "--output", str(output), "--top", "3", "-q"])
    assert code == 0
    document = json.loads(output.read_text())
    assert document["format"] == "qbcompiler-sensitivity" and document["layers"][0]["rank"] == 1
    assert "alone dB" in capsys.readouterr().out
    code = cli_main(["compile", "--model", str(mblt), "--calib-data-path", str(calib), "--target-device", "aries-rb",
                     "--output", str(tmp_path / "x.mxq"), "--mixed-precision", "cosine", "-q"])
    assert code != 0
    assert "KIND=VALUE" in capsys.readouterr().err


def test_analyze_sensitivity_runs_every_variant_on_every_sample(outlier):
    mblt, calib = outlier
    result = quantize(mblt, calib, target_device="aries-rb", analysis=False)
    samples = [{"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    report = analyze_sensitivity(load_mblt(mblt), result.model, samples)
    layers = len(report.layers)
    assert report.samples == 3
    assert report.variants == 3 * (1 + 2 * layers)  # baseline, then alone and kept16 per layer


def _relu_model() -> onnx.ModelProto:
    """Conv -> Relu -> Conv: the Relu output is one-sided, and a symmetric int8 range gives it 7 bits."""
    rng = np.random.default_rng(5)  # its own generator: the margins below do not depend on the test order
    weight = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    mixing = rng.standard_normal((8, 8, 1, 1)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Conv", ["b", "m"], ["y"], name="mix")]
    graph = helper.make_graph(nodes, "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(mixing, "m")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _relu_setup(tmp_path: Path) -> tuple[Path, Path]:
    source = tmp_path / "relu.onnx"
    onnx.save(_relu_model(), str(source))
    mblt = mblt_compile(source, tmp_path / "relu.mblt", backend="onnx")
    calib = tmp_path / "relu_calib"
    calib.mkdir()
    rng = np.random.default_rng(6)
    for index in range(24):
        np.save(calib / f"{index:02d}.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    return mblt, calib


def _relu_compile(mblt: Path, calib: Path, zero_points: bool, target: float):
    saved = mblt.with_name(f"relu_{zero_points}_{target}.json")
    result = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=mblt.with_suffix(".mxq"),
                         analysis_holdout=6, config_save_path=saved, mixed_precision_config={
                             "apply": True, "zeroPoints": zero_points, "target": {"kind": "sqnrDb", "value": target}})
    return result.mixed_precision, json.loads(saved.read_text())


def test_mixed_precision_takes_zero_point_ranges_before_any_int16_layer(tmp_path):
    mblt, calib = _relu_setup(tmp_path)
    mixed, config = _relu_compile(mblt, calib, True, 99.0)
    symmetric, zero_point = mixed["points"][0], mixed["points"][1]
    assert not symmetric["zero_points"] and zero_point["zero_points"]
    assert zero_point["units"] == 0 and zero_point["latency_increase"] == pytest.approx(0.0)
    assert zero_point["metric"] > symmetric["metric"] + 0.5  # the Relu output gets its 8th bit back
    target = (symmetric["metric"] + zero_point["metric"]) / 2
    mixed, config = _relu_compile(mblt, calib, True, target)
    assert mixed["target_met"] and mixed["chosen"] == 1 and mixed["sensitivity"] is None
    assert config["calibration"]["method"] == 2  # the saved config reproduces the zero-point program
    mixed, config = _relu_compile(mblt, calib, False, target)
    assert not any(point["zero_points"] for point in mixed["points"])
    assert config["calibration"]["method"] == 0


def test_mixed_precision_skips_units_past_the_latency_budget_and_tries_later_ones(outlier, tmp_path):
    mblt, calib = outlier
    result = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "m.mxq",
                         analysis_holdout=6, mixed_precision_config={"apply": True, "latencyBudget": 0.0,
                                                                     "maxInt16Fraction": 1.0,
                                                                     "target": {"kind": "sqnrDb", "value": 60.0}})
    mixed = result.mixed_precision
    skipped = [point for point in mixed["points"] if point.get("prefix") is False]
    assert skipped, "after the prefixes, single units are tried"
    assert all(not point["within_limits"] for point in skipped)  # every int16 layer costs latency here
    assert not mixed["target_met"] and mixed["points"][mixed["chosen"]]["units"] == 0


def test_mixed_precision_says_a_near_zero_held_out_output_once(outlier, tmp_path, caplog):
    """Found with CREPE: each point the search measured logged the same "(near) zero" warning again (dozens)."""
    mblt, calib = outlier
    for index in range(0, 24, 3):  # silent inputs: the output is exactly zero, its cosine meaningless
        np.save(calib / f"{index:02d}.npy", np.zeros((1, 3, 8, 8), np.float32))
    with caplog.at_level(logging.WARNING, logger="compiler_core.analysis.compare"):
        result = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "amp.mxq",
                             analysis_holdout=6,
                             mixed_precision_config={"apply": True, "target": {"kind": "sqnrDb", "value": 20.0},
                                                     "maxInt16Fraction": 0.7, "channelScales": False})
    assert len(result.mixed_precision["points"]) > 1
    said = [record.getMessage() for record in caplog.records if "(near) zero" in record.getMessage()]
    assert said and len(said) == len(set(said)) == len(result.quantize.analysis["warnings"])
