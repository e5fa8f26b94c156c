"""Parse stage: canonicalization passes, MBLT I/O, provenance and bad input, on small built models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mblt_compile, parse_model, read_provenance
from compiler_core.errors import (
    ArgumentError,
    CancelledError,
    DynamicShapeError,
    InvalidModelError,
    ModelLoadError,
    UnsupportedOpsError,
)
from compiler_core.fileio import sha256_file
from compiler_core.mblt.io import load_mblt
from compiler_core.progress import CancelToken

RNG = np.random.default_rng(0)


def _tensor(name: str, *shape: int, offset: float = 0.0) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.5 + offset).astype(np.float32), name)


def _conv_bn_model(batch: object = "N", opset: int = 13) -> onnx.ModelProto:
    """Conv (weights in a Constant) + BN + Relu + Identity + Dropout + Add + a standalone BN."""
    stats = [_tensor(n, 4, offset=1.0 if n in ("s", "v") else 0.0) for n in "sbmv"]
    stats[3] = numpy_helper.from_array(np.abs(numpy_helper.to_array(stats[3])) + 0.1, "v")
    nodes = [
        helper.make_node("Constant", [], ["w"], value=_tensor("w", 4, 3, 3, 3), name="conv.weight"),
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="features/conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="features/bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="features/relu"),
        helper.make_node("Identity", ["r"], ["i"], name="identity"),
        helper.make_node("Dropout", ["i"], ["d"], name="dropout"),
        helper.make_node("Add", ["d", "d"], ["a"], name="residual"),
        helper.make_node("BatchNormalization", ["a", "s", "b", "m", "v"], ["y"], name="head/bn"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], stats)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def _run(path, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.fixture
def conv_bn_path(tmp_path):
    return _save(_conv_bn_model(), tmp_path / "conv_bn.onnx")


def test_canonical_form_and_numerics(conv_bn_path, tmp_path):
    out = mblt_compile(conv_bn_path, tmp_path / "m.mblt")
    proto = onnx.load(str(out))
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert ops == ["Conv", "Relu", "Add", "Mul", "Add"]  # BN fused / decomposed, Identity+Dropout gone
    assert proto.ir_version == 10 and proto.opset_import[0].version == 21
    assert proto.producer_name == "qbcompiler"
    assert [n.name for n in proto.graph.node] == ["Conv_0", "Relu_0", "Add_0", "Mul_0", "Add_1"]
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1  # batch pinned
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    expected, actual = _run(conv_bn_path, {"x": x})[0], _run(out, {"x": x})[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_source_names_survive_fusion(conv_bn_path, tmp_path):
    proto = onnx.load(str(mblt_compile(conv_bn_path, tmp_path / "m.mblt")))
    source = {n.name: {p.key: p.value for p in n.metadata_props}["mblt.source_name"] for n in proto.graph.node}
    assert set(source["Conv_0"].split(", ")) == {"features/conv", "features/bn"}
    assert source["Relu_0"] == "features/relu"
    assert source["Mul_0"] == source["Add_1"] == "head/bn"
    assert all(p.key.startswith("mblt.") for n in proto.graph.node for p in n.metadata_props)


def test_output_is_deterministic(conv_bn_path, tmp_path):
    first = onnx.load(str(mblt_compile(conv_bn_path, tmp_path / "a.mblt")))
    second = onnx.load(str(mblt_compile(conv_bn_path, tmp_path / "b.mblt")))
    for proto in (first, second):
        del proto.metadata_props[:]  # provenance holds the creation time
    assert first.SerializeToString(deterministic=True) == second.SerializeToString(deterministic=True)


def test_provenance(conv_bn_path, tmp_path):
    out = mblt_compile(conv_bn_path, tmp_path / "m.mblt", input_shape_dict={"x": [1, 3, 8, 8]})
    record = read_provenance(out)
    assert record["source_sha256"] == sha256_file(conv_bn_path)
    assert record["backend"] == "onnx"
    assert record["parser_options"]["input_shape_dict"] == {"x": [1, 3, 8, 8]}
    assert record["inputs"] == [{"name": "x", "shape": [1, 3, 8, 8], "dtype": "float", "layout": "NCHW"}]
    assert load_mblt(out).graph.num_nodes() == 5


@pytest.mark.parametrize("group", [1, 2])
def test_per_channel_affine_chain_after_conv_transpose_is_folded(tmp_path, group):
    """``ConvTranspose -> Add -> Mul -> Sub -> Div`` by per-channel constants (PP-OCR det's head) folds into the
    ConvTranspose's weights (output channels on axis 1 within each group) and bias."""
    channels = 6
    per_channel = {name: numpy_helper.from_array((RNG.standard_normal((1, channels, 1, 1)) * 0.5 + 1.5)
                                                 .astype(np.float32), name) for name in ("a", "m", "s", "d")}
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t"], strides=[2, 2], group=group, name="up"),
             helper.make_node("Add", ["t", "a"], ["t1"]), helper.make_node("Mul", ["m", "t1"], ["t2"]),
             helper.make_node("Sub", ["t2", "s"], ["t3"]), helper.make_node("Div", ["t3", "d"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_tensor("w", 4, channels // group, 2, 2), _tensor("b", channels),
                               *per_channel.values()])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "up.onnx")
    out = mblt_compile(source, tmp_path / "up.mblt")
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["ConvTranspose"]
    x = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(out, {"x": x})[0], _run(source, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_constant_subgraph_folded(tmp_path):
    """Shape arithmetic feeding a Reshape folds away once the input shape is static."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    src = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "s.onnx")
    proto = onnx.load(str(mblt_compile(src, tmp_path / "s.mblt")))
    assert [n.op_type for n in proto.graph.node] == ["Reshape", "Relu"]
    assert [d.dim_value for d in proto.graph.output[0].type.tensor_type.shape.dim] == [1, 6]


def test_constant_multi_output_nodes_folded(tmp_path):
    """A Split of a constant (how exporters write an LSTM's initial states) leaves no all-constant node."""
    state = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(2, 4), "state")
    nodes = [
        helper.make_node("Split", ["state"], ["h", "c"], axis=0, num_outputs=2),
        helper.make_node("Add", ["x", "h"], ["a"]),
        helper.make_node("Mul", ["a", "c"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [state])
    src = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "split.onnx")
    out = mblt_compile(src, tmp_path / "split.mblt")
    assert "Split" not in [n.op_type for n in onnx.load(str(out)).graph.node]
    x = RNG.standard_normal((1, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(out, {"x": x})[0], _run(src, {"x": x})[0], rtol=1e-6)


def test_constant_inputs_are_bound(tmp_path):
    nodes = [helper.make_node("Mul", ["x", "k"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                           helper.make_tensor_value_info("k", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    src = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "k.onnx")
    out = mblt_compile(src, tmp_path / "k.mblt", constant_inputs={"k": [3.0]})
    assert [i.name for i in onnx.load(str(out)).graph.input] == ["x"]
    np.testing.assert_allclose(_run(out, {"x": np.ones((1, 4), np.float32)})[0], 3.0)


def test_external_data_is_read(tmp_path):
    model = _conv_bn_model(batch=1)
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.onnx.data", size_threshold=0)
    out = mblt_compile(tmp_path / "ext.onnx", tmp_path / "ext.mblt")
    assert onnx.load(str(out)).graph.node[0].op_type == "Conv"


# -- bad input -----------------------------------------------------------------------------------


def _assert_nothing_written(tmp_path, name="out.mblt"):
    assert not (tmp_path / name).exists()
    assert not list(tmp_path.glob(".*.part"))


@pytest.mark.parametrize("content", [b"", b"definitely not a protobuf \x00\xff", b"\x08\x07"])
def test_non_onnx_files(tmp_path, content):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    with pytest.raises(ModelLoadError):
        mblt_compile(bad, tmp_path / "out.mblt")
    _assert_nothing_written(tmp_path)


def test_truncated_onnx(conv_bn_path, tmp_path):
    data = Path(conv_bn_path).read_bytes()
    (tmp_path / "trunc.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        mblt_compile(tmp_path / "trunc.onnx", tmp_path / "out.mblt")
    _assert_nothing_written(tmp_path)


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        mblt_compile(tmp_path / "nope.onnx", tmp_path / "out.mblt")


def test_missing_external_data(tmp_path):
    onnx.save(_conv_bn_model(batch=1), str(tmp_path / "ext.onnx"), save_as_external_data=True,
              location="weights.bin", size_threshold=0)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ModelLoadError, match="weights.bin") as info:
        mblt_compile(tmp_path / "ext.onnx", tmp_path / "out.mblt")
    assert "missing" in str(info.value)
    _assert_nothing_written(tmp_path)


def test_an_unsupported_op_inside_a_branch_taints_only_the_outputs_of_its_if(tmp_path):
    branch = helper.make_graph([helper.make_node("Refine", ["trunk"], ["r"], domain="com.example")], "then", [],
                               [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4])])
    other = helper.make_graph([helper.make_node("Identity", ["trunk"], ["r2"])], "else", [],
                              [helper.make_tensor_value_info("r2", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("Relu", ["x"], ["trunk"]),
             helper.make_node("If", ["flag"], ["refined"], then_branch=branch, else_branch=other),
             helper.make_node("Neg", ["trunk"], ["plain"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                           helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("refined", TensorProto.FLOAT, [1, 4]),
                               helper.make_tensor_value_info("plain", TensorProto.FLOAT, [1, 4])])
    src = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                        helper.make_opsetid("com.example", 1)]), tmp_path / "if.onnx")
    with pytest.raises(UnsupportedOpsError) as info:
        mblt_compile(src, tmp_path / "out.mblt")
    assert info.value.fields["keep_outputs"] == ["plain"] and "keep only it with --output-names plain" in info.value.hint


@pytest.mark.parametrize(("content", "says"), [
    ("torchscript", "Its content is a TorchScript archive: give it the .pt suffix, or pass --backend torchscript."),
    ("tflite", "Its content is a TFLite model: give it the .tflite suffix, or pass --backend tflite."),
    ("keras", "Its content is a Keras model: give it the .keras or .h5 suffix, or pass --backend tf.")])
def test_a_model_saved_under_the_wrong_suffix_is_named_by_its_content(tmp_path, content, says):
    """A TorchScript file renamed .onnx was "cannot be read as ONNX: Wire format was corrupt"."""
    import zipfile

    path = tmp_path / "model.onnx"
    if content == "tflite":
        path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(64))
    else:
        names = ["model/code/__torch__.py", "model/constants.pkl"] if content == "torchscript" else \
            ["config.json", "metadata.json", "model.weights.h5"]
        with zipfile.ZipFile(path, "w") as archive:
            for name in names:
                archive.writestr(name, "x")
    with pytest.raises(ModelLoadError) as caught:
        mblt_compile(path, tmp_path / "out.mblt")
    assert caught.value.hint.endswith(says)
    _conv_bn = _save(_conv_bn_model(batch=1), tmp_path / "real.tflite")  # the other way round
    with pytest.raises(ModelLoadError, match="not a TFLite model") as caught:
        mblt_compile(_conv_bn, tmp_path / "out.mblt")
    assert "--backend" in caught.value.hint and "Its content" not in caught.value.hint  # ONNX has no magic bytes


def test_unknown_ops_listed_together(tmp_path):
    nodes = [helper.make_node("FancyOp", ["x"], ["a"], domain="com.example", name="f1"),
             helper.make_node("FancyOp", ["a"], ["b"], domain="com.example", name="f2"),
             helper.make_node("Relu", ["b"], ["c"]),
             helper.make_node("Frobnicate", ["c"], ["y"], name="frob")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.example", 1)])
    src = _save(model, tmp_path / "u.onnx")
    with pytest.raises(UnsupportedOpsError) as info:
        mblt_compile(src, tmp_path / "out.mblt")
    ops = {entry["op"]: entry for entry in info.value.fields["ops"]}
    assert ops["com.example::FancyOp"]["count"] == 2 and ops["com.example::FancyOp"]["nodes"] == ["f1", "f2"]
    assert ops["Frobnicate"]["nodes"] == ["frob"]
    assert "FancyOp x2" in str(info.value) and "Frobnicate x1" in str(info.value)
    _assert_nothing_written(tmp_path)


@pytest.mark.parametrize("opset_version", [13, 21])  # 13: the checks on the source protobuf; 21: on onnx-ir
@pytest.mark.parametrize("op", ["com.example::FancyOp", "Det"])  # no ONNX definition / not in the MBLT op set
def test_unsupported_op_on_one_branch_offers_the_outputs_that_avoid_it(tmp_path, op, opset_version):
    """A model whose unsupported op feeds only some outputs: the error names the others (as ``keep_outputs`` and in
    its hint), and parsing with only those works."""
    domain, _, op_type = op.rpartition("::")
    nodes = [helper.make_node("Relu", ["x"], ["trunk"], name="trunk"),
             helper.make_node(op_type, ["trunk"], ["odd"], domain=domain, name="odd_op"),
             helper.make_node("ReduceSum", ["odd"], ["refined"], keepdims=1, name="after_odd"),
             helper.make_node("Neg", ["trunk"], ["plain"], name="plain_head"),
             helper.make_node("Sigmoid", ["trunk"], ["flag"], name="flag_head")]
    square = [1, 4, 4]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, square)],
                              [helper.make_tensor_value_info("plain", TensorProto.FLOAT, square),
                               helper.make_tensor_value_info("refined", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("flag", TensorProto.FLOAT, square)])
    opsets = [helper.make_opsetid("", opset_version)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    src = _save(helper.make_model(graph, opset_imports=opsets), tmp_path / "branches.onnx")
    with pytest.raises(UnsupportedOpsError) as info:
        mblt_compile(src, tmp_path / "out.mblt")
    assert info.value.fields["keep_outputs"] == ["plain", "flag"]
    assert "2 of the model's 3 outputs do not need them" in info.value.hint
    assert "--output-names plain,flag" in info.value.hint
    model, _ = parse_model(src, output_names=["plain", "flag"])
    assert [value.name for value in model.graph.outputs] == ["plain", "flag"]
    graph.output.pop(0)
    graph.output.pop(1)  # only the output that needs the op: nothing to offer
    src = _save(helper.make_model(graph, opset_imports=opsets), tmp_path / "only.onnx")
    with pytest.raises(UnsupportedOpsError) as info:
        mblt_compile(src, tmp_path / "out.mblt")
    assert "keep_outputs" not in info.value.fields and "do not need them" not in info.value.hint


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_nodes_out_of_order_parse_and_a_loop_is_refused(tmp_path, order):
    """Nodes listed out of topological order are a valid graph; two nodes feeding each other are not."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="first"), helper.make_node("Neg", ["a"], ["y"], name="second")]
    graph = helper.make_graph(nodes[::-1] if order == "reversed" else nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model, _ = parse_model(_save(helper.make_model(graph), tmp_path / "chain.onnx"))
    assert [node.op_type for node in model.graph] == ["Relu", "Neg"]
    loop = [helper.make_node("Add", ["x", "b"], ["a"], name="left"), helper.make_node("Relu", ["a"], ["b"], name="right"),
            helper.make_node("Neg", ["a"], ["y"])]
    graph = helper.make_graph(loop[::-1] if order == "reversed" else loop, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    with pytest.raises(InvalidModelError, match="cycle"):
        parse_model(_save(helper.make_model(graph), tmp_path / "loop.onnx"))


def test_op_outside_mblt_opset(tmp_path):
    nodes = [helper.make_node("NonZero", ["x"], ["y"], name="nz")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    src = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "nz.onnx")
    with pytest.raises(UnsupportedOpsError, match="NonZero"):
        mblt_compile(src, tmp_path / "out.mblt")


def test_unpinnable_dynamic_dim(tmp_path):
    model = _conv_bn_model()
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    src = _save(model, tmp_path / "dyn.onnx")
    with pytest.raises(DynamicShapeError, match="dim 2 \\(H\\)") as info:
        mblt_compile(src, tmp_path / "out.mblt")
    # the input's own rank and sizes (openWakeWord's [batch, samples] front end was shown 1,3,224,224)
    assert "--input-shape x=1,3,<H>," in str(info.value) and "224" not in str(info.value)
    out = mblt_compile(src, tmp_path / "out.mblt", input_shape_dict={"x": [1, 3, 8, 8]})
    assert out.exists()


@pytest.mark.parametrize("shapes", [{"nope": [1, 3, 8, 8]}, {"x": [1, 3, 8]}, {"x": [1, 4, 8, 8]}])
def test_bad_input_shape_dict(conv_bn_path, tmp_path, shapes):
    with pytest.raises(ArgumentError):
        mblt_compile(conv_bn_path, tmp_path / "out.mblt", input_shape_dict=shapes)
    _assert_nothing_written(tmp_path)


def test_cancel_leaves_nothing(conv_bn_path, tmp_path):
    token = CancelToken()
    events = []

    def cancel_midway(event):
        events.append(event)
        if event.stage == "canonicalize" and event.done == 3:
            token.cancel()

    with pytest.raises(CancelledError):
        mblt_compile(conv_bn_path, tmp_path / "out.mblt", callback=cancel_midway, cancel_token=token)
    _assert_nothing_written(tmp_path)
    assert events[0].stage == "load"


def test_progress_events_cover_every_stage(conv_bn_path, tmp_path):
    events = []
    mblt_compile(conv_bn_path, tmp_path / "m.mblt", callback=events.append)
    assert [e.stage for e in events if e.done == 0] == ["load", "canonicalize", "write"]
    assert json.dumps([e.to_dict() for e in events])


def test_parse_model_in_memory(conv_bn_path):
    graph, provenance = parse_model(conv_bn_path)
    assert graph.graph.num_nodes() == 5 and provenance["backend"] == "onnx"


def test_consumers_of_group_normalization_get_static_shapes(tmp_path):
    """ONNX's shape inference gives GroupNormalization-21 no output shape; the ops after it still get theirs."""
    nodes = [helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["g"], num_groups=2),
             helper.make_node("ReduceL2", ["g", "axes"], ["y"], keepdims=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones(4, np.float32), "scale"),
                               numpy_helper.from_array(np.zeros(4, np.float32), "bias"),
                               numpy_helper.from_array(np.array([2, 3], np.int64), "axes")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
                   tmp_path / "group_norm.onnx")
    model = load_mblt(mblt_compile(source, tmp_path / "out.mblt"))
    assert list(model.graph.outputs[0].shape) == [1, 4, 1, 1]


def test_chain_of_group_normalizations_gets_static_shapes(tmp_path):
    """PoolFormer: GroupNorm -> Conv -> GroupNorm ...; each GroupNorm's input shape comes from the one before."""
    nodes, last = [], "x"
    for index in range(3):
        nodes += [helper.make_node("GroupNormalization", [last, "scale", "bias"], [f"g{index}"], num_groups=2),
                  helper.make_node("Conv", [f"g{index}", "w"], [f"c{index}"], pads=[1, 1, 1, 1])]
        last = f"c{index}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones(4, np.float32), "scale"),
                               numpy_helper.from_array(np.zeros(4, np.float32), "bias"),
                               numpy_helper.from_array(np.full((4, 4, 3, 3), 0.1, np.float32), "w")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
                   tmp_path / "group_norms.onnx")
    model = load_mblt(mblt_compile(source, tmp_path / "out.mblt"))
    assert all(list(value.shape) == [1, 4, 6, 6] for node in model.graph for value in node.outputs)


def test_constant_gather_elements_over_many_rows_folds(tmp_path):
    """ALBERT gathers its 512 token types by position at parse time; onnx.reference fails past 32 rows."""
    nodes = [helper.make_node("GatherElements", ["types", "positions"], ["t"], axis=1),
             helper.make_node("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "tf"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array((np.arange(512, dtype=np.int64) % 3)[None], "types"),
                               numpy_helper.from_array(np.arange(64, dtype=np.int64)[None] * 2, "positions")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
                   tmp_path / "gather_elements.onnx")
    model = load_mblt(mblt_compile(source, tmp_path / "out.mblt"))
    assert [node.op_type for node in model.graph] == ["Add"]
    added = next(value for value in model.graph[0].inputs if value.const_value is not None)
    np.testing.assert_array_equal(added.const_value.numpy().ravel(), (np.arange(64) * 2 % 3).astype(np.float32))


def test_weights_listed_as_graph_inputs_are_compiled_as_constants(tmp_path):
    """IR-3 model-zoo exports list every weight among the graph inputs; they are constants, so BN folds.

    ShuffleNet from onnx's own backend test data (IR version 3): before, 48 BatchNormalization nodes
    stayed (their parameters were run-time inputs) and parse refused the model.
    """
    source = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_shufflenet.onnx"
    proto = onnx.load(str(source))
    assert proto.ir_version < 4 and len(proto.graph.input) > 1
    mblt = mblt_compile(source, tmp_path / "shufflenet.mblt")
    graph = onnx.load(str(mblt)).graph
    assert [value.name for value in graph.input] == [proto.graph.input[0].name]
    assert not [node for node in graph.node if node.op_type == "BatchNormalization"]
    x = RNG.standard_normal((1, 3, 224, 224)).astype(np.float32)
    expected = ort.InferenceSession(str(source)).run(None, {proto.graph.input[0].name: x})[0]
    actual = ort.InferenceSession(str(mblt)).run(None, {graph.input[0].name: x})[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(("kernel", "pads", "strides", "dilations", "group"), [
    ((70,), (35, 34), (1,), (1,), 2),  # wav2vec2's positional convolution, smaller
    ((3, 40), (1, 5, 1, 6), (1, 2), (1, 1), 1),
    ((33,), (0, 0), (3,), (2,), 1),
])
def test_conv_wider_than_the_npu_window_is_split_into_convs_that_fit(tmp_path, kernel, pads, strides, dilations,
                                                                    group):
    from compiler_core.ops.constraints import MAX_KERNEL

    rng = np.random.default_rng(0)
    shape = [1, 4] + [12, 100][-len(kernel):]
    weight = rng.standard_normal((6, 4 // group, *kernel)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=list(pads), strides=list(strides),
                            dilations=list(dilations), group=group, kernel_shape=list(kernel))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "w"),
                               numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
                   tmp_path / "wide.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    convs = [node for node in load_mblt(mblt).graph if node.op_type == "Conv"]
    assert len(convs) == -(-max(kernel) // MAX_KERNEL)
    assert all(max(conv.inputs[1].const_value.shape[2:]) <= MAX_KERNEL for conv in convs)
    feed = {"x": rng.standard_normal(shape).astype(np.float32)}
    (expected,) = ort.InferenceSession(str(source)).run(None, feed)
    (actual,) = ort.InferenceSession(str(mblt)).run(None, feed)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("channels", "length", "kernel", "stride", "pads"), [
    (1, 576, 256, 128, (32, 32)),  # Silero VAD's STFT
    (3, 97, 25, 12, (3, 0)),  # kernel not a whole number of frames
    (2, 50, 9, 16, (0, 5)),  # kernel shorter than the stride, input cut
    (1, 64, 64, 16, (0, 0)),  # a single output
])
def test_conv_with_a_stride_beyond_the_npu_reads_frames_as_channels(tmp_path, channels, length, kernel, stride, pads):
    from compiler_core.ops.constraints import MAX_STRIDE

    rng = np.random.default_rng(0)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=list(pads), strides=[stride], kernel_shape=[kernel])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, length])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rng.standard_normal((5, channels, kernel)).astype(np.float32), "w"),
                               numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b")])
    strides = _strided_conv_compiled(tmp_path, graph, "strided.onnx", rng.standard_normal((1, channels, length)))
    assert strides == [1] and max(strides) <= MAX_STRIDE


