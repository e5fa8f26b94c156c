"""SmoothQuant: move activation outlier channels of MatMul/Gemm inputs into the weights, folded into a norm.

Transformer activations concentrate their range in a few feature channels (a LayerNorm's output with
a few large gamma entries, an LLM's residual stream), so one 8-bit per-tensor scale sized for the
widest channel leaves the others a handful of codes. For a linear layer ``Y = X W`` (``W`` of shape
``[K, N]``), dividing input feature ``j`` by ``s_j`` and multiplying weight row ``j`` by ``s_j`` leaves
``Y`` unchanged, and with

``s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)``

the activation and the weights share the difficulty (Xiao et al., "SmoothQuant: Accurate and Efficient
Post-Training Quantization for Large Language Models", 2022; ``alpha`` 0.5 by default). The weights
are quantized per output channel, so a larger row costs them little.

The division by ``s`` must cost nothing at run time: it is folded into the producer of ``X``. This
module folds it into a normalization (LayerNormalization, SimplifiedLayerNormalization,
RMSNormalization) over the last axis, whose Scale (gamma) and B (beta) entries ``j`` are divided by
``s_j``, or into a Mul by a per-feature constant (a decomposed RMSNorm's weight), whose constant is.
That is exact only when every reader of that output is a linear layer that takes the same scaled
input. Where the output has other readers (in a post-norm encoder such as BERT or MiniLM each
LayerNorm output is also the residual stream that the next residual Add reads) or is a model output,
:func:`smooth` either skips it and says why, or, with ``duplicate_norms``, adds a copy of the norm
with the divided Scale/B for the linear readers alone: one more norm per block (an int16 MFU routine
over ``S x H`` values, small beside the MatMuls it feeds) whose output can be int8 while the original
keeps its width for the residual stream. No Mul is inserted anywhere: that would be one more
requantizing operation, and its per-feature constant would need the very range int8 lacks. Outputs
are also skipped when there are no per-feature statistics
(:attr:`~compiler_core.calibration.statistics.TensorStats.feature_absmax`). A Scale shared with other
nodes (exporters merge equal initializers) is copied first, so only this producer's copy is divided.

QKV projections reading one norm get one scale vector from the max over their weight rows.

The statistics of a smoothed tensor follow exactly at the extremes (``max|X_j| / s_j``); its histogram
describes the tensor before smoothing, so the quantizer takes the Max observer for it
(:func:`smoothed_stats`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from compiler_core.calibration.statistics import StatisticsSet, TensorStats
from compiler_core.errors import ArgumentError

logger = logging.getLogger(__name__)

DEFAULT_ALPHA = 0.5
"""Migration strength: 0 leaves the activation as is, 1 moves all of its range into the weights."""
MAX_SCALE_RATIO = 1e4
"""Scales are kept within ``[1 / MAX_SCALE_RATIO, MAX_SCALE_RATIO]`` (a dead channel would ask for any factor)."""
NORM_OPS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"})
"""Producers that absorb ``1 / s``: per-feature Scale (input 1) and optional B (input 2) over the last axis."""
_STANDARD_DOMAINS = ("", "ai.onnx", "com.microsoft")
COPY_SUFFIX = "_smoothed"
"""Name suffix of a norm copy added by ``duplicate_norms`` (node, output and constants)."""
COPY_OF_KEY = "qb.smoothquant_copy_of"
"""Metadata key on a norm copy: the name of the norm it copies. Such a copy keeps 8-bit outputs."""


@dataclass(frozen=True)
class SmoothedTensor:
    """One smoothed activation: the tensor, the norm that absorbed ``1 / s``, the linears that took ``s``.

    ``source`` is the tensor before smoothing: ``tensor`` itself when the norm absorbed the scale in
    place, the original norm output when a smoothed copy of the norm (``tensor``'s producer) was added.
    """

    tensor: str
    producer: str
    consumers: tuple[str, ...]
    scales: np.ndarray
    source: str = ""


@dataclass(frozen=True)
class SmoothSkip:
    """A MatMul/Gemm input that was left as it is, and why."""

    tensor: str
    reason: str


@dataclass
class SmoothQuantResult:
    """What :func:`smooth` changed (``smoothed``) and which linear inputs it could not change (``skipped``)."""

    smoothed: list[SmoothedTensor] = field(default_factory=list)
    skipped: list[SmoothSkip] = field(default_factory=list)


def smooth(model: ir.Model, stats: StatisticsSet, *, alpha: float = DEFAULT_ALPHA,
           duplicate_norms: bool = False) -> SmoothQuantResult:
    """Apply SmoothQuant to ``model`` in place, from the calibration statistics ``stats``.

    The float function of ``model`` is unchanged (up to float rounding). Callers that need the
    original graph (the FP32 reference of an accuracy comparison) pass a copy.

    Args:
        model: the float graph (an MBLT, or an LLM graph in the same ONNX IR).
        stats: statistics collected on ``model`` before smoothing; they must hold
            ``feature_absmax`` for the MatMul/Gemm data inputs.
        alpha: migration strength in ``[0, 1]``.
        duplicate_norms: where a norm's output has other readers (post-norm residual stream) or is a
            model output, add a smoothed copy of the norm for its linear readers instead of skipping.

    Returns:
        The smoothed tensors and the skipped linear inputs with their reasons.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ArgumentError(f"SmoothQuant alpha must be within [0, 1], got {alpha}.", hint="0.5 is the usual value.")
    result = SmoothQuantResult()
    outputs = {value.name for value in model.graph.outputs}
    for value, linears in _linear_inputs(model):
        shared = _shared_reason(value, linears, outputs)
        reason = _cannot_fold(value, linears, shared) or ("" if duplicate_norms else shared)
        scales = None if reason else _scales(value, linears, stats.tensors.get(value.name), alpha)
        if reason or scales is None:
            result.skipped.append(SmoothSkip(value.name, reason or "no per-feature statistics for this tensor"))
            logger.debug("SmoothQuant leaves %s as it is: %s", value.name, result.skipped[-1].reason)
            continue
        producer = value.producer()
        target = _duplicate(model, producer) if shared else producer
        for index in _absorbing_inputs(target):
            _scale_constant(_private_constant(model, target, index), 1.0 / scales)
        for node in linears:
            _scale_weight_rows(node, scales)
            if target is not producer:
                node.replace_input_with(0, target.outputs[0])
        result.smoothed.append(SmoothedTensor(target.outputs[0].name, target.name, tuple(n.name for n in linears),
                                              scales, source=value.name))
    if result.smoothed or result.skipped:
        logger.info("SmoothQuant (alpha %.2f): %d norm output(s) smoothed (%d through a norm copy), %d linear "
                    "input(s) left as they are", alpha, len(result.smoothed),
                    sum(item.tensor != item.source for item in result.smoothed), len(result.skipped))
    return result


def smoothed_stats(tensor: TensorStats, scales: np.ndarray) -> TensorStats:
    """The statistics of ``tensor`` after its features (last axis) are divided by ``scales`` (extremes only).

    The range becomes the symmetric hull of ``feature_absmax / scales``; per-channel arrays follow
    when the channel axis is the feature axis, otherwise (token-major ``[1, S, H]`` read on the tokens)
    their extremes are clipped to that hull.
    """
    features = tensor.feature_absmax / scales
    absmax = float(features.max())
    changes = {"min": -absmax, "max": absmax, "feature_absmax": features}
    if tensor.channel_axis is not None and tensor.channel_axis == len(tensor.shape) - 1:
        changes.update(per_channel_min=tensor.per_channel_min / scales, per_channel_max=tensor.per_channel_max / scales,
                       per_channel_mean=tensor.per_channel_mean / scales)
    else:
        changes.update(per_channel_min=np.maximum(tensor.per_channel_min, -absmax),
                       per_channel_max=np.minimum(tensor.per_channel_max, absmax))
    return dataclasses.replace(tensor, **changes)


def _linear_inputs(model: ir.Model) -> list[tuple[ir.Value, list[ir.Node]]]:
    """Every tensor read as the data input of a MatMul/Gemm with constant 2-D weights, with those readers."""
    readers: dict[str, tuple[ir.Value, list[ir.Node]]] = {}
    for node in model.graph:
        if _weight(node) is not None:
            value = node.inputs[0]
            readers.setdefault(value.name, (value, []))[1].append(node)
    return list(readers.values())


def _weight(node: ir.Node) -> np.ndarray | None:
    """The ``[K, N]`` weight of a linear MatMul/Gemm (rows = input features), or None for other nodes."""
    if node.domain not in ("", "ai.onnx") or len(node.inputs) < 2 or node.inputs[0] is None:
        return None
    if node.op_type == "Gemm":
        attributes = node.attributes
        if attributes.get("transA") is not None and attributes["transA"].as_int():
            return None
    elif node.op_type != "MatMul":
        return None
    weight = node.inputs[1]
    if weight is None or weight.const_value is None or len(weight.const_value.shape) != 2:
        return None
    array = weight.const_value.numpy()
    transposed = node.op_type == "Gemm" and node.attributes.get("transB") is not None and node.attributes["transB"].as_int()
    return array.T if transposed else array


def _shared_reason(value: ir.Value, linears: list[ir.Node], outputs: set[str]) -> str:
    """Why the norm's own output cannot carry the smoothed values (other readers, a model output), or ""."""
    if value.name in outputs:
        return "a model output"
    others = [user for user, _ in value.uses() if user not in linears]
    if others:
        return (f"also read by {others[0].op_type} {others[0].name} (e.g. a residual Add): dividing the norm's "
                "output would change that reader's input")
    return ""


def _cannot_fold(value: ir.Value, linears: list[ir.Node], shared: str = "") -> str:
    """Why ``1 / s`` cannot be folded into the producer of ``value`` (or a copy of it), or ""."""
    producer = value.producer()
    if producer is None:
        return "a graph input (no producer to absorb the scale)"
    features = value.shape[-1] if value.shape is not None else None
    if producer.domain not in _STANDARD_DOMAINS or producer.op_type not in NORM_OPS | {"Mul"}:
        return f"produced by {producer.op_type} {producer.name}, which cannot absorb a per-feature scale"
    if producer.op_type == "Mul" and shared:
        return shared  # only norms are copied (the QDQ export recreates norm copies)
    if producer.op_type in NORM_OPS and _int_attr(producer, "axis", -1) not in (-1, len(value.shape) - 1):
        return f"{producer.name} normalizes over another axis than the features"
    indices = _absorbing_inputs(producer)
    if not indices or any(not _per_feature_constant(producer.inputs[i], features) for i in indices):
        return (f"{producer.name} has no per-feature constant to absorb the scale (norm Scale/B, or the constant "
                f"operand of a Mul, shaped [{features}])")
    if len({id(node.inputs[1]) for node in linears}) != len(linears) or any(len(node.inputs[1].uses()) != 1
                                                                             for node in linears):
        return "a weight is shared with another node"
    return ""


def _absorbing_inputs(node: ir.Node) -> list[int]:
    """Input indices whose constants take ``1 / s``: a norm's Scale and B; a Mul's one constant operand."""
    if node.op_type in NORM_OPS:
        return [index for index in (1, 2) if len(node.inputs) > index and node.inputs[index] is not None]
    constants = [index for index, value in enumerate(node.inputs[:2]) if value is not None and value.const_value is not None]
    return constants if len(constants) == 1 else []


def _per_feature_constant(value: ir.Value, features: int | None) -> bool:
    """A constant of ``features`` entries along its last axis only."""
    if value.const_value is None or features is None:
        return False
    shape = tuple(value.const_value.shape)
    return bool(shape) and shape[-1] == features and int(np.prod(shape)) == features


def _private_constant(model: ir.Model, node: ir.Node, index: int) -> ir.Value:
    """Input ``index`` of ``node``, first copied to a constant of its own if other nodes read it too.

    Exporters merge equal initializers (freshly initialized norms all have weight 1), so a norm's
    Scale can be shared by every norm of the model; only this node's copy is scaled.
    """
    value = node.inputs[index]
    if len(value.uses()) == 1:
        return value
    array = value.const_value.numpy().copy()
    private = ir.Value(name=f"{node.name}.smoothquant_{index}", shape=ir.Shape(array.shape),
                       type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), const_value=ir.tensor(array))
    model.graph.register_initializer(private)
    node.replace_input_with(index, private)
    return private


