"""Unroll ONNX LSTM, GRU and RNN nodes into primitive ops (MatMul, Add, Sigmoid, Tanh, Mul, Split, Concat ...).

The quantizer has kernels for the primitives, not for a recurrent cell, so canonicalization
unrolls every LSTM/GRU/RNN whose sequence length is static into the equations of the ONNX spec,
step by step. The input projection of all steps is one MatMul (with the biases that add to it folded
into one Add); each step adds ``H @ R^T`` and applies the gates. Every new node keeps the cell's
``mblt.source_name``. Cells outside the supported subset (non-default activations,
``input_forget``, partial ``sequence_lens``, non-constant weights) are left alone and later fail
quantization with the usual "no integer kernel" error; the reason is logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

logger = logging.getLogger(__name__)

SOURCE_NAME_KEY = "mblt.source_name"
_DEFAULT_ACTIVATIONS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh"), "RNN": ("tanh",)}


def decompose_recurrent(model: ir.Model) -> int:
    """Unroll every supported LSTM, GRU and RNN of the main graph in place; returns how many were unrolled."""
    count = 0
    cells = [n for n in model.graph if n.op_type in _DEFAULT_ACTIVATIONS and n.domain in ("", "ai.onnx")]
    for node in cells:
        reason = _unsupported_reason(node)
        if reason:
            logger.info("%s %s is kept (%s); it has no integer kernel", node.op_type, node.name, reason)
            continue
        _unroll(model.graph, node)
        count += 1
    return count


def _attribute(node: ir.Node, name: str, default):
    attribute = node.attributes.get(name)
    return default if attribute is None else attribute.value


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def _unsupported_reason(node: ir.Node) -> str:
    x = node.inputs[0]
    if x.shape is None or not all(isinstance(d, int) for d in x.shape):
        return "the input shape is not static"
    for index, name in ((1, "W"), (2, "R"), (3, "B"), (7, "P")):
        value = _input(node, index)
        if value is not None and value.const_value is None:
            return f"{name} is not a constant"
    if _attribute(node, "input_forget", 0):
        return "input_forget = 1"
    defaults = _DEFAULT_ACTIVATIONS[node.op_type]
    activations = [a.lower() for a in _attribute(node, "activations", [])]
    if activations and any(a != defaults[i % len(defaults)] for i, a in enumerate(activations)):
        return f"activations {activations}"
    lengths = _input(node, 4)
    if lengths is not None:
        seq_len = x.shape[1 if _attribute(node, "layout", 0) else 0]
        if lengths.const_value is None or not np.all(lengths.const_value.numpy() == seq_len):
            return "sequence_lens is not the full length"
    return ""


@dataclass
class _Emitter:
    """Builds the replacement nodes: names derived from the LSTM's, its source name on every node."""

    graph: ir.Graph
    anchor: ir.Node
    nodes: list[ir.Node] = field(default_factory=list)

    def op(self, op_type: str, inputs: list[ir.Value | None], attributes: dict | None = None, outputs: int = 1):
        index = len(self.nodes)
        node = ir.node(op_type, inputs, attributes, num_outputs=outputs, name=f"{self.anchor.name}_{index}",
                       metadata_props={SOURCE_NAME_KEY: self.anchor.metadata_props.get(SOURCE_NAME_KEY,
                                                                                        self.anchor.name)})
        for position, output in enumerate(node.outputs):
            output.name = f"{node.name}_out{position}"
        self.nodes.append(node)
        return node.outputs[0] if outputs == 1 else list(node.outputs)

    def const(self, array: np.ndarray, label: str) -> ir.Value:
        name = f"{self.anchor.name}.{label}"
        value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                         const_value=ir.tensor(array, name=name))
        self.graph.register_initializer(value)
        return value

    def axes(self, *axes: int) -> ir.Value:
        return self.const(np.array(axes, dtype=np.int64), f"axes{len(self.nodes)}")

    def split(self, value: ir.Value, axis: int, parts: int) -> list[ir.Value]:
        """``parts`` equal pieces along ``axis``, the axis kept."""
        return [value] if parts == 1 else self.op("Split", [value], {"axis": axis, "num_outputs": parts}, outputs=parts)

    def pieces(self, value: ir.Value, axis: int, parts: int) -> list[ir.Value]:
        """``parts`` equal pieces along ``axis``, the axis removed."""
        return [self.op("Squeeze", [piece, self.axes(axis)]) for piece in self.split(value, axis, parts)]

    def concat(self, values: list[ir.Value], axis: int) -> ir.Value:
        return values[0] if len(values) == 1 else self.op("Concat", values, {"axis": axis})


