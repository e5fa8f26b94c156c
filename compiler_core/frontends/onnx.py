"""ONNX frontend: read an ``.onnx`` file (with external data) into an onnx-ir model, with clear errors.

External weight data is read into memory at load time, so later passes (which create, fold and
re-serialize tensors) never hold a reference to a file beside the source. Graphs whose nodes
name tensors that nothing defines are refused here: onnx-ir would otherwise invent new graph
inputs for them.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from pathlib import Path, PurePath
from typing import NamedTuple

import onnx
import onnx_ir as ir
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from compiler_core.errors import InvalidModelError, ModelLoadError

logger = logging.getLogger(__name__)

_ONNX_HINT = "Export the model again, or pass the right file; see `qbcompiler parse --help`."
MAX_TENSOR_BYTES = 1 << 34
"""Largest single tensor (16 GiB) a model may declare; beyond it the model is refused before allocation."""


def load_onnx(path: str | Path) -> ir.Model:
    """Load an ONNX file, checking that it is complete and self-consistent.

    External data is resolved relative to the file and read into memory.

    Args:
        path: Path to a ``.onnx`` file; external data files are resolved relative to it.

    Raises:
        ModelLoadError: the file is missing, unreadable, truncated, not ONNX, or its external
            data is missing, too short or outside the model's folder.
        InvalidModelError: a node reads a tensor that no input, initializer or node defines.
    """
    path = Path(path)
    return to_ir(read_checked_proto(path), path)


class CheckedModelProto(NamedTuple):
    """A source model read and checked by :func:`read_onnx`, not yet turned into onnx-ir.

    Canonicalization does its first steps on the protobuf when the model needs the ONNX C API
    opset conversion (which works on protobuf), so the model is deserialized once, after it.
    """

    proto: onnx.ModelProto
    path: Path

    def to_ir(self) -> ir.Model:
        """The model in onnx-ir (see :func:`to_ir`)."""
        return to_ir(self.proto, self.path)


def read_onnx(path: str | Path) -> CheckedModelProto:
    """:func:`load_onnx` without the final deserialization into onnx-ir.

    Raises:
        ModelLoadError: see :func:`load_onnx`.
        InvalidModelError: see :func:`load_onnx`.
    """
    path = Path(path)
    return CheckedModelProto(read_checked_proto(path), path)


def read_checked_proto(path: Path, *, kind: str = "ONNX", hint: str = _ONNX_HINT) -> onnx.ModelProto:
    """Read an ONNX-format file (a source model or an MBLT) with its external data, fully checked.

    Args:
        path: The file; external data is resolved relative to its folder.
        kind: What to call the file in messages (``ONNX`` or ``MBLT``).
        hint: The remedy given with every error.

    Raises:
        ModelLoadError: see :func:`load_onnx`.
        InvalidModelError: a node reads an undefined tensor.
    """
    proto = _read_proto(path, kind, hint)
    tensors = list(_all_tensors(proto.graph))  # one walk for the size and external-data checks
    check_tensor_sizes(proto, path, tensors)
    external = [tensor for tensor in tensors if tensor.data_location == onnx.TensorProto.EXTERNAL]
    _check_external_data(external, path)
    check_references(proto.graph, path)
    _load_external_data(external, path)
    return proto


def to_ir(proto: onnx.ModelProto, path: Path) -> ir.Model:
    """Deserialize a checked proto into onnx-ir.

    Raises:
        ModelLoadError: onnx-ir cannot represent the proto.
    """
    try:
        return ir.serde.deserialize_model(proto)
    except Exception as error:  # onnx-ir raises plain exceptions on malformed protos
        raise ModelLoadError(f"'{path.name}' is not a valid ONNX model: {error}.", hint=_ONNX_HINT,
                             file=str(path)) from error


def source_checker_failure(path: str | Path) -> str | None:
    """The first line of ``onnx.checker.check_model(path, full_check=True)``'s complaint, or None.

    Used to decide whom an error blames: the source model only when this returns a message.
    """
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        lines = str(error).strip().splitlines()
        return lines[0] if lines else type(error).__name__
    return None


def _read_proto(path: Path, kind: str, hint: str) -> onnx.ModelProto:
    if not path.exists():
        raise ModelLoadError(f"{kind} file '{path}' does not exist.", hint="Check the path.", file=str(path))
    if path.is_dir():
        raise ModelLoadError(f"'{path}' is a folder, not an {kind} file.",
                             hint="Pass the file itself, or choose the backend for this folder with --backend.",
                             file=str(path))
    file_format = onnx.serialization.registry.get_format_from_file_extension(path.suffix) or "protobuf"
    try:  # what onnx.load(path, load_external_data=False) does, keeping the bytes for the UTF-8 check
        data = path.read_bytes()
        proto = onnx.load_model_from_string(data, format=file_format)
    except (DecodeError, RuntimeWarning, ValueError, OSError, UnicodeDecodeError) as error:
        from compiler_core.frontends import misnamed_hint

        raise ModelLoadError(f"'{path.name}' cannot be read as {kind} (truncated or not an {kind} file): {error}.",
                             hint=hint + misnamed_hint(path, "onnx"), file=str(path)) from error
    if not proto.HasField("graph") or not proto.opset_import or len(proto.graph.node) == 0:
        from compiler_core.frontends import misnamed_hint

        raise ModelLoadError(f"'{path.name}' is not an {kind} model (no graph, opset or nodes found).",
                             hint=hint + misnamed_hint(path, "onnx"), file=str(path))
    parse_checks = file_format == "protobuf" and len(data) <= _PARSE_CHECK_BYTES_PER_NODE * len(proto.graph.node)
    bad_text = None if parse_checks and _all_text_utf8(data) else _first_invalid_text(proto)
    del data
    if bad_text is not None:
        raise ModelLoadError(f"'{path.name}' is corrupt: the text field '{bad_text}' is not valid UTF-8.",
                             hint=hint, file=str(path))
    return proto


def _utf8_checking_model_class() -> type | None:
    """``onnx.ModelProto`` declared in proto3 syntax, whose parser refuses a string field that is not UTF-8 (proto2's,
    ONNX's, takes any bytes); None if this protobuf cannot build it. Built once, when this module is imported."""
    try:
        file = descriptor_pb2.FileDescriptorProto()
        onnx.ModelProto.DESCRIPTOR.file.CopyToProto(file)
        file.syntax = "proto3"  # ONNX's messages have no required fields, defaults or non-zero first enum values
        pool = descriptor_pool.DescriptorPool()
        pool.Add(file)
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(onnx.ModelProto.DESCRIPTOR.full_name))
    except Exception:  # noqa: BLE001 - the Python walk checks the text instead
        logger.debug("No proto3 ModelProto for the UTF-8 check; text fields are checked one by one", exc_info=True)
        return None


