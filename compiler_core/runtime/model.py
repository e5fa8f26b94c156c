"""qbruntime-style API over the simulator: Accelerator, ModelConfig, Model, get_model_summary.

An :class:`Accelerator` is a simulated device named by its target string. A :class:`Model` loads an
MXQ (validated first), checks that it was compiled for that device and for the chosen core mode,
and runs inferences: CPU head (onnxruntime) -> NPU body (the bit-exact integer program) -> CPU tail.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler_core.errors import ArgumentError
from compiler_core.quantization.program import QuantizedModel
from compiler_core.runtime.artifact import CompiledArtifact, load_artifact
from compiler_core.runtime.checks import host_io
from compiler_core.runtime.cost import estimate
from compiler_core.runtime.fastpath import executor_for
from compiler_core.targets import CORE_MODES as _MODES
from compiler_core.targets import get_device

logger = logging.getLogger(__name__)

CORE_MODES = tuple(_MODES)
LAYOUTS = ("NHWC", "NCHW")


class Accelerator:
    """A simulated NPU device.

    Args:
        device: a target-device string (``aries-rb`` ...); ``0`` means the first device, ``aries-rb``.
    """

    def __init__(self, device: str | int = 0) -> None:
        if isinstance(device, (int, np.integer)) and not isinstance(device, bool) and device != 0:
            raise ArgumentError(f"Accelerator({device}): the simulator has one device per target string; device "
                                "number 0 is aries-rb.",
                                hint="Pass 0, or a device string: Accelerator('regulus-rb') ...")
        self.profile = get_device("aries-rb" if device == 0 else str(device))

    @property
    def device(self) -> str:
        """The device string."""
        return self.profile.name

    def __repr__(self) -> str:
        return f"Accelerator({self.device!r})"


class ModelConfig:
    """Which core mode a model runs in (``auto`` by default: the first mode it was compiled for)."""

    def __init__(self) -> None:
        self.core_mode = "auto"
        self.cores: list[int] | None = None

    def set_single_core_mode(self, count: int | None = None, cores: Sequence[int] | None = None) -> None:
        """Each local core runs its own model instance."""
        self._set("single", list(cores) if cores else (list(range(count)) if count else None))

    def set_multi_core_mode(self, clusters: Sequence[int] | None = None) -> None:
        """The four cores of a cluster run a batch of four."""
        self._set("multi", list(clusters) if clusters else None)

    def set_global4_core_mode(self, clusters: Sequence[int] | None = None) -> None:
        """Four cores of a cluster work on one input (lower latency)."""
        self._set("global4", list(clusters) if clusters else None)

    def set_global8_core_mode(self) -> None:
        """All eight cores work on one input (lowest latency on ARIES)."""
        self._set("global8", None)

    def set_auto_core_mode(self) -> None:
        """Let the runtime pick the first core mode the MXQ was compiled for."""
        self._set("auto", None)

    def _set(self, mode: str, cores: list[int] | None) -> None:
        self.core_mode, self.cores = mode, cores

    def __repr__(self) -> str:
        return f"ModelConfig(core_mode={self.core_mode!r})"


class Model:
    """An MXQ loaded for inference.

    Args:
        path: the ``.mxq`` file.
        model_config: core mode selection.
        input_layout: layout of the 4-D float arrays you pass: ``NHWC`` (the NPU's, default) or ``NCHW``
            (the layout of PyTorch/ONNX models). 4-D outputs are returned in the same layout. Inputs and outputs
            that are NHWC in the model itself (TFLite, Keras: ``artifact.channels_last``) are NHWC either way.
    """

    def __init__(self, path: str | Path, model_config: ModelConfig | None = None, *, input_layout: str = "NHWC"):
        if input_layout not in LAYOUTS:
            raise ArgumentError(f"input_layout must be one of {', '.join(LAYOUTS)}, got {input_layout!r}.")
        if model_config is not None and not isinstance(model_config, ModelConfig):
            raise ArgumentError(f"model_config must be a ModelConfig, got a {type(model_config).__name__}.",
                                hint="e.g. config = ModelConfig(); config.set_multi_core_mode(); Model(path, config).")
        self.path = _mxq_path(path)
        self.config = model_config or ModelConfig()
        self.input_layout = input_layout
        self.artifact: CompiledArtifact = load_artifact(self.path)
        self._accelerator: Accelerator | None = None
        self.core_mode: str | None = None
        self.host_io: str | None = None
        self._code_specs: dict[str, Any] | None = None  # inputs a full-integer source model took as codes
        self._code_warned: set[str] = set()

    @property
    def program(self) -> QuantizedModel:
        """The integer program (NPU body)."""
        return self.artifact.program

    def launch(self, accelerator: Accelerator) -> None:
        """Bind to a device; the MXQ must target it and have been compiled for the core mode."""
        if not isinstance(accelerator, Accelerator):
            raise ArgumentError(f"launch takes an Accelerator, got a {type(accelerator).__name__}.",
                                hint=f"model.launch(Accelerator('{self.artifact.device}')).")
        if accelerator.device != self.artifact.device:
            raise ArgumentError(
                f"{self.path.name} was compiled for {self.artifact.device}, not {accelerator.device}.",
                hint=f"Use Accelerator('{self.artifact.device}') or compile for {accelerator.device}.")
        self.core_mode = self._resolve_mode()
        self._check_cores(accelerator.profile)
        self.host_io = host_io(accelerator.device, accelerator.profile.float_io)  # "float32" or "quantized"
        self._accelerator = accelerator

    def _resolve_mode(self) -> str:
        compiled = self.artifact.core_modes
        if self.config.core_mode == "auto":
            return compiled[0]
        if self.config.core_mode not in compiled:
            raise ArgumentError(
                f"{self.path.name} was not compiled for the {self.config.core_mode} core mode "
                f"(compiled modes: {', '.join(compiled)}).",
                hint="Pick one of those modes, or compile again with inference_scheme covering it.")
        return self.config.core_mode

    def _check_cores(self, device) -> None:
        """The cores (single) or clusters (multi, global4) chosen in the ModelConfig exist on ``device``."""
        cores = self.config.cores
        if not cores or self.core_mode not in ("single", "multi", "global4"):
            return
        if not all(isinstance(index, (int, np.integer)) and not isinstance(index, bool) for index in cores):
            raise ArgumentError(f"ModelConfig.set_{self.core_mode}_core_mode: core and cluster numbers are integers, "
                                f"got {cores!r}.", hint="e.g. set_multi_core_mode([0, 1]).")
        unit, count = ("core", device.total_cores) if self.core_mode == "single" else ("cluster", device.clusters)
        outside = sorted({index for index in cores if not 0 <= index < count})
        if outside or len(set(cores)) != len(cores):
            raise ArgumentError(
                f"ModelConfig.set_{self.core_mode}_core_mode({cores}): {device.name} has {count} {unit}(s), numbered "
                f"0-{count - 1}" + (f"; {outside} do not exist." if outside else "; each may be given once."),
                hint=f"Pick {unit}s among 0-{count - 1}, or leave them out to use every {unit}.")

    def _instances_used(self, device) -> tuple[int, int]:
        """(inputs in flight on the cores or clusters chosen, inputs in flight on the whole device)."""
        everything = _MODES[self.core_mode].instances(device.total_cores)
        if not self.config.cores or self.core_mode not in ("single", "multi", "global4"):
            return everything, everything
        per_unit = 1 if self.core_mode == "single" else everything // device.clusters
        return len(self.config.cores) * per_unit, everything

    def infer(self, inputs: np.ndarray | Sequence[np.ndarray] | Mapping[str, np.ndarray], *,
              raw: bool = False) -> list[np.ndarray]:
        """Run one inference, or a batch of N samples at once.

        Args:
            inputs: one array per model input (a list, a dict by name, or a single array).
                Float arrays are quantized on the way in. An input a full-integer source model (TFLite
                ``inference_input_type=tf.int8``) took as integers takes arrays of that dtype as the source's codes,
                ``(q - zero point) * scale``, as ``qbcompiler run`` and calibration read them (with a warning).
                Otherwise arrays of exactly the input's NPU code dtype (``int8``/``int16``/``uint8``) are taken as
                codes and must lie in its code range; any other dtype is an :class:`ArgumentError`.
                A model compiled for batch 1 also takes N samples stacked on the leading axis;
                the outputs then hold N samples too (same codes as N single inferences).
            raw: return the NPU output codes instead of float32 values.

        Returns:
            One array per model output.
        """
        if self._accelerator is None:
            raise ArgumentError("The model is not launched.", hint="Call model.launch(Accelerator(...)) first.")
        feeds = self._feeds(inputs)
        return self.artifact.run(feeds, raw=raw, output_layout=self.input_layout)

    def _feeds(self, inputs) -> dict[str, np.ndarray]:
        specs = self.artifact.input_specs
        if not isinstance(inputs, (np.ndarray, Mapping, Sequence)) or isinstance(inputs, str):
            raise ArgumentError(f"infer takes a list of arrays (one per input), a dict by input name or one array; "
                                f"got {type(inputs).__name__}.",
                                hint=f"Inputs ({self.input_layout}): {self._inputs_text()}.")
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if isinstance(inputs, Mapping):
            unknown = sorted(set(inputs) - {spec.name for spec in specs})
            if unknown:
                raise ArgumentError(f"Unknown input(s): {', '.join(unknown)}.",
                                    hint=f"The model's inputs are: {', '.join(s.name for s in specs)}.")
            inputs = [inputs.get(spec.name) for spec in specs]
        if len(inputs) != len(specs):
            raise ArgumentError(f"The model takes {len(specs)} input(s), {len(inputs)} given.",
                                hint=f"Inputs ({self.input_layout}): {self._inputs_text()}.")
        return {spec.name: self._convert(spec, self._source_values(spec.name, np.asarray(array)))
                for spec, array in zip(specs, inputs)}

    def _source_values(self, name: str, array: np.ndarray) -> np.ndarray:
        """A full-integer source model's input codes (a TFLite model's int8 input) as its values, as ``qbcompiler run``
        and calibration read them; other arrays as they are."""
        if self._code_specs is None:
            from compiler_core.runtime.inputs import input_specs_of

            self._code_specs = {spec.name: spec for spec in input_specs_of(self.artifact) if spec.codes is not None}
        spec = self._code_specs.get(name)
        if spec is None or array.dtype.name != spec.codes[0]:
            return array
        if name not in self._code_warned:
            self._code_warned.add(name)
            dtype, scale, zero_point = spec.codes
            logger.warning("%s input '%s' is read as the source model's %s codes: value = (q %s %d) * %.6g (pass "
                           "float32 values to give the values themselves)", dtype, name, dtype,
                           "-" if zero_point >= 0 else "+", abs(zero_point), scale)
        return spec.real_values(array).astype(np.float32)

    def _convert(self, spec, array: np.ndarray) -> np.ndarray:
        expected = list(spec.shape)
        own = len(expected) != 4 or spec.name in self.artifact.channels_last  # TFLite/Keras: NHWC already
        given_layout = self._shape_in_layout(spec)
        if array.ndim == len(given_layout) and expected and expected[0] == 1 and array.shape[0] >= 1:
            given_layout = [array.shape[0], *given_layout[1:]]  # a batch of samples
        if list(array.shape) != given_layout:
            hint = (f"Pass {self.input_layout} arrays of shape {given_layout}"
                    + (f" (or NCHW {expected} with Model(..., input_layout='NCHW'))"
                       if not own and self.input_layout == "NHWC" else "") + ".")
            raise ArgumentError(f"Input '{spec.name}' has shape {list(array.shape)}, expected {given_layout} "
                                f"({self.input_layout}).", hint=hint)
        if not own and self.input_layout == "NHWC":
            array = array.transpose(0, 3, 1, 2)
        return np.ascontiguousarray(array)

    def _shape_in_layout(self, spec) -> list[int]:
        """The input's shape as arrays are passed: NHWC for a 4-D NCHW input unless ``input_layout='NCHW'``."""
        shape = list(spec.shape)
        if len(shape) != 4 or spec.name in self.artifact.channels_last or self.input_layout == "NCHW":
            return shape
        return [shape[0], *shape[2:], shape[1]]

    def _inputs_text(self) -> str:
        return ", ".join(f"{spec.name} {self._shape_in_layout(spec)}" for spec in self.artifact.input_specs)

    def estimate(self) -> dict[str, Any]:
        """Estimated latency and throughput of the launched core mode on its device (cost model).

        Throughput counts the cores (single) or clusters (multi, global4) the ModelConfig chose: two of the eight
        cores in single mode give a quarter of the whole device's (``instances``: inputs in flight).
        """
        device = get_device(self.artifact.device)
        mode = self.core_mode or self.artifact.core_modes[0]
        result = estimate(self.program, device, mode, self.artifact.npu).to_dict()
        if self.core_mode is not None:  # launched: on the cores the ModelConfig chose
            used, everything = self._instances_used(device)
            result["throughput_fps"] = round(result["throughput_fps"] * used / everything, 1)
            result["instances"] = used
        return result

    def dispose(self) -> None:
        """Release the device binding (the MXQ can be launched again)."""
        self._accelerator = None
        self.core_mode = None


def get_model_summary(path: str | Path) -> dict[str, Any]:
    """Device, core modes, inputs/outputs (shape, dtype, layout, scale, zero point), layers, sizes, provenance."""
    return load_artifact(_mxq_path(path)).summary()


def _mxq_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"An MXQ path is needed, got {type(path).__name__}.", hint="Pass the .mxq file's path.")
    return Path(path)


def run_inputs_for(program: QuantizedModel, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs (float) of the NPU body for NCHW feeds, on the fast simulator (golden-identical codes)."""
    return executor_for(program).run(feeds)
