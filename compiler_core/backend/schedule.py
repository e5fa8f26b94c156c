"""Backend pass 5, schedule per core mode: tiles -> a command stream per core, with barriers.

For each layer and each core the stream is: the resident weights slice and LUTs (``DMA_W``,
``DMA_T``), then per tile the input bands (``DMA_IN``), the computation (``COMPUTE``) and the
output band (``DMA_OUT``), alternating between two SRAM buffer sets so that a tile's transfers
overlap its neighbour's computation. In ``global4``/``global8`` the cores of one inference split
each layer (row bands per core, or output channels when there are fewer rows than cores) and meet
at a barrier (``SYNC``) before the next layer reads the result; in ``multi`` four cores run four
inputs and each weight transfer is broadcast to them (the ``share`` field).

Commands are rows of :data:`FIELDS` unsigned 32-bit integers; docs/isa.md is the reference.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from compiler_core.backend.fusion import Layer
from compiler_core.backend.layout import NHWC, TensorLayout, native_nhwc
from compiler_core.backend.matmul import matmul_geometry
from compiler_core.backend.memplan import Buffer, plan_resident
from compiler_core.backend.tiling import (
    PER_CHANNEL_BYTES,
    LayerTiling,
    Tile,
    activation_bytes,
    align,
    channel_sliced,
    dense_over_width,
    input_rows,
    lut_bytes,
    tile_layer,
    weight_bytes,
    weight_channels,
)
from compiler_core.errors import DoesNotFitError
from compiler_core.quantization.program import QuantizedModel
from compiler_core.targets import CoreMode, DeviceProfile

logger = logging.getLogger(__name__)

DMA_IN, DMA_W, DMA_T, COMPUTE, DMA_OUT, SYNC = 1, 2, 3, 4, 5, 6
OPCODES = {DMA_IN: "DMA_IN", DMA_W: "DMA_W", DMA_T: "DMA_T", COMPUTE: "COMPUTE", DMA_OUT: "DMA_OUT", SYNC: "SYNC"}
FIELDS = ("opcode", "core", "layer", "tile", "slot", "a", "b", "c", "d", "sram", "flags", "share")
"""Command fields. DMA_IN/DMA_OUT: a = arena offset, b = bytes per run, c = runs, d = stride between
runs; DMA_W: a..b = output channels, c = weight bytes, d = per-channel parameter bytes; DMA_T: slot = table index, c = bytes;
COMPUTE: a..b = output rows, c..d = output channels. ``sram``: SRAM offset; ``flags`` bit 0: the
transfer transposes between NHWC storage and the kernel's NCHW order; ``share``: inputs that one
weight transfer serves."""
TRANSPOSE = 1
RESIDENT = 2
"""``flags`` bit 1: the DMA address ``a`` is in the core's SRAM (an SRAM-resident tensor), not the DRAM arena."""
RESIDENT_SHARE = 2
"""One-core modes keep activations in ``1 / RESIDENT_SHARE`` of the SRAM when every layer tiles in the rest."""


@dataclass
class ModeProgram:
    """The tile-level program of one core mode.

    Attributes:
        mode: the core mode.
        commands: ``[n, len(FIELDS)]`` uint32 command rows, in execution order per core.
        tilings: per layer, its tiling for this mode.
    """

    mode: CoreMode
    commands: np.ndarray
    tilings: list[LayerTiling] = field(default_factory=list)
    resident: dict[str, Buffer] = field(default_factory=dict)
    sram_base: int = 0
    sram_bytes: int = 0


