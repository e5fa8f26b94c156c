"""Scripts written for the vendor's qbcompiler / qbruntime (shared/reference/qb-compiler-api.md) against our API.

Each test is a call a vendor user makes from the reference's names; it works as there, or fails naming the argument.
Models: the bundled Fashion-MNIST sample (a real trained CNN with its own test images) and a full-integer TFLite
convolution built in the test.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from compiler_core.errors import ArgumentError, MxqFormatError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"
SAMPLE = SAMPLE_DIR / "model.onnx"
SAMPLE_CONFIG = SAMPLE_DIR / "compile_config.yaml"


@pytest.fixture(scope="module", autouse=True)
def statistics_cache(tmp_path_factory):
    """A statistics cache of this module's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path_factory.mktemp("statistics-cache")))
        yield


@pytest.fixture(scope="module")
def sample_mblt(tmp_path_factory) -> Path:
    from compiler_core import mblt_compile

    return mblt_compile(SAMPLE, tmp_path_factory.mktemp("sample") / "model.mblt")


@pytest.fixture(scope="module")
def sample_mxq(sample_mblt, tmp_path_factory) -> Path:
    from compiler_core.api import mxq_compile_from_mblt

    path = tmp_path_factory.mktemp("sample-mxq") / "fashion.mxq"
    mxq_compile_from_mblt(
        sample_mblt,
        target_device="aries-rb",
        calib_data_path=SAMPLE_DIR / "calib",
        save_path=path,
        compile_config=SAMPLE_CONFIG,
    )
    return path


def test_the_reference_top_level_names_import_from_the_package() -> None:
    """``from qbcompiler import mxq_compile_from_mblt, list_presets, dump_default_config ...``: four of the reference's
    names were only in submodules (AttributeError from the package)."""
    import compiler_core
    from compiler_core import api, config

    assert compiler_core.mxq_compile_from_source is api.mxq_compile_from_source
    assert compiler_core.mxq_compile_from_mblt is api.mxq_compile_from_mblt
    assert compiler_core.list_presets is config.list_presets
    assert compiler_core.dump_default_config is config.dump_default_config


def test_a_misspelt_parse_argument_is_refused_by_name(tmp_path: Path) -> None:
    """mblt_compile took any keyword and dropped it: ``dynamic_axis=`` (for ``dynamic_axes``) parsed as if not given."""
    from compiler_core import mblt_compile

    with pytest.raises(ArgumentError, match="Unknown parse argument.*dynamic_axis") as caught:
        mblt_compile(SAMPLE, tmp_path / "m.mblt", dynamic_axis={"image": {0: "batch"}})
    assert "dynamic_axes" in caught.value.hint
    assert not (tmp_path / "m.mblt").exists()


def test_the_vendor_parse_arguments_are_accepted_and_checked(tmp_path: Path, caplog) -> None:
    """The reference's ``mblt_compile(..., device, cpu_offload, ...)`` and ``in_dformats``: accepted, their values
    checked (``in_dformats`` reached ``mxq_compile`` as an unknown config argument)."""
    from compiler_core import mblt_compile

    with caplog.at_level(logging.WARNING, logger="compiler_core.api"):
        path = mblt_compile(
            SAMPLE, tmp_path / "m.mblt", device="cpu", cpu_offload=True, in_dformats={"image": "NCHW"}
        )
    assert path.is_file()
    assert "cpu_offload is decided when compiling" in caplog.text
    with pytest.raises(ArgumentError, match="device must be one of cpu, gpu"):
        mblt_compile(SAMPLE, tmp_path / "n.mblt", device="aries-rb")
    with pytest.raises(
        ArgumentError, match="in_dformats names input.*'input'|in_dformats names input.*input"
    ):
        mblt_compile(SAMPLE, tmp_path / "n.mblt", in_dformats={"input": "NCHW"})
    with pytest.raises(ArgumentError, match="not a layout"):
        mblt_compile(SAMPLE, tmp_path / "n.mblt", in_dformats={"image": "CHW"})