def _strided_conv_compiled(tmp_path, graph: onnx.GraphProto, name: str, x: np.ndarray) -> list[int]:
    """Parse the one-Conv ``graph``; check that the NPU supports every node of the MBLT and that it matches the source
    on ``x`` in onnxruntime; return the strides of the MBLT's Conv."""
    from compiler_core.targets import check_support

    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), tmp_path / name)
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    model = load_mblt(mblt)
    [conv] = [node for node in model.graph if node.op_type == "Conv"]
    assert check_support(model, "aries-rb").counts()["unsupported"] == 0
    feed = {"x": x.astype(np.float32)}
    (expected,) = ort.InferenceSession(str(source)).run(None, feed)
    (actual,) = ort.InferenceSession(str(mblt)).run(None, feed)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
    return list(conv.attributes["strides"].as_ints())


@pytest.mark.parametrize(("shape", "kernel", "strides", "pads"), [
    ((1, 1, 1, 1100), (1, 256), (1, 256), (0, 0, 0, 0)),  # basic-pitch's CQT (tf2onnx): stride == kernel, too wide
    ((1, 1, 1, 1100), (1, 256), (1, 128), (0, 0, 0, 0)),  # its half-hop filters
    ((1, 2, 300, 1), (40, 1), (16, 1), (5, 0, 3, 0)),  # a one-column input, padded
])
def test_one_row_2d_conv_with_a_long_stride_reads_frames_as_channels(tmp_path, shape, kernel, strides, pads):
    """A 2-D Conv over a one-row input is a 1-D one: before, a kernel 1x256 at stride 256 stayed on the CPU
    (``kernel 1x256 exceeds the NPU limit``), as the split into 32-tap convolutions cannot take the stride."""

    rng = np.random.default_rng(0)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=list(pads), strides=list(strides),
                            kernel_shape=list(kernel))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rng.standard_normal((6, shape[1], *kernel)).astype(np.float32),
                                                       "w"),
                               numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")])
    assert set(_strided_conv_compiled(tmp_path, graph, "strided2d.onnx", rng.standard_normal(shape))) == {1}


