"""Layering a config from defaults, a preset, a file, sub-config objects and explicit arguments."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Mapping
from functools import reduce
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.alias_generators import to_camel

from compiler_core.config.models import CompileConfig
from compiler_core.errors import ArgumentError

logger = logging.getLogger(__name__)


def _top(field: str) -> Callable[[Any], dict[str, Any]]:
    return lambda value: {field: value}


EXPLICIT_ARGUMENTS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "model_path": _top("model_paths"),
    "calib_data_path": _top("calib_data_paths"),
    "save_path": _top("save_paths"),
    "use_random_calib": _top("use_random_calib"),
    "inference_scheme": _top("inference_scheme"),
    "cpu_offload": _top("cpu_offload"),
    "cpu_layers": _top("cpu_layers"),
    "input_shape_dict": _top("input_shape_dict"),
    "device": _top("device"),
    "image_channels": _top("image_channels"),
    "target_device": _top("target_device"),
    "backend": _top("backend"),
    "analysis_holdout": _top("analysis_holdout"),
    "layer_bias_correction": lambda value: {"layer_bias_correction": {"apply": value}},
}
"""Explicit (snake_case) arguments accepted by ``resolve_config`` -> the config fields they set."""

SUB_CONFIGS: dict[str, str] = {
    "uint8_input_config": "uint8_input",
    "preprocessing_config": "preprocessing",
    "calibration_config": "calibration",
    "bit_config": "bit",
    "layer_bias_correction_config": "layer_bias_correction",
    "equivalent_transformation_config": "equivalent_transformation",
    "cross_layer_equalization_config": "cross_layer_equalization",
    "mixed_precision_config": "mixed_precision",
    "llm_config": "llm",
    "save_sample_config": "save_sample",
}
"""Sub-config argument names -> the CompileConfig section each one replaces field by field."""


VENDOR_EQUIVALENTS: dict[str, str] = {
    "hessian_quant_config": "bit_config={'weightRounding': 'gptq'} (GPTQ rounding on each convolution's Hessian; "
                            "llm_config={'gptq': True} for decoder LLMs)",
}
"""Vendor arguments this compiler spells differently -> what to pass instead (named in the unknown-argument error)."""


def resolve_config(compile_config: str | os.PathLike | Mapping[str, Any] | CompileConfig | None = None,
                   config_preset: str | None = None,
                   sub_configs: Mapping[str, Mapping[str, Any] | BaseModel] | None = None,
                   **explicit_args: Any) -> CompileConfig:
    """Build the effective config; later layers override earlier ones key by key.

    Priority, highest first: explicit arguments > sub-config objects > config file > preset >
    defaults. Nested sections are deep-merged; lists are replaced whole. Only keys a layer sets
    count (keys present in a file or dict, fields given to or assigned on a model); arguments that
    are None are ignored.

    Args:
        compile_config: A .json/.yaml path, a mapping, or a CompileConfig.
        config_preset: A preset name (see ``list_presets``).
        sub_configs: Section configs by argument name (``calibration_config``...), as mappings or
            models. ``*_config`` keyword arguments are accepted here too.
        **explicit_args: Explicit arguments such as ``inference_scheme`` or ``calib_data_path``.

    Raises:
        ConfigError: a layer is invalid (the message names the layer, the key and the fix).
        ArgumentError: an unknown argument or sub-config name, or a value of the wrong kind.
    """
    routed = {name: explicit_args.pop(name) for name in list(explicit_args) if name in SUB_CONFIGS}
    layers = []
    if config_preset is not None:
        layers.append(explicit_fields(CompileConfig.from_preset(config_preset)))
    if compile_config is not None:
        layers.append(explicit_fields(_load_compile_config(compile_config)))
        if config_preset is not None:
            _warn_preset_overridden(config_preset, layers[0], layers[1])
    layers.extend(_sub_config_layer(name, value) for name, value in {**(sub_configs or {}), **routed}.items()
                  if value is not None)
    layers.append(_explicit_layer(explicit_args))
    return CompileConfig.from_dict(reduce(deep_merge, layers, {}), source="resolved config")


def _warn_preset_overridden(preset: str, preset_layer: Mapping[str, Any], file_layer: Mapping[str, Any]) -> None:
    """Log the preset's keys that the config file sets to other values: the file wins, so the preset does nothing
    there (a config saved from a compile sets every key, so a preset added to it changes nothing at all)."""
    leaves = dict(_leaves(preset_layer))
    in_file = dict(_leaves(file_layer))
    overridden = [path for path, value in leaves.items() if path in in_file and in_file[path] != value]
    if overridden:
        logger.warning("The config file sets %d of the %d key(s) of preset '%s' to other values, and a file comes "
                       "before a preset: %s. Remove those keys from the file to get the preset's.", len(overridden),
                       len(leaves), preset, ", ".join(".".join(to_camel(part) for part in path.split("."))
                                                      for path in overridden))


def _leaves(layer: Mapping[str, Any], prefix: str = ""):
    """(dotted path, value) of every leaf of a nested config layer."""
    for key, value in layer.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _load_compile_config(compile_config: Any) -> CompileConfig:
    if isinstance(compile_config, CompileConfig):
        return compile_config
    if isinstance(compile_config, (str, os.PathLike)):
        return CompileConfig.from_file(compile_config)
    if isinstance(compile_config, Mapping):
        return CompileConfig.from_dict(dict(compile_config), source="compile_config")
    raise ArgumentError(f"compile_config must be a file path, a mapping or a CompileConfig, "
                        f"not {type(compile_config).__name__}.", hint="Pass a .json/.yaml path.")


def _sub_config_layer(name: str, value: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    section = SUB_CONFIGS.get(name)
    if section is None:
        raise ArgumentError(f"Unknown sub-config '{name}'.", hint=f"Valid sub-configs: {', '.join(SUB_CONFIGS)}.")
    expected = CompileConfig.model_fields[section].annotation
    if isinstance(value, BaseModel) and not isinstance(value, expected):
        raise ArgumentError(f"{name} must be a {expected.__name__} or a mapping, not {type(value).__name__}.")
    if isinstance(value, BaseModel):
        return {section: explicit_fields(value)}
    if not isinstance(value, Mapping):
        raise ArgumentError(f"{name} must be a {expected.__name__} or a mapping, not {type(value).__name__}.")
    return explicit_fields(CompileConfig.from_dict({section: dict(value)}, source=name))


def _explicit_layer(explicit_args: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(explicit_args) - set(EXPLICIT_ARGUMENTS))
    instead = [f"for {name} pass {VENDOR_EQUIVALENTS[name]}" for name in unknown if name in VENDOR_EQUIVALENTS]
    if unknown:
        raise ArgumentError(f"Unknown config argument(s): {', '.join(unknown)}" + (f"; {'; '.join(instead)}" if instead
                                                                                   else "") + ".",
                            hint=f"Valid arguments: {', '.join([*EXPLICIT_ARGUMENTS, *SUB_CONFIGS])}.")
    layers = [explicit_fields(CompileConfig.from_dict(EXPLICIT_ARGUMENTS[name](value), source=f"argument {name}"))
              for name, value in explicit_args.items() if value is not None]
    return reduce(deep_merge, layers, {})


def explicit_fields(model: BaseModel) -> dict[str, Any]:
    """The fields of ``model`` that were set explicitly, nested sections included, as a dict."""
    dumped = model.model_dump()
    result: dict[str, Any] = {}
    for name in type(model).model_fields:
        if name not in dumped:
            continue
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            nested = explicit_fields(value)
            if nested or name in model.model_fields_set:
                result[name] = nested
        elif name in model.model_fields_set:
            result[name] = dumped[name]
    return result


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``override``: mappings merge recursively, anything else is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def dump_default_config(output_path: str | os.PathLike, preset: str | None = None) -> Path:
    """Write the default config (or a preset's) in the grouped spelling, atomically.

    The format follows the suffix: ``.json``, ``.yaml`` or ``.yml``.

    Raises:
        ConfigError: unknown preset.
        ArgumentError: unsupported suffix.
        OutputWriteError: the file cannot be written.
    """
    config = CompileConfig.from_preset(preset) if preset is not None else CompileConfig.default_config()
    config.to_file(output_path, grouped=True)
    logger.info("Wrote %s config to %s", preset or "default", output_path)
    return Path(output_path)
