"""Quantization benchmark: MobileNetV2 on real photos, ours beside onnxruntime ``quantize_static``, same run.

Data (``tests/realdata.py``): ``--samples`` calibration photos and ``--eval`` held-out photos from
disjoint source scenes (skimage, scikit-learn and matplotlib photos and crops of them; a larger
``--samples`` takes more crops per source: 42 views of 14 calibration sources, at most 588). Both
tools calibrate on exactly the same tensors: onnxruntime's ``CalibrationDataReader`` decodes and
preprocesses the same JPEGs with the compiler's own reader (resize short side 256 bilinear, centre
crop 224, ImageNet normalize, CHW), inside the timed region, as ``quantize()`` does.

Tools:

- **ours**: ``quantize(mblt, calib, config_preset="classification")`` with every sample used for
  calibration (``analysisHoldout 0``, ``numSamples = --samples``), in a fresh statistics cache; then
  calibration modes 0 (Max), 2 (Histogram) and 3 (MSE) and :data:`EXTRA_CONFIGS` (preset ``a16w8`` with
  layer bias correction) on the cached statistics. Outputs come from
  the golden executor (``executor.run_codes`` per photo, two worker processes); ``--executor qdq``
  runs the exported QDQ model in onnxruntime instead (within one step of the golden executor).
- **onnxruntime**: ``quant_pre_process`` (shape inference and graph optimization, the documented step
  before quantization; it folds BatchNorm) then ``quantize_static`` (QDQ, per-channel, MinMax, int8
  activations and weights).

Metrics on the held-out photos, against FP32 (the source ONNX in onnxruntime): top-1 agreement (same
arg-max), top-5 agreement (the FP32 top-1 class among the quantized top 5), mean logit cosine.
Timings are wall clock of calibration + quantization (ours: the whole ``quantize()`` call, data
reading included; onnxruntime: ``quantize_static``, and separately ``quant_pre_process``), median of
``--runs``; parsing to MBLT is reported apart. Ratios are ours / onnxruntime (below 1 is better for
us); a cached mode switch is shown as a percentage of our first run.

``--held-out N`` judges on N views of the 30 held-out scenes of :func:`realdata.imagenet_held_out_views`
(the 5 above and 25 photographs from Debian's wallpaper packages) instead of ``--eval`` views of 5.

Usage: ``python bench/quant_accuracy.py [--samples 256] [--eval 40 | --held-out 300] [--runs 1]
[--executor golden|qdq] [--json out.json]``.

**Automatic mixed precision on corpus models** (``--amp ppocr_det,hand_landmark,...``): per model, three splits
(:func:`amp_splits`): calibration (the corpus entry's ``N_CALIB`` real samples, ``tests/corpus.py``), search
(``--amp-holdout`` more calibration-split samples on which the search checks its target; the manifest puts them
exactly where the compiler's ``analysisHoldout`` takes its held-out samples, so every tool calibrates on the same
samples) and held out (the corpus's own held-out samples: other scenes / pages / the scikit-image text photo),
which judge every row. Text detectors (:data:`EXTRA_DATA`) get photos with text in every split
(``tests/text_photos.py``, :data:`TEXT_PHOTOS`; each split from its own photographs). The rows:

- ours int8: the default config (``crossLayerEqualization`` and output headroom on), no preset;
- ours int8, zero points: the same with calibration method 2 (asymmetric activation ranges);
- ours int8, zero points, channel scales: the same with ``bit.activationScales: channel`` (per-channel 8-bit scales
  on the feature maps between convolutions and look-up tables); then with GPTQ conv weights
  (``bit.weightRounding: gptq``) and with the convolutions refitted to their quantized inputs (``sequential``);
- for image models of :data:`EXTRA_DATA`: the channel-scale rows with a raw uint8 pixel input (``uint8Input``, the
  feed's normalization folded into the input's per-channel parameters);
- ours a16w8 (int16 activations), with and without GPTQ;
- ours AMP: the default config with ``mixedPrecision`` (target ``--amp-target``, default cosine 0.99, on the mean
  or ``--amp-statistic worst`` sample, ``maxInt16Fraction`` 0.25, latency budget +15 %; ``--amp-config`` adds config
  arguments): int16 layers, their share, estimated latency change on aries-rb, points tried, search time;
- onnxruntime ``quantize_static`` (QDQ, int8) with MinMax (per-channel and per-tensor weights), Percentile and
  Entropy (per tensor) calibration on the same calibration samples (single-input float models only).

Every row shows the mean, the minimum and the per-sample cosines; the report records the samples and distinct
sources of each split and the load average at the start and the end (``--skip-onnxruntime`` leaves the peer out).

**Configs on corpus models** (``--configs ppocr_det``): :data:`CORPUS_CONFIGS` (int8, int16 activations,
each with and without the empirical bias correction, and ``a16w16``) on the corpus entry's calibration data,
judged on its held-out samples, with the int16 layer count and estimated latency of each.

Cosine: per held-out sample, of each output to FP32 (onnxruntime on the MBLT); the table shows the
worst output's mean over samples.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

import realdata  # noqa: E402
import realmodels  # noqa: E402

CACHED_MODES = {0: "Max", 2: "Histogram", 3: "MSE"}
EXTRA_CONFIGS = {"a16w8 + layer bias correction": {"config_preset": "a16w8",
                                                   "layer_bias_correction_config": {"apply": True}},
                 "a16w8 + empirical bias correction": {"config_preset": "a16w8", "layer_bias_correction_config": {
                     "apply": True, "empirical": True}}}
"""More configs of ours, on the cached statistics: int16 activations (with the preset's 2x range headroom) and
the analytic bias correction the ``classification`` preset also applies; then also the empirical one
(``layerBiasCorrection.empirical``, on the first 16 calibration views)."""


def metrics(fp32: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    """Top-1 / top-5 agreement with FP32, mean logit cosine, and the FP32 top-1/top-2 probability margin of
    every view whose top-1 changed (small margins: near ties that any noise flips)."""
    reference = fp32.argmax(1)
    top5 = np.argsort(-logits, axis=1)[:, :5]
    probabilities = np.exp(fp32 - fp32.max(1, keepdims=True))
    probabilities /= probabilities.sum(1, keepdims=True)
    ordered = np.sort(probabilities, axis=1)
    margins = ordered[:, -1] - ordered[:, -2]
    lost = logits.argmax(1) != reference
    return {"top1": float(np.mean(~lost)), "top5": float(np.mean([ref in row for ref, row in zip(reference, top5)])),
            "cosine": float(realdata.cosine(fp32, logits).mean()), "count": len(fp32),
            "lost_margins": sorted(round(float(m), 4) for m in margins[lost]),
            "top1_margin_0.05": float(np.mean(~lost[margins >= 0.05])) if np.any(margins >= 0.05) else None}


def timed(function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


# -- ours ---------------------------------------------------------------------------------------------


def quantize_ours(mblt: Path, calib: Path, samples: int, mode: int | None = None, config_preset: str = "classification",
                  **config_args):
    from compiler_core.api import quantize

    calibration = {"numSamples": samples, **({"mode": mode} if mode is not None else {})}
    return quantize(mblt, calib, config_preset=config_preset, preprocessing_config=realdata.IMAGENET_PREPROCESSING,
                    calibration_config=calibration, analysis_holdout=0, analysis=False, **config_args)


def our_logits(mblt: Path, model, feeds: dict[str, np.ndarray], executor: str, folder: Path) -> np.ndarray:
    params = model.params("logits")
    if executor == "qdq":
        from compiler_core.quantization.qdq import save_qdq

        path = save_qdq(mblt, model, folder / f"qdq_{id(model)}.onnx")
        return realdata.run_float(path, feeds, "logits")
    codes = realdata.golden_codes(model, feeds, chunk=-(-len(feeds["input"]) // 2))
    return params.dequantize(codes).astype(np.float32)


def run_ours(mblt: Path, calib: Path, args, feeds, fp32, folder: Path) -> dict:
    first_times, result = [], None
    for run in range(args.runs):  # a fresh cache per run: every first run computes statistics
        os.environ["QBCOMPILER_CACHE_DIR"] = str(folder / f"cache{run}")
        result, seconds = timed(quantize_ours, mblt, calib, args.samples)
        assert not result.statistics_from_cache
        first_times.append(seconds)
    rows = {"classification": {"seconds": statistics.median(first_times), "stages": result.timings,
                               **metrics(fp32, our_logits(mblt, result.model, feeds, args.executor, folder))}}
    for mode, name in CACHED_MODES.items():
        switched, seconds = timed(quantize_ours, mblt, calib, args.samples, mode)
        rows[f"mode {mode} ({name}), cached"] = {
            "seconds": seconds, "from_cache": switched.statistics_from_cache, "stages": switched.timings,
            **metrics(fp32, our_logits(mblt, switched.model, feeds, args.executor, folder))}
    for name, config in EXTRA_CONFIGS.items():
        other, seconds = timed(quantize_ours, mblt, calib, args.samples, **config)
        rows[f"{name}, cached"] = {
            "seconds": seconds, "from_cache": other.statistics_from_cache, "stages": other.timings,
            **metrics(fp32, our_logits(mblt, other.model, feeds, args.executor, folder))}
    return rows


# -- onnxruntime --------------------------------------------------------------------------------------


def run_onnxruntime(source: Path, calib: Path, args, feeds, fp32, folder: Path) -> dict:
    pre_times, quant_times = [], []
    for run in range(args.runs):
        preprocessed, seconds = timed(realdata.ort_preprocess, source, folder / f"ort_pre{run}.onnx")
        pre_times.append(seconds)
        output, seconds = timed(realdata.ort_quantize_static, source, calib, folder / f"ort_qdq{run}.onnx",
                                preprocessed=preprocessed)
        quant_times.append(seconds)
    logits = realdata.run_float(output, feeds, "logits")
    return {"quantize_static": {"seconds": statistics.median(quant_times),
                                "pre_process_seconds": statistics.median(pre_times), **metrics(fp32, logits)}}


# -- report -------------------------------------------------------------------------------------------


def print_table(report: dict) -> None:
    ours, peer = report["ours"], report["onnxruntime"]["quantize_static"]
    first = ours["classification"]["seconds"]
    print(f"\nMobileNetV2: {report['samples']} calibration photos, {report['eval']} held-out photos "
          f"(disjoint scenes); outputs of ours by the {report['executor']} executor")
    print(f"{'tool / config':38s} {'top-1':>8s} {'top-5':>8s} {'cosine':>8s} {'seconds':>9s} {'vs first':>9s}")
    for name, row in ours.items():
        share = f"{100 * row['seconds'] / first:8.1f}%" if name != "classification" else ""
        print(f"{'ours ' + name:38s} {row['top1']:8.3f} {row['top5']:8.3f} {row['cosine']:8.4f} "
              f"{row['seconds']:9.2f} {share:>9s}")
    print(f"{'onnxruntime quantize_static':38s} {peer['top1']:8.3f} {peer['top5']:8.3f} {peer['cosine']:8.4f} "
          f"{peer['seconds']:9.2f}   (+{peer['pre_process_seconds']:.2f} s quant_pre_process)")
    ratios = report["ratios"]
    print(f"\ntime ours / quantize_static: {ratios['time_vs_quantize_static']:.2f}; "
          f"ours / (pre_process + quantize_static): {ratios['time_vs_pre_process_and_quantize_static']:.2f}")
    print(f"slowest cached mode switch: {100 * ratios['slowest_cached_switch_vs_first']:.1f} % of the first run")
    print(f"top-1 kept, ours - onnxruntime: {ratios['top1_difference']:+.3f}; "
          f"cosine, ours - onnxruntime: {ratios['cosine_difference']:+.4f}")


def ratios(ours: dict, peer: dict) -> dict[str, float]:
    first = ours["classification"]
    switches = [row["seconds"] for name, row in ours.items() if name != "classification"]
    return {"time_vs_quantize_static": first["seconds"] / peer["seconds"],
            "time_vs_pre_process_and_quantize_static": first["seconds"] / (peer["seconds"] + peer["pre_process_seconds"]),
            "slowest_cached_switch_vs_first": max(switches) / first["seconds"],
            "top1_difference": first["top1"] - peer["top1"], "cosine_difference": first["cosine"] - peer["cosine"]}


# -- automatic mixed precision on corpus models -----------------------------------------------------------


def worst_cosine(reference: list[list[np.ndarray]], test: list[list[np.ndarray]]) -> float:
    """Worst output's mean (over samples) cosine."""
    values = []
    for position in range(len(reference[0])):
        cosines = [float(realdata.cosine(np.asarray(r[position], np.float64).reshape(1, -1),
                                         np.asarray(t[position], np.float64).reshape(1, -1))[0])
                   for r, t in zip(reference, test)]
        values.append(float(np.mean(cosines)))
    return min(values)


def mxq_outputs(mxq: Path, samples: list[dict]) -> list[list[np.ndarray]]:
    from compiler_core.runtime import Accelerator, Model

    model = Model(mxq, input_layout="NCHW")
    model.launch(Accelerator("aries-rb"))
    return [[np.asarray(v) for v in model.infer(sample)] for sample in samples]


def ort_outputs(path: Path | bytes, samples: list[dict]) -> list[list[np.ndarray]]:
    session = realdata.ort_session(path)
    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}
    return [[np.asarray(v) for v in session.run(names, {k: v for k, v in s.items() if k in inputs})]
            for s in samples]


