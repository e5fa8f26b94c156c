"""Lower two-operand Einsum nodes to Transpose -> Reshape -> MatMul -> Reshape -> Transpose.

``torch.einsum`` exports as an ONNX ``Einsum`` (attention written as ``bhid,bhjd->bhij``, projections as
``bnd,dh->bnh``). The quantizer has an integer MatMul, not an Einsum kernel, so canonicalization rewrites
every Einsum that is a (batched) matrix product: each index is a batch index (in both operands and the
output), a free index of one operand (and the output), or contracted (in both operands, not the output).
The operands are transposed to ``[batch, free, contracted]`` / ``[batch, contracted, free]``, flattened
to rank 3 when several indices share a role, multiplied, and the result is put in the output's order.
Equations outside that form (one operand, an index summed within one operand, a repeated index,
broadcast batch sizes) are left alone and keep their "no integer kernel" verdict. The result is exact
in float: only the summation order of the contraction changes.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

logger = logging.getLogger(__name__)

SOURCE_NAME_KEY = "mblt.source_name"


def lower_einsums(model: ir.Model) -> int:
    """Rewrite every matrix-product Einsum of the main graph in place; returns how many were rewritten."""
    count = 0
    for node in [n for n in model.graph if n.op_type == "Einsum" and n.domain in ("", "ai.onnx")]:
        plan = _plan(node)
        if isinstance(plan, str):
            logger.info("Einsum %s is kept: %s", node.name, plan)
            continue
        _rewrite(model.graph, node, *plan)
        count += 1
    return count


def _plan(node: ir.Node) -> tuple[str, str, str] | str:
    """``(a, b, out)`` index strings with the ellipsis spelt out, or why the node is not a matrix product."""
    attribute = node.attributes.get("equation")
    equation = (attribute.value if attribute is not None else "").replace(" ", "")
    if "->" not in equation or len(node.inputs) != 2:
        return "not a two-operand equation with an explicit output"
    shapes = [value.shape if value is not None else None for value in node.inputs]
    if any(shape is None or not all(isinstance(dim, int) for dim in shape) for shape in shapes):
        return "operand shapes are not static"
    terms, out = equation.split("->")
    a, b = terms.split(",")
    a, b, out = _spell_ellipsis(a, b, out, [len(shape) for shape in shapes])
    if a is None or len(a) != len(shapes[0]) or len(b) != len(shapes[1]):
        return "the equation does not match the operand ranks"
    if len(set(a)) != len(a) or len(set(b)) != len(b) or len(set(out)) != len(out):
        return "an index repeats within one term"
    if not set(out) <= set(a) | set(b) or not set(a) <= set(b) | set(out) or not set(b) <= set(a) | set(out):
        return "an index is summed within one operand"
    size = {**dict(zip(b, shapes[1])), **dict(zip(a, shapes[0]))}
    if any(size[i] != dict(zip(b, shapes[1]))[i] for i in set(a) & set(b)):
        return "shared indices differ in size (broadcast)"
    return a, b, out


def _spell_ellipsis(a: str, b: str, out: str, ranks: list[int]) -> tuple[str | None, str, str]:
    """Replace ``...`` by fresh capital letters (the same ones, right-aligned, in every term)."""
    if "..." not in a + b + out:
        return a, b, out
    spans = [rank - len(term.replace("...", "")) if "..." in term else 0 for term, rank in zip((a, b), ranks)]
    if min(spans) < 0:
        return None, b, out
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:max(spans)]
    if spans[0] and spans[1] and spans[0] != spans[1]:
        return None, b, out  # broadcasting ellipses of different ranks
    filled = [term.replace("...", letters[len(letters) - span:]) for term, span in zip((a, b), spans)]
    return filled[0], filled[1], out.replace("...", letters)


def _rewrite(graph: ir.Graph, node: ir.Node, a: str, b: str, out: str) -> None:
    x, y = node.inputs
    size = {**dict(zip(a, x.shape)), **dict(zip(b, y.shape))}
    batch = [i for i in out if i in a and i in b]
    free_a = [i for i in out if i in a and i not in b]
    free_b = [i for i in out if i in b and i not in a]
    contracted = [i for i in a if i in b and i not in out]
    emit = _Emitter(graph, node)
    left = emit.arrange(x, a, batch + free_a + contracted,
                        [size[i] for i in batch] + [_product(size, free_a), _product(size, contracted)])
    right = emit.arrange(y, b, batch + contracted + free_b,
                         [size[i] for i in batch] + [_product(size, contracted), _product(size, free_b)])
    product = emit.op("MatMul", [left, right])
    unflat = batch + free_a + free_b
    if [size[i] for i in batch] + [_product(size, free_a), _product(size, free_b)] != [size[i] for i in unflat]:
        product = emit.reshape(product, [size[i] for i in unflat])  # not when it keeps the shape (CvT's attention)
    perm = [unflat.index(i) for i in out]
    if perm != list(range(len(perm))):
        product = emit.op("Transpose", [product], {"perm": perm})
    ir.convenience.replace_nodes_and_values(graph, node, [node], emit.nodes, [node.outputs[0]], [product])


def _product(size: dict[str, int], indices: list[str]) -> int:
    return int(np.prod([size[i] for i in indices], dtype=np.int64)) if indices else 1


class _Emitter:
    """Builds the replacement nodes: names derived from the Einsum's, its source name on every node."""

    def __init__(self, graph: ir.Graph, anchor: ir.Node) -> None:
        self.graph, self.anchor, self.nodes = graph, anchor, []

    def op(self, op_type: str, inputs: list[ir.Value], attributes: dict | None = None) -> ir.Value:
        node = ir.node(op_type, inputs, attributes, name=f"{self.anchor.name}_{len(self.nodes)}",
                       metadata_props={SOURCE_NAME_KEY: self.anchor.metadata_props.get(SOURCE_NAME_KEY,
                                                                                        self.anchor.name)})
        node.outputs[0].name = f"{node.name}_out"
        self.nodes.append(node)
        return node.outputs[0]

    def reshape(self, value: ir.Value, shape: list[int]) -> ir.Value:
        name = f"{self.anchor.name}.shape{len(self.nodes)}"
        array = np.array(shape, dtype=np.int64)
        constant = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.INT64),
                            const_value=ir.tensor(array, name=name))
        self.graph.register_initializer(constant)
        return self.op("Reshape", [value, constant])

    def arrange(self, value: ir.Value, term: str, order: list[str], shape: list[int]) -> ir.Value:
        """``value`` (indexed by ``term``) transposed to ``order`` and reshaped to ``shape`` (when they differ)."""
        perm = [term.index(i) for i in order]
        current = [int(value.shape[p]) for p in perm]
        if perm != list(range(len(perm))):
            value = self.op("Transpose", [value], {"perm": perm})
        if current != shape:
            value = self.reshape(value, shape)
        return value
