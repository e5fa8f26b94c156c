"""open_calibration_data: every calibration-data form, validated against the model inputs first.

Forms (see docs/calibration-data.md): a folder of images or of ``.npy`` files, a ``.txt`` list of
files, a JSON manifest for multi-input models, a single file, several of these concatenated, or
seeded random data for smoke tests. Each form is an entry of :data:`FORMS`; it lists the files of
every sample, and the shared checks in :mod:`compiler_core.calibration.validate` then look at all
of them before any is used.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from compiler_core.calibration.audio import AUDIO_SUFFIXES, AudioSource, probe_wavs, window_starts
from compiler_core.calibration.dataset import CalibrationDataset
from compiler_core.calibration.preprocess import IMAGE_FORMAT_NAMES, IMAGE_SUFFIXES, default_pipeline
from compiler_core.calibration.sources import ImageSource, NpySource, RandomSource, Sample, Source
from compiler_core.calibration.specs import InputSpec
from compiler_core.calibration.validate import (
    ImageInfo,
    check_npy_files,
    files_error,
    name_files,
    npy_axes,
    npy_header,
    plan_images,
    probe_images,
    refuse_broken_links,
)
from compiler_core.config import AudioConfig, PreprocessingConfig, PreprocessOp
from compiler_core.config.messages import config_error_from_validation
from compiler_core.errors import ArgumentError, CalibrationError
from compiler_core.progress import ProgressCallback, Reporter, as_reporter

logger = logging.getLogger(__name__)

DEFAULT_RANDOM_SAMPLES = 32
"""Random samples made by ``use_random_calib`` when ``max_samples`` is not given."""

MIN_RECOMMENDED_SAMPLES = 16
"""Fewer samples than this log a warning: the ranges will be noisy."""

FILE_KINDS: dict[str, str] = {".npy": "npy", **dict.fromkeys(IMAGE_SUFFIXES, "image"),
                              **dict.fromkeys(AUDIO_SUFFIXES, "audio")}
"""Kind of every sample file, keyed by its suffix (compared case-insensitively): the one list of what is read."""

def file_patterns() -> str:
    """``*.npy *.jpg ... *.wav``: every sample-file suffix as file-dialog patterns."""
    return " ".join(f"*{suffix}" for suffix in FILE_KINDS)


_KIND_NAMES = {"image": "images", "npy": ".npy files", "audio": ".wav recordings"}

_NO_DATA_HINT = ("Pass calib_data_path / --calib-data-path (a folder of images, .wav recordings or .npy files, a .txt "
                 "list or a JSON manifest), or use_random_calib=True / --use-random-calib for a smoke test.")
_FORMS_HINT = ("calib_data_path may be a folder of images, .wav recordings or .npy files, a .txt list or a .json "
               "manifest.")
_MANIFEST_HINT = ('A manifest looks like {"info": {"input names": [...], "input shapes": [...]}, '
                  '"calib paths": [["in0.npy", "in1.npy"], ...]}.')

PathLike = str | os.PathLike
FileRef = tuple[Path, Path, int | None]
"""A sample file of one input: (path, folder its name is relative to, window start of a recording)."""


@dataclass(frozen=True)
class Row:
    """The files of one sample, in model-input order, and the folder their names are relative to."""

    files: tuple[Path, ...]
    root: Path
    start: int | None = None
    """The first sample of a recording's window (``.wav`` rows only; set by :func:`_audio_windows`)."""


@dataclass(frozen=True)
class Listing:
    """What one calib_data_path entry holds: its form and its samples' files."""

    kind: str
    rows: list[Row]