_UTF8_CHECKING_MODEL = _utf8_checking_model_class()
_PARSE_CHECK_BYTES_PER_NODE = 4096
"""File bytes per node up to which the UTF-8 check parses the file again (:func:`_all_text_utf8`) instead of walking its
fields: the parse copies the weights into fresh memory, about 1 ms per MB in a fresh process here (page faults); the
walk costs about 5 us per node (PP-OCR cls, 0.6 MB, 566 nodes: 0.2 ms against 3 ms; MobileNetV2, 14 MB, 222 nodes:
14 ms against 2 ms)."""


def _all_text_utf8(data: bytes) -> bool:
    """True if every string field of the serialized model ``data`` is UTF-8, as the proto3 parser checks it (in C); False
    when that parse fails for any reason, leaving the answer to :func:`_first_invalid_text`, which names the field."""
    if _UTF8_CHECKING_MODEL is None:
        return False
    try:
        _UTF8_CHECKING_MODEL.FromString(data)
    except Exception:  # noqa: BLE001 - DecodeError for text that is not UTF-8; anything else: the walk decides
        return False
    return True


def _repeated(field) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 6; older versions have ``label``
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED


def _first_invalid_text(message) -> str | None:
    """The name of the first string field holding bytes that are not UTF-8 (protobuf does not check proto2)."""
    text_and_messages = _text_and_message_fields(message.DESCRIPTOR)
    if text_and_messages is None:
        fields = message.ListFields()
    else:  # never read a bytes field (raw_data): each read copies the whole tensor
        fields = [(field, getattr(message, field.name)) for field in text_and_messages
                  if (len(getattr(message, field.name)) if _repeated(field) else message.HasField(field.name))]
    for field, value in fields:
        kind = _field_kind(field)
        if kind == _TEXT:
            if type(value) is not str:  # protobuf hands text that is not UTF-8 back as bytes
                return field.full_name
        elif kind == _TEXTS:
            try:
                "".join(value)  # a bytes item raises
            except TypeError:
                return field.full_name
        elif kind != _OTHER:
            for item in value if kind == _MESSAGES else (value,):
                found = _first_invalid_text(item)
                if found is not None:
                    return found
    return None


