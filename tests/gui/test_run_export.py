"""Issue 11 exports: "Copy as command" / "Copy as Python" rebuild a run's MXQ byte for byte; "Export report…" writes
the HTML report (checked in QtWebEngine's Chromium) and "Export per-layer CSV…" the analysis numbers.

The run is compiled through ``qbstudio.tasks.compile_run``, the function the Compile button runs in its child
process (here called directly), into a project-like ``runs/run-001`` folder. The MXQ's meta records its own save
path, so a reproduction must write to that same path: the tests move the original MXQ aside, run the copied text
in a fresh interpreter (``qbcompiler`` is the console script of ``python -m compiler_core``, so the copied command's
first word is replaced by that; nothing else changes) and compare the new file with the original, byte for byte,
without any normalisation. Also the *Two graphs* tab (selection and viewport synced). Screenshots:
build/screenshots/runs_copy_menu.png, runs_report.png, compare_two_graphs.png.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtCore import QPoint, QUrl  # noqa: E402
from PySide6.QtGui import QGuiApplication, QPainter  # noqa: E402
from PySide6.QtWebEngineWidgets import QWebEngineView  # noqa: E402

from compiler_core.config import resolve_config  # noqa: E402
from compiler_core.sweep import InProcessExecutor, run_sweep  # noqa: E402
from compiler_core.sweep.report import LAYER_CSV_COLUMNS, SECTIONS  # noqa: E402
from qbstudio.state.runs import RunHistory, RunRecord  # noqa: E402
from qbstudio.tasks import compile_run  # noqa: E402
from qbstudio.widgets.compare_graphs import SYNC_MS  # noqa: E402
from qbstudio.widgets.compare_view import CompareView  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "resources" / "samples" / "fashion_cnn"
SCREENSHOTS = ROOT / "build" / "screenshots"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run #1 compiled like the Compile button does; runs #2 and #3 two points of a sweep of the same MBLT."""
    from compiler_core.api import load_mblt, mblt_compile

    folder = tmp_path_factory.mktemp("project")
    patch = pytest.MonkeyPatch()
    patch.setenv("QBCOMPILER_CACHE_DIR", str(folder / "cache"))
    try:
        mblt = Path(mblt_compile(SAMPLE / "model.onnx", folder / "model.mblt"))
        config = resolve_config(compile_config=SAMPLE / "compile_config.yaml")
        calib = str(SAMPLE / "calib")
        outcome = compile_run(mblt, folder / "runs" / "run-001" / "model.mxq", config, calib, False)
        calibration = {"path": calib, "use_random": False}
        first = RunRecord.from_result(1, outcome.result, outcome.analysis, config=config.to_dict(),
                                      config_summary="Compile button", precisions=outcome.precisions,
                                      duration_s=outcome.duration_s, model_sha256="sha", calibration=calibration)
        sweep = run_sweep({"baseConfig": str(SAMPLE / "compile_config.yaml"), "axes": {"calibrationMode": [0, 2]}},
                          folder / "sweep", mblt=mblt, calib_data_path=calib, executor=InProcessExecutor())
        points = [RunRecord.from_sweep_record(i + 2, record, model_sha256="sha", origin=f"sweep 1 · {record['name']}",
                                              calibration=calibration) for i, record in enumerate(sweep.records)]
        yield {"runs": [first, *points], "mblt": mblt, "order": [node.name for node in load_mblt(mblt).graph],
               "folder": folder}
    finally:
        patch.undo()


@pytest.fixture
def view(qtbot, runs):
    widget = CompareView(None, {})
    widget.resize(1300, 820)
    widget.set_history(RunHistory(runs["runs"]))
    widget.set_layer_order(runs["order"])
    widget.model_name = str(SAMPLE / "model.onnx")
    widget.show()
    qtbot.waitExposed(widget)
    yield widget
    runner = widget.histogram.runner
    runner.shutdown()
    widget.close()
    _delete_now(qtbot, widget)


def _delete_now(qtbot, widget) -> None:
    deleted: list[bool] = []
    widget.destroyed.connect(lambda: deleted.append(True))
    widget.deleteLater()
    qtbot.waitUntil(lambda: bool(deleted), timeout=5000)


def _action(menu, text: str):
    return next(action for action in menu.actions() if action.text().endswith(text))


