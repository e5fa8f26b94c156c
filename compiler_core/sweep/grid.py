"""Sweep grids: a base compile config plus axes of settings, expanded into one resolved config per point.

A grid file (YAML or JSON) looks like::

    baseConfig: compile_config.yaml      # a path (relative to the grid file) or an inline mapping
    preset: classification               # optional base preset, under baseConfig
    axes:
      calibrationMode: [0, 1, 2, 3]      # named axes, see AXES
      percentile: [0.999, 0.9999]
      biasCorrection: [false, true]
      int16Layers: {none: [], stem: ["/features.0/*"]}   # named sets of layer-name globs
      calibration.maxPercentile.topkRatio: [0.01]         # or any dotted camelCase config key
    maxPoints: 64

Each point's config is, from lowest to highest priority: defaults < preset (the point's ``preset``
axis value, else the grid's) < base config < the point's axis values. Points whose resolved
configs are identical are kept once; the ``percentile`` axis is applied only to points whose mode is
MaxPercentile (1), so ``calibrationMode: [0, 1, 2, 3]`` x ``percentile: [a, b]`` gives 5 points, not 8.
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from compiler_core.config import CalibrationMode, CompileConfig, resolve_config
from compiler_core.config.files import read_mapping
from compiler_core.config.messages import config_error_from_validation
from compiler_core.config.resolve import deep_merge, explicit_fields
from compiler_core.errors import ConfigError, QBCompilerError

logger = logging.getLogger(__name__)

AXES: dict[str, str] = {
    "calibrationMethod": "calibration.method",
    "calibrationMode": "calibration.mode",
    "percentile": "calibration.maxPercentile.percentile",
    "outputMode": "calibration.output",
    "biasCorrection": "layerBiasCorrection.apply",
    "int16Layers": "bit.layerOverrides.activation16Bits",
    "numSamples": "calibration.numSamples",
    "preset": "",
}
"""Named axes -> the dotted config key each one sets (``preset`` selects a preset instead)."""

DEFAULT_MAX_POINTS = 64


class SweepGrid(BaseModel):
    """A validated sweep grid file (camelCase keys, unknown keys rejected)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    base_config: str | dict[str, Any] | None = Field(
        None, description="The compile config every point starts from: a file path or an inline mapping.")
    preset: str | None = Field(None, description="Preset under the base config (unless a preset axis sets one).")
    axes: dict[str, list[Any] | dict[str, Any]] = Field(
        min_length=1, description="Axis name (see AXES) or dotted config key -> values (a list, or a mapping "
                                  "of value names to values).")
    max_points: int = Field(DEFAULT_MAX_POINTS, ge=1, description="Refuse grids with more points than this.")

    @field_validator("axes")
    @classmethod
    def _known_non_empty_axes(cls, axes: dict[str, Any]) -> dict[str, Any]:
        for name, values in axes.items():
            if not values:
                raise ValueError(f"axis '{name}' has no values")
            if name not in AXES and "." not in name and name not in _top_level_keys():
                raise ValueError(f"unknown axis '{name}' (named axes: {', '.join(AXES)}; or a dotted config key "
                                 f"such as calibration.maxPercentile.topkRatio)")
        return axes


@dataclass(frozen=True)
class SweepPoint:
    """One point of a grid.

    Attributes:
        index: 0-based position in the expanded grid.
        name: file-name stem, ``point-00`` ...
        values: axis name -> the value's label (the name in a named-values axis, else the value).
        config: the fully resolved compile config.
    """

    index: int
    name: str
    values: dict[str, Any]
    config: CompileConfig

    @property
    def label(self) -> str:
        """``calibrationMode=2, biasCorrection=True``."""
        return ", ".join(f"{axis}={value}" for axis, value in self.values.items())


def load_grid(grid: str | os.PathLike | Mapping[str, Any] | SweepGrid) -> tuple[SweepGrid, Path | None]:
    """Read and validate a grid (file path, mapping or model); returns it with the folder relative paths use.

    Raises:
        ConfigError: unreadable file, bad YAML/JSON, unknown key or axis, empty axis.
    """
    if isinstance(grid, SweepGrid):
        return grid, None
    folder = None
    source = "sweep grid"
    if isinstance(grid, (str, os.PathLike)):
        folder, source = Path(grid).resolve().parent, Path(grid).name
        grid = read_mapping(grid)
    try:
        return SweepGrid.model_validate(dict(grid)), folder
    except ValidationError as error:
        raise config_error_from_validation(error, source, model=SweepGrid) from error


