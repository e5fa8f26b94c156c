"""Rebuild a compiled MXQ byte for byte: the ``qbcompiler compile`` command and the Python call that do it.

The MXQ's ``meta`` section records the resolved config the compile used, including its model path
(``modelPaths``), calibration data (``calibDataPaths``) and save path (``savePaths``). The save path
is part of the file's bytes, so a reproduction writes to that same path: the command rebuilds the
MXQ in place (identical bytes when nothing changed). The config travels as a JSON file beside the
MXQ: an existing one with exactly the recorded content (a GUI run's ``compile_config.json``, a sweep
point's ``<name>.config.json``) or ``<name>.reproduce.json`` written there.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler_core.errors import ArgumentError
from compiler_core.fileio import atomic_write_text, sha256_file

logger = logging.getLogger(__name__)

CONFIG_SUFFIX = ".reproduce.json"


@dataclass(frozen=True)
class Reproduction:
    """What rebuilds one MXQ: all paths absolute (as the compile recorded them).

    Attributes:
        model: The MBLT (or source model) the compile read.
        config_path: JSON CompileConfig with the recorded settings.
        save_path: Where the MXQ is written (the recorded save path: it is part of the MXQ's bytes).
        calib_data_path: Calibration data paths (empty with random calibration).
    """

    model: str
    config_path: str
    save_path: str
    calib_data_path: tuple[str, ...] = ()

    def command(self, program: str = "qbcompiler") -> str:
        """The shell command (POSIX quoting); ``program`` is the CLI's name (``qbcompiler``)."""
        calib = [arg for path in self.calib_data_path for arg in ("--calib-data-path", path)]
        return shlex.join([program, "compile", "--model", self.model, *calib, "--compile-config", self.config_path,
                           "--output", self.save_path])

    def python(self) -> str:
        """The Python call (``compiler_core.api.mxq_compile``)."""
        calib = list(self.calib_data_path) or None
        return (f"from compiler_core.api import mxq_compile\n"
                f"mxq_compile({self.model!r}, calib_data_path={calib!r}, save_path={self.save_path!r}, "
                f"compile_config={self.config_path!r})")


def reproduction_of(mxq_path: str | Path) -> Reproduction:
    """The reproduction of ``mxq_path``, read from its recorded config (may write ``<name>.reproduce.json``).

    Raises:
        MxqFormatError: ``mxq_path`` is not a readable MXQ.
        ArgumentError: the MXQ records no config with a model and save path, or its MBLT changed since.
        OutputWriteError: the config file cannot be written beside the MXQ.
    """
    from compiler_core.mxq.container import read_mxq

    mxq = Path(mxq_path)
    meta = read_mxq(mxq, mmap=True).meta
    config = meta.get("config")
    if not isinstance(config, dict) or not config.get("modelPaths") or not config.get("savePaths"):
        raise ArgumentError(f"'{mxq.name}' records no compile config to reproduce it from.",
                            hint="Only MXQs compiled by this compiler can be reproduced.", file=str(mxq))
    model = str(config["modelPaths"][0])
    _check_model(mxq, model, meta.get("mblt_sha256"))
    calib = () if config.get("useRandomCalib") else tuple(str(p) for p in config.get("calibDataPaths") or ())
    return Reproduction(model, str(config_file(mxq, config)), str(config["savePaths"][0]), calib)


def _check_model(mxq: Path, model: str, sha256: Any) -> None:
    """An MBLT that changed since the compile cannot give the same bytes: say so instead."""
    path = Path(model)
    if not path.is_file():
        raise ArgumentError(f"The model '{model}' that '{mxq.name}' was compiled from no longer exists.",
                            hint="Restore the model file, or compile again.", file=model)
    if path.suffix == ".mblt" and sha256 and sha256_file(path) != sha256:
        raise ArgumentError(f"The MBLT '{model}' changed since '{mxq.name}' was compiled; the command would not "
                            "rebuild the same MXQ.", hint="Compile again to get a reproducible run.", file=model)


def config_file(mxq: Path, config: dict[str, Any]) -> Path:
    """A JSON file beside ``mxq`` holding exactly ``config``: an existing one, else ``<name>.reproduce.json``."""
    for candidate in (mxq.parent / "compile_config.json", mxq.with_suffix(".config.json"),
                      mxq.with_suffix(CONFIG_SUFFIX)):
        try:
            if json.loads(candidate.read_text(encoding="utf-8")) == config:
                return candidate.resolve()
        except (OSError, ValueError):
            continue
    target = mxq.with_suffix(CONFIG_SUFFIX)
    logger.info("writing the recorded config of %s to %s", mxq.name, target)
    return Path(atomic_write_text(target, json.dumps(config, indent=2))).resolve()
