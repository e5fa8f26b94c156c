"""Check-time fit test: does every layer's smallest tile fit the core SRAM?

Runs on the parsed graph, before calibration. The real quantizer
(:func:`~compiler_core.quantization.pipeline.quantize_graph`) quantizes the graph with a stand-in range of
[-1, 1] for every tensor, which gives the integer operations, NPU layers and element types the compile
will tile: int8 by default, int16 where the config says so (presets such as ``a16w8``,
``bit.layerOverrides``), int16/int4 weights by override. Only the sizes matter, never the values, so the
weight-clip search is skipped. The backend's own passes then tile every layer for one core
(:func:`~compiler_core.backend.program.tile_failures`: ``fuse``, ``assign_layouts``, ``tile_layer``), the
same code ``check_tiles_fit`` runs after the real quantization. ``qbcompiler check``, the compile's support
stage and the workbench's graph view call it, so a model that cannot fit is refused (or its layers flagged)
with the layer, the bytes and the SRAM before any calibration runs.

Not known before calibration: the int16 layers ``mixedPrecision`` chooses from the statistics (each needs
up to twice the bytes); the compile tiles every layer again right after quantization and refuses any
that does not fit.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import onnx_ir as ir

from compiler_core.backend.program import tile_failures
from compiler_core.backend.tiling import does_not_fit
from compiler_core.config import CompileConfig
from compiler_core.errors import DoesNotFitError
from compiler_core.progress import CancelToken, ProgressCallback, Reporter
from compiler_core.quantization.pipeline import quantize_graph
from compiler_core.quantization.program import QuantizedModel
from compiler_core.targets import DeviceProfile, NodeSupport, SupportReport, SupportStatus

logger = logging.getLogger(__name__)

STAND_IN_RANGE = (-1.0, 1.0)
"""The range every tensor gets in the stand-in quantization (sizes do not depend on it)."""


def check_fit(graph: ir.Model, device: DeviceProfile, config: CompileConfig | None = None, *,
              cancel_token: CancelToken | None = None) -> None:
    """Refuse ``graph`` when a layer's smallest tile exceeds ``device.sram_bytes_per_core``.

    Args:
        graph: a canonical MBLT whose nodes all have integer kernels (check support first).
        device: the target device.
        config: the resolved CompileConfig (int16 layers); the defaults when None.
        cancel_token: stops the stand-in quantization between its steps.

    Raises:
        DoesNotFitError: the first layer that does not fit, named with its source node; ``fields["layers"]``
            lists every layer that does not fit.
    """
    failures = fit_failures(graph, device, config, cancel_token=cancel_token)
    if failures:
        raise fit_error(failures)


def fit_error(failures: list[DoesNotFitError]) -> DoesNotFitError:
    """One error for ``failures`` (non-empty): the first layer's, naming how many more do not fit;
    ``fields["layers"]`` lists them all."""
    first = failures[0]
    layers = [error.fields["layer"] for error in failures]
    more = f" {len(failures) - 1} more layer(s) do not fit either: {', '.join(layers[1:6])}." if layers[1:] else ""
    return DoesNotFitError(first.message + more, hint=first.hint, **{**first.fields, "layers": layers})


def fit_failures(graph: ir.Model, device: DeviceProfile, config: CompileConfig | None = None, *,
                 callback: ProgressCallback | None = None,
                 cancel_token: CancelToken | None = None) -> list[DoesNotFitError]:
    """The refusal of every layer of ``graph`` whose smallest tile exceeds the core SRAM (empty when all fit).

    ``fields["layer"]`` of each is the MBLT node name of the layer's main operation (the support report's
    node), and the message names its source node too. ``callback`` receives the stand-in quantization's
    progress (the workbench runs this in a worker).
    """
    model = stand_in_program(graph, config or CompileConfig(), reporter=Reporter(callback, cancel_token))
    sources = {node.name: node.metadata_props.get("mblt.source_name", "") for node in graph.graph}
    failures = [_with_source(error, sources.get(error.fields["layer"], "")) for error in tile_failures(model, device)]
    logger.debug("fit check on %s: %d operations, %d layer(s) too large for %d bytes of SRAM", device.name,
                 len(model.ops), len(failures), device.sram_bytes_per_core)
    return failures


def npu_fit_failures(graph: ir.Model, report: SupportReport, device: DeviceProfile,
                     config: CompileConfig | None = None, *, callback: ProgressCallback | None = None,
                     cancel_token: CancelToken | None = None) -> list[DoesNotFitError]:
    """:func:`fit_failures` of what the NPU would run: the whole graph when every node is supported, else the body
    CPU offload would leave (its nodes keep their names); empty when no such body exists (an unsupported node inside
    the graph: nothing of it compiles as it is)."""
    from compiler_core.backend.partition import partition
    from compiler_core.targets import body_computes, plan_cpu_offload

    if report.all_supported:
        return fit_failures(graph, device, config, callback=callback, cancel_token=cancel_token)
    plan = plan_cpu_offload(graph, report)
    if not plan.npu_ready or not body_computes(graph, plan):
        return []
    return fit_failures(partition(graph, plan).body, device, config, callback=callback, cancel_token=cancel_token)


def stand_in_program(graph: ir.Model, config: CompileConfig, *, reporter: Reporter | None = None) -> QuantizedModel:
    """``graph`` quantized by the compile's quantizer with :data:`STAND_IN_RANGE` for every tensor (no statistics)."""
    calibration = config.calibration
    if int(calibration.output) != 0:  # not implemented, changes no size: the compile's quantizer says so, once
        calibration = calibration.model_copy(update={"output": type(calibration.output)(0)})
        config = config.model_copy(update={"calibration": calibration})
    return quantize_graph(graph, lambda names, bits: dict.fromkeys(names, STAND_IN_RANGE), config,
                          reporter=reporter, weight_clip_search=False)


def flag_fit_failures(report: SupportReport, failures: list[DoesNotFitError]) -> SupportReport:
    """``report`` with each layer that does not fit marked ``unsupported``, the refusal as its reason.

    The graph view colours and explains these nodes like any other blocking node, and the workbench's
    compile readiness reads the same report.
    """
    entries = dict(report.entries)
    for error in failures:
        entry: NodeSupport | None = entries.get(error.fields["layer"])
        if entry is not None:
            entries[entry.node] = replace(entry, status=SupportStatus.UNSUPPORTED, reason=error.message)
    return replace(report, entries=entries)


def _with_source(error: DoesNotFitError, source: str) -> DoesNotFitError:
    layer = error.fields["layer"]
    if not source or source == layer:
        return error
    need = {"total": error.fields["needed_bytes"], "weights": error.fields["weights_bytes"],
            "activations": error.fields["activation_bytes"], "luts": error.fields["lut_bytes"]}
    return does_not_fit(layer, need, error.fields["sram_bytes"], f"{layer} (source node {source})")