@dataclass(frozen=True)
class ReadOptions:
    """The settings every check and every image source needs."""

    preprocessing: PreprocessingConfig
    image_channels: int

    @property
    def auto_convert(self) -> bool:
        """Whether HWC <-> CHW and gray <-> RGB conversions are allowed."""
        return self.preprocessing.auto_convert_format

    @property
    def audio(self) -> AudioConfig:
        """How recordings are read."""
        return self.preprocessing.audio

    @property
    def pipeline(self) -> list[PreprocessOp] | None:
        """The user's pipeline if it is to be applied, else None (the default is then used)."""
        config = self.preprocessing
        return list(config.pipeline) if config.apply and config.pipeline else None


def open_calibration_data(calib_data_path: PathLike | Sequence[PathLike] | None, inputs: list[InputSpec], *,
                          preprocessing: PreprocessingConfig | Mapping[str, Any] | None = None,
                          image_channels: int = 0, use_random_calib: bool = False, max_samples: int | None = None,
                          seed: int = 0, reporter: Reporter | ProgressCallback | None = None,
                          for_calibration: bool = True) -> CalibrationDataset:
    """Open calibration data in any supported form and check it against ``inputs``.

    Every file is checked (existence, decoding, shape, dtype, channels, size after preprocessing)
    before this returns; nothing is written. Samples are loaded lazily by the dataset.

    Args:
        calib_data_path: A folder, a ``.txt`` list, a ``.json`` manifest, one ``.npy``/image file, or
            a list of these (concatenated in order). None or empty for random data.
        inputs: The model inputs (:func:`~compiler_core.calibration.input_specs`).
        preprocessing: The preprocessing config (or its camelCase mapping) for raw images; its
            pipeline is used when ``apply`` is true. Otherwise images that already have the
            input's size are only scaled by 1/255.
        image_channels: 0 uses the model's channel count; 1 or 3 must equal it.
        use_random_calib: With no path, make seeded random samples (smoke tests only).
        max_samples: Use at most this many samples, evenly spaced over them (:func:`spread`); None or negative
            for all.
            For random data, the number of samples (default 32).
        seed: Seed of the random data.
        reporter: Progress and cancellation (:class:`~compiler_core.progress.Reporter` or callback).
        for_calibration: Warn when there are few samples for steady ranges (False: inputs to run, e.g.
            ``qbcompiler run --input photo.png``).

    Returns:
        The validated dataset.

    Raises:
        CalibrationError: no data, or any file that does not fit (named in the message).
        ArgumentError: ``max_samples`` is 0, ``image_channels`` is not 0, 1 or 3, or no inputs.
        ConfigError: ``preprocessing`` is a mapping that is not a valid config.
        CancelledError: cancelled through ``reporter``.
    """
    reporter = as_reporter(reporter)
    if not inputs:
        raise ArgumentError("The model has no inputs to calibrate.", hint="Check the MBLT.")
    if max_samples == 0:
        raise ArgumentError("max_samples is 0.", hint="Give a positive number, or None for every sample.")
    if image_channels not in (0, 1, 3):
        raise ArgumentError(f"image_channels must be 0, 1 or 3, got {image_channels}.",
                            hint="0 uses the model's channel count.")
    paths = _path_list(calib_data_path)
    if not paths:
        return _random_dataset(inputs, use_random_calib, max_samples, seed)
    if use_random_calib:
        logger.warning("use_random_calib is ignored because calibration data was given.")
    options = ReadOptions(_preprocessing_config(preprocessing), image_channels)
    return _file_dataset(paths, inputs, options, max_samples, reporter, for_calibration)


def _preprocessing_config(value: PreprocessingConfig | Mapping[str, Any] | None) -> PreprocessingConfig:
    if value is None or isinstance(value, PreprocessingConfig):
        return value or PreprocessingConfig()
    try:
        return PreprocessingConfig.model_validate(value)
    except ValidationError as error:
        raise config_error_from_validation(error, "preprocessing", model=PreprocessingConfig) from error


def _path_list(value: PathLike | Sequence[PathLike] | None) -> list[Path]:
    if value is None:
        return []
    values = [value] if isinstance(value, (str, os.PathLike)) else list(value)
    return [Path(v).absolute() for v in values if os.fspath(v) != ""]


