"""Per-layer sensitivity analysis: which layers lose the accuracy, and which would gain from int16.

For every layer (one integer operation of the program, plus each float model input) two kinds of
variant are measured on a few samples, against the FP32 model:

- **alone**: only this layer's output (``activation``) or only its weights (``weights``) quantized
  as the config says, everything else FP32: the noise this layer injects by itself;
- **kept16**: everything quantized as the config says except this layer, whose output and weights
  get 16 bits: what promoting this one layer to int16 buys.

All variants run through one onnxruntime *proxy* model built once: every quantized tensor ``x`` is
replaced by ``k * x + g8 * dq8(x) + g16 * dq16(x)`` (``dq`` a QuantizeLinear/DequantizeLinear pair
with the tensor's frozen parameters, and 16-bit parameters over the same range), every weight by
``k * w + g8 * w8 + g16 * w16``; the switches ``k, g8, g16`` are elements of one extra graph input,
so a variant is a different feed, not a different model. This is fake quantization (float kernels
between the quantization points), not the bit-exact integer program; docs/accuracy.md reports how
its ranking compares with the bit-exact simulator's. The weights of the proxy are quantized per
output channel over their max |w| (as the lowering does), without bias correction.

Each row also carries the layer's quantization point: its range, scale and bits, the fraction of
FP32 values on the samples that fall outside the range (clipping ratio) and the RMS error of
quantizing the FP32 tensor alone divided by the scale (about 0.29 for pure rounding noise; larger
means clipping).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from compiler_core.analysis.metrics import TensorComparison, at_tokens, token_positions
from compiler_core.progress import Reporter, as_reporter
from compiler_core.quantization.params import QuantParams, params_from_range
from compiler_core.quantization.program import QuantizedModel

logger = logging.getLogger(__name__)

MASK_INPUT = "qb_sensitivity_mask"
DEFAULT_SAMPLES = 2
STATISTICS_GROUP = 8
"""Tensors fetched per onnxruntime run for the clipping statistics (all at once held PP-OCR det's 640x640
activations of every layer, and onnxruntime's buffers for them, in memory at the same time)."""
WEIGHT_KINDS = {"linear"}


@dataclass
class Layer:
    """One layer of the analysis: the tensors it writes and, for linear layers, the node whose weights it owns."""

    name: str
    op_type: str
    precision: str
    tensors: list[str]
    weight_node: str | None = None


@dataclass
class _Slots:
    """Positions of a tensor's or weight's three switches (keep float, quantized as configured, 16 bits)."""

    keep: int
    low: int
    high: int


@dataclass
class ProxyModel:
    """The switchable fake-quantization model and where each switch lives in its mask input."""

    proto: bytes
    layers: list[Layer]
    tensor_slots: dict[str, _Slots]
    weight_slots: dict[str, _Slots]
    size: int
    outputs: list[str]
    inputs: list[str]
    params: dict[str, QuantParams] = field(default_factory=dict)

    def mask(self, low: Iterable[str] = (), high: Iterable[str] = (), weights_low: Iterable[str] = ()) -> np.ndarray:
        """The mask that quantizes the named tensors and weight nodes; everything not named stays float.

        ``low``: tensors quantized as configured; ``high``: tensors at 16 bits over the same range;
        ``weights_low``: weight nodes at 8 bits (16-bit weights are taken as float).
        """
        mask = np.zeros(self.size, dtype=np.float32)
        for slots in self.tensor_slots.values():
            mask[slots.keep] = 1.0
        for name in low:
            mask[self.tensor_slots[name].keep] = 0.0
        for name in high:
            mask[self.tensor_slots[name].keep] = 0.0
            mask[self.tensor_slots[name].high] = 1.0
        for name in weights_low:
            mask[self.weight_slots[name].low] = 1.0
        return mask

    def all_low(self, except_layer: Layer | None = None) -> np.ndarray:
        """Everything quantized as configured; ``except_layer`` (if given) at 16 bits."""
        skip = set(except_layer.tensors) if except_layer else set()
        skip_weight = except_layer.weight_node if except_layer else None
        return self.mask(low=[t for t in self.tensor_slots if t not in skip],
                         high=[t for t in skip if t in self.tensor_slots],
                         weights_low=[w for w in self.weight_slots if w != skip_weight])


def analysis_layers(model: QuantizedModel) -> list[Layer]:
    """The layers of ``model`` that own a quantization point (float inputs, op outputs) or weights."""
    layers = [Layer(f"input:{spec.name}", "input", f"a{model.tensors[spec.name].bits}", [spec.name])
              for spec in model.inputs if spec.name in model.tensors]
    for op in model.ops:
        tensors = [name for name in op.outputs if name in model.tensors]
        weight = op.name if op.kind in WEIGHT_KINDS and "weight" in op.consts else None
        if tensors or weight:
            layers.append(Layer(op.name, op.op_type, op.precision, tensors, weight))
    return layers


def build_proxy(float_model: ir.Model, model: QuantizedModel) -> ProxyModel:
    """The switchable fake-quantization model of ``model`` over its float graph ``float_model`` (left unchanged)."""
    copy = ir.serde.deserialize_model(ir.serde.serialize_model(float_model))
    graph = copy.graph
    layers = analysis_layers(model)
    mask = ir.Value(name=MASK_INPUT, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([0]))
    graph.inputs.append(mask)
    counter = _Counter()
    values = _values_by_name(graph)
    nodes = {node.name: node for node in graph}
    tensor_slots, weight_slots, params = {}, {}, {}
    for layer in layers:
        for name in layer.tensors:
            if name in values and name not in tensor_slots:
                params[name] = model.params(name)
                tensor_slots[name] = _switch_activation(graph, values[name], params[name], mask, counter)
        node = nodes.get(layer.weight_node) if layer.weight_node else None
        if node is not None and len(node.inputs) > 1 and node.inputs[1] is not None and \
                node.inputs[1].const_value is not None and node.op_type in ("Conv", "Gemm", "MatMul", "ConvTranspose"):
            weight_slots[layer.weight_node] = _switch_weight(graph, node, mask, counter)
        elif layer.weight_node:
            layer.weight_node = None
    mask.shape = ir.Shape([counter.value])
    graph.sort()
    proto = ir.to_proto(copy).SerializeToString()
    return ProxyModel(proto, layers, tensor_slots, weight_slots, counter.value,
                      [v.name for v in graph.outputs], [v.name for v in graph.inputs if v.name != MASK_INPUT], params)


class _Counter:
    def __init__(self) -> None:
        self.value = 0

    def take(self) -> int:
        self.value += 1
        return self.value - 1


def _values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {value.name: value for value in graph.inputs}
    for node in graph:
        for value in node.outputs:
            values[value.name] = value
    return values


def _constant(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=ir.tensor(array, name=name))
    graph.register_initializer(value)
    return value


def _switch(graph: ir.Graph, mask: ir.Value, index: int, prefix: str) -> ir.Value:
    position = _constant(graph, f"{prefix}.index", np.asarray(index, dtype=np.int64))
    node = ir.node("Gather", [mask, position], name=f"{prefix}.switch")
    node.outputs[0].name = f"{prefix}.switch_value"
    graph.append(node)
    return node.outputs[0]


def _sixteen_bit(params: QuantParams) -> QuantParams:
    """16-bit parameters over the range of ``params`` (per-channel parameters keep their own)."""
    if params.axis is not None or params.bits >= 16:
        return params
    scale, zero_point = float(np.asarray(params.scale)), int(np.asarray(params.zero_point))
    low, high = scale * (params.qmin - zero_point), scale * (params.qmax - zero_point)
    return params_from_range(low, high, bits=16, symmetric=zero_point == 0 or low >= 0)


def _fake_quant(graph: ir.Graph, value: ir.Value, params: QuantParams, prefix: str) -> ir.Value:
    scale = _constant(graph, f"{prefix}.scale", np.asarray(params.scale, dtype=np.float32))
    zero = _constant(graph, f"{prefix}.zero_point", np.asarray(params.zero_point).astype(params.dtype))
    axis = {"axis": params.axis} if params.axis is not None else {}
    quantize = ir.node("QuantizeLinear", [value, scale, zero], attributes=axis, name=f"{prefix}.quantize")
    dequantize = ir.node("DequantizeLinear", [quantize.outputs[0], scale, zero], attributes=axis,
                         name=f"{prefix}.dequantize")
    quantize.outputs[0].name, dequantize.outputs[0].name = f"{prefix}.codes", f"{prefix}.dq"
    graph.extend([quantize, dequantize])
    return dequantize.outputs[0]


def _mix(graph: ir.Graph, terms: Sequence[tuple[ir.Value, ir.Value]], prefix: str) -> ir.Value:
    """``sum(switch * value)`` over ``terms`` of ``(value, switch)``."""
    total = None
    for position, (value, switch) in enumerate(terms):
        product = ir.node("Mul", [value, switch], name=f"{prefix}.mul{position}")
        product.outputs[0].name = f"{prefix}.term{position}"
        graph.append(product)
        if total is None:
            total = product.outputs[0]
            continue
        add = ir.node("Add", [total, product.outputs[0]], name=f"{prefix}.add{position}")
        add.outputs[0].name = f"{prefix}.sum{position}"
        graph.append(add)
        total = add.outputs[0]
    return total


def _flag(graph: ir.Graph, mask: ir.Value, index: int, prefix: str) -> ir.Value:
    """The boolean switch ``mask[index] > 0.5`` (a scalar)."""
    switch = _switch(graph, mask, index, prefix)
    half = _constant(graph, f"{prefix}.half", np.asarray(0.5, dtype=np.float32))
    node = ir.node("Greater", [switch, half], name=f"{prefix}.flag")
    node.outputs[0].name = f"{prefix}.flag_value"
    graph.append(node)
    return node.outputs[0]


def _where(graph: ir.Graph, flag: ir.Value, first: ir.Value, second: ir.Value, name: str) -> ir.Value:
    node = ir.node("Where", [flag, first, second], name=name)
    node.outputs[0].name = f"{name}_value"
    graph.append(node)
    return node.outputs[0]


def _switch_activation(graph: ir.Graph, value: ir.Value, params: QuantParams, mask: ir.Value,
                       counter: _Counter) -> _Slots:
    """``x`` -> ``keep ? x : (high ? dq16(x) : dq8(x))`` for every reader of ``x``."""
    prefix = f"{value.name}.sens"
    uses = list(value.uses())
    slots = _Slots(counter.take(), -1, counter.take())
    low = _fake_quant(graph, value, params, f"{prefix}.q8")
    high = _fake_quant(graph, value, _sixteen_bit(params), f"{prefix}.q16")
    quantized = _where(graph, _flag(graph, mask, slots.high, f"{prefix}.h"), high, low, f"{prefix}.select")
    mixed = _where(graph, _flag(graph, mask, slots.keep, f"{prefix}.k"), value, quantized, f"{prefix}.mix")
    if value.is_graph_output():
        position = list(graph.outputs).index(value)
        name = value.name
        value.name = f"{name}.float"
        mixed.name = name
        mixed.shape, mixed.type = value.shape, value.type
        graph.outputs[position] = mixed
    for node, index in uses:
        node.replace_input_with(index, mixed)
    return slots


def _weight_axis(node: ir.Node) -> int:
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm" and "transB" in node.attributes and node.attributes["transB"].as_int():
        return 0
    return -1


def quantize_weight(weight: np.ndarray, axis: int, bits: int) -> np.ndarray:
    """Symmetric per-output-channel fake quantization over max |w| (round half away from zero)."""
    moved = np.moveaxis(weight.astype(np.float64), axis, 0)
    flat = moved.reshape(moved.shape[0], -1)
    qmax = 2 ** (bits - 1) - 1
    scale = np.abs(flat).max(axis=1, keepdims=True) / qmax
    scale[scale == 0] = 1.0
    scaled = flat / scale
    codes = np.clip(np.sign(scaled) * np.floor(np.abs(scaled) + 0.5), -qmax, qmax)
    return np.moveaxis((codes * scale).reshape(moved.shape), 0, axis).astype(weight.dtype)


def _switch_weight(graph: ir.Graph, node: ir.Node, mask: ir.Value, counter: _Counter) -> _Slots:
    """``y = op(x, w)`` -> ``y + low * op(x, w8 - w)`` (linear in the weights; both weights stay constant).

    Constant weights keep onnxruntime's fast convolution layouts (switched weights made MobileNetV2
    40x slower). 16-bit weights count as float: their rounding error is 256 times smaller.
    """
    prefix = f"{node.name}.sens_weight"
    array = node.inputs[1].const_value.numpy()
    axis = _weight_axis(node) % array.ndim
    slots = _Slots(-1, counter.take(), -1)
    delta = _constant(graph, f"{prefix}.delta", quantize_weight(array, axis, 8) - array)
    attributes = {key: attr for key, attr in node.attributes.items() if key != "beta"}
    twin = ir.node(node.op_type, [node.inputs[0], delta], attributes=attributes, name=f"{prefix}.twin",
                   domain=node.domain)
    twin.outputs[0].name = f"{prefix}.twin_value"
    output = node.outputs[0]
    uses = list(output.uses())
    scaled = _mix(graph, [(twin.outputs[0], _switch(graph, mask, slots.low, f"{prefix}.l"))], prefix)
    graph.append(twin)
    add = ir.node("Add", [output, scaled], name=f"{prefix}.add")
    add.outputs[0].name = f"{prefix}.sum"
    graph.append(add)
    if output.is_graph_output():
        position = list(graph.outputs).index(output)
        name = output.name
        output.name = f"{name}.float"
        add.outputs[0].name = name
        add.outputs[0].shape, add.outputs[0].type = output.shape, output.type
        graph.outputs[position] = add.outputs[0]
    for user, index in uses:
        user.replace_input_with(index, add.outputs[0])
    return slots


# -- running the variants -------------------------------------------------------------------------------


class ProxyRunner:
    """Runs masks of a :class:`ProxyModel` over a fixed list of samples and scores them against FP32.

    Args:
        proxy: the model.
        samples: input dicts (model input name -> array); the FP32 reference runs once per sample here.
    """

    def __init__(self, proxy: ProxyModel, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.proxy = proxy
        self.session = ort.InferenceSession(proxy.proto, options, providers=["CPUExecutionProvider"])
        self.feeds = [{name: np.asarray(sample[name]) for name in proxy.inputs} for sample in samples]
        self.reference = [self.run(proxy.mask(), feed) for feed in self.feeds]

    def run(self, mask: np.ndarray, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The model outputs for one sample under ``mask``."""
        return self.session.run(self.proxy.outputs, {**feed, MASK_INPUT: mask})

    def score(self, mask: np.ndarray, reporter: Reporter | None = None) -> dict[str, float | None]:
        """Worst output SQNR (dB) and worst mean cosine to FP32 over the samples under ``mask``."""
        comparisons = [TensorComparison() for _ in self.proxy.outputs]
        for feed, reference in zip(self.feeds, self.reference):
            keep = token_positions(feed)  # at the tokens, as the compile's analysis compares
            for comparison, ref, test in zip(comparisons, reference, self.run(mask, feed)):
                if np.issubdtype(ref.dtype, np.floating):
                    comparison.add(at_tokens(ref, keep), at_tokens(test, keep))
            if reporter is not None:
                reporter.advance()
        rows = [c.to_dict() for c in comparisons if c.samples]
        return {"sqnr_db": min((r["sqnr_db"] for r in rows), default=None),
                "cosine": min((r["cosine_mean"] for r in rows if r["cosine_mean"] is not None), default=None)}


def tensor_statistics(float_model: ir.Model, model: QuantizedModel, names: Sequence[str],
                      samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, dict[str, float]]:
    """Range, scale, bits, clipping ratio and rmse/scale of each named quantized tensor on ``samples`` (FP32 values)."""
    import onnxruntime as ort

    from compiler_core.calibration.statistics import session_with_outputs

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    wanted = [name for name in names if name not in {spec.name for spec in model.inputs}]
    session, exposed = session_with_outputs(float_model, wanted, options)
    inputs = [item.name for item in session.get_inputs()]
    totals: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in names}
    for sample in samples:
        feeds = {name: np.asarray(sample[name]) for name in inputs}
        for spec in model.inputs:
            if spec.name in totals and spec.name in sample:
                _accumulate(totals[spec.name], np.asarray(sample[spec.name], dtype=np.float64),
                            model.params(spec.name))
        for start in range(0, len(exposed), STATISTICS_GROUP):  # bounded memory: a few tensors per run
            group = exposed[start:start + STATISTICS_GROUP]
            for name, value in zip(group, session.run(group, feeds)):
                if name in totals:
                    _accumulate(totals[name], np.asarray(value, dtype=np.float64), model.params(name))
    return {name: _point_row(model.params(name), total) for name, total in totals.items()}


def _accumulate(total: list[float], values: np.ndarray, params: QuantParams) -> None:
    low, high = _range(params, values.ndim)
    total[0] += values.size
    total[1] += float(np.count_nonzero((values < low) | (values > high)))
    error = params.dequantize(params.quantize(values)) - values
    total[2] += float(np.sum(error * error))


def _range(params: QuantParams, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """Float range the codes cover, widened by half a step (values inside round to a code, not clip)."""
    scale, zero = np.asarray(params.scale, dtype=np.float64), np.asarray(params.zero_point, dtype=np.float64)
    if params.axis is not None and scale.ndim:
        shape = [1] * ndim
        shape[params.axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return (params.qmin - zero - 0.5) * scale, (params.qmax - zero + 0.5) * scale


def _point_row(params: QuantParams, total: list[float]) -> dict[str, Any]:
    scale = np.asarray(params.scale, dtype=np.float64)
    zero = np.asarray(params.zero_point, dtype=np.float64)
    low, high = float(np.min((params.qmin - zero) * scale)), float(np.max((params.qmax - zero) * scale))
    count = total[0] or 1.0
    mean_scale = float(np.mean(scale))
    return {"range": [low, high], "scale": mean_scale, "bits": params.bits, "clip_ratio": total[1] / count,
            "rmse_over_scale": math.sqrt(total[2] / count) / mean_scale if mean_scale else None}


@dataclass
class SensitivityReport:
    """What :func:`analyze_sensitivity` measured.

    Attributes:
        layers: one row per layer, most sensitive first (lowest SQNR when quantized alone).
        baseline: the proxy with everything quantized as configured (``sqnr_db``, ``cosine``).
        samples: samples every variant ran on.
        variants: proxy runs (per sample) made.
        seconds: wall time per stage (``proxy``, ``variants``, ``statistics``, ``total``).
        statistics_from_cache: True when no calibration inference ran (``None``: not known here).
    """

    layers: list[dict[str, Any]]
    baseline: dict[str, float | None]
    samples: int
    variants: int
    seconds: dict[str, float] = field(default_factory=dict)
    statistics_from_cache: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (the content of ``qbcompiler analyze --output``)."""
        return {"format": "qbcompiler-sensitivity", "method": "fake-quantization proxy (onnxruntime)",
                "samples": self.samples, "variants": self.variants, "baseline": self.baseline,
                "statistics_from_cache": self.statistics_from_cache,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "layers": self.layers}


def analyze_sensitivity(float_model: ir.Model, model: QuantizedModel, samples: Sequence[Mapping[str, np.ndarray]], *,
                        split: bool = False, kept16: bool = True, statistics: bool = True,
                        reporter: Reporter | None = None) -> SensitivityReport:
    """Measure every layer of ``model`` alone and kept in 16 bits (see the module docstring).

    Args:
        float_model: the float graph ``model`` was quantized from (after equalization), unchanged.
        model: the quantized program whose decisions are analysed.
        samples: input dicts; every variant runs on all of them.
        split: also measure a linear layer's activation and weights alone, each without the other
            (one more variant per linear layer).
        kept16: also measure each layer kept in 16 bits with the rest quantized (``False``: rank only;
            with ``split``, a linear layer's ``alone`` is then the power sum of its two parts).
        statistics: also measure each quantization point's clipping ratio and rmse/scale (``point``;
            ``None`` without).
        reporter: progress (stage ``sensitivity``, one unit per proxy run) and cancel.
    """
    reporter = as_reporter(reporter)
    samples = list(samples)
    started = time.perf_counter()
    seconds: dict[str, float] = {}
    proxy = build_proxy(float_model, model)
    runner = ProxyRunner(proxy, samples)
    seconds["proxy"] = time.perf_counter() - started
    plans = _plans(proxy, split, kept16)
    total = (len(plans) + 1) * len(samples)
    step = time.perf_counter()
    with reporter.stage("sensitivity", total=total, message=f"{len(plans)} variants on {len(samples)} samples"):
        baseline = runner.score(proxy.all_low(), reporter)
        scores = {key: runner.score(mask, reporter) for key, mask in plans.items()}
    seconds["variants"] = time.perf_counter() - step
    step = time.perf_counter()
    points = tensor_statistics(float_model, model, list(proxy.tensor_slots), samples) if statistics else {}
    seconds["statistics"] = time.perf_counter() - step
    rows = [_row(layer, scores, baseline, points) for layer in proxy.layers]
    rows.sort(key=lambda row: row["alone"]["sqnr_db"] if row["alone"]["sqnr_db"] is not None else 1e9)
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank
    seconds["total"] = time.perf_counter() - started
    logger.info("Sensitivity: %d layers, %d proxy runs in %.2f s", len(rows), total, seconds["total"])
    return SensitivityReport(rows, baseline, len(samples), total, seconds)


def _plans(proxy: ProxyModel, split: bool, kept16: bool) -> dict[tuple[str, str], np.ndarray]:
    plans = {}
    for layer in proxy.layers:
        tensors = [t for t in layer.tensors if t in proxy.tensor_slots]
        weights = [layer.weight_node] if layer.weight_node else []
        if not tensors and not weights:
            continue
        if split and tensors and weights:
            plans[(layer.name, "activation")] = proxy.mask(low=tensors)
            plans[(layer.name, "weights")] = proxy.mask(weights_low=weights)
            if kept16:  # without kept16 (a search that only ranks), "alone" is the sum of the two noises
                plans[(layer.name, "alone")] = proxy.mask(low=tensors, weights_low=weights)
        else:
            plans[(layer.name, "alone")] = proxy.mask(low=tensors, weights_low=weights)
        if kept16:
            plans[(layer.name, "kept16")] = proxy.all_low(except_layer=layer)
    return plans


def _combined(first: Mapping | None, second: Mapping | None) -> dict[str, float | None]:
    """Two independent noises add in power: the SQNR of both from each one's (cosine: the worse one's)."""
    present = [s for s in (first, second) if s and s["sqnr_db"] is not None]
    if not present:
        return {"sqnr_db": None, "cosine": None}
    noise = sum(10 ** (-s["sqnr_db"] / 10) for s in present)
    return {"sqnr_db": -10 * math.log10(noise) if noise > 0 else 999.0,
            "cosine": min((s["cosine"] for s in present if s["cosine"] is not None), default=None)}


def _row(layer: Layer, scores: Mapping, baseline: Mapping, points: Mapping) -> dict[str, Any]:
    alone = scores.get((layer.name, "alone")) or _combined(scores.get((layer.name, "activation")),
                                                           scores.get((layer.name, "weights")))
    kept = scores.get((layer.name, "kept16"))
    gain = (kept["sqnr_db"] - baseline["sqnr_db"]) if kept and kept["sqnr_db"] is not None and \
        baseline["sqnr_db"] is not None else None
    point = points.get(layer.tensors[0]) if layer.tensors else None
    return {"layer": layer.name, "op": layer.op_type, "precision": layer.precision, "tensors": layer.tensors,
            "weights": layer.weight_node is not None, "alone": alone,
            "activation_alone": scores.get((layer.name, "activation")),
            "weights_alone": scores.get((layer.name, "weights")), "kept16": kept, "gain_db": gain,
            "point": point}


def mblt_sensitivity(mblt: Any, config: Any, *, calib_data_path: Any = None, reporter: Reporter | None = None,
                     samples: int = DEFAULT_SAMPLES, split: bool = False) -> SensitivityReport:
    """Sensitivity of an MBLT under a resolved config, on cached statistics (calibrates once if not cached).

    The variants run on the first ``samples`` held-out samples (the calibration samples when none
    are held out).

    Args:
        mblt: MBLT path or an open :class:`~compiler_core.session.MbltSession`.
        config: the resolved :class:`~compiler_core.config.CompileConfig`.
        calib_data_path: calibration data (else the config's).
        reporter: progress and cancel.
        samples: samples per variant (at least 1).
        split: see :func:`analyze_sensitivity`.
    """
    from compiler_core.errors import ArgumentError
    from compiler_core.quantization.run import calibration_statistics, quantize_from_statistics
    from compiler_core.session import MbltSession

    if samples < 1:
        raise ArgumentError(f"samples must be at least 1, got {samples}.", hint="Pass --samples 1 or more.")
    reporter = as_reporter(reporter)
    session = mblt if isinstance(mblt, MbltSession) else MbltSession.open(mblt)
    calibration, holdout, stats, hit = calibration_statistics(session, config, calib_data_path=calib_data_path,
                                                              reporter=reporter)
    float_graph, model = quantize_from_statistics(session.graph, stats, config, mblt_sha256=session.sha256,
                                                  reporter=reporter)
    data = holdout if len(holdout) else calibration
    chosen = [sample for _, sample in zip(range(samples), data)]
    report = analyze_sensitivity(float_graph, model, chosen, split=split, reporter=reporter)
    report.statistics_from_cache = hit
    return report
