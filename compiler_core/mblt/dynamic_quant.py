"""Models quantized with onnxruntime's ``quantize_dynamic`` read as the float function they approximate.

``quantize_dynamic`` stores int8 weights and quantizes activations at run time: a MatMul becomes
``DynamicQuantizeLinear(x) -> MatMulInteger(x_q, W_q, x_zp, W_zp) -> Cast -> Mul(x_scale * W_scale)``
(a Conv the same with ``ConvInteger``), and an LSTM becomes ``com.microsoft::DynamicQuantizeLSTM`` with
int8 ``W``/``R``, their scales and zero points. Models shipped that way are common (they are 4x smaller).
This compiler calibrates and quantizes on its own, so each such chain is replaced by the float op over the
dequantized weights, ``(W_q - W_zp) * W_scale``: ``MatMul(x, W)``, ``Conv(x, W)``, an ONNX ``LSTM`` (the
contrib op's ``[directions, input, 4 * hidden]`` weights transposed to ONNX's layout). What is lost is only
the run-time rounding of the activations, which the compiler's own quantization replaces.

A chain that does not have this shape (weights computed at run time, a scale read elsewhere) is left as it
is and refused by the operator check like any op without a kernel; the hint names this module's reading.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

logger = logging.getLogger(__name__)

DYNAMIC_QUANT_OPS = frozenset({"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM"})
"""Op types that ``quantize_dynamic`` writes (``DynamicQuantizeLSTM`` in the ``com.microsoft`` domain)."""

_LSTM_ATTRIBUTES = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
                    "input_forget", "layout")


def dequantize_dynamic(model: ir.Model) -> int:
    """Replace every ``quantize_dynamic`` chain of the main graph by its float op, in place; returns how many."""
    graph = model.graph
    count = _hoist_dequantize(graph)
    for node in list(graph):
        if node.graph is None:  # removed with an earlier chain
            continue
        if node.op_type in ("MatMulInteger", "ConvInteger") and node.domain in ("", "ai.onnx"):
            count += _replace_integer_product(graph, node)
        elif node.op_type == "DynamicQuantizeLSTM" and node.domain == "com.microsoft":
            count += _replace_lstm(graph, node)
    if count:
        logger.info("Read %d dynamically quantized op(s) (quantize_dynamic) as float ops.", count)
    return count


_MOVERS = frozenset({"Gather", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
"""Ops that only move their first input's elements: a per-tensor DequantizeLinear commutes with them."""


def _hoist_dequantize(graph: ir.Graph) -> int:
    """Move per-tensor ``DequantizeLinear`` nodes above the data-movement ops that feed them.

    ``quantize_dynamic`` quantizes an embedding table (``Gather(table_q, ids) -> DequantizeLinear``), and its
    LSTM input may be moved while still in codes (``Transpose -> DequantizeLinear``). Moved up to the constant
    table, the DequantizeLinear folds with it and the Gather reads float weights. Returns how many were moved.
    """
    moved = 0
    changed = True
    while changed:
        changed = False
        for node in list(graph):
            if node.graph is None or node.op_type != "DequantizeLinear" or not _per_tensor(node):
                continue
            mover = node.inputs[0].producer()
            if mover is None or mover.op_type not in _MOVERS or mover.domain not in ("", "ai.onnx"):
                continue
            dequantized = ir.node("DequantizeLinear", [mover.inputs[0], *node.inputs[1:]],
                                  attributes=dict(node.attributes.items()), name=f"{node.name}_hoisted",
                                  metadata_props=dict(node.metadata_props))
            moved_float = ir.node(mover.op_type, [dequantized.outputs[0], *mover.inputs[1:]],
                                  attributes=dict(mover.attributes.items()), name=f"{mover.name}_float",
                                  metadata_props=dict(mover.metadata_props))
            graph.insert_before(node, [dequantized, moved_float])
            _take_over(node.outputs[0], moved_float.outputs[0])
            graph.remove(node, safe=True)
            if not mover.outputs[0].uses() and not mover.outputs[0].is_graph_output():
                graph.remove(mover, safe=True)
            moved += 1
            changed = True
    return moved