def _file_dataset(paths: list[Path], inputs: list[InputSpec], options: ReadOptions,
                  max_samples: int | None, reporter: Reporter, for_calibration: bool = True) -> CalibrationDataset:
    listings = [read_listing(path, inputs) for path in paths]
    rows = _audio_windows([row for listing in listings for row in listing.rows], inputs, options)
    if max_samples is not None and 0 < max_samples < len(rows):
        rows = spread(rows, max_samples)
    with reporter.stage("check calibration data", total=len(rows) * len(inputs)):
        columns, settings = _build_columns(rows, inputs, options, reporter)
    samples = [Sample.of([column[i] for column in columns]) for i in range(len(rows))]
    kind = "+".join(dict.fromkeys(listing.kind for listing in listings))
    if for_calibration:
        _warn_if_few(len(samples))
    notes = settings.pop("notes")
    return CalibrationDataset(inputs, samples, kind, settings, notes)


def _audio_windows(rows: list[Row], inputs: list[InputSpec], options: ReadOptions) -> list[Row]:
    """Each ``.wav`` row becomes one row per window of the input's length (other rows stay as they are).

    Raises:
        CalibrationError: recordings for a model with several inputs, unreadable ``.wav`` files, or files the input's
            window and sample rate do not fit (:func:`~compiler_core.calibration.audio.window_starts`).
    """
    recordings = list(dict.fromkeys(row.files[0] for row in rows if _file_kind(row.files[0]) == "audio"))
    if not recordings:
        return rows
    _refuse_recordings_for_several_inputs(recordings, inputs)
    starts = dict(zip(recordings, window_starts(probe_wavs(recordings), inputs[0], options.audio)))
    return [replace(row, start=start) for row in rows
            for start in starts.get(row.files[0], [None])]


def _refuse_recordings_for_several_inputs(recordings: list[Path], inputs: list[InputSpec]) -> None:
    if len(inputs) > 1 and recordings:
        names = ", ".join(spec.name for spec in inputs)
        raise files_error(f".wav recordings feed a model with one waveform input; this model has {len(inputs)} inputs "
                          f"({names}).", recordings,
                          "Give the samples as .npy files, one per input, in a JSON manifest (see "
                          "docs/calibration-data.md), or bind the other inputs with constant_inputs / --bind-input "
                          "when they are fixed (a sample rate, a zero initial state).")


