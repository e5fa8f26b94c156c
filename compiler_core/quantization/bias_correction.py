"""Data-driven (empirical) bias correction of the integer program, layer by layer.

The analytic correction (``layerBiasCorrection`` at lowering, :func:`~compiler_core.quantization.kernels.linear`)
removes the expected error of a layer's own weight rounding, ``(W - W_q) E[x]``. It cannot see the error
the layer *inherits*: the quantized input of a layer differs from the float one by more than zero-mean
noise (clipping, the rounding of a skewed distribution, a look-up table, and the weight rounding of every
layer before it), and a per-channel mean shift survives every later layer; a global average pool then
keeps only that shift (PP-OCR det's squeeze-and-excitation pools: output SQNR 0-1 dB on 8-dB inputs).

This pass measures the shift itself (Nagel et al. 2019, "empirical bias correction"): the calibration
samples run through the float graph, and as one batch through the integer program, operation by operation
in graph order. At every linear layer (Conv, ConvTranspose, Gemm, MatMul with constant weights) the mean
per output channel of ``dequantized - float`` over samples and positions is measured (the float values
clamped to the tensor's quantized range: clipping is the calibration's choice, not a shift to undo), the layer's int32
bias moves by ``-shift / (s_x * s_w[c])`` codes, and the layer runs again before the next operation
reads it: each layer is corrected for what the corrected layers before it give it (correcting every
layer at once from one measurement counts an upstream shift twice, once where it enters and once in every
layer it reaches; on PP-OCR det that diverged). A layer with a fused Relu/Clip is measured after the
activation. Cost: one batched run of the program and one float run per sample.

The program changes in place (its ``bias`` constants); the float graph is not touched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from compiler_core.progress import Reporter, as_reporter
from compiler_core.quantization.program import IntOp, QuantizedModel

logger = logging.getLogger(__name__)

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def correct_biases(float_graph: ir.Model, model: QuantizedModel, samples: Sequence[Mapping[str, np.ndarray]], *,
                   reporter: Reporter | None = None) -> dict[str, Any]:
    """Move the int32 biases of ``model``'s linear layers by their measured mean output error (see the module docstring).

    Args:
        float_graph: the float graph ``model`` was quantized from (after equalization / smoothing).
        model: the integer program; its ``bias`` constants change in place.
        samples: calibration input dicts (never the held-out ones), run as one batch.
        reporter: progress (stage ``bias-correction``, one unit per layer) and cancel.

    Returns:
        ``{"layers": corrected layer count, "mean_shift_steps": mean |shift| before correction, in output steps}``.
    """
    reporter = as_reporter(reporter)
    samples = list(samples)
    layers = {op.name: op for op in model.ops if op.kind == "linear" and op.outputs[0] in model.tensors}
    if not layers or not samples:
        return {"layers": 0, "mean_shift_steps": 0.0}
    walk = ProgramWalk(model, samples)
    if walk.fast is None:
        logger.warning("Empirical bias correction skipped: it runs the samples as one batch, and this program has "
                       "tensors without a leading batch dimension of 1.")
        return {"layers": 0, "mean_shift_steps": 0.0}
    reference = _float_means(float_graph, model, [op.outputs[0] for op in layers.values()], layers, samples)
    count = walk.count
    shifts = []
    with reporter.stage("bias-correction", total=len(layers), message=f"{len(layers)} layers, {count} samples"):
        for index, op in enumerate(model.ops):
            reporter.check()
            result = walk.run(index, op)
            if op.name in layers and op.outputs[0] in reference:
                name = op.outputs[0]
                shift = _channel_mean(model.params(name).dequantize(result[0]), _channel_axis(op, result[0].ndim))
                shift -= reference[name]
                if _move_bias(model, op, -shift):
                    result = walk.run(index, op, changed=True)
                    shifts.append(float(np.mean(np.abs(shift))) / _output_scale(model, name))
                reporter.advance()
            walk.store(index, op, result)
    mean_shift = float(np.mean(shifts)) if shifts else 0.0
    logger.info("Bias correction: %d layer(s) on %d sample(s), mean |shift| %.3f output step(s)", len(shifts), count,
                mean_shift)
    return {"layers": len(shifts), "mean_shift_steps": mean_shift}


STEP_CHUNK = 4
"""Samples per step call: a convolution's intermediates (im2col, accumulators) grow with the batch, the
environment does not need to (PP-OCR det with 16 samples in one call went past 5.7 GB)."""


class ProgramWalk:
    """The integer program run op by op on calibration samples as one batch, for passes that change a layer's
    constants on the way and run the rest of the program on its new output (bias correction, the weight refit).

    Attributes:
        fast: the fast executor of the program, or None when it cannot run the samples as one batch.
        env: tensor name -> codes of every sample, inputs first; a tensor leaves once its last reader ran.
        count: the number of samples.
    """

    def __init__(self, model: QuantizedModel, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
        from compiler_core.runtime.fastpath.plan import FastExecutor, PlanContext

        self.model, self.count = model, len(samples)
        fast = FastExecutor(model)
        self.fast = fast if fast.batchable else None
        self.env: dict[str, np.ndarray] = {}
        if self.fast is not None:
            self._context = PlanContext(model)
            feeds = {spec.name: np.concatenate([np.asarray(s[spec.name]) for s in samples]) for spec in model.inputs}
            self.env = fast.quantize_inputs(feeds)
            self._last_use = model.last_uses()
            self._outputs = {spec.name for spec in model.outputs}

    def run(self, index: int, op: IntOp, *, changed: bool = False) -> list[np.ndarray]:
        """The outputs of op ``index`` on the current environment; ``changed``: its constants changed since the
        executor was planned (its step is planned again)."""
        from compiler_core.runtime.fastpath.plan import build_step

        step = build_step(op, self._context) if changed else self.fast.steps[index]
        return _run_step(step, op, self.env, self.count)

    def store(self, index: int, op: IntOp, result: list[np.ndarray]) -> None:
        """Keep op ``index``'s outputs; drop the inputs no later op reads (graph outputs stay)."""
        for name, value in zip(op.outputs, result):
            self.env[name] = value
        for name in op.inputs:
            if name and self._last_use.get(name) == index and name not in self._outputs:
                self.env.pop(name, None)


