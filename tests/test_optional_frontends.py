"""An installation without an optional frontend package (the standalone bundle has no torch/tensorflow)."""

from __future__ import annotations

import sys

import pytest

from compiler_core.errors import ModelLoadError
from compiler_core.frontends import load_source


@pytest.mark.parametrize(("backend", "package", "suffix"), [("torch", "torch", ".pt2"),
                                                             ("torchscript", "torch", ".jit"),
                                                             ("tf", "tensorflow", ".keras")])
def test_missing_optional_package_is_a_coded_error(monkeypatch, tmp_path, backend, package, suffix):
    for name in [name for name in sys.modules if name == package or name.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in [name for name in sys.modules if name.startswith(f"compiler_core.frontends.{backend}")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # import raises ModuleNotFoundError, as when not installed
    model = tmp_path / f"model{suffix}"
    model.write_bytes(b"PK\x03\x04")
    with pytest.raises(ModelLoadError) as caught:
        load_source(str(model), backend)
    assert caught.value.code == "MODEL_LOAD_ERROR"
    assert "not installed" in caught.value.message and "pip install" in caught.value.hint
