"""Per-channel int8 feature-map scales (``bit.activationScales: channel``).

A mobile-backbone block (Conv -> HardSwish -> depthwise Conv -> HardSwish -> pointwise Conv) with two output
channels of the first convolution 40x wider than the rest: one 8-bit scale per tensor leaves the other
channels a few codes. With per-channel scales (and zero points, method 2) the Conv outputs get them from
their per-channel requantization, the HardSwish outputs from one table per channel, and the reading
convolutions fold them into their weights. Checked: which tensors qualify, that
the golden executor, the fast executor, the tile simulator (channel-sliced depthwise tiles) and the MXQ
runtime agree bit for bit and the QDQ export within a step, and that the narrow channels gain accuracy.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mblt_compile, mxq_compile, quantize
from compiler_core.backend.program import decode, lower
from compiler_core.quantization import executor
from compiler_core.quantization.qdq import export_qdq
from compiler_core.runtime import Accelerator, Model
from compiler_core.runtime.fastpath.plan import executor_for
from compiler_core.runtime.tilesim import run_tiles
from compiler_core.targets import CORE_MODES, get_device

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # after tests/: bench/corpus.py is the bench

CHANNELS = 16
WIDE = (3, 11)
SHAPE = [1, 3, 6, 48]  # 6 rows: the 8-core modes split the first convolution by output channels


def _block() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    first = rng.standard_normal((CHANNELS, 3, 3, 3)).astype(np.float32) * 0.3
    first[list(WIDE)] *= 40.0
    init = [numpy_helper.from_array(first, "w1"),
            numpy_helper.from_array(rng.standard_normal(CHANNELS).astype(np.float32) * 0.1, "b1"),
            numpy_helper.from_array(rng.standard_normal((CHANNELS, 1, 3, 3)).astype(np.float32) * 0.5, "wd"),
            numpy_helper.from_array(rng.standard_normal((4, CHANNELS, 1, 1)).astype(np.float32) * 0.3, "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("HardSwish", ["c"], ["h"], name="act"),
             helper.make_node("Conv", ["h", "wd"], ["d"], pads=[1, 1, 1, 1], group=CHANNELS, name="depthwise"),
             helper.make_node("HardSwish", ["d"], ["e"], name="act2"),
             helper.make_node("Conv", ["e", "w2"], ["y"], name="pointwise")]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(count)]


def _programs(tmp_path, bit_configs: dict | None = None):
    """The block's source, MBLT, calibration folder and one program per entry of ``bit_configs`` (key -> bit config;
    default: per-tensor and per-channel activation scales)."""
    bit_configs = bit_configs or {scales: {"activationScales": scales} for scales in ("tensor", "channel")}
    source = tmp_path / "block.onnx"
    onnx.save(_block(), str(source))
    mblt = mblt_compile(source, tmp_path / "block.mblt", backend="onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    for index, sample in enumerate(_samples(16, 0)):
        np.save(calib / f"{index:02d}.npy", sample["x"])
    programs = {key: quantize(mblt, calib, analysis=False, analysis_holdout=0, calibration_config={"method": 2},
                              bit_config=bit_config).model for key, bit_config in bit_configs.items()}
    return source, mblt, calib, programs


def test_feature_maps_between_convs_and_tables_get_channel_scales(tmp_path):
    source, mblt, _, programs = _programs(tmp_path)
    per_tensor, per_channel = programs["tensor"], programs["channel"]
    conv_out = next(op.outputs[0] for op in per_channel.ops if op.name.startswith("Conv") and op.inputs[0] == "x")
    chosen = {name: record.params for name, record in per_channel.tensors.items() if record.params.axis is not None}
    assert conv_out in chosen and len(chosen) == 4  # both Conv outputs read by HardSwish, both HardSwish outputs
    assert not any(record.params.axis is not None for record in per_tensor.tensors.values())
    conv_params = chosen[conv_out]
    assert np.size(conv_params.scale) == CHANNELS and np.size(conv_params.zero_point) == CHANNELS
    assert np.any(conv_params.zero_point)  # method 2: a zero point per channel, applied by the requantization
    assert set(np.argsort(conv_params.scale)[-2:]) == set(WIDE)
    tables = [op for op in per_channel.ops if op.kind == "lut"]
    assert tables and all(op.consts["table"].shape == (CHANNELS, 256) and op.attrs["axis"] == 1 for op in tables)
    assert per_channel.params("y").axis is None  # the model output keeps one scale


def test_channel_scales_are_exact_across_executors_and_gain_accuracy(tmp_path):
    source, mblt, calib, programs = _programs(tmp_path)
    model = programs["channel"]
    reference = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    qdq = ort.InferenceSession(_proto(export_qdq(mblt, model)), providers=["CPUExecutionProvider"])
    fast = executor_for(model)
    step = float(model.params("y").scale)
    errors = {"tensor": [], "channel": []}
    for sample in _samples(4, 7):
        golden = executor.run(model, sample)["y"]
        np.testing.assert_array_equal(fast.run(sample)["y"], golden)
        assert np.abs(qdq.run(None, sample)[0] - golden).max() <= 1.01 * step
        expected = reference.run(None, sample)[0]
        for scales, program in programs.items():
            errors[scales].append(float(np.mean((executor.run(program, sample)["y"] - expected) ** 2)))
    gain = 10 * np.log10(np.mean(errors["tensor"]) / np.mean(errors["channel"]))
    assert gain > 4.0, (gain, errors)  # 6.4 dB measured
    small = dataclasses.replace(get_device("aries-rb"), sram_bytes_per_core=16 * 1024)
    lowered = lower(model, small, list(CORE_MODES))
    first = lowered.layers[0]
    assert len({(t.c0, t.c1) for t in lowered.modes["global8"].tilings[0].tiles}) > 1  # its tables cut per tile
    assert [model.ops[index].kind for index in first.ops] == ["linear", "lut"]
    program = decode(lowered)
    feeds = _samples(1, 9)[0]
    codes, golden = executor.quantize_inputs(model, feeds), executor.run_codes(model, feeds)
    for mode in CORE_MODES:
        outputs = run_tiles(model, program, small, mode, codes)
        assert all(np.array_equal(outputs[name], value) for name, value in golden.items()), mode
    compiled = mxq_compile(mblt, save_path=tmp_path / "block.mxq", calib_data_path=calib, analysis_holdout=0,
                           target_device="aries-rb",
                           calibration_config={"method": 2}, bit_config={"activationScales": "channel"})
    runtime = Model(compiled.mxq_path, input_layout="NCHW")
    runtime.launch(Accelerator("aries-rb"))
    np.testing.assert_array_equal(np.asarray(runtime.infer(feeds)[0]), executor.run(model, feeds)["y"])


def _proto(model) -> bytes:
    import onnx_ir as ir

    return ir.to_proto(model).SerializeToString()


@pytest.mark.slow
def test_ppocr_det_int8_keeps_more_with_channel_scales(tmp_path, monkeypatch):
    """PP-OCR det at 320x320 on the splits of ``bench/quant_accuracy.py --amp`` (calibration: 16 corpus pages and
    scans and 8 photos with text; judged on the 8 search samples), int8 with zero points: per-channel feature-map
    scales against one scale per tensor."""
    import corpus
    import quant_accuracy

    from compiler_core.calibration.cache import CACHE_DIR_ENV

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    entry = corpus.corpus_by_name()["ppocr_det"]
    mblt = mblt_compile(entry.source(), tmp_path / "det.mblt", input_shape_dict={"x": [1, 3, 320, 320]})
    splits, _ = quant_accuracy.amp_splits("ppocr_det", corpus._mblt_inputs(mblt), 4)
    manifest = corpus.write_manifest(tmp_path / "calib", splits["calibration"])
    reference = ort.InferenceSession(str(mblt), providers=["CPUExecutionProvider"])
    cosines = {}
    for scales in ("tensor", "channel"):
        model = quantize(mblt, manifest, analysis=False, analysis_holdout=0,
                         calibration_config={"method": 2, "numSamples": len(splits["calibration"])},
                         bit_config={"activationScales": scales}).model
        fast = executor_for(model)
        values = []
        for sample in splits["search"]:
            expected = reference.run(None, sample)[0].reshape(-1).astype(np.float64)
            actual = next(iter(fast.run(sample).values())).reshape(-1).astype(np.float64)
            values.append(float(expected @ actual / (np.linalg.norm(expected) * np.linalg.norm(actual))))
        cosines[scales] = values
    print(cosines)
    assert np.mean(cosines["channel"]) >= np.mean(cosines["tensor"]) + 0.01, cosines


def test_cross_validated_channel_ranges_keep_ppocr_rec_held_out_lines(tmp_path, monkeypatch):
    """PP-OCR rec (the corpus's 16 calibration text lines, judged on its 4 held-out lines), int8 with zero points and
    per-channel feature-map scales: the last blocks' per-channel ranges, which single calibration lines set, clip
    every held-out line (Add_26: 115x its rounding noise, ``bench/loo_ranges.py``). ``bit.channelRanges:
    crossValidated`` widens them by what leaving each calibration line out predicts: 0.962 -> 0.983 held out."""
    import corpus

    from compiler_core.calibration.cache import CACHE_DIR_ENV

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    entry = corpus.corpus_by_name()["ppocr_rec"]
    mblt = mblt_compile(entry.source(), tmp_path / "rec.mblt", input_shape_dict=entry.input_shape_dict)
    specs = corpus._mblt_inputs(mblt)
    calibration = [entry.feed(specs, "calib", index) for index in range(corpus.N_CALIB)]
    held_out = [entry.feed(specs, "eval", index) for index in range(corpus.N_EVAL)]
    manifest = corpus.write_manifest(tmp_path / "calib", calibration)
    reference = ort.InferenceSession(str(mblt), providers=["CPUExecutionProvider"])
    cosines = {}
    for rule in ("max", "crossValidated"):
        model = quantize(mblt, manifest, analysis=False, analysis_holdout=0,
                         calibration_config={"method": 2, "numSamples": len(calibration)},
                         bit_config={"activationScales": "channel", "channelRanges": rule}).model
        fast = executor_for(model)
        values = []
        for sample in held_out:
            expected = reference.run(None, sample)[0].reshape(-1).astype(np.float64)
            actual = next(iter(fast.run(sample).values())).reshape(-1).astype(np.float64)
            values.append(float(expected @ actual / (np.linalg.norm(expected) * np.linalg.norm(actual))))
        cosines[rule] = values
    assert np.mean(cosines["crossValidated"]) >= np.mean(cosines["max"]) + 0.015, cosines
    assert min(cosines["crossValidated"]) >= 0.975, cosines
