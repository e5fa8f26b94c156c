"""Per-node support check of an MBLT against a target device, producing a :class:`SupportReport`.

The CLI ``qbcompiler check``, the workbench's graph colouring and ``compile`` (error, or CPU
offload of head/tail groups) all read the same report.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import onnx_ir as ir

from compiler_core.errors import UnsupportedOpsError
from compiler_core.ops import op_for
from compiler_core.ops.constraints import BATCH_REASON
from compiler_core.targets.devices import DEVICES, DeviceProfile, get_device

logger = logging.getLogger(__name__)

SOURCE_NAME_KEY = "mblt.source_name"
_NODES_PER_OP_IN_ERROR = 3


class SupportStatus(str, Enum):
    """Where a node can run on the chosen device."""

    SUPPORTED = "supported"
    NEEDS_MFU = "needs_mfu"
    UNSUPPORTED = "unsupported"
    CPU_OFFLOADED = "cpu_offloaded"

    def __str__(self) -> str:
        return self.value


BLOCKING = frozenset({SupportStatus.UNSUPPORTED, SupportStatus.NEEDS_MFU})
"""Statuses that stop a compile unless the node is offloaded to the CPU."""


@dataclass(frozen=True)
class NodeSupport:
    """The verdict for one node.

    Attributes:
        node: Unique node name in the MBLT.
        op_type: ONNX op type (``domain::op`` for custom domains).
        status: Where the node can run.
        reason: Why it is not ``supported`` (empty when it is).
        unit: NPU unit that runs the op (``MAC``, ``VEC``, ``MFU``, ``DMA``, ``SHAPE``), empty if none.
        source_name: The source framework's layer name (``mblt.source_name``), empty if unknown.
    """

    node: str
    op_type: str
    status: SupportStatus
    reason: str = ""
    unit: str = ""
    source_name: str = ""

    @property
    def blocking(self) -> bool:
        """True if this node stops a compile (unsupported or needs a missing MFU)."""
        return self.status in BLOCKING

    def to_dict(self) -> dict[str, str]:
        """JSON-serialisable form."""
        return {
            "node": self.node,
            "op_type": self.op_type,
            "status": self.status.value,
            "reason": self.reason,
            "unit": self.unit,
            "source_name": self.source_name,
        }


@dataclass
class SupportReport:
    """Support verdicts of every node of a model for one device, in graph order.

    Attributes:
        device: Device string the model was checked against.
        entries: Node name -> :class:`NodeSupport`, in graph order.
    """

    device: str
    entries: dict[str, NodeSupport] = field(default_factory=dict)
    batched_inputs: dict[str, list[int]] = field(default_factory=dict)
    """Model inputs whose first dimension is a batch other than 1 (static), with their shapes: the refusal of a
    ``batch N`` layer names the shape to give instead."""
    inner_unsupported: list[str] = field(default_factory=list)
    """Blocking nodes that a CPU-offload split would leave inside the NPU body (between NPU layers): the refusal
    offers the CPU head or tail that takes them, not ``cpu_offload``."""

    def flagged(self) -> list[NodeSupport]:
        """Every node that does not run on the NPU as is (including ``cpu_offloaded`` ones)."""
        return [entry for entry in self.entries.values() if entry.status != SupportStatus.SUPPORTED]

    def blocking(self) -> list[NodeSupport]:
        """Nodes that stop a compile: ``unsupported`` or ``needs_mfu``."""
        return [entry for entry in self.entries.values() if entry.blocking]

    def counts(self) -> dict[str, int]:
        """Status value -> number of nodes, with every status present."""
        tally = Counter(entry.status for entry in self.entries.values())
        return {status.value: tally.get(status, 0) for status in SupportStatus}

    @property
    def all_supported(self) -> bool:
        """True if every node runs on the NPU."""
        return not self.flagged()

    @property
    def compilable(self) -> bool:
        """True if nothing blocks a compile (every node supported or offloaded to the CPU)."""
        return not self.blocking()

    def by_op(self) -> dict[str, list[NodeSupport]]:
        """Op type -> its nodes' verdicts, ops in order of first appearance."""
        groups: dict[str, list[NodeSupport]] = {}
        for entry in self.entries.values():
            groups.setdefault(entry.op_type, []).append(entry)
        return groups

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form: device, counts, flags and every node's verdict."""
        return {
            "device": self.device,
            "counts": self.counts(),
            "all_supported": self.all_supported,
            "compilable": self.compilable,
            "nodes": [entry.to_dict() for entry in self.entries.values()],
        }

    def unsupported_error(self) -> UnsupportedOpsError | None:
        """Build the error listing every blocking op type, or None when nothing blocks.

        ``fields["ops"]`` holds ``{"op", "count", "nodes", "reason"}`` per op type, with up to three
        node names; the hint points at ``cpu_offload`` and at devices that have the MFU.
        """
        groups = _blocking_groups(self.blocking())
        if not groups:
            return None
        ops = [_op_summary(op_type, entries) for op_type, entries in groups.items()]
        listing = "; ".join(
            f"{op['op']} x{op['count']} ({', '.join(op['nodes'])}): {op['reason']}" for op in ops
        )
        count = sum(op["count"] for op in ops)
        return UnsupportedOpsError(
            f"{count} node(s) of {len(ops)} op type(s) cannot run on {self.device}: {listing}.",
            hint=self._hint(groups),
            device=self.device,
            ops=ops,
        )

    def _hint(self, groups: dict[str, list[NodeSupport]]) -> str:
        entries = [entry for group in groups.values() for entry in group]
        batched = [entry for entry in entries if entry.reason.startswith(BATCH_REASON)]
        if batched:  # the CPU runs batch 1 parts too, and no op replacement changes the batch: the shape does
            shapes = " ".join(f"{name}={','.join(map(str, [1, *shape[1:]]))}"
                              for name, shape in self.batched_inputs.items())
            batch_hint = ("The NPU runs one sample per inference: give the model batch 1"
                          + (f" (--input-shape {shapes}, or input_shape_dict, when its batch is dynamic; "
                             "re-export it with batch 1 when it is fixed)" if shapes else "")
                          + " and run the MXQ once per sample")
            if len(batched) == len(entries):
                return batch_hint + "."
            other = self._op_hint(groups)
            return f"{batch_hint}; for the other layers: {other[0].lower()}{other[1:]}"
        return self._op_hint(groups)

    def mfu_alternatives(self) -> list[str]:
        """Devices with the MFU when a blocking node needs it (the first thing to offer), else none."""
        needs_mfu = any(entry.status == SupportStatus.NEEDS_MFU for entry in self.blocking())
        return mfu_devices(self.device) if needs_mfu else []

    def _op_hint(self, groups: dict[str, list[NodeSupport]]) -> str:
        if self.inner_unsupported:
            return inner_hint(self.inner_unsupported, self.mfu_alternatives())
        hint = "Compile with cpu_offload to run unsupported head/tail groups on the CPU"
        alternatives = self.mfu_alternatives()
        if alternatives:
            hint += f", or target a device with the MFU ({', '.join(alternatives)})"
        return hint + ", or replace these ops in the source model."


