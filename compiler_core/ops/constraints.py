"""Constraint checks for op-support rules: each takes an ``ir.Node`` and returns None or a reason.

A reason is one short sentence a user can act on ("kernel 33x33 exceeds the NPU limit of 32 per
dimension"); the support report shows it next to the node. The numeric limits of the virtual NPU
are module constants so the docs and the backend can quote them:

=================  =====================================================================
limit              value and why
=================  =====================================================================
kernel             1..32 per spatial dimension: covers 31x31 large-kernel nets and the
                   32x32 patch embedding of ViT-B/32 within the line buffer.
stride             1..8, or any stride equal to the kernel (non-overlapping patchify,
                   ViT/Swin/ConvNeXt stems) up to the kernel limit.
dilation           1..64 (DeepLab ASPP rates up to 36 fit).
spatial rank       1-D and 2-D convolution and average pooling; max pooling also 3-D.
=================  =====================================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import onnx.defs
import onnx_ir as ir

logger = logging.getLogger(__name__)

Check = Callable[[ir.Node], "str | None"]

MAX_KERNEL = 32
MAX_STRIDE = 8
MAX_DILATION = 64
SPATIAL_RANKS = (1, 2, 3)
CONV_SPATIAL_RANKS = (1, 2)  # the integer convolution kernel (and AveragePool, which uses it)
RNN_ACTIVATIONS = ("Sigmoid", "Tanh", "Relu")
_RNN_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_LUT_ACTIVATIONS = frozenset({"Sigmoid", "Tanh"})


# -- value helpers ------------------------------------------------------------------------------


def is_constant(value: ir.Value | None) -> bool:
    """True if ``value`` is known at compile time (initializer or ``Constant`` output)."""
    if value is None:
        return False
    producer = value.producer()
    return value.const_value is not None or (producer is not None and producer.op_type == "Constant")


def dims(value: ir.Value | None) -> tuple[int | ir.SymbolicDim, ...] | None:
    """The dimensions of ``value``, or None if its shape is unknown."""
    if value is None or value.shape is None:
        return None
    return tuple(value.shape.dims)


def is_used(value: ir.Value | None) -> bool:
    """True if ``value`` feeds another node or is a graph output."""
    return value is not None and (bool(value.uses()) or value.is_graph_output())


def input_role(node: ir.Node, index: int) -> str:
    """The ONNX schema name of input ``index`` of ``node`` (e.g. ``"scales"``), else ``"#index"``."""
    try:
        schema = onnx.defs.get_schema(node.op_type, 100, node.domain or "")
    except onnx.defs.SchemaError:
        return f"#{index}"
    formal = schema.inputs[min(index, len(schema.inputs) - 1)] if schema.inputs else None
    return formal.name if formal is not None else f"#{index}"


def _ints(node: ir.Node, name: str, default: Sequence[int]) -> list[int]:
    return list(node.attributes.get_ints(name, default))


def _string(node: ir.Node, name: str, default: str) -> str:
    return node.attributes.get_string(name, default)


def _fmt(values: Sequence[int]) -> str:
    return "x".join(str(v) for v in values)


# -- generic checks (driven by the fields of a rule) --------------------------------------------


BATCH_REASON = "batch "
"""How every batch verdict starts (the refusal's hint reads it)."""


def batch_of(value: ir.Value | None, axis: int) -> str | None:
    """Check that dimension ``axis`` (the batch) of ``value`` is 1."""
    shape = dims(value)
    if shape is None or len(shape) <= axis:
        return None
    batch = shape[axis]
    if isinstance(batch, int):
        return None if batch == 1 else f"{BATCH_REASON}{batch} not supported; NPU runs batch 1"
    return f"{BATCH_REASON}dimension {batch} is dynamic; NPU runs batch 1 (pin it with input_shape_dict)"


def rank_at_most(node: ir.Node, max_rank: int) -> str | None:
    """Check that no input or output of ``node`` has more than ``max_rank`` dimensions."""
    for value in (*node.inputs, *node.outputs):
        shape = dims(value)
        if shape is not None and len(shape) > max_rank:
            return f"rank-{len(shape)} tensor '{value.name}' exceeds the NPU limit of rank {max_rank}"
    return None


def constant_inputs(node: ir.Node, indices: Sequence[int]) -> str | None:
    """Check that the inputs at ``indices`` (when present) are compile-time constants."""
    for index in indices:
        value = node.inputs[index] if index < len(node.inputs) else None
        if value is not None and not is_constant(value):
            role = input_role(node, index)
            return f"{node.op_type} input '{role}' must be a constant; the NPU needs it at compile time"
    return None


_INPUT_CONVERSIONS = frozenset({"Cast", "Gather"})  # integer model inputs: converted or used as lookup indices


def table_lookup_indices(node: ir.Node) -> str | None:
    """Gather indices must be constants, unless this is a table lookup (embedding).

    A lookup reads rows of a constant table with integer indices that are model inputs (token ids);
    the DMA unit gathers the rows at run time.
    """
    data, indices = node.inputs[0], node.inputs[1]
    if is_constant(indices) or (is_constant(data) and indices.is_graph_input()):
        return None
    return (f"{node.op_type} indices must be constants, or model inputs indexing a constant table "
            "(embedding lookup); computed indices need the CPU")


def activation_dtypes(node: ir.Node, allowed: frozenset[ir.DataType]) -> str | None:
    """Check that every non-constant input has one of the ``allowed`` element types."""
    for value in node.inputs:
        if value is None or is_constant(value) or value.dtype is None or value.dtype in allowed:
            continue
        if value.is_graph_input() and node.op_type in _INPUT_CONVERSIONS and value.dtype in _INPUT_INDEX_TYPES:
            continue  # integer model inputs (token ids, masks) are converted as they arrive
        names = "/".join(sorted(dtype.name.lower() for dtype in allowed))
        return (
            f"input '{value.name}' is {value.dtype.name.lower()} computed at run time; the NPU takes "
            f"{names} activations (integer index/shape tensors must be constants)"
        )
    return None


_INPUT_INDEX_TYPES = frozenset({ir.DataType.BOOL, ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32,
                                ir.DataType.INT64, ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32,
                                ir.DataType.UINT64})


def _is_float_type(dtype: ir.DataType | None) -> bool:
    return dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16)


