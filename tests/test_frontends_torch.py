"""PyTorch and TorchScript frontends: real models export, canonicalize and compute what torch computes.

Real models (see ``realmodels.py``): MobileNetV2 as a live module and as a ``.pt2`` program,
all-MiniLM-L6-v2 from its transformers folder, Silero VAD's ``silero_vad.jit``. Each is exported by
our loader, canonicalized, run in onnxruntime and compared with PyTorch on the same inputs by relative
error ``max|a - b| / max|b|``. Bad inputs must fail with our errors and messages that say what to do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
import realmodels
import torch

from compiler_core.errors import ArgumentError, ModelLoadError
from compiler_core.frontends import torch as torch_frontend
from compiler_core.frontends import torchscript as torchscript_frontend
from compiler_core.frontends.torch import load_torch
from compiler_core.frontends.torchscript import load_torchscript
from compiler_core.mblt.canonicalize import SOURCE_NAME_KEY, canonicalize

MAX_RELATIVE_ERROR = 1e-4


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """``max|actual - expected| / max|expected|``."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(actual - expected)) / max(float(np.max(np.abs(expected))), 1e-12))


def canonical_session(model: ir.Model) -> ort.InferenceSession:
    """Canonicalize ``model`` (shapes from the export) and open it in onnxruntime."""
    canonical = canonicalize(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(ir.to_proto(canonical).SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def source_names(model: ir.Model) -> list[str]:
    return [node.metadata_props.get(SOURCE_NAME_KEY, "") for node in ir.traversal.RecursiveGraphIterator(model.graph)]


def available(build):
    """Call a ``realmodels`` builder, skipping with its install hint when a package is missing."""
    try:
        return build()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))


# -- real models ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mobilenet():
    return available(realmodels.mobilenet_v2_module)


@pytest.fixture(scope="module")
def photo_batch() -> np.ndarray:
    image = realmodels.photo(0)
    if image is None:
        return np.random.default_rng(0).standard_normal(realmodels.MOBILENET_SHAPE).astype(np.float32)
    return realmodels.imagenet_tensor(image)


def torch_output(module, *args) -> np.ndarray:
    with torch.no_grad():
        return module(*(torch.from_numpy(a) for a in args)).numpy()


@pytest.mark.slow
def test_mobilenet_live_module_matches_torch(mobilenet, photo_batch):
    model = load_torch(mobilenet, feed_dict={"x": torch.from_numpy(photo_batch)})

    assert [value.name for value in model.graph.inputs] == ["x"]
    assert any(name.startswith("features.3.conv") for name in source_names(model))
    other = realmodels.imagenet_tensor(realmodels.photo(1)) if realmodels.photo(1) is not None else -photo_batch
    session = canonical_session(model)
    for batch in (photo_batch, other):  # the export input, and one it never saw
        (actual,) = session.run(None, {"x": batch})
        assert relative_error(actual, torch_output(mobilenet, batch)) < MAX_RELATIVE_ERROR


@pytest.mark.slow
def test_mobilenet_exported_program_file_matches_torch(mobilenet, photo_batch, tmp_path):
    path = tmp_path / "mobilenet_v2.pt2"
    torch.export.save(torch.export.export(mobilenet, (torch.from_numpy(photo_batch),)), path)

    model = load_torch(path)

    assert any("features." in name for name in source_names(model))
    described = torch_frontend.describe_requirements(path)
    assert described["needs_feed_dict"] is False
    assert described["inputs"] == [{"name": "x", "dtype": "float32", "shape": realmodels.MOBILENET_SHAPE}]
    (actual,) = canonical_session(model).run(None, {model.graph.inputs[0].name: photo_batch})
    assert relative_error(actual, torch_output(mobilenet, photo_batch)) < MAX_RELATIVE_ERROR


@pytest.mark.slow
def test_minilm_transformers_folder_matches_last_hidden_state():
    folder = available(realmodels.minilm_dir)
    import transformers

    model = load_torch(folder, feed_dict=realmodels.tokenize(realmodels.SENTENCES[:1]))

    assert [value.name for value in model.graph.outputs] == ["last_hidden_state"]
    assert any(name.startswith("encoder.layer.0.attention") for name in source_names(model))
    reference = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    session = canonical_session(model)
    for sentence in realmodels.SENTENCES[:2]:
        feed = realmodels.tokenize([sentence])
        (actual,) = session.run(None, feed)
        with torch.no_grad():
            expected = reference(**{k: torch.from_numpy(v) for k, v in feed.items()}).last_hidden_state.numpy()
        assert relative_error(actual, expected) < MAX_RELATIVE_ERROR


def silero_jit_path():
    folder = realmodels.package_dir("silero_vad", "silero-vad==6.2.3")
    return realmodels._require_file(folder / "data" / "silero_vad.jit", "silero-vad==6.2.3")


