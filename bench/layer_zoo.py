"""Layers and architectures the corpus rarely has, through the user's path (random weights).

Two families, each model given to the compiler as a user would and compared with its own framework on
the same inputs:

- ``torch``: small ``nn.Module`` s built around one kind of layer each (GRU, LSTM, multi-head and
  einsum attention, TransformerEncoder, PixelShuffle, ConvTranspose + bilinear upsampling, Group/
  Instance norm, adaptive pooling, unfold, ...), parsed from the live module (``backend="torch"``),
  calibrated on 16 standard-normal samples, compared on 3 others.
- ``keras``: ``keras.applications`` architectures (``weights=None``, logits), saved as ``.keras`` files,
  calibrated on 16 photos and compared on 4 held-out photos (the corpus's photo sets).

Random weights say nothing about a trained model's accuracy; what this bench shows is that a model the
graph calls supported compiles, that nothing is an ``INTERNAL_ERROR``, and that the MXQ follows the
framework. Some random Keras networks (MobileNet v1/v3) output values below 1e-9 everywhere; they are
marked instead of given a cosine.

Usage: ``python bench/layer_zoo.py [--family torch|keras|all] [--models a,b]`` (``make layer-zoo``);
torch takes about 3 minutes on 2 cores, keras about 25.
"""

from __future__ import annotations

import argparse
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
DEGENERATE = 1e-9
"""Largest |output| below which a random network's output counts as all zeros."""
SEQ, IMAGE = (1, 32, 64), (1, 3, 64, 64)


def torch_cases() -> dict:
    """name -> (module, input shape)."""
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812

    class Stem(nn.Module):
        def __init__(self, body):
            super().__init__()
            self.stem, self.body = nn.Conv2d(3, 16, 3, 2, 1), body

        def forward(self, x):
            return self.body(F.relu(self.stem(x)))

    class Call(nn.Module):
        def __init__(self, function, **modules):
            super().__init__()
            self.function = function
            for name, module in modules.items():
                setattr(self, name, module)

        def forward(self, x):
            return self.function(self, x)

    torch.manual_seed(0)
    return {
        "transformer_encoder": (Call(lambda s, x: s.m(x), m=nn.TransformerEncoder(
            nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0), 2)), SEQ),
        "multihead_attention": (Call(lambda s, x: s.m(x, x, x, need_weights=False)[0],
                                     m=nn.MultiheadAttention(64, 4, batch_first=True)), SEQ),
        "einsum_attention": (Call(lambda s, x: torch.einsum("bij,bjd->bid", torch.softmax(
            torch.einsum("bid,bjd->bij", s.q(x), s.k(x)) / 8, -1), s.v(x)),
            q=nn.Linear(64, 64), k=nn.Linear(64, 64), v=nn.Linear(64, 64)), SEQ),
        "gru_bidirectional": (Call(lambda s, x: s.m(x)[0], m=nn.GRU(64, 32, batch_first=True, bidirectional=True)),
                              SEQ),
        "lstm_2_layers": (Call(lambda s, x: s.m(x)[0], m=nn.LSTM(64, 32, num_layers=2, batch_first=True)), SEQ),
        "rnn_tanh": (Call(lambda s, x: s.m(x)[0], m=nn.RNN(64, 32, batch_first=True)), SEQ),
        "pixel_shuffle": (Stem(nn.Sequential(nn.Conv2d(16, 32, 3, 1, 1), nn.PixelShuffle(2), nn.Conv2d(8, 4, 3, 1, 1))),
                          IMAGE),
        "conv_transpose_bilinear": (Stem(nn.Sequential(nn.ConvTranspose2d(16, 8, 4, 2, 1), nn.Upsample(
            scale_factor=2, mode="bilinear", align_corners=True), nn.Conv2d(8, 2, 1))), IMAGE),
        "group_instance_norm": (Stem(nn.Sequential(nn.Conv2d(16, 32, 3, 1, 1), nn.GroupNorm(4, 32), nn.SiLU(),
                                                   nn.Conv2d(32, 16, 3, 1, 1), nn.InstanceNorm2d(16, affine=True),
                                                   nn.Mish())), IMAGE),
        "adaptive_pool_32_to_7": (Stem(nn.Sequential(nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(16 * 49, 10))),
                                  IMAGE),
        "hardswish_gelu_tanh": (Stem(nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.Hardswish(),
                                                   nn.Conv2d(16, 16, 1), nn.GELU(approximate="tanh"),
                                                   nn.Hardsigmoid())), IMAGE),
        "unfold_patches": (Call(lambda s, x: s.l(F.unfold(x, 8, stride=8).transpose(1, 2)), l=nn.Linear(3 * 64, 32)),
                           IMAGE),
        "normalize_cumsum_where": (Call(lambda s, x: torch.where(s.l(x) > 0, F.normalize(s.l(x), dim=-1),
                                                                 torch.cumsum(s.l(x), 1) * 0.1), l=nn.Linear(64, 16)),
                                   SEQ),
        "conv1d_audio": (Call(lambda s, x: s.m(x), m=nn.Sequential(
            nn.Conv1d(1, 16, 80, 4, 38), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(4), nn.Conv1d(16, 32, 3, 1, 1),
            nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 5))), (1, 1, 8000)),
        "channels_last_layernorm": (Call(lambda s, x: s.pw(s.ln(s.dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2),
                                         dw=nn.Conv2d(3, 3, 7, 1, 3, groups=3), ln=nn.LayerNorm(3), pw=nn.Linear(3, 12)),
                                    IMAGE),
        "prelu_elu_softplus_avgpool": (Stem(nn.Sequential(nn.PReLU(16), nn.Conv2d(16, 16, 3, 1, 1), nn.ELU(),
                                                          nn.Conv2d(16, 8, 1), nn.Softplus(),
                                                          nn.AvgPool2d(3, 2, 1, count_include_pad=False))), IMAGE),
        "nearest_resize_to_size": (Stem(nn.Sequential(nn.MaxPool2d(2), nn.Upsample(size=(20, 20), mode="nearest"),
                                                      nn.Conv2d(16, 4, 3))), IMAGE),
    }


