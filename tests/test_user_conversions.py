"""Conversion paths users take that the corpus had not exercised (s16 models2): counted loops, EmbeddingBag through
TorchScript's exporter, Keras files with Lambda and custom layers."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mblt_compile
from compiler_core.errors import ModelLoadError, UnsupportedOpsError
from compiler_core.mblt.io import load_mblt
from compiler_core.targets.support import check_support


def _run(path, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _counted_loop(trips: int, body_reads: str) -> onnx.ModelProto:
    """``y = x; for i in range(trips): y = y + c * i`` and the scan of the ``y`` values; ``body_reads`` names the graph
    value the body reads (``x``: the model input; ``c``: a constant)."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i_float"], to=TensorProto.FLOAT),
         helper.make_node("Mul", [body_reads, "i_float"], ["step"]),
         helper.make_node("Add", ["y_in", "step"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["scan"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("y_in", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, 4])])
    start = "c"  # the loop's own inputs are constants
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "true", start], ["y", "scans"], body=body),
         helper.make_node("Add", ["y", "x"], ["out"]), helper.make_node("Add", ["scans", "x"], ["out_scans"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("out_scans", TensorProto.FLOAT, [trips, 1, 4])],
        [numpy_helper.from_array(np.array(trips, np.int64), "trips"), numpy_helper.from_array(np.array(True), "true"),
         numpy_helper.from_array(np.array([[0.5, -1.0, 2.0, 0.25]], np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_counted_loop_over_the_input_is_unrolled(tmp_path):
    """A Loop with a constant trip count that reads the model input (refused as control flow before) is its
    iterations: no Loop in the MBLT, the same outputs and scan outputs as the source."""
    source = tmp_path / "loop.onnx"
    onnx.save(_counted_loop(3, "x"), str(source))
    mblt = mblt_compile(str(source), tmp_path / "loop.mblt")
    assert "Loop" not in {node.op_type for node in load_mblt(mblt).graph}
    x = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)
    for expected, actual in zip(_run(source, {"x": x}), _run(mblt, {"x": x})):
        np.testing.assert_allclose(actual, expected, rtol=1e-6)


def test_a_loop_too_long_to_unroll_that_reads_the_input_is_refused_by_name(tmp_path):
    """A loop whose own inputs are constants but whose body reads the model input is not a constant: refused as
    control flow naming the Loop (it was folded as one and stopped the parse with an internal error, "Unable to find
    input 'x'")."""
    source = tmp_path / "loop.onnx"
    onnx.save(_counted_loop(100, "x"), str(source))
    with pytest.raises(UnsupportedOpsError) as caught:
        mblt_compile(str(source), tmp_path / "loop.mblt")
    assert "Loop" in caught.value.message


def test_an_embedding_bag_exported_by_torchscript_runs_on_the_npu(tmp_path):
    """``nn.EmbeddingBag`` through torch's TorchScript exporter (a Loop over the bags, reading the flattened ids and
    graph constants) parses to lookups of the model input that aries-rb supports, with torch's outputs."""
    torch = pytest.importorskip("torch")

    class Bags(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bag, self.head = torch.nn.EmbeddingBag(512, 32, mode="mean"), torch.nn.Linear(32, 4)

        def forward(self, ids):
            return self.head(self.bag(ids))

    torch.manual_seed(0)
    net, ids = Bags().eval(), torch.randint(0, 512, (1, 20))
    source = tmp_path / "bags.onnx"
    torch.onnx.export(net, (ids,), str(source), dynamo=False, opset_version=17, input_names=["ids"])
    mblt = mblt_compile(str(source), tmp_path / "bags.mblt")
    report = check_support(load_mblt(mblt), "aries-rb")
    assert not [name for name, entry in report.entries.items() if entry.blocking], report.entries
    with torch.no_grad():
        expected = net(ids).numpy()
    np.testing.assert_allclose(_run(mblt, {"ids": ids.numpy()})[0], expected, rtol=1e-5, atol=1e-6)


def _keras():
    return pytest.importorskip("tensorflow", reason="the tf extra (tensorflow-cpu) is not installed").keras


def test_a_keras_lambda_layer_is_loaded_with_allow_pickle(tmp_path):
    """A .keras file with a Lambda layer: refused naming the Lambda and --allow-pickle (it was Keras's own sentence
    about ``safe_mode``, under "TFLite converter failed"); with ``allow_pickle`` it compiles to the Keras outputs."""
    keras = _keras()
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    hidden = keras.layers.Lambda(lambda t: t * 2.0 - 1.0)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling2D()(
        keras.layers.Conv2D(8, 3, activation="relu")(hidden))))
    source = tmp_path / "lambda.keras"
    model.save(source)
    with pytest.raises(ModelLoadError) as caught:
        mblt_compile(str(source), tmp_path / "refused.mblt")
    assert "Lambda" in caught.value.message and "--allow-pickle" in caught.value.hint
    mblt = mblt_compile(str(source), tmp_path / "lambda.mblt", allow_pickle=True)
    x = np.random.default_rng(0).random((1, 16, 16, 3), np.float32)
    session = ort.InferenceSession(str(mblt), providers=["CPUExecutionProvider"])
    actual = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(actual, model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_a_custom_keras_layer_whose_code_is_missing_is_named(tmp_path):
    """A custom layer class not importable here: the refusal names the layer and offers a SavedModel export."""
    keras = _keras()

    class Doubled(keras.layers.Layer):
        def call(self, inputs):
            return inputs * 2.0

    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(2)(Doubled(name="doubled")(inputs)))
    source = tmp_path / "custom.keras"
    model.save(source)
    with pytest.raises(ModelLoadError) as caught:
        mblt_compile(str(source), tmp_path / "custom.mblt")
    assert "'Doubled'" in caught.value.message and "SavedModel" in caught.value.hint


def test_a_run_time_padding_mask_of_infinities_masks_on_the_npu(tmp_path):
    """``nn.MultiheadAttention`` with a ``key_padding_mask`` through TorchScript's exporter builds its mask at run time
    as ``Where(mask, -inf, 0)``; calibrated as [0, 0] (infinities count as 0), it quantized to no mask at all: held-out
    SQNR 11.5 dB, now 32 dB (16 calibration and 4 held-out samples of random features with 0-19 padded keys)."""
    torch = pytest.importorskip("torch")
    from corpus import write_manifest

    from compiler_core.api import mxq_compile

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(40, 64)
            self.attention = torch.nn.MultiheadAttention(64, 4, batch_first=True)

        def forward(self, x, mask):
            hidden = self.embed(x)
            return self.attention(hidden, hidden, hidden, key_padding_mask=mask, need_weights=False)[0]

    torch.manual_seed(0)
    source = tmp_path / "attention.onnx"
    torch.onnx.export(Attention().eval(), (torch.randn(1, 50, 40), torch.zeros(1, 50, dtype=torch.bool)),
                      str(source), dynamo=False, opset_version=17, input_names=["x", "mask"])
    rng = np.random.default_rng(1)

    def sample(index):
        mask = np.zeros((1, 50), bool)
        mask[0, 50 - index % 20:] = True
        return {"x": rng.standard_normal((1, 50, 40)).astype(np.float32), "mask": mask}

    manifest = write_manifest(tmp_path / "calib", [sample(index) for index in range(20)])
    result = mxq_compile(str(source), target_device="aries-rb", save_path=tmp_path / "attention.mxq",
                         calib_data_path=str(manifest), analysis_holdout=4)
    (output,) = result.quantize.analysis["outputs"].values()
    assert output["sqnr_db"] > 25, output


def test_a_savedmodel_with_several_signatures_compiles_its_serving_one(tmp_path):
    """A Keras model saved behind hand-written signatures (``tf.saved_model.save`` of a ``tf.Module``): TensorFlow's
    converter kept its weights as resource variables (refused: 16 VAR_HANDLE / READ_VARIABLE operators); the serving
    signature is converted with its variables folded, with the model's outputs."""
    keras = _keras()
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    model = keras.Model(inputs, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling2D()(
        keras.layers.Conv2D(8, 3, activation="relu")(inputs))))
    module = tf.Module()
    module.model = model
    spec = [tf.TensorSpec([None, 16, 16, 3], tf.float32, name="x")]
    module.serve = tf.function(lambda x: {"logits": model(x)}, input_signature=spec)
    module.probs = tf.function(lambda x: {"probs": tf.nn.softmax(model(x))}, input_signature=spec)
    folder = tmp_path / "saved"
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve, "probs": module.probs})
    mblt = mblt_compile(str(folder), tmp_path / "saved.mblt")
    x = np.random.default_rng(0).random((1, 16, 16, 3), np.float32)
    session = ort.InferenceSession(str(mblt), providers=["CPUExecutionProvider"])
    actual = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(actual, model(x).numpy(), rtol=1e-4, atol=1e-5)


