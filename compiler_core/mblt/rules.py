"""Rewrite rules the onnxscript defaults lack, applied during canonicalization.

Each rule is pattern / check / rewrite; a failed check says why, so a remaining node can be
explained to the user.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRule, RewriteRuleClassBase, RewriteRuleSet
from onnxscript.rewriter.pattern import Constant


class BatchNormToAffine(RewriteRuleClassBase):
    """Inference BatchNormalization not preceded by a Conv/Gemm -> ``Mul`` + ``Add`` by constants.

    The optimizer folds BatchNorm into a producing Conv, ConvTranspose or Gemm; a BatchNorm after
    anything else (an Add, a pooling, an input) becomes a per-channel affine that later passes can
    fold into the next layer.
    """

    def pattern(self, op, x, scale, bias, mean, var):
        return op.BatchNormalization(x, scale, bias, mean, var, _allow_other_attributes=True,
                                     _outputs=["y"])

    def check(self, context, x, scale, bias, mean, var, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        if len(node.outputs) > 1 and any(out.uses() for out in node.outputs[1:]):
            return result.fail(f"{node.name}: training-mode outputs are used.")
        if any(v.const_value is None for v in (scale, bias, mean, var)):
            return result.fail(f"{node.name}: statistics are not constants.")
        if x.shape is None or len(x.shape) < 2:
            return result.fail(f"{node.name}: the input rank is unknown.")
        return result

    def rewrite(self, op, x, scale, bias, mean, var, y):
        node = y.producer()
        epsilon = node.attributes.get("epsilon", ir.AttrFloat32("epsilon", 1e-5)).as_float()
        gamma, beta, mu, sigma2 = (v.const_value.numpy().astype(np.float64) for v in (scale, bias, mean, var))
        multiplier = gamma / np.sqrt(sigma2 + epsilon)
        offset = beta - mu * multiplier
        broadcast = [-1] + [1] * (len(x.shape) - 2)
        mul = op.initializer(ir.Tensor(multiplier.reshape(broadcast).astype(np.float32)), name=f"{node.name}_scale")
        add = op.initializer(ir.Tensor(offset.reshape(broadcast).astype(np.float32)), name=f"{node.name}_shift")
        return op.Add(op.Mul(x, mul), add)


def _is_scalar(value, expected: float, tolerance: float = 1e-4) -> bool:
    """True if ``value`` is a one-element constant within ``tolerance`` of ``expected``."""
    const = value.const_value
    return const is not None and const.size == 1 and abs(float(const.numpy().reshape(())) - expected) <= tolerance


class _ErfGeluBase(RewriteRuleClassBase):
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` (exact GELU spelled out by exporters) -> ``Gelu``.

    One ``Gelu`` node is one look-up table on the NPU instead of five quantized steps.
    """

    def check(self, context, x, root2, one, half, **_) -> MatchResult:
        result = MatchResult()
        if not _is_scalar(root2, 2**0.5) or not _is_scalar(one, 1.0) or not _is_scalar(half, 0.5):
            return result.fail("constants are not sqrt(2), 1 and 0.5")
        return result

    def rewrite(self, op, x, root2, one, half, **_):
        return op.Gelu(x)


class ErfGeluOuterHalf(_ErfGeluBase):
    """``x * (0.5 * (1 + erf(x / sqrt 2)))``."""

    def pattern(self, op, x, root2, one, half):
        return op.Mul(x, op.Mul(half, op.Add(op.Erf(op.Div(x, root2)), one)))


class ErfGeluInnerHalf(_ErfGeluBase):
    """``(x * 0.5) * (1 + erf(x / sqrt 2))``."""

    def pattern(self, op, x, root2, one, half):
        return op.Mul(op.Mul(x, half), op.Add(op.Erf(op.Div(x, root2)), one))


