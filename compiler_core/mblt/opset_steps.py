"""Opset upgrades done on the protobuf without the ONNX C API, where they are the C API's own result.

``onnx.version_converter`` walks the model opset by opset and, at each step where an op's schema
changes, applies the adapter registered for that op and step. Most adapters only restamp the opset
(``CompatibleAdapter``: the new version widens the types or adds an attribute whose default is the
old behaviour); a few rewrite the node. :func:`convert_natively` upgrades a flat graph in Python
when every step of every node is one of those restamps or one of the adapters written here, doing
to the protobuf what the C++ adapter does:

- ``AxesAttributeToInput`` (ReduceSum/Squeeze/Unsqueeze 12 -> 13, the other Reduce ops 17 -> 18):
  the ``axes`` attribute becomes an int64 ``Constant`` node inserted before the node, read as the
  node's next input;
- ``Softmax_12_13`` (Softmax, LogSoftmax): ``axis`` on the last dimension becomes ``-1``; any other
  axis gets the ``Shape -> Flatten -> op(axis=-1) -> Reshape`` sandwich (the input's rank comes from
  the same non-strict shape inference the C API runs first). With ``last_axis`` the upgrade writes
  ``-1`` without that inference, and the caller keeps it where the strict inference of the result
  shows the axis is the last (:func:`softmax_axes_last`): also where the C API's inference cannot see
  the rank and writes the sandwich, which the parse then cannot always remove (PP-OCR rec kept 6 Reshapes);
- ``BatchNormalization_13_14``: a check only (no training outputs);
- ``Split_17_18``: a Split without a ``split`` input gets ``num_outputs``, its output count;
- ``SetAttribute(layout, 0)``: LSTM, GRU and RNN 13 -> 14.

Any other step returns None and the caller uses the C API. The new nodes are unnamed and the new
values are called ``_v_<n>``, as the C API names them. :data:`COMPATIBLE_STEPS` lists, per op, the
versions (up to 21) whose step from the previous opset is a ``CompatibleAdapter`` registration in
onnx 1.23's ``onnx/version_converter/convert.h``; tests compare the result with the C API's.
"""

from __future__ import annotations

import functools
import logging

import onnx

logger = logging.getLogger(__name__)

COMPATIBLE_STEPS: dict[str, tuple[int, ...]] = {
    "Abs": (13,),
    "Add": (13, 14),
    "ArgMax": (11, 12, 13),
    "ArgMin": (11, 12, 13),
    "AveragePool": (7, 10, 11, 19),
    "BatchNormalization": (12, 15),
    "Cast": (9, 13, 19, 21),
    "CastLike": (19, 21),
    "Ceil": (13,),
    "Clip": (12, 13),
    "Compress": (11,),
    "Concat": (11, 13),
    "Constant": (9, 11, 12, 13, 19, 21),
    "ConstantOfShape": (20, 21),
    "Conv":
    (11,),
    "ConvTranspose": (11,),
    "CumSum": (14,),
    "DepthToSpace": (11, 13),
    "DequantizeLinear": (13, 19, 21),
    "Div": (13, 14),
    "Dropout": (10, 13),
    "Equal": (11, 13, 19),
    "Erf": (13,),
    "Exp": (13,),
    "Expand": (13,),
    "Flatten": (9, 11, 13, 21),
    "Floor": (13,),
    "Gather": (11, 13),
    "GatherElements": (13,),
    "GatherND": (12, 13),
    "Gemm": (6, 9, 11, 13),
    "Greater": (9, 13),
    "GreaterOrEqual": (16,),
    "GroupNormalization": (21,),
    "Hardmax":
    (11, 13),
    "Identity": (13, 14, 16, 19, 21),
    "If": (11, 13, 16, 19, 21),
    "IsInf": (20,),
    "IsNaN": (13, 20),
    "LRN": (13,),
    "LeakyRelu": (16,),
    "Less": (9, 13),
    "LessOrEqual": (16,),
    "Log": (13,),
    "LogSoftmax": (11,),
    "Loop": (11, 13, 16, 19, 21),
    "LpPool": (11,),
    "MatMul": (9, 13),
    "Max": (8, 12, 13),
    "MaxPool": (8, 10, 11,
    12),
    "MaxUnpool": (11,),
    "Mean": (8, 13),
    "MeanVarianceNormalization": (13,),
    "Min": (8, 12, 13),
    "Mod": (13,),
    "Mul": (13, 14),
    "Neg": (13,),
    "NegativeLogLikelihoodLoss": (13,),
    "NonMaxSuppression": (11,),
    "NonZero": (13,),
    "OneHot": (11,),
    "OptionalGetElement": (18,),
    "OptionalHasElement": (18,),
    "PRelu": (7, 9, 16),
    "Pad": (13, 18,
    19, 21),
    "Pow": (12, 13, 15),
    "QLinearMatMul": (21,),
    "QuantizeLinear": (13, 19, 21),
    "Reciprocal": (13,),
    "ReduceL1": (11, 13),
    "ReduceL2": (11, 13),
    "ReduceLogSum": (11, 13),
    "ReduceLogSumExp": (11, 13),
    "ReduceMax":
    (11, 12, 13, 20),
    "ReduceMean": (11, 13),
    "ReduceMin": (11, 12, 13, 20),
    "ReduceProd": (11, 13),
    "ReduceSum":
    (11,),
    "ReduceSumSquare": (11, 13),
    "Relu": (13, 14),
    "Reshape": (13, 14, 19, 21),
    "Resize": (13, 18, 19),
    "Scan": (11, 16, 19, 21),
    "ScatterElements": (13, 16, 18),
    "ScatterND": (13, 16, 18),
    "Shape": (13, 15, 19, 21),
    "Sigmoid": (13,),
    "Sign": (13,),
    "Size": (13, 19, 21),
    "Slice": (11, 13),
    "Softmax": (11,),
    "SoftmaxCrossEntropyLoss": (13,),
    "SpaceToDepth": (13,),
    "Split": (11,),
    "Sqrt": (13,),
    "Squeeze": (11, 21),
    "Sub": (13, 14),
    "Sum": (8, 13),
    "Tanh": (13,),
    "Tile": (13,),
    "TopK": (11,),
    "Transpose": (13, 21),
    "Unsqueeze": (11, 21),
    "Where": (16,),
}
"""Op -> versions whose upgrade step from the previous opset only restamps the node (onnx 1.23's ``convert.h``)."""

