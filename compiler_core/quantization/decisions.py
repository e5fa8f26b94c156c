"""Quantization decisions: which tensors are quantized, with which width, range and parameters.

Tensors that must share parameters are grouped first (a data-movement op's output shares its
input's parameters; with the multi-layer methods 1 and 3, Concat inputs share the output's), then
each group gets one range: the hull of its members' calibrated ranges, or fixed parameters
(Softmax), or the uint8 input parameters derived from the preprocessing's normalization.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from compiler_core.errors import InternalError
from compiler_core.quantization import kernels
from compiler_core.quantization.fixedpoint import round_half_away
from compiler_core.quantization.graph import GraphView, Group, activation_bounds, is_table
from compiler_core.quantization.lowering import LoweringContext
from compiler_core.quantization.params import QuantParams, TensorQuant, params_from_range

logger = logging.getLogger(__name__)

SOURCE_NAME_KEY = "mblt.source_name"
SMOOTHED_COPY_KEY = "qb.smoothquant_copy_of"
"""A SmoothQuant norm copy (see smoothquant.py) feeds int8 MatMuls: int16 patterns do not widen it."""


@dataclass
class DecisionOptions:
    """What the CompileConfig says about activations.

    Attributes:
        symmetric: methods 0/1 (symmetric) vs 2/3 (zero point).
        multi_layer: methods 1/3: share ranges across Concat inputs and output.
        int16_layer: predicate on (node name, source name) for int16 activations.
        input_params: fixed parameters for model inputs (uint8 input).
        output_headroom: factor on the calibrated range of the model's output tensors (see :func:`output_head`).
        output_bits: activation width of the output tensors (at least their layer's own width).
        model_outputs: the whole model's output names when the graph is a CPU-offload body (its other
            outputs feed the CPU tail, which reads them again: they get no headroom); ``None``: all.
        signal_rms: root mean square of each tensor's calibration values; it caps the output headroom
            (see :func:`headroom_factor`). A tensor without an entry gets the full headroom.
        residual_bits: activation width of the residual-branch outputs (see :func:`residual_branches`).
        residual_scales: ``channel``: 8-bit residual-branch outputs of MatMul/Gemm layers get one scale per
            output feature (see :func:`per_channel_residuals`); ``tensor``: one scale.
        feature_absmax: calibrated max |x| per feature (last axis) by tensor, for ``residual_scales``.
        int16_headroom: factor on the calibrated range of every int16 activation tensor (at least the
            output headroom where that applies): 16 bits leave resolution to spare for inputs unlike the
            calibration set.
        activation_scales: ``channel``: 8-bit feature maps between convolutions and look-up tables get one
            scale per channel (see :func:`per_channel_feature_maps`); ``tensor``: one scale.
        channel_ranges: calibrated per-channel (axis 1) minima and maxima by tensor, for ``activation_scales``.
    """

    symmetric: bool = True
    multi_layer: bool = False
    int16_layer: Callable[[str, str], bool] = lambda name, source: False
    input_params: dict[str, QuantParams] = field(default_factory=dict)
    output_headroom: float = 1.0
    output_bits: int = 8
    model_outputs: frozenset[str] | None = None
    signal_rms: Mapping[str, float] = field(default_factory=dict)
    residual_bits: int = 8
    int16_headroom: float = 1.0
    residual_scales: str = "tensor"
    feature_absmax: Mapping[str, np.ndarray] = field(default_factory=dict)
    activation_scales: str = "tensor"
    channel_ranges: Mapping[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


OUTPUT_MIN_SQNR_DB = 25.0
"""Headroom may coarsen an output's step only while its own rounding noise stays this far below its RMS."""


