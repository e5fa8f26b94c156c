"""Automatic mixed precision: promote the fewest, cheapest layers to int16 until an accuracy target holds.

1. Quantize with the config as given (int8 unless it says otherwise) on the cached statistics and
   measure the target on the held-out samples with the bit-exact simulator. If it holds, stop.
   With ``zeroPoints`` (default) and a symmetric calibration method, measure its zero-point
   counterpart too (no latency cost: one-sided tensors such as Relu/HardSwish outputs get their
   eighth bit back) and continue from whichever measures better. With ``channelScales`` (default), then
   measure per-channel 8-bit feature-map scales (``bit.activationScales: channel``; its only cost is one
   look-up table per channel, which the latency estimate counts) and continue from it if it measures better.
2. Rank the layers by the sensitivity analysis (:mod:`compiler_core.analysis.sensitivity`) on a few
   *calibration* samples (the held-out ones only judge): the output noise a layer injects when it
   alone is quantized, its activation and its weights measured apart (the int16 variants of the
   analysis are not run: the ranking needs only these). A layer gets int16
   activations when its activation noise is at least :data:`PART_SHARE` of its noise, int16 weights
   likewise. Layers whose outputs share quantization parameters (a data-movement op and its input,
   Concat inputs with the multi-layer methods, masked Adds) form one unit: the quantizer gives a
   shared set the widest member's width anyway, so they are promoted, counted and paid for together.
3. Order the units by noise removed per unit of cost (the unit's share of the model's MACs and
   output elements, the two quantities the cost model charges, plus a typical unit's share) and try growing prefixes of that
   order (1, 2, 4, 8 ... units, then a bisection between the last failing and the first passing
   prefix), each one quantized and measured bit-exactly on the held-out samples, with its
   estimated latency on the target device. A prefix stops growing once a point exceeds
   ``maxInt16Fraction`` (counted on the program: layers with any int16 input, output or weights,
   so the readers of a widened tensor count too) or the latency budget; a bisection then looks for
   the longest prefix within the limits. If no prefix meets the target, units are added one by one
   after the longest prefix within the limits, each kept only if the point stays within them (a
   costly unit is skipped, a cheaper one after it may still fit). A cosine target is judged on the mean over
   the held-out samples, or with ``target.statistic: worst`` on the worst sample's cosine.
4. The chosen point is the smallest passing prefix (or, if none passes, the most accurate point
   tried); its layers become exact-name entries of ``bit.layerOverrides.activation16Bits`` /
   ``weight16Bits`` in the resolved config, with ``mixedPrecision.apply`` off, so compiling that
   config again reproduces the program without searching.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

from compiler_core.config import CalibrationMethod, CompileConfig
from compiler_core.errors import CalibrationError, ConfigError
from compiler_core.progress import Reporter, as_reporter
from compiler_core.quantization.program import QuantizedModel

if TYPE_CHECKING:
    from compiler_core.backend.partition import Partition

logger = logging.getLogger(__name__)

PART_SHARE = 0.1
"""A layer's activation (weights) is promoted when it makes at least this share of the layer's own noise."""
MAX_BISECTION_STEPS = 4
MAX_SKIP_STEPS = 8
"""Points tried past the longest prefix within the limits, skipping the units that do not fit."""


@dataclass
class Unit:
    """Layers promoted together, with the parts (activation, weights) of each."""

    layers: list[str]
    activations: list[str]
    weights: list[str]
    noise: float
    cost: float

    def priority(self, typical_cost: float) -> float:
        """Noise removed per unit of cost, the cost offset by a typical unit's (so that cheap layers that
        remove little noise do not crowd out the noisy ones; measured on hand_landmark: with the bare cost
        the prefixes of 2 to 8 units added nothing)."""
        return self.noise / (self.cost + typical_cost)


@dataclass
class MixedPrecisionResult:
    """What :func:`choose_mixed_precision` decided.

    Attributes:
        config: the resolved config with the chosen overrides (``mixedPrecision.apply`` off).
        target_met: the chosen point reaches the target on the held-out samples.
        chosen: index of the chosen point in ``points``.
        points: every point tried, in the order tried (units, int16 layers and fraction, metric, latency).
        front: indices of the points on the accuracy-vs-estimated-latency Pareto front.
        sensitivity: the sensitivity report that ranked the layers (``None`` when the int8 program already met the target).
        seconds: wall time per stage.
    """

    config: CompileConfig
    target_met: bool
    chosen: int
    points: list[dict[str, Any]]
    front: list[int]
    sensitivity: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def overrides(self) -> dict[str, list[str]]:
        """The chosen int16 layers (exact-name patterns)."""
        return dict(self.points[self.chosen]["overrides"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (recorded in the compile's analysis JSON under ``mixed_precision``)."""
        return {"target": self.config.mixed_precision.target.model_dump(by_alias=True),
                "target_met": self.target_met, "chosen": self.chosen, "overrides": self.overrides,
                "points": self.points, "pareto_front": self.front,
                "pareto_axes": {"accuracy": "target metric on held-out samples",
                                "latency": "estimated latency (ms) of the first core mode (cost model)"},
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "sensitivity": self.sensitivity}


