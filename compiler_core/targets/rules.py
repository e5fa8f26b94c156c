"""The op-support rule table: one :class:`OpRule` per ONNX op type the virtual NPU runs natively.

Adding an op is one entry in :data:`SUPPORT_RULES`. A rule names the NPU unit that executes the
op, the inputs that must be compile-time constants, the batch axis (for ops whose ONNX definition
has an N dimension), a rank limit, the activation element types, extra constraint checks from
:mod:`compiler_core.targets.constraints`, and whether the op needs the multi-function unit.

Units:

* ``MAC`` - convolution / matrix engine (Conv, MatMul, Gemm, Einsum, recurrent cells).
* ``VEC`` - vector unit: elementwise arithmetic, clamps, piecewise-linear activations, pooling,
  reductions, comparisons, selection, interpolation.
* ``MFU`` - multi-function unit: compile-time look-up tables (256 entries int8, 65,536 int16)
  and the int16 fixed-point softmax / normalisation routines (DESIGN.md section 7).
* ``DMA`` - data movement: transposes, slicing, concatenation, gathers, padding, tiling.
* ``SHAPE`` - metadata only on an NHWC buffer (Reshape, Squeeze, Identity, ...).

Which ops need the MFU, and why (``regulus-ra`` has none, so these become ``needs_mfu`` there):

=============================================  ===============================================
ops                                            reason
=============================================  ===============================================
Sigmoid, Tanh, Gelu, Erf, Exp, Log, Sqrt,      transcendental one-input functions: a LUT
Reciprocal, Sin, Cos, Softplus, Softsign,      over the int8/int16 input range
Mish, Elu, Selu, Celu, Swish
HardSigmoid, HardSwish                         piecewise linear, but the numerics contract
                                               evaluates them (like SiLU) through a LUT
Softmax, LogSoftmax                            exp LUT + int16 fixed-point normalisation
Layer/Group/Instance/RMS normalization,        int16 mean/variance routine with a
MeanVarianceNormalization, LRN                 reciprocal-square-root LUT
ReduceL2, ReduceLogSum, ReduceLogSumExp        sqrt / log / exp LUTs
Div (non-constant divisor)                     reciprocal LUT; a constant divisor is a multiply
Pow (exponent not a constant 1, 2 or 3)        power LUT; small integer exponents are multiplies
LpPool, GlobalLpPool (p != 1)                  power and root LUTs
LSTM, GRU, RNN (sigmoid/tanh gates)            gate activations; the matrix part is on MAC
=============================================  ===============================================

Everything else (ReLU family and Clip fuse as clamps; LeakyReLU/PReLU use two requantize
multipliers; comparisons, Where, pooling, TopK and NMS compare and select) runs without the MFU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import onnx_ir as ir

from compiler_core.targets import constraints as c

logger = logging.getLogger(__name__)

MAC = "MAC"
VEC = "VEC"
MFU = "MFU"
DMA = "DMA"
SHAPE = "SHAPE"
UNITS = (MAC, VEC, MFU, DMA, SHAPE)

FLOAT_ONLY = frozenset({ir.DataType.FLOAT})
FLOAT_OR_BOOL = frozenset({ir.DataType.FLOAT, ir.DataType.BOOL})
BOOL_ONLY = frozenset({ir.DataType.BOOL})
MAX_RANK = 5


@dataclass(frozen=True)
class OpRule:
    """How the virtual NPU runs one ONNX op type, and what it requires of a node.

    Attributes:
        unit: The executing unit: ``MAC``, ``VEC``, ``MFU``, ``DMA`` or ``SHAPE``.
        checks: Extra constraint checks; each returns None or a reason string.
        const_inputs: Input indices that must be compile-time constants when present.
        batch_axis: Axis of input 0 that is the batch (must be 1), or None if the op has no batch.
        max_rank: Largest tensor rank among the node's inputs and outputs.
        dtypes: Element types allowed for non-constant inputs; None means float32 for compute
            units and float32/bool for ``DMA``/``SHAPE``.
        mfu_when: For ops not on the MFU, a predicate telling when a node still needs it.
        mfu_use: What the MFU does for this op, quoted in ``needs_mfu`` reasons.
    """

    unit: str
    checks: tuple[c.Check, ...] = ()
    const_inputs: tuple[int, ...] = ()
    batch_axis: int | None = None
    max_rank: int = MAX_RANK
    dtypes: frozenset[ir.DataType] | None = None
    mfu_when: Callable[[ir.Node], bool] | None = None
    mfu_use: str = ""

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
        generic = (
            c.rank_at_most(node, self.max_rank),
            c.batch_of(node.inputs[0], self.batch_axis)
            if self.batch_axis is not None and node.inputs
            else None,
            c.constant_inputs(node, self.const_inputs),
            c.activation_dtypes(node, self.activation_dtypes),
        )
        reason = next((r for r in generic if r), None)
        return reason or next((r for r in (check(node) for check in self.checks) if r), None)


def _lut(use: str, **fields) -> OpRule:
    return OpRule(MFU, mfu_use=use, **fields)


_CONV = {"const_inputs": (1, 2), "batch_axis": 0}
_POOL = {"batch_axis": 0}
_NORM = {"const_inputs": (1, 2)}
_AXES = {"const_inputs": (1,)}
_SIGMOID_LUT = "a sigmoid look-up table"


def _recurrent(last_constant_input: int, mfu_use: str) -> OpRule:
    """LSTM/GRU/RNN: weights, biases and initial states are constants; the gates need the MFU."""
    return OpRule(MAC, (c.rnn_layout,), const_inputs=tuple(range(1, last_constant_input + 1)),
                  mfu_when=c.rnn_uses_lut, mfu_use=mfu_use)

SUPPORT_RULES: dict[str, OpRule] = {
    # Convolution and matrix engine.
    "Conv": OpRule(MAC, (c.conv_window,), **_CONV),
    "ConvTranspose": OpRule(MAC, (c.conv_window,), **_CONV),
    "MatMul": OpRule(MAC, max_rank=4),
    "Gemm": OpRule(MAC),
    "Einsum": OpRule(MAC, (c.einsum_equation,), max_rank=4),
    "LSTM": _recurrent(7, "its sigmoid/tanh gate look-up tables"),
    "GRU": _recurrent(5, "its sigmoid/tanh gate look-up tables"),
    "RNN": _recurrent(5, "its tanh/sigmoid look-up table"),
    # Pooling.
    "MaxPool": OpRule(VEC, (c.pool_window, c.no_pool_indices), **_POOL),
    "AveragePool": OpRule(VEC, (c.pool_window,), **_POOL),
    "LpPool": OpRule(
        VEC, (c.pool_window,), mfu_when=c.lp_needs_root, mfu_use="power and root tables", **_POOL
    ),
    "GlobalAveragePool": OpRule(VEC, (c.global_pool_rank,), **_POOL),
    "GlobalMaxPool": OpRule(VEC, (c.global_pool_rank,), **_POOL),
    "GlobalLpPool": OpRule(
        VEC, (c.global_pool_rank,), mfu_when=c.lp_needs_root, mfu_use="power and root tables", **_POOL
    ),
    # Normalisation.
    "BatchNormalization": OpRule(
        VEC,
        (c.int_attribute_is("training_mode", 0, 0, "training statistics are not computed"),),
        const_inputs=(1, 2, 3, 4),
        batch_axis=0,
    ),
    "LayerNormalization": _lut("its int16 normalisation routine", **_NORM),
    "GroupNormalization": _lut("its int16 normalisation routine", batch_axis=0, **_NORM),
    "InstanceNormalization": _lut("its int16 normalisation routine", batch_axis=0, **_NORM),
    "RMSNormalization": _lut("its int16 normalisation routine", const_inputs=(1,)),
    "MeanVarianceNormalization": _lut("its int16 normalisation routine"),
    "LRN": _lut("its power look-up table", batch_axis=0),
    # Clamps and piecewise-linear activations (vector unit).
    "Relu": OpRule(VEC),
    "LeakyRelu": OpRule(VEC),
    "PRelu": OpRule(VEC, const_inputs=(1,)),
    "ThresholdedRelu": OpRule(VEC),
    "Clip": OpRule(VEC, const_inputs=(1, 2)),
    # Look-up-table activations and transcendental functions (MFU).
    "Sigmoid": _lut(_SIGMOID_LUT),
    "HardSigmoid": _lut("a hard-sigmoid look-up table"),
    "HardSwish": _lut("a hard-swish look-up table"),
    "Swish": _lut(_SIGMOID_LUT),
    "Tanh": _lut("a tanh look-up table"),
    "Gelu": _lut("a GELU look-up table"),
    "Mish": _lut("a mish look-up table"),
    "Elu": _lut("an exp look-up table"),
    "Selu": _lut("an exp look-up table"),
    "Celu": _lut("an exp look-up table"),
    "Softplus": _lut("a softplus look-up table"),
    "Softsign": _lut("a reciprocal look-up table"),
    "Exp": _lut("an exp look-up table"),
    "Log": _lut("a log look-up table"),
    "Erf": _lut("an erf look-up table"),
    "Sqrt": _lut("a square-root look-up table"),
    "Reciprocal": _lut("a reciprocal look-up table"),
    "Sin": _lut("a sine look-up table"),
    "Cos": _lut("a cosine look-up table"),
    "Softmax": _lut("its exp table and int16 normalisation routine"),
    "LogSoftmax": _lut("its exp/log tables and int16 normalisation routine"),
    # Elementwise arithmetic (vector unit).
    "Add": OpRule(VEC),
    "Sub": OpRule(VEC),
    "Mul": OpRule(VEC),
    "Div": OpRule(
        VEC, mfu_when=c.divisor_is_dynamic, mfu_use="the reciprocal table of a non-constant divisor"
    ),
    "Pow": OpRule(
        VEC, mfu_when=c.exponent_needs_lut, mfu_use="a power look-up table (exponent not 1, 2 or 3)"
    ),
    "Neg": OpRule(VEC),
    "Abs": OpRule(VEC),
    "Sign": OpRule(VEC),
    "Floor": OpRule(VEC),
    "Ceil": OpRule(VEC),
    "Round": OpRule(VEC),
    "Max": OpRule(VEC),
    "Min": OpRule(VEC),
    "Mean": OpRule(VEC),
    "Sum": OpRule(VEC),
    "RotaryEmbedding": OpRule(VEC, const_inputs=(1, 2, 3)),
    # Comparison, logic and selection.
    "Equal": OpRule(VEC, dtypes=FLOAT_OR_BOOL),
    "Greater": OpRule(VEC),
    "GreaterOrEqual": OpRule(VEC),
    "Less": OpRule(VEC),
    "LessOrEqual": OpRule(VEC),
    "Not": OpRule(VEC, dtypes=BOOL_ONLY),
    "And": OpRule(VEC, dtypes=BOOL_ONLY),
    "Or": OpRule(VEC, dtypes=BOOL_ONLY),
    "Xor": OpRule(VEC, dtypes=BOOL_ONLY),
    "Where": OpRule(VEC, dtypes=FLOAT_OR_BOOL),
    # Integer codes are never NaN: on the NPU this is an all-false mask (exporters guard Softmax with it).
    "IsNaN": OpRule(VEC),
    "Cast": OpRule(VEC, (c.cast_target,), dtypes=FLOAT_OR_BOOL),
    # Reductions, arg-reductions, sorting and selection.
    "ReduceMean": OpRule(VEC, **_AXES),
    "ReduceMax": OpRule(VEC, **_AXES),
    "ReduceMin": OpRule(VEC, **_AXES),
    "ReduceSum": OpRule(VEC, **_AXES),
    "ReduceProd": OpRule(VEC, **_AXES),
    "ReduceL1": OpRule(VEC, **_AXES),
    "ReduceSumSquare": OpRule(VEC, **_AXES),
    "ReduceL2": _lut("a square-root look-up table", **_AXES),
    "ReduceLogSum": _lut("a log look-up table", **_AXES),
    "ReduceLogSumExp": _lut("exp and log look-up tables", **_AXES),
    "ArgMax": OpRule(VEC),
    "ArgMin": OpRule(VEC),
    "Hardmax": OpRule(VEC),
    "CumSum": OpRule(VEC, **_AXES),
    "TopK": OpRule(VEC, **_AXES),
    "NonMaxSuppression": OpRule(VEC, const_inputs=(2, 3, 4)),
    # Interpolation and sampling.
    "Resize": OpRule(
        VEC,
        (
            c.attribute_in("mode", ("nearest", "linear"), "nearest"),
            c.no_antialias,
            c.attribute_in(
                "coordinate_transformation_mode",
                ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"),
                "half_pixel",
            ),
            c.resize_axes,
        ),
        const_inputs=(1, 2, 3),
        batch_axis=0,
    ),
    "GridSample": OpRule(
        VEC,
        (c.attribute_in("mode", ("linear", "bilinear", "nearest"), "linear"), c.grid_sample_rank),
        batch_axis=0,
    ),
    # Data movement.
    "Transpose": OpRule(DMA),
    "Slice": OpRule(DMA, const_inputs=(1, 2, 3, 4)),
    "Concat": OpRule(DMA),
    "Split": OpRule(DMA, **_AXES),
    "Pad": OpRule(
        DMA, (c.attribute_in("mode", ("constant", "reflect", "edge"), "constant"),), const_inputs=(1, 2, 3)
    ),
    "Gather": OpRule(DMA, (c.table_lookup_indices,)),
    "GatherElements": OpRule(DMA, **_AXES),
    "GatherND": OpRule(DMA, **_AXES),
    "Expand": OpRule(DMA, **_AXES),
    "Tile": OpRule(DMA, **_AXES),
    "DepthToSpace": OpRule(DMA, batch_axis=0),
    "SpaceToDepth": OpRule(DMA, batch_axis=0),
    # Metadata only.
    "Reshape": OpRule(SHAPE, **_AXES),
    "Flatten": OpRule(SHAPE),
    "Squeeze": OpRule(SHAPE, **_AXES),
    "Unsqueeze": OpRule(SHAPE, **_AXES),
    "Identity": OpRule(SHAPE),
    "Dropout": OpRule(SHAPE, const_inputs=(1, 2)),
    "Constant": OpRule(SHAPE),
}
"""The registry: ONNX op type (default domain) -> :class:`OpRule`."""


def get_rule(node: ir.Node) -> OpRule | None:
    """The rule for ``node``, or None if the NPU has no implementation (unknown or custom-domain op)."""
    if node.domain not in ("", "ai.onnx"):
        return None
    return SUPPORT_RULES.get(node.op_type)


def supported_op_types() -> Mapping[str, str]:
    """Every natively supported op type with its unit, sorted by name (for docs and ``presets``)."""
    return {op_type: SUPPORT_RULES[op_type].unit for op_type in sorted(SUPPORT_RULES)}