_AXES_TO_INPUT = {"ReduceSum": 13, "Squeeze": 13, "Unsqueeze": 13, "ReduceL1": 18, "ReduceL2": 18, "ReduceLogSum": 18,
                  "ReduceLogSumExp": 18, "ReduceMax": 18, "ReduceMean": 18, "ReduceMin": 18, "ReduceProd": 18,
                  "ReduceSumSquare": 18}
"""Op -> the version at which ``axes`` moves from an attribute to an input (the ``AxesAttributeToInput`` steps)."""
_SOFTMAX_OPS = ("Softmax", "LogSoftmax")
_GRAPH_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_RECURRENT_OPS = ("LSTM", "GRU", "RNN")


@functools.cache
def _steps(op_type: str, source: int, target: int) -> list[int] | None:
    """The versions in (source, target] at which the op's schema changes, or None for an unknown op.

    Found by walking down from ``target`` with ``onnx.defs.get_schema`` (the newest schema at or below a
    version), a few look-ups per op type: listing every schema's history instead took 10 ms per process.
    """
    if not onnx.defs.has(op_type, ""):
        return None
    steps = []
    version = target
    while version > source:
        try:
            since = onnx.defs.get_schema(op_type, version, "").since_version
        except onnx.defs.SchemaError:  # no schema at or below ``version``: the op is newer
            break
        if since > source:
            steps.append(since)
        version = since - 1
    return steps[::-1]


def _plan(node: onnx.NodeProto, source: int, target: int) -> tuple[tuple[int, str], ...] | None:
    """The (version, adapter) steps the upgrade applies to ``node`` (adapters ``axes``, ``softmax``, ``num_outputs``,
    ``layout``), or None if one is not written here: the same for every node of an op type (a BatchNormalization's
    also depends on whether it has its training outputs), so worked out once per kind of node and upgrade."""
    return _plan_of(node.op_type, node.op_type == "BatchNormalization" and len(node.output) < 4, source, target)


@functools.cache
def _plan_of(op_type: str, inference_batchnorm: bool, source: int, target: int) -> tuple[tuple[int, str], ...] | None:
    steps = _steps(op_type, source, target)
    if steps is None:
        return None
    adapters = []
    compatible = COMPATIBLE_STEPS.get(op_type, ())
    for version in steps:
        if version in compatible:
            continue
        if _AXES_TO_INPUT.get(op_type) == version:
            adapters.append((version, "axes"))
        elif op_type in _SOFTMAX_OPS and version == 13:
            adapters.append((version, "softmax"))
        elif inference_batchnorm and version == 14:
            continue
        elif op_type == "Split" and version == 18:
            adapters.append((version, "num_outputs"))
        elif op_type in _RECURRENT_OPS and version == 14:
            adapters.append((version, "layout"))
        else:
            return None
    return tuple(adapters)


