"""Reading and writing config mappings as JSON or YAML, chosen by file suffix."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from compiler_core.errors import ArgumentError, ConfigError
from compiler_core.fileio import atomic_write_text

SUFFIXES = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}
"""Config file suffixes and their format."""

_YAML_HEADER = "# qb Compiler configuration. Keys are camelCase; unknown keys are rejected.\n"


def config_format(path: str | os.PathLike) -> str | None:
    """``"json"``, ``"yaml"`` or None for an unsupported suffix."""
    return SUFFIXES.get(Path(path).suffix.lower())


def read_mapping(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a JSON or YAML file whose top level is a mapping (an empty YAML file is ``{}``).

    Raises:
        ConfigError: unsupported suffix, unreadable file, bad syntax or a top level that is no mapping.
    """
    file = os.fspath(path)
    kind = config_format(path)
    if kind is None:
        raise ConfigError(f"{file}: unsupported config file type '{Path(path).suffix}'.",
                          hint="Use a .json, .yaml or .yml file.", file=file)
    text = _read_text(file)
    data = _parse_json(text, file) if kind == "json" else _parse_yaml(text, file)
    if data is None and kind == "yaml":
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a mapping of config keys at the top level, "
                          f"got {type(data).__name__}.", hint="See `qbcompiler dump-config`.", file=file)
    return data


def _read_text(file: str) -> str:
    try:
        return Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ConfigError(f"{file}: cannot read config file: {reason}.",
                          hint="Check the path and permissions.", file=file) from error


def _parse_json(text: str, file: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{file}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}.",
                          hint="Fix the syntax at that position.", file=file, line=error.lineno) from error


def _parse_yaml(text: str, file: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{file}{where}: invalid YAML: {problem}.", hint="Fix the syntax at that position.",
                          file=file, line=mark.line + 1 if mark is not None else None) from error


def dumps_mapping(data: dict[str, Any], kind: str) -> str:
    """Serialize ``data`` as ``"json"`` or ``"yaml"`` text (keys in the given order)."""
    if kind == "json":
        return json.dumps(data, indent=2) + "\n"
    return _YAML_HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def write_mapping(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write ``data`` atomically as JSON or YAML, chosen by the suffix of ``path``.

    Raises:
        ArgumentError: the suffix is not .json, .yaml or .yml.
        OutputWriteError: the file cannot be written.
    """
    kind = config_format(path)
    if kind is None:
        raise ArgumentError(f"Cannot write a config to '{os.fspath(path)}': unsupported file type.",
                            hint="Use a .json, .yaml or .yml file name.", file=os.fspath(path))
    atomic_write_text(path, dumps_mapping(data, kind))
