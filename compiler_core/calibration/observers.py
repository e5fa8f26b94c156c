"""Observers: the float range ``(lo, hi)`` to quantize a tensor to, chosen from its statistics by mode.

One registry, :data:`OBSERVERS`, keyed by mode name (``max``, ``max_percentile``, ``histogram``,
``mse``; config modes 0-3 map to them in that order). Every observer has the signature
``(stats, *, symmetric, bits, percentile, topk_ratio) -> (lo, hi)`` and reads only the
:class:`~compiler_core.calibration.statistics.TensorStats`, so switching modes never reruns the model.

Every result satisfies ``lo <= 0 <= hi`` (zero must be exactly representable), ``hi - lo >=``
:data:`MIN_RANGE` (constant tensors get a tiny range) and finite values. ``symmetric=True`` (calibration
methods 0/1) gives ``(-a, a)``; ``symmetric=False`` (methods 2/3, with a zero point) gives independent
ends, with ``lo = 0`` for non-negative tensors (after ReLU) and ``hi = 0`` for non-positive ones.

Histogram-based observers read the ``[-R, R)`` histogram of the statistics; folded around zero, it is a
histogram of |x| with ``bins / 2`` bins of width ``w = 2R / bins``, and thresholds are bin edges capped
at the observed max |x|.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from compiler_core.calibration.statistics import MIN_HISTOGRAM_RANGE, StatisticsSet, TensorStats
from compiler_core.errors import ArgumentError, InternalError

logger = logging.getLogger(__name__)

MIN_RANGE = MIN_HISTOGRAM_RANGE
"""Smallest ``hi - lo`` returned; a constant tensor is widened to this (2^-20)."""

MODE_NAMES = ("max", "max_percentile", "histogram", "mse")
"""Observer names in the order of ``calibration.mode`` 0-3."""

_KL_EMPTY_PROBABILITY = 1e-12  # stands in for q = 0 where p > 0, so KL stays finite but large


class Observer(Protocol):
    """Signature shared by every entry of :data:`OBSERVERS`."""

    def __call__(self, stats: TensorStats, *, symmetric: bool, bits: int, percentile: float,
                 topk_ratio: float) -> tuple[float, float]: ...


# ---------------------------------------------------------------------------------------------------
# max


def max_observer(stats: TensorStats, *, symmetric: bool = True, bits: int = 8, percentile: float = 0.9999,
                 topk_ratio: float = 0.01) -> tuple[float, float]:
    """The observed range: ``[min, max]``, or ``[-a, a]`` with ``a = max |x|`` when symmetric."""
    return _finish(stats.min, stats.max, symmetric)


# ---------------------------------------------------------------------------------------------------
# max_percentile


def max_percentile_observer(stats: TensorStats, *, symmetric: bool = True, bits: int = 8,
                            percentile: float = 0.9999, topk_ratio: float = 0.01) -> tuple[float, float]:
    """Clip at a histogram percentile, bounded above by a robust max and below by a floor.

    Per side (|x| when symmetric; x >= 0 and x <= 0 otherwise), with ``N`` samples:

    1. ``p`` = the ``percentile`` quantile of |x| (symmetric), or the ``percentile`` and
       ``1 - percentile`` quantiles of x (asymmetric), read from the histogram (linear within a bin).
       This clips rare extreme *elements*.
    2. ``robust`` = the mean of the ``max(1, ceil(topk_ratio * N))`` largest per-sample max |x|.
       This clips rare extreme *samples*: with the default 0.01 and fewer than 100 samples it is the
       plain max, so only ``p`` acts.
    3. ``floor`` = half the median per-sample max |x|. A quantile far below what a typical sample
       reaches means the distribution is mostly a point mass (exact zeros after ReLU, padding, masks),
       not a long tail; clipping there would saturate the signal of most samples.

    The clip value is ``max(min(p, robust), floor)``, then at most the observed extreme of that side;
    a ``p`` within one histogram bin of that extreme is taken as the extreme (no clipping finer than
    the histogram can resolve, so a constant tensor keeps its value).
    ``floor <= robust`` always holds (half the values are at least the median), so the rule is
    well defined.
    """
    _check_fraction("percentile", percentile, allow_zero=False)
    _check_fraction("topk_ratio", topk_ratio, allow_zero=True)
    robust, floor = _robust_max(stats, topk_ratio), 0.5 * float(np.median(stats.sample_absmax))
    width = stats.bin_width
    if symmetric:
        clip = _bounded(_snap(_abs_quantile(stats, percentile), stats.absmax, width), robust, floor)
        return _finish(-clip, clip, True)
    hi = _snap(_signed_quantile(stats, percentile), stats.max, width)
    lo = -_snap(-_signed_quantile(stats, 1.0 - percentile), -stats.min, width)
    hi = _bounded(hi, robust, floor) if stats.max > 0 else 0.0
    lo = -_bounded(-lo, robust, floor) if stats.min < 0 else 0.0
    return _finish(max(lo, stats.min), min(hi, stats.max), False)


def _robust_max(stats: TensorStats, topk_ratio: float) -> float:
    top = max(1, math.ceil(topk_ratio * stats.num_samples))
    return float(np.sort(stats.sample_absmax)[-top:].mean())


def _snap(value: float, extreme: float, width: float) -> float:
    """The extreme itself when ``value`` is within one bin of it: the histogram cannot resolve a finer clip."""
    return extreme if value >= extreme - width else value


def _bounded(value: float, robust: float, floor: float) -> float:
    return max(min(value, robust), floor)


def _abs_quantile(stats: TensorStats, quantile: float) -> float:
    return min(_quantile(_abs_histogram(stats), quantile) * stats.bin_width, stats.absmax)


def _signed_quantile(stats: TensorStats, quantile: float) -> float:
    return -stats.hist_range + _quantile(stats.histogram, quantile) * stats.bin_width


def _quantile(counts: np.ndarray, quantile: float) -> float:
    """The ``quantile`` position, in bins from the histogram's left edge, interpolating within a bin."""
    cumulative = np.cumsum(counts)
    target = quantile * cumulative[-1]
    index = int(np.searchsorted(cumulative, target, side="left"))
    index = min(index, counts.size - 1)
    before = cumulative[index - 1] if index > 0 else 0
    inside = counts[index]
    return index + (float(target - before) / inside if inside else 1.0)


