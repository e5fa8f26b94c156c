"""Runs & Compare (issue 11): side by side, per layer, heatmap, histogram with clip ranges, Pareto chart, deletion.

The runs are three real points of a sweep over the Fashion-MNIST sample (Max, MaxPercentile, KL),
compiled once per module with the in-process executor. Screenshots go to build/screenshots/compare_*.png.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtCore import QPointF, Qt  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402

from compiler_core.mxq.container import read_mxq  # noqa: E402
from compiler_core.quantization.params import code_range  # noqa: E402
from compiler_core.sweep import InProcessExecutor, run_sweep  # noqa: E402
from qbstudio.state.compare import (  # noqa: E402
    HeatScale,
    heat_colours,
    layer_series,
    node_values,
    pareto_data,
    setting_text,
    settings_diff,
)
from qbstudio.state.runs import RunHistory, RunRecord  # noqa: E402
from qbstudio.widgets.compare_view import CompareView  # noqa: E402
from qbstudio.widgets.graph_view import GraphView  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"
SCREENSHOTS = ROOT / "build" / "screenshots"
logger = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Three compiled points (calibration modes Max, MaxPercentile 0.999, Histogram) and the MBLT."""
    from compiler_core.api import load_mblt, mblt_compile

    folder = tmp_path_factory.mktemp("sweep")
    mblt = mblt_compile(SAMPLE_DIR / "model.onnx", folder / "model.mblt")
    grid = {"baseConfig": str(SAMPLE_DIR / "compile_config.yaml"),
            "axes": {"calibrationMode": [0, 1, 2], "percentile": [0.999]}}
    result = run_sweep(grid, folder / "out", mblt=mblt, calib_data_path=SAMPLE_DIR / "calib",
                       target_device="aries-rb", executor=InProcessExecutor())
    calibration = {"path": str(SAMPLE_DIR / "calib"), "use_random": False}
    runs = [RunRecord.from_sweep_record(i + 1, record, model_sha256="sha", origin=f"sweep 1 · {record['name']}",
                                        calibration=calibration) for i, record in enumerate(result.records)]
    order = [node.name for node in load_mblt(mblt).graph]
    return {"mblt": Path(mblt), "runs": runs, "result": result, "order": order}


@pytest.fixture
def view(qtbot, sweep):
    widget = CompareView(None, {"classification": "", "detection": ""})
    runner = widget.histogram.runner  # the view's own (a child: deleted with it, in this thread)
    widget.resize(1300, 860)
    widget.set_history(RunHistory(sweep["runs"]))
    widget.set_layer_order(sweep["order"])
    widget.histogram.mblt_path = str(sweep["mblt"])
    widget.show()
    qtbot.waitExposed(widget)
    yield widget
    runner.shutdown()
    widget.close()
    delete_now(qtbot, widget)


def delete_now(qtbot, widget) -> None:
    """Delete the C++ widget now, in the GUI thread: never leave Qt objects to a garbage collection that may
    run in a worker thread (which crashes)."""
    deleted: list[bool] = []
    widget.destroyed.connect(lambda: deleted.append(True))
    widget.deleteLater()
    qtbot.waitUntil(lambda: bool(deleted), timeout=5000)


