"""Fast steps for ``linear`` (Conv, Gemm, MatMul with constant weights) and ``matmul`` (two activations).

Accumulation runs in float32 when the layer's worst-case ``|acc|`` (largest centred input code
times the largest per-channel sum of ``|w|``) is below ``2**24``, else in float64 (below ``2**53``):
every partial sum is then an exactly representable integer, so any summation order (BLAS,
onnxruntime's convolution kernels) gives the exact integer sum. Convolutions and dense layers run in
a one-node onnxruntime ``Conv`` / ``MatMul`` session built once per layer; dense layers with 8-bit
weights run on ``MatMulInteger`` (exact int32; 16-bit inputs split into bytes, see
:func:`_integer_dense`), other dense layers on a float32 ``MatMul`` (16-bit inputs split into bytes); products of activations in numpy BLAS. Requantization: :class:`~compiler_core.runtime.fastpath.requant.Requantizer`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict

import numpy as np
import onnx
import onnxruntime as ort

from compiler_core.quantization.kernels.linear import conv_accumulate
from compiler_core.quantization.program import IntOp
from compiler_core.runtime.fastpath.plan import PlanContext, Step, register_fast
from compiler_core.runtime.fastpath.requant import FLOAT32_EXACT, FLOAT64_EXACT, Requantizer

logger = logging.getLogger(__name__)

SPLIT_BITS = 8
SESSION_MEMO_BYTES = 256 << 20  # serialized size of the remembered one-node models (their weights)
_sessions: OrderedDict[bytes, tuple[ort.InferenceSession, int]] = OrderedDict()
_sessions_lock = threading.Lock()


def accumulator_dtype(bound: int) -> type | None:
    """float32 or float64 when every partial sum up to ``bound`` is exact in it, else ``None``."""
    if bound < FLOAT32_EXACT:
        return np.float32
    return np.float64 if bound < FLOAT64_EXACT else None


def _input_zero_point(op: IntOp, rank: int) -> np.ndarray:
    zero_point = np.asarray(op.attrs["zp_x"], dtype=np.float64)
    return zero_point.reshape(1, -1, *([1] * (rank - 2))) if zero_point.ndim else zero_point


@register_fast("linear")
def build_linear(op: IntOp, context: PlanContext) -> Step | None:
    """Conv and ConvTranspose (1-D/2-D) and dense layers."""
    layout, x = op.attrs["layout"], op.inputs[0]
    span, shape = context.span(x, op.attrs["zp_x"]), context.shape(x)
    if layout not in ("conv", "dense", "conv_transpose") or span is None or shape is None:
        return None
    weight = op.consts["weight"].astype(np.int64)
    weight_sum = int(np.abs(weight.reshape(weight.shape[0], -1)).sum(axis=1).max())
    bound = span * weight_sum
    dtype = accumulator_dtype(bound)
    if dtype is None or (layout != "dense" and len(shape) not in (3, 4)) or (layout == "dense" and weight.ndim != 2):
        return None
    channel_shape = (-1,) if layout == "dense" else (-1,) + (1,) * (len(shape) - 2)
    zero_point = np.asarray(op.attrs["zp_y"], dtype=np.int64)
    requant = Requantizer(op.consts["multiplier"].reshape(channel_shape), op.consts["shift"].reshape(channel_shape),
                          op.consts["bias"].reshape(channel_shape),
                          zero_point.reshape(channel_shape) if zero_point.ndim else zero_point, op.attrs["clamp"], bound)
    if layout == "dense":
        integer = _integer_dense(weight, context.params(x), op.attrs["zp_x"], bound)
        if integer is not None:
            return Step(lambda inputs: [requant(integer(inputs[0]))], method=f"linear/integer/{requant.method}")
        return _dense_step(weight, span, weight_sum, requant, _input_zero_point(op, len(shape)))
    zero_point = _input_zero_point(op, len(shape)).astype(dtype)
    attrs = op.attrs
    if layout == "conv_transpose":  # the equivalent convolution of the zero-inserted, padded input
        shape = list(_zero_insert_and_pad(np.zeros([1, *shape[1:]], dtype=np.float32), attrs).shape)
        attrs = {**attrs, "pads": [0] * len(attrs["pads"])}
    accumulate = _conv_session(op, attrs, shape) if dtype == np.float32 else _numpy_conv(op, attrs)
    prepare = (lambda x: _zero_insert_and_pad(x, op.attrs)) if layout == "conv_transpose" else (lambda x: x)
    def run_conv(inputs: list) -> list:
        return [requant(accumulate(prepare(np.subtract(inputs[0], zero_point, dtype=dtype, order="C"))))]
    return Step(run_conv, method=f"{layout}/{np.dtype(dtype).name}/{requant.method}")


INT32_EXACT = 1 << 31


def _integer_dense(weight: np.ndarray, params, zero_point, bound: int):
    """``x -> (x - zp) @ W`` on onnxruntime ``MatMulInteger`` for 8- or 16-bit input codes and 8-bit weights, else ``None``.

    Input codes shift to unsigned by ``-qmin`` (``u = x - qmin``), the weights (within ``[-127, 127]``)
    to uint8 by +128 with a weight zero point of 128. uint8 x uint8 kernels widen to 16 bits before
    multiplying (no saturating pair sums, unlike uint8 x int8 without VNNI) and accumulate in int32.
    8-bit inputs: one call with the input zero point ``zp - qmin`` (exact while ``bound < 2**31``).
    16-bit inputs split into bytes ``u = 256 * high + low``; both halves go through one call,
    stacked on a leading axis, and ``256 * acc_high + acc_low - (zp - qmin) * sum(W)`` is formed in
    float64 (exact: below ``2**53``), as the float32 byte split does.
    """
    levels = int(params.qmax - params.qmin) + 1 if params is not None else 0
    if not levels or np.ndim(zero_point) or levels > 1 << 16 or weight.size == 0 or int(np.abs(weight).max()) > 127:
        return None
    weight_sum = int(np.abs(weight).sum(axis=1).max())  # weight is [N, K]
    offset, centre = int(params.qmin), int(zero_point) - int(params.qmin)
    split = levels > 256
    if (255 * weight_sum if split else bound) >= INT32_EXACT or (split and levels * weight_sum >= FLOAT64_EXACT):
        return None
    session = _one_node_session(_matmul_integer_model(weight, 0 if split else centre))
    shift = np.float32(offset)
    if not split:
        def accumulate(x: np.ndarray) -> np.ndarray:
            codes = (np.subtract(x, shift, dtype=np.float32) if offset else x).astype(np.uint8)
            return session.run(None, {"x": codes})[0]
        return accumulate
    correction = centre * weight.astype(np.float64).sum(axis=1)

    def accumulate_split(x: np.ndarray) -> np.ndarray:
        unsigned = np.subtract(x, shift, dtype=np.float32).astype(np.uint16)
        halves = session.run(None, {"x": np.stack([(unsigned >> 8).astype(np.uint8), unsigned.astype(np.uint8)])})[0]
        acc = halves[0].astype(np.float64)
        acc *= 256
        acc += halves[1]
        acc -= correction
        return acc

    return accumulate_split


def _matmul_integer_model(weight: np.ndarray, input_zero_point: int) -> onnx.ModelProto:
    node = onnx.helper.make_node("MatMulInteger", ["x", "w", "x_zero", "w_zero"], ["y"])
    x_info = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, None)
    y_info = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.INT32, None)
    constants = [onnx.numpy_helper.from_array(np.ascontiguousarray((weight.T + 128).astype(np.uint8)), "w"),
                 onnx.numpy_helper.from_array(np.array(input_zero_point, dtype=np.uint8), "x_zero"),
                 onnx.numpy_helper.from_array(np.array(128, dtype=np.uint8), "w_zero")]
    graph = onnx.helper.make_graph([node], "dense_integer", [x_info], [y_info], constants)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)


def _dense_step(weight: np.ndarray, span: int, weight_sum: int, requant: Requantizer, zero_point: np.ndarray) -> Step:
    """A dense layer on a float32 onnxruntime MatMul when exact, split into bytes when the input is wider.

    Codes whose products overflow float32's exact range are split as ``x = 256 * high + low``
    (``0 <= low < 256``): both halves go through the float32 MatMul in one call, stacked on the
    leading axis, and ``256 * acc_high + acc_low`` is formed in float64 (exact). Beyond that, float64 BLAS.
    """
    high_span = -(-span // (1 << SPLIT_BITS))
    if span * weight_sum < FLOAT32_EXACT:
        dtype, split = np.float32, False
    elif max(high_span, (1 << SPLIT_BITS) - 1) * weight_sum < FLOAT32_EXACT:
        dtype, split = np.float32, True
    else:
        dtype, split = np.float64, False
    zero_point = zero_point.astype(dtype)
    if dtype == np.float64:
        matrix = np.ascontiguousarray(weight.T.astype(dtype))
        def run_blas(inputs: list) -> list:  # C order: BLAS takes it (a transposed view would not)
            return [requant(np.matmul(np.subtract(inputs[0], zero_point, dtype=dtype, order="C"), matrix))]
        return Step(run_blas, method=f"linear/float64/{requant.method}")
    accumulate = _matmul_session(weight.T)
    if not split:
        def run_dense(inputs: list) -> list:
            return [requant(accumulate(np.subtract(inputs[0], zero_point, dtype=dtype, order="C")))]
        return Step(run_dense, method=f"linear/float32/{requant.method}")

    def run_split(inputs: list) -> list:
        centred = np.subtract(inputs[0], zero_point, dtype=np.float32)
        high = np.floor(centred * np.float32(1.0 / (1 << SPLIT_BITS)))  # exact: a power of two
        low = centred - high * (1 << SPLIT_BITS)
        halves = accumulate(np.stack([high, low]))
        acc = halves[0].astype(np.float64)
        acc *= 1 << SPLIT_BITS
        acc += halves[1]
        return [requant(acc)]

    return Step(run_split, method=f"linear/float32-split/{requant.method}")


def _matmul_session(matrix: np.ndarray):
    """A float32 onnxruntime MatMul by a constant integer matrix ``[K, N]`` (exact under the layer's bound)."""
    node = onnx.helper.make_node("MatMul", ["x", "w"], ["y"])
    x_info = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)
    y_info = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    weight = onnx.numpy_helper.from_array(np.ascontiguousarray(matrix.astype(np.float32)), "w")
    graph = onnx.helper.make_graph([node], "dense", [x_info], [y_info], [weight])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)
    session = _one_node_session(model)
    return lambda x: session.run(None, {"x": x})[0]


