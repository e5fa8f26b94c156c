"""Run-time inputs are checked (dtype, shape, layout, range) and integer-only devices say how I/O is converted."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from compiler_core.api import mblt_compile, mxq_compile
from compiler_core.errors import ArgumentError
from compiler_core.quantization import executor
from compiler_core.runtime import Accelerator, Model
from compiler_core.runtime.inputs import load_run_inputs

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"


@pytest.fixture(scope="module")
def usb_mxq(tmp_path_factory) -> Path:
    """The sample compiled for the integer-only USB device."""
    folder = tmp_path_factory.mktemp("usb")
    mblt = mblt_compile(SAMPLE_DIR / "model.onnx", folder / "sample.mblt")
    return mxq_compile(mblt, "regulus-rb-usb", SAMPLE_DIR / "calib", folder / "sample.mxq",
                       compile_config=SAMPLE_DIR / "compile_config.yaml").mxq_path


def _launched(path: Path, layout: str = "NHWC") -> Model:
    model = Model(path, input_layout=layout)
    model.launch(Accelerator(model.artifact.device))
    return model


def _image(path: Path) -> np.ndarray:
    """A real test image, preprocessed as at calibration (NCHW float32)."""
    artifact = Model(path).artifact
    return next(iter(load_run_inputs(artifact, [str(SAMPLE_DIR / "test")])))[1]["image"]


def test_a_uint8_image_on_a_float_input_is_an_argument_error(usb_mxq):
    model = _launched(usb_mxq)
    image = np.zeros((1, 28, 28, 1), dtype=np.uint8)
    with pytest.raises(ArgumentError) as caught:
        model.infer(image)
    message = caught.value.message
    assert "'image' takes float32 values or int8 codes" in message and "uint8 array was given" in message
    assert caught.value.fields["given"] == "uint8"


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64, np.bool_])
def test_integer_arrays_of_another_dtype_than_the_codes_are_refused(usb_mxq, dtype):
    with pytest.raises(ArgumentError, match="takes float32 values or int8 codes"):
        _launched(usb_mxq, "NCHW").infer(np.zeros((1, 1, 28, 28), dtype=dtype))


def test_codes_of_the_input_dtype_run_as_codes(usb_mxq):
    model = _launched(usb_mxq, "NCHW")
    image = _image(usb_mxq)
    codes = model.program.params("image").quantize(image).astype(np.int8)
    expected = executor.run_codes(model.program, {"image": image})
    np.testing.assert_array_equal(model.infer(codes, raw=True)[0], model.infer(image, raw=True)[0])
    np.testing.assert_array_equal(model.infer(image, raw=True)[0], next(iter(expected.values())))


def test_float64_is_accepted_and_nan_is_refused(usb_mxq):
    model = _launched(usb_mxq, "NCHW")
    image = _image(usb_mxq)
    np.testing.assert_array_equal(model.infer(image.astype(np.float64))[0], model.infer(image)[0])
    image[0, 0, 3, 3] = np.nan
    with pytest.raises(ArgumentError, match="NaN or infinite"):
        model.infer(image)


def test_artifact_run_checks_shape_and_names(usb_mxq):
    artifact = Model(usb_mxq).artifact
    with pytest.raises(ArgumentError, match=r"shape \[1, 28, 28, 1\], expected \[1, 1, 28, 28\] \(NCHW\)"):
        artifact.run({"image": np.zeros((1, 28, 28, 1), np.float32)})
    with pytest.raises(ArgumentError, match="missing \\['image'\\], unknown \\['img'\\]"):
        artifact.run({"img": np.zeros((1, 1, 28, 28), np.float32)})


def test_integer_only_device_quantizes_io_on_the_host_and_says_so(usb_mxq, caplog):
    with caplog.at_level(logging.INFO, logger="compiler_core.runtime.checks"):
        model = _launched(usb_mxq)
    assert model.host_io == "quantized"
    assert "regulus-rb-usb takes quantized I/O only" in caplog.text
    output = model.infer(np.transpose(_image(usb_mxq), (0, 2, 3, 1)))[0]
    assert output.dtype == np.float32  # dequantized on the host


def test_float_io_device_exchanges_float32(tmp_path):
    mblt = mblt_compile(SAMPLE_DIR / "model.onnx", tmp_path / "s.mblt")
    result = mxq_compile(mblt, "regulus-rb", SAMPLE_DIR / "calib", tmp_path / "s.mxq",
                         compile_config=SAMPLE_DIR / "compile_config.yaml", analysis_holdout=0)
    assert _launched(result.mxq_path).host_io == "float32"


def test_inputs_to_run_are_not_warned_about_as_too_few_calibration_samples(usb_mxq, caplog):
    """``qbcompiler run --input photo.png`` warned "Only 1 calibration sample(s)": it is an input, not calibration."""
    artifact = Model(usb_mxq).artifact
    one = sorted((SAMPLE_DIR / "test").iterdir())[0]
    with caplog.at_level("WARNING"):
        names = [name for name, _ in load_run_inputs(artifact, [str(one)])]
    assert len(names) == 1 and "calibration sample" not in caplog.text
