"""Export the quantization decisions as a QDQ ONNX model that onnxruntime runs.

Every quantized tensor gets a ``QuantizeLinear -> DequantizeLinear`` pair with its frozen parameters;
weights, biases, added constants, embedding tables and ``Where`` constants are stored as the very
integer codes of the program behind a ``DequantizeLinear``. The float ops in between are the MBLT's
own, so the model is an independent cross-check of the golden executor (docs/numerics.md says where
the two may differ by one step) and a portable artifact in its own right.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx_ir as ir

from compiler_core.fileio import atomic_write
from compiler_core.mblt.io import load_mblt
from compiler_core.quantization.kernels.normalization import FRACTION_BITS
from compiler_core.quantization.params import QuantParams
from compiler_core.quantization.program import IntOp, QuantizedModel
from compiler_core.quantization.smoothquant import COPY_SUFFIX

logger = logging.getLogger(__name__)


def export_qdq(mblt_path: str | Path, model: QuantizedModel) -> ir.Model:
    """The QDQ model (in memory) for ``model``, built on a fresh copy of its MBLT."""
    graph_model = load_mblt(mblt_path)
    graph = graph_model.graph
    nodes = {node.name: node for node in graph}
    _add_norm_copies(graph, nodes, model)
    for op in model.ops:
        _integer_constants(graph, nodes, op, model)
    for name in model.tensors:
        _insert_qdq(graph, name, model.params(name))
    graph.sort()
    for name in [n for n, v in graph.initializers.items() if not v.uses() and not v.is_graph_output()]:
        del graph.initializers[name]  # the float weights the integer codes replaced
    graph_model.producer_name = "qbcompiler-qdq"
    return graph_model


def save_qdq(mblt_path: str | Path, model: QuantizedModel, path: str | Path) -> Path:
    """Write the QDQ model atomically."""
    qdq = export_qdq(mblt_path, model)
    data = ir.to_proto(qdq).SerializeToString()
    return atomic_write(path, lambda temp: temp.write_bytes(data))


# -- tensors --------------------------------------------------------------------------------------


def _constant(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=ir.tensor(array, name=name))
    graph.register_initializer(value)
    return value


def _qparams(graph: ir.Graph, prefix: str, params: QuantParams) -> tuple[ir.Value, ir.Value]:
    scale = _constant(graph, f"{prefix}.scale", np.asarray(params.scale, dtype=np.float32))
    zero = _constant(graph, f"{prefix}.zero_point", np.asarray(params.zero_point).astype(params.dtype))
    return scale, zero


def _insert_qdq(graph: ir.Graph, name: str, params: QuantParams) -> None:
    value = _find_value(graph, name)
    uses = list(value.uses())
    scale, zero = _qparams(graph, f"{name}.q", params)
    axis = {"axis": params.axis} if params.axis is not None else {}
    quantize = ir.node("QuantizeLinear", [value, scale, zero], attributes=axis, name=f"{name}.quantize")
    dequantize = ir.node("DequantizeLinear", [quantize.outputs[0], scale, zero], attributes=axis,
                         name=f"{name}.dequantize")
    quantize.outputs[0].name = f"{name}.codes"
    graph.extend([quantize, dequantize])
    if value.is_graph_output():
        _swap_output(graph, value, dequantize.outputs[0], name)
    else:
        dequantize.outputs[0].name = f"{name}.dq"
    for node, index in uses:
        node.replace_input_with(index, dequantize.outputs[0])


def _swap_output(graph: ir.Graph, value: ir.Value, replacement: ir.Value, name: str) -> None:
    """Graph outputs keep their names: the float value is renamed, the dequantized one takes its name."""
    value.name = f"{name}.float"
    replacement.name = name
    replacement.shape, replacement.type = value.shape, value.type
    graph.outputs[graph.outputs.index(value)] = replacement


def _find_value(graph: ir.Graph, name: str) -> ir.Value:
    for value in graph.inputs:
        if value.name == name:
            return value
    for node in graph:
        for value in node.outputs:
            if value.name == name:
                return value
    raise KeyError(name)


# -- integer constants ----------------------------------------------------------------------------


def _integer_constants(graph: ir.Graph, nodes: dict[str, ir.Node], op: IntOp, model: QuantizedModel) -> None:
    handler = _CONSTANT_HANDLERS.get(op.kind)
    if handler is not None:
        handler(graph, nodes, op, model)


def _dequantized(graph: ir.Graph, name: str, codes: np.ndarray, scale, zero_point=0, axis=None) -> ir.Value:
    codes_value = _constant(graph, f"{name}.codes", codes)
    scale_value = _constant(graph, f"{name}.scale", np.asarray(scale, dtype=np.float32))
    zero_value = _constant(graph, f"{name}.zero_point", np.zeros_like(np.asarray(scale), dtype=codes.dtype)
                           if np.ndim(scale) else np.asarray(zero_point, dtype=codes.dtype))
    node = ir.node("DequantizeLinear", [codes_value, scale_value, zero_value],
                   attributes={"axis": axis} if axis is not None else {}, name=f"{name}.dequantize")
    node.outputs[0].name = f"{name}.dq"
    graph.append(node)
    return node.outputs[0]


def _linear_constants(graph, nodes, op: IntOp, model: QuantizedModel) -> None:
    main = nodes[op.name]
    input_params = model.params(op.inputs[0])
    input_scale = float(input_params.scale) if input_params.axis is None else 1.0  # per channel: folded
    codes = op.consts["weight"]
    weight_scale = np.asarray(op.attrs["weight_scale"])
    if main.op_type == "ConvTranspose":
        main.replace_input_with(1, _transposed_weight(graph, op, codes, weight_scale))
    elif input_params.axis is not None:
        main.replace_input_with(1, _unfolded_weight(graph, op, codes, weight_scale, np.asarray(input_params.scale)))
    else:
        weight, axis = _weight_layout(main, codes)
        main.replace_input_with(1, _dequantized(graph, f"{op.name}.weight", weight, weight_scale, axis=axis))
    bias = _dequantized(graph, f"{op.name}.bias", op.consts["bias"].astype(np.int32), input_scale * weight_scale,
                        axis=0)
    if main.op_type in ("Conv", "ConvTranspose", "Gemm"):
        if len(main.inputs) > 2:
            main.replace_input_with(2, bias)
        else:
            main.resize_inputs(3)
            main.replace_input_with(2, bias)
        for attribute in ("alpha", "beta"):
            if attribute in main.attributes:
                main.attributes[attribute] = ir.AttrFloat32(attribute, 1.0)
        return
    add = nodes.get(op.nodes[1]) if len(op.nodes) > 1 else None
    if add is not None and add.op_type == "Add":
        add.replace_input_with(1 if add.inputs[0] is main.outputs[0] else 0, bias)
        return
    if np.any(op.consts["bias"]):  # no bias Add in the model, but bias correction made one
        _append_bias(graph, main, bias)


def _unfolded_weight(graph: ir.Graph, op: IntOp, codes: np.ndarray, weight_scale: np.ndarray,
                     input_scale: np.ndarray) -> ir.Value:
    """Conv weights that fold per-channel input scales (``codes * s_w[o] = w[o, c] * s_x[c]``): the codes
    dequantized with scale 1 (exact), times ``s_w[o] / s_x[c]`` per element (one float32 rounding)."""
    from compiler_core.quantization.kernels.linear import input_channel_index

    out_channels, per_group = codes.shape[:2]
    channel = input_channel_index(out_channels, per_group, input_scale.size // per_group)
    return _scaled_unit(graph, op, codes, weight_scale.reshape(-1, 1) / input_scale[channel])


def _scaled_unit(graph: ir.Graph, op: IntOp, codes: np.ndarray, scales: np.ndarray) -> ir.Value:
    """Weight ``codes`` dequantized with scale 1 (exact), times per-element float32 ``scales`` over their first two
    axes (one rounding, as in ``DequantizeLinear``): for scales that no single ``DequantizeLinear`` axis expresses."""
    unit = _dequantized(graph, f"{op.name}.weight", codes, 1.0)
    scale_value = _constant(graph, f"{op.name}.weight.channel_scale",
                            scales.reshape(*scales.shape, *[1] * (codes.ndim - 2)).astype(np.float32))
    node = ir.node("Mul", [unit, scale_value], name=f"{op.name}.weight.scale")
    node.outputs[0].name = f"{op.name}.weight.scaled"
    graph.append(node)
    return node.outputs[0]


def _append_bias(graph: ir.Graph, main: ir.Node, bias: ir.Value) -> None:
    """Insert ``Add(main_output, bias)``; the sum takes the output's name (and its quantization)."""
    output = main.outputs[0]
    name, uses = output.name, list(output.uses())
    add = ir.node("Add", [output, bias], name=f"{main.name}.bias_add")
    output.name = f"{name}.unbiased"
    add.outputs[0].name = name
    add.outputs[0].shape, add.outputs[0].type = output.shape, output.type
    graph.append(add)
    for node, index in uses:
        node.replace_input_with(index, add.outputs[0])
    if output.is_graph_output():
        graph.outputs[graph.outputs.index(output)] = add.outputs[0]