# ---------------------------------------------------------------------------------------------------
# histogram (KL divergence, TensorRT entropy calibration)


def histogram_observer(stats: TensorStats, *, symmetric: bool = True, bits: int = 8,
                       percentile: float = 0.9999, topk_ratio: float = 0.01) -> tuple[float, float]:
    """The threshold whose 2^(bits-1)-level quantization keeps the histogram closest in KL divergence.

    As TensorRT's entropy calibration: for every candidate threshold ``i`` bins (from the number of
    levels to the last non-empty bin), ``P`` is the |x| histogram cut at ``i`` with the clipped mass
    added to its last bin, ``Q`` is ``bins[:i]`` merged into the levels and spread back uniformly over
    the non-empty bins of each level; the ``i`` with the smallest ``KL(P || Q)`` wins. Like TensorRT the
    first bin is replaced by the second, so a spike of exact zeros does not dominate the search.

    Asymmetric: a non-negative (non-positive) tensor searches its one side with 2^bits levels; a
    mixed-sign tensor searches each side independently with 2^(bits-1) levels.
    """
    _check_bits(bits)
    width = stats.bin_width
    if symmetric:
        clip = min(_kl_threshold_bins(_abs_histogram(stats), 2 ** (bits - 1)) * width, stats.absmax)
        return _finish(-clip, clip, True)
    positive, negative = _sides(stats)
    levels = 2 ** bits if stats.min >= 0 or stats.max <= 0 else 2 ** (bits - 1)
    hi = min(_kl_threshold_bins(positive, levels) * width, stats.max) if stats.max > 0 else 0.0
    lo = max(-_kl_threshold_bins(negative, levels) * width, stats.min) if stats.min < 0 else 0.0
    return _finish(lo, hi, False)


def _kl_threshold_bins(counts: np.ndarray, levels: int) -> int:
    """Number of bins ``i`` (threshold ``i * w``) minimising KL(P || Q); vectorised over every candidate."""
    nonzero = np.flatnonzero(counts)
    if nonzero.size == 0:
        return 1
    used = int(nonzero[-1]) + 1
    if used <= levels:
        return used
    counts = counts[:used].astype(np.float64)
    counts[0] = counts[1]
    candidates = np.arange(levels, used + 1)
    return int(candidates[np.argmin(_kl_divergences(counts, candidates, levels))])


