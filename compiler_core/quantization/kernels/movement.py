"""Data movement on codes (Reshape, Transpose, Slice, Pad, MaxPool ...), Concat, table lookups, exact ops.

Data-movement ops keep their input's quantization parameters, so they run unchanged on integer
codes; the kernel evaluates the ONNX node itself (``onnx.reference``) on int64 codes, with constant
inputs stored in the IntOp. Pad's constant is the zero point (real zero). Concat rescales inputs
whose parameters differ from the output's. Ops whose outputs are not float (bool masks, int ids)
run exactly on their integer/bool values (docs/numerics.md, "Data movement and exact ops").
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from compiler_core.quantization.fixedpoint import quantize_multiplier, requantize
from compiler_core.quantization.graph import Group
from compiler_core.quantization.kernels import (
    EXACT,
    OBSERVE,
    SAME_AS_INPUT,
    KernelRefusal,
    register,
)
from compiler_core.quantization.lowering import LoweringContext, describe_bits, scalar
from compiler_core.quantization.program import IntOp

_FLOAT_EVALUATED = {"MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin", "Resize"}


def _attributes(node: ir.Node) -> dict:
    result = {}
    for name, attribute in node.attributes.items():
        value = attribute.value
        if isinstance(value, (list, tuple)):
            value = list(value)
        elif isinstance(value, (ir.Graph, ir.TensorProtocol)):
            raise KernelRefusal(f"{node.name}: attribute {name} cannot be carried by an integer kernel")
        result[name] = value
    return result


def _onnx_op(group: Group, ctx: LoweringContext, kind: str) -> IntOp:
    main = group.main
    consts, names = {}, []
    for index, value in enumerate(main.inputs):
        const = ctx.const(value) if value is not None else None
        if const is not None:
            consts[f"input{index}"] = const
            names.append("")
        else:
            names.append(value.name if value is not None else "")
    return IntOp(main.name, kind, main.op_type, names, [v.name for v in main.outputs],
                 attrs={"attributes": _attributes(main), "float_evaluated": main.op_type in _FLOAT_EVALUATED},
                 consts=consts)


def lower_move(group: Group, ctx: LoweringContext) -> IntOp:
    """Movement on codes; Pad's padding constant becomes the zero point."""
    op = _onnx_op(group, ctx, "move")
    main = group.main
    params = ctx.params(main.inputs[0])
    if main.op_type == "Pad":
        value = ctx.const(main.inputs[2]) if len(main.inputs) > 2 and main.inputs[2] is not None else None
        real = float(value.reshape(())) if value is not None and value.size else 0.0
        op.consts["input2"] = np.asarray(params.quantize(np.float64(real)), dtype=np.int64)
        op.inputs = [*op.inputs, ""][:3] if len(op.inputs) < 3 else op.inputs
    if main.op_type == "Resize" and op.attrs["attributes"].get("mode", "nearest") != "nearest":
        raise ValueError(f"{main.name}: only nearest Resize is data movement (see kernels/resize.py)")
    if main.op_type == "Resize":
        _sizes_of_spatial_axes(op, ctx.view.shape(main.inputs[0]))
    op.precision = describe_bits(params)
    return op


def _sizes_of_spatial_axes(op: IntOp, in_shape: list[int]) -> None:
    """A Resize to constant sizes that keep N and C becomes the same Resize over axes [2, 3] (ONNX leaves the other
    axes as they are), so a tile of channels runs it as it is (:func:`compiler_core.backend.layout.channel_local`)."""
    sizes, roi = op.consts.get("input3"), op.consts.get("input1")
    if (sizes is None or sizes.size != 4 or len(in_shape) != 4 or "axes" in op.attrs["attributes"]
            or (roi is not None and roi.size) or [int(size) for size in sizes[:2]] != list(in_shape[:2])):
        return
    op.consts["input3"] = np.asarray(sizes, dtype=np.int64)[2:]
    op.attrs["attributes"]["axes"] = [2, 3]


def lower_exact(group: Group, ctx: LoweringContext) -> IntOp:
    """Non-float outputs: run the node exactly on integer/bool values (quantized inputs dequantized first)."""
    op = _onnx_op(group, ctx, "exact")
    dequantize = {}
    for index, value in enumerate(group.main.inputs):
        if value is not None and ctx.is_quantized(value):
            scale, zero_point = scalar(ctx.params(value))
            dequantize[str(index)] = [scale, zero_point]
    op.attrs["dequantize"] = dequantize
    if group.main.op_type in _EQUALITY_OPS:
        _equal_on_grid(op, group, ctx)
    return op


_EQUALITY_OPS = {"Equal"}
"""Exact ops whose result changes with any difference of their operands (see :func:`_equal_on_grid`)."""


