"""Keras / TensorFlow architectures users bring, in the forms users save them, through the user's path.

Each ``keras.applications`` network (``weights=None``, seeded, logits) and a small U-Net is saved as a user
would (``.keras``; TFLite from ``tf.lite.TFLiteConverter`` as float32, float16, dynamic-range and full-integer;
a few also as a SavedModel folder from ``model.export`` and as ``.h5``), parsed with ``mblt_compile``, checked
with ``check_support``, compiled with ``mxq_compile`` (CPU offload only if check asks for it) on 16 photo
views, and the MXQ (bit-exact simulator) is compared with the Keras model itself (FP32) on 3 held-out photos:
cosine of the first output and, for classifiers, top-1 agreement.

Random BatchNorm statistics (mean 0, variance 1) leave many random networks with outputs that vanish or
explode; before saving, each BatchNorm's moving mean and variance are set from one forward pass over the
calibration photos (momentum 0, dropout off, ``training=True``), so every layer sees normalized activations
as in a trained network. The table says when an output is still degenerate instead of giving its cosine.

Usage: ``python bench/probe_keras.py [--models a,b] [--forms keras,tflite,...] [--presets a16w8]`` (about 35
minutes on 2 cores for everything). Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

DEVICE = "aries-rb"
DEGENERATE = 1e-6
"""Largest |output| below which a random network's output counts as constant zero."""
CALIBRATION, HELD_OUT = 16, 3
EXTRA_PRESETS: list[str] = []
"""Presets the TFLite float form is also compiled with (``--presets``), beside the default configuration."""

ALL_FORMS = ("keras", "tflite", "tflite_fp16", "tflite_dynamic", "tflite_int8", "savedmodel", "h5")
BASIC = ("keras", "tflite")
QUANTIZED = ("keras", "tflite", "tflite_fp16", "tflite_dynamic", "tflite_int8")

# name -> (keras.applications class or "unet", input size, pixel normalisation, forms, extra constructor options)
MODELS = {
    "mobilenet": ("MobileNet", 128, "pm1", BASIC + ("savedmodel",), {}),
    "mobilenet_v2": ("MobileNetV2", 128, "pm1", ALL_FORMS, {}),
    "mobilenet_v3_small": ("MobileNetV3Small", 128, "raw", QUANTIZED, {}),
    "mobilenet_v3_large": ("MobileNetV3Large", 128, "raw", BASIC, {}),
    "efficientnet_b0": ("EfficientNetB0", 128, "raw", BASIC + ("savedmodel", "tflite_int8"), {}),
    "efficientnet_v2_b0": ("EfficientNetV2B0", 128, "raw", BASIC, {}),
    "resnet50": ("ResNet50", 128, "imagenet", BASIC + ("h5", "tflite_dynamic", "tflite_int8"), {}),
    "resnet50_v2": ("ResNet50V2", 128, "pm1", BASIC, {}),
    "densenet121": ("DenseNet121", 96, "imagenet", BASIC, {}),
    "nasnet_mobile": ("NASNetMobile", 96, "pm1", BASIC, {}),
    "xception": ("Xception", 96, "pm1", BASIC, {}),
    "inception_v3": ("InceptionV3", 96, "pm1", BASIC, {}),
    "convnext_tiny": ("ConvNeXtTiny", 96, "raw", BASIC, {}),
    "vgg16": ("VGG16", 64, "imagenet", BASIC, {}),
    "mobilenet_v2_features": ("MobileNetV2", 128, "pm1", BASIC, {"include_top": False, "pooling": "avg"}),
    "resnet50_v2_features": ("ResNet50V2", 128, "pm1", BASIC, {"include_top": False, "pooling": "avg"}),
    "unet_small": ("unet", 128, "unit", BASIC + ("savedmodel", "tflite_int8"), {}),
}


def build(class_name: str, size: int, options: dict):
    """The seeded random Keras model (logits for classifiers)."""
    import keras

    keras.utils.set_random_seed(0)
    if class_name == "unet":
        return unet(size)
    top = {"classes": 1000, "classifier_activation": None} if options.get("include_top", True) else {}
    return getattr(keras.applications, class_name)(weights=None, input_shape=(size, size, 3), **top, **options)


