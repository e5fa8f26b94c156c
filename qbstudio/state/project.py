"""The ``.qbproj`` project: model, MBLT, calibration, compile settings and runs, saved atomically as JSON.

Paths inside the project folder are stored relative to the project file, so a project folder can
be moved or copied whole. A *template* project (the bundled samples) is never written back: it
opens as an untitled copy whose work folder lives in the user's data folder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Any

from compiler_core.errors import OutputWriteError, QBCompilerError
from compiler_core.fileio import atomic_write_text, sha256_file
from qbstudio.state.runs import RunHistory, RunRecord
from qbstudio.state.settings import CompileSettings

logger = logging.getLogger(__name__)

PROJECT_SUFFIX = ".qbproj"
PROJECT_FORMAT = "qbstudio-project"
PROJECT_VERSION = 1
WORK_SUFFIX = ".qbstudio"
MBLT_NAME = "model.mblt"
PROJECT_LOCK_NAME = "open.lock"
"""The lock file in the work folder of a project open in a window (the workbench's QLockFile)."""


class ProjectError(QBCompilerError):
    """A project file is unreadable, malformed or of an unknown version."""

    code = "PROJECT_ERROR"


@dataclass
class ModelRef:
    """The source model of a project.

    Attributes:
        path: Absolute path of the model file (or folder).
        backend: Frontend name (``onnx`` ...), as detected or chosen.
        sha256: Content hash when the model was imported ("" for folders).
        input_shapes: Static shapes chosen for inputs with dynamic dimensions.
        output_names: Tensors the graph was cut at on import (empty: the model's own outputs).
        constant_inputs: Scalar inputs bound to constants on import (a TorchScript ``forward``'s ``sr: int``).
        allow_pickle: The user trusted this pickled torch module, whose loading runs code stored in it.
        submodule: The child module of a TorchScript file compiled instead of the whole (``_model``); "" for all.
    """

    path: str
    backend: str
    sha256: str = ""
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    output_names: list[str] = field(default_factory=list)
    constant_inputs: dict[str, float] = field(default_factory=dict)
    allow_pickle: bool = False
    submodule: str = ""

    def changed_on_disk(self) -> bool:
        """Whether the file's hash differs from the one recorded at import."""
        if not self.sha256 or not Path(self.path).is_file():
            return False
        return sha256_file(self.path) != self.sha256


@dataclass
class CalibrationSource:
    """Where calibration data comes from.

    Attributes:
        path: Folder, ``.txt`` list or JSON manifest (absolute), or None.
        use_random: Random data for a smoke test when no path is given.
        max_samples: Use at most this many samples (None: all).
    """

    path: str | None = None
    use_random: bool = False
    max_samples: int | None = None


@dataclass
class Project:
    """Everything the workbench saves in a ``.qbproj`` file.

    Attributes:
        name: Display name.
        work_dir: Folder for the MBLT, runs and calibration sets.
        path: The ``.qbproj`` file, or None while untitled.
        model: The imported model, or None.
        calibration: The calibration source.
        settings: The compile settings (with the preprocessing pipeline).
        runs: Finished compiles.
        template: Opened from a template (never written back to ``template_path``).
        config_file: The config file the settings were loaded from, if any (informative).
        file_run_mxqs: The MXQ paths of the runs the project file held when this window last read or wrote it: a run in
            the file outside this set was added by another window (kept on save), one in it but not in :attr:`runs`
            was deleted here.
        adopted_run_ids: The runs the last :meth:`save` took over from the file (another window's compiles).
    """

    name: str
    work_dir: Path
    path: Path | None = None
    model: ModelRef | None = None
    calibration: CalibrationSource = field(default_factory=CalibrationSource)
    settings: CompileSettings = field(default_factory=CompileSettings)
    runs: RunHistory = field(default_factory=RunHistory)
    template: bool = False
    config_file: str | None = None
    file_run_mxqs: set[Path] = field(default_factory=set, repr=False)
    adopted_run_ids: list[int] = field(default_factory=list, repr=False)

    @property
    def mblt_path(self) -> Path:
        """Where the parsed model is kept (inside the work folder)."""
        return self.work_dir / MBLT_NAME

    @property
    def has_mblt(self) -> bool:
        """Whether the parsed model exists on disk."""
        return self.mblt_path.is_file()

    def run_dir(self, run_id: int) -> Path:
        """Folder of run ``run_id`` inside the work folder."""
        return self.work_dir / "runs" / f"run-{run_id:03d}"

    def claim_run_dir(self) -> int:
        """The id of a new run whose folder is created now: the next id whose folder nobody holds (another window
        compiling in this project, a run deleted from the list whose files stay).

        Raises:
            OutputWriteError: the work folder cannot be written.
        """
        run_id = self.runs.next_id()
        while True:
            try:
                self.run_dir(run_id).mkdir(parents=True)
                return run_id
            except FileExistsError:
                run_id += 1
            except OSError as error:
                raise OutputWriteError(f"Cannot create the run folder in '{self.work_dir}': "
                                       f"{error.strerror or error}.", hint="Save the project to a folder you can "
                                       "write to (File › Save Project As…).", file=str(self.run_dir(run_id))) from error

    @property
    def writable(self) -> bool:
        """Whether :meth:`save` can write back to :attr:`path` (titled and not a template)."""
        return self.path is not None and not self.template

    # ------------------------------------------------------------------ serialisation

    def to_dict(self, base: Path) -> dict[str, Any]:
        """JSON-ready form with paths relative to ``base`` where they lie below it."""
        model = None
        if self.model is not None:
            model = {**asdict(self.model), "path": _store(self.model.path, base)}
        calibration = {**asdict(self.calibration), "path": _store(self.calibration.path, base)}
        return {"format": PROJECT_FORMAT, "version": PROJECT_VERSION, "name": self.name,
                "workDir": _store(str(self.work_dir), base), "model": model, "calibration": calibration,
                "settings": self.settings.to_dict(), "configFile": _store(self.config_file, base),
                "runs": [_store_run(run, base) for run in self.runs.to_list()]}

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the project to ``path`` (default: :attr:`path`) atomically; it becomes titled.

        Saving to a new location moves the work folder's contents beside the new file.

        Raises:
            ProjectError: no path given for an untitled or template project.
            OutputWriteError: the file cannot be written.
        """
        target = Path(path) if path is not None else (self.path if self.writable else None)
        if target is None:
            raise ProjectError("This project has no file yet.", hint="Use File > Save Project As.")
        target = target.with_suffix(PROJECT_SUFFIX).absolute()
        before = (self.path, self.template, self.name, self.work_dir, self.calibration.path,
                  [run.mxq_path for run in self.runs.runs])
        new_work_dir = target.with_suffix(WORK_SUFFIX)
        made_work_dir = not new_work_dir.exists()
        try:
            if target != self.path or self.template:
                self._relocate(new_work_dir)
            self.adopted_run_ids = self._adopt_runs_saved_elsewhere(target) if target == self.path else []
            self.path, self.template = target, False
            self.name = target.stem
            atomic_write_text(target, json.dumps(self.to_dict(target.parent), indent=2) + "\n")
            self.file_run_mxqs = self._run_mxqs()
        except (OSError, QBCompilerError) as error:  # not saved: the project stays as it was (a read-only folder)
            self.path, self.template, self.name, self.work_dir, self.calibration.path, mxq_paths = before
            for run, mxq_path in zip(self.runs.runs, mxq_paths):
                run.mxq_path = mxq_path
            if made_work_dir and new_work_dir != self.work_dir:
                shutil.rmtree(new_work_dir, ignore_errors=True)
            if isinstance(error, QBCompilerError):
                raise
            raise OutputWriteError(f"Cannot write to '{target.parent}': {error.strerror or error}.",
                                   hint="Choose a folder you can write to (File › Save Project As…).",
                                   file=str(error.filename or target)) from error
        logger.info("project saved to %s", target)
        return target

    def _adopt_runs_saved_elsewhere(self, target: Path) -> list[int]:
        """Take over the runs that another window (the same project open twice) wrote to ``target`` since this one
        last read or wrote it, so that this save does not drop them; returns their ids."""
        try:
            data = _read_json(target)
            other = Project(name=self.name, work_dir=self.work_dir)
            other._load_parts(data, target.parent)
        except (ProjectError, OSError) as error:  # gone or damaged: nothing to keep from it
            logger.info("not merging runs from %s: %s", target, error)
            return []
        known = self._run_mxqs() | self.file_run_mxqs
        adopted = [run for run in other.runs.runs if Path(run.mxq_path) not in known]
        for run in adopted:
            if self.runs.get(run.run_id) is not None:  # both numbered a run alike (a sweep's points have no run folder)
                run.run_id = self.runs.next_id()
            self.runs.add(run)
        self.runs.runs.sort(key=lambda run: run.run_id)
        if adopted:
            logger.warning("%s was changed by another window: kept its run(s) %s", target.name,
                           ", ".join(f"#{run.run_id}" for run in adopted))
        return [run.run_id for run in adopted]

    def _run_mxqs(self) -> set[Path]:
        return {Path(run.mxq_path) for run in self.runs.runs}

    def write_copy(self, path: str | os.PathLike) -> Path:
        """Write the project as it is to ``path`` (an autosave of an untitled project); state unchanged."""
        target = Path(path).absolute()
        return atomic_write_text(target, json.dumps(self.to_dict(target.parent), indent=2) + "\n")

    def _relocate(self, new_work_dir: Path) -> None:
        old = self.work_dir
        if old.resolve() == new_work_dir.resolve():
            return
        if old.is_dir():
            shutil.copytree(old, new_work_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(PROJECT_LOCK_NAME))
        for run in self.runs.runs:
            run.mxq_path = _rebase(run.mxq_path, old, new_work_dir)
        if self.calibration.path:
            self.calibration.path = _rebase(self.calibration.path, old, new_work_dir)
        self.work_dir = new_work_dir

    @classmethod
    def new(cls, name: str, work_dir: str | os.PathLike) -> Project:
        """An untitled project working in ``work_dir``."""
        return cls(name=name, work_dir=Path(work_dir))

    @classmethod
    def load(cls, path: str | os.PathLike, *, scratch_dir: str | os.PathLike | None = None) -> Project:
        """Read a ``.qbproj`` file.

        Args:
            path: The project file.
            scratch_dir: Work folder for a template project (required to open one).

        Raises:
            ProjectError: unreadable, not a project, another version, or invalid settings.
        """
        path = Path(path).absolute()
        data = _read_json(path)
        for key, annotation in (("name", str | None), ("workDir", str | None), ("template", bool | None)):
            _field_type(data, key, annotation, "the project")
        base = path.parent
        template = bool(data.get("template"))
        if template and scratch_dir is None:
            raise ProjectError(f"'{path.name}' is a template project.", hint="Open it from the workbench.")
        work_dir = Path(scratch_dir) if template else _resolve(data.get("workDir"), base) or path.with_suffix(
            WORK_SUFFIX)
        project = cls(name=data.get("name") or path.stem, work_dir=Path(work_dir), path=path, template=template)
        project._load_parts(data, base)
        return project

    def _load_parts(self, data: dict[str, Any], base: Path) -> None:
        _field_type(data, "configFile", str | None, "the project")
        model = data.get("model")
        if model:
            model = _typed(model, ModelRef, "the model entry")
            self.model = ModelRef(**{**model, "path": _resolve(model["path"], base)})
        calibration = _typed(data.get("calibration") or {}, CalibrationSource, "the calibration entry")
        self.calibration = CalibrationSource(**{**calibration, "path": _resolve(calibration.get("path"), base)})
        self.config_file = _resolve(data.get("configFile"), base)
        self.settings = _settings(data, self.config_file)
        runs = data.get("runs", [])
        if not isinstance(runs, list):
            raise ProjectError("The project's 'runs' is not a list.", hint=_DAMAGED_HINT)
        self.runs = RunHistory.from_list([
            {**(checked := _typed(run, RunRecord, f"run {index + 1}")), "mxq_path": _resolve(checked["mxq_path"], base)}
            for index, run in enumerate(runs)])
        self.file_run_mxqs = self._run_mxqs()


_DAMAGED_HINT = "The project file is damaged or was edited by hand; restore it from a backup."


def _typed(data: Any, kind: type, what: str) -> dict[str, Any]:
    """The fields of dataclass ``kind`` in ``data``, each checked against its annotation (unknown keys dropped).

    Raises:
        ProjectError: ``data`` is not an object, a required field is missing or a field has the wrong type.
    """
    if not isinstance(data, dict):
        raise ProjectError(f"In the project file, {what} is not an object.", hint=_DAMAGED_HINT)
    hints = typing.get_type_hints(kind)
    for name, spec in kind.__dataclass_fields__.items():
        required = spec.default is MISSING and spec.default_factory is MISSING
        if required and name not in data:
            raise ProjectError(f"In the project file, {what} has no '{name}'.", hint=_DAMAGED_HINT)
        _field_type(data, name, hints[name], what)
    return {name: data[name] for name in kind.__dataclass_fields__ if name in data}


def _field_type(data: dict[str, Any], name: str, annotation: Any, what: str) -> None:
    if name not in data:
        return
    allowed = tuple(typing.get_origin(arg) or arg for arg in typing.get_args(annotation)) \
        if isinstance(annotation, types.UnionType) else (typing.get_origin(annotation) or annotation,)
    allowed = tuple(type(None) if arg is None else arg for arg in allowed)
    if float in allowed:
        allowed += (int,)
    value = data[name]
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        names = " or ".join("null" if arg is type(None) else arg.__name__ for arg in allowed)
        raise ProjectError(f"In the project file, {what} has '{name}' = {json.dumps(value)[:60]}; expected {names}.",
                           hint=_DAMAGED_HINT)


def _settings(data: dict[str, Any], config_file: str | None) -> CompileSettings:
    _field_type(data, "settings", dict | None, "the project")
    try:
        if data.get("settings"):
            return CompileSettings.from_dict(data["settings"])
        settings = CompileSettings()
        if config_file:
            settings.load(config_file)
        return settings
    except QBCompilerError as error:
        raise ProjectError(f"The project's compile settings are invalid: {error.message}",
                           hint=error.hint) from error


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ProjectError(f"Cannot read project '{path}': {getattr(error, 'strerror', None) or error}.",
                           hint="Check the path and permissions.", file=str(path)) from error
    except ValueError as error:
        raise ProjectError(f"'{path.name}' is not valid JSON: {error}.", hint="Restore it from a backup.",
                           file=str(path)) from error
    if not isinstance(data, dict) or data.get("format") != PROJECT_FORMAT:
        raise ProjectError(f"'{path.name}' is not a qb Studio project.", hint="Open a .qbproj file.",
                           file=str(path))
    if data.get("version") != PROJECT_VERSION:
        raise ProjectError(f"'{path.name}' has project version {data.get('version')}; this build reads "
                           f"{PROJECT_VERSION}.", hint="Open it with a matching qb Studio.", file=str(path))
    return data


def _store(value: str | None, base: Path) -> str | None:
    """Relative to ``base`` if below it, else absolute (POSIX separators for portability)."""
    if not value:
        return value
    target = Path(value).absolute()
    try:
        return target.relative_to(base.absolute()).as_posix()
    except ValueError:
        return str(target)


def _resolve(value: str | None, base: Path) -> str | None:
    if not value:
        return value
    return str(Path(os.path.normpath(base / value)))


def _store_run(run: dict[str, Any], base: Path) -> dict[str, Any]:
    return {**run, "mxq_path": _store(run.get("mxq_path"), base)}


def _rebase(value: str, old: Path, new: Path) -> str:
    try:
        return str(new / Path(value).relative_to(old))
    except ValueError:
        return value