def _equal_on_grid(op: IntOp, group: Group, ctx: LoweringContext) -> None:
    """``Equal(x, c)`` with ``x`` quantized (per tensor) and ``c`` a float constant compares on ``x``'s grid: ``x`` equals
    ``c`` when its code is the nearest to ``c / scale`` (either one at a tie), as an integer comparison of codes does.

    Compared as float, a dequantized code is almost never the constant: hummingbird-ml's tree ensembles compare the
    count of satisfied conditions on each leaf's path with the path's length (integers, a MatMul's output on a grid of
    ``max / 127``: 1 is 63.5 codes), and no leaf matched (a forest's probabilities came out 0 for some digits).
    ``attrs["equal_on_grid"]`` holds the operand's index, the constant's key and half a step (the QDQ export writes
    the constant as its nearest code's value).
    """
    quantized = [int(index) for index in op.attrs["dequantize"]]
    constants = [index for index in range(len(group.main.inputs)) if f"input{index}" in op.consts
                 and np.issubdtype(np.asarray(op.consts[f"input{index}"]).dtype, np.floating)]
    if len(quantized) != 1 or len(constants) != 1 or np.ndim(ctx.params(group.main.inputs[quantized[0]]).scale):
        return
    scale = op.attrs["dequantize"][str(quantized[0])][0]
    op.attrs["equal_on_grid"] = [quantized[0], f"input{constants[0]}", float(scale) / 2]


def _grid_equal_feeds(op: IntOp, feeds: dict) -> None:
    """The quantized operand of a grid Equal set to the constant wherever it lies within half a step of it."""
    index, key, half_step = op.attrs["equal_on_grid"]
    operand, constant = feeds[f"input{index}"], feeds[key]
    close = np.abs(operand.astype(np.float64) - constant.astype(np.float64)) <= half_step * (1 + 1e-6)
    feeds[f"input{index}"] = np.where(close, constant, operand).astype(operand.dtype)


