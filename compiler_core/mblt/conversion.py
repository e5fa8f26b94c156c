"""Opset conversion: ``onnxscript.version_converter.convert_version(model, target, fallback=True)``, with the
ONNX C API fallback called on a proto whose large ``Constant`` weights are set aside.

onnxscript converts opsets 18-25 itself and hands older models to ``onnx.version_converter`` (C++),
which copies every tensor several times (into its own graph and back, across the Python boundary
each way). Models that keep their weights in ``Constant`` nodes (PP-OCR: about 10 MB) spent most of
that call copying them: 61 ms of PP-OCRv4 rec's conversion, 23 ms without the weights. Upgrading
adapters never read a weight's values (they turn attributes into inputs) and the converter's shape
inference reads only small constants (shapes, axes), so the raw bytes of each ``Constant`` tensor of
more than :data:`LARGE_CONSTANT_ELEMENTS` elements are taken out of the serialized proto before the
call and written back into the same ``Constant`` node of the converted proto. Where a node cannot be
found again, the model is converted once more with its weights in place, so the result is always what
the library gives.
"""

from __future__ import annotations

import logging
import math

import onnx
import onnx_ir as ir
import onnxscript.version_converter
from onnxscript.version_converter import _c_api_utils, _version_converter

from compiler_core.mblt.opset_steps import convert_natively, softmax_axes_last
from compiler_core.mblt.rule_index import Inline, RemoveUnusedFunctions, RemoveUnusedNodes, RemoveUnusedOpsets

logger = logging.getLogger(__name__)

LARGE_CONSTANT_ELEMENTS = 1000
"""``Constant`` tensors of more elements than this (onnxscript's limit for initializers) are set aside."""


def convert_version(model: ir.Model, target_version: int) -> None:
    """Convert ``model`` in place to ``target_version`` of the default opset, as onnxscript does with fallback.

    A failed C API conversion is logged and leaves the model's opset as it was (as in onnxscript).
    """
    ir.passes.Sequential(Inline(), RemoveUnusedFunctions(), RemoveUnusedOpsets())(model)
    if _version_converter.version_supported(model, target_version):  # onnxscript's own converter (or none)
        onnxscript.version_converter.convert_version(model, target_version, fallback=True)
        return
    if model.graph.opset_imports.get("") != target_version:
        try:
            proto = _c_api_utils.call_onnx_api(lambda source: _convert_proto(source, target_version), model)
        except Exception as error:  # the C API raises plain exceptions; the caller checks the resulting opset
            logger.warning("The ONNX C API could not convert the model to opset %d; the model was not modified",
                           target_version, exc_info=error)
        else:
            _adopt(model, ir.from_proto(proto))
    ir.passes.Sequential(RemoveUnusedNodes(), RemoveUnusedFunctions(), RemoveUnusedOpsets())(model)


def convert_source_proto(proto: onnx.ModelProto,
                         target_version: int) -> tuple[onnx.ModelProto, bool, dict[str, onnx.TensorProto]]:
    """The C API conversion of :func:`convert_version` on a source protobuf, followed by ONNX's strict inference.

    Where :func:`~compiler_core.mblt.opset_steps.convert_natively` writes the C API's upgrade of the model and
    strict inference succeeds on it, that is the result and the C API is not called. The C API call sees what :func:`convert_version` gives it (every initializer also a graph input, the large ones
    without their data, the large ``Constant`` weights set aside). Afterwards only the user's inputs remain
    inputs, and each large initializer is back in its place, in the order :func:`convert_version` leaves them,
    as a data-less entry (its name, type and dims): the caller gives it its tensor, returned by name, once
    the model is deserialized, so the weights are never copied. ``proto`` is consumed.

    Returns:
        The converted model (with the inferred shapes if strict inference succeeded), whether it succeeded,
        and the large initializers' tensors by name.

    Raises:
        Exception: the C API could not convert the model (what :func:`convert_version` logs).
    """
    result, inferred, aside, pending = convert_source_proto_weights_apart(proto, target_version)
    for tensor, data in pending.values():
        tensor.raw_data = data
    return result, inferred, aside