class WholeWindowAveragePool(RewriteRuleClassBase):
    """AveragePool whose window is the whole (unpadded) input -> ``GlobalAveragePool``.

    TFLite writes global pooling as AVERAGE_POOL_2D with the feature map's size as its window
    (64x64 in MediaPipe's selfie segmentation), which exceeds the NPU's pooling window; the global
    pool computes the same mean without one.
    """

    def pattern(self, op, x):
        return op.AveragePool(x, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        if x.shape is None or not all(isinstance(d, int) for d in x.shape):
            return result.fail(f"{node.name}: the input shape is not static.")
        spatial = list(x.shape)[2:]
        attributes = {name: attribute.value for name, attribute in node.attributes.items()}
        kernel = list(attributes.get("kernel_shape", []))
        # A window larger than the input is the whole input too when ceil_mode clips it to one output per
        # axis (HF EfficientNet pools with AvgPool2d(1280, ceil_mode=True) over 7x7).
        clipped = attributes.get("ceil_mode", 0) and y.shape is not None and list(y.shape)[2:] == [1] * len(spatial)
        if len(kernel) != len(spatial) or not all(k == d or (clipped and k > d) for k, d in zip(kernel, spatial)):
            return result.fail(f"{node.name}: the window is not the whole input.")
        if any(attributes.get("pads", [0])) or attributes.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return result.fail(f"{node.name}: the input is padded.")
        if any(d != 1 for d in attributes.get("dilations", [1])):
            return result.fail(f"{node.name}: the window is dilated.")
        return result

    def rewrite(self, op, x, y):
        return op.GlobalAveragePool(x)


def _channel_constant(value: ir.Value, channels: int, rank: int) -> np.ndarray | None:
    """``value`` as a per-output-channel vector of ``channels`` values (a scalar broadcast), or None.

    Accepted: a scalar, a one-element tensor, or a constant broadcasting along axis 1 of a rank-``rank``
    NCHW tensor only (shape ``[C, 1, ..]`` or ``[1, C, 1, ..]``).
    """
    const = value.const_value
    if const is None:
        return None
    array = const.numpy().astype(np.float64)
    if array.size == 1 and array.ndim <= rank:
        return np.full(channels, float(array.reshape(())))
    if array.ndim > rank or array.size != channels:
        return None
    shape = [1] * (rank - array.ndim) + list(array.shape)
    if shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return array.reshape(-1)


class _ConvChannelAffine(RewriteRuleClassBase):
    """``Conv -> <op> constant`` (per output channel or scalar) folded into the convolution's weights and bias.

    Exporters write BatchNorm leftovers, learnable scales and biases (PP-OCR's
    ``Conv -> Add(bias) -> Mul(scale) -> Add(shift)`` chains, and its DB head's
    ``ConvTranspose -> Add -> Mul -> Add``) as separate element-wise ops; each would be its own
    quantization point with its own rounding, and its own pass over the feature map. Folding them is
    exact in float. ``producer`` is ``Conv`` (output channels on weight axis 0) or ``ConvTranspose``
    (weights ``[Cin, Cout/group, k...]``: output channel ``g * Cout/group + j`` is column ``j`` of group ``g``).
    """

    operator = ""
    producer = "Conv"

    def pattern(self, op, x, w, c):
        conv = getattr(op, self.producer)(x, w, _allow_other_inputs=True, _allow_other_attributes=True,
                                          _outputs=["conv_out"])
        return getattr(op, self.operator)(conv, c)

    def _channels(self, node: ir.Node, weight_shape) -> int:
        if self.producer == "Conv":
            return int(weight_shape[0])
        group = node.attributes.get("group")
        return int(weight_shape[1]) * (int(group.as_int()) if group is not None else 1)

    def _scaled(self, node: ir.Node, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
        if self.producer == "Conv":
            return weight * scale.reshape([-1] + [1] * (weight.ndim - 1))
        group = node.attributes.get("group")
        groups = int(group.as_int()) if group is not None else 1
        grouped = weight.reshape(groups, weight.shape[0] // groups, *weight.shape[1:])
        factors = scale.reshape(groups, 1, weight.shape[1], *[1] * (weight.ndim - 2))
        return (grouped * factors).reshape(weight.shape)

    def check(self, context, x, w, c, conv_out) -> MatchResult:
        result = MatchResult()
        node = conv_out.producer()
        if w.const_value is None or (len(node.inputs) > 2 and node.inputs[2] is not None
                                     and node.inputs[2].const_value is None):
            return result.fail(f"{node.name}: weights or bias are not constants.")
        if len(conv_out.uses()) != 1 or conv_out.is_graph_output():
            return result.fail(f"{node.name}: the convolution's output has other consumers.")
        channels = self._channels(node, w.const_value.shape)
        if conv_out.shape is None or _channel_constant(c, channels, len(conv_out.shape)) is None:
            return result.fail(f"{node.name}: the {self.operator} operand is not a per-channel constant.")
        if self.operator == "Div" and np.any(_channel_constant(c, channels, len(conv_out.shape)) == 0):
            return result.fail(f"{node.name}: division by zero.")
        return result

    def rewrite(self, op, x, w, c, conv_out):
        node = conv_out.producer()
        original = w.const_value.numpy()
        channels = self._channels(node, original.shape)
        bias_value = node.inputs[2] if len(node.inputs) > 2 else None
        bias = bias_value.const_value.numpy().astype(np.float64) if bias_value is not None else np.zeros(channels)
        factor = _channel_constant(c, channels, len(conv_out.shape))
        scale, shift = {"Mul": (factor, 0.0), "Div": (1.0 / factor, 0.0),
                        "Add": (1.0, factor), "Sub": (1.0, -factor)}[self.operator]
        scale = np.broadcast_to(scale, (channels,))
        new_bias = bias * scale + shift
        dtype = original.dtype
        if self.operator in ("Add", "Sub") and not np.isnan(original).any():
            new_weight = original  # times 1.0 in float64 and back: the same numbers, without three copies of them
        else:  # the float64 product (the float64 scale promotes the weights, no widened copy of them first)
            new_weight = self._scaled(node, original, scale).astype(dtype)
        weight_init = op.initializer(ir.Tensor(new_weight), name=f"{node.name}_w_{self.operator.lower()}")
        bias_init = op.initializer(ir.Tensor(new_bias.astype(dtype)), name=f"{node.name}_b_{self.operator.lower()}")
        attributes = {name: attribute for name, attribute in node.attributes.items()}
        return getattr(op, self.producer)(x, weight_init, bias_init, **attributes)


class ConvMulChannel(_ConvChannelAffine):
    """``Conv * c``."""

    operator = "Mul"


class ConvAddChannel(_ConvChannelAffine):
    """``Conv + c``."""

    operator = "Add"


class ConvSubChannel(_ConvChannelAffine):
    """``Conv - c``."""

    operator = "Sub"


class ConvDivChannel(_ConvChannelAffine):
    """``Conv / c``."""

    operator = "Div"


class ConvTransposeMulChannel(_ConvChannelAffine):
    """``ConvTranspose * c``."""

    operator, producer = "Mul", "ConvTranspose"


class ConvTransposeAddChannel(_ConvChannelAffine):
    """``ConvTranspose + c``."""

    operator, producer = "Add", "ConvTranspose"


class ConvTransposeSubChannel(_ConvChannelAffine):
    """``ConvTranspose - c``."""

    operator, producer = "Sub", "ConvTranspose"


class ConvTransposeDivChannel(_ConvChannelAffine):
    """``ConvTranspose / c``."""

    operator, producer = "Div", "ConvTranspose"


class _ConvRule(RewriteRuleClassBase):
    """The pattern of the rules that rewrite one Conv by its weights (a Conv, any inputs and attributes)."""

    def pattern(self, op, x, w):
        return op.Conv(x, w, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])


def _constant_weights(node: ir.Node) -> bool:
    """Whether a Conv's weights, and its bias if it has one, are constants."""
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    return node.inputs[1].const_value is not None and (bias is None or bias.const_value is not None)


class SplitWideConvKernel(_ConvRule):
    """A Conv whose kernel is wider than the NPU's window limit -> a sum of Convs over slices of the kernel.

    ``y[t] = sum_k W[k] x[t*s + k*d]`` splits over ``k`` into chunks of at most ``MAX_KERNEL`` taps: chunk
    ``i`` convolves the padded input shifted by ``i * MAX_KERNEL * d`` with its slice of the weights, and the
    chunks add up (the bias rides on the first). Exact in float. wav2vec2's positional convolution
    (kernel 128 over time) is the case that needs it. One axis per application; the rule repeats for more.
    """

    def check(self, context, x, w, y) -> MatchResult:
        from compiler_core.ops.constraints import MAX_KERNEL, MAX_STRIDE

        result = MatchResult()
        node = y.producer()
        if not _constant_weights(node):
            return result.fail(f"{node.name}: weights or bias are not constants.")
        wide = [j for j, k in enumerate(w.const_value.shape[2:]) if k > MAX_KERNEL]
        if not wide:
            return result.fail(f"{node.name}: the kernel fits the NPU window.")
        spatial = len(w.const_value.shape) - 2
        lengths = {"pads": 2 * spatial, "strides": spatial, "dilations": spatial}
        for name, length in lengths.items():
            if name in node.attributes and (len(node.attributes[name].as_ints()) != length
                                            or min(node.attributes[name].as_ints(), default=0) < (name != "pads")):
                return result.fail(f"{node.name}: malformed {name}.")
        strides = list(node.attributes["strides"].as_ints()) if "strides" in node.attributes else []
        if strides and strides[wide[0]] > MAX_STRIDE:  # Silero's STFT (stride 128): the chunks could not run either
            return result.fail(f"{node.name}: stride {strides[wide[0]]} is too large for the split convolutions.")
        auto_pad = node.attributes.get("auto_pad")
        if auto_pad is not None and auto_pad.as_string() not in ("NOTSET", ""):
            return result.fail(f"{node.name}: auto_pad {auto_pad.as_string()} (explicit pads only).")
        return result

    def rewrite(self, op, x, w, y):
        from compiler_core.ops.constraints import MAX_KERNEL

        node = y.producer()
        weight = w.const_value.numpy()
        spatial = weight.ndim - 2
        axis = next(j for j, k in enumerate(weight.shape[2:]) if k > MAX_KERNEL)
        ints = {name: list(node.attributes[name].as_ints()) for name in ("pads", "strides", "dilations")
                if name in node.attributes}
        pads = ints.get("pads", [0] * 2 * spatial)
        dilation = ints.get("dilations", [1] * spatial)[axis]
        begin, end = pads[axis], pads[axis + spatial]
        if begin or end:
            padding = [0] * 2 * weight.ndim
            padding[2 + axis], padding[2 + axis + weight.ndim] = begin, end
            x = op.Pad(x, op.initializer(ir.tensor(np.array(padding, np.int64)), name=f"{node.name}_wide_pads"))
        kernel = weight.shape[2 + axis]
        reach = dilation * (kernel - 1)  # how far past its first input a window reads
        chunk_pads = list(pads)
        chunk_pads[axis] = chunk_pads[axis + spatial] = 0
        attributes = {name: attribute for name, attribute in node.attributes.items()
                      if name not in ("pads", "kernel_shape")}
        total = None
        for index, first in enumerate(range(0, kernel, MAX_KERNEL)):
            taps = min(MAX_KERNEL, kernel - first)
            # Chunk i reads from its offset to ``reach - offset - its own reach`` before the end: counted from
            # the end, so the (possibly not yet inferred) input length is not needed.
            start = first * dilation
            short = reach - start - dilation * (taps - 1)
            stop = -short if short else np.iinfo(np.int64).max
            sliced = op.Slice(x, *(op.initializer(ir.tensor(np.array([v], np.int64)), name=f"{node.name}_wide{index}_{k}")
                                   for k, v in (("start", start), ("stop", stop), ("axis", 2 + axis))))
            part = np.take(weight, np.arange(first, first + taps), axis=2 + axis)
            inputs = [sliced, op.initializer(ir.tensor(np.ascontiguousarray(part)), name=f"{node.name}_wide{index}_w")]
            if index == 0 and len(node.inputs) > 2 and node.inputs[2] is not None:
                inputs.append(node.inputs[2])
            conv = op.Conv(*inputs, pads=chunk_pads, **attributes)
            total = conv if total is None else op.Add(total, conv)
        return total


class FramedStridedConv(_ConvRule):
    """A Conv whose stride is beyond the NPU's (and not its kernel) -> frames of ``stride`` samples as channels.

    ``y[t] = sum_m W[m] x[t*S + m]``: cut the (padded) input into frames of ``S`` samples, ``x'[c*S + j, f] =
    x[c, f*S + j]`` (Reshape, Transpose, Reshape), and the kernel into ``ceil(K / S)`` frames of its taps
    (zero-padded to whole frames), ``W'[o, c*S + j, k] = W[o, c, k*S + j]``; then ``y = Conv(x', W')`` with stride 1
    and ``ceil(K / S)`` taps. Exact in float. Silero VAD's STFT (kernel 256, stride 128, one channel) is the case:
    it ran on the CPU before. A 2-D Conv over a one-row (or one-column) input with a 1-tap kernel on that axis is
    the same 1-D convolution: basic-pitch's constant-Q transform (tf2onnx, ``[1, 1, 1, samples]``, kernel 1x256,
    stride 256 or 128). A stride equal to the kernel is the NPU's own only while the kernel fits its window.
    """

    def check(self, context, x, w, y) -> MatchResult:
        from compiler_core.ops.constraints import MAX_KERNEL, MAX_STRIDE

        result = MatchResult()
        node = y.producer()
        if not _constant_weights(node):
            return result.fail(f"{node.name}: weights or bias are not constants.")
        rank = len(w.const_value.shape)
        if rank not in (3, 4) or x.shape is None or len(x.shape) != rank \
                or not all(isinstance(dim, int) for dim in x.shape):
            return result.fail(f"{node.name}: not a 1-D (or one-row 2-D) convolution of a static input.")
        attributes = node.attributes
        kernels = list(w.const_value.shape[2:])
        strides = list(attributes.get_ints("strides", [1] * (rank - 2)))
        pads = list(attributes.get_ints("pads", [0] * 2 * (rank - 2)))
        long = [j for j, (kernel, stride) in enumerate(zip(kernels, strides))
                if stride > MAX_STRIDE and not (stride == kernel <= MAX_KERNEL)]
        if len(long) != 1:
            return result.fail(f"{node.name}: the NPU takes strides {strides} with kernel {kernels}.")
        axis = long[0]
        for other in set(range(rank - 2)) - {axis}:  # a one-row input, read by one tap, unpadded
            if x.shape[2 + other] != 1 or kernels[other] != 1 or pads[other] or pads[other + rank - 2]:
                return result.fail(f"{node.name}: the strided axis is not the only one with more than one sample.")
        kernel, stride = kernels[axis], strides[axis]
        if -(-kernel // stride) > MAX_KERNEL:
            return result.fail(f"{node.name}: {-(-kernel // stride)} frames of taps exceed the NPU window.")
        if attributes.get_int("group", 1) != 1 or set(attributes.get_ints("dilations", [1])) != {1}:
            return result.fail(f"{node.name}: grouped or dilated.")
        if attributes.get_string("auto_pad", "NOTSET") not in ("NOTSET", ""):
            return result.fail(f"{node.name}: auto_pad (explicit pads only).")
        if x.shape[2 + axis] + pads[axis] + pads[axis + rank - 2] < kernel:
            return result.fail(f"{node.name}: the input is shorter than the kernel.")
        return result

    def rewrite(self, op, x, w, y):
        from compiler_core.ops.constraints import MAX_KERNEL, MAX_STRIDE

        node = y.producer()
        attributes = node.attributes
        weight = w.const_value.numpy()
        out_channels, in_channels, *kernels = weight.shape
        spatial = len(kernels)
        strides = list(attributes.get_ints("strides", [1] * spatial))
        axis = next(j for j, (k, s) in enumerate(zip(kernels, strides)) if s > MAX_STRIDE and not (s == k <= MAX_KERNEL))
        kernel, stride = kernels[axis], strides[axis]
        all_pads = list(attributes.get_ints("pads", [0] * 2 * spatial))
        begin, end = all_pads[axis], all_pads[axis + spatial]
        batch, length = x.shape[0], x.shape[2 + axis]
        padded = length + begin + end
        outputs = (padded - kernel) // stride + 1
        taps = -(-kernel // stride)  # the kernel in whole frames
        frames = outputs - 1 + taps
        end += frames * stride - padded  # cut (or zero-pad) the input to whole frames
        if end < 0:
            x = op.Slice(x, *(op.initializer(ir.tensor(np.array([v], np.int64)), name=f"{node.name}_frames_{k}")
                              for k, v in (("start", 0), ("stop", length + end), ("axis", 2 + axis))))
            end = 0
        if begin or end:
            padding = [0] * 2 * (spatial + 2)
            padding[2 + axis], padding[2 + axis + spatial + 2] = begin, end
            x = op.Pad(x, op.initializer(ir.tensor(np.array(padding, np.int64)), name=f"{node.name}_frames_pads"))

        def shape(name: str, dims: list[int]) -> ir.Value:
            return op.initializer(ir.tensor(np.array(dims, np.int64)), name=f"{node.name}_frames_{name}")

        def unit_axes(dims: list[int], size: int) -> list[int]:  # ``size`` on the strided axis, 1 on the other
            return dims + [size if j == axis else 1 for j in range(spatial)]

        # the one-sample axis adds nothing to the layout: [B, C, 1, L] and [B, C, L] hold the samples in one order
        cut = op.Reshape(x, shape("cut", [batch, in_channels, frames, stride]))
        framed = op.Reshape(op.Transpose(cut, perm=[0, 1, 3, 2]),
                            shape("shape", unit_axes([batch, in_channels * stride], frames)))
        whole = np.zeros((out_channels, in_channels, taps * stride), weight.dtype)
        whole[:, :, :kernel] = weight.reshape(out_channels, in_channels, kernel)
        folded = whole.reshape(out_channels, in_channels, taps, stride).transpose(0, 1, 3, 2)
        inputs = [framed, op.initializer(ir.tensor(np.ascontiguousarray(folded.reshape(
            unit_axes([out_channels, in_channels * stride], taps)))), name=f"{node.name}_frames_w")]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            inputs.append(node.inputs[2])
        return op.Conv(*inputs, kernel_shape=unit_axes([], taps), strides=[1] * spatial, pads=[0] * 2 * spatial)


class LrnToConv(RewriteRuleClassBase):
    """LRN (AlexNet, GoogLeNet, ZFNet) -> ``x * Pow(Conv(x * x), -beta)`` with a banded 1x1 Conv.

    ``y = x / (bias + alpha / size * sum of x^2 over the size neighbouring channels)^beta``: the channel
    window sum is a 1x1 Conv whose weight ``W[c, i]`` is ``alpha / size`` for the channels ``i`` of ``c``'s
    window (ONNX's window: ``floor((size - 1) / 2)`` before, ``ceil((size - 1) / 2)`` after, cut at the
    edges), with ``bias`` as the Conv bias; the power is a table. Exact in float up to rounding; every
    op it leaves has an integer kernel, where LRN has none.
    """

    def pattern(self, op, x):
        return op.LRN(x, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        if x.shape is None or len(x.shape) < 3 or not isinstance(x.shape[1], int):
            return result.fail(f"{node.name}: the channel count is unknown.")
        if "size" not in node.attributes or node.attributes["size"].as_int() < 1:
            return result.fail(f"{node.name}: size must be a positive integer.")
        return result

    def rewrite(self, op, x, y):
        node = y.producer()
        attributes = node.attributes
        size = attributes["size"].as_int()
        alpha, beta, bias = (attributes[name].as_float() if name in attributes else default
                             for name, default in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
        channels, spatial = x.shape[1], len(x.shape) - 2
        index = np.arange(channels)
        offset = index[None, :] - index[:, None]  # [out, in]: input channel minus output channel
        band = (offset >= -((size - 1) // 2)) & (offset <= (size - 1) - (size - 1) // 2)
        weight = (band * (alpha / size)).astype(np.float32).reshape(channels, channels, *([1] * spatial))
        conv = op.Conv(op.Mul(x, x), op.initializer(ir.tensor(weight), name=f"{node.name}_window"),
                       op.initializer(ir.tensor(np.full(channels, bias, np.float32)), name=f"{node.name}_bias"),
                       kernel_shape=[1] * spatial)
        power = op.Pow(conv, op.initializer(ir.tensor(np.array(-beta, np.float32)), name=f"{node.name}_power"))
        return op.Mul(x, power)


def _sole_consumer(value: ir.Value, node: ir.Node, *also: ir.Node) -> bool:
    """True if moving the Transpose that produces ``value`` past ``node`` (and ``also``) leaves it unused.

    That is: ``value`` is not a graph output, and its other consumers are Transposes that undo it (they
    cancel with it, so they read its input instead).
    """
    if value.is_graph_output():
        return False
    perm = _perm(value)
    for user, _ in value.uses():
        if user is node or user in also:
            continue
        if user.op_type != "Transpose" or "perm" not in user.attributes or perm is None:
            return False
        if [perm[axis] for axis in user.attributes["perm"].as_ints()] != list(range(len(perm))):
            return False
    return True


def _perm(value: ir.Value) -> list[int] | None:
    """The permutation of the Transpose that produces ``value``, or None (no Transpose, or a default perm)."""
    producer = value.producer()
    if producer is None or producer.op_type != "Transpose" or "perm" not in producer.attributes:
        return None
    return list(producer.attributes["perm"].as_ints())


def _untransposed_constant(value: ir.Value, perm: list[int]) -> np.ndarray | None:
    """A constant operand of an element-wise op on ``Transpose(x, perm)``, brought to ``x``'s axis order."""
    if value.const_value is None or len(value.const_value.shape) > len(perm):
        return None
    array = value.const_value.numpy()
    full = array.reshape([1] * (len(perm) - array.ndim) + list(array.shape))
    return np.ascontiguousarray(np.transpose(full, np.argsort(perm))) if array.ndim else array


_TRANSPOSE_UNARY_OPS = ("Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu",
                        "Celu", "Softplus", "Softsign", "Mish", "Gelu", "Erf", "Exp", "Log", "Sqrt", "Reciprocal",
                        "Abs", "Neg", "Clip")
"""Element-wise ops of one tensor (their other inputs, if any, scalars or PRelu's slope) a Transpose moves past."""
_TRANSPOSE_BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")
"""Element-wise ops of two tensors a Transpose of both moves past (or of one, the other a constant)."""


class _TransposeDown(RewriteRuleClassBase):
    """``op(Transpose(x), ...)`` -> ``Transpose(op(x, ...))`` for an element-wise ``op``.

    The TFLite and Keras frontends wrap every NCHW operation in a Transpose pair and leave element-wise
    ops in NHWC, so a residual ``Add`` or a standalone activation keeps a Transpose on each side (FER's
    mini-Xception: 16 Transposes among 55 nodes). Moving the Transpose after the op meets the one behind
    it, and the two cancel. Applies when the other operands are transposed the same way or are constants
    (brought to the untransposed order), and one moved Transpose feeds only this op, so the count never
    grows (a shared one stays for its other consumers). Exact: element-wise ops commute with a permutation of the axes.
    """

    operator = ""
    moved = (0,)
    """The operands that are Transposes moved past the op; the others must be constants."""

    def pattern(self, op, x):
        return getattr(op, self.operator)(op.Transpose(x, _allow_other_attributes=True), _allow_other_inputs=True,
                                          _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, y, **_) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        if len(node.inputs) <= max(self.moved) or any(node.inputs[i] is None for i in self.moved):
            return result.fail(f"{node.name}: missing operands.")
        perms = [_perm(node.inputs[i]) for i in self.moved]
        if perms[0] is None or any(perm != perms[0] for perm in perms):
            return result.fail(f"{node.name}: its operands are not transposed the same way.")
        if not any(_sole_consumer(node.inputs[i], node) for i in self.moved):  # else the count would grow
            return result.fail(f"{node.name}: its transposed operands have other consumers.")
        any_constant = self.operator in _TRANSPOSE_BINARY_OPS or self.operator == "PRelu"
        for i, value in enumerate(node.inputs):
            if i in self.moved or value is None:
                continue
            constant = _untransposed_constant(value, perms[0])
            if constant is None or (constant.size != 1 and not any_constant):
                return result.fail(f"{node.name}: operand {i} is not a constant that broadcasts.")
        return result

    def rewrite(self, op, y, **_):
        node = y.producer()
        perm = _perm(node.inputs[self.moved[0]])
        inputs = []
        for i, value in enumerate(node.inputs):
            if i in self.moved:
                inputs.append(value.producer().inputs[0])
            elif value is None or value.const_value.size == 1:  # a scalar broadcasts the same either way
                inputs.append(value)
            else:
                inputs.append(op.initializer(ir.tensor(_untransposed_constant(value, perm)),
                                             name=f"{node.name}_operand{i}_untransposed"))
        return op.Transpose(getattr(op, self.operator)(*inputs, **dict(node.attributes.items())), perm=perm)


class _TransposeDownBoth(_TransposeDown):
    """Both operands of a binary op transposed the same way."""

    moved = (0, 1)

    def pattern(self, op, x, z):
        return getattr(op, self.operator)(op.Transpose(x, _allow_other_attributes=True),
                                          op.Transpose(z, _allow_other_attributes=True), _outputs=["y"])


class _TransposeDownSecond(_TransposeDown):
    """A constant first, then a transposed operand (``c - Transpose(x)``)."""

    moved = (1,)

    def pattern(self, op, c, x):
        return getattr(op, self.operator)(c, op.Transpose(x, _allow_other_attributes=True), _outputs=["y"])


class _TransposeDownGated(RewriteRuleClassBase):
    """``Mul(t, Sigmoid(t))`` with ``t = Transpose(x)`` -> ``Transpose(Mul(x, Sigmoid(x)))``: a gated activation.

    TFLite writes Keras's swish (EfficientNet, every SE block) as ``x * sigmoid(x)`` on NHWC, so the one
    Transpose feeds two ops and neither :class:`_TransposeDown` rule may move it (each would leave it for the
    other): EfficientNetB0 kept 130 Transposes. Moved past both at once, it meets the next one and cancels.
    """

    gate = ""
    gate_first = False
    """Operand order of the ``Mul`` (the rule set lists both)."""

    def pattern(self, op, x):
        moved = op.Transpose(x, _allow_other_attributes=True, _outputs=["moved"])
        gated = getattr(op, self.gate)(moved, _allow_other_attributes=True)
        return op.Mul(gated, moved, _outputs=["y"]) if self.gate_first else op.Mul(moved, gated, _outputs=["y"])

    def check(self, context, x, moved, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        gate = node.inputs[0 if self.gate_first else 1].producer()
        if gate.outputs[0].is_graph_output() or len(gate.outputs[0].uses()) != 1:
            return result.fail(f"{node.name}: its gate is read elsewhere too.")
        if _perm(moved) is None or not _sole_consumer(moved, node, gate):
            return result.fail(f"{node.name}: the Transpose has other consumers.")
        return result

    def rewrite(self, op, x, moved, y):
        node = y.producer()
        gate = node.inputs[0 if self.gate_first else 1].producer()
        gated = getattr(op, self.gate)(x, **dict(gate.attributes.items()))
        product = op.Mul(gated, x) if self.gate_first else op.Mul(x, gated)
        return op.Transpose(product, perm=_perm(moved))


_TRANSPOSE_GATES = ("Sigmoid", "HardSigmoid", "Tanh")
"""Gates of ``x * gate(x)`` activations TFLite writes out (swish, hard-swish, the tanh-gated ones)."""


class _TransposeDownReduce(RewriteRuleClassBase):
    """``Reduce(Transpose(x, p), axes)`` -> ``Reduce(x, p[axes])``, transposed after only if the kept axes move.

    A Keras global average pool is a ReduceMean over NHWC's H and W: with the axes mapped through the
    permutation, it reads the NCHW tensor directly and the channels come out in the same order.
    """

    operator = ""

    def pattern(self, op, x, axes):
        return getattr(op, self.operator)(op.Transpose(x, _allow_other_attributes=True), axes,
                                          _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, axes, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        perm = _perm(node.inputs[0])
        if perm is None or not _sole_consumer(node.inputs[0], node):
            return result.fail(f"{node.name}: not a Transpose this op alone reads.")
        if axes.const_value is None or axes.const_value.size == 0:
            return result.fail(f"{node.name}: the axes are not a non-empty constant.")
        if any(not -len(perm) <= a < len(perm) for a in axes.const_value.numpy().reshape(-1).tolist()):
            return result.fail(f"{node.name}: an axis is out of range.")
        return result

    def rewrite(self, op, x, axes, y):
        node = y.producer()
        perm = _perm(node.inputs[0])
        reduced = sorted({a % len(perm) for a in axes.const_value.numpy().reshape(-1).tolist()})
        source_axes = np.array(sorted(perm[a] for a in reduced), np.int64)
        attributes = dict(node.attributes.items())
        keepdims = attributes["keepdims"].as_int() if "keepdims" in attributes else 1
        out = getattr(op, self.operator)(x, op.initializer(ir.tensor(source_axes), name=f"{node.name}_source_axes"),
                                         **attributes)
        if keepdims:
            return op.Transpose(out, perm=perm)
        kept = [perm[i] for i in range(len(perm)) if i not in reduced]  # source axes in output order
        order = [sorted(kept).index(a) for a in kept]
        return out if order == sorted(order) else op.Transpose(out, perm=order)


class TransposeDownPad(RewriteRuleClassBase):
    """``Pad(Transpose(x, p), pads)`` -> ``Transpose(Pad(x, pads'), p)``: each axis keeps its own padding.

    BlazeFace-style residual blocks pad the shortcut's channels on NHWC's last axis before the Add.
    """

    def pattern(self, op, x, pads):
        return op.Pad(op.Transpose(x, _allow_other_attributes=True), pads, _allow_other_inputs=True,
                      _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, pads, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        perm = _perm(node.inputs[0])
        if perm is None or not _sole_consumer(node.inputs[0], node):
            return result.fail(f"{node.name}: not a Transpose this op alone reads.")
        if pads.const_value is None or pads.const_value.size != 2 * len(perm):
            return result.fail(f"{node.name}: the pads are not a constant for every axis.")
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            return result.fail(f"{node.name}: explicit axes.")
        return result

    def rewrite(self, op, x, pads, y):
        node = y.producer()
        perm = _perm(node.inputs[0])
        inverse = np.argsort(perm)
        begins, ends = pads.const_value.numpy().reshape(2, -1)
        source_pads = np.concatenate([begins[inverse], ends[inverse]]).astype(np.int64)
        inputs = [x, op.initializer(ir.tensor(source_pads), name=f"{node.name}_source_pads"), *node.inputs[2:]]
        return op.Transpose(op.Pad(*inputs, **dict(node.attributes.items())), perm=perm)


class TransposeDownConcat(RewriteRuleClassBase):
    """``Concat(Transpose(a, p), Transpose(b, p), ..., axis=k)`` -> ``Transpose(Concat(a, b, ..., axis=p[k]), p)``."""

    def pattern(self, op, inputs):
        return op.Concat(inputs, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, inputs, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        perms = [_perm(value) if value is not None else None for value in node.inputs]
        if not perms or perms[0] is None or any(perm != perms[0] for perm in perms):
            return result.fail(f"{node.name}: its inputs are not all transposed the same way.")
        if not any(_sole_consumer(value, node) for value in node.inputs):  # else the count would grow
            return result.fail(f"{node.name}: its transposed inputs have other consumers.")
        return result

    def rewrite(self, op, inputs, y):
        node = y.producer()
        perm = _perm(node.inputs[0])
        axis = node.attributes["axis"].as_int() % len(perm)
        sources = [value.producer().inputs[0] for value in node.inputs]
        return op.Transpose(op.Concat(*sources, axis=perm[axis]), perm=perm)


def _transpose_down_rules() -> list:
    """Every Transpose-moving rule. ``remove_nodes=False``: a moved Transpose that its inverse also reads stays
    until that pair cancels, then the unused nodes go."""
    def rule(base, operator, suffix=""):
        return type(f"TransposeDown{operator}{suffix}", (base,), {"operator": operator}).rule(remove_nodes=False)

    rules = [rule(_TransposeDown, operator) for operator in _TRANSPOSE_UNARY_OPS + _TRANSPOSE_BINARY_OPS]
    rules += [rule(_TransposeDownReduce, operator)
              for operator in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceL2")]
    rules += [TransposeDownPad.rule(remove_nodes=False), TransposeDownConcat.rule(remove_nodes=False)]
    rules += [type(f"TransposeDownGated{gate}{'First' if first else ''}", (_TransposeDownGated,),
                   {"gate": gate, "gate_first": first}).rule(remove_nodes=False)
              for gate in _TRANSPOSE_GATES for first in (False, True)]
    for operator in _TRANSPOSE_BINARY_OPS:
        rules += [rule(_TransposeDownBoth, operator, "Both"), rule(_TransposeDownSecond, operator, "Second")]
    return rules


_QUANTIZED_RANGES = {ir.DataType.INT8: (-128, 127), ir.DataType.UINT8: (0, 255), ir.DataType.INT16: (-32768, 32767),
                     ir.DataType.UINT16: (0, 65535)}


class FakeQuantToClip(RewriteRuleClassBase):
    """``DequantizeLinear(QuantizeLinear(x, s, z), s, z)`` on activations -> ``Clip(x, (qmin - z) s, (qmax - z) s)``.

    A model already quantized with QDQ nodes (onnxruntime's ``quantize_static``, TensorFlow QAT exports) marks
    each activation with such a pair; its weights' DequantizeLinear fold as constants. The compiler
    calibrates and quantizes on its own, so the pair is read as the float function it approximates: the
    value saturated to the integer range (a ReLU6 encoded in the range stays a clamp), without the rounding.
    Only one scale and zero point per tensor, the same in both nodes.
    """

    def pattern(self, op, x, scale, zero_point, scale2, zero_point2):
        quantized = op.QuantizeLinear(x, scale, zero_point, _allow_other_attributes=True)
        return op.DequantizeLinear(quantized, scale2, zero_point2, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, scale, zero_point, scale2, zero_point2, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        constants = [v.const_value for v in (scale, zero_point, scale2, zero_point2)]
        if any(c is None or c.size != 1 for c in constants):
            return result.fail(f"{node.name}: scales and zero points are not one constant each.")
        if zero_point.dtype not in _QUANTIZED_RANGES:
            return result.fail(f"{node.name}: {zero_point.dtype} codes.")
        if (float(constants[0].numpy()) != float(constants[2].numpy())
                or int(constants[1].numpy()) != int(constants[3].numpy()) or float(constants[0].numpy()) <= 0):
            return result.fail(f"{node.name}: the two nodes use different scales or zero points.")
        return result

    def rewrite(self, op, x, scale, zero_point, scale2, zero_point2, y):
        node = y.producer()
        step, zero = float(scale.const_value.numpy()), int(zero_point.const_value.numpy())
        low, high = _QUANTIZED_RANGES[zero_point.dtype]
        bounds = [op.initializer(ir.tensor(np.array((code - zero) * step, np.float32)), name=f"{node.name}_{name}")
                  for name, code in (("low", low), ("high", high))]
        return op.Clip(x, *bounds)


class _FakeQuantMoveToClip(FakeQuantToClip):
    """The same pair with one data-movement op between (tf2onnx writes ``Q -> Transpose -> DQ``): the Clip, then
    the move, with its own attributes and shape operand."""

    mover = ""

    def pattern(self, op, x, scale, zero_point, scale2, zero_point2):
        quantized = op.QuantizeLinear(x, scale, zero_point, _allow_other_attributes=True)
        moved = getattr(op, self.mover)(quantized, _allow_other_inputs=True, _allow_other_attributes=True,
                                        _outputs=["moved"])
        return op.DequantizeLinear(moved, scale2, zero_point2, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, scale, zero_point, scale2, zero_point2, y, moved) -> MatchResult:
        return super().check(context, x, scale, zero_point, scale2, zero_point2, y)

    def rewrite(self, op, x, scale, zero_point, scale2, zero_point2, y, moved):
        mover = moved.producer()
        clipped = super().rewrite(op, x, scale, zero_point, scale2, zero_point2, y)
        return getattr(op, self.mover)(clipped, *mover.inputs[1:], **dict(mover.attributes.items()))


def _fake_quant_rules() -> list:
    movers = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
    return [FakeQuantToClip.rule(remove_nodes=False)] + [
        type(f"FakeQuant{mover}ToClip", (_FakeQuantMoveToClip,), {"mover": mover}).rule(remove_nodes=False)
        for mover in movers]


def _collapsed_transpose(shape: list[int], perm: list[int]) -> tuple[list[int], list[int]]:
    """The fewest axes a Transpose of ``shape`` by ``perm`` can be written with: ``(shape', perm')``.

    Size-1 axes go; axes that stay neighbours in the same order under ``perm`` merge into one.
    """
    kept = [axis for axis in perm if shape[axis] != 1]
    order = sorted(kept)
    renumbered = [order.index(axis) for axis in kept]
    groups: list[list[int]] = []  # runs of input axes, in output order
    for axis in renumbered:
        if groups and axis == groups[-1][-1] + 1:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    by_input = sorted(groups)
    new_shape = [int(np.prod([shape[order[axis]] for axis in group])) for group in by_input]
    return new_shape, [by_input.index(group) for group in groups]


class CollapseHighRankTranspose(RewriteRuleClassBase):
    """``Reshape -> Transpose -> Reshape`` through a tensor of more axes than the NPU has -> fewer axes.

    Swin's window partition is ``view(B, H/w, w, W/w, w, C).permute(0, 1, 3, 2, 4, 5)``: rank 6, while
    the NPU's tensors have at most 5 axes. Dropping size-1 axes and merging axes that stay neighbours
    under the permutation gives the same elements in the same order with fewer axes (rank 4 here).
    """

    def pattern(self, op, x, s1, s2):
        inner = op.Reshape(x, s1, _allow_other_attributes=True, _outputs=["inner"])
        moved = op.Transpose(inner, _allow_other_attributes=True, _outputs=["moved"])
        return op.Reshape(moved, s2, _allow_other_attributes=True)

    def check(self, context, x, s1, s2, inner, moved) -> MatchResult:
        from compiler_core.ops import MAX_RANK

        result = MatchResult()
        node = moved.producer()
        if inner.shape is None or not all(isinstance(d, int) for d in inner.shape) or len(inner.shape) <= MAX_RANK:
            return result.fail(f"{node.name}: the tensor fits the NPU's rank.")
        if len(inner.uses()) != 1 or len(moved.uses()) != 1 or moved.is_graph_output() or inner.is_graph_output():
            return result.fail(f"{node.name}: the intermediate tensors have other consumers.")
        if s2.const_value is None or "perm" not in node.attributes:
            return result.fail(f"{node.name}: the target shape or the permutation is not constant.")
        if sorted(node.attributes["perm"].as_ints()) != list(range(len(inner.shape))):
            return result.fail(f"{node.name}: the permutation does not match the rank.")
        shape, _ = _collapsed_transpose(list(inner.shape), list(node.attributes["perm"].as_ints()))
        if len(shape) > MAX_RANK:
            return result.fail(f"{node.name}: still rank {len(shape)} after merging axes.")
        return result

    def rewrite(self, op, x, s1, s2, inner, moved):
        node = moved.producer()
        shape, perm = _collapsed_transpose(list(inner.shape), list(node.attributes["perm"].as_ints()))
        target = op.initializer(ir.tensor(np.array(shape, np.int64)), name=f"{node.name}_collapsed_shape")
        return op.Reshape(op.Transpose(op.Reshape(x, target), perm=perm), s2)


def _last_axis(value: ir.Value, rank: int) -> bool:
    const = value.const_value
    return const is not None and const.size == 1 and int(const.numpy().reshape(())) % rank == rank - 1


class _WrittenOutLayerNorm(RewriteRuleClassBase):
    """``(x - mean(x)) / sqrt(mean((x - mean(x))**2) + eps)`` over the last axis -> ``LayerNormalization``.

    Exporters (Paddle, older torch) write LayerNorm out; quantized step by step, its ``Div`` of two
    activations and its tiny variance lose most of the signal. The fused node is the MFU's int16
    normalisation routine; the scale and shift that follow fold into it (``LayerNormAffine``).
    """

    def check(self, context, x, axes, axes2, two, epsilon, **_) -> MatchResult:
        result = MatchResult()
        if x.shape is None:
            return result.fail("the input rank is unknown")
        rank = len(x.shape)
        if not (_last_axis(axes, rank) and _last_axis(axes2, rank)):
            return result.fail("the means are not over the last axis")
        if not _is_scalar(two, 2.0, 0.0):
            return result.fail("the exponent is not 2")
        if epsilon.const_value is None or epsilon.const_value.size != 1:
            return result.fail("epsilon is not a constant scalar")
        return result

    def rewrite(self, op, x, epsilon, **_):
        width = int(x.shape[-1])
        dtype = x.dtype.numpy() if x.dtype is not None else np.float32
        ones = op.initializer(ir.Tensor(np.ones(width, dtype=dtype)), name=f"{x.name}_ln_scale")
        zeros = op.initializer(ir.Tensor(np.zeros(width, dtype=dtype)), name=f"{x.name}_ln_bias")
        eps = float(epsilon.const_value.numpy().reshape(()))
        return op.LayerNormalization(x, ones, zeros, axis=-1, epsilon=eps)


class WrittenOutLayerNormDiv(_WrittenOutLayerNorm):
    """Normalized by ``Div(d, std)``."""

    def pattern(self, op, x, axes, axes2, two, epsilon):
        deviation = op.Sub(x, op.ReduceMean(x, axes, _allow_other_attributes=True))
        variance = op.ReduceMean(op.Pow(deviation, two), axes2, _allow_other_attributes=True)
        return op.Div(deviation, op.Sqrt(op.Add(variance, epsilon)))


class WrittenOutLayerNormReciprocal(_WrittenOutLayerNorm):
    """Normalized by ``Mul(d, Reciprocal(std))``."""

    def pattern(self, op, x, axes, axes2, two, epsilon):
        deviation = op.Sub(x, op.ReduceMean(x, axes, _allow_other_attributes=True))
        variance = op.ReduceMean(op.Pow(deviation, two), axes2, _allow_other_attributes=True)
        return op.Mul(deviation, op.Reciprocal(op.Sqrt(op.Add(variance, epsilon))))


class _LayerNormAffine(RewriteRuleClassBase):
    """``LayerNormalization(x, s, b) * g`` or ``+ c`` (constants over the last axis) folded into ``s`` and ``b``."""

    operator = ""

    def pattern(self, op, x, scale, bias, c):
        norm = op.LayerNormalization(x, scale, bias, _allow_other_attributes=True, _outputs=["norm"])
        return getattr(op, self.operator)(norm, c)

    def check(self, context, x, scale, bias, c, norm) -> MatchResult:
        result = MatchResult()
        node = norm.producer()
        if len(norm.uses()) != 1 or norm.is_graph_output() or len(node.outputs) > 1:
            return result.fail(f"{node.name}: the normalized output has other consumers")
        if node.attributes.get_int("axis", -1) % len(norm.shape) != len(norm.shape) - 1:
            return result.fail(f"{node.name}: not normalized over the last axis only")
        if scale.const_value is None or bias.const_value is None or self._vector(c, norm) is None:
            return result.fail(f"{node.name}: scale, bias or the {self.operator} operand is not constant")
        return result

    @staticmethod
    def _vector(c: ir.Value, norm: ir.Value) -> np.ndarray | None:
        const = c.const_value
        width = int(norm.shape[-1])
        if const is None:
            return None
        array = const.numpy().astype(np.float64)
        if array.size == 1:
            return np.full(width, float(array.reshape(())))
        if array.size == width and array.shape[-1] == width and array.ndim <= len(norm.shape):
            return array.reshape(-1)
        return None

    def rewrite(self, op, x, scale, bias, c, norm):
        node = norm.producer()
        vector = self._vector(c, norm)
        width = vector.size
        gamma = np.broadcast_to(scale.const_value.numpy().astype(np.float64).reshape(-1), (width,))
        beta = np.broadcast_to(bias.const_value.numpy().astype(np.float64).reshape(-1), (width,))
        gamma, beta = (gamma * vector, beta * vector) if self.operator == "Mul" else (gamma, beta + vector)
        dtype = scale.const_value.numpy().dtype
        new_scale = op.initializer(ir.Tensor(gamma.astype(dtype)), name=f"{node.name}_scale_{self.operator.lower()}")
        new_bias = op.initializer(ir.Tensor(beta.astype(dtype)), name=f"{node.name}_bias_{self.operator.lower()}")
        return op.LayerNormalization(x, new_scale, new_bias, **dict(node.attributes.items()))


class LayerNormMul(_LayerNormAffine):
    """``LayerNorm * g``."""

    operator = "Mul"


class LayerNormAdd(_LayerNormAffine):
    """``LayerNorm + c``."""

    operator = "Add"


_MAX_WEIGHT_BATCH = 64
"""Most batch entries a constant MatMul weight is split into (one dense layer each)."""


class MatMulBatchedWeight(RewriteRuleClassBase):
    """``MatMul(x, w)`` with a constant ``w`` that has batch axes -> dense layers the NPU runs.

    ``torch.matmul(x, w)`` with a ``[1, K, N]`` parameter broadcasts the unit batch axes: when ``x`` has
    at least ``w``'s rank, dropping them changes no output shape, and the product is one dense layer.
    A per-head weight ``[H, K, N]`` (``x`` is ``[.., H, M, K]``) becomes H dense layers over the slices
    of ``x`` along axis -3, concatenated back.
    """

    def pattern(self, op, x, w):
        return op.MatMul(x, w, _outputs=["y"])

    def check(self, context, x, w, y) -> MatchResult:
        result = MatchResult()
        if w.const_value is None or w.shape is None or x.shape is None:
            return result.fail("the weight is not a constant of known shape")
        shape, x_shape = list(w.shape), list(x.shape)
        if len(shape) < 3 or len(x_shape) < len(shape):
            return result.fail("the weight has no batch axes, or x broadcasts against it")
        batch = [d for d in shape[:-2] if d != 1]
        if not batch:
            return result
        if len(batch) > 1 or shape[-3] != batch[0] or x_shape[-3] != batch[0] or batch[0] > _MAX_WEIGHT_BATCH:
            return result.fail("the weight's batch axes are not one per-slice axis -3 that x shares")
        return result

    def rewrite(self, op, x, w, y):
        node = y.producer()
        weight = w.const_value.numpy()
        matrices = weight.reshape(-1, *weight.shape[-2:])
        if len(matrices) == 1:
            return op.MatMul(x, op.initializer(ir.Tensor(matrices[0]), name=f"{node.name}_w2d"))
        slices = op.Split(x, axis=-3, num_outputs=len(matrices), _outputs=len(matrices))
        products = [op.MatMul(part, op.initializer(ir.Tensor(np.ascontiguousarray(matrix)), name=f"{node.name}_w{h}"))
                    for h, (part, matrix) in enumerate(zip(slices, matrices))]
        return op.Concat(*products, axis=-3)


class MatMulConstantFirst(RewriteRuleClassBase):
    """``MatMul(c, x)`` with a constant first operand -> ``Transpose(MatMul(Transpose(x), c'))``, a dense layer.

    ``c @ x = (x' @ c')'`` (``'`` swaps the last two axes). DETR's first decoder layer attends from its learned
    queries (zero targets plus constant position embeddings: a constant after folding) to the encoder's memory:
    the dense-layer kernel takes constant weights as the second operand only. A batched ``c'`` is then split by
    :class:`MatMulBatchedWeight`.
    """

    def pattern(self, op, c, x):
        return op.MatMul(c, x, _outputs=["y"])

    def check(self, context, c, x, y) -> MatchResult:
        result = MatchResult()
        if c.const_value is None or x.const_value is not None:
            return result.fail("the first operand is not a constant, or both are")
        if c.shape is None or x.shape is None or len(c.shape) < 2 or len(x.shape) < 2:
            return result.fail("an operand is a vector or of unknown rank")
        return result

    def rewrite(self, op, c, x, y):
        node = y.producer()
        swap = lambda rank: [*range(rank - 2), rank - 1, rank - 2]  # noqa: E731
        weight = np.ascontiguousarray(np.swapaxes(c.const_value.numpy(), -1, -2))
        product = op.MatMul(op.Transpose(x, perm=swap(len(x.shape))),
                            op.initializer(ir.Tensor(weight), name=f"{node.name}_ct"))
        return op.Transpose(product, perm=swap(max(len(x.shape), len(c.shape))))


class GemmToMatMul(RewriteRuleClassBase):
    """A Gemm the dense-layer kernel cannot take (``transA=1``, a non-constant ``B`` or ``C``) -> ``MatMul`` (+ ``Add``).

    ``alpha * A' @ B' + beta * C`` with ``A'``/``B'`` transposed as the attributes say: the MatMul is a dense layer
    when ``B`` is a constant and a product of two activations otherwise, both of which the NPU runs.
    """

    def pattern(self, op, a, b):
        return op.Gemm(a, b, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, a, b, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        trans_a = node.attributes.get("transA")
        c = node.inputs[2] if len(node.inputs) > 2 else None
        if (trans_a is None or trans_a.value == 0) and b.const_value is not None and (c is None or c.const_value is not None):
            return result.fail("a plain Gemm with constant weights and bias is a dense layer as it is")
        if c is not None and (c.shape is None or y.shape is None or len(c.shape) > len(y.shape)):
            return result.fail("the shape of C is unknown")
        return result

    def rewrite(self, op, a, b, y):
        node = y.producer()
        attribute = lambda name, default: node.attributes[name].value if name in node.attributes else default  # noqa: E731
        left = op.Transpose(a, perm=[1, 0]) if attribute("transA", 0) else a
        right = op.Transpose(b, perm=[1, 0]) if attribute("transB", 0) else b
        product = op.MatMul(left, right)
        alpha, beta = float(attribute("alpha", 1.0)), float(attribute("beta", 1.0))
        if alpha != 1.0:
            product = op.Mul(product, op.Constant(value=ir.tensor(np.array(alpha, np.float32))))
        c = node.inputs[2] if len(node.inputs) > 2 else None
        if c is None:
            return product
        if beta != 1.0:
            c = op.Mul(c, op.Constant(value=ir.tensor(np.array(beta, np.float32))))
        return op.Add(product, c)


class WrapPadToConcat(RewriteRuleClassBase):
    """``Pad(x, pads, mode="wrap")`` (``padding_mode="circular"``) -> per padded axis, ``Concat`` of the input's
    last ``begin`` entries, the input and its first ``end`` entries (exact; Slice and Concat run on the NPU)."""

    def pattern(self, op, x, pads):
        return op.Pad(x, pads, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, pads, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        mode = node.attributes.get("mode")
        if mode is None or mode.value != "wrap":
            return result.fail(f"{node.name}: not a wrap Pad.")
        if x.shape is None or not all(isinstance(d, int) for d in x.shape):
            return result.fail(f"{node.name}: the input shape is not static.")
        if pads.const_value is None or pads.const_value.size != 2 * len(x.shape):
            return result.fail(f"{node.name}: the pads are not a constant for every axis.")
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            return result.fail(f"{node.name}: explicit axes.")
        amounts = pads.const_value.numpy().reshape(2, -1)
        if np.any(amounts < 0) or np.any(amounts > np.asarray(list(x.shape))):
            return result.fail(f"{node.name}: a pad is negative or wider than its axis.")
        return result

    def rewrite(self, op, x, pads, y):
        node = y.producer()
        begins, ends = pads.const_value.numpy().reshape(2, -1)
        value = x

        def constant(values, name):
            return op.initializer(ir.tensor(np.asarray(values, np.int64)), name=f"{node.name}_{name}")

        for axis, (begin, end) in enumerate(zip(begins.tolist(), ends.tolist())):
            if not begin and not end:
                continue
            parts = []
            if begin:
                parts.append(op.Slice(value, constant([-begin], f"start{axis}"),
                                      constant([np.iinfo(np.int64).max], f"stop{axis}"), constant([axis], f"axis{axis}")))
            parts.append(value)
            if end:
                parts.append(op.Slice(value, constant([0], f"zero{axis}"), constant([end], f"end{axis}"),
                                      constant([axis], f"axis_end{axis}")))
            value = op.Concat(*parts, axis=axis)
        return value if value is not x else op.Identity(x)


class LogSoftmaxToExpLog(RewriteRuleClassBase):
    """``LogSoftmax(x)`` -> ``d - Log(ReduceSum(Exp(d)))`` with ``d = x - ReduceMax(x)`` over the same axis.

    The stable form of the definition; every op has an NPU kernel (Exp and Log look-up tables, vector reductions).
    ``Log(Softmax(x))`` would not do: int8 probabilities round small ones to 0.
    """

    def pattern(self, op, x):
        return op.LogSoftmax(x, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, y) -> MatchResult:
        result = MatchResult()
        if x.shape is None:
            return result.fail("the input rank is unknown")
        return result

    def rewrite(self, op, x, y):
        node = y.producer()
        axis = node.attributes["axis"].value if "axis" in node.attributes else -1
        axes = op.initializer(ir.tensor(np.array([axis], np.int64)), name=f"{node.name}_axes")
        shifted = op.Sub(x, op.ReduceMax(x, axes, keepdims=1))
        return op.Sub(shifted, op.Log(op.ReduceSum(op.Exp(shifted), axes, keepdims=1)))


class ClipRuntimeBounds(RewriteRuleClassBase):
    """A Clip whose bound is computed at run time -> ``Min(Max(x, low), high)``.

    The NPU's Clip takes its bounds at compile time; an element-wise Max/Min takes them as a tensor. openWakeWord's
    log-mel front end clamps to ``max(x) - 80 dB`` (``Clip(x, ReduceMax(x) - 80)``, librosa's ``top_db``). Exact,
    low bound above the high one included: both give ``high`` then. A constant bound rides along (the library's
    rule folds a Max or Min by a constant back into a Clip).
    """

    def pattern(self, op, x):
        return op.Clip(x, _allow_other_inputs=True, _outputs=["y"])

    def check(self, context, x, y) -> MatchResult:
        result = MatchResult()
        bounds = [value for value in y.producer().inputs[1:3] if value is not None and value.name]
        if not any(value.const_value is None for value in bounds):
            return result.fail("the Clip's bounds are constants (or absent).")
        return result

    def rewrite(self, op, x, y):
        inputs = list(y.producer().inputs) + [None, None]
        low, high = inputs[1], inputs[2]
        if low is not None and low.name:
            x = op.Max(x, low)
        if high is not None and high.name:
            x = op.Min(x, high)
        return x


class GatherCastIds(RewriteRuleClassBase):
    """``Gather(table, Cast(ids, to=int64))`` -> ``Gather(table, ids)`` when ``ids`` is an int32 model input.

    TF/TFLite exports and byte models (Magika) feed int32 token ids and cast them to int64 for the lookup;
    Gather takes int32 indices as they are, and the lookup of a model input runs on the NPU (the Cast to an
    integer type does not).
    """

    def pattern(self, op, table, ids):
        return op.Gather(table, op.Cast(ids, _allow_other_attributes=True), _allow_other_attributes=True,
                         _outputs=["y"])

    def check(self, context, table, ids, y) -> MatchResult:
        result = MatchResult()
        cast = y.producer().inputs[1].producer()
        target = cast.attributes.get("to")
        if not ids.is_graph_input() or ids.dtype != ir.DataType.INT32:
            return result.fail("the cast values are not an int32 model input (Gather takes int32 or int64 indices)")
        if target is None or ir.DataType(target.value) != ir.DataType.INT64:
            return result.fail("the Cast is not to int64")
        return result

    def rewrite(self, op, table, ids, y):
        node = y.producer()
        return op.Gather(table, ids, **dict(node.attributes.items()))


class WholeSlice(RewriteRuleClassBase):
    """A ``Slice`` that keeps its whole input (static shapes, every step 1) -> its input.

    The library's rule matches a Slice with all five inputs; torch's TorchScript exporter writes four (no steps), as in
    the unrolled loop of an ``nn.EmbeddingBag`` (``ids[offsets[i]:offsets[i + 1]]`` of its only bag), where the
    Slice of the integer ids left a refused integer op before the lookup.
    """

    def pattern(self, op, x):
        return op.Slice(x, _allow_other_inputs=True, _outputs=["y"])

    def check(self, context, x, y) -> MatchResult:
        result = MatchResult()
        steps = y.producer().inputs[4] if len(y.producer().inputs) > 4 else None
        if steps is not None and (steps.const_value is None or not np.all(steps.const_value.numpy() == 1)):
            return result.fail("the Slice has steps other than 1")
        if not _static_shape(x) or not _static_shape(y) or list(x.shape) != list(y.shape):
            return result.fail("the Slice's output shape is not its input's (or is not static)")
        return result

    def rewrite(self, op, x, y):
        return op.Identity(x)


class GatherReshapedIds(RewriteRuleClassBase):
    """``Gather(table, Reshape(ids))`` (axis 0) -> ``Reshape(Gather(table, ids))`` when ``ids`` is an integer model input.

    The lookup of a model input runs on the NPU; a Reshape of its integer ids does not (``nn.EmbeddingBag``'s
    TorchScript export flattens the ids of its bags first). Reshaping the rows looked up instead is the same result.
    """

    def pattern(self, op, table, ids, shape):
        return op.Gather(table, op.Reshape(ids, shape, _allow_other_attributes=True), _allow_other_attributes=True,
                         _outputs=["y"])

    def check(self, context, table, ids, shape, y) -> MatchResult:
        result = MatchResult()
        axis = y.producer().attributes.get("axis")
        if axis is not None and axis.value != 0:
            return result.fail("the Gather is not along axis 0")
        if table.const_value is None or not ids.is_graph_input() or ids.dtype not in (ir.DataType.INT32,
                                                                                     ir.DataType.INT64):
            return result.fail("the reshaped values are not integer model ids looked up in a constant table")
        if shape.const_value is None or np.any(shape.const_value.numpy() == 0):
            return result.fail("the ids' new shape is not a constant without 0 (copied) dimensions")
        return result

    def rewrite(self, op, table, ids, shape, y):
        rows = np.concatenate([shape.const_value.numpy().astype(np.int64), np.array(table.shape[1:], np.int64)])
        target = op.initializer(ir.tensor(rows), name=f"{y.producer().name}_rows_shape")
        return op.Reshape(op.Gather(table, ids, axis=0), target)


class FiniteWhereFill(RewriteRuleClassBase):
    """``Where(c, a, b)`` with a constant branch holding ``-inf`` (or ``inf``) -> the same with float32's extreme.

    A padding mask built at run time, ``Where(key_padding_mask, -inf, 0)`` (``nn.MultiheadAttention`` with a
    ``key_padding_mask``, exported by TorchScript), calibrated as the range [0, 0]: statistics count infinities as 0,
    so the mask quantized to all zeros and the attention ignored it (Softmax SQNR 7.4 dB). With -3.4e38 the mask is
    the large negative fill the quantizer saturates (as a ``masked_fill(mask, finfo.min)`` is); in FP32 the scores it
    masks still get a weight of 0.
    """

    def pattern(self, op, condition, a, b):
        return op.Where(condition, a, b, _outputs=["y"])

    def check(self, context, condition, a, b, y) -> MatchResult:
        result = MatchResult()
        branches = [value.const_value.numpy() for value in (a, b) if value.const_value is not None]
        if not any(np.issubdtype(branch.dtype, np.floating) and np.isinf(branch).any() for branch in branches):
            return result.fail("no constant branch holds an infinity")
        return result

    def rewrite(self, op, condition, a, b, y):
        return op.Where(condition, self._finite(op, a, y, "a"), self._finite(op, b, y, "b"))

    @staticmethod
    def _finite(op, value: ir.Value, y: ir.Value, which: str) -> ir.Value:
        if value.const_value is None or not np.issubdtype(value.const_value.numpy().dtype, np.floating):
            return value
        array = value.const_value.numpy()
        extreme = np.finfo(array.dtype)
        finite = np.where(np.isposinf(array), extreme.max, np.where(np.isneginf(array), extreme.min, array))
        return op.initializer(ir.tensor(finite.astype(array.dtype)), name=f"{y.producer().name}_finite_{which}")


def _static_shape(value: ir.Value) -> bool:
    return value.shape is not None and all(isinstance(dim, int) for dim in value.shape)


class StftToConv(RewriteRuleClassBase):
    """``STFT`` of a real signal with a constant window and hop -> a strided ``Conv1d`` with the windowed DFT basis.

    torch's dynamo exporter writes ``torch.stft`` as an ONNX STFT (opset 17), which has no NPU form; each frequency
    bin is a dot product of a frame with ``window * cos`` and ``-window * sin``, which is what a convolution with
    ``2 * bins`` output channels and a stride of the hop computes (the wide kernel and long stride are then split as
    for Silero's STFT). Output ``[batch, frames, bins, 2]`` as the STFT's (real, imaginary).
    """

    def pattern(self, op, signal):
        return op.STFT(signal, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, signal, y) -> MatchResult:
        result = MatchResult()
        node = y.producer()
        inputs = list(node.inputs) + [None] * (4 - len(node.inputs))
        step, window, length = inputs[1], inputs[2], inputs[3]
        if signal.shape is None or len(signal.shape) != 3 or signal.shape[2] != 1:
            return result.fail("the signal is not real ([batch, samples, 1])")
        if step is None or step.const_value is None:
            return result.fail("the hop is not a constant")
        present = [v for v in (window, length) if v is not None and v.name]
        if not present or any(v.const_value is None for v in present):
            return result.fail("the window or frame length is not a constant")
        if window is not None and window.name and length is not None and length.name \
                and int(length.const_value.numpy()) != window.const_value.size:
            return result.fail("the frame length is not the window's")
        return result

    def rewrite(self, op, signal, y):
        node = y.producer()
        inputs = list(node.inputs) + [None] * (4 - len(node.inputs))
        step = int(inputs[1].const_value.numpy())
        if inputs[2] is not None and inputs[2].name:
            window = inputs[2].const_value.numpy().astype(np.float64).ravel()
        else:
            window = np.ones(int(inputs[3].const_value.numpy()))
        size = window.size
        onesided = node.attributes["onesided"].value if "onesided" in node.attributes else 1
        bins = size // 2 + 1 if onesided else size
        angle = 2 * np.pi * np.outer(np.arange(bins), np.arange(size)) / size
        basis = np.concatenate([window * np.cos(angle), -window * np.sin(angle)])[:, None, :].astype(np.float32)
        weight = op.initializer(ir.tensor(basis), name=f"{node.name}_dft")
        frames = op.Conv(op.Transpose(signal, perm=[0, 2, 1]), weight, strides=[step], kernel_shape=[size])
        parts = op.initializer(ir.tensor(np.array([0, 2, bins, -1], np.int64)), name=f"{node.name}_parts")
        return op.Transpose(op.Reshape(frames, parts), perm=[0, 3, 2, 1])


class GatheredWindowMean(RewriteRuleClassBase):
    """``ReduceMean(GatherND(x, I), axes)`` with constant windows ``I`` -> one ``MatMul`` by the pooling matrix.

    torch's dynamo exporter writes an adaptive average pool whose output does not divide its input
    (``AdaptiveAvgPool2d((7, 7))`` of 64x64) as a GatherND of every window's positions (a rank-6 tensor, beyond the
    NPU's rank 5) and a mean over the window axes. Each output is the mean of fixed input positions: a constant
    ``[outputs, positions]`` matrix times ``x`` with its indexed axes flattened. Exact; at most
    ``MAX_POOLING_MATRIX`` entries.
    """

    MAX_POOLING_MATRIX = 1 << 20

    def pattern(self, op, x, indices, axes):
        return op.ReduceMean(op.GatherND(x, indices, _allow_other_attributes=True), axes,
                             _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, indices, axes, y) -> MatchResult:
        result = MatchResult()
        gather = y.producer().inputs[0].producer()
        reduce = y.producer()
        if gather.attributes.get("batch_dims") is not None and gather.attributes["batch_dims"].value != 0:
            return result.fail("the GatherND has batch dimensions")
        if reduce.attributes.get("noop_with_empty_axes") is not None \
                and reduce.attributes["noop_with_empty_axes"].value:
            return result.fail("the mean may be a no-op")
        if indices.const_value is None or axes.const_value is None:
            return result.fail("the windows or the axes are not constants")
        if x.shape is None or not x.shape.is_static():
            return result.fail("the input shape is not static")
        index = indices.const_value.numpy()
        depth, windows = index.shape[-1], index.ndim - 1
        reduced = {int(a) % (windows + len(x.shape) - depth) for a in axes.const_value.numpy().ravel()}
        if not reduced or max(reduced) >= windows:
            return result.fail("the mean is not over window axes only")
        positions = int(np.prod(list(x.shape)[:depth]))
        outputs = int(np.prod([n for a, n in enumerate(index.shape[:-1]) if a not in reduced]))
        if positions * outputs > self.MAX_POOLING_MATRIX:
            return result.fail("the pooling matrix would be too large")
        return result

    def rewrite(self, op, x, indices, axes, y):
        reduce = y.producer()
        index = indices.const_value.numpy()
        depth, windows = index.shape[-1], index.ndim - 1
        shape = list(x.shape)
        reduced = sorted({int(a) % (windows + len(shape) - depth) for a in axes.const_value.numpy().ravel()})
        kept = [a for a in range(windows) if a not in reduced]
        sizes = np.array(shape[:depth]).reshape((depth,) + (1,) * windows)
        flat = np.ravel_multi_index(tuple(np.moveaxis(index, -1, 0) % sizes), shape[:depth])  # [*windows]
        flat = np.transpose(flat, kept + reduced).reshape(-1, int(np.prod([index.shape[a] for a in reduced])))
        positions = int(np.prod(shape[:depth]))
        matrix = np.zeros((flat.shape[0], positions))  # each output row: 1/n at its window's n positions
        np.add.at(matrix, (np.repeat(np.arange(flat.shape[0]), flat.shape[1]), flat.ravel()), 1.0 / flat.shape[1])
        name = reduce.name
        rows = op.Reshape(x, op.initializer(ir.tensor(np.array([positions, -1], np.int64)), name=f"{name}_positions"))
        pooled = op.MatMul(op.initializer(ir.tensor(matrix.astype(np.float32)), name=f"{name}_pooling"), rows)
        keepdims = reduce.attributes["keepdims"].value if "keepdims" in reduce.attributes else 1
        window_dims = [1 if a in reduced else index.shape[a] for a in range(windows)] if keepdims else \
            [index.shape[a] for a in kept]
        out_shape = np.array(window_dims + shape[depth:], np.int64)
        return op.Reshape(pooled, op.initializer(ir.tensor(out_shape), name=f"{name}_shape"))


class EqualIntInputFloat(RewriteRuleClassBase):
    """``Equal(ids, c)`` of an integer model input and an integer constant -> ``Equal(Cast(ids, float), float(c))``.

    A padding mask given as an input and tested in the model (``src_key_padding_mask=mask == 0`` of a hand-written
    transformer, torch's dynamo export) compared int64 run-time values, which the NPU does not take; as floats the
    input becomes a float activation (BERT's ``attention_mask`` path). Only for an input that is nothing but tested
    (a mask of a few values, which the activation grid holds exactly) and a test that only selects or masks: an
    Equal of general integers (ONNX's ``test_equal_bcast``: int32 values across a wide range) compared as 8-bit
    activations agreed on 98.3 % of its elements.
    """

    _INTEGERS = (ir.DataType.INT64, ir.DataType.INT32, ir.DataType.INT16, ir.DataType.INT8, ir.DataType.UINT8)

    def pattern(self, op, ids, constant):
        return op.Equal(ids, constant, _outputs=["y"])

    def check(self, context, ids, constant, y) -> MatchResult:
        result = MatchResult()
        if not ids.is_graph_input() or ids.dtype not in self._INTEGERS:
            return result.fail("the compared values are not an integer model input")
        value = constant.const_value
        if value is None or constant.dtype not in self._INTEGERS:
            return result.fail("the other side is not an integer constant")
        if value.size and int(np.abs(value.numpy()).max()) >= 2**24:
            return result.fail("the constant is not exact in float32")
        if any(node.op_type != "Equal" for node, _ in ids.uses()):
            return result.fail("the input is also read as numbers (token ids into an embedding): as 8-bit floats "
                               "ids == 0 would also hold for small ids; the CPU head takes the test")
        if y.is_graph_output() or not self._masks_only(y):
            return result.fail("the test feeds integer arithmetic (RoBERTa's position ids) or is an output: the "
                               "CPU head takes it")
        return result

    @staticmethod
    def _masks_only(value: ir.Value) -> bool:
        """True if the test's result selects or masks only (Where, bool logic, a Cast to float): an integer use
        behind it (a cumulative sum of the mask) would be left on the CPU, fed by the NPU, which no split allows."""
        pending, seen = [value], set()
        while pending:
            current = pending.pop()
            for node, _ in current.uses():
                if node in seen:
                    continue
                seen.add(node)
                if node.op_type in ("Not", "And", "Or", "Xor"):
                    pending.extend(node.outputs)
                elif node.op_type == "Cast":
                    target = node.attributes.get("to")
                    if target is None or not ir.DataType(target.value).is_floating_point():
                        return False
                elif node.op_type != "Where":
                    return False
        return True

    def rewrite(self, op, ids, constant, y):
        as_float = op.initializer(ir.tensor(constant.const_value.numpy().astype(np.float32)),
                                  name=f"{y.producer().name}_float")
        return op.Equal(op.Cast(ids, to=ir.DataType.FLOAT), as_float)


class _GatherIndexWrap(RewriteRuleClassBase):
    """``Gather(table, where(x < 0, x + n, x))`` -> ``Gather(table, x)`` where ``n`` is the gathered axis's size.

    Keras 3's ``Embedding`` (``ops.take``) wraps negative ids by hand before its lookup; ONNX Gather wraps them itself
    (indices in ``[-n, n)``), so the select is a no-op for every index Gather accepts. tf2onnx writes the select of
    int32 ids as arithmetic (``cond * (x + n) + !cond * x``: slovorez's morpheme model), integer Casts, Mul and Add
    that the NPU cannot run before a lookup it can.
    """

    def check(self, context, table, x, test, zero, size, y, **_) -> MatchResult:
        result = MatchResult()
        gather = y.producer()
        axis = gather.attributes["axis"].value if "axis" in gather.attributes else 0
        if test is not x and (test.producer() is None or test.producer().op_type != "Cast"
                              or test.producer().inputs[0] is not x):
            return result.fail("the sign test is not of the ids themselves")
        if not _is_scalar(zero, 0.0, tolerance=0.0):
            return result.fail("the ids are not compared with 0")
        shape = table.shape
        if shape is None or not shape.is_static() or not -len(shape) <= axis < len(shape):
            return result.fail("the table's shape is unknown")
        if not _is_scalar(size, float(shape[axis]), tolerance=0.0):
            return result.fail("the added constant is not the gathered axis's size")
        return result

    def rewrite(self, op, table, x, y, **_):
        return op.Gather(table, x, **dict(y.producer().attributes.items()))


class GatherIndexWrapWhere(_GatherIndexWrap):
    """The select as a ``Where``."""

    def pattern(self, op, table, x, test, zero, size):
        return op.Gather(table, op.Where(op.Less(test, zero), op.Add(x, size), x), _allow_other_attributes=True,
                         _outputs=["y"])


class GatherIndexWrapArithmetic(_GatherIndexWrap):
    """The select as tf2onnx writes it for integers: ``Cast(less) * (x + n) + x * Cast(Not(less))``."""

    def pattern(self, op, table, x, test, zero, size):
        less = op.Less(test, zero)
        negative = op.Mul(op.Cast(less, _allow_other_attributes=True), op.Add(x, size))
        positive = op.Mul(x, op.Cast(op.Not(less), _allow_other_attributes=True))
        return op.Gather(table, op.Add(negative, positive), _allow_other_attributes=True, _outputs=["y"])


MBLT_REWRITE_RULES = RewriteRuleSet(
    [BatchNormToAffine.rule(), ErfGeluOuterHalf.rule(), ErfGeluInnerHalf.rule(), WholeWindowAveragePool.rule(),
     ConvMulChannel.rule(), ConvAddChannel.rule(), ConvTransposeMulChannel.rule(), ConvTransposeAddChannel.rule(),
     WrittenOutLayerNormDiv.rule(), WrittenOutLayerNormReciprocal.rule(), LayerNormMul.rule(), LayerNormAdd.rule(),
     GatherIndexWrapArithmetic.rule(), EqualIntInputFloat.rule()],
    commute=True).rules + [ConvSubChannel.rule(), ConvDivChannel.rule(), ConvTransposeSubChannel.rule(),
                           ConvTransposeDivChannel.rule(), SplitWideConvKernel.rule(), FramedStridedConv.rule(),
                           CollapseHighRankTranspose.rule(),
                           LrnToConv.rule(), MatMulConstantFirst.rule(), MatMulBatchedWeight.rule(), GemmToMatMul.rule(),
                           WrapPadToConcat.rule(),
                           LogSoftmaxToExpLog.rule(), GatherCastIds.rule(), GatherIndexWrapWhere.rule(), WholeSlice.rule(),
                           GatherReshapedIds.rule(), FiniteWhereFill.rule(), StftToConv.rule(), GatheredWindowMean.rule(), ClipRuntimeBounds.rule(), *_fake_quant_rules(),
                           *_transpose_down_rules()]
"""Our rules, in application order (operand orders of commutative ops included)."""


def _exactly(value: float) -> Constant:
    """A pattern constant that matches ``value`` only: the library's ``x + 0`` matches within 1e-8, so it removed
    basic-pitch's ``Log(power + 1e-10)`` floor (the log's minimum went from -100 dB to -124 dB)."""
    return Constant(value, rel_tol=0.0, abs_tol=0.0)


def _identity(op, x, **_):
    return op.Identity(x)


EXACT_NO_OP_RULES = [
    *RewriteRuleSet([RewriteRule(lambda op, x: op.Mul(x, _exactly(1)), _identity, name="ExactMulBy1"),
                     RewriteRule(lambda op, x: op.Add(x, _exactly(0)), _identity, name="ExactAdd0")],
                    commute=True).rules,
    RewriteRule(lambda op, x: op.Sub(x, _exactly(0)), _identity, name="ExactSub0"),
    RewriteRule(lambda op, x: op.Div(x, _exactly(1)), _identity, name="ExactDivBy1"),
]
"""The arithmetic no-ops (``x * 1``, ``1 * x``, ``x + 0``, ``0 + x``, ``x - 0``, ``x / 1``) with exactly these
constants: they stand in for the library's, in our rule set and in the optimizer's default rules."""
