"""Fast steps for data movement on codes: reshapes and transposes in numpy.

Reshape, Flatten, Squeeze, Unsqueeze and Identity only change the shape, which is static in the
model: the step reshapes to the recorded output shape (with the run's batch size in front).
Transpose permutes axes. The gathers (nearest Resize, Slice, Pad, Gather by constant indices, Tile,
Expand, Split, DepthToSpace, SpaceToDepth) take each output code from a position that does not
depend on the data: the plan runs the golden kernel once on position numbers to learn the map, checks
the map against the golden kernel on random codes, and the step is one ``np.take`` per sample.
Every other ``move`` op type keeps the golden kernel (``onnx.reference``).
"""

from __future__ import annotations

import numpy as np

from compiler_core.quantization.kernels.movement import run_onnx
from compiler_core.quantization.program import IntOp
from compiler_core.runtime.fastpath.plan import PlanContext, Step, register_fast

RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
GATHERS = ("Resize", "Slice", "Pad", "Gather", "Tile", "Expand", "Split", "DepthToSpace", "SpaceToDepth")
_POSITION_OFFSET = 1 << 20  # position numbers start here: never equal to a code (at most 16 bits)


@register_fast("move")
def build_move(op: IntOp, context: PlanContext) -> Step | None:
    """Reshape-like ops and Transpose; ``None`` (golden) for the rest."""
    if op.op_type in GATHERS:
        return _gather_step(op, context)
    if len(op.outputs) != 1:
        return None
    if op.op_type in RESHAPES:
        return _reshape_step(op, context)
    if op.op_type == "Transpose":
        return _transpose_step(op, context)
    return None


def _gather_step(op: IntOp, context: PlanContext) -> Step | None:
    """One ``np.take`` per output with a position map learnt from the golden kernel (a fill slot for Pad)."""
    shape = context.shape(op.inputs[0])
    shapes_out = [context.shape(name) for name in op.outputs]
    params = context.params(op.inputs[0])
    runtime_inputs = [name for index, name in enumerate(op.inputs) if name and f"input{index}" not in op.consts]
    if shape is None or params is None or runtime_inputs != [op.inputs[0]] or shape[0] != 1 \
            or any(out is None or out[0] != 1 for out in shapes_out):
        return None
    size = int(np.prod(shape))
    if size + _POSITION_OFFSET >= 1 << 24:  # position numbers must stay exact even if evaluated in float32
        return None
    positions = np.arange(_POSITION_OFFSET, _POSITION_OFFSET + size, dtype=np.int64).reshape(shape)
    maps = [_position_map(np.asarray(result), size) for result in _golden(op, positions)]
    if any(index_map is None for index_map in maps) or not _reproduces_golden(op, params, shape, maps):
        return None
    tails = [tuple(out[1:]) for out in shapes_out]
    needs_fill = any(bool((index_map == size).any()) for index_map in maps)
    fill_code = float(np.asarray(op.consts.get("input2", 0)).reshape(-1)[0]) if needs_fill else 0.0

    def run(inputs: list) -> list:
        flat = inputs[0].reshape(inputs[0].shape[0], -1)
        if needs_fill:
            flat = np.concatenate([flat, np.full((flat.shape[0], 1), fill_code, dtype=flat.dtype)], axis=1)
        return [np.take(flat, index_map, axis=1).reshape(flat.shape[0], *tail) for index_map, tail in zip(maps, tails)]

    return Step(run, method=f"move/gather/{op.op_type}")


def _golden(op: IntOp, data: np.ndarray) -> list:
    inputs = [data if index == 0 else None for index in range(len(op.inputs))]
    return run_onnx(op, inputs)


def _position_map(result: np.ndarray, size: int) -> np.ndarray | None:
    """Flat input position of every output element; ``size`` (the fill slot) where the op wrote its constant."""
    positions = result.reshape(-1) - _POSITION_OFFSET
    filled = positions < 0
    if np.any(positions >= size) or (filled.any() and not np.all(positions[filled] + _POSITION_OFFSET < (1 << 17))):
        return None
    return np.where(filled, size, positions).astype(np.intp)


def _reproduces_golden(op: IntOp, params, shape: list[int], maps: list[np.ndarray]) -> bool:
    """The maps give the golden kernel's codes on random codes (and the constant where the op fills)."""
    codes = np.random.default_rng(0).integers(params.qmin, params.qmax + 1, shape, dtype=np.int64)
    fill = np.asarray(op.consts.get("input2", 0)).reshape(-1)[:1]
    table = np.concatenate([codes.reshape(-1), fill.astype(np.int64)])
    return all(np.array_equal(np.take(table, index_map), np.asarray(golden).reshape(-1))
               for index_map, golden in zip(maps, _golden(op, codes)))


def _reshape_step(op: IntOp, context: PlanContext) -> Step | None:
    shape_in, shape_out = context.shape(op.inputs[0]), context.shape(op.outputs[0])
    if not shape_in or not shape_out or int(np.prod(shape_in)) != int(np.prod(shape_out)):
        return None
    batched = shape_in[0] == 1 and shape_out[0] == 1
    tail = tuple(shape_out[1:])

    def run(inputs: list) -> list:
        value = inputs[0]
        return [value.reshape((value.shape[0], *tail) if batched else shape_out)]

    return Step(run, batch_safe=batched, method="move/reshape")


def _transpose_step(op: IntOp, context: PlanContext) -> Step | None:
    shape = context.shape(op.inputs[0])
    if shape is None:
        return None
    perm = op.attrs["attributes"].get("perm") or list(reversed(range(len(shape))))
    perm = [int(axis) % len(shape) for axis in perm]
    return Step(lambda inputs: [np.transpose(inputs[0], perm)], batch_safe=perm[0] == 0, method="move/transpose")
