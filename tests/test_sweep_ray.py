"""The Ray sweep executor: a 4-point sweep on a local Ray instance gives the process pool's metrics and programs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compiler_core.errors import ArgumentError
from compiler_core.mxq import read_mxq
from compiler_core.sweep import RayExecutor, make_executor, run_sweep

ray = pytest.importorskip("ray", reason="the optional 'ray' extra is not installed")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "resources" / "samples" / "fashion_cnn"
GRID = {"baseConfig": str(SAMPLE / "compile_config.yaml"),
        "axes": {"calibrationMode": [0, 1], "biasCorrection": [False, True]}}
METRIC_KEYS = ("status", "axes", "settings", "outputs", "worst_sqnr_db", "top1_agreement", "estimate",
               "mxq_size_bytes", "int16_layers", "statistics_from_cache")


def test_ray_and_the_process_pool_give_the_same_4_point_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))  # Ray workers and pool workers inherit it
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # Each MXQ's meta records its own save path; folders of equal name length keep the MXQ sizes comparable
    # (the meta section is padded, so a one-character difference can cross a padding boundary on some paths).
    pool = run_sweep(GRID, tmp_path / "pool", model=SAMPLE / "model.onnx", calib_data_path=SAMPLE / "calib",
                     executor=make_executor("local", 2))
    events = []
    on_ray = run_sweep(GRID, tmp_path / "rays", mblt=pool.mblt, calib_data_path=SAMPLE / "calib",
                       executor=make_executor("ray", 2), callback=events.append)
    assert not ray.is_initialized()  # the local instance started for the sweep is stopped again
    failures = [(r["name"], r.get("error")) for r in on_ray.records if r["status"] != "ok"]
    assert len(on_ray.records) == 4 and not failures, failures
    assert on_ray.calibrations == 0  # the pool's sweep filled the cache; Ray points only re-quantize
    for first, second in zip(pool.records, on_ray.records):
        assert {key: first[key] for key in METRIC_KEYS} == {key: second[key] for key in METRIC_KEYS}
        ours, theirs = read_mxq(first["mxq"]), read_mxq(second["mxq"])  # the meta names each sweep's own paths
        assert ours.program == theirs.program and ours.consts.keys() == theirs.consts.keys()
        assert all(np.array_equal(ours.consts[name], theirs.consts[name]) for name in ours.consts)
    assert json.loads(on_ray.json_path.read_text())["pareto_front"] == pool.front
    assert any(event.stage == "point-03/queued" for event in events)


def test_make_executor_builds_a_ray_executor_and_checks_workers():
    executor = make_executor("ray", 3, "auto")
    assert isinstance(executor, RayExecutor) and executor.max_workers == 3 and executor.address == "auto"
    with pytest.raises(ArgumentError, match="at least 1"):
        RayExecutor(0)
    with pytest.raises(ArgumentError, match="local, inprocess or ray"):
        make_executor("dask")
