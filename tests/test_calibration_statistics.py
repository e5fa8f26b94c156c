"""Activation statistics, their cache and the observers, checked against brute-force numpy on the fashion sample."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from compiler_core.api import mblt_compile
from compiler_core.calibration.cache import (
    CACHE_DIR_ENV,
    StatisticsCache,
    collect_statistics_cached,
    statistics_cache_key,
)
from compiler_core.calibration.observers import (
    MIN_RANGE,
    OBSERVERS,
    histogram_observer,
    mode_name,
    observe,
    observe_all,
)
from compiler_core.calibration.statistics import (
    PowerOfTwoHistogram,
    StatisticsSet,
    TensorAccumulator,
    TensorStats,
    channel_axis,
    collect_statistics,
)
from compiler_core.config import CalibrationMode
from compiler_core.errors import ArgumentError, CalibrationError, CancelledError
from compiler_core.progress import CancelToken, Reporter

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_MODEL = ROOT / "resources" / "samples" / "fashion_cnn" / "model.onnx"
NUM_SAMPLES = 16
BINS = 2048


def _samples(count: int = NUM_SAMPLES, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Seeded inputs whose scale grows, so histogram ranges must double along the way."""
    rng = np.random.default_rng(seed)
    return [{"image": (rng.standard_normal((1, 1, 28, 28)) * (0.25 + index)).astype(np.float32)}
            for index in range(count)]


class CountingDataset:
    """A list of samples with a fingerprint that counts how often it is iterated."""

    def __init__(self, samples: list[dict[str, np.ndarray]], fingerprint: str = "seeded-0") -> None:
        self.samples, self.fingerprint, self.iterations = samples, fingerprint, 0

    def __iter__(self):
        self.iterations += 1
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)


@pytest.fixture(scope="module")
def fashion_mblt(tmp_path_factory) -> Path:
    return mblt_compile(SAMPLE_MODEL, tmp_path_factory.mktemp("mblt") / "fashion.mblt")


@pytest.fixture(scope="module")
def fashion_stats(fashion_mblt) -> StatisticsSet:
    return collect_statistics(fashion_mblt, _samples(), num_samples=NUM_SAMPLES)


@pytest.fixture(scope="module")
def brute_force(fashion_mblt) -> dict[str, np.ndarray]:
    """Every float tensor of every sample, stacked: exposed independently of the code under test."""
    model = ir.load(fashion_mblt)
    names = [v.name for node in model.graph for v in node.outputs if v.dtype == ir.DataType.FLOAT]
    model.graph.outputs.extend(v for node in model.graph for v in node.outputs
                               if v.name in names and not v.is_graph_output())
    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    runs = [dict(zip(names, session.run(names, sample)), **sample) for sample in _samples()]
    return {name: np.stack([run[name] for run in runs]) for name in ["image", *names]}


# ---------------------------------------------------------------------------------------------------
# statistics against brute force


def test_every_float_tensor_and_the_input_are_collected(fashion_stats, brute_force):
    assert list(fashion_stats.tensors) == list(brute_force)
    assert fashion_stats.num_samples == NUM_SAMPLES
    assert len(fashion_stats.mblt_sha256) == 64


def test_scalar_statistics_match_brute_force(fashion_stats, brute_force):
    for name, stacked in brute_force.items():
        stats, exact = fashion_stats[name], stacked.astype(np.float64)
        assert stats.shape == stacked.shape[1:]
        assert stats.count == stacked.size
        assert stats.min == float(stacked.min()) and stats.max == float(stacked.max()), name
        assert stats.mean == pytest.approx(exact.mean(), rel=1e-6, abs=1e-6), name
        assert stats.std == pytest.approx(exact.std(), rel=1e-5), name
        per_sample = np.abs(exact).reshape(NUM_SAMPLES, -1).max(axis=1)
        np.testing.assert_array_equal(stats.sample_absmax, per_sample)


def test_per_channel_statistics_match_brute_force(fashion_stats, brute_force):
    for name, stacked in brute_force.items():
        stats = fashion_stats[name]
        assert stats.channel_axis == channel_axis(stacked.shape[1:])
        moved = np.moveaxis(stacked.astype(np.float64), stats.channel_axis + 1, 0)
        flat = moved.reshape(moved.shape[0], -1)
        np.testing.assert_array_equal(stats.per_channel_min, flat.min(axis=1))
        np.testing.assert_array_equal(stats.per_channel_max, flat.max(axis=1))
        np.testing.assert_allclose(stats.per_channel_mean, flat.mean(axis=1), rtol=1e-5, atol=1e-6)


