"""Graph colours by estimated cycles (Qt-free): a performance report's layers -> heat colours and tooltips.

The report is :func:`compiler_core.runtime.profile.profile_mxq`'s. Each layer's share of the chosen
core mode's latency colours its main node, the nodes fused into it and the node named by its output
tensor (an activation folded into a convolution at quantization) (the same
:class:`~qbstudio.state.compare.HeatScale` gradient mechanism as the SQNR heatmap); the tooltip
gives the layer's cycles, time, MACs, DRAM bytes and MAC utilisation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # qbstudio.state.compare imports numpy; the main window imports this module at start-up
    from qbstudio.state.compare import HeatScale

logger = logging.getLogger(__name__)

CYCLES_COLOURING = "cycles:"
"""Key prefix of the graph colouring by a core mode's cycles (``cycles:<mode>``) in the graph's colour selector."""


@dataclass(frozen=True)
class CycleHeat:
    """What the graph needs to show one core mode's cycles.

    Attributes:
        colours: Node name -> ``[fill, text colour]``.
        tooltips: Node name -> the layer's numbers.
        scale: The gradient (share of latency, %).
        title: Legend title.
    """

    colours: dict[str, list[str]]
    tooltips: dict[str, str]
    scale: HeatScale
    title: str


def layer_tooltip(row: dict[str, Any], mode: str, microseconds: float) -> str:
    """Several lines: layer (and fused nodes), cycles and time, share, MACs, DRAM bytes, utilisation."""
    fused = f" + {', '.join(row['fused'])}" if row.get("fused") else ""
    return (f"{row['layer']}{fused}\n"
            f"{row['cycles']:,} cycles = {microseconds:,.1f} µs ({row['share']:.1%} of the {mode} latency)\n"
            f"{row['macs'] / 1e6:,.2f} MMACs, DRAM {row['dram_bytes'] / 1024:,.1f} KiB, "
            f"MAC utilisation {row['utilisation']:.1%}\n"
            f"{row['tiles']} tile(s) on {row['unit']}, split {row['split']} over {row['cores']} core(s)")


def cycle_heat(report: dict[str, Any], mode: str) -> CycleHeat:
    """Heat colours of ``mode``'s layers by their share of the latency.

    Raises:
        KeyError: ``mode`` is not in the report.
    """
    entry = report["modes"][mode]
    rows = entry["layers"]
    total = sum(row["cycles"] for row in rows) or 1
    seconds_per_cycle = entry["latency_ms"] * 1e-3 / total
    values: dict[str, float] = {}
    tips: dict[str, str] = {}
    for row in rows:
        tip = layer_tooltip(row, mode, row["cycles"] * seconds_per_cycle * 1e6)
        for name in (row["layer"], *row.get("fused", [])):
            values[name] = 100.0 * row["share"]
            tips[name] = tip
    for row in rows:  # an activation folded into the layer leaves its node name on the layer's output tensor
        for name in row.get("outputs", []):
            if name not in values:
                values[name] = 100.0 * row["share"]
                tips[name] = layer_tooltip(row, mode, row["cycles"] * seconds_per_cycle * 1e6)
    from qbstudio.state.compare import HeatScale, heat_colours

    scale = HeatScale.share(max(values.values(), default=0.0))
    colours, _ = heat_colours(values, scale, unit="%")
    return CycleHeat(colours, tips, scale, f"Share of the {mode} latency ({entry['latency_ms'] * 1e3:,.0f} µs), %")
