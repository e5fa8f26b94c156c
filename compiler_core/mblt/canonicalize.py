"""Canonicalization: any loaded ONNX graph -> the canonical MBLT graph (DESIGN section 5).

The order of the steps matters (see notes/onnx-canonicalization.md): shapes are pinned and stale
shapes cleared before version conversion, constants are lifted before the optimizer so that the
Conv+BatchNorm fusion can fire, and the result is checked before anything is written.
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import _c_api_utils
from onnx_ir.passes.common import shape_inference as ir_shape_inference
from onnxscript.rewriter import RewriteRuleSet, _rewrite_rule
from onnxscript.rewriter.rules import common as common_rules
from onnxscript.rewriter.rules.fusion._layer_norm import layer_normalization_rules
from onnxscript.utils import metadata_merger

from compiler_core.errors import (
    ArgumentError,
    DynamicShapeError,
    InternalError,
    InvalidModelError,
    UnsupportedOpsError,
)
from compiler_core.frontends.onnx import CheckedModelProto
from compiler_core.mblt import opset
from compiler_core.mblt.conversion import convert_source_proto_weights_apart, convert_version
from compiler_core.mblt.cut import (
    cut_at_outputs,
    keep_outputs_hint,
    outer_reads,
    outputs_clear_of,
    outputs_clear_of_proto,
    refuse_data_dependent_ops,
)
from compiler_core.mblt.dynamic_quant import DYNAMIC_QUANT_OPS, dequantize_dynamic
from compiler_core.mblt.einsum import lower_einsums
from compiler_core.mblt.io import check_model
from compiler_core.mblt.loops import unroll_static_loops
from compiler_core.mblt.ml_ops import lower_ml_ops
from compiler_core.mblt.naming import assign_canonical_names
from compiler_core.mblt.precision import WIDENED, compute_in_float32
from compiler_core.mblt.recurrent import decompose_recurrent
from compiler_core.mblt.rule_index import (
    FUSED_BIASES,
    LiftConstants,
    RemoveUnusedNodes,
    RemoveUnusedOpsets,
    TopologicalSort,
    all_nodes,
    apply_rules,
    default_rules,
    fuse_batchnorms_proto,
    give_fused_biases,
    holds_graph,
    indexed_rule_set,
    merge_equal_weights,
    optimize,
    read_once,
)
from compiler_core.mblt.rules import EXACT_NO_OP_RULES, MBLT_REWRITE_RULES
from compiler_core.ops import canonical_op_types
from compiler_core.progress import Reporter, as_reporter

logger = logging.getLogger(__name__)

SOURCE_NAME_KEY = "mblt.source_name"
VERIFY_STAGE = "verify"
CHECKED_PROTO = "mblt.checked_proto"
"""``model.meta`` key of the checker's protobuf that ``canonicalize(..., keep_checked=True)`` keeps."""
"""The ``stage`` field of the error raised when the canonical graph fails ONNX's checker."""
# A node fused from several keeps every source name ("conv1, bn1"); onnxscript exposes no public
# hook for per-key mergers yet, so register ours on its default merger.
_rewrite_rule._default_metadata_merger.mergers[SOURCE_NAME_KEY] = metadata_merger.comma_separator_merger

_FOLDER_LOGGER = "onnxscript.optimizer._constant_folding"
_FOLD_SIZE_LIMIT = 1 << 26  # elements; weights of real models must fold (PP-OCR keeps them in Constants)


def canonicalize(
    model: onnx.ModelProto | ir.Model | CheckedModelProto,
    *,
    input_shape_dict: Mapping[str, Sequence[int]] | None = None,
    constant_inputs: Mapping[str, np.ndarray] | None = None,
    output_names: Sequence[str] | None = None,
    reporter: Reporter | None = None,
    keep_checked: bool = False,
) -> ir.Model:
    """Turn a loaded ONNX model into a canonical MBLT graph, in memory.

    Args:
        model: The source model (protobuf, onnx-ir, or the ONNX frontend's checked protobuf); an onnx-ir model is
            modified in place.
        input_shape_dict: Static shapes for inputs with dynamic dimensions, by input name.
        constant_inputs: Inputs to bind to constant values (e.g. a sample-rate selector).
        output_names: Tensors to make the graph's outputs, cutting away what only the other outputs need
            (post-processing such as NonMaxSuppression); ``None`` keeps the model's outputs.
        reporter: Progress and cancellation.
        keep_checked: Keep what ONNX's checker saw in ``model.meta[CHECKED_PROTO]`` (a
            :class:`~compiler_core.mblt.io.CheckedProto`, for :func:`~compiler_core.mblt.io.write_mblt` to reuse).

    Returns:
        The canonical model: opset 21, static shapes, folded, topologically sorted, named.

    Raises:
        UnsupportedOpsError: ops unknown to ONNX or outside the MBLT op set remain.
        DynamicShapeError: a dynamic dimension could not be pinned.
        InvalidModelError: the graph fails ONNX's checker or type inference.
    """
    reporter = as_reporter(reporter)
    if isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    source_inference: list[InvalidModelError] = []  # the pinned source's own inference failure, if any
    inferred = [False]  # the shapes were inferred with the opset conversion (the protobuf path)
    steps = [
        ("record source names", lambda m: _record_source_names(m)),
        ("cut at outputs", lambda m: (cut_at_outputs(m, output_names or ()), _note_tail_cut(m))),
        ("refuse data-dependent ops", refuse_data_dependent_ops),
        ("read dynamic quantization as float", dequantize_dynamic),
        ("write scikit-learn operators as tensor ops", lower_ml_ops),
        ("check operators", _check_known_ops),
        ("initializer inputs to constants", _initializer_inputs_to_constants),
        ("pin input shapes", lambda m: _pin_inputs(m, input_shape_dict or {})),
        ("bind constant inputs", lambda m: _bind_constant_inputs(m, constant_inputs or {})),
        ("compute in float32", compute_in_float32),
        ("convert to opset 21", _convert_opset),
        ("lift constants", lambda m: source_inference.extend(filter(None, [_lift_constants(m, infer=not inferred[0])]))),
        ("optimize", _optimize),
        ("legalize", _legalize),
        ("tidy", _tidy),
        ("verify", lambda m: _verify(m, source_inference[0] if source_inference else None, keep_checked)),
    ]
    with reporter.stage("canonicalize", total=len(steps)), frozen_heap():
        done = 0
        if isinstance(model, CheckedModelProto):
            converted = _steps_on_proto(model, input_shape_dict or {}, constant_inputs or {}, output_names or (),
                                        [name for name, _ in steps[:_PROTO_STEPS]], reporter)
            if converted is not None:
                model, inferred[0] = converted
                done = _PROTO_STEPS
            else:
                model = model.to_ir()
                read_once(model.graph)
        for name, step in steps[done:]:
            step(model)
            reporter.advance(message=name)
    return model


# -- the first steps on the source protobuf ----------------------------------------------------------

_PROTO_STEPS = 11
"""The steps up to the opset conversion, which :func:`_steps_on_proto` can do on the source protobuf."""


