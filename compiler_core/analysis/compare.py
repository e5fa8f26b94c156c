"""FP32 (the MBLT in onnxruntime) vs the quantized model (fast simulator) on held-out samples.

The quantized side runs on :class:`~compiler_core.runtime.fastpath.FastExecutor` (codes identical to
the golden executor) in batches of up to :data:`MAX_BATCH` samples, fewer when the kept per-layer
tensors of a batch would exceed :data:`KEPT_ELEMENTS_BUDGET` elements (bounded memory). The FP32
side is one onnxruntime session exposing every compared tensor, run once per sample. Metrics are
fused float64 sums straight from the integer codes (:func:`~compiler_core.analysis.metrics.fused_sums`),
with BLAS on one thread: on a loaded 2-core machine threaded dot products spin-wait and ran 4x slower.

A held-out sample whose FP32 output is (near) zero has no meaningful cosine: it is left out of the
output's cosine (SQNR sums over all samples and stays honest), listed in ``near_zero_samples``, and a
warning names its source file.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
from threadpoolctl import threadpool_limits

from compiler_core.analysis.metrics import (
    WARN_SQNR_DB,
    TensorComparison,
    at_tokens,
    head_op_type,
    is_classifier_output,
    token_positions,
)
from compiler_core.calibration.statistics import session_with_outputs
from compiler_core.mblt.io import load_mblt
from compiler_core.progress import Reporter, as_reporter
from compiler_core.quantization.program import QuantizedModel
from compiler_core.runtime.fastpath import FastExecutor, executor_for

logger = logging.getLogger(__name__)

MAX_BATCH = 4
KEPT_ELEMENTS_BUDGET = 1 << 24  # float32 codes kept for per-layer metrics: 64 MB; big batches of big
# activations ran slower per sample (PP-OCR det 640x640: batch 8 took 4.5x the time of batch 1 per sample)

import onnxruntime as ort  # noqa: E402  (after the project imports: heavy, and only needed here)


def analyze(mblt_path: str | Path | ir.Model, model: QuantizedModel, samples: Iterable[Mapping[str, np.ndarray]], *,
            num_samples: int, per_layer: bool = True, reporter: Reporter | None = None,
            sample_names: Sequence[str] | None = None, log_warnings: bool = True, tail: bytes | None = None,
            model_outputs: Sequence[str] | None = None) -> dict[str, Any]:
    """Compare outputs (and, optionally, every quantized tensor) of FP32 and quantized runs.

    ``mblt_path`` is the MBLT file or the model in memory (a compile session's graph, left unchanged).
    ``sample_names`` (e.g. the held-out files) name the samples in warnings. ``log_warnings=False`` only returns
    them (the mixed-precision search measures the same samples at every point it tries).

    With CPU offload, ``tail`` is the ONNX CPU tail and ``model_outputs`` the whole model's outputs: the outputs
    compared are then the model's (the tail run on the FP32 body outputs and on the dequantized quantized ones, as
    the runtime runs it), not the body's inner tensors the tail reads.

    Returns:
        ``{"samples", "outputs": {name: metrics}, "layers": [{"layer", "op", "precision", "position",
        ...metrics}] (worst SQNR first; ``position`` is the layer's index in graph order, -1 for an
        input), "summary": {...}, "warnings": [...]}``.
    """
    reporter = as_reporter(reporter)
    count = 0
    # The stage opens before the FP32 session and the simulator are built (seconds on a large model), so
    # the user sees the analysis start at once; then one event per compared sample.
    with reporter.stage("analyze", total=num_samples, message="preparing the FP32 reference and the simulator"):
        cpu_tail = _CpuTail(tail, model, model_outputs) if tail is not None else None
        session, names = _reference_session(mblt_path, model, per_layer, cpu_tail.inputs if cpu_tail else ())
        body_outputs = [spec for spec in model.outputs if cpu_tail is None or spec.name in cpu_tail.model_outputs]
        outputs = {spec.name: TensorComparison(peak=0.0) for spec in body_outputs if spec.name in model.tensors}
        layers = {name: TensorComparison() for name in names if name in model.tensors} if per_layer else {}
        count_outputs = len(body_outputs) + (len(cpu_tail.outputs) if cpu_tail else 0)
        classifier = {spec.name: is_classifier_output(spec.shape, _head_op(model, spec.name), count_outputs,
                                                          spec.name)
                      for spec in body_outputs}
        if cpu_tail is not None:
            outputs.update({name: TensorComparison() for name in cpu_tail.outputs})
            classifier.update(cpu_tail.classifier(count_outputs))
        fast = executor_for(model)
        batch = _batch_size(model, set(layers)) if fast.batchable else 1
        reporter.advance(0, "comparing FP32 and quantized outputs")
        with threadpool_limits(limits=1, user_api="blas"):
            for chunk in _chunks(samples, batch):
                quantized = _quantized_chunk(fast, model, chunk, set(layers))
                for index, sample in enumerate(chunk):
                    _compare_sample(session, names, model, sample, quantized, index, outputs, layers, classifier,
                                    cpu_tail)
                    count += 1
                    reporter.advance()
    report = _report(model, outputs, layers, classifier, count)
    report["warnings"] = _near_zero_warnings(report["outputs"], sample_names) + _quiet_probability_warnings(
        report["outputs"], {spec.name: _head_op(model, spec.name) for spec in body_outputs})
    for message in report["warnings"] if log_warnings else ():
        logger.warning(message)
    return report


def class_score_outputs(model: QuantizedModel, output_specs: Sequence, tail: bytes | None = None) -> dict[str, bool]:
    """Which of a compiled model's outputs hold class scores (:func:`is_classifier_output`, the one rule), for
    ``qbcompiler run`` and "Try on inputs" as for the analysis: ``output_specs`` are the whole model's outputs
    (``name``, ``shape``), written by the NPU body ``model`` or by the CPU ``tail``."""
    count = len(output_specs)
    flags = {spec.name: is_classifier_output(list(spec.shape), _head_op(model, spec.name), count, spec.name)
             for spec in output_specs if spec.name in model.tensors}
    if tail is not None:
        flags.update(_CpuTail(tail, model, [spec.name for spec in output_specs]).classifier(count))
    return flags


def _head_op(model: QuantizedModel, tensor: str) -> str:
    """ONNX op type of the operation writing ``tensor``, looking through shape-only ops ("" if none)."""
    return head_op_type(tensor, {name: (op.op_type, op.inputs[0] if op.inputs else None)
                                 for op in model.ops for name in op.outputs})


QUIET_PROBABILITY = 0.05
"""A Sigmoid/Softmax output below this on every held-out sample never fired there (a wake word in plain speech)."""


def _quiet_probability_warnings(outputs: dict[str, dict], heads: Mapping[str, str]) -> list[str]:
    """Probabilities that stay near 0 on every held-out sample: their SQNR and cosine measure noise around zero
    (the rows get ``quiet_probability``)."""
    warnings = []
    for name, row in outputs.items():
        peak = row.get("reference_peak")
        if heads.get(name) in ("Sigmoid", "Softmax") and peak is not None and peak < QUIET_PROBABILITY \
                and row.get("verdict") != "ok":
            row["quiet_probability"] = True  # the CLI's accuracy hint leaves it out
            warnings.append(f"output '{name}': a probability that stays at or below {peak:.2g} on every held-out "
                            f"sample (the model never fires on them), so its SQNR and cosine measure the error around "
                            f"zero (largest error {row['max_abs_error']:.2g}); hold out samples where it fires to "
                            "judge the accuracy")
    return warnings


def _near_zero_warnings(outputs: dict[str, dict], sample_names: Sequence[str] | None) -> list[str]:
    warnings = []
    for name, row in outputs.items():
        for index in row.get("near_zero_samples", []):
            sample = sample_names[index] if sample_names and index < len(sample_names) else f"#{index}"
            message = (f"output '{name}': the FP32 output of held-out sample {sample} is (near) zero, so its "
                       "cosine is meaningless and is left out of the cosine mean/min (SQNR still counts it)")
            warnings.append(message)
    return warnings


def _batch_size(model: QuantizedModel, kept: set[str]) -> int:
    per_sample = sum(int(np.prod(model.shapes.get(name, [1]))) for name in kept) or 1
    return max(1, min(MAX_BATCH, KEPT_ELEMENTS_BUDGET // per_sample))


def _chunks(samples: Iterable[Mapping[str, np.ndarray]], size: int):
    chunk = []
    for sample in samples:
        chunk.append(sample)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _quantized_chunk(fast: FastExecutor, model: QuantizedModel, chunk: list, kept: set[str]) -> dict[str, np.ndarray]:
    """Codes of the outputs and of the kept tensors for a chunk of samples, in one batched run."""
    feeds = {spec.name: np.concatenate([np.asarray(sample[spec.name]) for sample in chunk]) for spec in model.inputs}
    return fast.execute_codes(fast.quantize_inputs(feeds), keep=kept, as_int64=False)


def _reference_session(mblt: str | Path | ir.Model, model: QuantizedModel, per_layer: bool, tail_inputs=()):
    """The FP32 session and the tensors it returns: the outputs, every quantized tensor when ``per_layer``, and the
    body's tensors a CPU tail reads (an ArgMax's int64 indices are no quantized tensor)."""
    graph = mblt if isinstance(mblt, ir.Model) else load_mblt(mblt)
    inputs = {s.name for s in model.inputs}
    wanted = [name for name in model.tensors if name not in inputs] if per_layer else []
    exact = [name for name in tail_inputs if name in model.exact and name not in inputs]
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session, names = session_with_outputs(graph, wanted, options, any_type=exact)
    if per_layer:
        return session, names
    outputs = [v.name for v in graph.graph.outputs]
    return session, outputs + [name for name in names if name in model.exact and name not in outputs]


class _CpuTail:
    """The CPU tail of an offloaded model, run after the FP32 body and after the quantized one."""

    def __init__(self, tail: bytes, model: QuantizedModel, model_outputs: Sequence[str] | None) -> None:
        import onnx

        self.session = ort.InferenceSession(tail, providers=["CPUExecutionProvider"])
        self.inputs = [item.name for item in self.session.get_inputs()]
        self.outputs = [item.name for item in self.session.get_outputs()]
        body = {spec.name for spec in model.outputs}
        self.model_outputs = set(model_outputs) if model_outputs is not None else body - set(self.inputs)
        proto = onnx.load_model_from_string(tail)
        self._producers = {name: (node.op_type, node.input[0] if node.input else None)
                           for node in proto.graph.node for name in node.output}
        self._shapes = {value.name: [dim.dim_value for dim in value.type.tensor_type.shape.dim]
                        for value in proto.graph.output}

    def classifier(self, count: int) -> dict[str, bool]:
        return {name: is_classifier_output(self._shapes.get(name, []), head_op_type(name, self._producers), count,
                                           name)
                for name in self.outputs}

    def run(self, values: Mapping[str, np.ndarray], sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {name: values[name] if name in values else np.asarray(sample[name]) for name in self.inputs}
        return dict(zip(self.outputs, self.session.run(self.outputs, feeds)))


def _compare_sample(session, names, model: QuantizedModel, sample, quantized: dict, index: int, outputs, layers,
                    classifier, cpu_tail: _CpuTail | None = None) -> None:
    feeds = {spec.name: np.asarray(sample[spec.name]) for spec in model.inputs}
    session_inputs = {item.name for item in session.get_inputs()}
    reference = dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in session_inputs})))
    keep = token_positions(sample)  # outputs [1, S, ...] are compared at the tokens, not at padding
    if cpu_tail is not None:
        ours = {name: _tail_input(model, quantized, name, index, reference[name])
                for name in cpu_tail.inputs if name in reference}
        tail_reference, tail_ours = cpu_tail.run(reference, sample), cpu_tail.run(ours, sample)
        for name in cpu_tail.outputs:
            outputs[name].add(at_tokens(tail_reference[name], keep), at_tokens(tail_ours[name], keep), classifier[name])
            outputs[name].padding += _padding(tail_reference[name], keep)
    for name, comparison in outputs.items():
        if cpu_tail is not None and name in cpu_tail.outputs:
            continue
        rows = _sample_rows(model, quantized, name, index)
        if np.shape(rows) == np.shape(reference[name]):
            _add(comparison, model, name, at_tokens(reference[name], keep), at_tokens(rows, keep), classifier[name])
            comparison.padding += _padding(reference[name], keep)
        else:
            _add(comparison, model, name, reference[name], rows, classifier[name])
    for name, comparison in layers.items():
        if name in quantized and name in reference:
            _add(comparison, model, name, reference[name], _sample_rows(model, quantized, name, index), False)


def _padding(value: np.ndarray, keep: np.ndarray | None) -> int:
    """Positions of ``value`` left out as padding (:func:`at_tokens`)."""
    return 0 if at_tokens(value, keep) is value else int((~keep).sum())


def _tail_input(model: QuantizedModel, quantized: dict, name: str, index: int, reference: np.ndarray) -> np.ndarray:
    """The quantized body's value of a tensor the CPU tail reads: dequantized, or as it is for an exact tensor."""
    rows = _sample_rows(model, quantized, name, index)
    value = rows if name in model.exact else model.params(name).dequantize(rows)
    return np.asarray(value).astype(reference.dtype).reshape(np.shape(reference))


