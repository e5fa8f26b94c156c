"""make_calib and make_calib_man: turn a folder of raw images into preprocessed .npy samples + a .txt list.

Both write ``save_dir/save_name/000000.npy ...`` (one sample each, no batch dimension) and
``save_dir/save_name.txt`` (their absolute paths, one per line), which ``open_calibration_data``
reads back. The samples are written into a hidden temporary folder that is renamed into place only
when all of them succeeded, so an error or a cancel leaves nothing behind.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from compiler_core.calibration.preprocess import IMAGE_SUFFIXES, pipeline_output_size, preprocess_image
from compiler_core.calibration.specs import token_input_roles
from compiler_core.calibration.validate import files_error, name_files, probe_images, refuse_broken_links
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
        data_dir: Folder of images (:data:`~compiler_core.calibration.preprocess.IMAGE_SUFFIXES`; not searched
            recursively).
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
    entries = sorted(p for p in data_dir.iterdir() if not p.name.startswith("."))
    refuse_broken_links(entries, suffixes)
    files = [p for p in entries if p.is_file() and p.suffix.lower() in suffixes]
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


# ---------------------------------------------------------------- text for token inputs

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")
"""Files that make a folder a tokenizer folder (a HuggingFace model folder has some of them)."""


def tokenizer_folder(path: PathLike | None) -> Path | None:
    """``path`` (a model folder) when it holds a tokenizer, else None."""
    folder = Path(path) if path else None
    return folder if folder is not None and folder.is_dir() and any(
        (folder / name).is_file() for name in TOKENIZER_FILES) else None


def make_calib_text(text_path: PathLike, tokenizer: Any, specs: Sequence[Any], save_dir: PathLike, save_name: str,
                    max_size: int = 100, *, reporter: Reporter | ProgressCallback | None = None) -> Path:
    """Tokenize the lines of a text file into calibration samples for a transformer's token inputs.

    Each non-empty line is one sample: its token ids truncated or padded to the model's sequence length (the last
    dimension of the ids input), with the attention mask (1 on tokens, 0 on padding), token types (0) and positions
    (0, 1, ...) for the inputs that take them. Written as ``save_dir/save_name/000000_<input name>.npy`` ... and a JSON
    manifest ``save_dir/save_name.json`` (absolute paths), which ``open_calibration_data`` reads back; all or nothing,
    as :func:`make_calib`.

    Args:
        text_path: UTF-8 text, one sentence or passage per line (blank lines skipped).
        tokenizer: A HuggingFace model or tokenizer folder, a ``tokenizer.json`` file, or a loaded tokenizer
            (``tokenizer(text, truncation=..., max_length=..., padding=...)`` returning ``input_ids`` ...).
        specs: The model inputs (:func:`~compiler_core.calibration.input_specs`); each must be a token input
            (:data:`TOKEN_INPUT_ROLES`).
        save_dir: Folder receiving ``save_name/`` and ``save_name.json``.
        save_name: Name of the sample folder and of the manifest.
        max_size: The first ``max_size`` lines; -1 for all.
        reporter: Progress and cancellation.

    Returns:
        Path of the JSON manifest.

    Raises:
        CalibrationError: the model's inputs are not token inputs, the text is missing, unreadable or empty.
        ModelLoadError: the tokenizer cannot be loaded.
        CancelledError: cancelled; nothing was written.
    """
    roles = token_input_roles(specs)
    if roles is None:
        names = ", ".join(f"{spec.name} ({np.dtype(spec.dtype).name})" for spec in specs)
        raise CalibrationError(f"The model's inputs ({names}) are not token inputs, so text cannot calibrate it.",
                               hint="Text calibrates models whose inputs are all integer token inputs (input_ids, "
                                    "attention_mask, token_type_ids, position_ids); give other models images or "
                                    ".npy files.")
    ids = next(spec for spec in specs if roles[spec.name] == "ids")
    length = int(ids.shape[-1])
    lines = _select(_text_lines(Path(text_path)), max_size, None)
    encode = _tokenizer(tokenizer)
    reporter = as_reporter(reporter)
    samples = []
    filled = 0
    with reporter.stage("tokenize", total=len(lines)):
        for line in lines:
            try:
                encoded = encode(line, truncation=True, max_length=length, padding="max_length")
            except ValueError as error:  # e.g. a tokenizer without a padding token
                raise CalibrationError(f"The tokenizer cannot pad to {length} tokens: {error}",
                                       hint="Use a tokenizer with a padding token (its tokenizer_config.json "
                                            "names pad_token).") from error
            tokens = np.asarray(encoded["input_ids"], np.int64).reshape(-1)[:length]
            mask = np.asarray(encoded.get("attention_mask", np.ones(length)), np.int64).reshape(-1)[:length]
            filled += int(mask.all())
            values = {"ids": tokens, "mask": mask, "types": np.zeros(length, np.int64),
                      "positions": np.arange(length, dtype=np.int64)}
            samples.append({spec.name: values[roles[spec.name]].reshape(spec.shape).astype(spec.dtype)
                            for spec in specs})
            reporter.advance()
    if filled:
        logger.info("%d of %d lines fill all %d token positions (longer ones are cut there).", filled, len(samples),
                    length)
    return _write_token_samples(samples, specs, Path(save_dir), save_name, reporter)


def _text_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CalibrationError(f"Text file '{path}' does not exist.", hint="Check the path.", file=str(path)) from None
    except UnicodeDecodeError as error:
        raise CalibrationError(f"'{path.name}' is not UTF-8 text (byte {error.start}).",
                               hint="Save the text as UTF-8, one sentence per line.", file=str(path)) from error
    except OSError as error:
        raise CalibrationError(f"Cannot read '{path}': {error.strerror or error}.", file=str(path)) from error
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise CalibrationError(f"'{path.name}' has no text.", hint="Write one sentence or passage per line.",
                               file=str(path))
    return lines


def _tokenizer(tokenizer: Any) -> Callable[..., Mapping[str, Any]]:
    """A callable tokenizer from a folder, a ``tokenizer.json`` or an object."""
    from compiler_core.errors import ModelLoadError

    if not isinstance(tokenizer, (str, os.PathLike)):
        if not callable(tokenizer):
            raise ArgumentError(f"tokenizer must be a folder, a tokenizer.json file or a tokenizer, not "
                                f"{type(tokenizer).__name__}.")
        return tokenizer
    path = Path(tokenizer)
    try:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        if path.is_dir():
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        if path.is_file() and path.suffix == ".json":
            return PreTrainedTokenizerFast(tokenizer_file=str(path))
    except Exception as error:  # transformers raises OSError, ValueError, JSON errors ... for a bad tokenizer
        raise ModelLoadError(f"Cannot load a tokenizer from '{path}': {type(error).__name__}: {error}",
                             hint="Give the model's folder (with tokenizer.json or vocab.txt) or its tokenizer.json.",
                             file=str(path)) from error
    raise ModelLoadError(f"'{path}' is neither a tokenizer folder nor a tokenizer.json file.",
                         hint="Give the model's folder (with tokenizer.json or vocab.txt) or its tokenizer.json.",
                         file=str(path))


def _write_token_samples(samples: Sequence[Mapping[str, np.ndarray]], specs: Sequence[Any], save_dir: Path,
                         save_name: str, reporter: Reporter) -> Path:
    if not save_name or Path(save_name).name != save_name:
        raise ArgumentError(f"save_name must be a plain name, got '{save_name}'.")
    target, manifest = save_dir / save_name, save_dir / f"{save_name}.json"
    temp = _make_temp_dir(save_dir, save_name)
    names = [spec.name for spec in specs]
    stems = [re.sub(r"[^A-Za-z0-9_.-]", "_", name) for name in names]
    files = [[f"{index:06d}_{stem}.npy" for stem in stems] for index in range(len(samples))]
    try:
        with reporter.stage("make calibration data", total=len(samples)):
            for sample, row in zip(samples, files):
                for name, file in zip(names, row):
                    np.save(temp / file, sample[name])
                reporter.advance()
        backup = _swap_in(temp, target)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    root = target.resolve()
    content = {"info": {"input names": names, "input shapes": [list(spec.shape) for spec in specs]},
               "calib paths": [[str(root / file) for file in row] for row in files]}
    try:
        atomic_write_text(manifest, json.dumps(content, indent=1) + "\n")
    except BaseException:
        _restore(target, backup)
        raise
    if backup is not None:
        shutil.rmtree(backup.parent, ignore_errors=True)
    logger.info("Wrote %d tokenized calibration samples to %s and their manifest to %s.", len(samples), target,
                manifest)
    return manifest