def test_in_dformats_reaches_the_parse_of_mxq_compile(tmp_path: Path) -> None:
    from compiler_core import mxq_compile

    result = mxq_compile(
        SAMPLE,
        "aries-rb",
        SAMPLE_DIR / "calib",
        tmp_path / "m.mxq",
        compile_config=SAMPLE_CONFIG,
        in_dformats={"image": "NCHW"},
        analysis_holdout=0,
    )
    assert Path(result.mxq_path).is_file()


def test_cli_compile_takes_the_reference_device_flag(sample_mblt, tmp_path: Path) -> None:
    """``qbcompiler compile ... --device cpu`` (the reference's compile flags) was "unrecognized arguments"."""
    import json

    from test_compile_runtime import _run_cli

    code = _run_cli(
        "compile",
        "--model",
        str(sample_mblt),
        "--target-device",
        "aries-rb",
        "--device",
        "cpu",
        "--calib-data-path",
        str(SAMPLE_DIR / "calib"),
        "--compile-config",
        str(SAMPLE_CONFIG),
        "--output",
        str(tmp_path / "m.mxq"),
        "--config-save-path",
        str(tmp_path / "c.json"),
        "-q",
    )
    assert code == 0
    assert json.loads((tmp_path / "c.json").read_text())["device"] == "cpu"


def test_accelerator_by_another_device_number_says_what_the_number_means() -> None:
    """``qbruntime.Accelerator(1)`` said "Unknown target device '1'"."""
    from compiler_core.runtime import Accelerator

    assert Accelerator(0).device == "aries-rb"
    with pytest.raises(ArgumentError, match=r"Accelerator\(1\).*number 0 is aries-rb"):
        Accelerator(1)


def test_get_model_summary_of_an_mblt_says_it_is_not_compiled_yet(sample_mblt) -> None:
    """An MBLT given to get_model_summary / Model was "not an MXQ file or its first bytes are damaged ... compile it
    again", as if corrupt."""
    from compiler_core.runtime import get_model_summary

    with pytest.raises(MxqFormatError, match="parsed model .* not a compiled MXQ") as caught:
        get_model_summary(sample_mblt)
    assert "read_provenance" in caught.value.hint


def test_the_runtime_flow_of_the_reference(sample_mxq) -> None:
    """Section 5 of the reference as written: Accelerator(0), ModelConfig set_*_core_mode, launch, infer a list of NHWC
    arrays, a batch, dispose and launch again."""
    from compiler_core.runtime import Accelerator, Model, ModelConfig, get_model_summary

    summary = get_model_summary(sample_mxq)
    assert summary["device"] == "aries-rb" and summary["core_modes"]
    from PIL import Image

    pixels = np.stack(
        [
            np.asarray(Image.open(path).convert("L"))
            for path in sorted((SAMPLE_DIR / "test").glob("*.png"))[:4]
        ]
    )
    images = ((pixels / 255.0 - 0.286041) / 0.353024).astype(np.float32)[
        ..., None
    ]  # NHWC, the sample's normalization
    config = ModelConfig()
    config.set_single_core_mode()
    model = Model(sample_mxq, config)
    model.launch(Accelerator(0))
    outputs = model.infer([images[:1]])
    assert isinstance(outputs, list) and outputs[0].shape == (1, 10)
    batch = model.infer([images])[0]
    assert np.array_equal(batch[:1], outputs[0])
    model.dispose()
    with pytest.raises(ArgumentError, match="not launched"):
        model.infer([images[:1]])
    model.launch(Accelerator(0))
    assert np.array_equal(model.infer([images[:1]])[0], outputs[0])


