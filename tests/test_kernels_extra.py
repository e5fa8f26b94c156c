"""Integer kernels for PRelu, linear/cubic Resize and ConvTranspose, and the LSTM decomposition.

Each kernel is checked twice: against an exact float reference computed from the very integer
constants it uses (within one step: only the final rounding differs), and end to end on a small
model (``compiler_core.api.quantize`` with random calibration) against the QDQ model in
onnxruntime (within one step on at least 99.9 % of the output elements, docs/numerics.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from compiler_core.api import mblt_compile, parse_model, quantize
from compiler_core.errors import MxqFormatError
from compiler_core.mxq.schema import validate_program
from compiler_core.quantization import executor, kernels
from compiler_core.quantization.kernels.linear import convolution_weight_as_transposed, transposed_conv_weight
from compiler_core.quantization.kernels.resize import WEIGHT_FRACTION_BITS
from compiler_core.quantization.qdq import export_qdq
from compiler_core.quantization.serialize import to_document

RNG = np.random.default_rng(0)
AGREEMENT = 0.999


def make_model(nodes, inputs: dict[str, list[int]], outputs: dict[str, list[int] | None],
               initializers: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """An opset-21 float model from nodes, input/output shapes and initializers."""
    graph = helper.make_graph(
        nodes, "test", [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs.items()],
        [numpy_helper.from_array(np.asarray(value), name) for name, value in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def quantized(tmp_path: Path, model: onnx.ModelProto):
    """``(mblt_path, QuantizedModel)`` of ``model`` with random calibration."""
    source = tmp_path / "model.onnx"
    onnx.save(model, str(source))
    mblt = mblt_compile(source, tmp_path / "model.mblt", backend="onnx")
    return mblt, quantize(mblt, use_random_calib=True, analysis=False).model


def golden_vs_qdq(mblt: Path, program, feeds: dict[str, np.ndarray]) -> float:
    """Fraction of output codes where the golden executor and the QDQ model agree within one step."""
    codes = executor.run_codes(program, feeds)
    qdq = ir.to_proto(export_qdq(mblt, program)).SerializeToString()
    options = ort.SessionOptions()
    # onnxruntime 1.32's extended MatMul+Add -> Gemm fusion builds an ill-typed QuantizeLinear for
    # 3-D MatMul inputs with int8 zero points; the basic level keeps the QDQ model as written.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(qdq, options, providers=["CPUExecutionProvider"])
    results = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    agree, total = 0, 0
    for name, golden in codes.items():
        reference = program.params(name).quantize(results[name])
        agree += int((np.abs(reference - golden) <= 1).sum())
        total += golden.size
    return agree / total


def feeds_for(model: onnx.ModelProto, count: int = 1):
    """Standard-normal feeds (what random calibration draws) for each model input."""
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    return {name: RNG.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def only_op(program, kind: str):
    """The single integer operation of ``kind``."""
    (op,) = [op for op in program.ops if op.kind == kind]
    return op


# -- PRelu -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("slope_shape", [[1], [4, 1, 1], [1, 1, 5], [4, 3, 5]])
def test_prelu_kernel_against_exact_reference(tmp_path, slope_shape):
    slope = RNG.uniform(-0.5, 1.5, slope_shape).astype(np.float32)
    model = make_model([helper.make_node("PRelu", ["x", "slope"], ["y"])], {"x": [1, 4, 3, 5]},
                       {"y": [1, 4, 3, 5]}, {"slope": slope})
    mblt, program = quantized(tmp_path, model)
    op = only_op(program, "prelu")
    feeds = feeds_for(model)
    x_params, y_params = program.params(op.inputs[0]), program.params(op.outputs[0])
    codes_x = x_params.quantize(feeds["x"])
    (codes_y,) = kernels.KERNELS["prelu"](op, [codes_x])
    real = x_params.dequantize(codes_x)
    exact = np.where(real >= 0, real, real * slope.astype(np.float64)) / y_params.scale + y_params.zero_point
    assert np.abs(codes_y - np.clip(exact, y_params.qmin, y_params.qmax)).max() <= 0.5 + 1e-6
    assert golden_vs_qdq(mblt, program, feeds) >= AGREEMENT


def test_all_prelu_runs_on_the_prelu_kernel(tmp_path):
    model = make_model([helper.make_node("PRelu", ["x", "slope"], ["y"])], {"x": [1, 8]}, {"y": [1, 8]},
                       {"slope": np.array([0.25], dtype=np.float32)})
    _, program = quantized(tmp_path, model)
    assert [op.kind for op in program.ops] == ["prelu"]


# -- Resize ----------------------------------------------------------------------------------------

RESIZE_CASES = [
    ("linear", "half_pixel", {"scales": [1, 1, 2, 2]}),
    ("linear", "align_corners", {"sizes": [1, 3, 11, 7]}),
    ("linear", "asymmetric", {"scales": [1, 1, 1.5, 0.5]}),
    ("linear", "pytorch_half_pixel", {"sizes": [1, 3, 1, 9]}),
    ("linear", "half_pixel_symmetric", {"scales": [1, 1, 3, 2]}),
    ("cubic", "half_pixel", {"scales": [1, 1, 2, 2]}),
]


def resize_model(mode: str, transform: str, target: dict) -> onnx.ModelProto:
    in_shape = [1, 3, 6, 8]
    if "scales" in target:
        out_shape = [int(np.floor(n * s)) for n, s in zip(in_shape, target["scales"])]
        inputs, constants = ["x", "", "scales"], {"scales": np.array(target["scales"], dtype=np.float32)}
    else:
        out_shape = target["sizes"]
        inputs, constants = ["x", "", "", "sizes"], {"sizes": np.array(target["sizes"], dtype=np.int64)}
    node = helper.make_node("Resize", inputs, ["y"], mode=mode, coordinate_transformation_mode=transform)
    return make_model([node], {"x": in_shape}, {"y": out_shape}, constants)


@pytest.mark.parametrize(("mode", "transform", "target"), RESIZE_CASES)
def test_resize_kernel_against_exact_reference(tmp_path, mode, transform, target):
    model = resize_model(mode, transform, target)
    mblt, program = quantized(tmp_path, model)
    op = only_op(program, "interpolate")
    feeds = feeds_for(model)
    params = program.params(op.inputs[0])
    codes_x = params.quantize(feeds["x"])
    (codes_y,) = kernels.KERNELS["interpolate"](op, [codes_x])
    exact = (codes_x - params.zero_point).astype(np.float64)
    for axis in op.attrs["axes"]:
        weights = op.consts[f"weight{axis}"].astype(np.float64) / (1 << WEIGHT_FRACTION_BITS)
        assert np.all(op.consts[f"weight{axis}"].sum(axis=1) == 1 << WEIGHT_FRACTION_BITS)
        exact = np.moveaxis(np.tensordot(weights, exact, axes=([1], [axis])), 0, axis)
    exact = np.clip(exact + params.zero_point, params.qmin, params.qmax)
    assert np.abs(codes_y - exact).max() <= 0.5 + 1e-9
    assert golden_vs_qdq(mblt, program, feeds) >= AGREEMENT


def test_resize_weights_are_the_spec_interpolation(tmp_path):
    """Q15 weights dequantized equal onnxruntime's float Resize within one Q15 step per weight."""
    model = resize_model("linear", "half_pixel", {"scales": [1, 1, 2, 2]})
    _, program = quantized(tmp_path, model)
    op = only_op(program, "interpolate")
    assert op.attrs["axes"] == [2, 3]
    x = np.zeros([1, 3, 6, 8], dtype=np.float32)
    x[0, 0, 2, :] = 1.0  # one row of ones: the output rows are the H-axis weights of input row 2
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(op.consts["weight2"][:, 2] / 2**15, expected[0, 0, :, 0], atol=2**-15)