def expand_grid(grid: SweepGrid, *, folder: Path | None = None,
                on_duplicate: Callable[[dict[str, Any]], None] | None = None, **explicit_args: Any) -> list[SweepPoint]:
    """Every point of ``grid`` (cartesian product of the axes, identical configs kept once).

    Args:
        grid: The validated grid.
        folder: Where a relative ``baseConfig`` path is resolved (the grid file's folder).
        on_duplicate: Receives the axis values of each combination whose config equals an earlier
            point's (instead of the INFO log line saying so).
        **explicit_args: ``resolve_config`` arguments applied to every point (``target_device`` ...).

    Raises:
        ConfigError: a point's config is invalid (the message names the point and the key), or the
            grid has more than ``maxPoints`` points.
    """
    names = list(grid.axes)
    choices = [_labelled(grid.axes[name]) for name in names]
    count = 1
    for values in choices:
        count *= len(values)
    if count > grid.max_points:
        raise ConfigError(f"The sweep grid has {count} points, more than maxPoints ({grid.max_points}).",
                          hint="Drop axis values, or raise maxPoints in the grid file.", key="maxPoints")
    base = _base_layer(grid, folder)
    points: list[SweepPoint] = []
    seen: set[str] = set()
    for combination in itertools.product(*choices):
        values = {name: label for name, (label, _) in zip(names, combination)}
        settings = dict(zip(names, (value for _, value in combination)))
        config = _point_config(grid, base, settings, values, explicit_args)
        if "percentile" in settings and config.calibration.mode != CalibrationMode.MaxPercentile:
            del settings["percentile"], values["percentile"]  # the percentile only matters in MaxPercentile mode
            config = _point_config(grid, base, settings, values, explicit_args)
        identity = config.model_dump_json(by_alias=True)
        if identity in seen:
            if on_duplicate is None:
                logger.info("Sweep point %s has the same config as an earlier point; kept once", values)
            else:
                on_duplicate(values)
            continue
        seen.add(identity)
        points.append(SweepPoint(len(points), f"point-{len(points):02d}", values, config))
    return points


def differing_settings(config: CompileConfig, base: CompileConfig) -> dict[str, Any]:
    """Dotted camelCase keys whose value in ``config`` differs from ``base`` (paths excluded)."""
    ours, theirs = _flatten(_dump(config)), _flatten(_dump(base))
    return {key: value for key, value in ours.items() if theirs.get(key, _MISSING) != value
            and not key.startswith(_PATH_KEYS)}


def base_config(grid: SweepGrid, *, folder: Path | None = None, **explicit_args: Any) -> CompileConfig:
    """The grid's base config resolved with ``explicit_args`` (what each point is compared with)."""
    layer = _base_layer(grid, folder)
    return resolve_config(compile_config=layer, config_preset=grid.preset, **explicit_args)


_MISSING = object()
_PATH_KEYS = ("modelPaths", "calibDataPaths", "savePaths")


def _labelled(values: list[Any] | dict[str, Any]) -> list[tuple[Any, Any]]:
    if isinstance(values, dict):
        return list(values.items())
    return [(_label(value), value) for value in values]


def _label(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _base_layer(grid: SweepGrid, folder: Path | None) -> dict[str, Any]:
    base = grid.base_config
    if base is None:
        return {}
    if isinstance(base, str):
        path = Path(base)
        path = path if path.is_absolute() or folder is None else folder / path
        return explicit_fields(CompileConfig.from_file(path))
    return explicit_fields(CompileConfig.from_dict(copy.deepcopy(base), source="sweep grid baseConfig"))


def _point_config(grid: SweepGrid, base: dict[str, Any], settings: dict[str, Any], labels: dict[str, Any],
                  explicit_args: dict[str, Any]) -> CompileConfig:
    preset = settings.pop("preset", grid.preset)
    layer: dict[str, Any] = {}
    for axis, value in settings.items():
        layer = deep_merge(layer, _nested(AXES.get(axis, axis), value))
    try:
        axis_layer = explicit_fields(CompileConfig.from_dict(layer, source="axis values"))
        return resolve_config(compile_config=deep_merge(base, axis_layer), config_preset=preset, **explicit_args)
    except QBCompilerError as error:
        raise ConfigError(f"Sweep point {labels}: {error.message}", hint=error.hint, **error.fields) from error


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    result: Any = value
    for part in reversed(dotted.split(".")):
        result = {part: result}
    return result


def _dump(config: CompileConfig) -> dict[str, Any]:
    return config.model_dump(mode="json", by_alias=True)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _top_level_keys() -> set[str]:
    return {field.alias or name for name, field in CompileConfig.model_fields.items()}