def test_model_infer_reads_a_full_integer_tflite_models_int8_codes_as_qbcompiler_run_does(
    tmp_path: Path, caplog
) -> None:
    """``Model.infer`` took a full-integer TFLite model's int8 input arrays as the NPU's own codes, while ``qbcompiler
    run`` and calibration read them as the TFLite model's codes. Compiled with int8 activations the two coincide (the
    NPU input keeps the TFLite scale and zero point); compiled with int16 activations (``a16w8``) ``Model.infer``
    refused the arrays ``run`` reads ("takes float32 values or int16 codes"). The reference's runtime takes int8 arrays
    as the model's int8 input, the codes its users hold: both read them so now, as the TFLite interpreter does."""
    from test_frontends_tflite import full_integer_conv

    from compiler_core import mblt_compile, mxq_compile
    from compiler_core.runtime import Accelerator, Model
    from compiler_core.runtime.inputs import load_run_inputs

    path, calib, held_out, expected = full_integer_conv(tmp_path)
    mxq = tmp_path / "m.mxq"
    mxq_compile(
        mblt_compile(path, tmp_path / "m.mblt"),
        "aries-rb",
        calib,
        mxq,
        analysis_holdout=0,
        config_preset="a16w8",
    )
    model = Model(mxq)  # NHWC, as the TFLite model itself
    model.launch(Accelerator("aries-rb"))
    assert model.program.params("x_q").bits == 16
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="compiler_core.runtime.model"):
        from_codes = model.infer([np.load(held_out)])[0]
    assert "read as the source model's int8 codes" in caplog.text
    ((_, feeds),) = load_run_inputs(
        model.artifact, [str(held_out)]
    )  # as `qbcompiler run --input held_out.npy`
    assert np.array_equal(from_codes, model.infer(feeds)[0])
    actual = np.asarray(from_codes, np.float64).ravel()
    cosine = float(actual @ expected.ravel() / np.linalg.norm(actual) / np.linalg.norm(expected))
    assert cosine > 0.99


def test_a_feed_dict_that_is_not_a_dict_is_an_argument_error(tmp_path: Path) -> None:
    """``feed_dict=(x,)`` (positional example inputs) was an AttributeError traceback ('tuple' has no 'items')."""
    import torch

    from compiler_core import mblt_compile

    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    with pytest.raises(
        ArgumentError, match="feed_dict must be a dict keyed by forward's argument names, got a tuple"
    ):
        mblt_compile(module, tmp_path / "m.mblt", backend="torch", feed_dict=(torch.zeros(1, 3, 8, 8),))


def test_the_cores_a_model_config_chooses_are_checked_and_counted(sample_mxq) -> None:
    """``set_single_core_mode(cores=[0, 1])`` estimated the throughput of all eight cores, and core 8 (there are 8,
    numbered 0-7) was accepted."""
    from compiler_core.runtime import Accelerator, Model, ModelConfig

    def launched(config: ModelConfig) -> Model:
        model = Model(sample_mxq, config)
        model.launch(Accelerator("aries-rb"))
        return model

    everything = launched(ModelConfig()).estimate()
    config = ModelConfig()
    config.set_single_core_mode(cores=[0, 1])
    two = launched(config).estimate()
    assert (everything["instances"], two["instances"]) == (8, 2)
    assert two["throughput_fps"] == pytest.approx(everything["throughput_fps"] / 4, abs=0.1)
    assert two["latency_ms"] == everything["latency_ms"]
    config.set_single_core_mode(cores=[0, 8])
    with pytest.raises(ArgumentError, match=r"has 8 core\(s\), numbered 0-7; \[8\] do not exist"):
        launched(config)


