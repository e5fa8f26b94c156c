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

Usage: ``python bench/corpus.py [--models a,b] [--fast] [--timeout 1200]``, then
``python bench/corpus.py --markdown [--write docs/models.md] [--status FILE]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

DEVICE = "aries-rb"
RESULTS = REPO_ROOT / "build" / "corpus" / "results.json"
TARGET_COSINE = 0.99
DEFAULT_TIMEOUT = 1200


# ---------------------------------------------------------------------------------------------------
# Driver


def _run_child(name: str, timeout: float) -> dict:
    """One model in a fresh process with an empty statistics cache of its own, so that *compile s* is a cold compile
    (calibration included), not a cache hit left by an earlier run."""
    import os
    import tempfile

    from compiler_core.calibration.cache import CACHE_DIR_ENV

    command = [sys.executable, __file__, "--one", name]
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="corpus-cache-") as cache:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT,
                                  env={**os.environ, CACHE_DIR_ENV: cache})
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
           "cosine mean / min | compile s | MBLT / MXQ MB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
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
                   f"{cosine} | {row.get('compile_seconds') or '-'} | {_sizes_cell(row)} |")
    return "\n".join(out)


def _sizes_cell(row: dict) -> str:
    """MBLT and MXQ file sizes (MB), from rows that recorded them."""
    return f"{row['mblt_mb']} / {row['mxq_mb']}" if "mxq_mb" in row else "-"


def failures_markdown(rows: dict[str, dict], names: list[str]) -> str:
    """One bullet per failing model: stage, code and message."""
    lines = [f"- **{name}** ({rows[name]['error']['stage']}): `{rows[name]['error']['code']}` "
             f"{rows[name]['error']['message']}".replace("\n", " ")
             for name in names if name in rows and "error" in rows[name]]
    return "\n".join(lines) or "- none"


DOC_HEAD = """# Real-model corpus

Trained models shipped inside pip packages, or trained here on data that pip and Debian packages ship (scikit-learn's
digits, Fashion-MNIST, matplotlib's stock prices), compiled for **aries-rb** through the public API on real inputs. Generated by `make corpus` (`python bench/corpus.py`, then
`python bench/corpus.py --markdown --write docs/models.md`) from `build/corpus/results.json`; the
registry is `tests/corpus.py`, and `tests/test_corpus.py` runs a fast subset in the test suite.

Columns: *check* is `check_support` on the parsed MBLT (`supported`; `cpu_offload`: only a head or
tail is flagged, so the compile runs with `cpu_offload`; `unsupported`: flagged nodes inside the NPU
body). *compile* is `mxq_compile` (default config unless a preset is named) on {n_calib} real
calibration samples: `ok` or the error code and the stage it stopped at. *cosine* compares the MXQ
(bit-exact simulator, `runtime.Model`) with onnxruntime on the MBLT (FP32) on {n_eval} held-out
real samples: the worst output's mean and minimum over the samples. Entries below the 0.99 target
are marked. *compile s* is the wall time of `mxq_compile` (calibration, quantization, scheduling,
MXQ write) on this 2-core machine, each model in its own process with an empty statistics cache (a cold
compile); other work shared the machine, so the times are rough. *MBLT / MXQ MB* are the parsed graph's
and the compiled file's sizes.

Measured at commit `{commit}`.
"""


