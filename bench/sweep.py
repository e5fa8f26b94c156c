"""Sweep benchmark: a 12-point settings sweep on MobileNetV2 beside one full compile, in the same run.

The peer is one ``qbcompiler compile`` of the source ONNX with the sweep's base config (parse,
calibration on an empty statistics cache, quantization, analysis, schedule, MXQ). The sweep is one
``qbcompiler sweep`` over 12 points (calibration mode x bias correction x int16 stem) with
``--workers`` worker processes, also from the source ONNX and an empty cache: it parses once,
calibrates once, then every point re-quantizes from the cached statistics. Each command runs in a
fresh Python process and is timed from outside (imports included). The issue's target is a sweep
in at most 3x the time of one compile on 2 cores. Printed: both wall times, their ratio, the
sweep's stage times (parse, calibrate, points), each point's own compile time and stage timings,
and the load average before and after (other work on the machine inflates both sides).

Usage: ``python bench/sweep.py [--workers 2] [--calib 64] [--keep DIR] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

import realdata  # noqa: E402
import realmodels  # noqa: E402

STEM = ["Conv_0", "Clip_0", "Conv_1", "Clip_1", "Conv_2"]


def _grid(base_config: Path) -> dict:
    return {"baseConfig": str(base_config), "preset": "classification",
            "axes": {"calibrationMode": [0, 1, 2], "biasCorrection": [False, True],
                     "int16Layers": {"none": [], "stem": STEM}}}


def _run(argv: list[str], cache: Path) -> float:
    env = {**os.environ, "QBCOMPILER_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "compiler_core", "-q", *argv], check=True, env=env, cwd=REPO_ROOT,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--calib", type=int, default=64, help="calibration photos")
    parser.add_argument("--keep", help="write the sweep here (kept) instead of a temporary folder")
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args()
    source = realmodels.mobilenet_v2_onnx()
    calib, _ = realdata.imagenet_photo_sets(args.calib, 40)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="qb-bench-sweep-") as scratch:
        scratch_path = Path(scratch)
        base = scratch_path / "base.json"
        base.write_text(json.dumps({"targetDevice": "aries-rb", "preprocessing": realdata.IMAGENET_PREPROCESSING}))
        grid = scratch_path / "grid.json"
        grid.write_text(json.dumps(_grid(base)))
        one = _run(["compile", "--model", str(source), "--calib-data-path", str(calib), "--config-preset",
                    "classification", "--compile-config", str(base), "--output", str(scratch_path / "one.mxq")],
                   scratch_path / "cache-one")
        output = Path(args.keep) if args.keep else scratch_path / "sweep"
        sweep = _run(["sweep", "--model", str(source), "--grid", str(grid), "--calib-data-path", str(calib),
                      "--output-dir", str(output), "--workers", str(args.workers)], scratch_path / "cache-sweep")
        result = json.loads((output / "sweep.json").read_text())
    _report(result, one, sweep, load_before, os.getloadavg(), args)


def _report(result: dict, one: float, sweep: float, load_before, load_after, args) -> None:
    records = result["records"]
    ok = [r for r in records if r["status"] == "ok"]
    print(f"MobileNetV2, {args.calib} calibration photos, {args.workers} workers, {os.cpu_count()} CPUs; "
          f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(f"one full compile:        {one:7.1f} s")
    print(f"{len(records)}-point sweep:          {sweep:7.1f} s  = {sweep / one:.2f}x one compile (target <= 3x); "
          f"{len(ok)} ok, {result['calibrations']} calibration run(s)")
    print(f"  sweep stages: {json.dumps(result['seconds'])}")
    costs = [r["compile_seconds"] for r in ok]
    if costs:
        print(f"  per point: median {statistics.median(costs):.1f} s, min {min(costs):.1f} s, max {max(costs):.1f} s "
              f"(all from cached statistics: {all(r['statistics_from_cache'] for r in ok)})")
    for record in records:
        print(f"  {record['name']} {record['status']:9s} {record['compile_seconds']:6.1f} s  "
              f"SQNR {record.get('worst_sqnr_db') or float('nan'):5.1f} dB  "
              f"top-1 {record.get('top1_agreement') or float('nan'):.2f}  "
              f"{record.get('latency_ms') or float('nan'):.3f} ms (est.)  {'front' if record.get('pareto') else '     '}  "
              f"{json.dumps(record.get('timings', {}))}  {record['axes']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"one_compile_seconds": one, "sweep_seconds": sweep, "ratio": sweep / one,
                                               "load_before": load_before, "load_after": load_after,
                                               "sweep": {k: result[k] for k in ("seconds", "calibrations", "points")},
                                               "point_seconds": costs}, indent=2))


if __name__ == "__main__":
    main()
