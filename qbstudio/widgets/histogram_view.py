"""Why a layer differs: the activation histogram of one layer with each compared run's clipping range.

The histogram comes from the cached calibration statistics (loaded in a background job); each run's
range, scale and zero point are read from its MXQ, so the lines are what the compiled model uses.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from qbstudio.state.compare import (
    ClipRange,
    StatisticsSource,
    WeightRanges,
    clip_range,
    histogram,
    mxq_tensors,
    mxq_weight_ranges,
)
from qbstudio.state.runs import RunRecord
from qbstudio.widgets.layer_plot import RUN_COLOURS, _style_axes
from qbstudio.workers import JobRunner, Worker

logger = logging.getLogger(__name__)

COLUMNS = ("Run", "Bits", "Scale", "Zero point", "Clip low", "Clip high", "Observed range", "Source")
SLOT = "histogram"


def _fmt(value: float) -> str:
    return f"{value:.6g}"


class HistogramView(QWidget):
    """Histogram of the selected layer's output tensor, one clip range per compared run, and a parameter table.

    Args:
        runner: Runs the statistics lookup off the GUI thread.
    """

    def __init__(self, runner: JobRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.source = StatisticsSource()
        self.title = QLabel("Select a layer (in the graph, the layer table or the per-layer plot).",
                            objectName="histogramTitle", wordWrap=True)
        self.legend_label = QLabel(objectName="histogramLegend", wordWrap=True)
        self.table = QTableWidget(0, len(COLUMNS), objectName="clipTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self._splitter = QSplitter(Qt.Orientation.Vertical)
        self._splitter.addWidget(self.table)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.legend_label)
        layout.addWidget(self._splitter, 1)
        self._plot: Any = None
        self._curve: Any = None
        self._lines: list[list[Any]] = []
        self._runs: list[RunRecord] = []
        self.layer: str | None = None
        self.tensor: str | None = None
        self.ranges: dict[int, ClipRange | None] = {}
        self.counts: np.ndarray | None = None
        self.edges: np.ndarray | None = None
        self._tensor_cache: dict[str, dict[str, dict[str, Any]]] = {}
        self._weight_cache: dict[str, dict[str, WeightRanges]] = {}
        self.weights: dict[int, WeightRanges | None] = {}
        self._weight_plot: Any = None
        self._weight_curves: list[list[Any]] = []
        self._pending: RunRecord | None = None
        runner.busy_changed.connect(self._after_job)
        self.mblt_path: str = ""
        """The MBLT the runs compiled (the project's): statistics are looked up for it."""

    def _build_plot(self) -> Any:
        """The plot and its items, created once (redraws only update them: no pyqtgraph garbage per layer)."""
        if self._plot is None:
            import pyqtgraph as pg

            self._plot = pg.PlotWidget(background="w", objectName="histogramPlot")
            _style_axes(self._plot)
            self._plot.setLabel("left", "count (log10)", color="#222")
            self._plot.setLabel("bottom", "activation value", color="#222")
            self._curve = self._plot.plot([], [], stepMode="center", fillLevel=0, brush=(120, 120, 120, 110),
                                          pen=pg.mkPen("#555"))
            self._lines = []
            for index, colour in enumerate(RUN_COLOURS):
                pen = pg.mkPen(colour, width=2, style=Qt.PenStyle.DashLine)
                pair = [pg.InfiniteLine(angle=90, pen=pen, label=label,
                                        labelOpts={"color": colour, "position": 0.1 + 0.08 * index,
                                                   "fill": (255, 255, 255, 200)})
                        for label in (None, "")]  # the run's number labels the high end only
                for line in pair:
                    line.hide()
                    self._plot.addItem(line)
                self._lines.append(pair)
            self._weight_plot = pg.PlotWidget(background="w", objectName="weightRangePlot")
            _style_axes(self._weight_plot)
            self._weight_plot.setLabel("left", "weights (as compiled)", color="#222")
            self._weight_plot.setLabel("bottom", "output channel", color="#222")
            self._weight_curves = [[self._weight_plot.plot([], [], pen=pg.mkPen(colour, width=1.5)) for _ in range(2)]
                                   for colour in RUN_COLOURS]
            self._splitter.insertWidget(0, self._plot)
            self._splitter.insertWidget(1, self._weight_plot)
            self._splitter.setSizes([400, 180, 140])
        return self._plot

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Build the plot on first show."""
        self._build_plot()
        self._draw()
        super().showEvent(event)

    def set_runs(self, runs: list[RunRecord]) -> None:
        """The compared runs (their MXQs give the ranges)."""
        self._runs = list(runs)
        if self.layer and self._runs:
            self.show_layer(self.layer)
        elif not self._runs:
            self.layer = self.tensor = None
            self.ranges, self.counts, self.edges = {}, None, None
            self.title.setText("Select a layer (in the graph, the layer table or the per-layer plot).")
            self._fill_table()
            self._draw()

    def show_layer(self, layer: str) -> None:
        """Show layer ``layer``: ranges from the MXQs now, the histogram when the statistics are loaded."""
        self.layer = layer
        run = next((r for r in self._runs if r.layer_row(layer)), None)
        row = run.layer_row(layer) if run else None
        self.tensor = (row or {}).get("tensor") or layer
        self.ranges = {r.run_id: clip_range(self._mxq_tensors(r).get(self.tensor)) for r in self._runs}
        self.weights = {r.run_id: self._mxq_weights(r).get(layer) for r in self._runs}
        self.counts = self.edges = None
        self._fill_table()
        self._draw()
        self._load_statistics(run)

    def _mxq_tensors(self, run: RunRecord) -> dict[str, dict[str, Any]]:
        if run.mxq_path not in self._tensor_cache:
            from compiler_core.errors import QBCompilerError

            try:
                self._tensor_cache[run.mxq_path] = mxq_tensors(run.mxq_path)
            except (QBCompilerError, OSError) as error:
                logger.warning("run #%d: cannot read %s: %s", run.run_id, run.mxq_path, error)
                self._tensor_cache[run.mxq_path] = {}
        return self._tensor_cache[run.mxq_path]

    def _mxq_weights(self, run: RunRecord) -> dict[str, WeightRanges]:
        if run.mxq_path not in self._weight_cache:
            from compiler_core.errors import QBCompilerError

            try:
                self._weight_cache[run.mxq_path] = mxq_weight_ranges(run.mxq_path)
            except (QBCompilerError, OSError) as error:
                logger.warning("run #%d: cannot read %s: %s", run.run_id, run.mxq_path, error)
                self._weight_cache[run.mxq_path] = {}
        return self._weight_cache[run.mxq_path]

    def _draw_weights(self) -> None:
        """Per output channel, each run's smallest and largest real weight (one colour per run)."""
        shown = False
        for index, pair in enumerate(self._weight_curves):
            run = self._runs[index] if index < len(self._runs) else None
            ranges = self.weights.get(run.run_id) if run is not None else None
            if ranges is None:
                for curve in pair:
                    curve.setData([], [])
                continue
            channels = np.arange(ranges.low.size)
            pair[0].setData(channels, ranges.low)
            pair[1].setData(channels, ranges.high)
            shown = True
        self._weight_plot.setVisible(shown)

    def _load_statistics(self, run: RunRecord | None) -> None:
        if run is None or not self.mblt_path or not run.calibration:
            self.title.setText(f"<b>{self.layer}</b> ({self.tensor}): no statistics recorded for these runs "
                               "(runs from before this version); the clip ranges below come from the MXQs.")
            return
        if self.runner.is_busy(SLOT):
            self.runner.cancel(SLOT)
            self._pending = run
            return
        self._pending = None
        self.title.setText(f"<b>{self.layer}</b> ({self.tensor}): loading statistics from the cache…")
        worker = Worker(SLOT, self.source.tensor, self.mblt_path, run.config, run.calibration, self.tensor)
        tensor = self.tensor
        worker.succeeded.connect(lambda stats: self._on_stats(tensor, stats))
        worker.failed.connect(lambda error: self.title.setText(f"<b>{self.layer}</b>: statistics unavailable: "
                                                               f"{getattr(error, 'message', error)}"))
        self.runner.start(SLOT, worker)

    def _after_job(self, slot: str, busy: bool) -> None:
        """Load the statistics asked for while the last lookup ran, once the runner has freed the slot (keyed on the
        slot, not on the job's end: a request between the two would be lost, as the calibration preview's was)."""
        if slot != SLOT or busy:
            return
        pending, self._pending = self._pending, None
        if pending is not None:
            self._load_statistics(pending)

    def _on_stats(self, tensor: str, stats: Any) -> None:
        if tensor != self.tensor:
            return
        if stats is None:
            self.title.setText(f"<b>{self.layer}</b> ({tensor}): this tensor has no calibration statistics "
                               "(it takes its parameters from another tensor).")
            return
        self.edges, self.counts = histogram(stats)
        self.title.setText(f"<b>{self.layer}</b> — tensor {tensor}: {stats.count:,} values over "
                           f"{stats.num_samples} calibration samples, min {stats.min:.4g}, max {stats.max:.4g}. "
                           "Dashed lines: each run's clipping range (from its MXQ).")
        self._draw()

    def _fill_table(self) -> None:
        self.table.setRowCount(len(self._runs))
        for row, run in enumerate(self._runs):
            clip = self.ranges.get(run.run_id)
            cells = [run.label, "—", "—", "—", "—", "—", "—", "not quantized per tensor"] if clip is None else [
                run.label, str(clip.bits), _fmt(clip.scale), str(clip.zero_point), _fmt(clip.low), _fmt(clip.high),
                "—" if clip.observed is None else f"[{_fmt(clip.observed[0])}, {_fmt(clip.observed[1])}]", clip.source]
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if column == 0:
                    item.setForeground(QColor(RUN_COLOURS[row % len(RUN_COLOURS)]))
                self.table.setItem(row, column, item)

    def _draw(self) -> None:
        if self._plot is None:
            return
        self._draw_weights()
        if self.counts is not None and self.counts.size:
            self._curve.setData(self.edges, np.log10(self.counts.astype(float) + 1.0))
        else:
            self._curve.setData([0.0, 0.0], [0.0])
        legend = []
        for index, pair in enumerate(self._lines):
            run = self._runs[index] if index < len(self._runs) else None
            clip = self.ranges.get(run.run_id) if run is not None else None
            for line, position in zip(pair, (clip.low, clip.high) if clip else (math.nan, math.nan)):
                line.setVisible(math.isfinite(position))
                if math.isfinite(position):
                    line.setPos(position)
                    if line is pair[1]:
                        line.label.setFormat(f"#{run.run_id}")
            if clip is not None:
                legend.append(f"<span style='color:{RUN_COLOURS[index]}'>┅ {run.label}: [{clip.low:.3g}, "
                              f"{clip.high:.3g}] scale {clip.scale:.3g}</span>")
        self.legend_label.setText("&nbsp;&nbsp;".join(["<span style='color:#555'>▇ calibration histogram</span>",
                                                        *legend]))

    def line_positions(self) -> dict[int, tuple[float, float]]:
        """Run id -> the clip range drawn (for tests)."""
        return {run_id: (clip.low, clip.high) for run_id, clip in self.ranges.items() if clip is not None}
