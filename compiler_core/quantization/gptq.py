"""GPTQ weight rounding (Frantar et al. 2022): per-channel integer weights chosen to keep each layer's output.

Rounding every weight to its nearest code (RTN) minimises the weights' own error; GPTQ minimises the
error of the layer's *output* on calibration inputs ``X``: ``||W X - W_q X||``. It rounds the input
columns one at a time and spreads each column's rounding error over the columns not yet rounded, in
proportion to the inverse of the inputs' Hessian ``H = 2 X Xᵀ / n`` (the Optimal Brain Surgeon update).
Columns go in blocks of :data:`BLOCK_SIZE`, the far columns updated once per block; ``H`` is damped by
``DAMPING * mean(diag(H))`` on its diagonal. The result is ordinary symmetric per-output-channel codes
and scales, so an MXQ built from GPTQ weights has the same format and cost as one built by RTN.

Used for decoder LLMs (:func:`compiler_core.llm.compile_llm`, ``llm.gptq``): :func:`gptq_model` rounds
every ``nn.Linear`` of a torch causal LM in place to weights that lie exactly on the grid the compiler's
per-channel quantization (:func:`compiler_core.quantization.kernels.linear.weight_channel_scales`) then
chooses, so the MXQ holds GPTQ's codes unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from compiler_core.quantization.fixedpoint import round_half_away_float
from compiler_core.quantization.kernels.linear import weight_channel_scales
from compiler_core.quantization.params import code_range

logger = logging.getLogger(__name__)

BLOCK_SIZE = 128
"""Columns rounded together before the columns past them are updated (the paper's lazy batch update)."""
DAMPING = 0.01
"""Added to the Hessian's diagonal, as a fraction of its mean diagonal (keeps the inverse well-conditioned)."""
GRID_RETRIES = 3
"""Times a row whose largest code falls short of ``qmax`` is rounded again with a smaller scale."""


def gptq_round(weight: Any, hessian: Any, bits: int = 8, *, scale: Any = None, block_size: int = BLOCK_SIZE,
               damping: float = DAMPING, act_order: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ codes for a ``[out, in]`` weight given the Hessian ``[in, in]`` of its inputs.

    Args:
        weight: the float weight, one row per output channel.
        hessian: ``X Xᵀ`` (any positive multiple) of the layer's calibration inputs.
        bits: code width (symmetric codes in ``[-qmax, qmax]``).
        scale: per-row scales; default the compiler's own per-channel choice for ``weight``.
        block_size: columns per lazy-update block.
        damping: diagonal damping as a fraction of the mean diagonal.
        act_order: round the columns with the largest Hessian diagonal first.

    Returns:
        ``(codes, scale)``: integer codes (float64 array) and per-row scales; ``codes * scale[:, None]``
        is the rounded weight.
    """
    import torch

    rows = np.asarray(weight, dtype=np.float64)
    scale = weight_channel_scales(rows, bits) if scale is None else np.asarray(scale, dtype=np.float64)
    qmax = code_range(bits)[1]
    inverse, order = _inverse_hessian(torch.as_tensor(np.asarray(hessian, np.float64)), damping, act_order)
    columns = torch.from_numpy(rows[:, order].copy())
    step = torch.from_numpy(scale)[:, None]
    codes = _round_columns(columns, inverse, step, qmax, block_size)
    result = np.empty_like(rows)
    result[:, order] = codes.numpy()
    return result, scale


def _inverse_hessian(hessian, damping: float, act_order: bool):
    """Upper Cholesky factor of the damped inverse Hessian, in column order, and that order."""
    import torch

    hessian = hessian.clone()
    dead = torch.diag(hessian) == 0
    hessian[dead, dead] = 1.0  # an input that is always 0: its weights do not matter
    order = torch.argsort(torch.diag(hessian), descending=True) if act_order else torch.arange(hessian.shape[0])
    hessian = hessian[order][:, order]
    hessian += torch.eye(hessian.shape[0], dtype=hessian.dtype) * damping * torch.mean(torch.diag(hessian))
    lower = torch.linalg.cholesky(hessian)
    inverse = torch.cholesky_inverse(lower)
    return torch.linalg.cholesky(inverse, upper=True), order.numpy()


def _round_columns(columns, inverse, step, qmax: int, block_size: int):
    """Round ``columns`` left to right, pushing each column's error onto the later ones (in place)."""
    import torch

    codes = torch.zeros_like(columns)
    width = columns.shape[1]
    for start in range(0, width, block_size):
        end = min(start + block_size, width)
        block = columns[:, start:end].clone()
        errors = torch.zeros_like(block)
        local = inverse[start:end, start:end]
        for index in range(end - start):
            column = block[:, index:index + 1]
            code = torch.clamp(_round_half_away(column / step), -qmax, qmax)
            codes[:, start + index:start + index + 1] = code
            error = (column - code * step) / local[index, index]
            block[:, index:] -= error * local[index:index + 1, index:]
            errors[:, index:index + 1] = error
        columns[:, end:] -= errors @ inverse[start:end, end:]
    return codes


def _round_half_away(values):
    import torch

    return torch.sign(values) * torch.floor(torch.abs(values) + 0.5)


def gptq_on_grid(weight: Any, hessian: Any, bits: int = 8, **options: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """GPTQ codes whose dequantized rows the compiler's per-channel quantization maps back to the same codes.

    The compiler chooses each row's scale from the weights it is given (a clip of ``max |w|``); a row
    of GPTQ codes whose largest magnitude is below ``qmax`` would get a smaller scale and be rounded a
    second time. Such rows are rounded again (GPTQ on those rows only: rows are independent) with their
    scale shrunk by ``largest code / qmax``, up to :data:`GRID_RETRIES` times.

    Returns:
        ``(codes, scale, off_grid)``: ``off_grid`` counts the rows the compiler would still round again.
    """
    qmax = code_range(bits)[1]
    rows = np.asarray(weight, dtype=np.float64)
    codes, scale = gptq_round(rows, hessian, bits, **options)
    for _ in range(GRID_RETRIES):
        short = np.flatnonzero(np.abs(codes).max(axis=1) < qmax)  # the compiler's clip would shrink these rows
        if short.size == 0:
            break
        largest = np.maximum(np.abs(codes[short]).max(axis=1), 1.0)
        retry_scale = scale[short] * largest / qmax
        codes[short], scale[short] = gptq_round(rows[short], hessian, bits, scale=retry_scale, **options)
    off_grid = int(np.count_nonzero(_off_grid(codes, scale, bits)))
    return codes, scale, off_grid


def _off_grid(codes: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    """Rows the compiler's quantization of ``codes * scale`` would not map back to ``codes``."""
    dequantized = (codes * scale[:, None]).astype(np.float32).astype(np.float64)
    again = weight_channel_scales(dequantized, bits)
    qmax = code_range(bits)[1]
    recoded = np.clip(round_half_away_float(dequantized / again[:, None]), -qmax, qmax)
    return np.any(recoded != codes, axis=1)


# -- torch models ----------------------------------------------------------------------------------


def linear_hessians(model: Any, batches: Iterable[Any], skip_tokens: int = 0,
                    include: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """``X Xᵀ / n`` of every ``nn.Linear``'s input over ``batches`` of token ids (FP32 forward passes).

    Args:
        model: a torch module taking ``input_ids`` of shape ``[1, T]``.
        batches: token-id tensors ``[1, T]``.
        skip_tokens: leading positions of each batch left out (a prefix whose activations are never
            quantized).
        include: which Linear names to measure (default all).

    Returns:
        Linear name -> Hessian (float64 torch tensor).
    """
    import torch

    sums: dict[str, Any] = {}
    counts: dict[str, int] = {}
    shared: dict[str, str] = {}  # a Linear fed the same tensor as the one before it (q/k/v, gate/up)
    last: dict[str, Any] = {}
    handles = []

    def hook(name):
        def accumulate(_module, inputs, _output):
            tensor = inputs[0]
            if last.get("tensor") is tensor:
                shared[name] = last["name"]
                return
            last.update(tensor=tensor, name=name)
            x = tensor.detach().reshape(-1, tensor.shape[-1])[skip_tokens:].float()
            sums[name] = sums.get(name, 0) + (x.T @ x).double()
            counts[name] = counts.get(name, 0) + x.shape[0]
        return accumulate

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and (include is None or include(name)):
            handles.append(module.register_forward_hook(hook(name)))
    try:
        with torch.no_grad():
            for batch in batches:
                model(batch)
    finally:
        for handle in handles:
            handle.remove()
    hessians = {name: sums[name] / counts[name] for name in sums}
    return hessians | {name: hessians[source] for name, source in shared.items()}


def gptq_model(model: Any, token_windows: Sequence[Sequence[int]], *, bits: int = 8, prefix: Sequence[int] = (),
               act_order: bool = False) -> dict[str, Any]:
    """Round every ``nn.Linear`` of a causal LM in place with GPTQ, calibrated on ``token_windows``.

    The Hessians come from the FP32 model on ``prefix + window`` (the prefix positions left out). A
    tied LM head is untied first, so the embedding table keeps its float values.

    Returns:
        ``{"layers": n, "off_grid_rows": n, "tokens": n, "output_error": {...}}``: ``output_error`` is the
        mean over layers of the relative output error ``tr(E H Eᵀ) / tr(W H Wᵀ)`` for GPTQ and for RTN
        with the same scales.
    """
    import torch

    untie_lm_head(model)
    batches = [torch.tensor([[*prefix, *window]], dtype=torch.int64) for window in token_windows]
    hessians = linear_hessians(model, batches, skip_tokens=len(prefix))
    errors = {"gptq": [], "nearest": []}
    off_grid = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if name not in hessians:
                continue
            weight = module.weight.detach().double().numpy()
            codes, scale, short = gptq_on_grid(weight, hessians[name].numpy(), bits, act_order=act_order)
            off_grid += short
            rounded = codes * scale[:, None]
            qmax = code_range(bits)[1]
            nearest = np.clip(round_half_away_float(weight / scale[:, None]), -qmax, qmax) * scale[:, None]
            errors["gptq"].append(output_error(weight, rounded, hessians[name].numpy()))
            errors["nearest"].append(output_error(weight, nearest, hessians[name].numpy()))
            module.weight.copy_(torch.from_numpy(rounded).to(module.weight.dtype))
    summary = {"layers": len(hessians), "off_grid_rows": off_grid,
               "tokens": sum(len(w) for w in token_windows),
               "output_error": {kind: float(np.mean(values)) for kind, values in errors.items()}}
    logger.info("GPTQ rounded %d Linear layers (%d rows off the compiler's grid); relative output error %.2e "
                "(round-to-nearest %.2e)", summary["layers"], off_grid, summary["output_error"]["gptq"],
                summary["output_error"]["nearest"])
    return summary


def output_error(weight: np.ndarray, rounded: np.ndarray, hessian: np.ndarray) -> float:
    """Relative output error of a rounded weight on inputs with Hessian ``H``: ``tr(E H Eᵀ) / tr(W H Wᵀ)``."""
    hessian = np.asarray(hessian, np.float32)  # a diagnostic: float32 is plenty, and twice as fast

    def energy(rows: np.ndarray) -> float:
        rows = np.asarray(rows, np.float32)
        return float(np.sum((rows @ hessian) * rows, dtype=np.float64))

    return energy(weight - rounded) / energy(weight)


def untie_lm_head(model: Any) -> None:
    """Give a tied LM head its own copy of the embedding table (rounding the head keeps the table float)."""
    import torch

    head, embedding = model.lm_head, model.get_input_embeddings()
    if embedding is not None and head.weight is embedding.weight:
        head.weight = torch.nn.Parameter(embedding.weight.detach().clone())
        model.config.tie_word_embeddings = False


# -- convolutions of a compiled graph ---------------------------------------------------------------


def conv_hessians(float_graph: Any, samples: Iterable[Any], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Per group, ``X Xᵀ / n`` of every Conv's im2col input columns over ``samples`` (FP32 runs of ``float_graph``).

    Args:
        float_graph: the float graph the program is quantized from (after equalization / smoothing).
        samples: calibration input dicts (never held-out ones).
        names: the Conv nodes to measure (default every Conv with constant 2-D-or-more weights).

    Returns:
        Conv node name -> ``[groups, K, K]`` float64 (``K`` = input channels per group x kernel size, in the
        order of a ``[out, in / groups, *kernel]`` weight's flattened rows).
    """
    import onnxruntime as ort

    from compiler_core.calibration.statistics import session_with_outputs
    from compiler_core.quantization.graph import GraphView

    view = GraphView(float_graph)
    wanted = None if names is None else set(names)
    convs = [node for node in view.nodes if node.op_type == "Conv" and (wanted is None or node.name in wanted)
             and view.const(node.inputs[1]) is not None and len(view.shape(node.inputs[0])) >= 3]
    graph_inputs = {value.name for value in float_graph.graph.inputs}
    tensors = sorted({node.inputs[0].name for node in convs} - graph_inputs)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session, exposed = session_with_outputs(float_graph, tensors, options)
    feeds = {item.name for item in session.get_inputs()}
    sums: dict[str, np.ndarray] = {}
    rows = 0
    for sample in samples:
        values = dict(zip(exposed, session.run(exposed, {k: np.asarray(v) for k, v in sample.items() if k in feeds})))
        for node in convs:
            x = sample[node.inputs[0].name] if node.inputs[0].name in graph_inputs else values[node.inputs[0].name]
            hessian, count = _conv_hessian(np.asarray(x, np.float32), node, view.const(node.inputs[1]).shape)
            sums[node.name] = sums.get(node.name, 0.0) + hessian
        rows += 1
    return {name: total / rows for name, total in sums.items()}


def _conv_hessian(x: np.ndarray, node: Any, weight_shape: Sequence[int]) -> tuple[np.ndarray, int]:
    """``[groups, K, K]`` sum of the im2col columns' outer products for one input batch, averaged over positions."""
    columns = conv_columns(x, node, weight_shape)
    hessian = np.matmul(columns.transpose(0, 2, 1), columns).astype(np.float64) / columns.shape[1]
    return hessian, columns.shape[1]


def conv_columns(x: np.ndarray, node: Any, weight_shape: Sequence[int]) -> np.ndarray:
    """``[groups, N * positions, K]`` im2col columns of a Conv's input batch ``x`` (``K`` in the order of a
    ``[out, in / groups, *kernel]`` weight's flattened rows)."""
    from numpy.lib.stride_tricks import sliding_window_view

    from compiler_core.quantization.lowering import attr_int, attr_ints

    kernel = [int(k) for k in weight_shape[2:]]
    spatial = len(kernel)
    strides = attr_ints(node, "strides", [1] * spatial)
    dilations = attr_ints(node, "dilations", [1] * spatial)
    pads = attr_ints(node, "pads", [0] * (2 * spatial))
    groups = attr_int(node, "group", 1)
    padded = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + spatial]) for i in range(spatial)])
    window = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    patches = sliding_window_view(padded, window, axis=tuple(range(2, 2 + spatial)))
    patches = patches[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
                      + tuple(slice(None, None, d) for d in dilations)]  # [N, C, *out, *kernel]
    batch, channels = patches.shape[:2]
    positions = int(np.prod(patches.shape[2:2 + spatial]))
    per_group = channels // groups
    columns = np.moveaxis(patches.reshape(batch, groups, per_group, positions, -1), 3, 2)  # [N, G, P, cpg, k]
    return np.ascontiguousarray(columns.transpose(1, 0, 2, 3, 4)).reshape(groups, batch * positions, -1)


def gptq_conv_codes(weight: np.ndarray, hessians: np.ndarray, scale: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ codes of a ``[out, in / groups, *kernel]`` weight with per-group Hessians ``[groups, K, K]`` (of the
    inputs the weight reads) and the per-row scales ``scale``; returns codes shaped like ``weight``.

    Groups of at most :data:`BLOCK_SIZE` columns (depthwise and grouped convolutions) are rounded together, one
    batched column loop for all groups (the same arithmetic as :func:`gptq_round` with one block)."""
    groups = hessians.shape[0]
    rows = np.asarray(weight, np.float64).reshape(weight.shape[0], -1)
    per_group = rows.shape[0] // groups
    scale = np.asarray(scale, np.float64)
    if groups > 1 and rows.shape[1] <= BLOCK_SIZE:
        return _grouped_codes(rows, hessians, scale, bits, per_group).reshape(weight.shape)
    codes = np.empty_like(rows)
    for group in range(groups):
        part = slice(group * per_group, (group + 1) * per_group)
        codes[part], _ = gptq_round(rows[part], hessians[group], bits, scale=scale[part])
    return codes.reshape(weight.shape)


def _grouped_codes(rows: np.ndarray, hessians: np.ndarray, scale: np.ndarray, bits: int, per_group: int):
    """:func:`gptq_round` of every group at once (``rows`` ``[groups * per_group, K]``, ``K <= BLOCK_SIZE``)."""
    import torch

    groups, width = hessians.shape[0], rows.shape[1]
    hessian = torch.as_tensor(np.asarray(hessians, np.float64)).clone()
    diagonal = torch.diagonal(hessian, dim1=1, dim2=2)
    diagonal[diagonal == 0] = 1.0  # an input that is always 0: its weights do not matter (a view: in place)
    diagonal += DAMPING * diagonal.mean(dim=1, keepdim=True)
    inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hessian)), upper=True)
    columns = torch.from_numpy(rows.reshape(groups, per_group, width).copy())
    step = torch.from_numpy(scale.reshape(groups, per_group, 1))
    qmax = code_range(bits)[1]
    codes = torch.zeros_like(columns)
    for index in range(width):
        column = columns[:, :, index:index + 1]
        code = torch.clamp(_round_half_away(column / step), -qmax, qmax)
        codes[:, :, index:index + 1] = code
        error = (column - code * step) / inverse[:, index, index].reshape(groups, 1, 1)
        columns[:, :, index:] -= error * inverse[:, None, index, index:]
    return codes.numpy().reshape(rows.shape)
