"""Look-up tables for unary nonlinear functions (the MFU's job).

The table has one entry per input code (256 for int8, 65,536 for int16). Entry ``i`` is the output
code of ``f(dequantize(qmin + i))``, where ``f`` is evaluated by onnxruntime on float32 inputs with
the node's own attributes, so every ONNX unary op is exactly as its spec says
(docs/numerics.md, "Look-up tables").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from compiler_core.quantization.graph import Group
from compiler_core.quantization.kernels import KernelRefusal, register
from compiler_core.quantization.lowering import LoweringContext, describe_bits
from compiler_core.quantization.params import QuantParams
from compiler_core.quantization.program import IntOp

_FINITE_LIMIT = 3.0e38


def evaluate_chain(group: Group, x: np.ndarray, ctx: LoweringContext) -> np.ndarray:
    """Evaluate the group's nodes (a unary function and the element-wise steps fused after it) on ``x``.

    Runs in onnxruntime on float32, with every node's own attributes, so each ONNX op is exactly as
    its spec says. The group's input is ``x``; every other non-constant operand must be the output
    of an earlier node of the group (``graph.absorb_unary_chain`` only fuses such nodes).
    """
    source = group.main.inputs[0]
    names = {source.name: "x"}
    nodes, initializers = [], []
    for position, node in enumerate(group.nodes):
        proto = ir.serde.serialize_node(node)
        proto.ClearField("metadata_props")
        inputs = []
        for index, value in enumerate(node.inputs):
            if value is None:
                inputs.append("")
            elif value.name in names:
                inputs.append(names[value.name])
            else:
                inputs.append(_scalar_initializer(node, index, ctx.const(value), f"c{position}_{index}", initializers))
        del proto.input[:]
        proto.input.extend(inputs)
        del proto.output[:]
        proto.output.append(f"t{position}")
        names[node.outputs[0].name] = f"t{position}"
        nodes.append(proto)
    graph = onnx.helper.make_graph(nodes, "lut", [onnx.helper.make_tensor_value_info("x", 1, [len(x)])],
                                   [onnx.helper.make_tensor_value_info(f"t{len(nodes) - 1}", 1, [len(x)])],
                                   initializers)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x.astype(np.float32)})[0]


def _scalar_initializer(node: ir.Node, index: int, const: np.ndarray | None, name: str, initializers: list) -> str:
    if const is None:
        raise KernelRefusal(f"{node.name}: input {index} must be a constant for a look-up table")
    if const.size != 1:
        raise KernelRefusal(f"{node.name}: a look-up table needs a scalar input {index}, got shape {const.shape}")
    initializers.append(onnx.numpy_helper.from_array(const.reshape(()).astype(const.dtype), name))
    return name


def lower_lut(group: Group, ctx: LoweringContext) -> IntOp:
    """Tabulate ``f`` (with the element-wise steps fused after it) over every input code.

    With per-channel input or output parameters (``bit.activationScales: channel``) there is one table
    per channel: ``[C, 2**bits]``, attribute ``axis`` 1, entry ``[c, i]`` for code ``qmin + i`` of channel ``c``.
    """
    main = group.main
    x = main.inputs[0]
    params_in, params_out = ctx.params(x), ctx.params(group.output)
    codes = np.arange(params_in.qmin, params_in.qmax + 1, dtype=np.int64)
    channels = _channels(params_in, params_out)
    if channels:
        if params_in.bits != 8 or params_out.bits not in (8, 16):
            raise KernelRefusal(f"{main.name}: per-channel look-up tables need an 8-bit input")
        codes = np.broadcast_to(codes, (channels, codes.size))
        real_in = _per_row(params_in).dequantize(codes)
    else:
        real_in = params_in.dequantize(codes)
    real = evaluate_chain(group, real_in.reshape(-1).astype(np.float32), ctx).astype(np.float64).reshape(real_in.shape)
    real = np.nan_to_num(real, nan=0.0, posinf=_FINITE_LIMIT, neginf=-_FINITE_LIMIT)
    table = (_per_row(params_out) if channels else params_out).quantize(real)
    dtype = np.int8 if params_out.bits == 8 else np.int16
    return IntOp(main.name, "lut", main.op_type, [x.name], [group.output.name],
                 attrs={"offset": params_in.qmin, **({"axis": 1} if channels else {})},
                 consts={"table": table.astype(dtype)}, precision=describe_bits(params_in, params_out))


def _channels(*params: QuantParams) -> int:
    """Channels of the per-channel (axis 1) parameters among ``params``, 0 if all are per tensor."""
    sizes = {int(np.size(p.scale)) for p in params if p.axis is not None}
    if any(p.axis not in (None, 1) for p in params) or len(sizes) > 1:
        raise KernelRefusal("per-channel look-up tables need their parameters on axis 1, with one channel count")
    return sizes.pop() if sizes else 0


def _per_row(params: QuantParams) -> QuantParams:
    """``params`` applied to a ``[C, codes]`` table: per-channel parameters on axis 0 (per tensor: broadcast)."""
    if params.axis is None:
        return params
    return dataclasses.replace(params, axis=0)


def run_lut(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``y = table[x - qmin]``; per channel ``y[:, c] = table[c, x[:, c] - qmin]``."""
    table = op.consts["table"].astype(np.int64)
    index = inputs[0] - op.attrs["offset"]
    if table.ndim == 1:
        return [table[index]]
    channel = np.arange(table.shape[0]).reshape(1, -1, *([1] * (index.ndim - 2)))
    return [table[channel, index]]


register("lut", lower_lut, run_lut)
