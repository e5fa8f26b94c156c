"""Wires Runs & Compare to the rest of the window: graph heatmap, layer selection, run deletion and sweeps.

Kept out of :mod:`qbstudio.main_window` so the window only creates it; every method here is one
user action or one job outcome of the compare features.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from compiler_core.progress import ProgressEvent
from qbstudio import dialogs
from qbstudio.state.compare import colouring_choices
from qbstudio.state.performance import CYCLES_COLOURING
from qbstudio.state.runs import RunRecord
from qbstudio.widgets.compare_graphs import apply_colouring
from qbstudio.workers import Worker

if TYPE_CHECKING:
    from qbstudio.main_window import MainWindow

logger = logging.getLogger(__name__)

SWEEP_SLOT = "sweep"


def run_sweep_job(grid: dict[str, Any], output_dir: Path, *, mblt: Path, calibration: dict[str, Any],
                  base_config: dict[str, Any], on_point, callback=None, cancel_token=None) -> Any:
    """``compiler_core.sweep.run_sweep`` over the project's MBLT and data, from the current settings."""
    from compiler_core.sweep import run_sweep

    spec = {**grid, "baseConfig": base_config}
    return run_sweep(spec, output_dir, mblt=mblt, calib_data_path=calibration.get("path") or None,
                     use_random_calib=True if calibration.get("use_random") else None, callback=callback,
                     cancel_token=cancel_token, on_point=on_point)


class _PointRelay(QObject):
    """Carries each finished sweep point from the sweep's thread to the GUI thread."""

    point = Signal(dict)


