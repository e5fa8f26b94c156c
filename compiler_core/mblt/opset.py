"""The MBLT operator set: the standard ONNX ops a canonical MBLT may contain.

A parsed model may use any ONNX op on the way in; canonicalization folds shape arithmetic and
constants away. What is left must be one of these ops, which the quantizer and the backends know.
Whether a given *device* runs an op is a separate question answered by ``compiler_core.targets``.
"""

from __future__ import annotations

MBLT_OPSET_VERSION = 21
MBLT_IR_VERSION = 10
MBLT_FORMAT_VERSION = "1"

_CONVOLUTION = {"Conv", "ConvTranspose"}
_POOLING = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool"}
_NORMALIZATION = {"BatchNormalization", "LayerNormalization", "GroupNormalization",
                  "InstanceNormalization", "LpNormalization", "MeanVarianceNormalization"}
_ACTIVATION = {"Relu", "LeakyRelu", "PRelu", "Gelu", "Sigmoid", "HardSigmoid", "HardSwish", "Mish", "Elu",
               "Selu", "Celu", "ThresholdedRelu", "Tanh", "Softplus", "Softsign", "Clip", "Shrink"}
_MATH = {"Exp", "Log", "Erf", "Sqrt", "Reciprocal", "Pow", "Neg", "Abs", "Sin", "Cos", "Floor", "Ceil",
         "Round", "Sign", "Add", "Sub", "Mul", "Div", "Max", "Min", "Mean", "Sum", "Mod"}
_LINEAR = {"MatMul", "Gemm", "Einsum"}
_SOFTMAX = {"Softmax", "LogSoftmax", "Hardmax"}
_SHAPE = {"Reshape", "Transpose", "Slice", "Concat", "Split", "Pad", "Gather", "GatherElements",
          "GatherND", "Expand", "Squeeze", "Unsqueeze", "Flatten", "Tile", "DepthToSpace", "SpaceToDepth",
          "ScatterElements", "ScatterND", "Trilu"}
_RESAMPLE = {"Resize", "GridSample"}
_REDUCE = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "CumSum"}
_SELECTION = {"TopK", "Where", "Equal", "Greater", "GreaterOrEqual", "Less",
              "LessOrEqual", "Not", "And", "Or", "Xor", "Cast", "IsNaN", "IsInf"}
_RECURRENT = {"LSTM", "GRU", "RNN"}
_INTERFACE = {"Identity"}  # only where a graph output is a graph input (or an output appears twice)

MBLT_OPS: frozenset[str] = frozenset(
    _CONVOLUTION | _POOLING | _NORMALIZATION | _ACTIVATION | _MATH | _LINEAR | _SOFTMAX | _SHAPE
    | _RESAMPLE | _REDUCE | _SELECTION | _RECURRENT | _INTERFACE
)
"""ONNX op types (default domain) allowed in a canonical MBLT.

Not claimed: NonMaxSuppression (its output shape depends on the data, and an MBLT is static; run
box selection after the model), control flow (If/Loop/Scan must fold away), sequences, and ops
newer than opset 21.
"""

FOLDED_OPS: frozenset[str] = frozenset({
    "Constant", "ConstantOfShape", "Shape", "Size", "Range", "Identity", "Dropout", "If", "Loop",
    "NonZero", "CastLike", "EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike",
    "RandomUniformLike", "Multinomial", "Bernoulli", "OneHot", "SequenceConstruct", "SplitToSequence",
    "SequenceAt", "ConcatFromSequence", "SequenceEmpty", "SequenceInsert", "SequenceLength",
})
"""Ops accepted on input only because canonicalization must fold or remove them."""


def is_mblt_op(domain: str, op_type: str) -> bool:
    """True if ``op_type`` in ``domain`` may appear in a canonical MBLT."""
    return domain in ("", "ai.onnx") and op_type in MBLT_OPS
