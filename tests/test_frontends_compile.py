"""Every frontend's real model parses and compiles to an MXQ for aries-rb that loads and runs.

One model (or a few) per backend: MobileNetV2 as a live torch module, all-MiniLM-L6-v2 from its
transformers folder (calibrated on real tokenized sentences: random int64 ids in ``[0, 100)`` would
also put random values in ``token_type_ids``, which only takes 0/1), Silero VAD's TorchScript core
(its LSTM is unrolled at canonicalization), MediaPipe TFLite models (per-channel PRelu, bilinear
Resize, ConvTranspose) and a small Keras CNN (only where tensorflow imports). Calibration is random
(smoke test) and small, and the accuracy analysis is off, to keep the module under two minutes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import realmodels

from compiler_core.api import mblt_compile, mxq_compile
from compiler_core.calibration import input_specs, make_calib_text
from compiler_core.mblt.io import load_mblt
from compiler_core.runtime import Accelerator, Model

pytestmark = pytest.mark.slow

DEVICE = "aries-rb"
FAST = {"analysis_holdout": 0, "calibration_config": {"num_samples": 8}}
SITE_PACKAGES = Path(realmodels.__file__).resolve().parents[1] / ".venv" / "lib" / "python3.11" / "site-packages"
TFLITE_MODELS = {  # the integer kernels each one needs beyond Conv
    "face_landmark/face_landmark.tflite": {"prelu"},
    "palm_detection/palm_detection_lite.tflite": {"prelu", "interpolate"},
    "selfie_segmentation/selfie_segmentation.tflite": {"interpolate", "conv_transpose"},
}
MINILM_SEQ_LEN = 32


def available(build):
    """Call a ``realmodels`` builder, skipping with its install hint when a package is missing."""
    try:
        return build()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))


def run_once(mxq: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Load the MXQ in the runtime and run one inference (NCHW arrays, as the source models take)."""
    model = Model(mxq, input_layout="NCHW")
    model.launch(Accelerator(DEVICE))
    outputs = model.infer(feeds)
    assert outputs and all(np.all(np.isfinite(np.asarray(o, dtype=np.float64))) for o in outputs)
    return outputs


def random_feeds(mxq: Path) -> dict[str, np.ndarray]:
    """Standard-normal float inputs of the program's shapes."""
    rng = np.random.default_rng(0)
    return {spec.name: rng.standard_normal(spec.shape).astype(np.float32)
            for spec in Model(mxq).artifact.input_specs}


def compile_source(source, tmp_path: Path, **options) -> Path:
    """``mxq_compile`` with random calibration; returns the MXQ path."""
    save_path = tmp_path / "model.mxq"
    mxq_compile(source, target_device=DEVICE, save_path=save_path, use_random_calib=True, **FAST, **options)
    assert save_path.is_file()
    return save_path


def test_torch_live_mobilenet_v2(tmp_path):
    module = available(realmodels.mobilenet_v2_module)
    image = np.zeros(realmodels.MOBILENET_SHAPE, np.float32)
    mxq = compile_source(module, tmp_path, backend="torch", feed_dict={"x": image})
    (logits,) = run_once(mxq, random_feeds(mxq))
    assert logits.shape == (1, 1000)


def test_transformers_minilm_calibrated_on_text(tmp_path):
    """A transformers folder calibrated on plain sentences (make_calib_text with the folder's own tokenizer); the
    compile names the preset made for such a model."""
    folder = available(realmodels.minilm_dir)
    tokens = realmodels.tokenize(realmodels.SENTENCES, MINILM_SEQ_LEN)
    mblt = mblt_compile(folder, tmp_path / "minilm.mblt", backend="torch",
                        feed_dict={name: array[:1] for name, array in tokens.items()})
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(realmodels.SENTENCES) + "\n", encoding="utf-8")
    manifest = make_calib_text(text, folder, input_specs(load_mblt(mblt)), tmp_path, "text")
    save_path = tmp_path / "minilm.mxq"
    result = mxq_compile(mblt, target_device=DEVICE, calib_data_path=manifest, save_path=save_path, **FAST)
    assert result.quantize.samples["calibration"] + result.quantize.samples.get("holdout", 0) == len(
        realmodels.SENTENCES)
    assert result.suited_preset["name"] == "transformer_encoder" and "token inputs" in result.suited_preset["why"]
    outputs = run_once(save_path, {name: array[:1] for name, array in tokens.items()})
    assert outputs[0].shape == (1, MINILM_SEQ_LEN, 384)


def test_torchscript_silero_vad(tmp_path):
    folder = available(lambda: realmodels.package_dir("silero_vad", "silero-vad==6.2.3"))
    jit = folder / "data" / "silero_vad.jit"
    # its first Conv (the STFT, kernel 256, stride 128) runs on the NPU as a stride-1 Conv over frames
    mxq = compile_source(jit, tmp_path, backend="torchscript", submodule="_model",
                         input_shape_dict={"x": [1, 576], "state": [2, 1, 128]})
    assert "LSTM" not in {op.op_type for op in Model(mxq).program.ops}
    probability, state = run_once(mxq, {"x": np.zeros((1, 576), np.float32),
                                        "state": np.zeros((2, 1, 128), np.float32)})
    assert probability.size == 1 and state.shape == (2, 1, 128)


@pytest.mark.parametrize("relative", list(TFLITE_MODELS))
def test_mediapipe_tflite(tmp_path, relative):
    path = SITE_PACKAGES / "mediapipe" / "modules" / relative
    if not path.is_file():
        pytest.skip(f"{relative} is missing: pip install mediapipe==0.10.14")
    mxq = compile_source(path, tmp_path)
    ops = Model(mxq).program.ops
    kinds = {op.kind for op in ops} | {op.attrs.get("layout") for op in ops if op.kind == "linear"}
    assert TFLITE_MODELS[relative] <= kinds
    run_once(mxq, random_feeds(mxq))


def test_keras_cnn(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="the tf extra (tensorflow-cpu) is not installed")
    layers = tf.keras.layers
    tf.keras.utils.set_random_seed(0)
    keras_model = tf.keras.Sequential([
        tf.keras.Input((32, 32, 3), name="image"),
        layers.Conv2D(8, 3, strides=2, padding="same", activation="relu"), layers.DepthwiseConv2D(3, padding="same"),
        layers.PReLU(shared_axes=[1, 2]), layers.UpSampling2D(interpolation="bilinear"),
        layers.GlobalAveragePooling2D(), layers.Dense(10)])
    # (Conv2DTranspose is left out: TensorFlow's converter computes its output shape at run time with
    # SHAPE/PACK, which the TFLite frontend does not convert; the selfie model covers ConvTranspose.)
    path = tmp_path / "cnn.keras"
    keras_model.save(path)
    mxq = compile_source(path, tmp_path)
    assert {"prelu", "interpolate"} <= {op.kind for op in Model(mxq).program.ops}
    (logits,) = run_once(mxq, random_feeds(mxq))
    assert logits.shape == (1, 10)
