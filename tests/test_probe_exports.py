"""Layers and exports an unseen-model probe found broken (s12): each goes through the user's path.

Old-opset resizes keep their coordinates; a MatMul with a batched constant weight, a Gemm with transA or
activation operands, a circular pad, LogSoftmax and int32 ids cast for a lookup run on the NPU; inputs
returned as outputs keep their names and constant outputs are refused with a remedy; a model that leaves
the NPU nothing is refused with its ops named; asymmetric MaxPool pads follow ONNX; Keras recurrent layers,
dilated convolutions and an UpSampling2D + Cropping2D compile and follow Keras.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from corpus import write_manifest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mblt_compile, mxq_compile
from compiler_core.errors import UnsupportedOpsError
from compiler_core.mblt.conversion import convert_version
from compiler_core.mblt.io import load_mblt
from compiler_core.runtime import Accelerator, Model
from compiler_core.targets import SupportStatus, check_support

RNG = np.random.default_rng(0)
FLOAT = TensorProto.FLOAT


def _save(tmp_path: Path, name: str, nodes, inputs, outputs, weights, opset: int) -> Path:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, FLOAT, s) for n, s in outputs], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 6 if opset <= 11 else 8
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _floats(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.float32), name)


def _run(path, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _compile_and_run(source: Path, shapes: dict, tmp_path: Path, **options) -> tuple[list, list]:
    """Compile on 8 random samples, run the MXQ and onnxruntime on one other: (MXQ outputs, source outputs)."""
    sample = lambda: {n: RNG.standard_normal(s).astype(np.float32) for n, s in shapes.items()}  # noqa: E731
    mxq_compile(str(source), target_device="aries-rb", save_path=tmp_path / "model.mxq", analysis_holdout=0,
                calib_data_path=str(write_manifest(tmp_path / "calib", [sample() for _ in range(8)])), **options)
    model = Model(str(tmp_path / "model.mxq"), input_layout="NCHW")
    model.launch(Accelerator("aries-rb"))
    feeds = sample()
    return model.infer(feeds), _run(source, feeds)


# -- opset 9/10 resizes -------------------------------------------------------------------------


def _old_resize(tmp_path: Path, opset: int, mode: str, scale: float) -> Path:
    op = "Upsample" if opset == 9 else "Resize"
    size = int(8 * scale)
    return _save(tmp_path, f"{op.lower()}{opset}_{mode}",
                 [helper.make_node(op, ["x", "scales"], ["y"], mode=mode)], [("x", [1, 2, 8, 8])],
                 [("y", [1, 2, size, size])], [_floats("scales", [1, 1, scale, scale])], opset)


@pytest.mark.parametrize(("opset", "mode", "scale"), [(9, "linear", 2.0), (10, "linear", 1.5), (10, "nearest", 1.5),
                                                      (9, "nearest", 1.25)])
def test_an_old_opset_upsampling_keeps_its_asymmetric_coordinates(tmp_path, opset, mode, scale):
    """Upsample-9 / Resize-10 map output x to input x / scale; the MBLT computes what the source computes."""
    source = _old_resize(tmp_path, opset, mode, scale)
    mblt = mblt_compile(source, tmp_path / "model.mblt")
    x = RNG.standard_normal((1, 2, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(mblt, {"x": x})[0], _run(source, {"x": x})[0], atol=1e-5)


def test_the_onnx_ir_conversion_path_keeps_old_resize_coordinates_too(tmp_path):
    """:func:`convert_version` (the path of models the protobuf path does not take) gives the same result."""
    model = ir.load(_old_resize(tmp_path, 10, "linear", 2.0))
    convert_version(model, 21)
    (resize,) = [node for node in model.graph if node.op_type == "Resize"]
    assert resize.attributes["coordinate_transformation_mode"].value == "asymmetric"


def test_an_opset_11_resize_keeps_its_default_coordinates(tmp_path):
    """Resize-11 without the attribute means half_pixel: the upgrade leaves it so."""
    source = _save(tmp_path, "resize11", [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")],
                   [("x", [1, 2, 8, 8])], [("y", [1, 2, 16, 16])], [_floats("scales", [1, 1, 2, 2])], 11)
    mblt = load_mblt(mblt_compile(source, tmp_path / "model.mblt"))
    (resize,) = [node for node in mblt.graph if node.op_type == "Resize"]
    mode = resize.attributes.get("coordinate_transformation_mode")
    assert mode is None or mode.value == "half_pixel"


# -- MatMul with a batched constant weight ------------------------------------------------------


@pytest.mark.parametrize(("x_shape", "w_shape"), [([1, 16, 8], [1, 8, 6]), ([1, 4, 16, 8], [4, 8, 6])])
def test_a_matmul_with_a_batched_constant_weight_compiles_and_follows_onnxruntime(tmp_path, x_shape, w_shape):
    """``torch.matmul(x, w)`` with a ``[1, K, N]`` or per-head ``[H, K, N]`` parameter: dense layers on the NPU."""
    out_shape = [*x_shape[:-1], w_shape[-1]]
    source = _save(tmp_path, "batched_weight", [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", x_shape)],
                   [("y", out_shape)], [_weight("w", *w_shape)], 13)
    assert check_support(load_mblt(mblt_compile(source, tmp_path / "m.mblt")), "aries-rb").all_supported
    (output,), (reference,) = _compile_and_run(source, {"x": x_shape}, tmp_path)
    assert output.shape == reference.shape
    assert _cosine(output, reference) > 0.99


def test_check_refuses_a_constant_weight_the_input_broadcasts_against(tmp_path):
    """x [1, 16, 8] @ w [4, 8, 8] has no dense-layer form: ``check`` says so (it used to say supported)."""
    source = _save(tmp_path, "broadcast", [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [1, 16, 8])],
                   [("y", [4, 16, 8])], [_weight("w", 4, 8, 8)], 13)
    report = check_support(load_mblt(mblt_compile(source, tmp_path / "m.mblt")), "aries-rb")
    (entry,) = report.entries.values()
    assert entry.status == SupportStatus.UNSUPPORTED
    assert "batch axes" in entry.reason and "4x8x8" in entry.reason


# -- nothing left for the NPU -------------------------------------------------------------------


def test_a_model_with_nothing_for_the_npu_is_refused_with_its_ops_named(tmp_path):
    """A 3-D convolution then a Reshape: with cpu_offload everything that computes would run on the CPU."""
    source = _save(tmp_path, "conv3d", [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 6),
                                        helper.make_node("Reshape", ["c", "shape"], ["y"])],
                   [("x", [1, 1, 4, 8, 8])], [("y", [1, 4, 256])],
                   [_weight("w", 4, 1, 3, 3, 3), numpy_helper.from_array(np.array([1, 4, 256], np.int64), "shape")], 13)
    with pytest.raises(UnsupportedOpsError) as caught:
        _compile_and_run(source, {"x": [1, 1, 4, 8, 8]}, tmp_path, cpu_offload=True)
    assert "Nothing is left for the NPU" in caught.value.message and "Conv_0" in caught.value.message
    assert "3-D Conv" in caught.value.message
    assert not (tmp_path / "model.mxq").exists()


# -- Gemm the dense-layer kernel cannot take ---------------------------------------------------


@pytest.mark.parametrize("case", ["transposed_a", "activation_b", "activation_c"])
def test_a_gemm_with_transposed_a_or_an_activation_b_runs_on_the_npu(tmp_path, case):
    """``transA=1`` (constant B), an activation B (with alpha, beta, C) and an activation C become MatMul + Add,
    all on the NPU."""
    constant_b = case != "activation_b"
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["a"])]  # A = [K, M] = [16, 1] for transA
    if case == "activation_c":  # y = x @ W + sigmoid(x @ W2): a residual branch as C
        nodes = [helper.make_node("MatMul", ["x", "w2"], ["m"]), helper.make_node("Sigmoid", ["m"], ["c"]),
                 helper.make_node("Gemm", ["x", "b", "c"], ["y"])]
        weights = [_weight("b", 16, 10), _weight("w2", 16, 10)]
    elif constant_b:
        nodes.append(helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, beta=0.5))
        weights = [_weight("b", 16, 10), _weight("c", 1, 10)]
    else:
        nodes += [helper.make_node("Sigmoid", ["a"], ["s"]),  # s [16, 1] @ a^T [1, 16]
                  helper.make_node("Gemm", ["s", "a", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)]
        weights = [_weight("c", 16, 16)]
    out = [1, 10] if constant_b else [16, 16]
    source = _save(tmp_path, "gemm", nodes, [("x", [1, 16])], [("y", out)],
                   [*weights, numpy_helper.from_array(np.array([16, 1], np.int64), "shape")], 13)
    assert check_support(load_mblt(mblt_compile(source, tmp_path / "m.mblt")), "aries-rb").all_supported
    (output,), (reference,) = _compile_and_run(source, {"x": [1, 16]}, tmp_path)
    assert _cosine(output, reference) > 0.99


# -- circular padding ---------------------------------------------------------------------------


def test_a_circular_pad_between_convolutions_runs_on_the_npu_exactly(tmp_path):
    """``padding_mode="circular"`` (Pad mode wrap) becomes Slice + Concat: the MBLT equals the source, all on the NPU."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Pad", ["c", "pads"], ["p"], mode="wrap"),
             helper.make_node("Conv", ["p", "w2"], ["y"])]
    source = _save(tmp_path, "wrap", nodes, [("x", [1, 3, 8, 8])], [("y", [1, 4, 9, 8])],
                   [_weight("w", 8, 3, 3, 3), _weight("w2", 4, 8, 3, 3),
                    numpy_helper.from_array(np.array([0, 0, 2, 1, 0, 0, 1, 1], np.int64), "pads")], 19)
    mblt = mblt_compile(source, tmp_path / "m.mblt")
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(mblt, {"x": x})[0], _run(source, {"x": x})[0], atol=1e-5)
    assert check_support(load_mblt(mblt), "aries-rb").all_supported
    (output,), (reference,) = _compile_and_run(source, {"x": [1, 3, 8, 8]}, tmp_path)
    assert _cosine(output, reference) > 0.99


