"""Workbench start-up: time to a shown window, and to a rendered model with ``--smoke-exit-after-ready``.

Each measurement is a fresh ``python -m qbstudio`` process (offscreen Qt, an empty ``QBSTUDIO_HOME``):

- **window shown**: ``--smoke-exit-after-ready`` with nothing to open; the in-process time from
  interpreter start-up of ``qbstudio.app`` to the shown window, and the wall time of the process;
- **model ready**: the same with the sample model, which waits until the model is parsed and its
  graph rendered before exiting (wall time).

The peer, measured in the same run, is a bare PySide6 process that imports QtWebEngine and shows an
empty QMainWindow: the part of start-up no workbench code can remove. Medians of ``--runs`` (5).
The checkout's packages are byte-compiled first, as installing a wheel does (with
``PYTHONDONTWRITEBYTECODE`` set, every run would otherwise compile the sources again).
The machine's load average is printed before and after each measurement, and the CPU time (user +
system, the process and the children it waited for) beside each wall time: on a shared machine
the wall time follows the load, the CPU time much less.

Usage: ``python bench/startup.py [--runs 5] [--model resources/samples/fashion_cnn/model.onnx]``.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_MODEL = ROOT / "resources" / "samples" / "fashion_cnn" / "model.onnx"
PEER = """
import time, sys
started = time.perf_counter()
from PySide6 import QtWebEngineWidgets
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMainWindow
app = QApplication(sys.argv[:1])
window = QMainWindow()
window.show()
def done():
    print(f"peer ready after {time.perf_counter() - started:.2f} s in-process")
    app.quit()
QTimer.singleShot(0, done)
app.exec()
"""


def _env(home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("DISPLAY", "WAYLAND_DISPLAY")}
    flags = env.get("QTWEBENGINE_CHROMIUM_FLAGS", "")
    path = os.pathsep.join(part for part in (str(ROOT), env.get("PYTHONPATH", "")) if part)
    env.update(QBSTUDIO_HOME=str(home), QT_QPA_PLATFORM="offscreen", PYTHONPATH=path,
               QTWEBENGINE_CHROMIUM_FLAGS=" ".join(dict.fromkeys([*flags.split(), "--no-sandbox", "--disable-gpu"])))
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(command: list[str]) -> tuple[float, float, float, float]:
    """(wall s, window-shown s, ready s, CPU s) of one fresh process (in-process times from its output)."""
    with tempfile.TemporaryDirectory() as home:
        cpu = _children_cpu()
        started = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, env=_env(Path(home)), capture_output=True, text=True, timeout=300)
        wall = time.perf_counter() - started
        cpu = _children_cpu() - cpu
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    times = [float(line.rsplit("after ", 1)[1].split()[0]) for line in result.stdout.splitlines() if " after " in line]
    return wall, times[0], times[-1], cpu


def _median(command: list[str], runs: int) -> tuple[float, ...]:
    samples = [_run(command) for _ in range(runs)]
    return tuple(statistics.median(sample[index] for sample in samples) for index in range(4))


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    """Measure and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", type=Path, default=SAMPLE_MODEL)
    args = parser.parse_args()
    app = [sys.executable, "-m", "qbstudio", "--smoke-exit-after-ready"]
    for package in ("compiler_core", "qbstudio"):
        compileall.compile_dir(ROOT / package, quiet=1)
    print(f"median of {args.runs} fresh processes; load average (1, 5, 15 min) before each measurement -> after")
    before = _load()
    peer_wall, peer_in, _, peer_cpu = _median([sys.executable, "-c", PEER], args.runs)
    print(f"peer (bare QtWebEngine window):   shown {peer_in:.2f} s in-process, {peer_wall:.2f} s wall, "
          f"{peer_cpu:.2f} s CPU   [load {before} -> {_load()}]")
    before = _load()
    empty_wall, shown, built, empty_cpu = _median(app, args.runs)
    print(f"qbstudio, nothing open:           window shown {shown:.2f} s ({shown / peer_in:.2f}x peer), "
          f"panels built {built:.2f} s in-process, {empty_wall:.2f} s wall, {empty_cpu:.2f} s CPU   "
          f"[load {before} -> {_load()}]")
    before = _load()
    model_wall, _, model_ready, model_cpu = _median([*app, str(args.model)], args.runs)
    print(f"qbstudio {args.model.name}: model parsed and graph rendered {model_ready:.2f} s in-process, "
          f"{model_wall:.2f} s wall ({model_wall / peer_wall:.2f}x peer wall), {model_cpu:.2f} s CPU   "
          f"[load {before} -> {_load()}]")


if __name__ == "__main__":
    main()