def inner_hint(inner: Sequence[str], mfu_devices: Sequence[str] = ()) -> str:
    """What to do about unsupported layers between NPU layers: ``cpu_offload`` moves only a head or a tail, so name
    the layers that make one (a GridSample between Convs); a device with the MFU first when the layers need it."""
    first, last = inner[0], inner[-1]
    device = f"Target a device with the MFU ({', '.join(mfu_devices)}). " if mfu_devices else ""
    return (f"{device}cpu_offload moves only a leading (head) or trailing (tail) group to the CPU. Run {first} and "
            f"every layer after it on the CPU (--cpu-tail {first}, cpuLayers.tail; the graph view's node menu: Run on "
            f"the CPU with every layer after it), or {last} and every layer before it (--cpu-head {last}, "
            "cpuLayers.head), or replace these ops in the source model.")


def _blocking_groups(entries: list[NodeSupport]) -> dict[str, list[NodeSupport]]:
    groups: dict[str, list[NodeSupport]] = {}
    for entry in entries:
        groups.setdefault(entry.op_type, []).append(entry)
    return groups


def _op_summary(op_type: str, entries: list[NodeSupport]) -> dict[str, Any]:
    reasons = list(dict.fromkeys(entry.reason for entry in entries))
    reason = reasons[0] if len(reasons) == 1 else f"{reasons[0]} (and {len(reasons) - 1} other reason(s))"
    nodes = [entry.node for entry in entries[:_NODES_PER_OP_IN_ERROR]]
    return {"op": op_type, "count": len(entries), "nodes": nodes, "reason": reason}


