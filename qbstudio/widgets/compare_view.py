"""Runs & Compare: the runs table, and up to four picked runs side by side (settings diff, metrics, per-layer
plots, the "why a layer differs" histogram) plus the sweep editor and the Pareto chart.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from PySide6.QtCore import QItemSelectionModel, QPoint, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from qbstudio import dialogs
from qbstudio.state.compare import (
    MAX_COMPARED,
    better_direction,
    flatten,
    metric_rows,
    resolved_config,
    setting_text,
    settings_diff,
)
from qbstudio.state.runs import RunHistory, RunRecord
from qbstudio.widgets import compare_export
from qbstudio.widgets.compare_graphs import TwinGraphs
from qbstudio.widgets.fit import fit_width
from qbstudio.widgets.histogram_view import HistogramView
from qbstudio.widgets.layer_plot import RUN_COLOURS, LayerPlot
from qbstudio.widgets.summary import human_size
from qbstudio.widgets.sweep_panel import SweepPanel
from qbstudio.workers import JobRunner

logger = logging.getLogger(__name__)

RUN_COLUMNS = ("Run", "Finished", "Device", "Settings", "Verdict", "Min SQNR (dB)", "Cosine", "Top-1", "Size",
               "Time (s)")
DIFF_BACKGROUND = "#fff4d6"
BETTER, WORSE = "#2e7d32", "#c62828"


def run_cells(run: RunRecord) -> list[str]:
    """The table cells of one run."""
    head = run.headline()
    return [f"#{run.run_id} {run.name}".strip(), run.created.replace("T", " ")[:19], run.device, run.config_summary,
            head["verdict"] or "—", _number(head["sqnr_db"], 2), _number(head["cosine"], 5),
            "—" if head["top1"] is None else f"{head['top1'] * 100:.1f} %", human_size(run.size_bytes),
            f"{run.duration_s:.1f}"]


def run_sort_keys(run: RunRecord) -> list[Any]:
    """What each column of :func:`run_cells` sorts by (numbers as numbers: "#10" after "#9", 2 MB after 900 KB)."""
    head = run.headline()
    return [run.run_id, run.created, run.device, run.config_summary, head["verdict"] or "", head["sqnr_db"],
            head["cosine"], head["top1"], run.size_bytes, run.duration_s]


class RunItem(QTableWidgetItem):
    """A runs-table cell that sorts by its key; a missing value ("—") sorts below every number."""

    def __init__(self, text: str, key: Any, run_id: int) -> None:
        super().__init__(text)
        self.key = key
        self.setData(Qt.ItemDataRole.UserRole, run_id)

    def __lt__(self, other: QTableWidgetItem) -> bool:
        mine, theirs = self.key, getattr(other, "key", None)
        if mine is None or theirs is None:
            return mine is None and theirs is not None
        return mine < theirs


def _number(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _cell_text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


USE_SETTINGS_TEXT = "Use These Settings for the Next Compile"
"""The runs table's action that makes a run's settings (a sweep point's, say) the project's compile settings."""
BASELINE_CHARS = 12
"""The baseline box's narrowest width, in characters; it widens into the row's free space (the list shows whole names)."""
HEADER_TIP = "Right-click a run's header to copy it as a command or as Python"


class SideBySide(QWidget):
    """The picked runs as columns: the settings that differ (or the full resolved config) and the metrics."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.full_config = QCheckBox("Show the full resolved config", objectName="fullConfig")
        self.full_config.toggled.connect(self.refresh)
        self.table = QTableWidget(0, 0, objectName="sideBySide")
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setWordWrap(True)
        header = self.table.horizontalHeader()
        header.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        header.customContextMenuRequested.connect(self._on_header_menu)
        header.setTextElideMode(Qt.TextElideMode.ElideRight)  # it cut a long run name at both ends
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.full_config)
        layout.addWidget(self.table, 1)
        self._runs: list[RunRecord] = []
        self._baseline = 0
        self.diff_keys: list[str] = []

    def set_runs(self, runs: list[RunRecord], baseline: int = 0) -> None:
        """Show ``runs`` as columns, ``baseline`` (an index) marked and used for better/worse colours."""
        self._runs, self._baseline = list(runs), baseline
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the table."""
        runs = self._runs
        diff = settings_diff(runs) if len(runs) > 1 else []
        self.diff_keys = [key for key, _ in diff]
        if self.full_config.isChecked() and runs:
            flats = [flatten(resolved_config(run)) for run in runs]
            keys = sorted({key for flat in flats for key in flat})
            settings = [(key, [flat.get(key) for flat in flats]) for key in keys]
            settings_title = "Resolved config (differing keys highlighted)"
        else:
            settings = diff
            settings_title = f"Settings that differ ({len(diff)})" if len(runs) > 1 else "Settings (pick 2+ runs)"
        metrics = metric_rows(runs) if runs else []
        self.table.clear()
        self.table.clearSpans()
        self.table.setColumnCount(len(runs))
        self.table.setHorizontalHeaderLabels([f"{'★ baseline: ' if i == self._baseline else ''}{run.label}"
                                              for i, run in enumerate(runs)])
        for i, run in enumerate(runs):  # a long run name is elided at its end, whole in the tooltip
            self.table.horizontalHeaderItem(i).setForeground(QBrush(QColor(RUN_COLOURS[i % len(RUN_COLOURS)])))
            self.table.horizontalHeaderItem(i).setToolTip(f"{run.label}\n\n{HEADER_TIP}")
        rows: list[tuple[str, list[Any] | None]] = [(settings_title, None), *settings, ("Metrics", None), *metrics]
        self.table.setRowCount(len(rows))
        labels = []
        for row, (label, values) in enumerate(rows):
            labels.append(label if values is not None else "")
            if values is None:
                self._section(row, label)
            elif row <= len(settings):
                self._settings_row(row, label, values)
            else:
                self._metric_row(row, label, values)
        self.table.setVerticalHeaderLabels(labels)

    def header_menu(self, column: int) -> QMenu | None:
        """The context menu of run column ``column``: copy the run as a command or as Python."""
        if not 0 <= column < len(self._runs):
            return None
        menu = QMenu(self)
        compare_export.add_copy_actions(menu, self, self._runs[column], prefix=f"{self._runs[column].label}: ")
        return menu

    def _on_header_menu(self, position: QPoint) -> None:
        header = self.table.horizontalHeader()
        menu = self.header_menu(header.logicalIndexAt(position))
        if menu is not None:
            menu.popup(header.mapToGlobal(position))

    def _section(self, row: int, title: str) -> None:
        item = QTableWidgetItem(title)
        font = QFont()
        font.setBold(True)
        item.setFont(font)
        item.setBackground(QBrush(QColor("#e8eaf6")))
        self.table.setItem(row, 0, item)
        if self.table.columnCount() > 1:
            self.table.setSpan(row, 0, 1, self.table.columnCount())

    def _settings_row(self, row: int, key: str, values: list[Any]) -> None:
        differs = key in self.diff_keys
        for column, value in enumerate(values):
            text = _cell_text(setting_text(key, value))
            item = QTableWidgetItem(text)
            item.setToolTip(f"{key} = {text}")
            if differs:
                item.setBackground(QBrush(QColor(DIFF_BACKGROUND)))
            self.table.setItem(row, column, item)

    def _metric_row(self, row: int, label: str, values: list[Any]) -> None:
        direction = better_direction(label)
        base = values[self._baseline] if self._baseline < len(values) else None
        for column, value in enumerate(values):
            share = "agreement" in label and isinstance(value, (int, float))  # a share: "97.5 %", not "0.975"
            item = QTableWidgetItem(f"{value:.1%}" if share else _cell_text(value))
            if (direction and column != self._baseline and isinstance(value, (int, float))
                    and isinstance(base, (int, float)) and value != base):
                item.setForeground(QBrush(QColor(BETTER if (value - base) * direction > 0 else WORSE)))
            self.table.setItem(row, column, item)

    def row_labels(self) -> list[str]:
        """Every row's label, section titles included (for tests)."""
        return [self.table.verticalHeaderItem(r).text() or self.table.item(r, 0).text()
                for r in range(self.table.rowCount())]

    def cell(self, label: str, column: int) -> QTableWidgetItem | None:
        """The item of row ``label`` in run ``column`` (for tests)."""
        for row in range(self.table.rowCount()):
            if self.table.verticalHeaderItem(row).text() == label:
                return self.table.item(row, column)
        return None


