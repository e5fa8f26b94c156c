"""The "Try it" box: a compiled LLM generates beside its FP32 reference, divergent tokens highlighted."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("PySide6")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    """A 2-layer random Llama with a word-level tokenizer, compiled (prefill 8, cache 24)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from compiler_core.llm import compile_llm

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(127)} | {"[UNK]": 127}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]")
    path = tmp_path_factory.mktemp("tiny") / "tiny.llm.json"
    compile_llm(model, path, prefill_len=8, max_len=24, num_samples=8, tokenizer=tokenizer,
                calib_token_ids=np.random.default_rng(0).integers(0, 127, 64))
    return path


def test_generate_shows_both_texts(qtbot, tiny_llm):
    from qbstudio.widgets.llm_try import LlmTryPanel

    panel = LlmTryPanel()
    qtbot.addWidget(panel)
    panel.manifest_edit.setText(str(tiny_llm))
    panel.prompt_edit.setText("w1 w2 w3")
    panel.tokens_spin.setValue(6)
    panel.generate()
    qtbot.waitUntil(lambda: panel.generate_button.isEnabled(), timeout=120_000)
    assert "Prompt of 3 tokens" in panel.status.text(), panel.status.text()
    assert len(panel.mxq_view.toPlainText().split()) == 6 and len(panel.fp32_view.toPlainText().split()) == 6


def test_without_a_model_the_user_is_told(qtbot):
    from qbstudio.widgets.llm_try import LlmTryPanel

    panel = LlmTryPanel()
    qtbot.addWidget(panel)
    panel.generate()
    assert "Choose a compiled LLM" in panel.status.text()
    panel.manifest_edit.setText("/nonexistent/x.llm.json")
    panel.generate()
    qtbot.waitUntil(lambda: panel.generate_button.isEnabled(), timeout=30_000)
    assert "cannot be read as an LLM manifest" in panel.status.text()


def test_divergent_tokens_are_highlighted():
    from qbstudio.widgets.llm_try import DIVERGED_MXQ, pieces_html

    text = pieces_html([" a", " b<", " c"], 1, DIVERGED_MXQ)
    assert text.startswith(" a<span") and "b&lt;" in text and text.count(DIVERGED_MXQ) == 2


def test_the_try_window_has_a_close_button(qtbot):
    """Found by s16-gui3: the window closed with Escape only; every other dialog has a button."""
    from PySide6.QtWidgets import QDialogButtonBox

    from qbstudio.widgets.llm_try import show_dialog

    dialog = show_dialog()
    qtbot.addWidget(dialog)
    close = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Close)
    close.click()
    assert not dialog.isVisible()