# -- LogSoftmax -----------------------------------------------------------------------------------


def test_a_log_softmax_inside_the_network_runs_on_the_npu(tmp_path):
    """A CTC-style head: MatMul -> LogSoftmax over 32 classes -> MatMul; LogSoftmax has no kernel of its own and
    sat inside the NPU body (unsupported even with cpu_offload). Now Exp/Log tables and reductions, on the NPU."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("LogSoftmax", ["logits"], ["l"], axis=-1),
             helper.make_node("MatMul", ["l", "w2"], ["y"])]
    source = _save(tmp_path, "logsoftmax", nodes, [("x", [1, 20, 16])], [("y", [1, 20, 8])],
                   [numpy_helper.from_array((RNG.standard_normal((16, 32)) * 1.5).astype(np.float32), "w"),
                    _weight("w2", 32, 8)], 13)
    assert check_support(load_mblt(mblt_compile(source, tmp_path / "m.mblt")), "aries-rb").all_supported
    (output,), (reference,) = _compile_and_run(source, {"x": [1, 20, 16]}, tmp_path)
    assert _cosine(output - output.mean(), reference - reference.mean()) > 0.99


# -- outputs that are inputs or constants -------------------------------------------------------


def test_an_onnx_input_returned_as_an_output_keeps_its_name(tmp_path):
    """The library's output fix renamed the input (``x_orig``): the user could not feed ``x``. The copy is the output."""
    source = _save(tmp_path, "returned", [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])],
                   [("x", [1, 3, 8, 8])], [("c", [1, 4, 8, 8]), ("x", [1, 3, 8, 8])], [_weight("w", 4, 3, 3, 3)], 13)
    graph = load_mblt(mblt_compile(source, tmp_path / "m.mblt")).graph
    assert [value.name for value in graph.inputs] == ["x"]
    assert [value.name for value in graph.outputs] == ["c", "x_out"]
    (conv, copy), (reference, _) = _compile_and_run(source, {"x": [1, 3, 8, 8]}, tmp_path)
    assert _cosine(conv, reference) > 0.99 and copy.shape == (1, 3, 8, 8)