def test_nearest_resize_stays_a_move(tmp_path):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    model = make_model([node], {"x": [1, 2, 3, 3]}, {"y": [1, 2, 6, 6]},
                       {"scales": np.array([1, 1, 2, 2], dtype=np.float32)})
    _, program = quantized(tmp_path, model)
    assert [op.kind for op in program.ops] == ["move"]


# -- ConvTranspose ---------------------------------------------------------------------------------

CONV_TRANSPOSE_CASES = [
    ({"strides": [2, 2]}, [1, 4, 5, 6], [4, 3, 2, 2], 1),
    ({"strides": [2, 1], "pads": [1, 0, 0, 1], "output_padding": [1, 0]}, [1, 4, 5, 6], [4, 3, 3, 3], 1),
    ({"strides": [3, 2], "dilations": [2, 1], "pads": [2, 1, 1, 2], "group": 2}, [1, 4, 5, 6], [4, 3, 3, 2], 2),
    ({"strides": [2, 2], "group": 4}, [1, 4, 5, 5], [4, 1, 3, 3], 4),
    ({"strides": [2], "pads": [1, 1], "output_padding": [1]}, [1, 4, 7], [4, 2, 4], 1),
    ({"strides": [2, 2], "auto_pad": "VALID"}, [1, 2, 4, 4], [2, 3, 3, 3], 1),
    ({"strides": [2, 2], "output_shape": [9, 10]}, [1, 2, 4, 5], [2, 3, 3, 3], 1),
]