def voiced_chunk(seed: int, samples: int = 576) -> np.ndarray:
    """A few harmonics of a voice-like pitch with a little noise, 16 kHz, [1, samples]."""
    rng = np.random.default_rng(seed)
    time = np.arange(samples) / realmodels.SILERO_SAMPLE_RATE
    pitch = rng.uniform(90, 250)
    wave = sum(np.sin(2 * np.pi * pitch * k * time + rng.uniform(0, 6.3)) / k for k in range(1, 6))
    return (0.1 * wave + 0.01 * rng.standard_normal(samples))[None].astype(np.float32)


def test_silero_vad_jit_core_matches_torch():
    path = available(silero_jit_path)
    state = np.zeros((2, 1, 128), np.float32)
    model = load_torchscript(path, submodule="_model", feed_dict={"x": voiced_chunk(0), "state": state})

    assert [value.name for value in model.graph.inputs] == ["x", "state"]
    assert any(name.startswith("_model.encoder.0") for name in source_names(model))
    reference = torch.jit.load(str(path)).eval()._model
    session = canonical_session(model)
    for seed in range(3):  # carry the LSTM state from chunk to chunk, as a streaming caller does
        chunk = voiced_chunk(seed)
        actual = session.run(None, {"x": chunk, "state": state})
        with torch.no_grad():
            expected = [t.numpy() for t in reference(torch.from_numpy(chunk), torch.from_numpy(state))]
        assert abs(float(actual[0].item()) - float(expected[0].item())) < 1e-5  # speech probability
        assert relative_error(actual[1], expected[1]) < MAX_RELATIVE_ERROR
        state = expected[1]


def test_silero_vad_stateful_top_level_explains_submodule():
    path = available(silero_jit_path)
    with pytest.raises(ModelLoadError) as caught:
        load_torchscript(path, feed_dict={"x": np.zeros((1, 512), np.float32), "sr": 16000})
    assert "submodule" in caught.value.hint and "_model" in caught.value.hint
    # the exporter's reason without its dump of internal graph values ("[Caused by the value '110 defined in ...]")
    assert "bitwise Not" in caught.value.message and "Caused by" not in caught.value.message


# -- TorchScript example inputs ------------------------------------------------------------------


class TokenClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, ids, bias):
        return self.head(self.embedding(ids) + bias)


def test_torchscript_makes_int64_inputs_for_indices(tmp_path):
    torch.manual_seed(0)
    module = TokenClassifier().eval()
    path = tmp_path / "traced.pt"
    torch.jit.save(torch.jit.trace(module, (torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 5, 8))), path)

    model = load_torchscript(path, input_shape_dict={"ids": [1, 5], "bias": [1, 5, 8]})

    assert [value.dtype for value in model.graph.inputs] == [ir.DataType.INT64, ir.DataType.FLOAT]
    ids, bias = np.array([[1, 4, 9, 15, 0]]), np.full((1, 5, 8), 0.5, np.float32)
    (actual,) = canonical_session(model).run(None, {"ids": ids, "bias": bias})
    with torch.no_grad():
        expected = module(torch.from_numpy(ids), torch.from_numpy(bias)).numpy()
    assert relative_error(actual, expected) < MAX_RELATIVE_ERROR
    assert {"head", "embedding"} <= set(source_names(model))
    assert [value.name for value in model.graph.outputs] == ["output"]  # not the script's value number ("21")


class TwoHeads(torch.nn.Module):
    def forward(self, x):
        return x.relu(), x.sigmoid()


def test_torchscript_outputs_get_names_a_user_can_read(tmp_path):
    path = tmp_path / "two.pt"
    torch.jit.save(torch.jit.trace(TwoHeads(), torch.zeros(1, 4)), path)
    model = load_torchscript(path, input_shape_dict={"x": [1, 4]})
    assert [value.name for value in model.graph.outputs] == ["output_0", "output_1"]
    (relu, sigmoid) = canonical_session(model).run(None, {"x": np.array([[-1.0, 0.0, 1.0, 2.0]], np.float32)})
    assert relu.tolist() == [[0.0, 0.0, 1.0, 2.0]] and sigmoid[0, 1] == 0.5


def test_torchscript_unknown_and_missing_inputs_list_the_signature(tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(4, 2)), path)
    with pytest.raises(ArgumentError, match="Unknown input name"):
        load_torchscript(path, input_shape_dict={"image": [1, 4]})
    with pytest.raises(ArgumentError, match="needs a value for input") as caught:
        load_torchscript(path)
    assert "forward(input: Tensor)" in caught.value.hint and "--input-shape input=DIMS" in caught.value.hint
    assert "sr=" not in caught.value.hint  # the example names this module's inputs (it named Silero's for any)
    assert caught.value.fields["inputs_needed"] == [{"name": "input", "type": "Tensor", "optional": False}]