def headroom_factor(low: float, high: float, bits: int, rms: float | None, headroom: float, symmetric: bool) -> float:
    """The output headroom for one tensor: ``headroom``, reduced where it would drown the values in rounding noise.

    Widening a range by ``h`` multiplies the step by ``h``. An output whose values mostly sit in a
    narrow band far inside its range (class logits over thousands of classes: a few peaks, the rest
    near zero; ddddocr_rec's RMS is 1/22 of its range) loses most of its resolution that way, while
    regressions and landmarks, whose values fill their range, can afford it. The factor is the
    largest ``h <= headroom`` (and at least 1) for which the uniform rounding noise ``step**2 / 12``
    stays :data:`OUTPUT_MIN_SQNR_DB` below the tensor's mean square.
    """
    width = 2 * max(abs(low), abs(high)) if symmetric else high - low
    if headroom <= 1.0 or rms is None or not rms > 0 or not width > 0:
        return headroom
    limit = rms * ((1 << bits) - 1) * math.sqrt(12 / 10 ** (OUTPUT_MIN_SQNR_DB / 10)) / width
    return float(min(headroom, max(1.0, limit)))


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, name: str) -> str:
        self.parent.setdefault(name, name)
        while self.parent[name] != name:
            self.parent[name] = self.parent[self.parent[name]]
            name = self.parent[name]
        return name

    def union(self, first: str, second: str) -> None:
        self.parent[self.find(first)] = self.find(second)


def decide(view: GraphView, groups: list[Group], ranges: Mapping[str, tuple[float, float]],
           options: DecisionOptions, tensors_bits: Mapping[str, int]) -> dict[str, TensorQuant]:
    """Freeze the parameters of every quantized tensor.

    Args:
        view: the MBLT.
        groups: fused operation groups, in order.
        ranges: calibrated float range per tensor (from the observers).
        options: method-level choices.
        tensors_bits: activation width per tensor (8 or 16), from :func:`activation_bits`.
    """
    kernels.load_all()
    records = {name: TensorQuant(name, bits=bits) for name, bits in tensors_bits.items()}
    context = LoweringContext(view, records)
    sets, fixed = _UnionFind(), {}
    for name in records:
        sets.find(name)
    masked: set[str] = set()
    for group in groups:
        _link_group(group, context, sets, fixed, options)
        _link_masked(group, context, sets, ranges, masked)
    for name in masked:
        records[name].extra["masked"] = True  # the Softmax reading it counts its smallest code as -inf
    head = output_head(view, groups, options.model_outputs) if options.output_headroom != 1.0 else set()
    for name, record in records.items():
        if name in ranges and name not in masked:
            low, high = ranges[name]
            factor = headroom_factor(low, high, record.bits, options.signal_rms.get(name), options.output_headroom,
                                     options.symmetric) if name in head else 1.0
            if name in head and factor < options.output_headroom:
                logger.info("Output headroom of %s: %.2f instead of %.2f (values narrow for their range)", name,
                            factor, options.output_headroom)
            if record.bits == 16:
                factor = max(factor, options.int16_headroom)
            record.calibrate(low * factor, high * factor, source="observer")
    for name in _empty_tensors(view, set(records) - set(ranges)):
        records[name].calibrate(0.0, 0.0, source="empty tensor")  # no values, so no range to observe
    _freeze_sets(records, sets, fixed, options)
    if options.residual_scales == "channel":
        per_channel_residuals(view, groups, records, options, excluded=head | masked | set(fixed) | _grouped(sets))
    if options.activation_scales == "channel":
        per_channel_feature_maps(view, groups, records, options, excluded=head | masked | set(fixed) | _grouped(sets))
    return records


def _empty_tensors(view: GraphView, names: set[str]) -> list[str]:
    """The tensors among ``names`` with no elements (a dimension of 0): calibration never sees a value of them."""
    if not names:
        return []
    values = [*view.graph.inputs, *(output for node in view.nodes for output in node.outputs)]
    return [value.name for value in values
            if value.name in names and value.shape is not None and any(dim == 0 for dim in value.shape)]


def _grouped(sets: _UnionFind) -> set[str]:
    """Tensors that share their parameters with another tensor."""
    members: dict[str, list[str]] = {}
    for name in list(sets.parent):
        members.setdefault(sets.find(name), []).append(name)
    return {name for names in members.values() if len(names) > 1 for name in names}


RESIDUAL_CHANNEL_FLOOR = 2.0 ** -10
"""A feature's range is at least this share of the widest feature's: a dead feature would ask for any scale,
and this keeps the per-channel requantization multipliers within ten bits of each other."""


