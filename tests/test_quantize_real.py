"""Quantization of real trained models on real data: accuracy, exactness against QDQ, a peer, the cache.

- Fashion-MNIST CNN (the bundled sample, trained on the real train split): int8 accuracy on all
  10,000 test images within 0.1 point of FP32.
- Exactness: the golden executor and the exported QDQ model in onnxruntime agree within one step on
  at least 99.9 % of output elements (Fashion CNN and MobileNetV2).
- MobileNetV2 calibrated on real photos keeps the FP32 top-1 class at least as often as
  onnxruntime's ``quantize_static`` (QDQ, per-channel, MinMax) on the same data, logit cosine >= 0.99.
- MobileNetV2 with ``a16w8`` and layer bias correction keeps the FP32 top-1 class on >= 95 % of 60 views
  of 30 held-out scenes (:func:`realdata.imagenet_held_out_views`), logit cosine >= 0.995.
- all-MiniLM-L6-v2 (S=128): sentence-embedding cosine to FP32 >= 0.99 on held-out sentences, with the
  a16w8 preset and with the a8w8 one (``transformer_encoder_int8``: int16 only for Softmax/LayerNorm/GELU,
  SmoothQuant, per-feature residual-branch scales).
- Switching the calibration mode reuses the cached statistics.

Each model is parsed and quantized once per module; golden-executor runs are spread over two worker
processes. ``QBCOMPILER_CACHE_DIR`` points at a temporary folder for the whole module.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import realdata
import realmodels
from realdata import cosine, golden_codes, run_float
from realmodels import MINILM_INPUT_NAMES, REPO_ROOT, RealModelUnavailable

from compiler_core.api import mblt_compile, quantize
from compiler_core.calibration.cache import CACHE_DIR_ENV
from compiler_core.quantization.qdq import cross_check, save_qdq

pytestmark = pytest.mark.slow

FASHION_DIR = REPO_ROOT / "resources" / "samples" / "fashion_cnn"
WORKERS = 2
MIN_WITHIN_ONE_STEP = 0.999
MINILM_EVAL_SENTENCES = 32
# all-MiniLM-L6-v2 (S=128): the transformer_encoder preset (a16w8: int16 activations, int8 weights, Max
# calibration). Measured alternatives: int16 only for Softmax/LayerNorm/GELU with MaxPercentile 0.925;
# plus Max calibration and int16 FFN down-projections 0.997; all int16 with Max 0.9996.
MINILM_CONFIG = {"config_preset": "transformer_encoder"}
# The lighter preset: a8w8 with int16 only for Softmax/LayerNorm/GELU (int8 inputs into 30 of the 36 weight MatMuls),
# SmoothQuant through LayerNorm copies, per-feature int8 scales on the 12 residual-branch outputs: 0.9955 (with
# one scale per residual-branch output 0.860; see docs/accuracy.md and bench/smoothquant.py).
MINILM_INT8_CONFIG = {"config_preset": "transformer_encoder_int8"}


def _available(builder, *args):
    try:
        return builder(*args)
    except RealModelUnavailable as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module", autouse=True)
def statistics_cache(tmp_path_factory):
    """Every quantize() of this module caches statistics in a fresh folder, not the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("statistics-cache")
        patch.setenv(CACHE_DIR_ENV, str(folder))
        yield folder


# -- running models ---------------------------------------------------------------------------------


def _qdq_codes(mblt: Path, model, feeds: dict[str, np.ndarray], output: str, folder: Path) -> np.ndarray:
    """Output codes of the QDQ model in onnxruntime: ``round(y / scale) + zero_point``."""
    path = save_qdq(mblt, model, folder / f"{mblt.stem}.qdq.onnx")
    params = model.params(output)
    values = run_float(path, feeds, output).astype(np.float64)
    return np.rint(values / np.float32(params.scale)).astype(np.int64) + int(params.zero_point)


def _within_one_step(golden: np.ndarray, other: np.ndarray) -> tuple[float, int]:
    difference = np.abs(golden.astype(np.int64) - other.astype(np.int64))
    return float(np.mean(difference <= 1)), int(difference.max())


def _dequantized(model, name: str, codes: np.ndarray) -> np.ndarray:
    return model.params(name).dequantize(codes).astype(np.float32)


