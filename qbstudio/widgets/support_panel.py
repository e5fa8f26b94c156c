"""The Layer support panel: flagged nodes of the support report, filterable, selection synced with the graph."""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QItemSelectionModel,
    QModelIndex,
    QPersistentModelIndex,
    QPoint,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from qbstudio.netron.palette import SUPPORT_PALETTE

logger = logging.getLogger(__name__)

NO_REPORT = "Each layer's support on the device shows here once a model is loaded."

MIN_REASON_WIDTH = 160
COLUMNS = ("Status", "Node", "Op", "Reason", "Source name")
ALL_FLAGGED = "flagged"
ALL_NODES = "all"
NodeRow = dict[str, str]
Index = QModelIndex | QPersistentModelIndex


class SupportTableModel(QAbstractTableModel):
    """Rows of ``SupportReport.to_dict()["nodes"]``: node, op_type, status, reason, source_name."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._rows: list[NodeRow] = []

    def set_rows(self, rows: list[NodeRow]) -> None:
        """Replace every row."""
        self.beginResetModel()
        self._rows = list(rows)
        self.endResetModel()

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008, N802 (Qt API)
        """Number of rows."""
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008, N802 (Qt API)
        """Number of columns."""
        return 0 if parent.isValid() else len(COLUMNS)

    def row(self, index: int) -> NodeRow:
        """The row dict at ``index``."""
        return self._rows[index]

    def row_of(self, node: str) -> int:
        """Row number of ``node``, or -1."""
        return next((i for i, row in enumerate(self._rows) if row["node"] == node), -1)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        """Cell text, status colours and tooltips."""
        if not index.isValid():
            return None
        row = self._rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return self._text(row, index.column(), role)
        if role == Qt.ItemDataRole.BackgroundRole and index.column() == 0:
            return QBrush(QColor(SUPPORT_PALETTE[row["status"]].fill))
        if role == Qt.ItemDataRole.ForegroundRole and index.column() == 0:
            return QBrush(QColor(SUPPORT_PALETTE[row["status"]].text))
        if role == Qt.ItemDataRole.UserRole:
            return row["node"]
        return None

    @staticmethod
    def _text(row: NodeRow, column: int, role: int) -> str:
        if column == 0:
            style = SUPPORT_PALETTE[row["status"]]
            return style.description if role == Qt.ItemDataRole.ToolTipRole else style.label
        key = ("status", "node", "op_type", "reason", "source_name")[column]
        return row.get(key, "")

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802 (Qt API)
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        """Column titles."""
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return COLUMNS[section]
        return None


class SupportFilter(QSortFilterProxyModel):
    """Filters rows by status (one status, ``flagged`` or ``all``) and by text in any column."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._status = ALL_FLAGGED
        self._text = ""

    def set_status(self, status: str) -> None:
        """Show one status, every non-supported status (``flagged``), or everything (``all``)."""
        self._status = status
        self.invalidateFilter()

    def set_text(self, text: str) -> None:
        """Show rows with ``text`` (case-insensitive) in any column."""
        self._text = text.strip().lower()
        self.invalidateFilter()

    def filterAcceptsRow(self, source_row: int, source_parent: Index) -> bool:  # noqa: N802 (Qt API)
        """Status and text test of one row."""
        row = self.sourceModel().row(source_row)
        if self._status == ALL_FLAGGED and row["status"] == "supported":
            return False
        if self._status not in (ALL_FLAGGED, ALL_NODES) and row["status"] != self._status:
            return False
        return not self._text or any(self._text in str(value).lower() for value in row.values())


