"""The op table: one :class:`~compiler_core.ops.OpDef` per ONNX op type, by family.

Units and the multi-function unit (``regulus-ra`` has none, so MFU ops are ``needs_mfu`` there):

=============================================  ===============================================
ops                                            why they need the MFU
=============================================  ===============================================
Sigmoid, Tanh, Gelu, Erf, Exp, Log, Sqrt,      transcendental one-input functions: a LUT
Reciprocal, Sin, Cos, Softplus, Softsign,      over the int8/int16 input range
Mish, Elu, Selu, Celu
HardSigmoid, HardSwish                         piecewise linear, but evaluated (like SiLU)
                                               through a LUT
Softmax                                        exp LUT + int16 fixed-point normalisation
Layer/Group/Instance normalization             int16 mean/variance routine with a square root
ReduceL2                                       a square root of the sum of squares
Div (non-constant divisor)                     reciprocal LUT; a constant divisor is a multiply
Pow (exponent not a constant 1, 2 or 3)        power LUT; small integer exponents are multiplies
=============================================  ===============================================

ReLU and Clip fuse as clamps; LeakyReLU/PReLU, Max/Min, comparisons and pooling compare and select
on the vector unit. Ops with ``lowering=None`` have no integer kernel: the support check reports
them unsupported with their ``note``, and ``cpu_offload`` can run them on the CPU at the head or
tail of the graph.
"""

from __future__ import annotations

from compiler_core.ops import BOOL_ONLY, DMA, FLOAT_OR_BOOL, MAC, MFU, SHAPE, VEC, OpDef
from compiler_core.ops import constraints as c

_CONV = {"const_inputs": (1, 2), "batch_axis": 0}
_AXES = {"const_inputs": (1,)}
_FOLDED = "canonicalization folds it into constants or removes it"


def _table(*entries: OpDef) -> dict[str, OpDef]:
    table = {}
    for entry in entries:
        assert entry.op_type not in table, f"{entry.op_type} registered twice"
        table[entry.op_type] = entry
    return table


def _linear(op_type: str, *checks, **fields) -> OpDef:
    return OpDef(op_type, "linear", MAC, "linear", "mac", checks=checks, **fields)


def _lut(op_type: str, use: str, unit: str = MFU) -> OpDef:
    return OpDef(op_type, "lut", unit, "lut", "lut", checks=(c.scalar_constant_operands,), mfu_use=use)


def _exact(op_type: str, dtypes=None) -> OpDef:
    """Compare/logic/index ops: bool or integer outputs computed exactly from their inputs."""
    return OpDef(op_type, "selection", VEC, "exact", "vector", checks=(c.outputs_not_float,), dtypes=dtypes)


def _move(op_type: str, unit: str = DMA, **fields) -> OpDef:
    return OpDef(op_type, "movement", unit, "move", "free" if unit == SHAPE else "dma", **fields)


def _no_kernel(op_type: str, family: str, note: str, unit: str | None = None, **fields) -> OpDef:
    return OpDef(op_type, family, unit, None, "vector", note=note, **fields)


def _removed(op_type: str, family: str, note: str = _FOLDED) -> OpDef:
    return OpDef(op_type, family, None, None, "free", canonical=False, note=note)


_SIGMOID = "a sigmoid look-up table"
_EXP = "an exp look-up table"

