"""The workbench's compile path streams the accuracy analysis: the GUI thread sees it start and advance per sample.

The compile runs as the Compile button runs it (``run_in_process`` of ``qbstudio.tasks:compile_run`` in a
forkserver child) on the bundled Fashion-MNIST sample, whose config holds 12 photos out for the analysis.
"""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QThread  # noqa: E402

from compiler_core.config.models import CompileConfig  # noqa: E402
from compiler_core.resources import resource_path  # noqa: E402
from qbstudio.main_window import COMPILE_TARGET  # noqa: E402
from qbstudio.process_jobs import run_in_process  # noqa: E402
from qbstudio.tasks import parse_model  # noqa: E402
from qbstudio.workers import JobRunner, Worker  # noqa: E402

SAMPLE = resource_path("samples", "fashion_cnn")


@pytest.fixture
def sample_mblt(tmp_path, monkeypatch):
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    return parse_model(str(SAMPLE / "model.onnx"), tmp_path / "model.mblt", backend="onnx", input_shapes={}).mblt_path


def _analyze_events(events) -> list:
    return [event for event in events if event.stage == "analyze"]


def test_analysis_progress_reaches_the_gui_process_sample_by_sample(sample_mblt, tmp_path):
    config = CompileConfig.from_file(SAMPLE / "compile_config.yaml")
    events = []
    run_in_process(COMPILE_TARGET, sample_mblt, tmp_path / "run" / "fashion.mxq", config, str(SAMPLE / "calib"),
                   False, callback=events.append)
    analyze = _analyze_events(events)
    holdout = config.analysis_holdout
    assert analyze[0].done == 0 and analyze[0].total == holdout  # shown before the simulator is built
    assert "preparing" in analyze[0].message
    steps = [event.done for event in analyze[1:-1] if event.done > 0]
    assert steps == list(range(1, holdout + 1))  # one event per compared sample, in order, not one jump
    assert analyze[-1].done == analyze[-1].total == holdout
    stages = [event.stage for event in events]
    assert stages.index("quantize") < stages.index("analyze") < stages.index("schedule")  # mid-compile, streamed


def test_worker_passes_the_analysis_start_and_end_to_the_gui_thread(qtbot, sample_mblt, tmp_path):
    """Through the Worker's throttled signal: the GUI sees the stage open and finish (and the steps that come
    at least ``PROGRESS_INTERVAL_S`` apart, which on this tiny model may be none)."""
    config = CompileConfig.from_file(SAMPLE / "compile_config.yaml")
    runner = JobRunner()
    worker = Worker("compile", run_in_process, COMPILE_TARGET, sample_mblt, tmp_path / "run" / "fashion.mxq",
                    config, str(SAMPLE / "calib"), False)
    received, outcome = [], []
    worker.progress.connect(received.append)
    worker.succeeded.connect(outcome.append)
    with qtbot.waitSignal(worker.finished, timeout=300_000):
        runner.start("compile", worker)
    for thread in runner.findChildren(QThread):
        thread.wait()
    assert outcome and outcome[0].analysis is not None
    analyze = _analyze_events(received)
    assert analyze[0].done == 0 and analyze[-1].done == config.analysis_holdout
