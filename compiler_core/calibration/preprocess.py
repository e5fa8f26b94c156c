"""Image preprocessing for calibration: decode with Pillow, then the pipeline ops in order.

Every op is an entry of :data:`PIPELINE_OPS` keyed by its ``op`` tag, holding how it transforms the
pixels and how it changes the image size (so sizes can be checked before any image is decoded).
While no op has produced floating-point values the pixels stay a Pillow image, so resizing works on
uint8 pixels exactly like torchvision's PIL path; after ``normalize`` they are a float64 HWC array.
``layout`` only records the target order; the transpose happens once, at the end.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from PIL import ExifTags, Image

from compiler_core.config import (
    CenterCropOp,
    ColorConvertOp,
    LayoutOp,
    LetterboxOp,
    NormalizeOp,
    PreprocessOp,
    ResizeOp,
)

logger = logging.getLogger(__name__)

IMAGE_FORMATS: dict[str, str] = {
    ".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".webp": "WebP", ".tif": "TIFF", ".tiff": "TIFF",
    ".gif": "GIF",
}
"""Image file suffixes (compared case-insensitively) and the format each names: the one registry of what is read as an
image. Animated GIF/WebP and multi-page TIFF files give their first frame."""

IMAGE_SUFFIXES = tuple(IMAGE_FORMATS)
"""File suffixes read as images (compared case-insensitively)."""

_FORMAT_NAMES = list(dict.fromkeys(IMAGE_FORMATS.values()))
IMAGE_FORMAT_NAMES = ", ".join(_FORMAT_NAMES[:-1]) + " or " + _FORMAT_NAMES[-1]
"""``JPEG, PNG, BMP, WebP, TIFF or GIF``: the image formats named in messages."""

Pixels = Image.Image | np.ndarray
Size = tuple[int, int]
"""(height, width) in pixels."""

_RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "nearest": Image.Resampling.NEAREST}
_GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}


@dataclass(frozen=True)
class PipelineState:
    """Pixels between two ops: a Pillow image (uint8 domain) or a float HWC array.

    Attributes:
        pixels: The image; arrays are always HWC, whatever ``order`` says.
        color: Current channel order of colour images, ``RGB`` or ``BGR``.
        order: Layout the final array is transposed to, ``HWC`` or ``CHW``.
    """

    pixels: Pixels
    color: str = "RGB"
    order: str = "HWC"

    @property
    def size(self) -> Size:
        """(height, width) of the current pixels."""
        if isinstance(self.pixels, Image.Image):
            return self.pixels.height, self.pixels.width
        return self.pixels.shape[0], self.pixels.shape[1]


@dataclass(frozen=True)
class OpKernel:
    """How one pipeline op transforms pixels (``apply``) and the image size (``output_size``)."""

    apply: Callable[[PreprocessOp, PipelineState], PipelineState]
    output_size: Callable[[PreprocessOp, Size], Size]


# ---------------------------------------------------------------- geometry on images and arrays


def _resize(pixels: Pixels, size: Size, mode: str) -> Pixels:
    height, width = size
    if isinstance(pixels, Image.Image):
        return pixels.resize((width, height), _RESAMPLE[mode])
    planes = [Image.fromarray(np.ascontiguousarray(pixels[..., c], dtype=np.float32))
              for c in range(pixels.shape[2])]
    resized = [np.asarray(p.resize((width, height), _RESAMPLE[mode]), dtype=np.float64) for p in planes]
    return np.stack(resized, axis=-1)


def _place(pixels: Pixels, canvas: Size, top: int, left: int, fill: float) -> Pixels:
    """Put ``pixels`` on a ``canvas``-sized background at (top, left); negative offsets crop."""
    height, width = canvas
    if isinstance(pixels, Image.Image):
        color = fill if pixels.mode == "L" else (int(fill),) * len(pixels.getbands())
        background = Image.new(pixels.mode, (width, height), color)
        background.paste(pixels, (left, top))
        return background
    out = np.full((height, width, pixels.shape[2]), fill, dtype=pixels.dtype)
    src_top, src_left = max(0, -top), max(0, -left)
    dst_top, dst_left = max(0, top), max(0, left)
    rows = min(pixels.shape[0] - src_top, height - dst_top)
    cols = min(pixels.shape[1] - src_left, width - dst_left)
    if rows > 0 and cols > 0:
        out[dst_top:dst_top + rows, dst_left:dst_left + cols] = \
            pixels[src_top:src_top + rows, src_left:src_left + cols]
    return out


def _as_float(pixels: Pixels) -> np.ndarray:
    array = np.asarray(pixels, dtype=np.float64)
    return array[..., None] if array.ndim == 2 else array


# ---------------------------------------------------------------- resize


def _resize_size(op: ResizeOp, size: Size) -> Size:
    if op.height is not None:
        return op.height, op.width
    if not op.keep_aspect:
        return op.size, op.size
    height, width = size
    if width <= height:  # torchvision Resize(int): short side to size, long side truncated
        return int(op.size * height / width), op.size
    return op.size, int(op.size * width / height)


def _apply_resize(op: ResizeOp, state: PipelineState) -> PipelineState:
    target = _resize_size(op, state.size)
    if target == state.size:
        return state
    return replace(state, pixels=_resize(state.pixels, target, op.mode))


# ---------------------------------------------------------------- centerCrop


def _crop_size(op: CenterCropOp, size: Size) -> Size:
    return op.height, op.width


def _apply_center_crop(op: CenterCropOp, state: PipelineState) -> PipelineState:
    height, width = state.size
    top = int(round((height - op.height) / 2.0))  # torchvision's rounding; outside pixels are 0
    left = int(round((width - op.width) / 2.0))
    return replace(state, pixels=_place(state.pixels, (op.height, op.width), -top, -left, 0))


# ---------------------------------------------------------------- letterbox


def letterbox_geometry(size: Size, canvas: Size) -> tuple[Size, int, int]:
    """Scaled size and (top, left) offset of an image of ``size`` letterboxed onto ``canvas``.

    Same rounding as the YOLO (ultralytics) letterbox: the ratio keeps the whole image visible and
    the padding is split in two, the extra pixel going to the bottom/right.
    """
    ratio = min(canvas[0] / size[0], canvas[1] / size[1])
    scaled = (int(round(size[0] * ratio)), int(round(size[1] * ratio)))
    top = int(round((canvas[0] - scaled[0]) / 2 - 0.1))
    left = int(round((canvas[1] - scaled[1]) / 2 - 0.1))
    return scaled, top, left


def _letterbox_size(op: LetterboxOp, size: Size) -> Size:
    return op.height, op.width


def _apply_letterbox(op: LetterboxOp, state: PipelineState) -> PipelineState:
    canvas = (op.height, op.width)
    scaled, top, left = letterbox_geometry(state.size, canvas)
    pixels = state.pixels if scaled == state.size else _resize(state.pixels, scaled, "bilinear")
    return replace(state, pixels=_place(pixels, canvas, top, left, op.pad_value))


# ---------------------------------------------------------------- colour, normalize, layout


def _same_size(op: PreprocessOp, size: Size) -> Size:
    return size


def _apply_color_convert(op: ColorConvertOp, state: PipelineState) -> PipelineState:
    if op.order == state.color:
        return state
    pixels = state.pixels
    if isinstance(pixels, Image.Image):
        if len(pixels.getbands()) >= 3:
            pixels = Image.merge(pixels.mode, pixels.split()[2::-1] + pixels.split()[3:])
    elif pixels.shape[2] >= 3:
        pixels = np.concatenate([pixels[..., 2::-1], pixels[..., 3:]], axis=-1)
    return replace(state, pixels=pixels, color=op.order)


def _apply_normalize(op: NormalizeOp, state: PipelineState) -> PipelineState:
    array = _as_float(state.pixels)
    mean = np.asarray(op.mean, dtype=np.float64)
    std = np.asarray(op.std, dtype=np.float64)
    return replace(state, pixels=(array * op.scale - mean) / std)


def _apply_layout(op: LayoutOp, state: PipelineState) -> PipelineState:
    return replace(state, order=op.order)


PIPELINE_OPS: dict[str, OpKernel] = {
    "resize": OpKernel(_apply_resize, _resize_size),
    "centerCrop": OpKernel(_apply_center_crop, _crop_size),
    "letterbox": OpKernel(_apply_letterbox, _letterbox_size),
    "colorConvert": OpKernel(_apply_color_convert, _same_size),
    "normalize": OpKernel(_apply_normalize, _same_size),
    "layout": OpKernel(_apply_layout, _same_size),
}
"""Implementation of every preprocessing op, keyed by its ``op`` tag."""


# ---------------------------------------------------------------- public helpers


def default_pipeline() -> list[PreprocessOp]:
    """The pipeline used for images that already have the model's size: pixels / 255, nothing else."""
    return [NormalizeOp(op="normalize", mean=[0.0], std=[1.0])]