def spread(items: list, count: int) -> list:
    """``count`` of ``items`` evenly spaced over the whole list, in order, the first included: a folder sorted by
    name (``cat_001`` ... ``dog_120``) or by class subfolder gives samples of every part, not only its first."""
    return [items[index * len(items) // count] for index in range(count)]


def _warn_if_few(count: int) -> None:
    if count < MIN_RECOMMENDED_SAMPLES:
        logger.warning("Only %d calibration sample(s); %d or more (typically 100-128) give steadier ranges.",
                       count, MIN_RECOMMENDED_SAMPLES)


# ---------------------------------------------------------------- random data


def _random_dataset(inputs: list[InputSpec], use_random_calib: bool, max_samples: int | None,
                    seed: int) -> CalibrationDataset:
    if not use_random_calib:
        raise CalibrationError("No calibration dataset is provided.", hint=_NO_DATA_HINT)
    count = max_samples if max_samples is not None and max_samples > 0 else DEFAULT_RANDOM_SAMPLES
    logger.warning("Calibrating with %d random samples: the quantized model is only good for smoke tests.", count)
    samples = [Sample.of([RandomSource(spec, seed, i) for spec in inputs]) for i in range(count)]
    return CalibrationDataset(inputs, samples, "random", {"random_seed": seed},
                              ["random data (normal for float inputs, integers in [0, 100) otherwise)"])


# ---------------------------------------------------------------- forms


def read_listing(path: Path, inputs: list[InputSpec]) -> Listing:
    """List the sample files of one calib_data_path entry (checks that they exist, reads no data).

    Raises:
        CalibrationError: the path does not exist, is of an unknown kind, or lists missing files.
    """
    if not path.exists():
        raise CalibrationError(f"Calibration data path '{path}' does not exist.",
                               hint=f"Check the path. {_FORMS_HINT}", file=str(path))
    form = "folder" if path.is_dir() else path.suffix.lower()
    reader = FORMS.get(form)
    if reader is None:
        raise CalibrationError(f"Calibration data path '{path}' is a '{path.suffix}' file, which is not a "
                               "calibration data form.", hint=_FORMS_HINT, file=str(path))
    return reader(path, inputs)


def _read_folder(path: Path, inputs: list[InputSpec]) -> Listing:
    entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
    refuse_broken_links(entries, tuple(FILE_KINDS))
    files = [p for p in entries if p.is_file()]
    by_kind = _by_kind(files)
    if not by_kind and entries and not files:  # class subfolders (train/cat/*.jpg, ImageNet's)
        files = _files_below(path)
        by_kind = _by_kind(files)
        used = [p for group in by_kind.values() for p in group]
        if used:
            logger.info("Calibration folder '%s' holds only subfolders: read %d file(s) from %d of them", path,
                        len(used), len({p.parent for p in used}))
    if len(by_kind) > 1:
        found = " and ".join(f"{_KIND_NAMES[kind]} ({len(group)})" for kind, group in by_kind.items())
        raise files_error(f"Calibration folder '{path}' holds {found}.", [group[0] for group in by_kind.values()],
                          "Keep one kind per folder; pass several folders if you need both.")
    if not by_kind:
        _raise_no_usable_files(path, entries, files)
    kind, used = next(iter(by_kind.items()))
    _refuse_recordings_for_several_inputs(by_kind.get("audio", []), inputs)
    _require_single_input(inputs, f"the folder '{path.name}'")
    return Listing(_LISTING_KINDS[kind], [Row((p,), path) for p in used])


_LISTING_KINDS = {"image": "images", "npy": "npy", "audio": "wav"}
"""The dataset ``kind`` of a folder or single file of each file kind."""


def _by_kind(files: list[Path]) -> dict[str, list[Path]]:
    """The sample files among ``files`` by kind, in :data:`FILE_KINDS` order; other files left out."""
    groups: dict[str, list[Path]] = {}
    for path in files:
        kind = _file_kind(path)
        if kind is not None:
            groups.setdefault(kind, []).append(path)
    return groups


def _files_below(path: Path) -> list[Path]:
    """Every file in the subfolders of ``path``, at any depth, sorted by path; hidden files and folders skipped.
    Linked folders are followed (class folders linked in from a dataset elsewhere), each real folder once."""
    found, seen = [], set()
    for folder, subfolders, names in os.walk(path, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:  # a link back up the tree, or a second link to one folder
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        if Path(folder) != path:
            found.extend(Path(folder) / name for name in sorted(names) if not name.startswith("."))
    return sorted(found)


def _raise_no_usable_files(path: Path, entries: list[Path], files: list[Path]) -> None:
    if not entries:
        raise CalibrationError(f"Calibration folder '{path}' is empty.", hint=_FORMS_HINT, file=str(path))
    if not files:
        raise CalibrationError(
            f"Calibration folder '{path}' holds only subfolders ({name_files(entries)}), with no files in them.",
            hint=_FORMS_HINT, file=str(path))
    counts = Counter(p.suffix.lower() or "extension-less" for p in files)
    found = ", ".join(f"{n} {suffix} file{'s' if n > 1 else ''}" for suffix, n in counts.most_common())
    raise CalibrationError(
        f"Calibration folder '{path}' has no usable files (images {', '.join(IMAGE_SUFFIXES)}, recordings "
        f"{', '.join(AUDIO_SUFFIXES)} or .npy): "
        f"found {found}.", hint=_FORMS_HINT, file=str(path))


def _require_single_input(inputs: list[InputSpec], what: str) -> None:
    if len(inputs) > 1:
        names = ", ".join(spec.name for spec in inputs)
        raise CalibrationError(f"The model has {len(inputs)} inputs ({names}) but {what} gives one file per "
                               "sample.", hint="Use a JSON manifest that lists one file per input for each "
                                               "sample (see docs/calibration-data.md; the workbench writes one from "
                                               "one folder per input: Calibration › From folders…).")


def _read_txt(path: Path, inputs: list[InputSpec]) -> Listing:
    _require_single_input(inputs, f"the list '{path.name}'")
    lines = _read_text(path).splitlines()
    entries = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not entries:
        raise CalibrationError(f"Calibration list '{path}' names no files.",
                               hint="Write one .npy path per line.", file=str(path))
    files = [_resolve(entry, path.parent) for entry in entries]
    _require_existing(files, path)
    return Listing("txt", [Row((f,), path.parent) for f in files])


def _read_single(path: Path, inputs: list[InputSpec]) -> Listing:
    _refuse_recordings_for_several_inputs([path] if _file_kind(path) == "audio" else [], inputs)
    _require_single_input(inputs, f"the file '{path.name}'")
    return Listing(_LISTING_KINDS[_file_kind(path)], [Row((path,), path.parent)])


def _resolve(entry: str, base: Path) -> Path:
    path = Path(os.path.expanduser(entry))
    return path if path.is_absolute() else base / path


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CalibrationError(f"Cannot read '{path}': {getattr(error, 'strerror', None) or error}.",
                               hint="Check the file and its permissions.", file=str(path)) from error


def _require_existing(files: Sequence[Path], listed_in: Path) -> None:
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise files_error(f"{len(missing)} file(s) listed in '{listed_in.name}' do not exist: "
                          f"{name_files(missing)}.", missing,
                          f"Relative paths are relative to the folder of '{listed_in.name}'.")


# ---------------------------------------------------------------- JSON manifest


def _read_manifest(path: Path, inputs: list[InputSpec]) -> Listing:
    data = _load_json(path)
    entries = _manifest_entries(data, path)
    _check_entry_widths(entries, inputs, path)
    info = data.get("info") or {}
    names = _info_list(info, "input names", len(inputs), path, _is_name) or [None] * len(inputs)
    shapes = _info_list(info, "input shapes", len(inputs), path, _is_shape) or [None] * len(inputs)
    rows_files = [[_resolve(p, path.parent) for p in entry] for entry in entries]
    _require_existing([f for files in rows_files for f in files], path)
    column_shapes = [tuple(s) if s is not None else _header_shape(rows_files[0][i]) for i, s in enumerate(shapes)]
    order = match_columns(names, column_shapes, inputs, path)
    rows = [Row(tuple(files[order[i]] for i in range(len(inputs))), path.parent) for files in rows_files]
    return Listing("manifest", rows)


def write_folder_manifest(folders: Sequence[PathLike], inputs: list[InputSpec], manifest_path: PathLike) -> Path:
    """Write a JSON manifest that pairs one folder per model input: the n-th file of each folder is sample n.

    Each folder is read as a calibration folder is (images or ``.npy`` files, one kind, sorted by name); the
    manifest names the inputs and their shapes and lists the files by absolute path.

    Args:
        folders: One folder per model input, in the order of ``inputs``.
        inputs: The model inputs.
        manifest_path: The ``.json`` file to write.

    Returns:
        ``manifest_path``.

    Raises:
        CalibrationError: a folder is missing or has no usable files, or the folders hold different numbers of
            files.
    """
    if len(folders) != len(inputs):
        raise CalibrationError(f"Give one folder per model input: {len(inputs)} input(s), {len(folders)} folder(s).",
                               hint="Pick the folders in the model's input order.")
    columns = []
    for folder, spec in zip(folders, inputs):
        path = Path(folder)
        if not path.is_dir():
            raise CalibrationError(f"Calibration folder '{path}' does not exist.", hint="Check the path.",
                                   file=str(path))
        columns.append([row.files[0] for row in _read_folder(path, [spec]).rows])
    counts = [len(files) for files in columns]
    if len(set(counts)) > 1:
        found = ", ".join(f"'{Path(folder).name}' ({spec.name}): {count}"
                          for folder, spec, count in zip(folders, inputs, counts))
        raise CalibrationError(f"The folders hold different numbers of files ({found}); the n-th file of each "
                               "folder makes sample n.", hint="Give every folder the same number of files.")
    manifest = Path(manifest_path)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "info": {"input names": [spec.name for spec in inputs], "input shapes": [list(spec.shape) for spec in inputs]},
        "calib paths": [[str(file.absolute()) for file in files] for files in zip(*columns)]}, indent=1))
    logger.info("Calibration manifest '%s': %d sample(s) from %d folder(s)", manifest, counts[0], len(folders))
    return manifest


