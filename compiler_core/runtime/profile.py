"""Per-layer performance report of a compiled MXQ, per core mode, from its tile-level program.

For every layer: tiles, how the layer is split across cores, SRAM use (weights, activation tiles,
LUTs, their total, and the SRAM-resident activations live meanwhile), MACs, cycles, DRAM bytes, MAC utilisation and share of the total; per core mode the
totals, latency and throughput. The numbers come from :mod:`compiler_core.runtime.cost` reading
the same command stream the tile-level simulator executes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compiler_core.errors import ArgumentError
from compiler_core.runtime.artifact import load_artifact
from compiler_core.runtime.cost import estimate
from compiler_core.targets import CORE_MODES, get_device


def profile_mxq(path: str | Path, modes: list[str] | None = None) -> dict[str, Any]:
    """The per-layer report of every compiled core mode (or of ``modes``).

    Raises:
        ArgumentError: the MXQ holds no tile-level program (compiled by an older version) or was not
            compiled for a requested mode.
    """
    artifact = load_artifact(Path(path))
    if artifact.npu is None:
        raise ArgumentError(f"{Path(path).name} holds no tile-level program (compiled by an older qb Studio).",
                            hint="Compile the model again to profile it.")
    device = get_device(artifact.device)
    chosen = modes or [mode for mode in CORE_MODES if mode in artifact.npu.commands]
    unknown = [mode for mode in chosen if mode not in artifact.npu.commands]
    if unknown:
        raise ArgumentError(f"{Path(path).name} was not compiled for {', '.join(unknown)} "
                            f"(compiled: {', '.join(artifact.npu.commands)}).")
    report = {"file": str(path), "device": device.name, "arena_bytes": artifact.npu.arena_bytes,
              "sram_bytes_per_core": device.sram_bytes_per_core, "cpu_parts": cpu_parts(artifact.meta), "modes": {}}
    for mode in chosen:
        result = estimate(artifact.program, device, mode, artifact.npu)
        resident = artifact.npu.modes[mode].get("resident", {}).values()
        for index, row in enumerate(result.layers):  # activations kept in SRAM while this layer runs
            row["sram"] = {**row["sram"], "resident": sum(item["size"] for item in resident
                                                          if item["live"][0] <= index <= item["live"][1])}
        peak = max((row["sram"].get("total", 0) + row["sram"]["resident"] for row in result.layers), default=0)
        report["modes"][mode] = {**result.to_dict(), "cycles": sum(row["cycles"] for row in result.layers),
                                 "sram_peak_bytes": peak, "layers": result.layers}
    return report


def cpu_parts(meta: dict[str, Any]) -> list[str]:
    """``["head"]``, ``["tail"]``, both or none: the parts of an MXQ (its ``meta``) that run on the host CPU."""
    offload = meta.get("cpu_offload") or {}
    return [part for part in ("head", "tail") if offload.get(part)]


def host_note(parts: list[str]) -> str:
    """What an NPU latency estimate leaves out when the MXQ has CPU parts ("" when it has none)."""
    if not parts:
        return ""
    return f"the NPU part; the CPU {' and '.join(parts)} run{'s' if len(parts) == 1 else ''} on the host, not counted"


def format_profile(report: dict[str, Any], top: int | None = None) -> str:
    """Plain-text tables of a :func:`profile_mxq` report (``top``: only the slowest layers)."""
    lines = [f"{report['file']} on {report['device']}: activation arena {report['arena_bytes']:,} B, "
             f"SRAM {report['sram_bytes_per_core']:,} B per core"]
    header = (f"{'layer':<28} {'unit':<6} {'tiles':>5} {'split':<8} {'w KiB':>7} {'act KiB':>8} {'lut KiB':>7} "
              f"{'peak KiB':>8} {'res KiB':>7} {'MMACs':>8} {'kcycles':>8} {'DRAM KiB':>9} {'util':>6} {'share':>6}")
    for mode, entry in report["modes"].items():
        note = host_note(report.get("cpu_parts") or [])
        lines += ["", f"[{mode}] latency {entry['latency_ms']:.3f} ms{f' ({note})' if note else ''}, "
                      f"{entry['throughput_fps']:,.1f} FPS, "
                      f"{entry['macs'] / 1e6:,.1f} MMACs, {entry['cycles']:,} cycles, DRAM {entry['dram_bytes'] / 1024:,.0f} KiB "
                      f"per input, SRAM peak {entry['sram_peak_bytes'] / 1024:,.0f} KiB", header]
        rows = entry["layers"]
        if top:
            rows = sorted(rows, key=lambda row: -row["cycles"])[:top]
        for row in rows:
            sram = row["sram"]
            lines.append(f"{row['layer'][:28]:<28} {row['unit']:<6} {row['tiles']:>5} {row['split']:<8} "
                         f"{sram.get('weights', 0) / 1024:>7.1f} {sram.get('activations', 0) / 1024:>8.1f} "
                         f"{sram.get('luts', 0) / 1024:>7.1f} {sram.get('total', 0) / 1024:>8.1f} "
                         f"{sram.get('resident', 0) / 1024:>7.1f} "
                         f"{row['macs'] / 1e6:>8.2f} {row['cycles'] / 1e3:>8.1f} {row['dram_bytes'] / 1024:>9.1f} "
                         f"{row['utilisation']:>6.1%} {row['share']:>6.1%}")
    return "\n".join(lines)
