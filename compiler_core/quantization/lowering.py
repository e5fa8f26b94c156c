"""Lowering: frozen tensor parameters + MBLT groups -> the integer program."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir

from compiler_core.errors import UnsupportedOpsError
from compiler_core.ops import get_op
from compiler_core.quantization import kernels
from compiler_core.quantization.graph import GraphView, Group
from compiler_core.quantization.params import QuantParams, TensorQuant
from compiler_core.quantization.program import IntOp

logger = logging.getLogger(__name__)


@dataclass
class LoweringContext:
    """What a lowering function may read: the graph, tensor parameters, statistics, options.

    Attributes:
        view: the MBLT.
        tensors: frozen parameters of every quantized tensor.
        channel_means: per-channel float means of activations (for bias correction), by tensor.
        bias_correction: apply analytic bias correction to linear layers.
        weight_bits: per MBLT node name, the weight width (8, 4 or 16).
        hessians: per Conv node name, ``[groups, K, K]`` Hessians of its FP32 input columns: its weights are
            rounded by GPTQ (``bit.weightRounding: gptq``).
        weight_clip_search: search each weight channel's MSE-best clip (False: clip at ``max |w|``; the fit
            check's stand-in program, whose values do not matter).
    """

    view: GraphView
    tensors: dict[str, TensorQuant]
    channel_means: dict[str, np.ndarray] = field(default_factory=dict)
    bias_correction: bool = False
    weight_bits: dict[str, int] = field(default_factory=dict)
    hessians: dict[str, np.ndarray] = field(default_factory=dict)
    weight_clip_search: bool = True

    def params(self, value: ir.Value) -> QuantParams:
        """Frozen parameters of a quantized run-time tensor."""
        record = self.tensors.get(value.name)
        if record is None or record.params is None:
            raise KeyError(f"tensor {value.name} has no quantization parameters")
        return record.params

    def is_quantized(self, value: ir.Value | None) -> bool:
        """True for run-time float tensors with parameters."""
        return value is not None and value.name in self.tensors

    def const(self, value: ir.Value | None) -> np.ndarray | None:
        """Constant array behind ``value`` (``None`` for run-time tensors)."""
        return self.view.const(value)


def lower_groups(groups: list[Group], context: LoweringContext) -> list[IntOp]:
    """Lower every group; nodes without an integer kernel, or refused by one, are listed in one error.

    A refusal (:class:`~compiler_core.quantization.kernels.KernelRefusal`) is a limit of a kernel,
    not a bug: it becomes ``UNSUPPORTED_OPS`` naming the node and the reason. The support check
    flags the same nodes first (``tests/test_ops_registry.py`` holds the two together).
    """
    kernels.load_all()
    refused: dict[str, list[tuple[str, str]]] = {}
    ops = []
    for group in groups:
        try:
            ops.append(_lower_one(group, context))
        except kernels.KernelRefusal as refusal:
            refused.setdefault(group.main.op_type, []).append((group.main.name, str(refusal)))
    if refused:
        raise _refused_error(refused)
    return ops


def _is_exact(group: Group, context: LoweringContext) -> bool:
    """No float output: the group runs exactly on integer/bool values."""
    return not any(context.view.is_float(value) for value in group.outputs)


def _lower_one(group: Group, context: LoweringContext) -> IntOp:
    spec = kernels.spec_for(group.main.op_type)
    if spec is None:
        entry = get_op(group.main.op_type, group.main.domain)
        note = f": {entry.note}" if entry is not None and entry.note else ""
        raise kernels.KernelRefusal(f"no integer kernel for {group.main.op_type}{note}")
    if _is_exact(group, context):
        from compiler_core.quantization.kernels.movement import lower_exact

        op = lower_exact(group, context)
    else:
        op = spec.lower(group, context)
    op.nodes = [node.name for node in group.nodes]
    return op


def _refused_error(refused: dict[str, list[tuple[str, str]]]) -> UnsupportedOpsError:
    ops = []
    for op_type, entries in sorted(refused.items(), key=lambda item: -len(item[1])):
        reasons = list(dict.fromkeys(reason for _, reason in entries))
        ops.append({"op": op_type, "count": len(entries), "nodes": [name for name, _ in entries[:3]],
                    "reason": reasons[0] + (f" (and {len(reasons) - 1} other reason(s))" if len(reasons) > 1 else "")})
    listing = "; ".join(f"{o['op']} x{o['count']} ({', '.join(o['nodes'])}): {o['reason']}" for o in ops)
    return UnsupportedOpsError(f"The quantizer cannot build integer kernels for: {listing}.",
                               hint="Use cpu_offload for a head/tail, or change these layers in the source model.",
                               ops=ops, stage="quantize")


def attr_int(node: ir.Node, name: str, default: int) -> int:
    """Integer attribute with a default."""
    attribute = node.attributes.get(name)
    return int(attribute.as_int()) if attribute is not None else default


def attr_float(node: ir.Node, name: str, default: float) -> float:
    """Float attribute with a default."""
    attribute = node.attributes.get(name)
    return float(attribute.as_float()) if attribute is not None else default


def attr_ints(node: ir.Node, name: str, default: list[int] | None = None) -> list[int] | None:
    """Integer-list attribute with a default."""
    attribute = node.attributes.get(name)
    return [int(v) for v in attribute.as_ints()] if attribute is not None else default


def attr_str(node: ir.Node, name: str, default: str) -> str:
    """String attribute with a default."""
    attribute = node.attributes.get(name)
    return attribute.as_string() if attribute is not None else default


def clamp_codes(params: QuantParams, low: float, high: float) -> tuple[int, int]:
    """Output code bounds for a fused activation clamping to ``[low, high]`` (float).

    Raises:
        KernelRefusal: a finite bound on per-channel parameters (a uint8 image input's): one pair of code bounds
            cannot clamp them.
    """
    if np.isfinite(low) or np.isfinite(high):
        scalar(params)
    code_low = params.qmin if not np.isfinite(low) else int(params.quantize(np.float64(low)))
    code_high = params.qmax if not np.isfinite(high) else int(params.quantize(np.float64(high)))
    return max(code_low, params.qmin), min(code_high, params.qmax)


def scalar(params: QuantParams) -> tuple[float, int]:
    """``(scale, zero_point)`` of per-tensor parameters."""
    if params.axis is not None:
        raise kernels.KernelRefusal("per-channel (uint8 image) input parameters can only feed a convolution directly; "
                                     "turn off uint8Input (the uint8 model input) for this model")
    return float(params.scale), int(params.zero_point)


def describe_bits(*params: QuantParams | None, weight_bits: int | None = None) -> str:
    """Precision label like ``a8w8`` or ``a16``."""
    activation = max((p.bits for p in params if p is not None), default=8)
    return f"a{activation}" + (f"w{weight_bits}" if weight_bits else "")


def jsonable(values: dict[str, Any]) -> dict[str, Any]:
    """Make numpy scalars in ``values`` plain Python numbers."""
    return {key: (value.item() if isinstance(value, np.generic) else value) for key, value in values.items()}
