"""Resize: nearest is data movement; linear (and cubic) is an exact separable integer interpolation.

For every interpolated axis the compiler evaluates the ONNX node itself (``onnx.reference``, with
the node's mode, coordinate transformation and cubic/antialias attributes) on the one-hot basis
vectors of that axis, which gives the interpolation matrix ``W[out, in]`` exactly as the spec
defines it. Each row is quantized to Q15 (``2**15`` = 1.0) and corrected to sum to exactly
``2**15``. The kernel contracts the centred codes with these matrices and rounds once; the output
keeps the input's parameters (docs/numerics.md, "Resize").
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from compiler_core.quantization.fixedpoint import round_half_away, rounding_shift
from compiler_core.quantization.graph import Group
from compiler_core.quantization.kernels import SAME_AS_INPUT, KernelRefusal, register
from compiler_core.quantization.kernels.movement import lower_move
from compiler_core.quantization.lowering import LoweringContext, attr_ints, attr_str, describe_bits, scalar
from compiler_core.quantization.program import IntOp

WEIGHT_FRACTION_BITS = 15
AXIS_MATRIX_MEMO_ENTRIES = 16
"""Interpolation matrices remembered per process (float64: 1024 x 512 is 4 MiB; ISNet has 11 distinct ones)."""
_EXACT_LIMIT = float(1 << 53)  # float64 contractions of integers stay exact below this
_AXIS_ATTRIBUTES = ("mode", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside", "antialias")
_NOT_IDENTITY_AT_SCALE_ONE = {"tf_half_pixel_for_nn", "tf_crop_and_resize"}


def lower_resize(group: Group, ctx: LoweringContext) -> IntOp:
    """Nearest -> ``move``; linear/cubic -> ``interpolate`` with one Q15 matrix per resized axis."""
    main = group.main
    if attr_str(main, "mode", "nearest") == "nearest":
        return lower_move(group, ctx)
    _check_supported(main)
    x, y = main.inputs[0], group.output
    params = ctx.params(x)
    _, zero_point = scalar(params)
    in_shape, out_shape = ctx.view.shape(x), ctx.view.shape(y)
    scales = _full_scales(main, ctx, in_shape)
    consts, axes, growth = {}, [], 1.0
    for axis, (in_len, out_len) in enumerate(zip(in_shape, out_shape)):
        scale = None if scales is None else float(scales[axis])
        if _is_identity(main, in_len, out_len, scale):
            continue
        weights = interpolation_matrix(main, in_len, out_len, scale)
        if np.array_equal(weights, np.eye(in_len, dtype=np.int64) << WEIGHT_FRACTION_BITS):
            continue
        consts[f"weight{axis}"] = weights.astype(np.int32)
        axes.append(axis)
        growth *= float(np.abs(weights).sum(axis=1).max())
    if (params.qmax - params.qmin) * growth >= _EXACT_LIMIT:
        raise KernelRefusal(f"{main.name}: interpolating {len(axes)} axes would overflow the exact accumulator; "
                         "at most two resized axes are supported")
    return IntOp(main.name, "interpolate", "Resize", [x.name], [y.name],
                 attrs={"axes": axes, "zp": zero_point, "clamp": [params.qmin, params.qmax]}, consts=consts,
                 precision=describe_bits(params))


def _check_supported(node) -> None:
    if attr_str(node, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        raise KernelRefusal(f"{node.name}: Resize with tf_crop_and_resize has no integer kernel (extrapolated values)")
    if attr_str(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        raise KernelRefusal(f"{node.name}: Resize with keep_aspect_ratio_policy has no integer kernel")


def _full_scales(node, ctx: LoweringContext, in_shape: list[int]) -> np.ndarray | None:
    """Per-axis float32 scales over every axis, or ``None`` when the node gives (constant) sizes."""
    rank = len(in_shape)
    axes = [a % rank for a in attr_ints(node, "axes", list(range(rank)))]
    scales = ctx.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    sizes = ctx.const(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    if scales is not None and scales.size:
        full = np.ones(rank, dtype=np.float32)
        full[axes] = scales.astype(np.float32)
        return full
    if sizes is None or not sizes.size:
        raise KernelRefusal(f"{node.name}: Resize needs constant scales or sizes for its integer kernel")
    return None


def _is_identity(node, in_len: int, out_len: int, scale: float | None) -> bool:
    """Unchanged axes (same length, scale 1) need no matrix, except where the mode shifts samples."""
    mode = attr_str(node, "coordinate_transformation_mode", "half_pixel")
    return in_len == out_len and (scale is None or scale == 1.0) and mode not in _NOT_IDENTITY_AT_SCALE_ONE


def interpolation_matrix(node, in_len: int, out_len: int, scale: float | None) -> np.ndarray:
    """Q15 matrix ``[out_len, in_len]`` of the node's interpolation along one axis; rows sum to ``2**15``."""
    attributes = tuple((name, node.attributes[name].value) for name in _AXIS_ATTRIBUTES if name in node.attributes)
    real = _axis_matrix(attributes, in_len, out_len, scale)
    if real.shape != (out_len, in_len):
        raise ValueError(f"{node.name}: per-axis evaluation gave {real.shape}, expected {(out_len, in_len)}")
    if not np.allclose(real.sum(axis=1), 1.0, atol=1e-6):
        raise KernelRefusal(f"{node.name}: interpolation weights do not sum to 1; no integer kernel")
    return _q15_rows(real)


