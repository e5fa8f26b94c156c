"""Reductions: AveragePool, GlobalAveragePool, ReduceMean, ReduceSum, ReduceL2, CumSum.

``acc = sum(x - zp_x)`` over the window (exact), ``y = clamp(requantize(acc, M, S) + zp_y)`` with the
multiplier ``s_x / (N * s_y)`` for the window's element count ``N`` (``s_x / s_y`` for ReduceSum).
AveragePool windows that overlap the padding count only real elements unless
``count_include_pad`` is set; each distinct count has its own multiplier
(docs/numerics.md, "Averaging").
"""

from __future__ import annotations

import numpy as np

from compiler_core.quantization.fixedpoint import integer_sqrt, quantize_multiplier, requantize
from compiler_core.quantization.graph import Group
from compiler_core.quantization.kernels import KernelRefusal, register
from compiler_core.quantization.kernels.linear import conv_accumulate
from compiler_core.quantization.lowering import (
    LoweringContext,
    attr_int,
    attr_ints,
    describe_bits,
    scalar,
)
from compiler_core.quantization.program import IntOp


def _axes(group: Group, ctx: LoweringContext, rank: int) -> list[int]:
    main = group.main
    if main.op_type == "GlobalAveragePool":
        return list(range(2, rank))
    axes = ctx.const(main.inputs[1]) if len(main.inputs) > 1 and main.inputs[1] is not None else None
    if axes is None or axes.size == 0:
        return [] if attr_int(main, "noop_with_empty_axes", 0) else list(range(rank))
    return sorted(int(a) % rank for a in np.atleast_1d(axes))


def lower_reduce(group: Group, ctx: LoweringContext) -> IntOp:
    """GlobalAveragePool / ReduceMean / ReduceSum over constant axes."""
    main = group.main
    x = main.inputs[0]
    shape = ctx.view.shape(x)
    axes = _axes(group, ctx, len(shape))
    count = int(np.prod([shape[a] for a in axes])) if axes else 1
    s_x, zp_x = scalar(ctx.params(x))
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    divisor = 1 if main.op_type == "ReduceSum" else count
    multiplier, shift = quantize_multiplier(s_x / (divisor * s_y))
    keepdims = main.op_type == "GlobalAveragePool" or bool(attr_int(main, "keepdims", 1))
    return IntOp(main.name, "reduce_sum", main.op_type, [x.name], [group.output.name],
                 attrs={"axes": axes, "keepdims": keepdims, "zp_x": zp_x, "zp_y": zp_y, "clamp": [out.qmin, out.qmax]},
                 consts={"multiplier": multiplier.astype(np.int32), "shift": shift.astype(np.int32)},
                 precision=describe_bits(ctx.params(x), out))


