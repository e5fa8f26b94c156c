"""Checks of calibration files against the model inputs, done before any inference.

Every check looks at all files first and then raises one :class:`CalibrationError` that names the
offending files (up to :data:`MAX_LISTED_FILES`, then "and N more") and says what to do.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from tokenize import TokenError

import numpy as np
from PIL import Image

from compiler_core.calibration.preprocess import (
    IMAGE_FORMAT_NAMES,
    MAX_IMAGE_PIXELS,
    exif_orientation,
    image_channels_of_mode,
    jpeg_reduction,
    normalize_channel_counts,
    pipeline_order,
    pipeline_output_size,
    reduce_jpeg,
    upright_size,
)
from compiler_core.calibration.specs import InputSpec
from compiler_core.config import PreprocessOp
from compiler_core.errors import CalibrationError
from compiler_core.progress import Reporter

logger = logging.getLogger(__name__)

MAX_LISTED_FILES = 5
"""How many file names one message spells out; the rest are counted."""

_TO_MODEL_LAYOUT = {("HWC", "NCHW"): (2, 0, 1), ("CHW", "NHWC"): (1, 2, 0)}


def name_files(paths: Sequence[Path | str], limit: int = MAX_LISTED_FILES) -> str:
    """``a.png, b.png and 3 more``: the first ``limit`` file names, then a count."""
    names = [Path(p).name for p in paths[:limit]]
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(names) + more


def files_error(message: str, paths: Sequence[Path | str], hint: str, **fields) -> CalibrationError:
    """A CalibrationError whose ``file`` is the first offender and ``files`` lists them all."""
    return CalibrationError(message, hint=hint, file=str(paths[0]) if paths else None,
                            files=[str(p) for p in paths], **fields)


def refuse_broken_links(paths: Sequence[Path], suffixes: Sequence[str]) -> None:
    """Refuse links among ``paths`` with one of ``suffixes`` whose target is missing: left out, they would shrink
    the data without a word.

    Raises:
        CalibrationError: naming every such link.
    """
    broken = [p for p in paths if p.suffix.lower() in suffixes and p.is_symlink() and not p.exists()]
    if broken:
        raise files_error(f"{len(broken)} file(s) in '{broken[0].parent}' are links to files that do not exist: "
                          f"{name_files(broken)}.",
                          broken, "Restore the files they point to or remove the links.")


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


# ---------------------------------------------------------------- .npy files


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a ``.npy`` file, read from its header only.

    The header must describe exactly the bytes that follow it, so a header claiming a huge shape
    is refused before anything is allocated for it.

    Raises:
        ValueError: not a .npy file, a damaged header, a header that does not match the file size,
            or it holds Python objects.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as handle:
        try:
            version = np.lib.format.read_magic(handle)
            # version 3.0 only allows a UTF-8 header; its layout is version 2.0's
            reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0,
                      (3, 0): np.lib.format.read_array_header_2_0}.get(version)
            if reader is None:
                raise ValueError(f"unsupported .npy format version {version}")
            shape, _, dtype = reader(handle)
        except (SyntaxError, TokenError, TypeError, MemoryError, RecursionError) as error:  # from the header's literal
            raise ValueError(f"the .npy header is damaged ({type(error).__name__})") from error
        data_start = handle.tell()
    if dtype.hasobject:
        raise ValueError("it holds Python objects (saved with allow_pickle)")
    expected = data_start + math.prod(shape) * dtype.itemsize
    actual = path.stat().st_size
    if expected != actual:
        raise ValueError(f"its header describes a {list(shape)} {dtype} array ({expected} bytes with the header), "
                         f"but the file has {actual} bytes")
    return tuple(shape), dtype


def npy_axes(shape: tuple[int, ...], spec: InputSpec, auto_convert: bool) -> tuple[int, ...] | None | bool:
    """How a file of ``shape`` feeds ``spec``: ``None`` as it is, axes to transpose, ``False`` not at all.

    Accepted: the input shape, the input shape without its batch dimension of 1, and (with
    ``auto_convert``) the HWC version of an NCHW input or the CHW version of an NHWC one.
    """
    if shape == spec.shape or (spec.shape[:1] == (1,) and shape == spec.shape[1:]):
        return None
    if not auto_convert or len(spec.shape) != 4 or spec.shape[0] != 1:
        return False
    batchless = spec.shape[1:]
    swapped = {"NCHW": (batchless[1], batchless[2], batchless[0]),
               "NHWC": (batchless[2], batchless[0], batchless[1])}.get(spec.layout)
    if swapped is not None and shape in (swapped, (1, *swapped)):
        return (2, 0, 1) if spec.layout == "NCHW" else (1, 2, 0)
    return False


def accepted_shapes(spec: InputSpec, auto_convert: bool) -> str:
    """Human-readable list of the shapes :func:`npy_axes` accepts for ``spec``."""
    shapes = [_shape_text(spec.shape)]
    if spec.shape[:1] == (1,):
        shapes.append(_shape_text(spec.shape[1:]))
    if auto_convert and len(spec.shape) == 4 and spec.shape[0] == 1 and spec.layout in ("NCHW", "NHWC"):
        other = "HWC" if spec.layout == "NCHW" else "CHW"
        height, width = spec.spatial_size
        swapped = (height, width, spec.channels) if other == "HWC" else (spec.channels, height, width)
        shapes.append(f"{other} {_shape_text(swapped)}")
    return " or ".join(shapes)


def check_npy_files(paths: Sequence[Path], spec: InputSpec, auto_convert: bool,
                    reporter: Reporter) -> list[tuple[int, ...] | None]:
    """Check every ``.npy`` feeding ``spec``; returns the transpose axes per file (None = as is).

    Raises:
        CalibrationError: unreadable files, wrong shapes or dtypes that cannot be cast without loss.
    """
    unreadable: dict[Path, str] = {}
    bad_shapes: dict[tuple[int, ...], list[Path]] = defaultdict(list)
    bad_dtypes: dict[np.dtype, list[Path]] = defaultdict(list)
    axes: list[tuple[int, ...] | None] = []
    codes = 0  # files holding a quantized source input's integer codes
    for path in paths:
        reporter.advance()
        try:
            shape, dtype = npy_header(path)
        except (OSError, ValueError) as error:
            unreadable[path] = str(error).rstrip(".")
            continue
        fit = npy_axes(shape, spec, auto_convert)
        if fit is False:
            bad_shapes[shape].append(path)
        if spec.codes is not None and dtype.name == spec.codes[0]:
            codes += 1
        elif not np.can_cast(dtype, spec.dtype, casting="same_kind"):
            bad_dtypes[dtype].append(path)
        axes.append(None if fit is False else fit)
    raise_unreadable(unreadable, "as .npy arrays", "Save each sample with numpy.save(path, array).")
    _raise_bad_npy_shapes(bad_shapes, spec, auto_convert)
    _raise_bad_npy_dtypes(bad_dtypes, spec)
    _note_transposed(paths, axes, spec)
    if spec.codes is not None and codes:
        dtype, scale, zero_point = spec.codes
        logger.warning("%d %s .npy file(s) for input '%s' are read as the source model's %s codes: value = (q %s %d) "
                       "* %.6g (the compiled model takes the values)", codes, dtype, spec.name, dtype,
                       "-" if zero_point >= 0 else "+", abs(zero_point), scale)
    return axes


def raise_unreadable(unreadable: dict[Path, str], what: str, hint: str) -> None:
    """One error naming every file that cannot be read ``what`` (e.g. "as images") with its reason; nothing when
    ``unreadable`` is empty."""
    if not unreadable:
        return
    paths = list(unreadable)
    reasons = "; ".join(f"{p.name}: {unreadable[p]}" for p in paths[:MAX_LISTED_FILES])
    more = f"; and {len(paths) - MAX_LISTED_FILES} more" if len(paths) > MAX_LISTED_FILES else ""
    raise files_error(f"{len(paths)} calibration file(s) cannot be read {what}: {reasons}{more}.", paths, hint)


def _grouped(bad: dict, label) -> tuple[str, list[Path]]:
    """``"<label> in a.npy, b.npy; <label> in ..."`` and every offending path."""
    text = "; ".join(f"{label(key)} in {name_files(paths)}" for key, paths in bad.items())
    return text, [path for group in bad.values() for path in group]


def _raise_bad_npy_shapes(bad: dict[tuple[int, ...], list[Path]], spec: InputSpec, auto_convert: bool) -> None:
    if not bad:
        return
    groups, paths = _grouped(bad, lambda shape: f"got {_shape_text(shape)}")
    raise files_error(
        f"{len(paths)} .npy file(s) do not fit model input '{spec.name}': expected shape "
        f"{accepted_shapes(spec, auto_convert)}; {groups}.", paths,
        "Save one sample per file with the model's input shape (the batch dimension may be left out).")


def _raise_bad_npy_dtypes(bad: dict[np.dtype, list[Path]], spec: InputSpec) -> None:
    if not bad:
        return
    groups, paths = _grouped(bad, lambda dtype: dtype.name)
    raise files_error(
        f"{len(paths)} .npy file(s) cannot be cast to {spec.dtype.name} for model input '{spec.name}' "
        f"without loss: {groups}.", paths, f"Save the arrays as {spec.dtype.name}.")


def _note_transposed(paths: Sequence[Path], axes: Sequence[tuple[int, ...] | None], spec: InputSpec) -> None:
    count = sum(a is not None for a in axes)
    if count:
        logger.info("Transposing %d .npy file(s) (e.g. %s) to %s for model input '%s'.",
                    count, name_files([p for p, a in zip(paths, axes) if a is not None], 1), spec.layout, spec.name)


# ---------------------------------------------------------------- images


@dataclass(frozen=True)
class ImageInfo:
    """What the header of an image says: ``size`` is (height, width) as shown (after the EXIF orientation),
    ``turned`` whether the EXIF orientation turns or flips the stored pixels, ``frames`` how many frames or pages the
    file holds (the first is read)."""

    path: Path
    size: tuple[int, int]
    channels: int
    turned: bool = False
    frames: int = 1


@dataclass(frozen=True)
class ImagePlan:
    """How images feed one input: the ops, the decode channels and the final transpose (None = none)."""

    pipeline: tuple[PreprocessOp, ...]
    channels: int
    axes: tuple[int, ...] | None
    converted: int = 0


def _decode_reduced(image: Image.Image) -> None:
    image.draft(image.mode, (1, 1))  # DCT scaling: the whole stream is read, 1/8 of the pixels made
    image.load()


def _verify(image: Image.Image) -> None:
    image.verify()  # every chunk's CRC: catches truncated and damaged PNGs without inflating them


QUICK_CHECKS = {"JPEG": _decode_reduced, "PNG": _verify}
"""Cheap integrity check per Pillow format (others are decoded fully); about 1 ms per photo."""


def probe_image(path: Path) -> ImageInfo:
    """Read an image's size and mode and check that the whole file is intact.

    Raises:
        OSError: Pillow cannot identify or decode the file (the message is Pillow's reason).
        SyntaxError: Pillow found a damaged PNG chunk.
    """
    with Image.open(path) as image:
        if not jpeg_reduction(image):  # read from the header: refused before decoding
            raise ValueError(f"it is {image.width}x{image.height} pixels, more than the "
                             f"{MAX_IMAGE_PIXELS // 1_000_000} megapixel limit (only a JPEG is read at a reduced "
                             "scale): re-save it smaller")
        reduce_jpeg(image)  # the size the pipeline will see, as decode_image reads it
        info = ImageInfo(path, upright_size(image), image_channels_of_mode(image.mode), exif_orientation(image) != 1,
                         getattr(image, "n_frames", 1))
        QUICK_CHECKS.get(image.format, Image.Image.load)(image)
    return info


def probe_images(paths: Sequence[Path], reporter: Reporter) -> list[ImageInfo]:
    """:func:`probe_image` every path.

    Raises:
        CalibrationError: files Pillow cannot read, each named with Pillow's reason.
    """
    infos, unreadable = [], {}
    for path in paths:
        reporter.advance()
        try:
            infos.append(probe_image(path))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
            unreadable[path] = str(error).rstrip(".") or type(error).__name__
    raise_unreadable(unreadable, "as images", f"Remove or re-save these files; only real {IMAGE_FORMAT_NAMES} "
                                               "images may be in the folder.")
    return infos


def plan_images(infos: Sequence[ImageInfo], spec: InputSpec, pipeline: Sequence[PreprocessOp], *,
                image_channels: int, auto_convert: bool, default: bool) -> ImagePlan:
    """Check that ``pipeline`` turns every image into exactly ``spec``'s shape; return how to load them.

    Args:
        infos: Probed images feeding ``spec``.
        spec: The model input.
        pipeline: The effective pipeline.
        image_channels: 0 (the model's channels), 1 or 3.
        auto_convert: Whether gray <-> RGB and HWC <-> CHW conversions are allowed.
        default: Whether ``pipeline`` is the default one (changes the hints).

    Raises:
        CalibrationError: the input takes no images, the channels or sizes do not fit.
    """
    channels = _target_channels(spec, image_channels)
    _check_normalize_channels(pipeline, channels)
    converted = [info.path for info in infos if info.channels != channels]
    if converted and not (auto_convert or image_channels):
        _raise_channels(infos, spec, channels)
    _check_sizes(infos, spec, pipeline, default)
    axes = _layout_axes(pipeline, spec, auto_convert)
    if converted:
        logger.info("Converting %d image(s) (e.g. %s) to %s for model input '%s'.", len(converted),
                    name_files(converted, 1), "gray" if channels == 1 else "RGB", spec.name)
    return ImagePlan(tuple(pipeline), channels, axes, len(converted))


def _target_channels(spec: InputSpec, image_channels: int) -> int:
    if not spec.is_image:
        raise CalibrationError(
            f"Model input '{spec.name}' has shape {_shape_text(spec.shape)}, which images cannot feed "
            "(it needs a 4-D NCHW/NHWC input with 1 or 3 channels).",
            hint="Give the samples as .npy files instead.")
    if image_channels and image_channels != spec.channels:
        raise CalibrationError(
            f"image_channels is {image_channels} but model input '{spec.name}' has {spec.channels} channels.",
            hint="Set image_channels to 0 (use the model's channels) or to the model's channel count.")
    return spec.channels


def _check_normalize_channels(pipeline: Sequence[PreprocessOp], channels: int) -> None:
    wrong = sorted(n for n in normalize_channel_counts(pipeline) if n not in (1, channels))
    if wrong:
        raise CalibrationError(
            f"A normalize op has {wrong[0]} mean/std values but the images have {channels} channel(s).",
            hint="Give one value for mean and std." if channels == 1
            else f"Give 1 or {channels} values for mean and std.")


def _raise_channels(infos: Sequence[ImageInfo], spec: InputSpec, channels: int) -> None:
    wrong = [info.path for info in infos if info.channels != channels]
    kind = "colour" if channels == 1 else "gray"
    raise files_error(
        f"{len(wrong)} image(s) are {kind} but model input '{spec.name}' takes {channels} channel(s): "
        f"{name_files(wrong)}.", wrong,
        "Set preprocessing.autoConvertFormat to true or image_channels to convert them, or re-save the images.")


def _check_sizes(infos: Sequence[ImageInfo], spec: InputSpec, pipeline: Sequence[PreprocessOp],
                 default: bool) -> None:
    by_output: dict[tuple[int, int], list[ImageInfo]] = defaultdict(list)
    for info in infos:
        by_output[pipeline_output_size(pipeline, info.size)].append(info)
    if len(by_output) > 1:
        _raise_mixed_sizes(infos, spec, default)
    output, group = next(iter(by_output.items()))
    if output != spec.spatial_size:
        _raise_wrong_size(output, group, spec, default)


MIXED_SIZES_LISTED = 3
"""Sizes named in a mixed-sizes message (the most common first); ``files`` lists every image."""


def _size_text(size: tuple[int, int]) -> str:
    return f"{size[1]}x{size[0]}"


def _resize_hint(spec: InputSpec) -> str:
    height, width = spec.spatial_size
    return (f'Add a resize step to preprocessing.pipeline, e.g. {{"op": "resize", "height": {height}, '
            f'"width": {width}}} (or letterbox / centerCrop), and set preprocessing.apply to true.')


def _raise_mixed_sizes(infos: Sequence[ImageInfo], spec: InputSpec, default: bool) -> None:
    by_size: dict[tuple[int, int], list[Path]] = defaultdict(list)
    for info in infos:
        by_size[info.size].append(info.path)
    ranked = sorted(by_size.items(), key=lambda item: (-len(item[1]), item[0]))
    groups = "; ".join(f"{_size_text(size)} ({len(paths)}: {name_files(paths, limit=2)})"
                       for size, paths in ranked[:MIXED_SIZES_LISTED])
    if len(ranked) > MIXED_SIZES_LISTED:
        groups += f"; and {len(ranked) - MIXED_SIZES_LISTED} more size(s)"
    what = "no preprocessing pipeline is given" if default else "the preprocessing does not bring them to one size"
    paths = [p for _, group in ranked for p in group]
    raise files_error(f"The images have {len(by_size)} different sizes (width x height) and {what}; "
                      f"model input '{spec.name}' takes {_size_text(spec.spatial_size)}: {groups}.", paths,
                      _resize_hint(spec), resize_to=list(spec.spatial_size))


def _raise_wrong_size(output: tuple[int, int], group: Sequence[ImageInfo], spec: InputSpec, default: bool) -> None:
    paths = [info.path for info in group]
    after = "" if default else " after preprocessing"
    raise files_error(
        f"The images are {_size_text(output)}{after} but model input '{spec.name}' takes "
        f"{_size_text(spec.spatial_size)} (width x height): {name_files(paths)}.", paths, _resize_hint(spec),
        resize_to=list(spec.spatial_size))


def _layout_axes(pipeline: Sequence[PreprocessOp], spec: InputSpec, auto_convert: bool) -> tuple[int, ...] | None:
    order = pipeline_order(pipeline)
    if order == spec.layout[1:]:
        return None
    if not auto_convert:
        raise CalibrationError(
            f"The preprocessing produces {order} images but model input '{spec.name}' is {spec.layout}.",
            hint=f'Add {{"op": "layout", "order": "{spec.layout[1:]}"}} to preprocessing.pipeline or set '
                 "preprocessing.autoConvertFormat to true.")
    logger.debug("Transposing %s images to %s for model input '%s'.", order, spec.layout, spec.name)
    return _TO_MODEL_LAYOUT[(order, spec.layout)]