def _sample_rows(model: QuantizedModel, quantized: dict, name: str, index: int) -> np.ndarray:
    """Sample ``index``'s block of a chunk's codes: a tensor whose one-sample shape leads with d > 1 (ViT's
    heads folded into the first axis) comes back from a sample-by-sample run as d rows per sample. A scalar
    (a ReduceMax with ``keepdims=0``: openWakeWord's ``max(x) - 80 dB``) has no rows: a model with one is never
    batched, so its one sample's value is the whole."""
    if np.ndim(quantized[name]) == 0:
        return quantized[name]
    shape = model.shapes.get(name)
    rows = int(shape[0]) if shape and int(shape[0]) > 0 else 1
    return quantized[name][index * rows:(index + 1) * rows]


def _add(comparison: TensorComparison, model: QuantizedModel, name: str, reference: np.ndarray, codes: np.ndarray,
         classifier: bool) -> None:
    """Per-tensor codes go straight into the fused sums; per-channel ones are dequantized first."""
    params = model.params(name)
    if params.axis is None or np.size(params.scale) == 1:
        comparison.add_codes(reference, codes, float(np.ravel(params.scale)[0]), float(np.ravel(params.zero_point)[0]),
                             classifier)
    else:
        comparison.add(reference, params.dequantize(codes), classifier)


