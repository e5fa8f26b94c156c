"""Fast steps for element-wise kinds, reductions and table look-ups.

A requantization of a single code (``scale`` with one multiplier, Concat and Where rescaling, the
two operands of ``add``) is a function of at most 65,536 input codes: it is tabulated once with the
golden primitives and applied as one gather. ``add`` of two 8-bit operands tabulates the whole
``(a, b) -> y`` function (65,536 entries), as do ``mul`` and ``divide`` of two 8-bit operands.
The n-ary ``sum`` and ``extremum`` rescale every operand by table and combine in exact float64.
Reductions (and running sums) sum exactly in float64 and requantize with
:class:`~compiler_core.runtime.fastpath.requant.Requantizer`.
"""

from __future__ import annotations

from functools import reduce

import numpy as np

from compiler_core.quantization.fixedpoint import integer_sqrt, requantize, rounding_shift
from compiler_core.quantization.kernels.elementwise import ADD_FRACTION_BITS
from compiler_core.quantization.kernels.linear import conv_accumulate
from compiler_core.quantization.program import IntOp
from compiler_core.runtime.fastpath.plan import PlanContext, Step, register_fast
from compiler_core.runtime.fastpath.requant import FLOAT64_EXACT, Requantizer

PAIR_TABLE_LIMIT = 1 << 17


def code_table(context: PlanContext, tensor: str, function) -> tuple[np.ndarray, int] | None:
    """``(function(codes) for every code of tensor, qmin)``, or ``None`` when the tensor has no codes."""
    params = context.params(tensor)
    if params is None or params.axis is not None:
        return None
    codes = np.arange(params.qmin, params.qmax + 1, dtype=np.int64)
    return np.asarray(function(codes)), params.qmin


def lookup(table: np.ndarray, offset: int, codes: np.ndarray) -> np.ndarray:
    """``table[codes - offset]`` for float32 codes."""
    return np.take(table, np.subtract(codes, offset, dtype=np.float32).astype(np.intp))


# -- add -------------------------------------------------------------------------------------------


