"""TFLite operator -> ONNX nodes: one converter per op, all in the ``CONVERTERS`` registry.

Tensors keep TFLite's NHWC layout; ops that ONNX defines on NCHW (Conv, pooling, Resize,
DepthToSpace) are wrapped in a Transpose pair, which later passes fold. Fused activations are
emitted before the transpose back, so Conv -> Relu stays adjacent for fusion. Converters raise
:class:`NotConvertible` with a reason when an instance uses options ONNX cannot express.
Custom ops are keyed by their ``custom_code``.
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Callable

import numpy as np
from onnx import helper

from compiler_core.frontends.tflite.builder import GraphBuilder, NotConvertible
from compiler_core.frontends.tflite.reader import Operator
from compiler_core.frontends.tflite.sparse import densify

logger = logging.getLogger(__name__)

Converter = Callable[[GraphBuilder, Operator], None]

CONVERTERS: dict[str, Converter] = {}
"""Registry: TFLite builtin op name (or custom code) -> converter emitting ONNX nodes."""

TO_NCHW = (0, 3, 1, 2)
TO_NHWC = (0, 2, 3, 1)
_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min


def converts(*keys: str) -> Callable[[Converter], Converter]:
    """Register a converter under one or more TFLite op names."""
    def register(function: Converter) -> Converter:
        for key in keys:
            CONVERTERS[key] = function
        return function
    return register


# -- shared helpers ------------------------------------------------------------------------------


def _option(op: Operator, name: str, default: object = 0) -> object:
    return getattr(op.options, name)() if op.options is not None else default


def _source(b: GraphBuilder, op: Operator) -> str:
    return b.graph.tensors[op.outputs[0]].name


def _activation(b: GraphBuilder, value: str, fused: int, source: str) -> str:
    """Apply a TFLite fused activation (NONE, RELU, RELU_N1_TO_1, RELU6, TANH)."""
    if fused == 0:
        return value
    if fused == 1:
        return b.add_node("Relu", [value], source=source)[0]
    if fused in (2, 3):
        low, high = (-1.0, 1.0) if fused == 2 else (0.0, 6.0)
        return _clip(b, value, low, high, source)
    if fused == 4:
        return b.add_node("Tanh", [value], source=source)[0]
    raise NotConvertible(f"fused activation {fused} (SIGN_BIT) has no ONNX equivalent")


def _clip(b: GraphBuilder, value: str, low: float, high: float, source: str) -> str:
    bounds = [b.add_initializer(f"{source}/clip_{k}", np.array(v, np.float32)) for k, v in (("min", low), ("max", high))]
    return b.add_node("Clip", [value, *bounds], source=source)[0]


def _transpose(b: GraphBuilder, value: str, perm: tuple[int, ...], source: str) -> str:
    return b.add_node("Transpose", [value], source=source, perm=list(perm))[0]


def _weight(b: GraphBuilder, op: Operator, position: int, perm: tuple[int, ...]) -> str:
    """A filter in ONNX order: folded when constant, a Transpose node otherwise."""
    value = b.constant(op.inputs[position])
    name = b.graph.tensors[op.inputs[position]].name
    if value is not None:
        return b.add_initializer(name, np.ascontiguousarray(value.astype(np.float32).transpose(perm)))
    return _transpose(b, b.input(op, position), perm, name)


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow SAME padding: output ceil(size / stride), the odd pixel padded at the end."""
    effective = (kernel - 1) * dilation + 1
    total = max((math.ceil(size / stride) - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def _pads(padding: int, spatial: tuple[int, int], kernel: tuple[int, int], strides: tuple[int, int],
          dilations: tuple[int, int] = (1, 1)) -> list[int]:
    """ONNX pads [top, left, bottom, right] for TFLite Padding (0 SAME, 1 VALID)."""
    if padding == 1:
        return [0, 0, 0, 0]
    (top, bottom), (left, right) = (_same_pads(s, k, st, d) for s, k, st, d in zip(spatial, kernel, strides, dilations))
    return [top, left, bottom, right]


def _nchw_op(b: GraphBuilder, op: Operator, op_type: str, inputs: list[str], fused: int = 0,
             **attributes: object) -> None:
    """Transpose the first input to NCHW, run ``op_type`` and the activation, transpose back."""
    source = _source(b, op)
    x = _transpose(b, inputs[0], TO_NCHW, source)
    y = b.add_node(op_type, [x, *inputs[1:]], source=source, **attributes)[0]
    y = _activation(b, y, fused, source)
    b.bind(_transpose(b, y, TO_NHWC, source), op.outputs[0])


def _elementwise(b: GraphBuilder, op: Operator, op_type: str, inputs: list[str], fused: int = 0,
                 **attributes: object) -> None:
    source = _source(b, op)
    y = b.add_node(op_type, inputs, source=source, **attributes)[0]
    b.bind(_activation(b, y, fused, source), op.outputs[0])


def _reshape_to_output(b: GraphBuilder, op: Operator) -> None:
    shape = b.int64_initializer(f"{_source(b, op)}/shape", b.shape(op.outputs[0]))
    _elementwise(b, op, "Reshape", [b.input(op, 0), shape])


# -- convolution and pooling ---------------------------------------------------------------------


@converts("CONV_2D")
def _conv_2d(b: GraphBuilder, op: Operator) -> None:
    _, height, width, channels = b.shape(op.inputs[0])
    _, kernel_h, kernel_w, filter_channels = b.shape(op.inputs[1])
    strides = (_option(op, "StrideH", 1), _option(op, "StrideW", 1))
    dilations = (_option(op, "DilationHFactor", 1), _option(op, "DilationWFactor", 1))
    _nchw_op(b, op, "Conv", [b.input(op, 0), _weight(b, op, 1, TO_NCHW), b.input(op, 2)],
             fused=_option(op, "FusedActivationFunction"), kernel_shape=[kernel_h, kernel_w],
             strides=list(strides), dilations=list(dilations), group=channels // filter_channels,
             pads=_pads(_option(op, "Padding"), (height, width), (kernel_h, kernel_w), strides, dilations))


@converts("DEPTHWISE_CONV_2D")
def _depthwise_conv_2d(b: GraphBuilder, op: Operator) -> None:
    _, height, width, channels = b.shape(op.inputs[0])
    _, kernel_h, kernel_w, _ = b.shape(op.inputs[1])
    strides = (_option(op, "StrideH", 1), _option(op, "StrideW", 1))
    dilations = (_option(op, "DilationHFactor", 1), _option(op, "DilationWFactor", 1))
    _nchw_op(b, op, "Conv", [b.input(op, 0), _weight(b, op, 1, (3, 0, 1, 2)), b.input(op, 2)],
             fused=_option(op, "FusedActivationFunction"), kernel_shape=[kernel_h, kernel_w],
             strides=list(strides), dilations=list(dilations), group=channels,
             pads=_pads(_option(op, "Padding"), (height, width), (kernel_h, kernel_w), strides, dilations))


def _transpose_conv(b: GraphBuilder, op: Operator, positions: tuple[int, int, int], same: bool,
                    strides: tuple[int, int], fused: int) -> None:
    """TFLite transpose convolution (filter OHWI) as ONNX ConvTranspose with explicit pads."""
    x_pos, w_pos, bias_pos = positions
    _, in_h, in_w, _ = b.shape(op.inputs[x_pos])
    _, kernel_h, kernel_w, _ = b.shape(op.inputs[w_pos])
    _, out_h, out_w, _ = b.shape(op.outputs[0])
    begin, end, extra = [], [], []
    for size, kernel, stride, target in ((in_h, kernel_h, strides[0], out_h), (in_w, kernel_w, strides[1], out_w)):
        total = (size - 1) * stride + kernel - target
        before = max(total, 0) // 2 if same else 0
        begin.append(before)
        end.append(max(total - before, 0))
        extra.append(max(before - total, 0))
    _nchw_op(b, op, "ConvTranspose", [b.input(op, x_pos), _weight(b, op, w_pos, (3, 0, 1, 2)), b.input(op, bias_pos)],
             fused=fused, kernel_shape=[kernel_h, kernel_w], strides=list(strides), pads=begin + end,
             output_padding=extra if any(extra) else None)


@converts("TRANSPOSE_CONV")
def _transpose_conv_builtin(b: GraphBuilder, op: Operator) -> None:
    _transpose_conv(b, op, (2, 1, 3), same=_option(op, "Padding") == 0,
                    strides=(_option(op, "StrideH", 1), _option(op, "StrideW", 1)),
                    fused=_option(op, "FusedActivationFunction"))


@converts("Convolution2DTransposeBias")
def _convolution_2d_transpose_bias(b: GraphBuilder, op: Operator) -> None:
    """MediaPipe's custom op: inputs (input, OHWI filter, bias); options are a raw C struct
    ``TfLiteTransposeConvParams {padding (1 SAME, 2 VALID), stride_width, stride_height}``."""
    if len(op.custom_options) < 12:
        raise NotConvertible(f"its custom options ({len(op.custom_options)} bytes) are not a "
                             "TfLiteTransposeConvParams struct")
    padding, stride_w, stride_h = struct.unpack_from("<3i", op.custom_options)
    if padding not in (1, 2) or stride_w < 1 or stride_h < 1:
        raise NotConvertible(f"undecodable options (padding={padding}, strides={stride_h}x{stride_w})")
    _transpose_conv(b, op, (0, 1, 2), same=padding == 1, strides=(stride_h, stride_w), fused=0)


def _pool(b: GraphBuilder, op: Operator, op_type: str) -> None:
    _, height, width, _ = b.shape(op.inputs[0])
    kernel = (_option(op, "FilterHeight", 1), _option(op, "FilterWidth", 1))
    strides = (_option(op, "StrideH", 1), _option(op, "StrideW", 1))
    _nchw_op(b, op, op_type, [b.input(op, 0)], fused=_option(op, "FusedActivationFunction"),
             kernel_shape=list(kernel), strides=list(strides),
             pads=_pads(_option(op, "Padding"), (height, width), kernel, strides))


@converts("MAX_POOL_2D")
def _max_pool_2d(b: GraphBuilder, op: Operator) -> None:
    _pool(b, op, "MaxPool")


@converts("AVERAGE_POOL_2D")
def _average_pool_2d(b: GraphBuilder, op: Operator) -> None:
    _pool(b, op, "AveragePool")  # count_include_pad=0 (the default) matches TFLite's SAME averaging


@converts("FULLY_CONNECTED")
def _fully_connected(b: GraphBuilder, op: Operator) -> None:
    source = _source(b, op)
    if _option(op, "WeightsFormat") != 0:
        raise NotConvertible("shuffled (non-default) weights format")
    in_features = b.shape(op.inputs[1])[1]
    x = b.input(op, 0)
    if len(b.shape(op.inputs[0])) != 2:
        x = b.add_node("Reshape", [x, b.int64_initializer(f"{source}/rows", [-1, in_features])], source=source)[0]
    y = b.add_node("MatMul", [x, _weight(b, op, 1, (1, 0))], source=source)[0]
    if b.input(op, 2):
        y = b.add_node("Add", [y, b.input(op, 2)], source=source)[0]
    y = _activation(b, y, _option(op, "FusedActivationFunction"), source)
    if len(b.shape(op.outputs[0])) != 2:
        y = b.add_node("Reshape", [y, b.int64_initializer(f"{source}/shape", b.shape(op.outputs[0]))],
                       source=source)[0]
    b.bind(y, op.outputs[0])


@converts("BATCH_MATMUL")
def _batch_matmul(b: GraphBuilder, op: Operator) -> None:
    """MatMul with broadcast batch dims; adj_x / adj_y transpose the last two axes (folded on constants)."""
    operands = [_adjoint(b, op, position, bool(_option(op, name, False)))
                for position, name in ((0, "AdjX"), (1, "AdjY"))]
    _elementwise(b, op, "MatMul", operands)


def _adjoint(b: GraphBuilder, op: Operator, position: int, adjoint: bool) -> str:
    if not adjoint:
        return b.input(op, position)
    rank = len(b.shape(op.inputs[position]))
    return _weight(b, op, position, (*range(rank - 2), rank - 1, rank - 2))


# -- elementwise ---------------------------------------------------------------------------------

_BINARY = {"ADD": "Add", "SUB": "Sub", "MUL": "Mul", "DIV": "Div", "MAXIMUM": "Max", "MINIMUM": "Min",
           "POW": "Pow"}


@converts(*_BINARY)
def _binary(b: GraphBuilder, op: Operator) -> None:
    fused = _option(op, "FusedActivationFunction") if op.op_type in ("ADD", "SUB", "MUL", "DIV") else 0
    _elementwise(b, op, _BINARY[op.op_type], [b.input(op, 0), b.input(op, 1)], fused=fused)


@converts("SQUARED_DIFFERENCE")
def _squared_difference(b: GraphBuilder, op: Operator) -> None:
    difference = b.add_node("Sub", [b.input(op, 0), b.input(op, 1)], source=_source(b, op))[0]
    _elementwise(b, op, "Mul", [difference, difference])


@converts("SQUARE")
def _square(b: GraphBuilder, op: Operator) -> None:
    _elementwise(b, op, "Mul", [b.input(op, 0), b.input(op, 0)])


_COMPARISONS = {"LESS": "Less", "LESS_EQUAL": "LessOrEqual", "GREATER": "Greater", "GREATER_EQUAL": "GreaterOrEqual",
                "EQUAL": "Equal", "NOT_EQUAL": "Equal"}


@converts(*_COMPARISONS)
def _comparison(b: GraphBuilder, op: Operator) -> None:
    inputs = [b.input(op, 0), b.input(op, 1)]
    if op.op_type == "NOT_EQUAL":
        inputs = [b.add_node("Equal", inputs, source=_source(b, op))[0]]
    _elementwise(b, op, "Not" if op.op_type == "NOT_EQUAL" else _COMPARISONS[op.op_type], inputs)


@converts("SELECT_V2")
def _select_v2(b: GraphBuilder, op: Operator) -> None:
    _elementwise(b, op, "Where", [b.input(op, i) for i in range(3)])  # numpy broadcasting, as ONNX Where


_UNARY = {"LOGISTIC": "Sigmoid", "TANH": "Tanh", "RELU": "Relu", "HARD_SWISH": "HardSwish", "EXP": "Exp",
          "LOG": "Log", "ABS": "Abs", "NEG": "Neg", "SQRT": "Sqrt", "ELU": "Elu", "FLOOR": "Floor",
          "CEIL": "Ceil", "SIN": "Sin", "COS": "Cos"}


@converts(*_UNARY)
def _unary(b: GraphBuilder, op: Operator) -> None:
    _elementwise(b, op, _UNARY[op.op_type], [b.input(op, 0)])


@converts("RELU6", "RELU_N1_TO_1", "RELU_0_TO_1")
def _clipped_relu(b: GraphBuilder, op: Operator) -> None:
    low, high = {"RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0), "RELU_0_TO_1": (0.0, 1.0)}[op.op_type]
    b.bind(_clip(b, b.input(op, 0), low, high, _source(b, op)), op.outputs[0])


@converts("RSQRT")
def _rsqrt(b: GraphBuilder, op: Operator) -> None:
    root = b.add_node("Sqrt", [b.input(op, 0)], source=_source(b, op))[0]
    _elementwise(b, op, "Reciprocal", [root])


@converts("LEAKY_RELU")
def _leaky_relu(b: GraphBuilder, op: Operator) -> None:
    _elementwise(b, op, "LeakyRelu", [b.input(op, 0)], alpha=float(_option(op, "Alpha", 0.2)))


@converts("GELU")
def _gelu(b: GraphBuilder, op: Operator) -> None:
    _elementwise(b, op, "Gelu", [b.input(op, 0)], approximate="tanh" if _option(op, "Approximate", False) else "none")


@converts("PRELU")
def _prelu(b: GraphBuilder, op: Operator) -> None:
    _elementwise(b, op, "PRelu", [b.input(op, 0), b.input(op, 1)])  # NHWC alpha [.., C] broadcasts as is


@converts("SOFTMAX")
def _softmax(b: GraphBuilder, op: Operator) -> None:
    x, beta = b.input(op, 0), float(_option(op, "Beta", 1.0))
    if beta != 1.0:
        scale = b.add_initializer(f"{_source(b, op)}/beta", np.array(beta, np.float32))
        x = b.add_node("Mul", [x, scale], source=_source(b, op))[0]
    _elementwise(b, op, "Softmax", [x], axis=-1)


def _last_axis(b: GraphBuilder, op_type: str, value: str, source: str) -> str:
    """``op_type`` (a reduction) over the last axis, kept as a size-1 axis."""
    axes = b.int64_initializer(f"{source}/axes", [-1])
    return b.add_node(op_type, [value, axes], source=source, keepdims=1)[0]


@converts("LOG_SOFTMAX")
def _log_softmax(b: GraphBuilder, op: Operator) -> None:
    """TFLite's stable form (LogSoftmax has no NPU kernel): s = x - max(x); s - log(sum(exp(s)))."""
    source, x = _source(b, op), b.input(op, 0)
    shifted = b.add_node("Sub", [x, _last_axis(b, "ReduceMax", x, source)], source=source)[0]
    total = _last_axis(b, "ReduceSum", b.add_node("Exp", [shifted], source=source)[0], source)
    _elementwise(b, op, "Sub", [shifted, b.add_node("Log", [total], source=source)[0]])


@converts("L2_NORMALIZATION")
def _l2_normalization(b: GraphBuilder, op: Operator) -> None:
    """x / max(ReduceL2(x), 1e-6) over the last axis, TFLite's float kernel (LpNormalization has no NPU kernel)."""
    source, x = _source(b, op), b.input(op, 0)
    epsilon = b.add_initializer(f"{source}/epsilon", np.array(1e-6, np.float32))
    norm = b.add_node("Max", [_last_axis(b, "ReduceL2", x, source), epsilon], source=source)[0]
    _elementwise(b, op, "Div", [x, norm], fused=_option(op, "FusedActivationFunction"))


# -- shape and data movement ---------------------------------------------------------------------


@converts("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def _reshape(b: GraphBuilder, op: Operator) -> None:
    target = b.constant(op.inputs[1]) if op.op_type == "RESHAPE" and len(op.inputs) > 1 and op.inputs[1] >= 0 \
        else None
    if target is None:
        _reshape_to_output(b, op)  # the output's static shape; TFLite may also give -1 in new_shape
        return
    # A shape computed from Shape/Gather/Prod/Pack (Keras Tensordot, dynamic batch) was folded at import;
    # TensorFlow's converter then records a made-up output shape (e.g. [1, 1]); the computed one is right.
    size = int(np.prod(b.shape(op.inputs[0])))
    dims = [int(d) for d in np.asarray(target).reshape(-1)]
    if dims.count(-1) == 1:
        known = int(np.prod([d for d in dims if d != -1])) or 1
        dims[dims.index(-1)] = size // known
    _elementwise(b, op, "Reshape", [b.input(op, 0), b.int64_initializer(f"{_source(b, op)}/shape", dims)])


def _fold(b: GraphBuilder, op: Operator, compute) -> bool:
    """Set the output to ``compute(*constant inputs)`` when every input is a constant (shape arithmetic)."""
    values = [b.constant(index) if index >= 0 else None for index in op.inputs]
    if not values or any(value is None for value in values):
        return False
    b.set_constant(op.outputs[0], np.asarray(compute(*values)))
    return True


@converts("CONCATENATION")
def _concatenation(b: GraphBuilder, op: Operator) -> None:
    axis = int(_option(op, "Axis"))
    if not _option(op, "FusedActivationFunction") and _fold(b, op, lambda *v: np.concatenate(v, axis=axis)):
        return
    inputs = [b.input(op, i) for i in range(len(op.inputs))]
    _elementwise(b, op, "Concat", inputs, fused=_option(op, "FusedActivationFunction"), axis=_option(op, "Axis"))


@converts("TRANSPOSE")
def _transpose_op(b: GraphBuilder, op: Operator) -> None:
    perm = [int(p) for p in b.require_constant(op, 1, "permutation")]
    _elementwise(b, op, "Transpose", [b.input(op, 0)], perm=perm)


@converts("PAD", "PADV2", "MIRROR_PAD")
def _pad(b: GraphBuilder, op: Operator) -> None:
    paddings = b.require_constant(op, 1, "paddings").astype(np.int64)
    pads = b.int64_initializer(f"{_source(b, op)}/pads", [*paddings[:, 0], *paddings[:, 1]])
    if op.op_type == "MIRROR_PAD":
        if _option(op, "Mode") != 0:
            raise NotConvertible("SYMMETRIC mirror padding has no ONNX Pad mode")
        _elementwise(b, op, "Pad", [b.input(op, 0), pads], mode="reflect")
        return
    _elementwise(b, op, "Pad", [b.input(op, 0), pads, b.input(op, 2)])


@converts("STRIDED_SLICE")
def _strided_slice(b: GraphBuilder, op: Operator) -> None:
    if _option(op, "EllipsisMask") or _option(op, "NewAxisMask"):
        raise NotConvertible("ellipsis_mask / new_axis_mask are not supported")
    begin, end, strides = (b.require_constant(op, i, what) for i, what in ((1, "begin"), (2, "end"), (3, "strides")))
    shape, source = b.shape(op.inputs[0]), _source(b, op)
    starts, ends, steps = [], [], []
    for axis, size in enumerate(shape[:len(begin)]):
        start, stop, step = _slice_bounds(op, axis, size, int(begin[axis]), int(end[axis]), int(strides[axis]))
        starts.append(start)
        ends.append(stop)
        steps.append(step)
    data = b.constant(op.inputs[0])
    if data is not None:  # shape arithmetic: slice now, dropping the shrink-mask axes
        shrink = int(_option(op, "ShrinkAxisMask"))
        picked = data[tuple(slice(a, max(z, -len(data) - 1) if p < 0 else z, p) for a, z, p in zip(starts, ends, steps))]
        b.set_constant(op.outputs[0], np.squeeze(picked, axis=tuple(a for a in range(len(starts)) if shrink >> a & 1)))
        return
    inputs = [b.input(op, 0)] + [b.int64_initializer(f"{source}/{k}", v) for k, v in
                                 (("starts", starts), ("ends", ends), ("axes", range(len(starts))), ("steps", steps))]
    sliced = b.add_node("Slice", inputs, source=source)[0]
    b.bind(b.add_node("Reshape", [sliced, b.int64_initializer(f"{source}/shape", b.shape(op.outputs[0]))],
                      source=source)[0], op.outputs[0])


def _slice_bounds(op: Operator, axis: int, size: int, begin: int, end: int, stride: int) -> tuple[int, int, int]:
    """One axis of STRIDED_SLICE as ONNX Slice (start, end, step), masks applied."""
    bit = 1 << axis
    if _option(op, "ShrinkAxisMask") & bit:
        index = begin + size if begin < 0 else begin
        return index, index + 1, 1
    if _option(op, "Offset", False):
        end = begin + end
    start = None if _option(op, "BeginMask") & bit else begin
    stop = None if _option(op, "EndMask") & bit else end
    first, last, step = slice(start, stop, stride).indices(size)
    return first, (_INT64_MIN if last < 0 else last), step


@converts("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD")
def _reduce(b: GraphBuilder, op: Operator) -> None:
    keep = bool(_option(op, "KeepDims", False))
    reducers = {"MEAN": np.mean, "SUM": np.sum, "REDUCE_MAX": np.max, "REDUCE_MIN": np.min, "REDUCE_PROD": np.prod}
    dtype = b.graph.tensors[op.outputs[0]].dtype
    if _fold(b, op, lambda x, axes: reducers[op.op_type](x, axis=tuple(int(a) for a in np.reshape(axes, -1)),
                                                         keepdims=keep).astype(dtype or x.dtype)):
        return
    op_type = {"MEAN": "ReduceMean", "SUM": "ReduceSum", "REDUCE_MAX": "ReduceMax", "REDUCE_MIN": "ReduceMin",
               "REDUCE_PROD": "ReduceProd"}[op.op_type]
    axes = b.require_constant(op, 1, "axes").astype(np.int64).reshape(-1)
    _elementwise(b, op, op_type, [b.input(op, 0), b.int64_initializer(f"{_source(b, op)}/axes", axes)],
                 keepdims=int(bool(_option(op, "KeepDims", False))))


@converts("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def _resize(b: GraphBuilder, op: Operator) -> None:
    batch, _, _, channels = b.shape(op.inputs[0])
    _, out_h, out_w, _ = b.shape(op.outputs[0])
    sizes = b.int64_initializer(f"{_source(b, op)}/sizes", [batch, channels, out_h, out_w])
    bilinear = op.op_type == "RESIZE_BILINEAR"
    if _option(op, "AlignCorners", False):
        transform, nearest = "align_corners", "round_prefer_ceil"
    elif _option(op, "HalfPixelCenters", False):  # nearest: floor((x + 0.5) / scale) == round_prefer_ceil of the half-pixel coordinate
        transform, nearest = "half_pixel", "round_prefer_ceil"
    else:
        transform, nearest = "asymmetric", "floor"
    _nchw_op(b, op, "Resize", [b.input(op, 0), "", "", sizes], mode="linear" if bilinear else "nearest",
             coordinate_transformation_mode=transform, nearest_mode=None if bilinear else nearest)


@converts("DEPTH_TO_SPACE", "SPACE_TO_DEPTH")
def _depth_space(b: GraphBuilder, op: Operator) -> None:
    op_type = "DepthToSpace" if op.op_type == "DEPTH_TO_SPACE" else "SpaceToDepth"
    mode = {"mode": "DCR"} if op_type == "DepthToSpace" else {}  # TF's depth_to_space order is DCR
    _nchw_op(b, op, op_type, [b.input(op, 0)], blocksize=_option(op, "BlockSize", 2), **mode)


# -- quantization, sparsity and casts: folded at conversion time when constant -------------------


@converts("DEQUANTIZE", "QUANTIZE")
def _quantize_dequantize(b: GraphBuilder, op: Operator) -> None:
    """Constants fold to float32 real values; on activations both are the identity on real values
    (the graph carries real values; the quantization parameters become calibration hints)."""
    value = b.constant(op.inputs[0])
    if value is not None:
        b.set_constant(op.outputs[0], value.astype(np.float32))
        return
    b.add_node("Identity", [b.input(op, 0)], [b.value_name(op.outputs[0])], source=_source(b, op))


@converts("DENSIFY")
def _densify(b: GraphBuilder, op: Operator) -> None:
    tensor = b.graph.tensors[op.inputs[0]]
    if tensor.sparsity is None or tensor.data is None:
        raise NotConvertible("its input is not a constant sparse tensor")
    dense = densify(tensor.data, tensor.shape, tensor.sparsity)
    quantization = tensor.quantization
    b.set_constant(op.outputs[0], quantization.dequantize(dense) if quantization and dense.dtype.kind in "iu" else dense)


@converts("CAST")
def _cast(b: GraphBuilder, op: Operator) -> None:
    dtype = b.graph.tensors[op.outputs[0]].dtype
    if dtype is None:
        raise NotConvertible(f"cast to {b.graph.tensors[op.outputs[0]].type_name}")
    _elementwise(b, op, "Cast", [b.input(op, 0)], to=helper.np_dtype_to_tensor_dtype(dtype))


@converts("SHAPE")
def _shape(b: GraphBuilder, op: Operator) -> None:
    # Every tensor has a static shape here (inputs are pinned at import), so Shape is a constant;
    # Keras's Flatten writes Shape -> StridedSlice -> Pack -> Reshape for a dynamic batch.
    dtype = b.graph.tensors[op.outputs[0]].dtype or np.dtype(np.int32)
    b.set_constant(op.outputs[0], np.asarray(b.shape(op.inputs[0]), dtype=dtype))


@converts("PACK")
def _pack(b: GraphBuilder, op: Operator) -> None:
    axis = int(_option(op, "Axis"))
    values = [b.constant(index) for index in op.inputs]
    if all(value is not None for value in values):
        b.set_constant(op.outputs[0], np.stack(values, axis=axis))
        return
    rank = len(b.shape(op.outputs[0]))
    axes = b.int64_initializer(f"{_source(b, op)}/axes", [axis % rank])
    pieces = [b.add_node("Unsqueeze", [b.input(op, i), axes], source=_source(b, op))[0] for i in range(len(op.inputs))]
    _elementwise(b, op, "Concat", pieces, axis=axis % rank)


@converts("GATHER")
def _gather(b: GraphBuilder, op: Operator) -> None:
    if _option(op, "BatchDims"):
        raise NotConvertible("batch_dims > 0 has no ONNX Gather equivalent")
    axis = int(_option(op, "Axis"))
    data, indices = b.constant(op.inputs[0]), b.constant(op.inputs[1])
    if data is not None and indices is not None:  # e.g. Keras Tensordot picking dims of a static shape
        b.set_constant(op.outputs[0], np.take(data, indices.astype(np.int64), axis=axis))
        return
    indices_value = b.input(op, 1) if indices is None else \
        b.add_initializer(f"{_source(b, op)}/indices", indices.astype(np.int64))
    _elementwise(b, op, "Gather", [b.input(op, 0), indices_value], axis=axis)


def _split_into(b: GraphBuilder, op: Operator, data_position: int, axis: int) -> None:
    """ONNX Split along ``axis`` into the op's outputs, sized by their static shapes (folded on constants)."""
    rank = len(b.shape(op.inputs[data_position]))
    axis %= rank
    sizes = [b.shape(index)[axis] for index in op.outputs]
    data = b.constant(op.inputs[data_position])
    if data is not None:
        for index, piece in zip(op.outputs, np.split(data, np.cumsum(sizes)[:-1], axis=axis)):
            b.set_constant(index, piece)
        return
    b.add_node("Split", [b.input(op, data_position), b.int64_initializer(f"{_source(b, op)}/split", sizes)],
               [b.value_name(index) for index in op.outputs], source=_source(b, op), axis=axis)


@converts("SPLIT")
def _split(b: GraphBuilder, op: Operator) -> None:
    _split_into(b, op, 1, int(b.require_constant(op, 0, "axis").reshape(-1)[0]))  # inputs: (axis, data)


@converts("SPLIT_V")
def _split_v(b: GraphBuilder, op: Operator) -> None:
    # size_splits may hold one -1; the outputs' static shapes carry the resolved sizes
    _split_into(b, op, 0, int(b.require_constant(op, 2, "axis").reshape(-1)[0]))


@converts("UNPACK")
def _unpack(b: GraphBuilder, op: Operator) -> None:
    rank = len(b.shape(op.inputs[0]))
    axis, source = int(_option(op, "Axis")) % rank, _source(b, op)
    data = b.constant(op.inputs[0])
    if data is not None:
        for position, index in enumerate(op.outputs):
            b.set_constant(index, np.take(data, position, axis=axis))
        return
    pieces = b.add_node("Split", [b.input(op, 0), b.int64_initializer(f"{source}/split", [1] * len(op.outputs))],
                        len(op.outputs), source=source, axis=axis)
    axes = b.int64_initializer(f"{source}/axes", [axis])
    for piece, index in zip(pieces, op.outputs):
        b.add_node("Squeeze", [piece, axes], [b.value_name(index)], source=source)


@converts("SLICE")
def _slice(b: GraphBuilder, op: Operator) -> None:
    """begin + size per axis; size -1 runs to the end of the axis."""
    begin = [int(v) for v in b.require_constant(op, 1, "begin").reshape(-1)]
    size = [int(v) for v in b.require_constant(op, 2, "size").reshape(-1)]
    shape, source = b.shape(op.inputs[0]), _source(b, op)
    ends = [dim if length == -1 else start + length for start, length, dim in zip(begin, size, shape)]
    data = b.constant(op.inputs[0])
    if data is not None:
        b.set_constant(op.outputs[0], data[tuple(slice(start, end) for start, end in zip(begin, ends))])
        return
    inputs = [b.input(op, 0)] + [b.int64_initializer(f"{source}/{k}", v) for k, v in
                                 (("starts", begin), ("ends", ends), ("axes", range(len(begin))))]
    _elementwise(b, op, "Slice", inputs)


@converts("TILE")
def _tile(b: GraphBuilder, op: Operator) -> None:
    if _fold(b, op, lambda x, multiples: np.tile(x, [int(m) for m in np.reshape(multiples, -1)])):
        return
    multiples = b.require_constant(op, 1, "multiples").astype(np.int64).reshape(-1)
    _elementwise(b, op, "Tile", [b.input(op, 0), b.int64_initializer(f"{_source(b, op)}/repeats", multiples)])


@converts("BROADCAST_TO")
def _broadcast_to(b: GraphBuilder, op: Operator) -> None:
    if _fold(b, op, lambda x, shape: np.broadcast_to(x, [int(d) for d in np.reshape(shape, -1)]).copy()):
        return
    shape = b.int64_initializer(f"{_source(b, op)}/shape", b.shape(op.outputs[0]))
    _elementwise(b, op, "Expand", [b.input(op, 0), shape])


@converts("FILL")
def _fill(b: GraphBuilder, op: Operator) -> None:
    # Keras recurrent layers start from tf.zeros([batch, units]): a FILL whose dims come from SHAPE of the input,
    # constant once the input shape is pinned.
    if _fold(b, op, lambda dims, value: np.full([int(d) for d in np.reshape(dims, -1)], np.reshape(value, ()))):
        return
    dims = b.require_constant(op, 0, "dims").astype(np.int64).reshape(-1)
    _elementwise(b, op, "Expand", [b.input(op, 1), b.int64_initializer(f"{_source(b, op)}/shape", dims)])


@converts("REVERSE_V2")
def _reverse_v2(b: GraphBuilder, op: Operator) -> None:
    rank = len(b.shape(op.inputs[0]))
    axes = [int(a) % rank for a in b.require_constant(op, 1, "axes").reshape(-1)]
    data, source = b.constant(op.inputs[0]), _source(b, op)
    if data is not None:
        b.set_constant(op.outputs[0], np.flip(data, axis=tuple(axes)).copy())
        return
    inputs = [b.input(op, 0)] + [b.int64_initializer(f"{source}/{k}", v) for k, v in
                                 (("starts", [-1] * len(axes)), ("ends", [_INT64_MIN] * len(axes)),
                                  ("axes", axes), ("steps", [-1] * len(axes)))]
    _elementwise(b, op, "Slice", inputs)
