"""Cost model of the virtual NPU, read from the tile-level program (``qbtile-1``) of a core mode.

Per tile, ``cycles = max(compute, DMA)``: the tile's transfers stream through the second SRAM
buffer set while the previous tile computes (double buffering), so only the first tile's input
transfer of each layer is not hidden. Compute runs on the unit of the layer:

- MAC array: ``int8_macs_per_cycle_per_core`` MACs arranged as ``LANES x LANES`` (reduction x
  output channels, 64 x 64 for 4,096 MACs). A convolution tile is a matrix product (im2col): it takes
  ``pixels x ceil(Cin x taps / LANES) x ceil(Cout / LANES)`` cycles; a depthwise one maps channels
  onto the output lanes only (``pixels x taps x ceil(C / LANES)``), so its utilisation is at most
  ``1 / LANES``. The multipliers are ``DeviceProfile.multiplier_bits`` (8) wide: a 16-bit operand
  takes two passes, int16 x int16 four (:meth:`~compiler_core.targets.DeviceProfile.mac_passes`).
- MFU and vector unit: ``LANES`` 8-bit lanes per cycle, so ``LANES`` int8 or ``LANES / 2`` int16
  elements; it streams the larger of what it reads and writes (a reduction reads more). A fused
  epilogue streams behind the MAC array, so a fused layer costs the larger of the two.
- int16 tensors also move twice the DMA bytes and take twice the SRAM (the tile program's sizes).
- DMA-only layers (data movement): no compute.

DMA runs at the DRAM bandwidth of the device profile divided by the cores that are active (all of
them: the estimate is for a fully loaded device); a weight transfer broadcast to the four cores of
a cluster (``multi``) is charged once per batch. Latency is the sum of the layers, each the slowest
of its cores (the barrier). Throughput is the inputs in flight (:class:`~compiler_core.targets.CoreMode`)
over the latency. Nothing here is fitted to a published throughput; the MAC array geometry and the
vector width are assumptions of the virtual device (docs/cost-model.md).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler_core.backend.fusion import DMA, MAC, Layer
from compiler_core.backend.program import DecodedProgram, decode, lower
from compiler_core.backend.schedule import COMPUTE, DMA_IN, DMA_OUT, DMA_T, DMA_W, RESIDENT
from compiler_core.backend.tiling import out_channels, output_rows
from compiler_core.quantization.program import IntOp, QuantizedModel
from compiler_core.targets import CORE_MODES, DeviceProfile

logger = logging.getLogger(__name__)

VECTOR_LANES = 64
"""Elements per cycle of the MFU and the vector unit (one per MAC-array lane)."""


@dataclass(frozen=True)
class Estimate:
    """Estimated performance of one core mode."""

    mode: str
    latency_ms: float
    throughput_fps: float
    macs: int
    dram_bytes: int = 0
    layers: list[dict[str, Any]] = field(default_factory=list, compare=False)

    def to_dict(self) -> dict:
        """JSON-serialisable summary (without the per-layer rows)."""
        return {"mode": self.mode, "latency_ms": round(self.latency_ms, 4),
                "throughput_fps": round(self.throughput_fps, 1), "macs": self.macs, "dram_bytes": self.dram_bytes}


def lanes(device: DeviceProfile) -> int:
    """Side of the square MAC array (64 for 4,096 MACs per cycle)."""
    return max(1, math.isqrt(device.int8_macs_per_cycle_per_core))


def op_macs(op: IntOp, shapes: dict[str, list[int]]) -> int:
    """Multiply-accumulates of one operation (0 for data movement)."""
    out = int(np.prod(shapes.get(op.outputs[0], [0]))) if op.outputs else 0
    if op.kind == "linear":
        return out * int(np.prod(op.consts["weight"].shape[1:]))
    if op.kind == "matmul":
        return out * int(shapes.get(op.inputs[0], [1])[-1])
    return 0


def _tile_cycles(model: QuantizedModel, program: DecodedProgram, layer: Layer, rows: tuple[int, int],
                 channels: tuple[int, int], tiled_rows: bool, side: int, device: DeviceProfile) -> tuple[float, int]:
    """Compute cycles and MACs of one tile."""
    op = layer.main(model)
    out = program.layouts[layer.outputs[0]]
    share = 1.0
    if tiled_rows:
        share = (rows[1] - rows[0]) / max(output_rows(model, layer, program.layouts), 1)
    total_channels = out_channels(model, layer, program.layouts)
    channel_share = (channels[1] - channels[0]) / max(total_channels, 1)
    elements = int(np.prod(out.shape, dtype=np.int64)) * share * channel_share
    macs = int(op_macs(op, model.shapes) * share * channel_share)
    if layer.unit == DMA:
        return 0.0, 0
    if layer.unit != MAC:  # the vector unit streams the larger of what it reads and writes (a reduction reads more)
        read = max((int(np.prod(program.layouts[name].shape, dtype=np.int64)) for name in layer.inputs), default=0)
        return max(elements, read * share * channel_share) * _vector_passes(program, layer, device) / VECTOR_LANES, 0
    mac_cycles = _mac_cycles(op, model, elements, channels, side) * _mac_passes(op, program, layer, device)
    epilogue = elements * _vector_passes(program, layer, device) / VECTOR_LANES if len(layer.ops) > 1 else 0.0
    return max(mac_cycles, epilogue), macs


def _bits(program: DecodedProgram, name: str) -> int:
    return 8 * program.layouts[name].itemsize


def _mac_passes(op: IntOp, program: DecodedProgram, layer: Layer, device: DeviceProfile) -> int:
    """Passes of the MAC array per product for the layer's operand widths (int16 x int8: 2, int16 x int16: 4)."""
    activation = _bits(program, layer.inputs[0])  # int4 weights are stored (and multiplied) as int8
    weight = 8 * op.consts["weight"].dtype.itemsize if "weight" in op.consts else _bits(program, layer.inputs[-1])
    return device.mac_passes(min(activation, 16), min(weight, 16))