KERAS_APPLICATIONS = {  # name -> (keras.applications class, input normalisation of tests/corpus.py)
    "mobilenet": ("MobileNet", "pm1"), "mobilenet_v3_small": ("MobileNetV3Small", "raw"),
    "efficientnet_b0": ("EfficientNetB0", "raw"), "efficientnet_v2_b0": ("EfficientNetV2B0", "raw"),
    "resnet50_v2": ("ResNet50V2", "pm1"), "densenet121": ("DenseNet121", "imagenet"),
    "inception_v3": ("InceptionV3", "pm1"), "xception": ("Xception", "pm1"),
    "nasnet_mobile": ("NASNetMobile", "pm1"), "convnext_tiny": ("ConvNeXtTiny", "raw"),
}


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def _compile_and_compare(source, folder: Path, calibration: list[dict], evaluation: list[np.ndarray],
                         reference, **parse_options) -> dict:
    """Parse, check, compile (CPU offload only if check asks for it) and compare; a row of the table."""
    import corpus

    from compiler_core.api import mblt_compile, mxq_compile
    from compiler_core.mblt.io import load_mblt
    from compiler_core.runtime import Accelerator, Model
    from compiler_core.targets import check_support

    row = {"stage": "parse"}
    try:
        mblt = mblt_compile(source, folder / "model.mblt", **parse_options)
        report = check_support(load_mblt(mblt), DEVICE)
        row.update(stage="compile", counts=report.counts())
        manifest = corpus.write_manifest(folder / "calib", calibration)
        mxq_compile(str(mblt), target_device=DEVICE, calib_data_path=str(manifest), save_path=folder / "model.mxq",
                    analysis_holdout=0, cpu_offload=not report.all_supported)
        model = Model(str(folder / "model.mxq"), input_layout="NCHW")
        model.launch(Accelerator(DEVICE))
        expected = [reference(x) for x in evaluation]
        if max(float(np.max(np.abs(e))) for e in expected) < DEGENERATE:
            row.update(stage="done", degenerate=True)
            return row
        row.update(stage="done", cosine=float(np.mean([_cosine(model.infer(x)[0], e)
                                                       for x, e in zip(evaluation, expected)])))
    except Exception as error:  # every failure is a row of the table
        code = getattr(error, "code", "INTERNAL_ERROR")
        row["error"] = f"{code}: {str(error).splitlines()[0][:160]}"
        if code == "INTERNAL_ERROR":
            row["traceback"] = traceback.format_exc(limit=-3)
    return row