def test_a_torch_module_returning_its_input_keeps_the_parameter_name(tmp_path):
    """The dynamo exporter names the returned input after the output (``output_1``): the graph input is ``x`` again."""
    torch = pytest.importorskip("torch")
    module = torch.nn.Conv2d(3, 4, 3, padding=1).eval()
    wrapper = type("Returns", (torch.nn.Module,), {"forward": lambda self, x: (module(x), x)})()
    graph = load_mblt(mblt_compile(wrapper, tmp_path / "m.mblt", backend="torch",
                                   feed_dict={"x": torch.randn(1, 3, 8, 8)})).graph
    assert [value.name for value in graph.inputs] == ["x"]
    assert [value.name for value in graph.outputs] == ["output_0", "output_1"]


def test_a_plain_dict_of_outputs_exports_every_tensor(tmp_path):
    """Only a transformers ModelOutput is cut to its ``logits``; a module's own dict keeps all its tensors."""
    torch = pytest.importorskip("torch")
    module = torch.nn.Conv2d(3, 4, 3, padding=1).eval()
    wrapper = type("Heads", (torch.nn.Module,), {"forward": lambda self, x: {"logits": module(x),
                                                                              "feat": module(x).mean((2, 3))}})()
    graph = load_mblt(mblt_compile(wrapper, tmp_path / "m.mblt", backend="torch",
                                   feed_dict={"x": torch.randn(1, 3, 8, 8)})).graph
    assert [value.name for value in graph.outputs] == ["logits", "feat"]


