"""The opset conversion with large Constant weights set aside gives the library's conversion, byte for byte."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.version_converter
from onnx import TensorProto, helper, numpy_helper

from compiler_core.mblt import conversion


def _opset11_model() -> onnx.ModelProto:
    """Constant weights (one large, one small), a Conv, a ReduceMean with an ``axes`` attribute (an input from 18)."""
    weights = np.arange(8 * 4 * 3 * 3, dtype=np.float32).reshape(8, 4, 3, 3) / 100  # 288 elements
    scale = np.linspace(-1, 1, 8 * 16 * 16, dtype=np.float32).reshape(1, 8, 16, 16)  # 2048 elements: set aside
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(weights)),
             helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(scale)),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("ReduceMean", ["m"], ["y"], axes=[2, 3], keepdims=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 1, 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=10)


def _bytes(model: ir.Model) -> bytes:
    return ir.to_proto(model).SerializeToString(deterministic=True)


def _library(proto: onnx.ModelProto) -> ir.Model:
    model = ir.serde.deserialize_model(proto)
    onnxscript.version_converter.convert_version(model, 21, fallback=True)
    return model


def test_conversion_sets_large_constants_aside_and_matches_the_library(monkeypatch):
    proto = _opset11_model()
    seen = []
    real = onnx.version_converter.convert_version

    def spy(model, version):
        seen.append({n.output[0]: n.attribute[0].t.HasField("raw_data") for n in model.graph.node
                     if n.op_type == "Constant"})
        return real(model, version)

    reference = _library(proto)
    monkeypatch.setattr(onnx.version_converter, "convert_version", spy)
    ours = ir.serde.deserialize_model(proto)
    conversion.convert_version(ours, 21)
    assert seen == [{"w": True, "s": False}]  # only the large tensor went without its bytes
    assert ours.opset_imports[""] == 21
    assert _bytes(ours) == _bytes(reference)


def test_a_constant_node_lost_in_conversion_converts_again_with_its_weights(monkeypatch):
    proto = _opset11_model()
    real = onnx.version_converter.convert_version
    calls = []

    def renaming(model, version):  # the first conversion renames the large Constant's output
        calls.append(model)
        converted = real(model, version)
        if len(calls) == 1:
            for node in converted.graph.node:
                node.output[:] = ["moved" if name == "s" else name for name in node.output]
                node.input[:] = ["moved" if name == "s" else name for name in node.input]
        return converted

    monkeypatch.setattr(onnx.version_converter, "convert_version", renaming)
    model = ir.serde.deserialize_model(proto)
    conversion.convert_version(model, 21)
    assert len(calls) == 2
    constants = {node.outputs[0].name: node.attributes["value"].value.numpy() for node in model.graph
                 if node.op_type == "Constant"}
    np.testing.assert_array_equal(constants["s"], numpy_helper.to_array(proto.graph.node[1].attribute[0].t))
    monkeypatch.undo()
    assert _bytes(model) == _bytes(_library(proto))


def test_a_failed_conversion_leaves_the_opset(monkeypatch):
    def failing(model, version):
        raise RuntimeError("no adapter")

    monkeypatch.setattr(onnx.version_converter, "convert_version", failing)
    model = ir.serde.deserialize_model(_opset11_model())
    conversion.convert_version(model, 21)
    assert model.opset_imports[""] == 11