class ArrayReader:
    """onnxruntime ``CalibrationDataReader`` over in-memory samples."""

    def __init__(self, samples: list[dict]) -> None:
        self.samples = iter(samples)

    def get_next(self):
        return next(self.samples, None)


def ort_static(source: Path, samples: list[dict], output: Path, method: str, per_channel: bool = True) -> Path:
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    ort.set_default_logger_severity(3)
    pre = realdata.ort_preprocess(source, output.with_suffix(".pre.onnx"))
    with _histograms_in_chunks():
        quantize_static(str(pre), str(output), ArrayReader(samples), quant_format=QuantFormat.QDQ,
                        per_channel=per_channel, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, method))
    return output


HISTOGRAM_CHUNK = 2
"""Samples per ``collect_data`` call of onnxruntime's histogram calibrators (Percentile, Entropy)."""


@contextlib.contextmanager
def _histograms_in_chunks():
    """onnxruntime's histogram calibrators keep every sample's intermediate tensors until the histograms are built
    (PP-OCR det, 16 pages: 15.6 GB, and the out-of-memory killer); fed :data:`HISTOGRAM_CHUNK` samples per
    ``collect_data`` call, their own collector merges the histograms and memory stays bounded."""
    from onnxruntime.quantization.calibrate import HistogramCalibrater

    original = HistogramCalibrater.collect_data

    def collect_in_chunks(self, data_reader):
        while True:
            chunk = [s for s in (data_reader.get_next() for _ in range(HISTOGRAM_CHUNK)) if s]
            if not chunk:
                return
            original(self, ArrayReader(chunk))
            self.clear_collected_data()

    HistogramCalibrater.collect_data = collect_in_chunks
    try:
        yield
    finally:
        HistogramCalibrater.collect_data = original