def image_channels_of_mode(mode: str) -> int:
    """1 for gray Pillow modes, 3 for colour ones (alpha is dropped on decoding)."""
    return 1 if mode in _GRAY_MODES else 3


MAX_IMAGE_PIXELS = 64_000_000
"""Largest image decoded at full size (about 200 MB as RGB); a larger JPEG is decoded at 1/2, 1/4 or 1/8 of its
size (:func:`jpeg_reduction`), any other larger file is refused."""


def jpeg_reduction(image: Image.Image) -> int:
    """The JPEG DCT scale (1, 2, 4 or 8) that decodes ``image`` within :data:`MAX_IMAGE_PIXELS`; 0 when it is not a
    JPEG over the limit that a reduced decode can bring under it."""
    if image.width * image.height <= MAX_IMAGE_PIXELS:
        return 1
    if image.format != "JPEG":
        return 0
    return next((scale for scale in (2, 4, 8)
                 if -(-image.width // scale) * -(-image.height // scale) <= MAX_IMAGE_PIXELS), 0)


def reduce_jpeg(image: Image.Image) -> None:
    """Decode a JPEG over :data:`MAX_IMAGE_PIXELS` at the scale :func:`jpeg_reduction` gives (a 108-megapixel phone
    photo at 1/2: 54 megapixels); its ``size`` is then the reduced one. Nothing for other images."""
    scale = jpeg_reduction(image)
    if scale > 1:
        image.draft(image.mode, (-(-image.width // scale), -(-image.height // scale)))


ORIENTATION_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
"""The transpose that turns stored pixels upright, per EXIF orientation (``PIL.ImageOps.exif_transpose``'s table;
1 and invalid values: none)."""


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation tag of an opened image, read from its header without decoding the pixels (Pillow's own
    ``PngImageFile.getexif`` decodes the whole PNG first); 1 (upright) when it has none or an invalid one."""
    orientation = Image.Image.getexif(image).get(ExifTags.Base.Orientation, 1)
    return orientation if orientation in ORIENTATION_TRANSPOSE else 1


def upright_size(image: Image.Image) -> Size:
    """(height, width) of the image as it is shown, after its EXIF orientation: a phone photo held upright is stored
    sideways with orientation 6 or 8."""
    if exif_orientation(image) in (5, 6, 7, 8):  # turned by 90 or 270 degrees
        return image.width, image.height
    return image.height, image.width


def decode_image(path: str | os.PathLike, channels: int) -> Image.Image:
    """Read an image as ``L`` (``channels`` 1) or ``RGB`` (3), converting gray <-> colour as needed; the pixels are
    turned upright by the EXIF orientation (as viewers and ``PIL.ImageOps.exif_transpose`` show them), a 16-bit gray
    image is scaled to 8 bits (its top byte), a JPEG over :data:`MAX_IMAGE_PIXELS` decoded at a reduced scale;
    alpha is dropped (the colour under it is kept, as ``convert("RGB")`` does) and an animated file gives its first
    frame."""
    with Image.open(path) as image:
        reduce_jpeg(image)
        orientation = exif_orientation(image)
        if orientation != 1:
            image = image.transpose(ORIENTATION_TRANSPOSE[orientation])
        if image.mode in _WIDE_GRAY_MODES:
            image = _top_byte(image)
        return image.convert("L" if channels == 1 else "RGB")


_WIDE_GRAY_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N"})
"""Pillow's modes of 16-bit gray PNGs ("I" in older Pillow): its own ``convert("L")`` clips them at 255, so a 16-bit
photo came out almost white."""


def _top_byte(image: Image.Image) -> Image.Image:
    array = np.asarray(image).astype(np.int64)
    return Image.fromarray(np.clip(array >> 8, 0, 255).astype(np.uint8), "L")


def run_pipeline(image: Image.Image, pipeline: Sequence[PreprocessOp]) -> np.ndarray:
    """Run ``pipeline`` on a decoded image; returns float32 ``HWC`` (or ``CHW`` after a layout op)."""
    state = PipelineState(image)
    for op in pipeline:
        state = PIPELINE_OPS[op.op].apply(op, state)
    array = _as_float(state.pixels).astype(np.float32)
    return np.ascontiguousarray(array.transpose(2, 0, 1)) if state.order == "CHW" else array


def preprocess_image(path: str | os.PathLike, pipeline: Sequence[PreprocessOp], channels: int) -> np.ndarray:
    """Decode ``path`` with ``channels`` channels and run ``pipeline`` on it (see :func:`run_pipeline`)."""
    return run_pipeline(decode_image(path, channels), pipeline)


def pipeline_output_size(pipeline: Sequence[PreprocessOp], size: Size) -> Size:
    """(height, width) the pipeline turns an image of ``size`` into, without decoding it."""
    for op in pipeline:
        size = PIPELINE_OPS[op.op].output_size(op, size)
    return size


def pipeline_order(pipeline: Sequence[PreprocessOp]) -> str:
    """Layout of the pipeline's output: the last ``layout`` op's order, else ``HWC``."""
    orders = [op.order for op in pipeline if isinstance(op, LayoutOp)]
    return orders[-1] if orders else "HWC"


def normalize_channel_counts(pipeline: Sequence[PreprocessOp]) -> set[int]:
    """Lengths of the mean/std lists of every normalize op (1 broadcasts to every channel)."""
    return {len(op.mean) for op in pipeline if isinstance(op, NormalizeOp)}
