"""Element-wise arithmetic: Add/Sub with rescaling, Mul, Div by constants, Where, Cast, Relu/Clip.

See docs/numerics.md, "Element-wise operations".
"""

from __future__ import annotations

import numpy as np

from compiler_core.quantization.fixedpoint import (
    quantize_multiplier,
    requantize,
    round_half_away,
    rounding_shift,
)
from compiler_core.quantization.graph import Group, activation_bounds
from compiler_core.quantization.kernels import (
    OBSERVE,
    SAME_AS_INPUT,
    KernelRefusal,
    register,
    register_kernel,
)
from compiler_core.quantization.lowering import LoweringContext, clamp_codes, describe_bits, scalar
from compiler_core.quantization.params import QuantParams
from compiler_core.quantization.program import IntOp

ADD_FRACTION_BITS = 16  # operands are rescaled to Q16 of the output scale before adding
CONST_BITS_QMAX = 32767  # constants added to activations are int16 codes
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _operand(ctx: LoweringContext, value, bounds: tuple[float, float] | None = None
             ) -> tuple[str, float, int, np.ndarray | None]:
    """(input name or "", scale, zero point, constant codes) of one Add/Sub/Where operand.

    ``bounds`` clips a constant first (exact for Max/Min against an output of that range: ``max(x, -inf)``
    is ``x``). An infinite entry left is the float32 extreme of its sign: ``x + -inf`` saturates the output to its
    smallest code as ``x + -3.4e38`` does (torch's TorchScript export of a causal attention writes its mask as
    ``scores + [0 / -inf]``; the Softmax reads that code as -inf). A NaN has no integer form and is refused.
    """
    const = ctx.const(value)
    if const is None:
        scale, zero_point = scalar(ctx.params(value))
        return value.name, scale, zero_point, None
    if bounds is not None:
        const = np.clip(const, *bounds)
    if np.isnan(const).any():
        raise KernelRefusal(f"constant '{value.name}' holds NaN values, which have no integer code")
    if np.isinf(const).any():
        const = np.clip(const, -FLOAT32_MAX, FLOAT32_MAX)
    absmax = float(np.abs(const).max()) if const.size else 0.0
    scale = absmax / CONST_BITS_QMAX if absmax > 0 else 1.0
    return "", scale, 0, np.clip(round_half_away(const / scale), -CONST_BITS_QMAX, CONST_BITS_QMAX)


def _add_operand(ctx: LoweringContext, value) -> tuple[str, float | np.ndarray, int, np.ndarray | None]:
    """As :func:`_operand`, and a per-feature operand (``residualScales: channel``) with its scale vector.

    Per-feature parameters on the last axis with zero point 0 (a residual-branch output) are rescaled
    feature by feature: one multiplier per feature instead of one.
    """
    params = ctx.params(value) if ctx.const(value) is None else None
    if params is not None and params.axis is not None and params.axis == len(ctx.view.shape(value)) - 1 \
            and not np.any(params.zero_point):
        return value.name, np.asarray(params.scale, dtype=np.float64), 0, None
    return _operand(ctx, value)