def _duplicate(model: ir.Model, norm: ir.Node) -> ir.Node:
    """A copy of ``norm`` (own Scale/B constants, one output) inserted after it, marked :data:`COPY_OF_KEY`."""
    graph = model.graph
    inputs = list(norm.inputs[:3])
    for index, suffix in ((1, "scale"), (2, "bias")):
        if len(norm.inputs) > index and norm.inputs[index] is not None:
            array = norm.inputs[index].const_value.numpy().copy()
            value = ir.Value(name=f"{norm.name}{COPY_SUFFIX}.{suffix}", shape=ir.Shape(array.shape),
                             type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), const_value=ir.tensor(array))
            graph.register_initializer(value)
            inputs[index] = value
    copy = ir.node(norm.op_type, inputs, attributes=dict(norm.attributes), domain=norm.domain,
                   name=f"{norm.name}{COPY_SUFFIX}", num_outputs=1, metadata_props={COPY_OF_KEY: norm.name})
    original = norm.outputs[0]
    output = copy.outputs[0]
    output.name, output.shape, output.type = f"{original.name}{COPY_SUFFIX}", original.shape, original.type
    graph.insert_after(norm, copy)
    return copy


def _scales(value: ir.Value, linears: list[ir.Node], tensor: TensorStats | None, alpha: float) -> np.ndarray | None:
    features = value.shape[-1]
    if tensor is None or tensor.feature_absmax.size != features:
        return None
    activation = tensor.feature_absmax.astype(np.float64)
    weight = np.max([np.abs(_weight(node).astype(np.float64)).max(axis=1) for node in linears], axis=0)
    if activation.max() <= 0 or weight.max() <= 0:
        return None
    activation = np.maximum(activation, activation.max() / MAX_SCALE_RATIO)
    weight = np.maximum(weight, weight.max() / MAX_SCALE_RATIO)
    scales = activation ** alpha / weight ** (1.0 - alpha)
    return np.clip(scales, 1.0 / MAX_SCALE_RATIO, MAX_SCALE_RATIO)


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attribute = node.attributes.get(name)
    return default if attribute is None else int(attribute.as_int())


def _scale_constant(value: ir.Value, factors: np.ndarray) -> None:
    array = value.const_value.numpy()
    value.const_value = ir.tensor((array * factors).astype(array.dtype), name=value.name)


def _scale_weight_rows(node: ir.Node, scales: np.ndarray) -> None:
    weight = node.inputs[1]
    array = weight.const_value.numpy()
    transposed = node.op_type == "Gemm" and node.attributes.get("transB") is not None and node.attributes["transB"].as_int()
    factors = scales.reshape(1, -1) if transposed else scales.reshape(-1, 1)
    weight.const_value = ir.tensor((array * factors).astype(array.dtype), name=weight.name)
