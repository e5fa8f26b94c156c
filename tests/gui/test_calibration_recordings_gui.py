"""The Calibration tab previews a folder of .wav recordings for a waveform model: what it read, in its words."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from test_user_path import TIMEOUT_MS, answers, make_window, wait_model  # noqa: E402, F401  (fixtures and helper)

from tests.test_calibration_audio import LIBRIVOX, waveform_model  # noqa: E402


def test_a_recording_folder_is_previewed_as_windows(qtbot, make_window, tmp_path):  # noqa: F811
    if not any(LIBRIVOX.glob("*.wav")):
        pytest.skip(f"{LIBRIVOX} is missing: apt-get install -y pocketsphinx-testdata")
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(waveform_model(tmp_path / "wave.onnx", 1600)))
    panel = window.calibration
    window.tabs.setCurrentWidget(panel)
    with qtbot.waitSignal(panel.preview_ready, timeout=TIMEOUT_MS) as ready:
        panel.set_source(LIBRIVOX)
    preview = ready.args[0]
    assert preview.kind == "wav" and preview.total == 245  # 71 + 29 + 53 + 60 + 32 windows of 0.1 s in 5 recordings
    assert panel.count_label.text() == "245 sample(s), wav"
    assert panel.preview_status.text().startswith(
        "245 window(s) of 1600 samples (0.1 s) from 5 .wav file(s) at 16000 Hz")
    assert preview.stats[0].source.endswith(".wav@0")


def test_try_on_inputs_offers_every_file_kind_the_reader_reads():
    """The dialog's filter listed *.png *.jpg *.jpeg *.bmp *.npy by hand: WebP/TIFF photos and .wav recordings were
    hidden under "All files"."""
    from qbstudio.widgets.try_inputs import try_inputs_filter

    first = try_inputs_filter(1).split(";;")[0]
    assert all(f"*{suffix}" in first for suffix in (".webp", ".tif", ".gif", ".wav", ".npy", ".jpg"))


def test_editing_the_image_pipeline_keeps_the_audio_settings(qtbot, make_window, tmp_path):  # noqa: F811
    """The form wrote a whole ``preprocessing`` section: any pipeline edit reset ``audio`` (an openWakeWord project's
    fullScale 32768 went back to 1.0 without a word)."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(waveform_model(tmp_path / "wave.onnx", 1600)))
    panel = window.calibration
    audio = {"sampleRate": 16000, "resample": True, "fullScale": 32768.0}
    panel.settings.set("preprocessing.audio", audio)
    panel.apply_preset("yolo_640")
    assert panel.settings.preprocessing["audio"] == audio
    panel.normalize_check.setChecked(not panel.normalize_check.isChecked())  # a form edit
    assert panel.settings.preprocessing["audio"] == audio
