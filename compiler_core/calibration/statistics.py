"""Activation statistics: run the MBLT in onnxruntime with every float tensor exposed, one sample at a time.

:func:`collect_statistics` copies the MBLT in memory, makes every float32 node output a graph output
(graph inputs are read straight from the feeds), runs onnxruntime on one sample at a time and folds
each tensor into a :class:`TensorAccumulator`: min / max, count, sum and sum of squares, per-channel
min / max / sum, the max |x| of every sample, and a :class:`PowerOfTwoHistogram`; for the data inputs of
MatMul/Gemm, and for the outputs of MatMul/Gemm layers with constant weights (through their bias Add), also
max |x| per feature (last axis), which SmoothQuant and per-channel residual-branch scales read. The result is a
:class:`StatisticsSet`, saved as one ``.npz`` and cached by ``compiler_core.calibration.cache``, from
which every observer (``compiler_core.calibration.observers``) derives its range without rerunning the
model.

Memory bound. MBLTs have a static batch of 1, so nothing is batched: at any moment the process holds
the activations of ONE sample (every exposed tensor, as onnxruntime returns them together) plus the
accumulators. Peak extra memory is therefore

    O(sum of activation sizes of one sample)        -- e.g. 52 MB for MobileNetV2 at 224x224
  + O(largest tensor) scratch for histogram indices -- 6 bytes per element of the largest tensor
  + O(num_tensors * bins) histograms                -- 8 bytes per bin per tensor
  + O(sum of channel counts) per-channel arrays     -- 24 bytes per channel
  + O(num_tensors * num_samples) per-sample maxima  -- 8 bytes each.

It grows with the model's activation footprint and the bin count, not with the number of samples
(except the per-sample maxima, a few KB even for thousands of samples).

Channel axis (:func:`channel_axis`): rank >= 3 tensors are channel-major (NCHW / NCW), axis 1, except
rank-3 tensors whose dims[1] > dims[2], which are read as token-major ``[1, S, H]`` (axis 2); rank 1 and
2 use the last axis; scalars have none. The axis is stored with the statistics.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from google.protobuf.message import DecodeError
from threadpoolctl import threadpool_limits

from compiler_core.errors import ArgumentError, CalibrationError, InvalidModelError, ModelLoadError
from compiler_core.fileio import atomic_write, sha256_bytes, sha256_file
from compiler_core.mblt.io import load_mblt
from compiler_core.progress import ProgressCallback, Reporter, as_reporter

logger = logging.getLogger(__name__)

STATISTICS_FORMAT = "qbcompiler.statistics"
STATISTICS_FORMAT_VERSION = 4
DEFAULT_BINS = 2048
MIN_HISTOGRAM_RANGE = 2.0 ** -20
_META_KEY = "meta"
_ARRAY_FIELDS = ("per_channel_min", "per_channel_max", "per_channel_mean", "histogram", "sample_absmax",
                 "feature_absmax")
FEATURE_READERS = {"MatMul": 0, "Gemm": 0}
"""Ops whose data input (by index) is reduced over its last axis: their inputs get :attr:`TensorStats.feature_absmax`."""


def channel_axis(shape: Sequence[int]) -> int | None:
    """The axis holding channels: 1 for NCHW / NCW, the last axis for ``[N, C]`` and token-major ``[1, S, H]``.

    A rank-3 tensor with ``dims[1] > dims[2]`` is taken as token-major (sequence longer than the hidden
    size is rare for NCW signals, common for transformer activations); scalars return ``None``.
    """
    rank = len(shape)
    if rank == 0:
        return None
    if rank <= 2 or (rank == 3 and shape[1] > shape[2]):
        return rank - 1
    return 1


# ---------------------------------------------------------------------------------------------------
# Histogram


class PowerOfTwoHistogram:
    """Histogram of x over ``[-R, R)`` with ``bins`` equal bins, where R is a power of two that only grows.

    R starts as the smallest power of two strictly above the first max |x| (at least 2^-20) and doubles
    whenever a value reaches it: adjacent bin pairs are summed into the centre half. Because R and
    ``bins`` are powers of two, ``x * bins / (2R)`` is exact in float32 and ``floor`` of it is the bin, so
    a histogram grown by doubling equals one computed directly at the final range, bit for bit.
    "Strictly above" keeps x = R out of the range, so no value needs clamping (which would break that).

    Args:
        bins: Number of bins, a power of two >= 4.
        hist_range: Start with this range (a power of two) instead of deriving it from the first values.
    """

    def __init__(self, bins: int = DEFAULT_BINS, *, hist_range: float | None = None) -> None:
        if bins < 4 or bins & (bins - 1):
            raise ArgumentError(f"Histogram bins must be a power of two >= 4, got {bins}.",
                                hint="Use e.g. 1024, 2048 or 4096.")
        if hist_range is not None and not (hist_range > 0 and math.frexp(hist_range)[0] == 0.5):
            raise ArgumentError(f"Histogram range must be a positive power of two, got {hist_range}.")
        self.bins = bins
        self.counts = np.zeros(bins, dtype=np.int64)
        self.range = hist_range
        self._index_dtype = np.uint16 if bins <= 1 << 16 else np.intp

    def add(self, values: np.ndarray, absmax: float | None = None, scratch: Scratch | None = None) -> None:
        """Count float32 ``values`` (finite); ``absmax`` is their max |x| if the caller already knows it."""
        flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        if flat.size == 0:
            return
        self.grow_to(float(np.max(np.abs(flat))) if absmax is None else absmax)
        scratch = scratch or Scratch()
        scaled = scratch.floats(flat.size)
        np.multiply(flat, np.float32(self.bins / (2.0 * self.range)), out=scaled)
        np.floor(scaled, out=scaled)
        index = scratch.indices(flat.size, self._index_dtype)
        np.add(scaled, np.float32(self.bins // 2), out=index, casting="unsafe")
        self.counts += np.bincount(index, minlength=self.bins)  # = np.add.at(counts, index, 1), ~20x faster

    def grow_to(self, absmax: float) -> None:
        """Double R until it is strictly above ``absmax``."""
        needed = max(MIN_HISTOGRAM_RANGE, 2.0 ** math.frexp(absmax)[1]) if absmax > 0 else MIN_HISTOGRAM_RANGE
        if self.range is None:
            self.range = needed
        while self.range < needed:
            self._double()

    def _double(self) -> None:
        pairs = self.counts.reshape(-1, 2).sum(axis=1)
        quarter = self.bins // 4
        self.counts = np.zeros(self.bins, dtype=np.int64)
        self.counts[quarter:quarter + self.bins // 2] = pairs
        self.range *= 2.0


class Scratch:
    """Reusable buffers for histogram index computation, so large tensors do not page-fault every sample."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def floats(self, size: int) -> np.ndarray:
        """A float32 buffer of ``size`` elements (contents undefined)."""
        return self._get("float32", size)

    def indices(self, size: int, dtype: Any) -> np.ndarray:
        """An integer buffer of ``size`` elements of ``dtype`` (contents undefined)."""
        return self._get(np.dtype(dtype).name, size)

    def _get(self, dtype: str, size: int) -> np.ndarray:
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.size < size:
            buffer = self._buffers[dtype] = np.empty(size, dtype=dtype)
        return buffer[:size]