def _stacked(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """``[2]`` for two per-tensor operands, ``[2, C]`` (the per-tensor one repeated) when one is per feature."""
    if first.size == 1 and second.size == 1:
        return np.concatenate([first, second])
    width = max(first.size, second.size)
    return np.stack([np.broadcast_to(first, (width,)), np.broadcast_to(second, (width,))])


def lower_add(group: Group, ctx: LoweringContext) -> IntOp:
    """Add/Sub: each operand rescaled to the output scale with ``ADD_FRACTION_BITS`` extra bits.

    A per-feature operand gets one multiplier per feature: the constants are then ``[2, C]``, row ``i``
    the multipliers of operand ``i`` over the last axis.
    """
    main = group.main
    (name_a, s_a, zp_a, c_a), (name_b, s_b, zp_b, c_b) = (_add_operand(ctx, v) for v in main.inputs[:2])
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    sign_b = -1.0 if main.op_type == "Sub" else 1.0
    m_a, sh_a = quantize_multiplier(s_a / s_y * (1 << ADD_FRACTION_BITS))
    m_b, sh_b = quantize_multiplier(sign_b * s_b / s_y * (1 << ADD_FRACTION_BITS))
    consts = {"multipliers": _stacked(m_a, m_b).astype(np.int32), "shifts": _stacked(sh_a, sh_b).astype(np.int32)}
    attrs = {"zp_a": zp_a, "zp_b": zp_b, "zp_y": zp_y}
    for key, codes, scale in (("const_a", c_a, s_a), ("const_b", c_b, s_b)):
        if codes is not None:
            consts[key] = codes.astype(np.int16)
            attrs[f"{key}_scale"] = float(scale)
    low, high = clamp_codes(out, *activation_bounds(ctx.view, group))
    return IntOp(main.name, "add", main.op_type, [name_a, name_b], [group.output.name],
                 attrs={**attrs, "clamp": [low, high]}, consts=consts,
                 precision=describe_bits(*(ctx.params(v) for v in main.inputs[:2] if ctx.is_quantized(v)), out))


def run_add(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Rescale both operands to the output scale (Q16), add, round (docs/numerics.md, "Add and Sub").

    ``[2, C]`` multipliers rescale each operand per index of the last axis.
    """
    attrs, consts = op.attrs, op.consts
    a = consts["const_a"].astype(np.int64) if "const_a" in consts else inputs[0]
    b = consts["const_b"].astype(np.int64) if "const_b" in consts else inputs[1]
    multipliers, shifts = consts["multipliers"].astype(np.int64), consts["shifts"].astype(np.int64)
    scaled_a = requantize(a - attrs["zp_a"], multipliers[0], shifts[0])
    scaled_b = requantize(b - attrs["zp_b"], multipliers[1], shifts[1])
    y = rounding_shift(scaled_a + scaled_b, ADD_FRACTION_BITS) + attrs["zp_y"]
    return [np.clip(y, *attrs["clamp"])]


def lower_mul(group: Group, ctx: LoweringContext) -> IntOp:
    """Mul/Div: by a constant -> an exact per-element multiplier; of two activations -> one product."""
    main = group.main
    a, b = main.inputs[:2]
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    low, high = clamp_codes(out, *activation_bounds(ctx.view, group))
    attrs = {"zp_y": zp_y, "clamp": [low, high]}
    const_a, const_b = ctx.const(a), ctx.const(b)
    if const_a is not None or const_b is not None:
        value, const = (b, const_a) if const_a is not None else (a, const_b)
        if main.op_type == "Div" and const_b is None:
            raise ValueError(f"{main.name}: division of a constant by an activation needs a reciprocal table")
        s_x, zp_x = scalar(ctx.params(value))
        factor = 1.0 / const.astype(np.float64) if main.op_type == "Div" else const.astype(np.float64)
        multiplier, shift = quantize_multiplier(s_x * factor / s_y)
        return IntOp(main.name, "scale", main.op_type, [value.name], [group.output.name],
                     attrs={**attrs, "zp_x": zp_x},
                     consts={"multiplier": multiplier.reshape(factor.shape).astype(np.int32),
                             "shift": shift.reshape(factor.shape).astype(np.int32)},
                     precision=describe_bits(ctx.params(value), out))
    if main.op_type == "Div":
        return lower_divide(group, ctx)
    (s_a, zp_a), (s_b, zp_b) = scalar(ctx.params(a)), scalar(ctx.params(b))
    multiplier, shift = quantize_multiplier(s_a * s_b / s_y)
    return IntOp(main.name, "mul", "Mul", [a.name, b.name], [group.output.name],
                 attrs={**attrs, "zp_a": zp_a, "zp_b": zp_b},
                 consts={"multiplier": multiplier.astype(np.int32), "shift": shift.astype(np.int32)},
                 precision=describe_bits(ctx.params(a), ctx.params(b), out))


def run_scale(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``y = requantize(x - zp_x, M, S) + zp_y`` with per-element ``M, S`` (broadcast)."""
    attrs = op.attrs
    y = requantize(inputs[0] - attrs["zp_x"], op.consts["multiplier"].astype(np.int64),
                   op.consts["shift"].astype(np.int64)) + attrs["zp_y"]
    return [np.clip(y, *attrs["clamp"])]


def run_mul(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``y = requantize((a - zp_a) * (b - zp_b), M, S) + zp_y``."""
    attrs = op.attrs
    product = (inputs[0] - attrs["zp_a"]) * (inputs[1] - attrs["zp_b"])
    y = requantize(product, op.consts["multiplier"].astype(np.int64), op.consts["shift"].astype(np.int64))
    return [np.clip(y + attrs["zp_y"], *attrs["clamp"])]


def lower_where(group: Group, ctx: LoweringContext) -> IntOp:
    """Where(cond, X, Y): constant branches are quantized to the output; run-time ones rescaled."""
    main = group.main
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    consts, names, attrs = {}, [main.inputs[0].name], {"zp_y": zp_y, "clamp": [out.qmin, out.qmax]}
    condition = ctx.const(main.inputs[0])
    if condition is not None:  # a constant mask (causal attention): stored with the op
        consts["condition"], names[0] = np.asarray(condition).astype(bool), ""
    for key, value in (("x", main.inputs[1]), ("y", main.inputs[2])):
        const = ctx.const(value)
        if const is not None:
            consts[f"const_{key}"] = out.quantize(const).astype(np.int32)
            names.append("")
            continue
        s_v, zp_v = scalar(ctx.params(value))
        multiplier, shift = quantize_multiplier(s_v / s_y)
        consts[f"multiplier_{key}"], consts[f"shift_{key}"] = multiplier.astype(np.int32), shift.astype(np.int32)
        attrs[f"zp_branch_{key}"] = zp_v  # not zp_{key}: branch "y" would overwrite the output's zp_y
        names.append(value.name)
    return IntOp(main.name, "select", "Where", names, [group.output.name], attrs=attrs, consts=consts,
                 precision=describe_bits(out))


def run_select(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Select between two operands already expressed in the output's codes."""
    branches = []
    for index, key in ((1, "x"), (2, "y")):
        if f"const_{key}" in op.consts:
            branches.append(op.consts[f"const_{key}"].astype(np.int64))
            continue
        rescaled = requantize(inputs[index] - op.attrs[f"zp_branch_{key}"], op.consts[f"multiplier_{key}"].astype(np.int64),
                              op.consts[f"shift_{key}"].astype(np.int64)) + op.attrs["zp_y"]
        branches.append(rescaled)
    condition = op.consts["condition"] if "condition" in op.consts else inputs[0].astype(bool)
    return [np.clip(np.where(condition, branches[0], branches[1]), *op.attrs["clamp"])]


def lower_cast(group: Group, ctx: LoweringContext) -> IntOp:
    """Cast of an exact (integer/bool) tensor to float: quantize the exact values; float->float: a copy."""
    main = group.main
    if ctx.is_quantized(main.inputs[0]):
        from compiler_core.quantization.kernels.movement import lower_move

        return lower_move(group, ctx)
    out = ctx.params(group.output)
    scale, zero_point = scalar(out)
    return IntOp(main.name, "quantize", "Cast", [main.inputs[0].name], [group.output.name],
                 attrs={"scale": scale, "zp_y": zero_point, "qmin": out.qmin, "qmax": out.qmax},
                 precision=describe_bits(out))


def run_quantize(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``clamp(round_half_away(x / scale) + zp)`` of exact values (float64 division)."""
    attrs = op.attrs
    params = QuantParams(np.float64(attrs["scale"]), np.int64(attrs["zp_y"]))
    codes = round_half_away(inputs[0].astype(np.float64) / params.scale) + attrs["zp_y"]
    return [np.clip(codes, attrs["qmin"], attrs["qmax"])]


def lower_clamp(group: Group, ctx: LoweringContext) -> IntOp:
    """Standalone Relu/Clip: the output keeps the input's parameters, so it is a clamp of codes."""
    main = group.main
    params = ctx.params(main.inputs[0])
    low, high = clamp_codes(params, *activation_bounds(ctx.view, Group(main, [main])))
    return IntOp(main.name, "clamp", main.op_type, [main.inputs[0].name], [group.output.name],
                 attrs={"clamp": [low, high]}, precision=describe_bits(params))


def run_clamp(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Clamp codes to ``[low, high]``."""
    return [np.clip(inputs[0], *op.attrs["clamp"])]


# -- division by an activation ------------------------------------------------------------------

RECIPROCAL_BITS = 28
"""``T[c] = round(2**28 / c)`` for a centred divisor code ``c``: products with int16 numerators stay below 2**46."""


def lower_divide(group: Group, ctx: LoweringContext) -> IntOp:
    """``a / b`` with ``b`` an activation: a reciprocal table over ``b``'s codes, a product, one requantization.

    ``T[k] = round_half_away(2**R / (k - zp_b))`` for every code ``k`` of ``b`` (``2**R`` where
    ``k == zp_b``: a zero divisor saturates), ``y = clamp(requantize((a - zp_a) * T[b], M, S) + zp_y)``
    with ``M, S`` from ``s_a / (s_b * 2**R * s_y)``. A constant numerator is stored as int16 codes.
    """
    main = group.main
    a, b = main.inputs[:2]
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    name_a, s_a, zp_a, const_a = _operand(ctx, a)
    params_b = ctx.params(b)
    s_b, zp_b = scalar(params_b)
    codes = np.arange(params_b.qmin, params_b.qmax + 1, dtype=np.int64) - zp_b
    table = round_half_away(float(1 << RECIPROCAL_BITS) / np.where(codes == 0, 1, codes))
    multiplier, shift = quantize_multiplier(s_a / (s_b * float(1 << RECIPROCAL_BITS) * s_y))
    low, high = clamp_codes(out, *activation_bounds(ctx.view, group))
    consts = {"reciprocal": table.astype(np.int32), "multiplier": multiplier.astype(np.int32),
              "shift": shift.astype(np.int32)}
    if const_a is not None:
        consts["const_a"] = const_a.astype(np.int16)
    return IntOp(main.name, "divide", "Div", [name_a, b.name], [group.output.name],
                 attrs={"zp_a": zp_a, "offset_b": params_b.qmin, "zp_y": zp_y, "clamp": [low, high]}, consts=consts,
                 precision=describe_bits(*(ctx.params(v) for v in (a, b) if ctx.is_quantized(v)), out))


def run_divide(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``requantize((a - zp_a) * T[b - qmin_b], M, S) + zp_y``."""
    attrs, consts = op.attrs, op.consts
    a = consts["const_a"].astype(np.int64) if "const_a" in consts else inputs[0] - attrs["zp_a"]
    reciprocal = consts["reciprocal"].astype(np.int64)[inputs[1] - attrs["offset_b"]]
    y = requantize(a * reciprocal, consts["multiplier"].astype(np.int64), consts["shift"].astype(np.int64))
    return [np.clip(y + attrs["zp_y"], *attrs["clamp"])]


# -- n-ary Max / Min / Sum / Mean --------------------------------------------------------------


def _rescaled_operands(group: Group, ctx: LoweringContext, factor: float, *,
                       clip_constants: bool = False) -> tuple[list[str], dict, dict]:
    """Every operand rescaled to ``factor`` times the output scale in Q16 (as Add does).

    ``clip_constants``: constants are clipped to the output's range first (exact for Max/Min).
    """
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    names, multipliers, shifts, zero_points, consts = [], [], [], [], {}
    bounds = tuple(float(v) for v in out.dequantize(np.array([out.qmin, out.qmax]))) if clip_constants else None
    for index, value in enumerate(group.main.inputs):
        name, scale, zero_point, codes = _operand(ctx, value, bounds)
        multiplier, shift = quantize_multiplier(factor * scale / s_y * (1 << ADD_FRACTION_BITS))
        names.append(name)
        multipliers.append(multiplier[0])
        shifts.append(shift[0])
        zero_points.append(zero_point)
        if codes is not None:
            consts[f"const{index}"] = codes.astype(np.int16)
    consts.update(multipliers=np.array(multipliers, dtype=np.int32), shifts=np.array(shifts, dtype=np.int32))
    low, high = clamp_codes(out, *activation_bounds(ctx.view, group))
    return names, consts, {"zero_points": zero_points, "zp_y": zp_y, "clamp": [low, high]}


def _rescale_all(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    terms = []
    for index, codes in enumerate(inputs):
        value = op.consts[f"const{index}"].astype(np.int64) if f"const{index}" in op.consts else codes
        terms.append(requantize(value - op.attrs["zero_points"][index], int(op.consts["multipliers"][index]),
                                int(op.consts["shifts"][index])))
    return terms


def lower_extremum(group: Group, ctx: LoweringContext) -> IntOp:
    """Max/Min: operands rescaled to the output's codes (Q16), compared, rounded once."""
    names, consts, attrs = _rescaled_operands(group, ctx, 1.0, clip_constants=True)
    return IntOp(group.main.name, "extremum", group.main.op_type, names, [group.output.name],
                 attrs={**attrs, "mode": "max" if group.main.op_type == "Max" else "min"}, consts=consts,
                 precision=describe_bits(ctx.params(group.output)))


def run_extremum(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Element-wise max/min of the rescaled operands (broadcast), then ``rounding_shift`` by 16."""
    reduce = np.maximum if op.attrs["mode"] == "max" else np.minimum
    terms = _rescale_all(op, inputs)
    result = terms[0]
    for term in terms[1:]:
        result = reduce(result, term)
    y = rounding_shift(result, ADD_FRACTION_BITS) + op.attrs["zp_y"]
    return [np.clip(y, *op.attrs["clamp"])]


def lower_sum(group: Group, ctx: LoweringContext) -> IntOp:
    """Sum/Mean: operands rescaled to the output scale (times 1/n for Mean) in Q16, added, rounded once."""
    count = len([v for v in group.main.inputs if v is not None])
    factor = 1.0 / count if group.main.op_type == "Mean" else 1.0
    names, consts, attrs = _rescaled_operands(group, ctx, factor)
    return IntOp(group.main.name, "sum", group.main.op_type, names, [group.output.name], attrs=attrs,
                 consts=consts, precision=describe_bits(ctx.params(group.output)))


def run_sum(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Sum of the rescaled operands (broadcast), then ``rounding_shift`` by 16."""
    terms = _rescale_all(op, inputs)
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    y = rounding_shift(total, ADD_FRACTION_BITS) + op.attrs["zp_y"]
    return [np.clip(y, *op.attrs["clamp"])]


register("add", lower_add, run_add)
register("extremum", lower_extremum, run_extremum)
register("sum", lower_sum, run_sum)
register_kernel("divide", run_divide)
register("scale", lower_mul, run_scale)
register_kernel("mul", run_mul)
register("select", lower_where, run_select)
def cast_policy(group: Group, ctx: LoweringContext) -> str:
    """float->float Cast keeps its input's parameters; int/bool->float is calibrated."""
    return SAME_AS_INPUT if ctx.view.is_float(group.main.inputs[0]) else OBSERVE


register("quantize", lower_cast, run_quantize, output_policy=cast_policy)
register("clamp", lower_clamp, run_clamp, output_policy=SAME_AS_INPUT)
