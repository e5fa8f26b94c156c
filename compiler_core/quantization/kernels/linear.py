"""Linear layers: Conv, ConvTranspose, Gemm and MatMul with constant weights (``linear``), MatMul of two activations.

``linear``: ``acc = sum((x - zp_x) * w) + bias``; ``y = clamp(requantize(acc, M[c], S[c]) + zp_y)``
with int8 weights symmetric per output channel and an int32 bias at scale ``s_x * s_w[c]``
(docs/numerics.md, "Linear layers"). A ConvTranspose runs as the equivalent convolution (layout
``conv_transpose``): its input is zero-inserted by the stride and padded, its weights are flipped
and their channel axes swapped (docs/numerics.md, "ConvTranspose").
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from compiler_core.quantization.fixedpoint import (
    quantize_multiplier,
    requantize,
    round_half_away,
    round_half_away_float,
)
from compiler_core.quantization.graph import Group, activation_bounds
from compiler_core.quantization.kernels import KernelRefusal, register, register_kernel
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
    s_y, zp_y = _output_scale(out, layout, len(ctx.view.shape(y)))
    bits = ctx.weight_bits.get(main.name, 8)
    q_weight, s_w = _quantize_weight(weight, bits, min_scale=np.abs(bias) / (s_x * INT32_MAX),
                                     clip_search=ctx.weight_clip_search)
    if layout == "conv" and main.name in ctx.hessians:
        q_weight = _gptq_codes(weight, ctx.hessians[main.name], s_w, bits, ctx.params(x))
    if ctx.bias_correction and x.name in ctx.channel_means:
        means = np.asarray(ctx.channel_means[x.name], dtype=np.float64)
        if ctx.params(x).axis is not None and means.size == np.size(ctx.params(x).scale):
            means = means / np.asarray(ctx.params(x).scale)  # the folded weights read x / s_x[c]
        bias = bias + _bias_correction(weight, q_weight * _per_row(s_w, weight), means, main, layout)
    q_bias = np.clip(round_half_away(bias / (s_x * s_w)), INT32_MIN, INT32_MAX)
    multiplier, shift = quantize_multiplier(s_x * s_w / s_y)
    low, high = clamp_codes(out, *activation_bounds(ctx.view, group))
    return IntOp(main.name, "linear", main.op_type, [x.name], [y.name],
                 attrs={"layout": layout, "zp_x": zp_x, "zp_y": zp_y.tolist() if np.ndim(zp_y) else zp_y,
                        "clamp": [low, high], **_conv_attrs(main),
                        "weight_scale": s_w.tolist()},
                 consts={"weight": q_weight.astype(np.int16 if bits == 16 else np.int8),
                         "bias": q_bias.astype(np.int32), "multiplier": multiplier.astype(np.int32),
                         "shift": shift.astype(np.int32)},
                 precision=describe_bits(ctx.params(x), out, weight_bits=bits))


def _output_scale(params, layout: str, rank: int) -> tuple[float | np.ndarray, int]:
    """The output scale (per output channel for per-feature outputs: ``residualScales: channel``) and zero point.

    Per-feature output parameters of a dense layer (last axis, zero point 0) fold into its per-channel
    multipliers ``s_x * s_w[c] / s_y[c]``.
    """
    if params.axis is not None and layout == "dense" and params.axis == rank - 1 and not np.any(params.zero_point):
        return np.asarray(params.scale, dtype=np.float64), 0
    if params.axis == 1 and layout == "conv":  # bit.activationScales channel: scales and zero points per channel
        return np.asarray(params.scale, dtype=np.float64), np.asarray(params.zero_point, dtype=np.int64)
    return scalar(params)


def input_channel_index(out_channels: int, per_group_in: int, groups: int) -> np.ndarray:
    """``[out_channels, per_group_in]``: the input channel that weight ``[o, c]`` of a grouped convolution reads
    (output channel ``o`` is in group ``o // (out_channels / groups)``, which reads its ``per_group_in`` channels)."""
    group = np.arange(out_channels)[:, None] // (out_channels // groups)
    return group * per_group_in + np.arange(per_group_in)[None, :]


def _fold_input_channels(weight: np.ndarray, params, layout: str):
    """Per-channel input parameters (uint8 image input, ``bit.activationScales: channel``): fold the channel
    scales into the weights.

    Returns the weights to quantize, the scalar input scale left (1.0 when folded) and the zero
    point(s): a list, one per input channel, for per-channel inputs.
    """
    if params.axis is None:
        scale, zero_point = scalar(params)
        return weight, scale, zero_point
    if layout != "conv" or params.axis != 1:
        raise KernelRefusal("per-channel inputs must feed a convolution directly")
    scales = np.asarray(params.scale, dtype=np.float64)
    groups_in = weight.shape[1]
    channel = input_channel_index(weight.shape[0], groups_in, scales.size // groups_in)
    folded = weight * scales[channel].reshape(weight.shape[0], groups_in, *([1] * (weight.ndim - 2)))
    return folded, 1.0, np.asarray(params.zero_point).astype(int).tolist()


def _weights_and_bias(group: Group, ctx: LoweringContext) -> tuple[np.ndarray, np.ndarray, str]:
    """Weights as ``[out_channels, ...]`` (float64) and the float bias, per op type."""
    main = group.main
    weight = ctx.const(main.inputs[1]).astype(np.float64)
    if main.op_type == "ConvTranspose":
        bias = ctx.const(main.inputs[2]) if len(main.inputs) > 2 and main.inputs[2] is not None else None
        weight = transposed_conv_weight(weight, attr_int(main, "group", 1))
        return weight, _bias_or_zero(bias, weight.shape[0]), "conv_transpose"
    if main.op_type == "Conv":
        bias = ctx.const(main.inputs[2]) if len(main.inputs) > 2 and main.inputs[2] is not None else None
        return weight, _bias_or_zero(bias, weight.shape[0]), "conv"
    if main.op_type == "Gemm":
        if attr_int(main, "transA", 0):
            raise KernelRefusal(f"{main.name}: Gemm with transA=1 has no NPU lowering")
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


def _quantize_weight(weight: np.ndarray, bits: int, min_scale: np.ndarray | float = 0.0,
                     clip_search: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel codes in ``[-qmax, qmax]`` and their scales.

    ``min_scale`` keeps the int32 bias of near-zero channels (``bias / (s_x * s_w)``) in range.
    """
    qmax = code_range(bits)[1]
    scale = weight_channel_scales(weight, bits, min_scale, clip_search)
    codes = np.clip(round_half_away(weight / _per_row(scale, weight)), -qmax, qmax)
    return codes, scale


def _gptq_codes(weight: np.ndarray, hessians: np.ndarray, scale: np.ndarray, bits: int, input_params) -> np.ndarray:
    """GPTQ codes (``bit.weightRounding: gptq``) with the scales round-to-nearest chose.

    The Hessians are of the FP32 inputs; the layer reads their codes, which add independent rounding noise of
    ``step^2 / 12`` to every input column: that goes on the diagonal (``E[x_q x_qᵀ] = E[x xᵀ] + σ² I``), so GPTQ
    does not push the rounding error into input directions where the FP32 signal is small but the int8 noise
    is not. For weights that fold per-channel input scales (:func:`_fold_input_channels`) the inputs are
    ``x / s_x[c]`` and the noise 1/12 of a code.
    """
    from compiler_core.quantization.gptq import gptq_conv_codes

    if input_params.axis is None:
        hessians = hessians + np.eye(hessians.shape[1]) * float(np.ravel(input_params.scale)[0]) ** 2 / 12.0
    else:
        groups, per_group = hessians.shape[0], weight.shape[1]
        taps = int(np.prod(weight.shape[2:], dtype=np.int64))
        channel_scale = np.asarray(input_params.scale, np.float64).reshape(groups, per_group)
        column = np.repeat(channel_scale, taps, axis=1)  # [groups, K]
        hessians = hessians / (column[:, :, None] * column[:, None, :]) + np.eye(hessians.shape[1]) / 12.0
    return gptq_conv_codes(weight, hessians, scale, bits)


def weight_channel_scales(weight: np.ndarray, bits: int, min_scale: np.ndarray | float = 0.0,
                          clip_search: bool = True) -> np.ndarray:
    """The per-output-channel weight scales the compiler chooses: the MSE-best clip of ``max |w|``, over ``qmax``.

    Args:
        weight: ``[out_channels, ...]``.
        bits: code width (8, 4 or 16).
        min_scale: a floor per channel (keeps a large bias in int32).
        clip_search: False: clip at ``max |w|`` without the search (the fit check's stand-in, where only the
            sizes matter: the search is most of the time of quantizing a large model).
    """
    qmax = code_range(bits)[1]
    rows = weight.reshape(weight.shape[0], -1)
    absmax = np.abs(rows).max(axis=1)
    clip = _mse_clip(rows, absmax, qmax) if clip_search else absmax
    return np.maximum(np.where(absmax > 0, clip / qmax, 1.0), min_scale)


WEIGHT_CLIP_CANDIDATES = np.linspace(0.5, 1.0, 26)
"""Clip ratios searched per output channel (1.0 = the channel's max |w|)."""


CLIP_MEMO_ENTRIES = 4096
_clip_memo: OrderedDict[tuple, np.ndarray] = OrderedDict()
_clip_memo_lock = threading.Lock()


def _mse_clip(rows: np.ndarray, absmax: np.ndarray, qmax: int) -> np.ndarray:
    """Per row, the clip value among ``ratio * max|w|`` that minimises the weights' squared error.

    Remembered per process by the weights' bytes (the last :data:`CLIP_MEMO_ENTRIES` layers): the
    points of a settings sweep, and repeated compiles in the workbench, mostly quantize the same
    weights, and hashing them is ~50x cheaper than the search.
    """
    rows = np.ascontiguousarray(rows, dtype=np.float64)
    key = (rows.shape, int(qmax), hashlib.blake2b(rows.data, digest_size=20).digest())
    with _clip_memo_lock:
        known = _clip_memo.get(key)
        if known is not None:
            _clip_memo.move_to_end(key)
            return known.copy()
    best = _search_clip(rows, absmax, qmax)
    with _clip_memo_lock:
        _clip_memo[key] = best.copy()
        while len(_clip_memo) > CLIP_MEMO_ENTRIES:
            _clip_memo.popitem(last=False)
    return best


def _search_clip(rows: np.ndarray, absmax: np.ndarray, qmax: int) -> np.ndarray:
    best, best_error = absmax.copy(), np.full(rows.shape[0], np.inf)
    for ratio in WEIGHT_CLIP_CANDIDATES:
        clip = np.where(absmax > 0, absmax * ratio, 1.0)
        step = (clip / qmax)[:, None]
        difference = np.clip(round_half_away_float(rows / step), -qmax, qmax)  # codes, exact in float64
        difference *= step
        difference -= rows
        error = np.square(difference, out=difference).sum(axis=1)
        better = error < best_error
        best, best_error = np.where(better, clip, best), np.where(better, error, best_error)
    return best


def _per_row(values: np.ndarray, like: np.ndarray) -> np.ndarray:
    return values.reshape([-1] + [1] * (like.ndim - 1))


def _bias_correction(weight: np.ndarray, dequantized: np.ndarray, input_mean: np.ndarray, node, layout: str):
    """Expected output error of the weight rounding, ``(W - W_q) @ E[x]``, per output channel."""
    error = weight - dequantized
    if layout == "conv_transpose":  # on average an output sees 1 / prod(strides) of the kernel taps
        strides = attr_ints(node, "strides", [1] * (weight.ndim - 2))
        return _bias_correction(weight, dequantized, input_mean, node, "conv") / float(np.prod(strides))
    if layout == "dense":
        if input_mean.size != error.shape[1]:
            return np.zeros(error.shape[0])
        return error @ input_mean
    groups = attr_int(node, "group", 1)
    per_group_in = error.shape[1]
    spatial = error.reshape(error.shape[0], per_group_in, -1).sum(axis=2)
    channel = input_channel_index(error.shape[0], per_group_in, groups)
    if input_mean.size <= channel.max():
        return np.zeros(error.shape[0])
    return (spatial * input_mean[channel]).sum(axis=1)


def transposed_conv_weight(weight: np.ndarray, groups: int) -> np.ndarray:
    """ConvTranspose weights ``[Cin, Cout/g, k...]`` -> the equivalent Conv's ``[Cout, Cin/g, k...]``, flipped."""
    in_channels, out_per_group, *kernel = weight.shape
    grouped = weight.reshape(groups, in_channels // groups, out_per_group, *kernel).swapaxes(1, 2)
    flipped = np.flip(grouped, axis=tuple(range(3, 3 + len(kernel))))
    return np.ascontiguousarray(flipped.reshape(groups * out_per_group, in_channels // groups, *kernel))


def convolution_weight_as_transposed(weight: np.ndarray, groups: int) -> np.ndarray:
    """Inverse of :func:`transposed_conv_weight` (for the QDQ export)."""
    out_channels, in_per_group, *kernel = weight.shape
    flipped = np.flip(weight.reshape(groups, out_channels // groups, in_per_group, *kernel),
                      axis=tuple(range(3, 3 + len(kernel))))
    return np.ascontiguousarray(flipped.swapaxes(1, 2).reshape(groups * in_per_group, out_channels // groups, *kernel))


def _conv_transpose_attrs(node) -> dict:
    """The equivalent stride-1 convolution: input stride (zero insertion) and its (possibly negative) pads."""
    x_shape = [int(d) for d in node.inputs[0].shape]
    kernel = [int(d) for d in node.inputs[1].shape[2:]]
    rank = len(kernel)
    strides = attr_ints(node, "strides", [1] * rank)
    dilations = attr_ints(node, "dilations", [1] * rank)
    output_padding = attr_ints(node, "output_padding", [0] * rank)
    pads = _transposed_pads(node, x_shape[2:], kernel, strides, dilations, output_padding)
    span = [d * (k - 1) for k, d in zip(kernel, dilations)]
    begin = [s - p for s, p in zip(span, pads[:rank])]
    end = [s - p + extra for s, p, extra in zip(span, pads[rank:], output_padding)]
    return {"kernel": kernel, "pads": begin + end, "strides": [1] * rank, "dilations": dilations,
            "group": attr_int(node, "group", 1), "input_strides": strides}


def _transposed_pads(node, spatial, kernel, strides, dilations, output_padding) -> list[int]:
    """ConvTranspose pads, from ``pads`` or (with ``output_shape`` or ``auto_pad`` SAME_*) per the ONNX spec."""
    rank = len(kernel)
    auto_pad = attr_str(node, "auto_pad", "NOTSET")
    output_shape = attr_ints(node, "output_shape")
    if auto_pad == "VALID":
        return [0] * (2 * rank)
    if output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [size * stride for size, stride in zip(spatial, strides)]
    if output_shape is None:
        return attr_ints(node, "pads", [0] * (2 * rank))
    output_shape = output_shape[-rank:]
    total = [s * (n - 1) + extra + (k - 1) * d + 1 - out
             for s, n, extra, k, d, out in zip(strides, spatial, output_padding, kernel, dilations, output_shape)]
    if auto_pad == "SAME_UPPER":
        return [t // 2 for t in total] + [t - t // 2 for t in total]
    return [t - t // 2 for t in total] + [t // 2 for t in total]


def _conv_attrs(node) -> dict:
    if node.op_type == "ConvTranspose":
        return _conv_transpose_attrs(node)
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
    if attrs["layout"] == "conv_transpose":
        acc = conv_accumulate(_zero_insert_and_pad(x, attrs), weight, {**attrs, "pads": [0] * len(attrs["pads"])})
        channel_shape = [1, -1] + [1] * (acc.ndim - 2)
    elif attrs["layout"] == "conv":
        acc = conv_accumulate(x, weight, attrs)
        channel_shape = [1, -1] + [1] * (acc.ndim - 2)
    else:
        acc = x @ weight.T
        channel_shape = [1] * (acc.ndim - 1) + [-1]
    acc = acc.astype(np.int64) + consts["bias"].astype(np.int64).reshape(channel_shape)
    multiplier = consts["multiplier"].astype(np.int64).reshape(channel_shape)
    shift = consts["shift"].astype(np.int64).reshape(channel_shape)
    zero_point = np.asarray(attrs["zp_y"], dtype=np.int64)
    y = requantize(acc, multiplier, shift) + (zero_point.reshape(channel_shape) if zero_point.ndim else zero_point)
    return [np.clip(y, *attrs["clamp"])]


def _zero_insert_and_pad(x: np.ndarray, attrs: dict) -> np.ndarray:
    """``stride - 1`` zeros between input samples, then zero padding (a negative pad crops)."""
    strides, rank = attrs["input_strides"], len(attrs["input_strides"])
    spatial = [(n - 1) * s + 1 for n, s in zip(x.shape[2:], strides)]
    inserted = np.zeros((*x.shape[:2], *spatial), dtype=x.dtype)
    inserted[(slice(None), slice(None), *(slice(None, None, s) for s in strides))] = x
    begin, end = attrs["pads"][:rank], attrs["pads"][rank:]
    widths = [(0, 0), (0, 0)] + [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    padded = np.pad(inserted, widths)
    crop = tuple(slice(max(-b, 0), n - max(-e, 0)) for b, e, n in zip(begin, end, padded.shape[2:]))
    return padded[(slice(None), slice(None), *crop)]


def conv_accumulate(x: np.ndarray, weight: np.ndarray, attrs: dict) -> np.ndarray:
    """Exact integer convolution sums in float64 (inputs already centred on their zero point)."""
    rank = len(attrs["kernel"])
    if rank == 1:
        x, weight = x[:, :, None, :], weight[:, :, None, :]
        attrs = {**attrs, "kernel": [1, *attrs["kernel"]], "pads": [0, attrs["pads"][0], 0, attrs["pads"][1]],
                 "strides": [1, *attrs["strides"]], "dilations": [1, *attrs["dilations"]]}
        return _conv2d(x, weight, attrs)[:, :, 0, :]
    if rank != 2:
        raise KernelRefusal("only 1-D and 2-D convolutions have an integer kernel")
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


register("linear", lower_linear, run_linear)
register_kernel("matmul", run_matmul)