def _per_tensor(dequantize: ir.Node) -> bool:
    parameters = [_constant(value) for value in dequantize.inputs[1:]]
    return bool(parameters) and all(value is not None and value.size == 1 for value in parameters)


def _constant(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and "value" in producer.attributes:
        return producer.attributes["value"].as_tensor().numpy()
    return None


def _sole_use(value: ir.Value, op_type: str) -> ir.Node | None:
    uses = value.uses()
    if len(uses) != 1 or value.is_graph_output():
        return None
    consumer = uses[0].node
    return consumer if consumer.op_type == op_type else None


@dataclass
class _IntegerChain:
    """A ``DynamicQuantizeLinear -> *Integer [-> Add(bias codes)] -> Cast -> Mul(x_scale * W_scale)`` chain."""

    x: ir.Value
    weights: np.ndarray
    bias: np.ndarray | None
    final: ir.Node
    nodes: list[ir.Node]


def _integer_chain(node: ir.Node) -> _IntegerChain | None:
    """The chain ``node`` (a MatMulInteger or ConvInteger) starts, with its float weights and bias, else None.

    Older onnxruntime releases also quantize the bias at run time, ``Cast(Floor(bias / (x_scale * W_scale)))``
    added to the int32 accumulator; the float bias is the Div's constant.
    """
    inputs = list(node.inputs) + [None] * (4 - len(node.inputs))
    codes, weight_codes, zero_point, weight_zero = inputs[:4]
    quantizer = codes.producer() if codes is not None else None
    if quantizer is None or quantizer.op_type != "DynamicQuantizeLinear" or codes is not quantizer.outputs[0]:
        return None
    if zero_point is not None and zero_point is not quantizer.outputs[2]:
        return None
    weights = _constant(weight_codes)
    weight_zero_value = _constant(weight_zero) if weight_zero is not None else np.zeros((), np.int32)
    if weights is None or weight_zero_value is None:
        return None
    nodes, accumulator, bias = [node], node.outputs[0], None
    add = _sole_use(accumulator, "Add")
    if add is not None:
        bias = _quantized_bias(next(v for v in add.inputs if v is not accumulator))
        if bias is None:
            return None
        nodes.append(add)
        accumulator = add.outputs[0]
    cast = _sole_use(accumulator, "Cast")
    final = _sole_use(cast.outputs[0], "Mul") if cast is not None else None
    if final is None:
        return None
    scales = [value for value in final.inputs if value is not cast.outputs[0]]
    product = scales[0].producer() if len(scales) == 1 else None
    if product is None or product.op_type != "Mul" or quantizer.outputs[1] not in product.inputs:
        return None
    weight_scale = _constant(next((v for v in product.inputs if v is not quantizer.outputs[1]), None))
    if weight_scale is None:
        return None
    float_weights = _dequantized(weights, weight_zero_value, weight_scale, node.op_type == "ConvInteger")
    return _IntegerChain(quantizer.inputs[0], float_weights, bias, final, [*nodes, cast, final])


def _quantized_bias(value: ir.Value) -> np.ndarray | None:
    """The float bias behind ``Reshape(Cast(Floor(Div(bias, scale))))`` (each step optional but the Div)."""
    producer = value.producer()
    while producer is not None and producer.op_type in ("Reshape", "Cast", "Floor", "Round"):
        producer = producer.inputs[0].producer()
    if producer is None or producer.op_type != "Div":
        return None
    bias = _constant(producer.inputs[0])
    return None if bias is None else bias.astype(np.float32).reshape(-1)


def _dequantized(codes: np.ndarray, zero: np.ndarray, scale: np.ndarray, conv: bool) -> np.ndarray:
    """``(codes - zero) * scale``: per tensor, per column of a MatMul's ``[K, N]`` or per output channel of a
    Conv's ``[M, C, kh, kw]``."""
    def shaped(array):
        array = array.astype(np.float32)
        return array.reshape((-1,) + (1,) * (codes.ndim - 1)) if conv and array.size > 1 else array
    return (codes.astype(np.float32) - shaped(zero)) * shaped(scale)


def _replace_integer_product(graph: ir.Graph, node: ir.Node) -> int:
    chain = _integer_chain(node)
    if chain is None:
        logger.info("%s %s is not a quantize_dynamic chain; kept", node.op_type, node.name)
        return 0
    weights = _initializer(graph, f"{node.name}_dequantized_weights", chain.weights)
    metadata = dict(chain.final.metadata_props)
    if node.op_type == "ConvInteger":
        bias = [] if chain.bias is None else [_initializer(graph, f"{node.name}_bias", chain.bias)]
        replacements = [ir.node("Conv", [chain.x, weights, *bias], attributes=dict(node.attributes.items()),
                                name=f"{node.name}_float", metadata_props=metadata)]
    else:
        replacements = [ir.node("MatMul", [chain.x, weights], name=f"{node.name}_float", metadata_props=metadata)]
        if chain.bias is not None:
            bias = _initializer(graph, f"{node.name}_bias", chain.bias)
            replacements.append(ir.node("Add", [replacements[0].outputs[0], bias], name=f"{node.name}_bias_add",
                                        metadata_props=metadata))
    graph.insert_before(chain.final, replacements)
    _take_over(chain.final.outputs[0], replacements[-1].outputs[0])
    inputs = [value for dead in chain.nodes for value in dead.inputs if value is not None]
    for dead in reversed(chain.nodes):
        graph.remove(dead, safe=True)
    _remove_dead_producers(graph, inputs)
    return 1


def _remove_dead_producers(graph: ir.Graph, values: list[ir.Value]) -> None:
    """Remove the producers of ``values`` that nothing reads any more, and theirs in turn."""
    pending = list(values)
    while pending:
        producer = pending.pop().producer()
        if (producer is None or producer.graph is not graph
                or any(output.uses() or output.is_graph_output() for output in producer.outputs)):
            continue
        pending.extend(value for value in producer.inputs if value is not None)
        graph.remove(producer, safe=True)


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    array = np.ascontiguousarray(array, dtype=np.float32)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.FLOAT),
                     const_value=ir.tensor(array))
    graph.register_initializer(value)
    return value