def per_channel_residuals(view: GraphView, groups: list[Group], records: dict[str, TensorQuant],
                          options: DecisionOptions, excluded: set[str] = frozenset()) -> list[str]:
    """Give per-feature 8-bit scales to the residual-branch outputs of MatMul/Gemm layers; returns their names.

    The attention-output and FFN-down projections of a transformer carry the residual stream's outlier
    features (MiniLM's FFN-down outputs: 40-210x the median feature), which one 8-bit scale cannot hold
    without rounding the other features to a few codes. Scale ``c`` is the feature's calibrated max |x|
    over 127 (zero point 0). It costs no extra operation: the producing layer already requantizes per
    output channel (its multiplier ``s_x * s_w[c] / s_y[c]``), and the residual Add rescales each operand
    anyway (one multiplier per feature for this operand instead of one). Per-embedding-group quantization
    of the same tensors (Bondarenko et al., "Understanding and Overcoming the Challenges of Efficient
    Transformer Quantization", 2021) with one group per feature.

    A tensor qualifies when it is 8-bit, its own parameters (not shared, not fixed, not in the output
    head: ``excluded``), produced by a MatMul/Gemm group without a clamping activation, read only by
    Add/Sub of two run-time tensors over its full last axis, and has per-feature statistics.
    """
    producer = {group.output.name: group for group in groups}
    main_of = {id(group.main) for group in groups}
    chosen = []
    for name in sorted(residual_branches(view) - set(excluded)):
        record, group = records.get(name), producer.get(name)
        features = np.asarray(options.feature_absmax.get(name, np.zeros(0)), dtype=np.float64)
        if record is None or record.bits != 8 or group is None or not _per_channel_producer(view, group):
            continue
        value = group.output
        if features.size != view.shape(value)[-1] or not features.max() > 0 or not _per_channel_readers(
                view, value, main_of):
            continue
        widest = float(features.max())
        scale = np.maximum(features, widest * RESIDUAL_CHANNEL_FLOOR) / record.params.qmax
        record.freeze(QuantParams(scale, np.zeros(scale.shape, dtype=np.int64), bits=8, signed=True,
                                  axis=len(view.shape(value)) - 1), source="observer, per feature (residual branch)")
        chosen.append(name)
    if chosen:
        logger.info("Per-feature int8 scales for %d residual-branch output(s) (bit.residualScales channel)",
                    len(chosen))
    return chosen


def _per_channel_producer(view: GraphView, group: Group) -> bool:
    """A MatMul/Gemm with constant weights whose output channels are the last axis, with no clamp fused."""
    main = group.main
    if main.op_type not in ("MatMul", "Gemm") or len(main.inputs) < 2 or not view.is_const(main.inputs[1]):
        return False
    low, high = activation_bounds(view, group)
    return not (np.isfinite(low) or np.isfinite(high)) and len(view.shape(group.output)) >= 2


def _per_channel_readers(view: GraphView, value, main_of: set[int]) -> bool:
    """Every reader is the main node of an Add/Sub of two run-time tensors whose output keeps the last axis."""
    readers = view.consumers(value)
    for node in readers:
        if node.op_type not in ("Add", "Sub") or id(node) not in main_of or any(view.is_const(v) for v in node.inputs):
            return False
        if view.shape(node.outputs[0])[-1:] != view.shape(value)[-1:]:
            return False
    return bool(readers)


