"""A compiled MXQ in memory: the NPU program, the CPU head/tail, and how to run all three in order."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compiler_core.backend.program import DecodedProgram
from compiler_core.backend.program import from_document as npu_from_document
from compiler_core.errors import MxqFormatError
from compiler_core.mxq import read_mxq
from compiler_core.quantization import executor
from compiler_core.quantization.program import QuantizedModel, ValueSpec
from compiler_core.quantization.serialize import from_document
from compiler_core.runtime.checks import check_feeds
from compiler_core.runtime.fastpath import FastExecutor, batch_size

logger = logging.getLogger(__name__)

_CODE_DTYPES = {np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.uint8)}
_CHANNELS_LAST_BACKENDS = ("tflite", "tf")
"""Frontends whose models are NHWC at their inputs and outputs (the MBLT keeps the model's own layout there)."""


@dataclass
class CompiledArtifact:
    """Everything the runtime needs from an MXQ file."""

    path: Path
    device: str
    core_modes: list[str]
    program: QuantizedModel
    meta: dict[str, Any]
    schedule: dict[str, Any]
    cpu_models: dict[str, bytes] = field(default_factory=dict)
    file_size: int = 0
    npu: DecodedProgram | None = None
    _sessions: dict[str, Any] = field(default_factory=dict, repr=False)
    _fast: FastExecutor | None = field(default=None, repr=False)
    _channels_last: frozenset[str] | None = field(default=None, repr=False)

    @property
    def input_specs(self) -> list[ValueSpec]:
        """The model's inputs (MBLT layout: NCHW for images)."""
        return [ValueSpec(**spec) for spec in self.meta["inputs"]]

    @property
    def output_specs(self) -> list[ValueSpec]:
        """The model's outputs."""
        return [ValueSpec(**spec) for spec in self.meta["outputs"]]

    @property
    def channels_last(self) -> frozenset[str]:
        """The 4-D graph inputs and outputs that are NHWC in the model itself (TFLite, Keras): inputs the program
        reads only through a Transpose to NCHW, outputs it writes with a Transpose from NCHW.

        They already are in the NPU's layout, so NHWC arrays pass them unchanged. A model parsed from TFLite or
        TensorFlow/Keras is NHWC at every 4-D input and output, whatever op writes it (a Cropping2D's Slice).
        """
        if self._channels_last is None and (self.meta.get("provenance") or {}).get("backend") in _CHANNELS_LAST_BACKENDS:
            self._channels_last = frozenset(spec.name for spec in (*self.input_specs, *self.output_specs)
                                            if len(spec.shape) == 4)
        if self._channels_last is None:
            readers: dict[str, list] = {}
            writers = {}
            for op in self.program.ops:
                for name in op.inputs:
                    readers.setdefault(name, []).append(op)
                for name in op.outputs:
                    writers[name] = op

            def perm(op) -> list[int] | None:
                return list(op.attrs.get("attributes", {}).get("perm") or []) if op.op_type == "Transpose" else None

            def to_nchw(name: str) -> bool:  # through element-wise clamps and tables (a QDQ model's input Clip)
                ops = readers.get(name, [])
                while len(ops) == 1 and ops[0].kind in ("clamp", "lut") and ops[0].inputs[0] == name:
                    name = ops[0].outputs[0]
                    ops = readers.get(name, [])
                return bool(ops) and all(perm(op) == [0, 3, 1, 2] for op in ops)

            inputs = {spec.name for spec in self.input_specs if len(spec.shape) == 4 and to_nchw(spec.name)}
            outputs = {spec.name for spec in self.output_specs if len(spec.shape) == 4 and spec.name in writers
                       and perm(writers[spec.name]) == [0, 2, 3, 1]}
            self._channels_last = frozenset(inputs | outputs)
        return self._channels_last

    def run(self, feeds: Mapping[str, np.ndarray], *, raw: bool = False, output_layout: str = "NCHW",
            golden: bool = False) -> list:
        """CPU head -> NPU body -> CPU tail on feeds in the model's own layout; returns outputs in ``output_layout``
        (``NCHW``: the model's own; ``NHWC``: 4-D outputs transposed, except :attr:`channels_last` ones).

        Feeds may hold N samples along the leading (batch) axis; they run at once on the fast
        simulator (sample by sample through a CPU head or tail). ``golden=True`` runs the body on the
        reference executor instead (same codes, much slower).
        """
        count = batch_size(feeds, {spec.name: spec.shape for spec in self.input_specs})
        feeds = check_feeds(self.input_specs, self.program, feeds, batch=count)
        if count > 1 and (self.cpu_models or golden):
            parts = [self.run({name: value[i:i + 1] for name, value in feeds.items()}, raw=raw,
                              output_layout=output_layout, golden=golden) for i in range(count)]
            return [np.concatenate(outputs) for outputs in zip(*parts)]
        env: dict[str, np.ndarray] = feeds
        raw_codes: dict[str, np.ndarray] = {}
        self._run_cpu("head", env)
        body = self._body_inputs(env)
        result = executor.execute(self.program, body) if golden else self.fast_executor().execute_codes(body)
        for spec in self.program.outputs:
            raw_codes[spec.name] = result[spec.name]
            env[spec.name] = executor.dequantize_output(self.program, spec.name, result[spec.name])
        self._run_cpu("tail", env)
        outputs = []
        for spec in self.output_specs:
            value = raw_codes[spec.name] if raw and spec.name in raw_codes else env[spec.name]
            nhwc = value.ndim == 4 and output_layout == "NHWC" and spec.name not in self.channels_last
            outputs.append(value.transpose(0, 2, 3, 1) if nhwc else value)
        return outputs

    def fast_executor(self) -> FastExecutor:
        """The program prepared for the fast simulator (built on first use)."""
        if self._fast is None:
            self._fast = FastExecutor(self.program)
        return self._fast

    def _body_inputs(self, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        body = {}
        for spec in self.program.inputs:
            value = np.asarray(env[spec.name])
            if spec.name not in self.program.tensors:
                body[spec.name] = value
                continue
            params = self.program.params(spec.name)
            body[spec.name] = value.astype(np.int64) if value.dtype in _CODE_DTYPES else params.quantize(value)
        return body

    def _run_cpu(self, part: str, env: dict[str, np.ndarray]) -> None:
        if part not in self.cpu_models:
            return
        session = self._session(part)
        names = [item.name for item in session.get_inputs()]
        outputs = [item.name for item in session.get_outputs()]
        env.update(zip(outputs, session.run(outputs, {name: env[name] for name in names})))

    def _session(self, part: str):
        if part not in self._sessions:
            import onnxruntime as ort

            self._sessions[part] = ort.InferenceSession(self.cpu_models[part], providers=["CPUExecutionProvider"])
        return self._sessions[part]

    def summary(self) -> dict[str, Any]:
        """The summary ``get_model_summary`` returns."""
        return {"file": str(self.path), "file_size": self.file_size, "device": self.device,
                "core_modes": self.core_modes, "schedule": self.schedule,
                "inputs": [self._io(spec) for spec in self.input_specs],
                "outputs": [self._io(spec) for spec in self.output_specs],
                "layers": self.program.layer_table(), "program": self.program.summary(),
                "cpu_offload": self.meta.get("cpu_offload", {}), "provenance": self.meta.get("provenance", {}),
                "compiler_version": self.meta.get("compiler_version")}

    def _io(self, spec: ValueSpec) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": spec.name, "shape_nchw": spec.shape, "dtype": spec.dtype}
        if len(spec.shape) == 4:
            entry["shape_nhwc"] = (list(spec.shape) if spec.name in self.channels_last
                                   else [spec.shape[0], *spec.shape[2:], spec.shape[1]])
            entry["layout"] = "NHWC"
        if spec.name in self.program.tensors:
            params = self.program.params(spec.name)
            entry.update(scale=np.asarray(params.scale).tolist(), zero_point=np.asarray(params.zero_point).tolist(),
                         code_dtype=str(params.dtype))
        return entry


def load_artifact(path: Path) -> CompiledArtifact:
    """Read and validate an MXQ and rebuild its program."""
    mxq = read_mxq(path)
    meta, document = mxq.meta, mxq.program
    try:
        core_modes = list(meta["core_modes"])
        _ = meta["inputs"], meta["outputs"]
    except (KeyError, TypeError) as error:
        raise MxqFormatError(f"{path.name}: the meta section lacks {error}.",
                             hint="The file is corrupt or was written by an incompatible compiler; compile again.") from error
    schedule = document.get("schedule", {})
    if not isinstance(schedule, dict):
        raise MxqFormatError(f"{path.name}: the program's 'schedule' is not an object.", section="program",
                             hint="The file is corrupt or was written by an incompatible compiler; compile again.")
    schedule = dict(schedule)
    program = from_document(document, dict(mxq.consts), mblt_sha256=meta.get("mblt_sha256", ""),
                            config=meta.get("config"))
    npu = npu_from_document(document["npu"], mxq.consts) if "npu" in document else None
    return CompiledArtifact(path, mxq.target_device, core_modes, program, meta, schedule, dict(mxq.cpu or {}),
                            mxq.file_size, npu)
