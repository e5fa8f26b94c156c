"""The workbench end to end on the bundled sample: open, graph, support, calibration, compile, runs, projects.

Every flow drives the real compiler; dialogs are intercepted through ``qbstudio.dialogs``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtWidgets import QApplication, QLabel  # noqa: E402

from qbstudio import dialogs  # noqa: E402
from qbstudio.main_window import MainWindow  # noqa: E402
from qbstudio.state.calibration import NO_PRESET  # noqa: E402
from qbstudio.state.preferences import AppDirs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_PROJECT = ROOT / "resources" / "samples" / "fashion_cnn.qbproj"
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"
SAMPLE_NODES = 13
MODEL_TIMEOUT_MS = 60_000
GRAPH_TIMEOUT_MS = 60_000
COMPILE_TIMEOUT_MS = 180_000


class ErrorLog:
    """Collects what ``dialogs.show_error`` would have shown."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, parent, title, error) -> None:
        self.calls.append((title, getattr(error, "message", str(error))))

    @property
    def titles(self) -> list[str]:
        return [title for title, _ in self.calls]


@pytest.fixture
def errors(monkeypatch) -> ErrorLog:
    log = ErrorLog()
    monkeypatch.setattr(dialogs, "show_error", log)
    monkeypatch.setattr(dialogs, "ask_save_changes", lambda *args: dialogs.DISCARD)  # closing with runs asks
    return log


@pytest.fixture
def make_window(qtbot, tmp_path, monkeypatch, errors):
    """Factory of shown main windows with their own QBSTUDIO_HOME; closed at teardown."""
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
    for window in windows:
        window.close()
        window.deleteLater()
    QApplication.processEvents()


def open_and_wait(qtbot, window: MainWindow, path: Path) -> None:
    """Open a project or model and wait for the model and the rendered graph."""
    with qtbot.waitSignal(window.model_ready, timeout=MODEL_TIMEOUT_MS):
        window.open_path(path)
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=GRAPH_TIMEOUT_MS)


def compile_and_wait(qtbot, window: MainWindow, timeout: int = COMPILE_TIMEOUT_MS) -> str:
    with qtbot.waitSignal(window.compile_finished, timeout=timeout) as blocker:
        assert window.start_compile()
    return blocker.args[0]


def test_sample_project_compiles_and_reopens(qtbot, make_window, errors, tmp_path):
    window = make_window()
    open_and_wait(qtbot, window, SAMPLE_PROJECT)
    assert window.project.template
    assert window.graph.node_count == SAMPLE_NODES
    assert len(window.loaded.model.graph) == SAMPLE_NODES
    assert "onnx" in window.model_label.text()
    qtbot.waitUntil(lambda: window.calibration.preview is not None, timeout=MODEL_TIMEOUT_MS)
    assert window.calibration.preview.total == 48
    assert window.project.settings.config.image_channels == 1

    assert compile_and_wait(qtbot, window) == "done", errors.calls
    run = window.project.runs.latest
    assert Path(run.mxq_path).is_file() and Path(run.mxq_path).stat().st_size == run.size_bytes
    summary = window.run_panel.summary
    assert run.mxq_path in summary.header.text()
    assert summary.metrics.rowCount() >= 3
    sqnr = [row["sqnr_db"] for row in run.worst_layers()]
    assert summary.layer_names()[0] == run.worst_layers()[0]["layer"] and sqnr == sorted(sqnr)
    assert window.compare.table.rowCount() == 1
    assert run.estimate[run.core_modes[0]]["latency_ms"] > 0 and run.calibration["path"] == str(SAMPLE_DIR / "calib")
    assert run.int16_layers == 0 and run.accuracy() == run.metrics["min_output_sqnr_db"]

    saved = tmp_path / "projects" / "fashion.qbproj"
    assert window.save_project_as(saved)
    data = json.loads(saved.read_text())
    assert not Path(data["workDir"]).is_absolute() and data["runs"][0]["mxq_path"].startswith("fashion.qbstudio/")
    window.close()

    again = make_window()
    open_and_wait(qtbot, again, saved)
    assert again.project.calibration.path == str(SAMPLE_DIR / "calib")
    assert again.project.settings.config.analysis_holdout == 12
    assert len(again.project.runs) == 1 and Path(again.project.runs.latest.mxq_path).is_file()
    assert again.compare.table.rowCount() == 1
    assert again.run_panel.summary.run.run_id == 1
    assert again.graph.node_count == SAMPLE_NODES
    assert errors.calls == []


