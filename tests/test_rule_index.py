"""Rewrite rules indexed by their pattern's root op type rewrite exactly as the full rule sets do, and our
constant lifting, opset conversion and shape merging give what the library's passes give."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript.optimizer
import onnxscript.version_converter
import pytest
import realmodels
from onnx import TensorProto, helper, numpy_helper
from onnxscript import rewriter

from compiler_core.api import parse_model
from compiler_core.mblt import canonicalize, conversion, opset_steps
from compiler_core.mblt.rule_index import (
    LiftConstants,
    RemoveUnusedNodes,
    constant_inputs,
    indexed_rules,
    input_op_types,
    root_op_type,
)


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


def test_an_indexed_rule_skips_a_root_whose_constant_operand_is_not_a_scalar_constant():
    """``x * 1``: a Mul by a computed value or by a vector is skipped before matching; a Mul by a scalar 1 matches."""
    rule = canonicalize.common_rules.mul_by_1_rule
    (indexed,) = indexed_rules([rule])
    assert constant_inputs(rule) == [(1, True)]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["x", "r"], ["a"]),
         helper.make_node("Mul", ["a", "ones"], ["b"]), helper.make_node("Mul", ["b", "one"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "ones"), numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    _, by_computed, by_vector, by_scalar = list(model.graph)
    for node in (by_computed, by_vector):
        assert indexed.try_rewrite(model, model.graph, node) is None
        assert rule.try_rewrite(model, model.graph, node) is None  # the full match agrees
    assert indexed.try_rewrite(model, model.graph, by_scalar) is not None


def test_an_indexed_rule_skips_a_root_whose_constant_operand_has_another_value():
    """``x * 1`` on ``x * 2``, ``x * 1.000001`` and ``x * 1``: the first is skipped before matching (the full match
    fails on it too); the nearly-1 one is within the pattern's tolerance, so both rewrite it and ``x * 1``."""
    rule = copy.copy(canonicalize.common_rules.mul_by_1_rule)
    library_try = rule.try_rewrite
    tried = []
    rule.try_rewrite = lambda *args, **kwargs: tried.append(args[2]) or library_try(*args, **kwargs)
    (indexed,) = indexed_rules([rule])
    constants = [numpy_helper.from_array(np.array(value, np.float32), name)
                 for name, value in (("two", 2.0), ("nearly", 1.000001), ("one", 1.0))]
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Mul", ["a", "nearly"], ["b"]),
         helper.make_node("Mul", ["b", "one"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], constants)
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    by_two, by_nearly, by_one = list(model.graph)
    assert library_try(model, model.graph, by_two) is None
    assert [indexed.try_rewrite(model, model.graph, node) is not None for node in (by_two, by_nearly, by_one)] \
        == [False, True, True]
    assert tried == [by_nearly, by_one]


def _unindexed(monkeypatch):
    """The library's passes in place of each faster equivalent of ours."""
    monkeypatch.setattr(canonicalize, "indexed_rule_set", rewriter.RewriteRuleSet)
    monkeypatch.setattr(canonicalize, "optimize", onnxscript.optimizer.optimize_ir)
    monkeypatch.setattr(canonicalize, "LiftConstants", ir.passes.common.LiftConstantsToInitializersPass)
    monkeypatch.setattr(canonicalize, "convert_version",
                        lambda model, version: onnxscript.version_converter.convert_version(model, version, fallback=True))
    monkeypatch.setattr(canonicalize, "_fully_typed", lambda model: False)  # the final whole-model inference runs
    monkeypatch.setattr(canonicalize, "_shape_and_dtype", _library_shape_and_dtype)
    monkeypatch.setattr(canonicalize, "frozen_heap", contextlib.nullcontext)
    monkeypatch.setattr(canonicalize, "RemoveUnusedNodes", ir.passes.common.RemoveUnusedNodesPass)
    monkeypatch.setattr(canonicalize, "RemoveUnusedOpsets", ir.passes.common.RemoveUnusedOpsetsPass)
    monkeypatch.setattr(canonicalize, "TopologicalSort", ir.passes.common.TopologicalSortPass)
    monkeypatch.setattr(canonicalize, "_steps_on_proto", lambda *args: None)  # every step on onnx-ir


def _library_shape_and_dtype(type_proto):
    inferred_type = ir.serde.deserialize_type_proto_for_type(type_proto)
    return (ir.serde.deserialize_type_proto_for_shape(type_proto),
            inferred_type.dtype if inferred_type is not None else None)


def test_lift_constants_lifts_as_the_library_pass_does():
    nodes = [helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.arange(6, dtype=np.float32))),
             helper.make_node("Constant", [], ["i"], value_ints=[2, 3]),
             helper.make_node("Constant", [], ["f"], value_float=0.5),
             helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(np.zeros(0, np.int64))),
             helper.make_node("Reshape", ["t", "i"], ["r"]), helper.make_node("Mul", ["r", "f"], ["m"]),
             helper.make_node("Concat", ["e", "i"], ["c"], axis=0),
             helper.make_node("Constant", [], ["out"], value=numpy_helper.from_array(np.ones(2, np.float32)))]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None)
                                               for name in ("m", "c", "out")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    lifted = {}
    for size_limit in (0, 4):  # 4: the 2-element ints, the scalar and the empty tensor stay Constant nodes
        ours, library = (ir.serde.deserialize_model(proto) for _ in range(2))
        LiftConstants(lift_all_constants=True, size_limit=size_limit)(ours)
        ir.passes.common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=size_limit)(library)
        assert ir.to_proto(ours).SerializeToString() == ir.to_proto(library).SerializeToString()
        lifted[size_limit] = sorted(ours.graph.initializers)
    assert lifted == {0: ["e", "f", "i", "t"], 4: ["t"]}  # the graph output "out" stays a Constant node


def test_lift_constants_leaves_a_graph_without_constant_nodes_to_a_quick_walk(monkeypatch):
    """With no ``Constant`` node (the graph after the first lift), the library's walk over every node is skipped."""
    walks = []
    library_call = ir.passes.common.LiftConstantsToInitializersPass.call
    monkeypatch.setattr(ir.passes.common.LiftConstantsToInitializersPass, "call",
                        lambda self, model: walks.append(1) or library_call(self, model))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    assert not LiftConstants(lift_all_constants=True, size_limit=0)(model).modified
    assert walks == []
    model.graph.insert_before(model.graph.node(0), ir.Node("", "Constant", [], [ir.AttrFloat32("value_float", 1.0)]))
    assert LiftConstants(lift_all_constants=True, size_limit=0)(model).modified
    assert walks == [1]


def test_rule_conditions_reject_only_nodes_the_full_try_rejects():
    """Conv without bias, with a non-zero bias, with a zero bias, with auto_pad SAME_UPPER: for each library rule
    with a condition, the indexed rule tries exactly the nodes the full rule rewrites."""
    weights = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    biases = [numpy_helper.from_array(np.full(2, value, np.float32), name) for name, value in (("b1", 1.0), ("b0", 0.0))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c0"]), helper.make_node("Conv", ["c0", "w", "b1"], ["c1"]),
             helper.make_node("Conv", ["c1", "w", "b0"], ["c2"]),
             helper.make_node("Conv", ["c2", "w"], ["y"], auto_pad="SAME_UPPER", kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])], [weights, *biases])
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    model = ir.serde.deserialize_model(proto)
    rules = {rule.name: rule for rule in rewriter._DEFAULT_REWRITE_RULES}
    applied = {}
    for name in ("RemoveOptionalBiasFromConv", "NormalizePadFormatConv"):
        (indexed,) = indexed_rules([rules[name]])
        full = [rules[name].try_rewrite(model, model.graph, node) is not None for node in model.graph]
        ours = [indexed.try_rewrite(model, model.graph, node) is not None for node in model.graph]
        assert ours == full
        applied[name] = full
    assert applied == {"RemoveOptionalBiasFromConv": [False, False, True, False],
                       "NormalizePadFormatConv": [False, False, False, True]}


