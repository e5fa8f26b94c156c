"""Facts about models the GUI shows: ONNX input shapes (without weights) and per-node details of an MBLT."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from compiler_core.errors import ModelLoadError
from compiler_core.targets.support import SOURCE_NAME_KEY, node_names

logger = logging.getLogger(__name__)

Dim = int | str | None
_MAX_ATTRIBUTE_CHARS = 120


@dataclass(frozen=True)
class InputShape:
    """One graph input as the file declares it.

    Attributes:
        name: Input name.
        dims: Each dimension: an int, a symbolic name, or None when unknown.
        dtype: Element type name (``float32`` ...).
    """

    name: str
    dims: tuple[Dim, ...]
    dtype: str

    @property
    def dynamic(self) -> bool:
        """Whether any dimension is not a fixed positive integer."""
        return any(not isinstance(dim, int) or dim <= 0 for dim in self.dims)

    def suggested(self) -> list[int]:
        """A static shape to offer: the fixed dims, 1 for the first dynamic dim (batch), else 0 (to fill in)."""
        return [dim if isinstance(dim, int) and dim > 0 else (1 if index == 0 else 0)
                for index, dim in enumerate(self.dims)]


_BATCH_WORDS = ("batch",)
_SEQUENCE_WORDS = ("seq", "length", "token", "sentence", "time", "len")
_SPATIAL_WORDS = ("height", "width")
_DETECTOR_WORDS = ("yolo", "det", "ocr", "ssd", "retina", "640", "text")
IMAGE_SIDE = 224
DETECTOR_SIDE = 640
SEQUENCE_LENGTH = 128


def dim_key(shape: InputShape, index: int) -> str:
    """The name the shape dialog asks for: a symbolic dim's own name (shared by every input using it),
    or ``input[index]`` for an unnamed one."""
    dim = shape.dims[index]
    return dim if isinstance(dim, str) and dim else f"{shape.name}[{index}]"


def dynamic_dim_keys(shapes: list[InputShape]) -> dict[str, list[str]]:
    """Dynamic dim key -> the inputs using it, in first-seen order (shared symbolic dims appear once)."""
    keys: dict[str, list[str]] = {}
    for shape in shapes:
        for index, dim in enumerate(shape.dims):
            if not isinstance(dim, int) or dim <= 0:
                users = keys.setdefault(dim_key(shape, index), [])
                if shape.name not in users:
                    users.append(shape.name)
    return keys


def suggest_dims(shapes: list[InputShape], model_name: str = "") -> dict[str, int]:
    """A value for every dynamic dim from its name, position and the model's name.

    Batch (the first dim, or a name with "batch") is 1; sequence-like names (``sequence_length``,
    ``seq``, ``tokens`` ...) and the later dims of 2-D/3-D inputs are 128; the spatial dims of an image
    input are 224, or 640 when the model's name suggests a detector (``yolo``, ``det``, ``ocr`` ...).
    """
    side = DETECTOR_SIDE if any(word in model_name.lower() for word in _DETECTOR_WORDS) else IMAGE_SIDE
    values: dict[str, int] = {}
    for shape in shapes:
        for index, dim in enumerate(shape.dims):
            if isinstance(dim, int) and dim > 0:
                continue
            values.setdefault(dim_key(shape, index), _suggest_dim(shape, index, side))
    return values


def _suggest_dim(shape: InputShape, index: int, side: int) -> int:
    name = shape.dims[index].lower() if isinstance(shape.dims[index], str) else ""
    if index == 0 or any(word in name for word in _BATCH_WORDS):
        return 1
    if any(word in name for word in _SPATIAL_WORDS):
        return side
    if any(word in name for word in _SEQUENCE_WORDS):
        return SEQUENCE_LENGTH
    if len(shape.dims) == 4:
        channels_first = shape.dims[1] in (1, 3) or index in (2, 3) and shape.dims[3] not in (1, 3)
        if (channels_first and index == 1) or (not channels_first and index == 3):
            return 3
        return side
    return SEQUENCE_LENGTH


def resolve_shapes(shapes: list[InputShape], values: dict[str, int]) -> dict[str, list[int]]:
    """The static shape of every dynamic input, with each dynamic dim taken from ``values`` by key."""
    return {shape.name: [dim if isinstance(dim, int) and dim > 0 else values[dim_key(shape, index)]
                         for index, dim in enumerate(shape.dims)]
            for shape in shapes if shape.dynamic}


def onnx_input_shapes(path: str | os.PathLike) -> list[InputShape]:
    """The true graph inputs of an ONNX file, read without loading external weights.

    Raises:
        ModelLoadError: the file is not a readable ONNX model.
    """
    try:
        proto = onnx.load(os.fspath(path), load_external_data=False)
    except Exception as error:  # protobuf raises several types for corrupt files
        raise ModelLoadError(f"'{os.path.basename(path)}' is not a readable ONNX model: {error}.",
                             hint="Check that the file is a complete .onnx export.", file=os.fspath(path)) from error
    initializers = {init.name for init in proto.graph.initializer}
    return [_input_shape(value) for value in proto.graph.input if value.name not in initializers]


def _input_shape(value: onnx.ValueInfoProto) -> InputShape:
    tensor = value.type.tensor_type
    dims = tuple(_dim(dim) for dim in tensor.shape.dim)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else "unknown"
    return InputShape(value.name, dims, dtype)


def _dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    if dim.HasField("dim_value"):
        return int(dim.dim_value)
    return dim.dim_param or None


def dynamic_inputs(shapes: list[InputShape]) -> list[InputShape]:
    """The inputs that need a static shape from the user."""
    return [shape for shape in shapes if shape.dynamic]


def node_count(model: ir.Model) -> int:
    """Number of nodes in the main graph."""
    return len(model.graph)


def find_node(model: ir.Model, name: str) -> ir.Node | None:
    """The node reported as ``name`` (support-report naming: node name, or ``op_index``)."""
    for report_name, node in zip(node_names(model.graph), model.graph):
        if name in (report_name, node.name):
            return node
    return None


def node_info(model: ir.Model, name: str) -> dict[str, Any] | None:
    """Details of node ``name``: op, domain, source name, input/output shapes, attributes."""
    node = find_node(model, name)
    if node is None:
        return None
    return {"name": name, "op": node.op_type, "domain": node.domain,
            "source_name": node.metadata_props.get(SOURCE_NAME_KEY, ""),
            "inputs": [_value_info(value) for value in node.inputs],
            "outputs": [_value_info(value) for value in node.outputs],
            "attributes": {key: _attribute_text(attr) for key, attr in node.attributes.items()}}


def _value_info(value: ir.Value | None) -> dict[str, Any]:
    if value is None:
        return {"name": "", "shape": None, "dtype": "", "constant": False}
    shape = [int(d) if isinstance(d, int) else str(d) for d in value.shape] if value.shape is not None else None
    dtype = value.dtype.name.lower() if value.dtype is not None else ""
    return {"name": value.name or "", "shape": shape, "dtype": dtype,
            "constant": value.const_value is not None or value.is_initializer()}


def _attribute_text(attr: Any) -> str:
    value = getattr(attr, "value", attr)
    if isinstance(value, ir.TensorProtocol):
        text = f"tensor {value.dtype.name.lower()}{list(value.shape)}"
    elif isinstance(value, np.ndarray):
        text = f"array{list(value.shape)}"
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(str(item) for item in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= _MAX_ATTRIBUTE_CHARS else text[:_MAX_ATTRIBUTE_CHARS] + "…"
