"""Read a ``.tflite`` flatbuffer into plain dataclasses, validating it eagerly.

The ``tflite`` package decodes lazily: a truncated file only fails when a field past the end is
touched. So everything the importer needs is decoded here, at once, inside one ``try``, and any
failure becomes a :class:`ModelLoadError` naming the file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tflite
from tflite.BuiltinOptions import BuiltinOptions
from tflite.TensorType import TensorType

from compiler_core.errors import ModelLoadError

logger = logging.getLogger(__name__)

TFLITE_MAGIC = b"TFL3"
_HINT = "Pass a complete .tflite file (re-export it, or download it again)."

_NUMPY_DTYPES = {
    TensorType.FLOAT32: np.float32, TensorType.FLOAT16: np.float16, TensorType.FLOAT64: np.float64,
    TensorType.INT8: np.int8, TensorType.UINT8: np.uint8, TensorType.INT16: np.int16,
    TensorType.UINT16: np.uint16, TensorType.INT32: np.int32, TensorType.UINT32: np.uint32,
    TensorType.INT64: np.int64, TensorType.UINT64: np.uint64, TensorType.BOOL: np.bool_,
}
_TYPE_NAMES = {value: name for name, value in vars(TensorType).items() if not name.startswith("_")}
_OPTION_CLASS_NAMES = {value: name for name, value in vars(BuiltinOptions).items() if not name.startswith("_")}
_SPARSE_VECTOR_CLASSES = {1: tflite.Int32Vector, 2: tflite.Uint16Vector, 3: tflite.Uint8Vector}


@dataclass(frozen=True)
class Quantization:
    """Affine quantization of a tensor: ``real = scale * (q - zero_point)``, per ``axis`` if per-channel."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int

    @property
    def per_channel(self) -> bool:
        """True when there is one scale per slice along ``axis``."""
        return self.scale.size > 1

    def dequantize(self, values: np.ndarray) -> np.ndarray:
        """The real (float32) values of quantized ``values``."""
        shape = [1] * values.ndim
        if self.per_channel:
            shape[self.axis] = -1
        scale = self.scale.reshape(shape) if self.per_channel else self.scale.reshape(())
        zero_point = self.zero_point.reshape(shape) if self.zero_point.size > 1 else self.zero_point.reshape(())
        return ((values.astype(np.float64) - zero_point) * scale).astype(np.float32)


@dataclass(frozen=True)
class DimensionMetadata:
    """One level of a sparse tensor's traversal: dense of ``dense_size``, or CSR ``segments``/``indices``."""

    dense: bool
    dense_size: int
    segments: np.ndarray | None = None
    indices: np.ndarray | None = None


@dataclass(frozen=True)
class Sparsity:
    """TFLite sparsity parameters (see the ``SparsityParameters`` table of the schema)."""

    traversal_order: tuple[int, ...]
    block_map: tuple[int, ...]
    dim_metadata: tuple[DimensionMetadata, ...]


@dataclass
class Tensor:
    """A TFLite tensor; ``data`` holds a constant's buffer contents (flat values if ``sparsity``)."""

    index: int
    name: str
    shape: tuple[int, ...]
    type_name: str
    dtype: np.dtype | None
    data: np.ndarray | None = None
    quantization: Quantization | None = None
    sparsity: Sparsity | None = None
    dynamic_dims: tuple[int, ...] = ()


@dataclass
class Operator:
    """A TFLite operator; ``inputs`` uses -1 for an omitted optional input."""

    index: int
    op_type: str
    custom_code: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: DecodedOptions | None = None
    custom_options: bytes = b""

    @property
    def key(self) -> str:
        """The converter registry key: the builtin name, or the custom code of a custom op."""
        return self.custom_code if self.op_type == "CUSTOM" else self.op_type

    @property
    def display_name(self) -> str:
        """``CONV_2D`` or ``CUSTOM:Convolution2DTransposeBias``, for messages."""
        return f"CUSTOM:{self.custom_code}" if self.op_type == "CUSTOM" else self.op_type


@dataclass
class TFLiteGraph:
    """Subgraph 0 of a TFLite model, fully decoded."""

    path: Path
    version: int
    description: str
    tensors: list[Tensor]
    operators: list[Operator]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    subgraph_count: int = 1
    metadata: dict[str, str] = field(default_factory=dict)


def read_tflite(path: str | Path) -> TFLiteGraph:
    """Read and validate a ``.tflite`` file; only subgraph 0 (the main graph) is decoded.

    Raises:
        ModelLoadError: the file is missing, not a TFLite flatbuffer, truncated or malformed.
    """
    path = Path(path)
    return decode_tflite(_read_bytes(path), path)