def triage(rows: dict[str, dict], names: list[str]) -> list[str]:
    """Bullets that sort the models by outcome: the lists the compiler work starts from."""
    groups: dict[str, list[str]] = {key: [] for key in (
        "internal", "check_missed", "refused", "below", "ok", "unavailable", "other")}
    for name in names:
        row = rows.get(name, {})
        error, verdict = row.get("error", {}), row.get("check", {}).get("verdict")
        if "unavailable" in row:
            groups["unavailable"].append(name)
        elif error.get("code") == "INTERNAL_ERROR":
            groups["internal"].append(f"{name} ({error['stage']})")
        elif error and verdict in ("supported", "cpu_offload"):
            groups["check_missed"].append(f"{name} ({error['code']})")
        elif error.get("code") == "UNSUPPORTED_OPS" and verdict in (None, "unsupported"):
            groups["refused"].append(f"{name} (at {error['stage']})")
        elif error:
            groups["other"].append(f"{name} ({error['code']} at {error['stage']})")
        else:
            worst = min(value["mean"] for value in row["cosine"].values())
            groups["below" if worst < TARGET_COSINE else "ok"].append(f"{name} {worst:.4f}"
                                                                     if worst < TARGET_COSINE else name)
    titles = {"ok": f"compile, cosine >= {TARGET_COSINE}", "below": f"compile, cosine < {TARGET_COSINE}",
              "internal": "INTERNAL_ERROR", "check_missed": "check green (or CPU head/tail only), compile refused",
              "refused": "refused with UNSUPPORTED_OPS before compiling (parse or check)",
              "unavailable": "package missing here", "other": "other errors"}
    return [f"- {titles[key]}: {len(items)}" + (f" — {', '.join(items)}" if items else "")
            for key, items in groups.items() if items or key in ("ok", "internal", "check_missed")]


def outputs_below(rows: dict[str, dict], names: list[str]) -> list[str]:
    """One bullet per output under the target: model, output, mean and min cosine."""
    lines = []
    for name in names:
        for output, value in rows.get(name, {}).get("cosine", {}).items():
            if value["mean"] < TARGET_COSINE:
                pooled = " (pooled over samples)" if value.get("pooled") else ""
                lines.append(f"- {name} `{output}`: mean {value['mean']:.4f}, min {value['min']:.4f}{pooled}")
    return lines or ["- none"]


def document(stored: dict, names: list[str]) -> str:
    """The whole of docs/models.md: introduction, table, failures and the data notes."""
    import corpus

    rows = stored.get("models", {})
    used = {rows[name].get("data") for name in names if name in rows}
    notes = [f"- **{kind}**: {text}" for kind, text in corpus.DATA_NOTES.items() if kind in used]
    return "\n".join([DOC_HEAD.format(n_calib=corpus.N_CALIB, n_eval=corpus.N_EVAL,
                                       commit=stored.get("commit", "?")),
                      "## Summary", "", *triage(rows, names), "", markdown(rows, names), "",
                      "## Failures", "", failures_markdown(rows, names), "",
                      "## Outputs below the target", "", *outputs_below(rows, names), "",
                      "## Inputs: how distinct they are", "",
                      "Calibration and held-out samples never share a photo scene, sentence, recording or file.",
                      "", *notes, ""])


HAND_WRITTEN = "<!-- hand-written sections below: bench/corpus.py --write keeps them -->"
"""Marker in the written document: what follows it (the Keras probe's section) is kept when it is written again."""


def _hand_written(path: Path) -> str:
    text = path.read_text() if path.is_file() else ""
    start = text.find(HAND_WRITTEN)
    return "" if start < 0 else "\n" + text[start:]


def main(argv: list[str] | None = None) -> int:
    """Run the corpus (or print the markdown table) and write ``build/corpus/results.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset")
    parser.add_argument("--fast", action="store_true", help="only the test-suite subset")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per model")
    parser.add_argument("--markdown", action="store_true", help="print the models.md table from results.json")
    parser.add_argument("--write", type=Path, help="with --markdown: write the whole document to this file")
    parser.add_argument("--status", type=Path, help="with --markdown: also write a dated copy for the team to this file")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        import logging

        logging.basicConfig(level=logging.WARNING)
        import corpus

        print("RESULT " + json.dumps(corpus.measure(args.one)), flush=True)
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
        stored = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"models": {}}
        text = document(stored, [entry.name for entry in entries if entry.name in rows])
        if args.write:
            args.write.write_text(text + _hand_written(args.write))
            print(f"written: {args.write}")
        if args.status:
            stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            args.status.write_text(f"<!-- corpus status written {stamp} by bench/corpus.py --status -->\n" + text)
            print(f"written: {args.status}")
        if not args.write and not args.status:
            print(text)
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
