"""Facts about models the GUI shows: ONNX input shapes (without weights) and per-node details of an MBLT."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from compiler_core.errors import ModelLoadError
from compiler_core.targets.support import SOURCE_NAME_KEY, node_names
from qbstudio.state.shapes import Dim, InputShape, dynamic_dim_keys, resolve_shapes, suggest_dims

__all__ = ["Dim", "InputShape", "dynamic_dim_keys", "dynamic_inputs", "node_info", "onnx_input_shapes",
           "resolve_shapes", "suggest_dims"]

logger = logging.getLogger(__name__)

_MAX_ATTRIBUTE_CHARS = 120


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