class CompareView(QWidget):
    """Past runs; up to four of them compared side by side, per layer, per tensor range, and on a Pareto chart.

    Args:
        runner: Background jobs (statistics for the histogram).
        presets: Preset name -> description, offered as a sweep axis.

    Signals:
        run_selected(int): the user selected a run in the table (its id; the first of several).
        picks_changed(): the compared runs or the baseline changed.
        layer_activated(str): the user clicked a layer in the per-layer plot.
        delete_confirmed(int): the user confirmed deleting this run.
        rename_confirmed(int, str): the user named this run (an empty name: its default label again).
        import_requested(): the user wants to add the points of a command-line sweep (``sweep.json``).
    """

    run_selected = Signal(int)
    picks_changed = Signal()
    layer_activated = Signal(str)
    delete_confirmed = Signal(int)
    rename_confirmed = Signal(int, str)
    import_requested = Signal()
    use_settings_requested = Signal(int)

    def __init__(self, runner: JobRunner | None = None, presets: dict[str, str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.history = RunHistory()
        self.other_models = 0
        self.model_name = ""
        self.layer_order: list[str] = []
        self.picks: list[int] = []
        self.table = self._make_table()
        self.baseline_combo = QComboBox(objectName="baselineRun")
        self.baseline_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.baseline_combo.setMinimumContentsLength(BASELINE_CHARS)  # not the first names' width, kept for ever
        self.baseline_combo.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.baseline_combo.currentIndexChanged.connect(self._on_baseline)
        self.delete_button = QPushButton("Delete run…", objectName="deleteRun", enabled=False)
        self.delete_button.clicked.connect(self.ask_delete)
        self.import_button = QPushButton("Import sweep results…", objectName="importSweep")
        self.import_button.setToolTip("Add the points of a `qbcompiler sweep` of this model (its sweep.json) as runs")
        self.import_button.clicked.connect(self.import_requested)
        self.copy_button = QToolButton(objectName="copyRun", text="Copy run as…", enabled=False)
        self.copy_button.setToolTip("Copy a compared run as the command or the Python call that rebuilds its MXQ")
        self.copy_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.copy_button.setMenu(QMenu(self.copy_button))
        self.copy_button.menu().aboutToShow.connect(self._fill_copy_menu)
        self.report_button = QPushButton("Export report…", objectName="exportReport", enabled=False)
        self.report_button.setToolTip("Write a self-contained HTML report of the compared runs (settings diff, "
                                      "metrics, per-layer plot, Pareto chart, commands)")
        self.report_button.clicked.connect(lambda: self.export_report())
        self.csv_button = QPushButton("Export per-layer CSV…", objectName="exportCsv", enabled=False)
        self.csv_button.setToolTip("Write one CSV row per layer per compared run (SQNR, cosine, precision ...)")
        self.csv_button.clicked.connect(lambda: self.export_csv())
        self.picks_label = fit_width(QLabel(objectName="picksLabel"))
        self.side = SideBySide()
        self.layers = LayerPlot()
        self.layers.layer_activated.connect(self._on_layer_clicked)
        self.histogram = HistogramView(runner or JobRunner(self))
        self.sweep = SweepPanel(presets)
        self.sweep.chart.run_clicked.connect(self._on_pareto_click)
        self.tabs = QTabWidget(objectName="compareTabs")
        self.tabs.addTab(self.side, "Side by side")
        self.tabs.addTab(self.layers, "Per layer")
        self.tabs.addTab(self.histogram, "Why a layer differs")
        self.tabs.addTab(self.sweep, "Sweep && Pareto")
        self.twin = TwinGraphs()
        self.twin.node_selected.connect(self._on_layer_clicked)
        self.tabs.addTab(self.twin, "Two graphs")
        self._build()

    def _make_table(self) -> QTableWidget:
        table = QTableWidget(0, len(RUN_COLUMNS), objectName="runsTable")
        table.setHorizontalHeaderLabels(RUN_COLUMNS)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        table.setToolTip(f"Select up to {MAX_COMPARED} runs (Ctrl+click) to compare them")
        table.verticalHeader().hide()
        table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        table.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        table.itemSelectionChanged.connect(self._on_selection)
        table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        table.customContextMenuRequested.connect(self._on_table_menu)
        table.setSortingEnabled(True)  # by any column; run ids travel with the cells, never by row number
        table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        for key, slot in ((QKeySequence.StandardKey.Delete, self.ask_delete), (Qt.Key.Key_F2, self.ask_rename)):
            shortcut = QShortcut(QKeySequence(key), table, activated=slot)
            shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        # three runs in view whatever the splitter gets (their settings wrap to two lines): on a 768-pixel-high
        # screen the proportional split left room for one and a half
        line = table.fontMetrics().height()
        table.setMinimumHeight(table.horizontalHeader().sizeHint().height() + 3 * (2 * line + 8)
                               + 2 * table.frameWidth())
        return table

    def _build(self) -> None:
        # two rows, so that the tab fits a 1024-pixel window beside the layers dock (in one row the buttons made the
        # window's minimum width 1,167 pixels, and a 1024-pixel screen cut off the Compile tab's run panel)
        # the baseline box has a row of its own for long run names (beside four buttons it had 6 letters at 1024 px)
        picks = QHBoxLayout()
        picks.addWidget(QLabel("Baseline"))
        picks.addWidget(self.baseline_combo, 1)
        picks.addWidget(self.import_button)
        controls = QHBoxLayout()
        controls.addWidget(self.picks_label, 1)
        controls.addWidget(self.delete_button)
        controls.addWidget(self.copy_button)
        controls.addWidget(self.report_button)
        controls.addWidget(self.csv_button)
        upper = QWidget()
        upper_layout = QVBoxLayout(upper)
        upper_layout.setContentsMargins(0, 0, 0, 0)
        upper_layout.addWidget(self.table, 1)
        upper_layout.addLayout(picks)
        upper_layout.addLayout(controls)
        splitter = QSplitter(Qt.Orientation.Vertical, objectName="runsSplitter")
        splitter.addWidget(upper)
        splitter.addWidget(self.tabs)
        splitter.setSizes([200, 520])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

    # -- runs -------------------------------------------------------------------------------------

    def set_history(self, history: RunHistory, other_models: int = 0) -> None:
        """Show the runs of ``history``; keep the picks that still exist (else the two newest runs).
        ``other_models``: how many runs of the project belong to other models (not shown; the view says so)."""
        self.history = history
        self.other_models = other_models
        self.table.blockSignals(True)
        self.table.setSortingEnabled(False)  # else each setItem re-sorts and the rest of the row lands elsewhere
        self.table.setRowCount(len(history.runs))
        for row, run in enumerate(history.runs):
            for column, (text, key) in enumerate(zip(run_cells(run), run_sort_keys(run))):
                self.table.setItem(row, column, RunItem(text, key, run.run_id))
        self.table.setSortingEnabled(True)
        self.table.blockSignals(False)
        kept = [run_id for run_id in self.picks if history.get(run_id)]
        self.set_picks(kept or [run.run_id for run in history.runs[-2:]])
        self.sweep.chart.set_runs(history.runs)

    def set_layer_order(self, names: list[str]) -> None:
        """The graph's node names in graph order (the per-layer x axis)."""
        self.layer_order = list(names)
        self._refresh_views()

    def set_picks(self, run_ids: list[int], baseline: int | None = None) -> None:
        """Compare these runs (at most :data:`MAX_COMPARED`); ``baseline`` is a run id among them."""
        previous = self.baseline_id
        self.picks = [run_id for run_id in dict.fromkeys(run_ids) if self.history.get(run_id)][:MAX_COMPARED]
        self.table.blockSignals(True)
        self.table.clearSelection()
        flags = QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows
        for row in range(self.table.rowCount()):
            if self.table.item(row, 0).data(Qt.ItemDataRole.UserRole) in self.picks:
                self.table.selectionModel().select(self.table.model().index(row, 0), flags)
        self.table.blockSignals(False)
        wanted = baseline if baseline in self.picks else previous if previous in self.picks else None
        self._fill_baseline(wanted)

    def _fill_baseline(self, wanted: int | None) -> None:
        combo = self.baseline_combo
        combo.blockSignals(True)
        combo.clear()
        for run_id in self.picks:
            combo.addItem(self.history.get(run_id).label, run_id)
            combo.setItemData(combo.count() - 1, self.history.get(run_id).label, Qt.ItemDataRole.ToolTipRole)
        if wanted is not None:
            combo.setCurrentIndex(self.picks.index(wanted))
        combo.blockSignals(False)
        metrics = combo.view().fontMetrics()  # the list shows whole names, however narrow the box
        combo.view().setMinimumWidth(max((metrics.horizontalAdvance(combo.itemText(i)) for i in range(combo.count())),
                                         default=0) + 3 * metrics.averageCharWidth())
        self._show_baseline_tip()
        for button in (self.delete_button, self.copy_button, self.report_button, self.csv_button):
            button.setEnabled(bool(self.picks))
        self._refresh_views()

    @property
    def baseline_id(self) -> int | None:
        """The pinned baseline run's id (None with no picks)."""
        return self.baseline_combo.currentData() if self.baseline_combo.count() else None

    def set_baseline(self, run_id: int) -> None:
        """Pin ``run_id`` (one of the picks) as the baseline."""
        if run_id in self.picks:
            self.baseline_combo.setCurrentIndex(self.picks.index(run_id))

    @property
    def picked_runs(self) -> list[RunRecord]:
        """The compared runs, in pick order."""
        return [self.history.get(run_id) for run_id in self.picks]

    def _baseline_index(self) -> int:
        return self.picks.index(self.baseline_id) if self.baseline_id in self.picks else 0

    def _on_baseline(self) -> None:
        self._show_baseline_tip()
        self._refresh_views()

    def _show_baseline_tip(self) -> None:
        label = self.baseline_combo.currentText()
        self.baseline_combo.setToolTip(f"{label}: the run the others are compared with (pinned)" if label else
                                       "The run the others are compared with (pinned)")

    def _refresh_views(self) -> None:
        runs, baseline = self.picked_runs, self._baseline_index()
        count = len(runs)
        hidden = (f"; {self.other_models} run(s) of another model stay in the project (import that model again to "
                  "see them)") if self.other_models else ""
        self.picks_label.setText(f"Comparing {count} run(s)" + (f" (at most {MAX_COMPARED})" if count == MAX_COMPARED
                                                                 else "") + hidden)
        self.side.set_runs(runs, baseline)
        self.layers.set_runs(runs, self.layer_order, baseline)
        self.histogram.set_runs(runs)
        self.twin.set_runs(runs, self.baseline_id)
        self.picks_changed.emit()

    def _on_selection(self) -> None:
        rows = sorted({index.row() for index in self.table.selectionModel().selectedRows()})
        run_ids = [self.table.item(row, 0).data(Qt.ItemDataRole.UserRole) for row in rows]
        if not run_ids:
            return
        if len(run_ids) > MAX_COMPARED:
            self.picks_label.setText(f"Only {MAX_COMPARED} runs can be compared at once.")
        self.set_picks(run_ids)
        self.run_selected.emit(run_ids[0])

    def _on_pareto_click(self, run_id: int) -> None:
        picks = self.picks if run_id in self.picks else (self.picks + [run_id])[-MAX_COMPARED:]
        baseline = self.baseline_id if self.baseline_id in picks else None
        self.set_picks(picks, baseline)
        self.tabs.setCurrentWidget(self.side)
        self.run_selected.emit(run_id)

    # -- layers -----------------------------------------------------------------------------------

    def _on_layer_clicked(self, name: str) -> None:
        self.show_layer(name)
        self.layer_activated.emit(name)

    def show_layer(self, name: str) -> None:
        """Layer ``name`` was selected (here or elsewhere): mark it and load its histogram."""
        self.layers.select_layer(name)
        self.twin.select_node(name)
        if any(run.layer_row(name) for run in self.picked_runs):
            self.histogram.show_layer(name)

    # -- exporting --------------------------------------------------------------------------------

    def run_menu(self, run_id: int) -> QMenu:
        """The runs table's context menu on run ``run_id``: copy it, export the compared runs, delete."""
        menu = QMenu(self)
        run = self.history.get(run_id)
        if run is not None:
            compare_export.add_copy_actions(menu, self, run)
            use = menu.addAction(USE_SETTINGS_TEXT)
            use.setObjectName(f"useSettings-{run_id}")
            use.triggered.connect(lambda: self.use_settings_requested.emit(run_id))
        menu.addSeparator()
        menu.addAction("Export report of the compared runs…").triggered.connect(lambda: self.export_report())
        menu.addAction("Export per-layer CSV of the compared runs…").triggered.connect(lambda: self.export_csv())
        menu.addSeparator()
        for text, key, slot in (("Rename run…", QKeySequence(Qt.Key.Key_F2), self.ask_rename),
                                 ("Delete run…", QKeySequence(QKeySequence.StandardKey.Delete), self.ask_delete)):
            action = menu.addAction(text)
            action.setShortcut(key)  # shown beside the text; the table's own shortcuts act on it
            action.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
            action.triggered.connect(slot)
        return menu

    def _on_table_menu(self, position: QPoint) -> None:
        item = self.table.itemAt(position)
        if item is None:
            return
        run_id = self.table.item(item.row(), 0).data(Qt.ItemDataRole.UserRole)
        if run_id not in self.picks:
            self.set_picks([run_id])
        self.run_menu(run_id).popup(self.table.viewport().mapToGlobal(position))

    def _fill_copy_menu(self) -> None:
        menu = self.copy_button.menu()
        menu.clear()
        for run in self.picked_runs:
            compare_export.add_copy_actions(menu, self, run, prefix=f"{run.label}: ")

    def export_report(self, path: str | None = None):
        """Write the HTML report of the compared runs (asks where when ``path`` is None); the file or None."""
        return compare_export.export_report(self, self.picked_runs, baseline=self._baseline_index(),
                                            order=self.layer_order, model=self.model_name, path=path)

    def export_csv(self, path: str | None = None):
        """Write the per-layer CSV of the compared runs (asks where when ``path`` is None); the file or None."""
        return compare_export.export_csv(self, self.picked_runs, order=self.layer_order, path=path)

    # -- renaming, deleting -----------------------------------------------------------------------

    def ask_rename(self) -> bool:
        """Ask for a name for the first compared run (F2); True if it was given."""
        runs = self.picked_runs
        if not runs:
            return False
        name = dialogs.ask_text(self, "Rename run", f"Name of run #{runs[0].run_id} (empty: its device again):",
                                runs[0].name)
        if name is None:
            return False
        self.rename_confirmed.emit(runs[0].run_id, name)
        return True

    def ask_delete(self) -> bool:
        """Ask, then delete the selected run(s) from the project (their files stay); True if confirmed."""
        runs = self.picked_runs
        if not runs:
            return False
        names = ", ".join(run.label for run in runs)
        if not dialogs.ask_yes_no(self, "Delete run", f"Delete {names} from the project?\n\nThe MXQ files stay on "
                                                       "disk; the runs disappear from the table and the project file."):
            return False
        for run in runs:
            self.delete_confirmed.emit(run.run_id)
        return True
