"""Tile-level simulator: executes a ``qbtile-1`` command stream, every DMA and every tile, from the arena.

Activations exist only as bytes: model inputs are written into one DRAM arena at the offsets of
the memory plan; ``DMA_IN`` copies (2-D) regions of it into a core's SRAM, ``DMA_W``/``DMA_T``
copy the resident weight slice and LUTs from the constant store into SRAM, ``COMPUTE`` decodes
its input tiles and weights from SRAM, runs the integer kernels of the layer's operations on the
tile (the golden kernels of docs/numerics.md, with the convolution padding of a row band adjusted
to the band) and encodes the output tile into SRAM, and ``DMA_OUT`` scatters it into the arena.
The output codes are read back from the arena. A wrong plan (overlapping live buffers, a wrong
address, a missing halo row) therefore changes the codes; the tests compare them with the golden
executor. It is slow by design (it proves the program; the fast simulator runs inferences).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping

import numpy as np

from compiler_core.backend.fusion import POINTWISE_KINDS
from compiler_core.backend.layout import NHWC, TensorLayout, native_nhwc
from compiler_core.backend.matmul import MatmulGeometry, matmul_geometry
from compiler_core.backend.program import DecodedProgram
from compiler_core.backend.schedule import COMPUTE, DMA_IN, DMA_OUT, DMA_T, DMA_W, RESIDENT, SYNC, TRANSPOSE
from compiler_core.backend.tiling import align, channel_sliced, input_rows
from compiler_core.errors import ArgumentError
from compiler_core.quantization import kernels
from compiler_core.quantization.program import IntOp, QuantizedModel
from compiler_core.targets import DeviceProfile

logger = logging.getLogger(__name__)


class TileSimulator:
    """Runs one core mode's command stream on byte arrays standing for DRAM and the cores' SRAM."""

    def __init__(self, model: QuantizedModel, program: DecodedProgram, device: DeviceProfile, mode: str) -> None:
        if mode not in program.commands:
            raise ArgumentError(f"The program has no {mode} core mode (it has {', '.join(program.commands)}).")
        kernels.load_all()
        self.model, self.program, self.mode = model, program, mode
        self.commands = program.commands[mode]
        self.sram = [np.zeros(device.sram_bytes_per_core, dtype=np.uint8)
                     for _ in range(program.modes[mode]["cores"])]
        self.arena = np.zeros(program.arena_bytes, dtype=np.uint8)
        self.transfers = 0

    def run_codes(self, codes: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Input codes (batch 1, NCHW) -> output codes, computed through the arena."""
        self.arena[:] = 0
        for spec in self.model.inputs:
            self._store(spec.name, np.asarray(codes[spec.name]))
        slots: dict[int, dict] = {}
        for command in self.commands:
            self._step(command, slots)
        return {spec.name: self._load(spec.name) for spec in self.model.outputs}

    # -- arena ----------------------------------------------------------------------------------

    def _store(self, name: str, value: np.ndarray) -> None:
        layout, buffer = self.program.layouts[name], self.program.buffers[name]
        data = _encode(value, layout, nhwc=layout.layout == NHWC)
        self.arena[buffer.offset:buffer.offset + data.size] = data

    def _load(self, name: str) -> np.ndarray:
        layout, buffer = self.program.layouts[name], self.program.buffers[name]
        raw = self.arena[buffer.offset:buffer.offset + layout.nbytes]
        return _decode(raw, layout, layout.stored_shape, nhwc=layout.layout == NHWC)

    # -- commands -------------------------------------------------------------------------------

    def _step(self, command: np.ndarray, slots: dict[int, dict]) -> None:
        opcode, core, layer_index, _tile, slot, a, b, c, d, sram, flags, _share = (int(v) for v in command)
        state = slots.setdefault(core, {"inputs": {}, "tables": {}, "weights": None})
        memory = self.sram[core]
        layer = self.program.layers[layer_index]
        if opcode == DMA_IN:
            name = layer.inputs[slot]
            data = self._gather(memory if flags & RESIDENT else self.arena, a, b, c, d)
            if flags & TRANSPOSE:
                data = _transpose_bytes(data, self.program.layouts[name], to_logical=True)
            memory[sram:sram + data.size] = data
            state["inputs"][slot] = (sram, data.size, bool(flags & TRANSPOSE))
        elif opcode == DMA_W:
            weight = self.model.ops[layer.ops[0]].consts["weight"]
            data = np.ascontiguousarray(weight[a:b]).view(np.uint8).reshape(-1)
            memory[sram:sram + data.size] = data
            state["weights"] = (sram, a, b)
        elif opcode == DMA_T:
            key, array = self._tables(layer)[slot]
            data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
            memory[sram:sram + data.size] = data
            state["tables"][key] = (sram, array.dtype, array.shape)
        elif opcode == COMPUTE:
            self._compute(layer, state, memory, a, b, c, d, sram)
        elif opcode == DMA_OUT:
            name = layer.outputs[slot]
            size = b * c
            data = memory[sram:sram + size]
            if flags & TRANSPOSE:
                data = _transpose_bytes(data, self.program.layouts[name], to_logical=False)
            self._scatter(memory if flags & RESIDENT else self.arena, data, a, b, c, d)
        elif opcode != SYNC:
            raise ArgumentError(f"Unknown opcode {opcode} in the {self.mode} program.")
        self.transfers += opcode in (DMA_IN, DMA_OUT, DMA_W, DMA_T)

    @staticmethod
    def _gather(source: np.ndarray, offset: int, run: int, runs: int, stride: int) -> np.ndarray:
        """A (2-D) region of the arena or of an SRAM-resident tensor."""
        if runs == 1:
            return source[offset:offset + run].copy()
        index = offset + np.arange(runs)[:, None] * stride + np.arange(run)[None, :]
        return source[index].reshape(-1)

    @staticmethod
    def _scatter(target: np.ndarray, data: np.ndarray, offset: int, run: int, runs: int, stride: int) -> None:
        if runs == 1:
            target[offset:offset + run] = data[:run]
            return
        index = offset + np.arange(runs)[:, None] * stride + np.arange(run)[None, :]
        target[index.reshape(-1)] = data[:run * runs]

    def _tables(self, layer) -> list[tuple[tuple[int, str], np.ndarray]]:
        return [((index, key), array) for index in layer.ops for key, array in self.model.ops[index].consts.items()
                if self.model.ops[index].kind == "lut"]

    # -- compute --------------------------------------------------------------------------------

    def _compute(self, layer, state, memory, r0: int, r1: int, c0: int, c1: int, base: int) -> None:
        main = self.model.ops[layer.ops[0]]
        tiling = self.program.modes[self.mode]["layers"][layer.index]
        geometry = matmul_geometry(self.model, layer, self.program.layouts) if tiling["rows"] else None
        if geometry is not None:
            values = self._epilogue(layer, self._matmul_tile(main, geometry, state, memory, r0, r1), state, memory)
            self._write_outputs(layer, main, values, state, memory, base)
            return
        out_layout = self.program.layouts[layer.outputs[0]]
        inputs, pads, band = [], None, None
        sliced = channel_sliced(self.model, layer, self.program.layouts)
        for slot, name in enumerate(layer.inputs):
            offset, size, logical = state["inputs"][slot]
            layout = self.program.layouts[name]
            raw = memory[offset:offset + size]
            if tiling["rows"]:
                start, end, top, bottom = input_rows(main, r0, r1, layout.rows, out_layout.rows)
                pads, band = (top, bottom), (start, end)
                inputs.append(_decode(raw, layout, layout.tile_shape(end - start),
                                      nhwc=layout.layout == NHWC))
            elif sliced and not logical:  # the tile's channels of every pixel
                inputs.append(_decode(raw, layout, (*layout.stored_shape[:3], c1 - c0), nhwc=True))
            else:
                inputs.append(_decode(raw, layout, layout.shape if logical else layout.stored_shape,
                                      nhwc=layout.layout == NHWC and not logical))
        op = self._tile_op(main, state, memory, pads, c0, c1, out_layout, tiling["rows"])
        if tiling["rows"] and main.kind in POINTWISE_KINDS:
            op = _row_consts(main, out_layout, r0, r1)
        if tiling["rows"] and main.kind == "interpolate" and "weight2" in main.consts:
            op = _band_interpolation(main, r0, r1, *band)
        values = self._run(layer, _channel_tables(op, c0, c1, inputs), inputs, state, memory, (c0, c1))
        self._write_outputs(layer, main, values, state, memory, base)

    def _write_outputs(self, layer, main: IntOp, values, state, memory, base: int) -> None:
        """Encode the tile's outputs into SRAM after its input buffers (where ``DMA_OUT`` reads them)."""
        offset = base + sum(align(size) for _, size, _ in state["inputs"].values())
        for name, value in zip(layer.outputs, values):
            layout = self.program.layouts[name]
            data = _encode(np.asarray(value), layout, nhwc=layout.layout == NHWC and native_nhwc(main))
            memory[offset:offset + data.size] = data
            offset += align(data.size)
        state["inputs"] = {}

    def _tile_op(self, main: IntOp, state, memory, pads, c0: int, c1: int, out_layout: TensorLayout,
                 rows: bool) -> IntOp:
        if main.kind != "linear":
            return main
        op = copy.copy(main)
        op.attrs, op.consts = dict(main.attrs), dict(main.consts)
        if pads is not None and main.attrs.get("layout") in ("conv", "conv_transpose"):
            rank = len(main.attrs["kernel"])
            op.attrs["pads"] = [pads[0], *main.attrs["pads"][1:rank], pads[1], *main.attrs["pads"][rank + 1:]]
        offset, w0, w1 = state["weights"]
        weight = main.consts["weight"]
        count = w1 - w0
        nbytes = count * weight.nbytes // weight.shape[0]
        op.consts["weight"] = memory[offset:offset + nbytes].view(weight.dtype).reshape(count, *weight.shape[1:])
        channels = weight.shape[0]
        for key in ("bias", "multiplier", "shift"):
            if main.consts[key].shape[:1] == (channels,):
                op.consts[key] = main.consts[key][w0:w1]
        if np.ndim(main.attrs["zp_y"]):  # per output channel
            op.attrs["zp_y"] = main.attrs["zp_y"][w0:w1]
        return op

    def _matmul_tile(self, main: IntOp, geometry: MatmulGeometry, state, memory, r0: int, r1: int) -> list[np.ndarray]:
        """Rows ``[r0, r1)`` of a MatMul of activations from its tiles of A and B, one matrix of B at a time."""
        layouts = self.program.layouts
        (a_at, a_size, _), (b_at, b_size, _) = state["inputs"][0], state["inputs"][1]
        if geometry.channels_last:  # bands of every head, heads innermost: the kernel's batch is the channel axis
            a = _decode(memory[a_at:a_at + a_size], layouts[main.inputs[0]], (1, r1 - r0, geometry.k, -1), nhwc=True)
            b = _decode(memory[b_at:b_at + b_size], layouts[main.inputs[1]], (1, geometry.k, -1, geometry.batch),
                        nhwc=True)
            return kernels.KERNELS[main.kind](main, [a, b])
        first, last = geometry.batches(r0, r1)
        a = _decode(memory[a_at:a_at + a_size], layouts[main.inputs[0]], (r1 - r0, geometry.k), nhwc=False)
        b = _decode(memory[b_at:b_at + b_size], layouts[main.inputs[1]], (last - first, geometry.k, -1), nhwc=False)
        parts = []
        for matrix in range(first, last):
            lo, hi = max(r0, matrix * geometry.m) - r0, min(r1, (matrix + 1) * geometry.m) - r0
            parts.append(kernels.KERNELS[main.kind](main, [a[None, lo:hi], b[None, matrix - first]])[0][0])
        return [np.concatenate(parts)]

    def _run(self, layer, op: IntOp, inputs: list[np.ndarray], state, memory, channels=None) -> list[np.ndarray]:
        values = kernels.KERNELS[op.kind](op, _with_absent(self.model.ops[layer.ops[0]], inputs))
        return self._epilogue(layer, values, state, memory, channels)

    def _epilogue(self, layer, values: list[np.ndarray], state, memory, channels=None) -> list[np.ndarray]:
        """The fused point-wise operations behind the main one, with their LUTs read from SRAM."""
        for index in layer.ops[1:]:
            epilogue = self.model.ops[index]
            tables = {key: _table(memory, *state["tables"][(index, key)]) for key in epilogue.consts
                      if (index, key) in state["tables"]}
            if tables:
                epilogue = copy.copy(epilogue)
                epilogue.consts = {**epilogue.consts, **tables}
            if channels is not None:
                epilogue = _channel_tables(epilogue, *channels, values)
            values = kernels.KERNELS[epilogue.kind](epilogue, list(values))
        return values


