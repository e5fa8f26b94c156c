"""Fast steps for Softmax, Layer/Group/Instance normalization, exact to the golden integer routines.

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
    """``min(rdiv(EXP[min(max - x, last)] * K, sum), qmax)`` with the table gathered once per element."""
    table = op.consts["exp_table"].astype(np.float64)
    shape = context.shape(op.inputs[0])
    axis, qmax = op.attrs["axis"], float(op.attrs["qmax"])
    multiplier = float(op.attrs["qmax"] << op.attrs.get("shift", 0))
    if shape is None or 2 * table.max(initial=0) * multiplier + shape[axis] * table.max(initial=0) >= FLOAT64_EXACT:
        return None
    extended = np.append(table, 0.0)  # distances past the table read 0
    last = float(table.size)
    masked = op.attrs.get("masked_code")

    def run(inputs: list) -> list:
        x = inputs[0]
        distance = np.minimum(x.max(axis=axis, keepdims=True) - x, last)
        if masked is not None:  # masked entries read the 0 past the table; a row of only masked ones is uniform
            hidden = x == masked
            distance = np.where(hidden, last, distance)
            distance = np.where(hidden.all(axis=axis, keepdims=True), 0.0, distance)
        exp = np.take(extended, distance.astype(np.intp))
        total = np.maximum(exp.sum(axis=axis, keepdims=True), 1.0)
        return [np.minimum(np.floor((2 * multiplier * exp + total) / (2 * total)), qmax).astype(np.float32)]

    return Step(run, batch_safe=axis != 0, method="softmax")


@register_fast("layernorm")
def build_layer_norm(op: IntOp, context: PlanContext) -> Step | None:
    """Row statistics in exact int64 (small), per-element division and requantization in float64."""
    attrs = op.attrs
    shape = context.shape(op.inputs[0])
    if shape is None or attrs["axis"] == 0:
        return None
    axis = attrs["axis"]
    count = int(np.prod(shape[axis:]))
    scaling = _ScaleAndOffset.build(op, context, op.consts["multiplier"], op.consts["offset"])
    if scaling is None:
        return None

    def run(inputs: list) -> list:
        x = inputs[0]
        rows = np.subtract(x, attrs["zp_x"], dtype=np.float64).reshape(*x.shape[:axis], count).astype(np.int64)
        return [scaling(_normalized(rows, attrs["epsilon_term"])).reshape(x.shape)]  # per-element over the rows

    return Step(run, method=f"layernorm/{scaling.requant.method}")


@register_fast("groupnorm")
def build_group_norm(op: IntOp, context: PlanContext) -> Step | None:
    """Statistics per (sample, group) as LayerNormalization's, then a per-channel scale and offset."""
    attrs, consts = op.attrs, op.consts
    shape = context.shape(op.inputs[0])
    if shape is None:
        return None
    channel = [1, -1] + [1] * (len(shape) - 2)
    scaling = _ScaleAndOffset.build(op, context, consts["multiplier"].reshape(channel),
                                    consts["offset"].reshape(channel), consts["shift"].reshape(channel))
    if scaling is None:
        return None

    def run(inputs: list) -> list:
        x = inputs[0]
        rows = np.subtract(x, attrs["zp_x"], dtype=np.float64).reshape(x.shape[0], attrs["groups"], -1).astype(np.int64)
        return [scaling(_normalized(rows, attrs["epsilon_term"]).reshape(x.shape))]

    return Step(run, method=f"groupnorm/{scaling.requant.method}")


class _ScaleAndOffset:
    """``clamp(requantize(n, M, S) + offset + zp_y)`` of normalized Q.F values, exact in float64."""

    def __init__(self, requant: Requantizer, offset: np.ndarray, clamp: tuple[int, int]) -> None:
        self.requant, self.offset, (self.low, self.high) = requant, offset, clamp

    @classmethod
    def build(cls, op: IntOp, context: PlanContext, multiplier: np.ndarray, offset: np.ndarray,
              shift: np.ndarray | None = None) -> _ScaleAndOffset | None:
        """``None`` when the normalized values or the offsets leave the exact float ranges."""
        attrs = op.attrs
        span = context.span(op.inputs[0], attrs["zp_x"])
        if span is None:
            return None
        centred_bound = 2 * span << MEAN_BITS
        if (2 * centred_bound << FRACTION_BITS) + 1 >= FLOAT64_EXACT:
            return None
        # the offset joins the requantized value before the clamp: requantize unclamped, then add and clamp
        wide = (-(1 << 62), 1 << 62)
        shift = op.consts["shift"] if shift is None else shift
        requant = Requantizer(multiplier, shift, None, 0, wide, centred_bound << FRACTION_BITS)
        if requant.method == "exact" or np.abs(offset).max(initial=0) + abs(attrs["zp_y"]) >= 1 << 22:
            return None  # float32 requantized values are exact below 2**24 and saturate the clamp beyond it
        return cls(requant, offset.astype(np.float64) + attrs["zp_y"], attrs["clamp"])

    def __call__(self, normalized: np.ndarray) -> np.ndarray:
        y = self.requant(normalized).astype(np.float64) + self.offset
        return np.clip(y, self.low, self.high).astype(np.float32)


def _normalized(rows: np.ndarray, epsilon_term: int) -> np.ndarray:
    """The golden normalization routine over the last axis of int64 centred codes, as exact float64 Q.F values."""
    count = rows.shape[-1]
    mean = _int_rdiv(rows.sum(axis=-1, keepdims=True) << MEAN_BITS, count)
    centred = (rows << MEAN_BITS) - mean
    variance = _int_rdiv((centred * centred).sum(axis=-1, keepdims=True), count)
    deviation = np.maximum(integer_sqrt(variance + epsilon_term), 1).astype(np.float64)
    return rounding_divide(centred.astype(np.float64) * (1 << FRACTION_BITS), deviation)


def _int_rdiv(numerator: np.ndarray, denominator: int) -> np.ndarray:
    return np.sign(numerator) * ((2 * np.abs(numerator) + denominator) // (2 * denominator))