def _unroll(graph: ir.Graph, node: ir.Node) -> None:
    emit = _Emitter(graph, node)
    layout = _attribute(node, "layout", 0)
    hidden = _attribute(node, "hidden_size", None) or node.inputs[2].shape[-1]
    directions = 2 if _attribute(node, "direction", "forward") == "bidirectional" else 1
    reverse = [False, True] if directions == 2 else [_attribute(node, "direction", "forward") == "reverse"]
    x = node.inputs[0]
    seq_len = x.shape[1 if layout else 0]
    sequence_major = emit.op("Transpose", [x], {"perm": [1, 0, 2]}) if layout else x
    lstm = node.op_type == "LSTM"
    states = [_initial_states(emit, node, index, directions, layout) for index in ((5, 6) if lstm else (5,))]
    clip = _attribute(node, "clip", None)
    outputs = []
    for direction in range(directions):
        if lstm:
            weights = _direction_weights(emit, node, direction, hidden)
            steps = _project_inputs(emit, sequence_major, weights, seq_len)
            outputs.append(_run_direction(emit, steps, weights, states[0][direction], states[1][direction],
                                          reverse[direction], clip))
        else:
            weights = _gru_rnn_weights(emit, node, direction, hidden)
            steps = _project_inputs(emit, sequence_major, weights, seq_len)
            outputs.append(_run_gru_rnn(emit, node.op_type, steps, weights, states[0][direction], reverse[direction],
                                        clip))
    _replace_outputs(graph, node, emit, outputs, layout)


def _initial_states(emit: _Emitter, node: ir.Node, index: int, directions: int, layout: int) -> list:
    value = _input(node, index)
    if value is None:
        return [None] * directions
    return emit.pieces(value, 1 if layout else 0, directions)


@dataclass
class _Weights:
    w_t: ir.Value              # [input, 4H]
    r_t: ir.Value              # [H, 4H]
    bias: ir.Value | None      # [4H] = Wb + Rb
    peepholes: list[ir.Value] | None  # P_i, P_o, P_f, each [H]


def _direction_weights(emit: _Emitter, node: ir.Node, direction: int, hidden: int) -> _Weights:
    w = node.inputs[1].const_value.numpy()[direction]
    r = node.inputs[2].const_value.numpy()[direction]
    bias_value, peephole_value = _input(node, 3), _input(node, 7)
    bias = None
    if bias_value is not None:
        b = bias_value.const_value.numpy()[direction]
        bias = emit.const((b[:4 * hidden] + b[4 * hidden:]).astype(w.dtype), f"B{direction}")
    peepholes = None
    if peephole_value is not None:
        p = peephole_value.const_value.numpy()[direction]
        peepholes = [emit.const(np.ascontiguousarray(p[i * hidden:(i + 1) * hidden]), f"P{direction}_{i}")
                     for i in range(3)]
    return _Weights(emit.const(np.ascontiguousarray(w.T), f"W{direction}"),
                    emit.const(np.ascontiguousarray(r.T), f"R{direction}"), bias, peepholes)


@dataclass
class _GruRnnWeights:
    w_t: ir.Value              # [input, gates * H]
    r_t: ir.Value              # [H, gates * H] (GRU with linear_before_reset = 0: the z and r gates only)
    bias: ir.Value | None      # [gates * H]: what adds to the input projection
    rh_t: ir.Value | None      # GRU, linear_before_reset = 0: [H, H] of the candidate gate
    rbh: ir.Value | None       # GRU, linear_before_reset = 1: [H], added to H @ Rh^T before the reset gate
    linear_before_reset: bool