def conv_transpose_model(attributes: dict, x_shape, w_shape, relu: bool = False):
    weight = RNG.standard_normal(w_shape).astype(np.float32) * 0.5
    bias = RNG.standard_normal(w_shape[1] * attributes.get("group", 1)).astype(np.float32) * 0.1
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t" if relu else "y"], **attributes)]
    if relu:
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    model = make_model(nodes, {"x": x_shape}, {"y": None}, {"w": weight, "b": bias})
    return onnx.shape_inference.infer_shapes(model), weight, bias


@pytest.mark.parametrize(("attributes", "x_shape", "w_shape", "groups"), CONV_TRANSPOSE_CASES)
def test_conv_transpose_kernel_against_exact_reference(tmp_path, attributes, x_shape, w_shape, groups):
    model, _, _ = conv_transpose_model(attributes, x_shape, w_shape)
    mblt, program = quantized(tmp_path, model)
    op = only_op(program, "linear")
    assert op.attrs["layout"] == "conv_transpose"
    validate_program(*to_document(program))  # what an MXQ load checks
    feeds = feeds_for(model)
    x_params, y_params = program.params(op.inputs[0]), program.params(op.outputs[0])
    codes_x = x_params.quantize(feeds["x"])
    (codes_y,) = kernels.KERNELS["linear"](op, [codes_x])
    # exact: the float64 ConvTranspose of the spec on the very codes and scales the kernel uses
    weight = convolution_weight_as_transposed(op.consts["weight"].astype(np.float64), groups)
    scales = np.asarray(op.attrs["weight_scale"])
    channel_scale = scales.reshape(groups, 1, -1).repeat(weight.shape[0] // groups, axis=1).reshape(weight.shape[:2])
    real_weight = weight * channel_scale.reshape(*channel_scale.shape, *[1] * (weight.ndim - 2))
    real_bias = op.consts["bias"].astype(np.float64) * x_params.scale * scales
    real_x = x_params.dequantize(codes_x)
    reference = _float_conv_transpose(model, real_x, real_weight, real_bias)
    exact = np.clip(reference / y_params.scale + y_params.zero_point, y_params.qmin, y_params.qmax)
    assert codes_y.shape == exact.shape
    assert np.abs(codes_y - exact).max() <= 0.5 + 1e-6
    assert golden_vs_qdq(mblt, program, feeds) >= AGREEMENT


def _float_conv_transpose(model: onnx.ModelProto, x, weight, bias) -> np.ndarray:
    """The ONNX ConvTranspose in float64, written as the spec's scatter (onnx.reference mishandles groups)."""
    (node,) = [n for n in model.graph.node if n.op_type == "ConvTranspose"]
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    rank, groups = x.ndim - 2, attributes.get("group", 1)
    kernel = weight.shape[2:]
    strides = attributes.get("strides", [1] * rank)
    dilations = attributes.get("dilations", [1] * rank)
    extra = attributes.get("output_padding", [0] * rank)
    full = [s * (n - 1) + d * (k - 1) + 1 + e for s, n, d, k, e in zip(strides, x.shape[2:], dilations, kernel, extra)]
    if "output_shape" in attributes:
        total = [f - o for f, o in zip(full, attributes["output_shape"])]
        pads = [t - t // 2 for t in total] + [t // 2 for t in total]
    else:
        pads = [0] * (2 * rank) if attributes.get("auto_pad") == "VALID" else attributes.get("pads", [0] * (2 * rank))
    in_per_group, out_per_group = x.shape[1] // groups, weight.shape[1]
    y = np.zeros([x.shape[0], out_per_group * groups, *full])
    for position in np.ndindex(*x.shape[2:]):
        for tap in np.ndindex(*kernel):
            target = tuple(p * s + t * d for p, s, t, d in zip(position, strides, tap, dilations))
            for group in range(groups):
                inputs = x[(slice(None), slice(group * in_per_group, (group + 1) * in_per_group), *position)]
                taps = weight[(slice(group * in_per_group, (group + 1) * in_per_group), slice(None), *tap)]
                y[(slice(None), slice(group * out_per_group, (group + 1) * out_per_group), *target)] += inputs @ taps
    crop = tuple(slice(b, f - e) for b, e, f in zip(pads[:rank], pads[rank:], full))
    return y[(slice(None), slice(None), *crop)] + bias.reshape(1, -1, *[1] * rank)


def test_conv_transpose_weight_layout_round_trips():
    weight = RNG.standard_normal([6, 2, 3, 2])
    for groups in (1, 2, 3, 6):
        converted = transposed_conv_weight(weight, groups)
        assert converted.shape == (2 * groups, 6 // groups, 3, 2)
        np.testing.assert_array_equal(convolution_weight_as_transposed(converted, groups), weight)


def test_conv_transpose_fuses_relu(tmp_path):
    model, _, _ = conv_transpose_model({"strides": [2, 2]}, [1, 3, 4, 4], [3, 2, 2, 2], relu=True)
    mblt, program = quantized(tmp_path, model)
    (op,) = program.ops
    assert op.kind == "linear" and len(op.nodes) == 2 and op.attrs["clamp"][0] == program.params(op.outputs[0]).quantize(0.0)
    assert golden_vs_qdq(mblt, program, feeds_for(model)) >= AGREEMENT


# -- LSTM decomposition ----------------------------------------------------------------------------

HIDDEN, INPUT, SEQ, BATCH = 5, 3, 4, 2


def lstm_model(direction: str = "forward", layout: int = 0, bias: bool = True, initial: bool = True,
               peepholes: bool = False, outputs=("Y", "Y_h", "Y_c")) -> onnx.ModelProto:
    directions = 2 if direction == "bidirectional" else 1
    x_shape = [SEQ, BATCH, INPUT] if layout == 0 else [BATCH, SEQ, INPUT]
    state_shape = [directions, BATCH, HIDDEN] if layout == 0 else [BATCH, directions, HIDDEN]
    constants = {"W": RNG.standard_normal([directions, 4 * HIDDEN, INPUT]).astype(np.float32),
                 "R": RNG.standard_normal([directions, 4 * HIDDEN, HIDDEN]).astype(np.float32) * 0.5}
    inputs = {"X": x_shape}
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        constants["B"] = RNG.standard_normal([directions, 8 * HIDDEN]).astype(np.float32) * 0.3
        names[3] = "B"
    if initial:
        inputs.update({"h0": state_shape, "c0": state_shape})
        names[5:7] = ["h0", "c0"]
    if peepholes:
        constants["P"] = RNG.standard_normal([directions, 3 * HIDDEN]).astype(np.float32) * 0.3
        names[7] = "P"
    while names and not names[-1]:
        names.pop()
    node_outputs = [name if name in outputs else "" for name in ("Y", "Y_h", "Y_c")]
    while not node_outputs[-1]:
        node_outputs.pop()
    node = helper.make_node("LSTM", names, node_outputs, hidden_size=HIDDEN, direction=direction, layout=layout)
    model = make_model([node], inputs, {name: None for name in outputs}, constants)
    return onnx.shape_inference.infer_shapes(model)


def _run(model_bytes: bytes, feeds):
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return session.run(None, {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}})


@pytest.mark.parametrize(("direction", "layout", "bias", "initial", "peepholes", "outputs"), [
    ("forward", 0, True, True, False, ("Y", "Y_h", "Y_c")),
    ("reverse", 0, True, True, False, ("Y", "Y_h")),
    ("bidirectional", 0, True, True, True, ("Y", "Y_h", "Y_c")),
    ("bidirectional", 1, False, False, False, ("Y", "Y_c")),
    ("forward", 1, True, False, False, ("Y_h",)),
])
def test_lstm_decomposes_to_primitive_ops(tmp_path, direction, layout, bias, initial, peepholes, outputs):
    model = lstm_model(direction, layout, bias, initial, peepholes, outputs)
    graph, _ = parse_model(_as_path(model, tmp_path), backend="onnx")
    ops = {node.op_type for node in graph.graph}
    assert "LSTM" not in ops and ops <= {"MatMul", "Add", "Sigmoid", "Tanh", "Mul", "Split", "Squeeze", "Unsqueeze",
                                         "Concat", "Transpose", "Reshape", "Slice", "Identity"}
    assert all(node.metadata_props.get("mblt.source_name") == "lstm" for node in graph.graph)
    _assert_unrolled_matches(model, graph, layout)


def _assert_unrolled_matches(model: onnx.ModelProto, graph: ir.Model, layout: int) -> None:
    """The unrolled graph's outputs equal the recurrent node's (onnxruntime; onnx.reference for layout 1)."""
    feeds = feeds_for(model)
    if layout == 0:
        expected = _run(model.SerializeToString(), feeds)
    else:  # onnxruntime has no batch-major (layout 1) recurrent cells
        expected = ReferenceEvaluator(model).run(None, feeds)
    actual = _run(ir.to_proto(graph).SerializeToString(), feeds)
    for want, got in zip(expected, actual):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _as_path(model: onnx.ModelProto, folder: Path) -> Path:
    model.graph.node[0].name = "lstm"
    onnx.save(model, str(folder / "lstm.onnx"))
    return folder / "lstm.onnx"


def test_decomposed_lstm_quantizes(tmp_path):
    model = lstm_model("forward", 0, True, True, False, ("Y", "Y_h", "Y_c"))
    mblt, program = quantized(tmp_path, model)
    assert {op.kind for op in program.ops} <= {"linear", "add", "lut", "mul", "move", "concat"}
    assert golden_vs_qdq(mblt, program, feeds_for(model)) >= 0.99  # many chained roundings, 2x5x4 outputs


def test_unsupported_lstm_is_left_alone(tmp_path):
    model = lstm_model()
    model.graph.node[0].attribute.append(helper.make_attribute("input_forget", 1))
    graph, _ = parse_model(_as_path(model, tmp_path), backend="onnx")
    assert [node.op_type for node in graph.graph] == ["LSTM"]



def gru_rnn_model(op_type: str, direction: str = "forward", layout: int = 0, bias: bool = True, initial: bool = True,
                  linear_before_reset: int = 0, outputs=("Y", "Y_h")) -> onnx.ModelProto:
    gates = 3 if op_type == "GRU" else 1
    directions = 2 if direction == "bidirectional" else 1
    x_shape = [SEQ, BATCH, INPUT] if layout == 0 else [BATCH, SEQ, INPUT]
    state_shape = [directions, BATCH, HIDDEN] if layout == 0 else [BATCH, directions, HIDDEN]
    constants = {"W": RNG.standard_normal([directions, gates * HIDDEN, INPUT]).astype(np.float32),
                 "R": RNG.standard_normal([directions, gates * HIDDEN, HIDDEN]).astype(np.float32) * 0.5}
    inputs = {"X": x_shape}
    names = ["X", "W", "R", "", "", ""]
    if bias:
        constants["B"] = RNG.standard_normal([directions, 2 * gates * HIDDEN]).astype(np.float32) * 0.3
        names[3] = "B"
    if initial:
        inputs["h0"] = state_shape
        names[5] = "h0"
    while not names[-1]:
        names.pop()
    node_outputs = [name if name in outputs else "" for name in ("Y", "Y_h")]
    while not node_outputs[-1]:
        node_outputs.pop()
    extra = {"linear_before_reset": linear_before_reset} if op_type == "GRU" else {}
    node = helper.make_node(op_type, names, node_outputs, hidden_size=HIDDEN, direction=direction, layout=layout,
                            name="cell", **extra)
    model = make_model([node], inputs, {name: None for name in outputs}, constants)
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize(("op_type", "direction", "layout", "bias", "initial", "linear_before_reset", "outputs"), [
    ("GRU", "forward", 0, True, True, 0, ("Y", "Y_h")),
    ("GRU", "forward", 0, True, False, 1, ("Y", "Y_h")),  # how torch exports nn.GRU
    ("GRU", "bidirectional", 0, True, True, 1, ("Y",)),
    ("GRU", "reverse", 0, False, False, 0, ("Y_h",)),
    ("GRU", "bidirectional", 1, True, False, 0, ("Y", "Y_h")),
    ("RNN", "forward", 0, True, True, 0, ("Y", "Y_h")),
    ("RNN", "bidirectional", 0, False, False, 0, ("Y",)),
])
def test_gru_and_rnn_decompose_to_primitive_ops(tmp_path, op_type, direction, layout, bias, initial,
                                                linear_before_reset, outputs):
    model = gru_rnn_model(op_type, direction, layout, bias, initial, linear_before_reset, outputs)
    onnx.save(model, str(tmp_path / "cell.onnx"))
    graph, _ = parse_model(tmp_path / "cell.onnx", backend="onnx")
    ops = {node.op_type for node in graph.graph}
    assert op_type not in ops and ops <= {"MatMul", "Add", "Sub", "Sigmoid", "Tanh", "Mul", "Split", "Squeeze",
                                          "Unsqueeze", "Concat", "Transpose", "Reshape", "Slice", "Identity"}
    _assert_unrolled_matches(model, graph, layout)


def test_decomposed_torch_gru_quantizes(tmp_path):
    model = gru_rnn_model("GRU", "bidirectional", 0, True, False, 1, ("Y",))
    mblt, program = quantized(tmp_path, model)
    # "scale": 1 - z of the first step, whose state is zero
    assert {op.kind for op in program.ops} <= {"linear", "add", "lut", "mul", "move", "concat", "scale"}
    assert golden_vs_qdq(mblt, program, feeds_for(model)) >= 0.99



# -- Einsum lowering ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("equation", "a", "b"), [
    ("bhid,bhjd->bhij", [1, 2, 5, 4], [1, 2, 6, 4]),   # attention scores
    ("bhij,bhjd->bhid", [1, 2, 5, 6], [1, 2, 6, 4]),   # attention context
    ("bnd,dh->bnh", [1, 5, 4], [4, 3]),                # a projection
    ("ij,kj->ik", [5, 4], [3, 4]),                     # B transposed
    ("bij,bjk->bki", [2, 5, 4], [2, 4, 3]),            # output in another order
    ("nchw,kc->nkhw", [1, 4, 3, 5], [6, 4]),           # a 1x1 convolution
    ("abcd,cde->abe", [1, 2, 3, 4], [3, 4, 5]),        # two contracted indices
    ("...id,...jd->...ij", [1, 2, 5, 4], [1, 2, 6, 4]),
    ("ij,ij->i", [5, 4], [5, 4]),                      # row-wise dot products
])
def test_matrix_product_einsum_becomes_matmul(tmp_path, equation, a, b):
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)], {"a": a, "b": b},
                       {"y": None})
    onnx.save(model, str(tmp_path / "einsum.onnx"))
    graph, _ = parse_model(tmp_path / "einsum.onnx", backend="onnx")
    assert "Einsum" not in {node.op_type for node in graph.graph}
    assert "MatMul" in {node.op_type for node in graph.graph}
    feeds = feeds_for(model)
    (expected,) = _run(model.SerializeToString(), feeds)
    (actual,) = _run(ir.to_proto(graph).SerializeToString(), feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("equation", "a", "b"), [
    ("bhid,bhjd->bhij", [1, 1, 3136, 32], [1, 1, 784, 32]),  # CvT's first-stage attention scores
    ("bhij,bhjd->bhid", [1, 2, 5, 6], [1, 2, 6, 4]),
])
def test_a_lowered_einsum_writes_no_reshape_that_keeps_the_shape(tmp_path, equation, a, b):
    """The reshape after the MatMul was written even when it kept the shape: CvT's [1, 1, 3136, 784] scores got a
    whole-tensor Reshape layer that did not fit the core SRAM (check said supported, compile DOES_NOT_FIT)."""
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)], {"a": a, "b": b},
                       {"y": None})
    onnx.save(model, str(tmp_path / "einsum.onnx"))
    graph, _ = parse_model(tmp_path / "einsum.onnx", backend="onnx")
    assert {node.op_type for node in graph.graph} <= {"Transpose", "MatMul"}


