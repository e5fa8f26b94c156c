"""Compile runs: one RunRecord per finished compile, and the RunHistory a project keeps."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_LAYER_KEYS = ("layer", "tensor", "op", "precision", "sqnr_db", "cosine_mean", "verdict")


@dataclass
class RunRecord:
    """What one successful compile produced, as the summary and the compare view show it.

    Attributes:
        run_id: 1, 2, ... within the project.
        created: ISO time the compile finished (UTC).
        device: Target device string.
        core_modes: Core modes compiled.
        mxq_path: Absolute path of the MXQ.
        size_bytes: MXQ size.
        config: The camelCase CompileConfig the run used.
        config_summary: One-line description of ``config``.
        metrics: The analysis summary (verdict, min output SQNR, mean cosine, ...).
        outputs: Per-output metrics.
        layers: Per-layer rows (layer, op, precision, sqnr_db, ...) from the analysis JSON.
        precisions: Layer name -> precision for every quantized layer.
        duration_s: Wall time of the compile.
        samples: Calibration and held-out sample counts.
        model_sha256: SHA-256 of the MBLT the run compiled: the run belongs to that model only.
        estimate: Core mode -> ``{"latency_ms", "throughput_fps"}`` from the cost model (an estimate).
        int16_layers: Layers that compute in 16 bits (``QuantizedModel.int16_layers``: the count mixed precision's
            limit and summary use).
        calibration: ``{"path", "use_random"}``: the data the run calibrated on (to find its statistics).
        origin: ``compile`` (the Compile button) or the sweep point's name (``sweep 1 · point-03``).
        preset: The preset last applied to the settings ("" if none).
        suited_preset: The preset made for this kind of model (``CompileResult.suited_preset``).
        mixed_precision: The automatic mixed precision outcome (target, met, int16 layers, latency), if it ran.
        cpu_parts: ``head`` / ``tail``: the parts that run on the host CPU (outside the NPU latency estimate).
    """

    run_id: int
    created: str
    device: str
    core_modes: list[str]
    mxq_path: str
    size_bytes: int
    config: dict[str, Any]
    config_summary: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    layers: list[dict[str, Any]] = field(default_factory=list)
    precisions: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    samples: dict[str, int] = field(default_factory=dict)
    model_sha256: str = ""
    estimate: dict[str, dict[str, float]] = field(default_factory=dict)
    int16_layers: int = 0
    calibration: dict[str, Any] = field(default_factory=dict)
    origin: str = "compile"
    preset: str = ""
    suited_preset: dict[str, Any] = field(default_factory=dict)
    mixed_precision: dict[str, Any] = field(default_factory=dict)
    cpu_parts: list[str] = field(default_factory=list)

    @classmethod
    def from_result(cls, run_id: int, result: dict[str, Any], analysis: dict[str, Any] | None, *,
                    config: dict[str, Any], config_summary: str, precisions: dict[str, str] | None = None,
                    duration_s: float = 0.0, model_sha256: str = "", calibration: dict[str, Any] | None = None,
                    preset: str = "") -> RunRecord:
        """Build a record from ``CompileResult.to_dict()`` and the analysis JSON beside the MXQ."""
        from compiler_core.runtime.profile import cpu_parts

        rows = [{key: row.get(key) for key in _LAYER_KEYS} for row in (analysis or {}).get("layers", [])]
        estimate = {mode: {"latency_ms": row.get("latency_ms"), "throughput_fps": row.get("throughput_fps")}
                    for mode, row in (result.get("estimate") or {}).items()}
        return cls(run_id=run_id, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   device=result["device"], core_modes=list(result["core_modes"]), mxq_path=result["output"],
                   size_bytes=int(result["size_bytes"]), config=config, config_summary=config_summary,
                   metrics=dict(result.get("analysis") or {}), outputs=dict(result.get("outputs") or {}),
                   layers=rows, precisions=dict(precisions or {}), duration_s=duration_s,
                   samples=dict(result.get("samples") or {}), model_sha256=model_sha256, estimate=estimate,
                   int16_layers=int((result.get("program") or {}).get("int16_layers", 0)),
                   calibration=dict(calibration or {}), preset=preset,
                   suited_preset=dict(result.get("suited_preset") or {}),
                   mixed_precision=dict(result.get("mixed_precision") or {}),
                   cpu_parts=cpu_parts({"cpu_offload": result.get("cpu_offload")}))

    @classmethod
    def from_sweep_record(cls, run_id: int, record: dict[str, Any], *, model_sha256: str, origin: str,
                          calibration: dict[str, Any] | None = None) -> RunRecord:
        """Build a record from one finished point of ``compiler_core.sweep`` (``record["status"] == "ok"``)."""
        mxq = Path(record["mxq"])
        analysis = read_analysis(mxq.with_suffix(".analysis.json")) or {}
        config = dict(record.get("config") or {})
        config.pop("savePaths", None)
        config.pop("modelPaths", None)
        config.pop("calibDataPaths", None)  # the data is the run's calibration, as for Compile-button runs
        settings = ", ".join(f"{key}={value}" for key, value in (record.get("axes") or {}).items())
        return cls(run_id=run_id, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   device=str(config.get("targetDevice", "")), core_modes=list(record.get("estimate", {})),
                   mxq_path=str(mxq), size_bytes=int(record.get("mxq_size_bytes") or 0), config=config,
                   config_summary=f"{origin}: {settings}" if settings else origin,
                   metrics=dict(analysis.get("summary") or {}), outputs=dict(record.get("outputs") or {}),
                   layers=[{key: row.get(key) for key in _LAYER_KEYS} for row in analysis.get("layers", [])],
                   duration_s=float(record.get("compile_seconds") or 0.0), samples=dict(analysis.get("samples") or {})
                   if isinstance(analysis.get("samples"), dict) else {}, model_sha256=model_sha256,
                   estimate=dict(record.get("estimate") or {}), int16_layers=int(record.get("int16_layers") or 0),
                   calibration=dict(calibration or {}), origin=origin)

    @property
    def label(self) -> str:
        """Short name for combos and legends, e.g. ``#2 aries-rb``."""
        return f"#{self.run_id} {self.device}"

    def layer_sqnr(self) -> dict[str, float]:
        """Layer name -> SQNR in dB (layers without a finite SQNR are left out)."""
        return {row["layer"]: float(row["sqnr_db"]) for row in self.layers
                if isinstance(row.get("sqnr_db"), (int, float)) and math.isfinite(row["sqnr_db"])}

    def worst_layers(self, count: int | None = None) -> list[dict[str, Any]]:
        """Layer rows sorted by SQNR, worst (lowest) first."""
        ranked = sorted(self.layers, key=lambda row: _sort_key(row.get("sqnr_db")))
        return ranked if count is None else ranked[:count]

    def layer_row(self, name: str) -> dict[str, Any] | None:
        """The analysis row of layer ``name`` (or of the layer producing tensor ``name``)."""
        return next((row for row in self.layers if name in (row.get("layer"), row.get("tensor"))), None)

    def headline(self) -> dict[str, Any]:
        """The few metrics a table shows: verdict, min output SQNR, mean cosine, top-1 agreement."""
        top1 = [out.get("top1_agreement") for out in self.outputs.values() if out.get("top1_agreement") is not None]
        return {"verdict": self.metrics.get("verdict", ""), "sqnr_db": self.metrics.get("min_output_sqnr_db"),
                "cosine": self.metrics.get("mean_output_cosine"), "top1": min(top1) if top1 else None}

    def accuracy(self) -> float | None:
        """The worst output SQNR in dB (the Pareto chart's accuracy), or None."""
        value = self.metrics.get("min_output_sqnr_db")
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    def latency_ms(self) -> float | None:
        """Estimated latency (ms) of the first core mode, or None."""
        first = next(iter(self.estimate.values()), {})
        value = first.get("latency_ms")
        return float(value) if isinstance(value, (int, float)) else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the project file's ``runs`` entries)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """Inverse of :meth:`to_dict` (unknown keys are ignored)."""
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        if "cpu_parts" not in known:  # saved before runs recorded it: the parts the user chose (cpuLayers)
            chosen = (known.get("config") or {}).get("cpuLayers") or {}
            known["cpu_parts"] = [part for part in ("head", "tail") if chosen.get(part)]
        return cls(**known)