def _gru_rnn_weights(emit: _Emitter, node: ir.Node, direction: int, hidden: int) -> _GruRnnWeights:
    """GRU gates z, r, h (ONNX order) or the one RNN gate; the biases that add to ``X @ W^T`` folded into one."""
    w = node.inputs[1].const_value.numpy()[direction]
    r = node.inputs[2].const_value.numpy()[direction]
    gates = w.shape[0] // hidden
    before_reset = bool(_attribute(node, "linear_before_reset", 0)) and node.op_type == "GRU"
    bias_value = _input(node, 3)
    b = bias_value.const_value.numpy()[direction] if bias_value is not None else np.zeros(2 * gates * hidden, w.dtype)
    wb, rb = b[:gates * hidden], b[gates * hidden:]
    folded = wb + rb
    rbh = None
    if before_reset:  # Rbh sits inside r * (H @ Rh^T + Rbh)
        folded = np.concatenate([folded[:2 * hidden], wb[2 * hidden:]])
        rbh = emit.const(np.ascontiguousarray(rb[2 * hidden:]), f"Rbh{direction}")
    bias = emit.const(folded.astype(w.dtype), f"B{direction}") if bias_value is not None or rbh is not None else None
    if node.op_type == "GRU" and not before_reset:  # r multiplies H before Rh: a separate MatMul
        return _GruRnnWeights(emit.const(np.ascontiguousarray(w.T), f"W{direction}"),
                              emit.const(np.ascontiguousarray(r[:2 * hidden].T), f"R{direction}"), bias,
                              emit.const(np.ascontiguousarray(r[2 * hidden:].T), f"Rh{direction}"), None, False)
    return _GruRnnWeights(emit.const(np.ascontiguousarray(w.T), f"W{direction}"),
                          emit.const(np.ascontiguousarray(r.T), f"R{direction}"), bias, None, rbh, before_reset)


def _run_gru_rnn(emit: _Emitter, op_type: str, steps: list[ir.Value], weights: _GruRnnWeights, h: ir.Value | None,
                 reverse: bool, clip: float | None) -> tuple[list, ir.Value, None]:
    """The GRU or RNN cell over the sequence; returns (H per position, last H, no cell state)."""
    hidden_states: list[ir.Value | None] = [None] * len(steps)
    for t in (reversed(range(len(steps))) if reverse else range(len(steps))):
        h = _gru_cell(emit, steps[t], weights, h, clip) if op_type == "GRU" else _rnn_cell(emit, steps[t], weights, h,
                                                                                             clip)
        hidden_states[t] = h
    return hidden_states, h, None


def _rnn_cell(emit: _Emitter, projected: ir.Value, weights: _GruRnnWeights, h, clip):
    """One RNN step: ``tanh(X W^T + Wb + Rb + H R^T)``."""
    if h is not None:
        projected = emit.op("Add", [projected, emit.op("MatMul", [h, weights.r_t])])
    return _activate(emit, "Tanh", projected, clip)


def _gru_cell(emit: _Emitter, projected: ir.Value, weights: _GruRnnWeights, h, clip):
    """One GRU step (ONNX gate order z, r, h); ``H' = (1 - z) * candidate + z * H``."""
    xz, xr, xh = emit.split(projected, -1, 3)
    if h is None:  # the initial state is zero: every H @ R^T term vanishes
        z, r = _activate(emit, "Sigmoid", xz, clip), _activate(emit, "Sigmoid", xr, clip)
        inner = xh if weights.rbh is None else emit.op("Add", [xh, emit.op("Mul", [r, weights.rbh])])
        candidate = _activate(emit, "Tanh", inner, clip)
        one = emit.const(np.array(1.0, dtype=np.float32), f"one{len(emit.nodes)}")
        return emit.op("Mul", [emit.op("Sub", [one, z]), candidate])
    recurrent = emit.op("MatMul", [h, weights.r_t])
    if weights.linear_before_reset:
        hz, hr, hh = emit.split(recurrent, -1, 3)
        if weights.rbh is not None:
            hh = emit.op("Add", [hh, weights.rbh])
    else:
        hz, hr = emit.split(recurrent, -1, 2)
    z = _activate(emit, "Sigmoid", emit.op("Add", [xz, hz]), clip)
    r = _activate(emit, "Sigmoid", emit.op("Add", [xr, hr]), clip)
    if weights.linear_before_reset:
        inner = emit.op("Add", [xh, emit.op("Mul", [r, hh])])
    else:
        inner = emit.op("Add", [xh, emit.op("MatMul", [emit.op("Mul", [r, h]), weights.rh_t])])
    candidate = _activate(emit, "Tanh", inner, clip)
    return emit.op("Add", [candidate, emit.op("Mul", [z, emit.op("Sub", [h, candidate])])])


