"""Frontends: each source format -> an ONNX graph in memory (onnx-ir; for ONNX the checked protobuf), plus backend detection."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx_ir as ir

from compiler_core.errors import ArgumentError, ModelLoadError
from compiler_core.formats import LLM_SUFFIXES, MODEL_FOLDER_MARKERS, SUFFIX_BACKENDS

BACKENDS = ("onnx", "torch", "torchscript", "tf", "tflite")

Loader = Callable[..., Any]
"""A loader returns an onnx-ir model, or (ONNX) a checked protobuf that ``canonicalize`` accepts as well."""
OPTIONAL_PACKAGES = {"torch": ("torch", "transformers"), "torchscript": ("torch",), "tf": ("tensorflow", "keras"),
                     "tflite": ("tflite",)}
"""Backend -> third-party packages it imports that an installation may lack (optional extras)."""
EXTRAS = {"torch": "torch", "torchscript": "torch", "tf": "tf", "tflite": "tflite"}


def _load_onnx(model: Any, **_: Any) -> Any:
    """The checked protobuf (``CheckedModelProto``): canonicalization deserializes it when it needs to."""
    from compiler_core.frontends.onnx import read_onnx

    if not isinstance(model, (str, Path)):
        raise ArgumentError("The onnx backend takes a path to an .onnx file.",
                            hint="Pass the file path, or choose --backend for other model kinds.")
    return read_onnx(model)


def _load_tflite(model: Any, **options: Any) -> ir.Model:
    from compiler_core.frontends.tflite import load_tflite

    return load_tflite(model, **options)


def _load_tf(model: Any, **options: Any) -> ir.Model:
    from compiler_core.frontends.tf import load_tf

    return load_tf(model, **options)


def _load_torch(model: Any, **options: Any) -> ir.Model:
    from compiler_core.frontends.torch import load_torch

    return load_torch(model, **options)


def _load_torchscript(model: Any, **options: Any) -> ir.Model:
    from compiler_core.frontends.torchscript import load_torchscript

    return load_torchscript(model, **options)


FRONTENDS: dict[str, Loader] = {"onnx": _load_onnx, "tflite": _load_tflite, "tf": _load_tf,
                                "torch": _load_torch, "torchscript": _load_torchscript}
"""Registry: backend name -> loader(model, **options) returning what ``canonicalize`` takes."""


def content_backend(path: str | Path) -> str | None:
    """The backend a file's first bytes name (TFLite's identifier, a torch zip archive or pickle, HDF5 for Keras), or
    None: what a model saved under another suffix really is."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
    except OSError:
        return None
    if head[4:8] == b"TFL3":
        return "tflite"
    if head[:2] == b"PK":  # torch.save and torch.jit.save both write zip archives (so does Keras 3's .keras)
        from compiler_core.frontends.torch import is_torchscript_archive

        if is_torchscript_archive(path):
            return "torchscript"
        return "tf" if _is_keras_archive(path) else "torch"
    if head[:1] == b"\x80":  # a pre-zip torch.save pickle
        return "torch"
    if head == b"\x89HDF\r\n\x1a\n":  # Keras 2's .h5
        return "tf"
    return None


def _is_keras_archive(path: Path) -> bool:
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return "config.json" in archive.namelist() and "metadata.json" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def misnamed_hint(path: str | Path, expected: str) -> str:
    """" It is a TorchScript archive, not ONNX: ..." when the file's content names another backend than ``expected``,
    else "" (a file given the wrong suffix)."""
    backend = content_backend(path)
    if backend is None or backend == expected:
        return ""
    suffix = {"tflite": ".tflite", "torchscript": ".pt", "torch": ".pt", "tf": ".keras or .h5"}[backend]
    kind = {"tflite": "a TFLite model", "torchscript": "a TorchScript archive", "torch": "a PyTorch file (torch.save)",
            "tf": "a Keras model"}[backend]
    return f" Its content is {kind}: give it the {suffix} suffix, or pass --backend {backend}."


def detect_backend(path: str | Path) -> str:
    """Guess the backend from a model path: suffix first, then folder contents and magic bytes.

    Raises:
        ModelLoadError: the kind of model cannot be told from the path.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in SUFFIX_BACKENDS:
        return SUFFIX_BACKENDS[suffix]
    if path.is_dir():
        for marker, backend in MODEL_FOLDER_MARKERS.items():
            if (path / marker).exists():
                return backend
    backend = content_backend(path)
    if backend is not None:
        return backend
    if suffix in LLM_SUFFIXES:
        raise ModelLoadError(f"'{path.name}' is a decoder LLM: it compiles to a prefill and a decode graph.",
                             hint=f"qbcompiler compile --model {path.name} --output {path.stem}.llm.json "
                                  "--calib-data-path TEXT.txt (docs/llm.md).", file=str(path))
    raise ModelLoadError(f"Cannot tell the kind of model from '{path.name}'.",
                         hint=f"Pass --backend (one of: {', '.join(BACKENDS)}).", file=str(path))


def load_source(model: Any, backend: str, **options: Any) -> Any:
    """Load ``model`` with the frontend registered for ``backend``: an onnx-ir model, or for ONNX the checked
    protobuf (``CheckedModelProto``); ``canonicalize`` takes either.

    Raises:
        ArgumentError: the backend name is unknown or not available in this installation.
        ModelLoadError: the frontend's optional package (torch, tensorflow ...) is not installed.
    """
    if backend not in BACKENDS:
        raise ArgumentError(f"Unknown backend '{backend}'.", hint=f"Use one of: {', '.join(BACKENDS)}.")
    if backend not in FRONTENDS:
        raise ArgumentError(f"The '{backend}' frontend is not available yet in this version.",
                            hint="Export the model to ONNX and use --backend onnx.")
    try:
        return FRONTENDS[backend](model, **options)
    except ModuleNotFoundError as error:
        package = (error.name or "").split(".")[0]
        if package not in OPTIONAL_PACKAGES.get(backend, ()):
            raise
        raise ModelLoadError(f"The '{backend}' frontend needs the Python package '{package}', which is not installed.",
                             hint=f"Install it (pip install 'qbstudio[{EXTRAS[backend]}]'); the standalone bundle "
                                  "reads ONNX and TFLite only. Or export the model to ONNX.",
                             file=str(model) if isinstance(model, (str, Path)) else None) from error