def convert_natively(proto: onnx.ModelProto, target_version: int, *,
                     last_axis: bool = False) -> onnx.ModelProto | None:
    """The C API's upgrade of a flat, default-domain model to ``target_version``, or None where it is not written here.

    ``proto`` is left as it is; the result is a new model (the caller has set large weights aside, so the copy is
    small).

    ``last_axis``: upgrade every Softmax/LogSoftmax as if its axis were its input's last dimension (``axis = -1``, no
    sandwich), without the shape inference that finds the input ranks. That is the C API's result wherever its
    inference knows the rank and the axis is the last one; the caller confirms it on the upgraded model's strict
    inference with :func:`softmax_axes_last` (which also knows ranks the C API's non-strict inference misses, such as
    PP-OCR cls's Softmax after a Reshape to a computed shape: the C API writes the sandwich there).
    """
    graph = proto.graph
    default = [entry for entry in proto.opset_import if entry.domain in ("", "ai.onnx")]
    if len(default) != 1 or not 1 <= default[0].version <= target_version or proto.functions:
        return None
    source = default[0].version
    plans = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            return None
        for attribute in node.attribute:
            if attribute.type in _GRAPH_TYPES:
                return None
        plan = _plan(node, source, target_version)
        if plan is None:
            return None
        plans.append(plan)
    ranks = _LAST_AXIS if last_axis else _softmax_input_ranks(proto, plans)
    if ranks is None:
        return None
    converted = onnx.ModelProto()
    converted.CopyFrom(proto)
    for entry in converted.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.domain, entry.version = entry.domain, target_version  # the C API writes the domain even if empty
    if any(plans) and not _adapt_nodes(converted, plans, ranks):
        return None
    return converted


class _LastAxis(dict):
    """Ranks for :func:`_softmax_12_13` under ``last_axis``: every Softmax input's rank is unknown (None)."""

    def __missing__(self, name: str) -> None:
        return None


_LAST_AXIS = _LastAxis()


def softmax_axes_last(source: onnx.ModelProto, inferred: onnx.ModelProto | None, target_version: int) -> bool:
    """True if every Softmax/LogSoftmax that the upgrade of ``source`` adapts reads, in ``inferred`` (its upgrade under
    ``last_axis`` with the shapes inferred; None when inference failed), an input of known rank whose last dimension
    is the source node's axis: then ``axis = -1`` is the node's meaning in the new opset (opset 13 normalizes over
    that one axis, as the old opsets did over the flattened dimensions from ``axis`` on). True when none is adapted."""
    default = next(entry.version for entry in source.opset_import if entry.domain in ("", "ai.onnx"))
    if not default < 13 <= target_version:
        return True
    axes = {node.input[0]: next((a.i for a in node.attribute if a.name == "axis"), 1)
            for node in source.graph.node if node.op_type in _SOFTMAX_OPS}
    if not axes:
        return True
    if inferred is None:
        return False
    graph = inferred.graph
    ranks = {info.name: len(info.type.tensor_type.shape.dim)
             for info in (*graph.input, *graph.value_info, *graph.output)
             if info.name in axes and info.type.tensor_type.HasField("shape")}
    return all(name in ranks and (axis if axis >= 0 else axis + ranks[name]) == ranks[name] - 1
               for name, axis in axes.items())


def _softmax_input_ranks(proto: onnx.ModelProto, plans: list[tuple[tuple[int, str], ...]]) -> dict[str, int] | None:
    """Input name -> rank for every Softmax the upgrade adapts, as the C API sees it after its first, non-strict
    inference: 0 where no shape is known (the C++ adapter reads an empty size list then); None if inference fails."""
    names = {node.input[0] for node, plan in zip(proto.graph.node, plans) if any(a == "softmax" for _, a in plan)}
    if not names:
        return {}
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return None
    graph = inferred.graph
    ranks = dict.fromkeys(names, 0)
    for info in (*graph.input, *graph.value_info, *graph.output):
        if info.name in names and info.type.tensor_type.HasField("shape"):
            ranks[info.name] = len(info.type.tensor_type.shape.dim)
    return ranks


class _ValueNames:
    """The C++ IR's names for new values: ``_v_<n>``, ``n`` counting every value created since the import.

    The import creates one value for the empty name, one per graph input, one per initializer that is not an input
    (IR >= 4) and one per node output (empty optional outputs included); each adapter's new node adds its outputs.
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        self._model = model
        self._next: int | None = None  # counted, with the names in use, when the first new value is named
        self._taken: set[str] = set()
        self.clash = False

    def _count(self) -> int:
        graph = self._model.graph
        inputs = {info.name for info in graph.input}
        separate = sum(1 for t in graph.initializer if t.name not in inputs) if self._model.ir_version >= 4 else 0
        self._taken = {name for node in graph.node for name in (*node.input, *node.output)} | inputs
        self._taken |= {info.name for info in graph.output} | {t.name for t in graph.initializer}
        return 2 + len(graph.input) + separate + sum(len(node.output) for node in graph.node)

    def __call__(self) -> str:
        """The next value's name (a value named by the adapter itself still takes its number)."""
        if self._next is None:
            self._next = self._count()
        name = f"_v_{self._next}"
        self._next += 1
        self.clash |= name in self._taken
        return name