def unet(size: int):
    """A small U-Net: strided encoder, Conv2DTranspose and UpSampling2D decoder, skip concatenations."""
    import keras
    from keras import layers

    inputs = keras.Input((size, size, 3))
    skips, hidden = [], inputs
    for width in (16, 32, 64):
        hidden = layers.Conv2D(width, 3, padding="same", use_bias=False)(hidden)
        hidden = layers.ReLU()(layers.BatchNormalization()(hidden))
        skips.append(hidden)
        hidden = layers.MaxPooling2D(2)(hidden)
    hidden = layers.Conv2D(128, 3, padding="same", activation="relu")(hidden)
    for index, (width, skip) in enumerate(zip((64, 32, 16), reversed(skips))):
        if index % 2 == 0:
            hidden = layers.Conv2DTranspose(width, 2, strides=2, padding="same")(hidden)
        else:
            hidden = layers.Conv2D(width, 1)(layers.UpSampling2D(2, interpolation="bilinear")(hidden))
        hidden = layers.Concatenate()([hidden, skip])
        hidden = layers.Conv2D(width, 3, padding="same", activation="relu")(hidden)
    return keras.Model(inputs, layers.Conv2D(2, 1)(hidden), name="unet_small")  # logits: a sigmoid hides errors


def settle_batch_norm(network, batch: np.ndarray) -> int:
    """Set every BatchNormalization's moving statistics from one forward pass over ``batch``; how many."""
    import keras

    norms = [layer for layer in network._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    dropouts = [layer for layer in network._flatten_layers() if isinstance(layer, keras.layers.Dropout)]
    saved = [(layer, layer.momentum) for layer in norms] + [(layer, layer.rate) for layer in dropouts]
    for layer in norms:
        layer.momentum = 0.0
    for layer in dropouts:
        layer.rate = 0.0
    network(batch, training=True)
    for layer, value in saved:
        setattr(layer, "momentum" if layer in norms else "rate", value)
    return len(norms)


def save_forms(network, forms: tuple[str, ...], folder: Path, calibration: list[np.ndarray]) -> dict[str, Path]:
    """``network`` saved in each form: form -> path."""
    import tensorflow as tf

    paths = {}
    for form in forms:
        if form == "keras":
            paths[form] = folder / "model.keras"
            network.save(paths[form])
        elif form == "h5":
            paths[form] = folder / "model.h5"
            network.save(paths[form])
        elif form == "savedmodel":
            paths[form] = folder / "saved_model"
            network.export(str(paths[form]), verbose=False)
        else:
            converter = tf.lite.TFLiteConverter.from_keras_model(network)
            if form != "tflite":
                converter.optimizations = [tf.lite.Optimize.DEFAULT]
            if form == "tflite_fp16":
                converter.target_spec.supported_types = [tf.float16]
            if form == "tflite_int8":
                converter.representative_dataset = lambda: ([x] for x in calibration)
                converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
                converter.inference_input_type = converter.inference_output_type = tf.int8
            paths[form] = folder / f"model_{form}.tflite"
            paths[form].write_bytes(converter.convert())
    return paths


def tflite_peer(network, path: Path | None, calibration: list[np.ndarray], held_out: list[np.ndarray],
                expected: list[np.ndarray]) -> list[float]:
    """The peer: TensorFlow's own full-integer post-training quantization of the same network (int8 TFLite on
    the same 16 calibration photos, run in TF's interpreter): cosine to Keras on each held-out photo."""
    import tensorflow as tf

    if path is None:
        path = save_forms(network, ("tflite_int8",), Path(tempfile.mkdtemp(prefix="peer-")),
                          calibration)["tflite_int8"]
    interpreter = tf.lite.Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    given, taken = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    cosines = []
    for x, e in zip(held_out, expected):
        scale, zero = given["quantization"]
        interpreter.set_tensor(given["index"], np.clip(np.round(x / scale + zero), -128, 127).astype(np.int8))
        interpreter.invoke()
        scale, zero = taken["quantization"]
        cosines.append(_cosine(scale * (interpreter.get_tensor(taken["index"]).astype(np.float32) - zero), e))
    return cosines


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def probe_form(source: Path, folder: Path, calibration: list[np.ndarray], held_out: list[np.ndarray],
               expected: list[np.ndarray], classifier: bool, preset: str | None = None) -> dict:
    """Parse, check, compile and compare one saved form: a row of the table."""
    import corpus
    import onnxruntime as ort

    from compiler_core.api import mblt_compile, mxq_compile
    from compiler_core.mblt.io import load_mblt
    from compiler_core.runtime import Accelerator, Model
    from compiler_core.targets import check_support

    row: dict = {"stage": "parse"}
    started = time.perf_counter()
    try:
        mblt = mblt_compile(source, folder / "model.mblt")
        row["parse_s"] = round(time.perf_counter() - started, 1)
        graph = load_mblt(mblt)
        session = ort.InferenceSession(str(mblt), providers=["CPUExecutionProvider"])
        input_name = session.get_inputs()[0].name
        row["mblt_cosine"] = min(_cosine(session.run(None, {input_name: x})[0], e) for x, e in zip(held_out, expected))
        report = check_support(graph, DEVICE)
        counts = report.counts()
        row.update(stage="compile", nodes=sum(counts.values()), flagged=sum(counts.values()) - counts.get("supported", 0),
                   flagged_ops=sorted({item.op_type for item in report.flagged()}))
        name = graph.graph.inputs[0].name
        manifest = corpus.write_manifest(folder / "calib", [{name: x} for x in calibration])
        started = time.perf_counter()
        result = mxq_compile(str(mblt), target_device=DEVICE, calib_data_path=str(manifest),
                             save_path=folder / "model.mxq", analysis_holdout=0, cpu_offload=not report.all_supported,
                             **({"config_preset": preset} if preset else {}))
        row["compile_s"] = round(time.perf_counter() - started, 1)
        mode, estimate = next(iter(result.schedule.items()))
        row["estimate"] = f"{mode} {estimate['latency_ms']:.3f} ms"
        row["transposes"] = sum(node.op_type == "Transpose" for node in graph.graph)
        row["offload"] = {key: value for key, value in (result.cpu_offload or {}).items()
                          if key in ("head", "tail", "nodes", "ops")}
        model = Model(str(folder / "model.mxq"), input_layout="NCHW")
        model.launch(Accelerator(DEVICE))
        outputs = [model.infer(x)[0] for x in held_out]
        row["stage"] = "done"
        row["max_abs"] = max(float(np.max(np.abs(e))) for e in expected)
        row["spread"] = float(np.mean([np.std(e) for e in expected]))
        if row["max_abs"] < DEGENERATE:
            row["degenerate"] = True
            return row
        row["cosines"] = [_cosine(o, e) for o, e in zip(outputs, expected)]
        if classifier:
            row["top1"] = sum(int(np.argmax(o) == np.argmax(e)) for o, e in zip(outputs, expected))
    except Exception as error:  # every failure is a row of the table
        code = getattr(error, "code", "INTERNAL_ERROR")
        row["error"] = f"{code}: {str(error).splitlines()[0][:200] if str(error) else type(error).__name__}"
        if code == "INTERNAL_ERROR":
            row["traceback"] = traceback.format_exc(limit=-4)
    return row


def run(names: list[str] | None, forms_wanted: list[str] | None) -> list[tuple[str, str, dict]]:
    import corpus

    corpus.NORMALIZE.setdefault("raw", lambda pixels: pixels)
    rows = []
    for name, (class_name, size, norm, forms, options) in MODELS.items():
        if names and name not in names:
            continue
        forms = tuple(f for f in forms if not forms_wanted or f in forms_wanted)
        spec = type("Spec", (), {"shape": (1, size, size, 3), "dtype": np.float32})
        calibration = [corpus.image_tensor(image, spec, norm) for image in corpus.photos("calib", CALIBRATION)]
        held_out = [corpus.image_tensor(image, spec, norm) for image in corpus.photos("eval", HELD_OUT)]
        with tempfile.TemporaryDirectory(prefix=f"probe-{name}-") as scratch:
            folder = Path(scratch)
            started = time.perf_counter()
            try:
                network = build(class_name, size, options)
                settled = settle_batch_norm(network, np.concatenate(calibration))
                expected = [np.asarray(network(x, training=False)) for x in held_out]
                with contextlib.redirect_stdout(io.StringIO()):  # export and the converter print signatures
                    paths = save_forms(network, forms, folder, calibration)
            except Exception as error:  # the model cannot be built or saved: a row, not a crash
                rows.append((name, "-", {"error": f"BUILD: {str(error).splitlines()[0][:200]}"}))
                _print(name, "-", rows[-1][2])
                continue
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    peer = tflite_peer(network, paths.get("tflite_int8"), calibration, held_out, expected)
                print(f"[probe] {name:22s} {'peer':15s} TF's int8 TFLite (16 calibration photos) vs Keras: cosine "
                      f"mean {np.mean(peer):.4f} min {min(peer):.4f}", flush=True)
            except Exception as error:  # the peer is a reference only
                print(f"[probe] {name:22s} peer: TF's int8 conversion failed: {str(error).splitlines()[0][:120]}")
            classifier = class_name != "unet" and options.get("include_top", True)
            print(f"[probe] {name}: built {size}x{size}, {network.count_params():,} params, {settled} BatchNorms "
                  f"settled, saved in {time.perf_counter() - started:.1f} s", flush=True)
            for form, path in paths.items():
                for preset in [None] + (list(EXTRA_PRESETS) if form == "tflite" else []):
                    label = f"{form}+{preset}" if preset else form
                    (folder / label).mkdir()
                    started = time.perf_counter()
                    row = probe_form(path, folder / label, calibration, held_out, expected, classifier, preset)
                    row["seconds"] = round(time.perf_counter() - started, 1)
                    rows.append((name, label, row))
                    _print(name, label, row)
    return rows


def _print(name: str, form: str, row: dict) -> None:
    nodes = f"{row['nodes'] - row['flagged']}/{row['nodes']}" if "nodes" in row else "-"
    flagged = ",".join(row.get("flagged_ops") or []) or "-"
    if "error" in row:
        result = row["error"]
    elif row.get("degenerate"):
        result = f"ok; FP32 output max |y| {row['max_abs']:.1e} (degenerate), no cosine"
    else:
        top1 = f" top-1 {row['top1']}/{HELD_OUT}" if "top1" in row else ""
        result = (f"ok; MBLT {row['mblt_cosine']:.4f}; MXQ cosine mean {np.mean(row['cosines']):.4f} min {min(row['cosines']):.4f}{top1}"
                  f" (FP32 std {row['spread']:.3g})")
    if "estimate" in row:
        result += f"; {row['transposes']} Transpose; est. {row['estimate']}"
    offload = f" offload {row['offload']}" if row.get("offload") else ""
    times = f"parse {row.get('parse_s', '-')} s, compile {row.get('compile_s', '-')} s, all {row.get('seconds', '-')} s"
    print(f"[probe] {name:22s} {form:15s} npu {nodes:9s} flagged {flagged:12s} {result}{offload}  ({times})",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--forms", help=f"comma-separated forms of {', '.join(ALL_FORMS)} (default: each model's)")
    parser.add_argument("--presets", help="comma-separated presets the tflite form is also compiled with (e.g. a16w8)")
    args = parser.parse_args()
    EXTRA_PRESETS.extend(args.presets.split(",") if args.presets else [])
    rows = run(args.models.split(",") if args.models else None, args.forms.split(",") if args.forms else None)
    internal = [(n, f) for n, f, row in rows if str(row.get("error", "")).startswith("INTERNAL_ERROR")]
    done = [row for _, _, row in rows if "error" not in row]
    close = [row for row in done if row.get("cosines") and min(row["cosines"]) >= 0.99]
    print(f"\n{len(rows)} model forms: {len(done)} compile ({len(close)} with every held-out cosine >= 0.99), "
          f"{len(rows) - len(done)} refused or failed, {len(internal)} internal errors {internal}")
    for name, form, row in rows:
        if "traceback" in row:
            print(f"\n{name} {form}:\n{row['traceback']}")
    return 1 if internal else 0


if __name__ == "__main__":
    sys.exit(main())