def target_metric(analysis: Mapping[str, Any], kind: str, statistic: str = "mean") -> float | None:
    """The worst output's value of ``kind`` (``cosine``, ``sqnrDb``, ``top1``) in an analysis report; with
    ``statistic`` ``worst``, the worst sample's cosine instead of the mean over samples."""
    key = {"cosine": "cosine_min" if statistic == "worst" else "cosine_mean", "sqnrDb": "sqnr_db",
           "top1": "top1_agreement"}[kind]
    values = [row[key] for row in analysis.get("outputs", {}).values() if row.get(key) is not None]
    return min(values) if values else None


def format_metric(kind: str, value: float | None) -> str:
    """A target metric for people: ``cosine 0.9912``, ``SQNR 24.3 dB``, ``top-1 97.5 %``."""
    if value is None:
        return f"{kind} -"
    if kind == "sqnrDb":
        return f"SQNR {value:.1f} dB"
    if kind == "top1":
        return f"top-1 {100 * value:.1f} %"
    digits = next((d for d in (4, 5) if value >= 1 or float(f"{value:.{d}f}") < 1), 6)  # 0.99996 is not 1.0000
    return f"{kind} {value:.{digits}f}"


def exact_pattern(name: str) -> str:
    """A ``layer_matches`` pattern that matches exactly ``name`` (glob characters escaped)."""
    return "".join(f"[{char}]" if char in "*?[" else char for char in name)


def with_overrides(config: CompileConfig, activations: Sequence[str], weights: Sequence[str]) -> CompileConfig:
    """``config`` plus int16 activation/weight layers (exact names), mixed precision off."""
    overrides = config.bit.layer_overrides
    activation16 = list(overrides.activation16_bits) + [exact_pattern(n) for n in activations]
    weight16 = list(overrides.weight16_bits) + [exact_pattern(n) for n in weights]
    layer_overrides = overrides.model_copy(update={"activation16_bits": activation16, "weight16_bits": weight16})
    bit = config.bit.model_copy(update={"layer_overrides": layer_overrides})
    mixed = config.mixed_precision.model_copy(update={"apply": False})
    return config.model_copy(update={"bit": bit, "mixed_precision": mixed})


ZERO_POINT_METHODS = {CalibrationMethod.WChALayer: CalibrationMethod.WChALayerZeropoint,
                      CalibrationMethod.WChAMulti: CalibrationMethod.WChAMultiZeropoint}
"""Each symmetric calibration method and its zero-point (asymmetric activation) counterpart."""


def with_zero_points(config: CompileConfig) -> CompileConfig | None:
    """``config`` with the zero-point counterpart of its calibration method (``None`` if it has zero points)."""
    method = ZERO_POINT_METHODS.get(config.calibration.method)
    if method is None:
        return None
    return config.model_copy(update={"calibration": config.calibration.model_copy(update={"method": method})})


def with_channel_scales(config: CompileConfig) -> CompileConfig | None:
    """``config`` with per-channel feature-map scales (``None`` if it has them already)."""
    if config.bit.activation_scales == "channel":
        return None
    return config.model_copy(update={"bit": config.bit.model_copy(update={"activation_scales": "channel"})})