def _adapt_nodes(model: onnx.ModelProto, plans: list[tuple[tuple[int, str], ...]], ranks: dict[str, int]) -> bool:
    """Rewrite the nodes whose plan has adapters, inserting the C API's new nodes around them, in the C API's order
    (opset step by opset step, nodes in graph order); False if a new value's name is already used (left to the C
    API)."""
    graph = model.graph
    fresh = _ValueNames(model)
    adapted: dict[int, onnx.NodeProto] = {}
    before: dict[int, list[onnx.NodeProto]] = {}
    after: dict[int, list[onnx.NodeProto]] = {}
    steps = sorted((version, index, adapter) for index, plan in enumerate(plans) for version, adapter in plan)
    for _, index, adapter in steps:
        node = adapted.get(index)
        if node is None:
            node = adapted[index] = onnx.NodeProto()
            node.CopyFrom(graph.node[index])
        if adapter == "axes":
            before.setdefault(index, []).extend(_axes_to_input(node, fresh))
        elif adapter == "num_outputs":  # Split_17_18: without a split input, the output count is explicit
            if len(node.input) != 2 and not any(a.name == "num_outputs" for a in node.attribute):
                _set_int(node, "num_outputs", len(node.output))
        elif adapter == "layout":  # SetAttribute(layout, 0): the 13 -> 14 step of LSTM, GRU and RNN
            _set_int(node, "layout", 0)
        else:
            sandwich = _softmax_12_13(node, ranks[graph.node[index].input[0]], fresh)
            if sandwich is not None:
                before.setdefault(index, []).extend(sandwich[0])
                after.setdefault(index, []).extend(sandwich[1])
    if fresh.clash:
        return False
    moved = min([*before, *after], default=len(graph.node))  # the nodes before the first insertion stay in place
    for index, node in adapted.items():
        if index < moved:
            graph.node[index].CopyFrom(node)
    if moved == len(graph.node):
        return True
    nodes = onnx.GraphProto()
    for index in range(moved, len(graph.node)):
        node = graph.node[index]
        nodes.node.extend([*before.get(index, ()), adapted.get(index, node), *after.get(index, ())])
    del graph.node[moved:]
    graph.node.extend(nodes.node)
    return True


def _set_int(node: onnx.NodeProto, name: str, value: int) -> None:
    """Set an int attribute as the C++ IR does: in place of an attribute of that name, else after the others."""
    attribute = next((a for a in node.attribute if a.name == name), None)
    if attribute is None:
        attribute = node.attribute.add()
    else:
        attribute.Clear()
    attribute.name, attribute.type, attribute.i = name, onnx.AttributeProto.INT, value


def _axes_to_input(node: onnx.NodeProto, fresh) -> list[onnx.NodeProto]:
    """``AxesAttributeToInput``: the ``axes`` attribute becomes a ``Constant`` input (nothing without the attribute)."""
    index = next((i for i, a in enumerate(node.attribute) if a.name == "axes"), None)
    if index is None:
        return []
    axes = list(node.attribute[index].ints)
    del node.attribute[index]
    constant = onnx.NodeProto(op_type="Constant", output=[fresh()])
    value = constant.attribute.add(name="value", type=onnx.AttributeProto.TENSOR)
    value.t.data_type = onnx.TensorProto.INT64
    value.t.dims.append(len(axes))
    value.t.int64_data.extend(axes)
    node.input.append(constant.output[0])
    return [constant]


def _softmax_12_13(node: onnx.NodeProto, rank: int | None,
                   fresh) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]] | None:
    """``Softmax_12_13``: ``axis = -1`` when the old axis is the last one (taken for granted when ``rank`` is None),
    else the Flatten/Reshape sandwich."""
    attribute = next((a for a in node.attribute if a.name == "axis"), None)
    axis = attribute.i if attribute is not None else 1
    if rank is not None and axis < 0:
        axis += rank
    if attribute is None:
        attribute = node.attribute.add(name="axis", type=onnx.AttributeProto.INT)
    attribute.i = -1
    if rank is None or axis == rank - 1:
        return None
    source, output = node.input[0], node.output[0]
    shape = onnx.NodeProto(op_type="Shape", input=[source], output=[fresh()])
    flatten = onnx.NodeProto(op_type="Flatten", input=[source], output=[fresh()])
    flatten.attribute.add(name="axis", type=onnx.AttributeProto.INT, i=axis)
    node.input[0] = flatten.output[0]
    node.output[0] = f"{output}_intermediate"
    fresh()  # the Reshape's output is a new value too, renamed to the Softmax's old output name
    reshape = onnx.NodeProto(op_type="Reshape", input=[node.output[0], shape.output[0]], output=[output])
    return [shape, flatten], [reshape]