def test_the_prefilter_follows_the_pattern_up_and_compares_the_values_a_variable_reads():
    """A HardSwish written out in PP-OCR's operand order and a squeeze-excitation gate (``x * HardSigmoid(y)``), a
    Clip by constants and one by a computed bound, a Mul of an activation by a constant: each variant of the library's
    HardSwish fusions, its LayerNorm fusion and our ClipRuntimeBounds runs its full try only on the nodes it rewrites
    (the producers' producers, a variable read twice, the conditions), and rewrites what the full rule rewrites."""
    from compiler_core.mblt.rules import MBLT_REWRITE_RULES

    constants = [numpy_helper.from_array(np.array(value, np.float32), name)
                 for name, value in (("three", 3.0), ("zero", 0.0), ("six", 6.0), ("scale", 2.0))]
    nodes = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Div", ["m", "six"], ["hs"]),
             helper.make_node("ReduceMax", ["hs"], ["top"], keepdims=0),
             helper.make_node("Clip", ["hs", "top"], ["clipped"]),
             helper.make_node("HardSigmoid", ["clipped"], ["gate"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["hs", "gate"], ["se"]), helper.make_node("HardSigmoid", ["se"], ["g2"], alpha=1 / 6,
                                                                             beta=0.5),
             helper.make_node("Mul", ["g2", "se"], ["own"]), helper.make_node("Mul", ["own", "scale"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], constants)
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    model = ir.serde.deserialize_model(proto)
    names = ("HardSwishFusion", "HardSwishFusionFromHardSigmoid", "LayerNormFusion", "ClipRuntimeBounds")
    rules = [rule for rule in [*canonicalize._LIBRARY_RULES, *MBLT_REWRITE_RULES] if rule.name in names]
    applied = {}
    for rule in map(copy.copy, rules):  # the rule objects stay as they are
        full = [rule.try_rewrite(model, model.graph, node) is not None for node in model.graph]
        _assert_tried_only_where_applied(rule, model, full)
        applied[rule.name] = [a or b for a, b in zip(applied.get(rule.name, full), full)]
    ops = [node.op_type for node in model.graph]
    assert [ops[index] for index, hit in enumerate(applied["HardSwishFusion"]) if hit] == ["Div"]
    assert [index for index, hit in enumerate(applied["HardSwishFusionFromHardSigmoid"]) if hit] == [9]
    assert [index for index, hit in enumerate(applied["ClipRuntimeBounds"]) if hit] == [5]
    assert not any(applied["LayerNormFusion"])


def test_a_reshape_to_a_constant_shape_is_not_materialized_again():
    """MaterializeReshapeShape: a Reshape to a constant shape is skipped before matching (the full try rejects it);
    one to a computed shape with a known output shape is tried and rewritten."""
    rules = {rule.name: rule for rule in rewriter._DEFAULT_REWRITE_RULES}
    rule = copy.copy(rules["MaterializeReshapeShape"])
    full = []
    tried = []
    library_try = rule.try_rewrite
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Reshape", ["r", "xs"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(np.array([3, 2], np.int64), "s")])
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    for node_index in (0, 2):
        model = ir.serde.deserialize_model(proto)
        full.append(library_try(model, model.graph, model.graph.node(node_index)) is not None)
    rule.try_rewrite = lambda *args, **kwargs: tried.append(args[2].op_type) or library_try(*args, **kwargs)
    (indexed,) = indexed_rules([rule])
    model = ir.serde.deserialize_model(proto)
    ours = [indexed.try_rewrite(model, model.graph, model.graph.node(index)) is not None for index in (0, 2)]
    assert ours == full == [False, True]
    assert tried == ["Reshape"]  # only the second


def _assert_tried_only_where_applied(rule, model, applied: list[bool]) -> None:
    """The indexed copy of ``rule`` rewrites the nodes the full rule rewrites (``applied``, in graph order), and runs
    the full try (the pattern match and check) on those nodes only."""
    full = [rule.try_rewrite(model, model.graph, node) is not None for node in model.graph]
    tried = []
    library_try = rule.try_rewrite
    rule.try_rewrite = lambda *args, **kwargs: tried.append(args[2]) or library_try(*args, **kwargs)
    (indexed,) = indexed_rules([rule])
    ours = [indexed.try_rewrite(model, model.graph, node) is not None for node in model.graph]
    assert ours == full == applied
    assert tried == [node for node, hit in zip(model.graph, applied) if hit]


def test_the_wide_kernel_condition_rejects_only_convs_the_full_try_rejects():
    """SplitWideConvKernel on a 1x3 kernel, a 1x33 kernel and a 1x33 kernel whose weights are a graph input: the
    indexed rule tries exactly the node the full rule rewrites (the wide constant one)."""
    from compiler_core.mblt.rules import SplitWideConvKernel

    rng = np.random.default_rng(0)
    narrow, wide = (numpy_helper.from_array(rng.standard_normal((2, 2, 1, k)).astype(np.float32), f"w{k}")
                    for k in (3, 33))
    nodes = [helper.make_node("Conv", ["x", "w3"], ["c0"], pads=[0, 1, 0, 1]),
             helper.make_node("Conv", ["c0", "w33"], ["c1"], pads=[0, 16, 0, 16]),
             helper.make_node("Conv", ["c1", "v"], ["y"], pads=[0, 16, 0, 16])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 1, 40]),
                                           helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 2, 1, 33])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 1, 40])], [narrow, wide])
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    _assert_tried_only_where_applied(SplitWideConvKernel.rule(), ir.serde.deserialize_model(proto), [False, True, False])


def test_the_long_stride_condition_rejects_only_convs_the_full_try_rejects():
    """FramedStridedConv on 1-D Convs with stride 2, stride 16 (kernel 32) and no strides attribute: the indexed rule
    tries exactly the node the full rule rewrites (the long stride)."""
    from compiler_core.mblt.rules import FramedStridedConv

    rng = np.random.default_rng(0)
    short, framed = (numpy_helper.from_array(rng.standard_normal((2, 2, k)).astype(np.float32), f"w{k}")
                     for k in (3, 32))
    nodes = [helper.make_node("Conv", ["x", "w3"], ["c0"], strides=[2], pads=[1, 1]),
             helper.make_node("Conv", ["c0", "w32"], ["c1"], strides=[16]),
             helper.make_node("Conv", ["c1", "w3"], ["y"], pads=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3])], [short, framed])
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    _assert_tried_only_where_applied(FramedStridedConv.rule(), ir.serde.deserialize_model(proto), [False, True, False])


def test_name_fix_names_as_the_library_pass_does(monkeypatch):
    """Unique names: nothing to do, and the check alone says so; a duplicated value name, an unnamed value and an
    unnamed node: the library's renaming."""
    from compiler_core.mblt.rule_index import NameFix

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"), helper.make_node("Neg", ["a"], ["y"], name="r1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    ours, library = (ir.serde.deserialize_model(proto) for _ in range(2))
    full_fixes = []
    with monkeypatch.context() as patched:
        library_call = ir.passes.common.NameFixPass.call
        patched.setattr(ir.passes.common.NameFixPass, "call",
                        lambda self, model: full_fixes.append(model) or library_call(self, model))
        assert not NameFix()(ours).modified
        assert full_fixes == []
        ours.graph.node(1).outputs[0].name = "x"  # the output now shares the input's name
        library.graph.node(1).outputs[0].name = "x"
        for model in (ours, library):
            model.graph.node(0).outputs[0].name = ""
            model.graph.node(1).name = ""
        assert NameFix()(ours).modified and ir.passes.common.NameFixPass()(library).modified
    assert len(full_fixes) == 2
    assert ir.to_proto(ours).SerializeToString() == ir.to_proto(library).SerializeToString()


