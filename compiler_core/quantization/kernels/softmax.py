"""Integer Softmax (docs/numerics.md, "Softmax").

``d = max(x) - x`` per row (integer codes), ``e = EXP[min(d, last)]`` with
``EXP[d] = round(2**20 * exp(-d * s_x))``, ``y = min(round_half_away(e * K / sum(e)), qmax)`` with
``K = qmax * 2**shift``: the output scale is ``1/K``, the zero point 0. ``shift`` is the largest
power of two (up to :data:`MAX_SHIFT`) by which the calibrated maximum probability can be scaled
and stay at most 1, so a 1,000-class output whose probabilities stay near 0.001 keeps its
resolution instead of rounding to 0 with a fixed ``1/qmax`` step.

A masked input (``Where(mask, x, -3.4e38)`` or ``x + mask`` with a -inf-like mask, constant or computed at
run time from an ``attention_mask`` input) keeps the data's scale and saturates the masked entries to the
smallest code ``masked_code``; those entries count as ``-inf`` (``e = 0``), not as the smallest data value.
A row with every entry masked is uniform, as in FP32, where its entries are all the same -3.4e38 (a padded
query's row in DeBERTa's query x key mask); zeros there took DeBERTa-v2's output to cosine 0.55.
"""

from __future__ import annotations

import numpy as np

from compiler_core.quantization.decisions import INFINITE_LIKE
from compiler_core.quantization.fixedpoint import round_half_away, rounding_divide
from compiler_core.quantization.graph import Group
from compiler_core.quantization.kernels import FIXED, register
from compiler_core.quantization.lowering import LoweringContext, attr_int, describe_bits, scalar
from compiler_core.quantization.params import QuantParams, code_range
from compiler_core.quantization.program import IntOp

EXP_BITS = 20
MAX_SHIFT = 16
"""Finest output step ``1/(qmax * 2**16)``; int64 products stay below 2**60 (int16 outputs)."""


def output_shift(observed: tuple[float, float] | None) -> int:
    """The largest ``k <= MAX_SHIFT`` with ``observed_max * 2**k <= 1`` (0 without a calibrated range)."""
    if observed is None or not np.isfinite(observed[1]) or observed[1] <= 0:
        return 0
    return int(min(max(np.floor(-np.log2(min(observed[1], 1.0))), 0), MAX_SHIFT))


def softmax_output_params(group: Group, ctx: LoweringContext, observed: tuple[float, float] | None) -> QuantParams:
    """Output parameters: scale ``1/(qmax * 2**shift)`` from the calibrated range, zero point 0."""
    record = ctx.tensors.get(group.output.name)
    bits = record.bits if record is not None else 8
    qmax = code_range(bits)[1]
    return QuantParams(np.float64(1.0 / (qmax << output_shift(observed))), np.int64(0), bits)


def lower_softmax(group: Group, ctx: LoweringContext) -> IntOp:
    """Build the exp table for the input scale."""
    main = group.main
    x = main.inputs[0]
    params_in = ctx.params(x)
    s_x, _ = scalar(params_in)
    out = ctx.params(group.output)
    span = params_in.qmax - params_in.qmin
    table = round_half_away((1 << EXP_BITS) * np.exp(-np.arange(span + 1, dtype=np.float64) * s_x))
    last = int(np.nonzero(table)[0].max()) + 1 if table.any() else 1
    rank = len(ctx.view.shape(x))
    axis = attr_int(main, "axis", -1) % rank
    shift = int(round(np.log2(1.0 / (float(scalar(out)[0]) * out.qmax))))
    attrs = {"axis": axis, "qmax": out.qmax, "shift": shift}
    if _is_masked(x, ctx):
        attrs["masked_code"] = int(params_in.qmin)
    return IntOp(main.name, "softmax", "Softmax", [x.name], [group.output.name],
                 attrs=attrs, consts={"exp_table": table[:last].astype(np.int32)},
                 precision=describe_bits(params_in, out))


def _is_masked(value, ctx: LoweringContext) -> bool:
    """``value`` comes from a Where or Add/Sub whose other operand is -inf-like (an attention mask).

    A constant mask is seen here; one computed at run time (from an ``attention_mask`` input) by its
    calibrated range, which the decisions mark on the masked tensor's record.
    """
    record = ctx.tensors.get(value.name)
    if record is not None and record.extra.get("masked"):
        return True
    producer = value.producer()
    if producer is None or producer.op_type not in ("Where", "Add", "Sub"):
        return False
    operands = producer.inputs[1:3] if producer.op_type == "Where" else producer.inputs[:2]
    for operand in operands:
        const = ctx.const(operand)
        if const is not None and const.size and float(np.abs(const).max()) >= INFINITE_LIKE:
            return True
    return False


def run_softmax(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Integer softmax along ``axis``."""
    x, axis = inputs[0], op.attrs["axis"]
    table = op.consts["exp_table"].astype(np.int64)
    distance = np.minimum(x.max(axis=axis, keepdims=True) - x, len(table))
    exp = np.where(distance < len(table), table[np.minimum(distance, len(table) - 1)], 0)
    if "masked_code" in op.attrs:
        masked = x == op.attrs["masked_code"]
        exp = np.where(masked, 0, exp)
        exp = np.where(masked.all(axis=axis, keepdims=True), table[0], exp)  # all masked: equal entries, uniform
    total = np.maximum(exp.sum(axis=axis, keepdims=True), 1)
    qmax = op.attrs["qmax"]
    return [np.minimum(rounding_divide(exp * (qmax << op.attrs.get("shift", 0)), total), qmax)]


register("softmax", lower_softmax, run_softmax, output_policy=FIXED, fixed_params=softmax_output_params)
