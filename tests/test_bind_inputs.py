"""Inputs bound to constants (``constant_inputs`` / ``--bind-input``) and what binding folds away."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import parse_model
from compiler_core.errors import ArgumentError


def _stateful(path: Path, opset: int) -> Path:
    """y = x @ W + sum(state), next = state + x (a recurrent cell's shape: an input and a [2, 1, 4] state)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceSum", ["state"], ["s"], keepdims=0),
             helper.make_node("Add", ["h", "s"], ["y"]),
             helper.make_node("Add", ["state", "x"], ["next"])]
    graph = helper.make_graph(nodes, "cell", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                              helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3]),
                               helper.make_tensor_value_info("next", TensorProto.FLOAT, [2, 1, 4])],
                              [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), path)
    return path


@pytest.mark.parametrize("opset", [13, 21])  # 13: the protobuf path with the C API conversion; 21: onnx-ir's
def test_one_value_bound_to_a_state_input_fills_it(tmp_path, opset):
    """``--bind-input state=0`` for Silero's [2, 1, 128] state stopped the parse with INTERNAL_ERROR (an IndexError)."""
    model, _ = parse_model(_stateful(tmp_path / "cell.onnx", opset), constant_inputs={"state": 0})
    assert [value.name for value in model.graph.inputs] == ["x"]
    import onnx_ir as ir
    import onnxruntime as ort

    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    y, following = session.run(None, {"x": np.ones((1, 4), np.float32)})
    np.testing.assert_allclose(y, np.full((1, 3), 4.0))
    np.testing.assert_array_equal(following, np.ones((2, 1, 4)))  # the state's shape, filled


@pytest.mark.parametrize("opset", [13, 21])
def test_a_bound_value_of_another_shape_is_refused_by_name(tmp_path, opset):
    with pytest.raises(ArgumentError, match=r"Input 'state' takes shape \[2, 1, 4\]; the value bound to it has shape \[3\]"):
        parse_model(_stateful(tmp_path / "cell.onnx", opset), constant_inputs={"state": np.zeros(3)})


def _rates(path: Path) -> Path:
    """Like Silero VAD's ifless export: an If on the ``sr`` input picks 16 kHz or 8 kHz weights."""
    def branch(name: str, weight: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("MatMul", ["x", weight], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, 3])])

    nodes = [helper.make_node("Equal", ["sr", "rate16k"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], then_branch=branch("then", "w16k"),
                              else_branch=branch("else", "w8k"))]
    rng = np.random.default_rng(0)
    graph = helper.make_graph(nodes, "rates", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                               helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                              [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w16k"),
                               numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w8k"),
                               numpy_helper.from_array(np.array(16000, np.int64), "rate16k")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), path)
    return path


def test_a_folded_if_leaves_no_weights_of_its_other_branch(tmp_path):
    """Bound to 16000, Silero's 8 kHz weights stayed in the MBLT (unused: onnxruntime warned about each on every
    session, 19 lines per compile)."""
    model, _ = parse_model(_rates(tmp_path / "rates.onnx"), constant_inputs={"sr": 16000})
    used = {value.name for node in model.graph for value in node.inputs if value is not None}
    assert set(model.graph.initializers) <= used
    assert "If" not in {node.op_type for node in model.graph}


def test_an_if_on_a_selector_input_says_which_input_to_bind(tmp_path):
    """The refusal said "replace these operators"; binding ``sr`` is what folds Silero's If away."""
    from compiler_core.errors import UnsupportedOpsError

    with pytest.raises(UnsupportedOpsError) as caught:
        parse_model(_rates(tmp_path / "rates.onnx"))
    assert "depends only on the input(s) sr" in caught.value.hint and "--bind-input sr=VALUE" in caught.value.hint
