"""Content checks of an MXQ ``program`` section (encoding ``qbops-1``) against a schema per kernel kind.

The container checks (CRCs, bounds) prove the bytes are the ones written; these checks prove the
program makes sense before anything runs: every operation has a known kernel kind, the attributes
that kind reads with the right JSON types, constants of integer type and consistent shapes, and
tensor references that name tensors defined earlier. A failure is an :class:`MxqFormatError`
naming the operation, so a tampered or mis-written file never reaches a kernel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from compiler_core.errors import MxqFormatError

logger = logging.getLogger(__name__)

PROGRAM_ENCODING = "qbops-1"
"""The program encoding these checks cover; other encodings are left to their readers."""

Check = Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and np.isfinite(value)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(item) for item in value)


def _clamp(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and _ints(value)  # low > high is ONNX Clip's min > max


def _int_or_ints(value: Any) -> bool:
    return _is_int(value) or (_ints(value) and len(value) > 0)


def _numbers(value: Any) -> bool:
    return isinstance(value, list) and all(_is_number(item) for item in value)


def _bool_like(value: Any) -> bool:
    return isinstance(value, bool) or value in (0, 1)


INT, INTS, CLAMP, ZERO_POINT, NUMBER, NUMBERS = _is_int, _ints, _clamp, _int_or_ints, _is_number, _numbers
STRING: Check = lambda value: isinstance(value, str)  # noqa: E731
DICT: Check = lambda value: isinstance(value, dict)  # noqa: E731


def _plain_attribute(value: Any) -> bool:
    scalar = (int, float, str)
    return isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(item, scalar) for item in value))


ATTRIBUTES: Check = lambda value: isinstance(value, dict) and all(  # noqa: E731
    isinstance(key, str) and _plain_attribute(item) for key, item in value.items())
BOOL: Check = _bool_like
_TYPE_NAMES = {INT: "an integer", INTS: "a list of integers", CLAMP: "[low, high] integers",
               ZERO_POINT: "an integer or a list of integers", NUMBER: "a finite number",
               NUMBERS: "a list of finite numbers", STRING: "a string", DICT: "an object", BOOL: "a boolean"}


@dataclass(frozen=True)
class KindSchema:
    """What one kernel kind reads.

    Attributes:
        attrs: required attribute -> type check.
        optional_attrs: optional attribute -> type check.
        consts: required constant names.
        optional_consts: optional constant names (``prefix*`` matches any suffix).
        integer_consts: constants must be integer (or bool) arrays.
        inputs: (min, max) number of input slots (``""`` slots count); max None = any.
        outputs: (min, max) number of outputs.
        rules: extra checks over (op, consts) returning a problem sentence or None.
        slot_consts: input slot -> the constant that may stand in for it (an empty ``""`` slot is
            valid only when the op holds that constant); ``"*"`` lets any slot be empty (ONNX optional inputs).
        shapes: the output shapes the kernel computes from the input shapes (and constants), or
            None where :func:`_check_onnx_node` checks them; returns a problem sentence or None.
    """

    attrs: Mapping[str, Check] = field(default_factory=dict)
    optional_attrs: Mapping[str, Check] = field(default_factory=dict)
    consts: tuple[str, ...] = ()
    optional_consts: tuple[str, ...] = ()
    integer_consts: bool = True
    inputs: tuple[int, int | None] = (1, 1)
    outputs: tuple[int, int | None] = (1, 1)
    rules: tuple[Callable[[dict, dict[str, np.ndarray]], str | None], ...] = ()
    slot_consts: Callable[[int], str] | str | None = None
    shapes: Callable[[dict, dict[str, np.ndarray], list], list | str] | None = None


def _same_shape(*names: str):
    def rule(op: dict, consts: dict[str, np.ndarray]) -> str | None:
        shapes = {name: consts[name].shape for name in names if name in consts}
        if len(set(shapes.values())) > 1:
            return f"constants {', '.join(names)} must have one shape, found {shapes}"
        return None
    return rule


def _linear_shapes(op: dict, consts: dict[str, np.ndarray]) -> str | None:
    attrs, weight = op["attrs"], consts["weight"]
    layout = attrs["layout"]
    if layout not in ("conv", "conv_transpose", "dense"):
        return f"attribute 'layout' is {layout!r}, not conv, conv_transpose or dense"
    if layout == "dense":
        if weight.ndim != 2:
            return f"a dense weight must be 2-D, found shape {list(weight.shape)}"
        channels = weight.shape[0]
    else:
        missing = [name for name in ("kernel", "pads", "strides", "dilations") if not _ints(attrs.get(name))]
        if missing or not _is_int(attrs.get("group")) or attrs["group"] < 1:
            return f"a {layout} needs integer-list attributes kernel, pads, strides, dilations and a group >= 1"
        rank = len(attrs["kernel"])
        if weight.ndim != rank + 2 or len(attrs["pads"]) != 2 * rank or len(attrs["strides"]) != rank \
                or len(attrs["dilations"]) != rank or list(weight.shape[2:]) != attrs["kernel"]:
            return (f"weight shape {list(weight.shape)} does not match kernel {attrs['kernel']}, pads "
                    f"{attrs['pads']}, strides {attrs['strides']}, dilations {attrs['dilations']}")
        if min(attrs["strides"] + attrs["dilations"]) < 1:
            return "strides and dilations must be >= 1"
        if layout == "conv" and min(attrs["pads"]) < 0:  # a transposed conv's equivalent conv crops: pads < 0
            return "pads must be >= 0"
        channels = weight.shape[0]  # conv_transpose weights are stored as the equivalent conv's [Cout, Cin/g, k...]
    for name in ("bias", "multiplier", "shift"):
        if consts[name].shape != (channels,):
            return f"constant '{name}' has shape {list(consts[name].shape)}, expected [{channels}] (output channels)"
    # per-channel zero points: the input's only into a convolution (docs/numerics.md), one per channel
    inputs = weight.shape[1] * (attrs["group"] if layout != "dense" else 1)
    for name, count, kind in (("zp_x", inputs if layout == "conv" else 1, "input"), ("zp_y", channels, "output")):
        value = attrs.get(name)
        if isinstance(value, list) and len(value) not in (1, count):
            return f"attribute '{name}' has {len(value)} values, expected 1 or {count} ({kind} channels)"
    return None


def _requantizer_shapes(op: dict, consts: dict[str, np.ndarray]) -> str | None:
    return _same_shape("multiplier", "shift")(op, consts)


def _concat_counts(op: dict, consts: dict[str, np.ndarray]) -> str | None:
    count = len(op["inputs"])
    if len(op["attrs"]["zp_inputs"]) != count or consts["multiplier"].shape != (count,) \
            or consts["shift"].shape != (count,):
        return f"zp_inputs, multiplier and shift must each have one entry per input ({count})"
    return None


def _operand_counts(op: dict, consts: dict[str, np.ndarray]) -> str | None:
    count = len(op["inputs"])
    if len(op["attrs"]["zero_points"]) != count or consts["multipliers"].shape != (count,) \
            or consts["shifts"].shape != (count,):
        return f"zero_points, multipliers and shifts must each have one entry per input ({count})"
    return None


def _extremum_mode(op: dict, consts: dict[str, np.ndarray]) -> str | None:
    return None if op["attrs"]["mode"] in ("max", "min") else f"mode {op['attrs']['mode']!r} is not max or min"


def _add_shapes(op: dict, consts: dict[str, np.ndarray]) -> str | None:
    if consts["multipliers"].shape[:1] != (2,) or consts["shifts"].shape != consts["multipliers"].shape:
        return "constants multipliers and shifts must both have shape [2, ...]"
    return None


def _resize_weights(op: dict, consts: dict[str, np.ndarray]) -> str | None:
    for axis in op["attrs"]["axes"]:
        weights = consts.get(f"weight{axis}")
        if weights is None or weights.ndim != 2:
            return f"axis {axis} needs a 2-D constant 'weight{axis}'"
    return None


def _table_1d(name: str):
    def rule(op: dict, consts: dict[str, np.ndarray]) -> str | None:
        return None if consts[name].ndim == 1 and consts[name].size > 0 else f"constant '{name}' must be a non-empty 1-D table"
    return rule


def _lut_table(op: dict, consts: dict[str, np.ndarray]) -> str | None:
    """A 1-D table, or one row per channel (``[C, codes]``) with ``axis`` 1."""
    table = consts["table"]
    if "axis" in op.get("attrs", {}):
        ok = table.ndim == 2 and table.size > 0 and op["attrs"]["axis"] == 1
        return None if ok else "constant 'table' of a per-channel look-up table must be [channels, codes] with axis 1"
    return _table_1d("table")(op, consts)


# -- output shapes per kind: what the kernel computes from its inputs' recorded shapes ------------------

Shapes = list  # per input slot: the recorded shape (list of ints), or the standing-in constant's shape


def _elementwise(op: dict, consts: dict[str, np.ndarray], inputs: Shapes) -> list:
    """Element-wise kinds: their constants (per-element multipliers, branches) may broadcast the inputs
    further, so only the inputs' broadcast is known; :func:`_check_shapes` requires the recorded output
    to be a broadcast of it."""
    return [list(np.broadcast_shapes(*[tuple(shape) for shape in inputs]))]


def _requantized(shapes):
    """``shapes``, then broadcast with the final requantization's ``multiplier``/``shift`` constants."""
    def computed(op: dict, consts: dict[str, np.ndarray], inputs: Shapes) -> list:
        extra = [consts[name].shape for name in ("multiplier", "shift") if name in consts]
        return [list(np.broadcast_shapes(tuple(shape), *extra)) for shape in shapes(op, consts, inputs)]
    return computed