def test_selection_sync_details_and_int16_menu(qtbot, make_window, errors, monkeypatch):
    window = make_window()
    open_and_wait(qtbot, window, SAMPLE_PROJECT)
    selected: list[str] = []
    monkeypatch.setattr(window.graph, "select_node", lambda name, **_: selected.append(name))
    window.support.status_combo.setCurrentIndex(window.support.status_combo.findData("all"))
    assert len(window.support.visible_nodes()) == SAMPLE_NODES
    row = window.support.visible_nodes().index("Conv_1")
    window.support.table.selectRow(row)
    assert selected == ["Conv_1"]
    assert "Conv" in window.details.text() and "16" in window.details.text()

    window.graph.node_selected.emit("MaxPool_0")
    assert window.support.selected_node() == "MaxPool_0"
    assert window.details.node == "MaxPool_0" and "kernel_shape" in window.details.text()
    assert selected == ["Conv_1"]  # a click in the graph does not echo back to it

    menu = window.node_menu("Conv_0")
    menu.actions()[0].trigger()
    assert "Conv_0" in window.project.settings.int16_layers
    assert [window.options.int16_list.item(i).text() for i in range(window.options.int16_list.count())] == ["Conv_0"]
    assert not window.node_menu("Conv_0").actions()[0].isEnabled()

    assert compile_and_wait(qtbot, window) == "done", errors.calls
    window.graph.node_selected.emit("Conv_0")
    assert "SQNR" in window.details.text() and "Precision" in window.details.text()


def test_bad_inputs_show_a_message_and_keep_the_window_working(qtbot, make_window, errors, tmp_path):
    window = make_window()
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07this is not a protobuf" * 10)
    assert not window.import_model(corrupt)
    assert errors.titles == ["Cannot import model"]

    open_and_wait(qtbot, window, SAMPLE_DIR / "model.onnx")
    empty = tmp_path / "empty_calib"
    empty.mkdir()
    with qtbot.waitSignal(window.calibration.preview_failed, timeout=MODEL_TIMEOUT_MS):
        window.calibration.set_source(empty)
    assert errors.titles[-1] == "Calibration data"

    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text("calibration:\n  mode: 7\n  bogusKey: 1\n")
    before = window.project.settings.to_dict()
    assert not window.options.load_config(bad_config)
    assert errors.titles[-1] == "Cannot load compile config"
    assert "bad.yaml" in errors.calls[-1][1]
    assert window.project.settings.to_dict() == before

    window.calibration.set_source(SAMPLE_DIR / "calib", report_errors=False)
    window.options.load_config(SAMPLE_DIR / "compile_config.yaml")
    assert compile_and_wait(qtbot, window) == "done", errors.calls


def test_compile_error_keeps_settings(qtbot, make_window, errors, tmp_path):
    window = make_window()
    open_and_wait(qtbot, window, SAMPLE_DIR / "model.onnx")
    (tmp_path / "empty").mkdir()  # the compile fails reading it (a missing path no longer lets Compile start)
    window.project.calibration.path = str(tmp_path / "empty")
    window.project.calibration.use_random = False
    settings = window.project.settings.to_dict()
    assert compile_and_wait(qtbot, window) == "failed"
    assert errors.titles == ["Compile failed"] and "calibration" in errors.calls[0][1].lower()
    assert window.project.settings.to_dict() == settings
    assert not window.project.run_dir(1).exists()
    assert window.run_panel.compile_button.isEnabled()


def test_preview_warns_about_missing_normalization(qtbot, make_window, errors):
    window = make_window()
    open_and_wait(qtbot, window, SAMPLE_PROJECT)
    qtbot.waitUntil(lambda: window.calibration.preview is not None, timeout=MODEL_TIMEOUT_MS)
    assert window.calibration.warnings == []
    panel = window.calibration
    with qtbot.waitSignal(panel.preview_ready, timeout=MODEL_TIMEOUT_MS):
        panel.scale_combo.setCurrentIndex(1)  # raw pixels: values up to about 720
    assert any("far outside" in text for text in panel.warnings)
    with qtbot.waitSignal(panel.preview_failed, timeout=MODEL_TIMEOUT_MS):  # the reader rejects it
        panel.mean_edit.setText("0.5, 0.5, 0.5")
        panel.std_edit.setText("0.2, 0.2, 0.2")
        panel.scale_combo.setCurrentIndex(0)
        panel.mean_edit.editingFinished.emit()
    assert "3 mean/std values" in panel.preview_status.text()
    assert errors.calls == []  # live edits report in the panel, not in a dialog