@pytest.mark.parametrize(("equation", "a", "b"), [
    ("ij,k->i", [5, 4], [3]),                # kept: an index summed within one operand
    ("bij,jk->bik", [2, 5, 4], [4, 3]),      # lowered: b is a free index of the first operand
    ("bij,bjk->bik", [2, 5, 4], [1, 4, 3]),  # kept: the batch index broadcasts
])
def test_einsums_outside_the_matrix_product_form_are_kept(tmp_path, equation, a, b):
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)], {"a": a, "b": b},
                       {"y": None})
    onnx.save(model, str(tmp_path / "einsum.onnx"))
    graph, _ = parse_model(tmp_path / "einsum.onnx", backend="onnx")
    lowered = "Einsum" not in {node.op_type for node in graph.graph}
    assert lowered == (equation == "bij,jk->bik")
    feeds = feeds_for(model)
    np.testing.assert_allclose(_run(ir.to_proto(graph).SerializeToString(), feeds)[0],
                               _run(model.SerializeToString(), feeds)[0], rtol=1e-5, atol=1e-5)


def test_lowered_einsum_attention_quantizes(tmp_path):
    model = make_model([helper.make_node("Einsum", ["q", "k"], ["s"], equation="bhid,bhjd->bhij"),
                        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
                        helper.make_node("Einsum", ["p", "v"], ["y"], equation="bhij,bhjd->bhid")],
                       {"q": [1, 2, 6, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8]}, {"y": None})
    mblt, program = quantized(tmp_path, model)
    assert golden_vs_qdq(mblt, program, feeds_for(model)) >= 0.99