def _report(model: QuantizedModel, outputs, layers, classifier, count: int) -> dict[str, Any]:
    producer = {out: (position, op) for position, op in enumerate(model.ops) for out in op.outputs}
    layer_rows = []
    for name, comparison in layers.items():
        position, op = producer.get(name, (-1, None))
        layer_rows.append({"tensor": name, "layer": op.name if op else name, "op": op.op_type if op else "input",
                           "precision": op.precision if op else f"a{model.tensors[name].bits}",
                           "position": position, **comparison.to_dict()})
    layer_rows.sort(key=lambda row: row["sqnr_db"] if row["sqnr_db"] is not None else 1e9)
    output_rows = {name: comparison.to_dict(classifier[name]) for name, comparison in outputs.items()}
    return {"samples": count, "outputs": output_rows, "layers": layer_rows,
            "summary": {**_summary(output_rows, layer_rows), "range_loss": range_loss_layer(model, layer_rows)}}


RANGE_OPS = frozenset({"Log", "Sqrt", "Pow"})
"""Ops whose input range an integer grid may not hold (a Log of a power spectrum: 80-100 dB)."""
ERROR_BORN_DB = 10.0
"""How much lower than each of its inputs' SQNR a layer's SQNR must be for its error to count as born there."""


def range_loss_layer(model: QuantizedModel, layers: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The first Log/Sqrt/Pow layer (program order) where the error is born, or None.

    Its SQNR is below the warning level and at least :data:`ERROR_BORN_DB` below that of every input the analysis
    measured (graph inputs and constants are exact): the values reaching it were fine, and it lost them; on an
    integer grid, the small values of a wide range (every bin under one step becomes the floor). Running it with the
    layers before it on the CPU (``cpuLayers.head``) removes that error; the accuracy hint names the layer.
    """
    by_tensor = {row["tensor"]: row for row in layers}
    for row in sorted(layers, key=lambda row: row["position"]):
        sqnr = row["sqnr_db"]
        if row["op"] not in RANGE_OPS or row["position"] < 0 or sqnr is None or sqnr >= WARN_SQNR_DB:
            continue
        inputs = [by_tensor[name]["sqnr_db"] for name in model.ops[row["position"]].inputs if name in by_tensor]
        if all(value is None or value >= sqnr + ERROR_BORN_DB for value in inputs):
            measured = [value for value in inputs if value is not None]
            return {"layer": row["layer"], "op": row["op"], "sqnr_db": sqnr,
                    "input_sqnr_db": min(measured) if measured else None}
    return None


def _summary(outputs: dict[str, dict], layers: list[dict]) -> dict[str, Any]:
    verdicts = [row["verdict"] for row in outputs.values()]
    worst = "flag" if "flag" in verdicts else "warn" if "warn" in verdicts else "ok"
    return {"verdict": worst,
            "min_output_sqnr_db": min((row["sqnr_db"] for row in outputs.values()), default=None),
            "mean_output_cosine": _mean([row["cosine_mean"] for row in outputs.values()]),
            "layers_warned": sum(1 for row in layers if row["verdict"] == "warn"),
            "layers_flagged": sum(1 for row in layers if row["verdict"] == "flag"),
            "worst_layers": [row["layer"] for row in layers[:5]]}


def _mean(values: list[float | None]) -> float | None:
    """Mean of the values that exist (an output whose every sample is near zero has no cosine)."""
    present = [value for value in values if value is not None]
    return float(np.mean(present)) if present else None