def int16_layers(model: QuantizedModel) -> int:
    """Layers that compute in 16 bits (:meth:`QuantizedModel.int16_layers`)."""
    return model.int16_layers()


def counted_layers(model: QuantizedModel) -> int:
    """Layers counted for ``maxInt16Fraction``: operations with a quantized output or weights."""
    return sum(1 for op in model.ops if "weight" in op.consts or any(name in model.tensors for name in op.outputs))


class _Evaluator:
    """Quantizes a config on the cached statistics and measures it bit-exactly on the held-out samples."""

    def __init__(self, graph: ir.Model, stats, holdout, device, mode: str, reporter: Reporter, sha256: str,
                 calibration=None, tail: bytes | None = None, model_outputs: list[str] | None = None) -> None:
        self.graph, self.stats, self.holdout, self.calibration = graph, stats, holdout, calibration
        self.device, self.mode, self.reporter, self.sha256 = device, mode, reporter, sha256
        self.tail, self.model_outputs = tail, model_outputs  # with a CPU tail: the model's outputs are compared

    def __call__(self, config: CompileConfig) -> tuple[ir.Model, QuantizedModel, dict[str, Any], float]:
        from compiler_core.analysis.compare import analyze
        from compiler_core.quantization.run import quantize_from_statistics
        from compiler_core.runtime.cost import estimate

        quiet = Reporter(None, self.reporter.cancel_token)
        outputs = frozenset(self.model_outputs) if self.model_outputs is not None else None
        float_graph, model = quantize_from_statistics(self.graph, self.stats, config, mblt_sha256=self.sha256,
                                                      reporter=quiet, samples=self.calibration, model_outputs=outputs)
        report = analyze(float_graph, model, self.holdout, num_samples=len(self.holdout), per_layer=False,
                         reporter=quiet, log_warnings=False,  # the compile's own analysis says them once
                         tail=self.tail, model_outputs=self.model_outputs)
        return float_graph, model, report, estimate(model, self.device, self.mode).latency_ms


def choose_mixed_precision(session, config: CompileConfig, *, calib_data_path: Any = None,
                           reporter: Reporter | None = None, parts: Partition | None = None) -> MixedPrecisionResult:
    """Search int16 layers for ``config.mixed_precision`` (see the module docstring).

    Args:
        session: the open :class:`~compiler_core.session.MbltSession` (or an MBLT path).
        config: the resolved config (its target device and first core mode price the latency).
        calib_data_path: calibration data (else the config's); statistics come from the cache.
        reporter: progress (stages ``mixed-precision`` and ``sensitivity``) and cancel.
        parts: with a CPU head or tail (``cpu_offload``, ``cpuLayers``), the split the compile quantizes: the search
            quantizes the NPU body, feeds it the samples through the FP32 head and judges the target on the model's
            outputs (the body's run through the FP32 tail), as the compile's own analysis does.

    Raises:
        CalibrationError: no held-out samples to judge the target on.
        ConfigError: a ``top1`` target on a model without classifier outputs.
    """
    from compiler_core.quantization.run import calibration_statistics, through_head
    from compiler_core.session import MbltSession
    from compiler_core.targets import get_device, validate_inference_scheme

    reporter = as_reporter(reporter)
    started = time.perf_counter()
    session = session if isinstance(session, MbltSession) else MbltSession.open(session)
    device = get_device(config.target_device)
    mode = validate_inference_scheme(device.name, config.inference_scheme)[0]
    calibration, holdout, stats, _ = calibration_statistics(session, config, calib_data_path=calib_data_path,
                                                            reporter=reporter,
                                                            body_path=parts.body if parts is not None else None)
    if not len(holdout):
        raise CalibrationError("Automatic mixed precision needs held-out samples to check its target.",
                               hint="Set analysisHoldout above 0 and give at least 8 calibration samples.")
    head = parts.head if parts is not None else None
    holdout_samples = list(through_head(head, holdout))
    empirical = _empirical_samples(config, calibration)
    evaluate = _Evaluator(parts.body if parts is not None else session.graph, stats, holdout_samples, device, mode,
                          reporter, session.sha256,
                          calibration=list(through_head(head, empirical)) if empirical is not None else None,
                          tail=parts.tail if parts is not None else None,
                          model_outputs=[value.name for value in session.graph.graph.outputs]
                          if parts is not None else None)
    settings = config.mixed_precision
    search = _Search(config, evaluate, settings.target.kind, settings.target.value, reporter)
    with reporter.stage("mixed-precision", total=0, message="int8 program on the held-out samples"):
        float_graph, base_model, _ = search.base()
        if not search.met() and settings.zero_points:
            float_graph, base_model = search.zero_point_base(float_graph, base_model)
        if not search.met() and settings.channel_scales:
            float_graph, base_model = search.variant_base(with_channel_scales(search.config), float_graph, base_model)
    seconds = {"base": time.perf_counter() - started}
    sensitivity = None
    if not search.met():
        step = time.perf_counter()
        samples = [sample for _, sample in zip(range(settings.sensitivity_samples), through_head(head, calibration))]
        from compiler_core.analysis.sensitivity import analyze_sensitivity

        report = analyze_sensitivity(float_graph, base_model, samples, split=True, kept16=False,
                                     statistics=False, reporter=reporter)
        sensitivity = report.to_dict()
        seconds["sensitivity"] = time.perf_counter() - step
        step = time.perf_counter()
        units = rank_units(base_model, report.layers)
        with reporter.stage("mixed-precision", total=0, message=f"{len(units)} candidate units"):
            search.run(units, counted_layers(base_model))
        seconds["search"] = time.perf_counter() - step
    seconds["total"] = time.perf_counter() - started
    return search.result(sensitivity, seconds)


