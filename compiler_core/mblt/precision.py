"""Half- and double-precision models compute in float32 in the MBLT.

Exports in float16 (``model.half()``, onnxconverter-common's ``convert_float_to_float16``), bfloat16 or
float64 (scikit-learn converters) are common. The NPU quantizes every float tensor to int8/int16 from
its calibrated range, so the float width of the source only matters for the reference the MXQ is
compared with: the MBLT carries every such tensor as float32, which holds float16 and bfloat16 values
exactly. Float64 constants are rounded to float32 and finite values beyond its range are clipped to
its largest finite value (a ``-1e300`` mask fill stays a large negative number, not ``-inf``).

Graph inputs and outputs become float32 too; the runtime takes float arrays of any width.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import onnx_ir as ir

logger = logging.getLogger(__name__)

WIDENED = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)
"""Float types the MBLT carries as float32."""
_WIDENED_CODES = {int(dtype) for dtype in WIDENED}
_DTYPE_ATTRIBUTES = ("to", "dtype")
"""Node attributes naming an element type (Cast.to; RandomNormal/RandomUniform/EyeLike/Bernoulli.dtype)."""
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def compute_in_float32(model: ir.Model) -> Counter:
    """Retype every float16/bfloat16/float64 value, constant and type attribute of ``model`` as float32.

    Subgraphs (``If``/``Loop`` bodies) are included. Casts that become float32 -> float32 are left to the
    optimizer, which removes them.

    Returns:
        How many of each kind were changed (``values``, ``constants``, ``attributes``); empty for a
        float32 model.
    """
    changed: Counter = Counter()
    seen: set[str] = set()
    for graph in _graphs(model.graph):
        for value in _values(graph):
            if value.dtype in WIDENED:
                seen.add(value.dtype.name.lower())
                value.dtype = ir.DataType.FLOAT
                changed["values"] += 1
            if value.const_value is not None and value.const_value.dtype in WIDENED:
                value.const_value = _as_float32(value.const_value)
                changed["constants"] += 1
        for node in graph:
            for name, attribute in list(node.attributes.items()):
                widened = _widened_attribute(name, attribute)
                if widened is not None:
                    node.attributes[name] = widened
                    changed["attributes"] += 1
    if changed:
        logger.info("The model computes in %s; the MBLT carries those tensors as float32 (%d values, %d "
                    "constants, %d type attributes)", " and ".join(sorted(seen)) or "float32", changed["values"],
                    changed["constants"], changed["attributes"])
    return changed


def _graphs(graph: ir.Graph):
    yield graph
    for node in graph:
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                yield from _graphs(attribute.value)
            elif attribute.type == ir.AttributeType.GRAPHS:
                for subgraph in attribute.value:
                    yield from _graphs(subgraph)


def _values(graph: ir.Graph):
    yield from graph.inputs
    yield from graph.initializers.values()
    for node in graph:
        yield from node.outputs


def _widened_attribute(name: str, attribute: ir.Attr) -> ir.Attr | None:
    if attribute.type == ir.AttributeType.TENSOR and attribute.value.dtype in WIDENED:
        return ir.AttrTensor(name, _as_float32(attribute.value))
    if name in _DTYPE_ATTRIBUTES and attribute.type == ir.AttributeType.INT and attribute.value in _WIDENED_CODES:
        return ir.AttrInt64(name, int(ir.DataType.FLOAT))
    return None


def _as_float32(tensor: ir.TensorProtocol) -> ir.Tensor:
    values = np.asarray(tensor.numpy()).astype(np.float64)
    finite = np.isfinite(values)
    values[finite] = np.clip(values[finite], -_FLOAT32_MAX, _FLOAT32_MAX)
    return ir.tensor(values.astype(np.float32), name=tensor.name)