def _tflite(keras_model, tmp_path, name: str, **settings) -> str:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_keras_model(keras_model)
    for key, value in settings.items():
        setattr(converter, key, value)
    path = tmp_path / name
    path.write_bytes(converter.convert())
    return str(path)


def test_tflite_refusals_name_select_tf_ops_and_recurrent_loops(tmp_path):
    """A SELECT_TF_OPS conversion and a Keras LSTM converted without unrolling are refused saying what they are and
    what to do (they said only "no converter for this TFLite custom operator / operator")."""
    keras = _keras()
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,), batch_size=1)
    cumulative = keras.layers.Lambda(lambda t: tf.math.cumprod(t, axis=-1))(keras.layers.Dense(8)(inputs))
    flex = _tflite(keras.Model(inputs, keras.layers.Dense(2)(cumulative)), tmp_path, "flex.tflite",
                   target_spec=tf.lite.TargetSpec(supported_ops=[tf.lite.OpsSet.TFLITE_BUILTINS,
                                                                 tf.lite.OpsSet.SELECT_TF_OPS]))
    with pytest.raises(UnsupportedOpsError) as caught:
        mblt_compile(flex, tmp_path / "flex.mblt")
    assert "tf.Cumprod" in caught.value.message and "SELECT_TF_OPS" in caught.value.hint
    sequence = keras.Input((10, 8), batch_size=1)
    loop = _tflite(keras.Model(sequence, keras.layers.LSTM(4)(sequence)), tmp_path, "loop.tflite")
    with pytest.raises(UnsupportedOpsError) as caught:
        mblt_compile(loop, tmp_path / "loop.mblt")
    assert "WHILE" in caught.value.message and "unroll=True" in caught.value.message