ORT_ROWS = (("MinMax", True), ("MinMax", False), ("Percentile", False), ("Entropy", False))
"""onnxruntime ``quantize_static`` rows of ``--amp``: (calibration method, per-channel weights). Per-channel QDQ
is tried with MinMax only: on PP-OCR det onnxruntime cannot load its own per-channel output (a per-channel
DequantizeLinear on a BatchNorm-folded bias), so the other methods run per tensor."""


def run_ort_rows(source: Path, calib: list[dict], evaluation: list[dict], reference, folder: Path) -> dict:
    """onnxruntime ``quantize_static`` (:data:`ORT_ROWS`) on the same calibration samples, judged on the same held-out
    samples; a failure is a table cell, not the end of the bench."""
    rows = {}
    for method, per_channel in ORT_ROWS:
        label = f"onnxruntime {method}, per-{'channel' if per_channel else 'tensor'}"
        started = time.perf_counter()
        try:
            path = ort_static(source, calib, folder / f"ort_{method}_{per_channel}.onnx", method, per_channel)
            test = ort_outputs(path, evaluation)
            rows[label] = {"cosine": worst_cosine(reference, test), "per_sample": _per_sample(reference, test),
                           "seconds": time.perf_counter() - started}
        except Exception as error:  # noqa: BLE001  (the peer's own error is the result)
            rows[label] = {"error": f"{type(error).__name__}: {error}"[:200]}
        print(label, json.dumps(rows[label]), flush=True)
    return rows