def test_a_constant_output_is_refused_at_parse_with_the_output_names_remedy(tmp_path):
    """A weight returned as an output made the compile fail with INTERNAL_ERROR (KeyError in the memory plan)."""
    source = _save(tmp_path, "constant", [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])],
                   [("x", [1, 3, 8, 8])], [("c", [1, 4, 8, 8]), ("w", [4, 3, 3, 3])], [_weight("w", 4, 3, 3, 3)], 13)
    with pytest.raises(UnsupportedOpsError) as caught:
        mblt_compile(source, tmp_path / "m.mblt")
    assert "'w'" in caught.value.message and "output_names=['c']" in caught.value.hint
    graph = load_mblt(mblt_compile(source, tmp_path / "m.mblt", output_names=["c"])).graph
    assert [value.name for value in graph.outputs] == ["c"]


# -- int32 token ids ----------------------------------------------------------------------------


def test_an_embedding_of_int32_ids_cast_to_int64_runs_on_the_npu(tmp_path):
    """TF-style exports cast int32 ids to int64 before the lookup; the Cast to int64 had no kernel (CPU head)."""
    nodes = [helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "ids64"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["y"])]
    graph = helper.make_graph(nodes, "ids", [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 12])],
                              [helper.make_tensor_value_info("y", FLOAT, [1, 12, 8])],
                              [_weight("table", 50, 16), _weight("w", 16, 8)])
    source = tmp_path / "ids.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), source)
    assert check_support(load_mblt(mblt_compile(source, tmp_path / "m.mblt")), "aries-rb").all_supported
    sample = lambda: {"ids": RNG.integers(0, 50, (1, 12)).astype(np.int32)}  # noqa: E731
    mxq_compile(str(source), target_device="aries-rb", save_path=tmp_path / "model.mxq", analysis_holdout=0,
                calib_data_path=str(write_manifest(tmp_path / "calib", [sample() for _ in range(8)])))
    model = Model(str(tmp_path / "model.mxq"))
    model.launch(Accelerator("aries-rb"))
    feeds = sample()
    assert _cosine(model.infer(feeds)[0], _run(source, feeds)[0]) > 0.99


# -- Keras recurrent layers ---------------------------------------------------------------------


def test_a_keras_bidirectional_lstm_compiles_and_follows_keras(tmp_path):
    """Keras LSTM/GRU loop over TensorLists (no TFLite builtin): the frontend unrolls them, and the FILL of their
    zero initial state (its dims from SHAPE of the input) folds. Both were UNSUPPORTED_OPS at parse."""
    tf = pytest.importorskip("tensorflow", reason="the tf extra (tensorflow-cpu) is not installed")
    layers = tf.keras.layers
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((8, 16))
    hidden = layers.Bidirectional(layers.LSTM(8, return_sequences=True))(inputs)
    keras_model = tf.keras.Model(inputs, layers.Dense(4)(layers.GRU(8)(hidden)))
    path = tmp_path / "rnn.keras"
    keras_model.save(path)
    graph = load_mblt(mblt_compile(path, tmp_path / "m.mblt")).graph
    assert check_support(load_mblt(tmp_path / "m.mblt"), "aries-rb").all_supported
    name = graph.inputs[0].name
    assert _keras_mxq_cosine(path, keras_model, name, (1, 8, 16), tmp_path) > 0.99


