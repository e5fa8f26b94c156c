"""ONNX and MBLT readers on real files: external data, dangling inputs, whom a checker failure blames."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mblt_compile, mxq_compile, parse_model
from compiler_core.errors import InternalError, InvalidModelError, ModelLoadError
from compiler_core.mblt import canonicalize as canonicalize_module
from compiler_core.mblt.io import load_mblt, write_mblt
from compiler_core.runtime import Accelerator, Model
from compiler_core.runtime.inputs import load_run_inputs

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"


def _save_external(source: Path, folder: Path) -> Path:
    """``source`` re-saved as ``folder/model.onnx`` + ``model.onnx.data`` (every tensor external)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "model.onnx"
    onnx.save(onnx.load(str(source)), str(target), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=0)
    onnx.checker.check_model(str(target), full_check=True)
    assert (folder / "model.onnx.data").stat().st_size > target.stat().st_size
    return target


def _graph_bytes(path: Path) -> bytes:
    """The MBLT's graph (provenance aside, which names the source path)."""
    model = onnx.load(str(path))
    return model.graph.SerializeToString(deterministic=True)


def _ort(path: Path, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _gemm_model(opset: int = 13) -> onnx.ModelProto:
    """A Gemm with alpha/beta that canonicalization rewrites, and a small bias that it keeps."""
    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "Gemm_0.C")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "Gemm_0.C"], ["y"], alpha=0.5, beta=2.0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weights, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


# -- external data -------------------------------------------------------------------------------


def test_small_model_with_external_data_parses_and_matches(tmp_path):
    """The reported case: a folded bias kept an external-data location that did not exist any more."""
    source = tmp_path / "src" / "model.onnx"
    source.parent.mkdir()
    onnx.save(_gemm_model(), str(source), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    onnx.checker.check_model(str(source), full_check=True)
    mblt = mblt_compile(source, tmp_path / "out" / "gemm.mblt")
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 8)).astype(np.float32)}
    np.testing.assert_allclose(_ort(mblt, feeds)[0], _ort(source, feeds)[0], rtol=1e-5, atol=1e-6)
    assert not any(t.data_location == TensorProto.EXTERNAL for t in onnx.load(str(mblt)).graph.initializer)


def test_mobilenet_with_external_data_gives_the_same_mblt_as_inline(tmp_path):
    import realmodels

    try:
        inline = realmodels.mobilenet_v2_onnx()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))
    external = _save_external(inline, tmp_path / "external")
    from_external = mblt_compile(external, tmp_path / "a.mblt")
    from_inline = mblt_compile(inline, tmp_path / "b.mblt")
    assert _graph_bytes(from_external) == _graph_bytes(from_inline)
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    name = onnx.load(str(inline), load_external_data=False).graph.input[0].name
    np.testing.assert_allclose(_ort(from_external, {name: image})[0], _ort(inline, {name: image})[0],
                               rtol=1e-3, atol=1e-4)


def test_sample_with_external_data_compiles_and_matches_fp32(tmp_path):
    source = _save_external(SAMPLE_DIR / "model.onnx", tmp_path / "external")
    mblt = mblt_compile(source, tmp_path / "sample.mblt")
    result = mxq_compile(mblt, "aries-rb", SAMPLE_DIR / "calib", tmp_path / "sample.mxq",
                         compile_config=SAMPLE_DIR / "compile_config.yaml")
    model = Model(result.mxq_path, input_layout="NCHW")
    model.launch(Accelerator(model.artifact.device))
    fp32 = ort.InferenceSession(str(SAMPLE_DIR / "model.onnx"), providers=["CPUExecutionProvider"])
    agree, cosines = 0, []
    for _, feed in load_run_inputs(model.artifact, [str(SAMPLE_DIR / "test")]):
        image = feed["image"]
        expected = fp32.run(None, {"image": image})[0]
        got = model.infer(image)[0]
        agree += int(np.argmax(got) == np.argmax(expected))
        cosines.append(float(got.ravel() @ expected.ravel() / (np.linalg.norm(got) * np.linalg.norm(expected))))
    print(f"\nexternal-data sample vs FP32: top-1 agreement {agree}/{len(cosines)}, min cosine {min(cosines):.4f}")
    assert len(cosines) >= 10 and agree >= 0.9 * len(cosines) and min(cosines) > 0.98