def _per_sample(reference, test) -> list[float]:
    return [worst_cosine([r], [t]) for r, t in zip(reference, test)]


TEXT_PHOTOS = {"calib": 8, "search": 4, "eval": 6}
"""Photos with text (``tests/text_photos.py``) added to each split of a text detector's data by ``--amp``."""
EXTRA_DATA = {"ppocr_det": "imagenet"}
"""Corpus models whose ``--amp`` splits get :data:`TEXT_PHOTOS` (value: the corpus feed's pixel normalization)."""


UINT8_PIXELS = {"imagenet": {"op": "normalize", "mean": realmodels.IMAGENET_MEAN.tolist(),
                              "std": realmodels.IMAGENET_STD.tolist()}}
"""The normalization of each :data:`EXTRA_DATA` feed, for the ``uint8Input`` rows of ``--amp``."""


def uint8_input_config(name: str) -> dict:
    """Config arguments that make corpus model ``name``'s image input raw uint8 pixels (``uint8Input`` with the
    feed's normalization; the samples are float tensors of whole pixels, which the runtime quantizes back to those
    pixels), or ``{}`` for a model without :data:`EXTRA_DATA`."""
    normalize = UINT8_PIXELS.get(EXTRA_DATA.get(name, ""))
    if normalize is None:
        return {}
    return {"preprocessing_config": {"apply": False, "pipeline": [normalize]}, "uint8_input_config": {"apply": True}}