def test_the_folder_hands_the_library_only_nodes_it_may_change(monkeypatch):
    """Conv, Relu, Mul and Add of activations are left alone without the library's node processing (Add has a partial
    evaluator, for shape values only); the constant Add and the Reshape (which has a partial evaluator) go through
    it; the folded graph is the library folder's."""
    from onnxscript.optimizer import _constant_folding

    from compiler_core.mblt.rule_index import _FoldConstants

    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array(rng.standard_normal((2, 2, 1, 1)).astype(np.float32), "w"),
                    numpy_helper.from_array(np.array(1.5, np.float32), "k1"),
                    numpy_helper.from_array(np.array(0.5, np.float32), "k2"),
                    numpy_helper.from_array(np.array([1, 32], np.int64), "s")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["k1", "k2"], ["k"]), helper.make_node("Mul", ["r", "k"], ["m"]),
             helper.make_node("Add", ["m", "k2"], ["a"]), helper.make_node("Reshape", ["a", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], initializers)
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    ours, library = (ir.serde.deserialize_model(proto) for _ in range(2))
    options = {"shape_inference": True, "input_size_limit": 1 << 20, "output_size_limit": 1 << 20}
    assert _constant_folding.FoldConstantsPass(**options)(library).modified
    processed = []
    library_process = _constant_folding.FoldConstantsPass.process_node
    monkeypatch.setattr(_constant_folding.FoldConstantsPass, "process_node",
                        lambda self, node, is_function: processed.append(node.op_type)
                        or library_process(self, node, is_function))
    assert _FoldConstants(**options)(ours).modified
    assert processed == ["Add", "Reshape"]
    assert ir.to_proto(ours).SerializeToString() == ir.to_proto(library).SerializeToString()


def test_the_folder_hands_the_library_an_add_of_shape_values(monkeypatch):
    """An Add of a dimension taken from a dynamic shape and a constant has shape values for both operands: the library's
    partial evaluator gets it (and gives the Reshape after it a symbolic target), as without our shortcut."""
    from onnxscript.optimizer import _constant_folding

    from compiler_core.mblt.rule_index import _FoldConstants

    initializers = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                    numpy_helper.from_array(np.array([1], np.int64), "one"),
                    numpy_helper.from_array(np.array([-1], np.int64), "minus")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Add", ["n", "one"], ["m"]), helper.make_node("Concat", ["m", "minus"], ["t"], axis=0),
             helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    ours, library = (ir.serde.deserialize_model(proto) for _ in range(2))
    options = {"shape_inference": True, "input_size_limit": 1 << 20, "output_size_limit": 1 << 20}
    _constant_folding.FoldConstantsPass(**options)(library)
    processed = []
    library_process = _constant_folding.FoldConstantsPass.process_node
    monkeypatch.setattr(_constant_folding.FoldConstantsPass, "process_node",
                        lambda self, node, is_function: processed.append(node.op_type)
                        or library_process(self, node, is_function))
    _FoldConstants(**options)(ours)
    assert "Add" in processed
    assert ir.to_proto(ours).SerializeToString() == ir.to_proto(library).SerializeToString()