@pytest.mark.parametrize("shape", [[1, 4, 9], [1, 4, 3, 5], [1, 2, 3, 4, 5]])
def test_global_max_pool_reduces_every_spatial_axis(tmp_path, shape):
    """onnx.reference's GlobalMaxPool is wrong unless 4-D; ours matches onnxruntime on 1-D, 2-D and 3-D."""
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("GlobalMaxPool", ["r"], ["y"])],
                       {"x": shape}, {"y": None})
    mblt, program = quantized(tmp_path, model)
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    assert executor.run_codes(program, feeds)["y"].shape == (*shape[:2], *[1] * (len(shape) - 2))
    assert golden_vs_qdq(mblt, program, feeds) == 1.0


def test_max_against_an_infinite_constant(tmp_path):
    """Max(x, -inf) and Min(x, +inf) (exporters write them as masks) quantize: the constant clips to the range."""
    model = make_model([helper.make_node("Max", ["x", "low"], ["m"]), helper.make_node("Min", ["m", "high"], ["y"])],
                       {"x": [1, 3, 8]}, {"y": None},
                       {"low": np.array([-np.inf, 0.0, -np.inf], np.float32).reshape(1, 3, 1),
                        "high": np.array([np.inf], np.float32)})
    mblt, program = quantized(tmp_path, model)
    assert golden_vs_qdq(mblt, program, feeds_for(model)) >= AGREEMENT


