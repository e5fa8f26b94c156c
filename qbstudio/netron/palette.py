"""Colours of the support statuses in the graph and its legend: the one place they are defined.

Qt-free on purpose: the graph's injected CSS, the legend widget and any other view (a support
table, a report) read the same :data:`SUPPORT_PALETTE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class StatusStyle:
    """How one support status is drawn.

    Attributes:
        label: Short text for the legend.
        description: One sentence for tooltips.
        fill: Colour of the node's header (the op-type box), ``#rrggbb``.
        text: Colour of the header text on ``fill``.
        tint: Light background of the node's attribute list (and of the legend swatch border).
    """

    label: str
    description: str
    fill: str
    text: str
    tint: str


SUPPORT_PALETTE: MappingProxyType[str, StatusStyle] = MappingProxyType({
    "supported": StatusStyle("Supported", "Runs on the NPU of the chosen device.",
                             fill="#2e7d32", text="#ffffff", tint="#e8f5e9"),
    "needs_mfu": StatusStyle("Needs MFU", "Needs the MFU (lookup-table unit), which the chosen device lacks.",
                             fill="#ffb300", text="#1a1a1a", tint="#fff4d6"),
    "unsupported": StatusStyle("Unsupported", "Cannot run on the chosen device's NPU.",
                               fill="#c62828", text="#ffffff", tint="#ffebee"),
    "cpu_offloaded": StatusStyle("CPU offloaded", "Runs on the host CPU (head or tail offload).",
                                 fill="#546e7a", text="#ffffff", tint="#eceff1"),
})
"""Status value (``compiler_core.targets.SupportStatus`` values) -> style, in legend order."""

UNCLASSIFIED = StatusStyle("Not checked", "No support status for this node (for example inside a subgraph).",
                           fill="#8a8a8a", text="#ffffff", tint="#f2f2f2")
"""Nodes without a status while others have one; Netron's own category colours would read as statuses."""

SELECTION_COLOUR = "#7b1fa2"
"""Outline of selected nodes and edges (purple: distinct from every status colour)."""


def status_css_class(status: str) -> str:
    """The CSS class a rendered node carries for ``status`` (e.g. ``qb-status-needs_mfu``)."""
    return f"qb-status-{status}"
