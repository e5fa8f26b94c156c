"""CompileSettings: the compile configuration the workbench edits, kept as a validated CompileConfig."""

from __future__ import annotations

import copy
import logging
import os
import re
import typing
from typing import Any

from pydantic import BaseModel

from compiler_core.config import CompileConfig, deep_merge, describe_presets, preset_names
from compiler_core.config.presets import preset_config

logger = logging.getLogger(__name__)

DEFAULT_DEVICE = "aries-rb"
INT16_PATH = "bit.layerOverrides.activation16Bits"
KEPT_ON_RESET = ("targetDevice", "inferenceScheme", "imageChannels", "preprocessing", "uint8Input")
"""Config keys "Reset to defaults" keeps: the target and what the Calibration tab set for the model's data."""
MIXED_TARGET_NAMES = {"cosine": "cosine", "sqnrDb": "SQNR dB", "top1": "top-1"}
CHOICE_LABELS: dict[str, dict[int, str]] = {
    "calibration.method": {0: "Per tensor, symmetric", 1: "Concat-shared, symmetric", 2: "Per tensor, zero point",
                           3: "Concat-shared, zero point"},
    "calibration.output": {0: "Per layer", 1: "Per channel (not implemented)", 2: "Sigmoid (not implemented)"},
    "calibration.mode": {0: "Max", 1: "Percentile", 2: "Histogram (KL)", 3: "MSE search"},
}
"""The Compile tab's words for the config's numbered choices, by dotted key: the options, the sweep grid, the runs'
settings line and the comparison say the same (the runs table said "method WChALayer" for "Per tensor, symmetric")."""
"""Automatic mixed precision's target kinds as the runs table names them."""