def test_images_of_other_sizes_offer_a_one_click_resize_to_the_model_input(qtbot, make_window, errors, tmp_path):
    """Photos of several sizes for a 28x28 model: said in the panel with a fix, not in a modal dialog."""
    from PIL import Image

    window = make_window()
    open_and_wait(qtbot, window, SAMPLE_PROJECT)
    panel = window.calibration
    window.tabs.setCurrentWidget(panel)
    photos = tmp_path / "photos"
    photos.mkdir()
    for index, size in enumerate([(64, 48), (64, 48), (50, 50), (30, 90), (33, 33)]):
        Image.new("L", size, color=40 * index).save(photos / f"{index}.png")
    with qtbot.waitSignal(panel.preview_failed, timeout=MODEL_TIMEOUT_MS):
        panel.set_source(photos)  # report_errors=True: what choosing a folder does
    # under load a second preview of the same folder (the form's debounce timer) may still be reading: wait for it
    qtbot.waitUntil(lambda: "different sizes" in panel.preview_status.text(), timeout=MODEL_TIMEOUT_MS)
    assert errors.calls == [] and panel.fix_size_button.isVisible()
    assert panel.fix_size_button.text() == "Resize to 28×28 (model input)"
    assert "4 different sizes" in panel.preview_status.text() and "takes 28x28" in panel.preview_status.text()
    assert panel.count_label.text() == "5 image(s), not at the model's input size"  # found, not "—"
    with qtbot.waitSignal(panel.preview_ready, timeout=MODEL_TIMEOUT_MS):
        panel.fix_size_button.click()
    assert not panel.fix_size_button.isVisible() and panel.preview.total == 5
    steps = window.project.settings.preprocessing["pipeline"]
    assert [(step["height"], step["width"]) for step in steps if step["op"] == "resize"] == [(28, 28)]
    assert panel.resize_check.isChecked() and not panel.keep_aspect_check.isChecked()
    assert not any("far outside" in text for text in panel.warnings)  # the sample's normalization is kept


def test_one_click_resize_keeps_the_0_1_scaling_of_no_pipeline(qtbot, make_window, errors, tmp_path):
    from PIL import Image

    window = make_window()
    open_and_wait(qtbot, window, SAMPLE_PROJECT)
    panel = window.calibration
    panel.apply_preset(NO_PRESET)  # None (scale to 0-1): no pipeline
    photos = tmp_path / "photos"
    photos.mkdir()
    for index, size in enumerate([(64, 48), (50, 50), (30, 90), (33, 33)]):
        Image.new("L", size, color=60 * index).save(photos / f"{index}.png")
    with qtbot.waitSignal(panel.preview_failed, timeout=MODEL_TIMEOUT_MS):
        panel.set_source(photos)
    with qtbot.waitSignal(panel.preview_ready, timeout=MODEL_TIMEOUT_MS):
        panel.fix_size_button.click()
    assert max(max(stats.maximum) for stats in panel.preview.stats) <= 1.0
    assert not any("far outside" in text for text in panel.warnings)


def test_make_calib_writes_a_list_and_uses_it(qtbot, make_window, errors, tmp_path):
    window = make_window()
    open_and_wait(qtbot, window, SAMPLE_PROJECT)
    assert window.calibration.text_button.isHidden()  # an image model: no text calibration offered
    assert not window.calibration.pipeline_box.isHidden()
    images = tmp_path / "few"
    images.mkdir()
    for source in sorted((SAMPLE_DIR / "calib").glob("*.png"))[:8]:
        shutil.copy(source, images)
    with qtbot.waitSignal(window.calibration.preview_ready, timeout=MODEL_TIMEOUT_MS):
        window.calibration.set_source(images, report_errors=False)
    listing = tmp_path / "out" / "fashion8.txt"
    window.calibration.make_calibration_set(tmp_path / "out", "fashion8")
    qtbot.waitUntil(lambda: window.calibration.preview is not None and window.calibration.preview.kind == "txt",
                    timeout=MODEL_TIMEOUT_MS)
    assert listing.is_file() and len(listing.read_text().split()) == 8
    assert window.project.calibration.path == str(listing)
    assert any("Only 8" in text for text in window.calibration.warnings)


SCREENSHOTS = ROOT / "build" / "screenshots"