def per_channel_feature_maps(view: GraphView, groups: list[Group], records: dict[str, TensorQuant],
                             options: DecisionOptions, excluded: set[str] = frozenset()) -> list[str]:
    """Give per-channel 8-bit scales to the feature maps between convolutions and look-up tables; returns their names.

    A mobile backbone's pointwise convolution can leave a few channels 10-20x wider than the median one
    (PP-OCR det's Conv_2 / HardSwish_1: 306 / 163 against 25 / 10); one 8-bit scale sized for them leaves
    the others a handful of codes, and the depthwise convolution that reads them amplifies that rounding.
    Channel ``c`` gets its own calibrated range, cut to the tensor's own frozen range (a channel never reaches
    past the per-tensor parameters; a held-out value past its channel's calibrated range is clipped, as one past
    the tensor's range is with per-tensor parameters). It costs no extra operation: a Conv producer already
    requantizes per output channel (``s_x * s_w[c] / s_y[c]``), a look-up-table producer or reader holds
    one table per channel (``[C, 256]``), and a reading convolution folds the input scales into its
    weights before they are quantized per output channel (as for a uint8 image input).

    A tensor qualifies when it is 8-bit, 4-D, its own parameters (not shared, fixed or in the output head:
    ``excluded``), has per-channel statistics on axis 1 and more than one pixel, is produced by a Conv
    without a clamping activation or by a look-up table with an 8-bit input, and every reader is a Conv (data input) or a look-up table. With the
    asymmetric methods (2/3) each channel gets its own zero point too.
    """
    main_of = {id(group.main): group for group in groups}
    chosen = []
    for group in groups:
        value = group.output
        name, record = value.name, records.get(value.name)
        ranges = options.channel_ranges.get(name)
        shape = view.shape(value) if value is not None else None
        if (record is None or record.bits != 8 or record.params is None or name in excluded or ranges is None
                or shape is None or len(shape) != 4 or shape[2] * shape[3] <= 1 or np.size(ranges[1]) != shape[1]
                or value.is_graph_output()):
            continue
        producer = _channel_producer(view, group, records)
        if producer is None or not _channel_readers(view, value, main_of):
            continue
        params = _channel_params(record.params, ranges, symmetric=options.symmetric)
        if params is not None:
            record.freeze(params, source="observer, per channel (feature map)")
            chosen.append(name)
    if chosen:
        logger.info("Per-channel int8 scales for %d feature map(s) (bit.activationScales channel)", len(chosen))
    return chosen


def _channel_producer(view: GraphView, group: Group, records: dict[str, TensorQuant]) -> str | None:
    """``conv`` (a Conv with constant weights and no clamp), ``lut`` (a look-up table of an 8-bit input), else None."""
    main = group.main
    if main.op_type == "Conv" and len(main.inputs) > 1 and view.is_const(main.inputs[1]):
        low, high = activation_bounds(view, group)
        return "conv" if not (np.isfinite(low) or np.isfinite(high)) else None
    source = records.get(main.inputs[0].name) if main.inputs and main.inputs[0] is not None else None
    if is_table(main) and source is not None and source.bits == 8:
        return "lut"
    return None


def _channel_readers(view: GraphView, value, main_of: dict[int, Group]) -> bool:
    """Every reader is the main node of a Conv (reading ``value`` as its data input) or of a look-up table."""
    readers = view.consumers(value)
    for node in readers:
        group = main_of.get(id(node))
        if group is None or not node.inputs or node.inputs[0] is not value or any(
                v is value for v in node.inputs[1:]):
            return False
        is_conv = node.op_type == "Conv" and len(node.inputs) > 1 and view.is_const(node.inputs[1])
        if not is_conv and not is_table(node):
            return False
    return bool(readers)


def _channel_params(tensor: QuantParams, ranges: tuple[np.ndarray, np.ndarray], *, symmetric: bool) -> QuantParams | None:
    """Per-channel parameters over each channel's calibrated range, cut to the tensor's own frozen range."""
    scale, zero = float(np.asarray(tensor.scale)), int(np.asarray(tensor.zero_point))
    low_t, high_t = scale * (tensor.qmin - zero), scale * (tensor.qmax - zero)
    low = np.clip(np.minimum(np.asarray(ranges[0], dtype=np.float64), 0.0), low_t, 0.0)
    high = np.clip(np.maximum(np.asarray(ranges[1], dtype=np.float64), 0.0), 0.0, high_t)
    if symmetric:
        extent = np.maximum(-low, high)
        extent = np.maximum(extent, extent.max() * RESIDUAL_CHANNEL_FLOOR)
        if not extent.max() > 0:
            return None
        return QuantParams(extent / tensor.qmax, np.zeros(extent.shape, dtype=np.int64), bits=8, signed=True, axis=1)
    width = high - low
    width = np.maximum(width, width.max() * RESIDUAL_CHANNEL_FLOOR)
    if not width.max() > 0:
        return None
    channel_scale = width / (tensor.qmax - tensor.qmin)
    zero_point = np.clip(round_half_away(tensor.qmin - low / channel_scale), tensor.qmin, tensor.qmax)
    return QuantParams(channel_scale, zero_point.astype(np.int64), bits=8, signed=True, axis=1)


