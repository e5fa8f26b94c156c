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


def test_a_phone_rate_recording_is_refused_then_read_once_resampling_is_ticked(qtbot, make_window, tmp_path):  # noqa: F811
    """The refusal names ``preprocessing.audio.resample``; the Recordings box is where the workbench sets it (and the
    sample rate and sample scale), shown for a waveform model only."""
    import wave

    import numpy as np

    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(waveform_model(tmp_path / "wave.onnx", 1600)))
    panel = window.calibration
    window.tabs.setCurrentWidget(panel)
    assert not panel.audio_box.isHidden() and panel.pipeline_box.isHidden()
    (tmp_path / "phone").mkdir()
    tone = np.sin(2 * np.pi * 440 * np.arange(44100) / 44100) * 0.3
    with wave.open(str(tmp_path / "phone" / "a.wav"), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(44100)
        writer.writeframes(np.round(tone * 32767).astype("<i2").tobytes())
    with qtbot.waitSignal(panel.preview_failed, timeout=TIMEOUT_MS):
        panel.set_source(tmp_path / "phone")
    qtbot.waitUntil(lambda: "44100 Hz" in panel.preview_status.text(), timeout=TIMEOUT_MS)
    with qtbot.waitSignal(panel.preview_ready, timeout=TIMEOUT_MS) as ready:
        panel.resample_check.setChecked(True)
    assert ready.args[0].total == 10  # 1 s at 16 kHz: 10 windows of 1600 samples
    assert "1 .wav file(s) at 44100 Hz resampled to 16000 Hz" in panel.preview_status.text()
    with qtbot.waitSignal(panel.preview_ready, timeout=TIMEOUT_MS) as ready:
        panel.full_scale_combo.setCurrentIndex(1)
    assert window.project.settings.preprocessing["audio"] == {"sampleRate": 16000, "resample": True,
                                                              "fullScale": 32768.0}
    assert ready.args[0].stats[0].maximum[0] > 9000  # 0.3 of full scale, as int16 values