def _matmul(op: dict, consts: dict[str, np.ndarray], inputs: Shapes) -> list:
    a, b = (list(shape) for shape in inputs)
    if not a or not b:
        raise ValueError("MatMul operands must have rank >= 1")
    a2, b2 = (a if len(a) > 1 else [1, *a]), (b if len(b) > 1 else [*b, 1])
    if a2[-1] != b2[-2]:
        raise ValueError(f"inner sizes {a2[-1]} and {b2[-2]} differ")
    out = [*np.broadcast_shapes(tuple(a2[:-2]), tuple(b2[:-2])), a2[-2], b2[-1]]
    return [out[:-2] + out[-2:][len(a) == 1: 2 - (len(b) == 1)]]


def _window(sizes: Sequence[int], attrs: dict) -> list[int]:
    """Output sizes of a sliding window (kernel, pads, strides, dilations) over ``sizes``."""
    rank = len(attrs["kernel"])
    if len(sizes) != rank:
        raise ValueError(f"the input has {len(sizes)} spatial dims, the kernel {rank}")
    out = []
    for index, size in enumerate(sizes):
        span = (attrs["kernel"][index] - 1) * attrs["dilations"][index] + 1
        padded = size + attrs["pads"][index] + attrs["pads"][index + rank]
        if padded < span:
            raise ValueError(f"the window ({span}) is larger than the padded input ({padded})")
        out.append((padded - span) // attrs["strides"][index] + 1)
    return out


def _linear(op: dict, consts: dict[str, np.ndarray], inputs: Shapes) -> list:
    attrs, weight, shape = op["attrs"], consts["weight"], list(inputs[0])
    if attrs["layout"] == "dense":
        if not shape or shape[-1] != weight.shape[1]:
            raise ValueError(f"input {shape} does not end in the weight's {weight.shape[1]} input features")
        return [[*shape[:-1], weight.shape[0]]]
    if len(shape) != weight.ndim or shape[1] != weight.shape[1] * attrs["group"]:
        raise ValueError(f"input {shape} does not have {weight.shape[1] * attrs['group']} channels of rank {weight.ndim}")
    spatial = shape[2:]
    if attrs["layout"] == "conv_transpose":
        strides = attrs.get("input_strides")
        if not _ints(strides) or len(strides) != len(spatial) or min(strides, default=1) < 1:
            raise ValueError("a conv_transpose needs integer input_strides >= 1, one per spatial dim")
        spatial = [(size - 1) * stride + 1 for size, stride in zip(spatial, strides)]
    return [[shape[0], weight.shape[0], *_window(spatial, attrs)]]


def _pool(op: dict, consts: dict[str, np.ndarray], inputs: Shapes) -> list:
    shape, attrs = list(inputs[0]), op["attrs"]
    rank = len(attrs["kernel"])
    if len(attrs["pads"]) != 2 * rank or len(attrs["strides"]) != rank or len(attrs["dilations"]) != rank \
            or min(attrs["strides"] + attrs["dilations"] + attrs["kernel"], default=1) < 1 or min(attrs["pads"], default=0) < 0:
        raise ValueError("kernel, pads, strides and dilations do not fit together")
    return [[*shape[:2], *_window(shape[2:], attrs)]]


def _concat(op: dict, consts: dict[str, np.ndarray], inputs: Shapes) -> list:
    first, axis = list(inputs[0]), op["attrs"]["axis"]
    if not -len(first) <= axis < len(first):
        raise ValueError(f"axis {axis} is outside rank {len(first)}")
    axis %= len(first)
    for shape in inputs[1:]:
        if len(shape) != len(first) or any(a != b for i, (a, b) in enumerate(zip(shape, first)) if i != axis):
            raise ValueError(f"inputs {first} and {list(shape)} differ outside axis {axis}")
    return [[*first[:axis], sum(shape[axis] for shape in inputs), *first[axis + 1:]]]


def _reduce(op: dict, consts: dict[str, np.ndarray], inputs: Shapes) -> list:
    shape, axes = list(inputs[0]), op["attrs"]["axes"]
    if not axes:
        return [shape]
    if any(not -len(shape) <= axis < len(shape) for axis in axes):
        raise ValueError(f"axes {axes} are outside rank {len(shape)}")
    reduced = {axis % len(shape) for axis in axes}
    if op["attrs"]["keepdims"]:
        return [[1 if index in reduced else size for index, size in enumerate(shape)]]
    return [[size for index, size in enumerate(shape) if index not in reduced]]


def _interpolate(op: dict, consts: dict[str, np.ndarray], inputs: Shapes) -> list:
    shape = list(inputs[0])
    for axis in op["attrs"]["axes"]:
        if not 0 <= axis < len(shape):
            raise ValueError(f"axis {axis} is outside rank {len(shape)}")
        weights = consts[f"weight{axis}"]
        if weights.shape[1] != shape[axis]:
            raise ValueError(f"weight{axis} reads {weights.shape[1]} samples, the input has {shape[axis]}")
        shape[axis] = weights.shape[0]
    return [shape]


def _gather_table(op: dict, consts: dict[str, np.ndarray], inputs: Shapes) -> list:
    table, axis = consts["table"].shape, op["attrs"]["axis"]
    if not 0 <= axis < len(table):
        raise ValueError(f"axis {axis} is outside the table's rank {len(table)}")
    indices = consts["indices"].shape if "indices" in consts else inputs[1]
    return [[*table[:axis], *indices, *table[axis + 1:]]]


_AB = "const_a", "const_b"


def _ab_slot(index: int) -> str:
    return _AB[index] if index < 2 else ""


def _select_slot(index: int) -> str:
    return {0: "condition", 1: "const_x", 2: "const_y"}.get(index, "")


def _numbered_slot(index: int) -> str:
    return f"const{index}"


def _gather_slot(index: int) -> str:
    return ("table", "indices")[index] if index < 2 else ""


SOFTMAX_MAX_SHIFT = 16
"""compiler_core.quantization.kernels.softmax.MAX_SHIFT (its int64 products rely on the bound)."""


def _softmax_shift(op: dict, consts: dict[str, np.ndarray]) -> str | None:
    shift = op["attrs"].get("shift", 0)
    return None if 0 <= shift <= SOFTMAX_MAX_SHIFT else f"shift {shift} is outside 0..{SOFTMAX_MAX_SHIFT}"


_REQUANT = ("multiplier", "shift")
_QUANTIZED = {"zp_y": INT, "clamp": CLAMP}

SCHEMAS: dict[str, KindSchema] = {
    "linear": KindSchema(attrs={"layout": STRING, "zp_x": ZERO_POINT, "zp_y": ZERO_POINT, "clamp": CLAMP},
                         optional_attrs={"kernel": INTS, "pads": INTS, "strides": INTS, "dilations": INTS,
                                         "group": INT, "weight_scale": NUMBERS, "output_padding": INTS},
                         consts=("weight", "bias", *_REQUANT), rules=(_linear_shapes,), shapes=_linear),
    "matmul": KindSchema(attrs={"zp_a": INT, "zp_b": INT, **_QUANTIZED}, consts=_REQUANT, inputs=(2, 2),
                         rules=(_requantizer_shapes,), shapes=_requantized(_matmul)),
    "add": KindSchema(attrs={"zp_a": INT, "zp_b": INT, **_QUANTIZED}, optional_attrs={"const_a_scale": NUMBER,
                                                                                      "const_b_scale": NUMBER},
                      consts=("multipliers", "shifts"), optional_consts=("const_a", "const_b"), inputs=(2, 2),
                      rules=(_add_shapes,), slot_consts=_ab_slot, shapes=_elementwise),
    "scale": KindSchema(attrs={"zp_x": INT, **_QUANTIZED}, consts=_REQUANT, rules=(_requantizer_shapes,),
                        shapes=_elementwise),
    "mul": KindSchema(attrs={"zp_a": INT, "zp_b": INT, **_QUANTIZED}, consts=_REQUANT, inputs=(2, 2),
                      rules=(_requantizer_shapes,), shapes=_elementwise),
    "select": KindSchema(attrs=_QUANTIZED, optional_attrs={"zp_branch_x": INT, "zp_branch_y": INT},
                         optional_consts=("const_*", "multiplier_*", "shift_*", "condition"), inputs=(3, 3),
                         slot_consts=_select_slot, shapes=_elementwise),
    "quantize": KindSchema(attrs={"scale": NUMBER, "zp_y": INT, "qmin": INT, "qmax": INT}, shapes=_elementwise),
    "clamp": KindSchema(attrs={"clamp": CLAMP}, shapes=_elementwise),
    "lut": KindSchema(attrs={"offset": INT}, optional_attrs={"axis": INT}, consts=("table",), rules=(_lut_table,),
                      shapes=_elementwise),
    "move": KindSchema(attrs={"attributes": ATTRIBUTES}, optional_attrs={"float_evaluated": BOOL, "dequantize": DICT},
                       optional_consts=("input*",), integer_consts=False, inputs=(1, None), outputs=(1, None),
                       slot_consts="*"),
    "exact": KindSchema(attrs={"attributes": ATTRIBUTES}, optional_attrs={"float_evaluated": BOOL, "dequantize": DICT},
                        optional_consts=("input*",), integer_consts=False, inputs=(0, None), outputs=(1, None),
                        slot_consts="*"),
    "concat": KindSchema(attrs={"axis": INT, "zp_inputs": INTS, **_QUANTIZED}, consts=_REQUANT,
                         optional_consts=("const*",), inputs=(1, None), rules=(_concat_counts,),
                         slot_consts=_numbered_slot, shapes=_concat),
    "extremum": KindSchema(attrs={"zero_points": INTS, "mode": STRING, **_QUANTIZED},
                           consts=("multipliers", "shifts"), optional_consts=("const*",), inputs=(1, None),
                           rules=(_operand_counts, _extremum_mode), slot_consts=_numbered_slot, shapes=_elementwise),
    "sum": KindSchema(attrs={"zero_points": INTS, **_QUANTIZED}, consts=("multipliers", "shifts"),
                      optional_consts=("const*",), inputs=(1, None), rules=(_operand_counts,),
                      slot_consts=_numbered_slot, shapes=_elementwise),
    "divide": KindSchema(attrs={"zp_a": INT, "offset_b": INT, **_QUANTIZED}, consts=("reciprocal", *_REQUANT),
                         optional_consts=("const_a",), inputs=(2, 2),
                         rules=(_table_1d("reciprocal"), _requantizer_shapes), slot_consts=_ab_slot,
                         shapes=_elementwise),
    "groupnorm": KindSchema(attrs={"groups": INT, "zp_x": INT, "epsilon_term": INT, **_QUANTIZED},
                            consts=(*_REQUANT, "offset"), rules=(_same_shape("multiplier", "shift"),), shapes=_elementwise),
    "reduce_l2": KindSchema(attrs={"axes": INTS, "keepdims": BOOL, "zp_x": INT, **_QUANTIZED},
                            optional_attrs={"headroom": INT}, consts=_REQUANT, rules=(_requantizer_shapes,),
                            shapes=_requantized(_reduce)),
    "cumsum": KindSchema(attrs={"axis": INT, "exclusive": BOOL, "reverse": BOOL, "zp_x": INT, **_QUANTIZED},
                         consts=_REQUANT, rules=(_requantizer_shapes,), shapes=_elementwise),
    "gather_table": KindSchema(attrs={"axis": INT}, consts=("table",), optional_consts=("indices",), inputs=(2, 2),
                               slot_consts=_gather_slot, shapes=_gather_table),
    "layernorm": KindSchema(attrs={"axis": INT, "zp_x": INT, "epsilon_term": INT, **_QUANTIZED},
                            consts=(*_REQUANT, "offset"), rules=(_same_shape("multiplier", "shift", "offset"),),
                            shapes=_elementwise),
    "reduce_sum": KindSchema(attrs={"axes": INTS, "keepdims": BOOL, "zp_x": INT, **_QUANTIZED}, consts=_REQUANT,
                             rules=(_requantizer_shapes,), shapes=_requantized(_reduce)),
    "average_pool": KindSchema(attrs={"kernel": INTS, "pads": INTS, "strides": INTS, "dilations": INTS, "group": INT,
                                      "zp_x": INT, **_QUANTIZED}, consts=_REQUANT, rules=(_requantizer_shapes,),
                                shapes=_requantized(_pool)),
    "prelu": KindSchema(attrs={"zp_x": INT, **_QUANTIZED},
                        consts=("positive_multiplier", "positive_shift", "negative_multiplier", "negative_shift"),
                        rules=(_same_shape("positive_multiplier", "positive_shift"),
                               _same_shape("negative_multiplier", "negative_shift")), shapes=_elementwise),
    "interpolate": KindSchema(attrs={"axes": INTS, "zp": INT, "clamp": CLAMP}, optional_consts=("weight*",),
                              rules=(_resize_weights,), shapes=_interpolate),
    "softmax": KindSchema(attrs={"axis": INT, "qmax": INT}, optional_attrs={"shift": INT, "masked_code": INT},
                          consts=("exp_table",), rules=(_table_1d("exp_table"), _softmax_shift), shapes=_elementwise),
}
"""Kernel kind -> what its kernel reads. Every kind in the executor's registry must have an entry."""

_OP_FIELDS = {"name": STRING, "kind": STRING, "op_type": STRING, "inputs": list, "outputs": list, "attrs": DICT,
              "consts": DICT}


def validate_program(document: Mapping[str, Any], consts: Mapping[str, np.ndarray], *, path: str = "") -> None:
    """Check a ``qbops-1`` program document and its constants; return silently if it is sound.

    Args:
        document: The decoded ``program`` section.
        consts: The ``const`` section's arrays by name.
        path: The file, for messages.

    Raises:
        MxqFormatError: the first problem, naming the operation (``fields["op"]``).
    """
    where = f"{path}: " if path else ""
    shapes = _mapping(document, "shapes", where)
    bad = [name for name, shape in shapes.items() if not (_ints(shape) and all(dim >= 0 for dim in shape))]
    if bad:
        raise _error(f"{where}the program records shape {shapes[bad[0]]!r} for {bad[0]!r}: not a list of sizes >= 0.")
    tensors = _mapping(document, "tensors", where)
    known = _interface(document, "inputs", where)
    _interface(document, "outputs", where)
    ops = document.get("ops")
    if not isinstance(ops, list):
        raise _error(f"{where}the program has no operation list.")
    for index, entry in enumerate(ops):
        op = _check_op_fields(entry, index, where)
        label = f"operation {index} ('{op['name']}', kind {op['kind']!r})"
        problem, cause = _check_op(op, consts, known, shapes), None
        if not problem:
            problem, cause = _check_onnx_node(op, consts, document)
        if problem:
            raise _error(f"{where}the program is invalid at {label}: {problem}.", op=op["name"], index=index) from cause
        known.update(op["outputs"])
    missing = [spec["name"] for spec in document["outputs"] if spec["name"] not in known]
    if missing:
        raise _error(f"{where}the program never computes output {missing[0]!r}.")
    bad = [name for name, record in tensors.items() if not isinstance(record, dict) or not isinstance(record.get("params"), dict)]
    if bad:
        raise _error(f"{where}tensor {bad[0]!r} has no quantization parameters.")
    for name, record in tensors.items():
        problem = _params_problem(record["params"])
        if problem:
            raise _error(f"{where}tensor {name!r} has invalid quantization parameters: {problem}.")
    if "npu" in document:
        from compiler_core.backend.verify import npu_problem

        problem = npu_problem(document["npu"], consts, len(ops))
        if problem:
            raise _error(f"{where}the tile-level program is invalid: {problem}.")


def _params_problem(params: Mapping[str, Any]) -> str | None:
    """What is wrong with a tensor's ``QuantParams.to_dict()`` record, or ``None``."""
    if params.get("bits") not in (8, 16) or not isinstance(params.get("signed"), bool):
        return "'bits' must be 8 or 16 and 'signed' a boolean"
    try:
        scale = np.asarray(params.get("scale"), dtype=np.float64)
        zero_point = np.asarray(params.get("zero_point"), dtype=np.float64)
    except (TypeError, ValueError):
        return "'scale' and 'zero_point' must be numbers or lists of numbers"
    if scale.ndim > 1 or scale.shape != zero_point.shape or scale.size == 0:
        return "'scale' and 'zero_point' must have one shape: a number or a list per channel"
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        return "'scale' must be finite and positive"
    low, high = (0, (1 << params["bits"]) - 1) if not params["signed"] else (-(1 << params["bits"] - 1),
                                                                             (1 << params["bits"] - 1) - 1)
    if not (np.isfinite(zero_point).all() and (zero_point == np.round(zero_point)).all()
            and zero_point.min() >= low and zero_point.max() <= high):
        return f"'zero_point' must be integer codes in [{low}, {high}]"
    axis = params.get("axis")
    if axis is not None and not _is_int(axis) or (axis is None and scale.ndim != 0):
        return "'axis' must be an integer for per-channel parameters, else null"
    return None


def _mapping(document: Mapping[str, Any], key: str, where: str) -> dict:
    value = document.get(key)
    if not isinstance(value, dict):
        raise _error(f"{where}the program's '{key}' is not an object.")
    return value


def _interface(document: Mapping[str, Any], key: str, where: str, section: str = "program") -> set[str]:
    specs = document.get(key)
    valid = isinstance(specs, list) and all(
        isinstance(spec, dict) and set(spec) == {"name", "shape", "dtype"} and STRING(spec.get("name"))
        and _ints(spec.get("shape")) and all(dim >= 0 for dim in spec["shape"]) and _dtype(spec.get("dtype"))
        for spec in specs)
    if not valid:
        raise _error(f"{where}the {section}'s '{key}' must list {{name, shape, dtype}} records with sizes >= 0.",
                     section=section)
    return {spec["name"] for spec in specs}


def _dtype(value: Any) -> bool:
    if not STRING(value):
        return False
    try:
        np.dtype(value)
    except TypeError:
        return False
    return True


def validate_meta(meta: Mapping[str, Any], program: Mapping[str, Any], cpu_parts: Sequence[str], *,
                  path: str = "") -> None:
    """Check the ``meta`` section a runtime reads: the model's inputs and outputs, core modes and config.

    Without a CPU head the program's inputs must be the model's; without a CPU tail the model's
    outputs must be the program's.

    Raises:
        MxqFormatError: the first problem (``fields["section"] == "meta"``).
    """
    where = f"{path}: " if path else ""
    if not isinstance(meta, Mapping):
        raise _error(f"{where}the meta section is not an object.", section="meta")
    inputs = _interface(meta, "inputs", where, "meta section")
    outputs = _interface(meta, "outputs", where, "meta section")
    modes = meta.get("core_modes")
    if not (isinstance(modes, list) and modes and all(STRING(mode) for mode in modes)):
        raise _error(f"{where}the meta section's 'core_modes' must be a non-empty list of names.", section="meta")
    body_inputs = {spec["name"] for spec in program.get("inputs", [])}
    body_outputs = {spec["name"] for spec in program.get("outputs", [])}
    if "head" not in cpu_parts and not body_inputs <= inputs:
        raise _error(f"{where}the program reads input {sorted(body_inputs - inputs)[0]!r} that the model does not "
                     "declare.", section="meta")
    if "tail" not in cpu_parts and not outputs <= body_outputs:
        raise _error(f"{where}the model declares output {sorted(outputs - body_outputs)[0]!r} that nothing "
                     "computes.", section="meta")
    config = meta.get("config")
    if config is not None:
        from compiler_core.config import CompileConfig

        try:
            CompileConfig.model_validate(config)
        except (ValueError, TypeError) as error:
            raise _error(f"{where}the meta section's compile config is invalid: {str(error).splitlines()[0]}",
                         section="meta") from error


def _check_op_fields(entry: Any, index: int, where: str) -> dict:
    if not isinstance(entry, dict):
        raise _error(f"{where}operation {index} of the program is not an object.", index=index)
    for name, check in _OP_FIELDS.items():
        value = entry.get(name)
        ok = isinstance(value, list) and all(isinstance(item, str) for item in value) if check is list else check(value)
        if not ok:
            raise _error(f"{where}operation {index} ('{entry.get('name')}') has no valid '{name}' field.",
                         op=str(entry.get("name")), index=index)
    return entry


def _check_op(op: dict, consts: Mapping[str, np.ndarray], known: set[str], shapes: Mapping[str, Any]) -> str | None:
    schema = SCHEMAS.get(op["kind"])
    if schema is None:
        return f"kernel kind {op['kind']!r} does not exist (known: {', '.join(sorted(SCHEMAS))})"
    return (_check_slots(op, schema, known, shapes) or _check_attrs(op["attrs"], schema)
            or _check_const_refs(op, schema, consts) or _check_rules(op, schema, consts)
            or _check_shapes(op, schema, consts, shapes))


def _check_slots(op: dict, schema: KindSchema, known: set[str], shapes: Mapping[str, Any]) -> str | None:
    for what, values, (low, high) in (("inputs", op["inputs"], schema.inputs),
                                      ("outputs", op["outputs"], schema.outputs)):
        if len(values) < low or (high is not None and len(values) > high):
            return f"it has {len(values)} {what}, its kind takes {low} to {high if high is not None else 'any'}"
    unknown = [name for name in op["inputs"] if name and name not in known]
    if unknown:
        return f"it reads tensor {unknown[0]!r}, which no input or earlier operation defines"
    for index, name in enumerate(op["inputs"]):
        stand_in = schema.slot_consts(index) if callable(schema.slot_consts) else schema.slot_consts
        if not name and stand_in != "*" and (not stand_in or stand_in not in op["consts"]):
            return f"input slot {index} is empty and no constant stands in for it"
        if name and (not _ints(shapes.get(name)) or any(dim < 0 for dim in shapes[name])):
            return f"input {name!r} has no valid static shape in the program's 'shapes'"
    for name in op["outputs"]:
        if not name or name in known:
            return f"output {name!r} is empty or already defined"
        if not _ints(shapes.get(name)) or any(dim < 0 for dim in shapes[name]):
            return f"output {name!r} has no valid static shape in the program's 'shapes'"
    return None


def _check_attrs(attrs: dict, schema: KindSchema) -> str | None:
    missing = [name for name in schema.attrs if name not in attrs]
    if missing:
        return f"attribute {missing[0]!r} is missing"
    for name, value in attrs.items():
        check = schema.attrs.get(name) or schema.optional_attrs.get(name)
        if check is not None and not check(value):
            return f"attribute {name!r} is {value!r}, expected {_TYPE_NAMES.get(check, 'another type')}"
    return None


def _check_const_refs(op: dict, schema: KindSchema, consts: Mapping[str, np.ndarray]) -> str | None:
    refs = op["consts"]
    missing = [key for key in schema.consts if key not in refs]
    if missing:
        return f"constant {missing[0]!r} is missing"
    for key, name in refs.items():
        if key not in schema.consts and not _matches(key, schema.optional_consts):
            return f"constant {key!r} is not one its kind reads"
        if not isinstance(name, str) or name not in consts:
            return f"constant {key!r} references {name!r}, which the const section does not hold"
        dtype = np.asarray(consts[name]).dtype
        if schema.integer_consts and dtype.kind not in "iub":
            return f"constant {key!r} is {dtype}, expected an integer array"
    return None


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(key == pattern or (pattern.endswith("*") and key.startswith(pattern[:-1])) for pattern in patterns)


def _check_rules(op: dict, schema: KindSchema, consts: Mapping[str, np.ndarray]) -> str | None:
    arrays = {key: np.asarray(consts[name]) for key, name in op["consts"].items()}
    for rule in schema.rules:
        problem = rule(op, arrays)
        if problem:
            return problem
    return None


def _check_shapes(op: dict, schema: KindSchema, consts: Mapping[str, np.ndarray],
                  shapes: Mapping[str, Any]) -> str | None:
    """The recorded output shapes must be the ones the kernel computes from the recorded input shapes."""
    if schema.shapes is None:
        return None
    arrays = {key: np.asarray(consts[name]) for key, name in op["consts"].items()}
    inputs = []
    for index, name in enumerate(op["inputs"]):
        stand_in = schema.slot_consts(index) if callable(schema.slot_consts) else None
        inputs.append(list(shapes[name]) if name else list(arrays[stand_in].shape) if stand_in else [])
    try:
        computed = schema.shapes(op, arrays, inputs)
    except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError) as error:
        return f"its input shapes {inputs} do not fit it: {error}"
    recorded = [list(shapes[name]) for name in op["outputs"]]
    if schema.shapes is _elementwise:
        try:
            fits = list(np.broadcast_shapes(tuple(computed[0]), tuple(recorded[0]))) == recorded[0]
        except ValueError:
            fits = False
        if len(recorded) != 1 or not fits:
            return f"its output shape(s) {recorded} are not a broadcast of its inputs' shape {computed[0]}"
        return None
    if [list(map(int, shape)) for shape in computed] != recorded:
        return f"it computes output shape(s) {computed} from its inputs, the program records {recorded}"
    return None


