"""Rewrite rules indexed by their pattern's root op type rewrite exactly as the full rule sets do."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.optimizer
import pytest
import realmodels
from onnx import TensorProto, helper, numpy_helper
from onnxscript import rewriter

from compiler_core.api import parse_model
from compiler_core.mblt import canonicalize
from compiler_core.mblt.rule_index import indexed_rules, input_op_types, root_op_type


def test_every_rule_we_apply_has_a_root_op_type():
    rules = [*canonicalize.MBLT_REWRITE_RULES, *canonicalize._LIBRARY_RULES, *rewriter._DEFAULT_REWRITE_RULES]
    unindexed = [rule.name or repr(rule) for rule in rules if root_op_type(rule) is None]
    assert not unindexed  # each of these would still be tried on every node


def test_an_indexed_rule_skips_other_op_types_and_tries_its_own():
    rule = canonicalize.common_rules.mul_by_1_rule
    (indexed,) = indexed_rules([rule])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "one"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    relu, mul = list(model.graph)
    assert root_op_type(rule) == "Mul"
    assert indexed.try_rewrite(model, model.graph, relu) is None
    assert indexed.try_rewrite(model, model.graph, mul) is not None
    assert rule.try_rewrite(model, model.graph, mul) is not None


def test_an_indexed_rule_skips_a_root_whose_input_comes_from_another_op_type():
    """Conv -> Mul(per-channel constant) fusion: a Mul after a Relu is skipped before matching; one after a Conv is tried."""
    rule = next(r for r in canonicalize.MBLT_REWRITE_RULES
                if root_op_type(r) == "Mul" and [op for _, op in input_op_types(r)] == ["Conv"])
    (indexed,) = indexed_rules([rule])
    ((index, _),) = input_op_types(rule)
    weights = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    two = numpy_helper.from_array(np.array([2.0, 3.0], dtype=np.float32).reshape(2, 1, 1), "two")

    def operands(produced: str) -> list[str]:
        return [produced, "two"] if index == 0 else ["two", produced]

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", operands("r"), ["m"]),
         helper.make_node("Conv", ["m", "w"], ["c"]), helper.make_node("Mul", operands("c"), ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])], [weights, two])
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    model = ir.serde.deserialize_model(proto)
    _, mul_after_relu, _, mul_after_conv = list(model.graph)
    assert indexed.try_rewrite(model, model.graph, mul_after_relu) is None
    assert rule.try_rewrite(model, model.graph, mul_after_relu) is None  # the full match agrees
    assert rule.try_rewrite(model, model.graph, mul_after_conv) is not None
    assert indexed.try_rewrite(model, model.graph, mul_after_conv) is not None


def _unindexed(monkeypatch):
    monkeypatch.setattr(canonicalize, "indexed_rules", list)
    monkeypatch.setattr(canonicalize, "optimize", onnxscript.optimizer.optimize_ir)


@pytest.mark.parametrize("name", ["mobilenet_v2", "ppocr_cls"])
def test_real_models_canonicalize_to_the_same_graph_with_and_without_the_index(name, monkeypatch):
    source, shapes, constants = realmodels.real_models()[name]()
    indexed, _ = parse_model(source, input_shape_dict=shapes or None, constant_inputs=constants)
    _unindexed(monkeypatch)
    full, _ = parse_model(source, input_shape_dict=shapes or None, constant_inputs=constants)
    assert ir.serde.serialize_model(indexed).SerializeToString() == ir.serde.serialize_model(full).SerializeToString()