@pytest.mark.parametrize("limit", [16, 1 << 20])
def test_the_folder_builds_folded_tensors_without_protocol_checks(limit, monkeypatch):
    """Folded arrays become tensors without ``ir.tensor`` (its ``typing.Protocol`` checks), with the library's size
    gating: a folded value larger than the limit is kept only when the inputs it frees make up for it."""
    from onnxscript.optimizer import _constant_folding

    from compiler_core.mblt.rule_index import _FoldConstants

    initializers = [numpy_helper.from_array(np.array(1.5, np.float32), "k1"),
                    numpy_helper.from_array(np.array(0.5, np.float32), "k2"),
                    numpy_helper.from_array(np.arange(4, dtype=np.float32), "t"),
                    numpy_helper.from_array(np.array([8], np.int64), "repeats"),
                    numpy_helper.from_array(np.arange(20, dtype=np.float32), "r"),
                    numpy_helper.from_array(np.array([4, 5], np.int64), "s")]
    nodes = [helper.make_node("Add", ["k1", "k2"], ["k"]), helper.make_node("Tile", ["t", "repeats"], ["tiled"]),
             helper.make_node("Reshape", ["r", "s"], ["reshaped"]), helper.make_node("Mul", ["x", "k"], ["y"]),
             helper.make_node("Add", ["tiled", "x32"], ["z"]), helper.make_node("Add", ["reshaped", "x45"], ["w"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("x32", TensorProto.FLOAT, [32]),
                                           helper.make_tensor_value_info("x45", TensorProto.FLOAT, [4, 5])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in "yzw"],
                              initializers)
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    ours, library = (ir.serde.deserialize_model(proto) for _ in range(2))
    options = {"shape_inference": True, "input_size_limit": 1 << 20, "output_size_limit": limit}
    assert _constant_folding.FoldConstantsPass(**options)(library).modified
    built = []
    library_tensor = ir.tensor
    monkeypatch.setattr(ir, "tensor", lambda *args, **kwargs: built.append(args) or library_tensor(*args, **kwargs))
    assert _FoldConstants(**options)(ours).modified
    assert built == []
    assert ("tiled" in ours.graph.initializers) == (limit > 32)
    assert ir.to_proto(ours).SerializeToString() == ir.to_proto(library).SerializeToString()


def test_the_folders_reference_ops_are_the_ones_load_op_returns():
    """For every op of ``onnx.reference`` and opsets 1-26, the class the folder evaluates with is ``load_op``'s (or it
    asks ``load_op``): the same implementations, so the same folded values."""
    from onnx.reference.ops import _op_list, load_op

    from compiler_core.mblt.rule_index import _reference_op

    load_op("", "Relu", 21)  # builds the registry
    implemented = 0
    for op_type in _op_list._registered_operators:
        for version in range(1, 27):
            try:
                expected = load_op("", op_type, version)
            except Exception:  # noqa: BLE001 - no implementation for that version
                expected = None
            assert _reference_op("", op_type, version) is expected, (op_type, version)
            implemented += expected is not None
    assert implemented > 4000
    assert _reference_op("", "Reshape", None) is None and _reference_op("ai.onnx.ml", "Reshape", 21) is None


def test_folding_builds_no_reference_op_registry(tmp_path, monkeypatch):
    """Parsing PP-OCR cls folds 23 nodes with ``onnx.reference`` implementations without ``load_op``'s registry of
    every implementation (built on its first call, 7-9 ms per process); the MBLT is the one the library's evaluator
    gives."""
    from onnx.reference.ops import _op_list
    from onnxscript.optimizer import _constant_folding

    from compiler_core.api import mblt_compile
    from compiler_core.mblt import rule_index

    source, shapes, constants = realmodels.real_models()["ppocr_cls"]()
    options = {"input_shape_dict": shapes or None, "constant_inputs": constants}
    with monkeypatch.context() as patched:
        patched.setattr(rule_index, "_QUICK_REFERENCE_OPS", _constant_folding._reference_evaluator)
        reference = mblt_compile(source, tmp_path / "reference.mblt", **options).read_bytes()
    builds, evaluations = [], []
    library_build, library_evaluate = _op_list._build_registered_operators, rule_index._ReferenceOps.evaluate
    monkeypatch.setattr(_op_list, "_registered_operators", None)
    monkeypatch.setattr(_op_list, "_build_registered_operators", lambda: builds.append(1) or library_build())
    monkeypatch.setattr(rule_index._ReferenceOps, "evaluate",
                        lambda self, *args, **kwargs: evaluations.append(args[1]) or library_evaluate(self, *args, **kwargs))
    assert mblt_compile(source, tmp_path / "quick.mblt", **options).read_bytes() == reference
    assert len(evaluations) > 10 and builds == []


def test_conv_operand_conditions_reject_only_nodes_the_full_try_rejects():
    """ConvMulChannel (both operand orders) and ConvAffineFusion: Mul of a Conv by an activation, of a Conv read
    twice, and an Add by a vector are skipped before matching; the rewritable nodes are tried and rewritten."""
    from compiler_core.mblt.rules import ConvMulChannel

    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array(rng.standard_normal((2, 2, 1, 1)).astype(np.float32), "w"),
                    numpy_helper.from_array(np.zeros(2, np.float32), "b"),
                    numpy_helper.from_array(np.array(2.0, np.float32), "k"),
                    numpy_helper.from_array(np.full((1, 2, 1, 1), 0.5, np.float32), "v")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c0"]), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Mul", ["c0", "r0"], ["m0"]),  # by an activation; c0 is read twice
             helper.make_node("Conv", ["m0", "w", "b"], ["c1"]), helper.make_node("Mul", ["k", "c1"], ["m1"]),
             helper.make_node("Add", ["m1", "v"], ["a1"]),  # ConvAffineFusion needs a scalar offset
             helper.make_node("Conv", ["a1", "w", "b"], ["c2"]), helper.make_node("Mul", ["c2", "k"], ["m2"]),
             helper.make_node("Add", ["k", "m2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])], initializers)
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    model = ir.serde.deserialize_model(proto)
    nodes = list(model.graph)
    variants = {"ConvMulChannel": rewriter.RewriteRuleSet([ConvMulChannel.rule()], commute=True).rules,
                "ConvAffineFusion": [rule for rule in canonicalize._LIBRARY_RULES if rule.name == "ConvAffineFusion"]}
    results = {}
    for name, rules in variants.items():
        for rule in map(copy.copy, rules):  # the library's rule objects stay as they are
            full = [rule.try_rewrite(model, model.graph, node) is not None for node in model.graph]
            tried = []
            library_try = rule.try_rewrite
            rule.try_rewrite = lambda *args, library_try=library_try, tried=tried, **kwargs: (
                tried.append(nodes.index(args[2])) or library_try(*args, **kwargs))
            (indexed,) = indexed_rules([rule])
            assert [indexed.try_rewrite(model, model.graph, node) is not None for node in model.graph] == full
            hits, tries = results.setdefault(name, (set(), set()))
            hits.update(index for index, hit in enumerate(full) if hit)
            tries.update(tried)
    m0, m1, a1, m2, y = 2, 4, 5, 7, 8
    assert results["ConvMulChannel"] == ({m1, m2}, {m1, m2})  # Mul(c0, r0) is never tried
    assert results["ConvAffineFusion"][0] == {y} and a1 not in results["ConvAffineFusion"][1]  # a vector offset
    assert m0 not in results["ConvAffineFusion"][1]


def test_deduplicate_initializers_deduplicates_as_the_library_pass_does(monkeypatch):
    """Equal small initializers (from the protobuf and made in memory) become one; equal ones over the size limit, of
    another dtype or that are a graph output stay. Only initializers whose dtype and dims another one has are read."""
    from onnx_ir.passes.common import initializer_deduplication as _deduplication

    from compiler_core.mblt.rule_index import DeduplicateInitializers

    same = np.arange(4, dtype=np.float32)
    initializers = [numpy_helper.from_array(same, "a"), numpy_helper.from_array(same.copy(), "b"),
                    numpy_helper.from_array(same.astype(np.float64), "c"),
                    numpy_helper.from_array(np.ones(2000, np.float32), "d"),
                    numpy_helper.from_array(np.ones(2000, np.float32), "e"), numpy_helper.from_array(same, "f")]
    nodes = [helper.make_node("Add", ["x", name], [f"y{name}"]) for name in "abdef"]
    nodes.append(helper.make_node("Cast", ["c"], ["yc"], to=TensorProto.FLOAT))
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("ya", "yb", "yd", "ye", "yf")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [*outputs, helper.make_tensor_value_info("f", TensorProto.FLOAT, [4])], initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    ours, library = (ir.serde.deserialize_model(proto) for _ in range(2))
    for model in (ours, library):  # one made in memory, as folding and fusing make them
        model.graph.initializers["b"].const_value = ir.Tensor(same.copy(), name="b")
    assert ir.passes.common.DeduplicateInitializersPass()(library).modified
    read = []
    tobytes = _deduplication._tobytes
    monkeypatch.setattr(_deduplication, "_tobytes", lambda tensor: read.append(tensor) or tobytes(tensor))
    assert DeduplicateInitializers()(ours).modified
    assert len(read) == 2  # a and b; c is the only float64 one, d and e are over the size limit, f is an output
    assert list(ours.graph.initializers) == ["a", "c", "d", "e", "f"]
    assert ir.to_proto(ours).SerializeToString() == ir.to_proto(library).SerializeToString()


def test_topological_sort_sorts_as_the_library_pass_does_and_leaves_a_sorted_graph_unwalked(monkeypatch):
    """A graph in order (the library's stable sort would keep it): left as it is, without the library's sort; one out
    of order (a Relu listed before the Conv it reads): sorted as the library sorts it."""
    from compiler_core.mblt.rule_index import TopologicalSort

    def model(order):
        nodes = {"conv": helper.make_node("Conv", ["x", "w"], ["c"]), "relu": helper.make_node("Relu", ["c"], ["r"]),
                 "abs": helper.make_node("Abs", ["x"], ["a"]), "add": helper.make_node("Add", ["r", "a"], ["y"])}
        graph = helper.make_graph([nodes[name] for name in order], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])

    library_sort = ir.Graph.sort
    sorts = []
    monkeypatch.setattr(ir.Graph, "sort", lambda graph: sorts.append(graph) or library_sort(graph))
    for order, expected_sorts in ((["conv", "relu", "abs", "add"], 0), (["relu", "conv", "abs", "add"], 1)):
        ours, library = (ir.serde.deserialize_model(model(order)) for _ in range(2))
        sorts.clear()
        modified = TopologicalSort()(ours).modified
        assert len(sorts) == expected_sorts
        assert modified == ir.passes.common.TopologicalSortPass()(library).modified == bool(expected_sorts)
        assert [node.op_type for node in ours.graph] == [node.op_type for node in library.graph]
        assert ir.to_proto(ours).SerializeToString() == ir.to_proto(library).SerializeToString()


def test_a_read_once_tensor_reads_its_protobuf_once_and_hands_out_what_the_library_does(monkeypatch):
    """Shape, dtype and a small array are read from the protobuf on the first call only; a writable array (typed data)
    comes as a fresh copy each time, a read-only one (raw data, read without the library's look-ups) as the library's;
    the tensor serializes as before."""
    from compiler_core.mblt.rule_index import ReadOnceTensor

    reads = []
    library_numpy = ir.serde.TensorProtoTensor.numpy
    monkeypatch.setattr(ir.serde.TensorProtoTensor, "numpy", lambda self: reads.append(self) or library_numpy(self))
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [2], [1.5, 2.5])
    raw = numpy_helper.from_array(np.array([3, 4], np.int64), "raw")
    for proto, writable in ((typed, True), (raw, False)):
        reads.clear()
        tensor = ReadOnceTensor(proto)
        first, second = tensor.numpy(), tensor.numpy()
        assert len(reads) == int(writable) and first.flags.writeable == second.flags.writeable == writable
        np.testing.assert_array_equal(first, ir.serde.TensorProtoTensor(proto).numpy())
        assert first.dtype == ir.serde.TensorProtoTensor(proto).numpy().dtype
        if writable:
            first[0] = 0.0
            assert tensor.numpy()[0] == 1.5  # a caller's change stays its own
        assert tensor.shape == ir.Shape([2]) and tensor.dtype == ir.serde.TensorProtoTensor(proto).dtype
        assert ir.serde.serialize_tensor(tensor).SerializeToString() == proto.SerializeToString()


def test_a_read_once_tensor_reads_raw_data_of_every_type_as_the_library_does():
    """Every data type whose ``raw_data`` the read-once tensor reads itself: the library's array (values, dtype with its
    byte order, shape, read-only), and the other types (sub-byte, string) are left to the library."""
    from compiler_core.mblt.rule_index import _RAW_DTYPES, ReadOnceTensor

    rng = np.random.default_rng(3)
    for data_type in ir.DataType:
        proto = onnx.TensorProto(name="t", data_type=int(data_type), dims=[2, 3])
        if int(data_type) not in _RAW_DTYPES:  # undefined, string, 2/4/6-bit: the library's read
            assert data_type in (ir.DataType.UNDEFINED, ir.DataType.STRING) or data_type.bitwidth in (2, 4, 6)
            continue
        proto.raw_data = rng.integers(0, 256, int(6 * data_type.itemsize), dtype=np.uint8).tobytes()
        ours, library = ReadOnceTensor(proto).numpy(), ir.serde.TensorProtoTensor(proto).numpy()
        assert ours.dtype == library.dtype and ours.dtype.byteorder == library.dtype.byteorder
        assert ours.shape == library.shape and ours.tobytes() == library.tobytes()
        assert not ours.flags.writeable and not library.flags.writeable