def _empirical_samples(config: CompileConfig, calibration) -> list | None:
    """The calibration samples the empirical bias correction, the GPTQ weight rounding and the cross-validated
    channel ranges of every point run on (read once), if any of them is on."""
    correction = config.layer_bias_correction
    wanted = max(correction.empirical_samples if correction.apply and correction.empirical else 0,
                 config.bit.weight_rounding_samples if config.bit.weight_rounding != "nearest" else 0,
                 config.calibration.num_samples if config.bit.channel_ranges == "crossValidated" else 0)
    if not wanted:
        return None
    return [sample for _, sample in zip(range(wanted), calibration)]


class _Search:
    """Tries prefixes of the ranked units; keeps every point it measured."""

    def __init__(self, config: CompileConfig, evaluate: _Evaluator, kind: str, value: float,
                 reporter: Reporter) -> None:
        self.config, self.evaluate, self.kind, self.value, self.reporter = config, evaluate, kind, value, reporter
        self.points: list[dict[str, Any]] = []
        self.base_latency = 0.0
        self.configs: list[CompileConfig] = []

    def base(self):
        float_graph, model, report, latency = self.evaluate(self.config)
        self.base_latency = latency
        self._record(0, [], [], [], self.config, model, report, latency)
        return float_graph, model, report

    def met(self) -> bool:
        """A point tried so far meets the target within the limits."""
        return any(point["meets_target"] for point in self.points)

    def zero_point_base(self, float_graph: ir.Model, model: QuantizedModel) -> tuple[ir.Model, QuantizedModel]:
        """Measure the config with zero-point activation ranges; search from it when it measures better.

        A symmetric range spends half its codes on negative values a one-sided tensor never takes (the
        output of a Relu, HardSwish or Sigmoid); a zero point gives them to the values it has, at no
        latency cost. Returns the float graph and program the search ranks its layers on.
        """
        return self.variant_base(with_zero_points(self.config), float_graph, model)

    def variant_base(self, variant: CompileConfig | None, float_graph: ir.Model,
                     model: QuantizedModel) -> tuple[ir.Model, QuantizedModel]:
        """Measure ``variant`` of the config (no int16 layers); search from it when it measures better than the
        current base. Returns the float graph and program the search goes on from."""
        if variant is None:
            return float_graph, model
        current = max(point["metric"] for point in self.points)
        graph, other, report, latency = self.evaluate(variant)
        point = self._record(0, [], [], [], variant, other, report, latency)
        if point["metric"] <= current:
            return float_graph, model
        self.config = variant
        return graph, other

    def run(self, units: Sequence[Unit], counted: int) -> None:
        settings = self.config.mixed_precision
        limit = int(np.floor(settings.max_int16_fraction * counted + 1e-9))
        allowed = _prefix_within(units, limit)
        if allowed == 0:
            return
        failing, passing, over = 0, None, None
        size = 1
        while size <= allowed:
            point = self._try(units, size)
            if point["meets_target"]:
                passing = size
                break
            if not point["within_limits"]:
                over = size  # a longer prefix only costs more
                break
            failing = size
            if size == allowed:
                break
            size = min(size * 2, allowed)
        if passing is None and over is not None:
            passing = self._largest_within(units, failing, over)
        if passing is None:
            self._past_the_limits(units)
            return
        for _ in range(MAX_BISECTION_STEPS):
            if passing - failing <= 1:
                break
            middle = (failing + passing) // 2
            if self._try(units, middle)["meets_target"]:
                passing = middle
            else:
                failing = middle

    def _past_the_limits(self, units: Sequence[Unit]) -> None:
        """No prefix met the target: from the longest prefix within the limits, add the next units one by one,
        skipping each unit that takes the point past them (a costly unit need not end the search: a cheaper one
        after it may still fit), for at most :data:`MAX_SKIP_STEPS` points."""
        within = [p["units"] for p in self.points if p["within_limits"] and p.get("prefix")]
        size = max(within, default=0)
        if size >= len(units):
            return
        chosen = list(units[:size])
        over = any(p["units"] == size + 1 and not p["within_limits"] for p in self.points if p.get("prefix"))
        for unit in list(units[size + int(over):])[:MAX_SKIP_STEPS]:
            point = self._try(chosen + [unit], len(chosen) + 1, prefix=False)
            if point["within_limits"]:
                chosen.append(unit)
            if point["meets_target"]:
                return

    def _largest_within(self, units: Sequence[Unit], within: int, over: int) -> int | None:
        """Bisect between a prefix within the limits and one past them; a passing size if one is met."""
        for _ in range(MAX_BISECTION_STEPS):
            if over - within <= 1:
                return None
            middle = (within + over) // 2
            point = self._try(units, middle)
            if point["meets_target"]:
                return middle
            if point["within_limits"]:
                within = middle
            else:
                over = middle
        return None

    def _try(self, units: Sequence[Unit], size: int, prefix: bool = True) -> dict[str, Any]:
        chosen = units[:size]
        activations = sorted({n for unit in chosen for n in unit.activations})
        weights = sorted({n for unit in chosen for n in unit.weights})
        config = with_overrides(self.config, activations, weights)
        _, model, report, latency = self.evaluate(config)
        point = self._record(size, [n for unit in chosen for n in unit.layers], activations, weights, config, model,
                             report, latency)
        point["prefix"] = prefix
        self.reporter.emit("mixed-precision", len(self.points), 0,
                           f"{size} unit(s): {format_metric(self.kind, point['metric'])}, {point['int16_layers']} "
                           "int16 layer(s)")
        return point

    def _record(self, size: int, layers, activations, weights, config, model, report, latency) -> dict[str, Any]:
        metric = target_metric(report, self.kind, self.config.mixed_precision.target.statistic)
        if metric is None:
            raise ConfigError(f"The mixed-precision target '{self.kind}' does not apply to this model's outputs.",
                              hint="Use cosine or sqnrDb (top1 needs [1, C] classifier outputs).")
        settings = self.config.mixed_precision
        fraction = int16_layers(model) / max(counted_layers(model), 1)
        within = (settings.latency_budget is None or latency <= self.base_latency * (1 + settings.latency_budget)
                  + 1e-12) and (size == 0 or fraction <= settings.max_int16_fraction + 1e-12)
        point = {"index": len(self.points), "units": size, "layers": layers, "int16_layers": int16_layers(model),
                 "int16_fraction": fraction, "metric": metric,
                 "latency_ms": latency, "latency_increase": latency / self.base_latency - 1 if self.base_latency else 0.0,
                 "within_limits": within, "meets_target": metric >= self.value and within,
                 "zero_points": config.calibration.method in ZERO_POINT_METHODS.values(),
                 "channel_scales": config.bit.activation_scales == "channel",
                 "overrides": {"activation16Bits": [exact_pattern(n) for n in activations],
                               "weight16Bits": [exact_pattern(n) for n in weights]},
                 "outputs": {name: {k: row.get(k) for k in ("sqnr_db", "cosine_mean", "cosine_min", "top1_agreement")
                                   if k in row}
                             for name, row in report.get("outputs", {}).items()}}
        self.points.append(point)
        self.configs.append(config)
        logger.info("Mixed precision: %d unit(s), %s %.5f, %d int16 layer(s), %.4f ms", size, self.kind, metric,
                    point["int16_layers"], latency)
        return point

    def result(self, sensitivity, seconds) -> MixedPrecisionResult:
        from compiler_core.sweep.pareto import pareto_front

        passing = [p for p in self.points if p["meets_target"]]
        if passing:
            chosen = min(passing, key=lambda p: (p["units"], p["latency_ms"]))["index"]
        else:
            chosen = max(self.points, key=lambda p: (p["within_limits"], p["metric"]))["index"]
        front = pareto_front([p["metric"] for p in self.points], [p["latency_ms"] for p in self.points])
        for point in self.points:
            point["pareto"] = point["index"] in front
            point["chosen"] = point["index"] == chosen
        return MixedPrecisionResult(self.configs[chosen], bool(passing), chosen, self.points, front, sensitivity,
                                    seconds)


