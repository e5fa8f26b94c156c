"""Mixed precision judged on the worst held-out sample, and the photo-with-text splits of the PP-OCR det bench.

The outlier model (``test_sensitivity_amp``) has one convolution whose output carries a channel 1000x wider
than the others: int8 loses its useful channels, int16 restores them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler_core.api import mxq_compile
from compiler_core.calibration.cache import CACHE_DIR_ENV
from compiler_core.cli import _mixed_precision_option
from compiler_core.config import CompileConfig
from compiler_core.errors import ConfigError
from compiler_core.quantization.mixed_precision import target_metric

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # after tests/: bench/corpus.py is the bench

import test_sensitivity_amp  # noqa: E402
from test_sensitivity_amp import _model_and_data  # noqa: E402


@pytest.fixture(autouse=True)
def statistics_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(test_sensitivity_amp, "RNG", np.random.default_rng(11))  # the same model in any test order


def test_target_metric_takes_the_worst_sample_or_the_mean():
    analysis = {"outputs": {"a": {"cosine_mean": 0.995, "cosine_min": 0.97},
                            "b": {"cosine_mean": 0.999, "cosine_min": 0.98}}}
    assert target_metric(analysis, "cosine") == 0.995
    assert target_metric(analysis, "cosine", "worst") == 0.97


def test_worst_statistic_needs_a_cosine_target(tmp_path):
    mblt, calib = _model_and_data(tmp_path, 1000.0)
    with pytest.raises(ConfigError, match="worst"):
        mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "m.mxq",
                    analysis_holdout=6, mixed_precision_config={
                        "apply": True, "target": {"kind": "sqnrDb", "value": 20.0, "statistic": "worst"}})


def test_cli_passes_the_statistic_into_the_target():
    args = argparse.Namespace(mixed_precision="cosine=0.99", max_int16_fraction=None, latency_budget=None,
                              mixed_precision_statistic="worst")
    assert _mixed_precision_option(args)["target"] == {"kind": "cosine", "value": 0.99, "statistic": "worst"}


def test_mixed_precision_on_the_worst_sample_meets_the_target_on_every_held_out_sample(tmp_path):
    mblt, calib = _model_and_data(tmp_path, 1000.0)
    result = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "m.mxq",
                         analysis_holdout=6, mixed_precision_config={
                             "apply": True, "maxInt16Fraction": 0.7,
                             "target": {"kind": "cosine", "value": 0.995, "statistic": "worst"}})
    mixed = result.mixed_precision
    assert mixed["target_met"]
    for point in mixed["points"]:  # every point is judged on its worst sample, which is below its mean
        outputs = point["outputs"].values()
        assert point["metric"] == min(row["cosine_min"] for row in outputs)
        assert point["metric"] <= min(row["cosine_mean"] for row in outputs)
    assert mixed["points"][0]["metric"] < 0.995 <= mixed["points"][mixed["chosen"]]["metric"]
    assert target_metric(result.quantize.analysis, "cosine", "worst") >= 0.995  # the compiled program too


def test_the_search_split_is_exactly_what_the_compiler_holds_out(tmp_path):
    import corpus
    from quant_accuracy import amp_manifest

    from compiler_core.mblt.io import load_mblt
    from compiler_core.progress import Reporter
    from compiler_core.quantization.run import _open_dataset, _split

    mblt, _ = _model_and_data(tmp_path, 1.0)
    spec = corpus._mblt_inputs(mblt)[0]
    calibration = [{spec.name: np.full(spec.shape, index, np.float32)} for index in range(12)]
    search = [{spec.name: np.full(spec.shape, 100 + index, np.float32)} for index in range(4)]
    manifest = amp_manifest(tmp_path / "calib", calibration, search)
    dataset = _open_dataset(load_mblt(mblt), CompileConfig(), manifest, Reporter(None))
    kept, held = _split(dataset, CompileConfig(analysis_holdout=4))
    tags = [[float(part.sample(i)[spec.name].flat[0]) for i in range(len(part))] for part in (kept, held)]
    assert tags == [list(range(12)), [100.0, 101.0, 102.0, 103.0]]  # both in order, ours = onnxruntime's


def test_text_photo_splits_share_no_photograph_and_samples_are_reproducible():
    import text_photos

    pytest.importorskip("skimage")
    splits = {name: set(photos) for name, photos in text_photos.PHOTO_SPLITS.items()}
    assert not (splits["calib"] & splits["search"] or splits["calib"] & splits["eval"]
                or splits["search"] & splits["eval"])
    assert {"astronaut", "chelsea"} <= splits["calib"] | splits["eval"]
    first = text_photos.text_photo("calib", 0, 96, 64)  # the astronaut, a scikit-image photo
    assert first.shape == (64, 96, 3) and first.dtype == np.uint8
    assert np.array_equal(first, text_photos.text_photo("calib", 0, 96, 64))
    again = text_photos.text_photo("calib", len(text_photos.PHOTO_SPLITS["calib"]), 96, 64)  # same photo, next view
    assert np.abs(first.astype(float) - again).mean() > 5
