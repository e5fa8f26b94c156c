"""Run a settings sweep: parse once, calibrate once, compile every point through an executor, write the results.

Stages: the source model is parsed to ``<output dir>/model.mblt`` (or the given MBLT is used);
each point's resolved config is written to ``<name>.config.json``; the statistics cache is filled
once per distinct set of data/collection settings (``calibrate``), so the points only re-quantize;
the points compile through the executor into ``<name>.mxq``; ``sweep.json`` and ``sweep.csv`` hold
one record per point and the Pareto front (worst output SQNR vs estimated latency).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compiler_core.config import CompileConfig
from compiler_core.errors import ArgumentError, CancelledError, OutputWriteError
from compiler_core.fileio import atomic_write_text
from compiler_core.progress import CancelToken, ProgressCallback, ProgressEvent, Reporter, as_reporter
from compiler_core.sweep.executor import PointTask, SweepExecutor, make_executor
from compiler_core.sweep.grid import (
    SweepGrid,
    SweepPoint,
    base_config,
    differing_settings,
    expand_grid,
    load_grid,
)
from compiler_core.sweep.pareto import pareto_front
from compiler_core.sweep.reproduce import Reproduction

logger = logging.getLogger(__name__)

RESULTS_JSON = "sweep.json"
RESULTS_CSV = "sweep.csv"
ESTIMATE_NOTE = "estimated by the cost model of the virtual NPU (not measured on hardware)"
_CALIBRATION_KEYS = ("calib_data_paths", "use_random_calib", "image_channels", "preprocessing", "analysis_holdout",
                     "cpu_offload", "cpu_layers", "target_device")

PointCallback = Callable[[dict[str, Any]], None]


@dataclass
class SweepResult:
    """What :func:`run_sweep` produced.

    Attributes:
        records: one record per point (see docs/sweeps.md), in point order.
        front: indices of the points on the Pareto front.
        calibrations: how many times calibration inference ran (0 when the cache already had it).
        seconds: stage wall times (``parse``, ``calibrate``, ``points``, ``total``).
        json_path / csv_path: the result files.
        mblt: the MBLT every point compiled.
        base: the base config (resolved) that each record's ``settings`` are compared with.
    """

    records: list[dict[str, Any]]
    front: list[int]
    calibrations: int
    seconds: dict[str, float]
    json_path: Path
    csv_path: Path
    mblt: Path
    base: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (the content of ``sweep.json``)."""
        return {"format": "qbcompiler-sweep", "mblt": str(self.mblt), "points": len(self.records),
                "ok": sum(1 for r in self.records if r["status"] == "ok"), "calibrations": self.calibrations,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "pareto_front": self.front,
                "pareto_axes": {"accuracy": "worst output SQNR (dB)",
                                "latency": f"latency (ms) of the first core mode, {ESTIMATE_NOTE}"},
                "base_config": self.base, "records": self.records, "json": str(self.json_path),
                "csv": str(self.csv_path)}


def run_sweep(grid: str | Path | Mapping[str, Any] | SweepGrid, output_dir: str | Path, *,
              model: str | Path | None = None, mblt: str | Path | None = None,
              calib_data_path: str | Path | Sequence[str | Path] | None = None, target_device: str | None = None,
              use_random_calib: bool | None = None, executor: SweepExecutor | None = None, max_workers: int = 2,
              callback: ProgressCallback | Reporter | None = None, cancel_token: CancelToken | None = None,
              on_point: PointCallback | None = None, **parse_options: Any) -> SweepResult:
    """Compile every point of ``grid`` into ``output_dir`` and write ``sweep.json`` / ``sweep.csv`` there.

    Args:
        grid: Grid file (YAML/JSON), mapping or :class:`SweepGrid`.
        output_dir: Folder for the MBLT (when parsing), point configs, MXQs and result files.
        model: Source model to parse once (exclusive with ``mblt``).
        mblt: An MBLT to compile directly.
        calib_data_path: Calibration data for every point.
        target_device: Overrides the grid's base config.
        use_random_calib: Random calibration data (smoke tests only).
        executor: Where points run; a :class:`LocalProcessExecutor` with ``max_workers`` if ``None``.
        max_workers: Worker processes of the default executor.
        callback: Progress: ``parse``/``calibrate`` stages, ``sweep`` (points finished of all), and
            each point's own stages as ``point-03/quantize`` ...
        cancel_token: Stops the sweep; finished points are kept and written to the result files.
        on_point: Receives each point's record as soon as the point finishes.
        **parse_options: ``backend``, ``input_shape_dict`` ... for parsing ``model``.

    Raises:
        ArgumentError: neither or both of ``model`` and ``mblt``.
        ConfigError: bad grid file or a point's config is invalid.
        CancelledError: after the results of the finished points were written.
    """
    reporter = as_reporter(callback, cancel_token)
    started = time.perf_counter()
    output = Path(output_dir).resolve()
    calib_paths = _paths(calib_data_path)
    spec, folder = load_grid(grid)
    seconds: dict[str, float] = {}
    explicit = {"target_device": target_device, "use_random_calib": use_random_calib,
                "calib_data_path": list(calib_paths) if calib_paths else None}
    points = expand_grid(spec, folder=folder, **explicit)
    base = base_config(spec, folder=folder, **explicit)
    _make_folder(output)
    mblt_path = _mblt(model, mblt, output, reporter, seconds, parse_options)
    tasks = _write_point_configs(points, output, mblt_path, calib_paths)
    calibrations = _fill_statistics_cache(points, mblt_path, calib_paths, reporter, seconds)
    records = _run_points(points, tasks, base, executor or make_executor("local", max_workers), reporter, on_point,
                          seconds)
    front = _mark_front(records)
    seconds["total"] = time.perf_counter() - started
    result = SweepResult(records, front, calibrations, seconds, output / RESULTS_JSON, output / RESULTS_CSV,
                         mblt_path, base.model_dump(mode="json", by_alias=True))
    _write_results(result)
    _raise_if_cancelled(records, result)
    return result