def run_onnx(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Evaluate the ONNX node on codes (``move``) or exact values (``exact``)."""
    feeds, names = {}, []
    for index, name in enumerate(op.inputs):
        key = f"input{index}"
        if key in op.consts:
            feeds[key] = np.asarray(op.consts[key])
            names.append(key)
        elif name:
            value = inputs[index]
            if str(index) in op.attrs.get("dequantize", {}):  # float in the model: the float32 value, as in QDQ
                scale, zero_point = op.attrs["dequantize"][str(index)]
                value = (np.float64(scale) * (value - zero_point)).astype(np.float32)
            feeds[key] = value.astype(np.float64) if op.attrs.get("float_evaluated") else value
            names.append(key)
        else:
            names.append("")
    if "equal_on_grid" in op.attrs:
        _grid_equal_feeds(op, feeds)
    evaluator = _evaluator(op.op_type, tuple(names), len(op.outputs), _frozen(op.attrs["attributes"]))
    results = evaluator.run(None, feeds)
    if op.kind == "move":
        return [np.asarray(r).astype(np.int64) for r in results]
    return [np.asarray(r) for r in results]


def _frozen(attributes: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attributes.items()))


class _GlobalMaxPool(OpRun):
    """``onnx.reference``'s GlobalMaxPool reduces the wrong axes unless the input is 4-D (onnx 1.x
    ``_global_max_pool`` takes ``ndim - 2`` as the first spatial axis); reduce every spatial axis."""

    op_domain = ""

    def _run(self, x):
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)


_GlobalMaxPool.__name__ = "GlobalMaxPool"  # ReferenceEvaluator matches new_ops by class name


class _MaxPool(OpRun):
    """``onnx.reference``'s MaxPool (onnx 1.23) reads ``pads`` as (begin, end) per axis instead of ONNX's all
    begins then all ends: ``pads=[0, 0, 1, 1]`` (TF's SAME for an even window) came out 14x16 for 15x15. The
    maximum over each (dilated) window, pads as ONNX says (auto_pad SAME as the spec: ``ceil(size / stride)``)."""

    op_domain = ""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None, pads=None,  # noqa: PLR0913
             storage_order=None, strides=None):
        kernel = list(kernel_shape)
        rank = len(kernel)
        strides, dilations = list(strides or [1] * rank), list(dilations or [1] * rank)
        spatial = list(x.shape[2:])
        extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            totals = [max((-(-n // s) - 1) * s + e - n, 0) for n, s, e in zip(spatial, strides, extents)]
            small = [t // 2 for t in totals]
            begins = small if auto_pad == "SAME_UPPER" else [t - h for t, h in zip(totals, small)]
            pads = begins + [t - b for t, b in zip(totals, begins)]
        pads = list(pads or [0] * 2 * rank) if auto_pad in (None, "NOTSET") or auto_pad.startswith("SAME") else \
            [0] * 2 * rank
        begins, ends = pads[:rank], pads[rank:]
        rounding = np.ceil if ceil_mode else np.floor
        outs = []
        for n, b, e, s, extent in zip(spatial, begins, ends, strides, extents):
            out = int(rounding((n + b + e - extent) / s)) + 1
            if ceil_mode and (out - 1) * s >= n + b:  # the last window must start inside the input or its begin pad
                out -= 1
            outs.append(out)
        lowest = np.iinfo(x.dtype).min if np.issubdtype(x.dtype, np.integer) else -np.inf
        tail = [max(e, (o - 1) * s + extent - n - b) for n, b, e, o, s, extent in
                zip(spatial, begins, ends, outs, strides, extents)]
        padded = np.pad(x, [(0, 0), (0, 0), *zip(begins, tail)], constant_values=lowest)
        result = None
        for offsets in np.ndindex(*kernel):
            window = padded[(slice(None), slice(None), *(slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in
                                                         zip(offsets, dilations, outs, strides)))]
            result = window if result is None else np.maximum(result, window)
        return (result.astype(x.dtype),)


_MaxPool.__name__ = "MaxPool"


@lru_cache(maxsize=512)
def _evaluator(op_type: str, names: tuple[str, ...], outputs: int, attributes: tuple) -> ReferenceEvaluator:
    output_names = [f"output{i}" for i in range(outputs)]
    node = onnx.helper.make_node(op_type, list(names), output_names,
                                 **{k: list(v) if isinstance(v, tuple) else v for k, v in attributes})
    graph = onnx.helper.make_graph([node], "op", [onnx.helper.make_tensor_value_info(n, 0, None) for n in names if n],
                                   [onnx.helper.make_tensor_value_info(n, 0, None) for n in output_names])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)
    return ReferenceEvaluator(model, new_ops=[_GlobalMaxPool, _MaxPool])


def lower_concat(group: Group, ctx: LoweringContext) -> IntOp:
    """Concat: inputs whose parameters differ from the output's are rescaled first."""
    main = group.main
    out = ctx.params(group.output)
    s_y, zp_y = scalar(out)
    multipliers, shifts, zero_points, names, constants = [], [], [], [], {}
    for index, value in enumerate(main.inputs):
        const = ctx.const(value)
        if const is not None:  # a constant piece is stored in the output's codes: a plain copy
            constants[f"const{index}"] = out.quantize(const).astype(np.int32)
            s_x, zp_x, name = s_y, zp_y, ""
        else:
            (s_x, zp_x), name = scalar(ctx.params(value)), value.name
        multiplier, shift = quantize_multiplier(s_x / s_y)
        multipliers.append(multiplier[0])
        shifts.append(shift[0])
        zero_points.append(zp_x)
        names.append(name)
    axis = int(main.attributes["axis"].as_int()) % len(ctx.view.shape(group.output))
    return IntOp(main.name, "concat", "Concat", names, [group.output.name],
                 attrs={"axis": axis, "zp_inputs": zero_points, "zp_y": zp_y, "clamp": [out.qmin, out.qmax]},
                 consts={"multiplier": np.array(multipliers, dtype=np.int32), "shift": np.array(shifts, dtype=np.int32),
                         **constants},
                 precision=describe_bits(out))


def run_concat(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Rescale each input to the output's codes, then concatenate."""
    attrs = op.attrs
    parts = []
    for index, codes in enumerate(inputs):
        if f"const{index}" in op.consts:
            codes = op.consts[f"const{index}"].astype(np.int64)
        multiplier, shift = int(op.consts["multiplier"][index]), int(op.consts["shift"][index])
        if multiplier == 1 << 30 and shift == 30 and attrs["zp_inputs"][index] == attrs["zp_y"]:
            parts.append(codes)  # same parameters: a plain copy
            continue
        rescaled = requantize(codes - attrs["zp_inputs"][index], multiplier, shift) + attrs["zp_y"]
        parts.append(np.clip(rescaled, *attrs["clamp"]))
    return [np.concatenate(parts, axis=attrs["axis"])]


def lower_gather(group: Group, ctx: LoweringContext) -> IntOp:
    """Gather from a constant table (embedding): the table is stored in the output's codes."""
    main = group.main
    table = ctx.const(main.inputs[0])
    if table is None:
        return lower_move(group, ctx)
    out = ctx.params(group.output)
    axis = int(main.attributes["axis"].as_int()) if "axis" in main.attributes else 0
    dtype = np.int8 if out.bits == 8 else np.int16
    indices = ctx.const(main.inputs[1])
    consts = {"table": out.quantize(table).astype(dtype)}
    if indices is not None:
        consts["indices"] = indices.astype(np.int64)
    return IntOp(main.name, "gather_table", "Gather", ["", main.inputs[1].name if indices is None else ""],
                 [group.output.name], attrs={"axis": axis % table.ndim}, consts=consts, precision=describe_bits(out))


def run_gather_table(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``take(table, indices, axis)`` (negative indices count from the end, as in ONNX)."""
    table = op.consts["table"].astype(np.int64)
    indices = op.consts["indices"] if "indices" in op.consts else inputs[1]
    indices = np.where(indices < 0, indices + table.shape[op.attrs["axis"]], indices)
    return [np.take(table, indices, axis=op.attrs["axis"])]


def gather_policy(group: Group, ctx: LoweringContext) -> str:
    """Gather from a constant table gets observed parameters; from an activation, the input's."""
    return OBSERVE if ctx.const(group.main.inputs[0]) is not None else SAME_AS_INPUT


register("move", lower_move, run_onnx, output_policy=SAME_AS_INPUT)
register("exact", lower_exact, run_onnx, output_policy=EXACT)
register("concat", lower_concat, run_concat)
register("gather_table", lower_gather, run_gather_table, output_policy=gather_policy)