def test_shape_merging_reads_each_distinct_inferred_type_once(monkeypatch):
    """Three values of one inferred type and one of another: two type readings, and every value gets the shape and
    dtype the library's reading gives it (equal frozen shapes, shared)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Abs", ["b"], ["c"]), helper.make_node("ReduceSum", ["c"], ["d"], keepdims=0),
             helper.make_node("Identity", ["d"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    inferred = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    types = {info.name: info.type for info in inferred.graph.value_info}
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    readings = []
    reading = canonicalize._shape_and_dtype
    monkeypatch.setattr(canonicalize, "_shape_and_dtype", lambda type_proto: readings.append(1) or reading(type_proto))
    canonicalize._merge_types(model, types)
    assert len(readings) == 2
    values = {value.name: value for node in model.graph for value in node.outputs}
    for name, type_proto in types.items():
        assert (values[name].shape, values[name].dtype) == _library_shape_and_dtype(type_proto)
    assert values["a"].shape is values["c"].shape and values["a"].shape.frozen


def test_importing_the_parser_builds_its_rule_sets_and_op_set_once():
    """The optimizer's and the legalization's rule sets and the MBLT op set are built when the parser is imported (in a
    fresh interpreter: before any parse), not inside the first parse."""
    import subprocess
    import sys

    code = ("import sys, compiler_core.api\n"
            "from compiler_core.mblt import canonicalize, rule_index\n"
            "print(rule_index._DEFAULT_RULES is not None, canonicalize._legalize_rules.cache_info().currsize,\n"
            "      'compiler_core.ops.table' in sys.modules)")
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                            timeout=120)
    assert result.stdout.split() == ["True", "1", "True"]


def test_output_fix_fixes_as_the_library_pass_does(monkeypatch):
    """Distinct computed outputs: nothing to do, found without the library's walk; an output listed twice and an
    input used as an output: the library's Identities."""
    from compiler_core.mblt.rule_index import OutputFix

    def model(outputs):
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                  [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2]) for name in outputs])
        return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))

    library_calls = []
    library_call = ir.passes.common.OutputFixPass.call
    monkeypatch.setattr(ir.passes.common.OutputFixPass, "call",
                        lambda self, model: library_calls.append(model) or library_call(self, model))
    assert not OutputFix()(model(["r"])).modified
    assert library_calls == []
    ours, library = model(["r", "r", "x"]), model(["r", "r", "x"])
    assert OutputFix()(ours).modified and ir.passes.common.OutputFixPass()(library).modified
    assert ir.to_proto(ours).SerializeToString() == ir.to_proto(library).SerializeToString()


def test_remove_unused_nodes_removes_as_the_library_pass_does():
    """Dead nodes and initializers, unused optional outputs (Dropout mask, MaxPool indices), trailing empty inputs,
    inside an If branch too; an opset-12 BatchNormalization keeps its outputs (there they select training mode)."""
    branch = helper.make_graph(
        [helper.make_node("Dropout", ["x"], ["d", "d_mask"]), helper.make_node("Neg", ["x"], ["dead"]),
         helper.make_node("Relu", ["d"], ["b_out"])],
        "branch", [], [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [1, 2, 4, 4])])
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "p_idx"], kernel_shape=[1, 1]),
             helper.make_node("Clip", ["p", "lo", ""], ["c"]),
             helper.make_node("Abs", ["x"], ["unused"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
                     helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, None), helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(0.0, np.float32), "lo"), numpy_helper.from_array(np.ones(3, np.float32), "junk")])
    bn_nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn", "mean_out", "var_out"])]
    bn_graph = helper.make_graph(
        bn_nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("bn", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones(2, np.float32), name) for name in "sbmv"])
    for proto in (helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                  helper.make_model(bn_graph, opset_imports=[helper.make_opsetid("", 12)]),
                  helper.make_model(bn_graph, opset_imports=[helper.make_opsetid("", 15)])):
        ours, library = (ir.serde.deserialize_model(proto) for _ in range(2))
        assert RemoveUnusedNodes()(ours).modified == ir.passes.common.RemoveUnusedNodesPass()(library).modified
        assert ir.to_proto(ours).SerializeToString() == ir.to_proto(library).SerializeToString()
    assert [len(n.outputs) for n in ours.graph] == [1]  # opset 15: the statistics outputs went


@pytest.mark.parametrize("name", ["mobilenet_v2", "ppocr_det", "ppocr_rec", "ppocr_cls", "minilm_l6", "silero_ifless"])
def test_real_models_canonicalize_to_the_same_graph_with_and_without_the_index(name, monkeypatch):
    """Every parse-bench model: our indexed rules, folder, constant lifting, opset conversion and shape merging give
    the library's graph, byte for byte. (Our upgrade writes a last-axis Softmax as ``axis=-1`` where the C API,
    blind to its rank, writes a Flatten/Reshape sandwich, on purpose: tests/test_opset_steps.py; here it takes the
    C API's way, so the rest is compared.)"""
    source, shapes, constants = realmodels.real_models()[name]()
    with monkeypatch.context() as patch:
        patch.setattr(conversion, "softmax_axes_last",
                      lambda source, inferred, version: opset_steps.softmax_axes_last(source, None, version))
        indexed, _ = parse_model(source, input_shape_dict=shapes or None, constant_inputs=constants)
    _unindexed(monkeypatch)
    full, _ = parse_model(source, input_shape_dict=shapes or None, constant_inputs=constants)
    # compared outside the assert: pytest's explanation of two unequal MB-long byte strings ran for many minutes
    same = ir.serde.serialize_model(indexed).SerializeToString() == ir.serde.serialize_model(full).SerializeToString()
    assert same, (f"{name}: {len(indexed.graph)} vs {len(full.graph)} nodes, same op counts: "
                  f"{sorted(n.op_type for n in indexed.graph) == sorted(n.op_type for n in full.graph)}")