def no_empty_tensors(node: ir.Node) -> str | None:
    """Every input and output has at least one element (zero-size tensors have no NPU buffer)."""
    for value in (*node.inputs, *node.outputs):
        shape = dims(value)
        if is_constant(value):
            continue  # an empty constant operand (e.g. "no axes") is fine
        if shape is not None and any(isinstance(d, int) and d == 0 for d in shape):
            return f"tensor '{value.name}' has no elements (shape {_fmt(shape)}); zero-size tensors are not supported"
    return None


# -- windows: convolution and pooling -----------------------------------------------------------


def _window_limits(kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]) -> str | None:
    if any(k < 1 or k > MAX_KERNEL for k in kernel):
        return f"kernel {_fmt(kernel)} exceeds the NPU limit of {MAX_KERNEL} per dimension"
    if any(s < 1 or (s > MAX_STRIDE and s != k) for s, k in zip(strides, kernel)):
        return f"stride {_fmt(strides)} exceeds the limit of {MAX_STRIDE} (larger only when stride == kernel)"
    if any(d < 1 or d > MAX_DILATION for d in dilations):
        return f"dilation {_fmt(dilations)} exceeds the NPU limit of {MAX_DILATION}"
    return None


def _window(node: ir.Node, kernel: Sequence[int] | None, ranks: Sequence[int] = SPATIAL_RANKS) -> str | None:
    if not kernel:
        return None
    spatial = len(kernel)
    if spatial not in ranks:
        listed = ", ".join(f"{r}-D" for r in ranks)
        return f"{spatial}-D {node.op_type} not supported ({listed} only)"
    strides = _ints(node, "strides", [1] * spatial)
    return _window_limits(kernel, strides, _ints(node, "dilations", [1] * spatial))


def _weight_kernel(node: ir.Node) -> list[int] | None:
    kernel = _ints(node, "kernel_shape", [])
    weight = dims(node.inputs[1]) if len(node.inputs) > 1 else None
    if not kernel and weight is not None and all(isinstance(d, int) for d in weight[2:]):
        kernel = list(weight[2:])
    return kernel or None


def conv_window(node: ir.Node) -> str | None:
    """Conv / ConvTranspose: 1-2 spatial dims within the kernel, stride and dilation limits."""
    return _window(node, _weight_kernel(node), CONV_SPATIAL_RANKS)


def pool_window(node: ir.Node) -> str | None:
    """MaxPool / LpPool: 1-3 spatial dims within the window limits."""
    return _window(node, _ints(node, "kernel_shape", []))


def average_window(node: ir.Node) -> str | None:
    """AveragePool: 1-2 spatial dims (its window sums use the convolution kernel)."""
    return _window(node, _ints(node, "kernel_shape", []), CONV_SPATIAL_RANKS)