class SupportPanel(QWidget):
    """Table of the nodes flagged for the chosen device, with a status combo and a text filter.

    Signals:
        node_activated(str): the user selected a row (node name).
        node_context_requested(str, QPoint): right click on a row (node name, global screen position).
    """

    node_activated = Signal(str)
    node_context_requested = Signal(str, QPoint)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = SupportTableModel(self)
        self.proxy = SupportFilter(self)
        self.proxy.setSourceModel(self.model)
        self._syncing = False
        self._build()

    def _build(self) -> None:
        self.summary = QLabel(NO_REPORT, wordWrap=True)
        self.status_combo = QComboBox()
        self.status_combo.addItem("Flagged (not supported)", ALL_FLAGGED)
        for status, style in SUPPORT_PALETTE.items():
            self.status_combo.addItem(style.label, status)
        self.status_combo.addItem("All nodes", ALL_NODES)
        self.status_combo.currentIndexChanged.connect(
            lambda: self.proxy.set_status(self.status_combo.currentData()))
        self.filter_edit = QLineEdit(placeholderText="Filter by node, op, reason…", clearButtonEnabled=True)
        self.filter_edit.textChanged.connect(self.proxy.set_text)
        self.table = self._make_table()
        filters = QHBoxLayout()
        filters.addWidget(self.status_combo)
        filters.addWidget(self.filter_edit, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.summary)
        layout.addLayout(filters)
        layout.addWidget(self.table, 1)

    def _make_table(self) -> QTableView:
        table = QTableView(self)
        table.setModel(self.proxy)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        table.setSortingEnabled(True)
        table.sortByColumn(-1, Qt.SortOrder.AscendingOrder)
        table.verticalHeader().hide()
        table.setWordWrap(False)
        table.setTextElideMode(Qt.TextElideMode.ElideRight)
        header = table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        for column in (0, 1, 2):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        table.selectionModel().currentRowChanged.connect(self._on_current_changed)
        table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        table.customContextMenuRequested.connect(self._on_context_menu)
        return table

    def _on_context_menu(self, position: QPoint) -> None:
        index = self.table.indexAt(position)
        if index.isValid():
            name = index.data(Qt.ItemDataRole.UserRole)
            self.node_context_requested.emit(name, self.table.viewport().mapToGlobal(position))

    def clear_filter(self) -> None:
        """Forget the text filter (typed for another model's node names)."""
        self.filter_edit.clear()

    def set_report(self, report: dict[str, Any] | None) -> None:
        """Show ``SupportReport.to_dict()`` (or nothing)."""
        self.model.set_rows(report["nodes"] if report else [])
        self.summary.setText(self._summary_text(report))
        self.table.resizeColumnsToContents()
        self._fit_reason_column()

    def _fit_reason_column(self) -> None:
        """Keep the Reason column inside the visible width (long reasons end in "…"; the tooltip has them all)."""
        header = self.table.horizontalHeader()
        beside = sum(header.sectionSize(column) for column in range(3))
        room = max(MIN_REASON_WIDTH, self.table.viewport().width() - beside)
        if header.sectionSize(3) > room:
            header.resizeSection(3, room)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Refit the Reason column to the new width."""
        super().resizeEvent(event)
        if self.model.rowCount():
            self.table.resizeColumnToContents(3)
            self._fit_reason_column()

    @staticmethod
    def _summary_text(report: dict[str, Any] | None) -> str:
        if not report:
            return NO_REPORT
        counts = report["counts"]
        flagged = sum(count for status, count in counts.items() if status != "supported")
        parts = ", ".join(f"{count} {SUPPORT_PALETTE[s].label.lower()}" for s, count in counts.items() if count)
        verdict = "compilable" if report["compilable"] else "not compilable as is"
        return f"<b>{report['device']}</b>: {flagged} flagged of {sum(counts.values())} nodes ({parts}); {verdict}."

    def visible_nodes(self) -> list[str]:
        """Node names of the rows shown (after filtering), in view order."""
        return [self.proxy.index(r, 0).data(Qt.ItemDataRole.UserRole) for r in range(self.proxy.rowCount())]

    def select_node(self, name: str) -> bool:
        """Select ``name``'s row without emitting :attr:`node_activated`; False if it is not shown."""
        source_row = self.model.row_of(name)
        index = self.proxy.mapFromSource(self.model.index(source_row, 0)) if source_row >= 0 else QModelIndex()
        self._syncing = True
        try:
            if not index.isValid():
                self.table.clearSelection()
                return False
            flags = QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows
            self.table.selectionModel().setCurrentIndex(index, flags)
            self.table.scrollTo(index)
            return True
        finally:
            self._syncing = False

    def selected_node(self) -> str | None:
        """The node of the current row, if any."""
        index = self.table.currentIndex()
        return index.data(Qt.ItemDataRole.UserRole) if index.isValid() else None

    def _on_current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if current.isValid() and not self._syncing:
            self.node_activated.emit(current.data(Qt.ItemDataRole.UserRole))
