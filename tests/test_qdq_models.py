"""Models quantized by onnxruntime (QDQ format) given to the compiler: read as the float model they approximate."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.errors import QBCompilerError


def _conv_bn_model(path) -> None:
    """Image -> Conv -> BatchNormalization -> Relu6 -> Conv: the layers of a torchvision export before fusion."""
    rng = np.random.default_rng(0)
    tensors = {"w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
               "s": rng.uniform(0.5, 1.5, 8).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32),
               "m": rng.standard_normal(8).astype(np.float32) * 0.1, "v": rng.uniform(0.5, 2.0, 8).astype(np.float32),
               "w2": rng.standard_normal((4, 8, 1, 1)).astype(np.float32) * 0.3,
               "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("Clip", ["bn", "lo", "hi"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "convbn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [numpy_helper.from_array(value, name) for name, value in tensors.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)


@pytest.fixture(scope="module")
def qdq_model(tmp_path_factory):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    folder = tmp_path_factory.mktemp("qdq")
    _conv_bn_model(folder / "float.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{"x": np.random.default_rng(i).standard_normal((1, 3, 16, 16)).astype(np.float32)}
                                 for i in range(4)])

        def get_next(self):
            return next(self.samples, None)

    quantize_static(str(folder / "float.onnx"), str(folder / "qdq.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True)
    return folder / "qdq.onnx"


def test_a_qdq_model_s_batchnorm_is_folded_once_its_quantized_parameters_are_constants(qdq_model, tmp_path):
    """onnxruntime quantizes the BatchNorm's scale and bias too (DequantizeLinear of int8 / int32 codes), which the
    library's folder keeps; the BatchNorm then stayed and the model was refused (an onnxruntime QDQ MobileNetV2:
    UNSUPPORTED_OPS, BatchNormalization x52)."""
    from compiler_core.api import mblt_compile
    from compiler_core.mblt.io import load_mblt

    source = onnx.load(qdq_model)
    assert {"QuantizeLinear", "DequantizeLinear", "BatchNormalization"} <= {node.op_type for node in source.graph.node}
    ops = {node.op_type for node in load_mblt(mblt_compile(str(qdq_model), tmp_path / "qdq.mblt")).graph}
    assert "BatchNormalization" not in ops and "DequantizeLinear" not in ops and "Conv" in ops


def test_a_qdq_model_compiles_and_a_uint8_input_it_cannot_take_is_refused_clearly(qdq_model, tmp_path, monkeypatch):
    """The input's own Q/DQ pair becomes a Clip on the input; with uint8 input (per-channel input parameters) that
    Clip has no kernel: a refusal naming the node and uint8Input, not an INTERNAL_ERROR (IndexError) as before."""
    from compiler_core.api import mxq_compile

    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "cache"))
    result = mxq_compile(str(qdq_model), target_device="aries-rb", save_path=tmp_path / "m.mxq",
                         use_random_calib=True)
    assert result.mxq_path.is_file()
    pipeline = {"apply": True, "pipeline": [{"op": "normalize", "mean": [0.5], "std": [0.25]}]}
    with pytest.raises(QBCompilerError) as error:
        mxq_compile(str(qdq_model), target_device="aries-rb", save_path=tmp_path / "u8.mxq", use_random_calib=True,
                    compile_config={"uint8Input": {"apply": True}, "preprocessing": pipeline})
    assert error.value.code == "UNSUPPORTED_OPS" and "uint8Input" in error.value.message
