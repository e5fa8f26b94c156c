"""Unroll ``Loop`` nodes that are counted loops: a constant trip count and a condition that stays true.

torch's TorchScript exporter writes a Python ``for`` over a shape as a ``Loop`` (``nn.EmbeddingBag``: one pass per
bag); with the shapes pinned its trip count is a constant, and the MBLT holds no control flow. Each iteration becomes a
copy of the body, with the iteration number a constant, the loop-carried values threaded from one copy to the next and
each scan output the ``Concat`` of its per-iteration values along a new first axis (ONNX's Loop semantics).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir
from onnx_ir._cloner import Cloner

logger = logging.getLogger(__name__)

MAX_UNROLLED_ITERATIONS = 64
"""Loops with more iterations stay (and are refused as control flow): each iteration copies the whole body."""


def unroll_static_loops(model: ir.Model) -> int:
    """Unroll every counted ``Loop`` of the main graph (see the module docstring); returns how many."""
    unrolled = 0
    for node in list(model.graph):
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx") and _trip_count(node) is not None:
            _unroll(model.graph, node, _trip_count(node))
            unrolled += 1
    if unrolled:
        logger.info("Unrolled %d counted Loop(s).", unrolled)
    return unrolled


def _trip_count(node: ir.Node) -> int | None:
    """The iteration count of a counted loop, or None (no constant count, too many, or a condition that can turn)."""
    count, condition = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if count is None or count.const_value is None or count.const_value.size != 1:
        return None
    if condition is not None and (condition.const_value is None or not bool(condition.const_value.numpy())):
        return None
    body = node.attributes["body"].as_graph()
    trips = int(count.const_value.numpy().reshape(()))
    if not 0 < trips <= MAX_UNROLLED_ITERATIONS or not _stays_true(body.outputs[0], body.inputs[1]):
        return None
    return trips


def _stays_true(condition: ir.Value, condition_in: ir.Value) -> bool:
    """True when the body's condition output is its condition input or a constant true (through Cast / Identity)."""
    while condition is not condition_in:
        producer = condition.producer()
        if condition.const_value is not None:
            return bool(condition.const_value.numpy().all())
        if producer is None or producer.op_type not in ("Cast", "Identity", "Constant"):
            return False
        if producer.op_type == "Constant":
            value = producer.attributes.get("value")
            return value is not None and bool(np.asarray(value.as_tensor().numpy()).all())
        condition = producer.inputs[0]
    return True


def _unroll(graph: ir.Graph, loop: ir.Node, trips: int) -> None:
    body = loop.attributes["body"].as_graph()
    carried_count = len(loop.inputs) - 2
    carried = list(loop.inputs[2:])
    scans: list[list[ir.Value]] = [[] for _ in body.outputs[1 + carried_count:]]
    new_nodes: list[ir.Node] = []
    for iteration in range(trips):
        value_map = {body.inputs[0]: _constant(graph, np.array(iteration, np.int64), f"{loop.name}_i{iteration}"),
                     body.inputs[1]: _constant(graph, np.array(True), f"{loop.name}_cond{iteration}")}
        value_map.update(zip(body.inputs[2:], carried))
        cloner = Cloner(attr_map={}, value_map=value_map, metadata_props={}, allow_outer_scope_values=True)
        for inner in body:
            copy = cloner.clone_node(inner)
            copy.name = f"{loop.name}_{iteration}_{inner.name}"
            for original, output in zip(inner.outputs, copy.outputs):
                output.name = f"{loop.name}_{iteration}_{original.name}"
            new_nodes.append(copy)
        outputs = [value_map.get(value, value) for value in body.outputs]
        carried = outputs[1:1 + carried_count]
        for scan, value in zip(scans, outputs[1 + carried_count:]):
            scan.append(_node(new_nodes, "Unsqueeze", [value, _constant(graph, np.array([0], np.int64),
                                                                    f"{value.name}_axis")]))
    results = carried + [_node(new_nodes, "Concat", scan, axis=0) for scan in scans]
    graph.insert_before(loop, new_nodes)
    for output, result in zip(loop.outputs, results):
        ir.convenience.replace_all_uses_with(output, result)
        if output.is_graph_output():
            graph.outputs[graph.outputs.index(output)] = result
        name, output.name = output.name, f"{output.name}_loop"
        result.name = name or result.name
    graph.remove(loop, safe=True)
    for inner in ir.traversal.RecursiveGraphIterator(body):  # the body's reads of the graph are no uses any more
        inner.resize_inputs(0)


def _constant(graph: ir.Graph, array: np.ndarray, name: str) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name), shape=ir.Shape(array.shape),
                     type=ir.TensorType(ir.DataType.from_numpy(array.dtype)))
    graph.register_initializer(value)
    return value


def _node(nodes: list[ir.Node], op_type: str, inputs: list[ir.Value], **attributes) -> ir.Value:
    node = ir.node(op_type, inputs, attributes=attributes)
    nodes.append(node)
    return node.outputs[0]
