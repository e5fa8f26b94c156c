"""CPU-offload split: partition a checked model into CPU head, NPU body and CPU tail.

With ``cpu_offload`` the compiler runs blocking nodes (``unsupported`` or ``needs_mfu``) on the
host CPU, but only at the edges of the graph, so the NPU runs one contiguous body:

* **CPU head**: a blocking node joins the head when every producer of its inputs is a head node,
  a graph input, an initializer or a ``Constant`` node; a supported node whose inputs come from
  the same places joins it when it is pure data movement (Pad, Reshape, Unsqueeze ...) and its
  outputs feed nothing but head nodes (no graph output), so a Pad/Reshape leading into a blocking
  first layer does not keep that layer in the NPU body. A supported node computing bool/int values
  (index or mask arithmetic, no float output) inside the head (fed by a head node, feeding only head
  nodes) joins it too: RoBERTa's position ids are ``Equal -> Not -> Cast -> CumSum ...`` on the token
  ids, and the one supported ``Not`` in that chain must not split it.
* **CPU tail** (backward, in reverse graph order): a blocking node not in the head joins the tail
  when every consumer of its outputs is a tail node (graph outputs and unused outputs are fine).
* **NPU body**: every other node, in graph order. Blocking nodes left there are
  ``inner_unsupported``: no edge split can remove them, so the compile fails on them.

Other supported nodes move to the CPU only when the user chooses them (``cpuLayers``, see
:func:`chosen_cpu_layers`): a ``head`` layer goes there with every layer it depends on, a ``tail``
layer with every layer after it, and those groups join the plan as if they were blocking. A node
that qualifies for both head and tail (a graph made of one unsupported node) goes to the head. The
plan is data; the backend exports the head and tail as ONNX (MXQ ``cpu`` section) and the runtime
chains the three parts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import onnx_ir as ir

from compiler_core.config import CpuLayersConfig, layer_matches
from compiler_core.errors import ConfigError
from compiler_core.ops import SHAPE, op_for
from compiler_core.targets.support import SupportReport, SupportStatus, inner_hint, node_names

logger = logging.getLogger(__name__)

_INNER_NOTE = "inside the NPU body; cpu_offload moves only head/tail groups"
_LEAD_IN_OPS = frozenset({"Pad", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Slice", "Identity"})
"""Supported ops (pure data movement) that may join the CPU head when they only feed it."""
_OFFLOADABLE = frozenset({SupportStatus.UNSUPPORTED, SupportStatus.NEEDS_MFU, SupportStatus.CPU_OFFLOADED})


@dataclass
class OffloadPlan:
    """Node names of each part of a CPU-offload split, each list in graph order.

    Attributes:
        cpu_head: Nodes run on the CPU before the NPU body.
        npu_body: Nodes run on the NPU.
        cpu_tail: Nodes run on the CPU after the NPU body.
        inner_unsupported: Body nodes the NPU cannot run (a compile error even with offload).
        chosen: CPU nodes put there by ``cpuLayers`` (the matched layers and what goes with them).
    """

    cpu_head: list[str] = field(default_factory=list)
    npu_body: list[str] = field(default_factory=list)
    cpu_tail: list[str] = field(default_factory=list)
    inner_unsupported: list[str] = field(default_factory=list)
    chosen: list[str] = field(default_factory=list)

    @property
    def has_cpu_parts(self) -> bool:
        """True if anything runs on the CPU."""
        return bool(self.cpu_head or self.cpu_tail)

    @property
    def npu_ready(self) -> bool:
        """True if the NPU body holds no blocking node."""
        return not self.inner_unsupported

    def inner_hint(self, mfu_devices: Sequence[str] = ()) -> str:
        """What to do about the unsupported layers inside the body (:func:`inner_hint`)."""
        return inner_hint(self.inner_unsupported, mfu_devices)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "cpu_head": list(self.cpu_head),
            "npu_body": list(self.npu_body),
            "cpu_tail": list(self.cpu_tail),
            "inner_unsupported": list(self.inner_unsupported),
            "chosen": list(self.chosen),
        }


def _is_constant_source(value: ir.Value) -> bool:
    producer = value.producer()
    return producer is None or producer.op_type == "Constant"


def _head(nodes: list[tuple[str, ir.Node]], offloadable: set[str]) -> set[str]:
    """The largest head: blocking nodes fed only by sources and the head, plus lead-in nodes.

    A supported data-movement node joins too when its results feed nothing but head nodes (the
    Pad/Unsqueeze before Silero's STFT convolution): it does no arithmetic, and moving it frees the
    blocking node behind it. So does a supported node of bool/int index arithmetic between head nodes (fed
    by one, feeding only head nodes): on the NPU it would need a CPU -> NPU -> CPU round trip that the
    split cannot express.
    Found as a fixpoint, starting from every node and dropping those that break a rule.
    """
    head = {node for _, node in nodes}
    changed = True
    while changed:
        changed = False
        for name, node in nodes:
            lead_in = _feeds_only(node, head) and (
                node.op_type in _LEAD_IN_OPS or (_fed_by_head_node(node, head) and _computes_indices(node)))
            if node in head and not (_fed_by(node, head) and (name in offloadable or lead_in)):
                head.discard(node)
                changed = True
    return {name for name, node in nodes if node in head}


def _computes_indices(node: ir.Node) -> bool:
    """True if no output is floating point: index or mask arithmetic (bool/int), never NPU activations."""
    return all(value.dtype is not None and not value.dtype.is_floating_point() for value in node.outputs)


def _fed_by_head_node(node: ir.Node, head: set[ir.Node]) -> bool:
    return any(value is not None and value.producer() in head for value in node.inputs)


def _fed_by(node: ir.Node, head: set[ir.Node]) -> bool:
    return all(_is_constant_source(value) or value.producer() in head for value in node.inputs if value is not None)


def _feeds_only(node: ir.Node, head: set[ir.Node]) -> bool:
    consumers = [consumer for value in node.outputs for consumer in value.consumers()]
    return bool(consumers) and not any(value.is_graph_output() for value in node.outputs) and all(
        consumer in head for consumer in consumers)


def _tail(nodes: list[tuple[str, ir.Node]], offloadable: set[str]) -> set[str]:
    tail_nodes: set[ir.Node] = set()
    for name, node in reversed(nodes):
        consumers = {consumer for value in node.outputs for consumer in value.consumers()}
        if name in offloadable and consumers <= tail_nodes:
            tail_nodes.add(node)
    return {name for name, node in nodes if node in tail_nodes}


def _closure(start: ir.Node, step) -> set[ir.Node]:
    """``start`` and every node reached from it by ``step`` (producers or consumers)."""
    seen, stack = {start}, [start]
    while stack:
        for other in step(stack.pop()):
            if other is not None and other not in seen:
                seen.add(other)
                stack.append(other)
    return seen


def _producers(node: ir.Node) -> list[ir.Node | None]:
    return [value.producer() for value in node.inputs if value is not None and not _is_constant_source(value)]


def _consumers(node: ir.Node) -> list[ir.Node]:
    return [consumer for value in node.outputs for consumer in value.consumers()]


def chosen_cpu_layers(model: ir.Model, head: list[str], tail: list[str]) -> tuple[set[str], set[str]]:
    """The CPU head and tail node names that ``cpuLayers`` asks for (empty sets without patterns).

    A node matching a ``head`` pattern (MBLT node name or ``mblt.source_name``,
    :func:`~compiler_core.config.layer_matches`) goes to the head with every node it depends on back to the inputs;
    one matching a ``tail`` pattern to the tail with every node after it to the outputs. Each group is closed (the
    head towards the inputs, the tail towards the outputs), so the NPU body is what lies between them.

    Raises:
        ConfigError: a pattern matches no layer, or a node would be in both groups (a tail layer comes before a
            head layer: the NPU would run between CPU layers on both sides, which the split cannot express); the
            message names the layers.
    """
    if not head and not tail:
        return set(), set()
    names = dict(zip(model.graph, node_names(model.graph)))
    sources = {node: node.metadata_props.get("mblt.source_name", "") for node in model.graph}
    unused = [pattern for pattern in [*head, *tail]
              if not any(layer_matches([pattern], names[node], sources[node]) for node in model.graph)]
    if unused:
        raise ConfigError(f"cpuLayers pattern(s) {', '.join(repr(p) for p in unused)} match no layer of the model.",
                          hint="Use MBLT node names or source names as `qbcompiler check --all` lists them; "
                               "globs (*, ?) match as in bit.layerOverrides.")
    groups: list[dict[ir.Node, ir.Node]] = [{}, {}]  # member -> the chosen layer that brought it
    for group, patterns, step in ((groups[0], head, _producers), (groups[1], tail, _consumers)):
        for node in model.graph:
            if patterns and layer_matches(patterns, names[node], sources[node]):
                for member in _closure(node, step):
                    group.setdefault(member, node)
    both = [node for node in model.graph if node in groups[0] and node in groups[1]]
    if both:
        first = both[0]
        raise ConfigError(
            f"cpuLayers cannot split the model: {len(both)} layer(s) ({', '.join(names[n] for n in both[:6])}"
            f"{' ...' if len(both) > 6 else ''}) would run both in the CPU head and in the CPU tail: head layer "
            f"{names[groups[0][first]]} depends on them and tail layer {names[groups[1][first]]} comes before them, "
            "so the NPU would run between CPU layers on both sides.",
            hint="The NPU runs one contiguous body between a CPU head and a CPU tail: choose head layers before "
                 "every tail layer, or move the layer to the other list.",
            layers=[names[n] for n in both[:20]])
    return {names[n] for n in groups[0]}, {names[n] for n in groups[1]}


def plan_cpu_offload(model: ir.Model, report: SupportReport, cpu_layers: CpuLayersConfig | None = None) -> OffloadPlan:
    """Split ``model`` into CPU head, NPU body and CPU tail from its support report.

    Args:
        model: The model the report was made from.
        report: Its :class:`SupportReport` (from ``check_support``, or already offloaded).
        cpu_layers: ``cpuLayers``: supported layers the user puts on the CPU head or tail (see
            :func:`chosen_cpu_layers`, whose errors this raises).

    Returns:
        The :class:`OffloadPlan`; see the module docstring for the exact rules.
    """
    nodes = list(zip(node_names(model.graph), model.graph))
    chosen_head, chosen_tail = chosen_cpu_layers(model, cpu_layers.head, cpu_layers.tail) if cpu_layers else (set(), set())
    offloadable = {name for name, entry in report.entries.items() if entry.status in _OFFLOADABLE}
    offloadable |= chosen_head | chosen_tail
    head = _head(nodes, offloadable)
    tail = _tail(nodes, offloadable - head)
    body = [name for name, _ in nodes if name not in head and name not in tail]
    plan = OffloadPlan(
        cpu_head=[name for name, _ in nodes if name in head],
        npu_body=body,
        cpu_tail=[name for name, _ in nodes if name in tail],
        inner_unsupported=[name for name in body if name in offloadable],
        chosen=[name for name, _ in nodes if name in chosen_head | chosen_tail],
    )
    logger.debug(
        "offload plan: head %d, body %d, tail %d, inner unsupported %d",
        len(plan.cpu_head),
        len(plan.npu_body),
        len(plan.cpu_tail),
        len(plan.inner_unsupported),
    )
    return plan


def body_computes(model: ir.Model, plan: OffloadPlan) -> bool:
    """True if a node of the NPU body does work on an NPU unit (not only shape metadata such as a Reshape).

    A model whose every computing node is offloaded (a 3-D convolution, a transposed-A Gemm on its own)
    leaves the NPU nothing to run; the compile says so instead of writing an empty program.
    """
    body = set(plan.npu_body)
    for name, node in zip(node_names(model.graph), model.graph):
        definition = op_for(node) if name in body else None
        if definition is not None and definition.unit not in (None, SHAPE):
            return True
    return False


def apply_offload(report: SupportReport, plan: OffloadPlan) -> SupportReport:
    """Return a copy of ``report`` with head and tail nodes marked ``cpu_offloaded``.

    Offloaded reasons read "runs on the CPU (head) because <original reason>"; blocking nodes left
    in the NPU body keep their status, and their reason says offload cannot move them.

    Args:
        report: The report the plan was made from.
        plan: The split from :func:`plan_cpu_offload`.

    Returns:
        A new :class:`SupportReport`; ``report`` is not modified.
    """
    parts = {**dict.fromkeys(plan.cpu_head, "head"), **dict.fromkeys(plan.cpu_tail, "tail")}
    inner, chosen = set(plan.inner_unsupported), set(plan.chosen)
    entries = {}
    for name, entry in report.entries.items():
        if name in chosen and entry.status == SupportStatus.SUPPORTED:
            entry = replace(entry, status=SupportStatus.CPU_OFFLOADED,
                            reason=f"runs on the CPU ({parts[name]}): cpuLayers chose it or a layer that needs it")
        elif name in parts and entry.status == SupportStatus.SUPPORTED:
            entry = replace(entry, status=SupportStatus.CPU_OFFLOADED,
                            reason=f"runs on the CPU ({parts[name]}): its results only feed CPU nodes")
        elif name in parts and entry.status != SupportStatus.CPU_OFFLOADED:
            entry = replace(
                entry,
                status=SupportStatus.CPU_OFFLOADED,
                reason=f"runs on the CPU ({parts[name]}) because {entry.reason}",
            )
        elif name in inner and _INNER_NOTE not in entry.reason:
            entry = replace(entry, reason=f"{entry.reason} ({_INNER_NOTE})")
        entries[name] = entry
    return replace(report, entries=entries)