def run_torch(names: list[str] | None) -> list[tuple[str, dict]]:
    import torch

    rng = np.random.default_rng(0)
    rows = []
    for name, (module, shape) in torch_cases().items():
        if names and name not in names:
            continue
        module.eval()
        started = time.perf_counter()
        calibration = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(16)]
        evaluation = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]

        def reference(x, module=module):
            with torch.no_grad():
                return module(torch.from_numpy(x)).numpy()

        with tempfile.TemporaryDirectory(prefix=f"zoo-{name}-") as folder:
            row = _compile_and_compare(module, Path(folder), calibration, evaluation, reference, backend="torch",
                                       feed_dict={"x": torch.from_numpy(calibration[0]["x"])})
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append((name, row))
        _print(name, row)
    return rows


def run_keras(names: list[str] | None) -> list[tuple[str, dict]]:
    import corpus
    import keras

    corpus.NORMALIZE.setdefault("raw", lambda pixels: pixels)
    spec = type("Spec", (), {"shape": (1, 224, 224, 3), "dtype": np.float32})
    rows = []
    for name, (class_name, norm) in KERAS_APPLICATIONS.items():
        if names and name not in names:
            continue
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"zoo-{name}-") as folder:
            keras.utils.set_random_seed(0)
            network = getattr(keras.applications, class_name)(weights=None, input_shape=(224, 224, 3), classes=10,
                                                             classifier_activation=None)
            path = Path(folder) / f"{name}.keras"
            network.save(path)
            calibration = [corpus.image_tensor(image, spec, norm) for image in corpus.photos("calib", 16)]
            evaluation = [corpus.image_tensor(image, spec, norm) for image in corpus.photos("eval", 4)]
            input_name = _first_input(path, Path(folder))
            row = _compile_and_compare(path, Path(folder), [{input_name: x} for x in calibration], evaluation,
                                       lambda x, network=network: network(x, training=False).numpy())
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append((name, row))
        _print(name, row)
    return rows


def _first_input(path: Path, folder: Path) -> str:
    """The MBLT input name TFLite gives a Keras model (``serving_default_<layer>:0``)."""
    from compiler_core.api import mblt_compile
    from compiler_core.mblt.io import load_mblt

    return load_mblt(mblt_compile(path, folder / "probe.mblt")).graph.inputs[0].name


def _print(name: str, row: dict) -> None:
    counts = row.get("counts") or {}
    shown = f"{counts.get('supported', 0)}/{sum(counts.values())} supported" if counts else "-"
    if "error" in row:
        result = row["error"]
    elif row.get("degenerate"):
        result = f"compiles; FP32 output below {DEGENERATE:g} (random weights), no cosine"
    else:
        result = f"compiles; cosine {row['cosine']:.4f}"
    print(f"[zoo] {name:28s} {shown:18s} {result}  ({row['seconds']} s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["torch", "keras", "all"], default="all")
    parser.add_argument("--models", help="comma-separated names (default: all of the family)")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else None
    rows = []
    if args.family in ("torch", "all"):
        rows += run_torch(names)
    if args.family in ("keras", "all"):
        rows += run_keras(names)
    compiled = [name for name, row in rows if "error" not in row]
    internal = [name for name, row in rows if str(row.get("error", "")).startswith("INTERNAL_ERROR")]
    close = [name for name, row in rows if row.get("cosine", 0) >= 0.99]
    print(f"\n{len(rows)} models: {len(compiled)} compile ({len(close)} with cosine >= 0.99, "
          f"{sum(bool(row.get('degenerate')) for _, row in rows)} with all-zero FP32 output), "
          f"{len(rows) - len(compiled)} refused with a coded error, {len(internal)} internal errors {internal}")
    for name, row in rows:
        if "traceback" in row:
            print(f"\n{name}:\n{row['traceback']}")
    return 1 if internal else 0


if __name__ == "__main__":
    sys.exit(main())