OPS: dict[str, OpDef] = _table(
    # -- linear (MAC array) -------------------------------------------------------------------
    _linear("Conv", c.conv_window, **_CONV),
    _linear("ConvTranspose", c.conv_window, **_CONV),
    _linear("MatMul", c.matrix_operands, max_rank=4),
    _linear("Gemm", c.gemm_plain_a, const_inputs=(1, 2)),
    _no_kernel("Einsum", "linear", "canonicalization turns matrix-product equations into MatMul; this one "
               "sums an index within one operand, broadcasts, or has one operand"),
    # -- recurrent: canonicalization unrolls what it can into MatMul and gate steps ------------
    _no_kernel("LSTM", "recurrent", "canonicalization unrolls LSTMs with default activations and a static "
               "sequence length; this one was kept"),
    _no_kernel("GRU", "recurrent", "canonicalization unrolls GRUs with default activations and a static "
               "sequence length; this one was kept"),
    _no_kernel("RNN", "recurrent", "canonicalization unrolls RNNs with the default tanh and a static "
               "sequence length; this one was kept"),
    # -- pooling ------------------------------------------------------------------------------
    _move("MaxPool", VEC, checks=(c.pool_window, c.no_pool_indices), batch_axis=0),
    OpDef("AveragePool", "pooling", VEC, "average_pool", checks=(c.average_window, c.pool_floor_mode, c.explicit_pool_pads),
          batch_axis=0),
    OpDef("GlobalAveragePool", "pooling", VEC, "reduce_sum", checks=(c.global_pool_rank,), batch_axis=0),
    _move("GlobalMaxPool", VEC, checks=(c.global_pool_rank,), batch_axis=0),
    _no_kernel("LpPool", "pooling", "p-norm pooling has no integer kernel"),
    _no_kernel("GlobalLpPool", "pooling", "p-norm pooling has no integer kernel"),
    # -- normalization ------------------------------------------------------------------------
    _removed("BatchNormalization", "normalization",
             "canonicalization folds it into the producing convolution or writes it as Mul/Add"),
    OpDef("LayerNormalization", "normalization", MFU, "layernorm", checks=(c.only_first_output_used,),
          const_inputs=(1, 2),
          mfu_use="its int16 normalisation routine"),
    OpDef("InstanceNormalization", "normalization", MFU, "groupnorm", const_inputs=(1, 2), batch_axis=0,
          mfu_use="its int16 normalisation routine"),
    OpDef("GroupNormalization", "normalization", MFU, "groupnorm", const_inputs=(1, 2), batch_axis=0,
          mfu_use="its int16 normalisation routine"),
    _no_kernel("MeanVarianceNormalization", "normalization", "no integer kernel; write it as LayerNormalization"),
    _no_kernel("LpNormalization", "normalization", "no integer kernel; write it as x / ReduceL2(x)"),
    _no_kernel("LRN", "normalization", "canonicalization writes LRN as x * Pow(channel-window Conv(x * x), -beta); "
               "one whose channel count is unknown has no integer kernel"),
    # -- clamps and piecewise-linear activations ----------------------------------------------
    OpDef("Relu", "activation", VEC, "clamp"),
    OpDef("Clip", "activation", VEC, "clamp", const_inputs=(1, 2)),
    _lut("LeakyRelu", "", VEC),
    _lut("ThresholdedRelu", "", VEC),
    OpDef("PRelu", "activation", VEC, "prelu", const_inputs=(1,)),
    # -- look-up-table functions (MFU) --------------------------------------------------------
    _lut("Sigmoid", _SIGMOID),
    _lut("HardSigmoid", "a hard-sigmoid look-up table"),
    _lut("HardSwish", "a hard-swish look-up table"),
    _lut("Tanh", "a tanh look-up table"),
    _lut("Gelu", "a GELU look-up table"),
    _lut("Mish", "a mish look-up table"),
    _lut("Elu", _EXP),
    _lut("Selu", _EXP),
    _lut("Celu", _EXP),
    _lut("Softplus", "a softplus look-up table"),
    _lut("Softsign", "a reciprocal look-up table"),
    _lut("Exp", _EXP),
    _lut("Log", "a log look-up table"),
    _lut("Erf", "an erf look-up table"),
    _lut("Sqrt", "a square-root look-up table"),
    _lut("Reciprocal", "a reciprocal look-up table"),
    _lut("Sin", "a sine look-up table"),
    _lut("Cos", "a cosine look-up table"),
    _lut("Shrink", "", VEC),
    _lut("Neg", "", VEC),
    _lut("Abs", "", VEC),
    _lut("Sign", "", VEC),
    _lut("Floor", "", VEC),
    _lut("Ceil", "", VEC),
    _lut("Round", "", VEC),
    OpDef("Pow", "lut", VEC, "lut", "lut", checks=(c.scalar_constant_operands,), mfu_when=c.exponent_needs_lut,
          mfu_use="a power look-up table (exponent not 1, 2 or 3)"),
    OpDef("Softmax", "softmax", MFU, "softmax", mfu_use="its exp table and int16 normalisation routine"),
    _no_kernel("LogSoftmax", "softmax", "canonicalization writes LogSoftmax as x - max - log(sum(exp)); one whose "
               "input rank is unknown has no integer kernel"),
    _no_kernel("Hardmax", "softmax", "a one-hot float output has no integer kernel"),
    # -- element-wise arithmetic --------------------------------------------------------------
    OpDef("Add", "elementwise", VEC, "add"),
    OpDef("Sub", "elementwise", VEC, "add"),
    OpDef("Mul", "elementwise", VEC, "scale"),
    OpDef("Div", "elementwise", VEC, "scale", mfu_when=c.divisor_is_dynamic,
          mfu_use="the reciprocal table of a non-constant divisor"),
    OpDef("Max", "elementwise", VEC, "extremum", checks=(c.float_data_input,)),
    OpDef("Min", "elementwise", VEC, "extremum", checks=(c.float_data_input,)),
    OpDef("Sum", "elementwise", VEC, "sum", checks=(c.float_data_input,)),
    OpDef("Mean", "elementwise", VEC, "sum", checks=(c.float_data_input,)),
    _no_kernel("Mod", "elementwise", "no integer kernel for a remainder"),
    # -- comparison, logic and selection ------------------------------------------------------
    _exact("Equal", FLOAT_OR_BOOL),
    _exact("Greater"),
    _exact("GreaterOrEqual"),
    _exact("Less"),
    _exact("LessOrEqual"),
    _exact("Not", BOOL_ONLY),
    _exact("And", BOOL_ONLY),
    _exact("Or", BOOL_ONLY),
    _exact("Xor", BOOL_ONLY),
    _exact("IsNaN"),  # integer codes are never NaN: an all-false mask (exporters guard Softmax with it)
    _exact("IsInf"),
    _exact("ArgMax"),
    _exact("ArgMin"),
    OpDef("Where", "selection", VEC, "select", dtypes=FLOAT_OR_BOOL),
    OpDef("Cast", "selection", VEC, "quantize", checks=(c.cast_target,), dtypes=FLOAT_OR_BOOL),
    _no_kernel("TopK", "selection", "sorting has no integer kernel; run it after the model"),
    # -- reductions ---------------------------------------------------------------------------
    OpDef("ReduceMean", "reduction", VEC, "reduce_sum", **_AXES),
    OpDef("ReduceSum", "reduction", VEC, "reduce_sum", **_AXES),
    _move("ReduceMax", VEC, **_AXES),
    _move("ReduceMin", VEC, **_AXES),
    OpDef("ReduceL2", "reduction", MFU, "reduce_l2", mfu_use="a square root of the sum of squares", **_AXES),
    _no_kernel("ReduceL1", "reduction", "no integer kernel"),
    _no_kernel("ReduceProd", "reduction", "no integer kernel for a product of many activations"),
    _no_kernel("ReduceSumSquare", "reduction", "no integer kernel"),
    _no_kernel("ReduceLogSum", "reduction", "no integer kernel"),
    _no_kernel("ReduceLogSumExp", "reduction", "no integer kernel"),
    OpDef("CumSum", "reduction", VEC, "cumsum", **_AXES),
    # -- interpolation and sampling -----------------------------------------------------------
    OpDef("Resize", "resample", VEC, "interpolate", checks=(
        c.attribute_in("mode", ("nearest", "linear", "cubic"), "nearest"),
        c.no_antialias,
        c.attribute_in("coordinate_transformation_mode",
                       ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"),
                       "half_pixel"),
        c.resize_axes), const_inputs=(1, 2, 3), batch_axis=0),
    _no_kernel("GridSample", "resample", "data-dependent sampling has no integer kernel"),
    # -- data movement ------------------------------------------------------------------------
    _move("Transpose"),
    _move("Slice", const_inputs=(1, 2, 3, 4)),
    OpDef("Concat", "movement", DMA, "concat", "dma"),
    _move("Split", **_AXES),
    _move("Pad", checks=(c.attribute_in("mode", ("constant", "reflect", "edge"), "constant"),),
          const_inputs=(1, 2, 3)),
    OpDef("Gather", "movement", DMA, "gather_table", "dma", checks=(c.table_lookup_indices,)),
    _move("GatherElements", **_AXES),
    _move("GatherND", **_AXES),
    _move("Expand", **_AXES),
    _move("Tile", **_AXES),
    _move("DepthToSpace", batch_axis=0),
    _move("SpaceToDepth", batch_axis=0),
    _no_kernel("ScatterElements", "movement", "no integer kernel for scattering"),
    _no_kernel("ScatterND", "movement", "no integer kernel for scattering"),
    _no_kernel("Trilu", "movement", "no integer kernel; use a constant mask"),
    # -- metadata only ------------------------------------------------------------------------
    _move("Reshape", SHAPE, **_AXES),
    _move("Flatten", SHAPE),
    _move("Squeeze", SHAPE, **_AXES),
    _move("Unsqueeze", SHAPE, **_AXES),
    _move("Identity", SHAPE),  # only where a graph output is a graph input (or an output appears twice)
    _removed("Dropout", "movement"),
    _removed("Constant", "movement"),
)
"""The registry: ONNX op type (default domain) -> :class:`OpDef`."""
