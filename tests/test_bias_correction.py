"""Empirical bias correction (``layerBiasCorrection.empirical``) on a small model with a known mean shift.

The model: conv0 -> Relu -> conv1 -> GlobalAveragePool. One output channel of conv0 is 60x wider than
the others, so the int8 per-tensor scale leaves the narrow (non-negative) channels a few codes; their
rounding is not zero-mean, conv1 inherits a per-channel shift, and the average pool keeps only that
shift. The analytic correction (own weight rounding) cannot see it; the empirical one measures it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mblt_compile, quantize
from compiler_core.calibration.cache import CACHE_DIR_ENV
from compiler_core.mblt.io import load_mblt
from compiler_core.quantization.bias_correction import correct_biases
from compiler_core.quantization.run import quantize_from_statistics

SEED = 5
"""One draw of weights and data for every test, in any order and any pytest-xdist worker (a module-level generator
gave each test the draw its position in the run left it: the measured gains varied 1.6-5.5 dB between draws)."""


@pytest.fixture(autouse=True)
def statistics_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def _shift_model(rng: np.random.Generator) -> onnx.ModelProto:
    w0 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2
    w0[0] *= 60.0  # one wide channel sets the per-tensor scale
    b0 = np.full(8, -0.1, np.float32)
    w1 = rng.standard_normal((6, 8, 1, 1)).astype(np.float32)
    w1[:, 0] *= 0.01  # ... and conv1 barely reads it: the narrow channels carry the output
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"], name="relu0"),
             helper.make_node("Conv", ["b", "w1"], ["c"], name="conv1"),
             helper.make_node("GlobalAveragePool", ["c"], ["y"], name="pool")]
    graph = helper.make_graph(nodes, "shift", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 1, 1])],
                              [numpy_helper.from_array(w, n) for n, w in (("w0", w0), ("b0", b0), ("w1", w1))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.fixture
def shift_model(tmp_path) -> tuple[Path, Path, list[dict]]:
    """MBLT, a folder of 24 calibration samples and 8 held-out samples (other draws)."""
    rng = np.random.default_rng(SEED)
    source = tmp_path / "shift.onnx"
    onnx.save(_shift_model(rng), str(source))
    mblt = mblt_compile(source, tmp_path / "shift.mblt", backend="onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(24):
        np.save(calib / f"{index:02d}.npy", rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    held_out = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(8)]
    return mblt, calib, held_out


def _output_sqnr(mblt: Path, model, samples: list[dict]) -> float:
    from compiler_core.analysis.compare import analyze

    report = analyze(mblt, model, samples, num_samples=len(samples), per_layer=False)
    return next(iter(report["outputs"].values()))["sqnr_db"]


def _quantized(mblt, calib, empirical: bool, **correction):
    return quantize(mblt, calib, target_device="aries-rb", analysis=False, analysis_holdout=0,
                    cross_layer_equalization_config={"apply": False},
                    layer_bias_correction_config={"apply": True, "empirical": empirical, **correction}).model


def test_empirical_correction_removes_the_inherited_shift_on_held_out_samples(shift_model):
    mblt, calib, held_out = shift_model
    analytic = _output_sqnr(mblt, _quantized(mblt, calib, False), held_out)
    empirical = _output_sqnr(mblt, _quantized(mblt, calib, True), held_out)
    assert empirical > analytic + 3.0, (analytic, empirical)  # measured: 25.6 -> 31.1 dB


def test_only_linear_biases_change_and_the_program_stays_deterministic(shift_model):
    mblt, calib, _ = shift_model
    plain = _quantized(mblt, calib, False)
    first, second = _quantized(mblt, calib, True), _quantized(mblt, calib, True)
    changed = [op.name for op, ref in zip(first.ops, plain.ops)
               if not all(np.array_equal(op.consts[k], ref.consts[k]) for k in op.consts)]
    assert changed and all(op.kind == "linear" for op in first.ops if op.name in changed)
    for op, ref in zip(first.ops, plain.ops):
        assert set(op.consts) == set(ref.consts)
        for key in op.consts:
            if key != "bias":
                assert np.array_equal(op.consts[key], ref.consts[key]), (op.name, key)
    for op, again in zip(first.ops, second.ops):
        assert all(np.array_equal(op.consts[k], again.consts[k]) for k in op.consts)


def test_empirical_samples_limit_and_report(shift_model):
    mblt, calib, _ = shift_model
    from compiler_core.config import resolve_config
    from compiler_core.progress import as_reporter
    from compiler_core.quantization.run import calibration_statistics
    from compiler_core.session import MbltSession

    config = resolve_config(None, target_device="aries-rb", analysis_holdout=0,
                            cross_layer_equalization_config={"apply": False},
                            layer_bias_correction_config={"apply": True})
    session = MbltSession.open(mblt)
    calibration, _, stats, _ = calibration_statistics(session, config, calib_data_path=calib,
                                                      reporter=as_reporter(None))
    graph, model = quantize_from_statistics(load_mblt(mblt), stats, config)
    info = correct_biases(graph, model, list(calibration)[:4])
    assert info["layers"] == 2 and info["mean_shift_steps"] > 0
    assert correct_biases(graph, model, []) == {"layers": 0, "mean_shift_steps": 0.0}


def test_without_samples_the_empirical_step_is_skipped_with_a_warning(shift_model, caplog):
    mblt, calib, _ = shift_model
    from compiler_core.config import resolve_config
    from compiler_core.progress import as_reporter
    from compiler_core.quantization.run import calibration_statistics
    from compiler_core.session import MbltSession

    config = resolve_config(None, target_device="aries-rb", analysis_holdout=0,
                            layer_bias_correction_config={"apply": True, "empirical": True})
    session = MbltSession.open(mblt)
    _, _, stats, _ = calibration_statistics(session, config, calib_data_path=calib, reporter=as_reporter(None))
    plain = quantize_from_statistics(load_mblt(mblt), stats, config)[1]
    assert "only the analytic correction" in caplog.text
    analytic = quantize(mblt, calib, target_device="aries-rb", analysis=False, analysis_holdout=0,
                        layer_bias_correction_config={"apply": True}).model
    assert all(np.array_equal(a.consts[k], b.consts[k]) for a, b in zip(plain.ops, analytic.ops) for k in a.consts)


def test_mixed_precision_points_include_the_empirical_correction(shift_model, tmp_path, caplog):
    from compiler_core.api import mxq_compile
    from compiler_core.quantization.mixed_precision import target_metric

    mblt, calib, _ = shift_model
    common = {"target_device": "aries-rb", "calib_data_path": calib, "analysis_holdout": 6,
              "cross_layer_equalization_config": {"apply": False}}
    target = {"apply": True, "target": {"kind": "sqnrDb", "value": 99.0}, "maxInt16Fraction": 0.0}
    analytic = mxq_compile(mblt, save_path=tmp_path / "a.mxq", mixed_precision_config=target,
                           layer_bias_correction_config={"apply": True}, **common)
    empirical = mxq_compile(mblt, save_path=tmp_path / "e.mxq", mixed_precision_config=target,
                            layer_bias_correction_config={"apply": True, "empirical": True}, **common)
    assert "only the analytic correction" not in caplog.text
    base_analytic = analytic.mixed_precision["points"][0]["metric"]
    base_empirical = empirical.mixed_precision["points"][0]["metric"]
    assert base_empirical > base_analytic + 3.0, (base_analytic, base_empirical)
    chosen = empirical.mixed_precision["points"][empirical.mixed_precision["chosen"]]  # maybe the zero-point base
    assert target_metric(empirical.quantize.analysis, "sqnrDb") == pytest.approx(chosen["metric"])
