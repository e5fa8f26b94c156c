"""Cut a source graph at chosen tensors: they become its outputs, and what only the rest needs goes.

Detection exports often end in post-processing whose output size depends on the data
(``NonMaxSuppression``, ``NonZero``, ``TopK`` over a data-dependent ``k``): a static NPU graph cannot hold
it, and the host runs it better anyway. ``output_names`` (``--output-names`` on the command line) names
the tensors to stop at, e.g. the raw boxes and scores before NMS, as ``onnx.utils.extract_model`` would;
graph inputs that only fed the cut-away part are removed too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Hashable, Sequence

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from compiler_core.errors import ArgumentError, UnsupportedOpsError
from compiler_core.mblt.opset import DATA_DEPENDENT_OPS
from compiler_core.mblt.rule_index import holds_graph

logger = logging.getLogger(__name__)


def cut_at_outputs(model: ir.Model, output_names: Sequence[str]) -> None:
    """Make the tensors ``output_names`` the graph's outputs (in that order) and drop what no longer feeds them.

    Raises:
        ArgumentError: a name is not a tensor of the main graph, or is given twice.
    """
    if not output_names:
        return
    graph = model.graph
    values = {value.name: value for value in graph.inputs}
    values.update((output.name, output) for node in graph for output in node.outputs)
    missing = [name for name in output_names if name not in values]
    if missing:
        last = [output.name for node in list(graph)[-8:] for output in node.outputs]
        raise ArgumentError(f"output_names names {missing}, which are not tensors of the model's main graph.",
                            hint=f"Tensors near the end of the graph: {', '.join(last)}. The model's outputs: "
                                 f"{', '.join(value.name for value in graph.outputs)}.")
    if len(set(output_names)) != len(output_names):
        raise ArgumentError(f"output_names repeats a tensor: {list(output_names)}.", hint="Name each tensor once.")
    before = len(graph)
    graph.outputs.clear()
    graph.outputs.extend(values[name] for name in output_names)
    RemoveUnusedNodesPass()(model)
    kept = set(output_names)
    unused = [value for value in graph.inputs if not value.uses() and value.name not in kept]
    for value in unused:
        graph.inputs.remove(value)
    logger.info("Cut the graph at %s: %d of %d nodes kept%s", ", ".join(output_names), len(graph), before,
                f"; inputs no longer used: {', '.join(value.name for value in unused)}" if unused else "")


def refuse_data_dependent_ops(model: ir.Model) -> None:
    """Refuse a main graph that computes a data-dependent op (NonMaxSuppression ...) at run time.

    The error names the run-time tensors those nodes read, which are what ``output_names`` should cut at
    (before canonicalization renames them).

    Raises:
        UnsupportedOpsError: such a node reads a value computed at run time.
    """
    runtime = _runtime_values(model.graph)
    offending = [node for node in model.graph if node.domain in ("", "ai.onnx") and node.op_type in DATA_DEPENDENT_OPS
                 and any(value in runtime for value in node.inputs)]
    if not offending:
        return
    cut, inputs = [], set(model.graph.inputs)
    for node in offending:  # graph inputs (an NMS threshold) are parameters, not tensors to cut at
        cut.extend(value.name for value in node.inputs if value in runtime and value not in inputs
                   and value.name not in cut and not _computed_by(value, offending))
    ops = sorted({node.op_type for node in offending})
    raise UnsupportedOpsError(
        f"{len(offending)} node(s) compute {', '.join(ops)}, whose output size depends on the data "
        f"(e.g. {offending[0].name or offending[0].op_type}); a static NPU graph cannot hold it. This is usually "
        "post-processing that runs better on the host.",
        hint=f"End the graph before it: --output-names {','.join(cut)} (Python: output_names=[...]), then run "
             f"{ops[0]} on the MXQ's outputs; or export the model without it.",
        ops=[{"op": op, "count": sum(node.op_type == op for node in offending),
              "nodes": [node.name for node in offending if node.op_type == op][:3],
              "reason": "output size depends on the data"} for op in ops],
        cut_at=cut)


def _computed_by(value: ir.Value, nodes: list[ir.Node]) -> bool:
    """True if ``value`` comes (directly) from one of ``nodes``: cutting there would keep the op."""
    return value.producer() in nodes


_STATIC_RESULT_OPS = frozenset({"Shape", "Size"})
"""Ops whose result is known once the input shapes are pinned (exporters feed them into NonZero and co.)."""


def _runtime_values(graph: ir.Graph) -> set[ir.Value]:
    """Values that depend on a graph input's data (the graph is in topological order, as ONNX requires)."""
    runtime = set(graph.inputs)
    for node in graph:
        if node.op_type not in _STATIC_RESULT_OPS and any(value in runtime for value in node.inputs):
            runtime.update(node.outputs)
    return runtime


