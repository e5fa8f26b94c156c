"""Tile-level simulator vs golden executor on every model of the real-model corpus and every core mode.

For each entry of ``tests/corpus.py`` (the models ``bench/corpus.py`` compiles), in its own child
process: parse, compile for aries-rb with every core mode (``inference_scheme="all"``, the entry's
preset and CPU offload, :data:`N_CALIB` real calibration samples), then run one held-out real input
through the golden executor and through the tile-level program of each core mode
(:func:`compiler_core.runtime.tilesim.run_tiles`: every DMA and every tile, from the arena) and
compare the output codes bit for bit. A CPU head runs first (onnxruntime), as in ``runtime.Model``.

Models refused before compiling (``UNSUPPORTED_OPS`` at parse or check) or whose package is
missing are listed as skipped with the reason; anything else that stops a model is a failure.
Results go to ``build/tile_exact/results.json`` (merged per model); the exit status is 1 when any mode of any model
differs or fails.

Usage: ``python bench/tile_exact.py [--models a,b] [--timeout 1800]`` (``make tile-exact``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

DEVICE = "aries-rb"
N_CALIB = 4
RESULTS = REPO_ROOT / "build" / "tile_exact" / "results.json"
DEFAULT_TIMEOUT = 1800


def check_model(name: str) -> dict:
    """Compile one corpus entry with every core mode and compare each mode's tile program with golden codes."""
    import corpus
    import numpy as np
    from realmodels import RealModelUnavailable

    from compiler_core.api import mblt_compile, mxq_compile
    from compiler_core.errors import QBCompilerError
    from compiler_core.quantization import executor
    from compiler_core.runtime.artifact import load_artifact
    from compiler_core.runtime.tilesim import run_tiles
    from compiler_core.targets import get_device

    entry = corpus.corpus_by_name()[name]
    row: dict = {"name": name}
    with tempfile.TemporaryDirectory(prefix=f"tile-exact-{name}-") as folder:
        scratch = Path(folder)
        try:
            mblt = mblt_compile(entry.source(), scratch / "m.mblt", input_shape_dict=entry.input_shape_dict or None,
                                constant_inputs=entry.constant_inputs or None)
            specs = corpus._mblt_inputs(mblt)
            verdict = corpus._verdict(mblt)["verdict"]
            manifest = corpus.write_manifest(scratch / "calib",
                                             [entry.feed(specs, "calib", index) for index in range(N_CALIB)])
            feeds = entry.feed(specs, "eval", 0)
            started = time.perf_counter()
            mxq_compile(mblt, target_device=DEVICE, calib_data_path=manifest, save_path=scratch / "m.mxq",
                        config_preset=entry.preset, cpu_offload=entry.cpu_offload or verdict == "cpu_offload",
                        analysis_holdout=0, inference_scheme="all")
            row["compile_seconds"] = round(time.perf_counter() - started, 1)
        except RealModelUnavailable as error:
            return {**row, "skipped": f"package missing: {error}"}
        except QBCompilerError as error:
            if error.code == "UNSUPPORTED_OPS":
                return {**row, "skipped": f"refused before compiling: {error.code}"}
            return {**row, "error": f"{error.code}: {error}"}
        artifact = load_artifact(scratch / "m.mxq")
        env = dict(feeds)
        artifact._run_cpu("head", env)
        codes = artifact._body_inputs(env)
        golden = executor.execute(artifact.program, dict(codes))
        device = get_device(DEVICE)
        row.update(layers=len(artifact.npu.layers), modes={})
        for mode in artifact.npu.commands:
            started = time.perf_counter()
            outputs = run_tiles(artifact.program, artifact.npu, device, mode, codes)
            differing = [spec.name for spec in artifact.program.outputs
                         if not np.array_equal(outputs[spec.name], golden[spec.name])]
            row["modes"][mode] = {"exact": not differing, "differing": differing,
                                  "seconds": round(time.perf_counter() - started, 1)}
    return row


def _run_child(name: str, timeout: float) -> dict:
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True,
                              timeout=timeout, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return {"name": name, "error": f"TIMEOUT: no result within {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"name": name, "error": f"CRASH: child exited {done.returncode}: {(done.stderr or done.stdout)[-800:]}"}
    row = json.loads(lines[-1][len("RESULT "):])
    row["wall_seconds"] = round(time.perf_counter() - started, 1)
    return row


def _line(row: dict) -> str:
    if "skipped" in row:
        return f"{row['name']:<20} skipped ({row['skipped']})"
    if "error" in row:
        return f"{row['name']:<20} FAILED {row['error']}"
    cells = [f"{mode} {'exact' if entry['exact'] else 'DIFFERS ' + ','.join(entry['differing'])} "
             f"({entry['seconds']} s)" for mode, entry in row["modes"].items()]
    return f"{row['name']:<20} {row['layers']:>4} layers  " + "  ".join(cells)


def main(argv: list[str] | None = None) -> int:
    """Run every corpus model (or ``--models``) and print one line per model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per model")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        import logging

        logging.basicConfig(level=logging.WARNING)
        print("RESULT " + json.dumps(check_model(args.one)), flush=True)
        return 0
    import corpus

    names = [entry.name for entry in corpus.corpus()]
    if args.models:
        unknown = sorted(set(args.models.split(",")) - set(names))
        if unknown:
            parser.error(f"unknown model(s): {', '.join(unknown)}")
        names = [name for name in names if name in args.models.split(",")]
    started, rows = time.perf_counter(), {}
    try:  # merged per model, so a subset run updates its rows
        stored = json.loads(RESULTS.read_text())["models"]
    except (OSError, ValueError, KeyError):
        stored = {}
    for name in names:
        rows[name] = _run_child(name, args.timeout)
        print(_line(rows[name]), flush=True)
    total = time.perf_counter() - started
    failed = [name for name, row in rows.items()
              if "error" in row or any(not entry["exact"] for entry in row.get("modes", {}).values())]
    checked = sum(1 for row in rows.values() if row.get("modes"))
    print(f"\n{checked} models x every core mode checked, {len(failed)} failing"
          f"{' (' + ', '.join(failed) + ')' if failed else ''}, "
          f"{sum('skipped' in row for row in rows.values())} skipped; {total:.0f} s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"device": DEVICE, "seconds": round(total), "models": {**stored, **rows}}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
