"""Linear layers: Conv, Gemm and MatMul with constant weights (``linear``), MatMul of two activations.

``linear``: ``acc = sum((x - zp_x) * w) + bias``; ``y = clamp(requantize(acc, M[c], S[c]) + zp_y)``
with int8 weights symmetric per output channel and an int32 bias at scale ``s_x * s_w[c]``
(docs/numerics.md, "Linear layers").
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from compiler_core.quantization.fixedpoint import quantize_multiplier, requantize, round_half_away
from compiler_core.quantization.graph import Group, activation_bounds
from compiler_core.quantization.kernels import register
from compiler_core.quantization.lowering import (
    LoweringContext,
    attr_float,
    attr_int,
    attr_ints,
    attr_str,
    clamp_codes,
    describe_bits,
    scalar,
)
from compiler_core.quantization.params import code_range
from compiler_core.quantization.program import IntOp

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


# -- lowering ------------------------------------------------------------------------------------


def lower_linear(group: Group, ctx: LoweringContext) -> IntOp:
    """Conv / Gemm / MatMul-with-constant-B -> ``linear``; MatMul of two activations -> ``matmul``."""
    main = group.main
    if main.op_type == "MatMul" and ctx.const(main.inputs[1]) is None:
        return _lower_matmul(group, ctx)
    weight, bias, layout = _weights_and_bias(group, ctx)
    x, y = main.inputs[0], group.output
    weight, s_x, zp_x = _fold_input_channels(weight, ctx.params(x), layout)
    out = ctx.params(y)
    s_y, zp_y = scalar(out)
    bits = ctx.weight_bits.get(main.name, 8)
    q_weight, s_w = _quantize_weight(weight, bits, min_scale=np.abs(bias) / (s_x * INT32_MAX))
    if ctx.bias_correction and x.name in ctx.channel_means:
        bias = bias + _bias_correction(weight, q_weight * _per_row(s_w, weight), ctx.channel_means[x.name], main,
                                       layout)
    q_bias = np.clip(round_half_away(bias / (s_x * s_w)), INT32_MIN, INT32_MAX)
    multiplier, shift = quantize_multiplier(s_x * s_w / s_y)
    low, high = clamp_codes(out, *activation_bounds(ctx.view, group))
    return IntOp(main.name, "linear", main.op_type, [x.name], [y.name],
                 attrs={"layout": layout, "zp_x": zp_x, "zp_y": zp_y, "clamp": [low, high], **_conv_attrs(main),
                        "weight_scale": s_w.tolist()},
                 consts={"weight": q_weight.astype(np.int16 if bits == 16 else np.int8),
                         "bias": q_bias.astype(np.int32), "multiplier": multiplier.astype(np.int32),
                         "shift": shift.astype(np.int32)},
                 precision=describe_bits(ctx.params(x), out, weight_bits=bits))


def _fold_input_channels(weight: np.ndarray, params, layout: str):
    """Per-channel input parameters (uint8 image input): fold the channel scales into the weights.

    Returns the weights to quantize, the scalar input scale left (1.0 when folded) and the zero
    point(s): a list, one per input channel, for per-channel inputs.
    """
    if params.axis is None:
        scale, zero_point = scalar(params)
        return weight, scale, zero_point
    if layout != "conv" or params.axis != 1:
        raise ValueError("per-channel (uint8) inputs must feed a convolution directly")
    scales = np.asarray(params.scale, dtype=np.float64)
    groups_in = weight.shape[1]
    channel = np.arange(weight.shape[0])[:, None] // (weight.shape[0] // (scales.size // groups_in)) * groups_in
    channel = channel + np.arange(groups_in)[None, :]
    folded = weight * scales[channel].reshape(weight.shape[0], groups_in, *([1] * (weight.ndim - 2)))
    return folded, 1.0, np.asarray(params.zero_point).astype(int).tolist()


def _weights_and_bias(group: Group, ctx: LoweringContext) -> tuple[np.ndarray, np.ndarray, str]:
    """Weights as ``[out_channels, ...]`` (float64) and the float bias, per op type."""
    main = group.main
    weight = ctx.const(main.inputs[1]).astype(np.float64)
    if main.op_type == "Conv":
        bias = ctx.const(main.inputs[2]) if len(main.inputs) > 2 and main.inputs[2] is not None else None
        return weight, _bias_or_zero(bias, weight.shape[0]), "conv"
    if main.op_type == "Gemm":
        if attr_int(main, "transA", 0):
            raise ValueError(f"{main.name}: Gemm with transA=1 has no NPU lowering")
        weight = weight if attr_int(main, "transB", 0) else weight.T
        weight = weight * attr_float(main, "alpha", 1.0)
        c = ctx.const(main.inputs[2]) if len(main.inputs) > 2 and main.inputs[2] is not None else None
        bias = _bias_or_zero(c, weight.shape[0]) * attr_float(main, "beta", 1.0)
        return weight, bias, "dense"
    add = group.fused_of("Add")  # MatMul: [K, N] -> [N, K]; bias from a fused Add
    bias = None
    if add is not None:
        other = add.inputs[1] if add.inputs[0] is main.outputs[0] else add.inputs[0]
        bias = ctx.const(other)
    return weight.T, _bias_or_zero(bias, weight.shape[-1]), "dense"


def _bias_or_zero(bias: np.ndarray | None, channels: int) -> np.ndarray:
    if bias is None:
        return np.zeros(channels, dtype=np.float64)
    return np.broadcast_to(np.asarray(bias, dtype=np.float64).reshape(-1), (channels,)).copy()


def _quantize_weight(weight: np.ndarray, bits: int, min_scale: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel codes in ``[-qmax, qmax]`` and their scales.

    ``min_scale`` keeps the int32 bias of near-zero channels (``bias / (s_x * s_w)``) in range.
    """
    qmax = code_range(bits)[1]
    absmax = np.abs(weight.reshape(weight.shape[0], -1)).max(axis=1)
    scale = np.maximum(np.where(absmax > 0, absmax / qmax, 1.0), min_scale)
    codes = np.clip(round_half_away(weight / _per_row(scale, weight)), -qmax, qmax)
    return codes, scale


