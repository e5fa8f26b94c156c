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


def _run(command: list[str]) -> tuple[float, float]:
    """(wall seconds, in-process seconds from the 'after X s' line) of one fresh process."""
    with tempfile.TemporaryDirectory() as home:
        started = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, env=_env(Path(home)), capture_output=True, text=True, timeout=300)
        wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    line = next(line for line in result.stdout.splitlines() if " after " in line)
    return wall, float(line.rsplit("after ", 1)[1].split()[0])


def _median(command: list[str], runs: int) -> tuple[float, float]:
    samples = [_run(command) for _ in range(runs)]
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def main() -> None:
    """Measure and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", type=Path, default=SAMPLE_MODEL)
    args = parser.parse_args()
    app = [sys.executable, "-m", "qbstudio", "--smoke-exit-after-ready"]
    peer_wall, peer_in = _median([sys.executable, "-c", PEER], args.runs)
    shown_wall, shown_in = _median(app, args.runs)
    model_wall, model_in = _median([*app, str(args.model)], args.runs)
    print(f"load average {os.getloadavg()[0]:.2f}; median of {args.runs} fresh processes")
    print(f"peer (bare QtWebEngine window): {peer_in:.2f} s in-process, {peer_wall:.2f} s wall")
    print(f"window shown:                  {shown_in:.2f} s in-process, {shown_wall:.2f} s wall "
          f"({shown_in / peer_in:.2f}x peer)")
    print(f"model ready ({args.model.name}): {model_in:.2f} s in-process, {model_wall:.2f} s wall "
          f"({model_wall / peer_wall:.2f}x peer wall)")


if __name__ == "__main__":
    main()
