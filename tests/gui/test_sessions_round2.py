"""Workbench sessions, round 2 (s16, under Xvfb): the same project open in two windows, the Preset box after an edit,
long run names in the baseline selector.

Each test drives the real window; dialogs are answered through ``qbstudio.dialogs`` (the fixtures of
``test_user_path``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtCore import QLockFile, Qt  # noqa: E402
from test_user_path import (  # noqa: E402, F401  (fixtures)
    SAMPLE_PROJECT,
    SCREENSHOTS,
    TIMEOUT_MS,
    answers,
    conv_classifier,
    fake_run,
    make_window,
    wait_model,
)

from qbstudio import dialogs, main_window  # noqa: E402
from qbstudio.state.compare import settings_diff  # noqa: E402
from qbstudio.state.project import Project  # noqa: E402
from qbstudio.state.settings import CompileSettings  # noqa: E402
from qbstudio.widgets.options_panel import OptionsPanel  # noqa: E402


def compile_in(qtbot, window) -> None:
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS) as finished:
        assert window.start_compile()
    assert finished.args == ["done"]


def test_two_windows_on_one_project_keep_each_other_s_runs(qtbot, make_window, answers, tmp_path):  # noqa: F811
    first = make_window()
    wait_model(qtbot, first, lambda: first.open_path(SAMPLE_PROJECT))
    assert first.save_project_as(tmp_path / "shared.qbproj")
    assert answers.asked == []
    second = make_window()
    wait_model(qtbot, second, lambda: second.open_path(tmp_path / "shared.qbproj"))
    # "already open in another qb Studio window": the settings saved last win
    assert answers.asked == ["info"]

    compile_in(qtbot, first)
    assert first.autosave() is not None
    first_mxq = Path(first.project.runs.latest.mxq_path)
    first_bytes = first_mxq.read_bytes()
    second.options.set_value("calibration.numSamples", 8)  # another setting: another MXQ
    compile_in(qtbot, second)  # the second window never saw the first one's run
    second_mxq = Path(second.project.runs.latest.mxq_path)
    assert second_mxq != first_mxq and first_mxq.read_bytes() == first_bytes  # it was compiled over

    assert second.autosave() is not None  # the file holds the first window's run: this save keeps it
    assert second.project.adopted_run_ids == [1] and "another window" in second.statusBar().currentMessage()
    assert [run.run_id for run in second.session.runs.runs] == [1, 2]
    assert second.compare.table.rowCount() == 2
    first.session.rename_run(1, "mine")
    assert first.autosave() is not None and first.project.adopted_run_ids == [2]

    reopened = Project.load(tmp_path / "shared.qbproj")
    assert {run.run_id: Path(run.mxq_path) for run in reopened.runs.runs} == {1: first_mxq, 2: second_mxq}
    assert reopened.runs.get(1).name == "mine" and all(path.is_file() for path in (first_mxq, second_mxq))
    second.close()
    third = make_window()  # the other window closed: no question
    wait_model(qtbot, third, lambda: third.open_path(tmp_path / "shared.qbproj"))
    assert answers.asked == ["info", "info"]  # the first window still has it open
    first.close()
    assert third.new_project()
    wait_model(qtbot, third, lambda: third.open_path(tmp_path / "shared.qbproj"))
    assert answers.asked == ["info", "info"]
    assert not answers.errors


def test_the_preset_box_says_edited_after_a_setting_it_set_is_changed(qtbot):
    panel = OptionsPanel()
    qtbot.addWidget(panel)
    settings = CompileSettings()
    panel.set_settings(settings)
    panel.apply_preset("classification")
    assert panel.preset_combo.currentText() == "classification"
    panel.set_value("calibration.numSamples", 64)
    assert panel.preset_combo.currentText() == "classification (edited)" and "(edited)" in settings.summary()
    assert "Settings were changed after the preset 'classification'" in panel.preset_label.text()
    panel.apply_preset("classification")  # choosing it again applies it again: no longer edited
    assert panel.preset_combo.currentText() == "classification" and "changed" not in panel.preset_label.text()
    panel.set_value("calibration.numSamples", 32)
    panel.apply_preset("vision_transformer")  # another preset: only the one applied last is marked
    texts = [panel.preset_combo.itemText(index) for index in range(panel.preset_combo.count())]
    assert panel.preset_combo.currentText() == "vision_transformer"
    assert not any("(edited)" in text for text in texts)
    stored = {**settings.to_dict(), "presetEdited": True}  # as a project file keeps it
    reopened = CompileSettings.from_dict(stored)
    panel.set_settings(reopened)
    assert panel.preset_combo.currentText() == "vision_transformer (edited)"


def test_the_baseline_selector_shows_long_run_names_whole(qtbot, make_window, answers):  # noqa: F811
    window = make_window()
    window.resize(1024, 700)
    wait_model(qtbot, window, lambda: window.open_path(SAMPLE_PROJECT))
    names = [
        "percentile 0.9999 with bias correction, 128 samples",
        "MSE per channel, int16 Softmax and LayerNorm",
    ]
    runs = [fake_run(window) for _ in names]
    for run, name in zip(runs, names):
        window.session.rename_run(run.run_id, name)
    window.tabs.setCurrentIndex(3)
    window.compare.set_picks([run.run_id for run in runs], baseline=runs[1].run_id)
    combo = window.compare.baseline_combo
    qtbot.waitUntil(lambda: combo.isVisible())
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(SCREENSHOTS / "s16_baseline_long_names.png"))
    popup_width = combo.view().minimumWidth()
    for index in range(combo.count()):  # the list shows every name whole, the tooltip too
        assert combo.view().fontMetrics().horizontalAdvance(combo.itemText(index)) < popup_width
        assert combo.itemData(index, Qt.ItemDataRole.ToolTipRole) == combo.itemText(index)
    assert (
        combo.fontMetrics().horizontalAdvance(combo.currentText()) < combo.width() - 20
    )  # the box shows it whole
    assert combo.currentText() in combo.toolTip()
    header = window.compare.side.table.horizontalHeader()
    assert header.textElideMode() == Qt.TextElideMode.ElideRight  # cut at its end with "…", not at both ends
    first = window.compare.side.table.horizontalHeaderItem(0)
    assert first.toolTip().startswith(runs[0].label)
    assert window.width() <= 1024


def test_the_best_sweep_point_s_settings_are_used_for_the_next_compile(qtbot, make_window, answers, tmp_path):  # noqa: F811
    """Runs & Compare had no way to make a sweep point's settings the project's: the user copied a command."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.open_path(SAMPLE_PROJECT))
    assert window.save_project_as(tmp_path / "sweep.qbproj")
    compare, panel = window.compare, window.compare.sweep
    window.tabs.setCurrentWidget(compare)
    panel.editor.set_checked([0, 2], bias=(False, True))
    assert panel.point_count() == 4
    panel.run_button.click()
    qtbot.waitUntil(lambda: not window.runner.is_busy("sweep"), timeout=4 * TIMEOUT_MS)
    assert panel.status.text().startswith("Sweep done: 4 points") and not answers.errors
    best = max(window.session.runs.runs, key=lambda run: run.accuracy())
    assert window.project.settings.config.to_dict() != best.config  # not the settings of the best point yet

    menu = compare.run_menu(best.run_id)
    [use] = [action for action in menu.actions() if action.objectName() == f"useSettings-{best.run_id}"]
    use.trigger()
    assert window.tabs.currentIndex() == 2 and best.label in window.statusBar().currentMessage()
    assert window.options.preset_combo.currentData() is None
    compile_in(qtbot, window)
    compiled = window.session.runs.latest
    swept = {key for key, _ in settings_diff(window.session.runs.runs[:4])}
    assert swept and not [key for key, _ in settings_diff([best, compiled]) if key in swept]
    assert compiled.accuracy() == pytest.approx(best.accuracy(), abs=1e-6)