class CompileSettings:
    """The current CompileConfig plus the preset last applied; every change is validated at once.

    Values are addressed by dotted camelCase paths of the config file schema
    (``"calibration.maxPercentile.percentile"``), so the GUI, the CLI files and this object share
    one vocabulary.

    Args:
        config: Starting configuration (defaults, targeting :data:`DEFAULT_DEVICE`, if omitted).
        preset: Name of the preset the configuration came from, if any.
        preset_edited: Whether settings were changed after that preset was applied.
    """

    def __init__(self, config: CompileConfig | None = None, preset: str | None = None,
                 preset_edited: bool = False) -> None:
        self._config = config or CompileConfig(target_device=DEFAULT_DEVICE)
        if not self._config.target_device:
            self._config = self._config.model_copy(update={"target_device": DEFAULT_DEVICE})
        self.preset = preset
        self.preset_edited = bool(preset and preset_edited)

    @property
    def config(self) -> CompileConfig:
        """The validated configuration (a copy is not made: treat it as read-only)."""
        return self._config

    @property
    def device(self) -> str:
        """The target device string."""
        return self._config.target_device or DEFAULT_DEVICE

    def get(self, path: str) -> Any:
        """The JSON value at dotted camelCase ``path`` (e.g. ``"calibration.mode"``)."""
        node: Any = self._config.to_dict()
        for key in path.split("."):
            node = node[key]
        return node

    def set(self, path: str, value: Any) -> None:
        """Set the value at dotted ``path``, validating the whole config.

        Raises:
            ConfigError: the value is not valid there (the config is left unchanged).
        """
        data = self._config.to_dict()
        node = data
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
        self._config = CompileConfig.from_dict(data, source="settings")
        if self.preset and path.split(".")[0] not in KEPT_ON_RESET:  # the model, its data, the target: no edit
            self.preset_edited = True

    def set_device(self, name: str) -> str:
        """Target ``name``; an inference scheme the device lacks falls back to ``single``.

        Returns:
            The inference scheme in effect afterwards.

        Raises:
            ArgumentError: unknown device string.
        """
        from compiler_core.targets import get_device  # imports onnx: not at start-up

        profile = get_device(name)
        scheme = self._config.inference_scheme
        if scheme not in allowed_schemes(profile.name):
            logger.info("inference scheme %s is not available on %s; using single", scheme, profile.name)
            scheme = "single"
        self._config = self._config.model_copy(update={"target_device": profile.name, "inference_scheme": scheme})
        return scheme

    def set_scheme(self, scheme: str) -> None:
        """Set the inference scheme after checking it against the device.

        Raises:
            ArgumentError: the device does not offer ``scheme``.
        """
        from compiler_core.targets import validate_inference_scheme

        validate_inference_scheme(self.device, scheme)
        self.set("inferenceScheme", scheme)

    def apply_preset(self, name: str) -> None:
        """Layer preset ``name`` over the current settings (device and scheme are kept).

        Raises:
            ConfigError: unknown preset.
        """
        merged = deep_merge(self._config.to_dict(), preset_config(name))
        self._config = CompileConfig.from_dict(merged, source=f"preset '{name}'")
        self.preset = name
        self.preset_edited = False

    @property
    def int16_layers(self) -> list[str]:
        """Layer names/patterns whose activations are int16."""
        return list(self._config.bit.layer_overrides.activation16_bits)

    def add_int16_layer(self, name: str) -> bool:
        """Add ``name`` to ``bit.layerOverrides.activation16Bits``; False if it was there already."""
        layers = self.int16_layers
        if name in layers:
            return False
        self.set(INT16_PATH, [*layers, name])
        return True

    def remove_int16_layer(self, name: str) -> None:
        """Remove ``name`` from the int16 activation overrides (no error if absent)."""
        self.set(INT16_PATH, [layer for layer in self.int16_layers if layer != name])

    def cpu_layer_part(self, name: str) -> str | None:
        """``"head"`` or ``"tail"`` if ``cpuLayers`` lists ``name`` there (as an exact entry), else None."""
        parts = self._config.cpu_layers
        return "head" if name in parts.head else "tail" if name in parts.tail else None

    def set_cpu_layer(self, name: str, part: str | None) -> None:
        """List ``name`` in ``cpuLayers.head`` or ``.tail`` (``part``), or in neither (None); it leaves the other list."""
        parts = self._config.cpu_layers
        lists = {key: [layer for layer in getattr(parts, key) if layer != name] for key in ("head", "tail")}
        if part is not None:
            lists[part].append(name)
        self.set("cpuLayers", lists)

    @property
    def preprocessing(self) -> dict[str, Any]:
        """The ``preprocessing`` section as a camelCase dict."""
        return copy.deepcopy(self.get("preprocessing"))

    def reset(self) -> None:
        """Back to the compile defaults, keeping what describes the model, its data and the target
        (:data:`KEPT_ON_RESET`: device, inference scheme, image channels, preprocessing, uint8 input)."""
        current = self._config.to_dict()
        kept = {key: current[key] for key in KEPT_ON_RESET if key in current}
        self._config = CompileConfig.from_dict(kept, source="defaults")
        self.preset, self.preset_edited = None, False

    def use_run_config(self, config: dict[str, Any]) -> None:
        """Take the settings a run was compiled with (its recorded config) for the next compile; no preset is named
        (the run's settings are explicit). A config without a device keeps the current one.

        Raises:
            ConfigError: the recorded config is not valid; the settings are left unchanged.
        """
        loaded = CompileConfig.from_dict(copy.deepcopy(config), source="the run's settings")
        self._config = loaded if loaded.target_device else loaded.model_copy(update={"target_device": self.device})
        self.preset, self.preset_edited = None, False

    def load(self, path: str | os.PathLike) -> None:
        """Replace the settings with a JSON/YAML config file (the CLI's schema).

        Raises:
            ConfigError: unreadable or invalid file; the settings are left unchanged.
        """
        config = CompileConfig.from_file(path)
        self._config = config if config.target_device else config.model_copy(
            update={"target_device": self.device})
        self.preset, self.preset_edited = None, False

    def save(self, path: str | os.PathLike) -> None:
        """Write the settings as JSON or YAML (by suffix), atomically."""
        self._config.to_file(path)

    def to_dict(self) -> dict[str, Any]:
        """``{"preset": ..., "presetEdited": ..., "config": {camelCase config}}`` for the project file."""
        return {"preset": self.preset, "presetEdited": self.preset_edited, "config": self._config.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompileSettings:
        """Inverse of :meth:`to_dict`.

        Raises:
            ConfigError: the stored config is not valid.
        """
        return cls(CompileConfig.from_dict(data.get("config", {}), source="project"), data.get("preset"),
                   bool(data.get("presetEdited")))

    def summary(self) -> str:
        """One line for tables: device, scheme, preset (marked when edited since), the main calibration choices,
        int16 layers, automatic mixed precision's target and the layers on the CPU."""
        config = self._config
        calibration = config.calibration
        parts = [self.device, config.inference_scheme,
                 f"range {CHOICE_LABELS['calibration.mode'][int(calibration.mode)]}",
                 CHOICE_LABELS["calibration.method"][int(calibration.method)]]
        if self.preset:
            parts.insert(2, f"{self.preset} (edited)" if self.preset_edited else self.preset)
        if self.int16_layers:
            parts.append(f"int16 x{len(self.int16_layers)}")
        if config.mixed_precision.apply:
            target = config.mixed_precision.target
            parts.append(f"mixed precision {MIXED_TARGET_NAMES.get(target.kind, target.kind)} >= {target.value:g}")
        parts += [f"CPU {part} x{len(layers)}" for part, layers in
                  (("head", config.cpu_layers.head), ("tail", config.cpu_layers.tail)) if layers]
        if config.cpu_offload:
            parts.append("CPU offload")
        if config.layer_bias_correction.apply:
            parts.append("bias corr.")
        return " · ".join(parts)


def field_description(path: str) -> str:
    """The config schema's description of the field at dotted camelCase ``path`` (tooltips: one source)."""
    model: Any = CompileConfig
    description = ""
    for key in path.split("."):
        info = next(info for name, info in model.model_fields.items() if key in (name, info.alias))
        description = info.description or ""
        model = next((arg for arg in (info.annotation, *typing.get_args(info.annotation))
                      if isinstance(arg, type) and issubclass(arg, BaseModel)), None)
    return description


def choice_descriptions(path: str) -> dict[int, str]:
    """Code -> its sentence, from a description listing ``"0 Name: text; 1 Name: text ..."``."""
    return {int(code): f"{name}: {text.strip().rstrip('.')}."
            for code, name, text in _CHOICE.findall(field_description(path))}


_CHOICE = re.compile(r"(\d) (\w+): ([^;]+)")


def allowed_schemes(device: str) -> list[str]:
    """Inference schemes ``device`` offers, as its profile lists them (``all`` only where it means more
    than one core mode, i.e. on ARIES; on one-core REGULUS it would only repeat ``single``)."""
    from compiler_core.targets import get_device

    profile = get_device(device)
    return [scheme for scheme in profile.inference_schemes if _scheme_ok(profile.name, scheme)]


def _scheme_ok(device: str, scheme: str) -> bool:
    from compiler_core.targets import validate_inference_scheme

    try:
        validate_inference_scheme(device, scheme)
    except Exception:  # noqa: BLE001 - any rejection means "not offered"
        return False
    return True


def device_card(name: str) -> dict[str, Any]:
    """Facts for the device card: cores, schemes, MFU, precisions, TOPS, description."""
    from compiler_core.targets import get_device

    profile = get_device(name)
    return {"name": profile.name, "chip": profile.chip, "cores": profile.total_cores,
            "clusters": profile.clusters, "schemes": allowed_schemes(profile.name), "mfu": profile.has_mfu,
            "weights": list(profile.weight_precisions), "activations": list(profile.activation_precisions),
            "tops": round(profile.peak_tops, 1), "float_io": profile.float_io,
            "description": profile.description}


def devices() -> list[str]:
    """Every target device string."""
    from compiler_core.targets import list_devices

    return list_devices()


def presets() -> dict[str, str]:
    """Preset name -> description, from the core registry."""
    return describe_presets()


__all__ = ["CompileSettings", "allowed_schemes", "device_card", "devices", "preset_names", "presets"]
