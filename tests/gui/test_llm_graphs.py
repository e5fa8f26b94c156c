"""A decoder LLM in the workbench: a transformers ``*ForCausalLM`` folder (or GGUF file) opens as its prefill
graph, with its decode graph on a tab; both coloured by support, and restored from the project without a parse.
Compile asks for calibration text and writes the prefill and decode MXQs, then Try a Compiled LLM opens on them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_llm import word_tokenizer  # noqa: E402
from test_user_path import answers, make_window, wait_model  # noqa: E402, F401  (fixtures and helper)

import qbstudio.tasks  # noqa: E402
from qbstudio import dialogs  # noqa: E402
from qbstudio.tasks import LlmCompileRequest, llm_decode_path  # noqa: E402


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    """A random 2-layer Llama (4 heads, 1 KV head) saved as a transformers folder."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)
    folder = tmp_path_factory.mktemp("llm") / "tiny-llama"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


def test_a_decoder_llm_shows_its_prefill_and_decode_graphs(qtbot, make_window, answers, llama_folder, tmp_path,  # noqa: F811
                                                           monkeypatch):
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(llama_folder))
    assert answers.errors == []
    assert window.project.model.backend == "llm"
    loaded = window.loaded
    assert loaded.graph_names == ["Prefill", "Decode"] and window.graph.graph_name == "Prefill"
    assert window.graph.graph_tabs.isVisible() and window.graph.graph_tabs.count() == 2
    assert [v.name for v in loaded.model.graph.inputs] == ["input_ids", "position_ids"]
    prefill_nodes = {node.name for node in loaded.model.graph}
    assert set(window.report.entries) == prefill_nodes and window.report.compilable
    assert "prefill" in window.model_label.text() and "decode" in window.model_label.text()

    # the decode tab: its graph, its support report, its node details
    window.graph.graph_tabs.setCurrentIndex(1)
    decode_path, decode_model = loaded.graph("Decode")
    qtbot.waitUntil(lambda: window.graph.is_ready and window.graph.model_path == decode_path, timeout=120_000)
    assert decode_path == llm_decode_path(window.project.mblt_path)
    assert set(window.report.entries) == {node.name for node in decode_model.graph} != prefill_nodes
    assert window.support.isEnabled()
    cache_reader = next(node.name for node in decode_model.graph if "past_key_0" in [v.name for v in node.inputs if v])
    window.show_node(cache_reader)
    assert window.details.node == cache_reader

    # the image calibration form gives way to what an LLM calibrates on; the device change recolours the graph shown
    assert window.calibration.note_label.isVisibleTo(window.calibration) and "plain text" in window.calibration.note_label.text()
    assert not window.calibration.path_edit.isVisibleTo(window.calibration)
    window.set_device("regulus-ra")
    assert set(window.report.entries) == {node.name for node in decode_model.graph}

    # saved and reopened: both graphs come back from the project's MBLTs, with no parse
    project = tmp_path / "llm.qbproj"
    assert window.save_project_as(project)
    monkeypatch.setattr(qbstudio.tasks, "parse_llm_model", lambda *a, **k: pytest.fail("parsed again"))
    again = make_window()
    wait_model(qtbot, again, lambda: again.open_project(project))
    assert answers.errors == []
    assert again.loaded.graph_names == ["Prefill", "Decode"] and again.graph.graph_tabs.isVisible()
    assert len(again.loaded.graph("Decode")[1].graph) == len(decode_model.graph)

    # another model replaces it: one graph, no tabs, and the decode MBLT is not left behind
    from test_user_path import conv_classifier

    wait_model(qtbot, again, lambda: again.import_model(conv_classifier(tmp_path / "m.onnx")))
    assert again.loaded.graph_names == [] and not again.graph.graph_tabs.isVisible()
    assert not llm_decode_path(again.project.mblt_path).exists()


def test_a_model_of_one_graph_has_no_graph_tabs(qtbot, make_window, answers, tmp_path):  # noqa: F811
    from test_user_path import conv_classifier

    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "m.onnx")))
    assert window.loaded.graph_names == [] and not window.graph.graph_tabs.isVisible()
    assert window.graph.graph_name == ""
    assert not window.calibration.note_label.isVisibleTo(window.calibration)
    assert not window.options.llm_note.isVisibleTo(window.options)
    assert all(group.isVisibleTo(window.options) for group in window.options._model_groups)
    assert window.calibration.path_edit.isVisibleTo(window.calibration)