def test_histograms_equal_a_direct_histogram_at_the_final_range(fashion_stats, brute_force):
    doubled = 0
    for name, stacked in brute_force.items():
        stats = fashion_stats[name]
        first_range = 2.0 ** math.frexp(float(np.abs(stacked[0]).max()))[1]
        doubled += stats.hist_range > first_range
        assert stats.hist_range > stats.absmax and math.log2(stats.hist_range).is_integer()
        assert int(stats.histogram.sum()) == stats.count
        np.testing.assert_array_equal(stats.histogram, _direct_histogram(stacked, stats.hist_range))
    assert doubled >= 5  # the growing inputs forced merges in most tensors


def _direct_histogram(values: np.ndarray, hist_range: float, bins: int = BINS) -> np.ndarray:
    index = np.floor(values.astype(np.float64).ravel() * (bins / (2 * hist_range))).astype(np.int64) + bins // 2
    return np.bincount(index, minlength=bins)


def test_histogram_doubling_merge_is_exact():
    rng = np.random.default_rng(3)
    chunks = [(rng.standard_normal(5000) * 10.0 ** k).astype(np.float32) for k in range(-4, 4)]
    chunks.append(np.array([4.0, -4.0, 0.5, -0.5, 2.0 ** -30, -(2.0 ** -30), 0.0], dtype=np.float32))
    grown = PowerOfTwoHistogram(BINS)
    for chunk in chunks:
        grown.add(chunk)
    everything = np.concatenate(chunks)
    direct = PowerOfTwoHistogram(BINS, hist_range=grown.range)
    direct.add(everything)
    assert grown.range == 2.0 ** math.frexp(float(np.abs(everything).max()))[1]
    np.testing.assert_array_equal(grown.counts, direct.counts)
    np.testing.assert_array_equal(grown.counts, _direct_histogram(everything, grown.range))


def test_histogram_range_is_strictly_above_max_and_at_least_the_minimum():
    histogram = PowerOfTwoHistogram(16)
    histogram.add(np.array([4.0, -1.0], dtype=np.float32))
    assert histogram.range == 8.0
    assert PowerOfTwoHistogram(16, hist_range=None).bins == 16
    zeros = PowerOfTwoHistogram(16)
    zeros.add(np.zeros(3, dtype=np.float32))
    assert zeros.range == 2.0 ** -20 and zeros.counts[8] == 3
    with pytest.raises(ArgumentError):
        PowerOfTwoHistogram(1000)
    with pytest.raises(ArgumentError):
        PowerOfTwoHistogram(16, hist_range=3.0)


def test_channel_axis_rules():
    assert channel_axis([1, 16, 28, 28]) == 1
    assert channel_axis([1, 64, 100]) == 1  # NCW: channels fewer than samples
    assert channel_axis([1, 128, 384]) == 1
    assert channel_axis([1, 512, 64]) == 2  # token-major [1, S, H]
    assert channel_axis([1, 10]) == 1
    assert channel_axis([7]) == 0
    assert channel_axis([]) is None


def test_tensor_selection_and_unknown_names(fashion_mblt):
    stats = collect_statistics(fashion_mblt, _samples(2), num_samples=2, tensors=["Relu_0", "logits"])
    assert list(stats.tensors) == ["Relu_0", "logits"]
    with pytest.raises(ArgumentError, match="no_such_tensor"):
        collect_statistics(fashion_mblt, _samples(2), num_samples=2, tensors=["no_such_tensor"])


def test_bad_samples_name_the_input_and_the_sample(fashion_mblt):
    with pytest.raises(CalibrationError, match="'image'"):
        collect_statistics(fashion_mblt, [{"other": np.zeros((1, 1, 28, 28), np.float32)}], num_samples=1)
    with pytest.raises(CalibrationError, match=r"sample 1: input 'image' has shape \[1, 28, 28\]"):
        samples = [_samples(1)[0], {"image": np.zeros((1, 28, 28), np.float32)}]
        collect_statistics(fashion_mblt, samples, num_samples=2)
    with pytest.raises(CalibrationError, match="no sample"):
        collect_statistics(fashion_mblt, [], num_samples=4)


def test_fewer_samples_than_requested_are_used_with_a_warning(fashion_mblt, caplog):
    with caplog.at_level(logging.WARNING):
        stats = collect_statistics(fashion_mblt, _samples(3), num_samples=8)
    assert stats.num_samples == 3 and "Only 3" in caplog.text