def global_pool_rank(node: ir.Node) -> str | None:
    """Global pools: 1-3 spatial dims."""
    shape = dims(node.inputs[0])
    if shape is None or len(shape) - 2 in SPATIAL_RANKS:
        return None
    return f"{len(shape) - 2}-D {node.op_type} not supported (1-D, 2-D and 3-D only)"


def no_pool_indices(node: ir.Node) -> str | None:
    """MaxPool: the optional ``Indices`` output cannot be produced."""
    if len(node.outputs) > 1 and is_used(node.outputs[1]):
        return "MaxPool Indices output not supported (argmax positions are not tracked on the NPU)"
    return None


# -- attribute choices --------------------------------------------------------------------------


def attribute_in(name: str, allowed: Sequence[str], default: str) -> Check:
    """Make a check that string attribute ``name`` takes one of ``allowed`` values."""

    def check(node: ir.Node) -> str | None:
        value = _string(node, name, default)
        if value in allowed:
            return None
        return f"{node.op_type} {name} '{value}' not supported; use {' or '.join(repr(a) for a in allowed)}"

    return check


def int_attribute_is(name: str, expected: int, default: int, why: str) -> Check:
    """Make a check that integer attribute ``name`` equals ``expected``."""

    def check(node: ir.Node) -> str | None:
        value = node.attributes.get_int(name, default)
        return None if value == expected else f"{node.op_type} {name}={value} not supported: {why}"

    return check


def cast_target(node: ir.Node) -> str | None:
    """Cast: only to float32 or bool (NPU tensors are int8/int16 inside, float32 at the boundary)."""
    target = ir.DataType(node.attributes.get_int("to", ir.DataType.FLOAT))
    if target in (ir.DataType.FLOAT, ir.DataType.BOOL):
        return None
    return f"Cast to {target.name.lower()} not supported; the NPU computes float32 tensors as int8/int16"


# -- shape-dependent ops ------------------------------------------------------------------------


def resize_axes(node: ir.Node) -> str | None:
    """Resize: 1-D or 2-D spatial scaling of an N-C-spatial tensor; N and C unchanged."""
    source, target = dims(node.inputs[0]), dims(node.outputs[0])
    if source is None or target is None:
        return None
    if len(source) not in (3, 4):
        return f"rank-{len(source)} Resize not supported; only 1-D and 2-D spatial (N, C, [H,] W) resizing"
    if source[:2] != target[:2]:
        return f"Resize may only scale the spatial axes; N, C change from {_fmt(source[:2])} to {_fmt(target[:2])}"
    return None


def no_antialias(node: ir.Node) -> str | None:
    """Resize: antialiased downsampling is not implemented."""
    return "Resize antialias=1 not supported" if node.attributes.get_int("antialias", 0) else None


def grid_sample_rank(node: ir.Node) -> str | None:
    """GridSample: 2-D sampling (rank-4 input) only."""
    shape = dims(node.inputs[0])
    if shape is None or len(shape) == 4:
        return None
    return f"rank-{len(shape)} GridSample not supported; only 2-D (N, C, H, W) sampling"


def einsum_equation(node: ir.Node) -> str | None:
    """Einsum: one or two operands without repeated indices (no diagonals or traces)."""
    equation = _string(node, "equation", "").replace(" ", "")
    operands = equation.split("->")[0].split(",")
    if len(operands) > 2:
        return f"Einsum '{equation}' with {len(operands)} operands not supported; split it into pairs"
    for term in operands:
        letters = term.replace("...", "")
        if len(set(letters)) != len(letters):
            return f"Einsum '{equation}' repeats an index in one operand (diagonal/trace); not supported"
    return None


# -- recurrent ops ------------------------------------------------------------------------------


def _rnn_activations(node: ir.Node) -> list[str]:
    return list(node.attributes.get_strings("activations", _RNN_DEFAULT_ACTIVATIONS.get(node.op_type, ())))


def rnn_layout(node: ir.Node) -> str | None:
    """LSTM / GRU / RNN: batch 1 (axis 1, or 0 with ``layout=1``) and supported gate activations."""
    batch_axis = 0 if node.attributes.get_int("layout", 0) else 1
    reason = batch_of(node.inputs[0], batch_axis)
    if reason:
        return reason
    unsupported = [name for name in _rnn_activations(node) if name not in RNN_ACTIVATIONS]
    if unsupported:
        return (
            f"{node.op_type} gate activation {unsupported[0]} not supported; use {', '.join(RNN_ACTIVATIONS)}"
        )
    return None