# -- Softmax ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("weight_scale", "least_shift"), [(1e-4, 9), (3.0, 0)])
def test_softmax_output_step_follows_the_calibrated_maximum(tmp_path, weight_scale, least_shift):
    """1,000 near-uniform probabilities (~0.001) keep their resolution; a peaked softmax keeps 1/127.

    With a fixed 1/127 output step every probability below 0.004 was code 0: the output of an
    uncertain 1,000-class classifier was all zeros (cosine 0 to FP32).
    """
    weight = RNG.standard_normal((64, 1000)).astype(np.float32) * weight_scale
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["logits"]),
                        helper.make_node("Softmax", ["logits"], ["y"], axis=-1)],
                       {"x": [1, 64]}, {"y": [1, 1000]}, {"w": weight})
    mblt, program = quantized(tmp_path, model)
    op = only_op(program, "softmax")
    assert op.attrs["shift"] >= least_shift
    assert (op.attrs["shift"] == 0) == (least_shift == 0)
    feeds = feeds_for(model)
    assert golden_vs_qdq(mblt, program, feeds) >= AGREEMENT
    logits = feeds["x"] @ weight
    reference = np.exp(logits - logits.max())
    reference /= reference.sum()
    output = program.params("y").dequantize(executor.run_codes(program, feeds)["y"])
    cosine = float((reference * output).sum() / (np.linalg.norm(reference) * np.linalg.norm(output)))
    assert cosine >= 0.99
    document, consts = to_document(program)
    validate_program(document, consts)  # what an MXQ load checks
    (entry,) = [entry for entry in document["ops"] if entry["kind"] == "softmax"]
    entry["attrs"]["shift"] = 40  # int64 products would overflow
    with pytest.raises(MxqFormatError, match="shift 40"):
        validate_program(document, consts)