@functools.lru_cache(maxsize=AXIS_MATRIX_MEMO_ENTRIES)
def _axis_matrix(attributes: tuple, in_len: int, out_len: int, scale: float | None) -> np.ndarray:
    """The real matrix ``[out, in]`` of one axis (read-only), remembered per process: every evaluation of a column runs
    the reference Resize element by element (ISNet's 39 upsamplings to 1024x1024: about 5 s), and a U-Net resizes the
    same lengths many times, the compile's fit check (:mod:`compiler_core.backend.fit`) and its quantization too."""
    evaluator = _axis_evaluator(dict(attributes), by_scale=scale is not None)
    feeds = {"scales": np.array([scale], dtype=np.float32)} if scale is not None else {
        "sizes": np.array([out_len], dtype=np.int64)}
    basis = np.eye(in_len, dtype=np.float64)
    real = np.stack([evaluator.run(None, {"x": basis[i], **feeds})[0] for i in range(in_len)], axis=1)
    real.flags.writeable = False
    return real


def _q15_rows(real: np.ndarray) -> np.ndarray:
    """Round to Q15 and give each row's largest-magnitude weight the rounding remainder."""
    weights = round_half_away(real * (1 << WEIGHT_FRACTION_BITS))
    largest = np.argmax(np.abs(weights), axis=1)
    rows = np.arange(weights.shape[0])
    weights[rows, largest] += (1 << WEIGHT_FRACTION_BITS) - weights.sum(axis=1)
    return weights


def _axis_evaluator(attributes: dict, by_scale: bool) -> ReferenceEvaluator:
    """The node's own Resize (its interpolation ``attributes`` only) on a 1-D input, by scale or by size."""
    inputs = ["x", "", "scales"] if by_scale else ["x", "", "", "sizes"]
    resize = onnx.helper.make_node("Resize", inputs, ["y"], **attributes)
    graph = onnx.helper.make_graph([resize], "axis", [onnx.helper.make_tensor_value_info(n, 0, None)
                                                      for n in inputs if n],
                                   [onnx.helper.make_tensor_value_info("y", 0, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)
    return ReferenceEvaluator(model)


def run_interpolate(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``rounding_shift(W_a @ ... (x - zp), 15 * len(axes)) + zp`` (float64 contractions are exact)."""
    attrs = op.attrs
    centred = (inputs[0] - attrs["zp"]).astype(np.float64)
    for axis in attrs["axes"]:
        weights = op.consts[f"weight{axis}"].astype(np.float64)
        centred = np.moveaxis(np.tensordot(weights, centred, axes=([1], [axis])), 0, axis)
    y = rounding_shift(centred.astype(np.int64), WEIGHT_FRACTION_BITS * len(attrs["axes"])) if attrs["axes"] else \
        centred.astype(np.int64)
    return [np.clip(y + attrs["zp"], *attrs["clamp"])]


register("interpolate", lower_resize, run_interpolate, output_policy=SAME_AS_INPUT)