def convert_source_proto_weights_apart(
        proto: onnx.ModelProto, target_version: int,
) -> tuple[onnx.ModelProto, bool, dict[str, onnx.TensorProto], dict[str, tuple[onnx.TensorProto, bytes]]]:
    """:func:`convert_source_proto`, leaving the large ``Constant`` weights out of the result: they are returned as
    output name -> (the ``Constant``'s tensor in the result, its bytes), for the caller to write where it wants them
    (an initializer lifted from the ``Constant``: one copy of the weights fewer)."""
    user_inputs = len(proto.graph.input)
    source_version = _default_opset(proto)
    aside = _initializers_to_inputs(proto)
    weights = _take_constant_weights(proto)
    result, inferred = _native_conversion(proto, target_version)
    if not inferred:  # not written natively, or its inference fails: the C API's result, whatever it infers
        converted = onnx.version_converter.convert_version(proto, target_version)
        result, inferred = _strict_inference(converted)  # without the weights: they would be copied in and out
    pending = _constant_weight_targets(result, weights) if weights else {}
    if pending is None:
        logger.debug("A Constant node changed in the opset conversion; converting again with its weights")
        _put_constant_weights(proto, weights)
        result, inferred = _strict_inference(onnx.version_converter.convert_version(proto, target_version))
        pending = {}
    _inputs_to_initializers(result, user_inputs, aside)
    keep_asymmetric_resizes(result, source_version)
    return result, inferred, aside, pending


def _native_conversion(proto: onnx.ModelProto, target_version: int) -> tuple[onnx.ModelProto | None, bool]:
    """(:func:`convert_natively`'s upgrade with ONNX's strict inference, True) where it is written and inference
    succeeds, else (None, False); ``proto`` is not modified.

    The upgrade is first written with every Softmax on its input's last axis, so that one strict inference both types
    the result and tells the Softmax input ranks; only where that does not hold (an inner axis, an unknown rank) is it
    written again the C API's way, after the C API's own non-strict inference of the ranks.
    """
    converted = convert_natively(proto, target_version, last_axis=True)
    if converted is None:
        return None, False
    result, inferred = _strict_inference(converted)
    if not softmax_axes_last(proto, result if inferred else None, target_version):
        converted = convert_natively(proto, target_version)
        if converted is None:
            return None, False
        result, inferred = _strict_inference(converted)
    if inferred:
        logger.debug("Upgraded opset %s -> %s without the C API", proto.opset_import[0].version, target_version)
    return result, inferred


def _strict_inference(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """(the model with ONNX's strict inference, True), or (the model as given, False) when inference fails."""
    try:
        return onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True), True
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as error:
        logger.debug("Strict inference of the converted model fails (%s); shapes are inferred later", error)
        return proto, False