def _old_opset_model(path, *, reshape_to=(1, 8, 1024), op="Relu") -> None:
    """Opset 11, IR 6: Constant weights (large and small), initializers (large, small, one also listed as an input),
    stale -1 shapes in value_info, a dynamic batch, a BatchNormalization to fuse and a selector input to bind."""
    rng = np.random.default_rng(0)
    conv_w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32))
    big = numpy_helper.from_array(rng.standard_normal((8, 1024)).astype(np.float32), "big")
    nodes = [helper.make_node("Constant", [], ["w"], value=conv_w, name="weights"),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn"),
             helper.make_node(op, ["bn"], ["r"]),
             helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array(reshape_to, np.int64))),
             helper.make_node("Reshape", ["r", "shape"], ["flat"], name="flat"),
             helper.make_node("Add", ["flat", "big"], ["added"]),
             helper.make_node("Mul", ["added", "gain"], ["y"], name="scale")]
    stats = [numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), name) for name in "sbmv"]
    graph = helper.make_graph(
        nodes, "old",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 32, 32]),
         helper.make_tensor_value_info("gain", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 8, -1])], [*stats, big],
        value_info=[helper.make_tensor_value_info("c", TensorProto.FLOAT, [-1, 8, -1, -1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6)
    model.metadata_props.add(key="author", value="test")
    onnx.save(model, str(path))


def _parse_both_ways(path, monkeypatch, **options):
    """(MBLT bytes or the error's code and message) through the protobuf path, then with every step on onnx-ir."""
    results = []
    for on_proto in (True, False):
        if not on_proto:
            monkeypatch.setattr(canonicalize, "_steps_on_proto", lambda *args: None)
        try:
            model, _ = parse_model(path, **options)
            results.append(ir.serde.serialize_model(model).SerializeToString())
        except Exception as error:  # noqa: BLE001 - the same error must come out both ways
            results.append((type(error).__name__, str(error)))
    return results


def test_the_protobuf_path_gives_the_onnx_ir_path_graph(tmp_path, monkeypatch):
    """An opset-11 model with Constant and initializer weights, an initializer listed as input, stale shapes and a
    bound input: the same MBLT bytes whether the first steps run on the protobuf or on onnx-ir."""
    _old_opset_model(tmp_path / "old.onnx")
    calls = []
    original = canonicalize._steps_on_proto
    monkeypatch.setattr(canonicalize, "_steps_on_proto", lambda *args: calls.append(original(*args)) or calls[-1])
    on_proto, on_ir = _parse_both_ways(tmp_path / "old.onnx", monkeypatch, input_shape_dict={"x": [1, 3, 32, 32]},
                                       constant_inputs={"gain": np.array([2.0], np.float32)})
    assert calls and calls[0] is not None and calls[0][1]  # the protobuf path ran, with the shapes inferred
    assert isinstance(on_proto, bytes) and on_proto == on_ir
    canonical = onnx.load_from_string(on_proto)
    assert canonical.opset_import[0].version == 21
    assert {entry.value for node in canonical.graph.node for entry in node.metadata_props} == {"bn, conv", "r", "flat", "added", "scale"}


@pytest.mark.parametrize("case", ["lifted", "value_ints", "graph output"])
def test_large_constant_weights_end_where_the_onnx_ir_path_puts_them(case, tmp_path, monkeypatch):
    """Opset 11 with large Constant weights (set apart during the conversion), read by a Conv and an Add (lifted to
    initializers); with a ``value_ints`` Constant the protobuf lifting leaves every Constant to onnx-ir; a large
    Constant that is a graph output stays a Constant (which no MBLT may hold). The same outcome both ways."""
    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(rng.standard_normal((16, 3, 5, 5)).astype(np.float32))
    bias = numpy_helper.from_array(rng.standard_normal((1, 16, 8, 8)).astype(np.float32))
    nodes = [helper.make_node("Constant", [], ["w"], value=weights),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[2, 2, 2, 2]),
             helper.make_node("Constant", [], ["bias"], value=bias), helper.make_node("Add", ["c", "bias"], ["a"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if case == "value_ints":
        nodes += [helper.make_node("Constant", [], ["shape"], value_ints=[1, -1]),
                  helper.make_node("Reshape", ["a", "shape"], ["y"])]
    else:
        nodes.append(helper.make_node("Relu", ["a"], ["y"]))
    if case == "graph output":
        outputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 16, 8, 8]))
    graph = helper.make_graph(nodes, "old", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6), str(tmp_path / "m.onnx"))
    calls = []
    original = canonicalize._steps_on_proto
    monkeypatch.setattr(canonicalize, "_steps_on_proto", lambda *args: calls.append(original(*args)) or calls[-1])
    on_proto, on_ir = _parse_both_ways(tmp_path / "m.onnx", monkeypatch)
    assert calls and calls[0] is not None  # the protobuf path ran
    assert on_proto == on_ir
    assert isinstance(on_proto, bytes) == (case != "graph output")


@pytest.mark.parametrize("case", ["unknown op", "bad shape name", "bad constant name", "reshape misfit"])
def test_the_protobuf_path_raises_what_the_onnx_ir_path_raises(case, tmp_path, monkeypatch):
    options = {"input_shape_dict": {"x": [1, 3, 32, 32]}, "constant_inputs": {"gain": np.array([2.0], np.float32)}}
    _old_opset_model(tmp_path / "old.onnx", op="NoSuchOp" if case == "unknown op" else "Relu",
                     reshape_to=(1, 7, 1024) if case == "reshape misfit" else (1, 8, 1024))
    if case == "bad shape name":
        options["input_shape_dict"] = {"z": [1]}
    if case == "bad constant name":
        options["constant_inputs"] = {"z": np.array([1.0], np.float32)}
    on_proto, on_ir = _parse_both_ways(tmp_path / "old.onnx", monkeypatch, **options)
    assert isinstance(on_proto, tuple) and on_proto == on_ir
    expected = {"unknown op": "UnsupportedOpsError", "bad shape name": "ArgumentError",
                "bad constant name": "ArgumentError", "reshape misfit": "InvalidModelError"}[case]
    assert on_proto[0] == expected


@pytest.mark.parametrize("inbound", ["Conv", "ConvTranspose", "Gemm"])
def test_our_batchnorm_fusion_rewrites_as_the_library_rule_does(inbound):
    """Conv without bias, grouped ConvTranspose with a bias, Gemm with beta: the same fused graph, byte for byte."""
    from compiler_core.mblt.rule_index import _quick_library_rules

    rng = np.random.default_rng(1)
    if inbound == "Gemm":
        node = helper.make_node("Gemm", ["x", "w", "c"], ["h"], transB=1, beta=0.5)
        inits = [rng.standard_normal((4, 3)), rng.standard_normal(4)]
        x_shape, channels = [2, 3], 4
    elif inbound == "ConvTranspose":
        node = helper.make_node("ConvTranspose", ["x", "w", "c"], ["h"], group=2)
        inits = [rng.standard_normal((4, 2, 3, 3)), rng.standard_normal(4)]
        x_shape, channels = [1, 4, 5, 5], 4
    else:
        node = helper.make_node("Conv", ["x", "w"], ["h"])
        inits = [rng.standard_normal((4, 3, 3, 3))]
        x_shape, channels = [1, 3, 5, 5], 4
    stats = [rng.uniform(0.5, 1.5, channels) for _ in range(4)]
    names = ["w", "c"][:len(inits)] + ["s", "b", "m", "v"]
    tensors = [numpy_helper.from_array(array.astype(np.float32), name) for array, name in zip([*inits, *stats], names)]
    graph = helper.make_graph(
        [node, helper.make_node("BatchNormalization", ["h", "s", "b", "m", "v"], ["y"], epsilon=1e-3)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], tensors)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    library = {rule.name: rule for rule in rewriter._DEFAULT_REWRITE_RULES}
    graphs = []
    for rule in (_quick_library_rules()[f"FuseBatchNormInto{inbound}"], library[f"FuseBatchNormInto{inbound}"]):
        model = ir.serde.deserialize_model(proto)
        assert rewriter.RewriteRuleSet([rule]).apply_to_model(model) == 1
        graphs.append(ir.to_proto(model).SerializeToString())
    assert graphs[0] == graphs[1]


@pytest.mark.parametrize("name", ["ppocr_cls", "silero_ifless"])
def test_the_written_mblt_reuses_the_checkers_serialization(name, tmp_path, monkeypatch):
    """mblt_compile serializes the canonical graph once (for ONNX's checker) and writes the same bytes as a fresh
    ``ir.to_proto`` of the stamped graph would."""
    from compiler_core.api import mblt_compile
    from compiler_core.mblt import io

    source, shapes, constants = realmodels.real_models()[name]()
    options = {"input_shape_dict": shapes or None, "constant_inputs": constants}
    with monkeypatch.context() as patched:
        patched.setattr(io, "_written_proto", lambda model, checked, apart=None: ir.to_proto(model))
        reference = mblt_compile(source, tmp_path / "reference.mblt", **options).read_bytes()
    checking, serializations = [], []  # graphs serialized from the checker on (earlier: inference of other states)
    library_check, library_serialize = canonicalize.check_model, ir.serde.serialize_graph_into
    monkeypatch.setattr(canonicalize, "check_model", lambda model: checking.append(model) or library_check(model))
    monkeypatch.setattr(ir.serde, "serialize_graph_into", lambda *args, **kwargs: (
        checking and serializations.append(args[1])) or library_serialize(*args, **kwargs))
    assert mblt_compile(source, tmp_path / "reused.mblt", **options).read_bytes() == reference
    assert len(serializations) == 1


def _tensor_cases() -> list[ir.TensorProtocol]:
    rng = np.random.default_rng(0)
    plain = [ir.Tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), name="conv_w"),
             ir.Tensor(rng.integers(-9, 9, (40, 30)), name="table"),  # int64
             ir.Tensor(np.asfortranarray(rng.standard_normal((33, 41)).astype(np.float32)), name="fortran"),
             ir.Tensor(rng.standard_normal((16, 70)).astype(np.float32).T, name="transposed"),
             ir.Tensor(rng.standard_normal(600).astype(np.float16), name="half"),
             ir.Tensor(rng.integers(0, 2, 1200).astype(bool), name="mask"),
             ir.Tensor(np.zeros((0, 500), np.float32), name="empty"),
             ir.Tensor(rng.standard_normal((2000,)).astype(np.float32))]  # unnamed
    documented = ir.Tensor(rng.standard_normal(300).astype(np.float32), name="documented", doc_string="why")
    described = ir.Tensor(rng.standard_normal(300).astype(np.float32), name="described")
    described.metadata_props["origin"] = "test"
    packed = ir.Tensor(rng.integers(-8, 8, 3000).astype(np.int8), dtype=ir.DataType.INT4, name="packed")
    from_proto = ir.serde.deserialize_tensor(numpy_helper.from_array(rng.standard_normal(500).astype(np.float32),
                                                                     "from_proto"))
    return [*plain, documented, described, packed, from_proto]


