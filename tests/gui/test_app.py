"""The application shell: start-up (timed), no-display message, root sandbox flag, exception hook, None guard."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtWidgets import QApplication, QLabel  # noqa: E402

from qbstudio import app, dialogs  # noqa: E402
from qbstudio._compat import guard_none_refcount, needs_none_guard, skip_feature_source_scan  # noqa: E402
from qbstudio.main_window import MainWindow  # noqa: E402
from qbstudio.state.preferences import AppDirs, Preferences  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COLD_START_GOAL_S = 3.0


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(QBSTUDIO_HOME=str(tmp_path / "home"), QT_QPA_PLATFORM="offscreen", **extra)
    return env


def test_cold_start_to_a_shown_window(tmp_path):
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "qbstudio", "--smoke-exit-after-ready"], cwd=ROOT,
                            env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("qbstudio ready"))
    assert "window shown=True" in line
    shown = next(line for line in result.stdout.splitlines() if line.startswith("qbstudio window shown after"))
    in_process = float(shown.rsplit("after ", 1)[1].split()[0])
    print(f"\ncold start: window shown {in_process:.2f} s after start-up (in-process), {wall:.2f} s wall "
          f"including interpreter start and exit; {line}; load average {os.getloadavg()[0]:.1f}")
    assert in_process < COLD_START_GOAL_S or os.getloadavg()[0] > 2, line  # the goal holds on an idle machine
    log = tmp_path / "home" / "log" / "qbstudio.log"
    assert "qb Studio starting" in log.read_text()


def test_no_display_says_so_in_one_line(tmp_path):
    env = _env(tmp_path)
    del env["QT_QPA_PLATFORM"]
    result = subprocess.run([sys.executable, "-m", "qbstudio"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [app.NO_DISPLAY_MESSAGE.strip()]
    assert "QT_QPA_PLATFORM=offscreen" in result.stderr


def test_display_detection_and_sandbox_flag():
    assert not app.has_display({}, "linux")
    assert app.has_display({"DISPLAY": ":0"}, "linux") and app.has_display({"QT_QPA_PLATFORM": "offscreen"}, "linux")
    assert app.has_display({}, "darwin")
    assert app.chromium_flags("--disable-gpu", is_root=True) == "--disable-gpu --no-sandbox"
    assert app.chromium_flags("--no-sandbox", is_root=True) == "--no-sandbox"
    assert app.chromium_flags("", is_root=False) == ""


def test_exception_hook_saves_and_shows_the_error(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("QBSTUDIO_HOME", str(tmp_path / "home"))
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(dialogs, "show_error", lambda parent, title, error: shown.append((title, str(error))))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    window = MainWindow(AppDirs.default())
    qtbot.addWidget(window)
    saved: list[bool] = []
    monkeypatch.setattr(window, "emergency_save", lambda: saved.append(True))
    app.install_exception_hooks(window)
    try:
        raise ValueError("boom in a slot")
    except ValueError:
        sys.excepthook(*sys.exc_info())
    assert saved == [True] and shown == [("Unexpected error", "boom in a slot")]
    assert window.isEnabled()
    window.close()


def test_window_layout_and_recent_files_persist(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("QBSTUDIO_HOME", str(tmp_path / "home"))
    dirs = AppDirs.default()
    window = MainWindow(dirs)
    qtbot.addWidget(window)
    window.resize(701, 555)  # inside the offscreen screen (restoreGeometry clamps to it)
    window.tabs.setCurrentIndex(3)
    window.preferences.add_recent_model(ROOT / "resources" / "samples" / "fashion_cnn" / "model.onnx")
    window.close()
    prefs = Preferences.load(dirs.preferences_file)
    assert prefs.window["tab"] == 3 and prefs.recent_models
    again = MainWindow(dirs)
    qtbot.addWidget(again)
    assert again.tabs.currentIndex() == 3 and again.size().width() == 701
    assert again.recent_models_menu.actions()[0].text() == prefs.recent_models[0]
    again.close()


def test_deferred_build_shows_the_window_first_then_builds_the_panels(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("QBSTUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dialogs, "ask_save_changes", lambda *args: dialogs.DISCARD)
    window = MainWindow(AppDirs.default(), defer_workbench=True)
    qtbot.addWidget(window)
    assert not window.workbench_ready and not window.menuBar().isEnabled()
    with qtbot.waitSignal(window.workbench_built, timeout=120_000):
        window.show()
        qtbot.waitUntil(lambda: window.graph is not None, timeout=120_000)  # built before the imports
        assert window.graph.web_view.url().scheme() == "qbnetron"  # Netron loads while onnx imports
    assert window.workbench_ready and window.menuBar().isEnabled()
    assert window.central.currentWidget() is window.welcome
    assert window.compare.layers._plots is None  # pyqtgraph waits for the per-layer plot
    window.central.setCurrentWidget(window.tabs)
    window.tabs.setCurrentWidget(window.compare)
    window.compare.tabs.setCurrentWidget(window.compare.layers)
    qtbot.waitUntil(lambda: window.compare.layers._plots is not None)
    assert window.compare.layers.legend_texts() == []
    combo = window.device_combo  # filled after the first show: it kept the empty combo's width ("regulus-r")
    QApplication.processEvents()
    widest = max(combo.fontMetrics().horizontalAdvance(combo.itemText(i)) for i in range(combo.count()))
    assert combo.width() > widest
    window.close()


@pytest.mark.skipif(not needs_none_guard(), reason="None is immortal on this interpreter")
def test_none_refcount_guard(qapp):
    """PySide6 6.12.0 drops a reference to None per void call on CPython 3.11; drop the guard when this fails."""
    guard_none_refcount()
    label = QLabel()
    before = sys.getrefcount(None)
    for _ in range(100):
        label.setText("x")
    leaked = before - sys.getrefcount(None)
    assert leaked in (0, 100)
    if leaked == 0:
        pytest.fail("PySide6 no longer leaks None references: remove qbstudio._compat.guard_none_refcount")
    QApplication.processEvents()


def test_feature_hook_reads_no_module_source(tmp_path, monkeypatch):
    """After start-up's hook swap, importing a module does not read its source (0.3-0.4 s of CPU at start)."""
    import inspect

    if not skip_feature_source_scan():
        pytest.fail("PySide6 has no per-import feature hook any more: remove qbstudio._compat.skip_feature_source_scan")
    from shibokensupport import feature

    reads = []
    original = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: reads.append(obj) or original(obj))
    (tmp_path / "qb_feature_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import qb_feature_probe  # noqa: F401

    assert reads == []
    assert feature.pyside_feature_dict["qb_feature_probe"] == -1  # "ignore this module": plain camelCase Qt
    assert feature.pyside_feature_dict["qbstudio.main_window"] == 0  # our modules keep the binding's default


SYMPY_PROBE = """
import sys
from qbstudio.deferred_imports import defer_sympy, is_deferred
assert defer_sympy()
from qbstudio.tasks import parse_model
loaded = parse_model(sys.argv[1], sys.argv[2], backend=None, input_shapes={})
assert loaded.model.graph.inputs[0].shape is not None
print("after static parse:", is_deferred("sympy"), is_deferred("onnx_ir._symbolic_shapes"))
import onnx_ir as ir
dim = ir.SymbolicDim("sequence_length")
print("expression:", dim * 2 + 1, (dim * 2 + 1).evaluate({"sequence_length": 7}))
print("after arithmetic:", is_deferred("sympy"), is_deferred("onnx_ir._symbolic_shapes"))
import sympy
print("same module:", sys.modules["sympy"] is sympy, sympy.Max(2, 3))
"""


def test_sympy_is_deferred_until_symbolic_arithmetic(tmp_path):
    """The workbench process parses a static model without importing SymPy; the first symbolic expression loads it."""
    model = ROOT / "resources" / "samples" / "fashion_cnn" / "model.onnx"
    result = subprocess.run([sys.executable, "-c", SYMPY_PROBE, str(model), str(tmp_path / "m.mblt")], cwd=ROOT,
                            env=_env(tmp_path, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "after static parse: True True" in lines
    assert "expression: 2*sequence_length + 1 15" in lines
    assert "after arithmetic: False False" in lines
    assert "same module: True 3" in lines


def test_model_ready_without_sympy(tmp_path):
    """Start-up on the sample model: parsed and rendered with SymPy still not imported (0.4-0.6 s of CPU saved)."""
    model = ROOT / "resources" / "samples" / "fashion_cnn" / "model.onnx"
    result = subprocess.run([sys.executable, "-m", "qbstudio", "--smoke-exit-after-ready", str(model)], cwd=ROOT,
                            env=_env(tmp_path), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "qbstudio modules not imported yet: sympy, onnx_ir._symbolic_shapes" in result.stdout.splitlines()