@pytest.mark.parametrize("bounds", ["top_db", "both_runtime", "runtime_low_constant_high"])
def test_clip_with_a_bound_computed_at_run_time_becomes_max_and_min(tmp_path, bounds):
    """openWakeWord's log-mel ``Clip(x, ReduceMax(x) - 80)`` was refused by check (``Clip input 'min' must be a
    constant``); as Max/Min it is supported and exact, a low bound above the high one included."""
    from compiler_core.targets import check_support

    nodes = [helper.make_node("ReduceMax", ["x"], ["peak"], keepdims=0),
             helper.make_node("Sub", ["peak", "db"], ["low"])]
    if bounds == "top_db":
        nodes.append(helper.make_node("Clip", ["x", "low"], ["y"]))
    elif bounds == "both_runtime":  # the high bound sits below the low one for some inputs
        nodes += [helper.make_node("ReduceMin", ["x"], ["floor"], keepdims=0),
                  helper.make_node("Add", ["floor", "db"], ["high"]),
                  helper.make_node("Clip", ["x", "low", "high"], ["y"])]
    else:
        nodes.append(helper.make_node("Clip", ["x", "low", "cap"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 50])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(2.0, np.float32), "db"),
                               numpy_helper.from_array(np.array(1.5, np.float32), "cap")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
                   tmp_path / "clip.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    model = load_mblt(mblt)
    assert check_support(model, "aries-rb").counts()["unsupported"] == 0
    for seed in range(3):
        feed = {"x": np.random.default_rng(seed).standard_normal((1, 4, 50)).astype(np.float32) * (seed + 1)}
        np.testing.assert_array_equal(ort.InferenceSession(str(mblt)).run(None, feed)[0],
                                      ort.InferenceSession(str(source)).run(None, feed)[0])


