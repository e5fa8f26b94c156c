"""TFLite frontend: a ``.tflite`` flatbuffer -> an ONNX (opset 21) onnx-ir model.

The model keeps its TFLite interface: inputs and outputs are NHWC, with the TFLite tensor names.
fp16 and int8 constant weights are dequantized to float32 at conversion time (``DEQUANTIZE`` and
``DENSIFY`` of constants fold away). Full-integer models are imported as float graphs: each
quantized activation carries its real value, ``QUANTIZE``/``DEQUANTIZE`` on activations become
the identity, and every tensor's quantization parameters (per-channel ones included) are kept as
calibration hints in the model's ``metadata_props["mblt.calibration_hints"]`` (JSON).

Only subgraph 0 is imported (control-flow subgraphs are not supported).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from compiler_core.errors import ArgumentError
from compiler_core.frontends.tflite.converters import CONVERTERS
from compiler_core.frontends.tflite.importer import CALIBRATION_HINTS_KEY, import_graph
from compiler_core.frontends.tflite.reader import decode_tflite, read_tflite

logger = logging.getLogger(__name__)

__all__ = ["CALIBRATION_HINTS_KEY", "CONVERTERS", "describe_requirements", "load_tflite", "load_tflite_bytes"]


def load_tflite(model: Any, output_names: Sequence[str] | None = None, **_: Any) -> ir.Model:
    """Load a ``.tflite`` file as an ONNX onnx-ir model (NHWC interface, TFLite tensor names).

    Args:
        model: Path to a ``.tflite`` file.
        output_names: Tensors to end the graph at; operators that only feed the others may be unconvertible.

    Raises:
        ArgumentError: ``model`` is not a path.
        ModelLoadError: the file is missing, not TFLite, truncated or corrupt.
        UnsupportedOpsError: operators without a converter, every one listed with its count.
    """
    graph = read_tflite(_as_path(model))
    logger.info("TFLite %s: %d operators, %d tensors", graph.path.name, len(graph.operators), len(graph.tensors))
    return import_graph(graph, output_names)


def load_tflite_bytes(data: bytes, name: str | Path, output_names: Sequence[str] | None = None) -> ir.Model:
    """Like :func:`load_tflite`, for a flatbuffer in memory (e.g. from TensorFlow's converter).

    Args:
        data: The ``.tflite`` bytes.
        name: What to call the model in messages (its source path).
        output_names: As for :func:`load_tflite`.
    """
    return import_graph(decode_tflite(data, name), output_names)


def describe_requirements(path: str | Path) -> dict[str, Any]:
    """The inputs and outputs a ``.tflite`` model expects, without converting it.

    Returns:
        ``{"format": "tflite", "layout": "NHWC", "subgraphs": n, "inputs": [...], "outputs": [...]}``
        where each entry is ``{"name", "shape", "dtype", "quantization"}`` (quantization is
        ``{"scale", "zero_point"}`` or None).

    Raises:
        ModelLoadError: the file cannot be read as TFLite.
    """
    graph = read_tflite(_as_path(path))
    return {"format": "tflite", "layout": "NHWC", "subgraphs": graph.subgraph_count,
            "inputs": [_describe(graph.tensors[i]) for i in graph.inputs],
            "outputs": [_describe(graph.tensors[i]) for i in graph.outputs]}


def _describe(tensor: Any) -> dict[str, Any]:
    quantization = tensor.quantization
    return {"name": tensor.name, "shape": list(tensor.shape), "dtype": tensor.type_name.lower(),
            "quantization": None if quantization is None else {
                "scale": [float(s) for s in quantization.scale],
                "zero_point": [int(z) for z in quantization.zero_point]}}


def _as_path(model: Any) -> Path:
    if not isinstance(model, (str, Path)):
        raise ArgumentError("The tflite backend takes a path to a .tflite file.",
                            hint="Pass the file path, or choose --backend for other model kinds.")
    return Path(model)
