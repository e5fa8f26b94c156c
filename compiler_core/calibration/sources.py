"""Lazy sources of one input of one sample: a .npy file, an image through a pipeline, or random data."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from compiler_core.calibration.preprocess import preprocess_image
from compiler_core.calibration.specs import InputSpec
from compiler_core.config import PreprocessOp
from compiler_core.fileio import sha256_file

RANDOM_INT_HIGH = 100
"""Random integer inputs are drawn from [0, RANDOM_INT_HIGH)."""

_CONTENT_HASHES: dict[tuple[str, int, int], str] = {}
"""sha256 of files already hashed, keyed by (absolute path, size, mtime in ns)."""


def content_hash(path: Path) -> str:
    """sha256 of a file's bytes, remembered per (path, size, mtime) for this process."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _CONTENT_HASHES:
        _CONTENT_HASHES[key] = sha256_file(path)
    return _CONTENT_HASHES[key]


def relative_name(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` in POSIX spelling (the file name alone when unrelated)."""
    try:
        return Path(os.path.relpath(path, root)).as_posix()
    except ValueError:  # another drive on Windows
        return path.name


class Source(Protocol):
    """One input of one sample, loaded on demand."""

    spec: InputSpec

    def load(self) -> np.ndarray:
        """The array, exactly ``spec.shape`` and ``spec.dtype``."""

    def describe(self) -> str:
        """Where the data comes from, for messages and ``CalibrationDataset.sources``."""

    def token(self) -> str:
        """What identifies the content, for the dataset fingerprint."""


@dataclass(frozen=True)
class FileSource:
    """Shared part of file-backed sources: the file and the folder its name is relative to."""

    spec: InputSpec
    path: Path
    root: Path

    def describe(self) -> str:
        """The file path."""
        return str(self.path)

    def token(self) -> str:
        """Relative name, size and sha256 of the file."""
        return f"{relative_name(self.path, self.root)}\t{self.path.stat().st_size}\t{content_hash(self.path)}"


@dataclass(frozen=True)
class NpySource(FileSource):
    """A ``.npy`` file; ``axes`` transposes its last three dimensions (HWC <-> CHW) when set."""

    axes: tuple[int, ...] | None = None

    def token(self) -> str:
        """As a file's, and the codes it is read as (the same file gives other values as a quantized input's codes)."""
        return super().token() + (f"\tcodes {self.spec.codes}" if self.spec.codes is not None else "")

    def load(self) -> np.ndarray:
        """The file's array (a quantized source input's codes dequantized), transposed if needed, reshaped to the
        input shape and cast to its dtype."""
        array = self.spec.real_values(np.load(self.path, allow_pickle=False))
        if self.axes is not None:
            array = array.reshape(array.shape[-3:]).transpose(self.axes)
        return np.ascontiguousarray(array.reshape(self.spec.shape), dtype=self.spec.dtype)


@dataclass(frozen=True)
class ImageSource(FileSource):
    """An image decoded with ``channels`` channels and run through ``pipeline``.

    ``axes`` transposes the pipeline's output to the model's layout when set.
    """

    pipeline: tuple[PreprocessOp, ...] = ()
    channels: int = 3
    axes: tuple[int, ...] | None = None

    def load(self) -> np.ndarray:
        """The preprocessed image with the batch dimension, cast to the input dtype."""
        array = preprocess_image(self.path, self.pipeline, self.channels)
        if self.axes is not None:
            array = array.transpose(self.axes)
        return np.ascontiguousarray(array.reshape(self.spec.shape), dtype=self.spec.dtype)


@dataclass(frozen=True)
class RandomSource:
    """Seeded random data: standard normal for float inputs, integers in [0, 100) otherwise."""

    spec: InputSpec
    seed: int
    index: int

    def load(self) -> np.ndarray:
        """The same array for the same (seed, index, input)."""
        rng = np.random.default_rng([self.seed, self.index, _stable_id(self.spec.name)])
        if np.issubdtype(self.spec.dtype, np.floating):
            return rng.standard_normal(self.spec.shape).astype(self.spec.dtype)
        high = 2 if self.spec.dtype == np.bool_ else RANDOM_INT_HIGH
        return rng.integers(0, high, self.spec.shape).astype(self.spec.dtype)

    def describe(self) -> str:
        """``random:<seed>#<index>``."""
        return f"random:{self.seed}#{self.index}"

    def token(self) -> str:
        """Same as :meth:`describe`."""
        return self.describe()


def _stable_id(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


@dataclass(frozen=True)
class Sample:
    """One calibration sample: one source per model input, in input order."""

    sources: tuple[Source, ...]

    def describe(self) -> str:
        """The file(s) of the sample, joined by ``", "``."""
        return ", ".join(source.describe() for source in self.sources)

    def label(self) -> str:
        """A short name for tables: the first file's name, and how many more files a multi-input sample has."""
        first = Path(self.sources[0].describe()).name if self.sources else ""
        return first if len(self.sources) < 2 else f"{first} + {len(self.sources) - 1} more"

    def tokens(self) -> list[str]:
        """Fingerprint tokens of every source."""
        return [source.token() for source in self.sources]

    def roots(self) -> list[Path]:
        """Folders the sample's files were listed from."""
        return [source.root for source in self.sources if isinstance(source, FileSource)]

    @classmethod
    def of(cls, sources: Sequence[Source]) -> Sample:
        """A sample from a sequence of sources."""
        return cls(tuple(sources))
