"""Recordings as calibration data: PCM ``.wav`` files cut into windows of a waveform input's length.

A model whose input is a waveform ([1, N], [1, 1, N], [1, N, 1] or [N], float) takes a folder of ``.wav`` files: each
file is mixed to mono and cut into consecutive windows of N samples, each window one sample (the last, shorter part
of a file is left out). Files at another sample rate than ``preprocessing.audio.sampleRate`` are refused, naming the
rate found, or resampled with ``resample: true``. Read with the standard library's ``wave`` (8, 16, 24 and 32-bit
integer PCM).
"""

from __future__ import annotations

import logging
import math
import wave
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from compiler_core.calibration.sources import FileSource
from compiler_core.calibration.specs import InputSpec
from compiler_core.calibration.validate import raise_unreadable
from compiler_core.config import AudioConfig
from compiler_core.errors import CalibrationError

logger = logging.getLogger(__name__)

AUDIO_SUFFIXES = (".wav",)
"""File suffixes read as recordings (compared case-insensitively)."""

_PCM_TYPES = {1: np.uint8, 2: np.dtype("<i2"), 4: np.dtype("<i4")}
"""numpy type of each sample width; 8-bit WAV is unsigned (offset 128), 24-bit is widened to 32 bits."""


@dataclass(frozen=True)
class WavInfo:
    """What the header of a ``.wav`` file says."""

    path: Path
    rate: int
    channels: int
    sample_width: int
    frames: int

    @property
    def seconds(self) -> float:
        """Duration in seconds."""
        return self.frames / self.rate

    def frames_at(self, rate: int) -> int:
        """Samples per channel once resampled to ``rate`` (:func:`resample`)."""
        return self.frames if rate == self.rate else round(self.frames * rate / self.rate)


def wav_info(path: Path) -> WavInfo:
    """Read a ``.wav`` header.

    Raises:
        ValueError: not a PCM ``.wav`` file (the reason says what it is), or its data is shorter than its header says.
        OSError: the file cannot be read.
    """
    try:
        with wave.open(str(path), "rb") as reader:
            info = WavInfo(path, reader.getframerate(), reader.getnchannels(), reader.getsampwidth(),
                           reader.getnframes())
    except (wave.Error, EOFError) as error:
        raise ValueError(f"not a PCM .wav file ({error or 'no header'}); save it as 16-bit PCM WAV") from error
    data_bytes = info.frames * info.channels * info.sample_width
    if path.stat().st_size < data_bytes:
        raise ValueError(f"its header promises {data_bytes} bytes of audio but the file has {path.stat().st_size}: "
                         "it is truncated")
    return info


def read_wav(path: Path, rate: int | None = None) -> np.ndarray:
    """The recording as float32 mono in [-1, 1): channels averaged, integer PCM scaled by its full-scale value;
    resampled to ``rate`` when it is given and differs from the file's (:func:`resample`)."""
    stat = path.stat()
    return _read_wav_cached(str(path), stat.st_size, stat.st_mtime_ns, rate)


@lru_cache(maxsize=4)
def _read_wav_cached(path: str, size: int, mtime_ns: int, rate: int | None) -> np.ndarray:
    """Keyed by size and mtime too, so that the windows of one file (read one after the other) decode it once."""
    with wave.open(path, "rb") as reader:
        width, channels, file_rate = reader.getsampwidth(), reader.getnchannels(), reader.getframerate()
        data = reader.readframes(reader.getnframes())
    samples = _pcm_values(data, width) / float(1 << (8 * width - 1))
    mono = samples.reshape(-1, channels).mean(axis=1)
    if rate is not None and rate != file_rate:
        mono = resample(mono, file_rate, rate)
    mono = mono.astype(np.float32)
    mono.flags.writeable = False  # shared by the windows of the file
    return mono


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``samples`` at ``rate`` resampled to ``target`` Hz, band-limited: the FFT of the whole signal cut (or padded)
    at the lower Nyquist frequency, as ``scipy.signal.resample`` does; the signal is taken as periodic, which
    disturbs only its first and last milliseconds."""
    count = round(len(samples) * target / rate)
    spectrum = np.fft.rfft(samples)
    kept = min(len(spectrum), count // 2 + 1)
    return np.fft.irfft(spectrum[:kept], count) * (count / len(samples))


def _pcm_values(data: bytes, width: int) -> np.ndarray:
    if width == 3:  # 24-bit: pad each little-endian sample to 32 bits, then shift the sign back
        raw = np.frombuffer(data, np.uint8).reshape(-1, 3)
        padded = np.zeros((len(raw), 4), np.uint8)
        padded[:, 1:] = raw
        return (padded.view("<i4")[:, 0] >> 8).astype(np.float64)
    values = np.frombuffer(data, _PCM_TYPES[width]).astype(np.float64)
    return values - 128 if width == 1 else values


def window_length(spec: InputSpec) -> int:
    """Samples per window of a waveform input: its one dimension over 1; 0 when ``spec`` is no waveform input."""
    long = [size for size in spec.shape if size > 1]
    if len(long) != 1 or len(spec.shape) > 3 or not np.issubdtype(spec.dtype, np.floating):
        return 0
    return long[0]


@dataclass(frozen=True)
class AudioSource(FileSource):
    """One window of a recording: ``length`` samples from ``start`` (at ``rate`` Hz), times ``full_scale``."""

    start: int = 0
    full_scale: float = 1.0
    rate: int | None = None

    def load(self) -> np.ndarray:
        """The window in the input's shape and dtype."""
        length = math.prod(self.spec.shape)
        window = read_wav(self.path, self.rate)[self.start:self.start + length] * self.full_scale
        return np.ascontiguousarray(window.reshape(self.spec.shape), dtype=self.spec.dtype)

    def describe(self) -> str:
        """``path@start`` (samples), so that each window is named."""
        return f"{self.path}@{self.start}"

    def token(self) -> str:
        """The file's token and the window start."""
        return f"{super().token()}\t{self.start}"