def test_mblt_with_large_weights_is_written_with_external_data_and_read_back(tmp_path):
    graph, provenance = parse_model(str(SAMPLE_DIR / "model.onnx"))
    path = write_mblt(graph, tmp_path / "out" / "big.mblt", provenance, external_data_threshold=1024)
    data = tmp_path / "out" / "big.mblt.data"
    assert data.is_file() and data.stat().st_size > 100_000 > path.stat().st_size
    assert sorted(p.name for p in path.parent.iterdir()) == ["big.mblt", "big.mblt.data"]  # no .part left
    loaded = load_mblt(path)
    # read into memory: the loaded model can be written elsewhere and the data file removed
    moved = write_mblt(loaded, tmp_path / "moved" / "copy.mblt", provenance)
    shutil.rmtree(tmp_path / "out")
    feeds = {"image": np.random.default_rng(0).standard_normal((1, 1, 28, 28)).astype(np.float32)}
    np.testing.assert_allclose(_ort(moved, feeds)[0], _ort(SAMPLE_DIR / "model.onnx", feeds)[0],
                               rtol=1e-4, atol=1e-5)


def test_mblt_whose_data_file_is_missing_is_a_model_load_error(tmp_path):
    graph, provenance = parse_model(str(SAMPLE_DIR / "model.onnx"))
    path = write_mblt(graph, tmp_path / "big.mblt", provenance, external_data_threshold=1024)
    (tmp_path / "big.mblt.data").unlink()
    with pytest.raises(ModelLoadError, match="big.mblt.data.*file missing"):
        load_mblt(path)


@pytest.mark.parametrize("location", ["/etc/passwd", "../outside.data", ""])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, location):
    model = _gemm_model()
    tensor = model.graph.initializer[0]
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.external_data.add(key="location", value=location)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError) as caught:
        parse_model(str(path))
    assert "W" in caught.value.message and ("not a file inside" in caught.value.message
                                            or "missing" in caught.value.message)


def test_absurd_initializer_size_is_refused_before_allocation(tmp_path):
    model = _gemm_model()
    huge = TensorProto(name="huge", data_type=TensorProto.FLOAT, dims=[1 << 20, 1 << 20], raw_data=b"\0" * 16)
    model.graph.initializer.append(huge)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelLoadError, match="'huge' declares .* byte limit") as caught:
        parse_model(str(path))
    assert caught.value.fields["tensor"] == "huge"


# -- dangling inputs -----------------------------------------------------------------------------


def test_a_node_reading_an_undefined_tensor_is_invalid_model(tmp_path):
    model = _gemm_model()
    model.graph.node.append(helper.make_node("Add", ["y", "ghost"], ["z"], name="add_ghost"))
    model.graph.output[0].name = "z"
    path = tmp_path / "dangling.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InvalidModelError) as caught:
        mblt_compile(path, tmp_path / "out.mblt")
    assert caught.value.code == "INVALID_MODEL"
    assert caught.value.fields["node"] == "add_ghost" and caught.value.fields["tensor"] == "ghost"
    assert "'add_ghost'" in caught.value.message and "'ghost'" in caught.value.message
    assert not (tmp_path / "out.mblt").exists()


def test_a_subgraph_may_read_outer_scope_values_but_not_undefined_ones(tmp_path):
    def model_with_branch(read: str) -> Path:
        branch = helper.make_graph([helper.make_node("Neg", [read], ["b"])], "branch", [],
                                   [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4])])
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True))),
             helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch, name="choose")],
            "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
        path = tmp_path / f"if_{read}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
        return path

    graph, _ = parse_model(str(model_with_branch("r")))
    assert [v.name for v in graph.graph.inputs] == ["x"]
    with pytest.raises(InvalidModelError, match="reads tensor 'nowhere'"):
        parse_model(str(model_with_branch("nowhere")))


# -- whom a checker failure blames ----------------------------------------------------------------


def _failing_checker(monkeypatch):
    """Make the final check of the parsed graph fail, as a compiler bug would."""
    def failing(model):
        raise onnx.checker.ValidationError("simulated: the parsed graph is broken")

    monkeypatch.setattr(canonicalize_module, "check_model", failing)


