"""End-to-end compile: source model or MBLT -> MXQ, as straight-line stages with progress and cancel.

parse (source only) -> support check (and CPU-offload split) -> calibration statistics -> decisions
and integer program -> accuracy analysis on held-out samples -> backend lowering (tiling, memory plan,
schedule per core mode: compiler_core/backend) and its cost estimate -> MXQ
(atomic) + analysis JSON beside it + the resolved config (``config_save_path``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx_ir as ir

from compiler_core import __version__
from compiler_core.backend.fit import check_fit, fit_error, fit_failures, flag_fit_failures
from compiler_core.backend.partition import Partition, partition
from compiler_core.backend.program import check_tiles_fit, lower
from compiler_core.backend.program import from_document as npu_from_document
from compiler_core.backend.program import to_document as npu_to_document
from compiler_core.calibration.specs import input_codes
from compiler_core.config import CompileConfig
from compiler_core.errors import (
    ArgumentError,
    ConfigError,
    InternalError,
    MxqFormatError,
    UnsupportedOpsError,
)
from compiler_core.fileio import atomic_write_text, check_output_path
from compiler_core.mblt.io import describe_inputs
from compiler_core.mxq import write_mxq
from compiler_core.mxq.schema import validate_program
from compiler_core.mxq.writer import encode_json
from compiler_core.progress import Reporter
from compiler_core.quantization.run import QuantizeResult, calibration_statistics, quantize_mblt
from compiler_core.quantization.serialize import to_document
from compiler_core.runtime.cost import estimate
from compiler_core.session import MbltSession
from compiler_core.targets import (
    DeviceProfile,
    apply_offload,
    body_computes,
    check_support,
    chosen_cpu_layers,
    get_device,
    plan_cpu_offload,
    validate_inference_scheme,
)

logger = logging.getLogger(__name__)


@dataclass
class CompileResult:
    """What a compile produced."""

    mxq_path: Path
    device: str
    core_modes: list[str]
    quantize: QuantizeResult
    analysis_path: Path | None
    config_path: Path | None
    support: dict[str, int]
    cpu_offload: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, dict[str, Any]] = field(default_factory=dict)
    mixed_precision: dict[str, Any] = field(default_factory=dict)
    suited_preset: dict[str, Any] = field(default_factory=dict)
    """``{"name", "why", "covers"}`` of the preset made for this kind of model (:func:`~compiler_core.config.presets.
    suggest_preset`), empty when none is; the accuracy hints name it."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary (the CLI's ``result`` line)."""
        return {"output": str(self.mxq_path), "size_bytes": self.mxq_path.stat().st_size, "device": self.device,
                "core_modes": self.core_modes, "analysis_file": str(self.analysis_path) if self.analysis_path else None,
                "config_file": str(self.config_path) if self.config_path else None, "support": self.support,
                "cpu_offload": self.cpu_offload, "samples": self.quantize.samples,
                "statistics_from_cache": self.quantize.statistics_from_cache, "timings": self.quantize.timings,
                "analysis": self.quantize.analysis.get("summary", {}),
                "outputs": self.quantize.analysis.get("outputs", {}), "program": self.quantize.model.summary(),
                "range_loss": self.quantize.analysis.get("summary", {}).get("range_loss"),
                "estimate": self.schedule, "mixed_precision": _mixed_summary(self.mixed_precision),
                "suited_preset": self.suited_preset}


