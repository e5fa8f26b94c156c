"""Runs & Compare in the workbench window: a sweep from the editor (streamed, then a cancelled one), the graph
heatmap through the colour switch, layer selection from the per-layer plot, deleting runs, and reopening.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from qbstudio import dialogs  # noqa: E402
from qbstudio.widgets.welcome import SAMPLE_PROJECT  # noqa: E402

TIMEOUT_MS = 180_000


def _open(qtbot, window, path) -> None:
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT_MS):
        window.open_path(path)
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=TIMEOUT_MS)


def test_sweep_heatmap_delete_and_reopen_in_the_window(qtbot, shown_window, dialog_calls, monkeypatch, tmp_path):
    window = shown_window
    _open(qtbot, window, SAMPLE_PROJECT)
    window.log_handler.flush_pending()
    assert "kept once" not in window.log_dock.text()  # the sweep editor's default grid logs nothing at open
    assert window.save_project_as(tmp_path / "fashion" / "fashion.qbproj")
    compare, panel = window.compare, window.compare.sweep
    window.tabs.setCurrentWidget(compare)
    compare.tabs.setCurrentWidget(panel)

    # 1. a 2-point sweep: each finished point becomes a run at once
    panel.editor.set_checked([0, 2], bias=(False,))
    assert panel.point_count() == 2
    counts: list[int] = []
    window.session.runs_changed.connect(lambda: counts.append(len(window.session.runs)))
    panel.run_button.click()
    assert panel.cancel_button.isEnabled() and not panel.run_button.isEnabled(), (dialog_calls, panel.status.text())
    qtbot.waitUntil(lambda: not window.runner.is_busy("sweep"), timeout=TIMEOUT_MS)
    assert dialog_calls == []
    assert counts == [1, 2] and compare.table.rowCount() == 2
    assert panel.status.text().startswith("Sweep done: 2 points")
    assert all("run #" in panel.points.item(i).text() for i in range(2))
    runs = window.session.runs.runs
    assert sorted(run.origin for run in runs) == ["sweep 1 · point-00", "sweep 1 · point-01"]  # in finishing order
    assert all(Path(run.mxq_path).is_file() and run.estimate and run.calibration["path"] for run in runs)
    assert len(panel.chart.data.run_ids) == 2

    # 1b. the points of a command-line sweep of this model are imported as runs (once); another model's are refused
    from compiler_core.sweep import InProcessExecutor, run_sweep

    project = window.project
    cli = run_sweep({"baseConfig": project.settings.config.to_dict(), "axes": {"calibrationMode": [3]}},
                    tmp_path / "cli-sweep", mblt=project.mblt_path, calib_data_path=project.calibration.path,
                    executor=InProcessExecutor())
    assert window.compare_controller.import_sweep(cli.json_path) == 1
    assert window.compare_controller.import_sweep(cli.json_path) == 0
    assert window.session.runs.get(3).origin == "cli-sweep · point-00" and compare.table.rowCount() == 3
    other = tmp_path / "other.json"
    other.write_text('{"format": "qbcompiler-sweep", "mblt": "%s", "records": []}' % (tmp_path / "fashion" / "fashion.qbproj"))
    assert window.compare_controller.import_sweep(other) == 0
    assert dialog_calls and dialog_calls[-1][0] == "Cannot import the sweep" and "another model" in dialog_calls[-1][1]
    dialog_calls.clear()
    assert window.session.remove_run(3)

    # 2. heatmap: the graph offers each picked run's SQNR and the delta to the baseline
    compare.set_picks([1, 2], baseline=1)
    combo = window.graph.colour_combo
    keys = [combo.itemData(i) for i in range(combo.count())]
    assert keys == ["support", "sqnr:1", "sqnr:2", "delta:2:1"]
    window.tabs.setCurrentWidget(window.graph)
    with qtbot.waitSignal(window.graph.heat_painted, timeout=10_000) as painted:
        combo.setCurrentIndex(keys.index("delta:2:1"))
    assert painted.args[0] > 0 and window.graph.heat_active
    assert window.graph.heat_legend.title.startswith("Δ SQNR")
    with qtbot.waitSignal(window.graph.heat_painted, timeout=10_000):
        combo.setCurrentIndex(0)
    assert not window.graph.heat_active

    # 3. a layer clicked in the per-layer plot is selected in the layer table and the details
    compare.layers.layer_activated.emit("Conv_1")
    assert window.details.node == "Conv_1"
    assert compare.histogram.layer == "Conv_1"

    # 4. a cancelled sweep keeps the points that finished, and says so
    panel.editor.set_checked([0, 1, 2, 3], bias=(False, True), percentiles="0.999")
    assert panel.point_count() == 8
    before = len(window.session.runs)
    panel.run_button.click()
    qtbot.waitUntil(lambda: len(window.session.runs) > before or not window.runner.is_busy("sweep"),
                    timeout=TIMEOUT_MS)
    panel.cancel_button.click()
    qtbot.waitUntil(lambda: not window.runner.is_busy("sweep"), timeout=TIMEOUT_MS)
    assert "cancelled" in panel.status.text() and dialog_calls == []
    assert before < len(window.session.runs) < before + 8

    # 5. deleting asks first; "No" keeps the run
    asked: list[str] = []
    monkeypatch.setattr(dialogs, "ask_yes_no", lambda _parent, _title, text: asked.append(text) or False)
    compare.set_picks([1])
    assert not compare.ask_delete() and window.session.runs.get(1) is not None and "#1" in asked[0]
    monkeypatch.setattr(dialogs, "ask_yes_no", lambda *_args: True)
    assert compare.ask_delete() and window.session.runs.get(1) is None
    kept = [run.run_id for run in window.session.runs.runs]
    assert window.autosave() == window.project.path

    # 6. the runs survive closing and reopening the project
    path = window.project.path
    assert window.new_project()
    _open(qtbot, window, path)
    reopened = window.session.runs.runs
    assert [run.run_id for run in reopened] == kept and compare.table.rowCount() == len(kept)
    assert reopened[0].estimate and reopened[0].origin.startswith("sweep 1") and Path(reopened[0].mxq_path).is_file()
