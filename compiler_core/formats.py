"""Model file kinds by name: the one table the frontends' detection and the workbench's file dialogs read.

Kept free of heavy imports so that the workbench can build its file filters at start-up.
"""

from __future__ import annotations

from pathlib import Path

SUFFIX_BACKENDS: dict[str, str] = {
    ".onnx": "onnx", ".mblt": "onnx", ".tflite": "tflite", ".pt2": "torch", ".pth": "torch",
    ".jit": "torchscript", ".keras": "tf", ".h5": "tf", ".hdf5": "tf", ".pb": "tf",
}
"""Suffixes that name their backend."""

CONTENT_DETECTED_SUFFIXES: tuple[str, ...] = (".pt",)
"""Suffixes whose backend is told from the file's bytes (``.pt``: ``torch.save`` or ``torch.jit.save``)."""

LLM_SUFFIXES: tuple[str, ...] = (".gguf",)
"""Decoder LLM files (llama.cpp GGUF): two graphs, prefill and decode (``compiler_core.frontends.llm``)."""

MODEL_FOLDER_MARKERS: dict[str, str] = {"saved_model.pb": "tf", "config.json": "torch"}
"""A folder holding this file is a model of that backend (TensorFlow SavedModel, HuggingFace)."""


CALIBRATION_FILE_SUFFIXES: tuple[str, ...] = (".txt", ".json")
"""Calibration data given as one file: a list of sample files (``.txt``) or a multi-input manifest (``.json``)."""


def is_model_path(path: Path) -> bool:
    """Whether ``path`` names a model by its suffix, or is a folder holding a model marker (cheap: no file is read)."""
    if path.is_dir():
        return any((path / marker).exists() for marker in MODEL_FOLDER_MARKERS)
    return path.suffix.lower() in (*SUFFIX_BACKENDS, *CONTENT_DETECTED_SUFFIXES, *LLM_SUFFIXES)


def model_file_patterns() -> list[str]:
    """Glob patterns of every model file the compiler reads (``*.onnx`` ...), for file dialogs."""
    return [f"*{suffix}" for suffix in (*SUFFIX_BACKENDS, *CONTENT_DETECTED_SUFFIXES, *LLM_SUFFIXES)]
