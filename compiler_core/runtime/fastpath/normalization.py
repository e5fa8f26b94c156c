"""Fast steps for Softmax and LayerNormalization, exact to the golden integer routines.

Integer divisions ``rdiv(n, d)`` become ``floor((2|n| + d) / (2d))`` in float64: for integers below
``2**53`` the correctly rounded quotient never crosses an integer the exact quotient does not reach
(its error is below ``1/(2d)``), so the floor is exact.
"""

from __future__ import annotations

import numpy as np

from compiler_core.quantization.fixedpoint import integer_sqrt
from compiler_core.quantization.kernels.normalization import FRACTION_BITS, MEAN_BITS
from compiler_core.quantization.program import IntOp
from compiler_core.runtime.fastpath.plan import PlanContext, Step, register_fast
from compiler_core.runtime.fastpath.requant import FLOAT64_EXACT, Requantizer


def rounding_divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """``sign(n) * floor((2|n| + d) / (2d))`` for exact float64 integers with ``2|n| + d < 2**53``, ``d > 0``."""
    magnitude = np.floor((2 * np.abs(numerator) + denominator) / (2 * denominator))
    return np.copysign(magnitude, numerator)


@register_fast("softmax")
def build_softmax(op: IntOp, context: PlanContext) -> Step | None:
    """``rdiv(EXP[min(max - x, last)] * Q, sum)`` with the table gathered once per element."""
    table = op.consts["exp_table"].astype(np.float64)
    shape = context.shape(op.inputs[0])
    axis, qmax = op.attrs["axis"], float(op.attrs["qmax"])
    if shape is None or 2 * table.max(initial=0) * qmax + shape[axis] * table.max(initial=0) >= FLOAT64_EXACT:
        return None
    extended = np.append(table, 0.0)  # distances past the table read 0
    last = float(table.size)

    def run(inputs: list) -> list:
        x = inputs[0]
        distance = np.minimum(x.max(axis=axis, keepdims=True) - x, last)
        exp = np.take(extended, distance.astype(np.intp))
        total = exp.sum(axis=axis, keepdims=True)
        return [np.floor((2 * qmax * exp + total) / (2 * total)).astype(np.float32)]

    return Step(run, batch_safe=axis != 0, method="softmax")


@register_fast("layernorm")
def build_layer_norm(op: IntOp, context: PlanContext) -> Step | None:
    """Row statistics in exact int64 (small), per-element division and requantization in float64."""
    attrs, consts = op.attrs, op.consts
    span, shape = context.span(op.inputs[0], attrs["zp_x"]), context.shape(op.inputs[0])
    if span is None or shape is None or attrs["axis"] == 0:
        return None
    count = int(np.prod(shape[attrs["axis"]:]))
    centred_bound = 2 * span << MEAN_BITS
    if (2 * centred_bound << FRACTION_BITS) + 1 >= FLOAT64_EXACT:
        return None
    # the offset joins the requantized value before the clamp: requantize unclamped, then add and clamp
    wide = (-(1 << 62), 1 << 62)
    requant = Requantizer(consts["multiplier"], consts["shift"], None, 0, wide, centred_bound << FRACTION_BITS)
    if requant.method == "exact" or np.abs(consts["offset"]).max(initial=0) + abs(attrs["zp_y"]) >= 1 << 22:
        return None  # float32 requantized values are exact below 2**24 and saturate the clamp beyond it
    offset = consts["offset"].astype(np.float64) + attrs["zp_y"]
    low, high = attrs["clamp"]
    axis, epsilon = attrs["axis"], attrs["epsilon_term"]

    def run(inputs: list) -> list:
        x = inputs[0]
        rows = np.subtract(x, attrs["zp_x"], dtype=np.float64).reshape(*x.shape[:axis], count).astype(np.int64)
        mean = _int_rdiv(rows.sum(axis=-1, keepdims=True) << MEAN_BITS, count)
        centred = (rows << MEAN_BITS) - mean
        variance = _int_rdiv((centred * centred).sum(axis=-1, keepdims=True), count)
        deviation = np.maximum(integer_sqrt(variance + epsilon), 1).astype(np.float64)
        normalized = rounding_divide(centred.astype(np.float64) * (1 << FRACTION_BITS), deviation)
        y = requant(normalized).astype(np.float64) + offset
        return [np.clip(y, low, high).astype(np.float32).reshape(x.shape)]

    return Step(run, method=f"layernorm/{requant.method}")


def _int_rdiv(numerator: np.ndarray, denominator: int) -> np.ndarray:
    return np.sign(numerator) * ((2 * np.abs(numerator) + denominator) // (2 * denominator))
