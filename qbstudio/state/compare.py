"""Comparing runs (Qt-free): settings diff, metric rows, per-layer series, heat colours, clip ranges, Pareto data.

Everything the Runs & Compare views draw is computed here from :class:`~qbstudio.state.runs.RunRecord`
objects, the MXQ files they point to and the cached activation statistics, so it can be tested
without a display.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qbstudio.state.runs import RunRecord
from qbstudio.state.settings import CHOICE_LABELS

logger = logging.getLogger(__name__)

MAX_COMPARED = 4
"""Runs shown side by side at most."""

SQNR_SCALE = (10.0, 40.0)
"""dB range of the SQNR heat colours: at or below the low end red, at or above the high end green."""

DELTA_SCALE = 10.0
"""dB of the delta heat colours' ends: +this is full blue (better than the baseline), -this full red."""

_SQNR_STOPS = ((0.0, (198, 40, 40)), (0.4, (255, 179, 0)), (0.75, (67, 160, 71)), (1.0, (27, 94, 32)))
_DELTA_STOPS = ((0.0, (198, 40, 40)), (0.5, (245, 245, 245)), (1.0, (21, 101, 192)))
_SHARE_STOPS = ((0.0, (245, 245, 245)), (0.35, (255, 213, 79)), (0.7, (245, 124, 0)), (1.0, (183, 28, 28)))
_STOPS = {"sqnr": _SQNR_STOPS, "delta": _DELTA_STOPS, "share": _SHARE_STOPS}


# ---------------------------------------------------------------------------------------------- settings


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> ``{"calibration.mode": 1, ...}`` (lists are leaves)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def _enum_fields(model: type, prefix: str = "") -> dict[str, type[enum.Enum]]:
    """``{"calibration.method": CalibrationMethod, ...}``: the config keys whose values are enum numbers."""
    from pydantic import BaseModel

    found: dict[str, type[enum.Enum]] = {}
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        for kind in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(kind, type) and issubclass(kind, enum.Enum):
                found[key] = kind
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                found.update(_enum_fields(kind, f"{key}."))
    return found


@functools.cache
def _config_enums() -> dict[str, type[enum.Enum]]:
    from compiler_core.config import CompileConfig

    return _enum_fields(CompileConfig)


def setting_text(key: str, value: Any) -> Any:
    """A resolved config value as the user reads it: a numbered choice in the Compile tab's words with its config
    code and name (``calibration.method`` 1 -> ``Concat-shared, symmetric (1 WChAMulti)``); other values
    unchanged."""
    kind = _config_enums().get(key)
    if kind is None or isinstance(value, bool) or not isinstance(value, int):
        return value
    try:
        code = f"{value} {kind(value).name}"
    except ValueError:
        return value
    label = CHOICE_LABELS.get(key, {}).get(value)
    return f"{label} ({code})" if label else code


def resolved_config(run: RunRecord) -> dict[str, Any]:
    """The run's full config (camelCase, defaults filled in); the stored dict if it no longer validates."""
    from compiler_core.config import CompileConfig
    from compiler_core.errors import ConfigError

    try:
        return CompileConfig.from_dict(run.config, source=f"run #{run.run_id}").to_dict()
    except ConfigError as error:
        logger.warning("run #%d: stored config does not validate (%s); showing it as stored", run.run_id, error)
        return dict(run.config)


def settings_diff(runs: Sequence[RunRecord]) -> list[tuple[str, list[Any]]]:
    """``(dotted key, value per run)`` for every resolved config key whose value is not the same in all runs."""
    flats = [flatten(resolved_config(run)) for run in runs]
    keys = sorted({key for flat in flats for key in flat})
    missing = object()
    rows = []
    for key in keys:
        values = [flat.get(key, missing) for flat in flats]
        if any(json.dumps(v, default=str) != json.dumps(values[0], default=str) for v in values[1:]):
            rows.append((key, [None if v is missing else v for v in values]))
    return rows


# ---------------------------------------------------------------------------------------------- metrics


