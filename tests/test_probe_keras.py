"""Keras architectures users bring (``keras.applications``, U-Nets) that a probe found mishandled (s13).

Each test builds a small model with the same structure, saves it as a user would and goes through the
user's path (``mblt_compile`` / ``mxq_compile``); ``bench/probe_keras.py`` runs the full architectures.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from compiler_core.api import mblt_compile
from compiler_core.mblt.io import load_mblt

RNG = np.random.default_rng(0)


def _keras():
    return pytest.importorskip("tensorflow", reason="the tf extra (tensorflow-cpu) is not installed").keras


def test_an_inception_block_concatenating_branches_keeps_no_layout_transposes(tmp_path):
    """TFLite concatenates the branches of an Inception/DenseNet/NASNet block in NHWC, so the frontend wraps the
    CONCATENATION in Transposes; the rule moving them past the Concat matched only a one-input Concat, and
    InceptionV3 kept 67 Transposes (NCHW -> NHWC -> NCHW at every block) for the NPU to run. Now the moved
    Transposes cancel and the MBLT computes what Keras computes."""
    keras = _keras()
    layers = keras.layers
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3))
    stem = layers.MaxPooling2D(2)(layers.Conv2D(8, 3, padding="same", activation="relu")(inputs))
    branches = [layers.Conv2D(4, 1, activation="relu")(stem),
                layers.Conv2D(4, 3, padding="same", activation="relu")(stem),
                layers.Conv2D(4, 1)(layers.AveragePooling2D(3, 1, padding="same")(stem))]
    block = layers.Concatenate()(branches)
    pooled = layers.Concatenate()([layers.Conv2D(4, 3, strides=2)(block), layers.MaxPooling2D(3, 2)(block)])
    keras_model = keras.Model(inputs, layers.Conv2D(5, 1)(pooled))
    keras_model.save(tmp_path / "inception_block.keras")
    mblt = mblt_compile(tmp_path / "inception_block.keras", tmp_path / "m.mblt")
    ops = [node.op_type for node in load_mblt(mblt).graph]
    assert ops.count("Concat") == 2
    assert ops.count("Transpose") <= 2, ops  # the NHWC input's and the NHWC output's at most
    x = RNG.standard_normal((1, 12, 12, 3)).astype(np.float32)
    session = ort.InferenceSession(str(mblt), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(actual, keras_model(x, training=False).numpy(), rtol=1e-4, atol=1e-4)


def test_swish_and_squeeze_excite_blocks_keep_no_layout_transposes(tmp_path):
    """TFLite writes Keras's swish as ``x * sigmoid(x)`` on NHWC: the one Transpose before it feeds two ops, and
    neither element-wise rule could move it, so EfficientNetB0 kept 130 Transposes. An MBConv block (swish,
    depthwise, squeeze-and-excite with a hard-sigmoid gate, residual Add) now keeps only the SE vector's one
    (a [1, 1, 1, C] -> [1, C, 1, 1] Transpose of C values), and the MBLT computes what Keras computes."""
    keras = _keras()
    layers = keras.layers
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3))
    stem = layers.Conv2D(8, 3, padding="same", activation="swish")(inputs)
    hidden = layers.DepthwiseConv2D(3, padding="same", activation="swish")(layers.Conv2D(16, 1)(stem))
    squeezed = layers.Reshape((1, 1, 16))(layers.GlobalAveragePooling2D()(hidden))
    gate = layers.Conv2D(16, 1, activation="hard_sigmoid")(layers.Conv2D(4, 1, activation="swish")(squeezed))
    block = layers.Add()([layers.Conv2D(8, 1)(layers.Multiply()([hidden, gate])), stem])
    keras_model = keras.Model(inputs, layers.Conv2D(5, 3, activation="swish")(block))
    keras_model.save(tmp_path / "mbconv.keras")
    mblt = mblt_compile(tmp_path / "mbconv.keras", tmp_path / "m.mblt")
    ops = [node.op_type for node in load_mblt(mblt).graph]
    assert ops.count("Transpose") <= 3, ops  # the NHWC input's, the SE vector's and the NHWC output's
    x = RNG.standard_normal((1, 12, 12, 3)).astype(np.float32)
    session = ort.InferenceSession(str(mblt), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: x})
    np.testing.assert_allclose(actual, keras_model(x, training=False).numpy(), rtol=1e-4, atol=1e-4)
