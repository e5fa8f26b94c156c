"""Calibration tab: data source, preprocessing pipeline with presets, live preview with warnings, make_calib.

The preview opens the data with ``compiler_core.calibration.open_calibration_data`` (the same
reader the compile uses) in a background job and shows a few preprocessed samples with
per-channel statistics; :func:`qbstudio.state.calibration.review_samples` turns them into warnings.
"""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from compiler_core.calibration import (
    InputSpec,
    make_calib,
    make_calib_text,
    open_calibration_data,
    token_input_roles,
    tokenizer_folder,
    write_folder_manifest,
)
from compiler_core.calibration.audio import window_length
from compiler_core.errors import CalibrationError, QBCompilerError
from compiler_core.progress import as_reporter
from qbstudio import dialogs
from qbstudio.state.calibration import (
    PRESET_LABELS,
    PreprocessForm,
    SampleStats,
    display_image,
    matching_preset,
    pipeline_preset,
    pipeline_presets,
    review_samples,
    sample_stats,
)
from qbstudio.state.project import CalibrationSource
from qbstudio.state.settings import CompileSettings
from qbstudio.widgets.fit import fit_width
from qbstudio.workers import JobRunner, Worker

logger = logging.getLogger(__name__)

PREVIEW_SAMPLES = 6
THUMBNAIL_PX = 112
PREVIEW_DELAY_MS = 400
DATA_FILTER = "Calibration list or manifest (*.txt *.json)"


@dataclass
class Preview:
    """What the preview job found.

    Attributes:
        total: Samples in the dataset.
        kind: The data form (``images``, ``npy``, ``txt`` ...).
        notes: Conversions the reader applied.
        stats: Per-sample statistics of the first input.
        images: Display images of the first input (None for non-image inputs).
        spec: The first input.
        source: The data path previewed (None for random data).
        others: Per previewed sample, the statistics of the other inputs (in the model's order).
    """

    total: int
    kind: str
    notes: list[str]
    stats: list[SampleStats] = field(default_factory=list)
    images: list[np.ndarray | None] = field(default_factory=list)
    spec: InputSpec | None = None
    source: str | None = None
    others: list[list[SampleStats]] = field(default_factory=list)


def load_preview(source: CalibrationSource, specs: list[InputSpec], preprocessing: dict[str, Any],
                 count: int = PREVIEW_SAMPLES, *, callback=None, cancel_token=None) -> Preview:
    """Open the calibration data and preprocess ``count`` samples spread over it (a worker job)."""
    reporter = as_reporter(callback, cancel_token)
    dataset = open_calibration_data(source.path or None, specs, preprocessing=preprocessing,
                                    use_random_calib=source.use_random, max_samples=source.max_samples,
                                    reporter=reporter)
    spec = specs[0]
    preview = Preview(len(dataset), dataset.kind, list(dataset.notes), spec=spec, source=source.path)
    for index in sorted(set(np.linspace(0, len(dataset) - 1, min(count, len(dataset))).astype(int).tolist())):
        reporter.check()
        arrays = dataset.sample(index)
        names = {source.spec.name: Path(source.describe()).name for source in dataset.samples[index].sources}
        preview.stats.append(sample_stats(index, names[spec.name], arrays[spec.name], spec))
        preview.images.append(display_image(arrays[spec.name], spec))
        preview.others.append([sample_stats(index, names[other.name], arrays[other.name], other)
                               for other in specs[1:]])
    return preview


def write_calibration_set(preprocessing: dict[str, Any], data_dir: str, save_dir: str, save_name: str,
                          max_size: int, image_channels: int, *, callback=None, cancel_token=None) -> Path:
    """``compiler_core.calibration.make_calib`` as a worker job; returns the ``.txt`` list."""
    return make_calib(preprocessing, data_dir, save_dir, save_name, max_size, image_channels=image_channels,
                      reporter=as_reporter(callback, cancel_token))


def write_text_calibration_set(text_path: str, tokenizer: str, specs: list[InputSpec], save_dir: str,
                               save_name: str, max_size: int, *, callback=None, cancel_token=None) -> Path:
    """``compiler_core.calibration.make_calib_text`` as a worker job; returns the JSON manifest."""
    return make_calib_text(text_path, tokenizer, specs, save_dir, save_name, max_size,
                           reporter=as_reporter(callback, cancel_token))


