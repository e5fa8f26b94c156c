"""ONNX frontend: read an ``.onnx`` file (with external data) into an onnx-ir model, with clear errors."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from compiler_core.errors import ModelLoadError

logger = logging.getLogger(__name__)

_ONNX_HINT = "Export the model again, or pass the right file; see `qbcompiler parse --help`."


def load_onnx(path: str | Path) -> ir.Model:
    """Load an ONNX file, checking that it is complete and that its external data exists.

    Args:
        path: Path to a ``.onnx`` file; external data files are resolved relative to it.

    Raises:
        ModelLoadError: the file is missing, unreadable, truncated, not ONNX, or its external
            data is missing or too short.
    """
    path = Path(path)
    proto = _read_proto(path)
    _check_external_data(proto, path)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as error:  # onnx-ir raises plain exceptions on malformed protos
        raise ModelLoadError(f"'{path.name}' is not a valid ONNX model: {error}.", hint=_ONNX_HINT,
                             file=str(path)) from error
    ir.external_data.set_base_dir(model.graph, path.parent)
    return model


def _read_proto(path: Path) -> onnx.ModelProto:
    if not path.exists():
        raise ModelLoadError(f"Model file '{path}' does not exist.", hint="Check the path.", file=str(path))
    if path.is_dir():
        raise ModelLoadError(f"'{path}' is a folder, not an ONNX file.",
                             hint="Pass the .onnx file, or choose the backend for this folder with --backend.",
                             file=str(path))
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, OSError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"'{path.name}' cannot be read as ONNX (truncated or not an ONNX file): {error}.",
                             hint=_ONNX_HINT, file=str(path)) from error
    if not proto.HasField("graph") or not proto.opset_import or len(proto.graph.node) == 0:
        raise ModelLoadError(f"'{path.name}' is not an ONNX model (no graph, opset or nodes found).",
                             hint=_ONNX_HINT, file=str(path))
    return proto


def _check_external_data(proto: onnx.ModelProto, path: Path) -> None:
    missing: list[str] = []
    for tensor in _external_tensors(proto.graph):
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = path.parent / info.get("location", "")
        needed = int(info.get("offset", 0)) + int(info.get("length", 0))
        if not location.is_file():
            missing.append(f"{tensor.name} -> {location.name} (file missing)")
        elif location.stat().st_size < needed:
            missing.append(f"{tensor.name} -> {location.name} (file too short: "
                           f"{location.stat().st_size} < {needed} bytes)")
    if missing:
        shown = "; ".join(missing[:5]) + (f"; and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelLoadError(f"External weight data of '{path.name}' is missing or incomplete: {shown}.",
                             hint="Keep the external data file(s) in the same folder as the model.",
                             file=str(path))


def _external_tensors(graph: onnx.GraphProto):
    for tensor in graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            yield tensor
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_location == onnx.TensorProto.EXTERNAL:
                yield attribute.t
            for subgraph in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                yield from _external_tensors(subgraph)