def _channel_tables(op: IntOp, c0: int, c1: int, inputs: list) -> IntOp:
    """A per-channel look-up table (``[C, codes]``) cut to the tile's channels ``[c0, c1)`` when the tile holds
    only those channels (channel-sliced layers)."""
    table = op.consts.get("table") if op.kind == "lut" else None
    if table is None or table.ndim != 2 or not inputs or inputs[0] is None or inputs[0].shape[1] == table.shape[0]:
        return op
    sliced = copy.copy(op)
    sliced.consts = {**op.consts, "table": table[c0:c1]}
    return sliced


def _band_interpolation(op: IntOp, r0: int, r1: int, start: int, end: int) -> IntOp:
    """A linear Resize on a band: output rows ``[r0, r1)`` of its H matrix, over the input rows ``[start, end)``
    the band reads (every weight outside them is zero, so the sums and their one rounding are the whole op's)."""
    band = copy.copy(op)
    band.consts = {**op.consts, "weight2": op.consts["weight2"][r0:r1, start:end]}
    return band


def _row_consts(op: IntOp, out_layout: TensorLayout, r0: int, r1: int) -> IntOp:
    """The operation with its row-sized constants (an attention mask) cut to the tile's rows ``[r0, r1)``."""
    trailing = len(out_layout.shape) - out_layout.row_axis  # axes from the row axis to the end
    consts = {key: array[(Ellipsis, slice(r0, r1)) + (slice(None),) * (trailing - 1)]
              if array.ndim >= trailing and array.shape[array.ndim - trailing] == out_layout.rows > 1 else array
              for key, array in op.consts.items()}
    if all(consts[key] is op.consts[key] for key in consts):
        return op
    sliced = copy.copy(op)
    sliced.consts = consts
    return sliced