def _run_step(step, op: IntOp, env: dict, count: int) -> list[np.ndarray]:
    from compiler_core.runtime.fastpath.plan import _per_sample

    inputs = [env[name] if name else None for name in op.inputs]
    if count == 1 or not step.batch_safe:
        return list(step.run(inputs) if count == 1 else _per_sample(step, inputs, count))
    parts = []
    for start in range(0, count, STEP_CHUNK):
        chunk = [value[start:start + STEP_CHUNK] if value is not None and value.ndim and value.shape[0] == count
                 else value for value in inputs]
        parts.append(step.run(chunk))
    return [np.concatenate([part[position] for part in parts]) for position in range(len(parts[0]))]


def _channel_axis(op: IntOp, ndim: int) -> int:
    """Output channel axis: 1 for convolutions (NCHW), the last axis for dense layers."""
    return 1 if op.attrs.get("layout") in ("conv", "conv_transpose") and ndim >= 2 else ndim - 1


def _channel_mean(values: np.ndarray, axis: int) -> np.ndarray:
    values = np.moveaxis(np.asarray(values, dtype=np.float64), axis, -1)
    return values.reshape(-1, values.shape[-1]).mean(axis=0)


def _float_means(float_graph: ir.Model, model: QuantizedModel, tensors: list[str], layers: Mapping[str, IntOp],
                 samples) -> dict[str, np.ndarray]:
    """Per-channel mean of every linear layer's float output, clamped to its quantized range, over the samples."""
    import onnxruntime as ort

    from compiler_core.calibration.statistics import session_with_outputs

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session, names = session_with_outputs(float_graph, tensors, options)
    inputs = {item.name for item in session.get_inputs()}
    axes = {op.outputs[0]: op for op in layers.values()}
    sums: dict[str, np.ndarray] = {}
    for sample in samples:
        values = session.run(names, {k: np.asarray(v) for k, v in sample.items() if k in inputs})
        for name, value in zip(names, values):
            if name in axes:
                mean = _channel_mean(_representable(model, name, value), _channel_axis(axes[name], np.ndim(value)))
                sums[name] = sums.get(name, 0.0) + mean
    return {name: total / len(samples) for name, total in sums.items()}


def _representable(model: QuantizedModel, name: str, value: np.ndarray) -> np.ndarray:
    """``value`` clamped to the range the tensor's codes can hold: the correction removes the shift of the
    rounding, not the clipping the calibration chose (moving every value to make up for clipped outliers
    cost MobileNetV2 int8 19 of 192 views on the search split)."""
    params = model.params(name)
    if params.axis is not None:
        return value
    scale, zero_point = float(np.ravel(params.scale)[0]), float(np.ravel(params.zero_point)[0])
    return np.clip(value, (params.qmin - zero_point) * scale, (params.qmax - zero_point) * scale)


def _output_scale(model: QuantizedModel, name: str) -> float:
    return float(np.max(np.ravel(model.params(name).scale))) or 1.0


def _move_bias(model: QuantizedModel, op: IntOp, shift: np.ndarray) -> bool:
    """Add ``shift`` (float, per output channel) to the layer's int32 bias at scale ``s_x * s_w[c]``."""
    bias = op.consts["bias"]
    if shift.size != bias.size:
        return False  # a layer whose output channels are not on the measured axis (left as it is)
    input_params = model.params(op.inputs[0])
    s_x = float(np.ravel(input_params.scale)[0]) if input_params.axis is None else 1.0
    scale = s_x * np.asarray(op.attrs["weight_scale"], dtype=np.float64)
    moved = bias.astype(np.int64) + np.round(shift / scale).astype(np.int64)
    op.consts["bias"] = np.clip(moved, INT32_MIN, INT32_MAX).astype(np.int32)
    return True