def _link_group(group: Group, context: LoweringContext, sets: _UnionFind, fixed: dict, options) -> None:
    outputs = [v for v in group.outputs if v.name in context.tensors]
    if not outputs:
        return
    spec = kernels.spec_for(group.main.op_type)
    policy = spec.policy(group, context) if spec else kernels.OBSERVE
    if policy == kernels.SAME_AS_INPUT and group.main.inputs[0].name in context.tensors:
        for value in outputs:
            sets.union(value.name, group.main.inputs[0].name)
    elif policy == kernels.FIXED and spec.fixed_params is not None:
        fixed[outputs[0].name] = lambda observed: spec.fixed_params(group, context, observed)
    elif group.main.op_type == "Concat" and options.multi_layer:
        for value in group.main.inputs:
            if value.name in context.tensors:
                sets.union(value.name, outputs[0].name)


INFINITE_LIKE = 1e30
"""Values this large (e.g. -3.4e38 attention masks) act as infinities: they saturate."""


def _is_infinite_like(value, context: LoweringContext, ranges: Mapping) -> bool:
    const = context.view.const(value)
    if const is not None:
        return const.size > 0 and float(np.abs(const).max()) >= INFINITE_LIKE
    return max(map(abs, ranges.get(value.name, (0.0, 0.0)))) >= INFINITE_LIKE


def _link_masked(group: Group, context: LoweringContext, sets: _UnionFind, ranges: Mapping, masked: set) -> None:
    """Masking keeps the data's parameters; the -inf-like entries saturate to the smallest code.

    ``x + mask`` (mask of 0 / -3.4e38, constant or computed) and ``Where(c, x, -3.4e38)``
    (masked_fill): the output joins the data operand's set and its own range, which reaches
    -3.4e38, is ignored; its record's ``extra["masked"]`` is set (the Softmax's ``masked_code``).
    """
    main = group.main
    if group.fused or group.output.name not in context.tensors:
        return
    if main.op_type in ("Add", "Sub"):
        operands = [v for v in main.inputs[:2] if v is not None]
    elif main.op_type == "Where":
        operands = [v for v in main.inputs[1:3] if v is not None]
    else:
        return
    huge = [v for v in operands if _is_infinite_like(v, context, ranges)]
    normal = [v for v in operands if v not in huge and v.name in context.tensors]
    if len(huge) == 1 and len(normal) == 1:
        sets.union(group.output.name, normal[0].name)
        masked.add(group.output.name)


def _freeze_sets(records: dict[str, TensorQuant], sets: _UnionFind, fixed: dict, options: DecisionOptions) -> None:
    members: dict[str, list[str]] = {}
    for name in records:
        members.setdefault(sets.find(name), []).append(name)
    for names in members.values():
        params, source = _set_params(names, records, fixed, options)
        for name in names:
            records[name].freeze(params, source=source if len(names) == 1 else f"{source}, shared by {len(names)}")


def _set_params(names: list[str], records: dict[str, TensorQuant], fixed: dict, options: DecisionOptions):
    observed = [records[n].observed_range for n in names if records[n].observed_range is not None]
    for name in names:
        if name in fixed:
            joint = (min(r[0] for r in observed), max(r[1] for r in observed)) if observed else None
            return fixed[name](joint), f"fixed by {name}"
        if name in options.input_params:
            return options.input_params[name], "uint8 input"
    if not observed:
        raise InternalError(f"No calibration range for tensor(s) {', '.join(names[:3])}.",
                            hint="Please report this: statistics did not cover every quantized tensor.")
    low, high = min(r[0] for r in observed), max(r[1] for r in observed)
    bits = max(records[n].bits for n in names)
    return params_from_range(low, high, bits=bits, symmetric=options.symmetric), "observer"