_ONNX_EVALUATED = frozenset({"move", "exact"})


def _check_onnx_node(op: dict, consts: Mapping[str, np.ndarray],
                     document: Mapping[str, Any]) -> tuple[str | None, Exception | None]:
    """``move``/``exact`` run the ONNX op itself: its attributes, input types and shapes must infer the
    output shapes the program records (strict ONNX shape inference on the single node).

    Returns:
        (problem, the exception behind it) or (None, None).
    """
    if op["kind"] not in _ONNX_EVALUATED:
        return None, None
    if not op["op_type"] or not onnx.defs.has(op["op_type"], 21, ""):
        return f"its op type {op['op_type']!r} is not an ONNX operator", None  # shape inference skips unknown ops
    try:
        model = _single_node_model(op, consts, document)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as error:  # building or inferring the node fails in many ways: re-raised coded, as cause
        return f"its ONNX node ({op['op_type']}) is invalid: {type(error).__name__}: {_first_line(error)}", error
    for value in inferred.graph.output:
        dims = value.type.tensor_type.shape.dim
        shape = [dim.dim_value if dim.HasField("dim_value") else None for dim in dims]
        expected = document["shapes"][value.name]
        if value.type.tensor_type.HasField("shape") and None not in shape and shape != list(expected):
            return (f"its ONNX node ({op['op_type']}) gives {value.name!r} shape {shape}, the program records "
                    f"{expected}"), None
    return None, None