def _load_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as error:
        raise CalibrationError(f"'{path.name}' is not valid JSON (line {error.lineno}, column {error.colno}: "
                               f"{error.msg}).", hint=_MANIFEST_HINT, file=str(path)) from error


def _manifest_entries(data: Any, path: Path) -> list[list[str]]:
    entries = data.get("calib paths") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries or not all(
            isinstance(e, list) and all(isinstance(p, str) for p in e) for e in entries):
        raise CalibrationError(f"'{path.name}' has no \"calib paths\" list of file-path lists.",
                               hint=_MANIFEST_HINT, file=str(path))
    return entries


def _info_list(info: Any, key: str, width: int, path: Path, valid: Callable[[Any], bool]) -> list | None:
    value = info.get(key) if isinstance(info, dict) else None
    if value is not None and (not isinstance(value, list) or len(value) != width
                              or not all(item is None or valid(item) for item in value)):
        raise CalibrationError(f"'{path.name}': info \"{key}\" must list one value per model input ({width}): "
                               "a name (string) or a shape (list of sizes >= 0) each.",
                               hint=_MANIFEST_HINT, file=str(path))
    return value


def _is_name(item: Any) -> bool:
    return isinstance(item, str)


def _is_shape(item: Any) -> bool:
    return isinstance(item, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in item)


