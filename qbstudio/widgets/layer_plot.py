"""Per-layer plot of the compared runs: SQNR (or cosine) over the layers in graph order, and the delta to the baseline.

pyqtgraph is imported when the plot is built (the Runs tab's first show), not at start-up.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from qbstudio.state.compare import LayerSeries, layer_series
from qbstudio.state.runs import RunRecord

logger = logging.getLogger(__name__)

RUN_COLOURS = ("#1565c0", "#ef6c00", "#2e7d32", "#8e24aa")
"""Colour of the 1st..4th compared run, in every compare view."""

SYMBOLS = ("o", "t", "s", "d")
MAX_TICKS = 24
MAX_SYMBOLS = 80
"""Above this many layers the curves are drawn without point symbols (they would hide each other, and cost)."""
METRICS = {"sqnr_db": ("SQNR", "dB"), "cosine_mean": ("cosine", "")}


def _style_axes(plot: Any) -> None:
    plot.showGrid(x=True, y=True, alpha=0.3)
    for axis in ("left", "bottom"):
        plot.getAxis(axis).setTextPen("#222")
        plot.getAxis(axis).setPen("#888")


class LayerPlot(QWidget):
    """Two stacked plots over the layers: each run's metric, and its delta to the baseline.

    Clicking a layer (anywhere over its x position) emits :attr:`layer_activated`.

    Signals:
        layer_activated(str): the user clicked the layer with this name.
    """

    layer_activated = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.metric_combo = QComboBox(objectName="layerMetric")
        for key, (name, _unit) in METRICS.items():
            self.metric_combo.addItem(name, key)
        self.metric_combo.currentIndexChanged.connect(self._redraw)
        self.hint = QLabel("Click a layer to select it in the graph and the layer table.")
        self.hint.setStyleSheet("color: #555")
        self._runs: list[RunRecord] = []
        self._order: list[str] = []
        self._baseline = 0
        self.series: LayerSeries | None = None
        self.selected: str | None = None
        self._plots: dict[str, Any] | None = None
        self._legend: list[str] = []
        self.legend_label = QLabel(objectName="layerLegend")
        top = QHBoxLayout()
        top.addWidget(QLabel("Per layer, in graph order:"))
        top.addWidget(self.metric_combo)
        top.addWidget(self.hint, 1)
        self._holder = QVBoxLayout(self)
        self._holder.setContentsMargins(0, 0, 0, 0)
        self._holder.addLayout(top)
        self._holder.addWidget(self.legend_label)

    def _build(self) -> dict[str, Any]:
        if self._plots is None:
            import pyqtgraph as pg

            values = pg.PlotWidget(background="w", objectName="layerValues")
            delta = pg.PlotWidget(background="w", objectName="layerDelta")
            delta.setXLink(values)
            for plot in (values, delta):
                _style_axes(plot)
                # the finest tick level drew ~5x the grid lines (13 ms per axis paint): the 100 ms compare switch missed
                plot.getAxis("left").setStyle(maxTickLevel=1)
                plot.scene().sigMouseClicked.connect(lambda event, p=plot: self._on_click(p, event))
            delta.setLabel("left", "Δ to baseline", color="#222")
            delta.addItem(pg.InfiniteLine(pos=0, angle=0, pen=pg.mkPen("#888", width=1)))
            marker = pg.InfiniteLine(angle=90, pen=pg.mkPen("#7b1fa2", width=1, style=Qt.PenStyle.DashLine))
            marker.hide()
            values.addItem(marker)
            self._holder.addWidget(values, 3)
            self._holder.addWidget(delta, 2)
            self._plots = {"values": values, "delta": delta, "marker": marker, "curves": []}
        return self._plots

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Build the plots the first time the view is shown."""
        if self._plots is None:
            self._build()
            self._redraw()
        super().showEvent(event)

    def set_runs(self, runs: list[RunRecord], order: list[str], baseline: int = 0) -> None:
        """Plot ``runs`` (up to 4) over the layers in graph ``order``; ``baseline`` indexes ``runs``."""
        self._runs, self._order, self._baseline = list(runs), list(order), baseline
        self._redraw()

    @property
    def metric(self) -> str:
        """``sqnr_db`` or ``cosine_mean``."""
        return self.metric_combo.currentData()

    def _pool(self) -> tuple[list[Any], list[Any]]:
        """One curve and one delta bar item per possible run, created once and updated with setData/setOpts."""
        import pyqtgraph as pg

        plots = self._plots
        if not plots["curves"]:
            for colour in RUN_COLOURS:
                curve = pg.PlotDataItem([], [], connect="finite")
                bars = pg.BarGraphItem(x=[], height=[], width=0.2, brush=colour, pen=None)
                plots["values"].addItem(curve)
                plots["delta"].addItem(bars)
                plots["curves"].append((curve, bars))
        return [c for c, _ in plots["curves"]], [b for _, b in plots["curves"]]

    def _redraw(self) -> None:
        runs = self._runs
        self.series = layer_series(runs, self._order, metric=self.metric, baseline=self._baseline) if runs else None
        if self._plots is None:
            return
        import pyqtgraph as pg

        plots = self._plots
        curves, bars = self._pool()
        self._legend = []
        name, unit = METRICS[self.metric]
        plots["values"].setLabel("left", name, units=unit or None, color="#222")
        series = self.series
        count = len(runs) if series is not None and series.layers else 0
        x = np.arange(len(series.layers), dtype=float) if count else np.array([])
        symbols = count and len(series.layers) <= MAX_SYMBOLS
        for index, (curve, bar) in enumerate(zip(curves, bars)):
            if index >= count:
                curve.setData([], [])
                curve.hide()
                bar.hide()
                continue
            colour = RUN_COLOURS[index]
            pen = pg.mkPen(colour, width=3 if index == series.baseline else 2)
            curve.setPen(pen)
            curve.setSymbol(SYMBOLS[index] if symbols else None)
            curve.setSymbolBrush(colour)
            curve.setSymbolPen(colour)
            curve.setSymbolSize(6)
            curve.setData(x, series.values[index])
            curve.show()
            self._legend.append(f"{runs[index].label}{' (baseline)' if index == series.baseline else ''}")
            bar.setOpts(x=x + (index - 1.5) * 0.2, height=np.nan_to_num(series.deltas[index]), width=0.2)
            bar.setVisible(index != series.baseline)
        self._set_ticks(series.layers if count else [])
        self.legend_label.setText("&nbsp;&nbsp;".join(
            f"<span style='color:{RUN_COLOURS[i]}'>━━ {text}</span>" for i, text in enumerate(self._legend)))

    def _set_ticks(self, layers: list[str]) -> None:
        step = max(1, math.ceil(len(layers) / MAX_TICKS))
        ticks = [(i, name[:16]) for i, name in enumerate(layers) if i % step == 0]
        for key in ("values", "delta"):
            self._plots[key].getAxis("bottom").setTicks([ticks] if layers else None)

    def tick_labels(self) -> list[str]:
        """The layer names on the x axis (for tests)."""
        ticks = self._build()["values"].getAxis("bottom")._tickLevels
        return [label for level in ticks or [] for _, label in level]

    def legend_texts(self) -> list[str]:
        """The legend's entries (for tests)."""
        self._build()
        return list(self._legend)

    def select_layer(self, name: str) -> None:
        """Mark layer ``name`` with a vertical line (no signal)."""
        self.selected = name
        if self._plots is None or self.series is None:
            return
        marker = self._plots["marker"]
        if name in self.series.layers:
            marker.setPos(self.series.layers.index(name))
            marker.show()
        else:
            marker.hide()

    def layer_at(self, x: float) -> str | None:
        """The layer whose x position is nearest to ``x`` (None outside the axis)."""
        if self.series is None or not self.series.layers:
            return None
        index = round(x)
        return self.series.layers[index] if 0 <= index < len(self.series.layers) else None

    def _on_click(self, plot: Any, event: Any) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        point = plot.getPlotItem().vb.mapSceneToView(event.scenePos())
        name = self.layer_at(point.x())
        if name:
            self.select_layer(name)
            self.layer_activated.emit(name)
