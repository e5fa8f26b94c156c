"""Real data for quantization tests and benchmarks: photos, Fashion-MNIST, English sentences (offline, cached).

Every builder is deterministic and caches its files under ``<repo>/build/testdata/`` (see
``/work/shared/notes/test-data.md``). A missing package or dataset raises
:class:`realmodels.RealModelUnavailable` with the command that fixes it, so tests skip with a reason.

**Photos** (:func:`imagenet_photo_sets`). Source photos, split by *scene* so that no source image
(and no view of the same scene) appears in both sets:

- eval scenes: ``skimage.data`` chelsea (cat), coffee, rocket; scikit-learn ``flower.jpg``;
  matplotlib ``grace_hopper.jpg`` (5 colour scenes);
- calibration scenes: ``skimage.data`` astronaut, the stereo motorcycle pair (left and right, one
  scene), hubble_deep_field, immunohistochemistry, retina; scikit-learn ``china.jpg``; and the gray
  photos camera, brick, grass, gravel, moon, coins, clock (decoded as RGB by the readers)
  (7 colour images of 6 scenes + 7 gray).

``skimage.data.cat`` is the same picture as ``chelsea`` and is not used twice. Each source yields
views in a fixed order (:data:`CROP_VIEWS`): the whole image, its mirror, then square-ish windows of
80/65/50/40 % of each side at the centre and the four corners, each plain and mirrored (42 views per
source). Sets are filled round-robin over their sources (view 0 of every source, then view 1, ...),
so a set of N images spreads over all its sources and the first N of a larger set equal the smaller
set. Images are written as JPEG (Pillow, quality 95) at the crop's own resolution: the model's
preprocessing (:data:`IMAGENET_PIPELINE`) does the resizing, as at run time.

**Fashion-MNIST** (:func:`fashion_mnist_test`): the 10,000 test images and labels from the Debian
package ``dataset-fashion-mnist``; the bundled sample model was trained on the train split only.

**Sentences** (:func:`english_sentences`): real English sentences split out of the docstrings of
Python standard-library modules (read from source with ``ast``, never imported), in a fixed module
order. Calibration and held-out sentences come from disjoint module lists.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import shutil
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from realmodels import (
    CACHE_DIR,
    IMAGENET_MEAN,
    IMAGENET_STD,
    MINILM_INPUT_NAMES,
    REPO_ROOT,
    RealModelUnavailable,
    _build_lock,
    _require_module,
    tokenize,
)

logger = logging.getLogger(__name__)

PHOTO_DIR = CACHE_DIR / "photos"
PHOTO_FORMAT_VERSION = 1
JPEG_QUALITY = 95

# resize short side 256 (bilinear, keep aspect), centre crop 224, ImageNet normalize, CHW.
IMAGENET_PIPELINE = [
    {"op": "resize", "size": 256, "keepAspect": True, "mode": "bilinear"},
    {"op": "centerCrop", "height": 224, "width": 224},
    {"op": "normalize", "mean": IMAGENET_MEAN.tolist(), "std": IMAGENET_STD.tolist()},
    {"op": "layout", "order": "CHW"},
]
IMAGENET_PREPROCESSING = {"apply": True, "pipeline": IMAGENET_PIPELINE}

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
FASHION_PREPROCESSING = {"apply": True, "pipeline": [{"op": "normalize", "mean": [FASHION_MEAN],
                                                      "std": [FASHION_STD]}]}

# --------------------------------------------------------------------------------------------------
# Photos


def _skimage(name: str, index: int | None = None) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        from skimage import data

        image = getattr(data, name)()
        return np.asarray(image[index] if index is not None else image)
    return load


def _sklearn(file_name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        from sklearn.datasets import load_sample_image

        return np.asarray(load_sample_image(file_name))
    return load


def _matplotlib(file_name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        from matplotlib import cbook
        from PIL import Image

        with Image.open(cbook.get_sample_data(file_name, asfileobj=False)) as image:
            return np.asarray(image.convert("RGB"))
    return load


EVAL_SOURCES: dict[str, Callable[[], np.ndarray]] = {
    "chelsea": _skimage("chelsea"),
    "coffee": _skimage("coffee"),
    "rocket": _skimage("rocket"),
    "flower": _sklearn("flower.jpg"),
    "grace_hopper": _matplotlib("grace_hopper.jpg"),
}
WALLPAPER_DIR = Path("/usr/share/backgrounds")
WALLPAPER_SHORT_SIDE = 640
MATE_NATURE = ("Aqua", "Blinds", "Dune", "FreshFlower", "Garden", "GreenMeadow", "LadyBird", "RainDrops", "Storm",
               "TwoWings", "Wood", "YellowFlower")
LOMIRI_PHOTOS = ("Bridge_by_Sander_Klootwijk", "Dragonfly_by_Bolly", "Picture_0B_by_freespace",
                 "Picture_1A_by_freespace", "Wine_by_Jakkub_Mede", "aitzgorri_by_Aitzol_Berasategi",
                 "free_by_Peter_Nerlich", "friends_by_Aitzol_Berasategi", "greentock_by_Peter_Nerlich",
                 "life_by_Aitzol_Berasategi", "picosdeeuropa_by_Aitzol_Berasategi",
                 "seeding_by_Clements_Engelhardt", "sunset_by_Aitzol_Berasategi")
"""Photographs of the Debian wallpaper packages (their abstract and rendered wallpapers are left out)."""


def _wallpaper(relative: str, package: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        from PIL import Image

        path = WALLPAPER_DIR / relative
        if not path.is_file():
            raise RealModelUnavailable(f"{path} is missing: apt-get install -y {package} (as root)")
        with Image.open(path) as image:
            image = image.convert("RGB")
            scale = WALLPAPER_SHORT_SIDE / min(image.size)
            return np.asarray(image.resize((round(image.width * scale), round(image.height * scale)),
                                           Image.Resampling.LANCZOS))
    return load


WALLPAPER_FILES: dict[str, tuple[str, str]] = {
    **{f"mate_{name}": (f"mate/nature/{name}.jpg", "mate-backgrounds") for name in MATE_NATURE},
    **{f"lomiri_{name.split('_by_')[0]}": (f"{name}.jpg", "lomiri-wallpapers-16.04") for name in LOMIRI_PHOTOS},
}
"""Source name -> (path under :data:`WALLPAPER_DIR`, Debian package)."""
WALLPAPER_SOURCES: dict[str, Callable[[], np.ndarray]] = {
    name: _wallpaper(relative, package) for name, (relative, package) in WALLPAPER_FILES.items()}
"""25 held-out photos of 25 scenes from Debian packages, downscaled to a short side of 640 pixels (a 40 %
window then still covers the model's 256-pixel resize): ``mate-backgrounds`` nature/ (12 photos, GPL-2+),
``lomiri-wallpapers-16.04`` (13 photos, CC-BY-4.0 / CC-BY-SA-4.0)."""
HELD_OUT_SOURCES: dict[str, Callable[[], np.ndarray]] = {**EVAL_SOURCES, **WALLPAPER_SOURCES}
"""Every held-out scene: :data:`EVAL_SOURCES` and :data:`WALLPAPER_SOURCES` (30 scenes)."""
CALIB_SOURCES: dict[str, Callable[[], np.ndarray]] = {
    "astronaut": _skimage("astronaut"),
    "motorcycle_left": _skimage("stereo_motorcycle", 0),
    "motorcycle_right": _skimage("stereo_motorcycle", 1),
    "hubble": _skimage("hubble_deep_field"),
    "immunohistochemistry": _skimage("immunohistochemistry"),
    "retina": _skimage("retina"),
    "china": _sklearn("china.jpg"),
    **{name: _skimage(name) for name in ("camera", "brick", "grass", "gravel", "moon", "coins", "clock")},
}
_CORNERS = ("centre", "top_left", "top_right", "bottom_left", "bottom_right")
CROP_VIEWS: tuple[tuple[float, str, bool], ...] = (
    (1.0, "centre", False), (1.0, "centre", True),
    *((scale, corner, flip) for scale in (0.8, 0.65, 0.5, 0.4) for corner in _CORNERS for flip in (False, True)),
)
"""``(fraction of each side, window position, mirrored)`` in the order views are taken."""


def crop_view(image: np.ndarray, scale: float, corner: str, flip: bool) -> np.ndarray:
    """A window of ``scale`` times each side at ``corner`` (``centre`` or ``top_left`` ...), maybe mirrored."""
    height, width = image.shape[:2]
    crop_h, crop_w = round(height * scale), round(width * scale)
    top = {"top": 0, "bottom": height - crop_h}.get(corner.split("_")[0], (height - crop_h) // 2)
    left = {"left": 0, "right": width - crop_w}.get(corner.split("_")[-1], (width - crop_w) // 2)
    window = image[top:top + crop_h, left:left + crop_w]
    return np.ascontiguousarray(window[:, ::-1] if flip else window)


def _round_robin(sources: dict[str, Callable[[], np.ndarray]], count: int) -> Iterator[tuple[str, np.ndarray]]:
    """``count`` (file stem, view) pairs: view 0 of every source, then view 1, ..."""
    capacity = len(sources) * len(CROP_VIEWS)
    if count > capacity:
        raise ValueError(f"at most {capacity} views of {len(sources)} sources, asked for {count}")
    images = {name: _rgb_or_gray(load()) for name, load in sources.items()}
    for index in range(count):
        view, source = divmod(index, len(sources))
        name = list(sources)[source]
        scale, corner, flip = CROP_VIEWS[view]
        stem = f"{index:04d}_{name}_s{round(scale * 100)}_{corner}{'_flip' if flip else ''}"
        yield stem, crop_view(images[name], scale, corner, flip)


def _rgb_or_gray(image: np.ndarray) -> np.ndarray:
    if image.dtype != np.uint8:
        raise ValueError(f"expected a uint8 photo, got {image.dtype}")
    return image[..., :3] if image.ndim == 3 else image


def _write_jpegs(folder: Path, views: Iterator[tuple[str, np.ndarray]]) -> list[str]:
    from PIL import Image

    names = []
    for stem, pixels in views:
        Image.fromarray(pixels).save(folder / f"{stem}.jpg", quality=JPEG_QUALITY)
        names.append(f"{stem}.jpg")
    return names


def _photo_folder(name: str, sources: dict[str, Callable[[], np.ndarray]], count: int) -> Path:
    """``PHOTO_DIR/name`` holding ``count`` views of ``sources``, rebuilt when its record differs."""
    target = PHOTO_DIR / name
    record = {"version": PHOTO_FORMAT_VERSION, "count": count, "sources": list(sources),
              "views": [list(view) for view in CROP_VIEWS], "jpeg_quality": JPEG_QUALITY}
    if _record_matches(target, record):
        return target
    with _build_lock(f"photos-{name}"):
        if not _record_matches(target, record):
            PHOTO_DIR.mkdir(parents=True, exist_ok=True)
            temp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=PHOTO_DIR))
            record["files"] = _write_jpegs(temp, _round_robin(sources, count))
            (temp / ".record.json").write_text(json.dumps(record, indent=1))
            shutil.rmtree(target, ignore_errors=True)
            os.replace(temp, target)
    return target


def _record_matches(folder: Path, record: dict) -> bool:
    try:
        stored = json.loads((folder / ".record.json").read_text())
    except (OSError, ValueError):
        return False
    return {key: stored.get(key) for key in record} == record


def imagenet_photo_sets(n_calib: int = 64, n_eval: int = 40) -> tuple[Path, Path]:
    """JPEG folders ``(calib, eval)`` of real photos with disjoint source scenes (see the module docstring).

    The default sizes live in ``build/testdata/photos/calib`` and ``.../eval``; other sizes get their
    own folders (``calib_256``, ``eval_80``), so tests and benchmarks never rebuild each other's.

    Raises:
        RealModelUnavailable: scikit-image, scikit-learn or matplotlib is missing.
    """
    for module, pip_name in (("skimage", "scikit-image"), ("sklearn", "scikit-learn"),
                             ("matplotlib", "matplotlib"), ("PIL", "Pillow")):
        _require_module(module, pip_name)
    calib = _photo_folder("calib" if n_calib == 64 else f"calib_{n_calib}", CALIB_SOURCES, n_calib)
    evaluation = _photo_folder("eval" if n_eval == 40 else f"eval_{n_eval}", EVAL_SOURCES, n_eval)
    return calib, evaluation


def imagenet_held_out_views(count: int = 300) -> Path:
    """JPEG folder of ``count`` views of the 30 held-out scenes (:data:`HELD_OUT_SOURCES`), round-robin.

    No scene is a calibration scene of :func:`imagenet_photo_sets`. Cached as ``photos/heldout_<count>``.

    Raises:
        RealModelUnavailable: a Python package or a Debian wallpaper package is missing.
    """
    for module, pip_name in (("skimage", "scikit-image"), ("sklearn", "scikit-learn"),
                             ("matplotlib", "matplotlib"), ("PIL", "Pillow")):
        _require_module(module, pip_name)
    for relative, package in WALLPAPER_FILES.values():
        if not (WALLPAPER_DIR / relative).is_file():
            raise RealModelUnavailable(f"{WALLPAPER_DIR / relative} is missing: apt-get install -y {package} (as root)")
    return _photo_folder(f"heldout_{count}", HELD_OUT_SOURCES, count)


def image_files(folder: Path) -> list[Path]:
    """The JPEG files of a photo folder, in name order (the order the calibration readers use)."""
    return sorted(folder.glob("*.jpg"))


def imagenet_tensors(folder: Path) -> np.ndarray:
    """Every photo of ``folder`` through :data:`IMAGENET_PIPELINE` with the compiler's own reader: [N, 3, 224, 224]."""
    from compiler_core.calibration import preprocess_image
    from compiler_core.config import PreprocessingConfig

    pipeline = PreprocessingConfig(**IMAGENET_PREPROCESSING).pipeline
    return np.stack([preprocess_image(path, pipeline, 3) for path in image_files(folder)])


# --------------------------------------------------------------------------------------------------
# Fashion-MNIST


def read_idx(path: Path) -> np.ndarray:
    """A gzipped IDX file as an array: the reader of scripts/train_sample.py (which trained the sample)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_sample", REPO_ROOT / "scripts" / "train_sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_idx(path)


def fashion_mnist_test() -> tuple[np.ndarray, np.ndarray]:
    """The Fashion-MNIST test split: uint8 images [10000, 28, 28] and int64 labels [10000].

    Raises:
        RealModelUnavailable: the Debian package ``dataset-fashion-mnist`` is not installed.
    """
    images_path = FASHION_DIR / "t10k-images-idx3-ubyte.gz"
    labels_path = FASHION_DIR / "t10k-labels-idx1-ubyte.gz"
    if not (images_path.is_file() and labels_path.is_file()):
        raise RealModelUnavailable(f"Fashion-MNIST is missing from {FASHION_DIR}: "
                                   "apt-get install -y dataset-fashion-mnist")
    return read_idx(images_path), read_idx(labels_path).astype(np.int64)


def fashion_tensors(images: np.ndarray) -> np.ndarray:
    """uint8 [N, 28, 28] -> the sample model's float32 input [N, 1, 28, 28] (its README's preprocessing)."""
    return ((images.astype(np.float32) / 255.0 - FASHION_MEAN) / FASHION_STD)[:, None].astype(np.float32)


# --------------------------------------------------------------------------------------------------
# English sentences


CALIB_TEXT_MODULES = ("argparse", "logging", "subprocess", "threading", "tarfile", "zipfile", "shutil", "pathlib",
                      "tempfile", "configparser", "smtplib", "ftplib", "imaplib")
EVAL_TEXT_MODULES = ("difflib", "textwrap", "calendar", "fractions", "decimal", "pickle", "socket", "ssl",
                     "urllib/request", "http/client", "email/message", "inspect")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")
_CODE_LIKE = re.compile(r"[_=<>{}\[\]|\\#@*`$~^]|\.\w|\w\(|::|>>>|\bself\b|\bNone\b|\bTrue\b|\bFalse\b|\bdef\b")


def _docstrings(source: str) -> Iterator[str]:
    """Module, class and function docstrings in source order."""
    tree = ast.parse(source)
    nodes = [tree, *(node for node in ast.walk(tree)
                     if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))]
    for node in sorted(nodes, key=lambda item: getattr(item, "lineno", 0)):
        docstring = ast.get_docstring(node)
        if docstring:
            yield docstring


def _sentences(text: str) -> Iterator[str]:
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        yield from _SENTENCE_END.split(flat)


def is_prose(sentence: str) -> bool:
    """A plain English sentence: capitalised, 6-40 words, ends with a full stop, nothing code-like."""
    words = sentence.split()
    letters = sum(ch.isalpha() or ch == " " for ch in sentence)
    return (6 <= len(words) <= 40 and sentence[0].isupper() and sentence.endswith(".")
            and not _CODE_LIKE.search(sentence) and letters >= 0.9 * len(sentence))


def _module_sentences(modules: tuple[str, ...]) -> Iterator[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for module in modules:
        path = next((p for p in (stdlib / f"{module}.py", stdlib / module / "__init__.py") if p.is_file()), None)
        if path is None:
            logger.warning("standard-library module %s not found in %s; its sentences are skipped", module, stdlib)
            continue
        for docstring in _docstrings(path.read_text(encoding="utf-8")):
            yield from (s for s in _sentences(docstring) if is_prose(s))


def english_sentences(n: int, split: str = "calib") -> list[str]:
    """``n`` distinct English sentences from standard-library docstrings, in a fixed order.

    Args:
        n: how many.
        split: ``calib`` or ``eval``; the two read disjoint module lists, and an ``eval`` sentence
            that also occurs in the calibration modules is dropped, so the sets never share a sentence.

    Raises:
        ValueError: fewer than ``n`` sentences are available.
    """
    modules = {"calib": CALIB_TEXT_MODULES, "eval": EVAL_TEXT_MODULES}[split]
    excluded = set(_module_sentences(CALIB_TEXT_MODULES)) if split == "eval" else set()
    chosen: list[str] = []
    for sentence in _module_sentences(modules):
        if sentence not in excluded and sentence not in chosen:
            chosen.append(sentence)
            if len(chosen) == n:
                return chosen
    raise ValueError(f"only {len(chosen)} {split} sentences available, asked for {n}")


def minilm_calibration_manifest(n: int = 64, seq_len: int = 128) -> Path:
    """A JSON manifest of ``n`` calibration sentences for MiniLM: three int64 ``.npy`` per sample.

    Written under ``build/testdata/minilm_calib_<n>_s<seq_len>/`` (``manifest.json`` plus
    ``NNNN_<input>.npy`` of shape [1, seq_len]); the sentences are ``english_sentences(n, "calib")``.
    """
    folder = CACHE_DIR / f"minilm_calib_{n}_s{seq_len}"
    sentences = english_sentences(n, "calib")
    manifest = folder / "manifest.json"
    record = {"sentences": sentences, "seq_len": seq_len}
    if _record_matches(folder, record) and manifest.is_file():
        return manifest
    with _build_lock(folder.name):
        if not (_record_matches(folder, record) and manifest.is_file()):
            _write_manifest(folder, sentences, seq_len, record)
    return manifest


def _write_manifest(folder: Path, sentences: list[str], seq_len: int, record: dict) -> None:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=CACHE_DIR))
    tokens = tokenize(sentences, seq_len)
    paths = []
    for index in range(len(sentences)):
        row = []
        for name in MINILM_INPUT_NAMES:
            np.save(temp / f"{index:04d}_{name}.npy", tokens[name][index:index + 1])
            row.append(f"{index:04d}_{name}.npy")
        paths.append(row)
    info = {"input names": list(MINILM_INPUT_NAMES), "input shapes": [[1, seq_len]] * len(MINILM_INPUT_NAMES)}
    (temp / "manifest.json").write_text(json.dumps({"info": info, "calib paths": paths}, indent=1))
    (temp / ".record.json").write_text(json.dumps(record, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(temp, folder)


# --------------------------------------------------------------------------------------------------
# The peer: onnxruntime's quantize_static on the same photos


class PhotoReader:
    """An onnxruntime ``CalibrationDataReader`` over a photo folder, through :data:`IMAGENET_PIPELINE`.

    Images are decoded and preprocessed lazily by the compiler's own reader code, so onnxruntime gets
    exactly the tensors our calibration sees, and pays for loading them as we do.
    """

    def __init__(self, folder: Path, input_name: str = "input", limit: int | None = None) -> None:
        from compiler_core.config import PreprocessingConfig

        self.files = image_files(folder)[:limit]
        self.input_name = input_name
        self.pipeline = PreprocessingConfig(**IMAGENET_PREPROCESSING).pipeline
        self.position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        from compiler_core.calibration import preprocess_image

        if self.position >= len(self.files):
            return None
        path = self.files[self.position]
        self.position += 1
        return {self.input_name: preprocess_image(path, self.pipeline, 3)[None]}

    def rewind(self) -> None:
        self.position = 0


def ort_preprocess(source: Path, output: Path) -> Path:
    """onnxruntime's recommended step before quantization (shape inference, graph optimization: BN folding)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(str(source), str(output))
    return output


