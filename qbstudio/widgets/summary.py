"""The compile summary: MXQ path and size, device, core modes, accuracy metrics, worst layers first."""

from __future__ import annotations

import html
import logging
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from qbstudio.state.runs import RunRecord
from qbstudio.widgets.fit import fit_width

logger = logging.getLogger(__name__)

LAYER_COLUMNS = ("Layer", "Op", "Precision", "SQNR (dB)", "Verdict")
VERDICT_COLOURS = {"ok": "#2e7d32", "warn": "#b26a00", "bad": "#c62828"}
FEW_HOLDOUT = 10
METRICS_TITLE = "Accuracy (FP32 vs quantized, held-out samples)"


def human_size(size: int) -> str:
    """``1.2 MB`` style size."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def open_folder(path: str | Path) -> bool:
    """Open the folder holding ``path`` in the desktop's file manager (module-level: tests replace it)."""
    return QDesktopServices.openUrl(QUrl.fromLocalFile(str(Path(path).parent)))


def metric_rows(run: RunRecord) -> list[tuple[str, str]]:
    """(label, text) pairs of the accuracy metrics."""
    head = run.headline()
    verdict = head["verdict"] or "—"
    colour = VERDICT_COLOURS.get(verdict, "#333")
    rows = [("Verdict", f"<b style='color:{colour}'>{verdict}</b>")]
    if head["sqnr_db"] is not None:
        rows.append(("Min output SQNR", f"{head['sqnr_db']:.2f} dB"))
    if head["cosine"] is not None:
        rows.append(("Mean output cosine", f"{head['cosine']:.5f}"))
    held = run.samples.get("holdout")
    on = f" (on {held} held-out sample{'s' if held != 1 else ''})" if held else ""
    if head["top1"] is not None:
        rows.append(("Top-1 agreement", f"{head['top1'] * 100:.1f} %{on}"))
    if mixed := run.mixed_precision:
        rows.append(("Mixed precision", mixed_precision_text(mixed)))
    samples = run.samples
    if samples:
        random = " random" if samples.get("random") else ""
        rows.append(("Samples", f"{samples.get('calibration', 0)}{random} calibration, {samples.get('holdout', 0)}"
                                f"{random} held out"))
    if samples.get("random"):
        rows.append(("Note", "<span style='color:#b26a00'>Random calibration data (a smoke test): these figures say "
                             "nothing about real inputs. Choose real samples in the Calibration tab.</span>"))
    elif head["verdict"] in ("warn", "flag") and (tip := accuracy_tip(run)):
        rows.append(("Try", f"<span style='color:#b26a00'>{tip}</span>"))
    if not samples.get("random") and held == 0:
        rows.append(("Note", "<span style='color:#b26a00'>No sample was held out, so nothing measured the accuracy. "
                             "Add calibration data: from 5 samples on, some are held out (analysisHoldout).</span>"))
    elif not samples.get("random") and held is not None and held < FEW_HOLDOUT:
        rows.append(("Note", f"<span style='color:#b26a00'>Only {held} held-out sample(s): these figures are "
                             f"rough. Add calibration data for a steadier measure.</span>"))
    return rows


def mixed_precision_text(mixed: dict) -> str:
    """One line on the automatic mixed precision outcome (HTML): target, met or not, what it took."""
    from compiler_core.quantization.mixed_precision import format_metric

    target = mixed.get("target") or {}
    kind = target.get("kind", "cosine")
    met = mixed.get("target_met")
    verdict = "<b style='color:#2e7d32'>met</b>" if met else "<b style='color:#b26a00'>not met</b>"
    return (f"target {format_metric(kind, target.get('value'))} {verdict} (reached "
            f"{format_metric(kind, mixed.get('metric'))}) with {mixed.get('int16_layers', 0)} int16 layer(s) "
            f"({100 * (mixed.get('int16_fraction') or 0):.0f} %), estimated latency "
            f"{100 * (mixed.get('latency_increase') or 0):+.1f} %; {mixed.get('points_tried', 0)} points tried")


def accuracy_tip(run: RunRecord) -> str:
    """What to try on a run below the usual accuracy (HTML), or "" when the run tried it already: the preset made
    for the model, else automatic mixed precision and the a16w8 preset, after a16w8 the a16w16 one (as the CLI's
    hint)."""
    suited = run.suited_preset
    loss = run.metrics.get("range_loss")
    if loss and not (run.config.get("cpuLayers") or {}).get("head"):  # the CLI's hint: no bit width holds its range
        layer = html.escape(str(loss.get("layer", "")))
        return (f"The error starts at <b>{layer}</b> ({html.escape(str(loss.get('op', '')))}, SQNR "
                f"{loss.get('sqnr_db', 0):.1f} dB): an integer grid loses the small values of its wide input range. Run "
                f"it on the CPU with every layer before it (right-click {layer} in the graph).")
    if suited and run.preset not in (suited.get("name"), *suited.get("covers", ())):
        return (f"The model has {html.escape(suited.get('why', ''))}: the <b>{html.escape(suited.get('name', ''))}"
                "</b> preset is made for such models (Compile tab › Preset).")
    if run.preset == "a16w8":
        return ("With int16 activations everywhere, int16 weights may help: the <b>a16w16</b> preset (Compile tab › "
                "Preset), or more calibration data.")
    if run.mixed_precision and not run.mixed_precision.get("target_met"):
        return ("The target needs more int16 than the limits allow: raise the int16 share or the latency budget "
                "(Compile tab › Automatic mixed precision), or use the <b>a16w8</b> / <b>a16w16</b> preset.")
    if (run.config.get("mixedPrecision") or {}).get("apply") or run.preset == "a16w16":
        return ""
    return ("<b>Automatic mixed precision</b> (Compile tab) gives int16 to the layers that need it for a target you "
            "set; the <b>a16w8</b> preset gives every activation int16 (recurrent, regression and image-to-image "
            "models).")