def _per_row(values: np.ndarray, like: np.ndarray) -> np.ndarray:
    return values.reshape([-1] + [1] * (like.ndim - 1))


def _bias_correction(weight: np.ndarray, dequantized: np.ndarray, input_mean: np.ndarray, node, layout: str):
    """Expected output error of the weight rounding, ``(W - W_q) @ E[x]``, per output channel."""
    error = weight - dequantized
    if layout == "dense":
        if input_mean.size != error.shape[1]:
            return np.zeros(error.shape[0])
        return error @ input_mean
    groups = attr_int(node, "group", 1)
    per_group_in = error.shape[1]
    out_per_group = error.shape[0] // groups
    spatial = error.reshape(error.shape[0], per_group_in, -1).sum(axis=2)
    channel = (np.arange(error.shape[0])[:, None] // out_per_group) * per_group_in + np.arange(per_group_in)[None, :]
    if input_mean.size <= channel.max():
        return np.zeros(error.shape[0])
    return (spatial * input_mean[channel]).sum(axis=1)


def _conv_attrs(node) -> dict:
    if node.op_type != "Conv":
        return {}
    kernel = [int(d) for d in node.inputs[1].shape[2:]]
    rank = len(kernel)
    pads = attr_ints(node, "pads", [0] * (2 * rank))
    auto_pad = attr_str(node, "auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        raise ValueError(f"{node.name}: auto_pad {auto_pad} should have been made explicit by canonicalization")
    return {"kernel": kernel, "pads": pads, "strides": attr_ints(node, "strides", [1] * rank),
            "dilations": attr_ints(node, "dilations", [1] * rank), "group": attr_int(node, "group", 1)}


def _lower_matmul(group: Group, ctx: LoweringContext) -> IntOp:
    main = group.main
    a, b, y = main.inputs[0], main.inputs[1], group.output
    (s_a, zp_a), (s_b, zp_b) = scalar(ctx.params(a)), scalar(ctx.params(b))
    out = ctx.params(y)
    s_y, zp_y = scalar(out)
    multiplier, shift = quantize_multiplier(s_a * s_b / s_y)
    low, high = clamp_codes(out, *activation_bounds(ctx.view, group))
    return IntOp(main.name, "matmul", "MatMul", [a.name, b.name], [y.name],
                 attrs={"zp_a": zp_a, "zp_b": zp_b, "zp_y": zp_y, "clamp": [low, high]},
                 consts={"multiplier": multiplier.astype(np.int32), "shift": shift.astype(np.int32)},
                 precision=describe_bits(ctx.params(a), ctx.params(b), out))


# -- kernels -------------------------------------------------------------------------------------


def run_linear(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Integer linear layer (docs/numerics.md, "Linear layers")."""
    attrs, consts = op.attrs, op.consts
    zero_point = np.asarray(attrs["zp_x"])
    if zero_point.ndim:  # per input channel (uint8 image input)
        zero_point = zero_point.reshape(1, -1, *([1] * (inputs[0].ndim - 2)))
    x = (inputs[0] - zero_point).astype(np.float64)
    weight = consts["weight"].astype(np.float64)
    if attrs["layout"] == "conv":
        acc = conv_accumulate(x, weight, attrs)
        channel_shape = [1, -1] + [1] * (acc.ndim - 2)
    else:
        acc = x @ weight.T
        channel_shape = [1] * (acc.ndim - 1) + [-1]
    acc = acc.astype(np.int64) + consts["bias"].astype(np.int64).reshape(channel_shape)
    multiplier = consts["multiplier"].astype(np.int64).reshape(channel_shape)
    shift = consts["shift"].astype(np.int64).reshape(channel_shape)
    y = requantize(acc, multiplier, shift) + attrs["zp_y"]
    return [np.clip(y, *attrs["clamp"])]


def conv_accumulate(x: np.ndarray, weight: np.ndarray, attrs: dict) -> np.ndarray:
    """Exact integer convolution sums in float64 (inputs already centred on their zero point)."""
    rank = len(attrs["kernel"])
    if rank == 1:
        x, weight = x[:, :, None, :], weight[:, :, None, :]
        attrs = {**attrs, "kernel": [1, *attrs["kernel"]], "pads": [0, attrs["pads"][0], 0, attrs["pads"][1]],
                 "strides": [1, *attrs["strides"]], "dilations": [1, *attrs["dilations"]]}
        return _conv2d(x, weight, attrs)[:, :, 0, :]
    if rank != 2:
        raise ValueError("only 1-D and 2-D convolutions have an integer kernel")
    return _conv2d(x, weight, attrs)


def _conv2d(x: np.ndarray, weight: np.ndarray, attrs: dict) -> np.ndarray:
    (top, left, bottom, right), (sh, sw), (dh, dw) = attrs["pads"], attrs["strides"], attrs["dilations"]
    groups = attrs["group"]
    kh, kw = weight.shape[2:]
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    windows = sliding_window_view(padded, (span_h, span_w), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    batch, channels, out_h, out_w = windows.shape[:4]
    out_channels = weight.shape[0]
    if groups == 1:
        return np.tensordot(windows, weight, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
    per_group = channels // groups
    grouped = windows.reshape(batch, groups, per_group, out_h, out_w, kh, kw)
    kernels = weight.reshape(groups, out_channels // groups, per_group, kh, kw)
    result = np.einsum("bgcyxij,gocij->bgoyx", grouped, kernels, optimize=True)
    return result.reshape(batch, out_channels, out_h, out_w)


def run_matmul(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Integer product of two activations (docs/numerics.md, "MatMul of activations")."""
    attrs = op.attrs
    a = (inputs[0] - attrs["zp_a"]).astype(np.float64)
    b = (inputs[1] - attrs["zp_b"]).astype(np.float64)
    acc = np.matmul(a, b).astype(np.int64)
    y = requantize(acc, op.consts["multiplier"].astype(np.int64), op.consts["shift"].astype(np.int64))
    return [np.clip(y + attrs["zp_y"], *attrs["clamp"])]


register(["Conv", "Gemm", "MatMul"], "linear", lower_linear, run_linear)
register([], "matmul", lower_linear, run_matmul)