def _steps_on_proto(source: CheckedModelProto, input_shape_dict: Mapping[str, Sequence[int]],
                    constant_inputs: Mapping[str, np.ndarray], output_names: Sequence[str], names: list[str],
                    reporter: Reporter) -> tuple[ir.Model, bool] | None:
    """The steps before the optimizer on a source that needs the ONNX C API opset conversion, done on its protobuf.

    The C API converts protobuf: the steps on onnx-ir would deserialize the source, serialize it for the
    conversion, deserialize the result and serialize it again for shape inference. Here the source names,
    the operator check, pinned shapes and bound constants are written into the protobuf as the onnx-ir
    steps write them, the conversion runs on it, followed by ONNX's strict inference, and the result is
    deserialized once, with its shapes. Only a plain graph takes this path (standard-domain nodes, no
    subgraphs, no functions, tensor types only), where the cut at outputs, the data-dependent-op check and the
    float32 retyping have nothing to do (no ``output_names``, no such op, float32 or integer tensors only);
    anything else returns None, untouched, for the onnx-ir steps.

    Returns:
        The converted model and whether its shapes were inferred, or None.

    Raises:
        The errors of the onnx-ir steps, in the same order.
    """
    proto = source.proto
    if output_names or not _plain_old_opset_graph(proto):
        return None
    graph = proto.graph
    source_names = _record_source_names_proto(proto)
    steps = iter(names)
    reporter.advance(message=next(steps))  # record source names
    reporter.advance(message=next(steps))  # cut at outputs: no output names
    reporter.advance(message=next(steps))  # refuse data-dependent ops: none (see _plain_old_opset_graph)
    reporter.advance(message=next(steps))  # read dynamic quantization: none (see _plain_old_opset_graph)
    reporter.advance(message=next(steps))  # scikit-learn operators: none (standard-domain nodes only)
    _check_known_ops_proto(proto, source_names)
    reporter.advance(message=next(steps))
    _initializer_inputs_to_constants_proto(proto)
    reporter.advance(message=next(steps))
    _pin_inputs_proto(graph, input_shape_dict)
    reporter.advance(message=next(steps))
    _bind_constant_inputs_proto(graph, constant_inputs)
    reporter.advance(message=next(steps))
    reporter.advance(message=next(steps))  # compute in float32: float32 already
    model, inferred = _convert_opset_proto(source)
    reporter.advance(message=next(steps))
    return model, inferred


def _plain_old_opset_graph(proto: onnx.ModelProto) -> bool:
    """True for a model the proto path handles: an opset only the C API converts, a flat graph of standard ops."""
    opsets = {entry.domain: entry.version for entry in proto.opset_import}
    current = opsets.get("")
    if current is None or current == opset.MBLT_OPSET_VERSION or _onnxscript_converts(current):
        return False
    graph = proto.graph
    infos = (*graph.input, *graph.output, *graph.value_info)
    return (not proto.functions and not graph.sparse_initializer and _plain_nodes(graph)
            and all(info.type.HasField("tensor_type") and info.type.tensor_type.elem_type not in _WIDENED_CODES
                    for info in infos)
            and all(tensor.data_type not in _WIDENED_CODES for tensor in graph.initializer))


def _plain_nodes(graph: onnx.GraphProto) -> bool:
    """Every node is a standard op that is not data-dependent or dynamically quantized, with no subgraph and no
    float16/bfloat16/float64 attribute (loops, not generators: one pass over hundreds of nodes per parse)."""
    for node in graph.node:
        if node.domain != "" or node.op_type in opset.DATA_DEPENDENT_OPS or node.op_type in DYNAMIC_QUANT_OPS:
            return False
        for attribute in node.attribute:
            if attribute.type in _PROTO_GRAPH_TYPES or _widened_attribute(attribute):
                return False
    return True


_PROTO_GRAPH_TYPES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_WIDENED_CODES = frozenset(int(dtype) for dtype in WIDENED)


def _widened_attribute(attribute: onnx.AttributeProto) -> bool:
    """True if the attribute holds a float16/bfloat16/float64 tensor or names such a type (``Cast.to``)."""
    if attribute.type == onnx.AttributeProto.TENSOR:
        return attribute.t.data_type in _WIDENED_CODES
    if attribute.type == onnx.AttributeProto.TENSORS:
        return any(tensor.data_type in _WIDENED_CODES for tensor in attribute.tensors)
    return attribute.type == onnx.AttributeProto.INT and attribute.name in ("to", "dtype") \
        and attribute.i in _WIDENED_CODES


def _onnxscript_converts(version: int) -> bool:
    from onnxscript.version_converter import _version_converter

    return (_version_converter.SUPPORTED_MIN_ONNX_OPSET <= version <= opset.MBLT_OPSET_VERSION
            <= _version_converter.SUPPORTED_MAX_ONNX_OPSET)


def _record_source_names_proto(proto: onnx.ModelProto) -> list[str]:
    """:func:`_record_source_names` on the protobuf; returns each node's source name."""
    proto.ir_version = max(proto.ir_version or 0, opset.MBLT_IR_VERSION)
    names = []
    for index, node in enumerate(proto.graph.node):
        recorded = [entry.value for entry in node.metadata_props if entry.key == SOURCE_NAME_KEY] \
            if node.metadata_props else ()
        if recorded:
            names.append(recorded[-1])
        else:
            fallback = node.output[0] if node.output and node.output[0] else node.op_type
            entry = node.metadata_props.add()
            entry.key, entry.value = SOURCE_NAME_KEY, node.name or fallback
            names.append(entry.value)
        node.name = f"n{index}"
    return names


def _check_known_ops_proto(proto: onnx.ModelProto, source_names: list[str]) -> None:
    """:func:`_check_known_ops` on the protobuf (standard-domain nodes only)."""
    version = next(entry.version for entry in proto.opset_import if entry.domain == "")
    unknown: dict[str, list[str]] = {}
    known: dict[str, bool] = {}
    offending: list[int] = []
    for index, (node, name) in enumerate(zip(proto.graph.node, source_names)):
        if node.op_type not in known:
            known[node.op_type] = _schema_exists(node.op_type, version, "")
        if not known[node.op_type]:
            unknown.setdefault(node.op_type, []).append(name)
            offending.append(index)
    if unknown:
        raise unsupported_ops_error(unknown, "no ONNX definition (custom or unknown operator)",
                                    outputs_clear_of_proto(proto.graph, set(offending)), len(proto.graph.output))


def _initializer_inputs_to_constants_proto(proto: onnx.ModelProto) -> None:
    """:func:`_initializer_inputs_to_constants` on the protobuf."""
    graph = proto.graph
    initializers = {tensor.name for tensor in graph.initializer}
    listed = [info.name for info in graph.input if info.name in initializers]
    _remove_inputs(graph, set(listed))
    if listed:
        logger.info("%d graph input(s) also have initializers (an IR version %s export convention); "
                    "compiled as constants, e.g. %s", len(listed), proto.ir_version, ", ".join(listed[:3]))


def _remove_inputs(graph: onnx.GraphProto, names: set[str]) -> None:
    for index in reversed([i for i, info in enumerate(graph.input) if info.name in names]):
        del graph.input[index]


def _pin_inputs_proto(graph: onnx.GraphProto, input_shape_dict: Mapping[str, Sequence[int]]) -> None:
    """:func:`_pin_inputs` on the protobuf: the same checks, shapes written as onnx-ir serializes them."""
    names = {info.name for info in graph.input}
    unknown = sorted(set(input_shape_dict) - names)
    if unknown:
        raise ArgumentError(
            f"input_shape_dict names input(s) the model does not have: {', '.join(unknown)}.",
            hint=f"The model's inputs are: {', '.join(sorted(names))}.")
    for info in graph.input:
        shape = _pinned_shape(ir.serde.deserialize_value_info_proto(info, None), input_shape_dict.get(info.name))
        _write_dims(info.type.tensor_type, [int(dim) for dim in shape.dims])
    produced = {name for node in graph.node for name in node.output if name}
    for info in (*graph.value_info, *graph.output):
        if info.name in produced:
            info.type.tensor_type.ClearField("shape")  # stale (Paddle writes -1, exporters leave symbolic dims)


def _write_dims(tensor_type: onnx.TypeProto.Tensor, dims: list[int]) -> None:
    tensor_type.ClearField("shape")
    tensor_type.shape.SetInParent()
    for size in dims:
        tensor_type.shape.dim.add().dim_value = size


def _bind_constant_inputs_proto(graph: onnx.GraphProto, constant_inputs: Mapping[str, np.ndarray]) -> None:
    """:func:`_bind_constant_inputs` on the protobuf."""
    inputs = {info.name: info for info in graph.input}
    for name, array in constant_inputs.items():
        if name not in inputs:
            raise ArgumentError(f"constant_inputs names '{name}', which is not a model input.",
                                hint=f"The model's inputs are: {', '.join(sorted(inputs))}.")
        tensor_type = inputs[name].type.tensor_type
        dtype = ir.DataType(tensor_type.elem_type).numpy() if tensor_type.elem_type else None
        dims = ([dim.dim_value if dim.HasField("dim_value") else None for dim in tensor_type.shape.dim]
                if tensor_type.HasField("shape") else None)
        bound = _bound_value(name, array, dtype, dims)
        _remove_inputs(graph, {name})
        graph.initializer.append(ir.serde.serialize_tensor(ir.tensor(bound, name=name)))