def outputs_clear_of(graph: ir.Graph, offending: Collection[ir.Node]) -> list[str]:
    """Names of the graph's outputs that none of ``offending`` (nodes of the graph or of its subgraphs) computes,
    directly or through other nodes: ``output_names`` keeping only those would leave the offending nodes out."""
    offending = set(offending)
    tainted: set[ir.Node] = set()
    captured: dict[ir.Node, list[ir.Value]] = {}  # a node holding subgraphs also reads what they read from outside
    for node in graph:
        inner = [n for subgraph in subgraphs_of(node) for n in ir.traversal.RecursiveGraphIterator(subgraph)]
        if node in offending or any(n in offending for n in inner):
            tainted.add(node)
        if inner:
            captured[node] = outer_reads(node)

    def reads(value: ir.Value) -> tuple[bool, list[ir.Value]]:
        node = value.producer()
        if node is None or node.graph is not graph:
            return False, []
        return node in tainted, [v for v in (*node.inputs, *captured.get(node, ())) if v is not None]

    return [value.name for value, clear in zip(graph.outputs, _clear(list(graph.outputs), reads)) if clear]


def outputs_clear_of_proto(graph, offending: Collection[int]) -> list[str]:
    """:func:`outputs_clear_of` on an ``onnx.GraphProto`` without subgraphs; ``offending``: node indices."""
    producers = {name: index for index, node in enumerate(graph.node) for name in node.output if name}

    def reads(name: str) -> tuple[bool, list[str]]:
        index = producers.get(name)
        if index is None:
            return False, []
        return index in offending, [value for value in graph.node[index].input if value]

    names = [info.name for info in graph.output]
    return [name for name, clear in zip(names, _clear(names, reads)) if clear]


def _clear(outputs: list[Hashable], reads: Callable[[Hashable], tuple[bool, list[Hashable]]]) -> list[bool]:
    """For each output, whether no value it is computed from is made by an offending node (an iterative depth-first
    walk: graphs of thousands of nodes; a value on a cycle, which only an invalid graph has, counts as not clear)."""
    verdict: dict[Hashable, bool] = {}
    for output in outputs:
        stack, open_keys = [(output, False)], set()
        while stack:
            key, expanded = stack.pop()
            if key in verdict or (not expanded and key in open_keys):
                continue
            bad, inputs = reads(key)
            if expanded or bad:
                open_keys.discard(key)
                verdict[key] = not bad and all(verdict.get(value, False) for value in inputs)
                continue
            open_keys.add(key)
            stack.append((key, True))
            stack.extend((value, False) for value in inputs if value not in verdict and value not in open_keys)
    return [verdict[output] for output in outputs]


def subgraphs_of(node: ir.Node) -> list[ir.Graph]:
    """The graphs held by ``node``'s attributes (an If's branches, a Loop's body)."""
    if not holds_graph(node):
        return []
    return [graph for attribute in node.attributes.values()
            for graph in ([attribute.as_graph()] if attribute.type == ir.AttributeType.GRAPH
                          else attribute.as_graphs() if attribute.type == ir.AttributeType.GRAPHS else [])]


def outer_reads(node: ir.Node) -> list[ir.Value]:
    """The values ``node``'s subgraphs read from outside them (at any depth): what the node also depends on besides
    its inputs. Values made inside, the subgraphs' own inputs and their initializers are not."""
    read: list[ir.Value] = []
    for subgraph in subgraphs_of(node):
        nodes = list(ir.traversal.RecursiveGraphIterator(subgraph))
        inner = {value for sub in nodes for value in sub.outputs} | set(subgraph.inputs)
        read.extend(value for sub in nodes for value in sub.inputs
                    if value is not None and value not in inner and value.name not in subgraph.initializers)
    return read


def keep_outputs_hint(keep: Sequence[str], total: int) -> str:
    """The sentence offering to keep the outputs that avoid the offending ops ("" when none or all do)."""
    if not keep or len(keep) >= total:
        return ""
    return (f" {len(keep)} of the model's {total} outputs do not need them: keep only "
            f"{'it' if len(keep) == 1 else 'those'} with --output-names {','.join(keep)} (Python: output_names=[...]).")
