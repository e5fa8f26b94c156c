"""Real-model corpus benchmark: support check, aries-rb compile and accuracy of every corpus model.

For each entry of ``tests/corpus.py`` (models shipped in pip packages, real inputs), through the
public API only:

1. parse the source with ``mblt_compile`` (shapes and constants of the entry);
2. ``check_support(MBLT, "aries-rb")``: node counts per status, and the verdict ``supported``,
   ``cpu_offload`` (a head/tail must run on the CPU; the compile then gets ``cpu_offload=True``) or
   ``unsupported`` (blocked nodes inside the NPU body);
3. ``mxq_compile`` for aries-rb on the entry's calibration samples (``N_CALIB`` real inputs written
   as ``.npy`` + JSON manifest), timed;
4. the held-out samples (``N_EVAL``, disjoint sources) through the MXQ (``runtime.Model``, the bit-exact
   simulator) and through onnxruntime on the MBLT (the FP32 reference): cosine per output, mean and min.

Each model runs in its own child process (a crash or a timeout of one model is recorded, the rest
go on). Any exception outside the ``QBCompilerError`` hierarchy is recorded as ``INTERNAL_ERROR``,
as the CLI reports it. Results go to ``build/corpus/results.json`` (merged per model, so a subset
run updates its rows); ``--markdown`` prints the table of ``docs/models.md`` from that file.

Usage: ``python bench/corpus.py [--models a,b] [--fast] [--timeout 900] [--markdown [--write docs/models.md]]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

DEVICE = "aries-rb"
RESULTS = REPO_ROOT / "build" / "corpus" / "results.json"
TARGET_COSINE = 0.99
DEFAULT_TIMEOUT = 1200


# ---------------------------------------------------------------------------------------------------
# One model (child process)


def _error(error: BaseException) -> dict:
    from compiler_core.errors import QBCompilerError

    if isinstance(error, QBCompilerError):
        return {"code": error.code, "message": str(error.message)[:600]}
    return {"code": "INTERNAL_ERROR", "message": f"Unexpected {type(error).__name__}: {error}"[:600],
            "traceback": traceback.format_exc(limit=6)[-1500:]}


def _mblt_inputs(mblt: Path):
    import onnx
    from corpus import InputSpec
    from onnx.helper import tensor_dtype_to_np_dtype

    graph = onnx.load(str(mblt), load_external_data=False).graph
    return [InputSpec(value.name, tuple(d.dim_value for d in value.type.tensor_type.shape.dim),
                      np.dtype(tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))) for value in graph.input]


def _verdict(mblt: Path) -> dict:
    from compiler_core.api import load_mblt
    from compiler_core.targets import check_support, plan_cpu_offload

    graph = load_mblt(mblt)
    report = check_support(graph, DEVICE)
    flagged = [entry for entry in report.entries.values() if entry.blocking]
    if not flagged:
        verdict = "supported"
    else:
        verdict = "unsupported" if plan_cpu_offload(graph, report).inner_unsupported else "cpu_offload"
    reasons = sorted({f"{entry.op_type}: {entry.reason}" for entry in flagged})
    return {"verdict": verdict, "counts": report.counts(), "nodes": len(report.entries), "flagged": reasons[:6]}


def _cosines(reference: list[np.ndarray], quantized: list[np.ndarray]) -> dict:
    flat_ref = np.stack([r.astype(np.float64).ravel() for r in reference])
    flat_q = np.stack([q.astype(np.float64).ravel() for q in quantized])
    norms = np.linalg.norm(flat_ref, axis=1) * np.linalg.norm(flat_q, axis=1)
    values = np.where(norms > 0, (flat_ref * flat_q).sum(1) / np.maximum(norms, 1e-30), 0.0)
    return {"mean": float(values.mean()), "min": float(values.min())}


def _accuracy(mblt: Path, mxq: Path, samples: list[dict]) -> dict:
    import realdata

    from compiler_core.runtime import Accelerator, Model

    session = realdata.ort_session(mblt)
    names = [output.name for output in session.get_outputs()]
    model = Model(mxq, input_layout="NCHW")  # NCHW: arrays are passed in the MBLT's own layout, untouched
    model.launch(Accelerator(DEVICE))
    reference, quantized = {n: [] for n in names}, {n: [] for n in names}
    for sample in samples:
        for name, value in zip(names, session.run(names, sample)):
            reference[name].append(np.asarray(value))
        for name, value in zip(names, model.infer(sample)):
            quantized[name].append(np.asarray(value))
    return {name: _cosines(reference[name], quantized[name]) for name in names}


def run_one(name: str) -> dict:
    """Every measurement of one corpus entry (never raises: failures are recorded with their code)."""
    import corpus
    from realmodels import RealModelUnavailable

    from compiler_core.api import mblt_compile, mxq_compile

    entry = corpus.corpus_by_name()[name]
    row = {"name": name, "task": entry.task, "package": entry.package, "licence": entry.licence,
           "data": entry.data, "preset": entry.preset or "default", "stage": "source"}
    scratch = Path(tempfile.mkdtemp(prefix=f"corpus-{name}-"))
    try:
        source = entry.source()
        row.update(source=source.name, format=source.suffix.lstrip("."), stage="parse")
        mblt = mblt_compile(source, scratch / f"{name}.mblt", input_shape_dict=entry.input_shape_dict or None,
                            constant_inputs=entry.constant_inputs or None)
        specs = _mblt_inputs(mblt)
        row["inputs"] = {spec.name: [list(spec.shape), spec.dtype.name] for spec in specs}
        row["stage"] = "check"
        row["check"] = _verdict(mblt)
        row["stage"] = "data"
        calib = [entry.feed(specs, "calib", index) for index in range(corpus.N_CALIB)]
        evaluation = [entry.feed(specs, "eval", index) for index in range(corpus.N_EVAL)]
        manifest = corpus.write_manifest(scratch / "calib", calib)
        row["stage"] = "compile"
        offload = entry.cpu_offload or row["check"]["verdict"] == "cpu_offload"
        row["cpu_offload"] = offload
        started = time.perf_counter()
        mxq_compile(mblt, target_device=DEVICE, calib_data_path=manifest, save_path=scratch / f"{name}.mxq",
                    config_preset=entry.preset, cpu_offload=offload, analysis_holdout=0)
        row["compile_seconds"] = round(time.perf_counter() - started, 1)
        row["compile"] = {"code": "OK"}
        row["stage"] = "run"
        row["cosine"] = _accuracy(mblt, scratch / f"{name}.mxq", evaluation)
        row["stage"] = "done"
    except RealModelUnavailable as error:
        row["unavailable"] = str(error)
    except Exception as error:  # every failure is a row of the table, not a crash of the bench
        row["compile_seconds"] = row.get("compile_seconds")
        row["error"] = {"stage": row["stage"], **_error(error)}
        if row["stage"] == "compile":
            row["compile"] = _error(error)
    return row


# ---------------------------------------------------------------------------------------------------
# Driver


def _run_child(name: str, timeout: float) -> dict:
    command = [sys.executable, __file__, "--one", name]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return {"name": name, "error": {"stage": "timeout", "code": "TIMEOUT",
                                        "message": f"no result within {timeout:.0f} s"}}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = (done.stderr or done.stdout)[-800:]
        return {"name": name, "error": {"stage": "crash", "code": "CRASH",
                                        "message": f"child exited {done.returncode}: {tail}"}}
    row = json.loads(lines[-1][len("RESULT "):])
    row["wall_seconds"] = round(time.perf_counter() - started, 1)
    return row


def load_results(path: Path = RESULTS) -> dict[str, dict]:
    """The stored rows by model name (empty when none were written yet)."""
    try:
        return json.loads(path.read_text())["models"]
    except (OSError, ValueError, KeyError):
        return {}


def save_results(rows: dict[str, dict], path: Path = RESULTS) -> None:
    """Write ``rows`` (merged over earlier runs) with the commit they were measured on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=REPO_ROOT).stdout.strip()
    path.write_text(json.dumps({"device": DEVICE, "commit": commit, "models": rows}, indent=1))


