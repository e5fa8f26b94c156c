"""The graph view's verdict includes the fit check: a layer too large for a core's SRAM is flagged, not green."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import helper

pytest.importorskip("PySide6.QtWebEngineWidgets")

from test_fit import _conv_then  # noqa: E402  (the fit test's graphs)
from test_graph_view import node_classes  # noqa: E402

MODEL_TIMEOUT_MS = 60_000
FIT_TIMEOUT_MS = 30_000


def _open(qtbot, window, path: Path) -> None:
    with qtbot.waitSignal(window.model_ready, timeout=MODEL_TIMEOUT_MS):
        window.open_path(path)
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=MODEL_TIMEOUT_MS)


def _source_node(window, source: str) -> str:
    return next(name for name, entry in window.report.entries.items() if entry.source_name == source)


def test_a_layer_too_large_is_flagged_in_the_graph_and_blocks_compile(qtbot, shown_window, tmp_path):
    window = shown_window
    tail = helper.make_node("Transpose", ["c"], ["y"], perm=[0, 1, 3, 2], name="BigTranspose")
    _open(qtbot, window, _conv_then(tmp_path / "big.onnx", [1, 16, 512, 512], 16, tail, [1, 16, 512, 512]))
    node = _source_node(window, "BigTranspose")
    qtbot.waitUntil(lambda: window.report.entries[node].status == "unsupported", timeout=FIT_TIMEOUT_MS)
    assert "does not fit the core SRAM" in window.report.entries[node].reason
    assert window.report.entries[_source_node(window, "SmallConv")].status == "supported"
    qtbot.waitUntil(lambda: node_classes(qtbot, window.graph, [node])[node] == ["qb-status-unsupported"])
    readiness = window.readiness()
    assert not readiness.ok and "Transpose" in readiness.reason


def test_an_int16_preset_that_makes_a_layer_too_large_flags_it(qtbot, shown_window, tmp_path):
    window = shown_window
    tail = helper.make_node("Transpose", ["c"], ["y"], perm=[0, 1, 3, 2], name="Transpose16")
    _open(qtbot, window, _conv_then(tmp_path / "t16.onnx", [1, 8, 512, 512], 8, tail, [1, 8, 512, 512]))
    node = _source_node(window, "Transpose16")
    qtbot.waitUntil(lambda: window.runner.is_busy("fit") is False, timeout=FIT_TIMEOUT_MS)
    assert window.report.entries[node].status == "supported" and window.readiness().ok
    window.options.apply_preset("a16w8")
    qtbot.waitUntil(lambda: window.report.entries[node].status == "unsupported", timeout=FIT_TIMEOUT_MS)
    assert not window.readiness().ok