def test_cpu_offload_colours_the_offloaded_tail(qtbot, make_window, answers, tmp_path):  # noqa: F811
    """With CPU offload on, regulus-ra (no MFU) kept Softmax "needs MFU" and "not compilable as is" while the compile
    ran it on the CPU; the colours and the list now show the compile's split, and follow the switch both ways."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.open_path(conv_classifier(tmp_path / "m.onnx", softmax=True)))
    window.project.calibration.use_random = True
    window.options.set_device("regulus-ra")
    assert (
        window.graph._statuses["Softmax_0"] == "needs_mfu"
        and "not compilable" in window.support.summary.text()
    )
    window.enable_cpu_offload()
    assert window.graph._statuses["Softmax_0"] == "cpu_offloaded"
    assert (
        "not compilable" not in window.support.summary.text()
        and "1 cpu offloaded" in window.support.summary.text()
    )
    compile_in(qtbot, window)
    assert window.session.runs.latest.cpu_parts == ["tail"]
    window.options.set_value("cpuOffload", False)
    assert (
        window.graph._statuses["Softmax_0"] == "needs_mfu"
        and "not compilable" in window.support.summary.text()
    )
    window.options.set_device("aries-rb")
    assert set(window.graph._statuses.values()) == {"supported"}


class ReadOnlyLock:
    """QLockFile on a read-only file system (a root test process cannot make a folder read-only by its mode)."""

    LockError = QLockFile.LockError

    def __init__(self, path: str) -> None:
        self.path = path

    def tryLock(self, timeout: int) -> bool:  # noqa: N802 (Qt's name)
        return False

    def error(self):
        return QLockFile.LockError.PermissionError


def test_a_read_only_project_says_so_when_opened(qtbot, make_window, answers, tmp_path, monkeypatch):  # noqa: F811
    window = make_window()
    wait_model(qtbot, window, lambda: window.open_path(SAMPLE_PROJECT))
    assert window.save_project_as(tmp_path / "shared" / "p.qbproj")
    assert window.new_project()
    monkeypatch.setattr(main_window, "QLockFile", ReadOnlyLock)
    told: list[str] = []
    monkeypatch.setattr(dialogs, "show_info", lambda _parent, title, text: told.append(f"{title}: {text}"))
    wait_model(qtbot, window, lambda: window.open_path(tmp_path / "shared" / "p.qbproj"))
    [message] = told
    assert message.startswith(f"Read-only project: {tmp_path / 'shared'} cannot be written")
    assert "Save Project As" in message
