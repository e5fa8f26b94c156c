"""Check my setup: the report's facts, the cache clear button, the child-process test compile, --check-setup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtWidgets import QApplication  # noqa: E402

from compiler_core.calibration.cache import StatisticsCache, default_cache_root  # noqa: E402
from qbstudio import dialogs  # noqa: E402
from qbstudio.state.preferences import AppDirs  # noqa: E402
from qbstudio.widgets import setup_check  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dirs(tmp_path, monkeypatch) -> AppDirs:
    monkeypatch.setenv("QBSTUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    return AppDirs.default()


def _rows(dialog) -> dict[str, tuple[str, str]]:
    tree = dialog.tree
    return {tree.topLevelItem(i).text(0): (tree.topLevelItem(i).text(1), tree.topLevelItem(i).text(2))
            for i in range(tree.topLevelItemCount())}


def test_report_shows_versions_netron_and_folders(qtbot, dirs):
    dialog = setup_check.SetupCheckDialog(dirs)
    qtbot.addWidget(dialog)
    rows = _rows(dialog)
    assert rows["QtWebEngine"][1] == "✓ ok" and "Chromium" in rows["QtWebEngine"][0]
    assert rows["Netron"][1] == "✓ ok" and rows["Netron"][0].startswith("9.")
    assert rows["Data files"] == (str(ROOT / "resources"), "✓ ok")
    assert rows["Settings"][0] == str(dirs.preferences_file)
    assert rows["Log file"][0] == str(dirs.log_file)
    assert rows["Statistics cache"][0].startswith(str(default_cache_root()))
    dialog.copy_report()
    assert "[Folders]" in QApplication.clipboard().text() and str(dirs.log_file) in QApplication.clipboard().text()


def test_clear_cache_button_deletes_entries(qtbot, dirs, monkeypatch):
    root = default_cache_root()
    root.mkdir(parents=True)
    for index in range(3):
        np.savez(root / f"entry{index}.npz", a=np.zeros(1000))
    assert len(StatisticsCache(root)) == 3
    dialog = setup_check.SetupCheckDialog(dirs)
    qtbot.addWidget(dialog)
    assert _rows(dialog)["Statistics cache"][0].endswith(", 3 files)")
    monkeypatch.setattr(dialogs, "ask_yes_no", lambda *args: True)
    dialog.clear_button.click()
    assert len(StatisticsCache(root)) == 0
    assert "(0 bytes, 0 files)" in _rows(dialog)["Statistics cache"][0]
    assert dialog.status.text() == "Deleted 3 cache entries."


@pytest.mark.slow
def test_test_compile_runs_in_a_child_process(qtbot, dirs):
    dialog = setup_check.SetupCheckDialog(dirs)
    qtbot.addWidget(dialog)
    dialog.compile_button.click()
    assert not dialog.compile_button.isEnabled()
    qtbot.waitUntil(lambda: dialog.compile_button.isEnabled(), timeout=300_000)
    assert dialog.status.text().startswith("✓ Test compile"), dialog.status.text()
    # let the runner retire its worker and thread before the dialog closes (the button is re-enabled first)
    qtbot.waitUntil(lambda: not dialog.runner.is_busy("setup-check"), timeout=60_000)
    qtbot.wait(200)
    scratch = dialog._scratch
    dialog.done(0)
    assert not scratch.exists()


def test_check_setup_command_line(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("DISPLAY", "WAYLAND_DISPLAY",
                                                                          "QT_QPA_PLATFORM")}
    env.update(QBSTUDIO_HOME=str(tmp_path / "home"), QBCOMPILER_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-m", "qbstudio", "--check-setup", "--check-setup-output",
                             str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No problems found." in result.stdout
    mxq = tmp_path / "out" / "run" / "fashion_cnn.mxq"
    assert mxq.is_file()
    from compiler_core.mxq.container import validate_mxq

    validate_mxq(mxq)