def test_float_pixels_given_to_a_uint8_input_model_are_warned_about(tmp_path: Path, caplog) -> None:
    """An MXQ with uint8 input (normalization fused) given the image as float32 0..255 read them as normalized values
    (every one saturated) and answered without a word; the reference's runtime takes uint8 pixels for such a model."""
    from PIL import Image

    from compiler_core import mxq_compile
    from compiler_core.runtime import Accelerator, Model

    mxq = tmp_path / "u8.mxq"
    normalize = {"op": "normalize", "mean": [0.286041], "std": [0.353024], "fuseIntoFirstLayer": True}
    mxq_compile(
        SAMPLE,
        "aries-rb",
        SAMPLE_DIR / "calib",
        mxq,
        compile_config=SAMPLE_CONFIG,
        uint8_input_config={"apply": True},
        preprocessing_config={"apply": True, "pipeline": [normalize]},
        analysis_holdout=0,
    )
    pixels = np.asarray(Image.open(sorted((SAMPLE_DIR / "test").glob("*.png"))[0]).convert("L"))[
        None, ..., None
    ]
    model = Model(mxq)
    model.launch(Accelerator("aries-rb"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="compiler_core.runtime.checks"):
        model.infer([pixels])
        assert not caplog.text
        model.infer([pixels.astype(np.float32)])
    assert "far outside" in caplog.text and "pass the image as a uint8 array" in caplog.text


def test_config_save_path_writes_yaml_for_a_yaml_name(sample_mblt, tmp_path: Path) -> None:
    """``config_save_path="resolved.yaml"`` got JSON text; it is YAML now (and reproduces the config)."""
    import yaml

    from compiler_core import CompileConfig
    from compiler_core.api import mxq_compile_from_mblt

    saved = tmp_path / "resolved.yaml"
    mxq_compile_from_mblt(
        sample_mblt,
        target_device="aries-rb",
        calib_data_path=SAMPLE_DIR / "calib",
        save_path=tmp_path / "m.mxq",
        compile_config=SAMPLE_CONFIG,
        config_save_path=saved,
        analysis_holdout=0,
    )
    text = saved.read_text()
    assert not text.lstrip().startswith("{") and yaml.safe_load(text)["targetDevice"] == "aries-rb"
    assert CompileConfig.from_file(saved).preprocessing.pipeline[0].op == "normalize"


def test_get_body_subgraph_and_extract_body_leave_out_what_the_device_cannot_run(
    tmp_path: Path, capsys
) -> None:
    """The reference's ``get_body_subgraph(mblt_path, output_path)`` and ``qbcompiler extract-body`` did not exist.
    The sample CNN with a Softmax after its logits, for regulus-ra (no MFU: Softmax unsupported): the body ends at the
    logits, which equal the whole model's in onnxruntime; aries-rb runs the model whole."""
    import onnx
    import onnxruntime as ort
    from onnx import helper
    from test_compile_runtime import _run_cli

    from compiler_core import get_body_subgraph, mblt_compile, read_provenance

    source = onnx.load(SAMPLE)
    logits = source.graph.output[0].name
    source.graph.node.append(helper.make_node("Softmax", [logits], ["probs"], name="softmax", axis=-1))
    source.graph.output.append(helper.make_tensor_value_info("probs", onnx.TensorProto.FLOAT, [1, 10]))
    onnx.save(source, tmp_path / "with_softmax.onnx")
    mblt = mblt_compile(tmp_path / "with_softmax.onnx", tmp_path / "m.mblt")
    body = get_body_subgraph(mblt, tmp_path / "body.mblt", "regulus-ra")
    body_model = onnx.load(body)
    assert [value.name for value in body_model.graph.output] == [logits]
    assert "Softmax" not in {node.op_type for node in body_model.graph.node}
    assert read_provenance(body)["body_of"]["cpu_tail"]
    image = np.random.default_rng(0).normal(size=(1, 1, 28, 28)).astype(np.float32)
    whole = ort.InferenceSession(str(mblt)).run([logits], {"image": image})[0]
    np.testing.assert_allclose(
        ort.InferenceSession(str(body)).run(None, {"image": image})[0], whole, rtol=1e-6
    )
    assert len(onnx.load(get_body_subgraph(mblt, tmp_path / "whole.mblt")).graph.node) == len(
        onnx.load(mblt).graph.node
    )
    code = _run_cli(
        "extract-body",
        "--mblt",
        str(mblt),
        "--output",
        str(tmp_path / "cli.mblt"),
        "--target-device",
        "regulus-ra",
    )
    assert code == 0 and "left out 0 head and 1 tail node(s)" in capsys.readouterr().out


def test_the_reference_argument_order_works_positionally(sample_mblt, tmp_path: Path) -> None:
    """``mblt_compile(model, mblt_save_path, backend, target_device)`` and ``mxq_compile_from_mblt(mblt, target_device,
    calib_data_path, save_path)`` in the reference's order were TypeErrors (keyword-only arguments)."""
    from compiler_core import mblt_compile, mxq_compile_from_mblt

    assert mblt_compile(SAMPLE, tmp_path / "m.mblt", "onnx", "aries-rb").is_file()
    result = mxq_compile_from_mblt(
        sample_mblt,
        "aries-rb",
        SAMPLE_DIR / "calib",
        tmp_path / "m.mxq",
        compile_config=SAMPLE_CONFIG,
        analysis_holdout=0,
    )
    assert result.device == "aries-rb"


def test_the_vendors_hessian_quant_config_names_what_to_pass_here() -> None:
    """``hessian_quant_config=`` (a reference sub-config) was only "Unknown config argument(s)"; the message now names
    this compiler's GPTQ setting, which the config accepts."""
    from compiler_core.config import resolve_config

    with pytest.raises(
        ArgumentError, match=r"for hessian_quant_config pass bit_config=\{'weightRounding': 'gptq'\}"
    ):
        resolve_config(hessian_quant_config={"apply": True})
    assert resolve_config(bit_config={"weightRounding": "gptq"}).bit.weight_rounding == "gptq"


def test_runtime_arguments_of_the_wrong_kind_are_argument_errors(sample_mxq) -> None:
    """Each was a Python traceback naming our internals (AttributeError 'str' has no 'core_mode' / 'device', TypeError
    'NoneType' has no len(), '<=' between int and str, expected str ... not NoneType)."""
    from compiler_core.runtime import Accelerator, Model, ModelConfig, get_model_summary

    with pytest.raises(ArgumentError, match="model_config must be a ModelConfig, got a str"):
        Model(sample_mxq, "multi")
    with pytest.raises(ArgumentError, match="launch takes an Accelerator, got a str"):
        Model(sample_mxq).launch("aries-rb")
    model = Model(sample_mxq)
    model.launch(Accelerator(0))
    with pytest.raises(ArgumentError, match="infer takes a list of arrays .* got NoneType"):
        model.infer(None)
    config = ModelConfig()
    config.set_single_core_mode(cores="01")
    with pytest.raises(ArgumentError, match="core and cluster numbers are integers"):
        Model(sample_mxq, config).launch(Accelerator(0))
    with pytest.raises(ArgumentError, match="An MXQ path is needed, got NoneType"):
        get_model_summary(None)


def test_a_calibration_path_of_the_wrong_kind_is_an_argument_error(tmp_path: Path) -> None:
    """``calib_data_path=123`` was a TypeError ('int' object is not iterable) from inside the config resolution."""
    from compiler_core import mxq_compile

    with pytest.raises(ArgumentError, match="calib_data_path must be a path or a list of paths, got 123"):
        mxq_compile(SAMPLE, "aries-rb", 123, tmp_path / "m.mxq")


def test_a_wrong_input_count_lists_the_shapes_in_the_layout_arrays_are_passed_in(sample_mxq) -> None:
    """The hint listed the model's NCHW shape ([1, 1, 28, 28]) to a Model taking NHWC arrays ([1, 28, 28, 1])."""
    from compiler_core.runtime import Accelerator, Model

    for layout, shape in (("NHWC", "[1, 28, 28, 1]"), ("NCHW", "[1, 1, 28, 28]")):
        model = Model(sample_mxq, input_layout=layout)
        model.launch(Accelerator(0))
        with pytest.raises(ArgumentError, match="takes 1 input") as caught:
            model.infer([np.zeros((1, 28, 28, 1), np.float32)] * 2)
        assert caught.value.hint == f"Inputs ({layout}): image {shape}."
