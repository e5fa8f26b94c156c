"""GUI compile beside CLI compile: the same MobileNetV2 MBLT, config and photos, in the same run.

**CLI**: ``python -m compiler_core compile --model model.mblt --compile-config config.json ...`` in a fresh
process (what a user types; interpreter start and imports included), wall clock of the process.
**GUI**: what the workbench's Compile button runs, headless: a :class:`qbstudio.workers.Worker` in a
:class:`qbstudio.workers.JobRunner` thread calling :func:`qbstudio.process_jobs.run_in_process` with
``qbstudio.tasks:compile_run`` (the compile in a ``forkserver`` child, its progress events and log
records relayed to the GUI thread through Qt's queued signals), wall clock from ``JobRunner.start`` to
the ``succeeded`` signal handled in the GUI thread's event loop. The forkserver is started first, as
the workbench does at start-up (``process_jobs.warm_up``); its start is reported apart.

Both sides use one statistics cache folder, emptied before every compile, so each run really calibrates;
the rounds alternate CLI and GUI so that a change of machine load weighs on both. Besides the times the
bench prints the progress events the GUI thread received per stage: the ``analyze`` stage must arrive
as several steps, not one jump at its end.

Usage: ``python bench/gui_compile.py [--runs 3] [--holdout 16] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import realdata  # noqa: E402
import realmodels  # noqa: E402

TARGET_DEVICE = "aries-rb"


def prepare(scratch: Path, holdout: int) -> tuple[Path, Path, str]:
    """The MBLT of MobileNetV2, the compile config file both sides use, and the calibration photo folder."""
    from compiler_core.api import mblt_compile
    from compiler_core.config import resolve_config
    from compiler_core.config.files import write_mapping

    mblt = mblt_compile(realmodels.mobilenet_v2_onnx(), scratch / "model.mblt",
                        input_shape_dict={"input": list(realmodels.MOBILENET_SHAPE)})
    calib, _ = realdata.imagenet_photo_sets()
    config = resolve_config(config_preset="classification", target_device=TARGET_DEVICE,
                            preprocessing_config=realdata.IMAGENET_PREPROCESSING, analysis_holdout=holdout)
    config_path = scratch / "config.json"
    write_mapping(config_path, config.to_dict())
    return mblt, config_path, str(calib)


def compile_cli(mblt: Path, config_path: Path, calib: str, output: Path) -> tuple[float, dict]:
    """Seconds of one ``python -m compiler_core compile`` process, and its result record (JSONL channel)."""
    command = [sys.executable, "-m", "compiler_core", "compile", "--model", str(mblt), "--output",
               str(output / "model.mxq"), "--compile-config", str(config_path), "--calib-data-path", calib,
               "--target-device", TARGET_DEVICE]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=False,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "QBCOMPILER_JSONL": "1"})
    seconds = time.perf_counter() - started
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    results = [record for record in records if record.get("type") == "result"]
    if completed.returncode != 0 or not results:
        raise RuntimeError(f"CLI compile failed: {(completed.stderr.strip().splitlines() or ['?'])[-1]}")
    return seconds, results[-1]


def compile_gui(app, mblt: Path, config, calib: str, output: Path) -> tuple[float, list, object]:
    """Seconds from ``JobRunner.start`` to the ``succeeded`` signal in the GUI thread, the events received, and
    the :class:`qbstudio.tasks.CompileOutcome`."""
    from PySide6.QtCore import QEventLoop, QThread

    from qbstudio.main_window import COMPILE_TARGET
    from qbstudio.process_jobs import run_in_process
    from qbstudio.workers import JobRunner, Worker

    runner = JobRunner()
    events, outcome = [], {}
    loop = QEventLoop()
    worker = Worker("compile", run_in_process, COMPILE_TARGET, mblt, output / "model.mxq", config, calib, False)
    worker.progress.connect(lambda event: events.append((time.perf_counter(), event)))
    worker.succeeded.connect(lambda result: outcome.update(result=result, at=time.perf_counter()))
    worker.failed.connect(lambda error: outcome.update(error=error, at=time.perf_counter()))
    worker.finished.connect(loop.quit)
    started = time.perf_counter()
    runner.start("compile", worker)
    loop.exec()
    for thread in runner.findChildren(QThread):  # the job thread ends right after the worker's last signal
        thread.wait()
    app.processEvents()
    if "error" in outcome:
        raise RuntimeError(f"GUI compile failed: {outcome['error']}")
    return outcome["at"] - started, [(at - started, event) for at, event in events], outcome["result"]


def _clear(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def run(runs: int, holdout: int) -> dict:
    """Alternate ``runs`` CLI and GUI compiles; medians, ratio and the GUI's progress events."""
    from PySide6.QtCore import QCoreApplication

    from compiler_core.config import resolve_config
    from qbstudio._compat import guard_none_refcount

    guard_none_refcount()  # PySide6 6.12 reference leaks on CPython 3.11, as in the workbench
    with tempfile.TemporaryDirectory(prefix="qbstudio-gui-bench-") as folder:
        scratch = Path(folder)
        cache = scratch / "cache"
        os.environ["QBCOMPILER_CACHE_DIR"] = str(cache)  # before the forkserver starts: its children inherit it
        mblt, config_path, calib = prepare(scratch, holdout)
        config = resolve_config(compile_config=config_path)
        app = QCoreApplication.instance() or QCoreApplication([])
        from qbstudio.process_jobs import warm_up

        started = time.perf_counter()
        warm_up()
        warm_up_s = time.perf_counter() - started
        cli, gui, cli_inner, gui_inner, gui_events = [], [], [], [], []
        for index in range(runs):
            _clear(cache)
            seconds, record = compile_cli(mblt, config_path, calib, scratch / f"cli-{index}")
            cli.append(seconds)
            cli_inner.append(record["seconds"])
            _clear(cache)
            seconds, gui_events, outcome = compile_gui(app, mblt, config, calib, scratch / f"gui-{index}")
            gui.append(seconds)
            gui_inner.append(outcome.duration_s)
    analyze = [(round(at, 2), event.done, event.total) for at, event in gui_events if event.stage == "analyze"]
    return {"runs": runs, "holdout": holdout, "cli_s": cli, "gui_s": gui, "cli_median_s": statistics.median(cli),
            "gui_median_s": statistics.median(gui), "ratio": statistics.median(gui) / statistics.median(cli),
            "cli_compile_s": cli_inner, "gui_compile_s": gui_inner,
            "inner_ratio": statistics.median(gui_inner) / statistics.median(cli_inner),
            "forkserver_warm_up_s": warm_up_s,
            "gui_events_per_stage": dict(Counter(event.stage for _, event in gui_events)),
            "analyze_events": analyze}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="compiles per side (median)")
    parser.add_argument("--holdout", type=int, default=16, help="held-out photos of the accuracy analysis")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    result = run(args.runs, args.holdout)
    print(f"MobileNetV2 compile ({TARGET_DEVICE}, preset classification, analysis on {args.holdout} held-out photos), "
          f"median of {args.runs} alternating runs")
    print(f"  CLI (fresh process):        {result['cli_median_s']:7.2f} s   runs {[round(s, 2) for s in result['cli_s']]}")
    print(f"  GUI (worker -> forkserver): {result['gui_median_s']:7.2f} s   runs {[round(s, 2) for s in result['gui_s']]}")
    print(f"  ratio GUI / CLI:            {result['ratio']:7.2f}")
    print(f"  compile call alone (mxq_compile in the CLI process / compile_run in the GUI's child): CLI "
          f"{[round(s, 2) for s in result['cli_compile_s']]}, GUI {[round(s, 2) for s in result['gui_compile_s']]}, "
          f"ratio {result['inner_ratio']:.2f}")
    print(f"  forkserver start (once, at workbench start-up): {result['forkserver_warm_up_s']:.2f} s")
    print(f"  progress events received by the GUI thread (last run): {result['gui_events_per_stage']}")
    print(f"  analyze events (seconds since start, done, total): {result['analyze_events']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