def _index_wrap_model(form: str, size: int) -> onnx.ModelProto:
    """An embedding lookup of int32 ids that wraps negative ids by hand (``where(x < 0, x + size, x)``), as Keras 3's
    Embedding does and tf2onnx writes it (``arithmetic``: Casts, Mul, Add, Not) or as a ``Where``."""
    nodes = [helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
             helper.make_node("Less", ["ids_f", "zero"], ["negative"]),
             helper.make_node("Add", ["ids", "size"], ["wrapped"])]
    if form == "where":
        nodes.append(helper.make_node("Where", ["negative", "wrapped", "ids"], ["index"]))
    else:
        nodes += [helper.make_node("Not", ["negative"], ["positive"]),
                  helper.make_node("Cast", ["positive"], ["positive_i"], to=TensorProto.INT32),
                  helper.make_node("Mul", ["ids", "positive_i"], ["kept"]),
                  helper.make_node("Cast", ["negative"], ["negative_i"], to=TensorProto.INT32),
                  helper.make_node("Mul", ["negative_i", "wrapped"], ["moved"]),
                  helper.make_node("Add", ["moved", "kept"], ["index"])]
    nodes += [helper.make_node("Gather", ["table", "index"], ["rows"], axis=0),
              helper.make_node("Relu", ["rows"], ["y"])]
    table = np.random.default_rng(0).standard_normal((12, 16)).astype(np.float32)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(table, "table"),
                               numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                               numpy_helper.from_array(np.array(size, np.int32), "size")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("form", ["arithmetic", "where"])
def test_an_embedding_that_wraps_negative_ids_itself_is_a_plain_lookup_on_the_npu(tmp_path, form):
    """slovorez's Keras 3 Embedding via tf2onnx: the select of ``x + n`` for negative int32 ids was 7 unsupported
    nodes (integer Casts, Mul, Add) before a lookup the NPU runs; ONNX Gather wraps negative indices the same way."""
    from compiler_core.targets import check_support

    source = _save(_index_wrap_model(form, 12), tmp_path / "wrap.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    assert [node.op_type for node in onnx.load(str(mblt)).graph.node] == ["Gather", "Relu"]
    assert check_support(load_mblt(mblt), "aries-rb").counts()["unsupported"] == 0
    ids = np.array([[0, 3, 11, -1, -12, 5, -7, 2, 9, -3]], np.int32)
    np.testing.assert_array_equal(_run(mblt, {"ids": ids})[0], _run(source, {"ids": ids})[0])


def test_a_select_that_adds_another_constant_than_the_table_size_is_kept(tmp_path):
    """``x + 13`` over a 12-row table is not the wrap Gather does: the select stays (and stays flagged)."""
    mblt = mblt_compile(_save(_index_wrap_model("where", 13), tmp_path / "wrap.onnx"), tmp_path / "out.mblt")
    assert "Where" in {node.op_type for node in onnx.load(str(mblt)).graph.node}


def test_a_padding_mask_input_tested_with_equal_is_compared_as_floats(tmp_path):
    """A hand-written transformer's ``src_key_padding_mask=mask == 0`` (torch's dynamo export): ``Equal`` of the int64
    mask input was refused ("int64 computed at run time"); compared as floats it runs on the NPU, same values."""
    from compiler_core.targets import check_support

    nodes = [helper.make_node("Equal", ["mask", "zero"], ["padded"]),
             helper.make_node("Where", ["padded", "minus", "nothing"], ["bias"]),
             helper.make_node("Add", ["scores", "bias"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4, 8]),
                                           helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(0, np.int64), "zero"),
                               numpy_helper.from_array(np.array(-1e9, np.float32), "minus"),
                               numpy_helper.from_array(np.array(0.0, np.float32), "nothing")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                   tmp_path / "mask.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    assert check_support(load_mblt(mblt), "aries-rb").counts()["unsupported"] == 0
    feed = {"scores": np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32),
            "mask": np.array([[[1, 1, 1, 2, 1, 0, 0, 0]]], np.int64)}
    np.testing.assert_array_equal(_run(mblt, feed)[0], _run(source, feed)[0])


