"""Check-time fit test: does every convolution / dense layer's smallest tile fit the core SRAM?

Runs on the parsed graph, before calibration, with the same tiling code the backend uses
(:func:`compiler_core.backend.tiling.tile_layer`) on a stand-in of each ``linear`` layer with 8-bit
activations and weights (int16 overrides are decided later and need twice the bytes; the compile
tiles every layer again and refuses any that does not fit). ``qbcompiler check`` and the compile's
support stage call it, so a model that cannot fit is refused with the layer and the numbers before
any calibration runs.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from compiler_core.backend.fusion import MAC, Layer
from compiler_core.backend.layout import NHWC, PLAIN, TensorLayout
from compiler_core.backend.tiling import tile_layer
from compiler_core.quantization.program import IntOp, QuantizedModel
from compiler_core.targets import DeviceProfile

logger = logging.getLogger(__name__)


def check_fit(graph: ir.Model, device: DeviceProfile) -> int:
    """Tile every Conv/Gemm/MatMul-with-constant node on one core of ``device``.

    Returns:
        The number of layers checked.

    Raises:
        DoesNotFitError: a layer's smallest tile exceeds ``device.sram_bytes_per_core``.
    """
    checked = 0
    for node in graph.graph:
        stand_in = _stand_in(node)
        if stand_in is None:
            continue
        model, layer, layouts = stand_in
        tile_layer(model, layer, layouts, device.sram_bytes_per_core, 1)
        checked += 1
    logger.debug("fit check: %d layers tile within %d bytes of SRAM", checked, device.sram_bytes_per_core)
    return checked


def _stand_in(node: ir.Node) -> tuple[QuantizedModel, Layer, dict[str, TensorLayout]] | None:
    from compiler_core.quantization.kernels.linear import _conv_attrs

    if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    weight_value, x, y = node.inputs[1], node.inputs[0], node.outputs[0]
    if weight_value.const_value is None and not (weight_value.producer() is None and _is_initializer(weight_value)):
        return None
    shapes = [_static(value) for value in (weight_value, x, y)]
    if any(shape is None for shape in shapes):
        return None
    weight_shape, x_shape, y_shape = shapes
    if node.op_type == "Conv":
        if len(weight_shape) != 4:
            return None
        attrs = {"layout": "conv", **_conv_attrs(node)}
    else:
        attrs = {"layout": "dense"}
        weight_shape = list(reversed(weight_shape)) if node.op_type == "MatMul" else weight_shape
    weight = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), tuple(weight_shape), (0,) * len(weight_shape))
    source = node.metadata_props.get("mblt.source_name")
    name = f"{node.name} (source node {source})" if source and source != node.name else (node.name or "layer")
    op = IntOp(name, "linear", node.op_type, ["x"], ["y"], attrs=attrs, consts={"weight": weight})
    model = QuantizedModel([op], {}, {}, [], [], {"x": x_shape, "y": y_shape})
    layouts = {name: TensorLayout(name, tuple(shape), "int8", NHWC if len(shape) == 4 else PLAIN)
               for name, shape in (("x", x_shape), ("y", y_shape))}
    return model, Layer(0, [0], MAC, ["x"], ["y"]), layouts


def _static(value: ir.Value) -> list[int] | None:
    if value.shape is None or not all(isinstance(dim, int) for dim in value.shape):
        return None
    return [int(dim) for dim in value.shape]


def _is_initializer(value: ir.Value) -> bool:
    return value.is_initializer() if hasattr(value, "is_initializer") else False