def metric_rows(runs: Sequence[RunRecord]) -> list[tuple[str, list[Any]]]:
    """``(label, value per run)``: output metrics per output, estimated latency/FPS per core mode, size, ...

    Top-1/top-5 agreement rows appear only for outputs holding class scores (some run has them).
    """
    rows: list[tuple[str, list[Any]]] = []
    outputs = list(dict.fromkeys(name for run in runs for name in run.outputs))
    for output in outputs:
        for key, label in (("sqnr_db", "SQNR (dB)"), ("cosine_mean", "cosine"), ("top1_agreement", "top-1 agreement"),
                           ("top5_agreement", "top-5 agreement"), ("max_abs_error", "max |error|")):
            values = [run.outputs.get(output, {}).get(key) for run in runs]
            if key.endswith("_agreement") and all(value is None for value in values):
                continue  # not class scores (compiler_core.analysis.metrics.is_classifier_output)
            rows.append((f"{output}: {label}", values))
    modes = list(dict.fromkeys(mode for run in runs for mode in run.estimate))
    for mode in modes:
        rows.append((f"{mode}: latency (ms, est.)", [run.estimate.get(mode, {}).get("latency_ms") for run in runs]))
        rows.append((f"{mode}: FPS (est.)", [run.estimate.get(mode, {}).get("throughput_fps") for run in runs]))
    if any(run.cpu_parts for run in runs):  # the estimates above are the NPU's alone
        rows.append(("on the host CPU (not in the estimates)", [", ".join(run.cpu_parts) or "-" for run in runs]))
    rows.append(("MXQ size (bytes)", [run.size_bytes for run in runs]))
    rows.append(("int16 layers", [run.int16_layers for run in runs]))
    rows.append(("compile time (s)", [round(run.duration_s, 2) for run in runs]))
    return rows


def better_direction(label: str) -> int:
    """+1 if larger values of the metric ``label`` are better, -1 if smaller, 0 if neither."""
    if "latency" in label or "error" in label or "size" in label or "compile time" in label:
        return -1
    if any(word in label for word in ("SQNR", "cosine", "agreement", "FPS")):
        return 1
    return 0


# ---------------------------------------------------------------------------------------------- per layer


@dataclass
class LayerSeries:
    """Per-layer values of several runs over one layer axis (graph order).

    Attributes:
        layers: Layer names, in graph order.
        values: One list per run (NaN where the run has no finite value).
        deltas: ``values[i] - values[baseline]`` per run.
        baseline: Index of the baseline run.
    """

    layers: list[str]
    values: list[np.ndarray]
    deltas: list[np.ndarray]
    baseline: int


def layer_series(runs: Sequence[RunRecord], order: Sequence[str], *, metric: str = "sqnr_db",
                 baseline: int = 0) -> LayerSeries:
    """``metric`` (``sqnr_db`` or ``cosine_mean``) of every run per layer, in graph ``order``.

    Layers of the runs that are not in ``order`` (another graph) come last, in the first run's order.
    """
    present = [name for run in runs for name in (row.get("layer") for row in run.layers) if name]
    known = set(present)
    layers = [name for name in order if name in known]
    layers += [name for name in dict.fromkeys(present) if name not in set(layers)]
    values = []
    for run in runs:
        rows = {row.get("layer"): row for row in run.layers}
        values.append(np.array([_finite(rows.get(name), metric) for name in layers], dtype=float))
    base = values[baseline] if values else np.array([])
    return LayerSeries(layers, values, [v - base for v in values], baseline)


def _finite(row: Mapping[str, Any] | None, key: str) -> float:
    value = row.get(key) if row else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


# ---------------------------------------------------------------------------------------------- heat colours


def _gradient(stops, t: float) -> tuple[int, int, int]:
    t = min(1.0, max(0.0, t))
    for (t0, c0), (t1, c1) in zip(stops, stops[1:]):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            return tuple(round(a + (b - a) * f) for a, b in zip(c0, c1))  # type: ignore[return-value]
    return stops[-1][1]