def test_the_written_pieces_are_the_models_serialization_with_the_weights_appended():
    """``io._serialized`` splices the weights into the protobuf's bytes: the pieces join to exactly what protobuf
    writes for the model with the tensors appended to its initializers (fields before and after them included)."""
    from compiler_core.mblt import io

    tensors = _tensor_cases()
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(np.arange(3, dtype=np.float32), "small")],
                              doc_string="graph doc",
                              value_info=[helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], producer_name="p", doc_string="d")
    proto.metadata_props.add(key="k", value="v")
    expected = onnx.ModelProto()
    expected.CopyFrom(proto)
    for tensor in tensors:
        ir.serde.serialize_tensor_into(expected.graph.initializer.add(), tensor)
    pieces = io._serialized(proto, tensors)
    assert b"".join(pieces) == expected.SerializeToString(deterministic=True)
    assert io._serialized(proto, []) == [proto.SerializeToString(deterministic=True)]


@pytest.mark.parametrize("name", ["ppocr_cls", "ppocr_rec"])
def test_the_written_mblt_copies_no_weights(name, tmp_path, monkeypatch):
    """Writing a parsed MBLT hands the weights' arrays to the file as they are: the fused ones and the ones lifted
    from the source's ``Constant`` nodes (PP-OCR keeps every weight in one; rec's MatMul weights stay unfused) are
    numpy-backed, so none is copied by ``tobytes`` or into a protobuf (each copy was fresh pages to fault in); the
    bytes are what protobuf writes for the model."""
    from compiler_core import api

    source, shapes, constants = realmodels.real_models()[name]()
    writing, copies = [], []
    library_tobytes, library_serialize, library_write = ir.Tensor.tobytes, ir.serde.serialize_tensor_into, api.write_mblt

    def serialize(proto, from_):
        if writing and from_.size > 1000:
            copies.append(from_.name)
        return library_serialize(proto, from_)

    monkeypatch.setattr(ir.Tensor, "tobytes", lambda self: (writing and copies.append(self.name)) or library_tobytes(self))
    monkeypatch.setattr(ir.serde, "serialize_tensor_into", serialize)
    monkeypatch.setattr(api, "write_mblt", lambda *args, **kwargs: writing.append(1) or library_write(*args, **kwargs))
    path = api.mblt_compile(source, tmp_path / "m.mblt", input_shape_dict=shapes or None, constant_inputs=constants)
    assert writing and copies == []
    written = onnx.load(str(path))
    assert len([t for t in written.graph.initializer if len(t.raw_data) > 4000]) > 10
    assert written.SerializeToString(deterministic=True) == path.read_bytes()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the signalling NaN
@pytest.mark.parametrize("operator", ["Add", "Sub", "Mul", "Div"])
def test_conv_channel_fusions_compute_the_float64_result_copying_no_unchanged_weights(operator):
    """Conv -> Add/Sub keeps the weights' own array (times 1.0 in float64 and back is the same numbers; one with a
    NaN still takes the round trip); Conv -> Mul/Div gives the bytes of the float64 product of widened weights."""
    from compiler_core.mblt.rules import ConvAddChannel, ConvDivChannel, ConvMulChannel, ConvSubChannel

    rule = {"Add": ConvAddChannel, "Sub": ConvSubChannel, "Mul": ConvMulChannel, "Div": ConvDivChannel}[operator].rule()
    rng = np.random.default_rng(3)
    for with_nan in (False, True):
        weights = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
        if with_nan:
            weights.view(np.uint32)[0, 0, 0, 0] = 0x7F800001  # a signalling NaN: the round trip makes it quiet
        factor = rng.uniform(0.5, 1.5, (1, 4, 1, 1)).astype(np.float32)
        graph = helper.make_graph(
            [helper.make_node("Conv", ["x", "w", "b"], ["h"]), helper.make_node(operator, ["h", "c"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])],
            [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.arange(4, dtype=np.float32), "b"),
             numpy_helper.from_array(factor, "c")])
        proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
        model = ir.serde.deserialize_model(proto)
        model.graph.initializers["w"].const_value = ir.Tensor(weights, name="w")  # numpy() is this array each time
        source = model.graph.initializers["w"].const_value.numpy()
        assert rewriter.RewriteRuleSet([rule]).apply_to_model(model) == 1
        fused = next(iter(model.graph)).inputs[1].const_value.numpy()
        scale = {"Add": 1.0, "Sub": 1.0, "Mul": factor.reshape(-1), "Div": 1.0 / factor.reshape(-1).astype(np.float64)}
        widened = source.astype(np.float64) * np.broadcast_to(np.asarray(scale[operator], np.float64), (4,)).reshape(
            -1, 1, 1, 1)
        assert fused.tobytes() == widened.astype(np.float32).tobytes()
        assert np.shares_memory(fused, source) == (operator in ("Add", "Sub") and not with_nan)


def _batchnorm_graph(case: str) -> onnx.ModelProto:
    """Conv (or Gemm) -> BatchNormalization, as written, or with what keeps the library's fusion from applying."""
    rng = np.random.default_rng(1)
    gemm = case == "gemm"
    weights = rng.standard_normal((4, 8) if gemm else (4, 3, 3, 3)).astype(np.float32)
    params = [rng.uniform(0.5, 1.5, 4).astype(np.float32) for _ in range(4)]
    initializers = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.ones(4, np.float32), "b"),
                    *(numpy_helper.from_array(p, n) for p, n in zip(params, ("s", "o", "m", "v")))]
    shape_in, shape_out = ([2, 8], [2, 4]) if gemm else ([1, 3, 8, 8], [1, 4, 8, 8])
    inbound = (helper.make_node("Gemm", ["x", "w", "b"], ["c"], transB=1, beta=0.5) if gemm
               else helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]))
    nodes = [inbound, helper.make_node("BatchNormalization", ["c", "s", "o", "m", "v"], ["y"], epsilon=1e-3)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape_in)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_out)]
    if case == "conv output read twice":
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, shape_out))
    elif case == "conv output is a graph output":
        outputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, shape_out))
    elif case == "weights shared":
        nodes.append(helper.make_node("Conv", ["x", "w"], ["z"], pads=[1, 1, 1, 1]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, shape_out))
    elif case == "mean is an input":
        initializers = [t for t in initializers if t.name != "m"]
        inputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [4]))
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))


@pytest.mark.parametrize(("case", "fused"), [("plain", True), ("gemm", True), ("conv output read twice", False),
                                              ("conv output is a graph output", False), ("weights shared", False),
                                              ("mean is an input", False)])
def test_batchnorm_fusion_applied_directly_gives_the_library_s_graph(case, fused):
    """Our BatchNorm fusions apply without the pattern matcher in an indexed rule set: the same decision and the
    same graph, byte for byte, as the library's rule set with the library's rules."""
    from compiler_core.mblt.rule_index import IndexedRuleSet, _quick_library_rules

    quick = _quick_library_rules()
    ours = ir.serde.deserialize_model(_batchnorm_graph(case))
    library = ir.serde.deserialize_model(_batchnorm_graph(case))
    tried = []
    rule = quick["FuseBatchNormIntoGemm" if case == "gemm" else "FuseBatchNormIntoConv"]
    direct = rule.apply_directly
    rule.apply_directly = lambda *args: tried.append(args[1].op_type) or direct(*args)
    count = IndexedRuleSet(indexed_rules([rule])).apply_to_model(ours)
    names = {"gemm": "FuseBatchNormIntoGemm"}.get(case, "FuseBatchNormIntoConv")
    library_rule = next(r for r in rewriter._DEFAULT_REWRITE_RULES if r.name == names)
    assert tried == ["BatchNormalization"]  # the direct path ran, on the BatchNorm only
    assert count == rewriter.RewriteRuleSet([library_rule]).apply_to_model(library) == int(fused)
    assert ir.serde.serialize_model(ours).SerializeToString() == ir.serde.serialize_model(library).SerializeToString()
    assert ("BatchNormalization" not in [node.op_type for node in ours.graph]) is fused


