"""THE op registry: one :class:`OpDef` per ONNX op type, from which everything else derives.

An entry says everything the compiler knows about an op type:

* whether a canonical MBLT may contain it (``canonical``; ops that canonicalization always folds,
  fuses or unrolls are listed with ``canonical=False`` and the pass that removes them);
* where it runs on the virtual NPU (``unit``) and what it requires of a node (constraint checks
  from :mod:`compiler_core.ops.constraints`, constant inputs, batch axis, rank, element types,
  the multi-function unit);
* its integer lowering (``lowering``: a name in ``compiler_core.quantization.kernels.LOWERINGS``),
  or ``None`` when the NPU has no kernel for it — such an op can never be reported as supported;
* its cost class (``cost``) for the performance estimate.

The support check (``qbcompiler check``, the graph colours), the quantizer's lowering, the MBLT
op-set check of canonicalization, the cost model and ``docs/ops.md`` all read this table, so they
cannot disagree; ``tests/test_ops_registry.py`` walks it against every consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

import onnx_ir as ir

from compiler_core.ops import constraints as c

logger = logging.getLogger(__name__)

MAC = "MAC"
VEC = "VEC"
MFU = "MFU"
DMA = "DMA"
SHAPE = "SHAPE"
UNITS = (MAC, VEC, MFU, DMA, SHAPE)
"""NPU units: MAC array, vector unit, multi-function unit (look-up tables, int16 routines), DMA, metadata only."""

COST_CLASSES = ("mac", "vector", "lut", "dma", "free")
"""How the cost model prices an op: MAC work, vector elements, table look-ups, data movement, nothing."""

FLOAT_ONLY = frozenset({ir.DataType.FLOAT})
FLOAT_OR_BOOL = frozenset({ir.DataType.FLOAT, ir.DataType.BOOL})
BOOL_ONLY = frozenset({ir.DataType.BOOL})
MAX_RANK = 5


@dataclass(frozen=True)
class OpDef:
    """Everything the compiler knows about one ONNX op type (default domain).

    Attributes:
        op_type: The ONNX op type.
        family: Grouping for docs and the GUI legend (``linear``, ``elementwise``, ``lut``, ...).
        unit: The executing NPU unit, or None when the NPU cannot run the op at all.
        lowering: Name of the integer lowering in ``quantization.kernels.LOWERINGS``; None means
            no integer kernel (the op is reported unsupported and can only run on the CPU).
        cost: Cost class for the performance estimate (one of :data:`COST_CLASSES`).
        checks: Extra constraint checks; each returns None or a reason string.
        const_inputs: Input indices that must be compile-time constants when present.
        batch_axis: Axis of input 0 that is the batch (must be 1), or None.
        max_rank: Largest tensor rank among the node's inputs and outputs.
        dtypes: Element types allowed for non-constant inputs; None means float32 for compute units
            and float32/bool for ``DMA``/``SHAPE``.
        mfu_when: For ops not on the MFU, a predicate telling when a node still needs it.
        mfu_use: What the MFU does for this op, quoted in ``needs_mfu`` reasons.
        canonical: False for ops a canonical MBLT never contains (folded, fused or unrolled).
        note: Why the op has no kernel, or which canonicalization pass removes it.
    """

    op_type: str
    family: str
    unit: str | None
    lowering: str | None
    cost: str = "vector"
    checks: tuple[c.Check, ...] = ()
    const_inputs: tuple[int, ...] = ()
    batch_axis: int | None = None
    max_rank: int = MAX_RANK
    dtypes: frozenset[ir.DataType] | None = None
    mfu_when: Callable[[ir.Node], bool] | None = None
    mfu_use: str = ""
    canonical: bool = True
    note: str = ""

    @property
    def runs_on_npu(self) -> bool:
        """True if the NPU has an integer kernel for this op."""
        return self.unit is not None and self.lowering is not None

    def needs_mfu(self, node: ir.Node) -> bool:
        """True if ``node`` needs the multi-function unit."""
        return self.unit == MFU or (self.mfu_when is not None and self.mfu_when(node))

    @property
    def activation_dtypes(self) -> frozenset[ir.DataType]:
        """Element types accepted for non-constant inputs."""
        if self.dtypes is not None:
            return self.dtypes
        return FLOAT_OR_BOOL if self.unit in (DMA, SHAPE) else FLOAT_ONLY

    def violation(self, node: ir.Node) -> str | None:
        """The first constraint ``node`` violates, as a reason string, or None if it complies."""
        if not self.runs_on_npu:
            return f"no integer kernel for {self.op_type} on the NPU" + (f" ({self.note})" if self.note else "")
        generic = (
            c.no_empty_tensors(node),
            c.rank_at_most(node, self.max_rank),
            c.batch_of(node.inputs[0], self.batch_axis) if self.batch_axis is not None and node.inputs else None,
            c.constant_inputs(node, self.const_inputs),
            c.activation_dtypes(node, self.activation_dtypes),
        )
        reason = next((r for r in generic if r), None)
        return reason or next((r for r in (check(node) for check in self.checks) if r), None)


def get_op(op_type: str, domain: str = "") -> OpDef | None:
    """The entry for ``op_type`` in ``domain`` (None for unknown and custom-domain ops)."""
    if domain not in ("", "ai.onnx"):
        return None
    from compiler_core.ops.table import OPS

    return OPS.get(op_type)


def op_for(node: ir.Node) -> OpDef | None:
    """The entry for ``node``'s op type."""
    return get_op(node.op_type, node.domain)


def all_ops() -> Mapping[str, OpDef]:
    """Every registered op type -> its :class:`OpDef`, sorted by name."""
    from compiler_core.ops.table import OPS

    return {name: OPS[name] for name in sorted(OPS)}


@cache
def canonical_op_types() -> frozenset[str]:
    """Op types a canonical MBLT may contain (the MBLT operator set)."""
    return frozenset(name for name, op in all_ops().items() if op.canonical)


def supported_op_types() -> Mapping[str, str]:
    """Every op type the NPU runs, with its unit, sorted by name (for docs and ``presets``)."""
    return {name: op.unit for name, op in all_ops().items() if op.runs_on_npu}


__all__ = ["COST_CLASSES", "DMA", "MAC", "MFU", "SHAPE", "UNITS", "VEC", "OpDef", "all_ops",
           "canonical_op_types", "get_op", "op_for", "supported_op_types"]