def probe_wavs(paths: Sequence[Path]) -> list[WavInfo]:
    """:func:`wav_info` of every path.

    Raises:
        CalibrationError: naming every file that is no readable PCM ``.wav``, each with the reason.
    """
    infos, unreadable = [], {}
    for path in paths:
        try:
            infos.append(wav_info(path))
        except (OSError, ValueError) as error:
            unreadable[path] = str(error).rstrip(".")
    raise_unreadable(unreadable, "as .wav recordings", "Re-save them as PCM WAV (16-bit) or remove them.")
    return infos


def window_starts(infos: Sequence[WavInfo], spec: InputSpec, audio: AudioConfig) -> list[list[int]]:
    """The first sample of every window of every file, after checking the files against ``spec`` and ``audio``.

    Raises:
        CalibrationError: the input takes no waveform, files at another sample rate, or files shorter than a window.
    """
    length = _require_waveform_input(spec)
    if not audio.resample:
        _refuse_other_rates(infos, audio.sample_rate)
    rate = audio.sample_rate
    short = [info for info in infos if info.frames_at(rate) < length]
    if short:
        listed = ", ".join(f"{info.path.name} ({info.frames_at(rate)} samples)" for info in short[:5])
        raise CalibrationError(
            f"{len(short)} .wav file(s) are shorter than one window of model input '{spec.name}' ({length} samples, "
            f"{length / audio.sample_rate:.3g} s at {audio.sample_rate} Hz): {listed}.",
            hint="Give longer recordings or leave these out.", file=str(short[0].path),
            files=[str(info.path) for info in short])
    return [list(range(0, info.frames_at(rate) - length + 1, length)) for info in infos]


def _require_waveform_input(spec: InputSpec) -> int:
    length = window_length(spec)
    if not length:
        raise CalibrationError(
            f"Model input '{spec.name}' has shape {list(spec.shape)} ({spec.dtype.name}), which .wav recordings "
            "cannot feed: they feed a float waveform input with one dimension of samples, such as [1, 16000].",
            hint="Give the samples as .npy files of the input's shape (e.g. the features your front end computes).")
    return length


def _refuse_other_rates(infos: Sequence[WavInfo], expected: int) -> None:
    by_rate: dict[int, list[Path]] = defaultdict(list)
    for info in infos:
        if info.rate != expected:
            by_rate[info.rate].append(info.path)
    if not by_rate:
        return
    paths = [path for group in by_rate.values() for path in group]
    found = "; ".join(f"{rate} Hz: {', '.join(p.name for p in group[:3])}"
                      + (f" and {len(group) - 3} more" if len(group) > 3 else "") for rate, group in by_rate.items())
    raise CalibrationError(
        f"{len(paths)} .wav file(s) are not at the model's {expected} Hz (preprocessing.audio.sampleRate): {found}.",
        hint=f"Set preprocessing.audio.resample to true to resample them to {expected} Hz as they are read, or "
             f"resample the files (ffmpeg -i in.wav -ar {expected} out.wav); or set preprocessing.audio.sampleRate if "
             "the model takes another rate.",
        file=str(paths[0]), files=[str(p) for p in paths])