def _with_absent(op: IntOp, inputs: list[np.ndarray]) -> list:
    """Re-insert ``None`` for the operation's absent optional inputs."""
    present = iter(inputs)
    return [next(present) if name else None for name in op.inputs]


def _table(memory: np.ndarray, offset: int, dtype: np.dtype, shape: tuple) -> np.ndarray:
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return memory[offset:offset + size].view(dtype).reshape(shape)


def _encode(value: np.ndarray, layout: TensorLayout, *, nhwc: bool) -> np.ndarray:
    stored = value.astype(layout.dtype)
    if nhwc:
        stored = stored.transpose(0, 2, 3, 1)
    return np.ascontiguousarray(stored).view(np.uint8).reshape(-1)


def _decode(raw: np.ndarray, layout: TensorLayout, shape, *, nhwc: bool) -> np.ndarray:
    """Stored bytes -> values as the golden executor holds them (int64 codes; bool and float values as they are)."""
    array = np.ascontiguousarray(raw).view(layout.dtype).reshape(shape)
    array = array.transpose(0, 3, 1, 2) if nhwc else array
    return array.astype(np.int64) if array.dtype.kind in "iu" else array


def _transpose_bytes(data: np.ndarray, layout: TensorLayout, *, to_logical: bool) -> np.ndarray:
    """NHWC bytes -> NCHW bytes (``to_logical``) or back: what a transposing DMA does."""
    array = np.ascontiguousarray(data).view(layout.dtype)
    n, _, h, w = layout.shape
    c = array.size // max(n * h * w, 1)  # a tile of output channels moves only its channels
    moved = array.reshape(n, h, w, c).transpose(0, 3, 1, 2) if to_logical else array.reshape(n, c, h, w).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(moved).view(np.uint8).reshape(-1)


def run_tiles(model: QuantizedModel, program: DecodedProgram, device: DeviceProfile, mode: str,
              codes: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Output codes of ``mode``'s tile-level program for input codes (see :class:`TileSimulator`)."""
    return TileSimulator(model, program, device, mode).run_codes(codes)
