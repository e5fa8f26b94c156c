"""MBLT file I/O: atomic write with metadata and provenance, validated read."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError
from onnx_ir.passes.common import _c_api_utils

from compiler_core import __version__
from compiler_core.errors import InternalError, ModelLoadError, OutputWriteError
from compiler_core.fileio import atomic_write
from compiler_core.frontends.onnx import read_checked_proto, to_ir
from compiler_core.mblt import opset

logger = logging.getLogger(__name__)

PRODUCER_NAME = "qbcompiler"
FORMAT_KEY = "mblt.format_version"
PROVENANCE_KEY = "mblt.provenance"
INPUTS_KEY = "mblt.inputs"
EXTERNAL_DATA_THRESHOLD = 1_800_000_000
"""Bytes of weights beyond which :func:`write_mblt` keeps them in a ``.data`` file beside the MBLT."""


def make_provenance(*, source_path: str | None, source_sha256: str | None, backend: str,
                    parser_options: Mapping[str, Any] | None = None,
                    feed_dict_fingerprint: str | None = None) -> dict[str, Any]:
    """The provenance record stored in every MBLT (DESIGN section 5).

    It holds no timestamp, so parsing the same source with the same options gives the same bytes
    (the file's modification time says when it was written).
    """
    return {
        "source_path": source_path,
        "source_sha256": source_sha256,
        "backend": backend,
        "compiler": PRODUCER_NAME,
        "compiler_version": __version__,
        "parser_options": dict(parser_options or {}),
        "feed_dict_fingerprint": feed_dict_fingerprint,
    }


def describe_inputs(model: ir.Model) -> list[dict[str, Any]]:
    """Name, shape, dtype and the layout hint of each graph input."""
    return [{"name": v.name, "shape": [int(d) for d in v.shape], "dtype": v.dtype.name.lower(),
             "layout": layout_hint(list(v.shape))} for v in model.graph.inputs]


def layout_hint(dims: list[int]) -> str:
    """``NCHW``/``NHWC``/``NCW``/``NC`` guessed from a static shape (channels are 1, 3 or 4, or the smaller)."""
    if len(dims) == 4:
        return "NCHW" if dims[1] in (1, 3, 4) or dims[1] < dims[3] else "NHWC"
    return {3: "NCW", 2: "NC"}.get(len(dims), "")


class CheckedProto(NamedTuple):
    """The protobuf ONNX's checker passed, serialized by onnx-ir's ``call_onnx_api`` (``CheckerPass``): the graph with
    every initializer also declared as a graph input and the large ones without their data.

    Attributes:
        proto: That protobuf.
        inputs: How many graph inputs the model has.
        initializers: The model's initializers before the call, in order.
        moved: Those the call took out of the graph and put back last (the large ones), in order.
    """

    proto: onnx.ModelProto
    inputs: int
    initializers: tuple[ir.Value, ...]
    moved: tuple[ir.Value, ...]


def check_model(model: ir.Model) -> CheckedProto:
    """``CheckerPass(full_check=True)(model)``, returning what the checker saw.

    Raises:
        onnx.checker.ValidationError, onnx.shape_inference.InferenceError: as the checker raises them.
    """
    initializers = tuple(model.graph.initializers.values())
    inputs = len(model.graph.inputs)
    seen: list[onnx.ModelProto] = []

    def check(proto: onnx.ModelProto) -> None:
        seen.append(proto)
        onnx.checker.check_model(proto, full_check=True, skip_opset_compatibility_check=False,
                                 check_custom_domain=False)

    _c_api_utils.call_onnx_api(check, model)
    moved = tuple(value for value in initializers if value.const_value is None
                  or value.const_value.nbytes > _c_api_utils._BIG_TENSOR_SIZE_LIMIT)
    return CheckedProto(seen[0], inputs, initializers, moved)


def _written_proto(model: ir.Model, checked: CheckedProto | None,
                   apart: list[ir.TensorProtocol] | None = None) -> onnx.ModelProto:
    """``ir.to_proto(model)``, built from the checker's protobuf of the same graph where it can be.

    Serializing the graph is most of the work; the checker's copy has it already. It differs from the one to write
    in its graph inputs (every initializer is declared an input there; here those declarations are the initializers'
    value infos, which come first), the large initializers' data (appended, as the call put them last) and the model
    fields the writer stamps (reset from ``model``). Anything else (subgraphs, functions, initializers that are
    inputs or have no data, quantization annotations) takes ``ir.to_proto``. The caller makes sure the graph has not
    changed since the check.

    ``apart``: when given, the large initializers' tensors are appended to it instead of being serialized into the
    protobuf (they belong after its last initializer, in that order; :func:`_serialized` writes them there).
    """
    if checked is None or model.functions or checked.proto.graph.quantization_annotation:
        return ir.to_proto(model)
    graph = model.graph
    initializers = list(graph.initializers.values())
    moved = set(checked.moved)
    order = [*(value for value in checked.initializers if value not in moved), *checked.moved]
    declared = checked.proto.graph.input
    if (initializers != order or len(declared) != checked.inputs + len(order) or len(graph.inputs) != checked.inputs
            or any(value.const_value is None or value.is_graph_input() or value.is_graph_output()
                   for value in initializers)
            or any(attribute.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                   for node in graph for attribute in node.attributes.values())):
        return ir.to_proto(model)
    proto = checked.proto
    position = {value: checked.inputs + index for index, value in enumerate(checked.initializers)}
    infos = [declared[position[value]] for value in order]
    holder = onnx.GraphProto()
    holder.value_info.extend([*infos, *proto.graph.value_info])
    del declared[checked.inputs:]
    proto.graph.ClearField("value_info")
    proto.graph.value_info.extend(holder.value_info)
    for value in checked.moved:
        value.const_value.name = value.name
        if apart is not None:
            apart.append(value.const_value)
        else:
            ir.serde.serialize_tensor_into(proto.graph.initializer.add(), value.const_value)  # one copy of the weights
    for field in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        proto.ClearField(field)
        if getattr(model, field):
            setattr(proto, field, getattr(model, field))
    proto.ir_version = model.ir_version
    del proto.metadata_props[:]
    for key in sorted(model.metadata_props):
        proto.metadata_props.add(key=key, value=model.metadata_props[key])
    return proto


def write_mblt(model: ir.Model, path: str | Path, provenance: Mapping[str, Any], *,
               external_data_threshold: int = EXTERNAL_DATA_THRESHOLD, checked: CheckedProto | None = None) -> Path:
    """Stamp format metadata and provenance on ``model`` and write it atomically.

    Args:
        model: The canonical graph.
        path: The ``.mblt`` to write.
        provenance: The record from :func:`make_provenance`.
        external_data_threshold: When the weights total more bytes than this, they are written to
            ``<name>.mblt.data`` beside the file (protobuf cannot hold more than 2 GB).
        checked: What :func:`check_model` returned for the graph, unchanged since (the checker's serialization
            is reused; it is taken over).

    Raises:
        OutputWriteError: the file cannot be written.
    """
    model.ir_version = opset.MBLT_IR_VERSION
    model.producer_name = PRODUCER_NAME
    model.producer_version = __version__
    model.metadata_props[FORMAT_KEY] = opset.MBLT_FORMAT_VERSION
    model.metadata_props[PROVENANCE_KEY] = json.dumps(provenance, sort_keys=True)
    model.metadata_props[INPUTS_KEY] = json.dumps(describe_inputs(model))
    path = Path(path)
    weights = sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)
    if weights > external_data_threshold:
        return _write_with_external_data(model, path)
    apart: list[ir.TensorProtocol] = []
    parts = _serialized(_written_proto(model, checked, apart), apart)
    return atomic_write(path, lambda temp: _write_parts(temp, parts))


def _write_parts(path: Path, parts: list[bytes | memoryview]) -> None:
    with open(path, "wb") as handle:
        handle.writelines(parts)


_GRAPH_TAG = b"\x3a"  # ModelProto.graph: field 7, length-delimited
_INITIALIZER_TAG = b"\x2a"  # GraphProto.initializer: field 5
_RAW_DATA_TAG = b"\x4a"  # TensorProto.raw_data: field 9
_INITIALIZER_FIELD = 5
_HEADER_FIELDS = ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string")
"""The ModelProto fields numbered before ``graph`` (1-6)."""


def _serialized(proto: onnx.ModelProto, apart: list[ir.TensorProtocol]) -> list[bytes | memoryview]:
    """The bytes of ``proto.SerializeToString(deterministic=True)`` with the tensors ``apart`` appended to its graph's
    initializers, in pieces whose concatenation is those bytes, without copying the weights of a numpy-backed tensor.

    A deterministic serialization writes the fields of a message in field-number order, each length-delimited field as
    its tag, its length (a varint) and its bytes: the weights are spliced in after the graph's last initializer (field
    5; fields 10 and up follow) and the graph's length is rewritten. A numpy-backed tensor of whole-byte elements
    without doc string or metadata is written as its fields 1, 2 and 8 (dims, data type, name) followed by its
    ``raw_data`` (field 9): its array's own bytes. Any other tensor is serialized as ``serialize_tensor_into`` writes
    it.
    """
    data = proto.SerializeToString(deterministic=True)
    if not apart:
        return [data]
    header = onnx.ModelProto()
    for field in _HEADER_FIELDS:
        if proto.HasField(field):
            setattr(header, field, getattr(proto, field))
    view = memoryview(data)
    start = header.ByteSize()
    if view[start:start + 1] != _GRAPH_TAG:
        raise InternalError("The serialized model does not hold its graph where expected.")
    graph_size, graph_start = _read_varint(view, start + 1)
    graph = view[graph_start:graph_start + graph_size]
    split = _after_initializers(graph)
    entries = [_initializer_entry(tensor) for tensor in apart]
    size = graph_size + sum(len(piece) for entry in entries for piece in entry)
    return [view[:start], _GRAPH_TAG + _varint(size), graph[:split], *(piece for entry in entries for piece in entry),
            graph[split:], view[graph_start + graph_size:]]


def _after_initializers(graph: memoryview) -> int:
    """Offset of the first field after the initializers in a serialized GraphProto (all its fields are
    length-delimited)."""
    position = 0
    while position < len(graph):
        tag, after_tag = _read_varint(graph, position)
        if tag & 7 != 2:
            raise InternalError(f"Unexpected wire type {tag & 7} in the serialized graph.")
        if tag >> 3 > _INITIALIZER_FIELD:
            return position
        length, after_length = _read_varint(graph, after_tag)
        position = after_length + length
    return position


def _initializer_entry(tensor: ir.TensorProtocol) -> list[bytes | memoryview]:
    """One ``GraphProto.initializer`` entry (tag, length, TensorProto) for ``tensor``, as ``serialize_tensor_into``
    writes it."""
    if type(tensor) is ir.Tensor and not tensor.doc_string and not tensor.metadata_props \
            and tensor.dtype.bitwidth % 8 == 0 and sys.byteorder == "little":
        array = tensor.numpy()
        if array.dtype.itemsize == tensor.dtype.itemsize:
            fields = onnx.TensorProto()
            fields.dims.extend(tensor.shape.numpy())
            fields.data_type = tensor.dtype.value
            if tensor.name:
                fields.name = tensor.name
            weights = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # the bytes of tobytes(), not copied
            head = fields.SerializeToString(deterministic=True) + _RAW_DATA_TAG + _varint(weights.nbytes)
            return [_INITIALIZER_TAG + _varint(len(head) + weights.nbytes) + head, memoryview(weights)]
    serialized = onnx.TensorProto()
    ir.serde.serialize_tensor_into(serialized, tensor)
    data = serialized.SerializeToString(deterministic=True)
    return [_INITIALIZER_TAG + _varint(len(data)) + data]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: memoryview, position: int) -> tuple[int, int]:
    """(the varint at ``position``, the offset after it)."""
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def _write_with_external_data(model: ir.Model, path: Path) -> Path:
    """The data file goes beside the MBLT first (atomically); the .mblt itself is renamed in last."""
    data_name = path.name + ".data"
    logger.info("Weights over the external-data threshold: writing them to %s beside the MBLT", data_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return atomic_write(path, lambda temp: ir.save(model, temp, format="protobuf", external_data=data_name))
    except ValueError as error:  # onnx-ir refuses to overwrite data an external tensor still reads
        raise OutputWriteError(f"Cannot write the external data of '{path.name}': {error}.",
                               hint="Write the MBLT to another file name.", file=str(path)) from error


def load_mblt(path: str | Path) -> ir.Model:
    """Read an MBLT file (and its ``.data`` file, if any), checking that it is one.

    External weight data is read into memory, so the model can be written elsewhere afterwards.

    Raises:
        ModelLoadError: missing, unreadable, external data missing, or not written by this compiler's
            parse stage.
        InvalidModelError: the graph reads a tensor that nothing defines.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"MBLT file '{path}' does not exist.", hint="Check the path, or run `qbcompiler parse` first.",
                             file=str(path))
    proto = read_checked_proto(path, kind="MBLT", hint="Parse the source model again.")
    if FORMAT_KEY not in {entry.key for entry in proto.metadata_props}:
        raise ModelLoadError(f"'{path.name}' is an ONNX file but not an MBLT (no {FORMAT_KEY} metadata).",
                             hint="Run `qbcompiler parse --model FILE` to make an MBLT from it.", file=str(path))
    return to_ir(proto, path)


def read_provenance(path: str | Path) -> dict[str, Any]:
    """The provenance record of an MBLT file, plus its format version and inputs."""
    proto = _read_header_proto(Path(path))
    props = {entry.key: entry.value for entry in proto.metadata_props}
    if FORMAT_KEY not in props:
        raise ModelLoadError(f"'{Path(path).name}' is not an MBLT (no {FORMAT_KEY} metadata).",
                             hint="Run `qbcompiler parse` to make one.", file=str(path))
    record = json.loads(props.get(PROVENANCE_KEY, "{}"))
    record["format_version"] = props[FORMAT_KEY]
    record["inputs"] = json.loads(props.get(INPUTS_KEY, "[]"))
    return record


def _read_header_proto(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise ModelLoadError(f"MBLT file '{path}' does not exist.", hint="Check the path.", file=str(path))
    try:
        return onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError) as error:
        raise ModelLoadError(f"'{path.name}' cannot be read as an MBLT: {error}.",
                             hint="Parse the source model again.", file=str(path)) from error