def _vector_passes(program: DecodedProgram, layer: Layer, device: DeviceProfile) -> int:
    """Passes of the vector unit's ``multiplier_bits``-wide lanes for the layer's widest quantized tensor."""
    widest = max(_bits(program, name) for name in (*layer.inputs, *layer.outputs))
    return max(1, -(-min(widest, 16) // device.multiplier_bits))


def _mac_cycles(op: IntOp, model: QuantizedModel, elements: float, channels: tuple[int, int], side: int) -> float:
    if op.kind == "matmul":  # the tile's rows of A x its columns of B
        reduction, columns = model.shapes[op.inputs[0]][-1], channels[1] - channels[0]
        return elements / max(columns, 1) * math.ceil(reduction / side) * math.ceil(columns / side)
    weight = op.consts["weight"]
    cout = channels[1] - channels[0]
    pixels = elements / max(cout, 1)
    if op.attrs.get("layout") == "dense":
        return pixels * math.ceil(weight.shape[1] / side) * math.ceil(cout / side)
    cin_group, taps = weight.shape[1], int(np.prod(weight.shape[2:]))
    groups = op.attrs.get("group", 1)
    if groups > 1 and cin_group == 1:  # depthwise: channels on the output lanes, one input lane each
        return pixels * taps * math.ceil(cout / side)
    cout_group = max(1, math.ceil(cout / groups))
    # im2col: the reduction K = Cin/group x taps runs down the input lanes, output channels across
    return pixels * groups * math.ceil(cin_group * taps / side) * math.ceil(cout_group / side)


def estimate(model: QuantizedModel, device: DeviceProfile, mode: str,
             program: DecodedProgram | None = None) -> Estimate:
    """Latency and throughput of ``mode`` from its tile-level program, with the per-layer breakdown.

    Args:
        model: the integer program (op graph) the tile program refers to.
        device: the target device's profile.
        mode: a core mode compiled in ``program``.
        program: the decoded ``qbtile-1`` program; lowered on the fly when None.
    """
    if program is None or mode not in program.commands:
        program = decode(lower(model, device, [mode]))
    core_mode = CORE_MODES[mode]
    side = lanes(device)
    bytes_per_cycle = device.dram_bandwidth_bytes_per_s / device.total_cores / device.clock_hz
    info = program.modes[mode]
    per_layer: dict[int, dict[int, dict[str, float]]] = {}
    for command in program.commands[mode]:
        opcode, core, index = int(command[0]), int(command[1]), int(command[2])
        stats = per_layer.setdefault(index, {}).setdefault(core, {"cycles": 0.0, "dram": 0.0, "pending": 0.0,
                                                                   "tiles": 0, "compute": 0.0})
        moved = _moved_bytes(opcode, command)
        stats["dram"] += moved
        stats["pending"] += moved
        if opcode == COMPUTE:
            compute, _ = _tile_cycles(model, program, program.layers[index], (int(command[5]), int(command[6])),
                                      (int(command[7]), int(command[8])), info["layers"][index]["rows"], side,
                                      device)
            transfer = stats["pending"] / bytes_per_cycle
            # the first tile's transfers are not hidden; later ones overlap the previous tile's compute
            stats["cycles"] += compute + transfer if stats["tiles"] == 0 else max(compute, transfer)
            stats["compute"] += compute
            stats["pending"] = 0.0
            stats["tiles"] += 1
    for cores in per_layer.values():  # the last tile's output transfer
        for stats in cores.values():
            stats["cycles"] += stats["pending"] / bytes_per_cycle
    return _summarise(model, program, device, core_mode, per_layer)


def _moved_bytes(opcode: int, command: np.ndarray) -> float:
    """DRAM bytes one command moves for one input (broadcast weight transfers split over their inputs)."""
    if opcode in (DMA_IN, DMA_OUT):
        return 0.0 if command[10] & RESIDENT else float(command[6] * command[7])
    if opcode == DMA_W:
        return float(command[7] + command[8]) / max(int(command[11]), 1)
    if opcode == DMA_T:
        return float(command[7]) / max(int(command[11]), 1)
    return 0.0


def _summarise(model, program, device, core_mode, per_layer) -> Estimate:
    rows, total_cycles, dram = [], 0.0, 0
    info = program.modes[core_mode.name]
    for index, layer in enumerate(program.layers):
        cores = per_layer.get(index, {})
        cycles = max((stats["cycles"] for stats in cores.values()), default=0.0)
        macs = sum(op_macs(model.ops[i], model.shapes) for i in layer.ops)
        layer_dram = int(sum(stats["dram"] for stats in cores.values()))
        peak = device.int8_macs_per_cycle_per_core * max(len(cores), 1)
        tiling = info["layers"][index]
        rows.append({"layer": layer.main(model).name, "kind": layer.main(model).kind, "unit": layer.unit,
                     "fused": layer.fused, "outputs": list(layer.outputs), "tiles": tiling["tiles"], "split": tiling["split"], "cores": len(cores),
                     "sram": tiling["sram"], "macs": macs, "cycles": int(round(cycles)), "dram_bytes": layer_dram,
                     "utilisation": round(macs / (cycles * peak), 4) if cycles and macs else 0.0})
        total_cycles += cycles
        dram += layer_dram
    for row in rows:
        row["share"] = round(row["cycles"] / total_cycles, 4) if total_cycles else 0.0
    latency = total_cycles / device.clock_hz
    throughput = core_mode.instances(device.total_cores) / latency if latency else 0.0
    throughput = _io_limited(model, device, throughput)
    macs = sum(op_macs(op, model.shapes) for op in model.ops)
    return Estimate(core_mode.name, latency * 1e3, throughput, macs, dram, rows)


def _io_limited(model: QuantizedModel, device: DeviceProfile, throughput: float) -> float:
    """USB-attached devices cannot move more inputs per second than the link carries."""
    if not device.usb_transfer_bytes_per_s:
        return throughput
    io_bytes = sum(int(np.prod(spec.shape)) for spec in (*model.inputs, *model.outputs))
    return min(throughput, device.usb_transfer_bytes_per_s / max(io_bytes, 1))
