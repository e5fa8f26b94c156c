"""The HTML sweep report in a real browser engine (QtWebEngine's Chromium, offscreen): every section renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtCore import QUrl  # noqa: E402
from PySide6.QtWebEngineWidgets import QWebEngineView  # noqa: E402

from compiler_core.sweep import make_executor, run_sweep  # noqa: E402
from compiler_core.sweep.report import SECTIONS, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "resources" / "samples" / "fashion_cnn"
SCREENSHOT = ROOT / "build" / "screenshots" / "sweep_report.png"


def run_js(qtbot, view: QWebEngineView, expression: str):
    results = []
    view.page().runJavaScript(f"JSON.stringify({expression})", 0, results.append)
    qtbot.waitUntil(lambda: len(results) > 0, timeout=5000)
    return json.loads(results[0]) if results[0] else None


def test_the_report_opens_in_chromium_with_every_section_drawn(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    grid = {"baseConfig": str(SAMPLE / "compile_config.yaml"),
            "axes": {"calibrationMode": [0, 1], "biasCorrection": [False, True]}}
    result = run_sweep(grid, tmp_path / "out", model=SAMPLE / "model.onnx", calib_data_path=SAMPLE / "calib",
                       executor=make_executor("inprocess"))
    report = write_report(result.json_path, tmp_path / "report.html")
    view = QWebEngineView()
    view.resize(1000, 900)
    view.show()
    qtbot.waitExposed(view)
    with qtbot.waitSignal(view.loadFinished, timeout=30_000) as loaded:
        view.load(QUrl.fromLocalFile(str(report)))
    assert loaded.args == [True]
    heights = run_js(qtbot, view, "Object.fromEntries(Array.from(document.querySelectorAll('section'))"
                                  ".map(s => [s.id, s.getBoundingClientRect().height]))")
    assert list(heights) == list(SECTIONS) and all(height > 40 for height in heights.values())
    drawn = run_js(qtbot, view, "({lines: document.querySelectorAll('#layers-plot polyline.series').length, "
                                "points: document.querySelectorAll('#pareto-chart circle.point').length, "
                                "front: document.querySelectorAll('#pareto-chart circle.front').length, "
                                "width: document.getElementById('pareto-chart').getBoundingClientRect().width, "
                                "rows: document.querySelectorAll('#metrics tr').length})")
    assert drawn["lines"] == 4 and drawn["points"] == 4 and drawn["front"] == len(result.front) >= 1
    assert drawn["width"] > 500 and drawn["rows"] >= 5  # header + one row per point (one output each)
    run_js(qtbot, view, "document.getElementById('pareto').scrollIntoView()")
    qtbot.wait(200)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert view.grab().save(str(SCREENSHOT))
    deleted = []  # the page goes before the default profile (else Qt warns "Release of profile requested")
    view.destroyed.connect(lambda: deleted.append(True))
    view.deleteLater()
    qtbot.waitUntil(lambda: bool(deleted), timeout=5000)