def _single_node_model(op: dict, consts: Mapping[str, np.ndarray], document: Mapping[str, Any]) -> onnx.ModelProto:
    attrs, shapes, exact = op["attrs"], document["shapes"], document.get("exact", {})
    dequantized = attrs.get("dequantize", {}) if isinstance(attrs.get("dequantize"), dict) else {}
    names, inputs, initializers = [], [], []
    for index, name in enumerate(op["inputs"]):
        key = f"input{index}"
        if key in op["consts"]:
            initializers.append(onnx.numpy_helper.from_array(np.asarray(consts[op["consts"][key]]), key))
            names.append(key)
        elif name:
            if str(index) in dequantized:
                element = onnx.TensorProto.FLOAT
            elif name in exact:
                element = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(exact[name]))
            else:
                element = onnx.TensorProto.DOUBLE if attrs.get("float_evaluated") else onnx.TensorProto.INT64
            inputs.append(onnx.helper.make_tensor_value_info(key, element, _shape_of(name, shapes)))
            names.append(key)
        else:
            names.append("")
    node = onnx.helper.make_node(op["op_type"], names, op["outputs"], **attrs["attributes"])
    graph = onnx.helper.make_graph([node], "op", inputs, [onnx.helper.make_tensor_value_info(name, 0, None)
                                                          for name in op["outputs"]], initializers)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10)


def _shape_of(name: str, shapes: Mapping[str, Any]) -> list[int] | None:
    shape = shapes.get(name)
    return list(shape) if _ints(shape) else None


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else ""


def _error(message: str, **fields: Any) -> MxqFormatError:
    fields.setdefault("section", "program")
    return MxqFormatError(message, hint="The file is corrupt or was written by an incompatible compiler; "
                                        "compile the model again.", **fields)
