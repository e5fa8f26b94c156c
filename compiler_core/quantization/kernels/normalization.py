"""Integer Layer, Group and Instance normalization (docs/numerics.md, "LayerNormalization").

With ``x = q - zp`` over the ``N`` normalized elements, everything in units of ``s_x / 2**8``:
``mean = rdiv(sum(x) * 2**8, N)``, ``c = x * 2**8 - mean``, ``V = rdiv(sum(c*c), N) + E`` with
``E = round(eps * 2**16 / s_x**2)``, ``sd = max(isqrt(V), 1)``, ``n = rdiv(c * 2**F, sd)`` (the
normalized value in Q.F), ``y = clamp(requantize(n, M[i], S[i]) + B[i] + zp_y)`` with ``M, S`` from
``gamma[i] / (2**F * s_y)`` and ``B[i] = round(beta[i] / s_y)``.
"""

from __future__ import annotations

import numpy as np

from compiler_core.errors import UnsupportedOpsError
from compiler_core.quantization.fixedpoint import (
    integer_sqrt,
    quantize_multiplier,
    requantize,
    round_half_away,
    rounding_divide,
)
from compiler_core.quantization.graph import Group
from compiler_core.quantization.kernels import register
from compiler_core.quantization.lowering import LoweringContext, attr_float, attr_int, describe_bits, scalar
from compiler_core.quantization.program import IntOp

FRACTION_BITS = 16
MEAN_BITS = 8
VARIANCE_BITS = 2 * MEAN_BITS
MAX_CENTERED_SQUARES = 1 << 62
_MAX_EPSILON_TERM = 1 << 60


def lower_layer_norm(group: Group, ctx: LoweringContext) -> IntOp:
    """Fold gamma/beta and the output scale into per-element multipliers and offsets."""
    main = group.main
    x = main.inputs[0]
    shape = ctx.view.shape(x)
    axis = attr_int(main, "axis", -1) % len(shape)
    count = int(np.prod(shape[axis:]))
    params_in = ctx.params(x)
    s_x, zp_x = scalar(params_in)
    _check_variance_range(main, count, params_in)
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    gamma = np.broadcast_to(ctx.const(main.inputs[1]).astype(np.float64).reshape(-1), (count,))
    beta_value = main.inputs[2] if len(main.inputs) > 2 else None
    beta = ctx.const(beta_value) if beta_value is not None else None
    beta = np.zeros(count) if beta is None else np.broadcast_to(beta.astype(np.float64).reshape(-1), (count,))
    multiplier, shift = quantize_multiplier(gamma / ((1 << FRACTION_BITS) * s_y))
    epsilon = attr_float(main, "epsilon", 1e-5)
    epsilon_term = int(min(round_half_away(epsilon * (1 << VARIANCE_BITS) / s_x**2).item(), _MAX_EPSILON_TERM))
    return IntOp(main.name, "layernorm", "LayerNormalization", [x.name], [group.output.name],
                 attrs={"axis": axis, "zp_x": zp_x, "zp_y": zp_y, "epsilon_term": epsilon_term,
                        "clamp": [out.qmin, out.qmax]},
                 consts={"multiplier": multiplier.astype(np.int32), "shift": shift.astype(np.int32),
                         "offset": round_half_away(beta / s_y).astype(np.int32)},
                 precision=describe_bits(ctx.params(x), out))


def normalized_fraction(x: np.ndarray, epsilon_term: int) -> np.ndarray:
    """The integer routine shared by every normalization: centred codes over the last axis -> Q.F values."""
    count = x.shape[-1]
    mean = rounding_divide(x.sum(axis=-1, keepdims=True) << MEAN_BITS, count)
    centered = (x << MEAN_BITS) - mean
    variance = rounding_divide((centered * centered).sum(axis=-1, keepdims=True), count)
    deviation = np.maximum(integer_sqrt(variance + epsilon_term), 1)
    return rounding_divide(centered << FRACTION_BITS, deviation)


