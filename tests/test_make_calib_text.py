"""make_calib_text: sentences -> token-id samples for a transformer's inputs, read back as a JSON manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest
import realmodels

from compiler_core.calibration import InputSpec, make_calib_text, open_calibration_data, token_input_roles
from compiler_core.errors import CalibrationError, ModelLoadError

NAMES = ("input_ids", "attention_mask", "token_type_ids")


def _specs(length: int = 32, names=NAMES, dtype=np.int64) -> list[InputSpec]:
    return [InputSpec(name, (1, length), np.dtype(dtype), "NC") for name in names]


@pytest.fixture(scope="module")
def tokenizer_dir():
    try:
        return realmodels.minilm_dir()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))


def test_sentences_become_the_samples_the_tokenizer_gives(tokenizer_dir, tmp_path):
    """Each line is one sample, as the model's tokenizer pads and cuts it; blank lines are skipped."""
    text = tmp_path / "sentences.txt"
    text.write_text("\n\n".join(realmodels.SENTENCES) + "\n", encoding="utf-8")
    manifest = make_calib_text(text, tokenizer_dir, _specs(), tmp_path / "out", "text", max_size=-1)
    assert manifest == tmp_path / "out" / "text.json"
    assert json.loads(manifest.read_text())["info"]["input names"] == list(NAMES)
    data = open_calibration_data(manifest, _specs())
    expected = realmodels.tokenize(realmodels.SENTENCES, 32)
    assert len(data) == len(realmodels.SENTENCES) == len(expected["input_ids"])
    for index in range(len(data)):
        sample = data.sample(index)
        for name in NAMES:
            np.testing.assert_array_equal(sample[name][0], expected[name][index])


def test_int32_inputs_positions_and_the_first_lines(tokenizer_dir, tmp_path):
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(realmodels.SENTENCES), encoding="utf-8")
    specs = _specs(8, ("input_ids", "position_ids"), np.int32)
    manifest = make_calib_text(text, tokenizer_dir / "tokenizer.json", specs, tmp_path, "two", max_size=2)
    data = open_calibration_data(manifest, specs)
    assert len(data) == 2
    sample = data.sample(1)
    assert sample["input_ids"].dtype == np.int32 and sample["input_ids"].shape == (1, 8)
    np.testing.assert_array_equal(sample["position_ids"][0], np.arange(8))
    assert sample["input_ids"][0, 0] == 101 and sample["input_ids"][0, -1] == 102  # cut at 8 tokens: [CLS] ... [SEP]


def test_roles_only_for_token_inputs():
    assert token_input_roles(_specs()) == {"input_ids": "ids", "attention_mask": "mask", "token_type_ids": "types"}
    assert token_input_roles(_specs(names=("attention_mask",))) is None  # no token ids
    assert token_input_roles([InputSpec("image", (1, 3, 8, 8), np.dtype(np.float32), "NCHW")]) is None
    assert token_input_roles(_specs(names=("input_ids", "pixel_values"))) is None


def test_bad_text_tokenizer_and_model_are_explained(tokenizer_dir, tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("one sentence\n", encoding="utf-8")
    image = [InputSpec("image", (1, 3, 8, 8), np.dtype(np.float32), "NCHW")]
    with pytest.raises(CalibrationError, match="not token inputs"):
        make_calib_text(good, tokenizer_dir, image, tmp_path, "x")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n", encoding="utf-8")
    with pytest.raises(CalibrationError, match="has no text"):
        make_calib_text(blank, tokenizer_dir, _specs(), tmp_path, "x")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(CalibrationError, match="not UTF-8"):
        make_calib_text(latin, tokenizer_dir, _specs(), tmp_path, "x")
    with pytest.raises(CalibrationError, match="does not exist"):
        make_calib_text(tmp_path / "missing.txt", tokenizer_dir, _specs(), tmp_path, "x")
    with pytest.raises(ModelLoadError, match="tokenizer"):
        make_calib_text(good, tmp_path, _specs(), tmp_path, "x")  # a folder without a tokenizer
    assert sorted(path.name for path in tmp_path.iterdir()) == ["blank.txt", "good.txt", "latin.txt"]


def test_the_preset_suggested_follows_the_ops_and_the_inputs():
    from compiler_core.calibration import input_kind
    from compiler_core.config.presets import PRESETS, suggest_preset

    attention = {"Gather", "MatMul", "Softmax", "LayerNormalization", "Add"}
    image = [InputSpec("pixels", (1, 3, 224, 224), np.dtype(np.float32), "NCHW")]
    assert input_kind(_specs()) == "tokens" and input_kind(image) == "image"
    assert suggest_preset(attention, input_kind(_specs())).preset == "transformer_encoder"
    assert suggest_preset(attention, input_kind(image)).preset == "vision_transformer"
    assert suggest_preset({"Conv", "Relu", "Add", "Softmax", "MatMul"}, "image") is None  # no LayerNormalization
    assert suggest_preset(attention, "other") is None
    cnn = {"Conv", "Relu", "GlobalAveragePool", "Gemm"}
    assert suggest_preset(cnn, "image", class_scores=True).preset == "classification"
    assert suggest_preset(cnn, "image") is None and suggest_preset(cnn, "other", class_scores=True) is None
    assert suggest_preset(attention, "image", class_scores=True).preset == "vision_transformer"  # first match
    assert {"transformer_encoder", "vision_transformer", "classification", "classification_torchvision"} <= set(PRESETS)