def test_a_decoder_llm_compiles_from_the_workbench_and_opens_in_try_it(qtbot, make_window, answers,  # noqa: F811
                                                                       llama_folder, tmp_path, monkeypatch):
    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(llama_folder))
    text = tmp_path / "calibration.txt"
    text.write_text(" ".join(f"w{i}" for i in np.random.default_rng(3).integers(0, 511, 200)))
    asked, opened = [], []

    def ask(_parent, name, device, request, max_cache):
        asked.append((name, device, request, max_cache))
        return replace(request, text_path=str(text), prefill_len=8, max_len=16, num_samples=8)

    monkeypatch.setattr(dialogs, "ask_llm_compile", ask)
    monkeypatch.setattr(dialogs, "open_llm_try", lambda _parent, manifest=None: opened.append(manifest))
    window.set_device("regulus-rb")
    assert window.act_compile.isEnabled()
    assert window.options.llm_note.isVisibleTo(window.options)  # the image model's settings do not apply
    assert not any(group.isVisibleTo(window.options) for group in window.options._model_groups)
    assert "No LLM compiled yet" in window.run_panel.summary.header.text()
    with qtbot.waitSignal(window.compile_finished, timeout=600_000) as finished:
        assert window.start_compile()
    assert finished.args == ["done"], answers.errors
    assert asked == [("tiny-llama", "regulus-rb", LlmCompileRequest(text_path=""), 1024)]  # REGULUS: 1024 positions
    [manifest] = window.llm_manifests
    assert opened == [str(manifest)]
    written = json.loads(manifest.read_text())
    assert written["device"] == "regulus-rb" and written["prefill_len"] == 8 and written["max_len"] == 16
    assert (manifest.parent / written["prefill"]).is_file() and (manifest.parent / written["decode"]).is_file()
    header = window.run_panel.summary.header.text()
    assert "Compiled LLM" in header and str(manifest) in header and "regulus-rb" in header
    assert "decode: mean output cosine" in header
    window.show_llm_try()  # Compile > Try a Compiled LLM opens on the newest
    assert opened[-1] == str(manifest)

    # the same answers are offered again; a calibration text gone missing fails in a dialog and leaves nothing
    text.unlink()
    with qtbot.waitSignal(window.compile_finished, timeout=120_000) as failed:
        assert window.start_compile()
    assert failed.args == ["failed"] and asked[-1][2].text_path == str(text)
    assert answers.errors and answers.errors[-1][0] == "Compile failed" and "calibration text" in answers.errors[-1][1]
    assert window.llm_manifests == [manifest] and str(manifest) in window.run_panel.summary.header.text()
    assert sorted(p.name for p in (window.project.work_dir / "llm").iterdir()) == ["compile-001"]


def test_the_llm_compile_dialog_says_what_is_wrong(qtbot, tmp_path):
    dialog = dialogs.LlmCompileDialog("SmolLM2.gguf", "regulus-ra", LlmCompileRequest(text_path=""), 1024)
    qtbot.addWidget(dialog)
    ok = dialog.buttons.button(dialog.buttons.StandardButton.Ok)
    assert not ok.isEnabled() and dialog.problem.text() == ""  # nothing typed: nothing to complain about
    assert dialog.cache_spin.maximum() == 1024 and dialog.preset_combo.currentData() == "llm"
    dialog.text_edit.setText(str(tmp_path / "missing.txt"))
    assert not ok.isEnabled() and "No file" in dialog.problem.text()
    (tmp_path / "empty.txt").write_text("")
    dialog.text_edit.setText(str(tmp_path / "empty.txt"))
    assert "empty" in dialog.problem.text()
    (tmp_path / "book.txt").write_text("Once upon a time.")
    dialog.text_edit.setText(str(tmp_path / "book.txt"))
    assert ok.isEnabled() and dialog.problem.text() == ""
    dialog.prefill_spin.setValue(2048)
    assert not ok.isEnabled() and "KV cache" in dialog.problem.text()
    dialog.prefill_spin.setValue(64)
    dialog.preset_combo.setCurrentIndex(dialog.preset_combo.findData("llm_accurate"))
    assert dialog.answers() == LlmCompileRequest(str(tmp_path / "book.txt"), "llm_accurate", 64, 1024, 32)


def test_the_main_window_module_imports_neither_numpy_nor_onnx_ir():
    """The window shows before the heavy modules load (PRELOAD_MODULES); the LLM frontend is imported on use."""
    import subprocess
    import sys

    probe = "import sys, qbstudio.main_window; print(sorted({'numpy', 'onnx_ir', 'torch'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"