def shoot(widget, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    assert widget.grab().save(str(path))
    return path


# ---------------------------------------------------------------------------------------------- records


def test_sweep_records_become_runs_with_every_metric(sweep):
    run = sweep["runs"][0]
    assert run.origin == "sweep 1 · point-00" and run.estimate["single"]["latency_ms"] > 0
    assert run.accuracy() == pytest.approx(sweep["result"].records[0]["worst_sqnr_db"])
    assert run.layers and run.layer_row("Conv_1")["tensor"]
    again = RunRecord.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again == run


def test_settings_diff_lists_only_the_keys_that_differ(sweep):
    diff = dict(settings_diff(sweep["runs"]))
    assert diff["calibration.mode"] == [0, 1, 2]
    assert "targetDevice" not in diff and "calibration.method" not in diff
    # shown in the Compile tab's words with their config names (found under Xvfb: "calibration.method 0 / 1" said
    # nothing; s16: "1 WChAMulti" was not what the Compile tab calls "Concat-shared, symmetric")
    assert [setting_text("calibration.mode", value) for value in diff["calibration.mode"]] == [
        "Max (0 Max)", "Percentile (1 MaxPercentile)", "Histogram (KL) (2 Histogram)"]
    assert setting_text("calibration.method", 3) == "Concat-shared, zero point (3 WChAMultiZeropoint)"
    assert setting_text("calibration.int16Headroom", 2) == 2 and setting_text("calibration.mode", 9) == 9


def test_layer_series_is_in_graph_order_with_deltas_to_the_baseline(sweep):
    runs = sweep["runs"]
    order = sweep["order"]
    series = layer_series(runs, order, baseline=1)
    assert series.layers == [name for name in order if name in {row["layer"] for row in runs[0].layers}]
    index = series.layers.index("Conv_1")
    assert series.values[2][index] == pytest.approx(runs[2].layer_row("Conv_1")["sqnr_db"])
    assert np.nansum(np.abs(series.deltas[1])) == 0
    assert series.deltas[0][index] == pytest.approx(series.values[0][index] - series.values[1][index])


# ---------------------------------------------------------------------------------------------- side by side


def test_three_runs_side_by_side_with_a_pinned_baseline(qtbot, view, sweep):
    view.set_picks([1, 2, 3], baseline=2)
    assert view.picks == [1, 2, 3] and view.baseline_id == 2
    side = view.side
    labels = side.row_labels()
    assert "calibration.mode" in labels and "calibration.method" not in labels
    assert {"logits: SQNR (dB)", "logits: cosine", "logits: top-1 agreement", "logits: top-5 agreement",
            "logits: max |error|", "single: latency (ms, est.)", "single: FPS (est.)", "MXQ size (bytes)",
            "int16 layers", "compile time (s)"} <= set(labels)
    assert [side.cell("calibration.mode", c).text() for c in range(3)] == [
        "Max (0 Max)", "Percentile (1 MaxPercentile)", "Histogram (KL) (2 Histogram)"]
    assert side.cell("calibration.mode", 0).background().color().name() == "#fff4d6"
    top1 = sweep["runs"][0].outputs["logits"]["top1_agreement"]
    assert side.cell("logits: top-1 agreement", 0).text() == f"{top1:.1%}"  # was "1" for 100 %
    assert "baseline" in side.table.horizontalHeaderItem(1).text()
    sqnr = [run.outputs["logits"]["sqnr_db"] for run in sweep["runs"]]
    cell = side.cell("logits: SQNR (dB)", 0)
    assert cell.foreground().color().name() == ("#2e7d32" if sqnr[0] > sqnr[1] else "#c62828")
    diff_rows = side.table.rowCount()
    side.full_config.setChecked(True)
    assert side.table.rowCount() > diff_rows + 20 and "targetDevice" in side.row_labels()
    side.full_config.setChecked(False)
    view.tabs.setCurrentWidget(view.side)
    shoot(view, "compare_side_by_side.png")


def test_three_runs_stay_in_view_on_a_laptop_screen(qtbot, view, sweep):
    """Found under Xvfb at 1366x768: the runs table got the splitter's proportional share, room for one and a half
    runs. In a view of the height the tab gets on that screen, the three runs are all in view."""
    view.resize(850, 480)
    qtbot.wait(50)
    table = view.table
    assert table.rowCount() == 3
    assert table.viewport().height() >= sum(table.rowHeight(row) for row in range(3))
    shoot(view, "compare_small_screen.png")


def test_picking_is_capped_at_four_and_follows_the_table(qtbot, view, sweep):
    many = sweep["runs"] + [RunRecord.from_dict({**run.to_dict(), "run_id": run.run_id + 10}) for run in sweep["runs"]]
    view.set_history(RunHistory(many))
    view.table.selectAll()
    assert len(view.picks) == 4 and view.side.table.columnCount() == 4
    view.table.selectRow(0)
    assert view.picks == [1]


# ---------------------------------------------------------------------------------------------- per layer


def test_per_layer_plot_click_selects_the_layer(qtbot, view, sweep):
    view.set_picks([1, 2, 3], baseline=1)
    view.tabs.setCurrentWidget(view.layers)
    qtbot.waitUntil(lambda: view.layers._plots is not None)
    assert view.layers.legend_texts()[0].endswith("(baseline)") and len(view.layers.legend_texts()) == 3
    assert view.layers.tick_labels()[0] == view.layers.series.layers[0]
    target = view.layers.series.layers.index("Conv_1")
    plot = view.layers._plots["values"]
    qtbot.wait(50)
    scene = plot.getPlotItem().vb.mapViewToScene(QPointF(target, float(np.nanmean(view.layers.series.values[0]))))
    position = plot.mapFromScene(scene)
    with qtbot.waitSignal(view.layer_activated, timeout=3000) as signal:
        QTest.mouseClick(plot.viewport(), Qt.MouseButton.LeftButton, pos=position)
    assert signal.args == ["Conv_1"] and view.layers.selected == "Conv_1"
    shoot(view, "compare_per_layer.png")


# ---------------------------------------------------------------------------------------------- histogram


def test_histogram_shows_each_runs_clip_range_matching_the_mxq(qtbot, view, sweep):
    view.set_picks([1, 2, 3], baseline=1)
    view.tabs.setCurrentWidget(view.histogram)
    view.show_layer("Conv_1")
    histogram = view.histogram
    qtbot.waitUntil(lambda: histogram.counts is not None, timeout=60_000)
    assert histogram.counts.sum() > 0 and histogram.edges.size == histogram.counts.size + 1
    drawn = histogram.line_positions()
    assert set(drawn) == {1, 2, 3}
    for row, run in enumerate(sweep["runs"]):
        record = read_mxq(run.mxq_path).program["tensors"][histogram.tensor]
        params = record["params"]
        qmin, qmax = code_range(params["bits"], params["signed"])
        scale, zero_point = params["scale"], params["zero_point"]
        assert drawn[run.run_id] == pytest.approx((scale * (qmin - zero_point), scale * (qmax - zero_point)))
        assert histogram.table.item(row, 2).text() == f"{scale:.6g}"
        assert histogram.table.item(row, 3).text() == str(zero_point)
    assert len({round(high, 6) for _, high in drawn.values()}) > 1  # Max, percentile and KL clip differently
    assert drawn[1][1] >= max(drawn[2][1], drawn[3][1])  # Max keeps the largest range
    weights = histogram.weights[1]  # per-channel weight ranges of the layer: codes x per-channel scale
    op = next(op for op in read_mxq(sweep["runs"][0].mxq_path).program["ops"] if op["name"] == "Conv_1")
    mxq = read_mxq(sweep["runs"][0].mxq_path)
    codes = np.asarray(mxq.consts[op["consts"]["weight"]], dtype=np.float64)
    scale = np.asarray(op["attrs"]["weight_scale"], dtype=np.float64)
    assert weights.high == pytest.approx(codes.reshape(codes.shape[0], -1).max(axis=1) * scale)
    assert weights.low.size == codes.shape[0] and histogram._weight_plot.isVisible()
    qtbot.wait(200)
    shoot(view, "compare_histogram.png")


def test_histogram_of_a_layer_picked_as_the_last_lookup_ends_is_shown(qtbot, view, sweep, monkeypatch):
    """A layer picked just as the previous statistics lookup ended (after the job, before the runner freed its slot)
    is looked up once the slot is free; keyed on the job's end, the request was lost and the view stayed at
    "loading statistics from the cache…" (the calibration preview's bug, same pattern)."""
    view.set_picks([1, 2, 3], baseline=1)
    view.tabs.setCurrentWidget(view.histogram)
    histogram = view.histogram
    first, second = [name for name in sweep["order"] if name.startswith("Conv")][:2]
    start, started = histogram.runner.start, []

    def start_with_a_late_pick(slot, worker):
        if not started:
            worker.finished.connect(lambda: view.show_layer(second))  # before the runner connects its clean-up
        started.append(slot)
        return start(slot, worker)

    monkeypatch.setattr(histogram.runner, "start", start_with_a_late_pick)
    view.show_layer(first)
    qtbot.waitUntil(lambda: len(started) == 2 and histogram.counts is not None, timeout=60_000)
    assert histogram.layer == second and "calibration samples" in histogram.title.text()


# ---------------------------------------------------------------------------------------------- Pareto


def test_pareto_chart_shows_every_run_and_the_front(qtbot, view, sweep):
    view.tabs.setCurrentWidget(view.sweep)
    chart = view.sweep.chart
    qtbot.waitUntil(lambda: chart._items is not None)
    data = pareto_data(sweep["runs"])
    assert data.run_ids == [1, 2, 3] and data.front
    assert len(chart._items["scatter"].points()) == 3
    front_x = list(chart._items["front"].getData()[0])
    assert front_x == [data.latency[i] for i in data.front]
    assert "estimate" in chart._items["plot"].getAxis("bottom").labelText
    (x_low, x_high), (y_low, y_high) = chart._items["plot"].viewRange()
    for i in range(3):
        assert x_low < data.latency[i] < x_high and y_low < data.accuracy[i] < y_high
    same = [replace(run, metrics={**run.metrics, "min_output_sqnr_db": 20.4347132}) for run in sweep["runs"]]
    chart.set_runs(same)  # equal SQNRs (one quantization on two devices): the axis showed 20.43471320026735
    qtbot.wait(100)  # the auto range follows on the next paint
    (_, _), (y_low, y_high) = chart._items["plot"].viewRange()
    assert y_high - y_low >= 1.0
    chart.set_runs(sweep["runs"])
    view.set_picks([1])
    with qtbot.waitSignal(view.run_selected, timeout=2000) as signal:
        chart.click_run(3)
    assert signal.args == [3] and 3 in view.picks and view.tabs.currentWidget() is view.side
    view.tabs.setCurrentWidget(view.sweep)
    qtbot.wait(100)
    shoot(view, "compare_pareto.png")


def test_sweep_editor_counts_points_and_rejects_bad_input(qtbot, view):
    editor = view.sweep.editor
    editor.set_checked([0, 1, 2], bias=(False, True), percentiles="0.999, 0.9999")
    assert view.sweep.point_count() == 8  # (Max + 2 percentiles + KL) x bias off/on
    editor.set_checked([0, 3], bias=(True,), presets=["classification"])
    assert view.sweep.point_count() == 2
    editor.set_checked([1], percentiles="2")
    assert isinstance(view.sweep.point_count(), str) and not view.sweep.run_button.isEnabled()
    editor.set_checked([], bias=(False,))
    assert "calibration mode" in view.sweep.point_count()


def test_sweep_editor_logs_same_config_points_only_after_the_users_edit(qtbot, caplog):
    """The default grid has same-config combinations (Max and KL ignore the percentile): building the panel (as
    opening a project does) or restoring a grid says so in the count label, not in the log dock; a user's edit logs."""
    from qbstudio.widgets.sweep_panel import SweepPanel

    caplog.set_level(logging.INFO)
    panel = SweepPanel()
    panel.editor.set_checked([0, 1, 2], bias=(False,), percentiles="0.999, 0.9999")
    assert "kept once" in panel.editor.count_label.text()
    assert not [r for r in caplog.records if "kept once" in r.getMessage()]
    item = panel.editor.outputs.item(1)
    item.setCheckState(Qt.CheckState.Checked)  # what a click on the check box does
    logged = [r.getMessage() for r in caplog.records if "kept once" in r.getMessage()]
    assert len(logged) == 4  # Max and KL, each with the second percentile, for both outputs
    delete_now(qtbot, panel)


# ---------------------------------------------------------------------------------------------- heatmap


def _node_fill(qtbot, graph: GraphView, name: str) -> str:
    result: list[str] = []
    script = (f"(() => {{ const e = document.getElementById('node-name-{name}'); if (!e) return 'none';"
              " const p = e.querySelector(':scope > g.node-item-type > path');"
              " const t = e.querySelector(':scope > title.qb-tooltip');"
              " return getComputedStyle(p).fill + '|' + (t ? t.textContent : ''); })()")
    graph._page.runJavaScript(script, 0, result.append)
    qtbot.waitUntil(lambda: bool(result), timeout=5000)
    return result[0]


def _rgb(hex_colour: str) -> str:
    return "rgb({}, {}, {})".format(*(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)))


