"""Drive the converters over a decoded TFLite graph and assemble the ONNX model.

Every operator is tried even after one fails, so a single :class:`UnsupportedOpsError` lists every
unsupported op type (with counts and the first output tensor names); ops downstream of a failure
are skipped silently rather than reported twice.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from compiler_core.errors import (
    ArgumentError,
    DynamicShapeError,
    InvalidModelError,
    ModelLoadError,
    QBCompilerError,
    UnsupportedOpsError,
)
from compiler_core.frontends.onnx import check_references
from compiler_core.frontends.tflite.builder import GraphBuilder, NotConvertible, UpstreamUnavailable
from compiler_core.frontends.tflite.converters import CONVERTERS
from compiler_core.frontends.tflite.reader import Operator, Tensor, TFLiteGraph
from compiler_core.mblt.cut import keep_outputs_hint

logger = logging.getLogger(__name__)

ONNX_OPSET = 21
IR_VERSION = 10
CALIBRATION_HINTS_KEY = "mblt.calibration_hints"
SOURCE_FORMAT_KEY = "mblt.source_format"
_CORRUPT_HINT = "Pass a complete, uncorrupted .tflite file (re-export it, or download it again)."


def import_graph(graph: TFLiteGraph, output_names: Sequence[str] | None = None) -> ir.Model:
    """Convert a decoded TFLite subgraph to an ONNX (opset 21) onnx-ir model.

    Args:
        graph: The decoded subgraph.
        output_names: Tensors (ONNX value names, i.e. TFLite names) to end the graph at. Operators that
            only feed other outputs may then fail to convert (e.g. a custom detection post-processing op).

    Raises:
        UnsupportedOpsError: some operators have no converter or use options ONNX cannot express (and
            ``output_names`` do not avoid them); ``fields["cut_at"]`` names the tensors to end the graph at.
        ArgumentError: an output name is not a tensor the conversion produced.
    """
    _check_static_inputs(graph)
    builder = GraphBuilder(graph)
    failures: dict[str, list[tuple[Operator, str]]] = {}
    for op in graph.operators:
        reason = _convert_one(builder, op)
        if reason is not None:
            failures.setdefault(op.display_name, []).append((op, reason))
            builder.unavailable.update(op.outputs)
    outputs = _requested_outputs(builder, graph, output_names) if output_names else list(graph.outputs)
    if failures and not (output_names and all(index not in builder.unavailable for index in outputs)):
        keep = [builder.value_name(index) for index in graph.outputs if index not in builder.unavailable]
        raise _unsupported_error(graph, failures, _cut_before(builder, graph, failures), keep)
    return _assemble(builder, graph, outputs)


def _requested_outputs(builder: GraphBuilder, graph: TFLiteGraph, output_names: Sequence[str]) -> list[int]:
    """The TFLite tensor indices of ``output_names``."""
    index = {builder.value_name(i): i for i in range(len(graph.tensors))}
    missing = [name for name in output_names if name not in index]
    if missing:
        raise ArgumentError(f"output_names names {missing}, which are not tensors of '{graph.path.name}'.",
                            hint="Use the TFLite tensor names (as Netron shows them); the model's outputs: "
                                 f"{', '.join(builder.value_name(i) for i in graph.outputs)}.")
    return [index[name] for name in output_names]


def _cut_before(builder: GraphBuilder, graph: TFLiteGraph, failures: dict[str, list[tuple[Operator, str]]]) -> list[str]:
    """Run-time tensors the failed operators read that did convert: ending the graph there avoids them.

    Empty unless the failed operators are the model's last steps: when a convertible operator is lost
    because it reads a failed one's result, a cut would drop part of the model, not its post-processing.
    """
    failed = [op for entries in failures.values() for op, _ in entries]
    failed_ids = {id(op) for op in failed}
    if any(id(op) not in failed_ids and any(index in builder.unavailable for index in op.outputs)
           for op in graph.operators):
        return []
    cut: list[str] = []
    for op in failed:
        for index in op.inputs:
            if index >= 0 and index not in builder.unavailable and index not in builder.constants \
                    and index not in graph.inputs and builder.value_name(index) not in cut:
                cut.append(builder.value_name(index))
    return cut


def _check_static_inputs(graph: TFLiteGraph) -> None:
    """A dynamic batch is pinned to 1; other open dimensions would make every shape below a guess."""
    for index in graph.inputs:
        tensor = graph.tensors[index]
        open_dims = [dim for dim in tensor.dynamic_dims if dim != 0]
        if open_dims:
            raise DynamicShapeError(
                f"'{graph.path.name}': input '{tensor.name}' has dynamic dimension(s) {open_dims} "
                f"(signature {_signature(tensor)}); TFLite stores no sizes for them.",
                hint="Export the .tflite with a fixed input shape (e.g. a concrete function with a static "
                     "TensorSpec, or interpreter.resize_tensor_input before conversion).",
                input=tensor.name, file=str(graph.path))
        if tensor.dynamic_dims:
            logger.info("Input %s: dynamic batch pinned to %d", tensor.name, tensor.shape[0])


def _signature(tensor: Tensor) -> list[int]:
    return [-1 if i in tensor.dynamic_dims else dim for i, dim in enumerate(tensor.shape)]


def _convert_one(builder: GraphBuilder, op: Operator) -> str | None:
    """Run the converter of ``op``; the reason it failed, or None."""
    converter = CONVERTERS.get(op.key)
    if converter is None and op.op_type == "CUSTOM" and (op.custom_code or "").startswith(SELECT_TF_PREFIX):
        return (f"a TensorFlow op (tf.{op.custom_code[len(SELECT_TF_PREFIX):]}) the converter kept with "
                "SELECT_TF_OPS; only TFLite builtins are read")
    if converter is None and op.op_type == "WHILE":
        return ("a loop: TensorFlow's converter writes a Keras LSTM/GRU/SimpleRNN so unless its unroll=True; "
                "convert with unroll=True, or give the .keras file, whose recurrent layers are unrolled here")
    if converter is None:
        kind = f"custom operator (custom_code '{op.custom_code}')" if op.op_type == "CUSTOM" else "operator"
        return f"no converter for this TFLite {kind}"
    try:
        converter(builder, op)
    except UpstreamUnavailable:
        builder.unavailable.update(op.outputs)
    except NotConvertible as error:
        return str(error)
    except QBCompilerError:
        raise
    except Exception as error:  # a corrupt operator (wrong input count, options, shapes) trips the converter
        raise ModelLoadError(
            f"'{builder.graph.path.name}' is corrupt: operator {op.index} ({op.display_name}) cannot be read "
            f"({type(error).__name__}: {error}).", hint=_CORRUPT_HINT, file=str(builder.graph.path),
            node=f"op_{op.index}") from error
    return None


SELECT_TF_PREFIX = "Flex"
"""The custom code prefix of TensorFlow ops a ``SELECT_TF_OPS`` conversion keeps (``FlexCumprod``)."""
STATE_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"})
"""TFLite operators of resource variables: state kept between calls (streaming models such as microWakeWord's)."""


def _unsupported_error(graph: TFLiteGraph, failures: dict[str, list[tuple[Operator, str]]],
                       cut_at: list[str], keep_outputs: list[str]) -> UnsupportedOpsError:
    counts = Counter({name: len(entries) for name, entries in failures.items()})
    ops = [{"op": name, "count": count,
            "nodes": [graph.tensors[op.outputs[0]].name if op.outputs else f"op_{op.index}"
                      for op, _ in failures[name][:3]],
            "reason": "; ".join(sorted({reason for _, reason in failures[name]}))}
           for name, count in counts.most_common()]
    listing = "; ".join(f"{o['op']} x{o['count']} (e.g. {', '.join(o['nodes'])}: {o['reason']})" for o in ops)
    hint = ("Replace these operators in the source model, or convert it to ONNX another way and use "
            "--backend onnx.")
    keep = "" if cut_at else keep_outputs_hint(keep_outputs, len(graph.outputs))
    if STATE_OPS & set(counts):  # a streaming model keeps buffers between calls in resource variables
        hint = ("This is a streaming model: it keeps state between calls in resource variables "
                f"({', '.join(sorted(STATE_OPS & set(counts)))}), and an MXQ program holds no state from one "
                "inference to the next. Convert the model's non-streaming form (the whole input window in one "
                "call), or export it with the states as extra inputs and outputs that your code carries over.")
    elif cut_at:  # only post-processing fails: the rest of the model converts
        hint = (f"They only process the model's results: end the graph before them with --output-names "
                f"{','.join(cut_at)} (Python: output_names=[...]) and run that step on the MXQ's outputs.")
    if any(name.startswith(f"CUSTOM:{SELECT_TF_PREFIX}") for name in counts):
        hint += (" Select TF ops run TensorFlow itself and cannot be compiled: convert without "
                 "tf.lite.OpsSet.SELECT_TF_OPS (replace the ops the converter then names).")
    fields = {"cut_at": cut_at} if cut_at else {"keep_outputs": keep_outputs} if keep else {}
    return UnsupportedOpsError(
        f"'{graph.path.name}': {sum(counts.values())} TFLite operator(s) cannot be converted: {listing}.",
        hint=hint + keep, ops=ops, file=str(graph.path), stage="tflite import", **fields)


def _assemble(builder: GraphBuilder, graph: TFLiteGraph, output_indices: list[int]) -> ir.Model:
    outputs = [_output_value(builder, graph, index) for index in output_indices]
    proto_graph = helper.make_graph(
        builder.nodes, _graph_name(graph),
        inputs=[_value_info(builder.value_name(i), graph.tensors[i]) for i in graph.inputs],
        outputs=outputs, initializer=builder.initializer_protos())
    proto = helper.make_model(proto_graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              producer_name="qbstudio tflite frontend", ir_version=IR_VERSION)
    helper.set_model_props(proto, {CALIBRATION_HINTS_KEY: json.dumps(calibration_hints(builder, graph)),
                                   SOURCE_FORMAT_KEY: "tflite"})
    try:
        check_references(proto.graph, graph.path)
    except InvalidModelError as error:  # a corrupt file: an operator reads or rewrites a tensor it must not
        raise ModelLoadError(f"'{graph.path.name}' is corrupt: {error.message}", hint=_CORRUPT_HINT,
                             file=str(graph.path)) from error
    return ir.serde.deserialize_model(proto)


def _output_value(builder: GraphBuilder, graph: TFLiteGraph, index: int) -> onnx.ValueInfoProto:
    if index in graph.inputs or builder.constant(index) is not None:
        # An output that is an input or a constant still needs a node producing it under its name.
        name = builder.fresh_name(f"{graph.tensors[index].name}_output")
        builder.add_node("Identity", [builder.tensor_value(index)], [name], source=graph.tensors[index].name)
        return _value_info(name, graph.tensors[index])
    return _value_info(builder.value_name(index), graph.tensors[index])


def _value_info(name: str, tensor: Tensor) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _onnx_dtype(tensor), list(tensor.shape))


