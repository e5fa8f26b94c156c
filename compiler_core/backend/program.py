"""Backend driver and serialisation: quantized op graph -> tile-level program per core mode (``qbtile-1``).

The passes run in order, each its own module: :mod:`fusion` -> :mod:`layout` -> :mod:`tiling`
(inside the schedule, per core mode) -> :mod:`memplan` -> :mod:`schedule`. The result is stored in
the MXQ beside the op graph: the JSON ``program`` section gets an ``npu`` object (layers, arena
placement, per-mode tiling summary) and the ``const`` section one ``npu.<mode>.commands`` array
per compiled core mode. docs/isa.md is the specification.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler_core.backend.fusion import Layer, fuse
from compiler_core.backend.layout import TensorLayout, assign_layouts, transposes
from compiler_core.backend.memplan import Buffer, arena_size, plan_memory
from compiler_core.backend.schedule import FIELDS, ModeProgram, schedule_mode
from compiler_core.backend.tiling import tile_layer
from compiler_core.errors import DoesNotFitError
from compiler_core.quantization.program import QuantizedModel
from compiler_core.targets import CORE_MODES, DeviceProfile

logger = logging.getLogger(__name__)

NPU_ENCODING = "qbtile-1"


@dataclass
class NpuProgram:
    """The lowered model: layers, arena placement and one command stream per core mode."""

    layers: list[Layer]
    layouts: dict[str, TensorLayout]
    buffers: dict[str, Buffer]
    modes: dict[str, ModeProgram]
    transposes: list[list[str]]

    @property
    def arena_bytes(self) -> int:
        """Size of the activation arena."""
        return arena_size(self.buffers)


def lower(model: QuantizedModel, device: DeviceProfile, modes: Sequence[str]) -> NpuProgram:
    """Run the backend passes for ``modes`` on ``device``.

    Raises:
        DoesNotFitError: a layer's smallest tile exceeds the core SRAM.
    """
    layers = fuse(model)
    layouts = assign_layouts(model, layers)
    return schedule(model, device, modes, layers, layouts, plan_memory(model, layers, layouts))


def check_tiles_fit(model: QuantizedModel, device: DeviceProfile) -> None:
    """Tile every layer for one core of ``device``, as :func:`lower` will: a layer whose smallest tile exceeds the
    core SRAM is found in seconds, right after quantization, not after the analysis (ISNet: 4 minutes later).

    Raises:
        DoesNotFitError: a layer's smallest tile exceeds the core SRAM.
    """
    failures = tile_failures(model, device)
    if failures:
        raise failures[0]


def tile_failures(model: QuantizedModel, device: DeviceProfile) -> list[DoesNotFitError]:
    """Tile every layer for one core of ``device``, as :func:`lower` will, and return the refusal of each layer whose
    smallest tile exceeds the core SRAM (in execution order; empty when every layer fits)."""
    layers = fuse(model)
    layouts = assign_layouts(model, layers)
    failures = []
    for layer in layers:
        try:
            tile_layer(model, layer, layouts, device.sram_bytes_per_core, 1)
        except DoesNotFitError as error:
            failures.append(error)
    return failures


def schedule(model: QuantizedModel, device: DeviceProfile, modes: Sequence[str], layers: list[Layer],
             layouts: dict[str, TensorLayout], buffers: dict[str, Buffer]) -> NpuProgram:
    """Tile and schedule every mode over a given memory plan (the last passes of :func:`lower`)."""
    programs = {mode: schedule_mode(model, layers, layouts, buffers, device, CORE_MODES[mode]) for mode in modes}
    return NpuProgram(layers, layouts, buffers, programs, [transposes(model, layer, layouts) for layer in layers])


def commands_name(mode: str) -> str:
    """Name of a mode's command array in the ``const`` section."""
    return f"npu.{mode}.commands"


def to_document(program: NpuProgram) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The ``npu`` object of the program section and the command arrays for the ``const`` section."""
    layers = [{"ops": layer.ops, "unit": layer.unit, "inputs": layer.inputs, "outputs": layer.outputs,
               "fused": layer.fused, "transposes": moved} for layer, moved in zip(program.layers, program.transposes)]
    tensors = {name: {**program.layouts[name].to_dict(), "offset": buffer.offset, "size": buffer.size,
                      "live": [buffer.first, buffer.last]} for name, buffer in program.buffers.items()}
    modes, consts = {}, {}
    for name, mode_program in program.modes.items():
        consts[commands_name(name)] = mode_program.commands.astype("<u4")
        modes[name] = {"commands": commands_name(name), "cores": mode_program.mode.cores_per_instance,
                       "batch": mode_program.mode.batch, "sram_base": mode_program.sram_base,
                       "sram_bytes": mode_program.sram_bytes,
                       "resident": {tensor: {"offset": buffer.offset, "size": buffer.size,
                                             "live": [buffer.first, buffer.last]}
                                    for tensor, buffer in mode_program.resident.items()},
                       "layers": [{"rows": t.rows, "split": t.split, "tiles": len(t.tiles), "sram": t.sram}
                                  for t in mode_program.tilings]}
    document = {"encoding": NPU_ENCODING, "fields": list(FIELDS), "layers": layers, "tensors": tensors,
                "arena_bytes": program.arena_bytes, "modes": modes}
    return document, consts


@dataclass
class DecodedProgram:
    """A ``qbtile-1`` object read back: what the tile simulator and the cost model execute."""

    layers: list[Layer]
    layouts: dict[str, TensorLayout]
    buffers: dict[str, Buffer]
    arena_bytes: int
    modes: dict[str, dict[str, Any]]
    commands: dict[str, np.ndarray]


def from_document(document: Mapping[str, Any], consts: Mapping[str, np.ndarray]) -> DecodedProgram:
    """Rebuild the program from the ``npu`` object (already validated by the MXQ reader)."""
    layers = [Layer(index, list(entry["ops"]), entry["unit"], list(entry["inputs"]), list(entry["outputs"]),
                    list(entry.get("fused", []))) for index, entry in enumerate(document["layers"])]
    layouts = {name: TensorLayout(name, tuple(entry["shape"]), entry["dtype"], entry["layout"])
               for name, entry in document["tensors"].items()}
    buffers = {name: Buffer(name, entry["live"][0], entry["live"][1], entry["offset"], entry["size"])
               for name, entry in document["tensors"].items()}
    commands = {mode: np.asarray(consts[entry["commands"]]).astype(np.int64) for mode, entry in document["modes"].items()}
    return DecodedProgram(layers, layouts, buffers, int(document["arena_bytes"]), dict(document["modes"]), commands)


def decode(program: NpuProgram) -> DecodedProgram:
    """The in-memory equivalent of writing and reading the program."""
    document, consts = to_document(program)
    return from_document(document, consts)