def _hex(rgb: Sequence[int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _text_on(rgb: Sequence[int]) -> str:
    return "#1a1a1a" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 150 else "#ffffff"


@dataclass(frozen=True)
class HeatScale:
    """How values map to colours: a gradient over ``[low, high]`` (values outside are clamped).

    Attributes:
        kind: ``sqnr`` (red = low SQNR), ``delta`` (red = worse than the baseline, blue = better) or
            ``share`` (share of the estimated latency in %: white = none, red = the most).
        low / high: Values at the two ends of the gradient (dB, or % for ``share``).
        ticks: Values to label on the legend.
    """

    kind: str
    low: float
    high: float
    ticks: tuple[float, ...]

    @classmethod
    def sqnr(cls) -> HeatScale:
        """The per-run SQNR scale."""
        return cls("sqnr", *SQNR_SCALE, (10.0, 20.0, 30.0, 40.0))

    @classmethod
    def delta(cls) -> HeatScale:
        """The delta-to-baseline scale."""
        return cls("delta", -DELTA_SCALE, DELTA_SCALE, (-10.0, -5.0, 0.0, 5.0, 10.0))

    @classmethod
    def share(cls, largest: float) -> HeatScale:
        """Share of latency in %, from 0 to a round value at or above the ``largest`` share."""
        high = next((step for step in (1.0, 2.0, 5.0, 10.0, 20.0, 25.0, 50.0) if largest <= step), 100.0)
        return cls("share", 0.0, high, (0.0, high / 4, high / 2, 3 * high / 4, high))

    def rgb(self, value: float) -> tuple[int, int, int]:
        """Colour of ``value``."""
        return _gradient(_STOPS[self.kind], (value - self.low) / (self.high - self.low))

    def stops(self) -> list[tuple[float, str]]:
        """``(position 0..1, #rrggbb)`` of the gradient (for the legend)."""
        return [(t, _hex(c)) for t, c in _STOPS[self.kind]]


def heat_colours(values: Mapping[str, float], scale: HeatScale, *, unit: str = "dB",
                 label: str = "") -> tuple[dict[str, list[str]], dict[str, str]]:
    """``({node: [fill, text colour]}, {node: tooltip})`` for the graph heatmap; NaN values are left out."""
    fills: dict[str, list[str]] = {}
    tips: dict[str, str] = {}
    for name, value in values.items():
        if not math.isfinite(value):
            continue
        rgb = scale.rgb(value)
        fills[name] = [_hex(rgb), _text_on(rgb)]
        sign = "+" if scale.kind == "delta" and value > 0 else ""
        tips[name] = f"{name}\n{label}: {sign}{value:.2f} {unit}".strip()
    return fills, tips


def node_values(run: RunRecord, metric: str = "sqnr_db") -> dict[str, float]:
    """Node name -> ``metric`` of the run's layer.

    A row names its layer (the first node) and the tensor it outputs; when that tensor carries the
    name of the node producing it (a fused Relu, say), that node gets the layer's value too.
    """
    values: dict[str, float] = {}
    for row in run.layers:
        value = _finite(row, metric)
        if row.get("layer") and math.isfinite(value):
            values[row["layer"]] = value
    layers = set(values)
    for row in run.layers:
        tensor = row.get("tensor")
        if tensor and tensor not in layers and row.get("layer") in values:
            values.setdefault(tensor, values[row["layer"]])
    return values


def delta_values(run: RunRecord, baseline: RunRecord, metric: str = "sqnr_db") -> dict[str, float]:
    """Node name -> ``run`` minus ``baseline`` for the layers both have."""
    mine, theirs = node_values(run, metric), node_values(baseline, metric)
    return {name: mine[name] - theirs[name] for name in mine if name in theirs}


@dataclass
class Colouring:
    """A graph heatmap ready for ``GraphView.set_heatmap``: node colours, tooltips and the legend."""

    colours: dict[str, list[str]]
    tooltips: dict[str, str]
    title: str
    scale: HeatScale


def colouring_choices(runs: Sequence[RunRecord], baseline: int | None) -> list[tuple[str, str]]:
    """``(key, label)`` graph colourings of the compared ``runs``: each run's SQNR, each other run's delta."""
    choices = [(f"sqnr:{run.run_id}", f"Colours: SQNR of {run.label}") for run in runs]
    choices += [(f"delta:{run.run_id}:{baseline}", f"Colours: Δ SQNR {run.label} vs #{baseline}")
                for run in runs if run.run_id != baseline]
    return choices


def colouring(key: str, find) -> Colouring | None:
    """The heatmap of colouring ``key`` (``sqnr:<run>`` or ``delta:<run>:<baseline>``); ``find(run_id)`` gives a
    run or None. None for ``support`` or a run that no longer exists."""
    parts = key.split(":")
    run = find(int(parts[1])) if len(parts) > 1 and parts[1].isdigit() else None
    if run is None:
        return None
    base = find(int(parts[2])) if parts[0] == "delta" and len(parts) > 2 and parts[2].isdigit() else None
    if base is not None:
        scale, values = HeatScale.delta(), delta_values(run, base)
        title, label = f"Δ SQNR {run.label} − #{base.run_id} (dB)", f"Δ SQNR vs #{base.run_id}"
    else:
        scale, values = HeatScale.sqnr(), node_values(run)
        title, label = f"SQNR of {run.label} (dB)", f"SQNR of {run.label}"
    colours, tips = heat_colours(values, scale, label=label)
    return Colouring(colours, tips, title, scale)


# ---------------------------------------------------------------------------------------------- clip ranges


@dataclass(frozen=True)
class ClipRange:
    """How one run quantizes one activation tensor (read from its MXQ).

    Attributes:
        low / high: The representable real range, ``scale * (qmin - zp)`` .. ``scale * (qmax - zp)``.
        scale / zero_point / bits / signed: The frozen parameters in the MXQ (per tensor).
        observed: The calibrated range the observer chose, or None.
        source: Why the parameters are what they are (``observer:max_percentile`` ...).
    """

    low: float
    high: float
    scale: float
    zero_point: int
    bits: int
    signed: bool
    observed: tuple[float, float] | None
    source: str


def mxq_tensors(mxq_path: str | Path) -> dict[str, dict[str, Any]]:
    """The ``tensors`` records of an MXQ's program (name -> state, bits, observed_range, params, source)."""
    from compiler_core.mxq.container import read_mxq

    return dict(read_mxq(mxq_path).program.get("tensors", {}))


@dataclass(frozen=True)
class WeightRanges:
    """Per-output-channel real weight ranges of one layer in one run's MXQ (codes x per-channel scale).

    Attributes:
        low / high: Smallest / largest real weight of each output channel.
        step: Each channel's quantization step (its weight scale).
        bits: Weight width.
    """

    low: np.ndarray
    high: np.ndarray
    step: np.ndarray
    bits: int


def mxq_weight_ranges(mxq_path: str | Path) -> dict[str, WeightRanges]:
    """Layer name -> :class:`WeightRanges` for every layer with per-channel weights in an MXQ."""
    from compiler_core.mxq.container import read_mxq

    mxq = read_mxq(mxq_path)
    ranges = {}
    for op in mxq.program.get("ops", []):
        scale = op.get("attrs", {}).get("weight_scale")
        if "weight" not in op.get("consts", {}) or scale is None:
            continue
        codes = np.asarray(mxq.consts[op["consts"]["weight"]], dtype=np.float64)
        scale = np.asarray(scale, dtype=np.float64).reshape(-1)
        # conv weights lead with the output channels; a dense layer's [in, out] weights end with them
        axis = 0 if scale.size in (1, codes.shape[0]) else codes.ndim - 1
        rows = np.moveaxis(codes, axis, 0).reshape(codes.shape[axis], -1)
        step = np.broadcast_to(scale, (rows.shape[0],))
        bits = 16 if "w16" in str(op.get("precision", "")) else 8
        ranges[op["name"]] = WeightRanges(rows.min(axis=1) * step, rows.max(axis=1) * step, np.array(step), bits)
    return ranges


def clip_range(record: Mapping[str, Any] | None) -> ClipRange | None:
    """The :class:`ClipRange` of one MXQ tensor record (None without per-tensor parameters)."""
    params = (record or {}).get("params")
    if not params or np.ndim(params.get("scale")) != 0:
        return None
    from compiler_core.quantization.params import code_range

    scale, zero_point = float(params["scale"]), int(params["zero_point"])
    bits, signed = int(params["bits"]), bool(params.get("signed", True))
    qmin, qmax = code_range(bits, signed)
    observed = record.get("observed_range")
    return ClipRange(scale * (qmin - zero_point), scale * (qmax - zero_point), scale, zero_point, bits, signed,
                     tuple(observed) if observed else None, str(record.get("source", "")))


def histogram(stats: Any, bins: int = 160) -> tuple[np.ndarray, np.ndarray]:
    """``(bin edges, counts)`` of a ``TensorStats`` histogram, regrouped to about ``bins`` bins over its data."""
    counts = np.asarray(stats.histogram, dtype=np.int64)
    edges = np.asarray(stats.bin_edges, dtype=float)
    nonzero = np.flatnonzero(counts)
    if nonzero.size == 0:
        return edges[:2], counts[:1]
    first, last = int(nonzero[0]), int(nonzero[-1]) + 1
    counts, edges = counts[first:last], edges[first:last + 1]
    group = max(1, math.ceil(counts.size / bins))
    pad = (-counts.size) % group
    counts = np.concatenate([counts, np.zeros(pad, dtype=np.int64)]).reshape(-1, group).sum(axis=1)
    edges = np.concatenate([edges, edges[-1] + np.arange(1, pad + 1) * (edges[1] - edges[0])])[::group]
    if edges.size == counts.size:
        edges = np.append(edges, edges[-1] + group * (stats.bin_width))
    return edges, counts


class StatisticsSource:
    """Activation statistics of a model, from the compile's statistics cache (kept in memory once read).

    The same lookup a compile makes (data, split, tensor selection), so a run's statistics come
    from the cache entry its compile filled; onnxruntime runs again only if the cache was cleared.
    """

    def __init__(self) -> None:
        self._sets: dict[str, Any] = {}

    def tensor(self, mblt_path: str | Path, config: Mapping[str, Any], calibration: Mapping[str, Any],
               tensor: str, *, callback=None, cancel_token=None) -> Any:
        """The ``TensorStats`` of ``tensor`` (None if it was not collected)."""
        stats = self.statistics(mblt_path, config, calibration, callback=callback, cancel_token=cancel_token)
        return stats.tensors.get(tensor)

    def statistics(self, mblt_path: str | Path, config: Mapping[str, Any], calibration: Mapping[str, Any], *,
                   callback=None, cancel_token=None) -> Any:
        """The whole ``StatisticsSet`` of a run's model and data."""
        from compiler_core.config import CompileConfig
        from compiler_core.progress import as_reporter
        from compiler_core.quantization.run import calibration_statistics
        from compiler_core.session import MbltSession

        key = json.dumps([str(mblt_path), dict(calibration), config.get("calibration", {}).get("numSamples")],
                         sort_keys=True, default=str)
        if key not in self._sets:
            compile_config = CompileConfig.from_dict(dict(config), source="run")
            if calibration.get("use_random"):
                compile_config = compile_config.model_copy(update={"use_random_calib": True})
            path = calibration.get("path") or None
            _, _, stats, hit = calibration_statistics(MbltSession.open(mblt_path), compile_config,
                                                      calib_data_path=path,
                                                      reporter=as_reporter(callback, cancel_token))
            logger.info("statistics for %s %s", Path(mblt_path).name, "from the cache" if hit else "collected again")
            self._sets[key] = stats
        return self._sets[key]


# ---------------------------------------------------------------------------------------------- sweep files


def read_sweep_results(path: str | Path, model_sha256: str) -> tuple[list[dict[str, Any]], int]:
    """The finished points of a ``sweep.json`` written by ``qbcompiler sweep`` for the MBLT hashing to ``model_sha256``.

    Returns:
        ``(records of the points that compiled, points that did not)``.

    Raises:
        ArgumentError: the file is not a readable sweep result, or its MBLT is another model (or gone).
    """
    from compiler_core.errors import ArgumentError
    from compiler_core.fileio import sha256_file

    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ArgumentError(f"Cannot read the sweep results '{path}': {error}.",
                            hint="Pick the sweep.json that qbcompiler sweep wrote.") from error
    if not isinstance(data, dict) or data.get("format") != "qbcompiler-sweep" or not isinstance(data.get("records"), list):
        raise ArgumentError(f"'{path.name}' is not a qbcompiler sweep result.",
                            hint="Pick the sweep.json that qbcompiler sweep wrote.")
    mblt = Path(str(data.get("mblt", "")))
    if not mblt.is_file() or sha256_file(mblt) != model_sha256:
        raise ArgumentError(f"The sweep in '{path.parent}' compiled another model ({mblt.name}), not the open one.",
                            hint="Open the model the sweep compiled, or run the sweep on this project's model.")
    done = [r for r in data["records"] if isinstance(r, dict) and r.get("status") == "ok" and r.get("mxq")
            and Path(r["mxq"]).is_file()]
    return done, len(data["records"]) - len(done)


# ---------------------------------------------------------------------------------------------- Pareto


@dataclass
class ParetoData:
    """Points of the Pareto chart: one per run with an accuracy and an estimated latency.

    Attributes:
        run_ids / accuracy / latency / size: Per point (accuracy: worst output SQNR in dB; latency: ms,
            estimated, first core mode; size: MXQ bytes).
        front: Positions (into the lists) of the points on the front, by increasing latency.
    """

    run_ids: list[int]
    accuracy: list[float]
    latency: list[float]
    size: list[int]
    front: list[int]


def pareto_data(runs: Sequence[RunRecord]) -> ParetoData:
    """The Pareto chart's points and front (higher SQNR and lower latency are better)."""
    # Imported here, not at module import: the sweep package loads the config models (start-up cost).
    from compiler_core.sweep.pareto import pareto_front

    usable = [run for run in runs if run.accuracy() is not None and run.latency_ms() is not None]
    accuracy = [float(run.accuracy()) for run in usable]
    latency = [float(run.latency_ms()) for run in usable]
    front = sorted(pareto_front(accuracy, latency), key=lambda i: latency[i])
    return ParetoData([run.run_id for run in usable], accuracy, latency, [run.size_bytes for run in usable], front)
