"""One compile session: the MBLT is read once and hashed once per compile, and its graph is left unchanged.

The count is of real file opens of the ``.mblt`` (``open``/``io.open``, which ``Path.read_bytes``,
``onnx.load`` and the hashing all go through), so no stage can reload it by another route unseen.
"""

from __future__ import annotations

import builtins
import io
from pathlib import Path

import pytest

from compiler_core.api import mblt_compile, mxq_compile_from_mblt
from compiler_core.calibration.statistics import session_with_outputs
from compiler_core.session import MbltSession

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "resources" / "samples" / "fashion_cnn"


@pytest.fixture(scope="module")
def sample_mblt(tmp_path_factory) -> Path:
    return mblt_compile(SAMPLE / "model.onnx", tmp_path_factory.mktemp("session") / "fashion.mblt")


def _count_opens(monkeypatch, path: Path) -> list[str]:
    opened: list[str] = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and Path(file).resolve() == path.resolve():
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    return opened


def test_a_compile_with_analysis_reads_the_mblt_once(sample_mblt, tmp_path, monkeypatch):
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    opened = _count_opens(monkeypatch, sample_mblt)
    result = mxq_compile_from_mblt(sample_mblt, target_device="aries-rb", calib_data_path=str(SAMPLE / "calib"),
                                   save_path=tmp_path / "fashion.mxq", compile_config=SAMPLE / "compile_config.yaml",
                                   analysis_holdout=4)
    assert result.quantize.samples["holdout"] == 4 and result.quantize.analysis["samples"] == 4
    assert len(opened) == 1, opened


def test_session_identity_matches_the_file(sample_mblt):
    from compiler_core.fileio import sha256_file
    from compiler_core.mblt.io import read_provenance

    session = MbltSession.open(sample_mblt)
    assert session.sha256 == sha256_file(sample_mblt)
    assert session.provenance == read_provenance(sample_mblt)


def test_exposing_tensors_for_a_session_leaves_the_graph_outputs_unchanged(sample_mblt):
    import onnxruntime as ort

    session = MbltSession.open(sample_mblt)
    before = [value.name for value in session.graph.graph.outputs]
    runtime, names = session_with_outputs(session.graph, None, ort.SessionOptions())
    assert len(names) > len(before)
    assert {output.name for output in runtime.get_outputs()} >= set(names)
    assert [value.name for value in session.graph.graph.outputs] == before
