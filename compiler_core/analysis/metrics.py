"""Accuracy metrics of a quantized model against its FP32 reference, accumulated over samples.

Everything returns plain, JSON-serialisable dicts. SQNR is ``10 log10(sum(ref^2) / sum((ref - q)^2))``
over all elements of all samples; cosine is computed per sample and averaged; top-k agreement
compares the reference's top-1 class with the quantized top-1 / top-5 (classifier outputs only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

WARN_SQNR_DB = 20.0
FLAG_SQNR_DB = 10.0


@dataclass
class TensorComparison:
    """Running comparison of one tensor over samples."""

    signal: float = 0.0
    noise: float = 0.0
    max_abs_error: float = 0.0
    cosines: list[float] = field(default_factory=list)
    top1: int = 0
    top5: int = 0
    samples: int = 0

    def add(self, reference: np.ndarray, quantized: np.ndarray, classifier: bool = False) -> None:
        """Accumulate one sample."""
        ref = np.asarray(reference, dtype=np.float64).ravel()
        test = np.asarray(quantized, dtype=np.float64).ravel()
        error = ref - test
        signal = ref @ ref
        self.signal += float(signal)
        self.noise += float(error @ error)
        self.max_abs_error = max(self.max_abs_error, float(max(error.max(), -error.min())) if error.size else 0.0)
        self.cosines.append(cosine(ref, test, first_squared=signal))
        self.samples += 1
        if classifier:
            expected = int(np.argmax(ref))
            order = np.argsort(-test)
            self.top1 += int(order[0] == expected)
            self.top5 += int(expected in order[:5])

    def to_dict(self, classifier: bool = False) -> dict:
        """Summary: SQNR (dB), mean/min cosine, max abs error, top-k agreement, verdict."""
        sqnr = sqnr_db(self.signal, self.noise)
        result = {"sqnr_db": _finite(sqnr), "cosine_mean": float(np.mean(self.cosines)) if self.cosines else None,
                  "cosine_min": float(np.min(self.cosines)) if self.cosines else None,
                  "max_abs_error": self.max_abs_error, "samples": self.samples, "verdict": verdict(sqnr)}
        if classifier and self.samples:
            result.update(top1_agreement=self.top1 / self.samples, top5_agreement=self.top5 / self.samples)
        return result


def sqnr_db(signal: float, noise: float) -> float:
    """Signal-to-quantization-noise ratio in dB (``inf`` for a perfect match)."""
    if noise <= 0:
        return math.inf
    if signal <= 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def cosine(first: np.ndarray, second: np.ndarray, first_squared: float | None = None) -> float:
    """Cosine similarity of 1-D float64 arrays; 1.0 when both are all-zero.

    ``first_squared``: ``first @ first`` when the caller has it already (saves one pass over ``first``).
    """
    first_squared = first @ first if first_squared is None else first_squared
    norm = float(np.sqrt(first_squared) * np.sqrt(second @ second))  # = norm(first) * norm(second), bit for bit
    if norm == 0:
        return 1.0 if not np.any(first) and not np.any(second) else 0.0
    return float(first @ second) / norm


def verdict(sqnr: float, warn_db: float = WARN_SQNR_DB, flag_db: float = FLAG_SQNR_DB) -> str:
    """``ok``, ``warn`` (below ``warn_db``) or ``flag`` (below ``flag_db``)."""
    if sqnr < flag_db:
        return "flag"
    return "warn" if sqnr < warn_db else "ok"


def is_classifier_output(shape: list[int]) -> bool:
    """A ``[1, C]`` output with at least 10 classes is treated as classifier logits."""
    return len(shape) == 2 and shape[0] == 1 and shape[1] >= 10


def _finite(value: float) -> float | None:
    """JSON has no infinities: ``inf`` SQNR (exact match) is reported as 999.0."""
    if math.isinf(value):
        return 999.0 if value > 0 else -999.0
    return value
