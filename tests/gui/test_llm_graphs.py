"""A decoder LLM in the workbench: a transformers ``*ForCausalLM`` folder (or GGUF file) opens as its prefill
graph, with its decode graph on a tab; both coloured by support, and restored from the project without a parse."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_user_path import answers, make_window, wait_model  # noqa: E402, F401  (fixtures and helper)

import qbstudio.tasks  # noqa: E402
from qbstudio.tasks import llm_decode_path  # noqa: E402


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    """A random 2-layer Llama (4 heads, 1 KV head) saved as a transformers folder."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)
    folder = tmp_path_factory.mktemp("llm") / "tiny-llama"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
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

    # Compile is off and says what compiles it; the device change recolours the graph shown
    assert not window.act_compile.isEnabled()
    assert "--output tiny-llama.llm.json" in window.readiness().reason
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


def test_a_model_of_one_graph_has_no_graph_tabs(qtbot, make_window, answers, tmp_path):  # noqa: F811
    from test_user_path import conv_classifier

    window = make_window()
    wait_model(qtbot, window, lambda: window.import_model(conv_classifier(tmp_path / "m.onnx")))
    assert window.loaded.graph_names == [] and not window.graph.graph_tabs.isVisible()
    assert window.graph.graph_name == ""