def compile_mblt(mblt_path: Path, save_path: Path, config: CompileConfig, *, reporter: Reporter,
                 calib_data_path=None, config_save_path: Path | None = None) -> CompileResult:
    """MBLT -> MXQ with an already resolved config."""
    if not config.target_device:
        raise ArgumentError("No target device given.", hint="Pass target_device / --target-device (e.g. aries-rb).")
    device = get_device(config.target_device)
    core_modes = validate_inference_scheme(device.name, config.inference_scheme)
    check_output_path(save_path, "MXQ")  # before calibration, not after it
    session = MbltSession.open(mblt_path)  # the only read and hash of the MBLT in this compile
    graph = session.graph
    parts, support = _check_and_split(graph, device, config, reporter)
    config = _uint8_inputs_on_the_npu(config, graph, parts)
    mixed = _mixed_precision(session, config, parts, reporter, calib_data_path)
    config = mixed.config if mixed is not None else config
    result = quantize_mblt(session, config, calib_data_path=calib_data_path, reporter=reporter,
                           body_path=parts.body if parts is not None else None,
                           head=parts.head if parts is not None else None,
                           tail=parts.tail if parts is not None else None,
                           before_analysis=lambda model: check_tiles_fit(model, device))
    with reporter.stage("schedule", total=len(core_modes), message="tiling, memory plan and schedule per core mode"):
        npu = lower(result.model, device, core_modes)
        npu_document, npu_consts = npu_to_document(npu)
        decoded = npu_from_document(npu_document, npu_consts)
        schedule = {mode: estimate(result.model, device, mode, decoded).to_dict() for mode in core_modes}
        reporter.advance(len(core_modes))
    if mixed is not None:
        result.analysis["mixed_precision"] = mixed.to_dict()
    document, consts = to_document(result.model)
    document["schedule"] = schedule
    document["npu"] = npu_document
    consts.update(npu_consts)
    _check_program(document, consts, save_path)
    meta = _meta(session, device, core_modes, config, result, parts)
    # write_mxq checks for cancellation until the rename; after it the MXQ exists and nothing may cancel.
    written = write_mxq(save_path, target_device=device.name, meta=meta, program=document, consts=consts,
                        cpu=_cpu_blobs(parts), calib=_calib(result), reporter=reporter)
    analysis_path = _write_analysis(written, result)
    saved_config = _save_config(config, config_save_path) if config_save_path else None
    return CompileResult(written, device.name, core_modes, result, analysis_path, saved_config, support,
                         parts.to_dict() if parts else {}, schedule, mixed.to_dict() if mixed is not None else {},
                         suited_preset(graph))


def _save_config(config: CompileConfig, path: Path) -> Path:
    """The resolved config as YAML for a ``.yaml``/``.yml`` path (it was always JSON), else as JSON."""
    from compiler_core.config.files import config_format, dumps_mapping

    kind = config_format(path) or "json"
    return Path(atomic_write_text(path, dumps_mapping(config.model_dump(mode="json", by_alias=True), kind)))


def suited_preset(model: ir.Model) -> dict[str, Any]:
    """``{"name", "why", "covers"}`` of the preset made for a model like this MBLT, or ``{}`` (``covers``: presets
    that include its settings)."""
    from compiler_core.analysis.metrics import head_op_type, is_classifier_output
    from compiler_core.calibration import input_kind, input_specs
    from compiler_core.config.presets import suggest_preset

    graph = model.graph
    producers = {output.name: (node.op_type, node.inputs[0].name if node.inputs and node.inputs[0] else None)
                 for node in graph for output in node.outputs}
    outputs = [value for value in graph.outputs if value.shape is not None]
    class_scores = bool(outputs) and len(outputs) == len(graph.outputs) and all(
        is_classifier_output([int(dim) for dim in value.shape], head_op_type(value.name, producers), len(outputs),
                             value.name)
        for value in outputs)
    fit = suggest_preset({node.op_type for node in graph}, input_kind(input_specs(model)), class_scores)
    return {"name": fit.preset, "why": fit.why, "covers": sorted(fit.covers)} if fit is not None else {}


def _check_program(document: dict[str, Any], consts: dict[str, Any], save_path: Path) -> None:
    """Run the MXQ reader's program checks before writing: never write a file the runtime refuses to load."""
    try:
        validate_program(json.loads(encode_json(document, "program")), consts, path=str(save_path))
    except MxqFormatError as error:
        raise InternalError(f"The compiled program fails the MXQ reader's checks, so nothing was written: "
                            f"{error.message}", hint="Please report this with the model; "
                            "`qbcompiler check` and a smaller input resolution may help meanwhile.") from error


def _mixed_precision(session: MbltSession, config: CompileConfig, parts: Partition | None, reporter: Reporter,
                     calib_data_path):
    """With ``mixedPrecision.apply``: the chosen int16 layers (the config the compile then uses), else ``None``."""
    if not config.mixed_precision.apply:
        return None
    from compiler_core.quantization.mixed_precision import choose_mixed_precision

    return choose_mixed_precision(session, config, calib_data_path=calib_data_path, reporter=reporter, parts=parts)


