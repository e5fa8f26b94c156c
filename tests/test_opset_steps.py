"""The opset upgrades written in Python (``opset_steps``) give the ONNX C API's result, and decline the others."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import parse_model
from compiler_core.mblt import conversion, opset_steps
from compiler_core.mblt.opset_steps import COMPATIBLE_STEPS, convert_natively


def _model(nodes, inputs, outputs, opset: int, initializers=()) -> onnx.ModelProto:
    for index, node in enumerate(nodes):
        node.name = node.name or f"n{index}"
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _x(shape, name="x"):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _y(name="y"):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def _normalized(model: onnx.ModelProto) -> bytes:
    """The model after ONNX's strict inference (as the parse runs it on the upgrade), without model fields and with
    its value info sorted by name (inference lists it in the order it meets the values). New values keep their
    names: the C API's numbering (``_v_<n>``) reaches the MBLT through the folder's provenance metadata."""
    copy, _ = conversion._strict_inference(model)
    for field in ("ir_version", "producer_name", "producer_version"):
        copy.ClearField(field)
    infos = sorted(copy.graph.value_info, key=lambda info: info.name)
    copy.graph.ClearField("value_info")
    copy.graph.value_info.extend(infos)
    return copy.SerializeToString(deterministic=True)


def _cases() -> dict[str, onnx.ModelProto]:
    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    stats = [numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), name) for name in "sbmv"]
    return {
        "softmax inner axis (sandwich)": _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)],
                                                [_x([2, 3, 4])], [_y()], 11),
        "softmax last axis": _model([helper.make_node("Softmax", ["x"], ["y"], axis=2)], [_x([2, 3, 4])], [_y()], 12),
        "softmax default axis, rank 2": _model([helper.make_node("Softmax", ["x"], ["y"])], [_x([2, 3])], [_y()], 11),
        "softmax, unknown rank": _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [_x(None)], [_y()], 11),
        "log-softmax negative axis": _model([helper.make_node("LogSoftmax", ["x"], ["t"], axis=-2),
                                             helper.make_node("Relu", ["t"], ["y"])], [_x([2, 3, 4])], [_y()], 12),
        "reductions and squeezes": _model(
            [helper.make_node("ReduceMean", ["x"], ["a"], axes=[-1], keepdims=1),
             helper.make_node("ReduceSum", ["a"], ["b"], axes=[1], keepdims=1),
             helper.make_node("Squeeze", ["b"], ["c"], axes=[1, 2]),
             helper.make_node("Unsqueeze", ["c"], ["d"], axes=[0]),
             helper.make_node("ReduceMax", ["d"], ["y"], keepdims=0)], [_x([2, 1, 1])], [_y()], 11),
        "conv, batch norm, activations": _model(
            [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Clip", ["n", "", ""], ["r"]),
             helper.make_node("HardSigmoid", ["r"], ["h"]),
             helper.make_node("Mul", ["r", "h"], ["y"])], [_x([1, 3, 8, 8])], [_y()], 11, [weights, *stats]),
        "split without and with sizes, opset 17": _model(
            [helper.make_node("Split", ["x"], ["a", "b"], axis=1),
             helper.make_node("Split", ["a", "sizes"], ["c", "d"], axis=2),
             helper.make_node("Concat", ["c", "d", "b"], ["y"], axis=2)], [_x([1, 4, 4])], [_y()], 17,
            [numpy_helper.from_array(np.array([1, 3], np.int64), "sizes")]),
        "recurrent cells get a layout": _model(
            [helper.make_node("LSTM", ["x", "wl", "rl"], ["", "h"], hidden_size=2),
             helper.make_node("GRU", ["x", "wg", "rg"], ["", "g"], hidden_size=2, linear_before_reset=1),
             helper.make_node("Add", ["h", "g"], ["y"])], [_x([3, 1, 4])], [_y()], 11,
            [numpy_helper.from_array(rng.standard_normal((1, gates * 2, size)).astype(np.float32), name)
             for name, gates, size in (("wl", 4, 4), ("rl", 4, 2), ("wg", 3, 4), ("rg", 3, 2))]),
        "opset 17 to 21": _model([helper.make_node("ReduceMean", ["x"], ["a"], axes=[1]),
                                  helper.make_node("LayerNormalization", ["a", "s"], ["y"])],
                                 [_x([2, 3, 4])], [_y()], 17, [stats[0]]),
    }


@pytest.mark.parametrize("case", sorted(_cases()))
def test_native_upgrade_is_the_c_api_upgrade(case):
    source = _cases()[case]
    native = convert_natively(source, 21)
    assert native is not None
    assert _normalized(native) == _normalized(onnx.version_converter.convert_version(source, 21))
    assert [(entry.domain, entry.version) for entry in native.opset_import] == [("", 21)]


def test_the_source_is_left_as_it_was():
    source = _cases()["reductions and squeezes"]
    before = source.SerializeToString()
    convert_natively(source, 21)
    assert source.SerializeToString() == before


@pytest.mark.parametrize("node, opset", [
    (helper.make_node("Split", ["x"], ["y", "z"], axis=0, split=[1, 1]), 12),  # Split_12_13 is not written here
    (helper.make_node("Clip", ["x"], ["y"], min=0.0, max=6.0), 10),  # Clip_10_11
    (helper.make_node("Pad", ["x"], ["y"], pads=[0, 0, 1, 1]), 10),  # Pad_10_11
    (helper.make_node("Dropout", ["x"], ["y"], ratio=0.1), 11),  # Dropout_11_12
    (helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=1), 8),  # BN 8 -> 9
])
def test_steps_not_written_here_are_left_to_the_c_api(node, opset):
    outputs = [_y(name) for name in node.output]
    assert convert_natively(_model([node], [_x([2, 2])], outputs, opset), 21) is None


def test_the_compatible_steps_are_schema_changes():
    """Every listed step is a version at which ONNX changed the op's schema (else the table has a typo); convert.h
    registers one step with no schema change, BatchNormalization 11 -> 12, which the upgrade never meets."""
    versions: dict[str, set[int]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "":
            versions.setdefault(schema.name, set()).add(schema.since_version)
    stray = {op: [v for v in steps if v not in versions.get(op, set())] for op, steps in COMPATIBLE_STEPS.items()}
    assert {op: steps for op, steps in stray.items() if steps} == {"BatchNormalization": [12]}


def _old_softmax_model(path) -> None:
    """Opset 12 with the adapters PP-OCR rec needs: a ReduceMean and a Squeeze with ``axes`` and an inner-axis Softmax."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["x", "mean"], ["centred"]),
             helper.make_node("Softmax", ["centred"], ["soft"], axis=1),
             helper.make_node("Unsqueeze", ["soft"], ["wide"], axes=[0]),
             helper.make_node("Squeeze", ["wide"], ["y"], axes=[0])]
    graph = helper.make_graph(nodes, "old", [_x(["batch", 4, 6])], [_x(["batch", 4, 6], "y")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=7), str(path))