def _conv_batchnorm_source(path, case: str) -> None:
    """Opset 11: Conv (weights in a large Constant, or an initializer) -> BatchNormalization -> Relu, with what keeps
    the protobuf fusion from applying in some cases."""
    rng = np.random.default_rng(5)
    weights = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)  # 1152 elements: set apart as a large weight
    params = [rng.uniform(0.5, 1.5, 16).astype(np.float32) for _ in range(4)]
    if case == "float_data parameters":
        stats = [helper.make_tensor(n, TensorProto.FLOAT, [16], p.tolist()) for p, n in zip(params, "sbmv")]
    else:
        stats = [numpy_helper.from_array(p, n) for p, n in zip(params, "sbmv")]
    conv_inputs, initializers = ["x", "w"], list(stats)
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(weights), name="weights")]
    if case == "weights in an initializer":
        nodes, initializers = [], [*stats, numpy_helper.from_array(weights, "w")]
    if case in ("bias", "zero bias"):
        bias = np.zeros(16, np.float32) if case == "zero bias" else rng.standard_normal(16).astype(np.float32)
        conv_inputs.append("cb")
        initializers.append(numpy_helper.from_array(bias, "cb"))
    attributes = {"auto_pad": "SAME_UPPER"} if case == "auto_pad" else {"pads": [1, 1, 1, 1]}
    source = "x"
    if case == "pad before":
        nodes.append(helper.make_node("Pad", ["x", "p"], ["xp"], name="pad"))
        initializers.append(numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "p"))
        source, attributes = "xp", {}
    if case == "constant input":
        nodes.append(helper.make_node("Relu", ["k"], ["kr"], name="constant relu"))
        initializers.append(numpy_helper.from_array(rng.standard_normal((1, 8, 8, 8)).astype(np.float32), "k"))
        nodes.append(helper.make_node("Conv", ["x", "w3"], ["xk"], name="variable conv"))
        initializers.append(numpy_helper.from_array(rng.standard_normal((16, 8, 1, 1)).astype(np.float32), "w3"))
        source = "kr"
    conv_inputs[0] = source
    nodes += [helper.make_node("Conv", conv_inputs, ["c"], name="conv", **attributes),
              helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn", epsilon=1e-3)]
    last = "bn"
    if case == "conv output read twice":
        nodes.append(helper.make_node("Sigmoid", ["c"], ["side"], name="side"))
        nodes.append(helper.make_node("Add", ["bn", "side"], ["both"], name="both"))
        last = "both"
    if case == "two batchnorms":
        nodes.append(helper.make_node("BatchNormalization", ["bn", "s", "b", "m", "v"], ["bn2"], name="bn2"))
        last = "bn2"
    if case == "shared parameters":
        nodes.append(helper.make_node("Conv", [last, "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]))
        initializers.append(numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "w2"))
        nodes.append(helper.make_node("BatchNormalization", ["c2", "s2", "b2", "m", "v2"], ["bn2"], name="bn2"))
        initializers += [numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), n) for n in
                         ("s2", "b2", "v2")]  # the mean is both BatchNorms'
        last = "bn2"
    nodes.append(helper.make_node("Relu", [last], ["y"], name="relu"))
    if case == "constant input":
        nodes.append(helper.make_node("Add", ["y", "xk"], ["y2"], name="add"))
    output = "y2" if case == "constant input" else "y"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6), str(path))


@pytest.mark.parametrize(("case", "fused_on_proto"), [
    ("plain", 1), ("bias", 1), ("float_data parameters", 1), ("weights in an initializer", 1), ("two batchnorms", 1),
    ("shared parameters", 2), ("zero bias", 0), ("auto_pad", 0), ("pad before", 0), ("conv output read twice", 0),
    ("constant input", 0)])
def test_batchnorms_fused_on_the_protobuf_give_the_graph_the_rewrite_pass_gives(case, fused_on_proto, tmp_path,
                                                                                monkeypatch):
    """Conv -> BatchNormalization of an old-opset source is fused on the protobuf, before deserialization, where no
    other rule could act on the pair first: then onnx-ir never holds that BatchNorm, and the MBLT is the same, byte for
    byte, as with the optimizer's fusion; elsewhere the optimizer fuses it as before."""
    from compiler_core.mblt import rule_index

    _conv_batchnorm_source(tmp_path / "m.onnx", case)
    deserialized, fused = [], []
    original_to_ir, original_fuse = canonicalize.CheckedModelProto.to_ir, canonicalize.fuse_batchnorms_proto

    def fuse(graph, tensors, large):
        before = sum(node.op_type == "BatchNormalization" for node in graph.node)
        result = original_fuse(graph, tensors, large)
        fused.append(before - sum(node.op_type == "BatchNormalization" for node in graph.node))
        return result

    monkeypatch.setattr(canonicalize.CheckedModelProto, "to_ir",
                        lambda self: deserialized.append(original_to_ir(self)) or deserialized[-1])
    monkeypatch.setattr(canonicalize, "fuse_batchnorms_proto", fuse)
    waiting = []  # biases still waiting after the optimizer: its first rewrite pass should have given them all
    original_give = canonicalize.give_fused_biases
    monkeypatch.setattr(canonicalize, "give_fused_biases",
                        lambda model: waiting.append(rule_index.FUSED_BIASES in model.meta) or original_give(model))
    options = {"input_shape_dict": {"x": [1, 8, 8, 8]}}
    on_proto = ir.serde.serialize_model(parse_model(tmp_path / "m.onnx", **options)[0]).SerializeToString()
    assert fused == [fused_on_proto]
    monkeypatch.setattr(canonicalize, "fuse_batchnorms_proto", lambda graph, tensors, large: {})
    on_ir = ir.serde.serialize_model(parse_model(tmp_path / "m.onnx", **options)[0]).SerializeToString()
    assert on_proto == on_ir
    assert waiting == [False, False] and rule_index.FUSED_BIASES not in deserialized[0].meta
    canonical = onnx.load_from_string(on_proto)
    assert "BatchNormalization" not in [node.op_type for node in canonical.graph.node]


def test_folding_creates_one_reference_op_per_op_and_attributes(tmp_path, monkeypatch):
    """PP-OCR cls folds 18 Reshapes of biases to ``[1, C, 1, 1]`` in one pass: one ``onnx.reference`` instance runs them
    all (creating one builds a node and reads a schema each time); the MBLT is the one the library's evaluator gives
    (:func:`test_folding_builds_no_reference_op_registry`). Attributes that differ (``-0.0`` and ``0.0``) or that are
    not numbers and strings get an instance each."""
    from onnx.reference.op_run import OpRun

    from compiler_core.api import mblt_compile

    source, shapes, constants = realmodels.real_models()["ppocr_cls"]()
    created, ran = [], []
    library_create, library_run = OpRun.create.__func__, OpRun.run
    monkeypatch.setattr(OpRun, "create", classmethod(lambda cls, *a, **k: created.append(cls.__name__)
                                                     or library_create(cls, *a, **k)))
    monkeypatch.setattr(OpRun, "run", lambda self, *a, **k: ran.append(type(self).__name__) or library_run(self, *a, **k))
    mblt_compile(source, tmp_path / "m.mblt", input_shape_dict=shapes or None, constant_inputs=constants)
    reshapes = [name for name in ran if name.startswith("Reshape")]
    assert len(reshapes) == 18 and created.count(reshapes[0]) == 1
    from compiler_core.mblt.rule_index import _attribute_key

    assert _attribute_key({"alpha": 0.0}) != _attribute_key({"alpha": -0.0})
    assert _attribute_key({"axes": [1, 2]}) != _attribute_key({"axes": [1.0, 2.0]})
    assert _attribute_key({"value": np.zeros(2)}) is None