def test_a_checker_failure_on_a_valid_source_is_reported_as_a_compiler_bug(tmp_path, monkeypatch):
    path = tmp_path / "ok.onnx"
    onnx.save(_gemm_model(), str(path))
    _failing_checker(monkeypatch)
    with pytest.raises(InternalError) as caught:
        parse_model(str(path))
    assert caught.value.code == "INTERNAL_ERROR" and "compiler bug" in caught.value.hint
    assert "source model is probably malformed" not in str(caught.value)


def test_a_checker_failure_blames_the_source_only_when_the_source_fails_the_full_checker(tmp_path, monkeypatch):
    model = _gemm_model()
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 5  # Gemm gives 4: full check fails
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    _failing_checker(monkeypatch)
    with pytest.raises(InvalidModelError) as caught:
        parse_model(str(path))
    assert caught.value.message.startswith("The source model fails onnx.checker (full check):")
    assert caught.value.fields["file"] == str(path)



# -- the opset converter's warnings -----------------------------------------------------------------


def test_only_the_expected_converter_warning_is_hidden(tmp_path, caplog):
    converter = logging.getLogger("onnxscript.version_converter")
    with caplog.at_level(logging.WARNING, logger="onnxscript.version_converter"):
        path = tmp_path / "old.onnx"
        onnx.save(_gemm_model(opset=13), str(path))
        parse_model(str(path))  # opset 13 -> 21 goes through the C-API fallback
        with canonicalize_module._quiet("onnxscript.version_converter"):
            converter.warning("The model version conversion is not supported by the onnxscript version converter "
                              "and fallback is enabled. The model will be converted using the onnx C API")
            converter.warning("Failed to convert the model to the target version 21 using the ONNX C API.")
    messages = [record.getMessage() for record in caplog.records if record.name == converter.name]
    assert messages == ["Failed to convert the model to the target version 21 using the ONNX C API."]


# -- inconsistent shapes in the source (long-profile fuzz findings) ---------------------------------


