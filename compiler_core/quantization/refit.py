"""Convolution weights refitted to the program's own quantized inputs, layer by layer (``bit.weightRounding: sequential``).

GPTQ (``bit.weightRounding: gptq``, :mod:`~compiler_core.quantization.gptq`) keeps each layer's output on its
*FP32* input: it sees the layer's own weight rounding, not what the layer inherits. With 8-bit activations the
input a convolution actually reads differs from the FP32 one by the rounding of every tensor before it, and that
difference is not independent noise: on smooth inputs (an upscaled grey photo) neighbouring pixels round the same
way, and a per-channel mean shift survives to the squeeze-and-excitation pools.

This pass fits each convolution to its quantized input (sequential GPTQ with a bias; Frantar et al. 2022 apply
the same idea to the quantized prefix of a network). The calibration samples run as one batch through the integer
program operation by operation and through the float graph. At every Conv the weights and bias, in the units the
layer computes in (codes of its input times codes of its weights), are set to the least-squares fit

    [W', b'] = [W, b] Σ_fq Σ_qq⁻¹,   Σ_fq = E[a_fp a_qᵀ],  Σ_qq = E[a_q a_qᵀ]

of the float layer's output on the quantized input columns (``a`` = im2col columns of the input with a constant 1;
``a_fp`` the FP32 input clamped to the input's quantized range: clipping is the calibration's choice, not an
error to fit), damped towards the original weights; ``W'`` is rounded by GPTQ with the Hessian ``Σ_qq`` of the
quantized columns themselves, and the bias is refitted to the rounded codes. The layer then runs again before the
next operation reads it, so each layer is fitted to what the refitted layers before it give it.

Same weight scales, requantization multipliers, code format and cost: only the ``weight`` codes and ``bias`` of
the program's Conv layers change (every executor reads those), in place. The float graph is not touched.
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
DAMPING = 0.01
"""Ridge towards the original weights, as a fraction of the mean diagonal of ``Σ_qq`` (GPTQ's damping)."""


def refit_convolutions(float_graph: ir.Model, model: QuantizedModel, samples: Sequence[Mapping[str, np.ndarray]], *,
                       reporter: Reporter | None = None) -> dict[str, Any]:
    """Refit every Conv layer of ``model`` to its quantized input (see the module docstring); in place.

    Args:
        float_graph: the float graph ``model`` was quantized from (after equalization / smoothing).
        model: the integer program; the ``weight`` and ``bias`` constants of its Conv layers change.
        samples: calibration input dicts (never held-out ones), run as one batch.
        reporter: progress (stage ``weight-refit``, one unit per Conv) and cancel.

    Returns:
        ``{"layers": refitted Conv count, "error_ratio": median over layers of the accumulator error on the
        samples after / before}``.
    """
    from compiler_core.quantization.bias_correction import ProgramWalk
    from compiler_core.quantization.graph import GraphView

    reporter = as_reporter(reporter)
    samples = list(samples)
    view = GraphView(float_graph)
    nodes = {node.name: node for node in view.nodes}
    layers = {op.name: nodes[op.name] for op in model.ops if _refittable(op, nodes.get(op.name), view)}
    if not layers or not samples:
        return {"layers": 0, "error_ratio": 1.0}
    walk = ProgramWalk(model, samples)
    if walk.fast is None:
        logger.warning("Weight refit skipped: it runs the samples as one batch, and this program has tensors without "
                       "a leading batch dimension of 1.")
        return {"layers": 0, "error_ratio": 1.0}
    reference = _float_inputs(float_graph, [node.inputs[0].name for node in layers.values()], samples)
    count = walk.count
    ratios = []
    with reporter.stage("weight-refit", total=len(layers), message=f"{len(layers)} convolutions, {count} samples"):
        for index, op in enumerate(model.ops):
            reporter.check()
            if op.name in layers:
                node = layers[op.name]
                x_float = reference.get(node.inputs[0].name)
                if x_float is None:  # the layer reads a model input: the float samples themselves
                    x_float = np.concatenate([np.asarray(sample[node.inputs[0].name]) for sample in samples])
                ratios.append(_refit(model, op, node, view.const(node.inputs[1]), walk.env[op.inputs[0]], x_float))
            result = walk.run(index, op, changed=op.name in layers)
            if op.name in layers:
                reporter.advance()
            walk.store(index, op, result)
    ratio = float(np.median(ratios)) if ratios else 1.0
    logger.info("Weight refit: %d convolution(s) on %d sample(s), accumulator error after / before %.3f (median)",
                len(ratios), count, ratio)
    return {"layers": len(ratios), "error_ratio": ratio}


def _refittable(op: IntOp, node: ir.Node | None, view) -> bool:
    return (op.kind == "linear" and op.attrs.get("layout") == "conv" and node is not None and node.op_type == "Conv"
            and len(node.inputs) > 1 and view.const(node.inputs[1]) is not None and "weight" in op.consts)


def _float_inputs(float_graph: ir.Model, tensors: list[str], samples) -> dict[str, np.ndarray]:
    """FP32 values of ``tensors`` (graph inputs excepted) for the samples, batched on axis 0."""
    import onnxruntime as ort

    from compiler_core.calibration.statistics import session_with_outputs

    graph_inputs = {value.name for value in float_graph.graph.inputs}
    wanted = sorted(set(tensors) - graph_inputs)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session, names = session_with_outputs(float_graph, wanted, options)
    inputs = {item.name for item in session.get_inputs()}
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for sample in samples:
        for name, value in zip(names, session.run(names, {k: np.asarray(v) for k, v in sample.items() if k in inputs})):
            parts[name].append(np.asarray(value, np.float32))
    return {name: np.concatenate(values) for name, values in parts.items()}


def _refit(model: QuantizedModel, op: IntOp, node: ir.Node, weight: np.ndarray, x_codes: np.ndarray,
           x_float: np.ndarray) -> float:
    """Refit one Conv in place; returns its accumulator error on the samples after / before."""
    from compiler_core.quantization.gptq import conv_columns, gptq_conv_codes
    from compiler_core.quantization.kernels.linear import input_channel_index

    params = model.params(op.inputs[0])
    weight = np.asarray(weight, np.float64)
    out_channels, per_group_in = weight.shape[:2]
    shape = [1, -1] + [1] * (x_codes.ndim - 2)
    if params.axis is not None:  # per-channel input scales are folded into the weights (kernels.linear)
        scales = np.asarray(params.scale, np.float64)
        channel = input_channel_index(out_channels, per_group_in, scales.size // per_group_in)
        weight = weight * scales[channel].reshape(out_channels, per_group_in, *([1] * (weight.ndim - 2)))
        x_scale = scales.reshape(shape)
    else:
        x_scale = float(np.ravel(params.scale)[0])
    zero_point = np.asarray(op.attrs["zp_x"], np.float64)
    zero_point = zero_point.reshape(shape) if zero_point.ndim else zero_point
    low = (params.qmin - zero_point) * x_scale
    high = (params.qmax - zero_point) * x_scale
    w_scale = np.asarray(op.attrs["weight_scale"], np.float64)
    rows = weight.reshape(out_channels, -1) / w_scale[:, None]  # the float weights in weight codes
    bias = op.consts["bias"].astype(np.float64)
    groups = _groups(node)
    sums = None
    for start in range(x_codes.shape[0]):  # one sample at a time: bounded im2col memory
        quantized = np.asarray(x_codes[start:start + 1], np.float64) - zero_point
        exact = np.clip(np.asarray(x_float[start:start + 1], np.float64), low, high) / x_scale
        columns_q = _with_ones(conv_columns(quantized, node, weight.shape))
        columns_f = _with_ones(conv_columns(exact, node, weight.shape))
        terms = (columns_q.transpose(0, 2, 1) @ columns_q, columns_f.transpose(0, 2, 1) @ columns_q,
                 columns_f.transpose(0, 2, 1) @ columns_f)
        sums = terms if sums is None else tuple(a + b for a, b in zip(sums, terms))
    positions = max(float(sums[0][0, -1, -1]), 1.0)
    q_q, f_q, f_f = (total / positions for total in sums)  # [G, K+1, K+1]
    per_group = out_channels // groups
    original = np.concatenate([rows, bias[:, None]], axis=1).reshape(groups, per_group, -1)  # [G, R, K+1]
    current = np.concatenate([op.consts["weight"].astype(np.float64).reshape(groups, per_group, -1),
                              bias.reshape(groups, per_group, 1)], axis=2)
    target = original @ f_q  # E[t a_qᵀ] with t = [W, b] a_fp
    damping = DAMPING * np.mean(np.diagonal(q_q, axis1=1, axis2=2), axis=1)[:, None, None]
    eye = np.eye(q_q.shape[1])[None]
    fitted = np.linalg.solve(q_q + damping * eye, (target + damping * original).transpose(0, 2, 1)).transpose(0, 2, 1)
    hessians = q_q[:, :-1, :-1]
    bits = 16 if op.consts["weight"].dtype == np.int16 else 8
    codes = gptq_conv_codes(fitted[:, :, :hessians.shape[1]].reshape(weight.shape), hessians, np.ones(out_channels),
                            bits)
    codes_rows = codes.reshape(groups, per_group, -1)
    mean_q, mean_f = q_q[:, :-1, -1], f_f[:, :, -1]  # E[a_q] without the 1; E[a_fp] with it
    new_bias = np.einsum("grk,gk->gr", original, mean_f) - np.einsum("grk,gk->gr", codes_rows, mean_q)
    before = _error(current, original, q_q, f_q, f_f)
    after_rows = np.concatenate([codes_rows, new_bias[:, :, None]], axis=2)
    after = _error(after_rows, original, q_q, f_q, f_f)
    if not after < before:
        return 1.0  # the fit did not help on these samples (a flat or degenerate input): the layer stays as it was
    op.consts["weight"] = codes.astype(op.consts["weight"].dtype)
    op.consts["bias"] = np.clip(np.round(new_bias.reshape(-1)), INT32_MIN, INT32_MAX).astype(np.int32)
    return after / before if before > 0 else 1.0


def _groups(node: ir.Node) -> int:
    from compiler_core.quantization.lowering import attr_int

    return attr_int(node, "group", 1)


def _with_ones(columns: np.ndarray) -> np.ndarray:
    """``[G, P, K]`` columns with a constant 1 appended (the bias)."""
    return np.concatenate([columns, np.ones(columns.shape[:2] + (1,), columns.dtype)], axis=2)


def _error(rows: np.ndarray, original: np.ndarray, q_q: np.ndarray, f_q: np.ndarray, f_f: np.ndarray) -> float:
    """``E ||rows a_q - original a_fp||²`` summed over rows, from the second moments."""
    quadratic = np.einsum("grk,gkl,grl->", rows, q_q, rows)
    cross = np.einsum("grk,gkl,grl->", original, f_q, rows)
    exact = np.einsum("grk,gkl,grl->", original, f_f, original)
    return float(quadratic - 2 * cross + exact)