def _decision_tree_model(path: Path) -> np.ndarray:
    """hummingbird-ml's GEMM form of a depth-3 decision tree: its 7 conditions ``x[f] <= t`` as 0/1, their sum along
    each leaf's path (+1 where the path turns left, -1 where it turns right) compared with ``Equal`` to the number of
    left turns (the one leaf reached), then the leaves' class values. Returns 80 inputs."""
    rng = np.random.default_rng(3)
    features, depth, classes = 16, 3, 5
    conditions, leaves = 2 ** depth - 1, 2 ** depth
    paths, lefts = np.zeros((conditions, leaves), np.float32), np.zeros(leaves, np.float32)
    for leaf in range(leaves):
        node = 0
        for level in range(depth):
            right = leaf >> (depth - 1 - level) & 1
            paths[node, leaf], lefts[leaf] = (-1.0, lefts[leaf]) if right else (1.0, lefts[leaf] + 1)
            node = 2 * node + 1 + right
    tensors = {"select": np.eye(features, dtype=np.float32)[:, rng.integers(0, features, conditions)],
               "thresholds": rng.uniform(0.3, 0.7, conditions).astype(np.float32), "paths": paths,
               "lengths": lefts, "values": rng.uniform(0, 1, (leaves, classes)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "select"], ["picked"]),
             helper.make_node("LessOrEqual", ["picked", "thresholds"], ["true"]),
             helper.make_node("Cast", ["true"], ["ones"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["ones", "paths"], ["counts"]),
             helper.make_node("Equal", ["counts", "lengths"], ["reached"]),
             helper.make_node("Cast", ["reached"], ["leaf"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["leaf", "values"], ["y"])]
    graph = helper.make_graph(nodes, "tree", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, features])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, classes])],
                              [numpy_helper.from_array(value, name) for name, value in tensors.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return rng.uniform(0, 1, (80, 1, features)).astype(np.float32)


def test_equal_compares_a_quantized_count_with_a_constant_on_the_count_s_own_grid(tmp_path):
    """A constant compared with ``Equal`` to a quantized activation is put on that activation's grid: compared as
    float with a dequantized code (3 * 127 / 8 codes of 8 / 127 is 3.0236, not 3.0), no leaf of a tree ensemble
    matched and hummingbird-ml's random forest on scikit-learn's digits came out at cosine 0.50 (0 on some digits);
    the integer program now reaches the same leaves as onnxruntime on held-out inputs, and so does its QDQ export."""
    inputs = _decision_tree_model(tmp_path / "tree.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    for index, sample in enumerate(inputs[:64]):  # every path length (0..3) among them
        np.save(calib / f"{index:02d}.npy", sample)
    mblt = mblt_compile(tmp_path / "tree.onnx", tmp_path / "tree.mblt")
    model = quantize(mblt, calib_data_path=calib, analysis=False).model
    reference = ort.InferenceSession(str(tmp_path / "tree.onnx"))
    qdq = ort.InferenceSession(ir.serde.serialize_model(export_qdq(mblt, model)).SerializeToString())
    for sample in inputs[64:]:
        expected = reference.run(None, {"x": sample})[0]
        assert np.allclose(executor.run(model, {"x": sample})["y"], expected, atol=0.02)
        assert np.allclose(qdq.run(None, {"x": sample})[0], expected, atol=0.02)


def test_an_unrolled_lstm_stores_its_recurrent_weights_once_in_the_mxq(tmp_path, monkeypatch):
    """Each unrolled step is its own MatMul with its own copy of the recurrent weights (and their requantization
    tables); the MXQ keeps one copy that every step reads (a BiLSTM text model: 124 MB -> 24 MB)."""
    from compiler_core.api import mxq_compile
    from compiler_core.mxq.container import read_mxq
    from compiler_core.runtime import Accelerator, Model

    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    model = lstm_model("bidirectional", 0, True, True, False, ("Y",))
    result = mxq_compile(str(_as_path(model, tmp_path)), target_device="aries-rb", save_path=tmp_path / "lstm.mxq",
                         use_random_calib=True)
    mxq = read_mxq(result.mxq_path)
    steps = [entry for entry in mxq.const_index if entry.dtype == "|i1" and entry.shape == (4 * HIDDEN, HIDDEN)]
    assert len(steps) == 2 * SEQ  # per direction, every step reads R (h0 is an input)
    assert len({(entry.offset, entry.nbytes) for entry in steps}) == 2  # one copy per direction
    assert mxq.version == (2, 0)
    feeds = feeds_for(model)
    runtime = Model(result.mxq_path, input_layout="NCHW")  # the source layout
    runtime.launch(Accelerator("aries-rb"))
    ours = np.asarray(runtime.infer(feeds)[0], np.float64).ravel()
    want = np.asarray(_run(model.SerializeToString(), feeds)[0], np.float64).ravel()
    assert ours @ want / np.linalg.norm(ours) / np.linalg.norm(want) > 0.98  # every step reads the shared copy


# -- A causal mask of -inf -------------------------------------------------------------------------


def test_a_causal_mask_of_minus_infinity_added_to_scores_masks_the_softmax(tmp_path):
    """torch's TorchScript export of ``scaled_dot_product_attention(is_causal=True)`` adds a constant ``[0 / -inf]``
    mask to the scores: check said supported and the compile refused it ("holds inf or NaN values"). -inf saturates
    like the -3.4e38 masks do: the masked entries get the smallest code, which the Softmax reads as -inf."""
    size = 6
    mask = np.triu(np.full((size, size), -np.inf, np.float32), k=1)
    model = make_model([helper.make_node("Add", ["x", "mask"], ["scores"]),
                        helper.make_node("Softmax", ["scores"], ["y"], axis=-1)],
                       {"x": [1, 2, size, size]}, {"y": [1, 2, size, size]}, {"mask": mask})
    _, program = quantized(tmp_path, model)
    feeds = feeds_for(model)
    actual = executor.run(program, feeds)["y"]
    expected = ReferenceEvaluator(model).run(None, feeds)[0]
    assert np.all(actual[..., np.isinf(mask)] == 0)  # the masked entries weigh nothing
    assert np.abs(actual - expected).max() < 0.02  # the other entries: int8 codes of probabilities (1/255 a step)
