"""On-disk cache of activation statistics, keyed by (MBLT sha256, dataset fingerprint, settings).

Switching the calibration mode (Max / MaxPercentile / Histogram / MSE) only re-runs an observer over
cached statistics, so it is instant; only a new MBLT, new data or new collection settings re-run
onnxruntime. Entries live in ``<cache root>/statistics/<key>.npz`` where the cache root is
``$QBCOMPILER_CACHE_DIR`` if set, else ``platformdirs.user_cache_dir("qbcompiler")``.

Size bound: the cache keeps the ``max_entries`` (default 20) most recently used entries; reading an
entry refreshes its modification time and every ``put`` deletes the least recently used ones beyond
the bound. An entry is a few MB (2048 int64 bins per tensor, compressed), so the default stays well
under 1 GB even for large models. Unreadable entries are logged, deleted and treated as misses.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import platformdirs

from compiler_core.calibration.statistics import (
    DEFAULT_BINS,
    STATISTICS_FORMAT_VERSION,
    StatisticsSet,
    collect_statistics,
)
from compiler_core.errors import ArgumentError, CalibrationError, OutputWriteError
from compiler_core.fileio import sha256_file
from compiler_core.progress import ProgressCallback, Reporter, as_reporter
from compiler_core.session import MbltSession

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "QBCOMPILER_CACHE_DIR"
DEFAULT_MAX_ENTRIES = 20
_SUFFIX = ".npz"


def default_cache_root() -> Path:
    """``$QBCOMPILER_CACHE_DIR/statistics``, else ``user_cache_dir("qbcompiler")/statistics``."""
    base = os.environ.get(CACHE_DIR_ENV) or platformdirs.user_cache_dir("qbcompiler")
    return Path(base) / "statistics"


def statistics_cache_key(mblt_sha256: str, dataset_fingerprint: str, *, histogram_bins: int = DEFAULT_BINS,
                         num_samples: int | None = None, tensors: Sequence[str] | None = None) -> str:
    """sha256 of everything the statistics depend on.

    The MBLT hash, the dataset fingerprint, the bin count and the statistics format version, plus the
    number of samples used and the tensor selection (both change the result when the dataset is larger
    than ``num_samples`` or only some tensors are collected).
    """
    record = {"mblt": mblt_sha256, "dataset": dataset_fingerprint, "bins": histogram_bins,
              "format": STATISTICS_FORMAT_VERSION, "num_samples": num_samples,
              "tensors": sorted(tensors) if tensors is not None else None}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


class StatisticsCache:
    """A folder of :class:`StatisticsSet` files, one per key, bounded to the most recent entries.

    Args:
        root: Cache folder; :func:`default_cache_root` if ``None``.
        max_entries: Entries kept; the least recently used beyond this are deleted on :meth:`put`.
    """

    def __init__(self, root: str | Path | None = None, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ArgumentError(f"max_entries must be at least 1, got {max_entries}.")
        self.root = Path(root) if root is not None else default_cache_root()
        self.max_entries = max_entries

    def path_for(self, key: str) -> Path:
        """The file that holds (or would hold) ``key``."""
        return self.root / f"{key}{_SUFFIX}"

    def get(self, key: str) -> StatisticsSet | None:
        """The cached set for ``key``, or ``None`` (missing, or unreadable and then deleted)."""
        path = self.path_for(key)
        if not path.is_file():
            return None
        try:
            stats = StatisticsSet.load(path)
        except CalibrationError as error:
            logger.warning("Ignoring unreadable statistics cache entry %s (%s); it is removed.", path.name, error)
            path.unlink(missing_ok=True)
            return None
        _touch(path)
        return stats

    def put(self, key: str, stats: StatisticsSet) -> Path:
        """Store ``stats`` under ``key`` atomically, then trim the cache to ``max_entries``.

        Raises:
            OutputWriteError: the cache folder is not writable.
        """
        path = stats.save(self.path_for(key))
        self._trim()
        return path

    def entries(self) -> list[Path]:
        """Entry files, most recently used first."""
        if not self.root.is_dir():
            return []
        files = [path for path in self.root.glob(f"*{_SUFFIX}") if path.is_file()]
        return sorted(files, key=_mtime, reverse=True)

    def clear(self) -> int:
        """Delete every entry (and leftover temporary files); returns how many entries were deleted."""
        entries = self.entries()
        for path in [*entries, *self.root.glob("*.part")] if self.root.is_dir() else []:
            path.unlink(missing_ok=True)
        return len(entries)

    def __len__(self) -> int:
        return len(self.entries())

    def _trim(self) -> None:
        for stale in self.entries()[self.max_entries:]:
            logger.debug("Statistics cache over %d entries: removing %s", self.max_entries, stale.name)
            stale.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # a read-only cache still serves hits; it cannot track recency
        os.utime(path)


def collect_statistics_cached(
    mblt_path: str | Path | MbltSession,
    dataset: Iterable[Mapping[str, np.ndarray]],
    *,
    cache: StatisticsCache | None = None,
    reporter: Reporter | ProgressCallback | None = None,
    num_samples: int | None = None,
    tensors: Sequence[str] | None = None,
    histogram_bins: int = DEFAULT_BINS,
    intra_op_threads: int | None = None,
) -> tuple[StatisticsSet, bool]:
    """Statistics of ``mblt_path`` over ``dataset``, from the cache when possible.

    Args:
        mblt_path: The MBLT file, or a compile session holding it in memory (no reload, no rehash).
        dataset: Iterable of sample dicts with a ``fingerprint`` string and ``len()`` (a
            ``CalibrationDataset``). Without a fingerprint nothing is cached.
        cache: The cache; a :class:`StatisticsCache` at the default root if ``None``.
        reporter: Progress and cancellation.
        num_samples: Samples to use; ``len(dataset)`` if ``None``.
        tensors: Tensor selection, as for :func:`collect_statistics`.
        histogram_bins: Histogram bins.
        intra_op_threads: onnxruntime intra-op threads.

    Returns:
        ``(stats, hit)``: ``hit`` is True when the statistics came from the cache.
    """
    reporter = as_reporter(reporter)
    cache = cache if cache is not None else StatisticsCache()
    num_samples = num_samples if num_samples is not None else _length(dataset)
    fingerprint = str(getattr(dataset, "fingerprint", "") or "")
    sha256 = mblt_path.sha256 if isinstance(mblt_path, MbltSession) else sha256_file(mblt_path)
    key = statistics_cache_key(sha256, fingerprint, histogram_bins=histogram_bins, num_samples=num_samples,
                               tensors=tensors)
    cached = cache.get(key) if fingerprint else None
    if cached is not None and cached.mblt_sha256 == sha256:
        with reporter.stage("calibrate", total=1, message="Activation statistics loaded from the cache"):
            reporter.advance(1)
        logger.info("Statistics cache hit %s", key[:12])
        return cached, True
    source = mblt_path.graph if isinstance(mblt_path, MbltSession) else mblt_path
    stats = collect_statistics(source, dataset, num_samples=num_samples, tensors=tensors, reporter=reporter,
                               histogram_bins=histogram_bins, intra_op_threads=intra_op_threads,
                               dataset_fingerprint=fingerprint, mblt_sha256=sha256)
    if fingerprint:
        _store(cache, key, stats)
    return stats, False


def _store(cache: StatisticsCache, key: str, stats: StatisticsSet) -> None:
    try:
        cache.put(key, stats)
    except OutputWriteError as error:
        logger.warning("Statistics not cached (%s); calibration goes on without the cache.", error)


def _length(dataset: Iterable) -> int:
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError as error:
        raise ArgumentError("The dataset has no length; pass num_samples.") from error