@pytest.mark.parametrize("case", ["output", "ids"])
def test_an_equal_of_general_integers_is_not_compared_as_activations(tmp_path, case):
    """ONNX's test_equal_bcast (an Equal of int32 values as the model's output) was rewritten to a float compare and
    agreed with FP32 on 98.3 % of its elements; token ids that an embedding also reads (``ids == 0``) would match small
    ids as 0 on the 8-bit grid. Both keep the integer Equal (for the CPU head)."""
    nodes = [helper.make_node("Equal", ["ids", "zero"], ["padded"])]
    outputs = [helper.make_tensor_value_info("padded", TensorProto.BOOL, [1, 8])]
    initializers = [numpy_helper.from_array(np.array(0, np.int64), "zero")]
    if case == "ids":
        nodes += [helper.make_node("Gather", ["table", "ids"], ["vectors"]),
                  helper.make_node("ReduceMax", ["vectors", "last"], ["tokens"], keepdims=0),
                  helper.make_node("Where", ["padded", "nothing", "tokens"], ["y"])]
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])]
        initializers += [numpy_helper.from_array(np.ones((50, 4), np.float32), "table"),
                         numpy_helper.from_array(np.array([-1], np.int64), "last"),
                         numpy_helper.from_array(np.array(0.0, np.float32), "nothing")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])], outputs,
                              initializers)
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                   tmp_path / "equal.onnx")
    model = load_mblt(mblt_compile(source, tmp_path / "out.mblt"))
    equal = next(node for node in model.graph if node.op_type == "Equal")
    assert equal.inputs[0].is_graph_input()  # not Cast to float first


