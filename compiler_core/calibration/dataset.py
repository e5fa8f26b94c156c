"""CalibrationDataset: an ordered, lazily loaded list of samples that fit the model inputs exactly."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler_core.calibration.sources import Sample, Source
from compiler_core.calibration.specs import InputSpec
from compiler_core.errors import ArgumentError, CalibrationError

logger = logging.getLogger(__name__)


@dataclass
class CalibrationDataset:
    """Ordered calibration samples, each loaded from disk only when asked for.

    Build one with :func:`~compiler_core.calibration.open_calibration_data`, which validates every
    file first; loading a sample then only fails if a file changes on disk in between.

    Attributes:
        inputs: The model inputs every sample provides.
        samples: One :class:`~compiler_core.calibration.sources.Sample` per sample, in order.
        kind: The form the data came in (``images``, ``npy``, ``txt``, ``manifest``, ``random``,
            or several joined by ``+``).
        settings: What else decides the sample values (effective pipeline, channels, seed);
            part of the fingerprint.
        notes: Conversions applied on the way (shown by :meth:`describe`).
    """

    inputs: list[InputSpec]
    samples: list[Sample]
    kind: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return (self.sample(index) for index in range(len(self)))

    @property
    def sources(self) -> list[str]:
        """One string per sample: its file path (several joined by ``", "`` for multi-input samples)."""
        return [sample.describe() for sample in self.samples]

    def sample(self, index: int) -> dict[str, np.ndarray]:
        """Load sample ``index``: input name -> array of exactly that input's shape and dtype."""
        return {source.spec.name: _load(source) for source in self.samples[index].sources}

    def split(self, holdout: int, seed: int = 0) -> tuple[CalibrationDataset, CalibrationDataset]:
        """Split into (calibration part, held-out part), disjoint and the same for the same seed.

        The held-out samples are drawn at random with ``seed``; both parts keep the original order.

        Raises:
            ArgumentError: ``holdout`` is negative.
            CalibrationError: ``holdout`` leaves no sample for calibration.
        """
        if holdout < 0:
            raise ArgumentError(f"holdout must be 0 or more, got {holdout}.")
        if holdout >= len(self) and holdout:
            raise CalibrationError(
                f"Cannot hold out {holdout} of {len(self)} calibration samples: none would be left.",
                hint="Lower analysis_holdout or add calibration data.")
        chosen = set(np.random.default_rng(seed).permutation(len(self))[:holdout].tolist())
        kept = [s for i, s in enumerate(self.samples) if i not in chosen]
        held = [s for i, s in enumerate(self.samples) if i in chosen]
        return self._with_samples(kept), self._with_samples(held)

    def _with_samples(self, samples: list[Sample]) -> CalibrationDataset:
        return CalibrationDataset(self.inputs, samples, self.kind, dict(self.settings), list(self.notes))

    @property
    def fingerprint(self) -> str:
        """sha256 over every file's relative name, size and content, the settings and the inputs.

        Stable while nothing changes (moving the whole data folder keeps it); changes when a file's
        bytes, the order or set of files, the preprocessing or the model inputs change.
        """
        digest = hashlib.sha256()
        header = {"inputs": [spec.to_dict() for spec in self.inputs], "settings": self.settings}
        digest.update(json.dumps(header, sort_keys=True, default=str).encode())
        for sample in self.samples:
            for token in _tokens(sample):
                digest.update(token.encode() + b"\n")
        return digest.hexdigest()

    def describe(self) -> dict[str, Any]:
        """Plain dict for the CLI, the GUI and logs: form, count, inputs, roots, settings, notes."""
        roots = sorted({str(root) for sample in self.samples for root in sample.roots()})
        return {"kind": self.kind, "samples": len(self), "inputs": [spec.to_dict() for spec in self.inputs],
                "roots": roots, "settings": self.settings, "notes": list(self.notes),
                "first_sources": self.sources[:5]}


def _load(source: Source) -> np.ndarray:
    try:
        return source.load()
    except (OSError, SyntaxError, ValueError) as error:  # the file changed or vanished after the checks
        raise CalibrationError(f"Cannot load calibration sample '{source.describe()}': {error}.",
                               hint="Calibration files must not change while compiling; open the data again.",
                               file=source.describe()) from error


def _tokens(sample: Sample) -> list[str]:
    try:
        return sample.tokens()
    except OSError as error:
        raise CalibrationError(f"Calibration file '{error.filename}' vanished: {error.strerror}.",
                               hint="Calibration files must not change while compiling; open the data again.",
                               file=str(error.filename)) from error
