"""Inputs for ``qbcompiler run``: .npy files, images (with the MXQ's own preprocessing), lists, manifests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from compiler_core.calibration import InputSpec, open_calibration_data
from compiler_core.config import CompileConfig
from compiler_core.mblt.io import layout_hint
from compiler_core.runtime.artifact import CompiledArtifact


def input_specs_of(artifact: CompiledArtifact) -> list[InputSpec]:
    """The model inputs as calibration-reader specs (model layout, batch included)."""
    return [InputSpec(spec.name, tuple(spec.shape), np.dtype(spec.dtype), layout_hint(list(spec.shape)))
            for spec in artifact.input_specs]


def load_run_inputs(artifact: CompiledArtifact, paths: Sequence[str]) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """``(source name, feeds)`` per sample, preprocessed exactly as the MXQ's calibration data was."""
    config = CompileConfig.model_validate(artifact.meta.get("config") or {})
    preprocessing = config.preprocessing if config.preprocessing.apply else None
    dataset = open_calibration_data(list(paths), input_specs_of(artifact), preprocessing=preprocessing,
                                    image_channels=config.image_channels, for_calibration=False)
    for index in range(len(dataset)):
        yield dataset.sources[index], dataset.sample(index)