def ort_quantize_static(source: Path, calib: Path, output: Path, *, preprocessed: Path | None = None,
                        limit: int | None = None) -> Path:
    """``quantize_static`` (QDQ, per-channel, MinMax, int8 activations and weights) of an image model.

    ``source`` goes through :func:`ort_preprocess` first unless ``preprocessed`` is given.
    """
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    ort.set_default_logger_severity(3)
    model = preprocessed or ort_preprocess(source, output.with_suffix(".pre.onnx"))
    quantize_static(str(model), str(output), PhotoReader(calib, limit=limit), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    return output


# --------------------------------------------------------------------------------------------------
# Running models on many samples (FP32 and QDQ in onnxruntime, the golden executor in worker processes)


def ort_session(path: Path | bytes):
    """A single-threaded onnxruntime CPU session (quiet)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), options,
                                providers=["CPUExecutionProvider"])


def run_float(path: Path, feeds: dict[str, np.ndarray], output: str) -> np.ndarray:
    """``output`` of the model at ``path`` in onnxruntime, sample by sample (batch-1 models)."""
    session = ort_session(path)
    count = len(next(iter(feeds.values())))
    return np.concatenate([session.run([output], {name: value[i:i + 1] for name, value in feeds.items()})[0]
                           for i in range(count)])


def cosine(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two ``[N, ...]`` arrays."""
    first, second = first.reshape(len(first), -1), second.reshape(len(second), -1)
    return (first * second).sum(1) / (np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1))