# ---------------------------------------------------------------------------------------------------
# Per-tensor statistics


@dataclass
class TensorStats:
    """Everything calibration keeps about one tensor, accumulated over all samples.

    Attributes:
        name: Tensor (value) name in the MBLT.
        shape: Shape of the tensor for one sample.
        channel_axis: Axis of the per-channel arrays (see :func:`channel_axis`); ``None`` for scalars.
        min: Smallest finite value seen.
        max: Largest finite value seen.
        count: Number of elements counted (all samples, non-finite ones excluded).
        mean: Mean of the counted elements.
        std: Population standard deviation of the counted elements.
        per_channel_min: Minimum per channel (float64, one entry for scalars).
        per_channel_max: Maximum per channel.
        per_channel_mean: Mean per channel.
        histogram: int64 counts of :class:`PowerOfTwoHistogram` bins over ``[-hist_range, hist_range)``.
        hist_range: R, the power-of-two half-width of the histogram.
        sample_absmax: max |x| of every sample, in sample order (float64).
        nonfinite: Number of NaN / inf elements seen. They are left out of ``count``, ``mean`` and ``std``
            and enter the per-channel arrays and the histogram as 0 (a warning is logged).
        feature_absmax: max |x| per index of the LAST axis (the features a MatMul/Gemm reduces over, or
            produces), collected only for the data inputs and the outputs of MatMul/Gemm layers
            (:func:`feature_tensors`); empty otherwise. SmoothQuant and per-channel residual-branch scales
            read it: a token-major ``[1, S, H]`` tensor with ``S < H`` has its :attr:`channel_axis` on the
            tokens, not on the features.
    """

    name: str
    shape: tuple[int, ...]
    channel_axis: int | None
    min: float
    max: float
    count: int
    mean: float
    std: float
    per_channel_min: np.ndarray
    per_channel_max: np.ndarray
    per_channel_mean: np.ndarray
    histogram: np.ndarray
    hist_range: float
    sample_absmax: np.ndarray
    nonfinite: int = 0
    feature_absmax: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def absmax(self) -> float:
        """max |x| over every sample."""
        return max(-self.min, self.max)

    @property
    def bins(self) -> int:
        """Number of histogram bins."""
        return int(self.histogram.size)

    @property
    def bin_width(self) -> float:
        """Width of one histogram bin."""
        return 2.0 * self.hist_range / self.bins

    @property
    def bin_edges(self) -> np.ndarray:
        """The ``bins + 1`` histogram edges, from ``-hist_range`` to ``hist_range``."""
        return np.linspace(-self.hist_range, self.hist_range, self.bins + 1)

    @property
    def num_samples(self) -> int:
        """Number of samples folded in."""
        return int(self.sample_absmax.size)

    def summary(self) -> dict[str, Any]:
        """Plain-dict summary (no arrays) for reports and the GUI."""
        return {"shape": list(self.shape), "channel_axis": self.channel_axis, "min": self.min, "max": self.max,
                "absmax": self.absmax, "mean": self.mean, "std": self.std, "count": self.count,
                "channels": int(self.per_channel_min.size), "hist_range": self.hist_range,
                "nonfinite": self.nonfinite}

    def _scalars(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "channel_axis": self.channel_axis,
                "min": self.min, "max": self.max, "count": self.count, "mean": self.mean, "std": self.std,
                "hist_range": self.hist_range, "nonfinite": self.nonfinite}