@register_fast("add")
def build_add(op: IntOp, context: PlanContext) -> Step | None:
    """Both operands rescaled by table, summed, rounded by ``2**16`` exactly (per-feature multipliers: golden)."""
    attrs, consts = op.attrs, op.consts
    multipliers, shifts = consts["multipliers"].astype(np.int64), consts["shifts"].astype(np.int64)
    if multipliers.ndim > 1:
        return None
    operands = []
    for index, key in enumerate(("a", "b")):
        zero_point = attrs[f"zp_{key}"]
        def scaled(codes, i=index, zp=zero_point):
            return requantize(codes - zp, multipliers[i], shifts[i])
        if f"const_{key}" in consts:
            operands.append(("const", scaled(consts[f"const_{key}"].astype(np.int64)), 0))
            continue
        table = code_table(context, op.inputs[index], scaled)
        if table is None:
            return None
        operands.append(("input", *table))
    low, high = attrs["clamp"]
    if all(kind == "input" for kind, _, _ in operands) and operands[0][1].size * operands[1][1].size <= PAIR_TABLE_LIMIT:
        return _pair_table_step(operands, attrs["zp_y"], low, high)
    operands = _saturated(operands)
    if any(np.abs(values).max(initial=0) >= FLOAT64_EXACT // 4 for _, values, _ in operands):
        return None
    return _summed_step(operands, attrs["zp_y"], low, high)


SATURATED_TERM = 1 << 37
"""A Q16 term this large decides the clamped result alone when the other is at most half of it."""


def _saturated(operands: list) -> list:
    """Clip a huge operand (an attention mask times a huge scale) to ``SATURATED_TERM`` when the other is small.

    With ``|a| <= 2**36`` and ``|b| >= 2**37``, ``|a + b| >= 2**36``: the rounded sum is beyond
    ``2**20`` codes, past any clamp, on the side of ``b``'s sign; clipping ``b`` keeps that.
    """
    largest = [float(np.abs(values).max(initial=0)) for _, values, _ in operands]
    if len(operands) != 2 or min(largest) > SATURATED_TERM // 2 or max(largest) <= SATURATED_TERM:
        return operands
    return [(kind, np.clip(values, -SATURATED_TERM, SATURATED_TERM), offset) for kind, values, offset in operands]


def _final_codes(total: np.ndarray, zero_point: int, low: int, high: int) -> np.ndarray:
    return np.clip(rounding_shift(total, ADD_FRACTION_BITS) + zero_point, low, high)


def _pair_table_step(operands, zero_point: int, low: int, high: int) -> Step:
    (_, table_a, offset_a), (_, table_b, offset_b) = operands
    width = table_b.size
    table = _final_codes(table_a[:, None] + table_b[None, :], zero_point, low, high).astype(np.float32).reshape(-1)
    return _pair_lookup_step(table, width, offset_a, offset_b, "add/pair-table")


def _summed_step(operands, zero_point: int, low: int, high: int, combine=np.add, method: str = "add/tables") -> Step:
    """Operands (tables or constants of Q16 terms) combined pairwise in float64, rounded by ``2**16``.

    The caller guarantees the combined magnitude stays below ``2**52``: every value is then an exact
    integer, ``scaled`` is exact, and ``scaled + 0.5`` too, so ``trunc`` rounds halves away from zero.
    """
    prepared = [(kind, values.astype(np.float64), offset) for kind, values, offset in operands]
    unit = np.ldexp(1.0, -ADD_FRACTION_BITS)

    def run(inputs: list) -> list:
        parts = [values if kind == "const" else lookup(values, offset, inputs[index])
                 for index, (kind, values, offset) in enumerate(prepared)]
        scaled = reduce(combine, parts) * unit
        rounded = np.trunc(scaled + np.copysign(0.5, scaled))
        rounded += zero_point
        return [np.clip(rounded, low, high).astype(np.float32)]

    return Step(run, method=method)


# -- n-ary Sum / Mean / Max / Min --------------------------------------------------------------------


def _rescaled_terms(op: IntOp, context: PlanContext) -> list | None:
    """Per operand ``("const", Q16 terms, 0)`` or ``("input", table of Q16 terms, qmin)``; ``None`` if not tabulable."""
    operands = []
    for index, name in enumerate(op.inputs):
        multiplier, shift = int(op.consts["multipliers"][index]), int(op.consts["shifts"][index])
        zero_point = op.attrs["zero_points"][index]
        def scaled(codes, m=multiplier, s=shift, zp=zero_point):
            return requantize(codes - zp, m, s)
        if f"const{index}" in op.consts:
            operands.append(("const", scaled(op.consts[f"const{index}"].astype(np.int64)), 0))
            continue
        table = code_table(context, name, scaled)
        if table is None:
            return None
        operands.append(("input", *table))
    largest = sum(float(np.abs(values).max(initial=0)) for _, values, _ in operands)
    return operands if largest < FLOAT64_EXACT // 2 else None


@register_fast("sum")
def build_sum(op: IntOp, context: PlanContext) -> Step | None:
    """Sum/Mean: every operand rescaled by table, added in float64, rounded by ``2**16``."""
    operands = _rescaled_terms(op, context)
    if operands is None:
        return None
    return _summed_step(operands, op.attrs["zp_y"], *op.attrs["clamp"], method="sum/tables")


@register_fast("extremum")
def build_extremum(op: IntOp, context: PlanContext) -> Step | None:
    """Max/Min: every operand rescaled by table, compared, rounded by ``2**16``."""
    operands = _rescaled_terms(op, context)
    if operands is None:
        return None
    combine = np.maximum if op.attrs["mode"] == "max" else np.minimum
    return _summed_step(operands, op.attrs["zp_y"], *op.attrs["clamp"], combine=combine,
                        method=f"extremum/{op.attrs['mode']}/tables")


# -- single-operand rescaling -------------------------------------------------------------------------


@register_fast("scale")
def build_scale(op: IntOp, context: PlanContext) -> Step | None:
    """One multiplier: a table; per-element multipliers: a Requantizer over ``x - zp_x``."""
    attrs, consts = op.attrs, op.consts
    multiplier, shift = consts["multiplier"].astype(np.int64), consts["shift"].astype(np.int64)
    low, high = attrs["clamp"]
    shape = context.shape(op.inputs[0])
    if shape is None or multiplier.ndim > len(shape):
        return None
    if multiplier.size == 1:
        table = code_table(context, op.inputs[0], lambda codes: np.clip(
            requantize(codes - attrs["zp_x"], multiplier.reshape(()), shift.reshape(())) + attrs["zp_y"], low, high))
        if table is None:
            return None
        values, offset = table[0].astype(np.float32), table[1]
        return Step(lambda inputs: [lookup(values, offset, inputs[0])], method="scale/table")
    span = context.span(op.inputs[0], attrs["zp_x"])
    if span is None:
        return None
    requant = Requantizer(multiplier, shift, None, attrs["zp_y"], (low, high), span)
    zero_point = np.float32(attrs["zp_x"])
    return Step(lambda inputs: [requant(np.subtract(inputs[0], zero_point, dtype=np.float32))],
                method=f"scale/{requant.method}")


@register_fast("lut")
def build_lut(op: IntOp, context: PlanContext) -> Step | None:
    """``table[x - qmin]`` as one gather (per-channel tables: ``table[c, x - qmin]``, one flat gather too)."""
    table, offset = op.consts["table"].astype(np.float32), int(op.attrs["offset"])
    if table.ndim == 2:
        channels, width = table.shape
        flat = table.reshape(-1)

        def per_channel(inputs: list) -> list:
            starts = (np.arange(channels, dtype=np.float32) * width - offset).reshape(
                1, -1, *([1] * (inputs[0].ndim - 2)))
            return [np.take(flat, np.add(inputs[0], starts, dtype=np.float32).astype(np.intp))]
        return Step(per_channel, method="lut/channel")
    return Step(lambda inputs: [lookup(table, offset, inputs[0])], method="lut")


@register_fast("clamp")
def build_clamp(op: IntOp, context: PlanContext) -> Step | None:
    """Clamp of codes."""
    low, high = op.attrs["clamp"]
    return Step(lambda inputs: [np.clip(inputs[0], low, high)], method="clamp")


@register_fast("concat")
def build_concat(op: IntOp, context: PlanContext) -> Step | None:
    """Inputs with other parameters are rescaled by table; constant pieces (already output codes) are
    repeated over the batch; then one concatenation."""
    attrs = op.attrs
    low, high = attrs["clamp"]
    converters, constants = [], {}
    for index, name in enumerate(op.inputs):
        if f"const{index}" in op.consts:  # e.g. ViT's class token before the patch tokens
            constants[index] = op.consts[f"const{index}"].astype(np.float32)
            converters.append(None)
            continue
        multiplier, shift = int(op.consts["multiplier"][index]), int(op.consts["shift"][index])
        zero_point = attrs["zp_inputs"][index]
        if multiplier == 1 << 30 and shift == 30 and zero_point == attrs["zp_y"]:
            converters.append(None)
            continue
        table = code_table(context, name, lambda codes, m=multiplier, s=shift, zp=zero_point: np.clip(
            requantize(codes - zp, m, s) + attrs["zp_y"], low, high))
        if table is None:
            return None
        converters.append((table[0].astype(np.float32), table[1]))
    axis = attrs["axis"]

    def run(inputs: list) -> list:
        batch = next((codes.shape[0] for index, codes in enumerate(inputs) if index not in constants), 1)
        parts = []
        for index, (codes, convert) in enumerate(zip(inputs, converters)):
            if index in constants:
                piece = constants[index]
                parts.append(np.repeat(piece, batch, axis=0) if piece.shape[0] != batch else piece)
            else:
                parts.append(codes if convert is None else lookup(convert[0], convert[1], codes))
        return [np.concatenate(parts, axis=axis)]

    return Step(run, batch_safe=axis != 0, method="concat")


@register_fast("select")
def build_select(op: IntOp, context: PlanContext) -> Step | None:
    """Where: constant branches as float32 codes, run-time branches rescaled by table."""
    attrs, consts = op.attrs, op.consts
    branches = []
    for index, key in ((1, "x"), (2, "y")):
        if f"const_{key}" in consts:
            branches.append(("const", consts[f"const_{key}"].astype(np.float32), 0))
            continue
        multiplier, shift = consts[f"multiplier_{key}"].astype(np.int64), consts[f"shift_{key}"].astype(np.int64)
        if multiplier.size != 1:
            return None
        table = code_table(context, op.inputs[index], lambda codes, m=multiplier, s=shift, zp=attrs[f"zp_branch_{key}"],
                           zp_y=attrs["zp_y"]: requantize(codes - zp, m.reshape(()), s.reshape(())) + zp_y)
        if table is None or np.abs(table[0]).max() >= 1 << 24:
            return None
        branches.append(("input", table[0].astype(np.float32), table[1]))
    low, high = attrs["clamp"]
    constant = consts["condition"].astype(bool) if "condition" in consts else None

    def run(inputs: list) -> list:
        values = [table if kind == "const" else lookup(table, offset, inputs[index])
                  for index, (kind, table, offset) in zip((1, 2), branches)]
        condition = constant if constant is not None else inputs[0].astype(bool)
        return [np.clip(np.where(condition, values[0], values[1]), low, high).astype(np.float32)]

    return Step(run, method="select")


@register_fast("gather_table")
def build_gather_table(op: IntOp, context: PlanContext) -> Step | None:
    """Rows of a constant table (embeddings) by exact indices."""
    table, axis = op.consts["table"].astype(np.float32), op.attrs["axis"]
    fixed = op.consts.get("indices")

    def run(inputs: list) -> list:
        indices = fixed if fixed is not None else inputs[1]
        indices = np.where(indices < 0, indices + table.shape[axis], indices)
        return [np.take(table, indices, axis=axis)]

    return Step(run, batch_safe=axis == 0 or fixed is not None, method="gather_table")


# -- reductions -------------------------------------------------------------------------------------


@register_fast("reduce_sum")
def build_reduce(op: IntOp, context: PlanContext) -> Step | None:
    """Exact float64 sum over the axes, then one requantization."""
    attrs = op.attrs
    span, shape = context.span(op.inputs[0], attrs["zp_x"]), context.shape(op.inputs[0])
    if span is None or shape is None:
        return None
    axes = tuple(attrs["axes"])
    count = int(np.prod([shape[a] for a in axes])) if axes else 1
    if count * span >= FLOAT64_EXACT:
        return None
    requant = Requantizer(op.consts["multiplier"], op.consts["shift"], None, attrs["zp_y"], attrs["clamp"],
                          count * span)
    zero_point = np.float64(attrs["zp_x"])

    def run(inputs: list) -> list:
        centred = np.subtract(inputs[0], zero_point, dtype=np.float64)
        return [requant(centred.sum(axis=axes, keepdims=attrs["keepdims"]) if axes else centred)]

    return Step(run, batch_safe=0 not in axes, method=f"reduce/{requant.method}")


@register_fast("average_pool")
def build_average_pool(op: IntOp, context: PlanContext) -> Step | None:
    """Window sums (exact float64), then per-position requantization."""
    attrs = op.attrs
    span = context.span(op.inputs[0], attrs["zp_x"])
    if span is None:
        return None
    window = int(np.prod(attrs["kernel"]))
    requant = Requantizer(op.consts["multiplier"], op.consts["shift"], None, attrs["zp_y"], attrs["clamp"],
                          window * span)
    zero_point = np.float64(attrs["zp_x"])

    def run(inputs: list) -> list:
        centred = np.subtract(inputs[0], zero_point, dtype=np.float64)
        channels = centred.shape[1]
        ones = np.ones([channels, 1, *attrs["kernel"]])
        return [requant(conv_accumulate(centred, ones, {**attrs, "group": channels}))]

    return Step(run, method=f"average_pool/{requant.method}")


@register_fast("mul")
def build_mul(op: IntOp, context: PlanContext) -> Step | None:
    """Product of two activations: a pair table for 8-bit operands, else exact float64 products."""
    attrs = op.attrs
    multiplier, shift = op.consts["multiplier"].astype(np.int64), op.consts["shift"].astype(np.int64)
    params_a, params_b = context.params(op.inputs[0]), context.params(op.inputs[1])
    if params_a is None or params_b is None or multiplier.size != 1 or params_a.axis is not None \
            or params_b.axis is not None:
        return None
    low, high = attrs["clamp"]
    codes_a = np.arange(params_a.qmin, params_a.qmax + 1, dtype=np.int64) - attrs["zp_a"]
    codes_b = np.arange(params_b.qmin, params_b.qmax + 1, dtype=np.int64) - attrs["zp_b"]
    if codes_a.size * codes_b.size <= PAIR_TABLE_LIMIT:
        table = np.clip(requantize(codes_a[:, None] * codes_b[None, :], multiplier.reshape(()), shift.reshape(()))
                        + attrs["zp_y"], low, high).astype(np.float32).reshape(-1)
        return _pair_lookup_step(table, codes_b.size, params_a.qmin, params_b.qmin, "mul/pair-table")
    bound = int(np.abs(codes_a).max() * np.abs(codes_b).max())
    requant = Requantizer(multiplier.reshape(()), shift.reshape(()), None, attrs["zp_y"], (low, high), bound)
    zp_a, zp_b = np.float64(attrs["zp_a"]), np.float64(attrs["zp_b"])

    def run(inputs: list) -> list:
        product = np.subtract(inputs[0], zp_a, dtype=np.float64) * np.subtract(inputs[1], zp_b, dtype=np.float64)
        return [requant(product)]

    return Step(run, method=f"mul/{requant.method}")


@register_fast("prelu")
def build_prelu(op: IntOp, context: PlanContext) -> Step | None:
    """One slope: a table; slopes per element: two Requantizers and a select."""
    attrs, consts = op.attrs, op.consts
    span, shape = context.span(op.inputs[0], attrs["zp_x"]), context.shape(op.inputs[0])
    negative_multiplier = consts["negative_multiplier"].astype(np.int64)
    if span is None or shape is None or negative_multiplier.ndim > len(shape):
        return None
    low, high = attrs["clamp"]
    positive = Requantizer(consts["positive_multiplier"], consts["positive_shift"], None, attrs["zp_y"], (low, high),
                           span)
    negative = Requantizer(negative_multiplier, consts["negative_shift"], None, attrs["zp_y"], (low, high), span)
    if negative_multiplier.size == 1:
        def function(codes):
            centred = (codes - attrs["zp_x"]).astype(np.float32)
            return np.where(centred >= 0, positive(centred.copy()), negative(centred.copy()))
        table = code_table(context, op.inputs[0], function)
        if table is None:
            return None
        values, offset = table[0].reshape(-1).astype(np.float32), table[1]
        return Step(lambda inputs: [lookup(values, offset, inputs[0])], method="prelu/table")
    zero_point = np.float32(attrs["zp_x"])

    def run(inputs: list) -> list:
        centred = np.subtract(inputs[0], zero_point, dtype=np.float32)
        return [np.where(centred >= 0, positive(centred.copy()), negative(centred.copy()))]

    return Step(run, method=f"prelu/{positive.method}/{negative.method}")


@register_fast("divide")
def build_divide(op: IntOp, context: PlanContext) -> Step | None:
    """Division by an activation: a pair table for 8-bit operands, else exact float64 products and a Requantizer."""
    attrs, consts = op.attrs, op.consts
    multiplier, shift = consts["multiplier"].astype(np.int64).reshape(()), consts["shift"].astype(np.int64).reshape(())
    reciprocal, offset_b = consts["reciprocal"].astype(np.int64), attrs["offset_b"]
    low, high = attrs["clamp"]
    params_a = context.params(op.inputs[0]) if op.inputs[0] else None
    if params_a is not None and params_a.axis is None and (params_a.qmax - params_a.qmin + 1) * reciprocal.size \
            <= PAIR_TABLE_LIMIT:
        codes_a = np.arange(params_a.qmin, params_a.qmax + 1, dtype=np.int64) - attrs["zp_a"]
        table = np.clip(requantize(codes_a[:, None] * reciprocal[None, :], multiplier, shift) + attrs["zp_y"],
                        low, high).astype(np.float32).reshape(-1)
        return _pair_lookup_step(table, reciprocal.size, params_a.qmin, offset_b, "divide/pair-table")
    if "const_a" in consts:
        numerator, span = consts["const_a"].astype(np.float64), int(np.abs(consts["const_a"]).max(initial=0))
    else:
        numerator, span = None, context.span(op.inputs[0], attrs["zp_a"])
    if span is None or span * int(np.abs(reciprocal).max(initial=0)) >= FLOAT64_EXACT:
        return None
    requant = Requantizer(multiplier, shift, None, attrs["zp_y"], (low, high),
                          span * int(np.abs(reciprocal).max(initial=0)))
    factors, zp_a = reciprocal.astype(np.float64), np.float64(attrs["zp_a"])

    def run(inputs: list) -> list:
        centred = numerator if numerator is not None else np.subtract(inputs[0], zp_a, dtype=np.float64)
        return [requant(centred * lookup(factors, offset_b, inputs[1]))]

    return Step(run, method=f"divide/{requant.method}")


def _pair_lookup_step(table: np.ndarray, width: int, offset_a: int, offset_b: int, method: str) -> Step:
    """``table[(a - offset_a) * width + (b - offset_b)]`` of two float32 code tensors (broadcast)."""
    def run(inputs: list) -> list:
        index = np.subtract(inputs[0], offset_a, dtype=np.float32)
        index *= width
        if index.shape == np.broadcast_shapes(index.shape, inputs[1].shape):
            index += inputs[1]
        else:  # the second operand broadcasts the first
            index = index + inputs[1]
        index -= offset_b
        return [np.take(table, index.astype(np.intp))]

    return Step(run, method=method)


@register_fast("reduce_l2")
def build_reduce_l2(op: IntOp, context: PlanContext) -> Step | None:
    """Exact float64 sum of squares over the axes; the (reduced) root and requantization in golden int64."""
    attrs = op.attrs
    span, shape = context.span(op.inputs[0], attrs["zp_x"]), context.shape(op.inputs[0])
    if span is None or shape is None:
        return None
    axes = tuple(attrs["axes"])
    count = int(np.prod([shape[a] for a in axes])) if axes else 1
    if count * span * span >= FLOAT64_EXACT:
        return None
    multiplier, shift = op.consts["multiplier"].astype(np.int64), op.consts["shift"].astype(np.int64)
    zero_point, headroom = np.float64(attrs["zp_x"]), 2 * attrs["headroom"]

    def run(inputs: list) -> list:
        centred = np.subtract(inputs[0], zero_point, dtype=np.float64)
        squares = np.square(centred, out=centred)
        total = squares.sum(axis=axes, keepdims=attrs["keepdims"]) if axes else squares
        root = integer_sqrt(total.astype(np.int64) << headroom)
        y = requantize(root, multiplier, shift) + attrs["zp_y"]
        return [np.clip(y, *attrs["clamp"]).astype(np.float32)]

    return Step(run, batch_safe=0 not in axes, method="reduce_l2")


@register_fast("cumsum")
def build_cumsum(op: IntOp, context: PlanContext) -> Step | None:
    """Exact float64 running sums of centred codes (exclusive / reverse as in ONNX), one Requantizer."""
    attrs = op.attrs
    span, shape = context.span(op.inputs[0], attrs["zp_x"]), context.shape(op.inputs[0])
    if span is None or shape is None:
        return None
    axis = attrs["axis"]
    bound = shape[axis] * span
    if bound >= FLOAT64_EXACT:
        return None
    requant = Requantizer(op.consts["multiplier"], op.consts["shift"], None, attrs["zp_y"], attrs["clamp"], bound)
    zero_point = np.float64(attrs["zp_x"])

    def run(inputs: list) -> list:
        centred = np.subtract(inputs[0], zero_point, dtype=np.float64)
        if attrs["reverse"]:
            centred = np.flip(centred, axis=axis)
        acc = np.cumsum(centred, axis=axis)
        if attrs["exclusive"]:
            acc -= centred
        if attrs["reverse"]:
            acc = np.flip(acc, axis=axis)
        return [requant(np.ascontiguousarray(acc))]

    return Step(run, batch_safe=axis != 0, method=f"cumsum/{requant.method}")
