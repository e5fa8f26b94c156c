"""Integer Softmax (docs/numerics.md, "Softmax").

``d = max(x) - x`` per row (integer codes), ``e = EXP[min(d, last)]`` with
``EXP[d] = round(2**20 * exp(-d * s_x))``, ``y = round_half_away(e * Q / sum(e))`` with ``Q = qmax``
of the output, whose scale is fixed to ``1/Q`` and zero point to 0.

A masked input (``Where(mask, x, -3.4e38)`` or ``x + mask`` with a -inf-like constant) keeps the data's
scale and saturates the masked entries to the smallest code ``masked_code``; those entries count as
``-inf`` (``e = 0``), not as the smallest data value. A row with every entry masked gives all zeros.
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


def softmax_output_params(group: Group, ctx: LoweringContext) -> QuantParams:
    """Output parameters: scale ``1/qmax``, zero point 0, width of the input."""
    record = ctx.tensors.get(group.output.name)
    bits = record.bits if record is not None else 8
    qmax = code_range(bits)[1]
    return QuantParams(np.float64(1.0 / qmax), np.int64(0), bits)


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
    attrs = {"axis": axis, "qmax": out.qmax}
    if _is_masked(x, ctx):
        attrs["masked_code"] = int(params_in.qmin)
    return IntOp(main.name, "softmax", "Softmax", [x.name], [group.output.name],
                 attrs=attrs, consts={"exp_table": table[:last].astype(np.int32)},
                 precision=describe_bits(params_in, out))


def _is_masked(value, ctx: LoweringContext) -> bool:
    """``value`` comes from a Where or Add/Sub whose other operand is a -inf-like constant (an attention mask)."""
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
        exp = np.where(x == op.attrs["masked_code"], 0, exp)
    total = np.maximum(exp.sum(axis=axis, keepdims=True), 1)
    return [rounding_divide(exp * op.attrs["qmax"], total)]


register("softmax", lower_softmax, run_softmax, output_policy=FIXED, fixed_params=softmax_output_params)