def _one_node_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """An onnxruntime session of a one-node model, shared with earlier plans that built the same model."""
    data = model.SerializeToString()
    key = hashlib.blake2b(data, digest_size=20).digest()
    with _sessions_lock:
        known = _sessions.get(key)
        if known is not None:
            _sessions.move_to_end(key)
            return known[0]
    session = ort.InferenceSession(data, _session_options(), providers=["CPUExecutionProvider"])
    with _sessions_lock:
        _sessions[key] = (session, len(data))
        total = sum(size for _, size in _sessions.values())
        while total > SESSION_MEMO_BYTES and len(_sessions) > 1:
            total -= _sessions.popitem(last=False)[1][1]
    return session


def _zero_insert_and_pad(x: np.ndarray, attrs: dict) -> np.ndarray:
    """ConvTranspose input: ``stride - 1`` zeros between samples, then the (possibly negative) pads."""
    strides, rank = attrs["input_strides"], len(attrs["input_strides"])
    begin, end = attrs["pads"][:rank], attrs["pads"][rank:]
    spatial = [(n - 1) * s + 1 for n, s in zip(x.shape[2:], strides)]
    padded_shape = [n + max(b, 0) + max(e, 0) for n, b, e in zip(spatial, begin, end)]
    padded = np.zeros((*x.shape[:2], *padded_shape), dtype=x.dtype)
    placed = tuple(slice(max(b, 0), max(b, 0) + n, s) for b, n, s in zip(begin, spatial, strides))
    padded[(slice(None), slice(None), *placed)] = x
    crop = tuple(slice(max(-b, 0), n - max(-e, 0)) for b, e, n in zip(begin, end, padded_shape))
    return padded[(slice(None), slice(None), *crop)]