def _mixed_summary(mixed: dict[str, Any]) -> dict[str, Any]:
    """The mixed-precision outcome without the per-point and sensitivity detail (in the analysis JSON)."""
    if not mixed:
        return {}
    chosen = mixed["points"][mixed["chosen"]]
    return {"target": mixed["target"], "target_met": mixed["target_met"], "overrides": mixed["overrides"],
            "points_tried": len(mixed["points"]), "metric": chosen["metric"], "int16_layers": chosen["int16_layers"],
            "int16_fraction": chosen["int16_fraction"], "latency_increase": chosen["latency_increase"]}


def prepare_statistics(mblt_path: Path, config: CompileConfig, *, reporter: Reporter, calib_data_path=None) -> bool:
    """Fill the statistics cache for ``config`` as :func:`compile_mblt` would use it, without quantizing.

    Runs the same support check (and CPU-offload split) as a compile, so the tensor selection, and
    therefore the cache key, is the one the compile looks up.

    Returns:
        True when the statistics were already cached (no calibration inference ran).
    """
    if not config.target_device:
        raise ArgumentError("No target device given.", hint="Pass target_device / --target-device (e.g. aries-rb).")
    device = get_device(config.target_device)
    session = MbltSession.open(mblt_path)
    parts, _ = _check_and_split(session.graph, device, config, reporter)
    body = parts.body if parts is not None else None
    return calibration_statistics(session, config, calib_data_path=calib_data_path, reporter=reporter,
                                  body_path=body)[3]


def _check_and_split(graph: ir.Model, device: DeviceProfile, config: CompileConfig, reporter: Reporter):
    """Support and fit (every layer tiled on a stand-in quantization, before calibration); with ``cpu_offload``,
    the split that moves unsupported (or too large) head and tail nodes to the CPU."""
    chosen = set().union(*chosen_cpu_layers(graph, config.cpu_layers.head, config.cpu_layers.tail))  # any support
    with reporter.stage("check", total=1, message=f"checking support on {device.name}"):
        report = check_support(graph, device.name)
        fit_checked = report.all_supported  # the stand-in quantization needs a kernel for every node
        if fit_checked:
            failures = fit_failures(graph, device, config, cancel_token=reporter.cancel_token)
            outside = [error for error in failures if error.fields["layer"] not in chosen]
            if outside and not config.cpu_offload:
                raise fit_error(outside)
            report = flag_fit_failures(report, failures)  # at the head or tail, the CPU runs them
        reporter.advance()
    if report.all_supported and not chosen:
        return None, report.counts()
    plan = plan_cpu_offload(graph, report, config.cpu_layers)
    if not config.cpu_offload and any(entry.blocking for name, entry in report.entries.items() if name not in chosen):
        error = report.unsupported_error()
        if plan.inner_unsupported:  # cpu_offload alone would be refused next: offer what compiles
            error.hint = plan.inner_hint(report.mfu_alternatives())
        raise error
    too_large = [error for error in failures if error.fields["layer"] in plan.inner_unsupported] if fit_checked else []
    if too_large:
        raise fit_error(too_large)
    if plan.inner_unsupported:
        error = report.unsupported_error()
        raise UnsupportedOpsError(f"{len(plan.inner_unsupported)} unsupported node(s) sit inside the NPU body, "
                                  f"where cpu_offload cannot move them: {error.message}",
                                  hint=plan.inner_hint(report.mfu_alternatives()),
                                  ops=error.fields.get("ops"), nodes=plan.inner_unsupported[:10])
    if not body_computes(graph, plan) and plan.chosen:
        raise ConfigError(f"cpuLayers leaves nothing for the NPU of {device.name}: every computing layer would run "
                          "on the CPU with the layers chosen.",
                          hint="Choose fewer layers (the front end up to the Log, or the last layers); an MXQ needs "
                               "at least one layer on the NPU.", layers=plan.chosen[:20])
    if not body_computes(graph, plan):
        error = report.unsupported_error()
        raise UnsupportedOpsError(f"Nothing is left for the NPU of {device.name}: with cpu_offload every computing node "
                                  f"would run on the CPU. {error.message}",
                                  hint="Rewrite the unsupported ops as the reasons say, or run the model on the CPU "
                                       "(onnxruntime); an MXQ needs at least one layer on the NPU.",
                                  ops=error.fields.get("ops"), nodes=plan.cpu_head[:10] + plan.cpu_tail[:10])
    logger.info("CPU offload: %d head and %d tail node(s), %d of them chosen by cpuLayers", len(plan.cpu_head),
                len(plan.cpu_tail), len(plan.chosen))
    parts = partition(graph, plan)
    if not fit_checked:
        check_fit(parts.body, device, config, cancel_token=reporter.cancel_token)  # what the NPU will run
    return parts, apply_offload(report, plan).counts()