def _onnx_dtype(tensor: Tensor) -> int:
    """Quantized tensors are carried as float32 real values; others keep their type."""
    if tensor.dtype is None:
        raise UnsupportedOpsError(f"Graph input/output '{tensor.name}' has type {tensor.type_name}, which ONNX "
                                  "cannot represent here.", hint="Export the model with numeric inputs and outputs.",
                                  ops=[], tensor=tensor.name)
    if tensor.quantization is not None and tensor.dtype.kind in "iu":
        logger.warning("Quantized %s '%s' becomes a float32 value holding its real value (see %s)",
                       tensor.type_name, tensor.name, CALIBRATION_HINTS_KEY)
        return onnx.TensorProto.FLOAT
    return helper.np_dtype_to_tensor_dtype(tensor.dtype)


def calibration_hints(builder: GraphBuilder, graph: TFLiteGraph) -> dict[str, dict]:
    """Quantization parameters of every quantized tensor, keyed by TFLite tensor name."""
    hints = {}
    for tensor in graph.tensors:
        quantization = tensor.quantization
        if quantization is None:
            continue
        hints[tensor.name] = {
            "onnx_value": builder.value_name(tensor.index), "dtype": tensor.type_name,
            "kind": "constant" if tensor.data is not None else "activation",
            "scale": [float(s) for s in quantization.scale],
            "zero_point": [int(z) for z in np.asarray(quantization.zero_point).reshape(-1)],
            "axis": int(quantization.axis) if quantization.per_channel else None,
        }
    return hints


def _graph_name(graph: TFLiteGraph) -> str:
    return graph.path.stem or "tflite"