SPLIT_OF = {"calibration": "calib", "search": "search", "held_out": "eval"}
"""The ``text_photos`` split of each ``--amp`` split."""


def amp_splits(name: str, specs, holdout: int) -> tuple[dict[str, list], dict[str, dict]]:
    """The three splits of ``--amp`` for corpus model ``name`` (parsed inputs ``specs``): ``calibration``,
    ``search`` (``holdout`` more calibration-split samples the search judges its target on) and ``held_out`` (the
    corpus's own held-out samples), each with the photos with text of :data:`TEXT_PHOTOS` for an
    :data:`EXTRA_DATA` model; and per split, what its samples are and how many distinct sources they come from."""
    import corpus
    import text_photos

    entry = corpus.corpus_by_name()[name]
    n_calib = corpus.N_CALIB
    corpus.N_CALIB = n_calib + holdout  # the feeds size their calibration pools from it
    try:
        pages = [entry.feed(specs, "calib", i) for i in range(corpus.N_CALIB)]
    finally:
        corpus.N_CALIB = n_calib
    splits = {"calibration": pages[:n_calib], "search": pages[n_calib:],
              "held_out": [entry.feed(specs, "eval", i) for i in range(corpus.N_EVAL)]}
    sources = {"calibration": {"corpus samples": n_calib}, "search": {"corpus samples": holdout},
               "held_out": {"corpus samples": corpus.N_EVAL}}
    norm = EXTRA_DATA.get(name)
    if norm is None:
        return splits, sources
    spec = corpus._only(specs)
    height, width = spec.shape[1:3] if corpus._is_nhwc(spec.shape) else spec.shape[2:4]
    for part, split in SPLIT_OF.items():
        photos = [{spec.name: corpus.image_tensor(text_photos.text_photo(split, i, width, height), spec, norm)}
                  for i in range(TEXT_PHOTOS[split])]
        splits[part] = _interleave(splits[part], photos) if part == "calibration" else splits[part] + photos
        sources[part].update({"photos with text": len(photos),
                              "distinct photographs": text_photos.distinct_photos(split)})
    return splits, sources


def _interleave(first: list, second: list) -> list:
    """``first`` and ``second`` alternated (the rest of the longer one at the end): the sensitivity analysis
    ranks layers on the first calibration samples, which then hold both kinds."""
    merged = [item for pair in zip(first, second) for item in pair]
    return merged + first[len(second):] + second[len(first):]


def search_positions(total: int, holdout: int) -> list[int]:
    """The manifest positions the compiler holds out (``analysisHoldout``) from ``total`` samples: the search split
    goes exactly there, so that ours and onnxruntime calibrate on the same samples."""
    from compiler_core.calibration.dataset import CalibrationDataset

    held = CalibrationDataset([], list(range(total)), "bench", {}, []).split(holdout)[1]
    return list(held.samples)


def amp_manifest(folder: Path, calibration: list, search: list) -> Path:
    """A calibration manifest with ``search`` at :func:`search_positions` and ``calibration`` elsewhere, in order."""
    import corpus

    total = len(calibration) + len(search)
    positions = set(search_positions(total, len(search)))
    pools = (iter(calibration), iter(search))
    return corpus.write_manifest(folder, [next(pools[index in positions]) for index in range(total)])