# -- Fashion-MNIST ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fashion(tmp_path_factory):
    images, labels = _available(realdata.fashion_mnist_test)
    folder = tmp_path_factory.mktemp("fashion")
    mblt = mblt_compile(FASHION_DIR / "model.onnx", folder / "fashion_cnn.mblt")
    result = quantize(mblt, FASHION_DIR / "calib", config_preset="classification",
                      preprocessing_config=realdata.FASHION_PREPROCESSING, analysis_holdout=0, analysis=False)
    feeds = {"image": realdata.fashion_tensors(images)}
    started = time.perf_counter()
    codes = golden_codes(result.model, feeds, chunk=250, batched=True, workers=WORKERS)
    seconds = time.perf_counter() - started
    print(f"\nFashion-MNIST golden executor: {len(labels)} images in {seconds:.1f} s "
          f"({WORKERS} processes, batched chunks of 250)")
    return SimpleNamespace(mblt=mblt, model=result.model, feeds=feeds, labels=labels, codes=codes, folder=folder,
                           calibration_samples=result.samples["calibration"])


@pytest.fixture(scope="module")
def fashion_per_sample(fashion):
    """``executor.run_codes`` sample by sample on the first 200 test images."""
    feeds = {name: value[:200] for name, value in fashion.feeds.items()}
    return feeds, golden_codes(fashion.model, feeds, chunk=100, workers=WORKERS)


def test_fashion_batched_golden_runs_equal_run_codes(fashion, fashion_per_sample):
    _, per_sample = fashion_per_sample
    assert np.array_equal(per_sample, fashion.codes[:200])


def test_fashion_int8_accuracy_within_a_tenth_of_a_point_of_fp32(fashion, fashion_per_sample):
    assert np.array_equal(fashion_per_sample[1], fashion.codes[:200]), "batched golden runs drifted from run_codes"
    fp32 = run_float(fashion.mblt, fashion.feeds, "logits")
    fp32_accuracy = 100 * np.mean(fp32.argmax(1) == fashion.labels)
    int8_accuracy = 100 * np.mean(fashion.codes.argmax(1) == fashion.labels)
    agreement = 100 * np.mean(fashion.codes.argmax(1) == fp32.argmax(1))
    print(f"\nFashion-MNIST test set ({len(fashion.labels)} images, {fashion.calibration_samples} calibration "
          f"images): FP32 {fp32_accuracy:.2f} %  int8 {int8_accuracy:.2f} %  "
          f"(delta {int8_accuracy - fp32_accuracy:+.2f}; same class as FP32 on {agreement:.2f} %)")
    assert fp32_accuracy > 90.0  # the README's 91.42 %: the data and the model are the real ones
    assert int8_accuracy >= fp32_accuracy - 0.1  # issue 12; measured 91.35 % vs 91.42 % (-0.07)


def test_fashion_golden_matches_qdq_within_one_step(fashion, fashion_per_sample):
    feeds, golden = fashion_per_sample
    qdq = _qdq_codes(fashion.mblt, fashion.model, feeds, "logits", fashion.folder)
    fraction, worst = _within_one_step(golden, qdq)
    print(f"\nFashion CNN golden vs QDQ (onnxruntime), {len(golden)} images: {100 * fraction:.3f} % within one "
          f"step, {100 * np.mean(golden == qdq):.2f} % equal, max difference {worst}")
    assert fraction >= MIN_WITHIN_ONE_STEP


