"""Workbench start-up: time to a shown window, and to a rendered model with ``--smoke-exit-after-ready``.

Each measurement is a fresh ``python -m qbstudio`` process (offscreen Qt, an empty ``QBSTUDIO_HOME``):

- **window shown**: ``--smoke-exit-after-ready`` with nothing to open; the in-process time from
  interpreter start-up of ``qbstudio.app`` to the shown window, and the wall time of the process;
- **model ready**: the same with the sample model, which waits until the model is parsed and its
  graph rendered before exiting (wall time).

The peer, measured in the same run, is a bare PySide6 process that imports QtWebEngine and shows an
empty QMainWindow: the part of start-up no workbench code can remove. Medians of ``--runs`` (5).

Usage: ``python bench/startup.py [--runs 5] [--model resources/samples/fashion_cnn/model.onnx]``.
"""

from __future__ import annotations

import argparse
import os
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
    env.update(QBSTUDIO_HOME=str(home), QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT),
               QTWEBENGINE_CHROMIUM_FLAGS=" ".join(dict.fromkeys([*flags.split(), "--no-sandbox", "--disable-gpu"])))
    return env


def _run(command: list[str]) -> tuple[float, float, float]:
    """(wall s, window-shown s, ready s) of one fresh process (in-process times from its output)."""
    with tempfile.TemporaryDirectory() as home:
        started = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, env=_env(Path(home)), capture_output=True, text=True, timeout=300)
        wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    times = [float(line.rsplit("after ", 1)[1].split()[0]) for line in result.stdout.splitlines() if " after " in line]
    return wall, times[0], times[-1]


def _median(command: list[str], runs: int) -> tuple[float, float, float]:
    samples = [_run(command) for _ in range(runs)]
    return tuple(statistics.median(sample[index] for sample in samples) for index in range(3))


def main() -> None:
    """Measure and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", type=Path, default=SAMPLE_MODEL)
    args = parser.parse_args()
    app = [sys.executable, "-m", "qbstudio", "--smoke-exit-after-ready"]
    peer_wall, peer_in, _ = _median([sys.executable, "-c", PEER], args.runs)
    empty_wall, shown, built = _median(app, args.runs)
    model_wall, _, model_ready = _median([*app, str(args.model)], args.runs)
    print(f"load average {os.getloadavg()[0]:.2f}; median of {args.runs} fresh processes")
    print(f"peer (bare QtWebEngine window):   shown {peer_in:.2f} s in-process, {peer_wall:.2f} s wall")
    print(f"qbstudio, nothing open:           window shown {shown:.2f} s ({shown / peer_in:.2f}x peer), "
          f"panels built {built:.2f} s in-process, {empty_wall:.2f} s wall")
    print(f"qbstudio {args.model.name}: model parsed and graph rendered {model_ready:.2f} s in-process, "
          f"{model_wall:.2f} s wall ({model_wall / peer_wall:.2f}x peer wall)")


if __name__ == "__main__":
    main()
