"""make_calib and make_calib_man: turn a folder of raw images into preprocessed .npy samples + a .txt list.

Both write ``save_dir/save_name/000000.npy ...`` (one sample each, no batch dimension) and
``save_dir/save_name.txt`` (their absolute paths, one per line), which ``open_calibration_data``
reads back. The samples are written into a hidden temporary folder that is renamed into place only
when all of them succeeded, so an error or a cancel leaves nothing behind.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from compiler_core.calibration.preprocess import IMAGE_SUFFIXES, pipeline_output_size, preprocess_image
from compiler_core.calibration.validate import files_error, name_files, probe_images
from compiler_core.config import PreprocessingConfig, PreprocessOp
from compiler_core.config.files import read_mapping
from compiler_core.config.messages import config_error_from_validation
from compiler_core.errors import (
    ArgumentError,
    CalibrationError,
    ConfigError,
    OutputWriteError,
    QBCompilerError,
)
from compiler_core.fileio import atomic_write_text
from compiler_core.progress import ProgressCallback, Reporter, as_reporter

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
_VENDOR_KEYS = ("Pre-Order", "GetImage", "Pre-processing")


# ---------------------------------------------------------------- vendor YAML -> pipeline


def _vendor_size(value: Any, what: str) -> dict[str, int]:
    if isinstance(value, int):
        return {"height": value, "width": value}
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return {"height": int(value[0]), "width": int(value[1])}
    raise ConfigError(f"{what}: size must be a number or [height, width], got {value!r}.", hint=_VENDOR_HINT)


def _vendor_resize_torch(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    mode = params.get("interpolation", "bilinear")
    if mode not in ("bilinear", "nearest"):
        raise ConfigError(f"ResizeTorch: interpolation '{mode}' is not supported.",
                          hint="Use bilinear or nearest.")
    size = params.get("size")
    if isinstance(size, int):  # torchvision Resize(int): the short side
        return [{"op": "resize", "size": size, "keepAspect": True, "mode": mode}]
    return [{"op": "resize", **_vendor_size(size, "ResizeTorch"), "mode": mode}]


def _vendor_center_crop(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"op": "centerCrop", **_vendor_size(params.get("size"), "CenterCrop")}]


def _vendor_normalize(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    style = params.get("style")
    if style not in (None, "torch"):
        raise ConfigError(f"Normalize: style '{style}' is not supported.", hint="Use style: torch.")
    divide = style == "torch" or bool(params.get("to_float_div255", False))
    return [{"op": "normalize", "mean": list(params.get("mean", [0.0])), "std": list(params.get("std", [1.0])),
             "scale": 1 / 255 if divide else 1.0}]


def _vendor_set_order(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"op": "layout", "order": params.get("shape", "HWC")}]


VENDOR_OPS: dict[str, Callable[[Mapping[str, Any]], list[dict[str, Any]]]] = {
    "ResizeTorch": _vendor_resize_torch,
    "CenterCrop": _vendor_center_crop,
    "Normalize": _vendor_normalize,
    "SetOrder": _vendor_set_order,
}
"""Translation of each vendor ``Pre-Order`` step into our pipeline ops, keyed by the vendor name."""

_VENDOR_HINT = f"Vendor preprocessing steps understood: {', '.join(VENDOR_OPS)}."


def vendor_yaml_to_pipeline(data: Mapping[str, Any]) -> PreprocessingConfig:
    """Translate the vendor's make_calib YAML (as a dict) into our preprocessing config.

    ``GetImage.channel_order`` becomes a leading ``colorConvert``; each ``Pre-Order`` step takes its
    parameters from the ``Pre-processing`` block (or a top-level block of the same name).
    ``Normalize`` with ``style: torch`` or ``to_float_div255: true`` divides by 255 first.

    Raises:
        ConfigError: an unknown step, an unsupported parameter, or invalid values.
    """
    get_image = data.get("GetImage") or {}
    ops: list[dict[str, Any]] = []
    if "channel_order" in get_image:
        ops.append({"op": "colorConvert", "order": str(get_image["channel_order"]).upper()})
    blocks = data.get("Pre-processing") or {}
    for name in data.get("Pre-Order") or []:
        if name not in VENDOR_OPS:
            raise ConfigError(f"Unknown vendor preprocessing step '{name}'.", hint=_VENDOR_HINT)
        ops += VENDOR_OPS[name](blocks.get(name, data.get(name)) or {})
    try:
        return PreprocessingConfig.model_validate({"apply": True, "pipeline": ops})
    except ValidationError as error:
        raise config_error_from_validation(error, "vendor preprocessing", model=PreprocessingConfig) from error


def _pipeline_from(args_pre: Any) -> list[PreprocessOp]:
    if isinstance(args_pre, PreprocessingConfig):
        return list(args_pre.pipeline)
    data = read_mapping(args_pre) if isinstance(args_pre, (str, os.PathLike)) else args_pre
    if not isinstance(data, Mapping):
        raise ArgumentError("args_pre must be a YAML/JSON path, a PreprocessingConfig or a mapping.",
                            hint="See docs/calibration-data.md.")
    if any(key in data for key in _VENDOR_KEYS):
        return list(vendor_yaml_to_pipeline(data).pipeline)
    try:
        return list(PreprocessingConfig.model_validate(data).pipeline)
    except ValidationError as error:
        raise config_error_from_validation(error, "args_pre", model=PreprocessingConfig) from error


# ---------------------------------------------------------------- the helpers


def make_calib(args_pre: Any, data_dir: PathLike, save_dir: PathLike, save_name: str, max_size: int = 100, *,
               image_channels: int = 3, reporter: Reporter | ProgressCallback | None = None) -> Path:
    """Preprocess the images of ``data_dir`` into ``.npy`` samples (vendor ``make_calib``).

    Args:
        args_pre: Vendor YAML path (``GetImage``, ``Pre-Order`` ...), a YAML/JSON file or mapping of
            our preprocessing config, or a :class:`PreprocessingConfig`.
        data_dir: Folder of JPEG/PNG/BMP images (not searched recursively).
        save_dir: Folder receiving ``save_name/`` and ``save_name.txt``.
        save_name: Name of the sample folder and of the list.
        max_size: The first ``max_size`` images by name; -1 for all.
        image_channels: Decode images as 1 (gray) or 3 (RGB) channels.
        reporter: Progress and cancellation.

    Returns:
        Path of the ``.txt`` list.

    Raises:
        CalibrationError: no images, unreadable images, or images of sizes the pipeline does not unify.
        ConfigError: ``args_pre`` is not a valid preprocessing description.
        CancelledError: cancelled; nothing was written.
    """
    if image_channels not in (1, 3):
        raise ArgumentError(f"image_channels must be 1 or 3, got {image_channels}.")
    pipeline = _pipeline_from(args_pre)
    images = _select(_list_files(Path(data_dir), IMAGE_SUFFIXES), max_size, None)
    reporter = as_reporter(reporter)
    with reporter.stage("check images", total=len(images)):
        _check_one_output_size(probe_images(images, reporter), pipeline)
    return _write_samples(images, lambda path: preprocess_image(path, pipeline, image_channels),
                          Path(save_dir), save_name, reporter)


def make_calib_man(pre_ftn: Callable[[str], np.ndarray], data_dir: PathLike, save_dir: PathLike, save_name: str,
                   max_size: int = 100, seed: int = 42, *, extensions: Iterable[str] | None = None,
                   reporter: Reporter | ProgressCallback | None = None) -> Path:
    """Run a user function on up to ``max_size`` randomly chosen files (vendor ``make_calib_man``).

    Args:
        pre_ftn: ``pre_ftn(path) -> array``: the preprocessed sample, without batch dimension.
        data_dir: Folder of input files (not searched recursively).
        save_dir: Folder receiving ``save_name/`` and ``save_name.txt``.
        save_name: Name of the sample folder and of the list.
        max_size: How many files to pick at random with ``seed`` (kept in name order); -1 for all.
        seed: Seed of the random choice.
        extensions: File suffixes to consider (default: the image suffixes).
        reporter: Progress and cancellation.

    Returns:
        Path of the ``.txt`` list.

    Raises:
        CalibrationError: no files, ``pre_ftn`` failed or returned arrays of differing shapes.
        CancelledError: cancelled; nothing was written.
    """
    suffixes = tuple(s.lower() if s.startswith(".") else f".{s.lower()}" for s in (extensions or IMAGE_SUFFIXES))
    files = _select(_list_files(Path(data_dir), suffixes), max_size, seed)
    return _write_samples(files, lambda path: _call_user(pre_ftn, path), Path(save_dir), save_name,
                          as_reporter(reporter))


def _list_files(data_dir: Path, suffixes: Sequence[str]) -> list[Path]:
    if not data_dir.is_dir():
        raise CalibrationError(f"Data folder '{data_dir}' does not exist.", hint="Check data_dir.",
                               file=str(data_dir))
    files = sorted(p for p in data_dir.iterdir()
                   if p.is_file() and p.suffix.lower() in suffixes and not p.name.startswith("."))
    if not files:
        raise CalibrationError(f"Data folder '{data_dir}' has no {', '.join(suffixes)} files.",
                               hint="Subfolders are not scanned; point data_dir at the files.", file=str(data_dir))
    return files


def _select(files: list[Path], max_size: int, seed: int | None) -> list[Path]:
    if max_size == 0 or max_size < -1:
        raise ArgumentError(f"max_size must be positive or -1 (all), got {max_size}.")
    if max_size == -1 or max_size >= len(files):
        return files
    return files[:max_size] if seed is None else sorted(random.Random(seed).sample(files, max_size))


def _check_one_output_size(infos: Sequence[Any], pipeline: Sequence[PreprocessOp]) -> None:
    sizes: dict[tuple[int, int], list[Path]] = {}
    for info in infos:
        sizes.setdefault(pipeline_output_size(pipeline, info.size), []).append(info.path)
    if len(sizes) > 1:
        groups = "; ".join(f"{w}x{h}: {name_files(paths)}" for (h, w), paths in sizes.items())
        raise files_error(f"The preprocessing turns the images into {len(sizes)} different sizes "
                          f"(width x height): {groups}.", [p for ps in sizes.values() for p in ps],
                          "Add a resize (ResizeTorch) or crop (CenterCrop) step so every sample has one size.")


def _call_user(pre_ftn: Callable[[str], np.ndarray], path: Path) -> np.ndarray:
    try:
        result = pre_ftn(str(path))
    except QBCompilerError:
        raise
    except Exception as error:  # the user's function: any failure is reported with the file
        raise CalibrationError(f"pre_ftn failed on '{path.name}': {type(error).__name__}: {error}.",
                               hint="Fix the preprocessing function or remove the file.", file=str(path)) from error
    array = np.asarray(result) if result is not None else None
    if array is None or array.dtype == object:
        raise CalibrationError(f"pre_ftn returned {type(result).__name__} for '{path.name}', not a numeric array.",
                               hint="Return a numpy array.", file=str(path))
    return array.astype(np.float32) if np.issubdtype(array.dtype, np.floating) else array


# ---------------------------------------------------------------- atomic writing


def _write_samples(files: Sequence[Path], produce: Callable[[Path], np.ndarray], save_dir: Path, save_name: str,
                   reporter: Reporter) -> Path:
    if not save_name or Path(save_name).name != save_name:
        raise ArgumentError(f"save_name must be a plain name, got '{save_name}'.")
    target, listing = save_dir / save_name, save_dir / f"{save_name}.txt"
    temp = _make_temp_dir(save_dir, save_name)
    try:
        with reporter.stage("make calibration data", total=len(files)):
            _fill(temp, files, produce, reporter)
        backup = _swap_in(temp, target)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    names = [str(target.resolve() / f"{i:06d}.npy") for i in range(len(files))]
    try:
        atomic_write_text(listing, "\n".join(names) + "\n")
    except BaseException:
        _restore(target, backup)
        raise
    if backup is not None:
        shutil.rmtree(backup.parent, ignore_errors=True)
    logger.info("Wrote %d calibration samples to %s and their list to %s.", len(files), target, listing)
    return listing


def _make_temp_dir(save_dir: Path, save_name: str) -> Path:
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{save_name}.", suffix=".part", dir=save_dir))
    except OSError as error:
        raise OutputWriteError(f"Cannot write to '{save_dir}': {error.strerror or error}.",
                               hint="Choose a writable save_dir.", file=str(save_dir)) from error


def _fill(folder: Path, files: Sequence[Path], produce: Callable[[Path], np.ndarray], reporter: Reporter) -> None:
    first: tuple[Path, tuple[int, ...]] | None = None
    for index, path in enumerate(files):
        array = produce(path)
        if first is None:
            first = (path, array.shape)
        elif array.shape != first[1]:
            raise CalibrationError(
                f"Sample of '{path.name}' has shape {list(array.shape)} but the one of '{first[0].name}' has "
                f"{list(first[1])}; every sample must have the same shape.",
                hint="Resize or crop every image to one size in the preprocessing.", file=str(path))
        np.save(folder / f"{index:06d}.npy", array)
        reporter.advance()


def _swap_in(temp: Path, target: Path) -> Path | None:
    """Rename ``temp`` to ``target``; an existing ``target`` is moved aside and returned."""
    backup = None
    if target.exists():
        backup = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        os.replace(target, backup / target.name)
        backup = backup / target.name
    os.replace(temp, target)
    return backup


def _restore(target: Path, backup: Path | None) -> None:
    shutil.rmtree(target, ignore_errors=True)
    if backup is not None:
        os.replace(backup, target)
        shutil.rmtree(backup.parent, ignore_errors=True)
