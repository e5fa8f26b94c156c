"""Tampered-but-CRC-valid MXQs are rejected at load with MXQ_FORMAT_ERROR naming the operation."""

from __future__ import annotations

from pathlib import Path

import pytest
from mxq_tamper import load_parts, tamperings, write_parts

from compiler_core.api import mblt_compile, mxq_compile
from compiler_core.errors import MxqFormatError
from compiler_core.mxq.schema import SCHEMAS
from compiler_core.quantization import kernels
from compiler_core.runtime import Model

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"


@pytest.fixture(scope="module")
def sample_mxq(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tamper")
    mblt = mblt_compile(SAMPLE_DIR / "model.onnx", folder / "sample.mblt")
    return mxq_compile(mblt, "aries-rb", SAMPLE_DIR / "calib", folder / "sample.mxq",
                       compile_config=SAMPLE_DIR / "compile_config.yaml").mxq_path


def test_every_kernel_kind_has_a_schema():
    kernels.load_all()
    assert set(kernels.KERNELS) == set(SCHEMAS)


def test_an_untampered_rewrite_loads(sample_mxq, tmp_path):
    path = write_parts(load_parts(sample_mxq), tmp_path / "same.mxq")
    assert len(Model(path).artifact.program.ops) == len(load_parts(sample_mxq)["program"]["ops"])


def test_every_content_tampering_is_rejected_at_load(sample_mxq, tmp_path):
    parts = load_parts(sample_mxq)
    accepted = []
    cases = list(tamperings(parts))
    for number, (label, tampered) in enumerate(cases):
        path = write_parts(tampered, tmp_path / f"t{number}.mxq")
        try:
            Model(path)
        except MxqFormatError as error:
            assert error.code == "MXQ_FORMAT_ERROR" and error.fields.get("section") == "program", label
        else:
            accepted.append(label)
        path.unlink()
    print(f"\ntampered-but-CRC-valid MXQs: {len(cases) - len(accepted)}/{len(cases)} rejected at load")
    assert len(cases) > 50 and accepted == []


@pytest.mark.parametrize("schedule", [[], [["a", "b", "c", "d"]], "x", 3])
def test_a_schedule_that_is_not_an_object_is_rejected_at_load(sample_mxq, tmp_path, schedule):
    """Long fuzz finding: a list as the program's schedule raised a raw ValueError at load."""
    parts = load_parts(sample_mxq)
    parts["program"] = {**parts["program"], "schedule": schedule}
    with pytest.raises(MxqFormatError, match="schedule"):
        Model(write_parts(parts, tmp_path / "schedule.mxq"))
