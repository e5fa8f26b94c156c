"""Settings sweeps on the bundled sample: grid files, one calibration for all points, cancel, Pareto, reproduction."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from compiler_core.errors import CancelledError, ConfigError
from compiler_core.progress import CancelToken
from compiler_core.sweep import expand_grid, load_grid, make_executor, pareto_front, run_sweep
from compiler_core.sweep.grid import base_config, differing_settings

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "resources" / "samples" / "fashion_cnn"
BASE = str(SAMPLE / "compile_config.yaml")


# -- Pareto front (pure) --------------------------------------------------------------------------


def test_pareto_front_keeps_only_points_no_other_point_beats_on_both_axes():
    accuracy = [30.0, 35.0, 32.0, 40.0, 29.0]
    latency = [1.0, 2.0, 2.0, 3.0, 0.5]
    assert pareto_front(accuracy, latency) == [4, 0, 1, 3]  # point 2 loses to point 1 (same latency, less accurate)


def test_pareto_front_drops_missing_values_keeps_exact_duplicates_and_rejects_mismatched_lengths():
    assert pareto_front([10.0, None, 10.0, float("nan")], [1.0, 0.1, 1.0, 0.1]) == [0, 2]
    assert pareto_front([20.0, 20.0], [1.0, 2.0]) == [0]  # equally accurate but slower: dominated
    assert pareto_front([], []) == []
    with pytest.raises(ValueError, match="2 accuracy values but 1 latency"):
        pareto_front([1.0, 2.0], [1.0])


# -- grids ----------------------------------------------------------------------------------------


def test_grid_expands_the_product_applies_percentile_only_in_percentile_mode_and_names_int16_sets():
    grid, _ = load_grid({"baseConfig": BASE, "axes": {
        "calibrationMode": [0, 1], "percentile": [0.999, 0.99999],
        "int16Layers": {"none": [], "stem": ["Conv_0*"]}}})
    points = expand_grid(grid)
    assert len(points) == 6  # mode 0 x 2 int16 sets + mode 1 x 2 percentiles x 2 sets
    assert [p.name for p in points] == [f"point-{i:02d}" for i in range(6)]
    assert points[0].values == {"calibrationMode": 0, "int16Layers": "none"}
    stem = [p for p in points if p.values["int16Layers"] == "stem"]
    assert all(p.config.bit.layer_overrides.activation16_bits == ["Conv_0*"] for p in stem)
    base = base_config(grid)
    percentile_point = next(p for p in points if p.values.get("percentile") == 0.999)
    assert differing_settings(percentile_point.config, base) == {"calibration.maxPercentile.percentile": 0.999}
    assert points[0].config.target_device == "aries-rb"  # from the base config file


def test_grid_preset_axis_sits_under_the_base_config_and_dotted_keys_work():
    grid, _ = load_grid({"baseConfig": {"targetDevice": "aries-rb"},
                         "axes": {"preset": ["classification", "detection"],
                                  "calibration.maxPercentile.topkRatio": [0.05]}})
    points = expand_grid(grid)
    assert [p.config.layer_bias_correction.apply for p in points] == [True, False]
    assert [int(p.config.calibration.output) for p in points] == [0, 1]
    assert all(p.config.calibration.max_percentile.topk_ratio == 0.05 for p in points)


@pytest.mark.parametrize(("text", "expected"), [
    ("axes: {calibrationMood: [0, 1]}", "unknown axis 'calibrationMood'"),
    ("axes: {calibrationMode: []}", "axis 'calibrationMode' has no values"),
    ("axes: {calibrationMode: [0]}\nbase: x.yaml", "base"),
    ("axes: [calibrationMode", ""),
    ("baseConfig: {targetDevice: aries-rb}\naxes: {calibrationMode: [0, 7]}", "calibration.mode"),
    ("maxPoints: 2\naxes: {calibrationMode: [0, 2, 3]}", "3 points, more than maxPoints (2)"),
    ("baseConfig: missing.yaml\naxes: {calibrationMode: [0]}", "missing.yaml"),
])
def test_bad_grid_files_raise_config_error_naming_the_problem(tmp_path, text, expected):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        grid, folder = load_grid(path)
        expand_grid(grid, folder=folder)
    assert caught.value.code == "CONFIG_ERROR" and expected in caught.value.message


def test_cli_reports_a_bad_grid_as_one_error_line(tmp_path, capsys):
    from compiler_core.cli import run

    grid = tmp_path / "sweep.yaml"
    grid.write_text("axes: {calibrationMood: [0, 1]}")
    code = run(["sweep", "--model", str(SAMPLE / "model.onnx"), "--grid", str(grid), "--output-dir",
                str(tmp_path / "out"), "--calib-data-path", str(SAMPLE / "calib")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("ERROR [CONFIG_ERROR]: sweep.yaml: ") and "calibrationMood" in err[-1]
    assert not (tmp_path / "out").exists()


# -- a real sweep in worker processes -------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    cache = folder / "cache"
    saved = os.environ.get("QBCOMPILER_CACHE_DIR")
    os.environ["QBCOMPILER_CACHE_DIR"] = str(cache)  # spawned workers inherit it
    events, streamed = [], []
    try:
        result = run_sweep({"baseConfig": BASE, "axes": {"calibrationMode": [0, 1, 2]}}, folder / "out",
                           model=SAMPLE / "model.onnx", calib_data_path=SAMPLE / "calib", max_workers=2,
                           callback=events.append, on_point=streamed.append)
    finally:
        os.environ.pop("QBCOMPILER_CACHE_DIR") if saved is None else os.environ.update(QBCOMPILER_CACHE_DIR=saved)
    return result, events, streamed, cache


def test_sweep_calibrates_once_and_every_point_only_requantizes(sample_sweep):
    result, _, _, cache = sample_sweep
    assert [r["status"] for r in result.records] == ["ok"] * 3
    assert result.calibrations == 1
    assert all(r["statistics_from_cache"] for r in result.records)
    assert len(list((cache / "statistics").glob("*.npz"))) == 1


def test_sweep_records_hold_settings_metrics_estimates_and_files(sample_sweep):
    result, events, streamed, _ = sample_sweep
    first = result.records[0]
    assert first["settings"] == {"calibration.mode": 0}  # the sample's base config uses mode 1
    assert result.records[1]["settings"] == {}
    assert Path(first["mxq"]).is_file() and first["mxq_size_bytes"] == Path(first["mxq"]).stat().st_size
    assert first["estimate"]["single"]["latency_ms"] > 0 and "not measured" in first["estimate_note"]
    output = next(iter(first["outputs"].values()))
    assert {"sqnr_db", "cosine_mean", "top1_agreement", "top5_agreement"} <= set(output)
    assert first["worst_sqnr_db"] == output["sqnr_db"] and first["int16_layers"] == 0
    assert sorted(r["name"] for r in streamed) == ["point-00", "point-01", "point-02"]
    stages = {event.stage for event in events}
    assert "sweep" in stages and any(stage.startswith("point-01/") for stage in stages)


def test_sweep_files_list_every_point_and_mark_the_pareto_front(sample_sweep):
    result, _, _, _ = sample_sweep
    saved = json.loads(result.json_path.read_text())
    assert saved["points"] == 3 and saved["calibrations"] == 1
    expected = pareto_front([r["worst_sqnr_db"] for r in result.records], [r["latency_ms"] for r in result.records])
    assert saved["pareto_front"] == expected == result.front and expected
    assert [r["pareto"] for r in saved["records"]] == [i in expected for i in range(3)]
    rows = result.csv_path.read_text().splitlines()
    assert len(rows) == 4 and rows[0].startswith("index,name,status,settings,worst_sqnr_db")
    assert "single_latency_ms" in rows[0]


def test_the_copied_command_reproduces_the_point_byte_for_byte(sample_sweep, tmp_path):
    result, _, _, _ = sample_sweep
    record = result.records[2]
    original = Path(record["mxq"]).read_bytes()
    argv = shlex.split(record["command"])
    assert argv[:2] == ["qbcompiler", "compile"]
    env = {**os.environ, "QBCOMPILER_CACHE_DIR": str(tmp_path / "fresh-cache"),  # calibrates anew
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    Path(record["mxq"]).unlink()
    subprocess.run([sys.executable, "-m", "compiler_core", "-q", *argv[1:]], check=True, env=env,
                   capture_output=True)
    assert Path(record["mxq"]).read_bytes() == original


def test_cancel_keeps_finished_points_and_writes_the_results(tmp_path, monkeypatch):
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    token = CancelToken()
    grid = {"baseConfig": BASE, "axes": {"calibrationMode": [0, 1, 2, 3]}}
    with pytest.raises(CancelledError, match="Sweep cancelled") as caught:
        run_sweep(grid, tmp_path / "out", model=SAMPLE / "model.onnx", calib_data_path=SAMPLE / "calib",
                  executor=make_executor("local", 1), cancel_token=token, on_point=lambda record: token.cancel())
    records = json.loads((tmp_path / "out" / "sweep.json").read_text())["records"]
    statuses = [r["status"] for r in records]
    assert statuses.count("ok") >= 1 and statuses.count("cancelled") >= 2
    assert caught.value.fields["cancelled"] == statuses.count("cancelled")
    for record in records:
        assert Path(tmp_path / "out" / f"{record['name']}.mxq").exists() == (record["status"] == "ok")


def test_sweep_needs_exactly_one_model(tmp_path):
    from compiler_core.errors import ArgumentError

    with pytest.raises(ArgumentError, match="exactly one"):
        run_sweep({"axes": {"calibrationMode": [0]}}, tmp_path, calib_data_path=SAMPLE / "calib")


def test_cli_sweep_streams_one_point_line_per_point_then_the_result(sample_sweep, tmp_path, capsys, monkeypatch):
    from compiler_core.cli import run

    result, _, _, _ = sample_sweep
    monkeypatch.setenv("QBCOMPILER_JSONL", "1")
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    grid = tmp_path / "sweep.json"
    grid.write_text(json.dumps({"baseConfig": BASE, "axes": {"biasCorrection": [True]}}))
    code = run(["sweep", "--mblt", str(result.mblt), "--grid", str(grid), "--output-dir", str(tmp_path / "out"),
                "--calib-data-path", str(SAMPLE / "calib"), "--executor", "inprocess"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and [line["type"] for line in lines if line["type"] in ("point", "result")] == ["point", "result"]
    point, final = lines[-2], lines[-1]
    assert point["name"] == "point-00" and point["settings"] == {"layerBiasCorrection.apply": True}
    assert final["command"] == "sweep" and final["calibrations"] == 1 and final["pareto_front"] == [0]