HISTOGRAM_SAMPLE_LIMIT = 1 << 16
"""Per tensor and sample, at most this many elements feed the histogram (an odd-strided subsample).

min/max, means and per-channel ranges use every element; the histogram only shapes the clipping of
the percentile, KL and MSE observers, for which 65,536 values per sample (times the samples) are
plenty. It is what keeps statistics near the cost of inference on large activations.
"""


def histogram_subsample(flat: np.ndarray) -> np.ndarray:
    """Every k-th element (k odd, so it does not alias with power-of-two strides) up to the limit."""
    if flat.size <= HISTOGRAM_SAMPLE_LIMIT:
        return flat
    step = -(-flat.size // HISTOGRAM_SAMPLE_LIMIT) | 1
    return flat[::step]


class TensorAccumulator:
    """Folds the values of one tensor, sample by sample, into a :class:`TensorStats`.

    Args:
        name: Tensor name.
        bins: Histogram bins (power of two).
        features: Also keep max |x| per index of the last axis (:attr:`TensorStats.feature_absmax`).
    """

    def __init__(self, name: str, bins: int = DEFAULT_BINS, *, features: bool = False) -> None:
        self.name = name
        self.features = features
        self._feature_absmax = np.zeros(0)
        self.histogram = PowerOfTwoHistogram(bins)
        self.shape: tuple[int, ...] | None = None
        self._axis: int | None = None
        self._grouping = (1, 1, 1)
        self._ones: np.ndarray | None = None
        self.count = self.nonfinite = 0
        self.total = self.total_squares = 0.0
        self._channel_min = self._channel_max = self._channel_sum = np.zeros(0)
        self.sample_absmax: list[float] = []

    def update(self, values: np.ndarray, scratch: Scratch | None = None) -> None:
        """Fold one sample of this tensor in.

        Raises:
            CalibrationError: the tensor's shape differs from the first sample's.
        """
        values = np.ascontiguousarray(values, dtype=np.float32)
        if self.shape is None:
            self._start(values.shape)
        elif values.shape != self.shape:
            raise CalibrationError(f"Tensor '{self.name}' changed shape between samples: {list(self.shape)} "
                                   f"then {list(values.shape)}.", hint="Calibration needs static shapes; "
                                   "re-parse the model with fixed input shapes.", node=self.name)
        if values.size == 0:
            return
        grouped = values.reshape(self._grouping)
        low, high = grouped.min(axis=(0, 2)), grouped.max(axis=(0, 2))
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            values, grouped = self._without_nonfinite(values)
            low, high = grouped.min(axis=(0, 2)), grouped.max(axis=(0, 2))
        self._fold(values, grouped, low, high, scratch)

    def _start(self, shape: tuple[int, ...]) -> None:
        self.shape = tuple(int(d) for d in shape)
        self._axis = channel_axis(self.shape)
        if self._axis is None:
            self._grouping = (1, 1, 1)
        else:
            before = math.prod(self.shape[:self._axis])
            self._grouping = (before, self.shape[self._axis], math.prod(self.shape[self._axis + 1:]))
        channels = self._grouping[1]
        self._channel_min = np.full(channels, np.inf)
        self._channel_max = np.full(channels, -np.inf)
        self._channel_sum = np.zeros(channels)
        after = self._grouping[2] if self._grouping[2] > 1 else self._grouping[0]
        self._ones = np.ones(after, dtype=np.float32)

    def _without_nonfinite(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        finite = np.isfinite(values)
        bad = int(values.size - np.count_nonzero(finite))
        if self.nonfinite == 0:
            logger.warning("Tensor '%s' holds NaN or inf values; they are counted as 0.", self.name)
        self.nonfinite += bad
        self.count -= bad
        cleaned = np.where(finite, values, np.float32(0))
        return cleaned, cleaned.reshape(self._grouping)

    def _fold(self, values: np.ndarray, grouped: np.ndarray, low: np.ndarray, high: np.ndarray,
              scratch: Scratch | None) -> None:
        np.minimum(self._channel_min, low, out=self._channel_min)
        np.maximum(self._channel_max, high, out=self._channel_max)
        if self.features and values.ndim:
            self._fold_features(values)
        absmax = max(-float(low.min()), float(high.max()), 0.0)
        sums = self._channel_sums(grouped, absmax)
        self._channel_sum += sums
        flat = values.reshape(-1)
        self.count += flat.size
        self.total += float(sums.sum())
        self.total_squares += float(np.vdot(flat, flat))
        self.sample_absmax.append(absmax)
        self.histogram.add(histogram_subsample(flat), absmax, scratch)

    def _fold_features(self, values: np.ndarray) -> None:
        rows = values.reshape(-1, values.shape[-1])
        absmax = np.maximum(-rows.min(axis=0), rows.max(axis=0)).astype(np.float64)
        self._feature_absmax = absmax if self._feature_absmax.size == 0 else np.maximum(self._feature_absmax, absmax)

    def _channel_sums(self, grouped: np.ndarray, absmax: float) -> np.ndarray:
        # A BLAS matrix-vector product is ~3x faster than numpy's pairwise sum and as accurate here.
        # Tensors holding -3.4e38 masks would overflow float32 sums: those take the float64 path.
        if absmax > 1e30:
            return grouped.astype(np.float64).sum(axis=(0, 2))
        before, channels, after = grouped.shape
        if after > 1:
            return (grouped @ self._ones).sum(axis=0, dtype=np.float64)
        return (self._ones @ grouped.reshape(before, channels)).astype(np.float64)

    def result(self) -> TensorStats | None:
        """The accumulated :class:`TensorStats`, or ``None`` if no element was counted."""
        if self.shape is None or not self.sample_absmax:
            return None
        count = max(self.count, 1)
        mean = self.total / count
        variance = max(self.total_squares / count - mean * mean, 0.0)
        per_channel = max(self.count + self.nonfinite, 1) / self._channel_sum.size
        return TensorStats(
            name=self.name, shape=self.shape, channel_axis=self._axis,
            min=float(self._channel_min.min()), max=float(self._channel_max.max()), count=self.count,
            mean=mean, std=math.sqrt(variance), per_channel_min=self._channel_min.copy(),
            per_channel_max=self._channel_max.copy(), per_channel_mean=self._channel_sum / per_channel,
            histogram=self.histogram.counts.copy(), hist_range=float(self.histogram.range),
            sample_absmax=np.asarray(self.sample_absmax, dtype=np.float64), nonfinite=self.nonfinite,
            feature_absmax=self._feature_absmax.copy())


# ---------------------------------------------------------------------------------------------------
# The set of statistics of one (MBLT, dataset) pair


@dataclass
class StatisticsSet:
    """Statistics of every exposed tensor of one MBLT over one calibration dataset.

    Attributes:
        tensors: Tensor name -> :class:`TensorStats`, in graph order (inputs first).
        num_samples: Samples folded in.
        mblt_sha256: sha256 of the MBLT file (or of the model bytes).
        dataset_fingerprint: The dataset's fingerprint ("" if it had none).
        seconds: Wall time the collection took.
    """

    tensors: dict[str, TensorStats]
    num_samples: int
    mblt_sha256: str
    dataset_fingerprint: str
    seconds: float

    def __getitem__(self, name: str) -> TensorStats:
        return self.tensors[name]

    def __len__(self) -> int:
        return len(self.tensors)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict summary: set metadata and :meth:`TensorStats.summary` per tensor."""
        return {"num_samples": self.num_samples, "mblt_sha256": self.mblt_sha256,
                "dataset_fingerprint": self.dataset_fingerprint, "seconds": self.seconds,
                "tensors": {name: stats.summary() for name, stats in self.tensors.items()}}

    def save(self, path: str | Path) -> Path:
        """Write the set to one ``.npz`` (atomically; JSON metadata as a string array, no pickle).

        Raises:
            OutputWriteError: the file cannot be written.
        """
        meta = {"format": STATISTICS_FORMAT, "version": STATISTICS_FORMAT_VERSION, "num_samples": self.num_samples,
                "mblt_sha256": self.mblt_sha256, "dataset_fingerprint": self.dataset_fingerprint,
                "seconds": self.seconds, "tensors": [stats._scalars() for stats in self.tensors.values()]}
        arrays = {_META_KEY: np.array(json.dumps(meta))}
        for index, stats in enumerate(self.tensors.values()):
            arrays.update({f"t{index}.{field}": getattr(stats, field) for field in _ARRAY_FIELDS})
        return atomic_write(path, lambda temp: _write_npz(temp, arrays))

    @classmethod
    def load(cls, path: str | Path) -> StatisticsSet:
        """Read a set written by :meth:`save`.

        Raises:
            CalibrationError: the file is missing, corrupt or of another format version.
        """
        try:
            with np.load(path, allow_pickle=False) as archive:
                return cls._from_archive(archive)
        except CalibrationError:
            raise
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as error:
            raise CalibrationError(f"Statistics file '{path}' cannot be read: {error}.",
                                   hint="Delete it and calibrate again.", file=str(path)) from error

    @classmethod
    def _from_archive(cls, archive: Mapping[str, np.ndarray]) -> StatisticsSet:
        meta = json.loads(str(archive[_META_KEY][()]))
        if meta.get("format") != STATISTICS_FORMAT or meta.get("version") != STATISTICS_FORMAT_VERSION:
            raise CalibrationError(f"Statistics format {meta.get('format')} v{meta.get('version')} is not "
                                   f"{STATISTICS_FORMAT} v{STATISTICS_FORMAT_VERSION}.",
                                   hint="Calibrate again to rebuild the statistics.")
        tensors = {}
        for index, scalars in enumerate(meta["tensors"]):
            arrays = {field: archive[f"t{index}.{field}"] for field in _ARRAY_FIELDS}
            scalars = {**scalars, "shape": tuple(scalars["shape"])}
            tensors[scalars["name"]] = TensorStats(**scalars, **arrays)
        return cls(tensors=tensors, num_samples=meta["num_samples"], mblt_sha256=meta["mblt_sha256"],
                   dataset_fingerprint=meta["dataset_fingerprint"], seconds=meta["seconds"])


def _write_npz(temp: Path, arrays: dict[str, np.ndarray]) -> None:
    # A file handle, because np.savez appends ".npz" to a path that lacks it (our temp name ends in .part).
    with open(temp, "wb") as handle:
        np.savez_compressed(handle, **arrays)


# ---------------------------------------------------------------------------------------------------
# Collection


def collect_statistics(
    model_path_or_bytes: str | Path | bytes | ir.Model,
    samples: Iterable[Mapping[str, np.ndarray]],
    *,
    num_samples: int,
    tensors: Sequence[str] | None = None,
    reporter: Reporter | ProgressCallback | None = None,
    histogram_bins: int = DEFAULT_BINS,
    intra_op_threads: int | None = None,
    dataset_fingerprint: str | None = None,
    mblt_sha256: str | None = None,
) -> StatisticsSet:
    """Run the MBLT on up to ``num_samples`` samples and accumulate statistics of its float tensors.

    Args:
        model_path_or_bytes: Path of the MBLT, the serialized model, or the model in memory (a compile
            session's graph: its outputs are restored once the onnxruntime session exists).
        samples: Iterable of ``{input name: array}`` feeds (e.g. a ``CalibrationDataset``).
        num_samples: How many samples to use (fewer are used, with a warning, if the iterable ends first).
        tensors: Only these tensor names (node outputs or graph inputs); all float32 tensors if ``None``.
        reporter: Progress and cancellation (stage ``calibrate``, one unit per sample).
        histogram_bins: Bins of every histogram (power of two).
        intra_op_threads: onnxruntime intra-op threads (its default if ``None``).
        dataset_fingerprint: Stored with the result; defaults to ``samples.fingerprint`` if present.
        mblt_sha256: The model's hash when it is passed in memory.

    Returns:
        The :class:`StatisticsSet`.

    Raises:
        ModelLoadError: the model cannot be read.
        CalibrationError: no sample, a sample that does not fit the model inputs, or a failed run.
        CancelledError: cancelled through ``reporter``; nothing is returned.
    """
    if num_samples < 1:
        raise ArgumentError(f"num_samples must be at least 1, got {num_samples}.")
    PowerOfTwoHistogram(histogram_bins)  # validates the bin count before any work
    reporter = as_reporter(reporter)
    started = time.perf_counter()
    if isinstance(model_path_or_bytes, ir.Model):
        model, sha256 = model_path_or_bytes, mblt_sha256 or ""
    else:
        model, sha256 = _load_model(model_path_or_bytes)
    input_specs = {value.name: value for value in model.graph.inputs}
    wanted_inputs = [name for name in input_specs if _is_float(input_specs[name]) and _selected(name, tensors)]
    session, outputs = _session(model, tensors, intra_op_threads)
    _check_selection(tensors, wanted_inputs + outputs)
    features = feature_tensors(model)
    accumulators = {name: TensorAccumulator(name, histogram_bins, features=name in features)
                    for name in wanted_inputs + outputs}
    used = _run_samples(session, samples, input_specs, outputs, accumulators, num_samples, reporter)
    results = {name: stats for name, acc in accumulators.items() if (stats := acc.result()) is not None}
    fingerprint = dataset_fingerprint if dataset_fingerprint is not None else getattr(samples, "fingerprint", "")
    seconds = time.perf_counter() - started
    logger.info("Statistics of %d tensors over %d samples in %.2f s", len(results), used, seconds)
    return StatisticsSet(results, used, sha256, str(fingerprint or ""), seconds)


def feature_tensors(model: ir.Model) -> set[str]:
    """Names of the tensors that get per-feature maxima: MatMul/Gemm data inputs and linear-layer outputs.

    A data input (rank >= 2, not constant) is what SmoothQuant rescales per input feature; the output of
    a MatMul/Gemm with constant weights (or of the Add of a constant bias that follows it) is what a
    per-channel residual-branch scale (``bit.residualScales``) quantizes per output feature.
    """
    names = set()
    for node in model.graph:
        index = FEATURE_READERS.get(node.op_type)
        if index is None or node.domain not in ("", "ai.onnx") or len(node.inputs) <= index:
            continue
        value = node.inputs[index]
        if value is not None and value.const_value is None and value.shape is not None and len(value.shape) >= 2:
            names.add(value.name)
        if len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].const_value is not None:
            names.update(_linear_output(node))
    return names


def _linear_output(node: ir.Node) -> list[str]:
    """A linear node's output and, when its one reader adds a constant bias, that Add's output."""
    output = node.outputs[0]
    names = [output.name]
    readers = list(output.uses())
    if len(readers) == 1 and readers[0][0].op_type == "Add" and any(
            value is not None and value.const_value is not None for value in readers[0][0].inputs):
        names.append(readers[0][0].outputs[0].name)
    return names


def expose_tensors(model: ir.Model, tensors: Sequence[str] | None = None, *, any_type: Sequence[str] = ()) -> list[str]:
    """Make every float32 node output of ``model`` (or those named in ``tensors``) a graph output, and those named in
    ``any_type`` whatever their type (the int64 indices a CPU tail reads).

    Existing graph outputs are kept and listed too; shapes and types travel with the values.

    Returns:
        Names of the exposed outputs, in graph order.
    """
    names = []
    for node in model.graph:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        for value in node.outputs:
            if value.name and (_is_float(value) and _selected(value.name, tensors) or value.name in any_type):
                if not value.is_graph_output():
                    model.graph.outputs.append(value)
                names.append(value.name)
    return names


def _is_float(value: ir.Value) -> bool:
    return value.dtype == ir.DataType.FLOAT


def _selected(name: str, tensors: Sequence[str] | None) -> bool:
    return tensors is None or name in tensors


def _check_selection(tensors: Sequence[str] | None, available: list[str]) -> None:
    if tensors is None:
        return
    missing = sorted(set(tensors) - set(available))
    if missing:
        raise ArgumentError(f"No float32 tensor named {', '.join(repr(n) for n in missing[:10])} in the MBLT.",
                            hint="Pass names of float32 node outputs or graph inputs.")


def _load_model(source: str | Path | bytes) -> tuple[ir.Model, str]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        try:
            return ir.from_proto(onnx.ModelProto.FromString(data)), sha256_bytes(data)
        except (DecodeError, ValueError) as error:
            raise ModelLoadError(f"The model bytes cannot be read as ONNX: {error}.",
                                 hint="Pass the bytes of an MBLT file.") from error
    return load_mblt(source), sha256_file(source)


def session_with_outputs(model: ir.Model, tensors: Sequence[str] | None, options: ort.SessionOptions, *,
                         any_type: Sequence[str] = ()) -> tuple[ort.InferenceSession, list[str]]:
    """An onnxruntime session of ``model`` with its float32 tensors (or ``tensors``) and ``any_type`` exposed as
    outputs.

    The outputs are added to ``model`` only while the session is built, so a compile session's
    graph is left as it was.

    Returns:
        ``(session, names of the exposed outputs)``.
    """
    original = list(model.graph.outputs)
    names = expose_tensors(model, tensors, any_type=any_type)
    try:
        return _create_session(model, options), names
    finally:
        model.graph.outputs.clear()
        model.graph.outputs.extend(original)


def _session(model: ir.Model, tensors: Sequence[str] | None,
             intra_op_threads: int | None) -> tuple[ort.InferenceSession, list[str]]:
    options = ort.SessionOptions()
    # Between runs the CPU does numpy work; spinning onnxruntime workers would steal it (measured 2x slower).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    try:
        return session_with_outputs(model, tensors, options)
    except Exception as error:  # onnxruntime raises its own pybind exception types
        raise InvalidModelError(f"onnxruntime cannot load the MBLT with its tensors exposed: {error}.",
                                hint="Check the MBLT with `qbcompiler check`; report the model if it passes.",
                                stage="calibrate") from error


def _create_session(model: ir.Model, options: ort.SessionOptions) -> ort.InferenceSession:
    providers = ["CPUExecutionProvider"]
    try:
        data = ir.to_proto(model).SerializeToString()
    except ValueError:  # over protobuf's 2 GB limit: go through a file with external weights
        with tempfile.TemporaryDirectory(prefix="qbcompiler-stats-") as folder:
            path = Path(folder) / "exposed.onnx"
            ir.save(model, path, external_data="exposed.onnx.data")
            return ort.InferenceSession(str(path), options, providers=providers)
    return ort.InferenceSession(data, options, providers=providers)


def _run_samples(session: ort.InferenceSession, samples: Iterable[Mapping[str, np.ndarray]],
                 input_specs: Mapping[str, ir.Value], outputs: list[str],
                 accumulators: dict[str, TensorAccumulator], num_samples: int, reporter: Reporter) -> int:
    scratch = Scratch()
    used = 0
    # BLAS on one thread: the sums are small matrix-vector products, which spin-wait and run several
    # times slower with two threads on a loaded 2-core machine (and one thread fixes their rounding).
    with reporter.stage("calibrate", total=num_samples, message="Collecting activation statistics"), \
            threadpool_limits(limits=1, user_api="blas"):
        for index, sample in enumerate(islice(samples, num_samples)):
            reporter.check()
            feeds = _feeds(sample, input_specs, index)
            for name, values in _tensors_of(session, feeds, outputs, index):
                if name in accumulators:
                    accumulators[name].update(values, scratch)
            used = index + 1
            reporter.advance(1, f"sample {used} of {num_samples}")
    if used == 0:
        raise CalibrationError("The calibration data yielded no sample.", hint="Check the calibration data path.",
                               stage="calibrate")
    if used < num_samples:
        logger.warning("Only %d calibration samples were available (%d requested).", used, num_samples)
    return used


def _tensors_of(session: ort.InferenceSession, feeds: dict[str, np.ndarray], outputs: list[str],
                index: int) -> Iterator[tuple[str, np.ndarray]]:
    yield from feeds.items()
    try:
        values = session.run(outputs, feeds)
    except Exception as error:  # onnxruntime raises its own pybind exception types
        raise CalibrationError(f"onnxruntime failed on calibration sample {index}: {error}.",
                               hint="Check that the sample matches the model's inputs.", stage="calibrate") from error
    yield from zip(outputs, values)


def _feeds(sample: Mapping[str, np.ndarray], input_specs: Mapping[str, ir.Value], index: int) -> dict[str, np.ndarray]:
    feeds = {}
    for name, spec in input_specs.items():
        if name not in sample:
            raise CalibrationError(f"Calibration sample {index} has no value for model input '{name}'.",
                                   hint=f"Provide '{name}' (the sample has {sorted(sample)}).", stage="calibrate")
        array = np.ascontiguousarray(sample[name], dtype=spec.dtype.numpy())
        expected = _static_shape(spec) or array.shape
        if array.shape != expected:
            raise CalibrationError(f"Calibration sample {index}: input '{name}' has shape {list(array.shape)}, "
                                   f"the model expects {list(expected)}.",
                                   hint="Fix the preprocessing or the data files.", stage="calibrate")
        feeds[name] = array
    return feeds


def _static_shape(spec: ir.Value) -> tuple[int, ...] | None:
    if spec.shape is None or not all(isinstance(d, int) for d in spec.shape):
        return None
    return tuple(spec.shape)