def decode_tflite(data: bytes, path: str | Path) -> TFLiteGraph:
    """Decode TFLite flatbuffer ``data`` (already read); ``path`` names it in messages.

    Raises:
        ModelLoadError: the bytes are not a TFLite flatbuffer, or are truncated or malformed.
    """
    path = Path(path)
    if len(data) < 8 or data[4:8] != TFLITE_MAGIC:
        from compiler_core.frontends import misnamed_hint

        raise ModelLoadError(f"'{path.name}' is not a TFLite model (no 'TFL3' identifier at byte 4).",
                             hint="Pass a .tflite file, or choose the right --backend for this file."
                                  + (misnamed_hint(path, "tflite") if path.is_file() else ""),
                             file=str(path))
    try:
        model = tflite.Model.GetRootAsModel(data, 0)
        graph = _decode_model(model, data, path)
    except ModelLoadError:
        raise
    except Exception as error:  # flatbuffers raises struct.error / IndexError / ValueError on bad offsets
        raise ModelLoadError(f"'{path.name}' is truncated or corrupt: the TFLite flatbuffer cannot be decoded "
                             f"({type(error).__name__}: {error}).", hint=_HINT, file=str(path)) from error
    if graph.subgraph_count > 1:
        logger.warning("%s has %d subgraphs; only subgraph 0 (the main graph) is imported",
                       path.name, graph.subgraph_count)
    return graph


def _read_bytes(path: Path) -> bytes:
    if not path.exists():
        raise ModelLoadError(f"Model file '{path}' does not exist.", hint="Check the path.", file=str(path))
    if path.is_dir():
        raise ModelLoadError(f"'{path}' is a folder, not a .tflite file.", hint="Pass the .tflite file.",
                             file=str(path))
    return path.read_bytes()


def _decode_model(model: tflite.Model, data: bytes, path: Path) -> TFLiteGraph:
    if model.SubgraphsLength() < 1:
        raise ModelLoadError(f"'{path.name}' has no subgraph.", hint=_HINT, file=str(path))
    opcodes = [_opcode_name(model.OperatorCodes(i)) for i in range(model.OperatorCodesLength())]
    subgraph = model.Subgraphs(0)
    buffers = [_buffer_bytes(model.Buffers(i), data) for i in range(model.BuffersLength())]
    tensors = [_decode_tensor(subgraph.Tensors(i), i, buffers) for i in range(subgraph.TensorsLength())]
    operators = [_decode_operator(subgraph.Operators(i), i, opcodes) for i in range(subgraph.OperatorsLength())]
    for operator in operators:
        _check_tensor_indices(operator, len(tensors), path)
    inputs = tuple(int(i) for i in subgraph.InputsAsNumpy()) if subgraph.InputsLength() else ()
    outputs = tuple(int(i) for i in subgraph.OutputsAsNumpy()) if subgraph.OutputsLength() else ()
    bad = [i for i in (*inputs, *outputs) if not 0 <= i < len(tensors)]
    if bad:
        raise ModelLoadError(f"'{path.name}' is corrupt: the graph's inputs/outputs name tensor(s) {bad}, but the "
                             f"graph has {len(tensors)}.", hint=_HINT, file=str(path))
    return TFLiteGraph(
        path=path, version=model.Version(), description=(model.Description() or b"").decode(errors="replace"),
        tensors=tensors, operators=operators, inputs=inputs, outputs=outputs,
        subgraph_count=model.SubgraphsLength(), metadata=_metadata_names(model))


def _opcode_name(code: tflite.OperatorCode) -> tuple[str, str]:
    # Schema v3a moved builtin codes >= 127 to a new field; older files only fill the deprecated one.
    builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
    name = tflite.BUILTIN_OPCODE2NAME.get(builtin, f"BUILTIN_{builtin}")
    return name, (code.CustomCode() or b"").decode(errors="replace")


def _buffer_bytes(buffer: tflite.Buffer, data: bytes) -> bytes | memoryview | None:
    offset, size = buffer.Offset(), buffer.Size()
    if offset > 1:  # models over 2 GB keep buffers after the flatbuffer, addressed by offset/size
        if offset + size > len(data):
            raise ValueError(f"buffer at offset {offset} (+{size} bytes) lies past the end of the file")
        return memoryview(data)[offset:offset + size]
    if buffer.DataIsNone() or buffer.DataLength() == 0:
        return None
    return buffer.DataAsNumpy().tobytes()


def _decode_tensor(tensor: tflite.Tensor, index: int, buffers: list) -> Tensor:
    type_code = tensor.Type()
    dtype = np.dtype(_NUMPY_DTYPES[type_code]) if type_code in _NUMPY_DTYPES else None
    shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
    result = Tensor(index=index, name=(tensor.Name() or b"").decode(errors="replace") or f"tensor_{index}",
                    shape=shape, type_name=_TYPE_NAMES.get(type_code, str(type_code)), dtype=dtype,
                    quantization=_decode_quantization(tensor.Quantization()),
                    sparsity=_decode_sparsity(tensor.Sparsity()),
                    dynamic_dims=_dynamic_dims(tensor))
    raw = buffers[tensor.Buffer()] if 0 < tensor.Buffer() < len(buffers) else None
    if raw is not None and dtype is not None:
        values = np.frombuffer(raw, dtype=dtype).copy()
        result.data = values if result.sparsity else values.reshape(shape)
    return result


