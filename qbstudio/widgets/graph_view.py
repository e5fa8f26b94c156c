"""The Graph tab: an MBLT drawn by the embedded, offline Netron, coloured by op support.

:class:`GraphView` serves the model through the ``qbnetron:`` scheme (no TCP port), recolours
nodes without reloading when the device or a decision changes, and syncs selection both ways.
:func:`qbstudio.netron.register_scheme` must have run before the QApplication was created.
"""

from __future__ import annotations

import atexit
import logging
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import shiboken6
from PySide6.QtCore import QCoreApplication, QPoint, QRectF, Qt, QUrl, Signal
from PySide6.QtGui import QColor, QLinearGradient, QPainter
from PySide6.QtWebEngineWidgets import QWebEngineView
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QStackedWidget, QTabBar, QVBoxLayout, QWidget

from qbstudio.netron.page import LocalOnlyInterceptor, NetronPage, create_profile
from qbstudio.netron.palette import SUPPORT_PALETTE
from qbstudio.netron.scheme import INDEX_URL, NetronSchemeHandler, model_url_path
from qbstudio.netron.scripts import js_call

logger = logging.getLogger(__name__)

NO_MODEL_TEXT = "No model loaded."

LARGE_GRAPH_NODES = 1000
"""Above this many nodes the view warns that Netron's layout will be slow."""

_LAYOUT_CANCEL_BUTTON = "Cancel"
"""Button of Netron's notice for a layout running over 2.5 s (every other message blocks the graph)."""


_LIVE_VIEWS: weakref.WeakSet[GraphView] = weakref.WeakSet()


def release_web_engine() -> None:
    """Delete the page, then the profile, of every GraphView still alive.

    QtWebEngine crashes (or warns "Release of profile requested but WebEnginePage still not
    deleted") when pages outlive the QApplication or their profile, which happens when views are
    left to Python's garbage collection at exit. Runs on ``aboutToQuit`` and at interpreter exit.
    """
    for view in list(_LIVE_VIEWS):
        view._release_web_engine()


atexit.register(release_web_engine)


def _release_on_quit() -> None:
    app = QCoreApplication.instance()
    if app is not None and not app.property("qbReleasesWebEngine"):
        app.aboutToQuit.connect(release_web_engine)
        app.setProperty("qbReleasesWebEngine", True)


def statuses_from_report(report: Any) -> tuple[dict[str, str], dict[str, str]]:
    """``(statuses, reasons)`` for :meth:`GraphView.set_support` from a ``compiler_core`` SupportReport."""
    statuses = {name: str(entry.status) for name, entry in report.entries.items()}
    reasons = {name: entry.reason for name, entry in report.entries.items() if entry.reason}
    return statuses, reasons


