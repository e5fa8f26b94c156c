"""Look-up tables for unary nonlinear functions (the MFU's job).

The table has one entry per input code (256 for int8, 65,536 for int16). Entry ``i`` is the output
code of ``f(dequantize(qmin + i))``, where ``f`` is evaluated by onnxruntime on float32 inputs with
the node's own attributes, so every ONNX unary op is exactly as its spec says
(docs/numerics.md, "Look-up tables").
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from compiler_core.quantization.graph import Group
from compiler_core.quantization.kernels import KernelRefusal, register
from compiler_core.quantization.lowering import LoweringContext, describe_bits
from compiler_core.quantization.program import IntOp

_FINITE_LIMIT = 3.0e38


def evaluate_unary(node: ir.Node, x: np.ndarray, ctx: LoweringContext) -> np.ndarray:
    """Evaluate ``node`` element-wise on the float32 vector ``x`` with onnxruntime."""
    proto = ir.serde.serialize_node(node)
    proto.ClearField("metadata_props")
    names = ["x"]
    initializers = []
    for index, value in enumerate(node.inputs[1:], start=1):
        const = ctx.const(value)
        if const is None:
            raise KernelRefusal(f"{node.name}: input {index} must be a constant for a look-up table")
        if const.size != 1:
            raise KernelRefusal(f"{node.name}: a look-up table needs a scalar input {index}, got shape {const.shape}")
        names.append(f"c{index}")
        initializers.append(onnx.numpy_helper.from_array(const.reshape(()).astype(const.dtype), f"c{index}"))
    del proto.input[:]
    proto.input.extend(names)
    del proto.output[:]
    proto.output.append("y")
    graph = onnx.helper.make_graph([proto], "lut", [onnx.helper.make_tensor_value_info("x", 1, [len(x)])],
                                   [onnx.helper.make_tensor_value_info("y", 1, [len(x)])], initializers)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x.astype(np.float32)})[0]


def lower_lut(group: Group, ctx: LoweringContext) -> IntOp:
    """Tabulate ``f`` over every input code."""
    main = group.main
    x = main.inputs[0]
    params_in, params_out = ctx.params(x), ctx.params(group.output)
    codes = np.arange(params_in.qmin, params_in.qmax + 1, dtype=np.int64)
    real = evaluate_unary(main, params_in.dequantize(codes).astype(np.float32), ctx).astype(np.float64)
    real = np.nan_to_num(real, nan=0.0, posinf=_FINITE_LIMIT, neginf=-_FINITE_LIMIT)
    table = params_out.quantize(real)
    dtype = np.int8 if params_out.bits == 8 else np.int16
    return IntOp(main.name, "lut", main.op_type, [x.name], [group.output.name],
                 attrs={"offset": params_in.qmin}, consts={"table": table.astype(dtype)},
                 precision=describe_bits(params_in, params_out))


def run_lut(op: IntOp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``y = table[x - qmin]``."""
    return [op.consts["table"].astype(np.int64)[inputs[0] - op.attrs["offset"]]]


register("lut", lower_lut, run_lut)