_OTHER, _TEXT, _TEXTS, _MESSAGE, _MESSAGES = range(5)


@functools.cache
def _field_kind(field) -> int:
    """How :func:`_first_invalid_text` reads a field: not at all, as text (one or repeated), as messages."""
    if field.type == field.TYPE_STRING:
        return _TEXTS if _repeated(field) else _TEXT
    if field.type == field.TYPE_MESSAGE:
        return _MESSAGES if _repeated(field) else _MESSAGE
    return _OTHER


@functools.cache
def _text_and_message_fields(descriptor) -> tuple | None:
    """The string and message fields of ``TensorProto`` (whose bytes fields hold the weights), in field-number
    order; None for other message types (``ListFields`` is quicker there)."""
    if descriptor.full_name != onnx.TensorProto.DESCRIPTOR.full_name:
        return None
    fields = sorted(descriptor.fields, key=lambda field: field.number)
    return tuple(field for field in fields if field.type in (field.TYPE_STRING, field.TYPE_MESSAGE))


def check_tensor_sizes(proto: onnx.ModelProto, path: Path, tensors: list[onnx.TensorProto] | None = None) -> None:
    """Refuse tensors whose declared size is absurd, before anything is allocated for them.

    Args:
        proto: The model.
        path: Its file, for messages.
        tensors: Every tensor of the model (initializers and attribute tensors, subgraphs included), if the caller
            has them already.

    Raises:
        ModelLoadError: a tensor has a negative dimension or declares more than ``MAX_TENSOR_BYTES``.
    """
    for tensor in _all_tensors(proto.graph) if tensors is None else tensors:
        count = 1
        for dim in tensor.dims:
            if dim < 0:
                raise ModelLoadError(f"'{path.name}': tensor '{tensor.name}' has a negative dimension {list(tensor.dims)}.",
                                     hint=_ONNX_HINT, file=str(path), tensor=tensor.name)
            count *= dim
        itemsize = _itemsize(tensor.data_type)
        if count * itemsize > MAX_TENSOR_BYTES:
            raise ModelLoadError(f"'{path.name}': tensor '{tensor.name}' declares {count * itemsize} bytes "
                                 f"(shape {list(tensor.dims)}), more than the {MAX_TENSOR_BYTES} byte limit.",
                                 hint=_ONNX_HINT, file=str(path), tensor=tensor.name)
        _check_data_length(tensor, count, path)


