"""Fast steps for data movement on codes: reshapes and transposes in numpy.

Reshape, Flatten, Squeeze, Unsqueeze and Identity only change the shape, which is static in the
model: the step reshapes to the recorded output shape (with the run's batch size in front).
Transpose permutes axes. Every other ``move`` op type keeps the golden kernel (``onnx.reference``).
"""

from __future__ import annotations

import numpy as np

from compiler_core.quantization.program import IntOp
from compiler_core.runtime.fastpath.plan import PlanContext, Step, register_fast

RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


@register_fast("move")
def build_move(op: IntOp, context: PlanContext) -> Step | None:
    """Reshape-like ops and Transpose; ``None`` (golden) for the rest."""
    if len(op.outputs) != 1:
        return None
    if op.op_type in RESHAPES:
        return _reshape_step(op, context)
    if op.op_type == "Transpose":
        return _transpose_step(op, context)
    return None


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
