"""Where the bundled data files (``resources/``: Netron overlay scripts, the sample project) are.

One resolver for the three ways the code runs:

* **frozen** (the PyInstaller bundle): ``<bundle>/_internal/resources`` (``sys._MEIPASS``);
* **checkout** (``make run``, tests): ``resources/`` beside ``compiler_core/`` when that folder is a
  source tree (it has ``pyproject.toml``), so every worktree reads its own files;
* **installed wheel**: the ``qbstudio_resources`` package, which setuptools maps onto ``resources/``
  at build time, found through :mod:`importlib.resources`.
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import os
import sys
from pathlib import Path

from compiler_core.errors import InternalError

logger = logging.getLogger(__name__)

RESOURCE_PACKAGE = "qbstudio_resources"
SAMPLE_PROJECT = ("samples", "fashion_cnn.qbproj")


@functools.lru_cache(maxsize=1)
def resource_dir() -> Path:
    """The folder that holds the bundled data files.

    Raises:
        InternalError: none of the three places has them (a broken install or bundle).
    """
    for where, candidate in _candidates():
        if candidate is not None and candidate.is_dir():
            logger.debug("Resources from the %s: %s", where, candidate)
            return candidate
    raise InternalError("The application's data files (resources) were not found.",
                        hint="Reinstall qbstudio; a wheel or bundle built from a checkout carries them.")


def resource_path(*parts: str) -> Path:
    """A path under :func:`resource_dir` (it may not exist; callers check)."""
    return resource_dir().joinpath(*parts)


def sample_project() -> Path:
    """The bundled sample project (``fashion_cnn.qbproj``)."""
    return resource_path(*SAMPLE_PROJECT)


def _candidates():
    meipass = getattr(sys, "_MEIPASS", None)
    if getattr(sys, "frozen", False) and meipass:
        yield "bundle", Path(meipass) / "resources"
    root = Path(__file__).resolve().parents[1]
    yield "checkout", root / "resources" if (root / "pyproject.toml").is_file() else None
    yield "installed package", _package_dir()


def _package_dir() -> Path | None:
    try:
        files = importlib.resources.files(RESOURCE_PACKAGE)
    except ModuleNotFoundError:
        return None
    return Path(os.fspath(files)) if isinstance(files, os.PathLike) else None  # a folder, not a zip