def _check_data_length(tensor: onnx.TensorProto, count: int, path: Path) -> None:
    """The stored values must be exactly as many as the dims say (raw bytes, or one typed field)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.data_type in _PACKED_TYPES:
        return
    if tensor.HasField("raw_data"):
        found, expected = len(tensor.raw_data), count * _itemsize(tensor.data_type)
    else:
        typed = [len(getattr(tensor, field)) for field in _TYPED_FIELDS if len(getattr(tensor, field))]
        found = typed[0] if typed else 0
        expected = count * (2 if tensor.data_type in _COMPLEX_TYPES else 1) if typed or count else 0
        if tensor.data_type == onnx.TensorProto.STRING:
            found, expected = len(tensor.string_data), count
    if found != expected:
        raise ModelLoadError(f"'{path.name}': tensor '{tensor.name}' of shape {list(tensor.dims)} holds {found} "
                             f"{'bytes' if tensor.HasField('raw_data') else 'values'}, expected {expected}.",
                             hint=_ONNX_HINT, file=str(path), tensor=tensor.name)


_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")
_COMPLEX_TYPES = frozenset({onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128})
_PACKED_TYPES = frozenset(getattr(onnx.TensorProto, name) for name in
                          ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2", "FLOAT6E2M3", "FLOAT6E3M2")
                          if hasattr(onnx.TensorProto, name))
"""Sub-byte types pack several values per byte: their lengths are not checked here."""


@functools.cache
def _itemsize(data_type: int) -> int:
    """Bytes per element of an ONNX data type (1 for unknown and sub-byte types); cached: ONNX's look-up takes a few
    microseconds, and it is asked twice for every tensor of a model."""
    try:
        return max(1, onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize)
    except (KeyError, ValueError, TypeError):
        return 1


def _check_external_data(external: list[onnx.TensorProto], path: Path) -> None:
    missing: list[str] = []
    for tensor in external:
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = _external_location(info.get("location", ""), tensor.name, path)
        needed = _int_field(info, "offset", tensor.name, path) + _int_field(info, "length", tensor.name, path)
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


def _external_location(location: str, tensor: str, path: Path) -> Path:
    relative = PurePath(location)
    if not location or relative.is_absolute() or ".." in relative.parts:
        raise ModelLoadError(f"'{path.name}': tensor '{tensor}' names external data '{location}', which is not a "
                             "file inside the model's folder.", hint=_ONNX_HINT, file=str(path), tensor=tensor)
    return path.parent / relative


def _int_field(info: dict[str, str], key: str, tensor: str, path: Path) -> int:
    try:
        value = int(info.get(key, 0) or 0)
    except ValueError:
        value = -1
    if value < 0:
        raise ModelLoadError(f"'{path.name}': tensor '{tensor}' has an invalid external data {key} "
                             f"'{info.get(key)}'.", hint=_ONNX_HINT, file=str(path), tensor=tensor)
    return value


def _load_external_data(external: list[onnx.TensorProto], path: Path) -> None:
    """Read every external tensor into the proto (the checks above made sure the data is there)."""
    try:
        for tensor in external:
            external_data_helper.load_external_data_for_tensor(tensor, str(path.parent))
            tensor.ClearField("data_location")  # as if it had been stored inline: same bytes downstream
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"External weight data of '{path.name}' cannot be read: {error}.",
                             hint="Keep the external data file(s) in the same folder as the model.",
                             file=str(path)) from error


def check_references(graph: onnx.GraphProto, path: Path, outer: frozenset[str] = frozenset()) -> None:
    """Every node input must name a graph input, an initializer, a node output or an outer-scope value.

    Two walks over the nodes for a well-formed graph (outputs, then inputs in order, with the subgraphs); anything
    wrong is reported by :func:`_check_references_in_full`, which finds the same first problem.

    Raises:
        InvalidModelError: naming the first node that reads an undefined tensor, and the tensor.
    """
    defined = set(outer) | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if name:
                if name in producer or name in defined:
                    return _check_references_in_full(graph, path, outer)
                producer[name] = index
    scope: frozenset[str] | None = None
    in_order = True
    for index, node in enumerate(graph.node):
        for name in node.input:
            if name:
                source = producer.get(name)
                if source is None:
                    if name not in defined:
                        return _check_references_in_full(graph, path, outer)
                elif source >= index:
                    in_order = False
        for attribute in node.attribute:
            if attribute.type in _GRAPH_TYPES:
                scope = frozenset(defined | producer.keys()) if scope is None else scope
                for subgraph in _subgraphs(attribute):
                    check_references(subgraph, path, scope)
    if not in_order:
        _check_acyclic(graph, path)
    missing_outputs = [v.name for v in graph.output if v.name not in defined and v.name not in producer]
    if missing_outputs:
        raise InvalidModelError(f"'{path.name}': graph output(s) {missing_outputs} are not produced by any node.",
                                hint="The source model is malformed (check it with onnx.checker); export it again.",
                                file=str(path), tensor=missing_outputs[0])


_GRAPH_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def _check_references_in_full(graph: onnx.GraphProto, path: Path, outer: frozenset[str]) -> None:
    """:func:`check_references`, name by name: raises for the first problem (a graph it finds none in passes)."""
    defined = set(outer) | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    produced = [name for node in graph.node for name in node.output if name]
    counts = Counter(produced)
    redefined = sorted({name for name in produced if name in defined or counts[name] > 1})
    if redefined:
        raise InvalidModelError(f"'{path.name}': tensor '{redefined[0]}' is defined more than once (by a node and "
                                "an input, an initializer or another node).",
                                hint="The source model is malformed (check it with onnx.checker); export it again.",
                                file=str(path), tensor=redefined[0])
    defined |= set(produced)
    for node in graph.node:
        for name in node.input:
            if name and name not in defined:
                label = node.name or f"#{list(graph.node).index(node)}"
                raise InvalidModelError(
                    f"'{path.name}': node '{label}' ({node.op_type}) reads tensor '{name}', which no graph input, "
                    "initializer or node defines.",
                    hint="The source model is malformed (check it with onnx.checker); export it again.",
                    file=str(path), node=label, tensor=name)
        for attribute in node.attribute:
            for subgraph in _subgraphs(attribute):
                check_references(subgraph, path, frozenset(defined))
    _check_acyclic(graph, path)
    missing_outputs = [v.name for v in graph.output if v.name not in defined]
    if missing_outputs:
        raise InvalidModelError(f"'{path.name}': graph output(s) {missing_outputs} are not produced by any node.",
                                hint="The source model is malformed (check it with onnx.checker); export it again.",
                                file=str(path), tensor=missing_outputs[0])


def _check_acyclic(graph: onnx.GraphProto, path: Path) -> None:
    """Refuse a graph whose nodes feed each other in a loop (Kahn's algorithm over this scope).

    A graph whose nodes are listed in topological order (what exporters write) has no loop; that is checked
    first, in one walk.
    """
    producer = {name: index for index, node in enumerate(graph.node) for name in node.output if name}
    if all(producer.get(name, -1) < index for index, node in enumerate(graph.node) for name in node.input):
        return
    waiting = [len({producer[name] for name in node.input if name in producer}) for node in graph.node]
    consumers: dict[int, set[int]] = {}
    for index, node in enumerate(graph.node):
        for source in {producer[name] for name in node.input if name in producer}:
            consumers.setdefault(source, set()).add(index)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    done = 0
    while ready:
        index = ready.pop()
        done += 1
        for consumer in consumers.get(index, ()):
            waiting[consumer] -= 1
            if waiting[consumer] == 0:
                ready.append(consumer)
    if done != len(graph.node):
        stuck = next(node for node, count in zip(graph.node, waiting) if count)
        raise InvalidModelError(f"'{path.name}': the graph has a cycle (node '{stuck.name or stuck.op_type}' "
                                "depends on its own output).",
                                hint="The source model is malformed (check it with onnx.checker); export it again.",
                                file=str(path), node=stuck.name or stuck.op_type)


def _subgraphs(attribute: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attribute.type == onnx.AttributeProto.GRAPH:
        return [attribute.g]
    return list(attribute.graphs) if attribute.type == onnx.AttributeProto.GRAPHS else []


def _all_tensors(graph: onnx.GraphProto):
    """Every tensor of the graph: initializers, then each node's attribute tensors (a ``TENSOR`` attribute's ``t``, any
    ``tensors``) and its subgraphs' tensors, in order."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            kind = attribute.type
            if kind == _TENSOR:
                yield attribute.t
            if attribute.tensors:
                yield from attribute.tensors
            if kind in _GRAPH_TYPES:
                for subgraph in _subgraphs(attribute):
                    yield from _all_tensors(subgraph)


_TENSOR = onnx.AttributeProto.TENSOR