def _paths(calib_data_path) -> tuple[str, ...]:
    if calib_data_path is None:
        return ()
    items = [calib_data_path] if isinstance(calib_data_path, (str, Path)) else list(calib_data_path)
    return tuple(str(Path(item).resolve()) for item in items)


def _make_folder(output: Path) -> None:
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputWriteError(f"Cannot create the sweep output folder '{output}': {error.strerror}.",
                               hint="Choose a writable --output-dir.", file=str(output)) from error


def _mblt(model, mblt, output: Path, reporter: Reporter, seconds: dict[str, float], parse_options) -> Path:
    if (model is None) == (mblt is None):
        raise ArgumentError("Give exactly one of a source model and an MBLT for the sweep.",
                            hint="Pass --model FILE or --mblt FILE.mblt.")
    if mblt is not None:
        return Path(mblt).resolve()
    from compiler_core.api import mblt_compile

    started = time.perf_counter()
    path = Path(mblt_compile(model, output / "model.mblt", callback=reporter, **parse_options)).resolve()
    seconds["parse"] = time.perf_counter() - started
    return path


def _write_point_configs(points: Sequence[SweepPoint], output: Path, mblt: Path,
                         calib_paths: tuple[str, ...]) -> list[PointTask]:
    tasks = []
    for point in points:
        mxq = output / f"{point.name}.mxq"
        config_path = output / f"{point.name}.config.json"
        config = point.config.model_copy(update={"save_paths": [str(mxq)], "model_paths": [str(mblt)]})
        atomic_write_text(config_path, json.dumps(config.model_dump(mode="json", by_alias=True), indent=2))
        tasks.append(PointTask(point.index, point.name, str(mblt), str(config_path), calib_paths or None, str(mxq)))
    return tasks


def _fill_statistics_cache(points: Sequence[SweepPoint], mblt: Path, calib_paths: tuple[str, ...],
                           reporter: Reporter, seconds: dict[str, float]) -> int:
    """Calibrate once per distinct data/collection settings, so that every point finds its statistics cached."""
    from compiler_core.compile import prepare_statistics

    started = time.perf_counter()
    calibrations = 0
    for config in _distinct_calibrations(points):
        hit = prepare_statistics(mblt, config, reporter=reporter, calib_data_path=list(calib_paths) or None)
        calibrations += 0 if hit else 1
    seconds["calibrate"] = time.perf_counter() - started
    logger.info("Sweep statistics: %d calibration run(s) in %.2f s", calibrations, seconds["calibrate"])
    return calibrations


def _distinct_calibrations(points: Sequence[SweepPoint]) -> list[CompileConfig]:
    distinct: dict[str, CompileConfig] = {}
    for point in points:
        key = json.dumps([point.config.model_dump(mode="json", include=set(_CALIBRATION_KEYS)),
                          point.config.calibration.num_samples], sort_keys=True)
        distinct.setdefault(key, point.config)
    return list(distinct.values())


def _run_points(points: Sequence[SweepPoint], tasks: Sequence[PointTask], base: CompileConfig,
                executor: SweepExecutor, reporter: Reporter, on_point: PointCallback | None,
                seconds: dict[str, float]) -> list[dict[str, Any]]:
    started = time.perf_counter()
    records: dict[int, dict[str, Any]] = {}
    names = {task.index: task.name for task in tasks}

    def forward(index: int, event: ProgressEvent) -> None:
        reporter.emit(f"{names[index]}/{event.stage}", event.done, event.total, event.message)

    reporter.emit("sweep", 0, len(tasks), f"compiling {len(tasks)} points")
    for outcome in executor.run(tasks, on_event=forward, cancel_token=reporter.cancel_token):
        index = outcome["index"]
        records[index] = make_record(points[index], tasks[index], base, outcome)
        reporter.emit("sweep", len(records), len(tasks), f"{names[index]} {outcome['status']}")
        if on_point is not None:
            on_point(records[index])
    seconds["points"] = time.perf_counter() - started
    return [records[task.index] for task in tasks]


