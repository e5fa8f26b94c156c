"""A user's sessions in the real window, third round (s16, found under Xvfb): open -> compile -> Performance tab and
cycles heatmap -> change a setting -> compile -> compare the two runs.

Dialogs are answered through ``qbstudio.dialogs`` (the fixtures of ``test_user_path``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from test_user_path import (  # noqa: E402, F401  (fixtures)
    TIMEOUT_MS,
    answers,
    make_window,
    open_sample_with_preview,
)


def compile_now(qtbot, window) -> None:
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as blocker:
        assert window.start_compile()
    assert blocker.args == ["done"]


def test_the_performance_tab_shows_the_compile_just_made(qtbot, make_window, answers):  # noqa: F811
    """After a compile the Performance tab still said "Compile the model to see where the time goes." (and its
    cycles switch was off) until a node was selected in the graph or the layer table."""
    window = make_window()
    open_sample_with_preview(qtbot, window)
    view = window.details.performance
    window.details.tabs.setCurrentWidget(view)
    assert "Compile the model" in view.summary.text()
    compile_now(qtbot, window)
    qtbot.waitUntil(lambda: view.report is not None, timeout=TIMEOUT_MS)
    assert (
        view.colour.isEnabled() and view.mode.count() > 0 and "Compile the model" not in view.summary.text()
    )
    assert window.details.node is None  # no node was selected
    assert not answers.errors


def test_runs_are_told_apart_in_the_compile_tab_s_words(qtbot, make_window, answers):  # noqa: F811
    """Compile, change Range grouping on the Compile tab, compile, compare: the runs table said "method WChALayer"
    and "method WChAMulti", the side-by-side "0 WChALayer" / "1 WChAMulti", for what the Compile tab calls "Per
    tensor, symmetric" and "Concat-shared, symmetric"."""
    window = make_window()
    open_sample_with_preview(qtbot, window)
    combo = window.options.method_combo
    chosen = []
    for index in (0, 1):
        combo.setCurrentIndex(combo.findData(index))
        chosen.append(combo.currentText())
        compile_now(qtbot, window)
    runs = window.session.runs.runs[-2:]
    assert [chosen[index] in run.config_summary for index, run in enumerate(runs)] == [True, True]
    table = window.compare.table
    settings_column = next(
        column
        for column in range(table.columnCount())
        if table.horizontalHeaderItem(column).text() == "Settings"
    )
    shown = [table.item(row, settings_column).text() for row in range(table.rowCount())]
    assert all(any(text in line for line in shown) for text in chosen), shown
    window.tabs.setCurrentWidget(window.compare)
    window.compare.set_picks([run.run_id for run in runs])
    side = window.compare.side
    assert [side.cell("calibration.method", column).text().split(" (")[0] for column in (0, 1)] == chosen
    assert not answers.errors


def test_the_cycles_heatmap_follows_the_next_compile(qtbot, make_window, answers):  # noqa: F811
    """Colour by cycles, change a setting, compile: the switch went off and the graph back to support status (the
    Performance tab dropped it while the new run was profiled); it now repaints with the new run's cycles."""
    window = make_window()
    open_sample_with_preview(qtbot, window)
    view, graph = window.details.performance, window.graph
    window.details.tabs.setCurrentWidget(view)
    window.set_device("regulus-ra")
    compile_now(qtbot, window)
    qtbot.waitUntil(lambda: view.report is not None, timeout=TIMEOUT_MS)
    with qtbot.waitSignal(graph.heat_painted, timeout=5000):
        view.colour.setChecked(True)
    first = view.report
    window.set_device("aries-rb")
    compile_now(qtbot, window)
    qtbot.waitUntil(lambda: view.report not in (None, first), timeout=TIMEOUT_MS)
    latency_us = view.report["modes"]["single"]["latency_ms"] * 1000
    qtbot.waitUntil(
        lambda: f"({latency_us:.0f} µs)" in graph.heat_legend.title, timeout=5000
    )  # the new run's
    assert view.colour.isChecked() and graph.colouring == "cycles:single"
    assert graph.colour_combo.currentText() == "Colours: cycles (single)"
    assert not answers.errors
