"""Run-time inputs as a vendor-runtime user passes them: uint8 pixels, float32 pixels, normalized float32.

MobileNetV2 is compiled twice on 16 calibration photos: with ``classification_torchvision`` (uint8 input, ImageNet
normalization fused) and with ``classification`` (float input, normalization done by the caller). Each of the 300
held-out views of 30 scenes (none a calibration scene; ``realdata.imagenet_held_out_views``) is resized (short side
256) and centre-cropped to 224 and run three ways:

- ``uint8 MXQ, uint8 pixels``: the reference path;
- ``float MXQ, normalized floats``: the right input for a float MXQ;
- ``uint8 MXQ, float32 pixels``: the pixels as float32, which the runtime reads as the model's own (normalized) values.

Each row counts the photos whose top-1 class equals the reference path's and the photos for which the runtime warned
that the input lies far outside its range (``compiler_core.runtime.checks``).

Usage: ``python bench/vendor_inputs.py``.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

import realdata  # noqa: E402
import realmodels  # noqa: E402

from compiler_core import mxq_compile  # noqa: E402
from compiler_core.runtime import Accelerator, Model, checks  # noqa: E402

MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])


class _Warnings(logging.Handler):
    """Counts the far-outside-range warnings."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "far outside" in record.getMessage()


def _pixels(path: Path, size: int = 224) -> np.ndarray:
    image = Image.open(path).convert("RGB")
    scale = 256 / min(image.size)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.BILINEAR)
    left, top = (image.width - size) // 2, (image.height - size) // 2
    return np.asarray(image.crop((left, top, left + size, top + size)))[None]


def _launched(path: Path) -> Model:
    model = Model(path)
    model.launch(Accelerator("aries-rb"))
    return model


def main() -> None:
    onnx_path = realmodels.mobilenet_v2_onnx()
    calib, _ = realdata.imagenet_photo_sets(n_calib=16)
    held_out = realdata.imagenet_held_out_views(300)
    scenes = len(json.loads((held_out / ".record.json").read_text())["sources"])
    warnings = _Warnings()
    logging.getLogger("compiler_core.runtime.checks").addHandler(warnings)
    with tempfile.TemporaryDirectory() as folder:
        uint8_mxq, float_mxq = Path(folder) / "uint8.mxq", Path(folder) / "float.mxq"
        mxq_compile(onnx_path, "aries-rb", calib, uint8_mxq, config_preset="classification_torchvision")
        mxq_compile(
            onnx_path,
            "aries-rb",
            calib,
            float_mxq,
            config_preset="classification",
            preprocessing_config=realdata.IMAGENET_PREPROCESSING,
        )
        uint8_model, float_model = _launched(uint8_mxq), _launched(float_mxq)
        rows = {"float MXQ, normalized floats": [0, 0], "uint8 MXQ, float32 pixels": [0, 0]}
        files = realdata.image_files(held_out)
        for path in files:
            pixels = _pixels(path)
            reference = int(uint8_model.infer([pixels])[0].argmax())
            runs = {
                "float MXQ, normalized floats": (
                    float_model,
                    ((pixels / 255 - MEAN) / STD).astype(np.float32),
                ),
                "uint8 MXQ, float32 pixels": (uint8_model, pixels.astype(np.float32)),
            }
            for name, (model, array) in runs.items():
                checks._WARNED_RANGES.clear()  # warned once per model: count per photo
                warnings.count = 0
                rows[name][0] += int(model.infer([array])[0].argmax()) == reference
                rows[name][1] += warnings.count > 0
    print(f"{len(files)} held-out views of {scenes} scenes; reference: uint8 MXQ on uint8 pixels")
    print(f"{'input':32s} {'top-1 = reference':>18s} {'warned':>8s}")
    for name, (agree, warned) in rows.items():
        print(f"{name:32s} {agree:>12d}/{len(files)} {warned:>4d}/{len(files)}")


if __name__ == "__main__":
    main()