class SupportLegend(QWidget):
    """One colour swatch and label per support status, from :data:`SUPPORT_PALETTE`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 2, 6, 2)
        for status, style in SUPPORT_PALETTE.items():
            swatch = QLabel(self)
            swatch.setObjectName(f"legendSwatch_{status}")
            swatch.setFixedSize(14, 14)
            swatch.setStyleSheet(f"background: {style.fill}; border: 1px solid #444; border-radius: 3px;")
            label = QLabel(style.label, self)
            for widget in (swatch, label):
                widget.setToolTip(style.description)
            layout.addWidget(swatch)
            layout.addWidget(label)
            layout.addSpacing(10)
        layout.addStretch(1)


class HeatLegend(QWidget):
    """A horizontal colour gradient with value ticks (dB) for the error heatmap."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("heatLegend")
        self.setFixedHeight(34)
        self.setMinimumWidth(260)
        self.title = ""
        self.stops: list[tuple[float, str]] = []
        self.low, self.high = 0.0, 1.0
        self.ticks: tuple[float, ...] = ()

    def set_scale(self, title: str, stops: list[tuple[float, str]], low: float, high: float,
                  ticks: tuple[float, ...]) -> None:
        """Show a gradient of ``stops`` from ``low`` to ``high`` with ``ticks`` labelled."""
        self.title, self.stops, self.low, self.high, self.ticks = title, stops, low, high, ticks
        self.update()

    def tick_labels(self) -> list[str]:
        """The tick texts as drawn (for tests)."""
        return [f"{tick:+g}" if self.low < 0 else f"{tick:g}" for tick in self.ticks]

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Draw the title, the gradient bar and the ticks."""
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        title_width = painter.fontMetrics().horizontalAdvance(self.title) + 12
        bar = QRectF(title_width, 3, max(40, self.width() - title_width - 24), 12)
        painter.setPen(QColor("#222"))
        painter.drawText(QRectF(4, 0, title_width, 18), Qt.AlignmentFlag.AlignVCenter, self.title)
        gradient = QLinearGradient(bar.left(), 0, bar.right(), 0)
        for position, colour in self.stops:
            gradient.setColorAt(position, QColor(colour))
        painter.fillRect(bar, gradient)
        painter.drawRect(bar)
        for tick, text in zip(self.ticks, self.tick_labels()):
            x = bar.left() + bar.width() * (tick - self.low) / ((self.high - self.low) or 1.0)
            painter.drawLine(round(x), round(bar.bottom()), round(x), round(bar.bottom()) + 3)
            width = painter.fontMetrics().horizontalAdvance(text)
            painter.drawText(round(x - width / 2), round(bar.bottom()) + 15, text)
        painter.end()


class GraphView(QWidget):
    """Netron showing one MBLT, with support colours, selection sync and a per-node context menu.

    Args:
        parent: Parent widget.
        scheme_handler: Serves Netron and the model (tests pass one with an ``index_preprocessor``).
        large_graph_threshold: Node count above which a notice banner is shown.

    Signals:
        ready(): The graph is rendered (Netron's page is in its ``default`` state and nodes exist).
            Chromium does not lay out hidden pages: in a hidden tab this comes once the view is shown.
        node_selected(str): The user clicked a node in the graph (not sent for :meth:`select_node`).
        node_context_requested(str, QPoint): Right click on a node, at a global screen position.
        load_failed(str): Netron shows an error, or a dialog it would wait on, instead of the graph.
        colouring_changed(str): The user chose another colouring (``support`` or a key of :meth:`set_colourings`).
        heat_painted(int, float): Heat colours reached the page: nodes coloured, milliseconds from the call.
        graph_chosen(str): The user chose another graph of the model on the graph tabs (:meth:`set_graphs`).
    """

    ready = Signal()
    node_selected = Signal(str)
    node_context_requested = Signal(str, QPoint)
    load_failed = Signal(str)
    colouring_changed = Signal(str)
    heat_painted = Signal(int, float)
    graph_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None, *, scheme_handler: NetronSchemeHandler | None = None,
                 large_graph_threshold: int = LARGE_GRAPH_NODES) -> None:
        super().__init__(parent)
        self._large_graph_threshold = large_graph_threshold
        self._model_path: Path | None = None
        self._served_file = ""
        self._ready = False
        self._node_count: int | None = None
        self._statuses: dict[str, str] = {}
        self._tooltips: dict[str, str] = {}
        self._heat: tuple[dict[str, list[str]], dict[str, str]] | None = None
        self.last_heat_ms: float | None = None
        self._build_widgets()
        # The profile is created last so that it is this widget's last child: Qt deletes children in
        # order, and the page (under the stack) must be deleted before its profile.
        self._handler = scheme_handler or NetronSchemeHandler()
        self._interceptor = LocalOnlyInterceptor()
        self._profile = create_profile(self._handler, self._interceptor, parent=self)
        self._handler.setParent(self._profile)
        self._interceptor.setParent(self._profile)
        self._page = NetronPage(self._profile, self._web)
        self._web.setPage(self._page)
        self._connect_page()
        _LIVE_VIEWS.add(self)
        _release_on_quit()

    def _build_widgets(self) -> None:
        self._banner = QLabel(self)
        self._banner.setObjectName("graphViewBanner")
        self._banner.setWordWrap(True)
        self._banner.setStyleSheet("QLabel { background: #fff4d6; color: #1a1a1a; border-bottom: 1px solid #ffb300;"
                                   " padding: 4px 8px; }")
        self._banner.hide()
        self.graph_tabs = QTabBar(self, objectName="graphTabs")
        self.graph_tabs.setDrawBase(False)
        self.graph_tabs.setExpanding(False)
        self.graph_tabs.currentChanged.connect(self._on_graph_tab)
        self.graph_tabs.hide()
        self._placeholder = QLabel(NO_MODEL_TEXT, self, wordWrap=True, objectName="graphPlaceholder")
        self._placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._web = QWebEngineView()
        self._web.setContextMenuPolicy(Qt.ContextMenuPolicy.NoContextMenu)
        self._stack = QStackedWidget(self)
        self._stack.addWidget(self._placeholder)
        self._stack.addWidget(self._web)
        self.legend = SupportLegend(self)
        self.heat_legend = HeatLegend(self)
        self.heat_legend.hide()
        self._choices: list[tuple[str, str]] = []
        self._extra: tuple[str, str] | None = None
        self.colour_combo = QComboBox(self, objectName="graphColouring")
        self.colour_combo.setToolTip("Colour the nodes by support status, by a compared run's per-layer error, "
                                     "or by the estimated cycles (node details > Performance)")
        self.colour_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.colour_combo.addItem("Colours: support status", "support")
        self.colour_combo.currentIndexChanged.connect(
            lambda _i: self.colouring_changed.emit(self.colour_combo.currentData() or "support"))
        footer = QHBoxLayout()
        footer.setContentsMargins(0, 0, 6, 0)
        footer.addWidget(self.legend, 1)
        footer.addWidget(self.heat_legend, 1)
        footer.addWidget(self.colour_combo)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.graph_tabs)
        layout.addWidget(self._banner)
        layout.addWidget(self._stack, 1)
        layout.addLayout(footer)

    def _connect_page(self) -> None:
        self._page.model_opened.connect(self._on_model_opened)
        self._page.graph_ready.connect(self._on_graph_ready)
        self._page.message_shown.connect(self._on_message_shown)
        self._page.node_selected.connect(self.node_selected)
        self._page.node_context_requested.connect(self._on_context_requested)
        self._page.loadFinished.connect(self._on_load_finished)

    # -- public API --------------------------------------------------------------------------------

    @property
    def model_path(self) -> Path | None:
        """The MBLT shown, or None."""
        return self._model_path

    @property
    def is_ready(self) -> bool:
        """True once the current model's graph is rendered."""
        return self._ready

    @property
    def node_count(self) -> int | None:
        """Rendered node elements of the current graph (None until :attr:`ready`)."""
        return self._node_count

    @property
    def notice(self) -> str:
        """Text of the notice banner above the graph ('' when none is shown)."""
        return "" if self._banner.isHidden() else self._banner.text()

    @property
    def blocked_requests(self) -> list[str]:
        """Non-local URLs the page tried to load: blocked by the request interceptor, or refused by the
        injected ``fetch``/XHR guard before they reached Chromium's network stack."""
        return list(self._interceptor.blocked) + list(self._page.refused_requests)

    @property
    def suppressed_beacons(self) -> list[str]:
        """Telemetry URLs Netron tried to send with ``navigator.sendBeacon``; none left the page."""
        return list(self._page.suppressed_beacons)

    @property
    def refused_navigations(self) -> list[str]:
        """URLs the page tried to navigate to outside the ``qbnetron`` scheme (all refused)."""
        return list(self._page.refused_navigations)

    @property
    def web_view(self) -> QWebEngineView:
        """The embedded web view (for screenshots and tests)."""
        return self._web

    def load_mblt(self, path: str | Path) -> None:
        """Show the MBLT (any ONNX file) at ``path``; :attr:`ready` follows once it is drawn.

        Support statuses of the previous model are dropped; call :meth:`set_support` again (before
        or after ``ready``).

        Raises:
            FileNotFoundError: ``path`` is not a file.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"No model file at '{path}'.")
        self._reset_state()
        self._model_path = path
        self._served_file = model_url_path(self._handler.serve_model(path))
        self._stack.setCurrentWidget(self._web)
        logger.info("Graph view: opening %s", path)
        self._web.setUrl(INDEX_URL)

    def set_graphs(self, names: list[str], tips: Mapping[str, str] | None = None, current: str = "") -> None:
        """Offer the model's graphs as tabs above the view (a decoder LLM's prefill and decode graphs);
        fewer than two names hide the tabs. Choosing one sends :attr:`graph_chosen`; the caller loads it."""
        self.graph_tabs.blockSignals(True)
        while self.graph_tabs.count():
            self.graph_tabs.removeTab(0)
        for name in names:
            index = self.graph_tabs.addTab(name)
            self.graph_tabs.setTabData(index, name)
            self.graph_tabs.setTabToolTip(index, (tips or {}).get(name, ""))
        if current in names:
            self.graph_tabs.setCurrentIndex(names.index(current))
        self.graph_tabs.blockSignals(False)
        self.graph_tabs.setVisible(len(names) > 1)

    @property
    def graph_name(self) -> str:
        """The graph tab chosen ("" when the model has one graph)."""
        return self.graph_tabs.tabData(self.graph_tabs.currentIndex()) or "" if self.graph_tabs.count() > 1 else ""

    def _on_graph_tab(self, index: int) -> None:
        if index >= 0:
            self.graph_chosen.emit(self.graph_tabs.tabData(index))

    def warm_up(self) -> None:
        """Load Netron's page with no model, so the web engine's renderer starts before the first model.

        The first :meth:`load_mblt` then reuses a running renderer: the graph appears sooner. Does
        nothing once a model is shown.
        """
        if self._model_path is None and self._web.url() != INDEX_URL:
            logger.debug("Graph view: loading Netron's page ahead of the first model")
            self._web.setUrl(INDEX_URL)

    def clear(self) -> None:
        """Show no model (and stop serving the last one).

        The page goes back to Netron without a model (behind the "no model" page), which keeps the
        renderer running for the next model.
        """
        shown = self._handler.model_name is not None
        self.set_graphs([])
        self._placeholder.setText(NO_MODEL_TEXT)
        self._reset_state()
        self._handler.clear_model()
        self._stack.setCurrentWidget(self._placeholder)
        if shown or self._web.url() not in (INDEX_URL, QUrl()):
            self._web.setUrl(INDEX_URL)

    def show_progress(self, text: str | None) -> None:
        """Say what a running import does where its graph will appear (None: it ended without a graph).

        Only while no graph is shown: a graph on screen stays until the next one replaces it.
        """
        if self._stack.currentWidget() is self._placeholder:
            self._placeholder.setText(text or NO_MODEL_TEXT)

    def set_support(self, statuses: Mapping[str, str], reasons: Mapping[str, str] | None = None) -> None:
        """Colour nodes by support status, without reloading the page.

        Args:
            statuses: Node name -> ``supported``, ``needs_mfu``, ``unsupported`` or ``cpu_offloaded``
                (``SupportStatus`` members work too). Nodes left out are drawn as Netron draws them.
            reasons: Node name -> why it is not supported; shown in the node's tooltip.

        Raises:
            ValueError: A status is not one of the four above.
        """
        unknown = sorted({str(status) for status in statuses.values()} - set(SUPPORT_PALETTE))
        if unknown:
            raise ValueError(f"Unknown support status {', '.join(unknown)}; expected one of "
                             f"{', '.join(SUPPORT_PALETTE)}.")
        reasons = reasons or {}
        self._statuses = {name: str(status) for name, status in statuses.items()}
        self._tooltips = {name: self._tooltip(status, reasons.get(name, "")) for name, status in self._statuses.items()}
        if self._ready:
            self._push_statuses()

    def set_colourings(self, choices: list[tuple[str, str]]) -> None:
        """Offer ``(key, label)`` colourings after "support status"; keeps the current one if still offered.

        A colouring given to :meth:`set_extra_colouring` stays offered, last.
        """
        self._choices = list(choices)
        self._offer()

    def set_extra_colouring(self, choice: tuple[str, str] | None, *, select: bool = False) -> None:
        """Offer one ``(key, label)`` colouring besides the compared runs' (the Performance tab's cycles), or none.

        With ``select`` it becomes the chosen colouring (``colouring_changed`` is emitted if that changes it).
        """
        self._extra = choice
        self._offer(choice[0] if select and choice else None)

    def _offer(self, chosen: str | None = None) -> None:
        """Refill the selector; keep the current colouring (or take ``chosen``); signal once if it changed."""
        current = self.colour_combo.currentData() or "support"
        self.colour_combo.blockSignals(True)
        while self.colour_combo.count() > 1:
            self.colour_combo.removeItem(1)
        for key, label in [*self._choices, *([self._extra] if self._extra else [])]:
            self.colour_combo.addItem(label, key)
        self.colour_combo.setCurrentIndex(max(0, self.colour_combo.findData(chosen or current)))
        self.colour_combo.blockSignals(False)
        if self.colouring != current:
            self.colouring_changed.emit(self.colouring)

    @property
    def colouring(self) -> str:
        """The chosen colouring key (``support`` or one given to :meth:`set_colourings` or :meth:`set_extra_colouring`)."""
        return self.colour_combo.currentData() or "support"

    def set_heatmap(self, colours: Mapping[str, list[str]], tooltips: Mapping[str, str], *, title: str,
                    stops: list[tuple[float, str]], low: float, high: float, ticks: tuple[float, ...]) -> None:
        """Colour nodes by value (error heatmap) instead of support status, with a gradient legend.

        Args:
            colours: Node name -> ``[fill, text colour]``; other nodes are drawn light grey.
            tooltips: Node name -> tooltip text (the numbers).
            title / stops / low / high / ticks: The legend (see :class:`HeatLegend`).
        """
        self._heat = (dict(colours), dict(tooltips))
        self.heat_legend.set_scale(title, stops, low, high, ticks)
        self.legend.hide()
        self.heat_legend.show()
        if self._ready:
            self._push_heat()

    def clear_heatmap(self) -> None:
        """Back to the support colours."""
        if self._heat is None:
            return
        self._heat = None
        self.heat_legend.hide()
        self.legend.show()
        if self._ready:
            self._push_heat()

    @property
    def heat_active(self) -> bool:
        """Whether nodes are coloured by error."""
        return self._heat is not None

    def _push_heat(self) -> None:
        started = time.perf_counter()
        colours, tips = self._heat if self._heat is not None else (None, {})

        def done(result: str) -> None:
            self.last_heat_ms = (time.perf_counter() - started) * 1000.0
            painted = int(result) if result and result.lstrip("-").isdigit() else 0
            logger.debug("Graph view: heat colours on %d node(s) in %.1f ms", painted, self.last_heat_ms)
            self.heat_painted.emit(painted, self.last_heat_ms)

        self._page.runJavaScript(js_call("qbSetHeat", colours, tips), 0, done)

    def select_node(self, name: str, *, smooth: bool = True) -> None:
        """Select the node called ``name`` in the graph and scroll it into view.

        Does not emit :attr:`node_selected` (that signal is for the user's clicks). A name that is not
        in the rendered graph is logged and ignored.
        """
        if not self._ready:
            logger.debug("Graph view: select_node(%r) before the graph is ready; ignored", name)
            return

        def done(result: str) -> None:
            if result != "true":
                logger.info("Graph view: node %r is not in the rendered graph", name)

        self._page.runJavaScript(js_call("qbSelect", name, "smooth" if smooth else "instant"), 0, done)

    # -- internals ---------------------------------------------------------------------------------

    def _release_web_engine(self) -> None:
        """Delete the page before the profile, now (the view is unusable afterwards)."""
        if not shiboken6.isValid(self):
            return
        for item in (self._page, self._profile):
            if shiboken6.isValid(item):
                shiboken6.delete(item)

    @staticmethod
    def _tooltip(status: str, reason: str) -> str:
        label = SUPPORT_PALETTE[status].label
        return f"{label}: {reason}" if reason else label

    def _reset_state(self) -> None:
        self._ready = False
        self._node_count = None
        self._model_path = None
        self._served_file = ""
        self._statuses = {}
        self._tooltips = {}
        self._heat = None
        self.heat_legend.hide()
        self.legend.show()
        self._banner.hide()

    def _push_statuses(self) -> None:
        self._page.runJavaScript(js_call("qbSetStatuses", self._statuses, self._tooltips), 0)

    def _on_model_opened(self, file: str, nodes: int) -> None:
        if not self._served_file or file != self._served_file or nodes <= self._large_graph_threshold:
            return
        logger.info("Graph view: large graph (%d nodes), layout will take a while", nodes)
        self._show_notice(f"Large graph: {nodes:,} nodes. Netron is laying it out in the background, which "
                          "can take a while; the rest of qb Studio stays usable.")

    def _show_notice(self, text: str) -> None:
        self._banner.setText(text)
        self._banner.show()

    def _on_graph_ready(self, file: str, nodes: int) -> None:
        if not self._served_file or file != self._served_file:
            return
        self._ready = True
        self._node_count = nodes
        self._banner.hide()
        if nodes > self._large_graph_threshold:
            self._show_notice(f"Large graph: {nodes:,} nodes. Scrolling and zooming may be slow.")
        if self._statuses:
            self._push_statuses()
        if self._heat is not None:
            self._push_heat()
        logger.info("Graph view: %s rendered (%d nodes)", self._model_path, nodes)
        self.ready.emit()

    def _on_message_shown(self, file: str, text: str, kind: str, button: str) -> None:
        if not self._served_file or file != self._served_file:
            return
        if kind == "notification" and button == _LAYOUT_CANCEL_BUTTON:
            # Netron's "layout might take a very long time" notice: the layout goes on in its worker.
            self._show_notice(f"{text} The rest of qb Studio stays usable; Cancel in the graph stops it.")
            return
        logger.warning("Graph view: Netron shows %r instead of the graph of %s", text, self._model_path)
        self.load_failed.emit(text)

    def _on_load_finished(self, ok: bool) -> None:
        if not ok and self._served_file:
            self.load_failed.emit("The graph page could not be loaded.")

    def _on_context_requested(self, name: str, x: int, y: int) -> None:
        zoom = self._page.zoomFactor()
        position = self._web.mapToGlobal(QPoint(round(x * zoom), round(y * zoom)))
        self.select_node(name)
        self.node_context_requested.emit(name, position)