def _compile_cell(row: dict) -> str:
    if "unavailable" in row:
        return "unavailable"
    if row.get("compile", {}).get("code") == "OK":
        return "ok"
    error = row.get("error", {})
    return f"{error.get('code', '?')} ({error.get('stage', '?')})"


def _check_cell(row: dict) -> str:
    check = row.get("check")
    if not check:
        return "-"
    counts = check["counts"]
    flagged = counts["unsupported"] + counts["needs_mfu"]
    return check["verdict"] + (f" ({flagged} flagged)" if flagged else "")


def _cosine_cells(row: dict) -> tuple[str, str]:
    cosine = row.get("cosine")
    if not cosine:
        return "-", "-"
    means = [value["mean"] for value in cosine.values()]
    mins = [value["min"] for value in cosine.values()]
    return f"{min(means):.4f}", f"{min(mins):.4f}"


def table(rows: dict[str, dict], names: list[str]) -> str:
    """Aligned text table: one line per model; cosine = worst output's mean / min over held-out samples."""
    header = ("model", "fmt", "nodes", "check", "compile", "cos mean", "cos min", "compile s")
    lines = []
    for name in names:
        row = rows.get(name, {"name": name})
        mean, low = _cosine_cells(row)
        lines.append((name, row.get("format", "-"), str(row.get("check", {}).get("nodes", "-")), _check_cell(row),
                      _compile_cell(row), mean, low, str(row.get("compile_seconds") or "-")))
    widths = [max(len(str(cells[i])) for cells in [header, *lines]) for i in range(len(header))]
    render = ["  ".join(str(cell).ljust(width) for cell, width in zip(cells, widths)) for cells in [header, *lines]]
    failures = [f"  {name}: [{rows[name]['error']['code']}] at {rows[name]['error']['stage']}: "
                f"{rows[name]['error']['message']}" for name in names if name in rows and "error" in rows[name]]
    return "\n".join(render + (["", "Failures:", *failures] if failures else []))