def _uint8_inputs_on_the_npu(config: CompileConfig, graph: ir.Model, parts: Partition | None) -> CompileConfig:
    """``uint8Input`` for the model inputs the NPU body still takes: behind a CPU head the body's inputs are the head's
    outputs, not raw pixels (MobileNetV2 with the classification preset and a CPU head ending at a 32-channel Conv
    stopped with an INTERNAL_ERROR: the pixels' 3 means against 32 channels)."""
    if parts is None or not config.uint8_input.apply:
        return config
    model_inputs = {value.name for value in graph.graph.inputs}
    wanted = list(config.uint8_input.inputs) or list(parts.body_inputs)
    kept = [name for name in wanted if name in model_inputs and name in parts.body_inputs]
    if kept == wanted:
        return config
    logger.info("uint8Input does not apply to %s: behind the CPU head the NPU takes the head's outputs, not raw "
                "pixels%s", ", ".join(name for name in wanted if name not in kept),
                f" (uint8 stays on for {', '.join(kept)})" if kept else "")
    uint8 = config.uint8_input.model_copy(update={"apply": bool(kept), "inputs": kept})
    return config.model_copy(update={"uint8_input": uint8})


def _meta(session: MbltSession, device: DeviceProfile, core_modes: list[str], config: CompileConfig,
          result: QuantizeResult, parts: Partition | None) -> dict[str, Any]:
    graph = session.graph
    outputs = [{"name": v.name, "shape": [int(d) for d in v.shape], "dtype": v.dtype.numpy().name}
               for v in graph.graph.outputs]
    inputs = [{"name": i["name"], "shape": i["shape"], "dtype": _numpy_dtype(i["dtype"])} for i in describe_inputs(graph)]
    return {"format": "qbstudio-mxq", "compiler_version": __version__, "device": device.name, "core_modes": core_modes,
            "provenance": session.provenance, "mblt_sha256": session.sha256,
            "config": config.model_dump(mode="json", by_alias=True), "inputs": inputs, "outputs": outputs,
            "input_codes": input_codes(graph),  # quantized source inputs: `run` reads their integer codes too
            "layers": [{k: row[k] for k in ("name", "op_type", "kind", "precision")}
                       for row in result.model.layer_table()],
            "cpu_offload": parts.to_dict() if parts else {}, "analysis": result.analysis.get("summary", {}),
            "statistics": {"samples": result.samples}}  # no timings: the same inputs give the same bytes


def _numpy_dtype(name: str) -> str:
    return {"float": "float32", "int64": "int64", "int32": "int32", "bool": "bool"}.get(name, name)


def _cpu_blobs(parts: Partition | None) -> dict[str, bytes]:
    if parts is None:
        return {}
    return {name: blob for name, blob in (("head", parts.head), ("tail", parts.tail)) if blob is not None}


def _calib(result: QuantizeResult) -> dict[str, Any]:
    return {name: {"range": list(record.observed_range) if record.observed_range else None, "bits": record.bits,
                   "source": record.source} for name, record in result.model.tensors.items()}


def _write_analysis(mxq_path: Path, result: QuantizeResult) -> Path | None:
    if not result.analysis:
        return None
    return Path(atomic_write_text(mxq_path.with_suffix(".analysis.json"), json.dumps(result.analysis, indent=2)))