def _keras_mxq_cosine(path, keras_model, name: str, shape: tuple[int, ...], tmp_path) -> float:
    """Compile the saved Keras model on 8 random samples of ``shape`` (input ``name``) and the cosine of the MXQ's
    first output to Keras's on another one."""
    sample = lambda: {name: RNG.standard_normal(shape).astype(np.float32)}  # noqa: E731
    mxq_compile(str(path), target_device="aries-rb", save_path=tmp_path / "model.mxq", analysis_holdout=0,
                calib_data_path=str(write_manifest(tmp_path / "calib", [sample() for _ in range(8)])))
    model = Model(str(tmp_path / "model.mxq"))
    model.launch(Accelerator("aries-rb"))
    feeds = sample()
    return _cosine(model.infer(feeds)[0], keras_model(feeds[name], training=False).numpy())


def test_keras_dilated_convolutions_compile_as_dilated_convs(tmp_path):
    """With a dynamic batch TF writes a dilated conv as SPACE_TO_BATCH_ND -> CONV_2D -> BATCH_TO_SPACE_ND (no
    converter: UNSUPPORTED_OPS at parse) and leaves the height after an UpSampling2D open (the Cropping2D slice
    then failed the parse as INVALID_MODEL); converted again with batch 1 it is one dilated CONV_2D with static
    shapes, same input name. Its SAME 2x2 MaxPooling2D also checks the asymmetric MaxPool pads at run time."""
    tf = pytest.importorskip("tensorflow", reason="the tf extra (tensorflow-cpu) is not installed")
    layers = tf.keras.layers
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((32, 8))
    hidden = layers.Conv1D(8, 3, padding="causal", dilation_rate=2, activation="relu")(inputs)
    hidden = layers.Conv2D(4, 3, padding="same", dilation_rate=2)(layers.Reshape((32, 8, 1))(hidden))
    hidden = layers.MaxPooling2D(2, 1, padding="same")(hidden)  # pads [0, 0, 1, 1]
    hidden = layers.Cropping2D(1)(layers.UpSampling2D(2)(hidden))  # sliced where TF left the height open
    keras_model = tf.keras.Model(inputs, hidden)
    path = tmp_path / "dilated.keras"
    keras_model.save(path)
    graph = load_mblt(mblt_compile(path, tmp_path / "m.mblt")).graph
    assert [node.op_type for node in graph].count("Conv") == 2
    assert {int(d) for node in graph if node.op_type == "Conv" for d in node.attributes["dilations"].value} == {1, 2}
    name = graph.inputs[0].name  # the name TF's own conversion of the file gives (the calibration data's key)
    first = tf.lite.TFLiteConverter.from_keras_model(tf.keras.models.load_model(path, compile=False)).convert()
    assert name == tf.lite.Interpreter(model_content=first).get_input_details()[0]["name"]
    assert _keras_mxq_cosine(path, keras_model, name, (1, 32, 8), tmp_path) > 0.99


# -- MaxPool with asymmetric pads ---------------------------------------------------------------


@pytest.mark.parametrize("pads", [[0, 0, 1, 1], [1, 0, 1, 0]])
def test_a_max_pool_with_asymmetric_pads_follows_onnxruntime(tmp_path, pads):
    """TF's SAME padding of an even window pads only the end ([0, 0, 1, 1]); onnx.reference's MaxPool, the
    runtime's golden kernel, read ONNX pads per axis: a 15x15 map came out 14x16 (a reshape after it failed at
    run time; as an output it had the wrong shape)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2], pads=pads),
             helper.make_node("Reshape", ["m", "shape"], ["y"])]
    size = (14 + pads[0] + pads[2]) * (14 + pads[1] + pads[3])  # 2x2 window, stride 1
    source = _save(tmp_path, "maxpool", nodes, [("x", [1, 3, 15, 15])], [("y", [1, 4, size])],
                   [_weight("w", 4, 3, 3, 3), numpy_helper.from_array(np.array([1, 4, size], np.int64), "shape")], 13)
    (output,), (reference,) = _compile_and_run(source, {"x": [1, 3, 15, 15]}, tmp_path)
    assert output.shape == reference.shape
    assert _cosine(output, reference) > 0.99