def _initializers_to_inputs(proto: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Declare every initializer as a graph input too and take the large ones out (onnxscript's ``call_onnx_api``
    on the model); returns them by name (taken out of the proto, not copied)."""
    graph = proto.graph
    aside: dict[str, onnx.TensorProto] = {}
    large = []
    for index, tensor in enumerate(graph.initializer):
        info = graph.input.add()
        info.name = tensor.name
        tensor_type = info.type.tensor_type
        tensor_type.elem_type = tensor.data_type
        tensor_type.shape.SetInParent()
        for size in tensor.dims:
            tensor_type.shape.dim.add().dim_value = size
        if math.prod(tensor.dims) > LARGE_CONSTANT_ELEMENTS:
            aside[tensor.name] = tensor
            large.append(index)
    for index in reversed(large):
        del graph.initializer[index]  # the message lives on in ``aside``
    return aside


def _inputs_to_initializers(proto: onnx.ModelProto, user_inputs: int, aside: dict[str, onnx.TensorProto]) -> None:
    """Undo :func:`_initializers_to_inputs` on the converted model: a data-less entry for each set-aside initializer
    follows the other initializers, in the order of the inputs, and only the user's inputs remain inputs."""
    graph = proto.graph
    for info in graph.input[user_inputs:]:
        if info.name in aside:
            tensor = aside[info.name]
            entry = graph.initializer.add()
            entry.name, entry.data_type = tensor.name, tensor.data_type
            entry.dims.extend(tensor.dims)
    del graph.input[user_inputs:]


def _adopt(model: ir.Model, converted: ir.Model) -> None:
    """Make the converted graph the model's, with the initializers the C API call took out as inputs."""
    for value in converted.graph.inputs:
        if value.name in model.graph.initializers:
            value.const_value = model.graph.initializers[value.name].const_value
            converted.graph.register_initializer(value)
    user_inputs = converted.graph.inputs[:len(model.graph.inputs)]
    converted.graph.inputs.clear()
    converted.graph.inputs.extend(user_inputs)
    model.graph = converted.graph


def _convert_proto(proto: onnx.ModelProto, target_version: int) -> onnx.ModelProto:
    """``onnx.version_converter.convert_version`` with the large ``Constant`` weights set aside during the call."""
    source_version = _default_opset(proto)
    weights = _take_constant_weights(proto)
    converted = onnx.version_converter.convert_version(proto, target_version)
    if weights and not _put_constant_weights(converted, weights):
        logger.debug("A Constant node changed in the opset conversion; converting again with its weights")
        _put_constant_weights(proto, weights)
        converted = onnx.version_converter.convert_version(proto, target_version)
    keep_asymmetric_resizes(converted, source_version)
    return converted


def _default_opset(proto: onnx.ModelProto) -> int | None:
    return next((entry.version for entry in proto.opset_import if entry.domain in ("", "ai.onnx")), None)


def keep_asymmetric_resizes(converted: onnx.ModelProto, source_version: int | None) -> int:
    """Give the Resize nodes converted from opset 9/10 (``Upsample``, ``Resize``-10) their old coordinates.

    Before opset 11 Resize and Upsample map output pixel ``x`` to input ``x / scale`` (``asymmetric``; onnxruntime
    runs them so, and ``floor`` picks the nearest pixel of an upsampling); the C API's adapters write a Resize-11
    without ``coordinate_transformation_mode``, whose default is ``half_pixel``: a bilinear opset-9 upsampling
    shifted by a quarter pixel. Returns how many nodes were given the old mode.
    """
    if source_version is None or source_version >= 11:
        return 0
    fixed = 0
    for node in converted.graph.node:
        names = {attribute.name for attribute in node.attribute}
        if node.op_type != "Resize" or node.domain not in ("", "ai.onnx") or "coordinate_transformation_mode" in names:
            continue
        node.attribute.append(onnx.helper.make_attribute("coordinate_transformation_mode", "asymmetric"))
        if "nearest_mode" not in names:
            node.attribute.append(onnx.helper.make_attribute("nearest_mode", "floor"))
        fixed += 1
    return fixed


def _large_constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Output name -> ``value`` tensor of each main-graph ``Constant`` node whose tensor is stored as raw bytes
    and has more than :data:`LARGE_CONSTANT_ELEMENTS` elements."""
    found = {}
    for node in graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            continue
        for attribute in node.attribute:
            if attribute.name == "value" and attribute.HasField("t") and attribute.t.HasField("raw_data") \
                    and math.prod(attribute.t.dims) > LARGE_CONSTANT_ELEMENTS:
                found[node.output[0]] = attribute.t
    return found


def _take_constant_weights(proto: onnx.ModelProto) -> dict[str, tuple[list[int], int, bytes]]:
    """Clear the raw bytes of the large ``Constant`` tensors; returns output name -> (dims, data type, bytes)."""
    weights = {}
    for name, tensor in _large_constant_tensors(proto.graph).items():
        weights[name] = (list(tensor.dims), tensor.data_type, tensor.raw_data)
        tensor.ClearField("raw_data")
    return weights


def _put_constant_weights(proto: onnx.ModelProto, weights: dict[str, tuple[list[int], int, bytes]]) -> bool:
    """Write the bytes back into the ``Constant`` nodes of the same output names; False (nothing written) if one of
    them is missing or no longer a bare tensor of the same dims and type."""
    targets = _constant_weight_targets(proto, weights)
    if targets is None:
        return False
    for tensor, data in targets.values():
        tensor.raw_data = data
    return True


def _constant_weight_targets(proto: onnx.ModelProto, weights: dict[str, tuple[list[int], int, bytes]],
                             ) -> dict[str, tuple[onnx.TensorProto, bytes]] | None:
    """Output name -> (the tensor of the ``Constant`` node of that output, its bytes), or None if one of them is
    missing or no longer a bare tensor of the same dims and type."""
    targets = {}
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1 \
                and node.output[0] in weights:
            tensors = [a.t for a in node.attribute if a.name == "value" and a.HasField("t")]
            dims, data_type, _ = weights[node.output[0]]
            if len(tensors) == 1 and list(tensors[0].dims) == dims and tensors[0].data_type == data_type \
                    and not tensors[0].HasField("raw_data"):
                targets[node.output[0]] = tensors[0]
    if targets.keys() != weights.keys():
        return None
    return {name: (tensor, weights[name][2]) for name, tensor in targets.items()}