def _seed_with(opset: int, flatten: onnx.NodeProto, *extra: onnx.TensorProto) -> onnx.ModelProto:
    """The fuzz seed (Conv -> Relu -> MaxPool -> Flatten -> Gemm) with its Flatten replaced."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from fuzzing import seed_onnx

    model = seed_onnx()
    model.opset_import[0].version = opset
    model.graph.node.remove(model.graph.node[3])
    model.graph.node.insert(3, flatten)
    model.graph.initializer.extend(extra)
    return model


@pytest.mark.parametrize("opset", [8, 13, 21])
def test_a_reshape_whose_target_does_not_fit_is_invalid_model_naming_it(tmp_path, opset):
    target = numpy_helper.from_array(np.array([1, 60], np.int64), "target")  # the input holds 64 elements
    model = _seed_with(opset, helper.make_node("Reshape", ["p", "target"], ["f"], name="reshape"), target)
    path = tmp_path / "reshape.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InvalidModelError) as caught:
        parse_model(str(path))
    assert caught.value.code == "INVALID_MODEL"
    assert "'reshape'" in caught.value.message or "'fc'" in caught.value.message, caught.value.message


def test_a_source_that_passes_its_own_checker_but_is_inconsistent_is_invalid_model(tmp_path):
    """Long fuzz finding: MaxPool reads the 1-channel input, so the Gemm gets 16 features, not 64.
    onnx.checker passes the opset-8 source; the canonical graph failed it (was INTERNAL_ERROR)."""
    model = _seed_with(8, helper.make_node("Flatten", ["p"], ["f"], name="flatten"))
    model.graph.node[2].input[0] = "x"
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "mismatch.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InvalidModelError) as caught:
        parse_model(str(path))
    assert caught.value.fields.get("node") == "fc" and "64" in caught.value.message and "n4" not in caught.value.message


@pytest.mark.parametrize(("source", "target", "allowzero", "fits"), [
    ([1, 4, 4, 4], [1, -1], False, True), ([1, 4, 4, 4], [0, 64], False, True), ([1, 4, 4, 4], [0, 60], False, False),
    ([1, 4, 4, 4], [-1, -1], False, False), ([1, 4, 4, 4], [1, 3, -1], False, False), ([0, 4], [0, 7], True, True),
    ([0, 4], [-1, 0], True, False), ([2, 3], [3, 2], False, True)])
def test_reshape_fit_rule(source, target, allowzero, fits):
    assert (canonicalize_module._reshape_problem(source, target, allowzero) is None) == fits


def _corrupt_text_model() -> bytes:
    """A model whose text fields hold marker strings (each 8 ASCII bytes, so a same-length byte swap keeps it valid)."""
    nodes = [helper.make_node("Relu", ["x"], ["MARKINPU"], name="MARKNAME", doc_string="MARKDOCS"),
             helper.make_node("Neg", ["MARKINPU"], ["y"])]
    nodes[0].metadata_props.add(key="mblt.note", value="MARKMETA")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["MARKDIMS", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones(2, np.float32), "MARKTENS")])
    return helper.make_model(graph).SerializeToString()


@pytest.mark.parametrize("marker, field", [
    (b"MARKNAME", "onnx.NodeProto.name"), (b"MARKINPU", "onnx.NodeProto.output"),  # first met as a node output
    (b"MARKDOCS", "onnx.NodeProto.doc_string"), (b"MARKMETA", "onnx.StringStringEntryProto.value"),
    (b"MARKDIMS", "onnx.TensorShapeProto.Dimension.dim_param"), (b"MARKTENS", "onnx.TensorProto.name"),
])
def test_text_that_is_not_utf8_is_refused_naming_its_field(tmp_path, marker, field):
    path = tmp_path / "bad.onnx"
    path.write_bytes(_corrupt_text_model().replace(marker, b"\xff\xfe" + marker[2:]))
    with pytest.raises(ModelLoadError, match="is corrupt") as info:
        parse_model(path)
    assert f"'{field}'" in str(info.value)


def test_text_of_a_valid_model_is_checked_without_the_field_walk(tmp_path, monkeypatch):
    """A model whose text is all UTF-8 passes the proto3 parse of its bytes: the Python walk over its fields (which
    names a bad field) does not run; a model with a bad field takes the walk (test above), and so does one whose weights
    make the file large for its node count (the parse would copy them)."""
    from compiler_core.frontends import onnx as onnx_frontend

    path = tmp_path / "good.onnx"
    path.write_bytes(_corrupt_text_model())
    walks = []
    walk = onnx_frontend._first_invalid_text
    monkeypatch.setattr(onnx_frontend, "_first_invalid_text", lambda message: walks.append(message) or walk(message))
    parse_model(path, input_shape_dict={"x": [1, 4]})
    assert walks == []
    path.write_bytes(_corrupt_text_model().replace(b"MARKNAME", b"\xff\xfeRKNAME"))
    with pytest.raises(ModelLoadError, match="is corrupt"):
        parse_model(path)
    assert len(walks) > 1
    walks.clear()
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones(4096, np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    parse_model(path)
    assert len(walks) > 1


def _reference_problem(graph, check):
    try:
        check(graph, Path("m.onnx"), frozenset())
    except InvalidModelError as error:
        return error.message, error.fields
    return None


@pytest.mark.parametrize("case", ["fine", "redefined", "missing", "missing_output", "cycle", "out_of_order",
                                  "subgraph_missing", "subgraph_outer"])
def test_reference_check_finds_what_the_name_by_name_check_finds(case):
    """The two-walk reference check raises the same first problem as the name-by-name one, or none."""
    from compiler_core.frontends import onnx as onnx_frontend

    branch_input = "nowhere" if case == "subgraph_missing" else "a"
    branch = helper.make_graph([helper.make_node("Neg", [branch_input], ["b_out"])], "branch", [],
                               [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("If", ["cond"], ["c"], then_branch=branch, else_branch=branch),
             helper.make_node("Add", ["b", "c"], ["y"])]
    outputs = ["y"]
    if case == "redefined":
        nodes.append(helper.make_node("Abs", ["x"], ["a"]))
    elif case == "missing":
        nodes[3].input[1] = "ghost"
        nodes[1].input[0] = "phantom"
    elif case == "missing_output":
        outputs.append("nothing")
    elif case == "cycle":
        nodes[0].input[0] = "y"
    elif case == "out_of_order":
        nodes.reverse()
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs])
    found = _reference_problem(graph, onnx_frontend.check_references)
    assert found == _reference_problem(graph, onnx_frontend._check_references_in_full)
    assert (found is None) == (case in ("fine", "out_of_order", "subgraph_outer"))