def _check_entry_widths(entries: list[list[str]], inputs: list[InputSpec], path: Path) -> None:
    wrong = [(i, len(e)) for i, e in enumerate(entries) if len(e) != len(inputs)]
    if wrong:
        listed = ", ".join(f"entry {i} has {n}" for i, n in wrong[:5])
        more = f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""
        names = ", ".join(spec.name for spec in inputs)
        raise CalibrationError(f"'{path.name}': every \"calib paths\" entry needs {len(inputs)} path(s), one per "
                               f"model input ({names}); {listed}{more}.", hint=_MANIFEST_HINT, file=str(path))


def _header_shape(path: Path) -> tuple[int, ...] | None:
    try:
        return npy_header(path)[0] if path.suffix.lower() == ".npy" else None
    except (OSError, ValueError):
        return None  # reported with the file's name by the .npy checks


def match_columns(names: Sequence[str | None], shapes: Sequence[tuple[int, ...] | None],
                  inputs: list[InputSpec], path: Path) -> list[int]:
    """Manifest column feeding each model input: by shape first, then by name among equal shapes.

    Returns:
        ``order[i]`` is the manifest column of ``inputs[i]``.

    Raises:
        CalibrationError: a column fits no input, names an unknown input, or stays ambiguous.
    """
    options = {col: {i for i, spec in enumerate(inputs) if shape is None or npy_axes(shape, spec, True) is not False}
               for col, shape in enumerate(shapes)}
    resolved: dict[int, int] = {}
    progress = True
    while progress:
        progress = False
        for col in sorted(set(options) - set(resolved)):
            left = options[col] - set(resolved.values())
            named = {i for i in left if inputs[i].name == names[col]}
            if len(left) == 1 or len(named) == 1:
                resolved[col] = next(iter(left if len(left) == 1 else named))
                progress = True
    if len(resolved) < len(inputs):
        _raise_unmatched(names, shapes, inputs, options, resolved, path)
    return [next(col for col, i in resolved.items() if i == index) for index in range(len(inputs))]