def test_model_bytes_and_nonfinite_values(caplog):
    graph = helper.make_graph([helper.make_node("Log", ["x"], ["y"])], "log",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    samples = [{"x": np.array([[0.0, 1.0, np.e, 4.0]], np.float32)}] * 2
    with caplog.at_level(logging.WARNING):
        stats = collect_statistics(data, samples, num_samples=2, dataset_fingerprint="fp")
    log_stats = stats["y"]
    assert log_stats.nonfinite == 2 and log_stats.count == 6
    assert log_stats.min == 0.0 and log_stats.max == pytest.approx(math.log(4.0))
    assert stats.dataset_fingerprint == "fp" and "NaN or inf" in caplog.text


# ---------------------------------------------------------------------------------------------------
# progress, cancellation, persistence


def test_progress_reports_every_sample(fashion_mblt):
    events = []
    collect_statistics(fashion_mblt, _samples(4), num_samples=4, reporter=Reporter(events.append))
    calibrate = [event for event in events if event.stage == "calibrate"]
    assert {event.total for event in calibrate} == {4}
    assert [event.done for event in calibrate] == [0, 1, 2, 3, 4, 4]


def test_cancellation_between_samples_raises(fashion_mblt):
    token, seen = CancelToken(), []

    def on_event(event):
        seen.append(event.done)
        if event.done == 3:
            token.cancel()

    with pytest.raises(CancelledError):
        collect_statistics(fashion_mblt, _samples(), num_samples=NUM_SAMPLES, reporter=Reporter(on_event, token))
    assert max(seen) == 3


def test_save_load_round_trip(fashion_stats, tmp_path):
    path = fashion_stats.save(tmp_path / "stats.npz")
    loaded = StatisticsSet.load(path)
    _assert_same(loaded, fashion_stats)
    assert json.loads(json.dumps(loaded.to_dict()))["tensors"]["Relu_0"]["min"] == 0.0


def _assert_same(left: StatisticsSet, right: StatisticsSet) -> None:
    assert (left.num_samples, left.mblt_sha256, left.dataset_fingerprint) == \
        (right.num_samples, right.mblt_sha256, right.dataset_fingerprint)
    assert list(left.tensors) == list(right.tensors)
    for name, stats in left.tensors.items():
        other = right[name]
        for field in ("name", "shape", "channel_axis", "min", "max", "count", "mean", "std", "hist_range", "nonfinite"):
            assert getattr(stats, field) == getattr(other, field), (name, field)
        for field in ("per_channel_min", "per_channel_max", "per_channel_mean", "histogram", "sample_absmax"):
            np.testing.assert_array_equal(getattr(stats, field), getattr(other, field))


def test_load_rejects_garbage(tmp_path):
    path = tmp_path / "bad.npz"
    path.write_bytes(b"not a zip file")
    with pytest.raises(CalibrationError):
        StatisticsSet.load(path)


# ---------------------------------------------------------------------------------------------------
# cache


def test_cache_hit_returns_identical_stats_without_inference(fashion_mblt, tmp_path):
    cache, dataset = StatisticsCache(tmp_path / "cache"), CountingDataset(_samples(4))
    first, hit_first = collect_statistics_cached(fashion_mblt, dataset, cache=cache)
    second, hit_second = collect_statistics_cached(fashion_mblt, dataset, cache=cache)
    assert (hit_first, hit_second) == (False, True)
    assert dataset.iterations == 1
    _assert_same(first, second)
    assert len(cache) == 1


def test_cache_key_covers_data_bins_and_sample_count():
    base = statistics_cache_key("a" * 64, "data", histogram_bins=2048, num_samples=16)
    assert base != statistics_cache_key("b" * 64, "data", histogram_bins=2048, num_samples=16)
    assert base != statistics_cache_key("a" * 64, "other", histogram_bins=2048, num_samples=16)
    assert base != statistics_cache_key("a" * 64, "data", histogram_bins=1024, num_samples=16)
    assert base != statistics_cache_key("a" * 64, "data", histogram_bins=2048, num_samples=8)
    assert base == statistics_cache_key("a" * 64, "data", histogram_bins=2048, num_samples=16)


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    assert StatisticsCache().root == tmp_path / "statistics"


def test_corrupt_cache_entry_is_ignored_and_removed(fashion_mblt, tmp_path, caplog):
    cache, dataset = StatisticsCache(tmp_path), CountingDataset(_samples(2))
    collect_statistics_cached(fashion_mblt, dataset, cache=cache)
    entry = cache.entries()[0]
    entry.write_bytes(b"\x00garbage")
    with caplog.at_level(logging.WARNING):
        assert cache.get(entry.stem) is None
    assert not entry.exists() and "unreadable" in caplog.text
    _, hit = collect_statistics_cached(fashion_mblt, dataset, cache=cache)
    assert not hit and dataset.iterations == 2 and entry.exists()


def test_cache_keeps_only_the_most_recent_entries(fashion_stats, tmp_path):
    cache = StatisticsCache(tmp_path, max_entries=2)
    for age, key in enumerate(["old", "middle", "new"]):
        path = cache.put(key, fashion_stats)
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    cache.put("newest", fashion_stats)
    assert [path.stem for path in cache.entries()] == ["newest", "new"]
    assert cache.clear() == 2 and len(cache) == 0


# ---------------------------------------------------------------------------------------------------
# observers


def _stats_of(samples: list[np.ndarray], name: str = "t") -> TensorStats:
    accumulator = TensorAccumulator(name, BINS)
    for sample in samples:
        accumulator.update(sample)
    return accumulator.result()


@pytest.fixture(scope="module")
def gaussian_with_outliers() -> tuple[TensorStats, float, float]:
    rng = np.random.default_rng(7)
    samples = [rng.standard_normal((1, 16, 64, 64)).astype(np.float32) for _ in range(32)]
    samples[3][0, 2, 5, 5], samples[10][0, 7, 1, 1] = 64.0, -60.0
    magnitudes = np.abs(np.concatenate([s.ravel() for s in samples]))
    return _stats_of(samples), float(np.quantile(magnitudes, 0.99)), 64.0


def test_max_returns_the_outlier(gaussian_with_outliers):
    stats, _, outlier = gaussian_with_outliers
    assert observe(stats, "max") == (-outlier, outlier)
    assert observe(stats, "max", symmetric=False) == (-60.0, outlier)


@pytest.mark.parametrize("mode", ["max_percentile", "histogram", "mse"])
@pytest.mark.parametrize("symmetric", [True, False])
def test_robust_modes_clip_outliers_but_keep_the_bulk(gaussian_with_outliers, mode, symmetric):
    stats, p99, outlier = gaussian_with_outliers
    lo, hi = observe(stats, mode, symmetric=symmetric)
    assert p99 < hi < outlier / 2, (mode, lo, hi)
    assert -outlier / 2 < lo < -p99, (mode, lo, hi)


@pytest.mark.parametrize("mode", list(OBSERVERS))
def test_non_negative_tensor_gives_lo_zero(mode):
    rng = np.random.default_rng(1)
    stats = _stats_of([np.abs(rng.standard_normal((1, 8, 16, 16))).astype(np.float32) for _ in range(8)])
    lo, hi = observe(stats, mode, symmetric=False)
    assert lo == 0.0 and 1.0 < hi <= stats.max
    lo, hi = observe(stats, mode, symmetric=True)
    assert lo == -hi and hi > 1.0


@pytest.mark.parametrize("mode", list(OBSERVERS))
@pytest.mark.parametrize("value", [3.0, 0.0, -2.0, 1e-9])
@pytest.mark.parametrize("symmetric", [True, False])
def test_constant_tensors_get_a_valid_range(mode, value, symmetric):
    stats = _stats_of([np.full((1, 4, 3, 3), value, np.float32)] * 3)
    lo, hi = observe(stats, mode, symmetric=symmetric)
    assert math.isfinite(lo) and math.isfinite(hi)
    assert lo <= 0.0 <= hi and hi - lo >= MIN_RANGE
    assert lo <= value <= hi or abs(value) < MIN_RANGE


def test_every_mode_gives_valid_ranges_on_a_real_model(fashion_stats):
    for mode in OBSERVERS:
        for symmetric in (True, False):
            ranges = observe_all(fashion_stats, mode, symmetric=symmetric)
            assert set(ranges) == set(fashion_stats.tensors)
            for name, (lo, hi) in ranges.items():
                stats = fashion_stats[name]
                assert lo <= 0.0 <= hi and hi > lo and math.isfinite(lo) and math.isfinite(hi), (mode, name)
                assert hi <= stats.absmax + 1e-9 and lo >= -stats.absmax - 1e-9
                if not symmetric and stats.min >= 0:
                    assert lo == 0.0


def test_mode_lookup_accepts_names_numbers_and_the_config_enum(fashion_stats):
    stats = fashion_stats["Conv_1"]
    assert observe(stats, CalibrationMode.Histogram) == observe(stats, 2) == observe(stats, "histogram")
    assert mode_name(CalibrationMode.Mse) == "mse" and mode_name(1) == "max_percentile"
    with pytest.raises(ArgumentError):
        observe(stats, "entropy")
    with pytest.raises(ArgumentError, match="0.9999, not 99.99"):
        observe(stats, "max_percentile", percentile=99.99)


def test_kl_search_on_2048_bins_is_fast(gaussian_with_outliers):
    stats, _, _ = gaussian_with_outliers
    best = min(_timed(lambda: histogram_observer(stats)) for _ in range(3))
    assert best < 0.05


def _timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started

