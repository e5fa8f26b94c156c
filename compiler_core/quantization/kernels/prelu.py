"""PRelu with constant slopes of any broadcastable shape (scalar, per channel, per element).

Two exact multipliers, one for each sign of the centred input: ``s_x / s_y`` for ``x >= zp_x`` and
``slope[i] * s_x / s_y`` (per slope element, broadcast like the slope) below it. Every PRelu runs
here, scalar slopes included: the result is the same single rounding a table would give, without
a 256/65,536-entry table per layer (docs/numerics.md, "PRelu").
"""

from __future__ import annotations

import numpy as np

from compiler_core.quantization.fixedpoint import quantize_multiplier, requantize
from compiler_core.quantization.graph import Group
from compiler_core.quantization.kernels import KernelRefusal, register
from compiler_core.quantization.lowering import LoweringContext, describe_bits, scalar
from compiler_core.quantization.program import IntOp


def lower_prelu(group: Group, ctx: LoweringContext) -> IntOp:
    """Positive multiplier ``s_x / s_y``; negative multipliers ``slope * s_x / s_y`` shaped like the slope."""
    main = group.main
    x, y = main.inputs[0], group.output
    slope = ctx.const(main.inputs[1])
    if slope is None:
        raise KernelRefusal(f"{main.name}: PRelu needs a constant slope for its integer kernel")
    params_in, params_out = ctx.params(x), ctx.params(y)
    (s_x, zp_x), (s_y, zp_y) = scalar(params_in), scalar(params_out)
    positive, positive_shift = quantize_multiplier(s_x / s_y)
    slope = slope.astype(np.float64)
    negative, negative_shift = quantize_multiplier(slope * s_x / s_y)
    return IntOp(main.name, "prelu", "PRelu", [x.name], [y.name],
                 attrs={"zp_x": zp_x, "zp_y": zp_y, "clamp": [params_out.qmin, params_out.qmax]},
                 consts={"positive_multiplier": positive.astype(np.int32), "positive_shift": positive_shift.astype(np.int32),
                         "negative_multiplier": negative.reshape(slope.shape).astype(np.int32),
                         "negative_shift": negative_shift.reshape(slope.shape).astype(np.int32)},
                 precision=describe_bits(params_in, params_out))


def run_prelu(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``requantize(x - zp_x, M+, S+)`` where ``x >= zp_x``, else with the slope's ``M-[i], S-[i]``; ``+ zp_y``."""
    attrs, consts = op.attrs, op.consts
    centred = inputs[0] - attrs["zp_x"]
    positive = requantize(centred, consts["positive_multiplier"].astype(np.int64),
                          consts["positive_shift"].astype(np.int64))
    negative = requantize(centred, consts["negative_multiplier"].astype(np.int64),
                          consts["negative_shift"].astype(np.int64))
    y = np.where(centred >= 0, positive, negative) + attrs["zp_y"]
    return [np.clip(y, *attrs["clamp"])]


register("prelu", lower_prelu, run_prelu)