def batch_program(model):
    """A copy of a QuantizedModel whose constant Reshape targets ``[1, ...]`` take any batch (``[-1, ...]``).

    The golden executor is specified for batch 1 and checks it; its kernels are batch-agnostic except
    constant Reshape targets. Whoever uses this copy must check it against ``executor.run_codes``.
    """
    import copy

    batched = copy.deepcopy(model)
    for op in batched.ops:
        shape = op.consts.get("input1") if op.op_type == "Reshape" else None
        if shape is not None and shape.size and shape[0] == 1 and -1 not in shape:
            op.consts["input1"] = np.concatenate([[-1], shape[1:]]).astype(shape.dtype)
    return batched


def _golden_chunk(model, feeds: dict[str, np.ndarray], batched: bool) -> np.ndarray:
    """Codes of the first output for one chunk: one batched run, or ``executor.run_codes`` per sample."""
    from compiler_core.quantization import executor

    output = model.outputs[0].name
    if batched:
        env = {spec.name: model.params(spec.name).quantize(feeds[spec.name]) for spec in model.inputs}
        return executor.execute(model, env)[output]
    count = len(next(iter(feeds.values())))
    return np.concatenate([executor.run_codes(model, {name: value[i:i + 1] for name, value in feeds.items()})[output]
                           for i in range(count)])


def golden_codes(model, feeds: dict[str, np.ndarray], *, chunk: int, batched: bool = False,
                 workers: int = 2) -> np.ndarray:
    """Golden-executor codes of the model's first output for every sample, chunks over ``workers`` processes.

    ``batched=False`` calls ``executor.run_codes`` sample by sample; ``batched=True`` runs each chunk
    at once through :func:`batch_program` (check it against the per-sample run on a subset).
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    count = len(next(iter(feeds.values())))
    program = batch_program(model) if batched else model
    chunks = [{name: value[start:start + chunk] for name, value in feeds.items()} for start in range(0, count, chunk)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return np.concatenate(list(pool.map(_golden_chunk, [program] * len(chunks), chunks,
                                            [batched] * len(chunks))))
