"""Deterministic builds: the same inputs and config give byte-identical MBLT and MXQ files.

Each compile runs in its own process with its own string-hash seed and its own statistics cache,
so neither set/dict ordering nor a warm cache can make the bytes agree by accident.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"

_COMPILE = """
import sys
from compiler_core.api import mblt_compile, mxq_compile
source, mblt, mxq, calib, config = sys.argv[1:6]
mblt_compile(source, mblt)
mxq_compile(mblt, "aries-rb", calib, mxq, compile_config=config)
"""


def _compile_in_a_process(folder: Path, source: Path, calib: Path, config: Path, seed: int,
                          cache: Path) -> tuple[bytes, bytes]:
    """Compile into ``folder`` (the same paths every time) and return the MBLT and MXQ bytes."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "QBCOMPILER_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    mblt, mxq = folder / "model.mblt", folder / "model.mxq"
    subprocess.run([sys.executable, "-c", _COMPILE, str(source), str(mblt), str(mxq), str(calib), str(config)],
                   check=True, env=env, cwd=ROOT, capture_output=True)
    return mblt.read_bytes(), mxq.read_bytes()


def _assert_reproducible(tmp_path: Path, source: Path, calib: Path, config: Path) -> None:
    folder = tmp_path / "out"
    first = _compile_in_a_process(folder, source, calib, config, seed=1, cache=tmp_path / "cache1")
    second = _compile_in_a_process(folder, source, calib, config, seed=2, cache=tmp_path / "cache2")
    print(f"\n{source.name}: MBLT {len(first[0])} bytes, MXQ {len(first[1])} bytes, identical across processes: "
          f"{first == second}")
    assert first[0] == second[0], "the MBLT bytes differ"
    assert first[1] == second[1], "the MXQ bytes differ"


def test_the_sample_compiles_to_identical_bytes_in_two_processes(tmp_path):
    _assert_reproducible(tmp_path, SAMPLE_DIR / "model.onnx", SAMPLE_DIR / "calib",
                         SAMPLE_DIR / "compile_config.yaml")


@pytest.mark.slow
def test_mobilenet_compiles_to_identical_bytes_in_two_processes(tmp_path):
    import realdata
    import realmodels

    try:
        source = realmodels.mobilenet_v2_onnx()
        calib, _ = realdata.imagenet_photo_sets(8, 2)
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))
    config = tmp_path / "compile_config.json"
    config.write_text(json.dumps({"preprocessing": realdata.IMAGENET_PREPROCESSING, "analysisHoldout": 0}))
    _assert_reproducible(tmp_path, source, calib, config)