def test_screenshot_of_every_tab(qtbot, make_window, errors):
    """Writes build/screenshots/workbench_*.png (one per tab) for a visual check of the layout."""
    window = make_window()
    open_and_wait(qtbot, window, SAMPLE_PROJECT)
    qtbot.waitUntil(lambda: window.calibration.preview is not None, timeout=MODEL_TIMEOUT_MS)
    window.options.apply_preset("classification")
    assert compile_and_wait(qtbot, window) == "done", errors.calls
    window.options.mode_combo.setCurrentIndex(window.options.mode_combo.findData(0))  # Max: a visible difference
    assert compile_and_wait(qtbot, window) == "done", errors.calls
    window.set_device("regulus-ra")
    window.support.status_combo.setCurrentIndex(window.support.status_combo.findData("all"))
    window.graph.node_selected.emit("Conv_1")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    names = ("graph", "calibration", "compile", "runs")
    for index, name in enumerate(names):
        window.tabs.setCurrentIndex(index)
        qtbot.wait(600 if name == "graph" else 150)
        path = SCREENSHOTS / f"workbench_{index + 1}_{name}.png"
        assert window.grab().save(str(path))
        assert path.stat().st_size > 10_000
    assert errors.calls == []


def test_dynamic_input_asks_for_a_shape_and_drop_opens_it(qtbot, make_window, errors, monkeypatch, tmp_path):
    import onnx
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    model = onnx.load(SAMPLE_DIR / "model.onnx")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    dynamic = tmp_path / "dynamic.onnx"
    onnx.save(model, dynamic)
    asked = []

    def answer(parent, shapes, **_hints):
        asked.append([(shape.name, shape.dims) for shape in shapes])
        return {"image": [1, 1, 28, 28]}

    monkeypatch.setattr(dialogs, "ask_input_shapes", answer)
    window = make_window()
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(dynamic))])
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(window.model_ready, timeout=MODEL_TIMEOUT_MS):
        window.dropEvent(event)
    assert asked == [[("image", ("batch", 1, 28, 28))]]
    assert window.project.model.input_shapes == {"image": [1, 1, 28, 28]}
    assert "image: [1, 1, 28, 28]" in window.model_label.text()
    assert window.preferences.recent_models[0] == str(dynamic)
    monkeypatch.setattr(dialogs, "ask_input_shapes", lambda parent, shapes, **_: None)
    assert not window.import_model(dynamic)  # cancelled dialog: nothing happens
    assert errors.calls == []


def test_preview_of_a_manifest_names_each_input_s_own_file(qtbot, tmp_path):
    """A multi-input sample is labelled file by file (it was the last file's name above the first input's values),
    and a 4-D state tensor of 128 channels is one range, not 128 colour planes (found with FunASR's FSMN-VAD)."""
    import numpy as np

    from compiler_core.calibration import InputSpec
    from qbstudio.state.project import CalibrationSource
    from qbstudio.state.settings import CompileSettings
    from qbstudio.widgets.calibration_panel import CalibrationPanel, load_preview
    from qbstudio.workers import JobRunner

    specs = [InputSpec("speech", (1, 10, 40), np.dtype("float32"), "NCW"),
             InputSpec("cache", (1, 128, 19, 2), np.dtype("float32"), "NCHW")]
    rows = []
    for index in range(3):
        np.save(tmp_path / f"s{index}_speech.npy", np.full((1, 10, 40), index, np.float32))
        np.save(tmp_path / f"s{index}_cache.npy", np.arange(128 * 38, dtype=np.float32).reshape(1, 128, 19, 2))
        rows.append([f"s{index}_speech.npy", f"s{index}_cache.npy"])
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"info": {"input names": ["speech", "cache"]}, "calib paths": rows}))
    source = CalibrationSource(path=str(manifest))
    preview = load_preview(source, specs, {})
    assert [item.source for item in preview.stats] == ["s0_speech.npy", "s1_speech.npy", "s2_speech.npy"]
    assert [[item.source for item in more] for more in preview.others] == [[f"s{i}_cache.npy"] for i in range(3)]
    cache = preview.others[0][0]
    assert cache.input_name == "cache" and len(cache.minimum) == 1 and cache.describe() == "[0, 4.86e+03] μ 2.43e+03"
    assert preview.images[0] is None

    panel = CalibrationPanel(JobRunner())
    qtbot.addWidget(panel)
    panel.set_context(source, CompileSettings(), tmp_path, specs)
    panel._show_preview(preview)
    captions = [panel.grid.itemAt(i).widget().findChildren(QLabel)[-1].text() for i in range(panel.grid.count())]
    assert "s1_speech.npy" in captions[1] and "cache [1, 128, 19, 2] s1_cache.npy" in captions[1]
    assert not panel.pipeline_box.isVisibleTo(panel)  # neither input takes images
