"""The automatic mixed precision controls of the Compile settings form (headless)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("PySide6.QtWidgets")

from qbstudio.widgets.options_panel import OptionsPanel  # noqa: E402


def test_mixed_precision_controls_edit_the_config(qtbot, tmp_path):
    panel = OptionsPanel()
    qtbot.addWidget(panel)
    panel.resize(520, 1100)
    panel.show()
    assert not panel.mixed_check.isChecked() and not panel.mixed_kind.isEnabled()

    panel.mixed_check.setChecked(True)
    config = panel.settings.config.mixed_precision
    assert config.apply and config.target.kind == "cosine" and config.target.value == pytest.approx(0.99)
    assert panel.mixed_kind.isEnabled() and panel.mixed_value.isEnabled()

    assert panel.mixed_statistic.isEnabled()
    panel.mixed_statistic.setCurrentIndex(panel.mixed_statistic.findData("worst"))
    assert panel.settings.config.mixed_precision.target.statistic == "worst"

    panel.mixed_kind.setCurrentIndex(panel.mixed_kind.findData("sqnrDb"))
    assert panel.settings.config.mixed_precision.target.statistic == "mean"  # a worst sample needs a cosine
    assert not panel.mixed_statistic.isEnabled()
    assert panel.settings.config.mixed_precision.target.kind == "sqnrDb"
    assert panel.mixed_value.value() == pytest.approx(30.0)  # a sensible default for the new kind
    panel.mixed_value.setValue(35.0)
    panel.mixed_fraction.setValue(0.15)
    panel.mixed_budget.setValue(0.1)
    mixed = panel.settings.config.mixed_precision
    assert (mixed.target.value, mixed.max_int16_fraction, mixed.latency_budget) == (35.0, 0.15, 0.1)
    assert panel.settings.to_dict()["config"]["mixedPrecision"]["target"] == {"kind": "sqnrDb", "value": 35.0,
                                                                              "statistic": "mean"}

    panel.mixed_budget.setValue(panel.mixed_budget.minimum())  # shown as "unbounded"
    assert panel.mixed_budget.text() == "unbounded"
    assert panel.settings.config.mixed_precision.latency_budget is None
    shot = os.environ.get("QBSTUDIO_SCREENSHOT_DIR")
    if shot:
        panel.grab().save(os.path.join(shot, "mixed_precision_options.png"))

    panel.mixed_check.setChecked(False)
    assert not panel.mixed_value.isEnabled()
    assert panel.settings.config.mixed_precision.target.value == 35.0  # kept for the next time it is switched on


def test_sensitivity_table_from_the_compile_menu_feeds_the_int16_list(qtbot, tmp_path, monkeypatch):
    pytest.importorskip("PySide6.QtWebEngineWidgets")
    from PySide6.QtWidgets import QApplication

    from qbstudio import dialogs
    from qbstudio.main_window import MainWindow
    from qbstudio.state.preferences import AppDirs
    from qbstudio.widgets.welcome import SAMPLE_PROJECT

    errors = []
    monkeypatch.setattr(dialogs, "show_error", lambda parent, title, error: errors.append((title, str(error))))
    monkeypatch.setenv("QBSTUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    window = MainWindow(AppDirs.default())
    window.resize(1400, 900)
    window.show()
    qtbot.waitExposed(window)
    try:
        with qtbot.waitSignal(window.model_ready, timeout=60_000):
            window.open_path(SAMPLE_PROJECT)
        assert window.act_sensitivity in window.menuBar().actions()[1].menu().actions()
        assert window.start_sensitivity()
        told = []
        monkeypatch.setattr(dialogs, "show_info", lambda parent, title, text: told.append(text))
        assert not window.start_sensitivity()  # one heavy job at a time, and the window says which runs
        assert told == ["Cannot analyze sensitivity while the sensitivity analysis runs.\n\nWait for it to "
                        "finish, or press Cancel (toolbar, Ctrl+.) to stop it, then try again."]
        panel = window.run_panel  # its own clock and Cancel; the summary is not told a compile runs
        assert panel.running and panel.cancel_button.isEnabled() and not panel.compile_button.isEnabled()
        assert "Compiling" not in panel.summary.header.text()
        qtbot.waitUntil(lambda: window.sensitivity_dialog is not None and window.sensitivity_dialog.isVisible(),
                        timeout=180_000)
        assert errors == []
        assert not panel.running and panel.stage_label.text() == "Sensitivity analysis done"
        view = window.sensitivity_dialog.view
        assert view.table.rowCount() == len(view.report["layers"]) > 5
        assert view.table.item(0, 0).text() == "1"
        first = view.table.item(0, 1).text()
        view.table.selectRow(0)
        view.use_button.click()
        assert first in window.project.settings.int16_layers or first.startswith("input:")
        saved = view.save(tmp_path / "sensitivity.json")
        assert saved.read_text().startswith("{")
        shot = os.environ.get("QBSTUDIO_SCREENSHOT_DIR")
        if shot:
            window.sensitivity_dialog.grab().save(os.path.join(shot, "sensitivity_table.png"))
    finally:
        window.close()
        window.deleteLater()
        QApplication.processEvents()


@pytest.mark.parametrize(("box", "typed", "path", "expected"), [
    ("mixed_value", "0.99995", "mixedPrecision.target.value", 0.99995),  # a cosine target with five decimals
    ("mixed_fraction", "0.4", "mixedPrecision.maxInt16Fraction", 0.4),
    ("mixed_budget", "0.12", "mixedPrecision.latencyBudget", 0.12),
])
def test_a_value_typed_into_a_settings_box_is_the_one_applied(qtbot, box, typed, path, expected):
    """Each edit refreshed the whole form, which rewrote the box under the cursor after the first keystroke: typing
    0.9995 as the target gave 0.0 (seen under Xvfb). Typed values apply on Enter or when the box loses focus."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    panel = OptionsPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.mixed_check.setChecked(True)
    spin = getattr(panel, box)
    spin.setFocus()
    spin.selectAll()
    QTest.keyClicks(spin, typed)
    QTest.keyClick(spin, Qt.Key.Key_Return)
    assert panel.settings.get(path) == pytest.approx(expected)
    assert spin.value() == pytest.approx(expected)
