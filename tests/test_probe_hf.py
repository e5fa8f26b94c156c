"""HuggingFace ``transformers`` families a probe (``bench/probe_hf.py``, s13) found broken, through the user's path.

Each test builds a tiny random-weight config, saves it with ``save_pretrained`` and compiles the folder with
``mxq_compile`` as a user would; the MXQ (bit-exact simulator) is compared with the ``transformers`` module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from corpus import write_manifest

from compiler_core.api import mxq_compile
from compiler_core.runtime import Accelerator, Model

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SEQUENCE = 16


def _folder(tmp_path: Path, model_class: str, config_class: str, **config) -> Path:
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
    folder = tmp_path / model_class
    model.save_pretrained(folder)
    return folder


def _tokens(rng: np.random.Generator, used: int, vocabulary: int, pad: int) -> dict[str, np.ndarray]:
    ids = np.full((1, SEQUENCE), pad, np.int64)
    ids[0, :used] = rng.integers(5, vocabulary, used)
    mask = (np.arange(SEQUENCE) < used).astype(np.int64)[None]
    return {"input_ids": ids, "attention_mask": mask}


def _compile(folder: Path, tmp_path: Path, samples: list[dict], shapes: dict, **options) -> Model:
    mxq_compile(folder, target_device="aries-rb", calib_data_path=write_manifest(tmp_path / "calib", samples),
                save_path=tmp_path / "model.mxq", input_shape_dict=shapes, analysis_holdout=0, **options)
    model = Model(tmp_path / "model.mxq", input_layout="NCHW")
    model.launch(Accelerator("aries-rb"))
    return model


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_a_padding_mask_computed_from_the_attention_mask_input_masks_the_softmax(tmp_path):
    """BERT's additive mask is computed at run time from ``attention_mask``: the padded tokens get no attention.

    Before, only a constant -inf-like mask made the Softmax count saturated entries as -inf; a computed one
    was read as the smallest score, and over the narrow scores of a small model the padded tokens kept
    almost the weight of real ones: the padded tail's ids changed the real tokens' outputs. Masked entries
count as -inf, so the real tokens' outputs are bit-identical whatever the padded tail holds.
    """
    vocabulary = 500
    folder = _folder(tmp_path, "BertModel", "BertConfig", vocab_size=vocabulary, hidden_size=32, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    rng = np.random.default_rng(0)
    calib = [_tokens(rng, int(rng.integers(SEQUENCE // 2, SEQUENCE + 1)), vocabulary, 0) for _ in range(16)]
    shapes = {"input_ids": [1, SEQUENCE], "attention_mask": [1, SEQUENCE]}
    model = _compile(folder, tmp_path, calib, shapes)
    used = 9
    sample = _tokens(np.random.default_rng(1), used, vocabulary, 0)
    other_tail = {**sample, "input_ids": sample["input_ids"].copy()}
    other_tail["input_ids"][0, used:] = np.random.default_rng(2).integers(5, vocabulary, SEQUENCE - used)
    first, second = (np.asarray(model.infer(feed)[0]).reshape(1, SEQUENCE, -1)[0, :used] for feed in (sample, other_tail))
    reference = transformers.BertModel.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = reference(**{k: torch.from_numpy(v) for k, v in sample.items()}).last_hidden_state.numpy()[0, :used]
    assert _cosine(first, expected) >= 0.99
    np.testing.assert_array_equal(first, second, err_msg="the padded tokens' ids reach the real tokens")


def test_detr_parses_and_compiles_and_follows_torch(tmp_path):
    """DETR through the folder path: two things broke it.

    It reports SDPA attention, but its ResNet backbone refuses to be set back to SDPA after the eager export:
    that refusal escaped the export as an INTERNAL_ERROR (now the module keeps eager attention). Its first
    decoder layer multiplies constant queries (zero targets plus position embeddings, folded only after the
    rewrite rules ran) with the encoder's memory: a MatMul with a constant first operand, which no kernel
    takes (an INTERNAL_ERROR at quantization); the rules now run again on what the last folding exposed and
    turn it into a dense layer.
    """
    import onnxruntime as ort

    from compiler_core.api import mblt_compile

    backbone = {"model_type": "resnet", "depths": [1, 1], "hidden_sizes": [8, 16], "embedding_size": 8,
                "out_features": ["stage2"]}
    folder = _folder(tmp_path, "DetrForObjectDetection", "DetrConfig", use_timm_backbone=False,
                     use_pretrained_backbone=False, backbone=None, backbone_config=backbone, d_model=16,
                     encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                     encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=4, num_labels=3)
    shapes = {"pixel_values": [1, 3, 32, 32]}
    rng = np.random.default_rng(0)
    images = [{"pixel_values": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(19)]
    mblt = mblt_compile(folder, tmp_path / "detr.mblt", input_shape_dict=shapes)
    session = ort.InferenceSession(str(mblt), providers=["CPUExecutionProvider"])
    model = _compile(folder, tmp_path, images[:16], shapes)
    reference = transformers.DetrForObjectDetection.from_pretrained(folder).eval()
    for sample in images[16:]:
        with torch.no_grad():
            expected = reference(pixel_values=torch.from_numpy(sample["pixel_values"])).logits.numpy()
        np.testing.assert_allclose(session.run(None, sample)[0], expected, atol=1e-4)
        assert _cosine(model.infer(sample)[0], expected) >= 0.99


def test_a_decoder_sequence_classifier_runs_its_cpu_head_and_tail(tmp_path):
    """Qwen2ForSequenceClassification picks the logits of the last real token: an index the CPU head computes
    from the ids and only the CPU tail reads (a GatherND on the NPU body's scores).

    Before, the head was exported with no outputs (it fed no NPU input) and the tail without that input: the MXQ
    compiled, but loading its CPU head failed in onnxruntime (an INTERNAL_ERROR when run).
    """
    vocabulary = 300
    folder = _folder(tmp_path, "Qwen2ForSequenceClassification", "Qwen2Config", vocab_size=vocabulary,
                     hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                     intermediate_size=64, max_position_embeddings=64, num_labels=3, pad_token_id=0)
    rng = np.random.default_rng(0)
    calib = [_tokens(rng, int(rng.integers(SEQUENCE // 2, SEQUENCE + 1)), vocabulary, 0) for _ in range(16)]
    shapes = {"input_ids": [1, SEQUENCE], "attention_mask": [1, SEQUENCE]}
    model = _compile(folder, tmp_path, calib, shapes, cpu_offload=True)
    reference = transformers.Qwen2ForSequenceClassification.from_pretrained(folder).eval()
    held_out = [_tokens(np.random.default_rng(seed), used, vocabulary, 0) for seed, used in ((1, 9), (2, 16), (3, 12))]
    got = np.concatenate([np.asarray(model.infer(sample)[0]).reshape(1, -1) for sample in held_out])
    with torch.no_grad():
        expected = np.concatenate([reference(**{k: torch.from_numpy(v) for k, v in sample.items()}).logits.numpy()
                                   for sample in held_out])
    assert got.shape == expected.shape == (3, 3)
    assert _cosine(got, expected) >= 0.99
