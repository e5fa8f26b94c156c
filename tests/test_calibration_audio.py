"""Recordings as calibration data: a folder of ``.wav`` files feeds a waveform input, cut into windows of its
length, through the same reader as compile, make-calib checks, the workbench preview and Try."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from compiler_core.calibration import InputSpec, open_calibration_data
from compiler_core.errors import CalibrationError

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")
WINDOW = 576  # Silero VAD's input at 16 kHz
SPEC = InputSpec("input", (1, WINDOW), np.dtype(np.float32), "NC")


@pytest.fixture(scope="module")
def recordings() -> list[Path]:
    files = sorted(LIBRIVOX.glob("*.wav"))
    if not files:
        pytest.skip(f"{LIBRIVOX} is missing: apt-get install -y pocketsphinx-testdata")
    return files


def _samples(path: Path) -> np.ndarray:
    with wave.open(str(path)) as reader:
        return np.frombuffer(reader.readframes(reader.getnframes()), "<i2").astype(np.float32) / 32768


def _write(path: Path, samples: np.ndarray, rate: int = 16000, width: int = 2, channels: int = 1) -> None:
    """``samples`` in [-1, 1) as PCM of ``width`` bytes (``channels`` copies, the later ones at half level)."""
    levels = [samples] + [samples * 0.5] * (channels - 1)
    frames = np.stack(levels, axis=1).reshape(-1)
    scaled = np.round(frames * (1 << (8 * width - 1)))
    if width == 1:
        data = (scaled + 128).astype(np.uint8).tobytes()
    elif width == 3:
        data = scaled.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    else:
        data = scaled.astype({2: "<i2", 4: "<i4"}[width]).tobytes()
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(data)


def test_a_wav_folder_is_cut_into_windows_of_the_input_length(recordings):
    """It was refused ("has no usable files ... found 6 .wav files"): users wrote .npy windows themselves."""
    dataset = open_calibration_data(LIBRIVOX, [SPEC])
    expected = [(path, start) for path in recordings
                for start in range(0, len(_samples(path)) - WINDOW + 1, WINDOW)]
    assert len(dataset) == len(expected) and dataset.kind == "wav"
    for index in (0, 1, len(expected) // 2, len(expected) - 1):
        path, start = expected[index]
        assert dataset.sources[index] == f"{path}@{start}"
        np.testing.assert_array_equal(dataset.sample(index)["input"], _samples(path)[None, start:start + WINDOW])
    assert any(f"{len(expected)} window(s) of {WINDOW} samples" in note for note in dataset.notes)


def test_full_scale_reads_int16_sample_values_and_is_in_the_fingerprint(recordings):
    """openWakeWord takes int16 sample values in float32: ``preprocessing.audio.fullScale: 32768``."""
    spec = InputSpec("input", (1, 16000), np.dtype(np.float32), "NC")
    unit = open_calibration_data(recordings[0], [spec])
    scaled = open_calibration_data(recordings[0], [spec], preprocessing={"audio": {"fullScale": 32768}})
    np.testing.assert_array_equal(scaled.sample(0)["input"], unit.sample(0)["input"] * 32768)
    assert scaled.fingerprint != unit.fingerprint


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_pcm_widths_and_stereo_are_read_as_mono_in_unit_range(tmp_path, recordings, width):
    speech = _samples(recordings[0])[:WINDOW * 4]
    _write(tmp_path / "stereo.wav", speech, width=width, channels=2)
    dataset = open_calibration_data(tmp_path, [SPEC])
    assert len(dataset) == 4
    step = 2.0 ** (1 - 8 * width)  # one code of this width
    np.testing.assert_allclose(dataset.sample(1)["input"][0], speech[WINDOW:2 * WINDOW] * 0.75, atol=step)
    assert "1 .wav file(s) with several channels mixed to mono" in dataset.notes


def test_another_sample_rate_is_refused_naming_the_rate_and_the_config_key(tmp_path, recordings):
    _write(tmp_path / "phone.wav", _samples(recordings[0])[:8000], rate=44100)
    with pytest.raises(CalibrationError, match=r"1 \.wav file\(s\) are not at the model's 16000 Hz "
                                               r"\(preprocessing\.audio\.sampleRate\): 44100 Hz: phone\.wav") as info:
        open_calibration_data(tmp_path, [SPEC])
    assert "Set preprocessing.audio.resample to true" in info.value.hint
    assert len(open_calibration_data(tmp_path, [SPEC], preprocessing={"audio": {"sampleRate": 44100}})) == 13


def test_resample_reads_a_phone_rate_recording_at_the_models_rate(tmp_path):
    """A 44.1 kHz recording of two tones, read with ``resample: true`` for a 16 kHz model, gives the same tones
    sampled at 16 kHz (computed, not resampled) to within int16 rounding, away from the file's two ends."""
    def tones(rate: int, seconds: float) -> np.ndarray:
        times = np.arange(round(rate * seconds)) / rate
        return 0.4 * np.sin(2 * np.pi * 440 * times) + 0.2 * np.sin(2 * np.pi * 2500 * times + 1)

    _write(tmp_path / "phone.wav", tones(44100, 1.0), rate=44100)
    dataset = open_calibration_data(tmp_path, [SPEC], preprocessing={"audio": {"resample": True}})
    assert len(dataset) == 16000 // WINDOW
    assert "1 .wav file(s) at 44100 Hz resampled to 16000 Hz" in dataset.notes
    read = np.concatenate([dataset.sample(index)["input"][0] for index in range(len(dataset))])
    middle = slice(WINDOW, len(read) - WINDOW)
    # band-limited: 1.6e-5 here; linear interpolation would be 3.4e-3 off
    np.testing.assert_allclose(read[middle], tones(16000, 1.0)[:len(read)][middle], atol=1e-4)


