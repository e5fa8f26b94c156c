"""Read-only view of an MBLT for quantization, and fusion of nodes into operation groups.

A group is one integer operation: a main node plus the nodes fused into it (a MatMul's bias Add,
a trailing Relu/Clip). Only the group's final output is quantized; the float values between fused
nodes never exist on the NPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from compiler_core.ops import get_op

FLOAT_TYPES = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16}
ACCUMULATING_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "Mul"}
ACTIVATION_OPS = {"Relu", "Clip"}


@dataclass
class Group:
    """A main node and the nodes fused after it."""

    main: ir.Node
    fused: list[ir.Node] = field(default_factory=list)

    @property
    def nodes(self) -> list[ir.Node]:
        """Main node first, then fused nodes in order."""
        return [self.main, *self.fused]

    @property
    def output(self) -> ir.Value:
        """The value the group produces (the last fused node's output)."""
        return self.nodes[-1].outputs[0]

    @property
    def outputs(self) -> list[ir.Value]:
        """All produced values (several for Split)."""
        return list(self.fused[-1].outputs) if self.fused else list(self.main.outputs)

    def fused_of(self, op_type: str) -> ir.Node | None:
        """The fused node of ``op_type``, if any."""
        return next((node for node in self.fused if node.op_type == op_type), None)


class GraphView:
    """Constants, shapes and consumers of an MBLT, with quick lookups."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.graph = model.graph
        self.nodes = list(model.graph)
        self._outputs = {value.name for value in model.graph.outputs}

    def const(self, value: ir.Value | None) -> np.ndarray | None:
        """The constant array behind ``value``, or ``None`` for run-time values."""
        if value is None or value.const_value is None:
            return None
        return value.const_value.numpy()

    def is_const(self, value: ir.Value | None) -> bool:
        """True for initializers."""
        return value is not None and value.const_value is not None

    def is_float(self, value: ir.Value | None) -> bool:
        """True for float tensors (the ones that get quantized)."""
        return value is not None and value.dtype in FLOAT_TYPES

    def shape(self, value: ir.Value) -> list[int]:
        """Static shape of ``value``."""
        return [int(d) for d in value.shape]

    def consumers(self, value: ir.Value) -> list[ir.Node]:
        """Nodes reading ``value``."""
        return [node for node, _ in value.uses()]

    def is_graph_output(self, value: ir.Value) -> bool:
        """True if ``value`` is a model output."""
        return value.name in self._outputs

    def single_consumer(self, value: ir.Value) -> ir.Node | None:
        """The only consumer of ``value`` when it is not also a graph output."""
        consumers = self.consumers(value)
        if len(consumers) == 1 and not self.is_graph_output(value):
            return consumers[0]
        return None


def build_groups(view: GraphView) -> list[Group]:
    """Fuse bias Adds and Relu/Clip activations into the operation that feeds them, and element-wise
    steps on one activation into the look-up table before them."""
    absorbed: set[int] = set()
    groups = []
    for node in view.nodes:
        if id(node) in absorbed:
            continue
        group = Group(node)
        if node.op_type in ACCUMULATING_OPS and view.is_float(node.outputs[0]):
            _absorb_bias(view, group)
            _absorb_activation(view, group)
        elif is_table(node) and view.is_float(node.outputs[0]):
            absorb_unary_chain(view, group)
        absorbed.update(id(n) for n in group.fused)
        groups.append(group)
    return groups


_SCALAR_STEPS = frozenset({"Add", "Sub", "Mul", "Div"})


def is_table(node: ir.Node) -> bool:
    entry = get_op(node.op_type, node.domain)
    return entry is not None and entry.lowering == "lut"


def absorb_unary_chain(view: GraphView, group: Group) -> None:
    """After a look-up-table op, fuse what is still a function of the same one input into the table.

    Fused while the running value has a single consumer: another table op with scalar-constant
    operands (``tanh(softplus(x))``), arithmetic with a scalar constant (learnable ``a * f(x) + b``
    blocks), and a product with the table's own input (``x * sigmoid(x)``, SiLU/Swish/Mish gates).
    One table then replaces several quantization points, each of which would round.
    """
    source = group.main.inputs[0]
    while True:
        nxt = view.single_consumer(group.output)
        if nxt is None or not view.is_float(nxt.outputs[0]) or len(nxt.outputs) != 1:
            return
        others = [v for v in nxt.inputs if v is not group.output]
        if is_table(nxt) and nxt.inputs[0] is group.output and all(_scalar(view, v) for v in others) or nxt.op_type in _SCALAR_STEPS and len(others) == 1 and _scalar(view, others[0]) or nxt.op_type == "Mul" and len(others) == 1 and others[0] is source:
            group.fused.append(nxt)
        else:
            return


def _scalar(view: GraphView, value: ir.Value | None) -> bool:
    const = view.const(value)
    return const is not None and const.size == 1


def _absorb_bias(view: GraphView, group: Group) -> None:
    main = group.main
    if main.op_type != "MatMul" or not view.is_const(main.inputs[1]):
        return
    nxt = view.single_consumer(main.outputs[0])
    if nxt is None or nxt.op_type != "Add":
        return
    other = nxt.inputs[1] if nxt.inputs[0] is main.outputs[0] else nxt.inputs[0]
    bias = view.const(other)
    columns = view.shape(main.inputs[1])[-1]
    if bias is not None and bias.size == columns and bias.shape[-1] == columns:
        group.fused.append(nxt)


def _absorb_activation(view: GraphView, group: Group) -> None:
    nxt = view.single_consumer(group.output)
    if nxt is None or nxt.op_type not in ACTIVATION_OPS:
        return
    if nxt.op_type == "Clip" and not all(view.is_const(v) for v in nxt.inputs[1:] if v is not None):
        return
    group.fused.append(nxt)


def activation_bounds(view: GraphView, group: Group) -> tuple[float, float]:
    """Float clamp bounds of the group's fused activation (``-inf, inf`` when none)."""
    relu, clip = group.fused_of("Relu"), group.fused_of("Clip")
    if relu is not None:
        return 0.0, float("inf")
    if clip is not None:
        low = view.const(clip.inputs[1]) if len(clip.inputs) > 1 and clip.inputs[1] is not None else None
        high = view.const(clip.inputs[2]) if len(clip.inputs) > 2 and clip.inputs[2] is not None else None
        return (_bound(low, float("-inf")), _bound(high, float("inf")))
    return float("-inf"), float("inf")


def _bound(value: np.ndarray | None, default: float) -> float:
    """A Clip bound; exporters sometimes write it as a one-element 1-D tensor instead of a scalar."""
    return default if value is None or value.size == 0 else float(value.reshape(-1)[0])