def _raise_unmatched(names: Sequence[str | None], shapes: Sequence[Any], inputs: list[InputSpec],
                     options: dict[int, set[int]], resolved: dict[int, int], path: Path) -> None:
    col = min(set(options) - set(resolved))
    known = ", ".join(f"{spec.name} {list(spec.shape)}" for spec in inputs)
    label = f"'{names[col]}'" if names[col] else str(col)
    if not options[col]:
        problem = f"column {label} (shape {list(shapes[col] or [])}) fits no model input"
    elif names[col] and names[col] not in {spec.name for spec in inputs}:
        problem = f"input name {label} is not a model input and its shape fits several"
    else:
        problem = f"column {label} fits several model inputs ({', '.join(inputs[i].name for i in options[col])})"
    raise CalibrationError(f"'{path.name}': {problem}; the model inputs are {known}.",
                           hint='Name each column after its model input in info "input names".', file=str(path))


FORMS: dict[str, Callable[[Path, list[InputSpec]], Listing]] = {
    "folder": _read_folder,
    ".txt": _read_txt,
    ".json": _read_manifest,
    **dict.fromkeys(FILE_KINDS, _read_single),
}
"""Reader of each calib_data_path form, keyed by ``folder`` or the file suffix."""


# ---------------------------------------------------------------- sources per input


def _build_columns(rows: list[Row], inputs: list[InputSpec], options: ReadOptions,
                   reporter: Reporter) -> tuple[list[list[Source]], dict[str, Any]]:
    """Check the files of every input and make their sources; returns (columns, settings)."""
    settings: dict[str, Any] = {"notes": []}
    columns = [_build_column([(row.files[i], row.root, row.start) for row in rows], spec, options, reporter, settings)
               for i, spec in enumerate(inputs)]
    return columns, settings


def _build_column(files: list[FileRef], spec: InputSpec, options: ReadOptions, reporter: Reporter,
                  settings: dict[str, Any]) -> list[Source]:
    kinds = {_file_kind(path) for path, *_ in files}
    if None in kinds:
        odd = [path for path, *_ in files if _file_kind(path) is None]
        raise files_error(f"{len(odd)} calibration file(s) are neither .npy, images nor .wav: {name_files(odd)}.", odd,
                          f"List .npy files (or {IMAGE_FORMAT_NAMES} images, or .wav recordings).")
    by_kind: dict[str, list[int]] = {kind: [i for i, (p, *_) in enumerate(files) if _file_kind(p) == kind]
                                     for kind in kinds}
    sources: list[Source | None] = [None] * len(files)
    for kind, indices in by_kind.items():
        chosen = [files[i] for i in indices]
        made = COLUMN_BUILDERS[kind](chosen, spec, options, reporter, settings)
        for index, source in zip(indices, made):
            sources[index] = source
    return sources


def _file_kind(path: Path) -> str | None:
    return FILE_KINDS.get(path.suffix.lower())


def _npy_sources(files: list[FileRef], spec: InputSpec, options: ReadOptions, reporter: Reporter,
                 settings: dict[str, Any]) -> list[Source]:
    axes = check_npy_files([p for p, *_ in files], spec, options.auto_convert, reporter)
    transposed = sum(a is not None for a in axes)
    if transposed:
        settings["notes"].append(f"{transposed} .npy file(s) transposed to {spec.layout} for '{spec.name}'")
    return [NpySource(spec, path, root, a) for (path, root, _), a in zip(files, axes)]


