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
    """Tabulate ``f`` (with the element-wise steps fused after it) over every input code."""
    main = group.main
    x = main.inputs[0]
    params_in, params_out = ctx.params(x), ctx.params(group.output)
    codes = np.arange(params_in.qmin, params_in.qmax + 1, dtype=np.int64)
    real = evaluate_chain(group, params_in.dequantize(codes).astype(np.float32), ctx).astype(np.float64)
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