# -- bad inputs ----------------------------------------------------------------------------------


class Scaler(torch.nn.Module):
    def forward(self, image, scale: float = 2.0):
        return image * scale


def test_feed_dict_with_unknown_and_missing_names_lists_the_signature():
    with pytest.raises(ArgumentError) as caught:
        load_torch(Scaler(), feed_dict={"img": np.zeros((1, 3), np.float32)})
    message = str(caught.value)
    assert "unknown argument(s) img" in message and "missing required argument(s) image" in message
    assert "forward(image, scale=2.0)" in message


def test_feed_dict_with_non_tensor_value_is_rejected():
    with pytest.raises(ArgumentError, match=r"not a tensor, array or scalar: image \(list\)"):
        load_torch(Scaler(), feed_dict={"image": [1.0, 2.0]})


def test_module_without_feed_dict_asks_for_one():
    with pytest.raises(ArgumentError, match="needs example inputs") as excinfo:
        load_torch(Scaler())
    assert "--input-shape" in excinfo.value.hint and "input_shape_dict" in excinfo.value.hint


def test_transformers_folder_keeps_its_head_and_takes_its_image_size(tmp_path):
    """A saved ViTForImageClassification loads as itself (not the headless ViTModel); pixel_values comes
    from config.image_size / num_channels. Its class-token Concat compiles (tests/test_fast_executor.py)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=64, num_labels=5)
    reference = transformers.ViTForImageClassification(config).eval()
    reference.save_pretrained(tmp_path / "vit")
    model = canonicalize(load_torch(tmp_path / "vit"))
    assert [list(value.shape) for value in model.graph.inputs] == [[1, 3, 32, 32]]
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    (logits,) = canonical_session(model).run(None, {model.graph.inputs[0].name: image.numpy()})
    assert logits.shape == (1, 5)
    assert relative_error(logits, reference(pixel_values=image).logits.detach().numpy()) < 1e-4


def test_swin_with_sdpa_attention_exports_through_eager_attention():
    """Swin's SDPA path hands the exporter a transposed tensor it cannot view (both exporters fail); the
    frontend traces the eager attention instead and gives the caller's module back unchanged."""
    import transformers

    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2],
                                     window_size=4, num_labels=3)
    module = transformers.SwinForImageClassification(config).eval()
    assert module.config._attn_implementation == "sdpa"
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    model = canonicalize(torch_frontend.export_module(module, {"pixel_values": image}))
    assert module.config._attn_implementation == "sdpa"
    (logits,) = canonical_session(model).run(None, {model.graph.inputs[0].name: image.numpy()})
    assert relative_error(logits, module(pixel_values=image).logits.detach().numpy()) < 1e-4


class RaisesInForward(torch.nn.Module):
    def forward(self, x):
        raise ValueError("only 16 kHz audio is supported")


def test_forward_that_raises_is_a_model_load_error_with_its_reason():
    with pytest.raises(ModelLoadError, match="only 16 kHz audio is supported"):
        load_torch(RaisesInForward(), feed_dict={"x": torch.zeros(2)})


class BranchesOnValues(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent Python control flow: neither exporter can keep both branches
            return x * 2
        return x * 3


@pytest.mark.slow
def test_data_dependent_control_flow_fails_with_both_exporters_reasons(caplog):
    with pytest.raises(ModelLoadError) as caught:
        load_torch(BranchesOnValues(), feed_dict={"x": torch.ones(4)})
    message = str(caught.value)
    assert "data-dependent" in message  # the dynamo exporter's reason
    assert "branched on tensor values" in message and "test_frontends_torch.py" in message  # the legacy one
    assert "retrying with the legacy TorchScript exporter" in caplog.text


class Eigenvalues(torch.nn.Module):
    def forward(self, x):
        return torch.linalg.eigh(x @ x.T)[0]


@pytest.mark.slow
def test_operator_no_exporter_supports_names_it():
    with pytest.raises(ModelLoadError, match="linalg_eigh"):
        load_torch(Eigenvalues(), feed_dict={"x": torch.eye(3)})


@pytest.mark.slow
def test_dynamic_axes_reach_the_export_and_canonicalize_pins_them():
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    model = load_torch(module, feed_dict={"input": torch.randn(1, 3, 16, 16)}, dynamic_axes={"input": {0: "batch"}})

    assert not isinstance(model.graph.inputs[0].shape[0], int)
    batch = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (actual,) = canonical_session(model).run(None, {"input": batch})
    assert relative_error(actual, torch_output(module, batch)) < MAX_RELATIVE_ERROR


def test_pickled_module_needs_allow_pickle(tmp_path):
    path = tmp_path / "whole_module.pt"
    torch.save(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()), path)
    with pytest.raises(ArgumentError, match="executes code") as caught:
        load_torch(path, feed_dict={"input": torch.zeros(1, 3, 8, 8)})
    assert "allow_pickle=True" in caught.value.hint
    module = torch_frontend.resolve_source(path, allow_pickle=True)
    assert isinstance(module, torch.nn.Sequential)