def _image_sources(files: list[FileRef], spec: InputSpec, options: ReadOptions, reporter: Reporter,
                   settings: dict[str, Any]) -> list[Source]:
    infos = probe_images([p for p, *_ in files], reporter)
    user = options.pipeline
    pipeline = user if user is not None else default_pipeline()
    plan = plan_images(infos, spec, pipeline, image_channels=options.image_channels,
                       auto_convert=options.auto_convert, default=user is None)
    if user is None:
        logger.info("No preprocessing pipeline applies and the images already have the input size of '%s': "
                    "scaling pixels by 1/255 only.", spec.name)
        settings["notes"].append(f"default preprocessing for '{spec.name}': pixels / 255")
    if plan.converted:
        settings["notes"].append(f"{plan.converted} image(s) converted to {plan.channels} channel(s)")
    settings["notes"].extend(_image_notes(infos))
    settings.setdefault("images", {})[spec.name] = {
        "pipeline": [op.model_dump(mode="json", by_alias=True) for op in plan.pipeline],
        "channels": plan.channels, "axes": plan.axes}
    if any(info.turned for info in infos):  # statistics cached before EXIF orientations were applied are not reused
        settings["images"][spec.name]["exifOrientation"] = "applied"
    return [ImageSource(spec, path, root, plan.pipeline, plan.channels, plan.axes) for path, root, _ in files]


def _image_notes(infos: list[ImageInfo]) -> list[str]:
    """What was read differently from the stored pixels: photos turned upright by their EXIF orientation, animated or
    multi-page files read at their first frame."""
    turned = sum(info.turned for info in infos)
    animated = sum(info.frames > 1 for info in infos)
    return ([f"{turned} image(s) turned upright by their EXIF orientation"] if turned else []) + \
        ([f"{animated} animated or multi-page image(s): first frame read"] if animated else [])


def _audio_sources(files: list[FileRef], spec: InputSpec, options: ReadOptions, reporter: Reporter,
                   settings: dict[str, Any]) -> list[Source]:
    """One source per recording window (:func:`_audio_windows` checked the files and set each row's start)."""
    audio = options.audio
    settings.setdefault("audio", {})[spec.name] = audio.model_dump(mode="json", by_alias=True)
    paths = list(dict.fromkeys(path for path, *_ in files))
    length = math.prod(spec.shape)
    settings["notes"].append(f"{len(files)} window(s) of {length} samples ({length / audio.sample_rate:.3g} s) from "
                             f"{len(paths)} .wav file(s) at {audio.sample_rate} Hz (full scale {audio.full_scale:g}); "
                             "the end of each file shorter than a window left out")
    infos = probe_wavs(paths)
    stereo = sum(info.channels > 1 for info in infos)
    if stereo:
        settings["notes"].append(f"{stereo} .wav file(s) with several channels mixed to mono")
    resampled = {info.rate for info in infos if info.rate != audio.sample_rate}
    if resampled:
        settings["notes"].append(f"{sum(info.rate in resampled for info in infos)} .wav file(s) at "
                                 f"{', '.join(map(str, sorted(resampled)))} Hz resampled to {audio.sample_rate} Hz")
    rate = audio.sample_rate if resampled else None
    reporter.advance(len(files))
    return [AudioSource(spec, path, root, start or 0, audio.full_scale, rate) for path, root, start in files]


COLUMN_BUILDERS: dict[str, Callable[..., list[Source]]] = {
    "npy": _npy_sources, "image": _image_sources, "audio": _audio_sources}
"""Check-and-build function of each file kind, keyed by the kinds of :data:`FILE_KINDS`."""
