"""The linear ``ai.onnx.ml`` operators that scikit-learn converters write, as standard ONNX tensor ops.

skl2onnx turns a ``StandardScaler`` into ``Scaler``, a ``LogisticRegression`` or linear SVM into
``LinearClassifier`` (often followed by ``Normalizer``), a linear regression into ``LinearRegressor``, and maps
an MLP's arg-max to its class labels with ``ArrayFeatureExtractor``. Each is a few tensor ops the NPU has
kernels for: ``(x - offset) * scale``; ``MatMul`` + ``Add`` (+ ``Sigmoid``/``Softmax``) with ``ArgMax`` and a
``Gather`` of the class labels; ``x / norm``; a ``Gather`` of a constant table. They are written so at parse
time, computing what onnxruntime computes (``tests/test_ml_ops.py``).

Kept as they are (and refused by the operator check, with the reason in the log): string class labels,
``SOFTMAX_ZERO``/``PROBIT`` post-transforms and weights that are not attributes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

logger = logging.getLogger(__name__)

ML_DOMAIN = "ai.onnx.ml"


def lower_ml_ops(model: ir.Model) -> int:
    """Replace every supported linear ``ai.onnx.ml`` node of the main graph by standard ops; returns how many."""
    graph = model.graph
    count = 0
    for node in list(graph):
        lower = _LOWERINGS.get(node.op_type) if node.domain == ML_DOMAIN else None
        if lower is None:
            continue
        builder = _Builder(graph, node)
        reason = lower(builder, node)
        if reason:
            logger.info("%s %s is kept: %s", node.op_type, node.name, reason)
            continue
        builder.commit()
        count += 1
    if count:
        logger.info("Wrote %d ai.onnx.ml operator(s) (scikit-learn converters) as tensor ops.", count)
    return count


class _Builder:
    """New nodes for one ``ai.onnx.ml`` node, inserted before it; :meth:`commit` hands its outputs over."""

    def __init__(self, graph: ir.Graph, node: ir.Node) -> None:
        self.graph, self.node, self.nodes, self.results = graph, node, [], {}

    def op(self, op_type: str, inputs: list, **attributes) -> ir.Value:
        node = ir.node(op_type, inputs, attributes=attributes, name=f"{self.node.name}_{len(self.nodes)}",
                       metadata_props=dict(self.node.metadata_props))
        self.nodes.append(node)
        return node.outputs[0]

    def const(self, array: np.ndarray, suffix: str) -> ir.Value:
        array = np.ascontiguousarray(array)
        value = ir.Value(name=f"{self.node.name}_{suffix}", shape=ir.Shape(array.shape),
                         type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), const_value=ir.tensor(array))
        self.graph.register_initializer(value)
        return value

    def commit(self) -> None:
        self.graph.insert_before(self.node, self.nodes)
        for index, new in self.results.items():
            old = self.node.outputs[index]
            ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
            name, old.name = old.name, None
            new.name = name
            new.shape, new.type = old.shape, old.type
        self.graph.remove(self.node, safe=True)


def _floats(node: ir.Node, name: str) -> np.ndarray | None:
    attribute = node.attributes.get(name)
    return None if attribute is None else np.asarray(attribute.as_floats(), dtype=np.float32)


def _string(node: ir.Node, name: str, default: str) -> str:
    attribute = node.attributes.get(name)
    return default if attribute is None else attribute.as_string()


def _scaler(builder: _Builder, node: ir.Node) -> str | None:
    offset, scale = _floats(node, "offset"), _floats(node, "scale")
    x = node.inputs[0]
    shifted = builder.op("Sub", [x, builder.const(offset, "offset")]) if offset is not None else x
    builder.results[0] = builder.op("Mul", [shifted, builder.const(scale, "scale")]) if scale is not None else shifted
    return None


def _normalizer(builder: _Builder, node: ir.Node) -> str | None:
    norm = _string(node, "norm", "MAX")
    x = node.inputs[0]
    axes = builder.const(np.array([1], np.int64), "axes")
    if norm == "L2":
        size = builder.op("Sqrt", [builder.op("ReduceSumSquare", [x, axes], keepdims=1)])
    elif norm in ("L1", "MAX"):
        magnitude = builder.op("Abs", [x]) if norm == "L1" else x  # onnxruntime: MAX divides by the signed maximum
        size = builder.op("ReduceSum" if norm == "L1" else "ReduceMax", [magnitude, axes], keepdims=1)
    else:
        return f"norm {norm!r}"
    floor = builder.op("Max", [size, builder.const(np.array(1e-30, np.float32), "floor")])
    builder.results[0] = builder.op("Div", [x, floor])
    return None


def _linear_scores(builder: _Builder, node: ir.Node, rows: int) -> ir.Value | str:
    """``x @ W.T + b`` with the attributes' ``rows`` x features coefficients."""
    coefficients, intercepts = _floats(node, "coefficients"), _floats(node, "intercepts")
    if coefficients is None or coefficients.size % rows:
        return "its coefficients do not match its outputs"
    weights = coefficients.reshape(rows, -1)
    if intercepts is None:
        intercepts = np.zeros(rows, np.float32)
    return weights, intercepts