# -- MobileNetV2 on photos, against onnxruntime quantize_static -------------------------------------


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory):
    source = _available(realmodels.mobilenet_v2_onnx)
    calib, evaluation = _available(realdata.imagenet_photo_sets, 64, 160)
    folder = tmp_path_factory.mktemp("mobilenet")
    mblt = mblt_compile(source, folder / "mobilenet_v2.mblt", input_shape_dict={"input": realmodels.MOBILENET_SHAPE})
    result = quantize(mblt, calib, config_preset="classification",
                      preprocessing_config=realdata.IMAGENET_PREPROCESSING, analysis_holdout=0, analysis=False)
    feeds = {"input": realdata.imagenet_tensors(evaluation)}
    codes = golden_codes(result.model, feeds, chunk=-(-len(feeds["input"]) // WORKERS), workers=WORKERS)
    return SimpleNamespace(source=source, mblt=mblt, calib=calib, model=result.model, feeds=feeds, codes=codes,
                           folder=folder, calibration_samples=result.samples["calibration"])


def test_mobilenet_golden_matches_qdq_within_one_step(mobilenet):
    """Layer by layer (each layer fed the golden codes of its inputs) every tensor agrees within one step.

    End to end they drift apart: onnxruntime's float32 sums flip a rounding now and then, and a
    one-step change in an early layer grows through the depthwise convolutions. That number is
    printed, not asserted; the layer-wise check is the one that validates the integer kernels.
    """
    samples = [{"input": image[None]} for image in mobilenet.feeds["input"][:6]]
    layerwise = cross_check(mobilenet.mblt, mobilenet.model, samples, layerwise=True)
    qdq = _qdq_codes(mobilenet.mblt, mobilenet.model, mobilenet.feeds, "logits", mobilenet.folder)
    fraction, worst = _within_one_step(mobilenet.codes, qdq)
    print(f"\nMobileNetV2 golden vs QDQ (onnxruntime): layer-wise {100 * layerwise['all_tensors']['within_one']:.4f} % "
          f"of {layerwise['all_tensors']['elements']} elements within one step "
          f"({100 * layerwise['outputs']['within_one']:.3f} % of logits); end to end on {len(qdq)} photos "
          f"{100 * fraction:.2f} % within one step, max difference {worst}")
    assert layerwise["all_tensors"]["within_one"] >= MIN_WITHIN_ONE_STEP
    assert layerwise["outputs"]["within_one"] >= MIN_WITHIN_ONE_STEP


def test_mobilenet_classification_preset_beats_onnxruntime_quantize_static(mobilenet):
    peer = realdata.ort_quantize_static(mobilenet.source, mobilenet.calib, mobilenet.folder / "ort_qdq.onnx")
    fp32 = run_float(mobilenet.source, mobilenet.feeds, "logits")
    theirs = run_float(peer, mobilenet.feeds, "logits")
    ours = _dequantized(mobilenet.model, "logits", mobilenet.codes)
    count = len(fp32)
    rows = {name: (int(np.sum(logits.argmax(1) == fp32.argmax(1))), float(cosine(fp32, logits).mean()))
            for name, logits in (("ours (classification)", ours), ("onnxruntime quantize_static", theirs))}
    print(f"\nMobileNetV2, {mobilenet.calibration_samples} calibration photos, {count} held-out photos")
    for name, (kept, mean_cosine) in rows.items():
        print(f"  {name:30s} top-1 kept {kept:3d}/{count}  mean logit cosine {mean_cosine:.4f}")
    (ours_kept, ours_cosine), (peer_kept, _) = rows.values()
    assert ours_kept >= peer_kept
    assert ours_cosine >= 0.99


MOBILENET_HELD_OUT_VIEWS = 60
"""The fast subset: views 0-1 (whole and mirrored) of each of the 30 held-out scenes (59 of 60 kept, cosine
0.9993; with the analytic correction alone 120 views kept 115); ``bench/quant_accuracy.py --held-out 300``
prints the full table."""


def test_mobilenet_a16w8_keeps_top1_on_30_held_out_scenes(tmp_path):
    """Issue 12: top-1 agreement >= 95 % and logit cosine >= 0.995 on views of >= 20 distinct held-out photos.

    ``a16w8`` (int16 activations with 2x range headroom, int8 weights) plus the analytic and the empirical
    layer bias correction, calibrated on the 64 calibration views (14 other scenes).
    """
    source = _available(realmodels.mobilenet_v2_onnx)
    calib, _ = _available(realdata.imagenet_photo_sets, 64, 40)
    views = _available(realdata.imagenet_held_out_views, 300)
    mblt = mblt_compile(source, tmp_path / "mobilenet_v2.mblt", input_shape_dict={"input": realmodels.MOBILENET_SHAPE})
    result = quantize(mblt, calib, config_preset="a16w8",
                      layer_bias_correction_config={"apply": True, "empirical": True},
                      preprocessing_config=realdata.IMAGENET_PREPROCESSING, analysis_holdout=0, analysis=False)
    feeds = {"input": realdata.imagenet_tensors(views)[:MOBILENET_HELD_OUT_VIEWS]}
    scenes = {path.stem.split("_", 1)[1].rsplit("_s", 1)[0] for path in realdata.image_files(views)[:len(feeds["input"])]}
    codes = golden_codes(result.model, feeds, chunk=-(-len(feeds["input"]) // WORKERS), workers=WORKERS)
    fp32 = run_float(source, feeds, "logits")
    ours = _dequantized(result.model, "logits", codes)
    kept = int(np.sum(ours.argmax(1) == fp32.argmax(1)))
    mean_cosine = float(cosine(fp32, ours).mean())
    print(f"\nMobileNetV2 a16w8 + empirical layer bias correction, {len(fp32)} views of {len(scenes)} held-out scenes: "
          f"top-1 kept {kept}/{len(fp32)}, mean logit cosine {mean_cosine:.4f}")
    assert len(scenes) >= 20
    assert kept >= 0.95 * len(fp32)
    assert mean_cosine >= 0.995


# -- all-MiniLM-L6-v2 ----------------------------------------------------------------------------------


def _mean_pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(np.float64)
    return (hidden * weights).sum(1) / weights.sum(1)


@pytest.fixture(scope="module")
def minilm_mblt(tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2 (S=128) parsed once for the module."""
    source = _available(realmodels.minilm_onnx, 128)
    return mblt_compile(source, tmp_path_factory.mktemp("minilm") / "minilm.mblt",
                        input_shape_dict={name: [1, 128] for name in MINILM_INPUT_NAMES})


@pytest.mark.parametrize("config", [MINILM_CONFIG, MINILM_INT8_CONFIG], ids=["a16w8", "int8_smoothquant"])
def test_minilm_sentence_embeddings_keep_cosine(minilm_mblt, config):
    manifest = _available(realdata.minilm_calibration_manifest, 64)
    mblt = minilm_mblt
    result = quantize(mblt, manifest, analysis_holdout=0, analysis=False, **config)
    feeds = realmodels.tokenize(realdata.english_sentences(MINILM_EVAL_SENTENCES, "eval"))
    fp32 = _mean_pooled(run_float(mblt, feeds, "last_hidden_state"), feeds["attention_mask"])
    codes = golden_codes(result.model, feeds, chunk=MINILM_EVAL_SENTENCES // WORKERS, workers=WORKERS)
    quantized = _mean_pooled(_dequantized(result.model, "last_hidden_state", codes), feeds["attention_mask"])
    similarity = cosine(fp32, quantized)
    summary = result.model.summary()
    int8_inputs = [op for op in result.model.ops if op.kind == "linear" and result.model.params(op.inputs[0]).bits == 8]
    if config is MINILM_INT8_CONFIG:  # Q/K/V, FFN-up and attention-output projections of the 6 layers
        assert len(int8_inputs) == 30
        linear_outputs = [result.model.params(op.outputs[0]) for op in result.model.ops if op.kind == "linear"]
        assert sum(params.bits == 8 and params.axis is not None for params in linear_outputs) == 12
        wide = {op.op_type for op in result.model.ops for name in op.outputs
                if name in result.model.tensors and result.model.params(name).bits == 16}
        assert wide == {"LayerNormalization", "Softmax", "Gelu", "Add", "Mul"}  # Add, Mul: LayerNorm/Softmax inputs
    print(f"\nall-MiniLM-L6-v2 {config}: {len(int8_inputs)} MatMuls with int8 inputs; "
          f"{summary['int16_tensors']} of {summary['tensors']} tensors int16; "
          f"sentence-embedding cosine on {len(similarity)} held-out sentences: mean {similarity.mean():.4f}, "
          f"min {similarity.min():.4f}")
    assert similarity.mean() >= 0.99


# -- statistics cache --------------------------------------------------------------------------------


def test_switching_calibration_mode_reuses_cached_statistics(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    mblt = mblt_compile(FASHION_DIR / "model.onnx", tmp_path / "fashion_cnn.mblt")

    def run(mode: int):
        return quantize(mblt, FASHION_DIR / "calib", preprocessing_config=realdata.FASHION_PREPROCESSING,
                        calibration_config={"mode": mode}, analysis=False)

    first, switched, again = run(1), run(2), run(3)
    assert not first.statistics_from_cache
    assert switched.statistics_from_cache and again.statistics_from_cache
    scales = [float(result.model.params("logits").scale) for result in (first, switched, again)]
    assert len(set(scales)) > 1, f"modes 1-3 gave the same output scale {scales}: the mode was not applied"
    assert list((tmp_path / "cache" / "statistics").glob("*.npz"))