def test_a_parse_that_needs_only_written_steps_does_not_call_the_c_api(tmp_path, monkeypatch):
    _old_softmax_model(tmp_path / "old.onnx")
    shapes = {"x": [1, 4, 6]}
    monkeypatch.setattr(conversion, "convert_natively", lambda proto, version, **options: None)
    through_c_api, _ = parse_model(tmp_path / "old.onnx", input_shape_dict=shapes)
    monkeypatch.undo()
    calls = []
    real = onnx.version_converter.convert_version
    monkeypatch.setattr(onnx.version_converter, "convert_version", lambda *args: calls.append(1) or real(*args))
    native, _ = parse_model(tmp_path / "old.onnx", input_shape_dict=shapes)
    assert calls == []
    assert ir.to_proto(native).SerializeToString() == ir.to_proto(through_c_api).SerializeToString()


def test_an_upgrade_that_fails_strict_inference_is_the_c_api_upgrade(monkeypatch):
    """Strict inference keeps the C API's (non-strict) value info when it fails: such a model takes the C API."""
    nodes = [helper.make_node("Split", ["x"], ["a", "b"], axis=1),
             helper.make_node("Concat", ["a", "b", "x"], ["y"], axis=2)]  # a [1, 2, 4] and x [1, 4, 4] differ in dim 1
    source = _model(nodes, [_x([1, 4, 4])], [_y()], 17)
    results = []
    for native in (True, False):
        if not native:
            monkeypatch.setattr(conversion, "convert_natively", lambda proto, version, **options: None)
        copy = onnx.ModelProto()
        copy.CopyFrom(source)
        converted, inferred, _ = conversion.convert_source_proto(copy, 21)
        results.append((converted.SerializeToString(deterministic=True), inferred))
    assert results[0] == results[1] and not results[0][1] and "num_outputs" in str(onnx.ModelProto.FromString(results[0][0]))