def _rebuild(mxq: Path, argv: list[str], env_cache: Path) -> bytes:
    """Move ``mxq`` aside, run ``argv`` in a fresh interpreter from another folder, return the new file's bytes."""
    original = mxq.read_bytes()
    aside = mxq.with_name(mxq.name + ".orig")
    mxq.rename(aside)
    try:
        env = {"PYTHONPATH": str(ROOT), "QBCOMPILER_CACHE_DIR": str(env_cache), "PATH": "/usr/bin:/bin",
               "HOME": str(env_cache)}
        done = subprocess.run(argv, cwd=env_cache, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        rebuilt = mxq.read_bytes()
    finally:
        mxq.unlink(missing_ok=True)
        aside.rename(mxq)
    assert mxq.read_bytes() == original
    return rebuilt


@pytest.mark.parametrize("index", [0, 1])
def test_copied_command_and_python_rebuild_the_mxq_byte_for_byte(qtbot, view, runs, tmp_path, index):
    run = runs["runs"][index]
    mxq = Path(run.mxq_path)
    menu = view.run_menu(run.run_id)
    _action(menu, "Copy as command").trigger()
    command = QGuiApplication.clipboard().text()
    argv = shlex.split(command)
    assert argv[:2] == ["qbcompiler", "compile"] and argv[argv.index("--output") + 1] == str(mxq)
    paths = [argv[argv.index(flag) + 1] for flag in ("--model", "--calib-data-path", "--compile-config")]
    assert all(Path(path).is_absolute() and Path(path).exists() for path in paths)
    config = json.loads(Path(paths[2]).read_text())
    assert Path(paths[2]).parent == mxq.parent and config["savePaths"] == [str(mxq)]
    if index == 0:  # the Compile button's run: its own compile_config.json is the recorded config, reused
        assert Path(paths[2]).name == "compile_config.json" and not list(mxq.parent.glob("*.reproduce.json"))
    original = mxq.read_bytes()
    assert _rebuild(mxq, [sys.executable, "-m", "compiler_core", *argv[1:]], tmp_path) == original

    _action(view.run_menu(run.run_id), "Copy as Python").trigger()
    snippet = QGuiApplication.clipboard().text()
    assert snippet.startswith("from compiler_core.api import mxq_compile") and str(mxq) in snippet
    assert _rebuild(mxq, [sys.executable, "-c", snippet], tmp_path) == original


def test_copy_menu_in_the_runs_table_and_the_compare_window(qtbot, view, runs):
    view.set_picks([1, 2, 3], baseline=1)
    menu = view.run_menu(2)
    texts = [action.text() for action in menu.actions() if action.text()]
    assert texts[:2] == ["Copy as command", "Copy as Python"] and "Delete run…" in texts
    header = view.side.header_menu(2)
    assert [action.text() for action in header.actions()] == [f"{runs['runs'][2].label}: Copy as command",
                                                              f"{runs['runs'][2].label}: Copy as Python"]
    view.copy_button.menu().aboutToShow.emit()
    assert len(view.copy_button.menu().actions()) == 6
    rect = view.table.visualItemRect(view.table.item(1, 3))
    position = view.table.viewport().mapTo(view, rect.center())
    menu.popup(view.mapToGlobal(position))
    qtbot.waitUntil(menu.isVisible)
    picture = view.grab()
    painter = QPainter(picture)
    painter.drawPixmap(position + QPoint(4, 4), menu.grab())
    painter.end()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert picture.save(str(SCREENSHOTS / "runs_copy_menu.png"))
    menu.close()


def test_a_run_whose_mxq_is_gone_is_an_error_box_not_a_traceback(qtbot, view, runs, dialog_calls):
    ghost = RunRecord.from_dict({**runs["runs"][0].to_dict(), "run_id": 9, "mxq_path": str(runs["folder"] / "gone.mxq")})
    view.set_history(RunHistory([*runs["runs"], ghost]))
    _action(view.run_menu(9), "Copy as command").trigger()
    assert dialog_calls and dialog_calls[-1][0] == "Cannot reproduce #9 aries-rb"


def _run_js(qtbot, page_view, expression: str):
    results: list = []
    page_view.page().runJavaScript(f"JSON.stringify({expression})", 0, results.append)
    qtbot.waitUntil(lambda: len(results) > 0, timeout=5000)
    return json.loads(results[0]) if results[0] else None


def test_exported_report_opens_in_chromium_with_every_section(qtbot, view, runs, tmp_path):
    view.set_picks([1, 2, 3], baseline=2)
    report = view.export_report(str(tmp_path / "report.html"))
    assert report == tmp_path / "report.html"
    html = report.read_text()
    assert "<script" not in html and not re.search(r"\b(src|href)=", html)  # self-contained: nothing to fetch
    browser = QWebEngineView()
    browser.resize(1100, 900)
    browser.show()
    qtbot.waitExposed(browser)
    with qtbot.waitSignal(browser.loadFinished, timeout=30_000) as loaded:
        browser.load(QUrl.fromLocalFile(str(report)))
    assert loaded.args == [True]
    heights = _run_js(qtbot, browser, "Object.fromEntries(Array.from(document.querySelectorAll('section'))"
                                      ".map(s => [s.id, s.getBoundingClientRect().height]))")
    assert list(heights) == list(SECTIONS) and all(height > 40 for height in heights.values())
    drawn = _run_js(qtbot, browser, "({title: document.querySelector('h1').textContent, "
                                    "lines: document.querySelectorAll('#layers-plot polyline.series').length, "
                                    "points: document.querySelectorAll('#pareto-chart circle.point').length, "
                                    "diff: Array.from(document.querySelectorAll('#settings th')).map(t => t.textContent),"
                                    "commands: Array.from(document.querySelectorAll('#commands code'))"
                                    ".map(c => c.textContent), summary: document.getElementById('summary').textContent})")
    compared = runs["runs"]
    assert drawn["title"] == "Runs report" and drawn["lines"] == 3 and drawn["points"] == 3
    assert "calibration.mode" in drawn["diff"] and "baseline: #2 aries-rb" in drawn["summary"]
    assert [shlex.split(text)[-1] for text in drawn["commands"]] == [run.mxq_path for run in compared]
    _run_js(qtbot, browser, "document.getElementById('metrics').scrollIntoView()")
    qtbot.wait(300)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert browser.grab().save(str(SCREENSHOTS / "runs_report.png"))
    _delete_now(qtbot, browser)


def test_exported_csv_has_one_row_per_layer_per_run_equal_to_the_analysis(view, runs, tmp_path):
    view.set_picks([1, 3])
    path = view.export_csv(str(tmp_path / "layers.csv"))
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert tuple(rows[0]) == LAYER_CSV_COLUMNS
    for run in (runs["runs"][0], runs["runs"][2]):
        analysis = json.loads(Path(run.mxq_path).with_suffix(".analysis.json").read_text())["layers"]
        mine = [row for row in rows if row["run"] == run.label]
        assert len(mine) == len(analysis) > 5
        by_layer = {row["layer"]: row for row in analysis}
        for row in mine:
            expected = by_layer[row["layer"]]
            assert float(row["sqnr_db"]) == expected["sqnr_db"] and row["precision"] == expected["precision"]
            assert float(row["cosine_mean"]) == expected["cosine_mean"]
        ranks = [runs["order"].index(row["layer"]) for row in mine if row["layer"] in runs["order"]]
        assert ranks == sorted(ranks)  # graph order


def test_unwritable_export_paths_are_message_boxes(view, runs, tmp_path, dialog_calls):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert view.export_report(str(blocker / "report.html")) is None
    assert view.export_csv(str(blocker / "layers.csv")) is None
    assert [title for title, _ in dialog_calls] == ["Report not written", "CSV not written"]
    assert "Cannot write" in dialog_calls[0][1]


def _graph_js(qtbot, graph, expression: str):
    return _run_js(qtbot, graph.web_view, expression)


def test_two_graphs_side_by_side_with_synced_selection_and_viewport(qtbot, view, runs):
    view.set_picks([1, 3], baseline=1)
    view.twin.set_model(str(runs["mblt"]))
    view.tabs.setCurrentWidget(view.twin)
    left, right = view.twin.views
    qtbot.waitUntil(lambda: left.is_ready and right.is_ready, timeout=60_000)
    assert (left.colouring, right.colouring) == ("sqnr:1", "sqnr:3") and left.heat_active and right.heat_active
    fill = "getComputedStyle(document.querySelector('#node-name-Conv_0 > g.node-item-type > path')).fill"
    qtbot.waitUntil(lambda: _graph_js(qtbot, left, fill) != _graph_js(qtbot, right, fill), timeout=5000)

    selected = "Array.from(window.__view__.target.selection).map(e => e.value.name)"
    left.node_selected.emit("Conv_1")  # what a click on Conv_1 in the left graph sends (tests/gui/test_graph_view.py)
    qtbot.waitUntil(lambda: _graph_js(qtbot, right, selected) == ["Conv_1"], timeout=5000)

    viewport = "[window.__view__.target._zoom, document.getElementById('target').scrollTop]"
    settled: list = []  # the right view's scroll to Conv_1 is over once two reads agree
    qtbot.waitUntil(lambda: settled.append(_graph_js(qtbot, right, viewport)) or settled[-2:-1] == settled[-1:],
                    timeout=5000)
    qtbot.wait(2 * SYNC_MS)
    _graph_js(qtbot, left, "(() => { window.__view__.target._updateZoom(1.3); "
                           "document.getElementById('target').scrollTop = 150; return 1; })()")
    moved = _graph_js(qtbot, left, viewport)
    assert moved[0] == pytest.approx(1.3) and moved[1] > 0
    qtbot.waitUntil(lambda: _graph_js(qtbot, right, viewport) == moved, timeout=5000)
    qtbot.wait(300)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert view.grab().save(str(SCREENSHOTS / "compare_two_graphs.png"))
