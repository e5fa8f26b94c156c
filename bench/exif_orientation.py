"""Phone photos with an EXIF orientation: what MobileNetV2 (FP32) sees through the calibration reader.

Each of the 25 held-out wallpaper photos (``realdata.WALLPAPER_SOURCES``, Debian's mate-backgrounds and
lomiri-wallpapers) is saved as a phone saves it for each orientation tag 3, 6 and 8 (the pixels turned, the tag saying
how to show them; PNG, so that the orientation is the only difference), read through ``open_calibration_data`` with
the ImageNet pipeline, and classified by the FP32 MobileNetV2 in onnxruntime. Row ``read`` is what the reader feeds now (the tag applied); row ``stored pixels`` is
what it fed before (the same files with the tag ignored: the stored pixels as they are). Each row counts photos whose
top-1 class equals the upright photo's.

Usage: ``python bench/exif_orientation.py``.
"""

from __future__ import annotations

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

from compiler_core.calibration import InputSpec, open_calibration_data  # noqa: E402
from compiler_core.calibration.preprocess import ORIENTATION_TRANSPOSE  # noqa: E402

SPEC = InputSpec("input", (1, 3, 224, 224), np.dtype(np.float32), "NCHW")
UNDO = {3: 3, 6: 8, 8: 6}  # the transpose that turns an upright photo into the pixels stored with each tag


def top1(session, folder: Path) -> list[int]:
    dataset = open_calibration_data(folder, [SPEC], preprocessing=realdata.IMAGENET_PREPROCESSING)
    name = session.get_inputs()[0].name
    return [int(np.argmax(session.run(None, {name: dataset.sample(i)["input"]})[0])) for i in range(len(dataset))]


def main() -> None:
    session = realdata.ort_session(realmodels.mobilenet_v2_onnx())
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        folders = {name: root / name for name in ("upright", *(f"tag{o}" for o in UNDO), *(f"raw{o}" for o in UNDO))}
        for folder in folders.values():
            folder.mkdir()
        for index, (name, load) in enumerate(realdata.WALLPAPER_SOURCES.items()):
            photo = Image.fromarray(load())
            photo.save(folders["upright"] / f"{index:02d}_{name}.png")
            for orientation, undo in UNDO.items():
                stored = photo.transpose(ORIENTATION_TRANSPOSE[undo])
                exif = stored.getexif()
                exif[0x0112] = orientation
                stored.save(folders[f"tag{orientation}"] / f"{index:02d}_{name}.png", exif=exif)
                stored.save(folders[f"raw{orientation}"] / f"{index:02d}_{name}.png")
        upright = top1(session, folders["upright"])
        print(f"{len(upright)} photos; top-1 equal to the upright photo's, per orientation tag 3 / 6 / 8")
        for label, prefix in (("read (tag applied)", "tag"), ("stored pixels (before)", "raw")):
            counts = [sum(a == b for a, b in zip(top1(session, folders[f"{prefix}{o}"]), upright)) for o in UNDO]
            print(f"{label:24s} " + " / ".join(f"{count}/{len(upright)}" for count in counts))


if __name__ == "__main__":
    main()