def _kl_divergences(counts: np.ndarray, candidates: np.ndarray, levels: int) -> np.ndarray:
    """KL(P || Q) for every candidate, from prefix sums (O(candidates * levels), no per-bin matrices).

    With p_j = P_j / sum(P) and q_j = Q_j / sum(Q): KL = sum_j p_j log p_j - sum_j p_j log q_j. Q is
    constant over the non-empty bins of a level, so the second sum is a sum over levels of the level's
    P mass times log of its q value; bin ``i - 1`` (which also carries the clipped mass) is kept apart.
    """
    prefix = np.concatenate([[0.0], np.cumsum(counts)])
    prefix_nonzero = np.concatenate([[0], np.cumsum(counts > 0)])
    prefix_xlogx = np.concatenate([[0.0], np.cumsum(_xlogx(counts))])
    total = prefix[-1]
    last = candidates - 1
    last_count = counts[last]
    last_p = (last_count + total - prefix[candidates]) / total
    entropy_part = (prefix_xlogx[last] - prefix[last] * math.log(total)) / total + _xlogx(last_p)
    level_mass, level_q = _levels(prefix, prefix_nonzero, candidates, levels)
    level_mass[:, -1] -= last_count  # bin i-1 is accounted for separately below
    cross = np.sum(np.where(level_mass > 0, level_mass * np.log(np.maximum(level_q, _KL_EMPTY_PROBABILITY)), 0.0),
                   axis=1) / total
    last_q = np.where(last_count > 0, level_q[:, -1], _KL_EMPTY_PROBABILITY)
    return entropy_part - cross - last_p * np.log(last_q)


def _levels(prefix: np.ndarray, prefix_nonzero: np.ndarray, candidates: np.ndarray,
            levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate and level: the raw count mass and the normalised Q value of its non-empty bins."""
    merged = (candidates // levels)[:, None]
    starts = merged * np.arange(levels)[None, :]
    ends = starts + merged
    ends[:, -1] = candidates  # the last level takes the remainder, as in TensorRT
    mass = prefix[ends] - prefix[starts]
    occupied = prefix_nonzero[ends] - prefix_nonzero[starts]
    q_total = prefix[candidates][:, None]
    q_value = np.divide(mass, occupied * q_total, out=np.zeros_like(mass), where=occupied > 0)
    return mass, q_value


def _xlogx(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return np.where(values > 0, values * np.log(np.maximum(values, 1e-300)), 0.0)


# ---------------------------------------------------------------------------------------------------
# mse


def mse_observer(stats: TensorStats, *, symmetric: bool = True, bits: int = 8, percentile: float = 0.9999,
                 topk_ratio: float = 0.01) -> tuple[float, float]:
    """The clip value minimising the expected quantization MSE estimated from the histogram.

    For a threshold ``t`` with step ``s`` (``t / (2^(bits-1) - 1)`` symmetric, ``t / (2^bits - 1)`` for a
    one-sided asymmetric tensor), a bin with centre ``c`` of |x| costs ``(c - t)^2`` per element if
    ``c > t`` (clipping), ``c^2`` if ``c < s / 2`` (rounds to zero) and ``s^2 / 12`` otherwise
    (uniform rounding error). Every bin edge is a candidate; prefix sums make the search O(bins).
    A result within one bin of the extreme is the extreme (bin centres cannot resolve finer).

    Asymmetric mixed-sign tensors scale ``[min, max]`` by a common factor in (0, 1] (512 candidates),
    with step ``(hi - lo) / (2^bits - 1)``.
    """
    _check_bits(bits)
    if symmetric:
        clip = _mse_threshold(_abs_histogram(stats), stats.bin_width, 2 ** (bits - 1) - 1, stats.absmax)
        return _finish(-clip, clip, True)
    positive, negative = _sides(stats)
    steps = 2 ** bits - 1
    if stats.min >= 0:
        return _finish(0.0, _mse_threshold(positive, stats.bin_width, steps, stats.max), False)
    if stats.max <= 0:
        return _finish(-_mse_threshold(negative, stats.bin_width, steps, -stats.min), 0.0, False)
    return _finish(*_mse_scaled_range(stats, steps), False)


def _mse_threshold(counts: np.ndarray, width: float, steps: int, extreme: float) -> float:
    nonzero = np.flatnonzero(counts)
    if nonzero.size == 0:
        return extreme
    used = int(nonzero[-1]) + 1
    counts = counts[:used].astype(np.float64)
    centres = (np.arange(used) + 0.5) * width
    thresholds = np.minimum(np.arange(1, used + 1) * width, extreme)
    errors = _mse_errors(counts, centres, thresholds, thresholds / steps)
    return _snap(float(thresholds[np.argmin(errors)]), extreme, width)


def _mse_errors(counts: np.ndarray, magnitudes: np.ndarray, thresholds: np.ndarray,
                step: np.ndarray) -> np.ndarray:
    """Expected total squared error of one side (sorted ``magnitudes``) for every threshold."""
    prefix_n = np.concatenate([[0.0], np.cumsum(counts)])
    prefix_c = np.concatenate([[0.0], np.cumsum(counts * magnitudes)])
    prefix_c2 = np.concatenate([[0.0], np.cumsum(counts * magnitudes ** 2)])
    inside = np.searchsorted(magnitudes, thresholds, side="right")
    tiny = np.minimum(np.searchsorted(magnitudes, step / 2, side="left"), inside)
    clipped_n, clipped_c = prefix_n[-1] - prefix_n[inside], prefix_c[-1] - prefix_c[inside]
    clipping = (prefix_c2[-1] - prefix_c2[inside]) - 2 * thresholds * clipped_c + thresholds ** 2 * clipped_n
    rounding = prefix_c2[tiny] + (prefix_n[inside] - prefix_n[tiny]) * step ** 2 / 12
    return clipping + rounding


def _mse_scaled_range(stats: TensorStats, steps: int, candidates: int = 512) -> tuple[float, float]:
    half = stats.bins // 2
    centres = (np.arange(stats.bins) - half + 0.5) * stats.bin_width
    counts = stats.histogram.astype(np.float64)
    scale = np.arange(1, candidates + 1) / candidates
    lo, hi = scale * stats.min, scale * stats.max
    step = (hi - lo) / steps
    positive = _mse_errors(counts[half:], centres[half:], hi, step)
    negative = _mse_errors(counts[:half][::-1], -centres[:half][::-1], -lo, step)
    best = int(np.argmin(positive + negative))
    return float(lo[best]), float(hi[best])


# ---------------------------------------------------------------------------------------------------
# shared helpers


def _abs_histogram(stats: TensorStats) -> np.ndarray:
    positive, negative = _sides(stats)
    return positive + negative


def _sides(stats: TensorStats) -> tuple[np.ndarray, np.ndarray]:
    """Counts of x >= 0 and of x < 0, each indexed by |x| bin (bin k covers |x| in [k w, (k+1) w])."""
    half = stats.bins // 2
    return stats.histogram[half:], stats.histogram[:half][::-1]


def _finish(lo: float, hi: float, symmetric: bool) -> tuple[float, float]:
    """Enforce ``lo <= 0 <= hi``, symmetry, a minimum width and finiteness."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise InternalError(f"Observer produced a non-finite range ({lo}, {hi}).",
                            hint="Please report this with the model.")
    if symmetric:
        magnitude = max(-lo, hi, MIN_RANGE / 2)
        return -magnitude, magnitude
    if hi - lo < MIN_RANGE:
        return (lo, lo + MIN_RANGE) if hi > 0 or lo == 0 else (hi - MIN_RANGE, hi)
    return lo, hi


