"""Per-channel feature-map ranges widened by leave-one-out cross-validation (``bit.channelRanges: crossValidated``).

A per-channel range (``bit.activationScales: channel``) is the hull of what the calibration samples put in that
channel. Where one sample alone sets it, an unseen input goes past it: PP-OCR det's third backbone stage, whose
ranges a grey, low-contrast sign photo exceeds by 20-300x their rounding noise, or PP-OCR rec's last blocks. The
calibration samples can tell, without any held-out data: for each sample i, the range the *other* samples give is
what an unseen input meets, and sample i's values past it are what it clips.

:func:`cross_validated_widenings` makes that the range rule, per tensor: the factor k of :data:`WIDENINGS` that
minimizes, summed over the calibration samples, sample i's clipped energy plus the rounding noise (``step^2 / 12``
per value) of the other samples' per-channel ranges times k, cut to their per-tensor hull as the quantizer cuts a
channel to its tensor's range. A channel range many samples reach keeps k = 1 (widening only costs resolution);
one that a single sample sets is widened until the clipping it predicts no longer outweighs the resolution.

Two passes over the calibration samples in onnxruntime (the per-sample ranges, then the errors); the factors of
one statistics set are kept while it lives, so the points of a mixed-precision search compute them once.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from compiler_core.calibration.statistics import session_with_outputs
from compiler_core.progress import Reporter, as_reporter

logger = logging.getLogger(__name__)

WIDENINGS = (1.0, 1.25, 1.5, 2.0, 3.0)
"""The factors a tensor's per-channel ranges may be widened by."""

_CACHE: dict[int, tuple[weakref.ref, tuple[str, ...], dict[str, float]]] = {}


def cross_validated_widenings(graph: ir.Model, axes: Mapping[str, int], samples: Sequence[Mapping[str, np.ndarray]],
                              reporter: Reporter | None = None) -> dict[str, float]:
    """The cross-validated widening factor of each tensor in ``axes`` (name -> channel axis) over ``samples``.

    Needs at least two samples (with one, every factor is 1). ``reporter``: progress (stage ``channel-ranges``, one
    unit per sample and pass) and cancel.
    """
    if len(samples) < 2 or not axes:
        return {name: 1.0 for name in axes}
    reporter = as_reporter(reporter)
    runner = TensorRunner(graph, axes)
    with reporter.stage("channel-ranges", total=2 * len(samples),
                        message=f"cross-validating {len(axes)} per-channel ranges over {len(samples)} samples"):
        ranges = runner.sample_ranges(samples, reporter)
        errors = {name: np.zeros(len(WIDENINGS)) for name in ranges}
        for index, sample in enumerate(samples):
            reporter.check()
            for name, values in runner.run(sample).items():
                errors[name] += _errors(values, *_others(*ranges[name], index))
            reporter.advance()
    factors = {name: WIDENINGS[int(np.argmin(error))] for name, error in errors.items()}
    widened = {name: factor for name, factor in factors.items() if factor > 1}
    logger.info("bit.channelRanges crossValidated: %d of %d per-channel ranges widened (%s)", len(widened),
                len(factors), ", ".join(f"{name} x{factor:g}" for name, factor in list(widened.items())[:8]))
    return factors


def cached_widenings(stats: object, graph: ir.Model, axes: Mapping[str, int],
                     samples: Sequence[Mapping[str, np.ndarray]], reporter: Reporter | None = None) -> dict[str, float]:
    """:func:`cross_validated_widenings`, computed once per statistics set ``stats`` (while it lives) and tensors."""
    key, names = id(stats), tuple(sorted(axes))
    entry = _CACHE.get(key)
    if entry is not None and entry[0]() is stats and entry[1] == names:
        return entry[2]
    factors = cross_validated_widenings(graph, axes, samples, reporter)
    _CACHE[key] = (weakref.ref(stats, lambda _, key=key: _CACHE.pop(key, None)), names, factors)
    return factors


def widen(channel_ranges: Mapping[str, tuple[np.ndarray, np.ndarray]],
          factors: Mapping[str, float]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``channel_ranges`` with each tensor's minima and maxima multiplied by its factor."""
    return {name: (low * factors.get(name, 1.0), high * factors.get(name, 1.0))
            for name, (low, high) in channel_ranges.items()}


class TensorRunner:
    """The float graph in onnxruntime with the tensors of ``axes`` (name -> channel axis) exposed.

    :meth:`run` returns each tensor of one sample as ``[channels, values]`` (float64).
    """

    def __init__(self, graph: ir.Model, axes: Mapping[str, int]) -> None:
        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session, self.exposed = session_with_outputs(graph, list(axes), options)
        self.inputs = [item.name for item in self.session.get_inputs()]
        self.axes = axes

    def run(self, sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The exposed tensors of ``sample``, each ``[channels, values]``."""
        feeds = {name: np.asarray(sample[name], dtype=np.float32) for name in self.inputs}
        values = {**dict(zip(self.exposed, self.session.run(self.exposed, feeds))), **feeds}
        return {name: _by_channel(values[name], axis) for name, axis in self.axes.items() if name in values}

    def sample_ranges(self, samples, reporter: Reporter | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per tensor, each sample's per-channel minima and maxima (zero included), ``[samples, channels]``."""
        reporter = as_reporter(reporter)
        lows: dict[str, list[np.ndarray]] = {}
        highs: dict[str, list[np.ndarray]] = {}
        for sample in samples:
            reporter.check()
            for name, values in self.run(sample).items():
                lows.setdefault(name, []).append(np.minimum(values.min(axis=1), 0.0))
                highs.setdefault(name, []).append(np.maximum(values.max(axis=1), 0.0))
            reporter.advance()
        return {name: (np.array(lows[name]), np.array(highs[name])) for name in lows}


def _by_channel(values: np.ndarray, axis: int) -> np.ndarray:
    return np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1).astype(np.float64)


def _others(lows: np.ndarray, highs: np.ndarray, left_out: int) -> tuple[np.ndarray, np.ndarray]:
    keep = np.arange(lows.shape[0]) != left_out
    return lows[keep].min(axis=0), highs[keep].max(axis=0)


def _errors(values: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """For each factor of :data:`WIDENINGS`: clipped energy plus 8-bit rounding noise of ``values`` (``[channels,
    values]``) under ``[low, high] * factor`` cut to the hull of the channels' ranges.

    Only values past ``[low, high]`` can be clipped under a factor >= 1, so they are gathered once (usually a few).
    """
    channel, position = np.nonzero((values > high[:, None]) | (values < low[:, None]))
    outside = values[channel, position]
    errors = np.empty(len(WIDENINGS))
    for index, factor in enumerate(WIDENINGS):
        wide_low, wide_high = np.maximum(low * factor, low.min()), np.minimum(high * factor, high.max())
        clipped = outside - np.clip(outside, wide_low[channel], wide_high[channel])
        rounding = (((wide_high - wide_low) / 255.0) ** 2 / 12.0).sum() * values.shape[1]
        errors[index] = float(np.vdot(clipped, clipped)) + float(rounding)
    return errors
