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

    panel.mixed_kind.setCurrentIndex(panel.mixed_kind.findData("sqnrDb"))
    assert panel.settings.config.mixed_precision.target.kind == "sqnrDb"
    assert panel.mixed_value.value() == pytest.approx(30.0)  # a sensible default for the new kind
    panel.mixed_value.setValue(35.0)
    panel.mixed_fraction.setValue(0.15)
    panel.mixed_budget.setValue(0.1)
    mixed = panel.settings.config.mixed_precision
    assert (mixed.target.value, mixed.max_int16_fraction, mixed.latency_budget) == (35.0, 0.15, 0.1)
    assert panel.settings.to_dict()["config"]["mixedPrecision"]["target"] == {"kind": "sqnrDb", "value": 35.0}

    panel.mixed_budget.setValue(panel.mixed_budget.minimum())  # shown as "unbounded"
    assert panel.mixed_budget.text() == "unbounded"
    assert panel.settings.config.mixed_precision.latency_budget is None
    shot = os.environ.get("QBSTUDIO_SCREENSHOT_DIR")
    if shot:
        panel.grab().save(os.path.join(shot, "mixed_precision_options.png"))

    panel.mixed_check.setChecked(False)
    assert not panel.mixed_value.isEnabled()
    assert panel.settings.config.mixed_precision.target.value == 35.0  # kept for the next time it is switched on
