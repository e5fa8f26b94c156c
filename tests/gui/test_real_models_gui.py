"""The workbench on real models: MobileNetV2 end to end (with a responsiveness check) and MiniLM's device switch.

Slow (a real MobileNetV2 compile); the models and photos are built offline and cached by
``tests/realmodels.py`` and ``tests/realdata.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtCore import QTimer  # noqa: E402
from realmodels import RealModelUnavailable, minilm_onnx, mobilenet_v2_onnx  # noqa: E402

from qbstudio.main_window import MainWindow  # noqa: E402

pytestmark = pytest.mark.slow

MODEL_TIMEOUT_MS = 120_000
COMPILE_TIMEOUT_MS = 600_000
MAX_GUI_GAP_MS = 100  # DESIGN.md section 11: event-loop stalls under 100 ms during a compile
MOBILENET_NODES = 100
MINILM_NODES = 189


def _real(builder):
    try:
        return builder()
    except RealModelUnavailable as error:
        pytest.skip(str(error))


class GapMeter:
    """The largest gap between 10 ms QTimer ticks on the GUI thread: in wall time, and in the GUI thread's
    own CPU time (work that blocked the event loop, not time the OS gave to other processes)."""

    def __init__(self, parent) -> None:
        self.timer = QTimer(parent, interval=10)  # parented: never freed by the GC in a worker thread
        self.timer.timeout.connect(self._tick)
        self.last = 0.0
        self.max_gap_ms = 0.0
        self.max_busy_ms = 0.0
        self.last_cpu = 0.0
        self.ticks = 0

    def start(self) -> None:
        self.last, self.last_cpu = time.perf_counter(), time.thread_time()
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def _tick(self) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        self.max_gap_ms = max(self.max_gap_ms, (now - self.last) * 1000)
        self.max_busy_ms = max(self.max_busy_ms, (cpu - self.last_cpu) * 1000)
        self.last, self.last_cpu = now, cpu
        self.ticks += 1


@pytest.fixture
def errors(dialog_calls) -> list:
    return dialog_calls


@pytest.fixture
def window(shown_window):
    return shown_window


def _open(qtbot, window: MainWindow, path: Path) -> None:
    with qtbot.waitSignal(window.model_ready, timeout=MODEL_TIMEOUT_MS):
        assert window.import_model(path)
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=MODEL_TIMEOUT_MS)


def test_mobilenet_compile_keeps_the_gui_responsive_and_cancels_cleanly(qtbot, window, errors, tmp_path):
    from realdata import imagenet_photo_sets

    _open(qtbot, window, _real(mobilenet_v2_onnx))
    assert len(window.loaded.model.graph) == MOBILENET_NODES
    assert window.graph.node_count == MOBILENET_NODES
    calib, _ = _real(imagenet_photo_sets)
    window.calibration.apply_preset("classification_torchvision")
    with qtbot.waitSignal(window.calibration.preview_ready, timeout=MODEL_TIMEOUT_MS):
        window.calibration.set_source(calib)
    assert window.calibration.preview.total == 64 and window.calibration.warnings == []
    window.options.apply_preset("classification")
    window.options.samples_spin.setValue(32)
    window.options.holdout_spin.setValue(8)

    meter = GapMeter(window)
    meter.start()
    with qtbot.waitSignal(window.compile_finished, timeout=COMPILE_TIMEOUT_MS) as blocker:
        assert window.start_compile()
    meter.stop()
    assert blocker.args == ["done"], errors
    run = window.project.runs.latest
    assert Path(run.mxq_path).is_file() and run.device == "aries-rb"
    assert run.headline()["top1"] is not None and window.run_panel.summary.metrics.rowCount() >= 4
    assert window.run_panel.summary.layer_names()[0] == run.worst_layers()[0]["layer"]
    load = os.getloadavg()[0]
    print(f"\nMobileNetV2 compile {run.duration_s:.1f} s, max GUI gap {meter.max_gap_ms:.0f} ms wall, "
          f"{meter.max_busy_ms:.0f} ms of GUI-thread CPU, over {meter.ticks} ticks; load average {load:.1f}")
    assert meter.max_busy_ms < MAX_GUI_GAP_MS  # no work of ours blocks the event loop for 100 ms
    # Wall-clock gaps also hold the OS scheduling other processes; on a loaded machine (the test suite's
    # other worker, the compile child) allow that, but never a one-second freeze.
    assert meter.max_gap_ms < (MAX_GUI_GAP_MS if load < os.cpu_count() else 10 * MAX_GUI_GAP_MS)

    stages: list[str] = []
    with qtbot.waitSignal(window.compile_finished, timeout=COMPILE_TIMEOUT_MS) as blocker:
        window.start_compile()
        worker = window.runner.worker("compile")
        worker.progress.connect(lambda event: stages.append(event.stage))
        qtbot.waitUntil(lambda: len(stages) > 0, timeout=COMPILE_TIMEOUT_MS)  # the compile has begun
        window.run_panel.cancel_button.click()
    assert blocker.args == ["cancelled"]
    assert not window.project.run_dir(2).exists()
    assert sorted(p.name for p in window.project.work_dir.rglob("*.mxq")) == [Path(run.mxq_path).name]
    assert window.run_panel.compile_button.isEnabled() and window.run_panel.stage_label.text() == "Cancelled"
    assert len(window.project.runs) == 1

    saved = tmp_path / "mobilenet.qbproj"
    assert window.save_project_as(saved)
    window.new_project()
    assert window.loaded is None and len(window.project.runs) == 0
    with qtbot.waitSignal(window.model_ready, timeout=MODEL_TIMEOUT_MS):
        assert window.open_project(saved)
    assert window.project.calibration.path == str(calib)
    assert window.project.settings.config.calibration.num_samples == 32
    assert window.project.settings.config.uint8_input.apply
    assert len(window.project.runs) == 1 and window.compare.table.rowCount() == 1
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=MODEL_TIMEOUT_MS)
    assert errors == []


def test_minilm_device_switch_changes_the_flagged_set(qtbot, window, errors, monkeypatch):
    pushed: list[dict] = []
    original = window.graph.set_support
    monkeypatch.setattr(window.graph, "set_support", lambda statuses, reasons=None: (
        pushed.append(dict(statuses)), original(statuses, reasons)))
    _open(qtbot, window, _real(minilm_onnx))
    assert len(window.loaded.model.graph) == MINILM_NODES
    assert window.graph.node_count == MINILM_NODES
    assert window.project.settings.device == "aries-rb"
    assert window.support.visible_nodes() == []
    assert set(pushed[-1].values()) == {"supported"}

    window.device_combo.textActivated.emit("regulus-ra")
    assert window.project.settings.device == "regulus-ra"
    assert window.options.device_combo.currentText() == "regulus-ra"
    flagged = window.support.visible_nodes()
    assert len(flagged) == 25
    ops = {window.report.entries[name].op_type for name in flagged}
    assert {"Softmax", "LayerNormalization"} <= ops
    assert {name for name, status in pushed[-1].items() if status == "needs_mfu"} == set(flagged)
    assert "regulus-ra" in window.support.summary.text()
    window.support.filter_edit.setText("softmax")
    assert all(window.report.entries[n].op_type == "Softmax" for n in window.support.visible_nodes())
    assert window.options.scheme_combo.currentText() == "single"
    assert [window.options.scheme_combo.itemText(i) for i in range(window.options.scheme_combo.count())] == [
        "single"]  # one core: "all" would only repeat single
    assert errors == []