def _bound_value(name: str, array, dtype, dims: list[int | None] | None) -> np.ndarray:
    """The value bound to input ``name``, as the input's dtype. A single value fills the input's static shape (``state=0``
    for Silero's [2, 1, 128] state made the canonicalization fail with an IndexError); any other value must have
    the input's shape when that is static.

    Raises:
        ArgumentError: the value's shape is neither one value nor the input's static shape.
    """
    value = np.asarray(array, dtype=dtype)
    if dims is None or None in dims or list(value.shape) == dims:
        return value
    if value.size == 1:
        return np.full(dims, value.reshape(()), dtype=value.dtype)
    raise ArgumentError(f"Input '{name}' takes shape {dims}; the value bound to it has shape {list(value.shape)}.",
                        hint="Bind one value (it fills the whole input, e.g. 0 for a zero initial state) or an array "
                             "of the input's shape (constant_inputs).", input=name)


def _convert_opset_proto(source: CheckedModelProto) -> tuple[ir.Model, bool]:
    """:func:`_convert_opset` on the protobuf (the C API path of :func:`convert_version`), with strict inference."""
    proto = source.proto
    graph = proto.graph
    current = next(entry.version for entry in proto.opset_import if entry.domain == "")
    used = {""} | {node.domain for node in graph.node}
    for index in reversed([i for i, entry in enumerate(proto.opset_import) if entry.domain not in used]):
        del proto.opset_import[index]
    header = onnx.ModelProto()
    for field in _MODEL_FIELDS:
        if proto.HasField(field):
            setattr(header, field, getattr(proto, field))
    header.metadata_props.extend(proto.metadata_props)
    try:
        converted, inferred, large, pending = convert_source_proto_weights_apart(proto, opset.MBLT_OPSET_VERSION)
    except Exception as error:  # the C API raises plain exceptions
        logger.warning("The ONNX C API could not convert the model to opset %d; the model was not modified",
                       opset.MBLT_OPSET_VERSION, exc_info=error)
        raise _conversion_error(current) from error
    for field in _MODEL_FIELDS:
        if header.HasField(field):
            setattr(converted, field, getattr(header, field))
        else:
            converted.ClearField(field)
    del converted.metadata_props[:]
    converted.metadata_props.extend(header.metadata_props)
    if any(node.name and not node.metadata_props for node in converted.graph.node):
        _restore_node_metadata(converted.graph, graph)
    weights = _lift_constants_proto(converted.graph, pending)
    biases = fuse_batchnorms_proto(converted.graph, weights, large) if inferred else {}
    value_info = _take_value_info(converted.graph)
    model = CheckedModelProto(converted, source.path).to_ir()
    for name, tensor in large.items():  # the converted model holds stubs of the large initializers
        if name in model.graph.initializers:
            model.graph.initializers[name].const_value = ir.serde.deserialize_tensor(tensor)
    for name, array in weights.items():  # and of the lifted Constant weights and the fused Conv weights
        model.graph.initializers[name].const_value = array
    if biases:
        model.meta[FUSED_BIASES] = {node: biases[node.name] for node in model.graph if node.name in biases}
    read_once(model.graph)
    _merge_types(model, {info.name: info.type for info in value_info})
    ir.passes.Sequential(RemoveUnusedNodes(), RemoveUnusedOpsets())(model)
    logger.info("Converted opset %s -> %s", current, opset.MBLT_OPSET_VERSION)
    if model.opset_imports.get("") != opset.MBLT_OPSET_VERSION:
        raise _conversion_error(current)
    return model, inferred


def _restore_node_metadata(converted: onnx.GraphProto, source: onnx.GraphProto) -> None:
    """Give the C API's converted nodes the metadata of the source nodes of their names: the C API drops node metadata
    but keeps node names (every source node has one, and the source name in its metadata); the Python upgrade keeps
    both, and the nodes either inserts have neither."""
    saved = {node.name: {entry.key: entry.value for entry in node.metadata_props} for node in source.node}
    for node in converted.node:
        props = {entry.key: entry.value for entry in node.metadata_props}
        props.update(saved.get(node.name, {}))
        del node.metadata_props[:]
        for key, value in props.items():
            entry = node.metadata_props.add()
            entry.key, entry.value = key, value


def _lift_constants_proto(graph: onnx.GraphProto, pending: Mapping[str, tuple[onnx.TensorProto, bytes]],
                          ) -> dict[str, ir.Tensor]:
    """What :class:`LiftConstants` (all sizes) does to the deserialized graph, done on the protobuf, when every
    ``Constant`` holds a ``value`` tensor: each becomes an initializer of its output's name, in node order after the
    existing initializers; one whose output is a graph output stays. The inferred value info of a lifted value is
    dropped (deserialization types an initializer from its tensor, the same type). Other kinds of ``Constant``
    (``value_ints`` ...) are left to :class:`LiftConstants` for all, which keeps the order of the initializers.

    ``pending``: the bytes of large ``Constant`` tensors set apart in the opset conversion (output name -> (the
    ``Constant``'s tensor, bytes)); a lifted one gets them in its initializer, any other in its ``Constant``. A lifted
    initializer holding only dims, data type and name stays a stub here, and its tensor is returned (initializer
    name -> ``ir.Tensor`` over the bytes, not copied) for the deserialized model: it serializes to the same fields."""
    outputs = {info.name for info in graph.output}
    constants = [index for index, node in enumerate(graph.node) if node.op_type == "Constant"]
    nodes = [graph.node[index] for index in constants]
    lifted = []
    weights: dict[str, ir.Tensor] = {}
    if not any(len(node.attribute) != 1 or node.attribute[0].name != "value" or len(node.output) != 1
               or node.attribute[0].type != onnx.AttributeProto.TENSOR for node in nodes):
        for index, node in zip(constants, nodes):
            name = node.output[0]
            if name in outputs:
                continue
            graph.initializer.append(node.attribute[0].t)  # a copy, made quicker than add() and CopyFrom
            tensor = graph.initializer[-1]
            tensor.name = name
            if name in pending:
                array = _array_over(tensor, pending[name][1])
                if array is not None:
                    weights[name] = ir.Tensor(array, dtype=ir.DataType(tensor.data_type), name=name)
                else:
                    tensor.raw_data = pending[name][1]
            lifted.append(index)
    names = {graph.node[index].output[0] for index in lifted}
    for name, (tensor, data) in pending.items():
        if name not in names:  # the Constant stays: its weights go back into it
            tensor.raw_data = data
    for index in reversed(lifted):
        del graph.node[index]
    plain = [index for index, info in enumerate(graph.value_info)
             if info.name in names and not info.doc_string and not info.metadata_props]
    for index in reversed(plain):
        del graph.value_info[index]
    return weights


_STUB_FIELDS = frozenset({"dims", "data_type", "name"})


def _array_over(stub: onnx.TensorProto, data: bytes) -> np.ndarray | None:
    """The array ``data`` holds as the ``raw_data`` of ``stub`` (a view, read-only like the protobuf's), when the stub
    holds nothing but dims, data type and name and the type's elements are whole little-endian bytes; else None."""
    if sys.byteorder != "little" or any(field.name not in _STUB_FIELDS for field, _ in stub.ListFields()):
        return None
    dtype = ir.DataType(stub.data_type)
    if dtype.bitwidth % 8 or dtype in (ir.DataType.STRING, ir.DataType.UNDEFINED):
        return None
    array = np.frombuffer(data, dtype=dtype.numpy())
    if array.itemsize != dtype.itemsize or array.size != math.prod(stub.dims):
        return None
    return array.reshape(tuple(stub.dims))