def run_layer_norm(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Integer layer normalization over the trailing axes from ``axis``."""
    attrs, consts = op.attrs, op.consts
    shape = inputs[0].shape
    x = (inputs[0] - attrs["zp_x"]).reshape(*shape[: attrs["axis"]], -1)
    normalized = normalized_fraction(x, attrs["epsilon_term"])
    y = requantize(normalized, consts["multiplier"].astype(np.int64), consts["shift"].astype(np.int64))
    y = y + consts["offset"].astype(np.int64) + attrs["zp_y"]
    return [np.clip(y, *attrs["clamp"]).reshape(shape)]


def _check_variance_range(main, count: int, params_in) -> None:
    span = (params_in.qmax - params_in.qmin) << MEAN_BITS
    if count * span * span >= MAX_CENTERED_SQUARES:
        raise UnsupportedOpsError(f"{main.name}: {main.op_type} over {count} elements of {params_in.bits}-bit "
                                  "codes overflows the 64-bit variance sum.",
                                  hint="Use 8-bit activations for this layer, or normalize fewer elements.",
                                  node=main.name, op=main.op_type)


def lower_group_norm(group: Group, ctx: LoweringContext) -> IntOp:
    """Instance/GroupNormalization: statistics per (batch, group), then a per-channel scale and offset.

    The codes are viewed as ``[N, G, C/G * spatial]`` and normalized over the last axis with the
    LayerNormalization routine; gamma/beta and the output scale fold into per-channel multipliers
    and offsets (docs/numerics.md, "Group and instance normalization").
    """
    main = group.main
    x = main.inputs[0]
    shape = ctx.view.shape(x)
    channels = shape[1]
    groups = channels if main.op_type == "InstanceNormalization" else attr_int(main, "num_groups", 1)
    params_in = ctx.params(x)
    s_x, zp_x = scalar(params_in)
    _check_variance_range(main, int(np.prod(shape[1:])) // groups, params_in)
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    gamma = np.broadcast_to(ctx.const(main.inputs[1]).astype(np.float64).reshape(-1), (channels,))
    beta = np.broadcast_to(ctx.const(main.inputs[2]).astype(np.float64).reshape(-1), (channels,))
    multiplier, shift = quantize_multiplier(gamma / ((1 << FRACTION_BITS) * s_y))
    epsilon = attr_float(main, "epsilon", 1e-5)
    epsilon_term = int(min(round_half_away(epsilon * (1 << VARIANCE_BITS) / s_x**2).item(), _MAX_EPSILON_TERM))
    return IntOp(main.name, "groupnorm", main.op_type, [x.name], [group.output.name],
                 attrs={"groups": groups, "zp_x": zp_x, "zp_y": zp_y, "epsilon_term": epsilon_term,
                        "clamp": [out.qmin, out.qmax]},
                 consts={"multiplier": multiplier.astype(np.int32), "shift": shift.astype(np.int32),
                         "offset": round_half_away(beta / s_y).astype(np.int32)},
                 precision=describe_bits(params_in, out))


def run_group_norm(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Normalize per (batch, group) with the shared routine, then scale and offset per channel."""
    attrs, consts = op.attrs, op.consts
    shape = inputs[0].shape
    x = (inputs[0] - attrs["zp_x"]).reshape(shape[0], attrs["groups"], -1)
    normalized = normalized_fraction(x, attrs["epsilon_term"]).reshape(shape)
    channel = [1, -1] + [1] * (len(shape) - 2)
    y = requantize(normalized, consts["multiplier"].astype(np.int64).reshape(channel),
                   consts["shift"].astype(np.int64).reshape(channel))
    y = y + consts["offset"].astype(np.int64).reshape(channel) + attrs["zp_y"]
    return [np.clip(y, *attrs["clamp"])]


register("layernorm", lower_layer_norm, run_layer_norm)
register("groupnorm", lower_group_norm, run_group_norm)