def markdown(rows: dict[str, dict], names: list[str]) -> str:
    """The docs/models.md table (cosine below the 0.99 target is marked)."""
    out = ["| model | task | package | licence | input | real data | check (aries-rb) | compile | "
           "cosine mean / min | compile s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        row = rows.get(name, {"name": name})
        mean, low = _cosine_cells(row)
        below = mean != "-" and float(mean) < TARGET_COSINE
        cosine = f"{mean} / {low}" + (" **below 0.99**" if below else "") if mean != "-" else "-"
        inputs = "; ".join(f"{key} {'x'.join(map(str, shape))} {dtype}"
                           for key, (shape, dtype) in row.get("inputs", {}).items()) or "-"
        offload = " + cpu_offload" if row.get("cpu_offload") else ""
        out.append(f"| {name} | {row.get('task', '')} | {row.get('package', '')} | {row.get('licence', '')} | "
                   f"{inputs} | {row.get('data', '')} | {_check_cell(row)} | {_compile_cell(row)}{offload} | "
                   f"{cosine} | {row.get('compile_seconds') or '-'} |")
    return "\n".join(out)


def failures_markdown(rows: dict[str, dict], names: list[str]) -> str:
    """One bullet per failing model: stage, code and message."""
    lines = [f"- **{name}** ({rows[name]['error']['stage']}): `{rows[name]['error']['code']}` "
             f"{rows[name]['error']['message']}".replace("\n", " ")
             for name in names if name in rows and "error" in rows[name]]
    return "\n".join(lines) or "- none"


def main(argv: list[str] | None = None) -> int:
    """Run the corpus (or print the markdown table) and write ``build/corpus/results.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset")
    parser.add_argument("--fast", action="store_true", help="only the test-suite subset")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per model")
    parser.add_argument("--markdown", action="store_true", help="print the models.md table from results.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        import logging

        logging.basicConfig(level=logging.WARNING)
        print("RESULT " + json.dumps(run_one(args.one)), flush=True)
        return 0
    import corpus

    entries = corpus.corpus()
    names = [entry.name for entry in entries if not args.fast or entry.fast]
    if args.models:
        wanted = args.models.split(",")
        unknown = sorted(set(wanted) - {entry.name for entry in entries})
        if unknown:
            parser.error(f"unknown model(s): {', '.join(unknown)}")
        names = [name for name in names if name in wanted]
    rows = load_results()
    if args.markdown:
        print(markdown(rows, [entry.name for entry in entries if entry.name in rows]))
        return 0
    for name in names:
        print(f"[corpus] {name} ...", flush=True)
        rows[name] = _run_child(name, args.timeout)
        save_results(rows)
        print(f"[corpus] {name}: {_compile_cell(rows[name])}  check {_check_cell(rows[name])}  "
              f"cosine {_cosine_cells(rows[name])[0]}", flush=True)
    print(table(rows, [entry.name for entry in entries if entry.name in rows]))
    print(f"\nwritten: {RESULTS.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