def _take_value_info(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Take the value info of intermediate values out of the graph, when each holds only a type: typing the
    deserialized values from them with :func:`_merge_types` gives the same values as deserializing them, quicker
    (the common tensor types are read directly). Value info for a graph output is left (deserialization types a
    graph output from its output entry last)."""
    outputs = {info.name for info in graph.output}
    if any(info.doc_string or info.metadata_props or info.name in outputs for info in graph.value_info):
        return []
    holder = onnx.GraphProto()
    holder.value_info.extend(graph.value_info)
    graph.ClearField("value_info")
    return list(holder.value_info)


_MODEL_FIELDS = ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string")
"""Model fields the onnx-ir path keeps from the source when it adopts the converted graph."""


def _conversion_error(current: int) -> InvalidModelError:
    return InvalidModelError(
        f"Could not convert the model from opset {current} to {opset.MBLT_OPSET_VERSION}.",
        hint=f"Export the model with opset {opset.MBLT_OPSET_VERSION} (or 18-{opset.MBLT_OPSET_VERSION}) and parse again.")


# -- steps ---------------------------------------------------------------------------------------


def _record_source_names(model: ir.Model) -> None:
    # IR < 10 cannot serialize node metadata, and the opset converter round-trips through protobuf.
    model.ir_version = max(model.ir_version or 0, opset.MBLT_IR_VERSION)
    for index, node in enumerate(all_nodes(model.graph)):
        fallback = node.outputs[0].name if node.outputs and node.outputs[0].name else node.op_type
        node.metadata_props.setdefault(SOURCE_NAME_KEY, node.name or fallback)
        node.name = f"n{index}"  # unique handle; the naming pass gives the final names


def _check_known_ops(model: ir.Model) -> None:
    """List every op no ONNX schema (nor a model-local function) defines, all in one error."""
    functions = {(f.domain, f.name) for f in model.functions.values()}
    unknown: dict[str, list[str]] = {}
    offending: list[ir.Node] = []
    known: dict[tuple[str, str, int | None], bool] = {}  # one schema look-up per op type and version
    for node in all_nodes(model.graph):
        if (node.domain, node.op_type) in functions:
            continue
        key = (node.domain, node.op_type, node.version)
        if key not in known:
            known[key] = _has_schema(node, model.opset_imports)
        if known[key]:
            continue
        unknown.setdefault(_qualified(node), []).append(node.metadata_props.get(SOURCE_NAME_KEY, node.name))
        offending.append(node)
    if unknown:
        raise unsupported_ops_error(unknown, "no ONNX definition (custom or unknown operator)",
                                    outputs_clear_of(model.graph, offending), len(model.graph.outputs))


def _pin_inputs(model: ir.Model, input_shape_dict: Mapping[str, Sequence[int]]) -> None:
    names = {value.name for value in model.graph.inputs}
    unknown = sorted(set(input_shape_dict) - names)
    if unknown:
        raise ArgumentError(
            f"input_shape_dict names input(s) the model does not have: {', '.join(unknown)}.",
            hint=f"The model's inputs are: {', '.join(sorted(names))}.")
    for value in model.graph.inputs:
        value.shape = _pinned_shape(value, input_shape_dict.get(value.name))
    for node in all_nodes(model.graph):
        for output in node.outputs:
            output.shape = None  # stale (Paddle writes -1, exporters leave symbolic dims)


def _pinned_shape(value: ir.Value, requested: Sequence[int] | None) -> ir.Shape:
    if requested is not None:
        return _checked_requested_shape(value, requested)
    if value.shape is None:
        raise DynamicShapeError(f"Input '{value.name}' has no shape.",
                                hint=f"Give it with input_shape_dict / --input-shape {value.name}=1,3,224,224.",
                                input=value.name)
    dims = list(value.shape.dims)
    if dims and not _is_static(dims[0]):
        logger.info("Input %s: pinning the leading dynamic dimension %s to batch 1", value.name, dims[0])
        dims[0] = 1
    dynamic = [f"dim {i} ({dim})" for i, dim in enumerate(dims) if not _is_static(dim)]
    if dynamic:
        raise DynamicShapeError(
            f"Input '{value.name}' has dynamic dimensions that cannot be pinned automatically: "
            f"{', '.join(dynamic)}.",
            hint=f"Give its full shape with input_shape_dict / --input-shape "
                 f"{value.name}={','.join(str(dim) if _is_static(dim) else f'<{dim}>' for dim in dims)}, each <...> "
                 "replaced by the size to compile for.",
            input=value.name)
    return ir.Shape(dims)


def _checked_requested_shape(value: ir.Value, requested: Sequence[int]) -> ir.Shape:
    requested = [int(d) for d in requested]
    if any(d < 0 for d in requested):
        raise ArgumentError(f"input_shape_dict['{value.name}'] = {requested} has negative sizes.",
                                hint="Give every dimension as a non-negative integer.", input=value.name)
    declared = list(value.shape.dims) if value.shape is not None else None
    if declared is not None and len(declared) != len(requested):
        raise ArgumentError(
            f"input_shape_dict['{value.name}'] has rank {len(requested)}, the model's input has rank "
            f"{len(declared)} ({_shape_text(declared)}).", hint="Give one size per dimension.", input=value.name)
    for index, (dim, size) in enumerate(zip(declared or [], requested)):
        if _is_static(dim) and dim != size:
            raise ArgumentError(
                f"input_shape_dict['{value.name}'] sets dim {index} to {size}, but the model fixes it to {dim}.",
                hint=f"Use {_shape_text(declared)} (only dynamic dims can be chosen).", input=value.name)
    return ir.Shape(requested)


def _initializer_inputs_to_constants(model: ir.Model) -> None:
    # Exports of IR version < 4 (the classic model zoo) list every weight among the graph inputs too,
    # which makes weights overridable at run time, so nothing folds (not even BatchNorm into Conv).
    # A compiled model's weights are fixed: the initializer is the value.
    listed = [value for value in model.graph.inputs if value.const_value is not None]
    for value in listed:
        model.graph.inputs.remove(value)
    if listed:
        logger.info("%d graph input(s) also have initializers (an IR version %s export convention); "
                    "compiled as constants, e.g. %s", len(listed), model.ir_version,
                    ", ".join(value.name for value in listed[:3]))


def _bind_constant_inputs(model: ir.Model, constant_inputs: Mapping[str, np.ndarray]) -> None:
    inputs = {value.name: value for value in model.graph.inputs}
    for name, array in constant_inputs.items():
        if name not in inputs:
            raise ArgumentError(f"constant_inputs names '{name}', which is not a model input.",
                                    hint=f"The model's inputs are: {', '.join(sorted(inputs))}.")
        value = inputs[name]
        dims = [dim if isinstance(dim, int) else None for dim in value.shape] if value.shape is not None else None
        bound = _bound_value(name, array, value.dtype.numpy() if value.dtype else None, dims)
        model.graph.inputs.remove(value)
        value.const_value = ir.tensor(bound, name=name)
        value.shape = value.const_value.shape
        model.graph.register_initializer(value)


def _convert_opset(model: ir.Model) -> None:
    current = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    if current != opset.MBLT_OPSET_VERSION:
        # The C-API fallback drops node metadata but keeps node names: restore it by name.
        saved = {node.name: dict(node.metadata_props) for node in all_nodes(model.graph)}
        with _quiet("onnxscript.version_converter"):  # its "using the C API fallback" warning is expected
            convert_version(model, opset.MBLT_OPSET_VERSION)
        logger.info("Converted opset %s -> %s", current, opset.MBLT_OPSET_VERSION)
        for node in all_nodes(model.graph):
            node.metadata_props.update(saved.get(node.name, {}))
    if model.opset_imports.get("") != opset.MBLT_OPSET_VERSION:
        raise _conversion_error(current)


def _lift_constants(model: ir.Model, *, infer: bool = True) -> InvalidModelError | None:
    """Lift constants, then infer shapes of the graph as given (inputs pinned, opset converted).

    ``infer=False``: the shapes were already inferred with the opset conversion (see :func:`_steps_on_proto`).

    Returns:
        The model's own inconsistency (e.g. a Reshape whose target shape does not fit its input)
        when ONNX's strict inference fails here, else None. Parsing goes on (the optimizer may
        remove the offending node); :func:`_verify` uses it to blame the model instead of the compiler.
    """
    LiftConstants(lift_all_constants=True, size_limit=0)(model)
    if infer:
        # ONNX's inference reads the nodes in order: a graph out of order (onnxconverter-common's float16
        # conversion appends its Casts at the end) gave no shape from the first misplaced Cast on (ISNet: 37 Shape
        # nodes left unfolded). The source's own value infos had hidden that; the steps before clear them.
        model.graph.sort()
    failure = _strict_inference(model) if infer else None
    _check_reshapes(model)
    if failure is None:
        return None
    handle, node = _failing_node(model, failure)
    detail = re.sub(rf"\b{re.escape(handle)}\b", node, _first_line(failure)) if handle else _first_line(failure)
    logger.info("The model fails ONNX shape inference before canonicalization: %s", detail)
    where = f" at node '{node}'" if node else ""
    return InvalidModelError(f"The model is inconsistent{where}: ONNX type and shape inference fails with its "
                             f"input shapes pinned: {detail}",
                             hint="Check the input shapes (input_shape_dict) and the model; check it with "
                                  "onnx.shape_inference.infer_shapes(model, strict_mode=True).",
                             stage=VERIFY_STAGE, **({"node": node} if node else {}))


def _optimize(model: ir.Model) -> None:
    _returned_inputs_copied(model)
    with _quiet(_FOLDER_LOGGER, "Evaluation failed"):  # what it cannot fold, _fold_remaining_constants does
        optimize(model, num_iterations=4, input_size_limit=_FOLD_SIZE_LIMIT, output_size_limit=_FOLD_SIZE_LIMIT,
                 should_fold=_should_fold)
        if unroll_static_loops(model):  # counted once the pinned shapes folded their trip counts; fold the copies
            _infer_shapes(model)
            optimize(model, num_iterations=4, input_size_limit=_FOLD_SIZE_LIMIT,
                     output_size_limit=_FOLD_SIZE_LIMIT, should_fold=_should_fold)
    give_fused_biases(model)  # its first rewrite pass gave them (kept for an optimizer that does not)
    _remove_unused_initializers(model)


# Fusions onnxscript provides, applied after ours: Conv -> Mul/Add by scalars (PP-OCR writes Mul(c, conv)),
# HardSwish written out (x * clip(x + 3, 0, 6) / 6, or x * HardSigmoid(x)), LayerNorm written out
# (ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add), Max/Min by constants -> Clip, successive clamps, and the
# arithmetic no-ops (x * 1, x + 0, x - 0, x / 1; ours, which match these constants exactly).
_LIBRARY_RULES = [
    *RewriteRuleSet([common_rules.conv_affine_fusion_rule], commute=True).rules,
    *common_rules.fuse_hardswish_rules().rules,
    *layer_normalization_rules,
    common_rules.min_max_rule, common_rules.max_min_rule, common_rules.min_min_rule, common_rules.max_max_rule,
    common_rules.successive_clip_rule, common_rules.successive_relu_rule, common_rules.successive_clip_relu_rule,
    common_rules.successive_relu_clip_rule,
    *EXACT_NO_OP_RULES,
]
_MAX_REWRITE_ROUNDS = 8


def _legalize(model: ir.Model) -> None:
    """Apply our fusions and decompositions, then fold whatever they exposed.

    Rules are applied until none matches (a ``Conv -> Add -> Mul -> Add`` chain folds one op per
    round), with constant folding between rounds so every rule sees folded constants.
    """
    decompose_recurrent(model)  # unrolled into the ops the quantizer has kernels for
    lower_einsums(model)  # matrix-product equations become MatMul
    rules = _legalize_rules(indexed_rule_set)
    for _ in range(_MAX_REWRITE_ROUNDS):
        count, clean = apply_rules(rules, model)
        if not count:
            if not _fold_remaining_constants(model):
                break
            continue  # the rules see what the optimizer left to fold (DETR's constant first decoder queries)
        if not clean:  # else the rule set's own removal found nothing: this one would not either
            RemoveUnusedNodes()(model)
        with _quiet(_FOLDER_LOGGER, "Evaluation failed"):
            optimize(model, num_iterations=2, input_size_limit=_FOLD_SIZE_LIMIT,
                     output_size_limit=_FOLD_SIZE_LIMIT, should_fold=_should_fold)
    else:  # out of rounds; a loop that settled ended on a fold that found nothing, on the graph as it is now
        _fold_remaining_constants(model)
    _remove_unused_initializers(model)
    if merged := merge_equal_weights(model.graph):
        logger.info("Merged %d weight(s) equal to another (a weight the model shares between layers).", merged)


@functools.cache
def _legalize_rules(make_rule_set: Callable[[list], RewriteRuleSet]) -> RewriteRuleSet:
    """Our rules and the library's, as one rule set built once per process (rules keep no state between graphs,
    like the library's default rule set); keyed by the factory, so a test may substitute the library's."""
    return make_rule_set([*MBLT_REWRITE_RULES, *_LIBRARY_RULES])


def _build_registries() -> None:
    """Build, once per process, what every parse consults and no model changes: the optimizer's and the legalization's
    rule sets and the MBLT op set (the op registry's table). Called when this module is imported (as the library builds
    its default rule set when it is imported), so a parse only does the work of its model: built lazily, they were
    2-4 ms of the first parse of a process (the op table is compiled from source where no bytecode is cached)."""
    default_rules()
    _legalize_rules(indexed_rule_set)
    canonical_op_types()


def _fold_remaining_constants(model: ir.Model) -> int:
    """Evaluate nodes whose inputs are all constants that the optimizer left (multi-output Split of
    initial LSTM states, for one): an MBLT holds no all-constant node, so the quantizer never meets one. What a node's
    subgraphs read from the graph counts as its input: a ``Loop`` of constant inputs whose body reads a computed value
    is not constant (it was evaluated without that value: INTERNAL_ERROR "Unable to find input").
    Returns how many nodes were folded."""
    folded_nodes = 0
    for node in list(model.graph):
        inputs = [v for v in node.inputs if v is not None]
        if not inputs or node.domain not in ("", "ai.onnx"):
            continue
        read = list(dict.fromkeys([*inputs, *outer_reads(node)]))  # a Loop body's reads of the graph are inputs too
        if any(v.const_value is None for v in read) or sum(v.const_value.size for v in read) > _FOLD_SIZE_LIMIT:
            continue
        proto = ir.serde.serialize_node(node)
        graph = onnx.helper.make_graph([proto], "fold", [], [onnx.helper.make_empty_tensor_value_info(o)
                                                             for o in proto.output if o],
                                       [onnx.numpy_helper.from_array(v.const_value.numpy(), v.name) for v in read])
        folded = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset.MBLT_OPSET_VERSION)])
        results = _evaluate_constant_node(folded)
        for output, array in zip([o for o in node.outputs if o.name], results):
            name, output.name = output.name, f"{output.name}_unfolded"
            replacement = ir.Value(name=name, const_value=ir.Tensor(np.asarray(array)),
                                   shape=ir.Shape(np.shape(array)), type=ir.TensorType(output.dtype))
            model.graph.register_initializer(replacement)
            if output.is_graph_output():  # first: onnx-ir refuses to replace the uses of a graph output
                model.graph.outputs[model.graph.outputs.index(output)] = replacement
            ir.convenience.replace_all_uses_with(output, replacement)
        model.graph.remove(node, safe=False)
        folded_nodes += 1
    return folded_nodes


def _evaluate_constant_node(folded: onnx.ModelProto) -> list[np.ndarray]:
    """Run a one-node model of constants: onnxruntime first, ``onnx.reference`` for what it lacks.

    ``onnx.reference`` alone is not enough: its GatherElements fails on more than 32 rows to choose from
    (ALBERT's token-type buffer of 512), which the optimizer's folding then also left behind.
    """
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    try:
        session = ort.InferenceSession(folded.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {})
    except Exception as error:  # onnxruntime lacks the op/type or rejects the opset: the reference has more
        logger.debug("onnxruntime cannot fold %s (%s); using onnx.reference", folded.graph.node[0].op_type,
                     _first_line(error))
    return ReferenceEvaluator(folded).run(None, {})


def _tidy(model: ir.Model) -> None:
    RemoveUnusedNodes()(model)
    RemoveUnusedOpsets()(model)
    TopologicalSort()(model)
    _strip_foreign_metadata(model)
    assign_canonical_names(model)
    if not _fully_typed(model):
        _infer_shapes(model)


def _fully_typed(model: ir.Model) -> bool:
    """True if every value of the model has a dtype and a static shape and there are no subgraphs.

    Merging ONNX's strict inference into such a graph changes nothing: an inferred shape or dtype
    that differs from a static one is a conflict, which strict inference raises and :func:`_infer_shapes`
    ignores (the full checker in :func:`_verify` then reports it), so the whole-model inference is skipped.
    """
    graph = model.graph
    values = [*graph.inputs, *graph.initializers.values(), *(value for node in graph for value in node.outputs)]
    return not any(True for _ in _subgraphs(model)) and all(
        value.dtype is not None and value.shape is not None and all(_is_static(dim) for dim in value.shape.dims)
        for value in values)


def _verify(model: ir.Model, source_inference: InvalidModelError | None = None, keep_checked: bool = False) -> None:
    """Check the canonical graph: MBLT ops only, static shapes, ONNX's full checker.

    Args:
        model: The canonical graph.
        source_inference: How the model as given failed inference (from :func:`_lift_constants`);
            raised instead of an internal error when the canonical graph fails the checker.
        keep_checked: Keep the checker's protobuf in ``model.meta[CHECKED_PROTO]``.
    """
    _check_constant_outputs(model)
    _check_mblt_ops(model)
    if source_inference is not None and _has_dynamic_shapes(model):
        raise source_inference  # the model's inconsistency left tensors without shapes
    for _ in range(len(model.graph)):  # one round per GroupNormalization in a chain (PoolFormer has dozens)
        if not (_fill_same_shape_outputs(model)
                and any(value.shape is None for node in model.graph for value in node.outputs)):
            break
        _infer_shapes(model)  # ONNX infers no shape for GroupNormalization-21: give its consumers theirs
    _check_static_shapes(model)
    model.ir_version = opset.MBLT_IR_VERSION
    try:
        checked = check_model(model)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        # Whose fault it is depends on the source: the model's own when it already failed inference as
        # given; else api.parse_model blames it only when onnx.checker (full) fails on the source file.
        if source_inference is not None:
            raise source_inference from error
        raise InternalError(f"The parsed graph fails ONNX's checker: {_first_line(error)}",
                            hint="The source model may be fine; this is probably a compiler bug. Please report it "
                                 "with the model.", stage=VERIFY_STAGE) from error
    if keep_checked:
        model.meta[CHECKED_PROTO] = checked


# -- helpers -------------------------------------------------------------------------------------

_FREEZE_LOCK = threading.Lock()
_freeze_depth = 0
_saved_threshold = gc.get_threshold()
_YOUNG_THRESHOLD = 5000
"""Allocations between two collections of the youngest generation while the heap is frozen (Python's default is 700):
a parse's passes make thousands of short-lived objects, and each collection also walks the graph's new objects
(PP-OCR cls: 13 young collections and one of the middle generation per parse, 1.3 ms; one young collection at 5000)."""


@contextmanager
def frozen_heap():
    """Keep the objects that exist now (imported modules, the loaded graph) out of garbage collection for a while.

    The passes allocate enough to trigger a full collection, which scans every live object (about
    90,000 after the imports, plus the graph): 55-60 ms per parse here, a fifth of a small model's
    parse. Frozen objects are not scanned; objects created inside are collected as usual, and on exit
    the frozen ones return to the oldest generation, so garbage among them is collected later. Meanwhile the youngest
    generation is collected less often (:data:`_YOUNG_THRESHOLD`); the threshold is restored on exit.
    Nested and concurrent uses unfreeze only when the last one exits; a heap frozen by someone else
    is left as it is (unfreezing would undo their freeze). The parse API holds it from the load to the written MBLT:
    a full collection due when a process has just imported the compiler (the import leaves one pending) otherwise
    fell on the load (70 ms of a 110 ms first parse of PP-OCR cls).
    """
    global _freeze_depth, _saved_threshold
    with _FREEZE_LOCK:
        if _freeze_depth == 0 and gc.get_freeze_count():
            owner = False
        else:
            owner = True
            if _freeze_depth == 0:
                gc.freeze()
                _saved_threshold = gc.get_threshold()
                gc.set_threshold(max(_saved_threshold[0], _YOUNG_THRESHOLD), *_saved_threshold[1:])
            _freeze_depth += 1
    try:
        yield
    finally:
        if owner:
            with _FREEZE_LOCK:
                _freeze_depth -= 1
                if _freeze_depth == 0:
                    gc.set_threshold(*_saved_threshold)
                    gc.unfreeze()


@contextmanager
def _quiet(name: str, prefix: str = "The model version conversion is not supported by the onnxscript version "
                                    "converter and fallback is enabled"):
    """Hide only the expected warning (the one starting with ``prefix``) of one library logger during a call.

    Every other record of that logger (a failed conversion, a skipped node) still reaches the user.
    """
    target = logging.getLogger(name)

    def not_expected(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(prefix)

    target.addFilter(not_expected)
    try:
        yield
    finally:
        target.removeFilter(not_expected)


_ALWAYS_FOLDED = frozenset({"ConstantOfShape", "DequantizeLinear"})
"""Ops folded whenever their inputs are constants, beyond the library's defaults: a QDQ model's weights
(``DequantizeLinear`` of constant codes, which the library keeps to preserve the quantization) are float weights here:
the compiler quantizes on its own, and a BatchNorm whose parameters stay behind a DequantizeLinear until the last fold
is neither fused nor made an affine (an onnxruntime QDQ MobileNetV2 was refused: BatchNormalization x52)."""


def _should_fold(node: ir.Node) -> bool | None:
    return True if node.op_type in _ALWAYS_FOLDED else None


def _infer_shapes(model: ir.Model) -> None:
    """Strict ONNX type and shape inference, merged into the graph; a failure leaves the graph unchanged
    (the checker in :func:`_verify` then reports it)."""
    failure = _strict_inference(model)
    if failure is not None:
        logger.debug("Shape inference failed: %s", _first_line(failure))


def _strict_inference(model: ir.Model) -> Exception | None:
    """Run ONNX's strict inference on the model and merge the shapes; return its failure, if any.

    ``ShapeInferencePass`` logs and swallows failures; this calls the same helpers (which keep large
    initializers out of the serialized copy) and hands the failure back.
    """
    def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
        return onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)

    try:
        inferred = _c_api_utils.call_onnx_api(infer, model)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as error:
        return error
    if any(True for _ in _subgraphs(model)):
        ir_shape_inference._merge_func(model, inferred)  # nested graphs: the library's (slower) full merge
    else:
        _merge_main_graph(model, inferred)
    return None


def _subgraphs(model: ir.Model):
    for node in model.graph:
        if holds_graph(node):
            yield node


def _merge_main_graph(model: ir.Model, inferred: onnx.ModelProto) -> None:
    """Copy the inferred shapes and dtypes onto the graph's values, as ``ShapeInferencePass`` does, reading the
    inferred proto's value infos directly instead of deserializing the whole inferred model."""
    graph = inferred.graph
    _merge_types(model, {info.name: info.type for info in (*graph.input, *graph.value_info, *graph.output)})


def _merge_types(model: ir.Model, types: Mapping[str, onnx.TypeProto]) -> None:
    """Set the shape and dtype of each main-graph value named in ``types`` to the ones given there.

    Equal types (the same serialized ``TypeProto``) are read once: values of one type share its frozen shape (a frozen
    ``ir.Shape`` cannot change, so sharing it is as good as a copy each); a shape that is not frozen is not shared.
    """
    read: dict[bytes, tuple[ir.Shape | None, ir.DataType | None]] = {}
    for name, value in ir.convenience.create_value_mapping(model.graph).items():
        type_proto = types.get(name)
        if type_proto is None:
            continue
        key = type_proto.SerializeToString()
        shape_and_dtype = read.get(key)
        if shape_and_dtype is None:
            shape_and_dtype = _shape_and_dtype(type_proto)
            if shape_and_dtype[0] is None or shape_and_dtype[0].frozen:
                read[key] = shape_and_dtype
        shape, dtype = shape_and_dtype
        if shape is not None and value.shape != shape:
            value.shape = shape
        if dtype is not None and value.dtype != dtype:
            value.dtype = dtype


def _shape_and_dtype(type_proto: onnx.TypeProto) -> tuple[ir.Shape | None, ir.DataType | None]:
    """What ``ir.serde.deserialize_type_proto_for_shape`` and ``..._for_type`` give for an inferred value.

    A tensor type with only numeric, undenoted dims (nearly every inferred value) is read directly;
    anything else goes through the library.
    """
    if type_proto.HasField("tensor_type") and not type_proto.denotation:
        tensor_type = type_proto.tensor_type
        dtype = ir.DataType(tensor_type.elem_type) if tensor_type.HasField("elem_type") else None
        if not tensor_type.HasField("shape"):
            return None, dtype
        dims = tensor_type.shape.dim
        sizes = [dim.dim_value for dim in dims if dim.HasField("dim_value") and not dim.denotation]
        if len(sizes) == len(dims):
            return ir.Shape(sizes, frozen=True), dtype
    shape = ir.serde.deserialize_type_proto_for_shape(type_proto)
    inferred_type = ir.serde.deserialize_type_proto_for_type(type_proto)  # None for an empty TypeProto
    return shape, inferred_type.dtype if inferred_type is not None else None


def _check_reshapes(model: ir.Model) -> None:
    """Refuse a Reshape of the main graph whose constant target shape cannot hold its input's elements.

    ONNX's inference takes such a target shape as given; the mismatch only shows later, or at run time.
    Subgraphs are left alone: an ``If`` branch that the pinned shapes rule out may be ill-shaped.

    Raises:
        InvalidModelError: naming the Reshape, its input shape and its target shape.
    """
    for node in model.graph:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        data, target = node.inputs[0], node.inputs[1]
        if data is None or target is None or target.const_value is None or data.shape is None \
                or not all(_is_static(dim) for dim in data.shape.dims):
            continue
        problem = _reshape_problem(list(data.shape.dims), target.const_value.numpy().reshape(-1).tolist(),
                                   bool(node.attributes.get_int("allowzero", 0)))
        if problem:
            name = node.metadata_props.get(SOURCE_NAME_KEY, node.name)
            raise InvalidModelError(f"Reshape '{name}' cannot reshape its input of shape {list(data.shape.dims)} "
                                    f"to {target.const_value.numpy().reshape(-1).tolist()}: {problem}.",
                                    hint="The source model is inconsistent (or the input shapes given do not fit "
                                         "it); check input_shape_dict and the model.", node=name)


def _reshape_problem(source: list[int], target: list[int], allowzero: bool) -> str | None:
    """Why ``target`` cannot be a Reshape of a ``source``-shaped tensor, or None."""
    dims = [source[index] if size == 0 and not allowzero and index < len(source) else size
            for index, size in enumerate(target)]
    if dims.count(-1) > 1 or any(size < -1 for size in dims):
        return "at most one -1 and no other negative size is allowed"
    if allowzero and -1 in dims and 0 in dims:
        return "with allowzero, a target shape cannot hold both 0 and -1"
    total, known = math.prod(source), math.prod(d for d in dims if d != -1)  # Python ints: exact, as numpy's object products
    if -1 in dims:
        return None if (known and total % known == 0) or (not known and total == 0) else \
            f"{total} elements do not divide into the known sizes ({known})"
    return None if total == known else f"{total} elements, the target holds {known}"


_NODE_IN_MESSAGE = re.compile(r"node name: ([^)]+)\)")


def _failing_node(model: ir.Model, error: Exception) -> tuple[str | None, str | None]:
    """(the node name an inference error gives, that node's source name), or (None, None)."""
    match = _NODE_IN_MESSAGE.search(str(error))
    if match is None:
        return None, None
    handle = match.group(1)
    for node in all_nodes(model.graph):
        if node.name == handle:
            return handle, node.metadata_props.get(SOURCE_NAME_KEY, handle)
    return handle, handle


def _remove_unused_initializers(model: ir.Model) -> None:
    """Drop initializers left behind by discarded ``If`` branches (RemoveUnusedNodes keeps them; a folded branch's
    nodes still read them: Silero's 8 kHz weights stayed in the MBLT, and every onnxruntime session on it warned
    about each), and those only nodes already taken out of the graph still list as their input (an unrolled LSTM's
    folded initial state)."""
    outputs = set(model.graph.outputs)
    live = set(all_nodes(model.graph))  # the graph's nodes and those of the subgraphs it still holds
    for name, value in list(model.graph.initializers.items()):
        if not any(user in live for user, _ in value.uses()) and value not in outputs:
            del model.graph.initializers[name]


def _strip_foreign_metadata(model: ir.Model) -> None:
    for node in model.graph:
        for key in [k for k in node.metadata_props if not k.startswith("mblt.")]:
            del node.metadata_props[key]


def _check_constant_outputs(model: ir.Model) -> None:
    """Refuse outputs that depend on no input (a weight or a ``Constant`` returned): the NPU computes nothing for
    them, and an MXQ's outputs are what it computes."""
    graph = model.graph
    constant = [value.name for value in graph.outputs if not value.is_graph_input() and (
        value.const_value is not None or value.producer() is None or value.producer().op_type == "Constant")]
    if constant:
        kept = [value.name for value in graph.outputs if value.name not in constant]
        raise UnsupportedOpsError(
            f"Output(s) {', '.join(repr(name) for name in constant)} of the model are constants: they depend on no "
            "input, so the NPU has nothing to compute for them.",
            hint=(f"Leave them out with output_names={kept} (--output-names {','.join(kept)}) and take the constants "
                  "from the source model." if kept else "The model computes nothing from its inputs."),
            outputs=constant)


def _returned_inputs_copied(model: ir.Model) -> None:
    """Give each graph input that is also a graph output an ``Identity`` copy as the output, named ``<input>_out``.

    The library's OutputFix pass renames the input instead (``x_orig``), and the user could no longer feed ``x``.
    """
    graph = model.graph
    taken = {value.name for node in graph for value in node.outputs} | {value.name for value in graph.inputs}
    for index, value in enumerate(list(graph.outputs)):
        if not value.is_graph_input():
            continue
        name = f"{value.name}_out"
        while name in taken:
            name += "_"
        copy = ir.node("Identity", [value], name=name)
        copy.outputs[0].name, copy.outputs[0].shape, copy.outputs[0].type = name, value.shape, value.type
        graph.append(copy)
        taken.add(name)
        graph.outputs[index] = copy.outputs[0]


def _check_mblt_ops(model: ir.Model) -> None:
    offending: dict[str, list[str]] = {}
    nodes = [node for node in all_nodes(model.graph) if not opset.is_mblt_op(node.domain, node.op_type)]
    for node in nodes:
        offending.setdefault(_qualified(node), []).append(node.metadata_props.get(SOURCE_NAME_KEY) or node.name)
    if offending:
        error = unsupported_ops_error(offending, "not in the MBLT operator set (could not be folded away)",
                                      outputs_clear_of(model.graph, nodes), len(model.graph.outputs))
        cut = model.meta.get(_TAIL_CUT_KEY) if len(_tail_nodes(model.graph)) == len(nodes) else None
        if cut:
            error.hint = (f"The unsupported nodes only compute the model's outputs: compile the graph before them "
                          f"with --output-names {','.join(cut)} (output_names=[...]) and run the rest on the CPU. "
                          + error.hint)
        selectors = sorted({name for node in nodes if node.op_type == "If" for name in _selector_inputs(node)})
        if selectors:
            binds = " ".join(f"--bind-input {name}=VALUE" for name in selectors)
            error.hint = (f"The If's condition depends only on the input(s) {', '.join(selectors)}: bind them to the "
                          f"value you will run with ({binds}; constant_inputs in the API) and the If folds away. "
                          + error.hint)
        raise error


def _selector_inputs(node: ir.Node) -> list[str]:
    """The graph inputs an ``If``'s condition is computed from, when all of them are small integer or bool inputs (a
    sample rate, a mode flag: Silero VAD's ``sr``); empty when the condition also reads anything else at run time."""
    found, pending, seen = [], [node.inputs[0]], set()
    while pending:
        value = pending.pop()
        if value is None or value.name in seen or value.const_value is not None:
            continue
        seen.add(value.name)
        if value.is_graph_input():
            small = value.shape is not None and all(isinstance(d, int) for d in value.shape) and \
                math.prod(value.shape) <= 4
            if not small or value.dtype is None or not (value.dtype.is_integer() or value.dtype == ir.DataType.BOOL):
                return []
            found.append(value.name)
        elif value.producer() is not None:
            pending.extend(value.producer().inputs)
        else:
            return []
    return found


_TAIL_CUT_KEY = "mblt.tail_cut"
"""``model.meta`` (in memory): :func:`_cut_before_tail` on the source's names, for the hint of an unfoldable tail."""


def _note_tail_cut(model: ir.Model) -> None:
    """Keep the source's names of the tensors before an unsupported tail (the canonical graph renames them)."""
    names = _cut_before_tail(model.graph, _tail_nodes(model.graph))
    if names:
        model.meta[_TAIL_CUT_KEY] = names


def _tail_nodes(graph: ir.Graph) -> list[ir.Node]:
    """Nodes outside the MBLT op set (a ``Constant`` aside) that write graph outputs only, which nothing reads."""
    outputs = set(graph.outputs)
    return [node for node in graph if node.op_type != "Constant" and not opset.is_mblt_op(node.domain, node.op_type)
            and all(output in outputs and not output.uses() for output in node.outputs)]


def _cut_before_tail(graph: ir.Graph, tail: list[ir.Node]) -> list[str]:
    """The tensors to end the graph at to leave out the ``tail`` nodes (openWakeWord's ``If`` that runs a verifier
    when the score passes 0.5): the float values they read, their subgraphs' outer reads included (not a
    condition, a graph input or a constant)."""
    read: list[ir.Value] = []
    for node in tail:
        control = {"If": 1, "Loop": 2}.get(node.op_type, 0)  # a condition (and a trip count) is no result
        read.extend(value for value in node.inputs[control:] if value is not None)
        read.extend(outer_reads(node))
    names = []
    for value in read:
        producer = value.producer()
        if value.is_graph_input() or value.const_value is not None or value.dtype == ir.DataType.BOOL \
                or (producer is not None and producer.op_type == "Constant"):
            continue
        if value.name not in names:
            names.append(value.name)
    return names


_SAME_SHAPE_OPS = frozenset({"GroupNormalization", "MeanVarianceNormalization", "InstanceNormalization",
                             "LayerNormalization", "LpNormalization", "Softmax", "LogSoftmax", "Hardmax"})
"""Ops whose first output has their first input's shape (ONNX shape inference misses some of them)."""


def _fill_same_shape_outputs(model: ir.Model) -> int:
    """Give outputs of shape-preserving ops their input's shape where inference left none; returns how many."""
    filled = 0
    for node in model.graph:
        output, source = node.outputs[0], node.inputs[0]
        if node.op_type in _SAME_SHAPE_OPS and output.shape is None and source is not None and source.shape:
            output.shape = ir.Shape(list(source.shape))
            output.dtype = output.dtype or source.dtype
            filled += 1
    return filled


def _has_dynamic_shapes(model: ir.Model) -> bool:
    return any(value.shape is None or not all(_is_static(d) for d in value.shape.dims)
               for node in model.graph for value in node.outputs)


def _check_static_shapes(model: ir.Model) -> None:
    dynamic = []
    for node in model.graph:
        for value in node.outputs:
            if value.shape is None or not all(_is_static(d) and d >= 0 for d in value.shape.dims):
                dynamic.append(f"{value.name} ({_shape_text(value.shape)})")
    if dynamic:
        raise DynamicShapeError(
            f"{len(dynamic)} tensor(s) have no static shape after canonicalization: {', '.join(dynamic[:5])}.",
            hint="Pin the model's input shapes with input_shape_dict; data-dependent shapes are not supported.")


def unsupported_ops_error(offending: Mapping[str, list[str]], reason: str, keep_outputs: Sequence[str] = (),
                          total_outputs: int = 0) -> UnsupportedOpsError:
    """One error listing every offending op type with its count and first node names; ``keep_outputs``: the model's
    outputs computed without them (of ``total_outputs``), offered as ``output_names`` when some but not all are."""
    counts = Counter({op: len(nodes) for op, nodes in offending.items()})
    ops = [{"op": op, "count": count, "nodes": offending[op][:3], "reason": reason}
           for op, count in counts.most_common()]
    listing = "; ".join(f"{o['op']} x{o['count']} (e.g. {', '.join(o['nodes'])})" for o in ops)
    hint = "Replace these operators in the source model or export it differently."
    if any(op.split("::")[-1] in _QOPERATOR_OPS for op in counts):
        hint = ("This model was quantized in onnxruntime's QOperator format (QLinear* / QGemm nodes). Give the "
                "float model, or a QDQ export (quantize_static(..., quant_format=QuantFormat.QDQ)): this compiler "
                "calibrates and quantizes on its own.")
    if any(op.startswith("ai.onnx.ml::") for op in counts):
        hint = ("These are classical-ML operators (scikit-learn converters). The linear ones (Scaler, "
                "LinearClassifier/LinearRegressor with integer class labels, Normalizer, ArrayFeatureExtractor) are read "
                "as tensor ops; convert tree ensembles with hummingbird-ml (convert(model, 'torch', "
                "extra_config={'tree_implementation': 'gemm'}), then torch.onnx.export), train on integer class labels "
                "instead of strings, or end the graph before these operators.")
    keep = keep_outputs_hint(keep_outputs, total_outputs)
    return UnsupportedOpsError(f"{sum(counts.values())} node(s) use operators the compiler cannot parse: "
                               f"{listing} — {reason}.", hint=hint + keep, ops=ops,
                               **({"keep_outputs": list(keep_outputs)} if keep else {}))


_QOPERATOR_OPS = {"QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool",
                  "QLinearAveragePool", "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax",
                  "QLinearReduceMean", "QLinearWhere", "QGemm", "QLinearConvTranspose", "ConvInteger",
                  "MatMulInteger"}
"""onnxruntime's QOperator-format ops: their presence means a model quantized outside this compiler."""


def _has_schema(node: ir.Node, opset_imports: Mapping[str, int]) -> bool:
    domain = "" if node.domain == "ai.onnx" else node.domain
    version = node.version or opset_imports.get(domain) or opset_imports.get(node.domain)
    return version is not None and _schema_exists(node.op_type, version, domain)


def _schema_exists(op_type: str, version: int, domain: str) -> bool:
    try:
        onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return False
    return True


def _qualified(node: ir.Node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def _is_static(dim: object) -> bool:
    return isinstance(dim, int) and dim >= 0  # Paddle writes -1 for dynamic dims


def _shape_text(dims: object) -> str:
    if dims is None:
        return "unknown"
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


_build_registries()