def schedule_mode(model: QuantizedModel, layers: list[Layer], layouts: dict[str, TensorLayout],
                  buffers: dict[str, Buffer], device: DeviceProfile, mode: CoreMode,
                  resident: dict[str, Buffer] | None = None) -> ModeProgram:
    """Tile every layer for ``mode`` and emit its command stream.

    In one-core modes the upper ``1 / RESIDENT_SHARE`` of the SRAM holds the activations that fit
    there (``resident``, planned by :func:`~compiler_core.backend.memplan.plan_resident` unless
    given) and tiles use the rest. A layer that only tiles in the whole SRAM takes all of it: no
    tensor live during that layer is resident (it and its neighbours' tensors across it go to DRAM).
    """
    sram = device.sram_bytes_per_core
    if mode.cores_per_instance == 1:
        base = sram - sram // RESIDENT_SHARE
        tilings, wide = [], set()
        for layer in layers:
            try:
                tilings.append(tile_layer(model, layer, layouts, base, 1))
            except DoesNotFitError:
                tilings.append(tile_layer(model, layer, layouts, sram, 1))
                wide.add(layer.index)
        if wide:
            logger.info("%s: %d layer(s) need the whole SRAM; nothing is resident across them", mode.name, len(wide))
        if resident is None:
            resident = plan_resident(model, layers, layouts, sram - base, blocked=wide)
        return _emit(model, layers, layouts, buffers, mode, tilings, resident, base, sram)
    tilings = [tile_layer(model, layer, layouts, sram, mode.cores_per_instance) for layer in layers]
    return _emit(model, layers, layouts, buffers, mode, tilings, {}, sram, sram)


def _emit(model, layers, layouts, buffers, mode: CoreMode, tilings: list[LayerTiling],
          resident: dict[str, Buffer], base: int, sram: int) -> ModeProgram:
    rows: list[list[int]] = []
    cores = mode.cores_per_instance
    places = {name: (buffer.offset, 0) for name, buffer in buffers.items()}
    places.update({name: (base + buffer.offset, RESIDENT) for name, buffer in resident.items()})
    for layer, tiling in zip(layers, tilings):
        for core in sorted({tile.core for tile in tiling.tiles}):
            _emit_core(rows, model, layer, layouts, places, tiling, core, mode)
        if cores > 1:
            rows.extend([SYNC, core, layer.index, 0, 0, 0, 0, 0, 0, 0, 0, 0] for core in range(cores))
    commands = np.asarray(rows, dtype=np.uint32).reshape(-1, len(FIELDS))
    logger.debug("%s: %d commands, %d SRAM-resident tensors", mode.name, len(commands), len(resident))
    return ModeProgram(mode, commands, tilings, dict(resident), base, sram)


def _emit_core(rows: list[list[int]], model: QuantizedModel, layer: Layer, layouts: dict[str, TensorLayout],
               places: dict[str, tuple[int, int]], tiling: LayerTiling, core: int, mode: CoreMode) -> None:
    op = layer.main(model)
    tiles = [tile for tile in tiling.tiles if tile.core == core]
    flags = 0 if native_nhwc(op) else TRANSPOSE
    whole = dense_over_width(model, layer, layouts)
    luts = [array for index in layer.ops for array in model.ops[index].consts.values() if model.ops[index].kind == "lut"]
    tables_at = align(max(weight_bytes(op, t.c0, t.c1, whole=whole) for t in tiles))
    set_size = max(_set_bytes(model, layer, layouts, tiling.rows, t) for t in tiles)
    base = tables_at + lut_bytes(model, layer)
    offset = tables_at
    for slot, array in enumerate(luts):
        rows.append([DMA_T, core, layer.index, 0, slot, 0, 0, array.nbytes, 0, offset, 0, mode.batch])
        offset += align(array.nbytes)
    chunk = None
    for number, tile in enumerate(tiles):
        if op.kind == "linear" and weight_channels(op, tile.c0, tile.c1, whole=whole) != chunk:
            chunk = w0, w1 = weight_channels(op, tile.c0, tile.c1, whole=whole)
            data = op.consts["weight"]
            rows.append([DMA_W, core, layer.index, number, 0, w0, w1, data.nbytes // data.shape[0] * (w1 - w0),
                         PER_CHANNEL_BYTES * (w1 - w0), 0, 0, mode.batch])
        sram = base + (number % 2) * set_size
        for slot, name in enumerate(layer.inputs):
            arena_offset, run, runs, stride = _input_region(model, layer, layouts, places, tiling.rows, tile, slot)
            rows.append([DMA_IN, core, layer.index, number, slot, arena_offset, run, runs, stride, sram,
                         (flags if layouts[name].layout == NHWC else 0) | places[name][1], 1])
            sram += align(run * runs)
        rows.append([COMPUTE, core, layer.index, number, 0, tile.r0, tile.r1, tile.c0, tile.c1, base + (number % 2)
                     * set_size, 0, 1])
        for slot, name in enumerate(layer.outputs):
            arena_offset, run, runs, stride = _output_region(model, layer, layouts, places, tiling.rows, tile, name)
            rows.append([DMA_OUT, core, layer.index, number, slot, arena_offset, run, runs, stride, sram,
                         (flags if layouts[name].layout == NHWC else 0) | places[name][1], 1])
            sram += align(run * runs)