def _sort_key(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.inf


def read_analysis(path: str | Path | None) -> dict[str, Any] | None:
    """The analysis JSON written beside an MXQ, or None if there is none or it is unreadable."""
    if not path or not Path(path).is_file():
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        logger.warning("cannot read analysis %s: %s", path, error)
        return None


class RunHistory:
    """The runs of one project, oldest first."""

    def __init__(self, runs: list[RunRecord] | None = None) -> None:
        self.runs: list[RunRecord] = list(runs or [])

    def __len__(self) -> int:
        return len(self.runs)

    def next_id(self) -> int:
        """The id the next run gets."""
        return max((run.run_id for run in self.runs), default=0) + 1

    def add(self, run: RunRecord) -> None:
        """Append a finished run."""
        self.runs.append(run)

    def get(self, run_id: int) -> RunRecord | None:
        """The run with ``run_id``, or None."""
        return next((run for run in self.runs if run.run_id == run_id), None)

    @property
    def latest(self) -> RunRecord | None:
        """The newest run, or None."""
        return self.runs[-1] if self.runs else None

    def for_model(self, model_sha256: str | None) -> RunHistory:
        """The runs of the model whose MBLT hashes to ``model_sha256`` (none for None or "")."""
        if not model_sha256:
            return RunHistory()
        return RunHistory([run for run in self.runs if run.model_sha256 == model_sha256])

    def adopt(self, model_sha256: str) -> int:
        """Give runs recorded before runs carried a model hash to ``model_sha256``; returns how many."""
        orphans = [run for run in self.runs if not run.model_sha256]
        for run in orphans:
            run.model_sha256 = model_sha256
        return len(orphans)

    def remove(self, run_id: int) -> None:
        """Forget run ``run_id`` (its files are left alone)."""
        self.runs = [run for run in self.runs if run.run_id != run_id]

    def to_list(self) -> list[dict[str, Any]]:
        """JSON-ready list."""
        return [run.to_dict() for run in self.runs]

    @classmethod
    def from_list(cls, items: list[dict[str, Any]]) -> RunHistory:
        """Inverse of :meth:`to_list`."""
        return cls([RunRecord.from_dict(item) for item in items])


def compare_layers(first: RunRecord, second: RunRecord) -> tuple[list[str], list[float], list[float]]:
    """Per-layer SQNR of two runs on a common layer axis, ordered by ``first``'s worst layers.

    Returns:
        ``(layer names, SQNR of first, SQNR of second)``; a layer missing from one run is NaN there.
    """
    sqnr_a, sqnr_b = first.layer_sqnr(), second.layer_sqnr()
    names = [row["layer"] for row in first.worst_layers() if row.get("layer")]
    names += [name for name in sqnr_b if name not in sqnr_a]
    return names, [sqnr_a.get(n, math.nan) for n in names], [sqnr_b.get(n, math.nan) for n in names]