def run_reduce(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Exact sum over the axes, then one requantization."""
    attrs = op.attrs
    centered = inputs[0] - attrs["zp_x"]
    acc = centered.sum(axis=tuple(attrs["axes"]), keepdims=attrs["keepdims"]) if attrs["axes"] else centered
    y = requantize(acc, op.consts["multiplier"].astype(np.int64), op.consts["shift"].astype(np.int64))
    return [np.clip(y + attrs["zp_y"], *attrs["clamp"])]


def lower_average_pool(group: Group, ctx: LoweringContext) -> IntOp:
    """AveragePool: per-position element counts -> per-position multipliers."""
    main = group.main
    x = main.inputs[0]
    shape = ctx.view.shape(x)
    kernel = attr_ints(main, "kernel_shape")
    rank = len(kernel)
    if attr_int(main, "ceil_mode", 0):
        raise KernelRefusal(f"{main.name}: AveragePool with ceil_mode=1 has no integer kernel")
    attrs = {"kernel": kernel, "pads": attr_ints(main, "pads", [0] * 2 * rank),
             "strides": attr_ints(main, "strides", [1] * rank), "dilations": attr_ints(main, "dilations", [1] * rank),
             "group": shape[1]}
    ones = np.ones([1, 1, *shape[2:]])
    counts = conv_accumulate(ones, np.ones([1, 1, *kernel]), {**attrs, "group": 1})[0, 0]
    if attr_int(main, "count_include_pad", 0):
        counts = np.full_like(counts, float(np.prod(kernel)))
    s_x, zp_x = scalar(ctx.params(x))
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    multiplier, shift = quantize_multiplier(s_x / (counts.reshape(-1) * s_y))
    return IntOp(main.name, "average_pool", "AveragePool", [x.name], [group.output.name],
                 attrs={**attrs, "zp_x": zp_x, "zp_y": zp_y, "clamp": [out.qmin, out.qmax]},
                 consts={"multiplier": multiplier.reshape(counts.shape).astype(np.int32),
                         "shift": shift.reshape(counts.shape).astype(np.int32)},
                 precision=describe_bits(ctx.params(x), out))


def run_average_pool(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Window sums by a depthwise all-ones convolution, then per-position requantization."""
    attrs = op.attrs
    centered = (inputs[0] - attrs["zp_x"]).astype(np.float64)
    channels = centered.shape[1]
    ones = np.ones([channels, 1, *attrs["kernel"]])
    acc = conv_accumulate(centered, ones, {**attrs, "group": channels}).astype(np.int64)
    y = requantize(acc, op.consts["multiplier"].astype(np.int64), op.consts["shift"].astype(np.int64))
    return [np.clip(y + attrs["zp_y"], *attrs["clamp"])]


def lower_reduce_l2(group: Group, ctx: LoweringContext) -> IntOp:
    """ReduceL2: an exact sum of squared codes, an integer square root with ``H`` extra bits, one requantization.

    ``r = isqrt(sum((x - zp_x)**2) << 2H)`` is ``sqrt(sum) * 2**H`` rounded down; ``H`` is the largest
    that keeps the shifted sum below 2**62; ``y = clamp(requantize(r, M, S) + zp_y)`` with ``M, S``
    from ``s_x / (2**H * s_y)``.
    """
    main = group.main
    x = main.inputs[0]
    shape = ctx.view.shape(x)
    axes = _axes(group, ctx, len(shape))
    count = int(np.prod([shape[a] for a in axes])) if axes else 1
    params_in = ctx.params(x)
    s_x, zp_x = scalar(params_in)
    largest = count * (params_in.qmax - params_in.qmin) ** 2
    headroom = max(0, (61 - int(largest).bit_length()) // 2)
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    multiplier, shift = quantize_multiplier(s_x / (float(1 << headroom) * s_y))
    return IntOp(main.name, "reduce_l2", main.op_type, [x.name], [group.output.name],
                 attrs={"axes": axes, "keepdims": bool(attr_int(main, "keepdims", 1)), "headroom": headroom,
                        "zp_x": zp_x, "zp_y": zp_y, "clamp": [out.qmin, out.qmax]},
                 consts={"multiplier": multiplier.astype(np.int32), "shift": shift.astype(np.int32)},
                 precision=describe_bits(params_in, out))


def run_reduce_l2(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Exact sum of squares, integer square root, one requantization."""
    attrs = op.attrs
    centered = inputs[0] - attrs["zp_x"]
    squares = centered * centered
    total = squares.sum(axis=tuple(attrs["axes"]), keepdims=attrs["keepdims"]) if attrs["axes"] else squares
    root = integer_sqrt(total << (2 * attrs["headroom"]))
    y = requantize(root, op.consts["multiplier"].astype(np.int64), op.consts["shift"].astype(np.int64))
    return [np.clip(y + attrs["zp_y"], *attrs["clamp"])]


def lower_cumsum(group: Group, ctx: LoweringContext) -> IntOp:
    """CumSum along a constant axis: exact running sums of centred codes, one requantization each."""
    main = group.main
    x = main.inputs[0]
    rank = len(ctx.view.shape(x))
    axis = int(np.asarray(ctx.const(main.inputs[1])).reshape(-1)[0]) % rank
    s_x, zp_x = scalar(ctx.params(x))
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    multiplier, shift = quantize_multiplier(s_x / s_y)
    return IntOp(main.name, "cumsum", "CumSum", [x.name], [group.output.name],
                 attrs={"axis": axis, "exclusive": attr_int(main, "exclusive", 0), "reverse": attr_int(main, "reverse", 0),
                        "zp_x": zp_x, "zp_y": zp_y, "clamp": [out.qmin, out.qmax]},
                 consts={"multiplier": multiplier.astype(np.int32), "shift": shift.astype(np.int32)},
                 precision=describe_bits(ctx.params(x), out))


def run_cumsum(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Running sums of ``x - zp_x`` (exclusive and reverse as in ONNX), then requantization."""
    attrs = op.attrs
    axis = attrs["axis"]
    centered = inputs[0] - attrs["zp_x"]
    if attrs["reverse"]:
        centered = np.flip(centered, axis=axis)
    acc = np.cumsum(centered, axis=axis)
    if attrs["exclusive"]:
        acc = acc - centered
    if attrs["reverse"]:
        acc = np.flip(acc, axis=axis)
    y = requantize(acc, op.consts["multiplier"].astype(np.int64), op.consts["shift"].astype(np.int64))
    return [np.clip(y + attrs["zp_y"], *attrs["clamp"])]


register("reduce_sum", lower_reduce, run_reduce)
register("reduce_l2", lower_reduce_l2, run_reduce_l2)
register("cumsum", lower_cumsum, run_cumsum)
register("average_pool", lower_average_pool, run_average_pool)
