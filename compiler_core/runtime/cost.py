"""Cost model of the virtual NPU: estimated latency and throughput per core mode.

Per operation: MAC work at the device's peak times an efficiency that depends on the kind of
layer (dense convolutions and matrix products keep the MAC array busy; depthwise convolutions and
element-wise work do not), plus a fixed per-operation overhead (dispatch, DMA set-up). Weights
stream from DRAM once per inference unless they fit in the cores' SRAM.

The constants were fitted to the published ARIES throughput (third-party figures): ResNet-50
about 3,082 FPS and MobileNetV2 about 11,551 FPS with all 8 cores. These are estimates of a
virtual device, not measurements of hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler_core.quantization.program import IntOp, QuantizedModel
from compiler_core.targets import DeviceProfile

DENSE_EFFICIENCY = 0.35
DEPTHWISE_EFFICIENCY = 0.03
VECTOR_ELEMENTS_PER_CYCLE = 256
OP_OVERHEAD_S = 5e-6
MODE_CORES = {"single": 1, "multi": 4, "global4": 4, "global8": 8}
MODE_SCALING = {"single": 1.0, "multi": 1.0, "global4": 0.85, "global8": 0.75}


@dataclass(frozen=True)
class Estimate:
    """Estimated performance of one core mode."""

    mode: str
    latency_ms: float
    throughput_fps: float
    macs: int

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return {"mode": self.mode, "latency_ms": round(self.latency_ms, 4),
                "throughput_fps": round(self.throughput_fps, 1), "macs": self.macs}


def op_macs(op: IntOp, shapes: dict[str, list[int]]) -> int:
    """Multiply-accumulates of one operation (0 for data movement)."""
    out = int(np.prod(shapes.get(op.outputs[0], [0]))) if op.outputs else 0
    if op.kind == "linear":
        weight = op.consts["weight"]
        per_output = int(np.prod(weight.shape[1:]))
        return out * per_output
    if op.kind == "matmul":
        a_shape = shapes.get(op.inputs[0], [1])
        return out * int(a_shape[-1])
    return 0


def _op_seconds(op: IntOp, shapes: dict[str, list[int]], device: DeviceProfile) -> float:
    macs = op_macs(op, shapes)
    peak = device.int8_macs_per_cycle_per_core * device.clock_hz
    if macs:
        depthwise = op.attrs.get("group", 1) > 1 and op.consts["weight"].shape[1] == 1
        return macs / (peak * (DEPTHWISE_EFFICIENCY if depthwise else DENSE_EFFICIENCY)) + OP_OVERHEAD_S
    elements = int(np.prod(shapes.get(op.outputs[0], [0]))) if op.outputs else 0
    return elements / (VECTOR_ELEMENTS_PER_CYCLE * device.clock_hz) + OP_OVERHEAD_S


def estimate(model: QuantizedModel, device: DeviceProfile, mode: str) -> Estimate:
    """Latency of one inference and throughput of the whole device in ``mode``."""
    compute = sum(_op_seconds(op, model.shapes, device) for op in model.ops)
    weight_bytes = sum(op.consts["weight"].nbytes for op in model.ops if "weight" in op.consts)
    cores = MODE_CORES[mode]
    parallel = cores if mode.startswith("global") else 1  # global modes split one inference over cores
    sram = device.sram_bytes_per_core * parallel  # single/multi: each core holds its own instance
    transfer = 0.0 if weight_bytes <= sram else weight_bytes / device.dram_bandwidth_bytes_per_s
    latency = compute / (parallel * MODE_SCALING[mode]) + transfer
    instances = max(1, (device.clusters * device.cores_per_cluster) // parallel)
    throughput = instances / latency
    throughput = _io_limited(model, device, throughput)
    macs = sum(op_macs(op, model.shapes) for op in model.ops)
    return Estimate(mode, latency * 1e3, throughput, macs)


def _io_limited(model: QuantizedModel, device: DeviceProfile, throughput: float) -> float:
    """USB-attached devices cannot move more inputs per second than the link carries."""
    if not device.usb_transfer_bytes_per_s:
        return throughput
    io_bytes = sum(int(np.prod(spec.shape)) for spec in (*model.inputs, *model.outputs))
    return min(throughput, device.usb_transfer_bytes_per_s / max(io_bytes, 1))