def mfu_devices(device: str) -> list[str]:
    """Devices with the MFU, those of ``device``'s chip first (suggested when an op needs it)."""
    chip = DEVICES[device].chip if device in DEVICES else ""
    with_mfu = [profile for profile in DEVICES.values() if profile.has_mfu]
    return [p.name for p in with_mfu if p.chip == chip] + [p.name for p in with_mfu if p.chip != chip]


def _op_label(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def _mfu_reason(op_type: str, use: str, profile: DeviceProfile) -> str:
    same_chip = [name for name in mfu_devices(profile.name) if DEVICES[name].chip == profile.chip]
    alternative = " or ".join(same_chip[:2] or mfu_devices(profile.name)[:1])
    purpose = f" for {use}" if use else ""
    return (
        f"{op_type} needs the multi-function unit (MFU){purpose}, which {profile.name} does not have; "
        f"use {alternative}, or cpu_offload"
    )


def node_support(node: ir.Node, name: str, profile: DeviceProfile) -> NodeSupport:
    """Judge one node against the op registry and the device.

    Args:
        node: The node to check.
        name: Its unique name in the report.
        profile: The target device.

    Returns:
        The node's :class:`NodeSupport`; constraint violations win over a missing MFU.
    """
    label = _op_label(node)
    base = NodeSupport(
        name, label, SupportStatus.SUPPORTED, source_name=node.metadata_props.get(SOURCE_NAME_KEY, "")
    )
    rule = op_for(node)
    if rule is None:
        return replace(
            base, status=SupportStatus.UNSUPPORTED, reason=f"unsupported: no NPU implementation of {label}"
        )
    base = replace(base, unit=rule.unit or "")
    reason = rule.violation(node)
    if reason:
        return replace(base, status=SupportStatus.UNSUPPORTED, reason=reason)
    if rule.needs_mfu(node) and not profile.has_mfu:
        return replace(base, status=SupportStatus.NEEDS_MFU, reason=_mfu_reason(label, rule.mfu_use, profile))
    return base


def node_names(graph: ir.Graph) -> list[str]:
    """Report names of ``graph``'s nodes in order: the node name, or ``op_index`` if missing or repeated."""
    names: list[str] = []
    seen: set[str] = set()
    for index, node in enumerate(graph):
        name = node.name if node.name and node.name not in seen else f"{node.op_type}_{index}"
        seen.add(name)
        names.append(name)
    return names


def check_support(model: ir.Model, target_device: str) -> SupportReport:
    """Check every node of ``model`` against ``target_device``.

    Args:
        model: A canonical MBLT (static shapes, constants folded) as an ``onnx_ir.Model``.
        target_device: Device string such as ``"aries-rb"``.

    Returns:
        The :class:`SupportReport`, entries in graph order.

    Raises:
        ArgumentError: ``target_device`` is not a device string.
    """
    profile = get_device(target_device)
    entries = {
        name: node_support(node, name, profile) for name, node in zip(node_names(model.graph), model.graph)
    }
    batched = {value.name: list(value.shape) for value in model.graph.inputs
               if value.shape is not None and len(value.shape) > 1 and isinstance(value.shape[0], int)
               and value.shape[0] > 1}
    report = SupportReport(profile.name, entries, batched)
    if report.blocking():  # where a split would leave them: the refusal's hint depends on it
        from compiler_core.targets.offload import plan_cpu_offload

        report.inner_unsupported = plan_cpu_offload(model, report).inner_unsupported
    logger.debug("support check on %s: %s", profile.name, report.counts())
    return report


def format_report_table(report: SupportReport, only_flagged: bool = False) -> str:
    """Render a report as an aligned text table (node, op, status, reason) plus a summary line.

    Args:
        report: The report to render.
        only_flagged: List only nodes that are not ``supported``.

    Returns:
        The table text, as ``qbcompiler check`` prints it.
    """
    entries = report.flagged() if only_flagged else list(report.entries.values())
    rows = [("node", "op", "status", "reason")]
    rows += [(e.node, e.op_type, e.status.value, e.reason) for e in entries]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3] for row in rows
    ]
    lines = [line.rstrip() for line in lines]
    if not entries:
        lines.append("(no flagged nodes)" if only_flagged else "(empty graph)")
    return "\n".join([*lines, _summary_line(report)])


def _summary_line(report: SupportReport) -> str:
    counts = ", ".join(f"{count} {status}" for status, count in report.counts().items())
    return f"{report.device}: {len(report.entries)} node(s): {counts}"
