"""scikit-learn converters' linear ``ai.onnx.ml`` operators are written as tensor ops at parse (compiler_core/mblt/ml_ops).

Before, skl2onnx's StandardScaler + LogisticRegression (Scaler, LinearClassifier, Normalizer) was refused at parse
("Replace these operators in the source model"), and an MLP's class-label output (ArrayFeatureExtractor) too.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import mblt_compile, mxq_compile
from compiler_core.mblt.io import load_mblt

FEATURES, CLASSES = 6, 4


def _model(nodes, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "sklearn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, FEATURES])],
                              outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
                             ir_version=9)


def _pipeline(post_transform: str, classes: int) -> onnx.ModelProto:
    """Scaler -> LinearClassifier (``classes`` labels; one coefficient row when binary) -> Normalizer (L1)."""
    rng = np.random.default_rng(classes)
    rows = 1 if classes == 2 else classes
    nodes = [helper.make_node("Scaler", ["X"], ["scaled"], domain="ai.onnx.ml",
                              offset=rng.normal(size=FEATURES).tolist(), scale=rng.uniform(0.5, 2, FEATURES).tolist()),
             helper.make_node("LinearClassifier", ["scaled"], ["label", "scores"], domain="ai.onnx.ml",
                              coefficients=rng.normal(size=rows * FEATURES).tolist(),
                              intercepts=rng.normal(size=rows).tolist(), classlabels_ints=list(range(10, 10 + classes)),
                              post_transform=post_transform, multi_class=0),
             helper.make_node("Normalizer", ["scores"], ["probabilities"], domain="ai.onnx.ml", norm="L1")]
    outputs = [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
               helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, classes])]
    return _model(nodes, outputs)


def _regressor_and_labels() -> onnx.ModelProto:
    """LinearRegressor (2 targets, normalized by L2 and MAX) and an MLP-style label look-up (ArrayFeatureExtractor)."""
    rng = np.random.default_rng(7)
    classes = numpy_helper.from_array(np.array([3, 1, 4, 1, 5], np.int64), "classes")
    nodes = [helper.make_node("LinearRegressor", ["X"], ["targets"], domain="ai.onnx.ml", targets=2,
                              coefficients=rng.normal(size=2 * FEATURES).tolist(), intercepts=[0.5, -1.0]),
             helper.make_node("Normalizer", ["targets"], ["l2"], domain="ai.onnx.ml", norm="L2"),
             helper.make_node("Normalizer", ["targets"], ["max"], domain="ai.onnx.ml", norm="MAX"),
             helper.make_node("ArgMax", ["X"], ["index"], axis=1, keepdims=1),
             helper.make_node("Mod", ["index", "five"], ["wrapped"]),
             helper.make_node("ArrayFeatureExtractor", ["classes", "wrapped"], ["label"], domain="ai.onnx.ml")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, 2]) for name in ("l2", "max")]
    outputs.append(helper.make_tensor_value_info("label", TensorProto.INT64, None))
    return _model(nodes, outputs, [classes, numpy_helper.from_array(np.array(5, np.int64), "five")])


def _parsed_matches_onnxruntime(proto: onnx.ModelProto, tmp_path) -> None:
    source = tmp_path / "source.onnx"
    onnx.save(proto, source)
    mblt = mblt_compile(source, tmp_path / "model.mblt", input_shape_dict={"X": [1, FEATURES]})
    assert not [node.op_type for node in load_mblt(mblt).graph if node.domain == "ai.onnx.ml"]
    reference, ours = ort.InferenceSession(str(source)), ort.InferenceSession(str(mblt))
    for seed in range(4):
        sample = {"X": np.random.default_rng(seed).normal(size=(1, FEATURES)).astype(np.float32)}
        expected = dict(zip([o.name for o in reference.get_outputs()], reference.run(None, sample)))
        for output, value in zip(ours.get_outputs(), ours.run(None, sample)):
            assert np.allclose(value, expected[output.name], atol=1e-5), output.name
    return mblt


@pytest.mark.parametrize(("post_transform", "classes"), [("SOFTMAX", CLASSES), ("LOGISTIC", 2), ("NONE", CLASSES)])
def test_a_scaler_linear_classifier_normalizer_pipeline_parses_to_what_onnxruntime_computes(
        tmp_path, post_transform, classes):
    _parsed_matches_onnxruntime(_pipeline(post_transform, classes), tmp_path)


def test_linear_regressor_normalizers_and_a_label_lookup_parse_to_what_onnxruntime_computes(tmp_path):
    _parsed_matches_onnxruntime(_regressor_and_labels(), tmp_path)


def test_a_logistic_regression_pipeline_compiles_with_its_label_lookup_on_the_cpu(tmp_path, monkeypatch):
    """The class-label Gather runs on the CPU (``cpu_offload``), reading the body's ArgMax indices (int64): the
    analysis ran the tail on them and stopped with an INTERNAL_ERROR (KeyError: 'ArgMax_0'), as the FP32 reference
    only exposed float tensors."""
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    onnx.save(_pipeline("SOFTMAX", CLASSES), tmp_path / "lr.onnx")
    result = mxq_compile(tmp_path / "lr.onnx", target_device="aries-rb", save_path=tmp_path / "lr.mxq",
                         input_shape_dict={"X": [1, FEATURES]}, use_random_calib=True, cpu_offload=True)
    assert result.mxq_path.is_file()


def test_string_class_labels_are_kept_and_refused_naming_the_operator(tmp_path):
    proto = _pipeline("SOFTMAX", CLASSES)
    classifier = proto.graph.node[1]
    del classifier.attribute[[a.name for a in classifier.attribute].index("classlabels_ints")]
    classifier.attribute.append(helper.make_attribute("classlabels_strings", [f"c{i}" for i in range(CLASSES)]))
    proto.graph.output[0].type.tensor_type.elem_type = TensorProto.STRING
    onnx.save(proto, tmp_path / "strings.onnx")
    from compiler_core.errors import QBCompilerError

    with pytest.raises(QBCompilerError) as error:
        mblt_compile(tmp_path / "strings.onnx", tmp_path / "strings.mblt", input_shape_dict={"X": [1, FEATURES]})
    assert "LinearClassifier" in error.value.message


def test_a_tree_ensemble_is_refused_with_the_conversion_that_compiles(tmp_path):
    """skl2onnx writes a random forest as TreeEnsembleClassifier, which the NPU cannot run: the refusal names it and
    says to convert it with hummingbird-ml's GEMM trees (corpus: digits_forest compiles, cosine 0.999)."""
    from compiler_core.errors import QBCompilerError

    tree = helper.make_node("TreeEnsembleClassifier", ["X"], ["label", "probabilities"], domain="ai.onnx.ml",
                            class_ids=[0, 1], class_nodeids=[1, 2], class_treeids=[0, 0], class_weights=[1.0, 1.0],
                            classlabels_int64s=[0, 1], nodes_falsenodeids=[2, 0, 0], nodes_featureids=[0, 0, 0],
                            nodes_hitrates=[1.0, 1.0, 1.0], nodes_missing_value_tracks_true=[0, 0, 0],
                            nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_nodeids=[0, 1, 2],
                            nodes_treeids=[0, 0, 0], nodes_truenodeids=[1, 0, 0], nodes_values=[0.5, 0.0, 0.0],
                            post_transform="NONE")
    outputs = [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
               helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2])]
    onnx.save(_model([tree], outputs), tmp_path / "forest.onnx")
    with pytest.raises(QBCompilerError) as error:
        mblt_compile(tmp_path / "forest.onnx", tmp_path / "forest.mblt", input_shape_dict={"X": [1, FEATURES]})
    assert "TreeEnsembleClassifier" in error.value.message and "hummingbird-ml" in error.value.hint