def _check_bits(bits: int) -> None:
    if not 2 <= bits <= 16:
        raise ArgumentError(f"Activation bits must be between 2 and 16, got {bits}.")


def _check_fraction(name: str, value: float, *, allow_zero: bool) -> None:
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value <= 1):
        raise ArgumentError(f"{name} must be in {'[0, 1]' if allow_zero else '(0, 1]'}, got {value}.",
                            hint="Percentiles are fractions here: 0.9999, not 99.99.")


# ---------------------------------------------------------------------------------------------------
# registry and entry points


OBSERVERS: dict[str, Observer] = {
    "max": max_observer,
    "max_percentile": max_percentile_observer,
    "histogram": histogram_observer,
    "mse": mse_observer,
}


def mode_name(mode: str | int) -> str:
    """The :data:`OBSERVERS` key for a mode name, a ``CalibrationMode`` or its number 0-3."""
    if isinstance(mode, str) and mode in OBSERVERS:
        return mode
    if isinstance(mode, int) and 0 <= int(mode) < len(MODE_NAMES):
        return MODE_NAMES[int(mode)]
    raise ArgumentError(f"Unknown calibration mode {mode!r}.",
                        hint=f"Use one of {', '.join(OBSERVERS)} or 0-{len(MODE_NAMES) - 1}.")


def observe(stats: TensorStats, mode: str | int = "max", *, symmetric: bool = True, bits: int = 8,
            percentile: float = 0.9999, topk_ratio: float = 0.01) -> tuple[float, float]:
    """The ``(lo, hi)`` range of one tensor under ``mode`` (see :data:`OBSERVERS`)."""
    observer: Callable[..., tuple[float, float]] = OBSERVERS[mode_name(mode)]
    return observer(stats, symmetric=symmetric, bits=bits, percentile=percentile, topk_ratio=topk_ratio)


def observe_all(stats_set: StatisticsSet | Mapping[str, TensorStats], mode: str | int = "max", *,
                symmetric: bool = True, bits: int = 8, percentile: float = 0.9999,
                topk_ratio: float = 0.01) -> dict[str, tuple[float, float]]:
    """``{tensor name: (lo, hi)}`` for every tensor of ``stats_set`` under ``mode``."""
    tensors = stats_set.tensors if isinstance(stats_set, StatisticsSet) else stats_set
    name = mode_name(mode)
    return {tensor: observe(stats, name, symmetric=symmetric, bits=bits, percentile=percentile,
                            topk_ratio=topk_ratio) for tensor, stats in tensors.items()}
