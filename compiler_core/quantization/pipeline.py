"""From an MBLT, calibration statistics and a CompileConfig to a QuantizedModel (straight-line stages)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from compiler_core.config import CompileConfig, layer_matches
from compiler_core.errors import ArgumentError
from compiler_core.progress import Reporter, as_reporter
from compiler_core.quantization.decisions import (
    DecisionOptions,
    activation_bits,
    decide,
    quantized_tensors,
    uint8_input_params,
)
from compiler_core.quantization.graph import GraphView, build_groups
from compiler_core.quantization.lowering import LoweringContext, lower_groups
from compiler_core.quantization.program import QuantizedModel, ValueSpec

logger = logging.getLogger(__name__)

MODE_NAMES = {0: "max", 1: "max_percentile", 2: "histogram", 3: "mse"}


def decision_options(config: CompileConfig, view: GraphView | None = None,
                     model_outputs: frozenset[str] | None = None,
                     signal_rms: Mapping[str, float] | None = None,
                     feature_absmax: Mapping[str, np.ndarray] | None = None,
                     channel_ranges: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None) -> DecisionOptions:
    """Method, int16 layers and input handling from the config (``signal_rms``, ``feature_absmax``,
    ``channel_ranges``: see :class:`DecisionOptions`)."""
    method = int(config.calibration.method)
    patterns = list(config.bit.layer_overrides.activation16_bits)
    return DecisionOptions(symmetric=method in (0, 1), multi_layer=method in (1, 3),
                           int16_layer=lambda name, source: bool(patterns) and layer_matches(patterns, name, source),
                           input_params=uint8_inputs(config, view) if view is not None else {},
                           output_headroom=config.calibration.output_headroom, output_bits=config.bit.output_bits,
                           model_outputs=model_outputs, signal_rms=dict(signal_rms or {}),
                           residual_bits=config.bit.residual_bits, residual_scales=config.bit.residual_scales,
                           feature_absmax=dict(feature_absmax or {}), activation_scales=config.bit.activation_scales,
                           channel_ranges=dict(channel_ranges or {}),
                           int16_headroom=config.calibration.int16_headroom)


def uint8_inputs(config: CompileConfig, view: GraphView) -> dict:
    """Raw-pixel (uint8) parameters for the image inputs ``uint8Input`` names (all 4-D inputs if none)."""
    if not config.uint8_input.apply:
        return {}
    normalize = next((op for op in config.preprocessing.pipeline if op.op == "normalize"), None)
    mean, std, scale = (normalize.mean, normalize.std, normalize.scale) if normalize else ([0.0], [1.0], 1 / 255)
    wanted = set(config.uint8_input.inputs)
    result = {}
    for value in view.graph.inputs:
        shape = view.shape(value)
        if view.is_float(value) and len(shape) == 4 and (not wanted or value.name in wanted):
            result[value.name] = uint8_input_params(mean, std, scale, shape[1])
    missing = wanted - {v.name for v in view.graph.inputs}
    if missing:
        raise ArgumentError(f"uint8Input names unknown input(s): {', '.join(sorted(missing))}.",
                            hint=f"The model's inputs are: {', '.join(v.name for v in view.graph.inputs)}.")
    return result


def weight_bits(view: GraphView, config: CompileConfig) -> dict[str, int]:
    """Weight width per node from ``bit.layerOverrides`` (8 unless a pattern says 16 or 4)."""
    overrides = config.bit.layer_overrides
    result = {}
    for node in view.nodes:
        source = node.metadata_props.get("mblt.source_name", "")
        for bits, patterns in ((16, overrides.weight16_bits), (4, overrides.weight4_bits), (8, overrides.weight8_bits)):
            if patterns and layer_matches(patterns, node.name, source):
                result[node.name] = bits
                break
    return result


def quantize_graph(model: ir.Model, ranges_for, config: CompileConfig, *,
                   channel_means: Mapping[str, np.ndarray] | None = None, mblt_sha256: str = "",
                   reporter: Reporter | None = None, model_outputs: frozenset[str] | None = None,
                   signal_rms: Mapping[str, float] | None = None,
                   feature_absmax: Mapping[str, np.ndarray] | None = None,
                   channel_ranges: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                   hessians: Mapping[str, np.ndarray] | None = None, weight_clip_search: bool = True
                   ) -> QuantizedModel:
    """Decide parameters and lower the graph to integer operations.

    Args:
        model: the MBLT.
        ranges_for: callable ``(tensor_names, bits_by_tensor) -> {name: (low, high)}`` giving
            calibrated ranges (the observers over cached statistics).
        config: the resolved CompileConfig.
        channel_means: per-channel float means by tensor, for bias correction.
        mblt_sha256: identity of the MBLT, recorded in the result.
        reporter: progress/cancel.
        model_outputs: with CPU offload, the whole model's output names (see :class:`DecisionOptions`).
        signal_rms: root mean square of each tensor's calibration values (caps the output headroom).
        feature_absmax: calibrated max |x| per feature (last axis) by tensor, for per-channel
            residual-branch scales (``bit.residualScales``).
        channel_ranges: calibrated per-channel (axis 1) minima and maxima by tensor, for per-channel
            feature-map scales (``bit.activationScales``).
        hessians: per Conv, the Hessians of its input columns; GPTQ rounds its weights (``bit.weightRounding``).
        weight_clip_search: False skips the weight clip search (scales from ``max |w|``): the fit check's stand-in
            program (:mod:`compiler_core.backend.fit`), where only the sizes matter.
    """
    reporter = as_reporter(reporter)
    view = GraphView(model)
    if int(config.calibration.output) != 0:
        logger.warning("calibration.output %d (per-channel / sigmoid output quantization) is not implemented yet; "
                       "outputs are quantized per layer.", int(config.calibration.output))
    with reporter.stage("quantize", total=3, message="quantization decisions"):
        groups = build_groups(view)
        options = decision_options(config, view, model_outputs, signal_rms, feature_absmax, channel_ranges)
        bits = activation_bits(view, groups, options)
        ranges = ranges_for(quantized_tensors(view, groups), bits)
        reporter.advance(message="ranges observed")
        tensors = decide(view, groups, ranges, options, bits)
        reporter.advance(message="parameters frozen")
        context = LoweringContext(view, tensors, channel_means=dict(channel_means or {}),
                                  bias_correction=config.layer_bias_correction.apply,
                                  weight_bits=weight_bits(view, config), hessians=dict(hessians or {}),
                                  weight_clip_search=weight_clip_search)
        ops = lower_groups(groups, context)
        reporter.advance(message=f"{len(ops)} integer operations")
    return QuantizedModel(ops=ops, tensors=tensors, exact=_exact_tensors(view, tensors),
                          inputs=[_spec(v) for v in view.graph.inputs], outputs=[_spec(v) for v in view.graph.outputs],
                          shapes=_shapes(view), mblt_sha256=mblt_sha256, config=_config_dict(config))


def _spec(value: ir.Value) -> ValueSpec:
    return ValueSpec(value.name, [int(d) for d in value.shape], value.dtype.numpy().name)


def _shapes(view: GraphView) -> dict[str, list[int]]:
    shapes = {v.name: view.shape(v) for v in view.graph.inputs}
    for node in view.nodes:
        for value in node.outputs:
            shapes[value.name] = view.shape(value)
    return shapes


def _exact_tensors(view: GraphView, tensors: Mapping[str, Any]) -> dict[str, str]:
    exact = {v.name: v.dtype.numpy().name for v in view.graph.inputs if v.name not in tensors}
    for node in view.nodes:
        for value in node.outputs:
            if not view.is_float(value):
                exact[value.name] = value.dtype.numpy().name
    return exact


def _config_dict(config: CompileConfig) -> dict[str, Any]:
    return config.model_dump(mode="json", by_alias=True)