def _dynamic_dims(tensor: tflite.Tensor) -> tuple[int, ...]:
    """Dimensions the signature leaves open (-1); ``shape`` then holds the size 1 for them."""
    if tensor.ShapeSignatureLength() == 0:
        return ()
    return tuple(i for i, dim in enumerate(tensor.ShapeSignatureAsNumpy()) if dim < 0)


def _decode_quantization(params: tflite.QuantizationParameters | None) -> Quantization | None:
    if params is None or params.ScaleLength() == 0:
        return None
    scale = params.ScaleAsNumpy().astype(np.float32)
    zero_point = params.ZeroPointAsNumpy().astype(np.int64) if params.ZeroPointLength() else np.zeros(1, np.int64)
    return Quantization(scale=scale, zero_point=zero_point, axis=params.QuantizedDimension())


def _decode_sparsity(params: tflite.SparsityParameters | None) -> Sparsity | None:
    if params is None or params.DimMetadataLength() == 0:
        return None
    levels = tuple(_decode_dimension(params.DimMetadata(i)) for i in range(params.DimMetadataLength()))
    order = tuple(int(i) for i in params.TraversalOrderAsNumpy()) if params.TraversalOrderLength() else ()
    block_map = tuple(int(i) for i in params.BlockMapAsNumpy()) if params.BlockMapLength() else ()
    return Sparsity(traversal_order=order, block_map=block_map, dim_metadata=levels)


def _decode_dimension(meta: tflite.DimensionMetadata) -> DimensionMetadata:
    if meta.Format() == tflite.DimensionType.DENSE:
        return DimensionMetadata(dense=True, dense_size=meta.DenseSize())
    return DimensionMetadata(dense=False, dense_size=0,
                             segments=_sparse_vector(meta.ArraySegmentsType(), meta.ArraySegments()),
                             indices=_sparse_vector(meta.ArrayIndicesType(), meta.ArrayIndices()))


def _sparse_vector(kind: int, table: Any) -> np.ndarray:
    vector = _SPARSE_VECTOR_CLASSES[kind]()
    vector.Init(table.Bytes, table.Pos)
    return vector.ValuesAsNumpy().astype(np.int64)


def _decode_operator(op: tflite.Operator, index: int, opcodes: list[tuple[str, str]]) -> Operator:
    op_type, custom_code = opcodes[op.OpcodeIndex()]
    return Operator(
        index=index, op_type=op_type, custom_code=custom_code if op_type == "CUSTOM" else "",
        inputs=tuple(int(i) for i in op.InputsAsNumpy()) if op.InputsLength() else (),
        outputs=tuple(int(i) for i in op.OutputsAsNumpy()) if op.OutputsLength() else (),
        options=_decode_options(op),
        custom_options=op.CustomOptionsAsNumpy().tobytes() if op.CustomOptionsLength() else b"")


def _decode_options(op: tflite.Operator) -> DecodedOptions | None:
    table = op.BuiltinOptions()
    class_name = _OPTION_CLASS_NAMES.get(op.BuiltinOptionsType())
    if table is None or class_name in (None, "NONE") or not hasattr(tflite, class_name):
        return None
    options = getattr(tflite, class_name)()
    options.Init(table.Bytes, table.Pos)
    return DecodedOptions.read(options)


class DecodedOptions:
    """A builtin-options table read in full, with the accessors of the ``tflite`` class.

    ``options.Padding()`` or ``options.NewShapeAsNumpy()`` return values decoded up front, so a
    corrupt table fails inside :func:`decode_tflite` (as a :class:`ModelLoadError`) and never later.
    """

    _SKIPPED = ("Init", "GetRootAs")

    def __init__(self, kind: str, values: dict[str, Any]) -> None:
        self.kind = kind
        self._values = values

    @classmethod
    def read(cls, table: Any) -> DecodedOptions:
        """Call every accessor of ``table``: scalars, vectors (``X(j)`` for each ``j < XLength()``) and numpy views."""
        values: dict[str, Any] = {}
        methods = {name: getattr(table, name) for name in dir(table)
                   if not name.startswith(("_", *cls._SKIPPED)) and not name.endswith("BufferHasIdentifier")}
        for name, method in methods.items():
            if f"{name}Length" in methods:
                values[name] = [method(j) for j in range(methods[f"{name}Length"]())]
            elif callable(method) and method.__code__.co_argcount == 1:
                result = method()
                values[name] = result.copy() if isinstance(result, np.ndarray) else result
        return cls(type(table).__name__, values)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name not in values:
            raise AttributeError(f"{self.__dict__.get('kind', 'options')} has no field {name}")
        value = values[name]
        return (lambda j: value[j]) if isinstance(value, list) else (lambda: value)


def _check_tensor_indices(op: Operator, count: int, path: Path) -> None:
    bad = [i for i in (*op.inputs, *op.outputs) if i >= count or i < -1]
    if bad:
        raise ModelLoadError(f"'{path.name}' is corrupt: operator {op.index} ({op.display_name}) refers to "
                             f"tensor(s) {bad}, but the graph has {count}.", hint=_HINT, file=str(path))


def _metadata_names(model: tflite.Model) -> dict[str, str]:
    names = {}
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        names[(entry.Name() or b"").decode(errors="replace")] = str(entry.Buffer())
    return names