def quantized_tensors(view: GraphView, groups: list[Group]) -> list[str]:
    """Run-time float tensors that get codes: float graph inputs and every group's float outputs."""
    names = [value.name for value in view.graph.inputs if view.is_float(value)]
    for group in groups:
        names.extend(value.name for value in group.outputs if view.is_float(value))
    return names


BOUNDED_OUTPUT_OPS = {"Sigmoid", "Tanh", "Softmax", "HardSigmoid"}
"""Ops whose output range is bounded by the function itself: no headroom (their output leaves the head)."""
OUTPUT_HEAD_OPS = {"Concat"}
"""Besides data movement (ops that keep their input's parameters), ops an output's range reaches back through."""


def output_head(view: GraphView, groups: list[Group], model_outputs: frozenset[str] | None = None) -> set[str]:
    """The model's float output tensors and the tensors that reach them only through data movement or Concat.

    Nothing inside the model reads a clipped output value again, so an output range can trade
    resolution for headroom: inputs unlike the calibration set (a larger face, a box further off
    centre) push final logits and regressions past the calibrated maximum, and clipping there costs
    far more than a coarser step. Tensors that share an output's parameters (a Reshape's input) or
    feed its Concat get the same treatment, so the widened range is not clipped one op earlier, as
    long as nothing outside the head reads them too (a streaming model's state cache: the Concat
    that makes the next cache also feeds the next layer, whose input must keep its resolution).
    """
    kernels.load_all()
    context = LoweringContext(view, {})
    producer = {value.name: group for group in groups for value in group.outputs}
    head = {value.name for value in view.graph.outputs
            if view.is_float(value) and (model_outputs is None or value.name in model_outputs)}
    pending = list(head)
    while pending:
        group = producer.get(pending.pop())
        if group is None:
            continue
        if group.main.op_type in BOUNDED_OUTPUT_OPS:
            head.discard(group.output.name)
            continue
        if not _passes_range_back(group, context):
            continue
        for value in group.main.inputs:
            if view.is_float(value) and not view.is_const(value) and value.name not in head:
                head.add(value.name)
                pending.append(value.name)
    return _read_only_by_the_head(view, groups, head, context)


def _passes_range_back(group: Group, context: LoweringContext) -> bool:
    """Data movement (keeps its input's parameters) and Concat: an output's range reaches back through them."""
    if group.main.op_type in OUTPUT_HEAD_OPS:
        return True
    spec = kernels.spec_for(group.main.op_type)
    return spec is not None and not group.fused and spec.policy(group, context) == kernels.SAME_AS_INPUT


def _read_only_by_the_head(view: GraphView, groups: list[Group], head: set[str], context: LoweringContext) -> set[str]:
    """Drop head tensors that an op outside the head also reads (a streaming cache's Concat feeds the next
    layer too), and the data-movement outputs that share parameters with a dropped tensor, until stable."""
    values = {value.name: value for value in view.graph.inputs}
    values.update((value.name, value) for group in groups for value in group.outputs)
    group_of = {id(node): group for group in groups for node in group.nodes}
    producer = {value.name: group for group in groups for value in group.outputs}
    changed = True
    while changed:
        changed = False
        for name in sorted(head):
            if _read_outside(view, values.get(name), group_of, head, context) or _shares_with_dropped(producer.get(name),
                                                                                            head, view, context):
                head.discard(name)
                changed = True
    return head


def _read_outside(view: GraphView, value, group_of: dict, head: set[str], context: LoweringContext) -> bool:
    """An op other than a head data movement / Concat reads ``value`` (a layer computing from it)."""
    if value is None:
        return False
    for node in view.consumers(value):
        group = group_of.get(id(node))
        if group is None or not _passes_range_back(group, context) or not any(o.name in head for o in group.outputs):
            return True
    return False


def _shares_with_dropped(group: Group | None, head: set[str], view: GraphView, context: LoweringContext) -> bool:
    """A data-movement output keeps its input's parameters: it leaves the head with its input."""
    if group is None or group.fused:
        return False
    spec = kernels.spec_for(group.main.op_type)
    if spec is None or spec.policy(group, context) != kernels.SAME_AS_INPUT:
        return False
    source = group.main.inputs[0]
    return source is not None and view.is_float(source) and not view.is_const(source) and source.name not in head