def run_amp_model(name: str, args, folder: Path) -> dict:
    import corpus

    from compiler_core.api import mblt_compile, mxq_compile

    entry = corpus.corpus_by_name()[name]
    source = entry.source()
    mblt = mblt_compile(source, folder / f"{name}.mblt", input_shape_dict=entry.input_shape_dict or None,
                        constant_inputs=entry.constant_inputs or None)
    specs = corpus._mblt_inputs(mblt)
    splits, sources = amp_splits(name, specs, args.amp_holdout)
    calib, evaluation = splits["calibration"], splits["held_out"]
    manifest = amp_manifest(folder / f"{name}_calib", calib, splits["search"])
    print(name, "splits", json.dumps(sources), flush=True)
    reference = ort_outputs(mblt, evaluation)
    holdout = len(splits["search"])
    common = {"target_device": "aries-rb", "calib_data_path": manifest, "analysis_holdout": holdout,
              "calibration_config": {"numSamples": len(calib)}}
    rows = {}
    zero_points = {"calibration_config": {"numSamples": len(calib), "method": 2}}
    channels = {**zero_points, "bit_config": {"activationScales": "channel"}}
    refit = {**channels, "bit_config": {"activationScales": "channel", "weightRounding": "sequential"}}
    configs = [("ours int8", {}), ("ours int8, zero points", zero_points),
               ("ours int8, zero points, channel scales", channels),
               ("ours int8, zero points, channel scales, GPTQ conv weights",
                {**channels, "bit_config": {"activationScales": "channel", "weightRounding": "gptq"}}),
               ("ours int8, zero points, channel scales, sequential refit", refit)]
    pixels = uint8_input_config(name)
    if pixels:
        configs += [("ours int8, uint8 input, zero points, channel scales", {**channels, **pixels}),
                    ("ours int8, uint8 input, zero points, channel scales, sequential refit", {**refit, **pixels})]
    configs += [("ours a16w8", {"config_preset": "a16w8"}),
                ("ours a16w8, GPTQ conv weights", {"config_preset": "a16w8", "bit_config": {"weightRounding": "gptq"}})]
    for label, extra in configs:
        started = time.perf_counter()
        int8 = mxq_compile(mblt, save_path=folder / f"{name}_int8.mxq", **{**common, **extra})
        test = mxq_outputs(int8.mxq_path, evaluation)
        rows[label] = {"cosine": worst_cosine(reference, test), "per_sample": _per_sample(reference, test),
                       "seconds": time.perf_counter() - started,
                       "latency_ms": next(iter(int8.schedule.values()))["latency_ms"]}
        rows[label]["latency_increase"] = rows[label]["latency_ms"] / rows["ours int8"]["latency_ms"] - 1
        print(name, label, json.dumps(rows[label]), flush=True)
    kind, _, value = args.amp_target.partition("=")
    started = time.perf_counter()
    amp = mxq_compile(mblt, save_path=folder / f"{name}_amp.mxq", mixed_precision_config={
        "apply": True, "target": {"kind": kind, "value": float(value), "statistic": args.amp_statistic},
        "maxInt16Fraction": args.amp_fraction, "sensitivitySamples": args.amp_sensitivity_samples,
        "latencyBudget": args.amp_budget}, **{**common, **json.loads(args.amp_config)})
    mixed = amp.mixed_precision
    chosen = mixed["points"][mixed["chosen"]]
    test = mxq_outputs(amp.mxq_path, evaluation)
    rows["ours AMP"] = {"cosine": worst_cosine(reference, test), "per_sample": _per_sample(reference, test),
                        "seconds": time.perf_counter() - started, "target_met": mixed["target_met"],
                        "holdout_metric": chosen["metric"], "int16_layers": chosen["int16_layers"],
                        "int16_fraction": chosen["int16_fraction"], "latency_increase": chosen["latency_increase"],
                        "latency_ms": chosen["latency_ms"], "points": len(mixed["points"]),
                        "search_seconds": mixed["seconds"],
                        "zero_points": chosen.get("zero_points", False),
                        "channel_scales": chosen.get("channel_scales", False), "overrides": mixed["overrides"],
                        "tried": [{k: p.get(k) for k in ("units", "int16_layers", "int16_fraction", "metric",
                                                          "latency_increase", "zero_points", "channel_scales",
                                                          "pareto", "chosen")}
                                  for p in mixed["points"]]}
    print(name, "ours AMP", json.dumps(rows["ours AMP"]), flush=True)
    rows["splits"] = sources
    if len(specs) == 1 and source.suffix == ".onnx" and not args.skip_onnxruntime:
        source = _pinned(source, entry.input_shape_dict, folder / f"{name}_pinned.onnx")
        ort_calib = [{_source_input(source): s[specs[0].name]} for s in calib]
        ort_eval = [{_source_input(source): s[specs[0].name]} for s in evaluation]
        rows.update(run_ort_rows(source, ort_calib, ort_eval, reference, folder))
    return rows


CORPUS_CONFIGS = {
    "int8 (default)": {},
    "int8 + empirical bias correction": {"layer_bias_correction_config": {"apply": True, "empirical": True}},
    "a16w8": {"config_preset": "a16w8"},
    "a16w8 + empirical bias correction": {"config_preset": "a16w8",
                                          "layer_bias_correction_config": {"apply": True, "empirical": True}},
    "a16w8 + GPTQ conv weights": {"config_preset": "a16w8", "bit_config": {"weightRounding": "gptq"}},
    "a16w16": {"config_preset": "a16w16"},
}
"""Configs ``--configs`` measures on a corpus model, on the cached statistics of one calibration set."""


