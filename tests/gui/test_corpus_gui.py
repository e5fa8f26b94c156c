"""Corpus models in the workbench: they open, and what the graph colours as supported is what compiles.

Two small models of the real-model corpus (``tests/corpus.py``): CREPE tiny (convolutions with 512- and
64-tap kernels, wider than the NPU window, which parse splits: all supported, and it compiles) and
Magika (integer byte input: the head must run on the CPU). The graph's colours come from the same
report the compiler uses, and the compiler's answer is checked against them node by node.
"""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

import corpus  # noqa: E402
from realmodels import RealModelUnavailable  # noqa: E402

from compiler_core.api import mxq_compile  # noqa: E402
from qbstudio.main_window import MainWindow  # noqa: E402

pytestmark = pytest.mark.slow

MODEL_TIMEOUT_MS = 120_000


@pytest.fixture
def errors(dialog_calls) -> list:
    return dialog_calls


@pytest.fixture
def window(shown_window):
    return shown_window


def _open_entry(qtbot, window: MainWindow, monkeypatch, name: str) -> dict[str, str]:
    """Import the corpus model ``name``; returns the statuses last pushed to the graph."""
    entry = corpus.corpus_by_name()[name]
    try:
        source = entry.source()
    except RealModelUnavailable as error:
        pytest.skip(str(error))
    pushed: list[dict] = []
    original = window.graph.set_support
    monkeypatch.setattr(window.graph, "set_support", lambda statuses, reasons=None: (
        pushed.append(dict(statuses)), original(statuses, reasons)))
    with qtbot.waitSignal(window.model_ready, timeout=MODEL_TIMEOUT_MS):
        assert window.import_model(source, entry.input_shape_dict or None)
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=MODEL_TIMEOUT_MS)
    assert window.graph.node_count == len(window.loaded.model.graph)
    assert window.project.settings.device == "aries-rb"
    return pushed[-1]


def test_wide_kernel_convolutions_are_shown_supported_and_compile(qtbot, window, errors, monkeypatch, tmp_path):
    """CREPE tiny's six convolutions have 512- and 64-tap kernels (the NPU window is 32): parse splits each
    into convolutions that fit, so the graph shows every node supported, and the compile keeps that promise."""
    statuses = _open_entry(qtbot, window, monkeypatch, "crepe_tiny")
    assert set(statuses.values()) == {"supported"}
    convs = [node for node in window.loaded.model.graph if node.op_type == "Conv"]
    assert len(convs) == 16 + 5 * 2  # 512 taps -> 16 convolutions, 64 taps -> 2
    assert window.act_compile.isEnabled()
    mxq_compile(window.loaded.mblt_path, target_device="aries-rb", use_random_calib=True,
                save_path=tmp_path / "crepe.mxq", analysis_holdout=0)
    assert (tmp_path / "crepe.mxq").is_file()
    assert errors == []


def test_an_integer_input_head_is_flagged_and_compiles_once_offloaded(qtbot, window, errors, monkeypatch, tmp_path):
    statuses = _open_entry(qtbot, window, monkeypatch, "magika")
    flagged = {name for name, status in statuses.items() if status != "supported"}
    assert {window.report.entries[name].op_type for name in flagged} == {"Equal", "Reshape"}
    assert not window.act_compile.isEnabled()
    assert not window.run_panel.offload_button.isHidden()

    window.run_panel.offload_button.click()
    assert window.project.settings.config.cpu_offload
    assert window.act_compile.isEnabled()
    result = mxq_compile(window.loaded.mblt_path, target_device="aries-rb", use_random_calib=True, cpu_offload=True,
                         save_path=tmp_path / "magika.mxq", analysis_holdout=0)
    assert result.mxq_path.is_file()
    assert errors == []
