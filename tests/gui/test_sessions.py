"""A demanding user's sessions in the real window (s15, found under Xvfb): keys only, many runs of one model, the
settings typed digit by digit, drag and drop, the layout kept across restarts.

Dialogs are answered through ``qbstudio.dialogs`` (the fixtures of ``test_user_path``).
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QAction, QDropEvent  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QSplitter  # noqa: E402
from test_user_path import SAMPLE_DIR, SAMPLE_PROJECT, answers, fake_run, make_window, wait_model  # noqa: E402, F401  (fixtures)

from qbstudio import dialogs  # noqa: E402
from qbstudio.state.runs import RunHistory, RunRecord  # noqa: E402
from qbstudio.state.settings import CompileSettings  # noqa: E402
from qbstudio.widgets.compare_view import CompareView  # noqa: E402
from qbstudio.widgets.options_panel import OptionsPanel  # noqa: E402

MNEMONIC = re.compile(r"&([^&])")


def mnemonic(text: str) -> str | None:
    found = MNEMONIC.search(text.replace("&&", ""))
    return found.group(1).lower() if found else None


# ---------------------------------------------------------------- keyboard only


def test_menus_have_one_mnemonic_per_letter_and_no_shortcut_twice(qtbot, make_window):  # noqa: F811
    """Alt+F, O only highlighted Open (Choose Model Outputs shared the O), View › "Runs _Compare" underlined a space
    (its "&&" was halved), and Try on inputs had no menu entry or key."""
    window = make_window()
    menus = [action for action in window.menuBar().actions() if action.menu()]
    assert len({mnemonic(action.text()) for action in menus}) == len(menus)
    for top in menus:
        entries = [action for action in top.menu().actions() if not action.isSeparator()]
        letters = Counter(mnemonic(action.text()) for action in entries)
        letters.pop(None, None)
        assert all(count == 1 for count in letters.values()), (top.text(), letters)
        assert " " not in letters, top.text()
    view = next(action.menu() for action in menus if action.text() == "&View")
    assert "Runs && Compare" in [action.text() for action in view.actions()]
    keys = Counter(action.shortcut().toString() for action in window.findChildren(QAction)
                   if not action.shortcut().isEmpty())
    assert all(count == 1 for count in keys.values()), keys
    compile_menu = next(action.menu() for action in menus if action.text() == "&Compile")
    assert window.act_try in compile_menu.actions() and window.act_try.shortcut().toString() == "Ctrl+T"


def test_try_on_inputs_from_the_compile_menu_uses_the_shown_run(qtbot, make_window, answers, monkeypatch):  # noqa: F811
    window = make_window()
    wait_model(qtbot, window, lambda: window.open_path(SAMPLE_PROJECT))
    window.session.project.runs = RunHistory()
    window.session.runs_changed.emit()
    assert not window.act_try.isEnabled()
    tried = []
    monkeypatch.setattr(window, "try_on_inputs", lambda run, paths=None: tried.append(run.run_id))
    first, second = fake_run(window), fake_run(window)
    assert window.act_try.isEnabled()
    window.act_try.trigger()
    window.run_panel.summary.show_run(first)  # a run picked in Runs & Compare
    window.act_try.trigger()
    assert tried == [second.run_id, first.run_id]


def test_settings_typed_digit_by_digit_keep_every_digit(qtbot):
    """Each digit re-set the spin box from the settings, reformatting "0.9" to "0.9000" with the cursor inside: the
    next 9 was refused and 0.9999 could not be typed (nor 0.99999 as the percentile)."""
    panel = OptionsPanel()
    qtbot.addWidget(panel)
    panel.set_settings(CompileSettings())
    panel.mixed_check.setChecked(True)
    for spin, text, path, expected in ((panel.mixed_value, "0.9999", "mixedPrecision.target.value", 0.9999),
                                       (panel.mixed_fraction, "0.35", "mixedPrecision.maxInt16Fraction", 0.35),
                                       (panel.samples_spin, "256", "calibration.numSamples", 256)):
        spin.setFocus()
        spin.selectAll()
        QTest.keyClicks(spin, text)
        QTest.keyClick(spin, Qt.Key.Key_Return)
        assert spin.value() == pytest.approx(expected) and panel.settings.get(path) == pytest.approx(expected), path
    panel.set_value("calibration.mode", 1)  # MaxPercentile: the percentile field applies
    panel.percentile_spin.selectAll()
    QTest.keyClicks(panel.percentile_spin, "0.99999")
    assert panel.settings.get("calibration.maxPercentile.percentile") == pytest.approx(0.99999)


# ---------------------------------------------------------------- runs & compare with many runs


def record(run_id: int, sqnr: float, size: int, name: str = "") -> RunRecord:
    return RunRecord(run_id, f"2026-12-04T22:{run_id:02d}:00+00:00", "aries-rb", ["single"], f"/tmp/run{run_id}.mxq",
                     size, {}, f"settings {run_id}", {"verdict": "ok", "min_output_sqnr_db": sqnr}, name=name)


def column_ids(view: CompareView) -> list[int]:
    return [view.table.item(row, 0).data(Qt.ItemDataRole.UserRole) for row in range(view.table.rowCount())]


def test_runs_table_sorts_by_number_and_renames_and_deletes_with_keys(qtbot, monkeypatch):
    """The runs table could not be sorted; runs had no names ("#1 aries-rb" ... "#4 aries-rb" in every legend)."""
    view = CompareView()
    qtbot.addWidget(view)
    view.set_history(RunHistory([record(i, sqnr, size) for i, sqnr, size in
                                 ((1, 30.5, 900_000), (2, 9.2, 2_000_000), (10, 41.0, 120_000), (9, 28.0, 4_000_000))]))
    view.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
    assert column_ids(view) == [1, 2, 9, 10]  # "#10" after "#9"
    view.table.sortByColumn(5, Qt.SortOrder.DescendingOrder)  # Min SQNR, best first
    assert column_ids(view) == [10, 1, 9, 2]
    view.table.sortByColumn(8, Qt.SortOrder.AscendingOrder)  # size: 117 KB < 879 KB < 1.9 MB < 3.8 MB
    assert column_ids(view) == [10, 1, 2, 9]
    view.set_picks([9])
    assert [view.table.item(row, 5).text() for row in range(4)] == ["41.00", "30.50", "9.20", "28.00"]
    renamed, deleted = [], []
    view.rename_confirmed.connect(lambda run_id, name: renamed.append((run_id, name)))
    view.delete_confirmed.connect(deleted.append)
    monkeypatch.setattr(dialogs, "ask_text", lambda parent, title, label, text="": "int8 baseline")
    monkeypatch.setattr(dialogs, "ask_yes_no", lambda *args: True)
    view.show()
    view.activateWindow()
    qtbot.waitUntil(view.isActiveWindow)
    view.table.setFocus()
    QTest.keyClick(view.table, Qt.Key.Key_F2)
    QTest.keyClick(view.table, Qt.Key.Key_Delete)
    assert renamed == [(9, "int8 baseline")] and deleted == [9]
    view.set_history(RunHistory([record(9, 28.0, 4_000_000, name="int8 baseline")]))
    assert view.table.item(0, 0).text() == "#9 int8 baseline" and view.baseline_combo.currentText() == "#9 int8 baseline"


def test_four_runs_renamed_sorted_deleted_exported_and_reopened(qtbot, make_window, answers, tmp_path, monkeypatch):  # noqa: F811
    window = make_window()
    wait_model(qtbot, window, lambda: window.open_path(SAMPLE_PROJECT))
    window.session.project.runs = RunHistory()
    runs = [fake_run(window, sqnr=sqnr) for sqnr in (30.0, 25.0, 35.0, 20.0)]
    names = iter(["default", "a16w8", "AMP cosine 0.999", "CPU head"])
    monkeypatch.setattr(dialogs, "ask_text", lambda *args: next(names))
    for run in runs:
        window.compare.set_picks([run.run_id])
        assert window.compare.ask_rename()
    monkeypatch.setattr(dialogs, "ask_yes_no", lambda *args: True)
    window.compare.set_picks([runs[3].run_id])
    assert window.compare.ask_delete()
    assert [run.name for run in window.session.runs.runs] == ["default", "a16w8", "AMP cosine 0.999"]
    window.compare.set_picks([run.run_id for run in runs[:3]])
    report = window.compare.export_report(str(tmp_path / "report.html"))
    assert "a16w8" in Path(report).read_text() and "AMP cosine 0.999" in Path(report).read_text()
    assert window.save_project_as(tmp_path / "four.qbproj")
    saved = json.loads((tmp_path / "four.qbproj").read_text())
    assert [run["name"] for run in saved["runs"]] == ["default", "a16w8", "AMP cosine 0.999"]
    again = make_window()
    wait_model(qtbot, again, lambda: again.open_path(tmp_path / "four.qbproj"))
    assert [again.compare.table.item(row, 0).text() for row in range(again.compare.table.rowCount())] == [
        f"#{runs[0].run_id} default", f"#{runs[1].run_id} a16w8", f"#{runs[2].run_id} AMP cosine 0.999"]
    assert answers.errors == []


# ---------------------------------------------------------------- run summaries say what was applied


def test_run_settings_line_names_mixed_precision_cpu_layers_and_an_edited_preset():
    """An automatic-mixed-precision run after the a16w8 preset (its int16 '*' removed) read "a16w8 · mode Max ...":
    nothing about mixed precision, and a preset it no longer was."""
    settings = CompileSettings()
    settings.apply_preset("a16w8")
    assert "a16w8" in settings.summary() and "edited" not in settings.summary()
    settings.set("preprocessing", settings.get("preprocessing"))  # the Calibration tab describing the data: no edit
    settings.set_scheme("single")
    assert "edited" not in settings.summary()
    settings.remove_int16_layer("*")
    settings.set("mixedPrecision.apply", True)
    settings.set("mixedPrecision.target", {"kind": "sqnrDb", "value": 45.0})
    settings.set_cpu_layer("Conv_0", "head")
    line = settings.summary()
    assert "a16w8 (edited)" in line and "mixed precision SQNR dB >= 45" in line and "CPU head x1" in line
    assert CompileSettings.from_dict(settings.to_dict()).summary() == line  # kept in the project file
    settings.apply_preset("a16w8")
    assert "(edited)" not in settings.summary()


# ---------------------------------------------------------------- drag and drop


def drop(window, *paths: Path) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path)) for path in paths])
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    window.dropEvent(event)


def test_dropping_a_folder_list_or_odd_files(qtbot, make_window, answers, tmp_path, monkeypatch):  # noqa: F811
    """A calibration folder dropped on the window was imported as a model ("Cannot tell the kind of model"), as was a
    .txt list; of two files the second was dropped silently."""
    infos = []
    monkeypatch.setattr(dialogs, "show_info", lambda parent, title, text: infos.append(title))
    window = make_window()
    calib = shutil.copytree(SAMPLE_DIR / "calib", tmp_path / "calib")
    drop(window, calib)
    assert infos == ["Import a model first"] and window.project.model is None
    with qtbot.waitSignal(window.model_ready, timeout=120_000):
        drop(window, SAMPLE_DIR / "model.onnx")
    drop(window, calib)
    assert window.project.calibration.path == str(calib) and window.tabs.currentWidget() is window.calibration
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(str(path) for path in sorted(calib.glob("*.png"))[:8]))
    drop(window, listing)
    assert window.project.calibration.path == str(listing)
    notes = tmp_path / "notes.csv"
    notes.write_text("a,b\n")
    drop(window, notes)
    drop(window, SAMPLE_DIR / "model.onnx", calib)
    assert infos[1:] == ["Cannot open the dropped file", "Drop one item"]
    assert window.project.calibration.path == str(listing) and answers.errors == []


def test_a_missing_path_says_it_does_not_exist(qtbot, make_window, answers, tmp_path):  # noqa: F811
    window = make_window()
    window.open_path(tmp_path / "gone" / "model.onnx")
    assert len(answers.errors) == 1 and "does not exist" in answers.errors[0][1]


# ---------------------------------------------------------------- layout across restarts


def test_splitters_are_remembered_across_restarts(qtbot, make_window):  # noqa: F811
    window = make_window()
    splitters = {splitter.objectName(): splitter for splitter in window.findChildren(QSplitter)}
    wanted = {}
    for name in ("compileSplitter", "layersSplitter", "runsSplitter"):
        total = sum(splitters[name].sizes())
        splitters[name].setSizes([total // 4, total - total // 4])
        wanted[name] = splitters[name].sizes()
    window.close()
    again = make_window()
    again.tabs.setCurrentWidget(again.compare)
    restored = {splitter.objectName(): splitter.sizes() for splitter in again.findChildren(QSplitter)}
    for name, sizes in wanted.items():  # the share (a restored dock may be a little taller than before)
        assert abs(restored[name][0] / sum(restored[name]) - sizes[0] / sum(sizes)) < 0.03, (name, restored[name])


def test_every_tab_fits_a_1024_by_700_window(qtbot, make_window, answers):  # noqa: F811
    """Under Xvfb at 1024x700 the Compile tab's run panel and the Runs & Compare buttons were cut off: the compare
    buttons in one row made the window's minimum width 1,167 pixels."""
    screen = (1024, 700)
    window = make_window()
    window.resize(*screen)
    wait_model(qtbot, window, lambda: window.open_path(SAMPLE_PROJECT))
    fake_run(window)
    for index in range(window.tabs.count()):
        window.tabs.setCurrentIndex(index)
        qtbot.wait(20)
        hint = window.minimumSizeHint()
        assert hint.width() <= screen[0] and hint.height() <= screen[1], (window.tabs.tabText(index), hint)
    assert window.width() <= screen[0] and window.height() <= screen[1]


def test_a_replaced_model_s_runs_are_said_to_stay_in_the_project(qtbot, make_window, answers, tmp_path):  # noqa: F811
    """Replacing project A's model (Import Model › Replace) emptied Runs & Compare without a word: its runs were
    kept in the file, hidden; back on the first model they show again."""
    from test_user_path import conv_classifier

    window = make_window()
    wait_model(qtbot, window, lambda: window.open_path(SAMPLE_PROJECT))
    window.session.project.runs = RunHistory()
    fake_run(window)
    fake_run(window)
    assert "another model" not in window.compare.picks_label.text()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "other.onnx")))
    assert window.compare.table.rowCount() == 0
    assert "2 run(s) of another model stay in the project" in window.compare.picks_label.text()
    wait_model(qtbot, window, lambda: window.import_model(SAMPLE_DIR / "model.onnx"))
    assert window.compare.table.rowCount() == 2 and "another model" not in window.compare.picks_label.text()