def rnn_uses_lut(node: ir.Node) -> bool:
    """True if a recurrent op has sigmoid/tanh gates (evaluated by MFU look-up tables)."""
    return any(name in _LUT_ACTIVATIONS for name in _rnn_activations(node))


# -- conditional MFU use ------------------------------------------------------------------------


def divisor_is_dynamic(node: ir.Node) -> bool:
    """Div: a constant divisor becomes a multiply; a run-time divisor needs a reciprocal LUT."""
    return not is_constant(node.inputs[1])


def exponent_needs_lut(node: ir.Node) -> bool:
    """Pow: constant exponents 1, 2 and 3 are multiplies on the vector unit; others need a LUT."""
    exponent = node.inputs[1]
    if not is_constant(exponent) or exponent.const_value is None:
        return True
    values = exponent.const_value.numpy().ravel()
    return values.size != 1 or float(values[0]) not in (1.0, 2.0, 3.0)


def lp_needs_root(node: ir.Node) -> bool:
    """LpPool: p=1 is a sum of absolute values; other p need power and root LUTs."""
    return node.attributes.get_int("p", 2) != 1


# -- what the integer kernels need ------------------------------------------------------------


def gemm_plain_a(node: ir.Node) -> str | None:
    """Gemm: ``transA`` must be 0 (the activation is the left operand as is)."""
    if node.attributes.get_int("transA", 0):
        return "Gemm transA=1 not supported; transpose the activation before the Gemm (transA=0)"
    return None


def pool_floor_mode(node: ir.Node) -> str | None:
    """AveragePool: ``ceil_mode`` must be 0 (partial windows at the end are not averaged)."""
    if node.attributes.get_int("ceil_mode", 0):
        return f"{node.op_type} ceil_mode=1 not supported; pad the input or use ceil_mode=0"
    return None


def scalar_constant_operands(node: ir.Node) -> str | None:
    """Look-up-table ops: every input after the first must be a scalar constant (e.g. Pow's exponent)."""
    for index, value in enumerate(node.inputs[1:], start=1):
        if value is None:
            continue
        if not is_constant(value):
            return (f"{node.op_type} input '{input_role(node, index)}' is computed at run time; a look-up table "
                    "needs it to be a constant")
        const = value.const_value
        if const is not None and const.size != 1:
            return (f"{node.op_type} input '{input_role(node, index)}' has {const.size} values; a look-up table "
                    "needs a single constant")
    return None


def only_first_output_used(node: ir.Node) -> str | None:
    """Ops whose extra outputs (LayerNorm's Mean/InvStdDev, ...) the integer kernel does not produce."""
    extra = [value.name for value in node.outputs[1:] if is_used(value)]
    if extra:
        return f"{node.op_type} output '{extra[0]}' is used; the integer kernel computes only the first output"
    return None


def matrix_operands(node: ir.Node) -> str | None:
    """MatMul: both operands have rank 2 or more (1-D vector products are not lowered); a constant second
    operand is a dense layer's ``[K, N]`` weight (canonicalization drops unit batch axes and splits a per-slice
    one)."""
    for value in node.inputs[:2]:
        shape = dims(value)
        if shape is not None and len(shape) < 2:
            return f"MatMul operand '{value.name}' is 1-D; reshape it to a matrix ([1, K] or [K, 1])"
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    shape = dims(weight)
    if is_constant(weight) and shape is not None and len(shape) > 2:
        return (f"constant MatMul weight '{weight.name}' (shape {_fmt(shape)}) keeps batch axes: only [K, N], "
                "unit batch axes, or one per-slice axis -3 (at most 64) that the first operand shares are lowered; "
                "write one MatMul per weight slice")
    return None


def explicit_pool_pads(node: ir.Node) -> str | None:
    """AveragePool: ``auto_pad`` SAME_* is not lowered (give explicit ``pads``)."""
    auto_pad = _string(node, "auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", "VALID"):
        return None
    return f"{node.op_type} auto_pad={auto_pad} not supported; export with explicit pads"


def outputs_not_float(node: ir.Node) -> str | None:
    """Exact (compare/select/index) ops: their outputs must be bool or integer."""
    for value in node.outputs:
        if value.dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16):
            return f"{node.op_type} with a float output has no integer kernel"
    return None


def float_data_input(node: ir.Node) -> str | None:
    """Elementwise min/max/sum: every input is a float tensor (activation or constant)."""
    for value in node.inputs:
        if value is not None and value.dtype not in (None, ir.DataType.FLOAT):
            return f"{node.op_type} of {value.dtype.name.lower()} tensors has no integer kernel"
    return None
