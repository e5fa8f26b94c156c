"""Canonical, stable names for MBLT nodes and values.

Nodes are named ``<OpType>_<n>`` in topological order (``Conv_0``, ``Relu_3``), so the same source
model always gives the same names and they are safe in Netron element ids and CSS selectors. The
source framework's name is kept in the node's ``mblt.source_name`` metadata. Graph inputs and
outputs keep their names (users feed and read them); other values are named after their producer,
initializers after their first consumer and the operand's schema name (``Conv_0.W``).
"""

from __future__ import annotations

import functools
import re
from collections import Counter

import onnx
import onnx_ir as ir

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def assign_canonical_names(model: ir.Model) -> None:
    """Rename every node and non-interface value of the main graph in place."""
    graph = model.graph
    reserved = {v.name for v in graph.inputs} | {v.name for v in graph.outputs}
    counters: Counter[str] = Counter()
    taken = set(reserved)
    for node in graph:
        node.name = _next_name(_UNSAFE.sub("_", node.op_type), counters)
        for index, value in enumerate(node.outputs):
            if value.name in reserved:
                continue
            value.name = _unique(node.name if len(node.outputs) == 1 else f"{node.name}:{index}", taken)
    _name_initializers(graph, taken)


def _name_initializers(graph: ir.Graph, taken: set[str]) -> None:
    # Renaming a value re-keys graph.initializers, so work on a snapshot; and in two steps, since a new name
    # may still be the current name of an initializer renamed later (nodes renumbered after a removal).
    renamed = [value for value in graph.initializers.values()
               if not (value.is_graph_input() or value.is_graph_output())]
    names = [_unique(_initializer_name(value), taken) for value in renamed]
    for index, value in enumerate(renamed):
        value.name = f"\x00renaming{index}"
    for value, name in zip(renamed, names):
        value.name = name


def _initializer_name(value: ir.Value) -> str:
    uses = [(user, index) for user, index in value.uses() if user.graph is not None]  # not a node taken out
    if not uses:
        return "const"
    node, index = uses[0]
    return f"{node.name}.{_operand_name(node, index)}"


def _operand_name(node: ir.Node, index: int) -> str:
    formal = _formal_inputs(node.op_type, node.domain)
    if formal is None:
        return f"in{index}"
    if index < len(formal):
        return formal[index]
    return f"{formal[-1]}{index}" if formal else f"in{index}"


@functools.cache
def _formal_inputs(op_type: str, domain: str) -> tuple[str, ...] | None:
    """The names of the op's formal inputs at opset 21, or None without a schema (looked up once per op type: each
    ``get_schema`` builds a Python schema object, and a model has an initializer for most of its weights)."""
    try:
        schema = onnx.defs.get_schema(op_type, 21, domain)
    except onnx.defs.SchemaError:
        return None
    return tuple(formal.name for formal in schema.inputs)


def _next_name(prefix: str, counters: Counter[str]) -> str:
    name = f"{prefix}_{counters[prefix]}"
    counters[prefix] += 1
    return name


def _unique(name: str, taken: set[str]) -> str:
    candidate, suffix = name, 1
    while candidate in taken:
        candidate, suffix = f"{name}_{suffix}", suffix + 1
    taken.add(candidate)
    return candidate
