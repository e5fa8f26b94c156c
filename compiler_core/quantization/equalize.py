"""Cross-layer equalization of depthwise -> pointwise convolution pairs, from calibrated per-channel ranges.

A depthwise convolution whose output feeds a grouped-1 convolution directly (no activation between
them, as in BlazeFace/MediaPipe blocks) produces one tensor whose channels can differ in range by
orders of magnitude: one per-tensor 8-bit scale sized for the widest channel leaves the narrow ones a
handful of codes (BlazeFace: a ±509 range over channels that mostly stay within ±5). Scaling
depthwise channel ``c`` (weights and bias) by ``s_c`` and the consumer's input channel ``c`` by
``1 / s_c`` leaves the float function unchanged, so the ranges can be balanced for free:

``s_c = sqrt(w_c / a_c)`` (normalized so the widest channel keeps its range), with ``a_c`` the
calibrated max |x| of channel ``c`` and ``w_c`` the max |weight| of the consumer's input channel ``c``,
makes both equal to ``sqrt(a_c * w_c)`` up to one factor (Nagel et al., "Data-Free Quantization
Through Weight Equalization and Bias Correction", 2019, with activation ranges in place of the
depthwise weight ranges). The depthwise weights are quantized per output channel, so scaling them
costs nothing; the consumer's weights are quantized per output channel too, and the square root
shares the burden between its columns and the activation.

The equalized tensor's range is the hull of its scaled per-channel ranges (the calibration
histogram describes the unscaled tensor, so the histogram observers cannot read it).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from compiler_core.calibration.statistics import StatisticsSet, TensorStats

logger = logging.getLogger(__name__)

MAX_SCALE_RATIO = 1e4
"""Channel scales are kept within this factor of each other (dead channels would ask for any factor)."""


@dataclass(frozen=True)
class EqualizedPair:
    """One equalized pair: the depthwise and consumer node names, the tensor between them, the channel scales."""

    depthwise: str
    consumer: str
    tensor: str
    scales: np.ndarray


def find_pairs(model: ir.Model) -> list[tuple[ir.Node, ir.Node]]:
    """Depthwise Conv nodes whose only reader is a grouped-1 Conv taking them as data input."""
    outputs = {value.name for value in model.graph.outputs}
    pairs = []
    for node in model.graph:
        if not _is_depthwise(node) or node.outputs[0].name in outputs:
            continue
        readers = [(user, index) for user, index in node.outputs[0].uses()]
        if len(readers) != 1:
            continue
        consumer, index = readers[0]
        if index == 0 and _is_plain_conv(consumer):
            pairs.append((node, consumer))
    return pairs


def equalize(model: ir.Model, stats: StatisticsSet) -> list[EqualizedPair]:
    """Rescale every depthwise -> conv pair of ``model`` in place from ``stats``; returns what changed."""
    done = []
    for depthwise, consumer in find_pairs(model):
        tensor = stats.tensors.get(depthwise.outputs[0].name)
        scales = _scales(depthwise, consumer, tensor)
        if scales is None:
            continue
        _rescale(depthwise, scales, axis=0, bias=True)
        _rescale(consumer, 1.0 / scales, axis=1, bias=False)
        done.append(EqualizedPair(depthwise.name, consumer.name, depthwise.outputs[0].name, scales))
    if done:
        logger.info("Cross-layer equalization: %d depthwise -> conv pair(s)", len(done))
    return done


def equalized_stats(tensor: TensorStats, scales: np.ndarray) -> TensorStats:
    """The statistics of ``tensor`` after its channels are multiplied by ``scales`` (extremes only)."""
    low = tensor.per_channel_min * scales
    high = tensor.per_channel_max * scales
    return dataclasses.replace(tensor, min=float(low.min()), max=float(high.max()), per_channel_min=low,
                               per_channel_max=high, per_channel_mean=tensor.per_channel_mean * scales)


def _is_depthwise(node: ir.Node) -> bool:
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return False
    weight = node.inputs[1].const_value if node.inputs[1] is not None else None
    group = _int_attr(node, "group", 1)
    if weight is None or len(weight.shape) != 4 or group <= 1 or weight.shape[0] != group or weight.shape[1] != 1:
        return False
    constants = [value for value in node.inputs[1:3] if value is not None]
    return all(value.const_value is not None and len(value.uses()) == 1 for value in constants)


def _is_plain_conv(node: ir.Node) -> bool:
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return False
    weight = node.inputs[1].const_value if node.inputs[1] is not None else None
    return weight is not None and _int_attr(node, "group", 1) == 1 and len(node.inputs[1].uses()) == 1


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attribute = node.attributes.get(name)
    return default if attribute is None else int(attribute.as_int())


def _scales(depthwise: ir.Node, consumer: ir.Node, tensor: TensorStats | None) -> np.ndarray | None:
    channels = depthwise.inputs[1].const_value.shape[0]
    if tensor is None or tensor.channel_axis != 1 or tensor.per_channel_max.size != channels:
        return None
    activation = np.maximum(np.abs(tensor.per_channel_min), np.abs(tensor.per_channel_max))
    weight = np.abs(consumer.inputs[1].const_value.numpy().astype(np.float64)).max(axis=(0, 2, 3))
    if activation.max() <= 0 or weight.max() <= 0:
        return None
    floor_a, floor_w = activation.max() / MAX_SCALE_RATIO, weight.max() / MAX_SCALE_RATIO
    scales = np.sqrt(np.maximum(weight, floor_w) / np.maximum(activation, floor_a))
    widest = int(np.argmax(activation))
    scales = np.clip(scales / scales[widest], 1.0 / MAX_SCALE_RATIO, MAX_SCALE_RATIO)
    return scales.astype(np.float64)


def _rescale(node: ir.Node, scales: np.ndarray, *, axis: int, bias: bool) -> None:
    weight = node.inputs[1]
    array = weight.const_value.numpy()
    shape = [1] * array.ndim
    shape[axis] = scales.size
    weight.const_value = ir.tensor((array * scales.reshape(shape)).astype(array.dtype), name=weight.name)
    if bias and len(node.inputs) > 2 and node.inputs[2] is not None:
        value = node.inputs[2]
        values = value.const_value.numpy()
        value.const_value = ir.tensor((values * scales).astype(values.dtype), name=value.name)