def test_heatmap_colours_nodes_by_sqnr_and_delta_and_back(qtbot, sweep):
    graph = GraphView()
    graph.resize(1100, 820)
    graph.show()
    qtbot.waitExposed(graph)
    with qtbot.waitSignal(graph.ready, timeout=30_000):
        graph.load_mblt(sweep["mblt"])
    graph.set_support({"Conv_1": "supported"})
    run, base = sweep["runs"][2], sweep["runs"][0]
    scale = HeatScale.sqnr()
    colours, tips = heat_colours(node_values(run), scale, label=f"SQNR of {run.label}")
    graph.set_colourings([(f"sqnr:{run.run_id}", f"Colours: SQNR of {run.label}")])
    with qtbot.waitSignal(graph.colouring_changed, timeout=1000) as chosen:
        graph.colour_combo.setCurrentIndex(1)
    assert chosen.args == [f"sqnr:{run.run_id}"] and graph.colouring == f"sqnr:{run.run_id}"
    with qtbot.waitSignal(graph.heat_painted, timeout=5000) as painted:
        graph.set_heatmap(colours, tips, title="SQNR (dB)", stops=scale.stops(), low=scale.low, high=scale.high,
                          ticks=scale.ticks)
    assert painted.args[0] == len([name for name in colours if name in sweep["order"]]) > 5
    logger.warning("heatmap repaint on the %d-node sample: %.1f ms", graph.node_count, graph.last_heat_ms)
    fill, tip = _node_fill(qtbot, graph, "Conv_1").split("|", 1)
    assert fill == _rgb(colours["Conv_1"][0]) and f"{run.layer_row('Conv_1')['sqnr_db']:.2f} dB" in tip
    fused = run.layer_row("Conv_1")["tensor"]  # the Relu fused into Conv_1 shows the layer's value
    assert fused != "Conv_1" and _node_fill(qtbot, graph, fused).split("|")[0] == fill
    assert graph.heat_legend.isVisible() and not graph.legend.isVisible()
    assert graph.heat_legend.tick_labels() == ["10", "20", "30", "40"]
    qtbot.wait(300)
    shoot(graph, "compare_heatmap.png")
    delta = HeatScale.delta()
    values = {name: run.layer_sqnr()[name] - base.layer_sqnr()[name] for name in run.layer_sqnr()}
    colours, tips = heat_colours(values, delta, label="Δ")
    with qtbot.waitSignal(graph.heat_painted, timeout=5000):
        graph.set_heatmap(colours, tips, title="Δ SQNR (dB)", stops=delta.stops(), low=delta.low, high=delta.high,
                          ticks=delta.ticks)
    assert _node_fill(qtbot, graph, "Conv_1").split("|")[0] == _rgb(colours["Conv_1"][0])
    assert graph.heat_legend.tick_labels() == ["-10", "-5", "+0", "+5", "+10"]
    with qtbot.waitSignal(graph.heat_painted, timeout=5000):
        graph.clear_heatmap()
    assert _node_fill(qtbot, graph, "Conv_1").split("|")[0] == _rgb("#2e7d32")  # the support colour again
    assert graph.legend.isVisible()
    graph._release_web_engine()
    delete_now(qtbot, graph)
