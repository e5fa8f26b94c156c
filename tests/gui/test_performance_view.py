"""The Performance tab of the node details: per-layer cycles of each core mode, the selected layer highlighted."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler_core.api import mblt_compile, mxq_compile
from compiler_core.runtime.profile import profile_mxq
from qbstudio.widgets.node_details import NodeDetails

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("perf")
    mblt = mblt_compile(SAMPLE_DIR / "model.onnx", folder / "model.mblt")
    result = mxq_compile(mblt, "aries-rb", SAMPLE_DIR / "calib", folder / "all.mxq",
                         compile_config=SAMPLE_DIR / "compile_config.yaml", inference_scheme="all")
    return profile_mxq(result.mxq_path)


def test_performance_tab_charts_every_layer_and_highlights_the_selected_one(qtbot, report, tmp_path):
    details = NodeDetails()
    qtbot.addWidget(details)
    details.resize(720, 520)
    details.show()
    details.tabs.setCurrentIndex(1)
    view = details.performance
    assert not view.mode.isEnabled() and "Compile" in view.summary.text()
    view.set_report(report)
    assert [view.mode.itemText(i) for i in range(view.mode.count())] == ["single", "multi", "global4", "global8"]
    rows = view.rows()
    target = max(rows, key=lambda row: row["cycles"])
    view.select_layer(target["layer"])
    assert target["layer"] in view.row.text() and "tile(s)" in view.row.text()
    heights = view._bars.opts["height"]
    assert list(heights) == [row["cycles"] for row in rows]
    brushes = view._bars.opts["brushes"]
    assert brushes[rows.index(target)] != brushes[(rows.index(target) + 1) % len(rows)]
    view.mode.setCurrentIndex(3)
    assert "FPS" in view.summary.text()
    view.select_layer("no_such_node")
    assert "not an NPU layer" in view.row.text()
    view.select_layer(target["layer"])
    qtbot.wait(50)
    details.grab().save(str(tmp_path / "performance.png"))
    assert (tmp_path / "performance.png").stat().st_size > 0
