"""Backend pass 4, activation memory plan: arena offsets from live ranges, with reuse.

Every tensor that crosses a layer boundary lives in one DRAM arena from the layer that writes it
(model inputs: before the first layer) to the last layer that reads it (model outputs: to the end).
Buffers are placed largest first at the lowest 64-byte aligned offset that overlaps no buffer
whose live range intersects theirs (greedy by size, as TensorFlow Lite's arena planner does), so
tensors that are never live together share memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler_core.backend.fusion import Layer
from compiler_core.backend.layout import TensorLayout
from compiler_core.backend.tiling import align
from compiler_core.quantization.program import QuantizedModel


@dataclass(frozen=True)
class Buffer:
    """One arena buffer: its tensor, live range (layer indices, inclusive) and placement."""

    name: str
    first: int
    last: int
    offset: int
    size: int

    def overlaps(self, other: Buffer) -> bool:
        """Whether both are live at some layer and share arena bytes."""
        live = self.first <= other.last and other.first <= self.last
        return live and self.offset < other.offset + other.size and other.offset < self.offset + self.size


def live_ranges(model: QuantizedModel, layers: list[Layer]) -> dict[str, tuple[int, int]]:
    """``name -> (first layer, last layer)`` for every arena tensor."""
    end = len(layers)
    ranges = {spec.name: (-1, -1) for spec in model.inputs}
    for layer in layers:
        for name in layer.outputs:
            ranges[name] = (layer.index, layer.index)
        for name in layer.inputs:
            first, _ = ranges[name]
            ranges[name] = (first, max(ranges[name][1], layer.index))
    for spec in model.outputs:
        ranges[spec.name] = (ranges[spec.name][0], end)
    return ranges


def plan_memory(model: QuantizedModel, layers: list[Layer], layouts: dict[str, TensorLayout]) -> dict[str, Buffer]:
    """Place every arena tensor; returns ``name -> Buffer``."""
    return _place(live_ranges(model, layers), layouts, None)


def plan_resident(model: QuantizedModel, layers: list[Layer], layouts: dict[str, TensorLayout],
                  capacity: int, blocked: frozenset[int] | set[int] = frozenset()) -> dict[str, Buffer]:
    """Tensors kept in a core's SRAM region of ``capacity`` bytes instead of DRAM (one-core modes).

    Same planner, bounded: a tensor that finds no free range below ``capacity`` stays in DRAM.
    Model inputs and outputs always live in DRAM (the host writes and reads them there), and so
    does every tensor live during a ``blocked`` layer (one whose tiles take the whole SRAM).
    """
    interface = {spec.name for spec in (*model.inputs, *model.outputs)}
    ranges = {name: (first, last) for name, (first, last) in live_ranges(model, layers).items()
              if name not in interface and not any(first <= index <= last for index in blocked)}
    return _place(ranges, layouts, capacity)


def _place(ranges: dict[str, tuple[int, int]], layouts: dict[str, TensorLayout], capacity: int | None):
    order = sorted(ranges, key=lambda name: (-layouts[name].nbytes, ranges[name][0], name))
    placed: list[Buffer] = []
    for name in order:
        first, last = ranges[name]
        size = align(max(layouts[name].nbytes, 1))
        offset = 0
        for other in sorted((b for b in placed if b.first <= last and first <= b.last), key=lambda b: b.offset):
            if offset + size <= other.offset:
                break
            offset = max(offset, other.offset + other.size)
        if capacity is None or offset + size <= capacity:
            placed.append(Buffer(name, first, last, offset, size))
    return {buffer.name: buffer for buffer in sorted(placed, key=lambda b: (b.offset, b.name))}


def arena_size(buffers: dict[str, Buffer]) -> int:
    """Bytes of the arena (end of the highest buffer)."""
    return max((b.offset + b.size for b in buffers.values()), default=0)


def overlapping(buffers: dict[str, Buffer]) -> list[tuple[str, str]]:
    """Pairs of buffers live at the same time that share bytes (empty for a valid plan)."""
    items = sorted(buffers.values(), key=lambda b: b.offset)
    pairs = []
    for i, buffer in enumerate(items):
        for other in items[i + 1:]:
            if other.offset >= buffer.offset + buffer.size:
                break
            if buffer.overlaps(other):
                pairs.append((buffer.name, other.name))
    return pairs