def run_config_rows(name: str, args, folder: Path) -> dict:
    """:data:`CORPUS_CONFIGS` on a corpus model: held-out cosine (worst output's mean; per sample), int16 layers,
    estimated aries-rb latency (``single``). The program runs as its QDQ export in onnxruntime."""
    import corpus

    from compiler_core.api import mblt_compile, quantize
    from compiler_core.quantization.mixed_precision import counted_layers, int16_layers
    from compiler_core.quantization.qdq import save_qdq
    from compiler_core.runtime.cost import estimate
    from compiler_core.targets import get_device

    entry = corpus.corpus_by_name()[name]
    mblt = mblt_compile(entry.source(), folder / f"{name}.mblt", input_shape_dict=entry.input_shape_dict or None,
                        constant_inputs=entry.constant_inputs or None)
    specs = corpus._mblt_inputs(mblt)
    evaluation = [entry.feed(specs, "eval", i) for i in range(corpus.N_EVAL)]
    calib = [entry.feed(specs, "calib", i) for i in range(corpus.N_CALIB)]
    manifest = corpus.write_manifest(folder / f"{name}_calib", calib)
    reference = ort_outputs(mblt, evaluation)
    rows, base = {}, None
    for label, config in CORPUS_CONFIGS.items():
        started = time.perf_counter()
        result = quantize(mblt, manifest, analysis=False, analysis_holdout=0, target_device="aries-rb",
                          calibration_config={"numSamples": corpus.N_CALIB}, **config)
        qdq = save_qdq(mblt, result.model, folder / f"{name}_{len(rows)}.onnx")
        test = ort_outputs(qdq, evaluation)
        latency = estimate(result.model, get_device("aries-rb"), "single").latency_ms
        base = base or latency
        rows[label] = {"cosine": worst_cosine(reference, test),
                       "per_sample": [worst_cosine([r], [t]) for r, t in zip(reference, test)],
                       "int16_layers": int16_layers(result.model), "int16_fraction":
                       int16_layers(result.model) / max(counted_layers(result.model), 1),
                       "latency_ms": latency, "latency_increase": latency / base - 1,
                       "seconds": time.perf_counter() - started}
        print(name, label, json.dumps(rows[label]), flush=True)
    return rows


def print_config_rows(report: dict) -> None:
    print(f"\nConfigs on the corpus's calibration data ({report['calibration']} samples), judged on its held-out "
          "samples (QDQ in onnxruntime; aries-rb latency estimate, single core)")
    print(f"{'model':12s} {'config':36s} {'cosine':>8s} {'per sample':>30s} {'int16':>9s} {'est. lat.':>9s} "
          f"{'seconds':>8s}")
    for model, rows in report["models"].items():
        for label, row in rows.items():
            samples = " ".join(f"{value:.4f}" for value in row["per_sample"])
            share = f"{row['int16_layers']} {row['int16_fraction']:4.0%}"
            print(f"{model:12s} {label:36s} {row['cosine']:8.4f} {samples:>30s} {share:>9s} "
                  f"{row['latency_increase']:+9.1%} {row['seconds']:8.1f}")


