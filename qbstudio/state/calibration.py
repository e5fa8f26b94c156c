"""Calibration preprocessing as an editable form, preset pipelines, and checks of previewed samples."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compiler_core.calibration import InputSpec
from compiler_core.calibration.readers import MIN_RECOMMENDED_SAMPLES
from compiler_core.config import PRESETS, PreprocessingConfig

logger = logging.getLogger(__name__)

NO_PRESET = "none"
NORMALIZED_RANGE = (-3.0, 3.0)
PIXEL_RANGE = (0.0, 255.0)
_FAR_FACTOR = 1.0


@dataclass
class PreprocessForm:
    """The preprocessing pipeline as the calibration panel edits it, in a fixed, conventional order.

    Order: colour order, resize, centre crop, letterbox, normalize, layout. Every pipeline the
    presets and the vendor ``make_calib`` YAML produce fits this order.
    """

    apply: bool = False
    color_order: str = ""
    resize: bool = False
    keep_aspect: bool = True
    resize_size: int = 256
    resize_height: int = 224
    resize_width: int = 224
    resize_mode: str = "bilinear"
    crop: bool = False
    crop_height: int = 224
    crop_width: int = 224
    letterbox: bool = False
    letterbox_height: int = 640
    letterbox_width: int = 640
    pad_value: int = 114
    normalize: bool = False
    mean: list[float] = field(default_factory=lambda: [0.0])
    std: list[float] = field(default_factory=lambda: [1.0])
    scale: float = 1 / 255
    fuse: bool = False
    layout: str = ""

    def to_preprocessing(self) -> dict[str, Any]:
        """The camelCase ``preprocessing`` section (validated by the core's model)."""
        ops = [op for op in (self._color(), self._resize(), self._crop(), self._letterbox(), self._normalize(),
                             self._layout()) if op]
        data = {"apply": self.apply, "autoConvertFormat": True, "pipeline": ops}
        return PreprocessingConfig.model_validate(data).model_dump(mode="json", by_alias=True)

    def _color(self) -> dict[str, Any] | None:
        return {"op": "colorConvert", "order": self.color_order} if self.color_order else None

    def _resize(self) -> dict[str, Any] | None:
        if not self.resize:
            return None
        if self.keep_aspect:
            return {"op": "resize", "size": self.resize_size, "keepAspect": True, "mode": self.resize_mode}
        return {"op": "resize", "height": self.resize_height, "width": self.resize_width, "mode": self.resize_mode}

    def _crop(self) -> dict[str, Any] | None:
        return {"op": "centerCrop", "height": self.crop_height, "width": self.crop_width} if self.crop else None

    def _letterbox(self) -> dict[str, Any] | None:
        if not self.letterbox:
            return None
        return {"op": "letterbox", "height": self.letterbox_height, "width": self.letterbox_width,
                "padValue": self.pad_value}

    def _normalize(self) -> dict[str, Any] | None:
        if not self.normalize:
            return None
        return {"op": "normalize", "mean": list(self.mean), "std": list(self.std), "scale": self.scale,
                "fuseIntoFirstLayer": self.fuse}

    def _layout(self) -> dict[str, Any] | None:
        return {"op": "layout", "order": self.layout} if self.layout else None

    @classmethod
    def from_preprocessing(cls, data: dict[str, Any]) -> PreprocessForm:
        """Fill a form from a ``preprocessing`` section (ops out of the usual order keep their values)."""
        config = PreprocessingConfig.model_validate(data or {})
        form = cls(apply=config.apply)
        for op in config.pipeline:
            _READ_OP[op.op](form, op)
        return form

    def expected_range(self, uint8_input: bool) -> tuple[float, float]:
        """The value range the model's first layer saw in FP32 training, roughly.

        A float model is trained on normalized inputs (about [-3, 3]; [0, 1] lies inside); a model
        taking uint8 input, or with the normalization fused into its first layer, sees pixels 0-255.
        """
        if uint8_input or (self.apply and self.normalize and self.fuse):
            return PIXEL_RANGE
        return NORMALIZED_RANGE


def _read_color(form: PreprocessForm, op: Any) -> None:
    form.color_order = op.order


def _read_resize(form: PreprocessForm, op: Any) -> None:
    form.resize, form.resize_mode = True, op.mode
    form.keep_aspect = op.size is not None and op.keep_aspect
    if op.size is not None:
        form.resize_size = op.size
        form.resize_height = form.resize_width = op.size
    else:
        form.resize_height, form.resize_width = op.height, op.width


def _read_crop(form: PreprocessForm, op: Any) -> None:
    form.crop, form.crop_height, form.crop_width = True, op.height, op.width


def _read_letterbox(form: PreprocessForm, op: Any) -> None:
    form.letterbox, form.letterbox_height, form.letterbox_width = True, op.height, op.width
    form.pad_value = op.pad_value


def _read_normalize(form: PreprocessForm, op: Any) -> None:
    form.normalize, form.mean, form.std = True, list(op.mean), list(op.std)
    form.scale, form.fuse = op.scale, op.fuse_into_first_layer


def _read_layout(form: PreprocessForm, op: Any) -> None:
    form.layout = op.order


_READ_OP = {"colorConvert": _read_color, "resize": _read_resize, "centerCrop": _read_crop,
            "letterbox": _read_letterbox, "normalize": _read_normalize, "layout": _read_layout}


def pipeline_presets() -> dict[str, str]:
    """Preset name -> description: ``none`` and every core preset that carries preprocessing."""
    found = {name: preset.description for name, preset in PRESETS.items() if "preprocessing" in preset.config}
    return {NO_PRESET: "No preprocessing: images are only scaled to 0-1.", **found}


PRESET_LABELS = {NO_PRESET: "None (scale to 0-1)", "classification_torchvision": "ImageNet (torchvision)",
                 "yolo_640": "YOLO 640", "yolo_1280": "YOLO 1280"}
"""Friendly names of the pipeline presets (others show their registry name)."""


def matching_preset(preprocessing: dict[str, Any]) -> str | None:
    """The pipeline preset whose pipeline equals ``preprocessing``'s, or None for a custom one."""
    current = PreprocessForm.from_preprocessing(preprocessing)
    for name in pipeline_presets():
        if PreprocessForm.from_preprocessing(pipeline_preset(name)[0]) == current:
            return name
    return None


def pipeline_preset(name: str) -> tuple[dict[str, Any], bool]:
    """The ``preprocessing`` section of preset ``name`` and whether it asks for uint8 input.

    Raises:
        KeyError: unknown preset name.
    """
    if name == NO_PRESET:
        return PreprocessForm().to_preprocessing(), False
    config = PRESETS[name].config
    return dict(config["preprocessing"]), bool(config.get("uint8Input", {}).get("apply", False))


# ---------------------------------------------------------------- sample checks


@dataclass(frozen=True)
class SampleStats:
    """Per-channel statistics of one input of one sample.

    Attributes:
        index: Sample index in the dataset.
        source: The file(s) it came from.
        minimum: Per-channel minimum.
        maximum: Per-channel maximum.
        mean: Per-channel mean.
        input_name: The model input the sample feeds.
        per_channel: Whether the values are per image channel (False: one range for the whole tensor).
    """

    index: int
    source: str
    minimum: tuple[float, ...]
    maximum: tuple[float, ...]
    mean: tuple[float, ...]
    input_name: str = ""
    per_channel: bool = True

    @property
    def constant(self) -> bool:
        """Whether every value of the sample is the same."""
        return min(self.minimum) == max(self.maximum)

    def describe(self) -> str:
        """``c0 [min, max] mean ...`` on one line (``[min, max] mean`` for a tensor without image channels)."""
        if len(self.minimum) == 1 and not self.per_channel:
            return f"[{self.minimum[0]:.3g}, {self.maximum[0]:.3g}] μ {self.mean[0]:.3g}"
        return "  ".join(f"c{c}: [{lo:.3g}, {hi:.3g}] μ {mu:.3g}"
                         for c, (lo, hi, mu) in enumerate(zip(self.minimum, self.maximum, self.mean)))


def channel_axis(spec: InputSpec) -> int | None:
    """Axis of the channels of a sample for ``spec`` (None for inputs that are not images: a [1, 128, 19, 1] state
    tensor is not 128 colour planes)."""
    return {"NCHW": 1, "NHWC": 3}.get(spec.layout) if spec.is_image else None


def sample_stats(index: int, source: str, array: np.ndarray, spec: InputSpec) -> SampleStats:
    """Per-channel min/max/mean of ``array`` (one input of one sample)."""
    values = np.asarray(array, dtype=np.float64)
    axis = channel_axis(spec)
    planes = [values] if axis is None else [np.take(values, c, axis=axis) for c in range(values.shape[axis])]
    return SampleStats(index, source, tuple(float(p.min()) for p in planes), tuple(float(p.max()) for p in planes),
                       tuple(float(p.mean()) for p in planes), spec.name, axis is not None)


def display_image(array: np.ndarray, spec: InputSpec) -> np.ndarray | None:
    """A uint8 HxWx(1|3) picture of an image sample, stretched to its own min-max (None for non-images)."""
    axis = channel_axis(spec)
    if axis is None:
        return None
    image = np.asarray(array, dtype=np.float64)[0]
    image = np.moveaxis(image, 0, -1) if axis == 1 else image
    low, high = float(image.min()), float(image.max())
    scaled = (image - low) / (high - low) if high > low else np.zeros_like(image)
    return np.ascontiguousarray(np.clip(scaled * 255 + 0.5, 0, 255).astype(np.uint8))


def review_samples(stats: list[SampleStats], total: int, spec: InputSpec, form: PreprocessForm, *,
                   uint8_input: bool = False) -> list[str]:
    """Likely mistakes in previewed calibration data, as user-facing sentences (empty if none).

    Checks: too few samples; constant or all-zero samples; values far outside the range the model's
    first layer saw in FP32 training (about [-3, 3] when normalized, [0, 1] or [0, 255] otherwise);
    a normalize with a channel count the input does not have.
    """
    warnings = []
    if total < MIN_RECOMMENDED_SAMPLES:
        warnings.append(f"Only {total} calibration sample(s): use {MIN_RECOMMENDED_SAMPLES} or more "
                        f"(typically 100-128) for steady ranges.")
    warnings += [_constant_message(item) for item in stats if item.constant]
    if spec.is_image:
        warnings += _range_warnings(stats, form.expected_range(uint8_input))
    warnings += _channel_warnings(spec, form)
    return warnings


def _constant_message(item: SampleStats) -> str:
    value = item.minimum[0]
    kind = "all zeros" if value == 0 else f"constant ({value:.3g} everywhere)"
    return f"Sample {item.index} ({item.source}) is {kind}: it carries no information for calibration."


def _range_warnings(stats: list[SampleStats], expected: tuple[float, float]) -> list[str]:
    if not stats:
        return []
    low, high = min(min(s.minimum) for s in stats), max(max(s.maximum) for s in stats)
    span = expected[1] - expected[0]
    far = low < expected[0] - _FAR_FACTOR * span or high > expected[1] + _FAR_FACTOR * span
    if not far:
        return []
    span_text = f"Values span [{low:.3g}, {high:.3g}], far outside the [{expected[0]:g}, {expected[1]:g}]"
    if all(Path(s.source).suffix.lower() == ".npy" for s in stats):  # the pipeline is for images only
        return [f"{span_text} a float image model usually takes. The .npy files are fed as they are (the pipeline "
                f"does not apply to them): check they hold the model's input preprocessed as in training."]
    return [f"{span_text} expected after this pipeline: check normalize (mean/std/scale) and whether the data is "
            f"already preprocessed."]


def _channel_warnings(spec: InputSpec, form: PreprocessForm) -> list[str]:
    channels = spec.channels
    if not (form.apply and form.normalize) or not channels:
        return []
    counts = {len(form.mean), len(form.std)}
    if counts <= {1, channels}:
        return []
    return [f"normalize has {len(form.mean)} mean and {len(form.std)} std values, but input '{spec.name}' "
            f"has {channels} channel(s)."]

