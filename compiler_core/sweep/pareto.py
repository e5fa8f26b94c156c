"""The Pareto front of sweep points: the points no other point beats on both accuracy and latency."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

logger = logging.getLogger(__name__)


def pareto_front(accuracy: Sequence[float | None], latency: Sequence[float | None]) -> list[int]:
    """Indices of the non-dominated points, higher accuracy and lower latency being better.

    A point is dominated when another point is at least as accurate and at least as fast, and
    strictly better in one of the two. Points with a missing or non-finite value are never on the
    front. Exact duplicates are both kept (neither dominates the other).

    Args:
        accuracy: One value per point (e.g. the worst output SQNR in dB, or top-1 agreement).
        latency: One value per point (e.g. the estimated latency in ms), same length.

    Returns:
        The front's indices, in ascending latency (then descending accuracy).

    Raises:
        ValueError: the two sequences differ in length.
    """
    if len(accuracy) != len(latency):
        raise ValueError(f"{len(accuracy)} accuracy values but {len(latency)} latency values")
    valid = [i for i in range(len(accuracy)) if _finite(accuracy[i]) and _finite(latency[i])]
    ordered = sorted(valid, key=lambda i: (latency[i], -accuracy[i]))
    front: list[int] = []
    best = -math.inf
    for index in ordered:
        if accuracy[index] > best or _same(index, front, accuracy, latency):
            front.append(index)
            best = max(best, accuracy[index])
    return front


def _same(index: int, front: list[int], accuracy: Sequence, latency: Sequence) -> bool:
    """True when ``index`` duplicates the last point on the front (equal on both axes)."""
    return bool(front) and accuracy[front[-1]] == accuracy[index] and latency[front[-1]] == latency[index]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