class CompileSummary(QWidget):
    """Shows one :class:`RunRecord`.

    Signals:
        try_requested(object): the user wants to run inputs of their own through the run's MXQ.
    """

    try_requested = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run: RunRecord | None = None
        self.header = fit_width(QLabel(objectName="summaryHeader"))
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.metrics = QFormLayout()
        self.metrics_box = metrics_box = QGroupBox(METRICS_TITLE)
        metrics_box.setLayout(self.metrics)
        policy = metrics_box.sizePolicy()  # narrower than its title in a narrow panel: the rows wrap
        policy.setHorizontalPolicy(QSizePolicy.Policy.Ignored)
        metrics_box.setSizePolicy(policy)
        self.layers = QTableWidget(0, len(LAYER_COLUMNS), objectName="worstLayers")
        self.layers.setHorizontalHeaderLabels(LAYER_COLUMNS)
        self.layers.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.layers.verticalHeader().hide()
        self.layers.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.layers.horizontalHeader().setStretchLastSection(True)
        self.show_button = QPushButton("Show in folder", objectName="showInFolder")
        self.show_button.clicked.connect(self.show_in_folder)
        self.try_button = QPushButton("Try on inputs…", objectName="tryInputs")
        self.try_button.setToolTip("Run images, recordings or .npy files of your own through this MXQ (the bit-exact simulator) "
                                   "and the FP32 graph, side by side")
        self.try_button.clicked.connect(lambda: self.run is not None and self.try_requested.emit(self.run))
        buttons = QHBoxLayout()
        buttons.addWidget(self.show_button)
        buttons.addWidget(self.try_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.header)
        layout.addLayout(buttons)
        layout.addWidget(metrics_box)
        layout.addWidget(QLabel("Per-layer SQNR, worst first:"))
        layout.addWidget(self.layers, 1)
        self.show_run(None)

    def show_run(self, run: RunRecord | None) -> None:
        """Show ``run`` (None: the 'no compile yet' hint)."""
        self.run = run
        self.show_button.setEnabled(run is not None)
        self.try_button.setEnabled(run is not None and Path(run.mxq_path).is_file())
        while self.metrics.rowCount():
            self.metrics.removeRow(0)
        self.layers.setRowCount(0)
        if run is None:
            self.metrics_box.setTitle(METRICS_TITLE)
            self.header.setText("<i>No compile yet. Choose calibration data and settings, then press Compile.</i>")
            return
        held = run.samples.get("holdout")
        self.metrics_box.setTitle(METRICS_TITLE if held is None else
                                  "Accuracy (FP32 vs quantized: no held-out samples)" if held == 0 else
                                  f"Accuracy (FP32 vs quantized, on {held} held-out sample(s))")
        exists = Path(run.mxq_path).is_file()
        missing = "" if exists else " <span style='color:#c62828'>(file missing)</span>"
        self.header.setText(
            f"<b>Run #{run.run_id}</b> — {run.created}<br><b>MXQ</b> {run.mxq_path}{missing} "
            f"({human_size(run.size_bytes)})<br><b>Device</b> {run.device} · <b>core modes</b> "
            f"{', '.join(run.core_modes)} · {run.duration_s:.1f} s<br><small>{run.config_summary}</small>")
        for label, text in metric_rows(run):
            self.metrics.addRow(label, fit_width(QLabel(text)))
        self._fill_layers(run)
        QTimer.singleShot(0, self, self._fit_metrics_height)  # once the new rows are laid out (not after a close)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._fit_metrics_height()

    def _fit_metrics_height(self) -> None:
        """Give the metrics box the height its wrapped rows need at its width: the layout sized it from the rows'
        unwrapped hints, which cut a three-line "Try" advice to two lines in a narrow panel."""
        box = self.metrics_box
        needed = self.metrics.heightForWidth(box.contentsRect().width())
        if needed > 0:
            box.setMinimumHeight(needed + box.height() - box.contentsRect().height())

    def show_note(self, text: str) -> None:
        """Show ``text`` (rich text) in place of a run: a model whose compile is not a run (a decoder LLM)."""
        self.show_run(None)
        self.header.setText(text)

    def show_running(self) -> None:
        """A compile is running: its results will appear here."""
        self.show_run(None)
        self.show_button.setEnabled(False)
        self.header.setText("<i>Compiling… the results appear here when it finishes.</i>")

    def show_in_folder(self) -> bool:
        """Open the run's folder in the file manager; says so in the header when that is not possible."""
        if self.run is None:
            return False
        if open_folder(self.run.mxq_path):
            return True
        folder = Path(self.run.mxq_path).parent
        logger.warning("no file manager could open %s", folder)
        self.header.setText(self.header.text() + f"<br><span style='color:#c62828'>Could not open a file "
                                                 f"manager. The run's folder is {folder}</span>")
        return False

    def _fill_layers(self, run: RunRecord) -> None:
        rows = run.worst_layers()
        self.layers.setRowCount(len(rows))
        for index, row in enumerate(rows):
            sqnr = row.get("sqnr_db")
            values = (row.get("layer"), row.get("op"), row.get("precision"),
                      f"{sqnr:.2f}" if isinstance(sqnr, (int, float)) else "—", row.get("verdict"))
            for column, value in enumerate(values):
                self.layers.setItem(index, column, QTableWidgetItem(str(value or "")))

    def layer_names(self) -> list[str]:
        """Layer names in the table, top to bottom (for tests)."""
        return [self.layers.item(r, 0).text() for r in range(self.layers.rowCount())]
