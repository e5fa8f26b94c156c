"""Colour the graph by cycles: the Performance tab's switch colours every layer by its share of the chosen
core mode's estimated latency (the heatmap mechanism of Runs & Compare), with cycle tooltips and a % legend."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from test_compare import _node_fill as _fill  # noqa: E402  (Netron node fill and tooltip)
from test_compare import _rgb  # noqa: E402

from compiler_core.api import mxq_compile  # noqa: E402
from compiler_core.runtime.profile import profile_mxq  # noqa: E402
from qbstudio.state.performance import cycle_heat  # noqa: E402
from qbstudio.widgets.welcome import SAMPLE_PROJECT  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"
SCREENSHOTS = ROOT / "build" / "screenshots"
TIMEOUT_MS = 180_000


def test_cycle_heat_covers_layers_and_fused_nodes(tmp_path):
    from compiler_core.api import mblt_compile

    mblt = mblt_compile(SAMPLE_DIR / "model.onnx", tmp_path / "model.mblt")
    result = mxq_compile(mblt, "aries-rb", SAMPLE_DIR / "calib", tmp_path / "all.mxq",
                         compile_config=SAMPLE_DIR / "compile_config.yaml", inference_scheme="all")
    report = profile_mxq(result.mxq_path)
    for mode, entry in report["modes"].items():
        heat = cycle_heat(report, mode)
        top = max(entry["layers"], key=lambda row: row["cycles"])
        assert heat.scale.low == 0 and heat.scale.high >= 100 * top["share"]
        assert f"{top['cycles']:,} cycles" in heat.tooltips[top["layer"]] and "MMACs" in heat.tooltips[top["layer"]]
        assert all(name in heat.colours for row in entry["layers"] for name in (row["layer"], *row["fused"]))
        assert heat.colours["Relu_0"] == heat.colours["Conv_0"]  # the Relu folded into Conv_0 (its output's name)
        low = min(entry["layers"], key=lambda row: row["cycles"])
        assert heat.colours[top["layer"]][0] == "#{:02x}{:02x}{:02x}".format(*heat.scale.rgb(100 * top["share"]))
        assert heat.colours[top["layer"]][0] != heat.colours[low["layer"]][0]
        assert mode in heat.title and "µs" in heat.title


def test_performance_switch_colours_the_graph_by_cycles(qtbot, shown_window):
    window = shown_window
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT_MS):
        window.open_path(SAMPLE_PROJECT)
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=TIMEOUT_MS)
    folder = Path(window.project.work_dir)
    result = mxq_compile(window.project.mblt_path, "aries-rb", SAMPLE_DIR / "calib", folder / "cycles.mxq",
                         compile_config=SAMPLE_DIR / "compile_config.yaml", inference_scheme="all")
    view, graph = window.details.performance, window.graph
    view.set_report(profile_mxq(result.mxq_path))
    window.details.tabs.setCurrentWidget(view)
    view.mode.setCurrentIndex(view.mode.findText("multi"))
    with qtbot.waitSignal(graph.heat_painted, timeout=5000) as painted:
        view.colour.setChecked(True)
    heat = cycle_heat(view.report, "multi")
    assert painted.args[0] >= len(view.rows())
    top = max(view.rows(), key=lambda row: row["cycles"])
    fill, tip = _fill(qtbot, graph, top["layer"]).split("|", 1)
    assert fill == _rgb(heat.colours[top["layer"]][0]) and f"{top['cycles']:,} cycles" in tip
    assert graph.heat_legend.isVisible() and "multi" in graph.heat_legend.title
    assert graph.colouring == "cycles:multi" and graph.colour_combo.currentText() == "Colours: cycles (multi)"
    with qtbot.waitSignal(graph.heat_painted, timeout=5000):  # another core mode recolours
        view.mode.setCurrentIndex(view.mode.findText("global8"))
    assert "global8" in graph.heat_legend.title and graph.colour_combo.currentText() == "Colours: cycles (global8)"
    window.show_node(top["layer"])
    heat = cycle_heat(view.report, "global8")
    assert _fill(qtbot, graph, top["layer"]).split("|")[0] == _rgb(heat.colours[top["layer"]][0])
    qtbot.wait(1500)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert window.grab().save(str(SCREENSHOTS / "cycles_heatmap.png"))
    with qtbot.waitSignal(graph.heat_painted, timeout=5000):
        view.colour.setChecked(False)
    assert not graph.heat_active and graph.legend.isVisible()
    assert graph.colouring == "support" and graph.colour_combo.findData("cycles:global8") < 0
    with qtbot.waitSignal(graph.heat_painted, timeout=5000):  # and back, then the selector takes the graph
        view.colour.setChecked(True)
    with qtbot.waitSignal(graph.heat_painted, timeout=5000):
        graph.colour_combo.setCurrentIndex(graph.colour_combo.findData("support"))
    assert not view.colour.isChecked() and not graph.heat_active
