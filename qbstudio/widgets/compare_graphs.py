"""Two graphs side by side: the model in two Netron views, each coloured by a compared run, selection and
viewport kept in step.

The views are created the first time the tab is shown (two more Chromium pages cost start-up time
and memory nobody needs until then). Selecting a node in one view selects it (and scrolls to it) in
the other; panning and zooming one view is copied to the other while the tab is visible (polled every
:data:`SYNC_MS`, through Netron's graph target: ``#target`` scroll offsets and the target's zoom).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QLabel, QSplitter, QVBoxLayout, QWidget

from qbstudio.state.compare import colouring, colouring_choices
from qbstudio.state.runs import RunRecord

if TYPE_CHECKING:
    from qbstudio.widgets.graph_view import GraphView

logger = logging.getLogger(__name__)

SYNC_MS = 150
"""How often the visible views' viewports are compared."""

_READ_VIEWPORT = """(() => { try { const c = document.getElementById('target'); const t = window.__view__.target;
  return JSON.stringify([t._zoom || 1, c.scrollLeft, c.scrollTop]); } catch (e) { return ''; } })()"""
_WRITE_VIEWPORT = """(() => { try { const c = document.getElementById('target'); const t = window.__view__.target;
  const v = %s; if (Math.abs((t._zoom || 1) - v[0]) > 1e-6) { t._updateZoom(v[0]); }
  t._scrollLeft = v[1]; t._scrollTop = v[2]; c.scrollLeft = v[1]; c.scrollTop = v[2];
  return JSON.stringify([t._zoom || 1, c.scrollLeft, c.scrollTop]); } catch (e) { return ''; } })()"""


def apply_colouring(graph: GraphView, key: str, find: Callable[[int], RunRecord | None]) -> None:
    """Colour ``graph`` by ``key`` (``support``, ``sqnr:<run>``, ``delta:<run>:<baseline>``); ``find`` gives runs."""
    heat = colouring(key, find)
    if heat is None:
        graph.clear_heatmap()
        return
    graph.set_heatmap(heat.colours, heat.tooltips, title=heat.title, stops=heat.scale.stops(), low=heat.scale.low,
                      high=heat.scale.high, ticks=heat.scale.ticks)


class TwinGraphs(QWidget):
    """Two views of the model, each with its own colouring; selection and viewport synced.

    Signals:
        node_selected(str): the user selected a node in either view.
    """

    node_selected = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.views: list[GraphView] = []
        self.mblt_path = ""
        self._runs: list[RunRecord] = []
        self._baseline: int | None = None
        self._viewports: list[list[float] | None] = [None, None]
        self._timer = QTimer(self, interval=SYNC_MS)
        self._timer.timeout.connect(self.sync_viewports)
        self._placeholder = QLabel("The two graphs load when this tab is first shown.", self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._placeholder)

    # -- inputs -----------------------------------------------------------------------------------

    def set_model(self, path: str) -> None:
        """Show the MBLT ``path`` (both views; loaded once the views exist)."""
        self.mblt_path = str(path or "")
        for view in self.views:
            self._load(view)

    def set_runs(self, runs: Sequence[RunRecord], baseline: int | None) -> None:
        """The compared runs and the baseline's run id: the colourings each view offers."""
        self._runs, self._baseline = list(runs), baseline
        if self.views:
            self._offer_colourings()

    # -- views ------------------------------------------------------------------------------------

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Create the views on first show; poll the viewports while shown."""
        super().showEvent(event)
        self.ensure_views()
        self._timer.start()

    def hideEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Stop polling the viewports."""
        super().hideEvent(event)
        self._timer.stop()

    def ensure_views(self) -> None:
        """Create and load the two views (once)."""
        if self.views:
            return
        from qbstudio.widgets.graph_view import GraphView

        splitter = QSplitter(self)
        for index in range(2):
            view = GraphView(splitter)
            view.setObjectName(f"twinGraph{index}")
            view.node_selected.connect(lambda name, i=index: self._on_selected(i, name))
            view.colouring_changed.connect(lambda key, v=view: apply_colouring(v, key, self._find))
            splitter.addWidget(view)
            self.views.append(view)
        self._placeholder.hide()
        self.layout().addWidget(splitter, 1)
        for view in self.views:
            self._load(view)
        self._offer_colourings()

    def _load(self, view: GraphView) -> None:
        """Show the model in ``view`` (a new model drops its colours: they are applied again)."""
        if not self.mblt_path:
            view.clear()
            return
        if view.model_path is not None and str(view.model_path) == self.mblt_path:
            return
        try:
            view.load_mblt(self.mblt_path)
        except FileNotFoundError as error:
            logger.warning("Two graphs: %s", error)
            return
        apply_colouring(view, view.colouring, self._find)

    def _find(self, run_id: int) -> RunRecord | None:
        return next((run for run in self._runs if run.run_id == run_id), None)

    def _offer_colourings(self) -> None:
        choices = colouring_choices(self._runs, self._baseline)
        keys = [key for key, _ in choices if key.startswith("sqnr:")]
        others = [key for key in keys if key != f"sqnr:{self._baseline}"]
        defaults = [f"sqnr:{self._baseline}" if f"sqnr:{self._baseline}" in keys else (keys or ["support"])[0],
                    others[0] if others else "support"]
        for view, default in zip(self.views, defaults):
            current = view.colouring
            view.set_colourings(choices)
            wanted = current if current in {key for key, _ in choices} else default
            index = view.colour_combo.findData(wanted)
            if index >= 0 and index != view.colour_combo.currentIndex():
                view.colour_combo.setCurrentIndex(index)  # emits colouring_changed -> apply_colouring
            else:
                apply_colouring(view, view.colouring, self._find)

    # -- sync -------------------------------------------------------------------------------------

    def _on_selected(self, index: int, name: str) -> None:
        self.views[1 - index].select_node(name, smooth=False)  # no scroll animation racing the viewport sync
        self.node_selected.emit(name)

    def select_node(self, name: str) -> None:
        """Select ``name`` in both views (a selection made elsewhere in the window)."""
        for view in self.views:
            view.select_node(name)

    def sync_viewports(self) -> None:
        """Copy the viewport (zoom and scroll) of the view the user moved to the other one."""
        if len(self.views) != 2 or not all(view.is_ready for view in self.views):
            return
        states: list[list[float] | None] = [None, None]

        def read(index: int, result: str) -> None:
            states[index] = json.loads(result) if result else None
            if all(state is not None for state in states):
                self._copy_moved(states)

        for index, view in enumerate(self.views):
            view.web_view.page().runJavaScript(_READ_VIEWPORT, 0, lambda result, i=index: read(i, result))

    def _copy_moved(self, states: list[list[float]]) -> None:
        moved = [self._viewports[i] is not None and _differs(states[i], self._viewports[i]) for i in range(2)]
        if self._viewports[0] is None or moved[0] == moved[1]:
            self._viewports = [list(state) for state in states]  # first look, or both moved: no winner
            return
        source = 0 if moved[0] else 1
        self._viewports[source] = list(states[source])

        def written(result: str) -> None:
            self._viewports[1 - source] = json.loads(result) if result else None

        self.views[1 - source].web_view.page().runJavaScript(_WRITE_VIEWPORT % json.dumps(states[source]), 0,
                                                              written)


def _differs(now: Sequence[float], before: Sequence[float]) -> bool:
    return abs(now[0] - before[0]) > 1e-6 or abs(now[1] - before[1]) > 1 or abs(now[2] - before[2]) > 1