def test_recordings_are_refused_for_inputs_they_cannot_feed(tmp_path, recordings):
    image = InputSpec("image", (1, 3, 32, 32), np.dtype(np.float32), "NCHW")
    with pytest.raises(CalibrationError, match="which .wav recordings cannot feed"):
        open_calibration_data(LIBRIVOX, [image])
    with pytest.raises(CalibrationError, match=r"recordings feed a model with one waveform input; this model has 2 "
                                               r"inputs \(input, state\)"):
        open_calibration_data(recordings[0], [SPEC, InputSpec("state", (2, 1, 128), np.dtype(np.float32), "")])
    _write(tmp_path / "click.wav", np.zeros(100, np.float32))
    with pytest.raises(CalibrationError, match=r"shorter than one window .* click\.wav \(100 samples\)"):
        open_calibration_data(tmp_path, [SPEC])


def test_a_damaged_wav_among_good_ones_is_named(tmp_path, recordings):
    (tmp_path / "good.wav").write_bytes(recordings[0].read_bytes())
    (tmp_path / "cut.wav").write_bytes(recordings[1].read_bytes()[:5000])
    (tmp_path / "notes.wav").write_bytes(b"not audio")
    with pytest.raises(CalibrationError, match="2 calibration file\\(s\\) cannot be read as .wav recordings: "
                                               "cut.wav: .*truncated; notes.wav: not a PCM .wav file"):
        open_calibration_data(tmp_path, [SPEC])


def waveform_model(path: Path, length: int) -> Path:
    """A small real-valued waveform model: a frame energy per 64 samples through a MatMul and a ReLU."""
    weights = np.random.default_rng(0).standard_normal((length, 8)).astype(np.float32) / np.sqrt(length)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["mm"]), helper.make_node("Relu", ["mm"], ["output"])], "wave",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, length])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor("w", TensorProto.FLOAT, weights.shape, weights.reshape(-1).tolist())])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_compile_and_try_read_recordings_with_the_mxqs_audio_settings(tmp_path, recordings):
    """``preprocessing.audio`` counts without ``preprocessing.apply`` (which is about the image pipeline): compile
    calibrated on [-1, 1) and Try fed [-1, 1) when the config said int16 values."""
    from compiler_core.api import mxq_compile
    from compiler_core.runtime.artifact import load_artifact
    from compiler_core.runtime.inputs import load_run_inputs

    model = waveform_model(tmp_path / "wave.onnx", 1600)
    result = mxq_compile(str(model), "aries-rb", str(LIBRIVOX), tmp_path / "wave.mxq",
                         preprocessing_config={"audio": {"fullScale": 32768}})
    artifact = load_artifact(result.mxq_path)
    scale = artifact.summary()["inputs"][0]["scale"]
    assert np.max(scale) > 10  # int8 steps of int16 values, not of [-1, 1)
    samples = [feeds["input"] for _, feeds in load_run_inputs(artifact, [str(recordings[-1])])]
    assert len(samples) == len(_samples(recordings[-1])) // 1600 and np.abs(samples[0]).max() > 100


def test_qbcompiler_run_on_a_recording_saves_each_windows_outputs(tmp_path, recordings):
    """``run --input speech.wav --output-dir out/`` wrote every window's outputs to one file, each over the last."""
    from compiler_core.api import mxq_compile
    from compiler_core.cli import run

    model = waveform_model(tmp_path / "wave.onnx", 1600)
    mxq_compile(str(model), "aries-rb", str(LIBRIVOX), tmp_path / "wave.mxq")
    assert run(["run", "--mxq", str(tmp_path / "wave.mxq"), "--input", str(recordings[1]), "--output-dir",
          str(tmp_path / "out")]) == 0
    windows = len(_samples(recordings[1])) // 1600
    assert len(list((tmp_path / "out").glob("*.npy"))) == windows == 29
    assert (tmp_path / "out" / f"{recordings[1].stem}@1600.output.npy").is_file()