def make_record(point: SweepPoint, task: PointTask, base: CompileConfig, outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The result record of one point (JSON-serialisable)."""
    config = json.loads(Path(task.config_path).read_text())
    record: dict[str, Any] = {
        "index": point.index, "name": point.name, "status": outcome["status"], "axes": point.values,
        "settings": differing_settings(point.config, base), "config": config, "config_file": task.config_path,
        "mxq": task.save_path if outcome["status"] == "ok" else None, "compile_seconds": round(outcome["seconds"], 3),
        "command": reproduce_command(task), "python": reproduce_python(task)}
    if outcome["status"] != "ok":
        return {**record, "error": outcome.get("error")}
    return {**record, **_metrics(outcome["result"])}


def _metrics(result: Mapping[str, Any]) -> dict[str, Any]:
    outputs = {name: {key: metrics.get(key) for key in ("sqnr_db", "cosine_mean", "max_abs_error", "top1_agreement",
                                                         "top5_agreement", "verdict") if key in metrics}
               for name, metrics in result.get("outputs", {}).items()}
    sqnrs = [m["sqnr_db"] for m in outputs.values() if m.get("sqnr_db") is not None]
    estimate = {mode: {"latency_ms": row["latency_ms"], "throughput_fps": row["throughput_fps"]}
                for mode, row in result.get("estimate", {}).items()}
    first_mode = next(iter(estimate), None)
    return {"outputs": outputs, "worst_sqnr_db": min(sqnrs) if sqnrs else None,
            "top1_agreement": _worst(outputs, "top1_agreement"), "top5_agreement": _worst(outputs, "top5_agreement"),
            "estimate": estimate, "estimate_note": ESTIMATE_NOTE,
            "latency_ms": estimate[first_mode]["latency_ms"] if first_mode else None,
            "mxq_size_bytes": result["size_bytes"], "int16_layers": result["int16_layers"],
            "statistics_from_cache": result["statistics_from_cache"],
            "timings": {k: round(v, 3) for k, v in result.get("timings", {}).items()}}


def _worst(outputs: Mapping[str, Mapping[str, Any]], key: str) -> float | None:
    values = [m[key] for m in outputs.values() if m.get(key) is not None]
    return min(values) if values else None


def reproduce_command(task: PointTask) -> str:
    """The ``qbcompiler compile`` command that rebuilds the point's MXQ byte for byte."""
    return _reproduction(task).command()


def reproduce_python(task: PointTask) -> str:
    """The Python call that rebuilds the point's MXQ byte for byte."""
    return _reproduction(task).python()


def _reproduction(task: PointTask) -> Reproduction:
    return Reproduction(task.mblt, task.config_path, task.save_path, tuple(task.calib_data_path or ()))


def _mark_front(records: list[dict[str, Any]]) -> list[int]:
    accuracy = [r.get("worst_sqnr_db") if r["status"] == "ok" else None for r in records]
    latency = [r.get("latency_ms") if r["status"] == "ok" else None for r in records]
    front = pareto_front(accuracy, latency)
    for position, record in enumerate(records):
        record["pareto"] = position in front
    return [records[i]["index"] for i in front]


CSV_COLUMNS = ("index", "name", "status", "settings", "worst_sqnr_db", "top1_agreement", "top5_agreement",
               "latency_ms", "mxq_size_bytes", "int16_layers", "compile_seconds", "statistics_from_cache", "pareto",
               "mxq", "command")


def results_csv(records: Sequence[Mapping[str, Any]]) -> str:
    """One CSV row per point; estimated latency/FPS per core mode as ``<mode>_latency_ms`` / ``<mode>_fps``."""
    modes = sorted({mode for record in records for mode in record.get("estimate", {})})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*CSV_COLUMNS, *(f"{mode}_{kind}" for mode in modes for kind in ("latency_ms", "fps"))])
    for record in records:
        row = {**record, "settings": "; ".join(f"{k}={v}" for k, v in record.get("settings", {}).items())}
        estimates = [record.get("estimate", {}).get(mode, {}) for mode in modes]
        writer.writerow([_cell(row.get(column)) for column in CSV_COLUMNS] +
                        [_cell(e.get(key)) for e in estimates for key in ("latency_ms", "throughput_fps")])
    return buffer.getvalue()


def _cell(value: Any) -> Any:
    return "" if value is None else value


def _write_results(result: SweepResult) -> None:
    atomic_write_text(result.json_path, json.dumps(result.to_dict(), indent=2))
    atomic_write_text(result.csv_path, results_csv(result.records))


def _raise_if_cancelled(records: Sequence[Mapping[str, Any]], result: SweepResult) -> None:
    cancelled = [r["name"] for r in records if r["status"] == "cancelled"]
    if cancelled:
        done = sum(1 for r in records if r["status"] == "ok")
        raise CancelledError(f"Sweep cancelled: {done} of {len(records)} points finished; their results are in "
                             f"{result.json_path}.", stage="sweep", cancelled=len(cancelled))
