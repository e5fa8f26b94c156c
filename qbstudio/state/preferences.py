"""Per-user preferences (recent files, last folders, window layout) and the user folders, Qt-free."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from compiler_core.fileio import atomic_write_text

logger = logging.getLogger(__name__)

APP_NAME = "qbstudio"
APP_AUTHOR = "qbstudio"
HOME_ENV = "QBSTUDIO_HOME"
AUTOSAVE_SUFFIX = ".qbproj"
"""The project file suffix (``qbstudio.state.project.PROJECT_SUFFIX``), for autosaves."""
MAX_RECENT = 10


@dataclass(frozen=True)
class AppDirs:
    """The folders the workbench writes to.

    Attributes:
        config: Preferences.
        data: Untitled projects' work folders and autosaves.
        log: Log files.
    """

    config: Path
    data: Path
    log: Path

    @classmethod
    def default(cls) -> AppDirs:
        """platformdirs' user folders, or all under ``$QBSTUDIO_HOME`` when that is set (tests, portable)."""
        home = os.environ.get(HOME_ENV)
        if home:
            root = Path(home)
            return cls(root / "config", root / "data", root / "log")
        return cls(Path(platformdirs.user_config_dir(APP_NAME, APP_AUTHOR)),
                   Path(platformdirs.user_data_dir(APP_NAME, APP_AUTHOR)),
                   Path(platformdirs.user_log_dir(APP_NAME, APP_AUTHOR)))

    @property
    def preferences_file(self) -> Path:
        """The preferences JSON."""
        return self.config / "preferences.json"

    @property
    def log_file(self) -> Path:
        """The application log."""
        return self.log / "qbstudio.log"

    @property
    def untitled_dir(self) -> Path:
        """Parent of untitled projects' work folders."""
        return self.data / "untitled"

    @property
    def autosave_dir(self) -> Path:
        """Where untitled projects are autosaved."""
        return self.data / "autosave"

    def prune_untitled(self, min_age_s: float = 3600.0) -> list[Path]:
        """Delete untitled work folders no autosave refers to, untouched for ``min_age_s``; returns them.

        An untitled project is autosaved as ``autosave/<id>.qbproj`` beside its work folder ``untitled/<id>``
        once it holds a model. A folder without that file is a project that was saved elsewhere (its work
        folder was copied beside the saved file), or one that never held a model: nothing to recover. The age
        keeps the folder of another running window that has not autosaved yet.
        """
        if not self.untitled_dir.is_dir():
            return []
        now, pruned = time.time(), []
        for folder in self.untitled_dir.iterdir():
            if not folder.is_dir() or (self.autosave_dir / f"{folder.name}{AUTOSAVE_SUFFIX}").exists():
                continue
            if now - _newest_mtime(folder) < min_age_s:
                continue
            shutil.rmtree(folder, ignore_errors=True)
            pruned.append(folder)
        if pruned:
            logger.info("removed %d untitled work folder(s) no autosave refers to", len(pruned))
        return pruned


def _newest_mtime(folder: Path) -> float:
    """The newest modification time of ``folder`` and the files under it."""
    return max([folder.stat().st_mtime] + [item.stat().st_mtime for item in folder.rglob("*")])


@dataclass
class Preferences:
    """Recent projects and models, last folders by purpose, and the window layout.

    Attributes:
        recent_projects: Newest first.
        recent_models: Newest first.
        last_dirs: Purpose (``model``, ``project``, ``calibration``, ``config``) -> folder.
        window: Opaque window-layout strings the GUI stores (``geometry``, ``state``, ``tab``, ``splitters``).
    """

    recent_projects: list[str] = field(default_factory=list)
    recent_models: list[str] = field(default_factory=list)
    last_dirs: dict[str, str] = field(default_factory=dict)
    window: dict[str, Any] = field(default_factory=dict)

    def add_recent_project(self, path: str | os.PathLike) -> None:
        """Put ``path`` first in the recent projects (deduplicated, at most MAX_RECENT)."""
        self.recent_projects = _push(self.recent_projects, path)

    def add_recent_model(self, path: str | os.PathLike) -> None:
        """Put ``path`` first in the recent models."""
        self.recent_models = _push(self.recent_models, path)

    def remember_dir(self, purpose: str, path: str | os.PathLike) -> None:
        """Remember the folder of ``path`` (or ``path`` itself if it is a folder) for ``purpose``."""
        folder = Path(path)
        self.last_dirs[purpose] = str(folder if folder.is_dir() else folder.parent)

    def last_dir(self, purpose: str) -> str:
        """The remembered folder for ``purpose`` ("" if none or gone)."""
        folder = self.last_dirs.get(purpose, "")
        return folder if folder and Path(folder).is_dir() else ""

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically as JSON."""
        atomic_write_text(path, json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Preferences:
        """Read preferences; a missing or damaged file gives the defaults (and a warning)."""
        file = Path(path)
        if not file.is_file():
            return cls()
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
            return cls(**{key: value for key, value in data.items() if key in cls.__dataclass_fields__})
        except (OSError, ValueError, TypeError) as error:
            logger.warning("ignoring unreadable preferences %s: %s", file, error)
            return cls()


def _push(items: list[str], path: str | os.PathLike) -> list[str]:
    entry = str(Path(path).absolute())
    return [entry, *[item for item in items if item != entry]][:MAX_RECENT]