def _numpy_conv(op: IntOp, attrs: dict):
    weight = op.consts["weight"].astype(np.float64)
    return lambda x: conv_accumulate(x, weight, attrs)


def _conv_session(op: IntOp, attrs: dict, shape: list[int]):
    """A float32 onnxruntime Conv with the layer's integer weights (exact under the layer's bound)."""
    node = onnx.helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=attrs["kernel"], pads=attrs["pads"],
                                 strides=attrs["strides"], dilations=attrs["dilations"], group=attrs["group"])
    x_info = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", *shape[1:]])
    y_info = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    weight = onnx.numpy_helper.from_array(op.consts["weight"].astype(np.float32), "w")
    graph = onnx.helper.make_graph([node], "conv", [x_info], [y_info], [weight])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)
    session = _one_node_session(model)
    return lambda x: session.run(None, {"x": x})[0]


def _session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    # numpy work runs between the convolutions: spinning onnxruntime workers would steal its core
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options


@register_fast("matmul")
def build_matmul(op: IntOp, context: PlanContext) -> Step | None:
    """Product of two activations: exact float BLAS, then one scalar requantization."""
    a, b = op.inputs
    span_a, span_b = context.span(a, op.attrs["zp_a"]), context.span(b, op.attrs["zp_b"])
    shape_a = context.shape(a)
    if span_a is None or span_b is None or not shape_a:
        return None
    bound = int(shape_a[-1]) * span_a * span_b
    dtype = accumulator_dtype(bound)
    if dtype is None:
        return None
    requant = Requantizer(op.consts["multiplier"], op.consts["shift"], None, op.attrs["zp_y"], op.attrs["clamp"], bound)
    zp_a, zp_b = dtype(op.attrs["zp_a"]), dtype(op.attrs["zp_b"])

    def run(inputs: list) -> list:
        left = np.subtract(inputs[0], zp_a, dtype=dtype, order="C")
        right = np.subtract(inputs[1], zp_b, dtype=dtype, order="C")
        return [requant(np.matmul(left, right))]

    return Step(run, method=f"matmul/{np.dtype(dtype).name}/{requant.method}")