def _take_over(old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` everywhere (graph outputs too) under its name, shape and type."""
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    name, old.name = old.name, None
    new.name, new.shape, new.type = name, old.shape, old.type


def _dequantized_lstm_weights(codes, scale, zero) -> np.ndarray | None:
    """``[directions, input, 4 * hidden]`` int8 codes with per-direction or per-column scale and zero point ->
    ONNX's float ``[directions, 4 * hidden, input]``."""
    if codes is None or scale is None or zero is None:
        return None
    directions = codes.shape[0]
    shape = (directions, 1, -1)
    weights = ((codes.astype(np.float32) - zero.astype(np.float32).reshape(shape))
               * scale.astype(np.float32).reshape(shape))
    return np.ascontiguousarray(weights.transpose(0, 2, 1))


def _replace_lstm(graph: ir.Graph, node: ir.Node) -> int:
    inputs = list(node.inputs) + [None] * (12 - len(node.inputs))
    weights = _dequantized_lstm_weights(_constant(inputs[1]), _constant(inputs[8]), _constant(inputs[9]))
    recurrence = _dequantized_lstm_weights(_constant(inputs[2]), _constant(inputs[10]), _constant(inputs[11]))
    if weights is None or recurrence is None:
        logger.info("DynamicQuantizeLSTM %s has weights, scales or zero points computed at run time; kept",
                    node.name)
        return 0
    values = []
    for suffix, array in (("W", weights), ("R", recurrence)):
        values.append(_initializer(graph, f"{node.name}_{suffix}", array))
    lstm_inputs = [inputs[0], *values, *inputs[3:8]]
    while lstm_inputs and lstm_inputs[-1] is None:
        lstm_inputs.pop()
    attributes = {name: node.attributes[name] for name in _LSTM_ATTRIBUTES if name in node.attributes}
    lstm = ir.node("LSTM", lstm_inputs, attributes=attributes, num_outputs=len(node.outputs),
                   name=f"{node.name}_float", metadata_props=dict(node.metadata_props))
    graph.insert_before(node, lstm)
    for old, new in zip(node.outputs, lstm.outputs):
        _take_over(old, new)
    graph.remove(node, safe=True)
    return 1