def test_state_dict_file_has_no_architecture(tmp_path):
    path = tmp_path / "weights.pth"
    torch.save(torch.nn.Linear(4, 2).state_dict(), path)
    with pytest.raises(ModelLoadError, match="state dict .*no architecture"):
        load_torch(path, allow_pickle=True)


def test_hub_id_is_not_downloaded():
    with pytest.raises(ModelLoadError, match="hub downloads are not available"):
        load_torch("sentence-transformers/all-MiniLM-L6-v2")


# -- requirements for the GUI --------------------------------------------------------------------


def test_describe_requirements(tmp_path):
    torch.save(torch.nn.ReLU(), tmp_path / "module.pt")
    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "weights.pt")

    assert torch_frontend.describe_requirements(tmp_path / "module.pt")["needs_allow_pickle"] is True
    assert torch_frontend.describe_requirements(tmp_path / "weights.pt")["kind"] == "state_dict"
    assert torch_frontend.describe_requirements("org/model")["kind"] == "hub_id"


def test_describe_requirements_of_silero_and_minilm():
    silero = torchscript_frontend.describe_requirements(available(silero_jit_path))
    assert [(entry["name"], entry["type"]) for entry in silero["inputs"]] == [("x", "Tensor"), ("sr", "int")]
    assert silero["needs_feed_dict"] and silero["submodules"] == ["_model", "_model_8k"]
    minilm = torch_frontend.describe_requirements(available(realmodels.minilm_dir))
    assert minilm["kind"] == "transformers"
    assert [entry["name"] for entry in minilm["inputs"]][:2] == ["input_ids", "attention_mask"]


def test_a_bidirectional_lstm_leaves_no_stray_initializer(tmp_path):
    """A CRNN-style 2-layer bidirectional nn.LSTM without an initial state: the unrolled MBLT keeps no initializer
    that no node reads (its folded zero state was left, and named after a node no longer in the graph), and it
    computes what torch does."""
    from compiler_core.api import mblt_compile

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 12, num_layers=2, bidirectional=True).eval()

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = lstm

        def forward(self, x):
            return self.lstm(x)[0]

    mblt = mblt_compile(Head().eval(), tmp_path / "lstm.mblt", backend="torch", input_shape_dict={"x": [4, 1, 8]})
    graph = ir.load(mblt).graph
    node_names = {node.name for node in graph}
    assert all(value.uses() for value in graph.initializers.values())
    assert all(name.rsplit(".", 1)[0] in node_names for name in graph.initializers)
    x = torch.randn(4, 1, 8)
    with torch.no_grad():
        expected = Head()(x).numpy()
    (actual,) = ort.InferenceSession(str(mblt)).run(None, {graph.inputs[0].name: x.numpy()})
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def test_the_exporter_does_not_tell_users_about_torchvision():
    """Every torch export printed "torchvision is not installed. Skipping torchvision::roi_align" (and roi_pool,
    deform_conv2d) to stderr: noise a user cannot act on, from the exporter's operator registry (a fresh process,
    as a user runs it: pytest's own log capture hides the lines)."""
    import subprocess
    import sys

    script = ("import torch\n"
              "from compiler_core.frontends.torch import load_torch\n"
              "model = load_torch(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval(),\n"
              "                   input_shape_dict={'input': [1, 4]})\n"
              "print(sorted({node.op_type for node in model.graph}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Gemm" in done.stdout or "MatMul" in done.stdout
    assert "torchvision" not in done.stderr, done.stderr[-2000:]


def test_a_detector_s_modeloutput_exports_its_boxes_beside_its_logits():
    """DETR and YOLOS return logits and pred_boxes; only the logits were exported (the boxes are half the answer)."""
    from transformers.models.detr.modeling_detr import DetrObjectDetectionOutput

    class Detector(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.classes, self.boxes = torch.nn.Linear(8, 5), torch.nn.Linear(8, 4)

        def forward(self, queries):
            return DetrObjectDetectionOutput(logits=self.classes(queries), pred_boxes=self.boxes(queries).sigmoid(),
                                             last_hidden_state=queries)

    model = load_torch(Detector().eval(), input_shape_dict={"queries": [1, 20, 8]})
    assert [value.name for value in model.graph.outputs] == ["logits", "pred_boxes"]
