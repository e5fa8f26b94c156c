"""Compile settings: device and its card, inference scheme, preset, calibration, int16 overrides, options.

Every control edits the project's :class:`~qbstudio.state.settings.CompileSettings` (validated by
the core's CompileConfig) and the config can be loaded and saved in the CLI's JSON/YAML schema.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from compiler_core.config import CalibrationMethod, CalibrationMode, CalibrationOutput
from compiler_core.errors import QBCompilerError
from qbstudio import dialogs
from qbstudio.state.model_fit import holdout_note
from qbstudio.state.settings import (
    CHOICE_LABELS,
    CompileSettings,
    allowed_schemes,
    choice_descriptions,
    device_card,
    devices,
    field_description,
    presets,
)

logger = logging.getLogger(__name__)

NO_PRESET_LABEL = "(keep current settings)"
LLM_OPTIONS_NOTE = ("A decoder LLM is quantized by the LLM preset chosen when you press Compile (llm, llm_accurate or "
                    "llm_fast); of these settings only the device and the inference scheme apply to it.")
METHOD_LABELS = CHOICE_LABELS["calibration.method"]
OUTPUT_LABELS = CHOICE_LABELS["calibration.output"]
MODE_LABELS = CHOICE_LABELS["calibration.mode"]
CHANNEL_LABELS = {0: "As the model takes them", 1: "Gray (1)", 3: "RGB (3)"}
NOT_IMPLEMENTED_OUTPUTS = (1, 2)
CONFIG_FILTER = "Compile config (*.yaml *.yml *.json)"


MIXED_KIND_LABELS = {"cosine": "Output cosine to FP32", "sqnrDb": "Output SQNR (dB)",
                     "top1": "Top-1 agreement with FP32"}
MIXED_KIND_DEFAULTS = {"cosine": 0.99, "sqnrDb": 30.0, "top1": 0.95}


def card_html(name: str) -> str:
    """Rich text of the device card."""
    card = device_card(name)
    rows = [("Chip", f"{card['chip']} — {card['clusters']} cluster(s), {card['cores']} core(s)"),
            ("Peak", f"{card['tops']} TOPS INT8"), ("MFU", "yes" if card["mfu"] else "no (no LUT ops)"),
            ("Weights", ", ".join(card["weights"])), ("Activations", ", ".join(card["activations"])),
            ("Schemes", ", ".join(card["schemes"])), ("I/O", "float32" if card["float_io"] else "integer only")]
    body = "".join(f"<tr><td><b>{k}</b>&nbsp;</td><td>{v}</td></tr>" for k, v in rows)
    return f"<i>{card['description']}</i><table>{body}</table>"


def show_value(spin: QDoubleSpinBox | QSpinBox, value: float) -> None:
    """Show ``value`` in ``spin`` unless it shows it already: ``setValue`` rewrites the text, so a refresh after each
    typed digit turned "0.9" into "0.9000" with the cursor inside, and "0.9999" could not be typed."""
    if spin.value() != value:
        spin.setValue(value)


class OptionsPanel(QWidget):
    """The Compile settings form.

    Signals:
        changed(): the settings were edited (any field).
        device_changed(str): the target device changed.
    """

    changed = Signal()
    device_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = CompileSettings()
        self.sample_count: int | None = None
        self.holdout_adjusted = False
        self._refreshing = False
        layout = QVBoxLayout(self)
        layout.addWidget(self._target_group())
        self.llm_note = QLabel(LLM_OPTIONS_NOTE, wordWrap=True, objectName="llmOptionsNote", styleSheet="color: #555")
        self.llm_note.hide()
        layout.addWidget(self.llm_note)
        self._model_groups = [self._calibration_group(), self._precision_group(), self._mixed_group(),
                              self._options_group()]
        for group in self._model_groups:
            layout.addWidget(group)
        layout.addLayout(self._file_buttons())
        layout.addStretch(1)
        self.refresh()

    def set_llm(self, llm: bool) -> None:
        """A decoder LLM compiles with an LLM preset chosen at Compile: only the device and the core modes apply;
        the other settings are hidden (and kept for the next model)."""
        self.llm_note.setVisible(llm)
        for group in self._model_groups:
            group.setVisible(not llm)
        for widget in (self.preset_combo, self.preset_label):
            self._target_form.setRowVisible(widget, not llm)

    # ------------------------------------------------------------------ building

    def _target_group(self) -> QGroupBox:
        group = QGroupBox("Target")
        form = self._target_form = QFormLayout(group)
        self.device_combo = QComboBox(objectName="deviceCombo")
        self.device_combo.addItems(devices())
        self.device_combo.currentTextChanged.connect(self._on_device)
        self.device_card = QLabel(wordWrap=True, objectName="deviceCard")
        self.scheme_combo = QComboBox(objectName="schemeCombo")
        self.scheme_combo.currentTextChanged.connect(self._on_scheme)
        self.preset_combo = QComboBox(objectName="presetCombo")
        self.preset_combo.addItem(NO_PRESET_LABEL, None)
        for name, description in presets().items():
            self.preset_combo.addItem(name, name)
            self.preset_combo.setItemData(self.preset_combo.count() - 1, description, 3)  # ToolTipRole
        self.preset_combo.activated.connect(self._on_preset)
        self.preset_label = QLabel(wordWrap=True, styleSheet="color: #555")
        self.device_combo.setToolTip(field_description("targetDevice"))
        self.scheme_combo.setToolTip(field_description("inferenceScheme") + " 'all' compiles every core mode.")
        self.preset_combo.setToolTip("Layer a named preset's settings over the current ones.")
        form.addRow("Device", self.device_combo)
        form.addRow("", self.device_card)
        form.addRow("Inference scheme", self.scheme_combo)
        form.addRow("Preset", self.preset_combo)
        form.addRow("", self.preset_label)
        return group

    def _calibration_group(self) -> QGroupBox:
        group = QGroupBox("Calibration")
        form = QFormLayout(group)
        self.method_combo = self._enum_combo(CalibrationMethod, "calibration.method", METHOD_LABELS)
        self.output_combo = self._enum_combo(CalibrationOutput, "calibration.output", OUTPUT_LABELS)
        for code in NOT_IMPLEMENTED_OUTPUTS:  # accepted by the schema, quantized per layer anyway
            self.output_combo.model().item(self.output_combo.findData(code)).setEnabled(False)
        self.mode_combo = self._enum_combo(CalibrationMode, "calibration.mode", MODE_LABELS)
        self.percentile_spin = self._double_spin("calibration.maxPercentile.percentile", 0.0001, 1.0, 6, 0.0001)
        self.topk_spin = self._double_spin("calibration.maxPercentile.topkRatio", 0.0, 1.0, 4, 0.001)
        self.samples_spin = self._int_spin("calibration.numSamples", 1, 100_000)
        self.holdout_spin = self._int_spin("analysisHoldout", 0, 10_000)
        self.holdout_label = QLabel("", wordWrap=True, objectName="holdoutNote")
        self.channels_combo = QComboBox(objectName="imageChannels")
        for code, text in choice_descriptions("imageChannels").items():
            self.channels_combo.addItem(CHANNEL_LABELS[code], code)
            self.channels_combo.setItemData(self.channels_combo.count() - 1, text, Qt.ItemDataRole.ToolTipRole)
        self.channels_combo.currentIndexChanged.connect(
            lambda: self._edit("imageChannels", self.channels_combo.currentData()))
        rows = (("Range grouping", self.method_combo, "calibration.method"),
                ("Output layers", self.output_combo, "calibration.output"),
                ("Range choice", self.mode_combo, "calibration.mode"),
                ("Percentile", self.percentile_spin, "calibration.maxPercentile.percentile"),
                ("Top-k ratio", self.topk_spin, "calibration.maxPercentile.topkRatio"),
                ("Calibration samples (max)", self.samples_spin, "calibration.numSamples"),
                ("Held out for analysis", self.holdout_spin, "analysisHoldout"),
                ("", self.holdout_label, None),
                ("Image channels", self.channels_combo, "imageChannels"))
        for label, widget, path in rows:
            self._add_row(form, label, widget, path)
        return group

    @staticmethod
    def _add_row(form: QFormLayout, label: str, widget: QWidget, path: str | None) -> None:
        tip = field_description(path) if path else ""
        title = QLabel(label)
        for item in (title, widget):
            if tip and not item.toolTip():
                item.setToolTip(tip)
        form.addRow(title, widget)

    def _precision_group(self) -> QGroupBox:
        group = QGroupBox("int16 activation layers (bit.layerOverrides.activation16Bits)")
        layout = QVBoxLayout(group)
        self.int16_list = QListWidget(objectName="int16List")
        self.int16_list.setMaximumHeight(110)
        self.int16_edit = QLineEdit(placeholderText="Layer name or glob pattern, e.g. *softmax*")
        self.int16_edit.returnPressed.connect(self._on_add_int16)
        add = QPushButton("Add")
        add.clicked.connect(self._on_add_int16)
        remove = QPushButton("Remove")
        remove.clicked.connect(self._on_remove_int16)
        row = QHBoxLayout()
        row.addWidget(self.int16_edit, 1)
        row.addWidget(add)
        row.addWidget(remove)
        layout.addWidget(self.int16_list)
        layout.addLayout(row)
        return group

    def _mixed_group(self) -> QGroupBox:
        group = QGroupBox("Automatic mixed precision")
        form = QFormLayout(group)
        self.mixed_check = self._check("Promote sensitive layers to int16 until the target holds",
                                       "mixedPrecision.apply")
        self.mixed_check.setObjectName("mixedPrecisionCheck")
        self.mixed_kind = QComboBox(objectName="mixedPrecisionKind")
        for kind, label in MIXED_KIND_LABELS.items():
            self.mixed_kind.addItem(label, kind)
        self.mixed_kind.currentIndexChanged.connect(self._on_mixed_kind)
        self.mixed_value = QDoubleSpinBox(decimals=4, minimum=0.0, maximum=200.0, singleStep=0.001,
                                          objectName="mixedPrecisionValue")
        self.mixed_value.valueChanged.connect(lambda value: self._edit("mixedPrecision.target.value", value))
        self.mixed_statistic = QComboBox(objectName="mixedPrecisionStatistic")
        for statistic, label in (("mean", "Mean over the held-out samples"), ("worst", "Worst held-out sample")):
            self.mixed_statistic.addItem(label, statistic)
        self.mixed_statistic.currentIndexChanged.connect(self._on_mixed_statistic)
        self.mixed_fraction = self._double_spin("mixedPrecision.maxInt16Fraction", 0.0, 1.0, 2, 0.05)
        self.mixed_fraction.setObjectName("mixedPrecisionFraction")
        self.mixed_budget = QDoubleSpinBox(decimals=2, minimum=-0.01, maximum=10.0, singleStep=0.05,
                                           specialValueText="unbounded", objectName="mixedPrecisionBudget")
        self.mixed_budget.valueChanged.connect(
            lambda value: self._edit("mixedPrecision.latencyBudget", None if value < 0 else value))
        form.addRow(self.mixed_check)
        for label, widget, path in (("Target", self.mixed_kind, "mixedPrecision.target.kind"),
                                    ("Target value (at least)", self.mixed_value, "mixedPrecision.target.value"),
                                    ("Cosine judged on", self.mixed_statistic, "mixedPrecision.target.statistic"),
                                    ("Max. int16 share of layers", self.mixed_fraction, "mixedPrecision.maxInt16Fraction"),
                                    ("Latency budget (+fraction)", self.mixed_budget, "mixedPrecision.latencyBudget")):
            self._add_row(form, label, widget, path)
        self.mixed_check.setToolTip(field_description("mixedPrecision.apply") + " The chosen layers are written "
                                    "into the saved config (bit.layerOverrides), so the compile is reproducible.")
        return group

    def _on_mixed_statistic(self) -> None:
        statistic = self.mixed_statistic.currentData()
        if not self._refreshing and statistic != self.settings.config.mixed_precision.target.statistic:
            self._apply(lambda: self.settings.set("mixedPrecision.target.statistic", statistic))

    def _on_mixed_kind(self) -> None:
        kind = self.mixed_kind.currentData()
        if self._refreshing or kind == self.settings.get("mixedPrecision.target.kind"):
            return
        self._apply(lambda: self.settings.set("mixedPrecision.target",
                                              {"kind": kind, "value": MIXED_KIND_DEFAULTS[kind]}))

    def _options_group(self) -> QGroupBox:
        group = QGroupBox("Options")
        layout = QVBoxLayout(group)
        self.bias_check = self._check("Layer bias correction", "layerBiasCorrection.apply")
        self.offload_check = self._check("CPU offload of unsupported head/tail layers", "cpuOffload")
        self.uint8_check = self._check("uint8 input (raw pixels)", "uint8Input.apply")
        for check, path in ((self.bias_check, "layerBiasCorrection.apply"), (self.offload_check, "cpuOffload"),
                            (self.uint8_check, "uint8Input.apply")):
            check.setToolTip(field_description(path))
        for widget in (self.bias_check, self.offload_check, self.uint8_check):
            layout.addWidget(widget)
        return group

    def _file_buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        load = QPushButton("Load config…", objectName="loadConfigButton")
        load.clicked.connect(self.ask_load_config)
        save = QPushButton("Save config…", objectName="saveConfigButton")
        save.clicked.connect(self.ask_save_config)
        reset = QPushButton("Reset to defaults", objectName="resetConfigButton")
        reset.setToolTip("Undo presets and edits: the compile defaults, keeping the device, the inference scheme and "
                         "the Calibration tab's preprocessing (presets are layered over the current settings)")
        reset.clicked.connect(self.reset_to_defaults)
        self.config_label = QLabel(styleSheet="color: #555")
        row.addWidget(load)
        row.addWidget(save)
        row.addWidget(reset)
        row.addWidget(self.config_label, 1)
        return row

    def _enum_combo(self, kind: Any, path: str, labels: dict[int, str]) -> QComboBox:
        combo = QComboBox(objectName=path)
        tips = choice_descriptions(path)
        for member in kind:
            combo.addItem(labels[int(member)], int(member.value))
            combo.setItemData(combo.count() - 1, f"{member.value} = {tips.get(int(member), member.name)}",
                              Qt.ItemDataRole.ToolTipRole)
        combo.currentIndexChanged.connect(lambda: self._edit(path, combo.currentData()))
        return combo

    def _double_spin(self, path: str, low: float, high: float, decimals: int, step: float) -> QDoubleSpinBox:
        spin = QDoubleSpinBox(decimals=decimals, minimum=low, maximum=high, singleStep=step)
        spin.valueChanged.connect(lambda value: self._edit(path, value))
        return spin

    def _int_spin(self, path: str, low: int, high: int) -> QSpinBox:
        spin = QSpinBox(minimum=low, maximum=high)
        spin.valueChanged.connect(lambda value: self._edit(path, value))
        return spin

    def _check(self, text: str, path: str) -> QCheckBox:
        check = QCheckBox(text)
        check.toggled.connect(lambda value: self._edit(path, value))
        return check

    # ------------------------------------------------------------------ state <-> widgets

    def set_settings(self, settings: CompileSettings) -> None:
        """Edit ``settings`` (the project's object) from now on."""
        self.settings = settings
        self.refresh()

    def refresh(self) -> None:
        """Show the current settings in every control."""
        self._refreshing = True
        try:
            self._refresh_target()
            config = self.settings.config
            self._select_data(self.method_combo, int(config.calibration.method))
            self._select_data(self.output_combo, int(config.calibration.output))
            self._select_data(self.mode_combo, int(config.calibration.mode))
            show_value(self.percentile_spin, config.calibration.max_percentile.percentile)
            show_value(self.topk_spin, config.calibration.max_percentile.topk_ratio)
            show_value(self.samples_spin, config.calibration.num_samples)
            show_value(self.holdout_spin, config.analysis_holdout)
            self._select_data(self.channels_combo, config.image_channels)
            self._refresh_applicable()
            self.int16_list.clear()
            self.int16_list.addItems(self.settings.int16_layers)
            self._refresh_mixed(config)
            self.bias_check.setChecked(config.layer_bias_correction.apply)
            self.offload_check.setChecked(config.cpu_offload)
            self.uint8_check.setChecked(config.uint8_input.apply)
        finally:
            self._refreshing = False

    def _refresh_mixed(self, config) -> None:
        mixed = config.mixed_precision
        self.mixed_check.setChecked(mixed.apply)
        self._select_data(self.mixed_kind, mixed.target.kind)
        decimals = {"sqnrDb": 1, "cosine": 5}.get(mixed.target.kind, 4)  # a cosine target of 0.99999
        if self.mixed_value.decimals() != decimals:  # both reformat the text: not while it is typed in
            self.mixed_value.setDecimals(decimals)
            self.mixed_value.setMaximum(200.0 if mixed.target.kind == "sqnrDb" else 1.0)
        show_value(self.mixed_value, mixed.target.value)
        show_value(self.mixed_fraction, mixed.max_int16_fraction)
        show_value(self.mixed_budget, -0.01 if mixed.latency_budget is None else mixed.latency_budget)
        self._select_data(self.mixed_statistic, mixed.target.statistic)
        for widget in (self.mixed_kind, self.mixed_value, self.mixed_fraction, self.mixed_budget):
            widget.setEnabled(mixed.apply)
        self.mixed_statistic.setEnabled(mixed.apply and mixed.target.kind == "cosine")

    def _refresh_target(self) -> None:
        device = self.settings.device
        self.device_combo.setCurrentText(device)
        self.device_card.setText(card_html(device))
        self.scheme_combo.clear()
        self.scheme_combo.addItems(allowed_schemes(device))
        self.scheme_combo.setCurrentText(self.settings.config.inference_scheme)
        self._refresh_preset()

    def _refresh_preset(self) -> None:
        """The preset applied last, marked "(edited)" once a setting was changed after it (the box read the preset's
        name as if its settings were all still in effect)."""
        preset, edited = self.settings.preset, self.settings.preset_edited
        for index in range(1, self.preset_combo.count()):
            name = self.preset_combo.itemData(index)
            self.preset_combo.setItemText(index, f"{name} (edited)" if edited and name == preset else name)
        self._select_data(self.preset_combo, preset)
        description = presets().get(preset, "") if preset else ""
        if edited:
            description = (f"Settings were changed after the preset '{preset}' was applied; choose it again to apply "
                           f"all of its settings. ({description})")
        self.preset_label.setText(description)

    def _refresh_applicable(self) -> None:
        """Disable what the current choices ignore; show how the held-out count splits the data."""
        calibration = self.settings.config.calibration
        percentile = int(calibration.mode) == int(CalibrationMode.MaxPercentile) or any(
            override.mode is not None and int(override.mode) == int(CalibrationMode.MaxPercentile)
            for override in calibration.layer_overrides.values())
        for spin in (self.percentile_spin, self.topk_spin):
            spin.setEnabled(percentile)
        config = self.settings.config
        text, adjusted = holdout_note(self.sample_count, config.analysis_holdout, calibration.num_samples)
        colour = "#b26a00" if adjusted else "#555"
        self.holdout_label.setText(f"<span style='color:{colour}'>{text}</span>")
        self.holdout_adjusted = adjusted

    def set_sample_count(self, total: int | None) -> None:
        """The calibration data holds ``total`` samples (None: unknown); the held-out note follows."""
        self.sample_count = total
        self._refresh_applicable()

    def set_model_channels(self, channels: set[int]) -> None:
        """The model's image inputs have these channel counts: image-channel choices that contradict them are
        disabled (an empty set enables every choice)."""
        for index in range(self.channels_combo.count()):
            code = self.channels_combo.itemData(index)
            fits = code == 0 or not channels or channels == {code}
            self.channels_combo.model().item(index).setEnabled(fits)

    def set_value(self, path: str, value: Any) -> None:
        """Set the setting at dotted ``path`` as if edited in the form."""
        self._edit(path, value)

    @staticmethod
    def _select_data(combo: QComboBox, value: Any) -> None:
        combo.setCurrentIndex(max(0, combo.findData(value)))

    # ------------------------------------------------------------------ edits

    def _apply(self, action: Callable[[], Any], title: str = "Invalid setting") -> bool:
        try:
            action()
        except QBCompilerError as error:
            dialogs.show_error(self, title, error)
            self.refresh()
            return False
        self.refresh()
        self.changed.emit()
        return True

    def _edit(self, path: str, value: Any) -> None:
        if not self._refreshing and self.settings.get(path) != value:
            self._apply(lambda: self.settings.set(path, value))

    def _on_device(self, name: str) -> None:
        if not self._refreshing and name and name != self.settings.device:
            self.set_device(name)

    def set_device(self, name: str) -> None:
        """Target ``name`` (schemes it lacks fall back to single) and announce it."""
        if self._apply(lambda: self.settings.set_device(name)):
            self.device_changed.emit(self.settings.device)

    def _on_scheme(self, scheme: str) -> None:
        if not self._refreshing and scheme and scheme != self.settings.config.inference_scheme:
            self._apply(lambda: self.settings.set_scheme(scheme))

    def _on_preset(self) -> None:
        name = self.preset_combo.currentData()
        if name:
            self.apply_preset(name)

    def apply_preset(self, name: str) -> None:
        """Layer preset ``name`` over the current settings."""
        self._apply(lambda: self.settings.apply_preset(name), "Cannot apply preset")

    def use_run_settings(self, config: dict[str, Any]) -> bool:
        """Take a run's recorded settings for the next compile (Runs & Compare); a device change is announced."""
        device = self.settings.device
        if not self._apply(lambda: self.settings.use_run_config(config), "Cannot use the run's settings"):
            return False
        if self.settings.device != device:
            self.device_changed.emit(self.settings.device)
        return True

    def add_int16_layer(self, name: str) -> None:
        """Add a layer (or pattern) to the int16 activation overrides."""
        if name.strip():
            self._apply(lambda: self.settings.add_int16_layer(name.strip()))

    def set_cpu_layer(self, name: str, part: str | None) -> bool:
        """Run layer ``name`` on the CPU in the head or tail with what it needs (``part``), or on the NPU again (None)."""
        return self._apply(lambda: self.settings.set_cpu_layer(name, part), "Cannot run this layer on the CPU")

    def _on_add_int16(self) -> None:
        self.add_int16_layer(self.int16_edit.text())
        self.int16_edit.clear()

    def _on_remove_int16(self) -> None:
        names = [item.text() for item in self.int16_list.selectedItems()]
        self._apply(lambda: [self.settings.remove_int16_layer(name) for name in names])

    def reset_to_defaults(self) -> None:
        """Back to the compile defaults (see :meth:`CompileSettings.reset`)."""
        if self._apply(self.settings.reset):
            self.config_label.setText("Defaults")

    def load_config(self, path: str | Path) -> bool:
        """Replace the settings with a config file; an invalid file shows an error and changes nothing."""
        device = self.settings.device
        ok = self._apply(lambda: self.settings.load(path), "Cannot load compile config")
        if ok:
            self.config_label.setText(f"Loaded {Path(path).name}")
            if self.settings.device != device:
                self.device_changed.emit(self.settings.device)
        return ok

    def save_config(self, path: str | Path) -> bool:
        """Write the settings as JSON or YAML (by suffix)."""
        try:
            self.settings.save(path)
        except QBCompilerError as error:
            dialogs.show_error(self, "Cannot save compile config", error)
            return False
        self.config_label.setText(f"Saved {Path(path).name}")
        return True

    def ask_load_config(self) -> None:
        """Ask for a config file and load it."""
        path, _ = QFileDialog.getOpenFileName(self, "Load compile config", "", CONFIG_FILTER)
        if path:
            self.load_config(path)

    def ask_save_config(self) -> None:
        """Ask for a file name and save the config there."""
        start = dialogs.documents_folder(self) / "compile_config.yaml"
        path, _ = QFileDialog.getSaveFileName(self, "Save compile config", str(start), CONFIG_FILTER)
        if path:
            self.save_config(path)