@pytest.mark.parametrize(("window", "onesided"), [("hann", 1), ("none", 0)])
def test_an_stft_of_a_real_signal_is_a_strided_convolution_on_the_npu(tmp_path, window, onesided):
    """torch.stft through the dynamo exporter is an ONNX STFT, refused at parse ("not in the MBLT operator set"); as
    the convolution with the windowed DFT basis it parses, runs on the NPU and gives the STFT's numbers."""
    from compiler_core.targets import check_support

    size, hop = 256, 128
    inputs = ["signal", "hop", "window", ""] if window == "hann" else ["signal", "hop", "", "length"]
    nodes = [helper.make_node("STFT", inputs, ["spectrum"], onesided=onesided),
             helper.make_node("ReduceL2", ["spectrum", "last"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("signal", TensorProto.FLOAT, [1, 2048, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(hop, np.int64), "hop"),
                               numpy_helper.from_array(np.hanning(size + 1)[:-1].astype(np.float32), "window"),
                               numpy_helper.from_array(np.array(size, np.int64), "length"),
                               numpy_helper.from_array(np.array([-1], np.int64), "last")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8),
                   tmp_path / "stft.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    assert "STFT" not in {node.op_type for node in onnx.load(str(mblt)).graph.node}
    assert check_support(load_mblt(mblt), "aries-rb").counts()["unsupported"] == 0
    feed = {"signal": np.random.default_rng(0).standard_normal((1, 2048, 1)).astype(np.float32)}
    (expected,), (actual,) = _run(source, feed), _run(mblt, feed)
    assert actual.shape == expected.shape == (1, 15, size // 2 + 1 if onesided else size)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("keepdims", [0, 1])
def test_an_adaptive_pool_written_as_gathered_windows_is_one_matmul(tmp_path, keepdims):
    """torch's dynamo export of ``AdaptiveAvgPool2d((4, 4))`` over 10x10 (windows that overlap: 10 is not a multiple
    of 4): a GatherND of every window's positions (rank 6, beyond the NPU's rank 5) and a mean over the window axes,
    refused; as the pooling matrix times the flattened positions it runs on the NPU, with the same numbers."""
    from compiler_core.targets import check_support

    starts, size = [0, 2, 5, 7], 3  # floor(i * 10 / 4) .. ceil((i + 1) * 10 / 4): 3 rows each
    rows = np.array([[start + k for k in range(size)] for start in starts])  # [4, 3]
    index = np.stack(np.broadcast_arrays(rows[:, :, None, None], rows[None, None, :, :]), -1).astype(np.int64)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Transpose", ["r"], ["hw_first"], perm=[2, 3, 0, 1]),
             helper.make_node("GatherND", ["hw_first", "windows"], ["gathered"]),
             helper.make_node("ReduceMean", ["gathered", "axes"], ["pooled"], keepdims=keepdims)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
                              [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(index, "windows"),
                               numpy_helper.from_array(np.array([1, 3], np.int64), "axes")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8),
                   tmp_path / "pool.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    assert "GatherND" not in {node.op_type for node in onnx.load(str(mblt)).graph.node}
    if not keepdims:  # dynamo's form; with keepdims the output itself has rank 6
        assert check_support(load_mblt(mblt), "aries-rb").counts()["unsupported"] == 0
    feed = {"x": np.random.default_rng(0).standard_normal((1, 3, 10, 10)).astype(np.float32)}
    (expected,), (actual,) = _run(source, feed), _run(mblt, feed)
    assert actual.shape == expected.shape == ((4, 1, 4, 1, 1, 3) if keepdims else (4, 4, 1, 3))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_an_equal_of_ids_that_feeds_integer_arithmetic_stays_for_the_cpu_head(tmp_path):
    """RoBERTa's position ids from its input ids (``cumsum(ids != pad) * mask + pad``): the test feeds integer
    arithmetic the NPU cannot run, so it stays with it in the CPU head (on the NPU it would cut the head in two)."""
    nodes = [helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
             helper.make_node("Not", ["is_pad"], ["real"]),
             helper.make_node("Cast", ["real"], ["real_i"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["real_i", "axis"], ["positions"]),
             helper.make_node("Gather", ["table", "positions"], ["y"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(1, np.int64), "pad"),
                               numpy_helper.from_array(np.array(1, np.int64), "axis"),
                               numpy_helper.from_array(np.ones((10, 4), np.float32), "table")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                   tmp_path / "positions.onnx")
    equal, = [node for node in onnx.load(str(mblt_compile(source, tmp_path / "out.mblt"))).graph.node
              if node.op_type == "Equal"]
    assert list(equal.input)[0] == "ids"


def test_a_tiny_constant_added_is_kept_and_an_exact_zero_is_dropped(tmp_path):
    """basic-pitch's ``Log(power + 1e-10)``: the library's ``x + 0`` rule matches within 1e-8 and dropped the floor,
    so silent bins came out at -124 dB instead of -100 dB (the MBLT's notes output at cosine 0.996 to the source)."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["power"]), helper.make_node("Add", ["power", "floor"], ["floored"]),
             helper.make_node("Log", ["floored"], ["log"]), helper.make_node("Add", ["zero", "log"], ["shifted"]),
             helper.make_node("Mul", ["shifted", "nearly_one"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(1e-10, np.float32), "floor"),
                               numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                               numpy_helper.from_array(np.array(1.000001, np.float32), "nearly_one")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                   tmp_path / "floor.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    ops = [node.op_type for node in load_mblt(mblt).graph]
    assert ops.count("Add") == 1 and ops.count("Mul") == 2  # the floor and x * 1.000001 stay; 0 + log goes
    feed = {"x": np.concatenate([np.zeros(8), np.geomspace(1e-9, 1.0, 56)]).astype(np.float32)[None]}
    np.testing.assert_allclose(ort.InferenceSession(str(mblt)).run(None, feed)[0],
                               ort.InferenceSession(str(source)).run(None, feed)[0], rtol=1e-6)


@pytest.mark.parametrize("at_the_end", [True, False])
def test_an_if_that_only_computes_the_outputs_is_refused_with_the_cut_that_compiles(tmp_path, at_the_end):
    """openWakeWord's wake-word heads end in an ``If`` (score >= 0.5: run a verifier net, else return the score):
    the refusal says which tensor to end the graph at; an ``If`` inside the graph gets no such hint."""
    then_branch = helper.make_graph([helper.make_node("Mul", ["score", "two"], ["verified"])], "then", [],
                                    [helper.make_tensor_value_info("verified", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph([helper.make_node("Identity", ["score"], ["passed"])], "else", [],
                                    [helper.make_tensor_value_info("passed", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Gemm", ["x", "w"], ["logit"]), helper.make_node("Sigmoid", ["logit"], ["score"]),
             helper.make_node("ReduceMax", ["score"], ["top"], keepdims=0),
             helper.make_node("GreaterOrEqual", ["top", "half"], ["fire"]),
             helper.make_node("If", ["fire"], ["gated"], then_branch=then_branch, else_branch=else_branch)]
    output = "gated"
    if not at_the_end:
        nodes.append(helper.make_node("Relu", ["gated"], ["y"]))
        output = "y"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones((8, 1), np.float32), "w"),
                               numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                               numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
                   tmp_path / "gated.onnx")
    with pytest.raises(UnsupportedOpsError) as caught:
        mblt_compile(source, tmp_path / "out.mblt")
    assert "If" in caught.value.message
    assert ("--output-names score " in caught.value.hint) is at_the_end
    if at_the_end:
        mblt = mblt_compile(source, tmp_path / "cut.mblt", output_names=["score"])
        assert [value.name for value in load_mblt(mblt).graph.outputs] == ["score"]


def test_rank_6_window_partition_is_written_with_fewer_axes(tmp_path):
    """Swin's window partition (reshape to rank 6, permute, reshape) keeps its values with at most 5 axes."""
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 1, 3, 2, 4, 5]),
             helper.make_node("Reshape", ["t", "s2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([1, 2, 4, 2, 4, 6], np.int64), "s1"),
                               numpy_helper.from_array(np.array([-1, 4, 4, 6], np.int64), "s2")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
                   tmp_path / "windows.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    assert max(len(value.shape) for node in load_mblt(mblt).graph for value in node.outputs) <= 5
    feed = {"x": np.random.default_rng(0).standard_normal((1, 8, 8, 6)).astype(np.float32)}
    np.testing.assert_array_equal(ort.InferenceSession(str(mblt)).run(None, feed)[0],
                                  ort.InferenceSession(str(source)).run(None, feed)[0])


def test_average_pool_wider_than_its_input_with_ceil_mode_is_a_global_pool(tmp_path):
    """HF EfficientNet: AvgPool2d(1280, ceil_mode=True) over 7x7 is the mean of the whole input."""
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[1280, 1280], strides=[1280, 1280],
                            ceil_mode=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
                   tmp_path / "pool.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    assert [node.op_type for node in load_mblt(mblt).graph] == ["GlobalAveragePool"]
    feed = {"x": np.random.default_rng(0).standard_normal((1, 4, 7, 7)).astype(np.float32)}
    np.testing.assert_allclose(ort.InferenceSession(str(mblt)).run(None, feed)[0],
                               ort.InferenceSession(str(source)).run(None, feed)[0], rtol=1e-5, atol=1e-6)


def test_legalization_folds_the_remaining_constants_once_when_it_settles(conv_bn_path, monkeypatch):
    """The legalization loop ends on a round whose rules match nothing and whose fold finds nothing: that fold is the
    last one (the graph has not changed since, so another would find nothing either)."""
    from compiler_core.mblt import canonicalize

    folds = []
    real_fold = canonicalize._fold_remaining_constants
    monkeypatch.setattr(canonicalize, "_fold_remaining_constants", lambda model: folds.append(real_fold(model)) or folds[-1])
    parse_model(conv_bn_path, input_shape_dict={"x": [1, 3, 8, 8]})
    assert folds == [0]


def test_the_heap_is_frozen_from_the_load_to_the_written_mblt(conv_bn_path, tmp_path, monkeypatch):
    """mblt_compile keeps the heap frozen while it loads the source and writes the MBLT too, not only while it
    canonicalizes: a full collection due then scans only what the parse made."""
    import gc

    from compiler_core import api

    frozen = {}

    def spy(name):
        real = getattr(api, name)

        def call(*args, **kwargs):
            frozen[name] = gc.get_freeze_count()
            return real(*args, **kwargs)
        return call

    for name in ("load_source", "write_mblt"):
        monkeypatch.setattr(api, name, spy(name))
    gc.unfreeze()
    mblt_compile(conv_bn_path, tmp_path / "m.mblt", input_shape_dict={"x": [1, 3, 8, 8]})
    assert frozen["load_source"] > 1000 and frozen["write_mblt"] > 1000
    assert gc.get_freeze_count() == 0


def test_canonicalization_freezes_the_heap_only_while_it_runs(conv_bn_path, monkeypatch):
    """The pre-existing heap is out of garbage collection during canonicalization and back afterwards, and the youngest
    generation is collected less often meanwhile (its threshold restored afterwards); a heap someone else froze stays
    frozen."""
    import gc

    from compiler_core.mblt import canonicalize

    frozen_during = []
    thresholds_during = []
    real_optimize = canonicalize._optimize

    def spying_optimize(model):
        frozen_during.append(gc.get_freeze_count())
        thresholds_during.append(gc.get_threshold())
        real_optimize(model)

    monkeypatch.setattr(canonicalize, "_optimize", spying_optimize)
    gc.unfreeze()
    before = gc.get_threshold()
    parse_model(conv_bn_path, input_shape_dict={"x": [1, 3, 8, 8]})
    assert frozen_during[-1] > 1000 and gc.get_freeze_count() == 0
    assert thresholds_during[-1] == (max(before[0], canonicalize._YOUNG_THRESHOLD), *before[1:])
    assert gc.get_threshold() == before
    gc.freeze()
    try:
        calls = []
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        parse_model(conv_bn_path, input_shape_dict={"x": [1, 3, 8, 8]})
        assert calls == [] and gc.get_freeze_count() > 1000
    finally:
        monkeypatch.undo()
        gc.unfreeze()


def _half_conv_model(float_io: bool) -> onnx.ModelProto:
    """Conv + BN + Relu + Mul by a Constant, all in float16 (a ``model.half()``-style export).

    ``float_io``: float32 graph input and output with Casts around the float16 body (onnxconverter-common's
    ``keep_io_types=True``); else float16 input and a float32 output through a final Cast.
    """
    half = lambda name, *shape, offset=0.0: numpy_helper.from_array(  # noqa: E731
        (RNG.standard_normal(shape) * 0.5 + offset).astype(np.float16), name)
    stats = [half("s", 4, offset=1.0), half("b", 4), half("m", 4),
             numpy_helper.from_array(np.full(4, 0.8, np.float16), "v")]
    nodes = [
        helper.make_node("Constant", [], ["w"], value=half("w", 4, 3, 3, 3)),
        helper.make_node("Conv", ["xh", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(0.5, np.float16), "k")),
        helper.make_node("Mul", ["r", "k"], ["mh"]),
        helper.make_node("Cast", ["mh"], ["y"], to=TensorProto.FLOAT),
    ]
    if float_io:
        nodes.insert(0, helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16))
    else:
        nodes[1].input[0] = "x"
    x_type = TensorProto.FLOAT if float_io else TensorProto.FLOAT16
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", x_type, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], stats)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("float_io", [False, True], ids=["float16-io", "float32-io"])
def test_float16_model_parses_to_float32_and_is_supported(tmp_path, float_io):
    from compiler_core.targets import check_support

    source = _save(_half_conv_model(float_io), tmp_path / "half.onnx")
    mblt = mblt_compile(source, tmp_path / "half.mblt")
    canonical = onnx.load(str(mblt))
    types = {value.type.tensor_type.elem_type for value in
             [*canonical.graph.input, *canonical.graph.output, *canonical.graph.value_info]}
    types |= {tensor.data_type for tensor in canonical.graph.initializer}
    assert types == {TensorProto.FLOAT}
    assert "Cast" not in {node.op_type for node in canonical.graph.node}
    assert check_support(load_mblt(mblt), "aries-rb").all_supported
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    expected = _run(source, {"x": x if float_io else x.astype(np.float16)})[0]
    np.testing.assert_allclose(_run(mblt, {"x": x})[0], expected, atol=0.02, rtol=0.01)  # float16 rounding


def test_float64_model_computes_in_float32_with_huge_constants_clipped(tmp_path):
    weights = numpy_helper.from_array(RNG.standard_normal((6, 4)), "w")
    fill = numpy_helper.from_array(np.array([-1e300, 0, 0, 0], np.float64), "fill")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Add", ["r", "fill"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 4])], [weights, fill])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "double.onnx")
    mblt = mblt_compile(source, tmp_path / "double.mblt")
    canonical = onnx.load(str(mblt))
    assert {tensor.data_type for tensor in canonical.graph.initializer} == {TensorProto.FLOAT}
    assert canonical.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    x = RNG.standard_normal((2, 6))
    got = _run(mblt, {"x": x.astype(np.float32)})[0]
    assert np.all(np.isfinite(got)) and np.all(got[:, 0] == -np.finfo(np.float32).max)
    np.testing.assert_allclose(got[:, 1:], _run(source, {"x": x})[0][:, 1:], rtol=1e-5, atol=1e-5)


def detector_with_nms() -> onnx.ModelProto:
    """Conv -> boxes and scores -> NonMaxSuppression (data-dependent output size); a threshold input feeds only NMS."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["flat"]),
             helper.make_node("Transpose", ["flat"], ["rows"], perm=[0, 2, 1]),
             helper.make_node("Split", ["rows", "split"], ["boxes", "logits"], axis=2),
             helper.make_node("Sigmoid", ["logits"], ["probabilities"]),
             helper.make_node("Transpose", ["probabilities"], ["scores"], perm=[0, 2, 1]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "keep", "iou", "threshold"], ["selected"],
                              name="box_selection")]
    weights = [_tensor("w", 6, 3, 3, 3), numpy_helper.from_array(np.array([1, 6, 64], np.int64), "shape"),
               numpy_helper.from_array(np.array([4, 2], np.int64), "split"),
               numpy_helper.from_array(np.array([10], np.int64), "keep"),
               numpy_helper.from_array(np.array([0.5], np.float32), "iou")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
              helper.make_tensor_value_info("threshold", TensorProto.FLOAT, [1])]
    graph = helper.make_graph(nodes, "detector", inputs, [helper.make_tensor_value_info("selected", TensorProto.INT64, None)],
                              weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_non_max_suppression_is_refused_with_the_tensors_to_cut_at(tmp_path):
    source = _save(detector_with_nms(), tmp_path / "detector.onnx")
    with pytest.raises(UnsupportedOpsError) as caught:
        mblt_compile(source, tmp_path / "detector.mblt")
    assert caught.value.fields["cut_at"] == ["boxes", "scores"]
    assert "--output-names boxes,scores" in caught.value.hint
    assert not (tmp_path / "detector.mblt").exists()


def test_output_names_cut_the_graph_before_post_processing(tmp_path):
    source = _save(detector_with_nms(), tmp_path / "detector.onnx")
    mblt = mblt_compile(source, tmp_path / "detector.mblt", output_names=["boxes", "scores"])
    canonical = onnx.load(str(mblt))
    assert [value.name for value in canonical.graph.output] == ["boxes", "scores"]
    assert [value.name for value in canonical.graph.input] == ["x"]  # the NMS threshold input went with it
    assert "NonMaxSuppression" not in {node.op_type for node in canonical.graph.node}
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    cut = onnx.utils.Extractor(onnx.shape_inference.infer_shapes(onnx.load(source))).extract_model(["x"], ["boxes", "scores"])
    for ours, reference in zip(_run(mblt, {"x": x}), _run(_save(cut, tmp_path / "cut.onnx"), {"x": x})):
        np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)
    assert read_provenance(mblt)["parser_options"]["output_names"] == ["boxes", "scores"]


def test_output_names_that_are_not_tensors_are_an_argument_error(tmp_path):
    source = _save(detector_with_nms(), tmp_path / "detector.onnx")
    with pytest.raises(ArgumentError, match=r"\['box'\]") as caught:
        mblt_compile(source, tmp_path / "detector.mblt", output_names=["box", "scores"])
    assert "boxes" in caught.value.hint


@pytest.mark.parametrize(("shape", "size", "attributes"), [
    ((1, 10, 12, 12), 5, {"alpha": 1e-4, "beta": 0.75, "bias": 1.0}),  # AlexNet's / GoogLeNet's
    ((2, 10, 12, 12), 4, {"alpha": 2e-3, "beta": 0.5, "bias": 2.0}),   # an even window: one more channel after
    ((1, 10, 40), 3, {}),                                               # rank 3, the ONNX defaults
])
def test_local_response_normalization_becomes_ops_with_integer_kernels(tmp_path, shape, size, attributes):
    """LRN has no integer kernel; it is written as x * Pow(banded 1x1 Conv(x * x) + bias, -beta), same values."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("LRN", ["r"], ["y"], size=size, **attributes)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
                   tmp_path / "lrn.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    assert [node.op_type for node in load_mblt(mblt).graph] == ["Relu", "Mul", "Conv", "Pow", "Mul"]
    x = (np.random.default_rng(1).standard_normal(shape) * 30).astype(np.float32)
    (actual,) = ort.InferenceSession(str(mblt)).run(None, {"x": x})
    # The ONNX spec by hand: onnxruntime's LRN takes odd sizes and rank 4 only; onnx.reference's loops over the
    # batch instead of the channels.
    alpha, beta, bias = (attributes.get(name, default) for name, default in (("alpha", 1e-4), ("beta", 0.75),
                                                                                 ("bias", 1.0)))
    relu = np.maximum(x.astype(np.float64), 0)
    window = np.stack([(relu[:, max(0, c - (size - 1) // 2):c + size - (size - 1) // 2] ** 2).sum(1)
                       for c in range(shape[1])], 1)
    np.testing.assert_allclose(actual, relu / (bias + alpha / size * window) ** beta, rtol=1e-5, atol=1e-5)
    if shape[1:] == (10, 12, 12) and size % 2:
        (library,) = ort.InferenceSession(source).run(None, {"x": x})
        np.testing.assert_allclose(actual, library, rtol=1e-5, atol=1e-5)


def test_transposes_around_element_wise_ops_move_past_them_and_cancel(tmp_path):
    """The NHWC islands TFLite/Keras graphs leave between NCHW convolutions (a residual Add of two transposed
    branches, an activation, a per-channel constant on the last axis, ``c - x``, a global pool over H and W)
    lose their Transposes and keep their values."""
    rng = np.random.default_rng(2)
    to_nhwc, to_nchw = [0, 2, 3, 1], [0, 3, 1, 2]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["b"], kernel_shape=[1, 1]),
             helper.make_node("Transpose", ["a"], ["a_t"], perm=to_nhwc),
             helper.make_node("Transpose", ["b"], ["b_t"], perm=to_nhwc),
             helper.make_node("Add", ["a_t", "b_t"], ["s"]),
             helper.make_node("Mul", ["s", "gain"], ["m"]),           # per channel, on NHWC's last axis
             helper.make_node("Sub", ["one", "m"], ["d"]),            # a constant first
             helper.make_node("LeakyRelu", ["d"], ["r"], alpha=0.2),
             helper.make_node("Transpose", ["r"], ["r_t"], perm=to_nchw),
             helper.make_node("Conv", ["r_t", "w3"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Transpose", ["c"], ["c_t"], perm=to_nhwc),
             helper.make_node("ReduceMean", ["c_t", "hw"], ["y"], keepdims=0),
             helper.make_node("Transpose", ["r_t"], ["k_t"], perm=to_nhwc),  # feeds a pool with keepdims
             helper.make_node("ReduceMax", ["k_t", "w_axis"], ["z"])]
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name) for name, shape in
             (("w1", (6, 4, 1, 1)), ("w2", (6, 4, 1, 1)), ("w3", (5, 6, 1, 1)), ("gain", (6,)))]
    inits += [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
              numpy_helper.from_array(np.array([1, 2], np.int64), "hw"),
              numpy_helper.from_array(np.array([2], np.int64), "w_axis")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 7, 1, 6])], inits)
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8),
                   tmp_path / "nhwc.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    ops = [node.op_type for node in load_mblt(mblt).graph]
    assert ops.count("Transpose") == 1, ops  # only z's: ReduceMax keeps its dims, so its NHWC output is transposed
    feed = {"x": rng.standard_normal((1, 4, 7, 9)).astype(np.float32)}
    for actual, expected in zip(ort.InferenceSession(str(mblt)).run(None, feed),
                                ort.InferenceSession(source).run(None, feed)):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_weight_shared_between_layers_stays_one_initializer(tmp_path):
    """ALBERT-style sharing: two MatMuls read Transpose(W) of one 64x64 weight. Constant folding gives each its own
    transposed copy; the MBLT merges them back (chython-rxnmap's 85 MB ONNX became a 642 MB MBLT)."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Transpose", ["W"], ["Wt1"], perm=[1, 0]), helper.make_node("MatMul", ["x", "Wt1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]), helper.make_node("Transpose", ["W"], ["Wt2"], perm=[1, 0]),
             helper.make_node("MatMul", ["r", "Wt2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])],
                              [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                   tmp_path / "shared.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    assert [list(t.dims) for t in onnx.load(mblt).graph.initializer] == [[64, 64]]
    feed = {"x": rng.standard_normal((1, 16, 64)).astype(np.float32)}
    np.testing.assert_array_equal(ort.InferenceSession(mblt).run(None, feed)[0],
                                  ort.InferenceSession(source).run(None, feed)[0])


def test_a_model_quantized_with_qdq_nodes_parses_to_its_float_function(tmp_path):
    """onnxruntime's quantize_static output (QDQ pairs on activations, DequantizeLinear on int8 weights), with a
    ``Q -> Transpose -> DQ`` as tf2onnx writes: no Q/DQ is left, each pair is a Clip to its integer range, and the
    MBLT computes the QDQ model's values up to its rounding."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static

    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Sigmoid", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 4])],
                              [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
                               numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                   tmp_path / "float.onnx")
    samples = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(samples)

        def get_next(self):
            return next(self.items, None)

    quantized = str(tmp_path / "qdq.onnx")
    quantize_static(source, quantized, Reader(), activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"ForceQuantizeNoInputCheck": True})
    assert {"QuantizeLinear", "DequantizeLinear"} <= {node.op_type for node in onnx.load(quantized).graph.node}
    mblt = mblt_compile(quantized, tmp_path / "out.mblt")
    ops = [node.op_type for node in load_mblt(mblt).graph]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops and "Clip" in ops
    feed = samples[0]
    (actual,) = ort.InferenceSession(mblt).run(None, feed)
    (expected,) = ort.InferenceSession(quantized).run(None, feed)
    assert np.abs(actual - expected).max() < 0.05  # the QDQ model's own rounding: a few output steps (1/255)
    assert float(actual.ravel() @ expected.ravel()) / np.linalg.norm(actual) / np.linalg.norm(expected) > 0.999


@pytest.mark.parametrize("mover", ["Transpose", "Reshape"])
def test_a_qdq_pair_around_a_data_movement_is_a_clip_before_it(tmp_path, mover):
    """tf2onnx writes ``QuantizeLinear -> Transpose/Reshape -> DequantizeLinear`` (uint8, zero point 128)."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("Transpose", ["q"], ["m"], perm=[0, 2, 3, 1]) if mover == "Transpose" else
             helper.make_node("Reshape", ["q", "shape"], ["m"]),
             helper.make_node("DequantizeLinear", ["m", "s", "z"], ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    out_shape = [1, 4, 5, 3] if mover == "Transpose" else [1, 60]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
                               numpy_helper.from_array(np.array(128, np.uint8), "z"),
                               numpy_helper.from_array(np.array([1, 60], np.int64), "shape")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                   tmp_path / "qdq.onnx")
    mblt = mblt_compile(source, tmp_path / "out.mblt")
    ops = [node.op_type for node in load_mblt(mblt).graph]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    x = (np.random.default_rng(5).standard_normal((1, 3, 4, 5)) * 5).astype(np.float32)
    (actual,) = ort.InferenceSession(mblt).run(None, {"x": x})
    (expected,) = ort.InferenceSession(source).run(None, {"x": x})
    np.testing.assert_allclose(actual, expected, atol=0.025 + 1e-6)  # half a step: the rounding, not the range
    assert actual.max() > 6.3  # the clamp at (255 - 128) * 0.05 = 6.35 holds; values beyond it are cut
    assert actual.max() <= 6.35 + 1e-6


def test_a_qoperator_model_is_refused_with_what_to_give_instead(tmp_path):
    """onnxruntime's QOperator format (QLinearConv, QGemm ...) cannot be parsed; the error says to give the float
    model or a QDQ export, which compile."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    rng = np.random.default_rng(6)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 1])],
                              [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                   tmp_path / "float.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.items, None)

    quantized = str(tmp_path / "qop.onnx")
    quantize_static(source, quantized, Reader(), quant_format=QuantFormat.QOperator)
    with pytest.raises(UnsupportedOpsError) as caught:
        mblt_compile(quantized, tmp_path / "out.mblt")
    assert "QOperator" in caught.value.hint and "QDQ" in caught.value.hint


def test_canonical_names_look_up_each_op_schema_once(monkeypatch):
    """Initializers are named after their first consumer's formal input (``Conv_1.W``): three Convs with weights and
    biases ask ONNX for the Conv schema once, and the names are the schema's."""
    import onnx_ir as ir

    from compiler_core.mblt import naming

    naming._formal_inputs.cache_clear()
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((2, 2, 1, 1)).astype(np.float32), f"w{i}") for i in range(3)]
    biases = [numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), f"b{i}") for i in range(3)]
    nodes = [helper.make_node("Conv", [source, f"w{i}", f"b{i}"], [target])
             for i, (source, target) in enumerate((("x", "c0"), ("c0", "c1"), ("c1", "y")))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [*weights, *biases])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    looked_up = []
    get_schema = onnx.defs.get_schema
    monkeypatch.setattr(onnx.defs, "get_schema", lambda *args: looked_up.append(args[0]) or get_schema(*args))
    naming.assign_canonical_names(model)
    assert looked_up == ["Conv"]
    assert sorted(model.graph.initializers) == ["Conv_0.B", "Conv_0.W", "Conv_1.B", "Conv_1.W", "Conv_2.B", "Conv_2.W"]


def test_a_constant_node_left_for_the_last_fold_that_writes_an_output_gets_the_constant_outputs_refusal(tmp_path):
    """A multi-output Split of a constant (the optimizer skips those) whose second part is a model output stopped the
    parse with INTERNAL_ERROR ("is an output of graph ... Set replace_graph_outputs=True"); it now gets the refusal
    of constant outputs, whose hint leaves them out, and that parse runs."""
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("Split", ["c", "sizes"], ["a", "b"], axis=0),
             helper.make_node("Add", ["y", "a"], ["s"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "c"),
                               numpy_helper.from_array(np.array([2, 2], np.int64), "sizes")])
    source = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8),
                   tmp_path / "split.onnx")
    with pytest.raises(UnsupportedOpsError, match=r"Output\(s\) 'b' of the model are constants.*output_names=\['s'\]"):
        mblt_compile(source, tmp_path / "out.mblt")
    model = load_mblt(mblt_compile(source, tmp_path / "out.mblt", output_names=["s"]))
    assert [value.name for value in model.graph.outputs] == ["s"]