def main_configs(args) -> None:
    import corpus

    report = {"calibration": corpus.N_CALIB, "models": {}}
    with tempfile.TemporaryDirectory(prefix="bench-configs-") as scratch:
        os.environ.setdefault("QBCOMPILER_CACHE_DIR", str(Path(scratch) / "cache"))
        for name in args.configs.split(","):
            report["models"][name] = run_config_rows(name, args, Path(scratch))
    print_config_rows(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


def _pinned(source: Path, shapes: dict[str, list[int]], output: Path) -> Path:
    """``source`` with the corpus entry's static input shapes (``quant_pre_process``'s symbolic shape
    inference stops at PP-OCR det's dynamic height and width)."""
    import onnx

    if not shapes:
        return source
    model = onnx.load(str(source))
    for value in model.graph.input:
        for dim, size in zip(value.type.tensor_type.shape.dim, shapes.get(value.name, [])):
            dim.dim_value = size
    onnx.save(model, str(output))
    return output


def _source_input(source: Path) -> str:
    return realdata.ort_session(source).get_inputs()[0].name


def print_amp(report: dict) -> None:
    print(f"\nAutomatic mixed precision, target {report['target']} on the search split, judged on the held-out split "
          f"(aries-rb); AMP config {report['amp_config']}; load average {report['load'][0]:.1f} at the start, "
          f"{report['load'][1]:.1f} at the end")
    for model, rows in report["models"].items():
        for part, counts in rows.get("splits", {}).items():
            print(f"{model:18s} {part:12s} " + ", ".join(f"{value} {key}" for key, value in counts.items()))
    print(f"{'model':18s} {'tool':34s} {'cosine':>8s} {'min':>6s} {'per sample':>60s} {'int16':>9s} {'est. lat.':>9s} "
          f"{'points':>6s} {'seconds':>8s}")
    for model, rows in report["models"].items():
        for tool, row in rows.items():
            if tool == "splits":
                continue
            if "error" in row:
                print(f"{model:18s} {tool:34s} {row['error']}")
                continue
            share = f"{row['int16_layers']} {row['int16_fraction']:4.0%}" if "int16_layers" in row else ""
            latency = f"{row['latency_increase']:+.1%}" if "latency_increase" in row else ""
            samples = " ".join(f"{value:.3f}" for value in row.get("per_sample", []))
            worst = float(np.nanmin(row["per_sample"])) if row.get("per_sample") else float("nan")
            print(f"{model:18s} {tool:34s} {row['cosine']:8.4f} {worst:6.3f} {samples:>60s} {share:>9s} {latency:>9s} "
                  f"{row.get('points', ''):>6} {row['seconds']:8.1f}")


def main_amp(args) -> None:
    report = {"target": f"{args.amp_target} ({args.amp_statistic})", "amp_config": args.amp_config, "models": {},
              "load": [os.getloadavg()[0]]}
    with tempfile.TemporaryDirectory(prefix="bench-amp-") as scratch:
        for name in args.amp.split(","):
            os.environ.setdefault("QBCOMPILER_CACHE_DIR", str(Path(scratch) / "cache"))
            report["models"][name] = run_amp_model(name, args, Path(scratch))
            print(name, json.dumps(report["models"][name], default=str)[:2000], flush=True)
    report["load"].append(os.getloadavg()[0])
    print_amp(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=64, help="calibration photos (default 64)")
    parser.add_argument("--eval", type=int, default=40, help="held-out photos (default 40)")
    parser.add_argument("--held-out", type=int, metavar="N",
                        help="judge on N views of the 30 held-out scenes (realdata.HELD_OUT_SOURCES) instead")
    parser.add_argument("--runs", type=int, default=1, help="timed runs per tool; the median is shown")
    parser.add_argument("--executor", choices=("golden", "qdq"), default="golden",
                        help="run our quantized model with the golden executor or as QDQ in onnxruntime")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--amp", metavar="NAMES", help="automatic mixed precision on these corpus models instead")
    parser.add_argument("--amp-target", default="cosine=0.99", help="AMP target KIND=VALUE (default cosine=0.99)")
    parser.add_argument("--amp-holdout", type=int, default=4, help="calibration-split samples the search judges on")
    parser.add_argument("--amp-config", default="{}",
                        help="more config arguments of the AMP compile, as JSON (e.g. layer_bias_correction_config)")
    parser.add_argument("--amp-fraction", type=float, default=0.25, help="maxInt16Fraction (default 0.25)")
    parser.add_argument("--configs", metavar="NAMES", help="CORPUS_CONFIGS on these corpus models instead")
    parser.add_argument("--amp-budget", type=float, default=0.15, help="latency budget (default 0.15)")
    parser.add_argument("--amp-statistic", choices=("mean", "worst"), default="mean",
                        help="AMP cosine target on the mean of the search samples or on the worst one")
    parser.add_argument("--amp-sensitivity-samples", type=int, default=2,
                        help="calibration samples the AMP sensitivity ranking runs on (default 2)")
    parser.add_argument("--skip-onnxruntime", action="store_true", help="--amp without the onnxruntime rows")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.amp:
        main_amp(args)
        return
    if args.configs:
        main_configs(args)
        return
    import onnxruntime  # noqa: F401  (imported before any timing, for both tools)

    from compiler_core.api import mblt_compile

    source = realmodels.mobilenet_v2_onnx()
    calib, evaluation = realdata.imagenet_photo_sets(args.samples, args.eval)
    if args.held_out:
        evaluation = realdata.imagenet_held_out_views(args.held_out)
    feeds = {"input": realdata.imagenet_tensors(evaluation)}
    fp32 = realdata.run_float(source, feeds, "logits")
    with tempfile.TemporaryDirectory(prefix="bench-quant-") as scratch:
        folder = Path(scratch)
        mblt, parse_seconds = timed(mblt_compile, source, folder / "mobilenet_v2.mblt",
                                    input_shape_dict={"input": realmodels.MOBILENET_SHAPE})
        peer = run_onnxruntime(source, calib, args, feeds, fp32, folder)
        ours = run_ours(mblt, calib, args, feeds, fp32, folder)
    report = {"model": "mobilenet_v2", "samples": args.samples, "eval": len(fp32), "executor": args.executor,
              "runs": args.runs, "parse_seconds": parse_seconds, "ours": ours, "onnxruntime": peer,
              "ratios": ratios(ours, peer["quantize_static"])}
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