def _prefix_within(units: Sequence[Unit], limit: int) -> int:
    """The longest prefix of ``units`` with at most ``limit`` layers."""
    total = 0
    for count, unit in enumerate(units):
        total += len(unit.layers)
        if total > limit:
            return count
    return len(units)


def rank_units(model: QuantizedModel, rows: Sequence[Mapping[str, Any]]) -> list[Unit]:
    """Promotion units (layers sharing quantization parameters) in priority order, from sensitivity rows."""
    from compiler_core.runtime.cost import op_macs

    ops = {op.name: op for op in model.ops}
    work = {op.name: op_macs(op, model.shapes) + sum(int(np.prod(model.shapes.get(n, [0]))) for n in op.outputs)
            for op in model.ops}
    total_work = sum(work.values()) or 1
    owner = _shared_owner(model)
    units: dict[Any, Unit] = {}
    for row in rows:
        if row["layer"] not in ops or row["alone"]["sqnr_db"] is None:
            continue  # model inputs are widened by the int16 layers that read them
        activation, weights = _parts(row)
        key = owner.get(row["tensors"][0], row["layer"]) if row["tensors"] else row["layer"]
        unit = units.setdefault(key, Unit([], [], [], 0.0, 0.0))
        unit.layers.append(row["layer"])
        unit.noise += 10 ** (-row["alone"]["sqnr_db"] / 10)
        unit.cost += work[row["layer"]] / total_work
        if activation and row["tensors"]:
            unit.activations.append(row["layer"])
        if weights:
            unit.weights.append(row["layer"])
    for unit in units.values():  # a shared set becomes int16 as a whole: every member's output widens
        if unit.activations:
            unit.activations = list(unit.layers)
    ranked = [u for u in units.values() if u.activations or u.weights]
    typical = 1.0 / max(len(ranked), 1)
    ranked.sort(key=lambda unit: -unit.priority(typical))
    return ranked


def _parts(row: Mapping[str, Any]) -> tuple[bool, bool]:
    """Which parts of a layer to promote: those making at least :data:`PART_SHARE` of its alone noise."""
    if not row["weights"]:
        return True, False
    activation, weights = row.get("activation_alone"), row.get("weights_alone")
    if not activation or not weights or activation["sqnr_db"] is None or weights["sqnr_db"] is None:
        return True, True
    noise_a, noise_w = 10 ** (-activation["sqnr_db"] / 10), 10 ** (-weights["sqnr_db"] / 10)
    share = noise_a / (noise_a + noise_w) if noise_a + noise_w > 0 else 0.5
    return share >= PART_SHARE, 1 - share >= PART_SHARE


def _shared_owner(model: QuantizedModel) -> dict[str, int]:
    """Tensor -> an id of its parameter set (tensors frozen with one shared parameter object)."""
    sets: dict[int, int] = {}
    owner = {}
    for name, record in model.tensors.items():
        if record.params is not None:
            owner[name] = sets.setdefault(id(record.params), len(sets))
    return owner
