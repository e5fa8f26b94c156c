"""Load-time checks of a ``qbtile-1`` program (the ``npu`` object of the MXQ program section).

The MXQ reader calls :func:`npu_problem` after the op graph is validated, so a file whose CRCs
are valid but whose tile program was tampered with (a command out of range, a DMA outside the
arena, overlapping live buffers in the memory plan) is rejected at load, never executed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from compiler_core.backend.fusion import DMA, MAC, MFU, VECTOR
from compiler_core.backend.layout import NHWC, PLAIN
from compiler_core.backend.memplan import Buffer, overlapping
from compiler_core.backend.schedule import DMA_IN, DMA_OUT, FIELDS, OPCODES, RESIDENT
from compiler_core.targets import CORE_MODES

ENCODING = "qbtile-1"
UNITS = (MAC, MFU, VECTOR, DMA)
_DTYPES = {"int8", "uint8", "int16", "int32", "int64", "bool", "float32"}


def npu_problem(npu: Any, consts: Mapping[str, np.ndarray], op_count: int) -> str | None:
    """What is wrong with the ``npu`` object, or ``None`` when it is sound.

    The document comes from a file: a field of an unexpected JSON type anywhere (a list where a name
    belongs, null where a list belongs) is a problem of the file, reported as such.
    """
    try:
        return _npu_problem(npu, consts, op_count)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as error:
        return f"the tile program is malformed ({type(error).__name__}: {error})"


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _npu_problem(npu: Any, consts: Mapping[str, np.ndarray], op_count: int) -> str | None:
    if not isinstance(npu, Mapping) or npu.get("encoding") != ENCODING:
        return f"the tile program's encoding must be {ENCODING!r}"
    if list(npu.get("fields", [])) != list(FIELDS):
        return "the tile program's command fields are not those of qbtile-1"
    arena = npu.get("arena_bytes")
    layers, tensors, modes = npu.get("layers"), npu.get("tensors"), npu.get("modes")
    if not (isinstance(arena, int) and arena >= 0 and isinstance(layers, list) and isinstance(tensors, Mapping)
            and isinstance(modes, Mapping)):
        return "the tile program needs 'arena_bytes', 'layers', 'tensors' and 'modes'"
    return (_tensors_problem(tensors, arena) or _layers_problem(layers, tensors, op_count)
            or _modes_problem(modes, consts, layers, tensors, arena))


def _tensors_problem(tensors: Mapping[str, Any], arena: int) -> str | None:
    buffers = {}
    for name, entry in tensors.items():
        try:
            shape, dtype, layout = entry["shape"], entry["dtype"], entry["layout"]
            offset, size, (first, last) = entry["offset"], entry["size"], entry["live"]
        except (KeyError, TypeError, ValueError):
            return f"arena tensor {name!r} lacks shape, dtype, layout, offset, size or live range"
        numbers = [offset, size, first, last, *shape] if isinstance(shape, list) else None
        if numbers is None or not all(isinstance(v, int) and not isinstance(v, bool) for v in numbers):
            return f"arena tensor {name!r} has non-integer placement or shape"
        if dtype not in _DTYPES or layout not in (NHWC, PLAIN) or (layout == NHWC and len(shape) != 4):
            return f"arena tensor {name!r} has an unknown element type or layout"
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if offset < 0 or offset % 64 or size < nbytes or offset + size > arena or first > last:
            return f"arena tensor {name!r} is placed outside the arena or misaligned"
        buffers[name] = Buffer(name, first, last, offset, size)
    clashes = overlapping(buffers)
    if clashes:
        return f"the memory plan overlaps live buffers {clashes[0][0]!r} and {clashes[0][1]!r}"
    return None


def _layers_problem(layers: list, tensors: Mapping[str, Any], op_count: int) -> str | None:
    covered = []
    for index, layer in enumerate(layers):
        if not isinstance(layer, Mapping) or not isinstance(layer.get("ops"), list) or not layer["ops"]:
            return f"tile-program layer {index} has no operations"
        if not (_names(layer.get("inputs", [])) and _names(layer.get("outputs")) and _names(layer.get("fused", []))):
            return f"tile-program layer {index} does not list its input, output and fused tensors by name"
        if layer.get("unit") not in UNITS or not all(isinstance(op, int) and not isinstance(op, bool)
                                                     for op in layer["ops"]):
            return f"tile-program layer {index} names an unknown unit or a non-integer operation"
        covered.extend(layer["ops"])
        names = [*layer.get("inputs", []), *layer.get("outputs", [])]
        if not layer.get("outputs") or any(name not in tensors for name in names):
            return f"tile-program layer {index} reads or writes a tensor that is not in the arena"
    if covered != list(range(op_count)):
        return "the tile-program layers do not cover the operations once each, in order"
    return None


def _resident_problem(mode: str, entry: Mapping[str, Any], tensors: Mapping[str, Any]) -> str | None:
    """SRAM-resident tensors: inside the region above ``sram_base``, not overlapping while live."""
    base, sram, resident = entry.get("sram_base"), entry.get("sram_bytes"), entry.get("resident")
    if not (isinstance(base, int) and isinstance(sram, int) and 0 <= base <= sram and isinstance(resident, Mapping)):
        return f"the {mode} tile program lacks its SRAM layout"
    buffers = {}
    for name, item in resident.items():
        try:
            offset, size, (first, last) = item["offset"], item["size"], item["live"]
        except (KeyError, TypeError, ValueError):
            return f"the {mode} SRAM-resident tensor {name!r} lacks offset, size or live range"
        if name not in tensors or not all(isinstance(v, int) for v in (offset, size, first, last)):
            return f"the {mode} SRAM-resident tensor {name!r} is not an arena tensor"
        if offset < 0 or offset % 64 or size < tensors[name]["size"] - 63 or base + offset + size > sram:
            return f"the {mode} SRAM-resident tensor {name!r} lies outside the SRAM region"
        buffers[name] = Buffer(name, first, last, offset, size)
    clashes = overlapping(buffers)
    if clashes:
        return f"the {mode} SRAM plan overlaps live buffers {clashes[0][0]!r} and {clashes[0][1]!r}"
    return None


def _modes_problem(modes: Mapping[str, Any], consts: Mapping[str, np.ndarray], layers: list,
                   tensors: Mapping[str, Any], arena: int) -> str | None:
    for mode, entry in modes.items():
        if mode not in CORE_MODES or not isinstance(entry, Mapping):
            return f"the tile program has an unknown core mode {mode!r}"
        commands = consts.get(entry.get("commands", ""))
        if commands is None or commands.dtype != np.dtype("<u4") or commands.ndim != 2 or commands.shape[1] != len(FIELDS):
            return f"the {mode} command stream is missing or not a [n, {len(FIELDS)}] uint32 array"
        if entry.get("cores") != CORE_MODES[mode].cores_per_instance or len(entry.get("layers", [])) != len(layers):
            return f"the {mode} tile program does not match its core mode or layer list"
        problem = _resident_problem(mode, entry, tensors)
        if problem:
            return problem
        problem = _commands_problem(mode, commands.astype(np.int64), layers, entry, arena)
        if problem:
            return problem
    return None


def _commands_problem(mode: str, commands: np.ndarray, layers: list, entry: Mapping[str, Any], arena: int) -> str | None:
    if commands.size == 0:
        return f"the {mode} command stream is empty"
    opcode, core, layer = commands[:, 0], commands[:, 1], commands[:, 2]
    bad = ~np.isin(opcode, list(OPCODES)) | (core >= entry["cores"]) | (layer >= len(layers))
    if bad.any():
        return f"the {mode} command {int(np.argmax(bad))} has an unknown opcode, core or layer"
    dma = np.isin(opcode, (DMA_IN, DMA_OUT))
    offset, run, runs, stride = commands[:, 5], commands[:, 6], commands[:, 7], commands[:, 8]
    end = offset + np.maximum(runs - 1, 0) * stride + run
    resident = (commands[:, 10] & RESIDENT) != 0
    outside = dma & ((runs < 1) | np.where(resident, (offset < entry["sram_base"]) | (end > entry["sram_bytes"]),
                                           end > arena))
    if outside.any():
        return f"the {mode} command {int(np.argmax(outside))} transfers outside the activation arena or SRAM region"
    spill = dma & (commands[:, 9] + run * runs > entry["sram_base"]) & _resident_live(entry, len(layers))[layer]
    if spill.any():
        return f"the {mode} command {int(np.argmax(spill))} puts a tile into the SRAM-resident region"
    for index in np.flatnonzero(dma):
        key = "inputs" if opcode[index] == DMA_IN else "outputs"
        if commands[index, 4] >= len(layers[layer[index]].get(key, [])):
            return f"the {mode} command {int(index)} names a tensor slot its layer does not have"
    return None


def _resident_live(entry: Mapping[str, Any], count: int) -> np.ndarray:
    """Per layer, whether some SRAM-resident tensor is live (then no tile may reach above ``sram_base``)."""
    live = np.zeros(count, dtype=bool)
    for item in entry["resident"].values():
        first, last = item["live"]
        live[max(first, 0):min(last, count - 1) + 1] = True
    return live