def _project_inputs(emit: _Emitter, x: ir.Value, weights: _Weights | _GruRnnWeights, seq_len: int) -> list[ir.Value]:
    """``X @ W^T + (Wb + Rb)`` for all steps at once, then one ``[batch, 4H]`` piece per step."""
    projected = emit.op("MatMul", [x, weights.w_t])
    if weights.bias is not None:
        projected = emit.op("Add", [projected, weights.bias])
    return emit.pieces(projected, 0, seq_len)


def _run_direction(emit: _Emitter, steps: list[ir.Value], weights: _Weights, h: ir.Value | None,
                   c: ir.Value | None, reverse: bool, clip: float | None) -> tuple[list, ir.Value, ir.Value]:
    """The cell over the sequence; returns (H per position, last H, last C)."""
    hidden_states: list[ir.Value | None] = [None] * len(steps)
    for t in (reversed(range(len(steps))) if reverse else range(len(steps))):
        h, c = _cell(emit, steps[t], weights, h, c, clip)
        hidden_states[t] = h
    return hidden_states, h, c


def _cell(emit: _Emitter, gates: ir.Value, weights: _Weights, h, c, clip):
    """One LSTM step (ONNX gate order i, o, f, c)."""
    if h is not None:
        gates = emit.op("Add", [gates, emit.op("MatMul", [h, weights.r_t])])
    i, o, f, candidate = emit.split(gates, -1, 4)
    peep = weights.peepholes
    if peep is not None and c is not None:
        i = emit.op("Add", [i, emit.op("Mul", [c, peep[0]])])
        f = emit.op("Add", [f, emit.op("Mul", [c, peep[2]])])
    i, f = _activate(emit, "Sigmoid", i, clip), _activate(emit, "Sigmoid", f, clip)
    cell = emit.op("Mul", [i, _activate(emit, "Tanh", candidate, clip)])
    if c is not None:
        cell = emit.op("Add", [emit.op("Mul", [f, c]), cell])
    if peep is not None:
        o = emit.op("Add", [o, emit.op("Mul", [cell, peep[1]])])
    hidden = emit.op("Mul", [_activate(emit, "Sigmoid", o, clip), emit.op("Tanh", [cell])])
    return hidden, cell


def _activate(emit: _Emitter, op_type: str, value: ir.Value, clip: float | None) -> ir.Value:
    if clip is not None:  # the spec clips the input of the gate activations
        dtype = value.dtype.numpy() if value.dtype is not None else np.float32
        low = emit.const(np.array(-clip, dtype=dtype), f"clip_low{len(emit.nodes)}")
        high = emit.const(np.array(clip, dtype=dtype), f"clip_high{len(emit.nodes)}")
        value = emit.op("Clip", [value, low, high])
    return emit.op(op_type, [value])


def _replace_outputs(graph: ir.Graph, node: ir.Node, emit: _Emitter, outputs: list, layout: int) -> None:
    """Y ``[seq, dirs, batch, H]`` (layout 1: ``[batch, seq, dirs, H]``), Y_h and Y_c ``[dirs, batch, H]``."""
    direction_axis = 1 if layout else 0
    builders = [
        lambda: _sequence_output(emit, outputs, layout),
        lambda: emit.concat([emit.op("Unsqueeze", [h, emit.axes(direction_axis)]) for _, h, _ in outputs],
                            direction_axis),
        lambda: emit.concat([emit.op("Unsqueeze", [c, emit.axes(direction_axis)]) for _, _, c in outputs],
                            direction_axis),
    ]
    old_values, new_values = [], []
    for value, build in zip(node.outputs, builders):
        if value.uses() or value.is_graph_output():
            old_values.append(value)
            new_values.append(build())
    ir.convenience.replace_nodes_and_values(graph, node, [node], emit.nodes, old_values, new_values)


def _sequence_output(emit: _Emitter, outputs: list, layout: int) -> ir.Value:
    step_axis, direction_axis = (1, 2) if layout else (0, 1)
    per_step = []
    for t in range(len(outputs[0][0])):
        hidden = [emit.op("Unsqueeze", [states[t], emit.axes(step_axis, direction_axis)]) for states, _, _ in outputs]
        per_step.append(emit.concat(hidden, direction_axis))
    return emit.concat(per_step, step_axis)