WIDENED_INPUT_OPS = {"Softmax", "LayerNormalization"}
"""int16 Softmax/LayerNorm also get int16 inputs: their input ranges are the ones int8 cannot hold."""


def activation_bits(view: GraphView, groups: list[Group], options: DecisionOptions) -> dict[str, int]:
    """8 or 16 bits per quantized tensor.

    A layer (an NPU operation, named after its main MBLT node; its source name counts too) that
    matches an int16 pattern gets int16 outputs; matched Softmax/LayerNorm layers widen their input,
    and so does any matched layer that reads a float model input directly (an 8-bit per-tensor input
    is coarser than the pixel step of a per-channel normalized image: PP-OCR det 0.978 -> 0.988).
    A uint8 input (``uint8Input``) keeps its fixed 8-bit parameters.
    The output head (:func:`output_head`) gets ``options.output_bits``, the residual branches
    (:func:`residual_branches`) ``options.residual_bits``.
    """
    bits = {name: 8 for name in quantized_tensors(view, groups)}
    inputs = {value.name for value in view.graph.inputs}
    if options.output_bits > 8:
        for name in output_head(view, groups, options.model_outputs) & set(bits):
            bits[name] = options.output_bits
    if options.residual_bits > 8:
        for name in residual_branches(view) & set(bits):
            bits[name] = options.residual_bits
    for group in groups:
        main = group.main
        if main.metadata_props.get(SMOOTHED_COPY_KEY) or not options.int16_layer(
                main.name, main.metadata_props.get(SOURCE_NAME_KEY, "")):
            continue
        widened = list(group.outputs) + (list(main.inputs[:1]) if main.op_type in WIDENED_INPUT_OPS else [])
        widened += [value for value in main.inputs
                    if value is not None and value.name in inputs and value.name not in options.input_params]
        for value in widened:
            if value.name in bits:
                bits[value.name] = 16
    return bits


NORM_OPS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"})
LINEAR_OPS = frozenset({"MatMul", "Gemm", "Conv"})


def residual_branches(view: GraphView) -> set[str]:
    """Outputs of linear layers (constant weights) that a residual Add sums into a stream read by a norm.

    A residual Add adds two computed tensors and feeds a normalization (post-norm "Add & Norm", or the
    pre-norm stream that the next norm reads). Its inputs produced by a MatMul/Gemm/Conv (with the bias
    Add that follows it, when there is one) are the branch outputs: attention output projections and
    FFN down-projections, whose few outlier channels match the residual stream's.
    """
    names = set()
    for node in view.nodes:
        if node.op_type != "Add" or len(node.inputs) != 2 or any(view.is_const(v) for v in node.inputs):
            continue
        if not any(user.op_type in NORM_OPS for user in view.consumers(node.outputs[0])):
            continue
        for value in node.inputs:
            if _is_linear_output(view, value):
                names.add(value.name)
    return names


def _is_linear_output(view: GraphView, value) -> bool:
    producer = value.producer()
    if producer is not None and producer.op_type == "Add" and any(view.is_const(v) for v in producer.inputs):
        producer = next((v.producer() for v in producer.inputs if not view.is_const(v)), None)
    return (producer is not None and producer.op_type in LINEAR_OPS and len(producer.inputs) > 1
            and producer.inputs[1] is not None and view.is_const(producer.inputs[1]))


def uint8_input_params(mean: list[float], std: list[float], scale: float, channels: int) -> QuantParams:
    """Parameters under which raw uint8 pixels ``p`` dequantize to ``(p * scale - mean) / std``.

    Per channel: ``real = (scale / std) * (p - mean / scale)`` -> scale ``scale/std``, zero point
    ``round(mean / scale)``. The zero point is rounded, which shifts the input by at most half a
    pixel step; docs/numerics.md states it.
    """
    mean_array = np.broadcast_to(np.asarray(mean, dtype=np.float64), (channels,))
    std_array = np.broadcast_to(np.asarray(std, dtype=np.float64), (channels,))
    zero_point = round_half_away(mean_array / scale)
    return QuantParams(scale / std_array, zero_point, bits=8, signed=False, axis=1)
