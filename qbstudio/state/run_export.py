"""Exporting compared runs (Qt-free): the reproduction of a run, the HTML report and the per-layer CSV.

The HTML comes from :mod:`compiler_core.sweep.report` (the renderer ``qbcompiler sweep --report``
uses), the reproduction from :mod:`compiler_core.sweep.reproduce`; this module only turns
:class:`~qbstudio.state.runs.RunRecord` objects into their inputs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compiler_core.errors import QBCompilerError
from compiler_core.fileio import atomic_write_text
from compiler_core.sweep.pareto import pareto_front
from compiler_core.sweep.report import RUNS_FORMAT, layers_csv, write_runs_report
from compiler_core.sweep.reproduce import Reproduction, reproduction_of
from compiler_core.sweep.run import ESTIMATE_NOTE
from qbstudio.state.compare import resolved_config, setting_text, settings_diff
from qbstudio.state.runs import RunRecord

logger = logging.getLogger(__name__)

PARETO_AXES = {"accuracy": "worst output SQNR (dB)", "latency": f"latency (ms) of the first core mode, {ESTIMATE_NOTE}"}


def reproduction(run: RunRecord) -> Reproduction:
    """How to rebuild ``run``'s MXQ byte for byte (read from the MXQ; may write ``<name>.reproduce.json``).

    Raises:
        QBCompilerError: the MXQ is missing or unreadable, or the model it was compiled from changed.
    """
    return reproduction_of(run.mxq_path)


def copy_text(run: RunRecord, kind: str) -> str:
    """The clipboard text of "Copy as command" (``kind="command"``) or "Copy as Python" (``"python"``)."""
    found = reproduction(run)
    return found.command() if kind == "command" else found.python()


def layer_rows(run: RunRecord, order: Sequence[str] = ()) -> list[dict[str, Any]]:
    """``run``'s per-layer analysis rows in graph ``order`` (layers not in it last, in stored order)."""
    rank = {name: index for index, name in enumerate(order)}
    indexed = list(enumerate(run.layers))
    indexed.sort(key=lambda item: (rank.get(item[1].get("layer"), len(rank) + item[0])))
    return [dict(row) for _, row in indexed]


def report_data(runs: Sequence[RunRecord], baseline: int = 0, *, model: str = ""
                ) -> dict[str, Any]:
    """The ``qbstudio-runs`` data :func:`compiler_core.sweep.report.write_runs_report` renders."""
    diff = settings_diff(runs) if len(runs) > 1 else []
    front = set(pareto_front([run.accuracy() for run in runs], [run.latency_ms() for run in runs]))
    records = [_record(run, {key: setting_text(key, values[index]) for key, values in diff}, index in front)
               for index, run in enumerate(runs)]
    base = runs[baseline] if runs else None
    return {"format": RUNS_FORMAT, "model": model, "baseline": base.label if base else "",
            "base_config": resolved_config(base) if base else {}, "pareto_axes": PARETO_AXES, "records": records}


def _record(run: RunRecord, settings: dict[str, Any], on_front: bool) -> dict[str, Any]:
    try:
        command = copy_text(run, "command")
    except (QBCompilerError, OSError) as error:
        logger.info("run #%d has no reproduction command: %s", run.run_id, error)
        command = f"(not reproducible: {getattr(error, 'message', error)})"
    return {"name": run.label, "status": "ok", "summary": run.config_summary, "created": run.created,
            "settings": settings, "outputs": run.outputs, "worst_sqnr_db": run.accuracy(),
            "latency_ms": run.latency_ms(), "estimate": run.estimate, "mxq": run.mxq_path,
            "mxq_size_bytes": run.size_bytes, "int16_layers": run.int16_layers, "compile_seconds": run.duration_s,
            "pareto": on_front, "command": command, "cpu_parts": run.cpu_parts}  # outside the latency estimate


def write_report(runs: Sequence[RunRecord], path: str | Path, *, baseline: int = 0, order: Sequence[str] = (),
                 model: str = "") -> Path:
    """Write the self-contained HTML report of the compared ``runs`` to ``path``.

    Raises:
        OutputWriteError: ``path`` cannot be written.
    """
    layers = {run.label: layer_rows(run, order) for run in runs}
    return write_runs_report(report_data(runs, baseline, model=model), layers, path)


def write_layers_csv(runs: Sequence[RunRecord], path: str | Path, *, order: Sequence[str] = ()) -> Path:
    """Write one CSV row per layer per run (graph order) to ``path``.

    Raises:
        OutputWriteError: ``path`` cannot be written.
    """
    return Path(atomic_write_text(path, layers_csv({run.label: layer_rows(run, order) for run in runs})))