def to_pixmap(image: np.ndarray) -> QPixmap:
    """A QPixmap of a uint8 HxWx1 or HxWx3 array."""
    height, width, channels = image.shape
    kind = QImage.Format.Format_Grayscale8 if channels == 1 else QImage.Format.Format_RGB888
    data = np.ascontiguousarray(image[..., 0] if channels == 1 else image)
    qimage = QImage(data.data, width, height, data.strides[0], kind).copy()
    return QPixmap.fromImage(qimage)


class CalibrationPanel(QWidget):
    """The Calibration tab.

    Args:
        runner: Runs the preview and make_calib jobs.
        parent: Parent widget.

    Signals:
        changed(): the source or the preprocessing changed (the project is dirty).
        preview_ready(object): a :class:`Preview` was shown.
        preview_failed(object): opening the data failed (the exception).
    """

    changed = Signal()
    preview_ready = Signal(object)
    preview_failed = Signal(object)

    def __init__(self, runner: JobRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.source = CalibrationSource()
        self.settings = CompileSettings()
        self.specs: list[InputSpec] = []
        self.work_dir: Path | None = None
        self.model_path: Path | None = None
        self.preview: Preview | None = None
        self.warnings: list[str] = []
        self._refreshing = False
        self._rerun_preview = False
        self._report_errors = False
        self._timer = QTimer(self, singleShot=True, interval=PREVIEW_DELAY_MS)
        self._timer.timeout.connect(self.refresh_preview)
        runner.busy_changed.connect(self._on_busy_changed)
        self._build()

    # ------------------------------------------------------------------ building

    def _build(self) -> None:
        left = QVBoxLayout()
        left.addWidget(self._source_group())
        self.pipeline_box = self._pipeline_group()
        left.addWidget(self.pipeline_box)
        self.audio_box = self._audio_group()
        left.addWidget(self.audio_box)
        left.addStretch(1)
        left_widget = QWidget()
        left_widget.setLayout(left)
        self._scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)  # shrinks on short screens
        self._scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._scroll.setWidget(left_widget)
        self._scroll.setMaximumWidth(460)
        self._preview_box = self._preview_group()
        self.note_label = fit_width(QLabel("", objectName="calibNote", wordWrap=True))
        self.note_label.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.note_label.setMargin(12)
        self.note_label.hide()
        layout = QHBoxLayout(self)
        layout.addWidget(self.note_label, 1)
        layout.addWidget(self._scroll)
        layout.addWidget(self._preview_box, 1)

    def set_note(self, text: str | None) -> None:
        """Show ``text`` instead of the form and the preview, for a model that does not calibrate on files
        (a decoder LLM calibrates on text, asked for by its compile); None shows the form again."""
        self.note_label.setText(text or "")
        self.note_label.setVisible(bool(text))
        self._scroll.setVisible(not text)
        self._preview_box.setVisible(not text)

    def _source_group(self) -> QGroupBox:
        group = QGroupBox("Calibration data")
        form = QFormLayout(group)
        self.path_edit = QLineEdit(readOnly=True, placeholderText="No data chosen", objectName="calibPath")
        folder = QPushButton("Folder…", clicked=self._on_choose_folder)
        listing = QPushButton("List/manifest…", clicked=self._on_choose_file)
        self.text_button = QPushButton("Text file…", objectName="calibTextButton", clicked=self._on_choose_text)
        self.text_button.setToolTip("Tokenize a text file, one sentence per line, into token-id samples for this "
                                    "model's inputs (make_calib_text); the model's own tokenizer is used.")
        self.text_button.hide()
        self.folders_button = QPushButton("From folders…", objectName="calibFoldersButton",
                                          clicked=self._on_choose_folders)
        self.folders_button.setToolTip("A model with several inputs: pick one folder per input (images or .npy "
                                       "files); the n-th file of each folder makes sample n, written as a JSON "
                                       "manifest in the project folder.")
        self.folders_button.hide()
        row = QHBoxLayout()
        row.addWidget(folder)
        row.addWidget(listing)
        row.addWidget(self.folders_button)
        row.addWidget(self.text_button)
        self.random_check = QCheckBox("Random data when no path is given (smoke test only)")
        self.random_check.toggled.connect(self._on_source_option)
        self.count_label = QLabel("", objectName="calibCount")
        form.addRow("Source", self.path_edit)
        form.addRow("", row)
        form.addRow("", self.random_check)
        form.addRow("Found", self.count_label)
        return group

    def _pipeline_group(self) -> QGroupBox:
        group = QGroupBox("Preprocessing of raw images")
        form = QFormLayout(group)
        self.preset_combo = QComboBox(objectName="pipelinePreset")
        for name, description in pipeline_presets().items():
            self.preset_combo.addItem(PRESET_LABELS.get(name, name), name)
            self.preset_combo.setItemData(self.preset_combo.count() - 1, description, 3)
        self.preset_combo.addItem("(custom)", None)
        self.preset_combo.activated.connect(self._on_preset_chosen)
        self.apply_check = QCheckBox("Apply the pipeline to images")
        self.color_combo = self._combo(["", "RGB", "BGR"], "keep")
        self.layout_combo = self._combo(["", "HWC", "CHW"], "model's")
        form.addRow("Preset", self.preset_combo)
        form.addRow("", self.apply_check)
        form.addRow("Colour order", self.color_combo)
        form.addRow("Resize", self._resize_row())
        form.addRow("Center crop", self._crop_row())
        form.addRow("Letterbox", self._letterbox_row())
        form.addRow("Normalize", self._normalize_row())
        form.addRow("", self._normalize_options())
        form.addRow("Layout", self.layout_combo)
        self.uint8_check = QCheckBox("uint8 model input (raw pixels; normalize fused)")
        form.addRow("", self.uint8_check)
        self.make_button = QPushButton("Write calibration set…", objectName="makeCalibButton",
                                       clicked=self._on_make_calib)
        self.make_button.setToolTip("Preprocess the images into .npy samples plus a .txt list (make_calib).")
        form.addRow("", self.make_button)
        for widget in (self.apply_check, self.uint8_check):
            widget.toggled.connect(self._on_form_edited)
        return group

    def _on_preset_chosen(self) -> None:
        name = self.preset_combo.currentData()
        if name:
            self.apply_preset(name)

    def _combo(self, values: list[str], empty_label: str) -> QComboBox:
        combo = QComboBox()
        for value in values:
            combo.addItem(value or f"({empty_label})", value)
        combo.currentIndexChanged.connect(self._on_form_edited)
        return combo

    def _spin(self, low: int = 1, high: int = 8192) -> QSpinBox:
        spin = QSpinBox(minimum=low, maximum=high)
        spin.valueChanged.connect(self._on_form_edited)
        return spin

    def _checkbox(self, text: str) -> QCheckBox:
        check = QCheckBox(text)
        check.toggled.connect(self._on_form_edited)
        return check

    def _row(self, *widgets: QWidget) -> QWidget:
        holder = QWidget()
        row = QHBoxLayout(holder)
        row.setContentsMargins(0, 0, 0, 0)
        for widget in widgets:
            row.addWidget(widget)
        row.addStretch(1)
        return holder

    def _resize_row(self) -> QWidget:
        self.resize_check = self._checkbox("")
        self.keep_aspect_check = self._checkbox("short side")
        self.resize_size, self.resize_h, self.resize_w = self._spin(), self._spin(), self._spin()
        return self._row(self.resize_check, self.keep_aspect_check, self.resize_size, QLabel("or"),
                         self.resize_h, QLabel("×"), self.resize_w)

    def _crop_row(self) -> QWidget:
        self.crop_check = self._checkbox("")
        self.crop_h, self.crop_w = self._spin(), self._spin()
        return self._row(self.crop_check, self.crop_h, QLabel("×"), self.crop_w)

    def _letterbox_row(self) -> QWidget:
        self.letterbox_check = self._checkbox("")
        self.letterbox_h, self.letterbox_w, self.pad_spin = self._spin(), self._spin(), self._spin(0, 255)
        return self._row(self.letterbox_check, self.letterbox_h, QLabel("×"), self.letterbox_w, QLabel("pad"),
                         self.pad_spin)

    def _normalize_row(self) -> QWidget:
        self.normalize_check = self._checkbox("")
        self.mean_edit = QLineEdit(placeholderText="mean, e.g. 0.485, 0.456, 0.406")
        self.std_edit = QLineEdit(placeholderText="std")
        for edit in (self.mean_edit, self.std_edit):
            edit.editingFinished.connect(self._on_form_edited)
        holder = self._row(self.normalize_check, QLabel("mean"), self.mean_edit, QLabel("std"), self.std_edit)
        return holder

    def _normalize_options(self) -> QWidget:
        self.scale_combo = QComboBox()
        self.scale_combo.addItem("pixels / 255 first", 1 / 255)
        self.scale_combo.addItem("raw pixels", 1.0)
        self.scale_combo.currentIndexChanged.connect(self._on_form_edited)
        self.fuse_check = self._checkbox("fuse into first layer")
        return self._row(self.scale_combo, self.fuse_check)

    def _audio_group(self) -> QGroupBox:
        """``preprocessing.audio``: how .wav recordings feed a waveform input (shown for such models only)."""
        group = QGroupBox("Recordings (.wav)")
        layout = QFormLayout(group)
        self.rate_spin = QSpinBox(minimum=1, maximum=384_000, singleStep=1000, suffix=" Hz")
        self.rate_spin.setToolTip("The sample rate the model takes; .wav files at another rate are refused unless "
                                  "resampled.")
        self.rate_spin.editingFinished.connect(self._on_audio_edited)
        self.resample_check = QCheckBox("resample files at other rates")
        self.resample_check.toggled.connect(self._on_audio_edited)
        self.full_scale_combo = QComboBox()
        self.full_scale_combo.addItem("-1 to 1 (soundfile, librosa, torchaudio)", 1.0)
        self.full_scale_combo.addItem("int16 values, ±32768 (openWakeWord)", 32768.0)
        self.full_scale_combo.currentIndexChanged.connect(self._on_audio_edited)
        layout.addRow("Sample rate", self.rate_spin)
        layout.addRow("", self.resample_check)
        layout.addRow("Samples as", self.full_scale_combo)
        return group

    def _show_audio(self, audio: dict[str, Any]) -> None:
        self.rate_spin.setValue(audio["sampleRate"])
        self.resample_check.setChecked(audio["resample"])
        index = self.full_scale_combo.findData(float(audio["fullScale"]))
        if index < 0:  # another value from a config file
            self.full_scale_combo.addItem(f"full scale {audio['fullScale']:g} (from the config)", float(audio["fullScale"]))
            index = self.full_scale_combo.count() - 1
        self.full_scale_combo.setCurrentIndex(index)

    def _on_audio_edited(self) -> None:
        if self._refreshing:
            return
        self.settings.set("preprocessing.audio", {"sampleRate": self.rate_spin.value(),
                                                  "resample": self.resample_check.isChecked(),
                                                  "fullScale": self.full_scale_combo.currentData()})
        self.changed.emit()
        self.schedule_preview()

    def _preview_group(self) -> QGroupBox:
        group = QGroupBox("Preview (preprocessed samples)")
        layout = QVBoxLayout(group)
        top = QHBoxLayout()
        self.preview_button = QPushButton("Refresh preview", clicked=self.refresh_preview)
        self.preview_status = fit_width(QLabel(""))
        self.fix_size_button = QPushButton(clicked=self._on_fix_size, objectName="fixSize")
        self.fix_size_button.hide()
        self._fix_size: tuple[int, int] | None = None
        top.addWidget(self.preview_button)
        top.addStretch(1)
        top.addWidget(self.fix_size_button)
        self.warning_label = QLabel("", wordWrap=True, objectName="calibWarnings")
        self.warning_label.setTextFormat(Qt.TextFormat.RichText)
        self.grid_holder = QWidget()
        self.grid = QGridLayout(self.grid_holder)
        self.grid.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        scroll = QScrollArea(widgetResizable=True)
        scroll.setWidget(self.grid_holder)
        layout.addLayout(top)
        layout.addWidget(self.preview_status)
        layout.addWidget(self.warning_label)
        layout.addWidget(scroll, 1)
        return group

    # ------------------------------------------------------------------ state <-> form

    def set_context(self, source: CalibrationSource, settings: CompileSettings, work_dir: Path,
                    specs: list[InputSpec]) -> None:
        """Edit the project's calibration source and preprocessing; ``specs`` are the model inputs."""
        self.source, self.settings, self.work_dir, self.specs = source, settings, work_dir, specs
        self.text_button.setVisible(token_input_roles(specs) is not None if specs else False)
        self.folders_button.setVisible(len(specs) > 1)
        self.pipeline_box.setVisible(not specs or any(spec.is_image for spec in specs))  # images feed none: no pipeline
        self.audio_box.setVisible(len(specs) == 1 and window_length(specs[0]) > 0)  # what recordings can feed
        self._timer.stop()
        self._rerun_preview = False
        self.runner.cancel("preview")
        self.preview, self.warnings = None, []
        self._offer_size_fix(None)
        self._clear_grid()
        self.count_label.setText("")
        self.warning_label.setText("")
        self.preview_status.setText("" if specs else "Import a model first: the preview needs its input shapes.")
        self.refresh()
        self.schedule_preview()

    def refresh(self) -> None:
        """Show the source and the settings' preprocessing in the form."""
        self._refreshing = True
        try:
            self.path_edit.setText(self.source.path or "")
            self.random_check.setChecked(self.source.use_random)
            self._show_form(PreprocessForm.from_preprocessing(self.settings.preprocessing))
            self._show_audio(self.settings.preprocessing["audio"])
            self.preset_combo.setCurrentIndex(self.preset_combo.findData(matching_preset(self.settings.preprocessing)))
            self._enable_rows()
            self.uint8_check.setChecked(self.settings.config.uint8_input.apply)
            self.make_button.setEnabled(bool(self.source.path) and Path(self.source.path).is_dir())
        finally:
            self._refreshing = False

    def _show_form(self, form: PreprocessForm) -> None:
        self.apply_check.setChecked(form.apply)
        self.color_combo.setCurrentIndex(self.color_combo.findData(form.color_order))
        self.resize_check.setChecked(form.resize)
        self.keep_aspect_check.setChecked(form.keep_aspect)
        self.resize_size.setValue(form.resize_size)
        self.resize_h.setValue(form.resize_height)
        self.resize_w.setValue(form.resize_width)
        self.crop_check.setChecked(form.crop)
        self.crop_h.setValue(form.crop_height)
        self.crop_w.setValue(form.crop_width)
        self.letterbox_check.setChecked(form.letterbox)
        self.letterbox_h.setValue(form.letterbox_height)
        self.letterbox_w.setValue(form.letterbox_width)
        self.pad_spin.setValue(form.pad_value)
        self.normalize_check.setChecked(form.normalize)
        self.mean_edit.setText(", ".join(f"{v:g}" for v in form.mean))
        self.std_edit.setText(", ".join(f"{v:g}" for v in form.std))
        self.scale_combo.setCurrentIndex(0 if form.scale < 0.1 else 1)
        self.fuse_check.setChecked(form.fuse)
        self.layout_combo.setCurrentIndex(self.layout_combo.findData(form.layout))

    def form(self) -> PreprocessForm:
        """The form's current values (raises ValueError for unreadable mean/std)."""
        return PreprocessForm(
            apply=self.apply_check.isChecked(), color_order=self.color_combo.currentData(),
            resize=self.resize_check.isChecked(), keep_aspect=self.keep_aspect_check.isChecked(),
            resize_size=self.resize_size.value(), resize_height=self.resize_h.value(),
            resize_width=self.resize_w.value(), crop=self.crop_check.isChecked(), crop_height=self.crop_h.value(),
            crop_width=self.crop_w.value(), letterbox=self.letterbox_check.isChecked(),
            letterbox_height=self.letterbox_h.value(), letterbox_width=self.letterbox_w.value(),
            pad_value=self.pad_spin.value(), normalize=self.normalize_check.isChecked(),
            mean=_floats(self.mean_edit.text()), std=_floats(self.std_edit.text()),
            scale=self.scale_combo.currentData(), fuse=self.fuse_check.isChecked(),
            layout=self.layout_combo.currentData())

    def _enable_rows(self) -> None:
        rows = ((self.resize_check, (self.keep_aspect_check, self.resize_size, self.resize_h, self.resize_w)),
                (self.crop_check, (self.crop_h, self.crop_w)),
                (self.letterbox_check, (self.letterbox_h, self.letterbox_w, self.pad_spin)),
                (self.normalize_check, (self.mean_edit, self.std_edit, self.scale_combo, self.fuse_check)))
        for check, widgets in rows:
            for widget in widgets:
                widget.setEnabled(check.isChecked())
        if self.resize_check.isChecked():
            keep = self.keep_aspect_check.isChecked()
            self.resize_size.setEnabled(keep)
            self.resize_h.setEnabled(not keep)
            self.resize_w.setEnabled(not keep)

    def _on_form_edited(self) -> None:
        if self._refreshing:
            return
        self._enable_rows()
        try:
            self._set_pipeline(self.form().to_preprocessing())
            self.settings.set("uint8Input.apply", self.uint8_check.isChecked())
        except (ValueError, QBCompilerError) as error:
            self.preview_status.setText(f"<span style='color:#c62828'>Invalid pipeline: {error}</span>")
            return
        self.preset_combo.setCurrentIndex(self.preset_combo.findData(matching_preset(self.settings.preprocessing)))
        self.changed.emit()
        self.schedule_preview()

    def _set_pipeline(self, preprocessing: dict[str, Any]) -> None:
        """Set the image pipeline part of ``preprocessing``; its ``audio`` section (how .wav recordings are read),
        which the form does not edit, stays as the settings have it."""
        preprocessing["audio"] = self.settings.preprocessing.get("audio", preprocessing.get("audio"))
        self.settings.set("preprocessing", preprocessing)

    def apply_preset(self, name: str) -> None:
        """Load preset ``name``'s pipeline (and its uint8 input choice) into the settings and the form."""
        preprocessing, uint8 = pipeline_preset(name)
        self._set_pipeline(preprocessing)
        self.settings.set("uint8Input.apply", uint8)
        self.refresh()
        self.changed.emit()
        self.schedule_preview()

    # ------------------------------------------------------------------ source

    def set_source(self, path: str | Path | None, *, report_errors: bool = True) -> None:
        """Use ``path`` (folder, .txt or .json) as the calibration data and preview it."""
        self.source.path = str(Path(path).absolute()) if path else None
        self.refresh()
        self.changed.emit()
        self.refresh_preview(report_errors=report_errors)

    def _on_choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Calibration folder (images, .wav recordings or .npy files)", self._start_dir())
        if path:
            self.set_source(path)

    def _on_choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Calibration list or manifest", self._start_dir(), DATA_FILTER)
        if path:
            self.set_source(path)

    def _on_choose_folders(self) -> None:
        folders = []
        for number, spec in enumerate(self.specs, 1):
            folder = QFileDialog.getExistingDirectory(
                self, f"Input {number} of {len(self.specs)}: folder for '{spec.name}' {list(spec.shape)}",
                str(Path(folders[-1]).parent) if folders else self._start_dir())
            if not folder:
                return
            folders.append(folder)
        self.use_folders(folders)

    def use_folders(self, folders: list[str | Path], save_name: str = "calib_folders") -> Path | None:
        """Pair one folder per model input into ``work_dir/save_name.json`` and use that manifest (None: refused)."""
        try:
            manifest = write_folder_manifest(folders, list(self.specs), self.work_dir / f"{save_name}.json")
        except CalibrationError as error:
            dialogs.show_error(self, "Cannot pair these folders", error)
            return None
        self.set_source(manifest)
        return manifest

    def _start_dir(self) -> str:
        return str(Path(self.source.path).parent) if self.source.path else ""

    def _on_source_option(self) -> None:
        if self._refreshing:
            return
        self.source.use_random = self.random_check.isChecked()
        self.changed.emit()
        self.schedule_preview()

    # ------------------------------------------------------------------ preview

    def schedule_preview(self) -> None:
        """Refresh the preview shortly (edits in a row cause one refresh)."""
        if self.specs and (self.source.path or self.source.use_random):
            self._timer.start()
        else:
            self._timer.stop()

    def refresh_preview(self, *, report_errors: bool = False) -> None:
        """Open the data and preview it in the background (errors as a dialog if ``report_errors``)."""
        if not self.specs:
            self.preview_status.setText("Import a model first: the preview needs its input shapes.")
            return
        if self.runner.is_busy("preview"):
            self._rerun_preview, self._report_errors = True, self._report_errors or report_errors
            self.runner.cancel("preview")
            return
        self._report_errors = report_errors
        worker = Worker("preview", load_preview, CalibrationSource(**vars(self.source)), self.specs,
                        self.settings.preprocessing)
        worker.succeeded.connect(self._show_preview)
        worker.failed.connect(self._preview_error)
        self.preview_status.setText("Reading calibration data…")
        self.runner.start("preview", worker)

    def _on_busy_changed(self, slot: str, busy: bool) -> None:
        """Run the preview asked for while the last one was still running, once the runner has let that one go.

        Keyed on the runner's slot becoming free, not on the worker's ``finished``: a request arriving between the
        worker's end and the runner's clean-up saw the slot busy and was otherwise lost ("Reading calibration
        data…" for ever, found under Xvfb)."""
        if slot == "preview" and not busy and self._rerun_preview:
            self._rerun_preview = False
            self.refresh_preview(report_errors=self._report_errors)

    def _preview_error(self, error: Exception) -> None:
        self.preview = None
        self._clear_grid()
        message = getattr(error, "message", str(error))
        size = getattr(error, "fields", {}).get("resize_to")
        hint = getattr(error, "hint", "") if not size else ""  # a size mismatch has its button instead
        hint = f"<br>{html.escape(hint)}" if hint else ""
        self.preview_status.setText(f"<span style='color:#c62828'>{message}</span>{hint}")
        files = getattr(error, "fields", {}).get("files") or []
        # a size mismatch lists every image: they were found, only not at the model's size
        self.count_label.setText(f"{len(files)} image(s), not at the model's input size" if size and files else "—")
        self.warning_label.setText("")
        self._offer_size_fix(tuple(size) if size else None)
        self.preview_failed.emit(error)
        if self._report_errors and size is None:  # a size mismatch is said here, with its one-click fix
            dialogs.show_error(self, "Calibration data", error)

    def _offer_size_fix(self, size: tuple[int, int] | None) -> None:
        self._fix_size = size
        self.fix_size_button.setVisible(size is not None)
        if size is not None:
            self.fix_size_button.setText(f"Resize to {size[1]}×{size[0]} (model input)")
            self.fix_size_button.setToolTip("Turn on Resize to the model's input size (width × height) and "
                                            "turn off Center crop and Letterbox; edit the pipeline for other choices.")

    def _on_fix_size(self) -> None:
        if self._fix_size is None:
            return
        form = self.form()
        if not form.apply:  # without a pipeline images are scaled to 0-1: keep that, now as a step
            form.normalize, form.mean, form.std, form.scale = True, [0.0], [1.0], 1 / 255
        form.apply, form.resize, form.keep_aspect, form.crop, form.letterbox = True, True, False, False, False
        form.resize_height, form.resize_width = self._fix_size
        self._set_pipeline(form.to_preprocessing())
        self._offer_size_fix(None)
        self.refresh()
        self.changed.emit()
        self.refresh_preview()

    def _show_preview(self, preview: Preview) -> None:
        if preview.spec not in self.specs or preview.source != self.source.path:  # of a model/project closed since
            return
        self.preview = preview
        self._offer_size_fix(None)
        self.count_label.setText(f"{preview.total} sample(s), {preview.kind}")
        self.preview_status.setText("; ".join(preview.notes) or f"Showing {len(preview.stats)} of {preview.total}.")
        self.warnings = review_samples(preview.stats, preview.total, preview.spec, self.form(),
                                       uint8_input=self.settings.config.uint8_input.apply)
        self._show_warnings()
        self._fill_grid(preview)
        self.preview_ready.emit(preview)

    def _show_warnings(self) -> None:
        if not self.warnings:
            self.warning_label.setText("<span style='color:#2e7d32'>✓ No problems found in the previewed samples.</span>")
            return
        items = "".join(f"<li>{text}</li>" for text in self.warnings)
        self.warning_label.setText(f"<span style='color:#b26a00'><b>Check:</b><ul>{items}</ul></span>")

    def _clear_grid(self) -> None:
        while self.grid.count():
            item = self.grid.takeAt(0)
            if item.widget():
                item.widget().deleteLater()

    def _fill_grid(self, preview: Preview) -> None:
        self._clear_grid()
        columns = 3 if any(image is not None for image in preview.images) else 1  # text captions need the width
        others = preview.others or [[] for _ in preview.stats]
        for position, (stats, image, more) in enumerate(zip(preview.stats, preview.images, others)):
            self.grid.addWidget(self._tile(stats, image, preview.spec, more), position // columns, position % columns)

    def _tile(self, stats: SampleStats, image: np.ndarray | None, spec: InputSpec,
              others: list[SampleStats]) -> QWidget:
        tile = QWidget()
        layout = QVBoxLayout(tile)
        if image is not None:
            picture = QLabel()
            picture.setPixmap(to_pixmap(image).scaled(THUMBNAIL_PX, THUMBNAIL_PX, Qt.AspectRatioMode.KeepAspectRatio,
                                                      Qt.TransformationMode.FastTransformation))
            layout.addWidget(picture)
        lines = [f"<b>#{stats.index}</b> {stats.source}", f"{spec.name} {list(spec.shape)}",
                 stats.describe().replace("  ", "<br>")]
        by_name = {other.name: other for other in self.specs}
        for item in others:  # a multi-input sample: each input with its own file
            other = by_name.get(item.input_name)
            shape = list(other.shape) if other is not None else []
            lines.append(f"{item.input_name} {shape} {item.source}<br>{item.describe()}")
        caption = QLabel("<br>".join(lines))
        caption.setWordWrap(True)
        caption.setMaximumWidth(260)
        layout.addWidget(caption)
        return tile

    # ------------------------------------------------------------------ make_calib

    def _on_make_calib(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Write the calibration set into",
                                                  str(dialogs.documents_folder(self)))
        if folder:
            self.make_calibration_set(folder)

    def make_calibration_set(self, save_dir: str | Path, save_name: str = "calib_set", max_size: int = -1) -> Worker:
        """Write ``save_dir/save_name/*.npy`` + ``save_name.txt`` from the image folder; then use the list."""
        channels = self.specs[0].channels if self.specs and self.specs[0].channels in (1, 3) else 3
        worker = Worker("make_calib", write_calibration_set, self.settings.preprocessing, self.source.path,
                        str(save_dir), save_name, max_size, channels)
        worker.succeeded.connect(self._calibration_set_written)
        worker.failed.connect(lambda error: dialogs.show_error(self, "Cannot write the calibration set", error))
        self.runner.start("make_calib", worker)
        return worker

    def _on_choose_text(self) -> None:
        text, _ = QFileDialog.getOpenFileName(self, "Text to calibrate on (one sentence per line)",
                                              str(dialogs.documents_folder(self)), "Text (*.txt);;All files (*)")
        if not text:
            return
        tokenizer = tokenizer_folder(self.model_path)
        if tokenizer is None:
            chosen, _ = QFileDialog.getOpenFileName(self, "The model's tokenizer (tokenizer.json)",
                                                    str(self.model_path.parent if self.model_path else ""),
                                                    "Tokenizer (tokenizer.json *.json)")
            if not chosen:
                return
            tokenizer = Path(chosen)
        self.make_text_calibration_set(text, tokenizer)

    def make_text_calibration_set(self, text_path: str | Path, tokenizer: str | Path, save_name: str = "calib_text",
                                  max_size: int = -1) -> Worker:
        """Tokenize ``text_path`` into ``work_dir/save_name/*.npy`` + ``save_name.json``; then use the manifest."""
        worker = Worker("make_calib", write_text_calibration_set, str(text_path), str(tokenizer), list(self.specs),
                        str(self.work_dir), save_name, max_size)
        worker.succeeded.connect(self._calibration_set_written)
        worker.failed.connect(lambda error: dialogs.show_error(self, "Cannot write the calibration set", error))
        self.runner.start("make_calib", worker)
        return worker

    def _calibration_set_written(self, listing: Path) -> None:
        logger.info("calibration set written: %s", listing)
        self.set_source(listing)


def _floats(text: str) -> list[float]:
    values = [float(part) for part in text.replace(";", ",").split(",") if part.strip()]
    if not values:
        raise ValueError("give at least one number")
    return values
