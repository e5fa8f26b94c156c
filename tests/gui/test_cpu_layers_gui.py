"""The graph's node menu puts a layer on the CPU with what it needs (``cpuLayers``), shown as "CPU offloaded"."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from test_cpu_layers import _log_front_end_model  # noqa: E402  (input -> Mul -> Log -> Conv -> Relu)
from test_graph_view import node_classes  # noqa: E402

MODEL_TIMEOUT_MS = 60_000
OFFLOADED, SUPPORTED = ["qb-status-cpu_offloaded"], ["qb-status-supported"]


def _action(menu, text: str):
    return next(action for action in menu.actions() if action.text().startswith(text))


def test_the_node_menu_sets_and_clears_a_cpu_head_and_the_graph_colours_it(qtbot, shown_window, dialog_calls,
                                                                            tmp_path):
    window = shown_window
    with qtbot.waitSignal(window.model_ready, timeout=MODEL_TIMEOUT_MS):
        window.open_path(_log_front_end_model(tmp_path / "log.onnx"))
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=MODEL_TIMEOUT_MS)
    names = {entry.op_type: name for name, entry in window.report.entries.items()}
    log, mul, conv, relu = names["Log"], names["Mul"], names["Conv"], names["Relu"]
    assert not _action(window.node_menu(log), "Run on the NPU again").isEnabled()

    _action(window.node_menu(log), "Run on the CPU with every layer before it").trigger()
    settings = window.project.settings
    assert settings.cpu_layer_part(log) == "head" and settings.config.to_dict()["cpuLayers"]["head"] == [log]
    qtbot.waitUntil(lambda: node_classes(qtbot, window.graph, [mul, log, conv]) == {
        mul: OFFLOADED, log: OFFLOADED, conv: SUPPORTED})  # the Mul the Log depends on goes with it
    assert window._dirty
    saved = window.project.write_copy(tmp_path / "copy.qbproj").read_text()
    assert '"cpuLayers"' in saved and f'"{log}"' in saved  # saved with the project's compile settings
    menu = window.node_menu(log)
    assert not _action(menu, "Run on the CPU with every layer before it").isEnabled()
    window.show_node(mul)
    assert "cpuLayers chose it" in window.details.text()  # the Details panel says why it runs on the CPU
    # the Layer support table lists them as CPU offloaded and offers the same menu on a right click
    window.support.status_combo.setCurrentIndex(window.support.status_combo.findData("cpu_offloaded"))
    assert sorted(window.support.visible_nodes()) == sorted([mul, log])
    row = window.support.visible_nodes().index(log)
    centre = window.support.table.visualRect(window.support.proxy.index(row, 0)).center()
    with qtbot.waitSignal(window.support.node_context_requested) as blocker:
        window.support._on_context_menu(centre)
    assert blocker.args[0] == log

    # a tail before the head cannot be split: refused with the layers named, the choice taken back
    _action(window.node_menu(mul), "Run on the CPU with every layer after it").trigger()
    assert dialog_calls and dialog_calls[-1][0] == "Cannot run this layer on the CPU"
    assert "cpuLayers cannot split the model" in dialog_calls[-1][1]
    assert settings.cpu_layer_part(mul) is None and settings.cpu_layer_part(log) == "head"

    _action(window.node_menu(relu), "Run on the CPU with every layer after it").trigger()
    qtbot.waitUntil(lambda: node_classes(qtbot, window.graph, [relu, conv]) == {relu: OFFLOADED, conv: SUPPORTED})

    _action(window.node_menu(log), "Run on the NPU again").trigger()
    _action(window.node_menu(relu), "Run on the NPU again").trigger()
    assert settings.config.to_dict()["cpuLayers"] == {"head": [], "tail": []}
    qtbot.waitUntil(lambda: node_classes(qtbot, window.graph, [mul, log, relu]) == {
        mul: SUPPORTED, log: SUPPORTED, relu: SUPPORTED})
