"""The quantize stage as one call: calibration data -> statistics -> decisions -> integer program -> analysis."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from compiler_core.analysis.compare import analyze
from compiler_core.calibration import CalibrationDataset, input_specs, open_calibration_data
from compiler_core.calibration.cache import StatisticsCache, collect_statistics_cached
from compiler_core.calibration.observers import observe
from compiler_core.calibration.statistics import StatisticsSet
from compiler_core.config import CompileConfig, layer_matches
from compiler_core.errors import CalibrationError
from compiler_core.mblt.io import load_mblt
from compiler_core.progress import Reporter
from compiler_core.quantization.bias_correction import correct_biases
from compiler_core.quantization.equalize import equalize, equalized_stats, find_pairs
from compiler_core.quantization.pipeline import MODE_NAMES, quantize_graph
from compiler_core.quantization.program import QuantizedModel
from compiler_core.quantization.smoothquant import smooth, smoothed_stats
from compiler_core.session import MbltSession

logger = logging.getLogger(__name__)

MIN_CALIBRATION_SAMPLES = 4


@dataclass
class QuantizeResult:
    """What :func:`quantize_mblt` returns.

    Attributes:
        model: the integer program.
        analysis: FP32 vs quantized metrics on held-out samples (empty when none were held out).
        statistics_from_cache: True when no calibration inference ran.
        timings: seconds per stage.
        samples: calibration and held-out sample counts, and whether the data was random (``use_random_calib``).
    """

    model: QuantizedModel
    analysis: dict[str, Any]
    statistics_from_cache: bool
    timings: dict[str, float] = field(default_factory=dict)
    samples: dict[str, int | bool] = field(default_factory=dict)


def quantize_mblt(mblt_path: str | Path | MbltSession, config: CompileConfig, *,
                  calib_data_path: str | Sequence[str] | None = None, reporter: Reporter,
                  cache: StatisticsCache | None = None, analysis: bool = True,
                  body_path: str | Path | ir.Model | None = None, head: bytes | None = None,
                  tail: bytes | None = None,
                  before_analysis: Callable[[QuantizedModel], None] | None = None) -> QuantizeResult:
    """Quantize an MBLT with ``config`` (already resolved) on the given calibration data.

    ``mblt_path`` is the file or a compile session that holds it in memory (then nothing is read
    or hashed again). With CPU offload, ``body_path`` is the NPU part to quantize (a file or the
    model in memory; statistics still come from the whole MBLT, whose tensors it shares) and
    ``head`` the ONNX CPU head that turns samples into the body's inputs for the analysis, ``tail`` the ONNX CPU tail
    that turns the body's outputs into the model's (the analysis compares the model's outputs).
    ``before_analysis`` is called with the quantized model before the analysis runs (the compile's fit check: a
    failure there should not wait for the analysis).
    """
    timings: dict[str, float] = {}
    session = mblt_path if isinstance(mblt_path, MbltSession) else MbltSession.open(mblt_path)
    graph = session.graph
    calibration, holdout, stats, hit = calibration_statistics(session, config, calib_data_path=calib_data_path,
                                                              reporter=reporter, cache=cache, body_path=body_path,
                                                              timings=timings)
    for warning in unscaled_image_inputs(graph, stats) if "image" in calibration.kind else []:  # not .npy arrays
        logger.warning(warning)
    started = time.perf_counter()
    target = body_path if isinstance(body_path, ir.Model) else load_mblt(body_path) if body_path is not None else graph
    model_outputs = frozenset(v.name for v in graph.graph.outputs) if body_path is not None else None
    quantized, model = quantize_from_statistics(target, stats, config, mblt_sha256=session.sha256, reporter=reporter,
                                                model_outputs=model_outputs,
                                                samples=through_head(head, calibration))
    timings["quantize"] = time.perf_counter() - started
    if before_analysis is not None:
        before_analysis(model)
    report = {}
    if analysis and len(holdout):
        started = time.perf_counter()
        samples = through_head(head, holdout)
        report = analyze(quantized, model, samples, num_samples=len(holdout), reporter=reporter,
                         sample_names=holdout.sources, tail=tail,
                         model_outputs=[value.name for value in graph.graph.outputs])
        timings["analysis"] = time.perf_counter() - started
    samples = {"calibration": len(calibration), "holdout": len(holdout), "random": calibration.kind == "random"}
    return QuantizeResult(model, report, hit, timings, samples)


def quantize_from_statistics(target: ir.Model, stats: StatisticsSet, config: CompileConfig, *, mblt_sha256: str = "",
                             reporter: Reporter | None = None, model_outputs: frozenset[str] | None = None,
                             samples: Iterable[Mapping[str, np.ndarray]] | None = None,
                             ) -> tuple[ir.Model, QuantizedModel]:
    """Smooth and equalize (if configured) and quantize ``target`` with already collected statistics.

    ``samples`` are the calibration samples; with ``layerBiasCorrection.empirical`` the first
    ``empiricalSamples`` of them measure each linear layer's output shift
    (:mod:`~compiler_core.quantization.bias_correction`), with ``bit.weightRounding: gptq`` the first
    ``weightRoundingSamples`` give the Conv Hessians (:func:`~compiler_core.quantization.gptq.conv_hessians`), with
    ``sequential`` they refit the Convs to their quantized inputs (:mod:`~compiler_core.quantization.refit`);
    without samples those steps are skipped, with a warning.

    Returns:
        ``(float graph, program)``: the float graph the program was quantized from (``target`` itself,
        or a smoothed / equalized copy; the FP32 reference of any comparison) and the integer program.
    """
    collected = stats
    quantized, stats, equalized = _equalized(target, stats, config)
    correction = config.layer_bias_correction
    wanted = max(config.bit.weight_rounding_samples if config.bit.weight_rounding != "nearest" else 0,
                 correction.empirical_samples if correction.apply and correction.empirical else 0)
    cross_validated = config.bit.activation_scales == "channel" and config.bit.channel_ranges == "crossValidated"
    if cross_validated:
        wanted = max(wanted, config.calibration.num_samples)
    chosen = None if samples is None else [sample for _, sample in zip(range(wanted), samples)]
    hessians = None
    if config.bit.weight_rounding == "gptq":
        if chosen is None:
            logger.warning("bit.weightRounding gptq needs calibration samples here; weights were rounded to nearest.")
        else:
            from compiler_core.quantization.gptq import conv_hessians

            hessians = conv_hessians(quantized, chosen[:config.bit.weight_rounding_samples])
    model = quantize_graph(quantized, _range_function(stats, config, equalized), config,
                           channel_means=_channel_means(stats), mblt_sha256=mblt_sha256, reporter=reporter,
                           model_outputs=model_outputs, signal_rms=_signal_rms(stats),
                           feature_absmax=_feature_absmax(stats),
                           channel_ranges=_feature_map_ranges(quantized, stats, config, chosen, collected, reporter),
                           hessians=hessians)
    if config.bit.weight_rounding == "sequential":
        if chosen is None:
            logger.warning("bit.weightRounding sequential needs calibration samples here; weights were rounded to "
                           "nearest.")
        else:
            from compiler_core.quantization.refit import refit_convolutions

            refit_convolutions(quantized, model, chosen[:config.bit.weight_rounding_samples], reporter=reporter)
    if correction.apply and correction.empirical:
        if chosen is None:
            logger.warning("layerBiasCorrection.empirical needs calibration samples here; only the analytic "
                           "correction was applied.")
        else:
            correct_biases(quantized, model, chosen[:correction.empirical_samples], reporter=reporter)
    return quantized, model


def calibration_statistics(session: MbltSession, config: CompileConfig, *,
                           calib_data_path: str | Sequence[str] | None = None, reporter: Reporter,
                           cache: StatisticsCache | None = None, body_path: Any = None,
                           timings: dict[str, float] | None = None):
    """The calibration and held-out splits of the data and the activation statistics (from the cache if present).

    This is the part of :func:`quantize_mblt` that depends on the data and on the collection settings
    only, never on the quantization options (mode, percentile, bits, bias correction): a settings
    sweep calls it once to fill the cache, then every point of the sweep hits that entry.

    Returns:
        ``(calibration, holdout, stats, hit)``; ``hit`` is True when no calibration inference ran.
    """
    timings = timings if timings is not None else {}
    started = time.perf_counter()
    dataset = _open_dataset(session.graph, config, calib_data_path, reporter)
    calibration, holdout = _split(dataset, config)
    timings["data"] = time.perf_counter() - started
    started = time.perf_counter()
    stats, hit = collect_statistics_cached(session, calibration, cache=cache, reporter=reporter,
                                           tensors=_quantization_points(session.graph, body_path))
    timings["statistics"] = time.perf_counter() - started
    return calibration, holdout, stats, hit


NORMALIZED_SPAN = 20.0
"""Beyond +-20 a float image input holds pixel-like values: a normalized image stays within about [-3, 3] (a [0, 1]
one inside it)."""
_PASS_THROUGH = frozenset({"Transpose", "Reshape", "Identity", "Pad", "Squeeze", "Unsqueeze", "Flatten"})
_LINEAR = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def unscaled_image_inputs(graph: ir.Model, stats: StatisticsSet) -> list[str]:
    """Float image inputs whose calibration values reach pixel range while the model's first computation is a linear
    layer (no scaling of its own, as a Keras ``Rescaling`` or an exported ``x / 255`` would be): the MBLT is then run
    on inputs it was not trained on, and its FP32 reference itself means little (MediaPipe's palm detector fed 0-255
    pixels: the MXQ at cosine 0.82 to an FP32 output that was near zero). The compile asks only when the data are
    image files through the pipeline (``.npy`` arrays are the user's own preprocessing; spectrograms are arrays)."""
    warnings = []
    consumers: dict[str, list[ir.Node]] = {}
    for node in graph.graph:
        for value in node.inputs:
            if value is not None:
                consumers.setdefault(value.name, []).append(node)
    for spec in input_specs(graph):
        tensor = stats.tensors.get(spec.name)
        if not spec.is_image or spec.dtype.kind != "f" or tensor is None:
            continue
        if max(abs(tensor.min), abs(tensor.max)) <= NORMALIZED_SPAN:
            continue
        names, first = [spec.name], set()
        while names:  # through layout-only ops to the first operations that compute
            for node in consumers.get(names.pop(), []):
                if node.op_type in _PASS_THROUGH:
                    names += [value.name for value in node.outputs]
                else:
                    first.add(node.op_type)
        if first and first <= _LINEAR:
            warnings.append(f"Calibration input '{spec.name}' spans [{tensor.min:.3g}, {tensor.max:.3g}] after "
                            "preprocessing, but the model's first layer ({}) reads it unscaled: a float image model "
                            "is usually trained on normalized values (about [-3, 3] or [0, 1]). Check the "
                            "preprocessing pipeline's normalize step (e.g. scale 1/255, mean/std); the accuracy "
                            "figures compare with FP32 on these same inputs.".format(", ".join(sorted(first))))
    return warnings


def _equalized(target: ir.Model, stats: StatisticsSet, config: CompileConfig):
    """With ``equivalentTransformation`` (SmoothQuant) and/or ``crossLayerEqualization``: a transformed copy of
    ``target``, the statistics of the transformed tensors, the names of those tensors.

    ``target`` itself stays as it is: it is the FP32 reference of the analysis (and may be the compile
    session's graph); both transformations leave the float function unchanged.
    """
    smooth_on = config.equivalent_transformation.apply
    equalize_on = config.cross_layer_equalization.apply and bool(find_pairs(target))
    if not smooth_on and not equalize_on:
        return target, stats, set()
    copy = ir.serde.deserialize_model(ir.serde.serialize_model(target))
    tensors, changed = dict(stats.tensors), set()
    if smooth_on:
        transformation = config.equivalent_transformation
        for item in smooth(copy, stats, alpha=transformation.alpha,
                           duplicate_norms=transformation.duplicate_norms).smoothed:
            tensors[item.tensor] = smoothed_stats(stats.tensors[item.source], item.scales)
            changed.add(item.tensor)
    if equalize_on:
        for pair in equalize(copy, dataclasses.replace(stats, tensors=tensors)):
            tensors[pair.tensor] = equalized_stats(tensors[pair.tensor], pair.scales)
            changed.add(pair.tensor)
    if not changed:
        return target, stats, set()
    return copy, dataclasses.replace(stats, tensors=tensors), changed


def _open_dataset(graph: ir.Model, config: CompileConfig, calib_data_path, reporter: Reporter) -> CalibrationDataset:
    paths = calib_data_path if calib_data_path is not None else (config.calib_data_paths or None)
    return open_calibration_data(paths, input_specs(graph), preprocessing=config.preprocessing,
                                 image_channels=config.image_channels, use_random_calib=config.use_random_calib,
                                 reporter=reporter)


def _split(dataset: CalibrationDataset, config: CompileConfig) -> tuple[CalibrationDataset, CalibrationDataset]:
    """Hold out ``analysisHoldout`` samples (fewer for small sets), cap calibration at ``numSamples``."""
    total = len(dataset)
    holdout = min(config.analysis_holdout, max(0, total - MIN_CALIBRATION_SAMPLES), total // 4)
    if holdout < config.analysis_holdout:
        logger.info("Holding out %d of %d sample(s) for the accuracy analysis (analysisHoldout %d): at most a "
                    "quarter of the samples, and %d stay for calibration.", holdout, total, config.analysis_holdout,
                    total - holdout)
    if total - holdout < 1:
        raise CalibrationError(f"Only {total} calibration sample(s): too few to calibrate.",
                               hint="Provide at least 16 representative samples.")
    calibration, held_out = dataset.split(holdout) if holdout else (dataset, dataset.split(0)[1])
    limit = config.calibration.num_samples
    if len(calibration) > limit:
        calibration = calibration.split(len(calibration) - limit)[0]
    return calibration, held_out


def _range_function(stats: StatisticsSet, config: CompileConfig, equalized: set[str] = frozenset()):
    """``(names, bits) -> {name: (lo, hi)}`` with the config's mode, percentile and layer overrides.

    Equalized and smoothed tensors (:mod:`~compiler_core.quantization.equalize`,
    :mod:`~compiler_core.quantization.smoothquant`) take their exact extremes: their histogram describes
    the tensor before the transformation.
    """
    calibration = config.calibration
    symmetric = int(calibration.method) in (0, 1)

    def ranges(names: Sequence[str], bits: dict[str, int]) -> dict[str, tuple[float, float]]:
        result = {}
        for name in names:
            tensor = stats.tensors.get(name)
            if tensor is None:
                continue
            mode, percentile = _mode_for(name, calibration)
            if name in equalized:
                mode = 0
            result[name] = observe(tensor, MODE_NAMES[mode], symmetric=symmetric and tensor.min < 0,
                                   bits=bits.get(name, 8), percentile=percentile.percentile,
                                   topk_ratio=percentile.topk_ratio)
        return result

    return ranges


def _mode_for(name: str, calibration) -> tuple[int, Any]:
    for pattern, override in calibration.layer_overrides.items():
        if layer_matches([pattern], name):
            return int(override.mode if override.mode is not None else calibration.mode), (
                override.max_percentile or calibration.max_percentile)
    return int(calibration.mode), calibration.max_percentile


def _quantization_points(graph: ir.Model, body_path) -> list[str] | None:
    """Only the tensors that get codes need statistics (a Conv output fused into its Relu does not)."""
    from compiler_core.quantization.decisions import quantized_tensors
    from compiler_core.quantization.graph import GraphView, build_groups

    if body_path is not None:
        return None  # with CPU offload, the head's outputs feed the body: keep every tensor
    view = GraphView(graph)
    return [name for name in quantized_tensors(view, build_groups(view)) if name not in
            {v.name for v in graph.graph.inputs if not view.is_float(v)}]


def through_head(head: bytes | None, samples):
    """Samples -> the NPU body's inputs (CPU head outputs plus the inputs it passes through); without a head, the
    samples themselves."""
    if head is None:
        yield from samples
        return
    import onnxruntime as ort

    session = ort.InferenceSession(head, providers=["CPUExecutionProvider"])
    inputs = [item.name for item in session.get_inputs()]
    outputs = [item.name for item in session.get_outputs()]
    for sample in samples:
        yield {**sample, **dict(zip(outputs, session.run(outputs, {name: sample[name] for name in inputs})))}


def _signal_rms(stats: StatisticsSet) -> dict[str, float]:
    """Root mean square of every tensor's calibration values (from its mean and standard deviation)."""
    return {name: float(np.hypot(tensor.std, tensor.mean)) for name, tensor in stats.tensors.items()}


def _feature_absmax(stats: StatisticsSet) -> dict[str, np.ndarray]:
    """Max |x| per feature (last axis) of the tensors that have it (MatMul/Gemm inputs and outputs)."""
    return {name: tensor.feature_absmax for name, tensor in stats.tensors.items() if tensor.feature_absmax.size}


def _channel_ranges(stats: StatisticsSet) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Calibrated per-channel minima and maxima of the tensors whose channel axis is 1 (feature maps)."""
    return {name: (np.asarray(tensor.per_channel_min), np.asarray(tensor.per_channel_max))
            for name, tensor in stats.tensors.items()
            if tensor.channel_axis == 1 and getattr(tensor, "per_channel_max", None) is not None}


def _feature_map_ranges(graph: ir.Model, stats: StatisticsSet, config: CompileConfig, samples: list | None,
                        collected: StatisticsSet, reporter: Reporter | None) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """The per-channel ranges of ``bit.activationScales: channel``, cross-validated with ``bit.channelRanges``
    (computed once per ``collected``, the statistics set as collected: a mixed-precision search's points share it)."""
    if config.bit.activation_scales != "channel":
        return None
    ranges = _channel_ranges(stats)
    if config.bit.channel_ranges != "crossValidated":
        return ranges
    if samples is None:
        logger.warning("bit.channelRanges crossValidated needs the calibration samples here; the per-channel ranges "
                       "are the calibrated ones.")
        return ranges
    from compiler_core.quantization.range_validation import cached_widenings, widen

    feature_maps = {name: 1 for name in ranges if len(stats[name].shape) == 4 and math.prod(stats[name].shape[2:]) > 1}
    return widen(ranges, cached_widenings(collected, graph, feature_maps, samples, reporter))


def _channel_means(stats: StatisticsSet) -> dict[str, np.ndarray]:
    return {name: np.asarray(tensor.per_channel_mean) for name, tensor in stats.tensors.items()
            if getattr(tensor, "per_channel_mean", None) is not None}