def _set_bytes(model: QuantizedModel, layer: Layer, layouts, rows: bool, tile: Tile) -> int:
    return activation_bytes(model, layer, layouts, rows, tile.r0, tile.r1, tile.c0, tile.c1)


def _matmul_region(model, layer, layouts, places, tile: Tile, slot: int, name: str) -> tuple[int, int, int, int] | None:
    """The region of A (slot 0), B (1) or Y (2) a MatMul tile moves, or None for another layer."""
    geometry = matmul_geometry(model, layer, layouts)
    if geometry is None:
        return None
    region = geometry.regions(tile.r0, tile.r1, tile.c0, tile.c1)[slot]
    return places[name][0] + region.offset, region.run, region.runs, region.stride


def _input_region(model, layer, layouts, places, rows: bool, tile: Tile, slot: int) -> tuple[int, int, int, int]:
    name = layer.inputs[slot]
    matmul = _matmul_region(model, layer, layouts, places, tile, slot, name)
    if matmul is not None:
        return matmul
    layout, (offset, _) = layouts[name], places[name]
    if not rows and channel_sliced(model, layer, layouts) and tile.c1 - tile.c0 < layout.shape[1]:
        item, channels = layout.itemsize, layout.shape[1]  # NHWC: the tile's channels of every pixel
        return offset + tile.c0 * item, (tile.c1 - tile.c0) * item, layout.nbytes // (channels * item), channels * item
    if not rows:
        return offset, layout.nbytes, 1, 0
    out = layouts[layer.outputs[0]]
    start, end, _, _ = input_rows(layer.main(model), tile.r0, tile.r1, layout.rows, out.rows)
    return offset + start * layout.row_bytes(), (end - start) * layout.row_bytes(), 1, 0


def _output_region(model, layer, layouts, places, rows: bool, tile: Tile, name: str) -> tuple[int, int, int, int]:
    matmul = _matmul_region(model, layer, layouts, places, tile, 2, name)
    if matmul is not None:
        return matmul
    layout, (offset, _) = layouts[name], places[name]
    if name != layer.outputs[0]:
        return offset, layout.nbytes, 1, 0
    channels = layout.shape[1] if layout.layout == NHWC else (layout.shape[-1] if layout.shape else 1)
    item = layout.itemsize
    if tile.c1 - tile.c0 >= channels:
        if rows:
            return offset + tile.r0 * layout.row_bytes(), (tile.r1 - tile.r0) * layout.row_bytes(), 1, 0
        return offset, layout.nbytes, 1, 0
    if layout.layout == NHWC:
        first, count = (tile.r0, tile.r1 - tile.r0) if rows else (0, layout.shape[2])
        pixels_before, pixels = first * layout.shape[3], count * layout.shape[3]
    elif rows:  # ONNX order: a row of the row axis holds row_bytes / (channels x itemsize) vectors of channels
        per_row = layout.row_bytes() // max(channels * item, 1)
        pixels_before, pixels = tile.r0 * per_row, (tile.r1 - tile.r0) * per_row
    else:
        pixels_before, pixels = 0, layout.nbytes // max(channels * item, 1)
    return (offset + (pixels_before * channels + tile.c0) * item, (tile.c1 - tile.c0) * item, pixels,
            channels * item)