def _transposed_weight(graph: ir.Graph, op: IntOp, codes: np.ndarray, weight_scale: np.ndarray) -> ir.Value:
    """ConvTranspose weights ``[Cin, Cout/g, k...]``: the output channel is axis 1 (within a group).

    With one group the per-channel scales go on axis 1. With several, output channel ``o`` of group
    ``g`` is ``g * Cout/g + o``, which no single ``DequantizeLinear`` axis expresses, so the codes are
    dequantized with scale 1 (exact) and multiplied by the per-element float32 scales (one rounding,
    as in ``DequantizeLinear``).
    """
    from compiler_core.quantization.kernels.linear import convolution_weight_as_transposed

    groups = int(op.attrs["group"])
    weight = convolution_weight_as_transposed(codes, groups)
    if groups == 1:
        return _dequantized(graph, f"{op.name}.weight", weight, weight_scale, axis=1)
    in_channels, out_per_group = weight.shape[:2]
    scales = weight_scale.reshape(groups, 1, out_per_group)
    scales = np.broadcast_to(scales, (groups, in_channels // groups, out_per_group)).reshape(in_channels, out_per_group)
    return _scaled_unit(graph, op, weight, scales)


def _weight_layout(main: ir.Node, codes: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes in the node's own weight layout, and the output-channel axis there."""
    if main.op_type == "Conv":
        return codes, 0
    if main.op_type == "Gemm" and "transB" in main.attributes and main.attributes["transB"].as_int():
        return codes, 0
    return np.ascontiguousarray(codes.T), 1


def _add_constants(graph, nodes, op: IntOp, model: QuantizedModel) -> None:
    main = nodes[op.name]
    for index, key in ((0, "const_a"), (1, "const_b")):
        if key in op.consts:
            main.replace_input_with(index, _dequantized(graph, f"{op.name}.{key}", op.consts[key],
                                                        op.attrs[f"{key}_scale"]))


def _table_constants(graph, nodes, op: IntOp, model: QuantizedModel) -> None:
    main = nodes[op.name]
    params = model.params(op.outputs[0])
    main.replace_input_with(0, _dequantized(graph, f"{op.name}.table", op.consts["table"], params.scale,
                                            params.zero_point))


def _select_constants(graph, nodes, op: IntOp, model: QuantizedModel) -> None:
    main = nodes[op.name]
    params = model.params(op.outputs[0])
    for index, key in ((1, "const_x"), (2, "const_y")):
        if key in op.consts:
            codes = op.consts[key].astype(params.dtype)
            main.replace_input_with(index, _dequantized(graph, f"{op.name}.{key}", codes, params.scale,
                                                        params.zero_point))


def _add_norm_copies(graph: ir.Graph, nodes: dict[str, ir.Node], model: QuantizedModel) -> None:
    """Recreate the norm copies SmoothQuant added (``duplicateNorms``) and point their readers at them.

    Their gamma/beta come from the program (:func:`_layernorm_constants`); everything else from the
    norm they copy.
    """
    values = {value.name: value for node in graph for value in node.outputs}
    for op in model.ops:
        if op.name in nodes or op.kind != "layernorm" or not op.name.endswith(COPY_SUFFIX):
            continue
        norm = nodes.get(op.name[:-len(COPY_SUFFIX)])
        if norm is None:
            continue
        copy = ir.node(norm.op_type, list(norm.inputs[:3]), attributes=dict(norm.attributes), domain=norm.domain,
                       name=op.name, num_outputs=1)
        output = copy.outputs[0]
        output.name, output.shape, output.type = op.outputs[0], norm.outputs[0].shape, norm.outputs[0].type
        graph.insert_after(norm, copy)
        nodes[op.name] = copy
        values[output.name] = output
    for op in model.ops:
        node = nodes.get(op.name)
        if node is None or not op.inputs or not node.inputs or node.inputs[0] is None:
            continue
        if node.inputs[0].name != op.inputs[0] and op.inputs[0].endswith(COPY_SUFFIX) and op.inputs[0] in values:
            node.replace_input_with(0, values[op.inputs[0]])


def _layernorm_constants(graph, nodes, op: IntOp, model: QuantizedModel) -> None:
    """The program's gamma/beta where they differ from the MBLT's (SmoothQuant divided them; see smoothquant.py).

    gamma comes back from the per-element multipliers (``M * 2**-S * 2**F * s_y``, 31-bit exact) and
    beta from the integer offsets (``offset * s_y``, what the kernel adds).
    """
    main = nodes[op.name]
    scale = main.inputs[1].const_value.numpy() if main.inputs[1] is not None and main.inputs[1].const_value else None
    s_y = float(model.params(op.outputs[0]).scale)
    gamma = op.consts["multiplier"].astype(np.float64) * np.exp2(-op.consts["shift"].astype(np.float64))
    gamma *= (1 << FRACTION_BITS) * s_y
    if scale is None or scale.size != gamma.size or np.allclose(gamma, scale.reshape(-1), rtol=1e-6, atol=0):
        return
    main.replace_input_with(1, _constant(graph, f"{op.name}.scale", gamma.reshape(scale.shape).astype(np.float32)))
    beta = (op.consts["offset"].astype(np.float64) * s_y).reshape(scale.shape).astype(np.float32)
    if len(main.inputs) > 2 and main.inputs[2] is not None:
        main.replace_input_with(2, _constant(graph, f"{op.name}.bias", beta))


def _exact_constants(graph, nodes, op: IntOp, model: QuantizedModel) -> None:
    """An Equal compared on its operand's grid (``equal_on_grid``): its constant written as the value of its nearest
    code (half away from zero; the program also accepts the other code at a tie)."""
    if "equal_on_grid" not in op.attrs:
        return
    index, key, _ = op.attrs["equal_on_grid"]
    scale, zero_point = op.attrs["dequantize"][str(index)]
    constant = np.asarray(op.consts[key])
    codes = np.sign(constant) * np.floor(np.abs(constant.astype(np.float64) / scale) + 0.5) + zero_point
    snapped = (np.float64(scale) * (codes - zero_point)).astype(constant.dtype)
    nodes[op.name].replace_input_with(int(key.removeprefix("input")), _constant(graph, f"{op.name}.{key}", snapped))


_CONSTANT_HANDLERS = {"linear": _linear_constants, "add": _add_constants, "gather_table": _table_constants,
                      "select": _select_constants, "layernorm": _layernorm_constants, "exact": _exact_constants}


# -- cross-check ----------------------------------------------------------------------------------


def layerwise_qdq(mblt_path: str | Path, model: QuantizedModel) -> ir.Model:
    """The QDQ model cut at every quantized tensor: each layer reads *given* codes, writes its own.

    Every ``DequantizeLinear`` of an activation reads a new graph input ``<tensor>.codes_in`` and
    every ``QuantizeLinear`` output ``<tensor>.codes`` is a graph output. Feeding the golden
    executor's codes checks each layer on the very inputs the golden executor used, so one-step
    differences (float32 vs exact integer arithmetic) cannot cascade through the network.
    """
    qdq = export_qdq(mblt_path, model)
    graph = qdq.graph
    for node in list(graph):
        if node.op_type != "QuantizeLinear" or not node.outputs[0].name.endswith(".codes"):
            continue
        codes = node.outputs[0]
        codes.shape = node.inputs[0].shape
        codes.type = ir.TensorType(node.inputs[2].const_value.dtype)
        cut = ir.Value(name=f"{codes.name}_in", shape=codes.shape, type=codes.type)
        graph.inputs.append(cut)
        for user, index in list(codes.uses()):
            user.replace_input_with(index, cut)
        if not codes.is_graph_output():
            graph.outputs.append(codes)
    return qdq


def cross_check(mblt_path: str | Path, model: QuantizedModel, samples, *, layerwise: bool = True) -> dict:
    """Agreement of the golden executor with onnxruntime running the QDQ model.

    Returns per tensor ``{elements, within_one, equal, max_difference}`` and the totals over the
    model outputs; with ``layerwise`` each layer is fed the golden codes of its inputs.
    """
    import onnxruntime as ort

    from compiler_core.quantization import executor

    graph = layerwise_qdq(mblt_path, model) if layerwise else _with_code_outputs(export_qdq(mblt_path, model))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(ir.to_proto(graph).SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = [item.name for item in session.get_outputs() if item.name.endswith(".codes")]
    tally: dict[str, list[int]] = {}
    for sample in samples:
        feeds = {spec.name: np.asarray(sample[spec.name]) for spec in model.inputs}
        env = executor.execute(model, executor.quantize_inputs(model, feeds), keep=True)
        ort_feeds = {item.name: _feed(item, env, feeds) for item in session.get_inputs()}
        for name, value in zip(wanted, session.run(wanted, ort_feeds)):
            _tally(tally, name[: -len(".codes")], env, value)
    return _agreement(tally, [spec.name for spec in model.outputs])


def _with_code_outputs(qdq: ir.Model) -> ir.Model:
    for node in qdq.graph:
        if node.op_type == "QuantizeLinear" and not node.outputs[0].is_graph_output():
            node.outputs[0].shape = node.inputs[0].shape
            node.outputs[0].type = ir.TensorType(node.inputs[2].const_value.dtype)
            qdq.graph.outputs.append(node.outputs[0])
    return qdq


def _feed(item, env: dict, feeds: dict) -> np.ndarray:
    if item.name.endswith(".codes_in"):
        codes = env[item.name[: -len(".codes_in")]]
        return codes.astype({"tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
                             "tensor(int16)": np.int16}.get(item.type, np.int8))
    return feeds[item.name]


def _tally(tally: dict, tensor: str, env: dict, value: np.ndarray) -> None:
    if tensor not in env:
        return
    difference = np.abs(env[tensor] - value.astype(np.int64))
    entry = tally.setdefault(tensor, [0, 0, 0, 0])
    entry[0] += difference.size
    entry[1] += int((difference <= 1).sum())
    entry[2] += int((difference == 0).sum())
    entry[3] = max(entry[3], int(difference.max()) if difference.size else 0)


def _agreement(tally: dict, outputs: list[str]) -> dict:
    tensors = {name: {"elements": e, "within_one": w / e if e else 1.0, "equal": q / e if e else 1.0,
                      "max_difference": m} for name, (e, w, q, m) in tally.items()}
    total = [sum(tally[name][i] for name in tally) for i in range(3)]
    out = [sum(tally[name][i] for name in outputs if name in tally) for i in range(3)]
    return {"tensors": tensors,
            "all_tensors": {"elements": total[0], "within_one": total[1] / max(total[0], 1),
                            "equal": total[2] / max(total[0], 1)},
            "outputs": {"elements": out[0], "within_one": out[1] / max(out[0], 1), "equal": out[2] / max(out[0], 1)}}