def _softmax_after_computed_reshape(axis: int) -> onnx.ModelProto:
    """Opset 11: a Softmax reading a Reshape to a shape computed from ``Shape`` through ``Constant`` nodes (PP-OCR's
    attention and classifier head): the C API's non-strict inference does not know the Softmax input's rank."""
    def constant(name, values):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64)))

    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             constant("start", [0]), constant("end", [2]), constant("tail", [3, 4]),
             helper.make_node("Slice", ["shape", "start", "end"], ["head"]),
             helper.make_node("Concat", ["head", "tail"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=axis)]
    return _model(nodes, [_x([1, 2, 12])], [_y()], 11)


@pytest.mark.parametrize("axis", [3, -1, 2])
def test_a_softmax_whose_rank_only_strict_inference_knows(axis, tmp_path):
    """On the last axis the upgrade writes ``axis = -1`` where the C API writes the Flatten/Reshape sandwich (it cannot
    see the rank), and the parse keeps no Reshape for it; an inner axis still gets the C API's sandwich. Either way
    the MBLT computes what the source does (the MBLT of PP-OCR rec has 6 Reshapes fewer)."""
    source = _softmax_after_computed_reshape(axis)
    plans = [[(13, "softmax")] if node.op_type == "Softmax" else [] for node in source.graph.node]
    assert opset_steps._softmax_input_ranks(source, plans) == {"r": 0}  # what the C API's inference sees
    native, _ = conversion._native_conversion(source, 21)
    c_api = onnx.version_converter.convert_version(source, 21)
    assert [node.op_type for node in c_api.graph.node].count("Flatten") == (0 if axis == -1 else 1)  # -1 + 0 == 0 - 1
    flattened = [node.op_type for node in native.graph.node].count("Flatten")
    assert flattened == (1 if axis == 2 else 0)
    onnx.save(source, str(tmp_path / "source.onnx"))
    parsed, _ = parse_model(tmp_path / "source.onnx")
    ops = [node.op_type for node in parsed.graph]
    if axis != 2:
        assert ops == ["Reshape", "Softmax"]  # the model's own Reshape
    x = np.random.default_rng(0).standard_normal((1, 2, 12)).astype(np.float32)
    expected = ort.InferenceSession(source.SerializeToString()).run(None, {"x": x})[0]
    got = ort.InferenceSession(ir.to_proto(parsed).SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_nodes_the_c_api_upgrades_keep_their_source_names(tmp_path):
    """The C API drops node metadata: the parse gives it back (Clip 10 -> 11 is not written here)."""
    nodes = [helper.make_node("Clip", ["x"], ["c"], min=0.0, max=6.0, name="my_clip"),
             helper.make_node("Relu", ["c"], ["y"], name="my_relu")]
    source = _model(nodes, [_x([1, 4])], [_x([1, 4], "y")], 10)
    assert convert_natively(source, 21) is None
    onnx.save(source, str(tmp_path / "source.onnx"))
    parsed, _ = parse_model(tmp_path / "source.onnx")
    assert [(node.op_type, node.metadata_props["mblt.source_name"]) for node in parsed.graph] == [
        ("Clip", "my_relu, my_clip")]


def test_the_upgrade_plan_is_worked_out_once_per_kind_of_node():
    """Forty Relus and two BatchNormalizations: two plans worked out (one per op type; a BatchNormalization's also
    depends on whether it has training outputs), and the C API's upgrade."""
    opset_steps._plan_of.cache_clear()
    stats = [numpy_helper.from_array(np.ones(2, np.float32), name) for name in "sbmv"]
    nodes = [helper.make_node("Relu", [f"r{i}"], [f"r{i + 1}"]) for i in range(40)]
    nodes += [helper.make_node("BatchNormalization", ["r40", "s", "b", "m", "v"], ["n"]),
              helper.make_node("BatchNormalization", ["n", "s", "b", "m", "v"], ["y"])]
    source = _model(nodes, [helper.make_tensor_value_info("r0", TensorProto.FLOAT, [1, 2, 2, 2])], [_y()], 11, stats)
    native = convert_natively(source, 21)
    assert opset_steps._plan_of.cache_info().misses == 2
    assert _normalized(native) == _normalized(onnx.version_converter.convert_version(source, 21))