def _linear_classifier(builder: _Builder, node: ir.Node) -> str | None:
    labels = node.attributes.get("classlabels_ints")
    if labels is None:
        return "string class labels (the label output would be text)"
    labels = np.asarray(labels.as_ints(), dtype=np.int64)
    post = _string(node, "post_transform", "NONE")
    if post not in ("NONE", "LOGISTIC", "SOFTMAX"):
        return f"post_transform {post}"
    coefficients, width = _floats(node, "coefficients"), _input_width(node)
    if coefficients is None or not width:
        return "its input's feature count is not static" if coefficients is not None else "no coefficients"
    rows = coefficients.size // width  # one per class, or one for a binary classifier
    scores = _linear_scores(builder, node, rows)
    if isinstance(scores, str):
        return scores
    weights, intercepts = scores
    if rows == 1 and labels.size == 2:  # binary: the scores are (-s, s)
        weights, intercepts = np.concatenate([-weights, weights]), np.concatenate([-intercepts, intercepts])
    value = builder.op("Add", [builder.op("MatMul", [node.inputs[0], builder.const(weights.T.copy(), "weights")]),
                               builder.const(intercepts, "intercepts")])
    value = {"NONE": value, "LOGISTIC": builder.op("Sigmoid", [value]),
             "SOFTMAX": builder.op("Softmax", [value], axis=1)}[post]
    if node.outputs[0].uses() or node.outputs[0].is_graph_output():
        index = builder.op("ArgMax", [value], axis=1, keepdims=0)
        builder.results[0] = builder.op("Gather", [builder.const(labels, "labels"), index], axis=0)
    builder.results[1] = value
    return None


def _input_width(node: ir.Node) -> int | None:
    """The static feature count of the node's input, looked for through the element-wise ops before it (a Scaler
    lowered just before has no shape yet)."""
    value = node.inputs[0]
    while value is not None:
        if value.shape is not None and value.shape.rank() and isinstance(value.shape[-1], int):
            return value.shape[-1]
        producer = value.producer()
        value = producer.inputs[0] if producer is not None and producer.op_type in _ELEMENTWISE else None
    return None


_ELEMENTWISE = frozenset({"Sub", "Mul", "Add", "Div", "Cast", "Relu", "Identity", "Scaler", "Normalizer"})


def _linear_regressor(builder: _Builder, node: ir.Node) -> str | None:
    post = _string(node, "post_transform", "NONE")
    if post != "NONE":
        return f"post_transform {post}"
    targets = node.attributes.get("targets")
    scores = _linear_scores(builder, node, targets.as_int() if targets is not None else 1)
    if isinstance(scores, str):
        return scores
    weights, intercepts = scores
    builder.results[0] = builder.op("Add", [builder.op("MatMul", [node.inputs[0], builder.const(weights.T.copy(),
                                                                                            "weights")]),
                                            builder.const(intercepts, "intercepts")])
    return None


def _array_feature_extractor(builder: _Builder, node: ir.Node) -> str | None:
    data = node.inputs[0].const_value
    if data is None:
        return "its data is computed at run time"
    flat = builder.op("Reshape", [node.inputs[1], builder.const(np.array([-1], np.int64), "flat")])
    if data.shape.rank() == 1:  # onnxruntime's shape: one row
        picked = builder.op("Gather", [node.inputs[0], flat], axis=0)
        builder.results[0] = builder.op("Reshape", [picked, builder.const(np.array([1, -1], np.int64), "row")])
    else:
        builder.results[0] = builder.op("Gather", [node.inputs[0], flat], axis=-1)
    return None


_LOWERINGS: dict[str, Callable[[_Builder, ir.Node], str | None]] = {
    "Scaler": _scaler,
    "Normalizer": _normalizer,
    "LinearClassifier": _linear_classifier,
    "LinearRegressor": _linear_regressor,
    "ArrayFeatureExtractor": _array_feature_extractor,
}