class CompareController(QObject):
    """The compare features' glue for one :class:`~qbstudio.main_window.MainWindow`."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.compare = window.compare
        self.graph = window.graph
        self._relay = _PointRelay(self)
        self._relay.point.connect(self._on_point)
        self._sweep_number = 0
        self.compare.picks_changed.connect(self.update_colourings)
        self.compare.layer_activated.connect(self._on_layer)
        self.compare.delete_confirmed.connect(self._on_delete)
        self.compare.rename_confirmed.connect(self._on_rename)
        self.compare.import_requested.connect(self._ask_import)
        self.compare.use_settings_requested.connect(self.use_run_settings)
        self.compare.sweep.sweep_requested.connect(self.start_sweep)
        self.compare.sweep.cancel_requested.connect(self.cancel_sweep)
        self.graph.colouring_changed.connect(self.apply_colouring)
        self.graph.node_selected.connect(self.compare.show_layer)
        window.support.node_activated.connect(self.compare.show_layer)
        window.session.model_changed.connect(self._on_model)

    @property
    def window(self) -> MainWindow:
        """The window (its Qt parent: no Python reference is kept, so no cycle that only a garbage
        collection in some worker thread could break, deleting Qt objects there)."""
        return self.parent()

    def cancel_sweep(self) -> None:
        """Stop the running sweep (the finished points stay)."""
        self.window.runner.cancel(SWEEP_SLOT)

    # -- graph colours ----------------------------------------------------------------------------

    def update_colourings(self) -> None:
        """Offer the picked runs' SQNR and their deltas to the baseline as graph colourings."""
        self.graph.set_colourings(colouring_choices(self.compare.picked_runs, self.compare.baseline_id))
        if self.graph.colouring != "support":
            self.apply_colouring(self.graph.colouring)

    def apply_colouring(self, key: str) -> None:
        """Colour the graph by ``key``: ``support``, ``sqnr:<run>`` or ``delta:<run>:<baseline>``.

        The cycles colouring (``cycles:<mode>``) is the window's (node details > Performance).
        """
        if key.startswith(CYCLES_COLOURING):
            return
        apply_colouring(self.graph, key, self.window.session.runs.get)

    # -- layers, runs -----------------------------------------------------------------------------

    def _on_model(self) -> None:
        loaded = self.window.loaded
        self.compare.set_layer_order([node.name for node in loaded.model.graph] if loaded else [])
        self.compare.model_name = str(getattr(self.window.project.model, "path", "") or "") if loaded else ""
        self.compare.histogram.mblt_path = str(self.window.project.mblt_path) if loaded else ""
        self.compare.twin.set_model(self.compare.histogram.mblt_path)

    def _on_layer(self, name: str) -> None:
        self.window.support.select_node(name)
        self.graph.select_node(name)
        self.window.show_node(name)

    def _on_delete(self, run_id: int) -> None:
        if self.window.session.remove_run(run_id):
            self.window.statusBar().showMessage(f"Run #{run_id} deleted from the project", 5000)
            self.window.mark_dirty()

    def _on_rename(self, run_id: int, name: str) -> None:
        if self.window.session.rename_run(run_id, name):
            self.window.mark_dirty()

    def _ask_import(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getOpenFileName(self.window, "Import sweep results", str(self.window.project.work_dir),
                                              "Sweep results (sweep.json);;JSON (*.json)")
        if path:
            self.import_sweep(path)

    def import_sweep(self, path: str | Path) -> int:
        """Add the finished points of a ``qbcompiler sweep`` of the open model as runs; returns how many."""
        from compiler_core.errors import QBCompilerError
        from qbstudio.state.compare import read_sweep_results

        window = self.window
        if window.loaded is None:
            dialogs.show_error(window, "Nothing to import into", "Open the model the sweep compiled first.")
            return 0
        try:
            records, skipped = read_sweep_results(path, window.session.model_sha256)
        except QBCompilerError as error:
            dialogs.show_error(window, "Cannot import the sweep", error)
            return 0
        known = {run.mxq_path for run in window.project.runs.runs}
        calibration = {"path": window.project.calibration.path, "use_random": window.project.calibration.use_random}
        added = 0
        for record in records:
            if str(Path(record["mxq"])) in known:
                continue
            run = RunRecord.from_sweep_record(window.project.runs.next_id(), record,
                                              model_sha256=window.session.model_sha256,
                                              origin=f"{Path(path).parent.name} · {record['name']}",
                                              calibration=calibration)
            window.project.runs.add(run)
            added += 1
        window.session.runs_changed.emit()
        window.mark_dirty()
        window.statusBar().showMessage(f"Imported {added} run(s) from {Path(path).name}"
                                       f"{f'; {skipped} point(s) had not compiled' if skipped else ''}", 8000)
        return added

    def use_run_settings(self, run_id: int) -> bool:
        """Make run ``run_id``'s settings the compile settings (the best point of a sweep, to compile for the project)
        and show them in the Compile tab."""
        window = self.window
        run = window.session.runs.get(run_id)
        if run is None or not window.options.use_run_settings(run.config):
            return False
        window.tabs.setCurrentIndex(2)
        window.statusBar().showMessage(f"The compile settings are now those of {run.label}: press Compile to compile "
                                       "them for the project.", 10000)
        return True

    # -- sweeps -----------------------------------------------------------------------------------

    def start_sweep(self, grid: dict[str, Any]) -> bool:
        """Run the sweep ``grid`` over the project's model in the background; points stream into the runs."""
        window = self.window
        if window.loaded is None or not window.project.has_mblt:
            dialogs.show_error(window, "Nothing to sweep", "Import a model first.")
            return False
        if window.runner.is_busy(SWEEP_SLOT) or window.runner.is_busy("compile"):
            dialogs.show_error(window, "Sweep not started", "A compile or sweep is running; wait or cancel it.")
            return False
        self._sweep_number = self._next_sweep_number()
        output = window.project.work_dir / "sweeps" / f"sweep-{self._sweep_number:03d}"
        calibration = {"path": window.project.calibration.path, "use_random": window.project.calibration.use_random}
        base = window.project.settings.config.to_dict()
        self._context = (window.session.model_sha256, calibration)
        from compiler_core.errors import QBCompilerError
        from compiler_core.sweep import expand_grid, load_grid

        try:
            spec, folder = load_grid({**grid, "baseConfig": base})
            points = expand_grid(spec, folder=folder)
        except (QBCompilerError, ValueError) as error:
            dialogs.show_error(window, "Invalid sweep grid", error)
            return False
        worker = Worker(SWEEP_SLOT, run_sweep_job, grid, output, mblt=window.project.mblt_path,
                        calibration=calibration, base_config=base, on_point=self._relay.point.emit)
        worker.progress.connect(self._on_progress)
        worker.succeeded.connect(lambda result: self._finished(f"Sweep done: {len(result.records)} points, "
                                                               f"{len(result.front)} on the Pareto front "
                                                               f"({result.seconds.get('total', 0):.1f} s)"))
        worker.failed.connect(self._on_failed)
        worker.cancelled.connect(lambda: self._finished("Sweep cancelled; the finished points are in the runs table."))
        self.compare.sweep.started([point.name for point in points])
        window.runner.start(SWEEP_SLOT, worker)
        return True

    def _next_sweep_number(self) -> int:
        folder = self.window.project.work_dir / "sweeps"
        existing = [int(p.name.split("-")[-1]) for p in folder.glob("sweep-*") if p.name.split("-")[-1].isdigit()] \
            if folder.is_dir() else []
        return max(existing, default=0) + 1

    def _on_progress(self, event: ProgressEvent) -> None:
        self.compare.sweep.show_event(event.stage, event.done, event.total or 0, event.message or "")

    def _on_point(self, record: dict[str, Any]) -> None:
        name = record.get("name", "?")
        if record.get("status") != "ok":
            error = record.get("error") or {}
            self.compare.sweep.point_finished(name, f"{record.get('status')} {error.get('code', '')}".strip())
            return
        model_sha256, calibration = self._context
        if model_sha256 != self.window.session.model_sha256:
            logger.info("sweep point %s finished after the model changed; not recorded", name)
            return
        run = RunRecord.from_sweep_record(self.window.project.runs.next_id(), record, model_sha256=model_sha256,
                                          origin=f"sweep {self._sweep_number} · {name}", calibration=calibration)
        sqnr, latency = run.accuracy(), run.latency_ms()
        self.compare.sweep.point_finished(
            name, f"run #{run.run_id}: {'—' if sqnr is None or not math.isfinite(sqnr) else f'{sqnr:.1f} dB'}, "
                  f"{'—' if latency is None else f'{latency:.3g} ms (est.)'}")
        self.window.session.add_run(run)
        self.window.mark_dirty()

    def _on_failed(self, error: Exception) -> None:
        self._finished(f"Sweep failed: {getattr(error, 'code', type(error).__name__)}")
        dialogs.show_error(self.window, "Sweep failed", error)

    def _finished(self, text: str) -> None:
        self.compare.sweep.finished(text)
        self.window.statusBar().showMessage(text, 8000)
