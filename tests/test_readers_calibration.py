"""Resource limits of the calibration readers: huge shapes and dimensions are refused before allocation."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from compiler_core.calibration import InputSpec, open_calibration_data
from compiler_core.errors import CalibrationError

SPEC = InputSpec("image", (1, 1, 28, 28), np.dtype(np.float32), "NCHW")


def _npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * ((-len(header) - 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def test_an_npy_header_claiming_a_huge_shape_is_refused_from_the_header(tmp_path):
    (tmp_path / "huge.npy").write_bytes(_npy_header((1 << 20, 1 << 20, 1 << 10)) + b"\0" * 64)
    with pytest.raises(CalibrationError, match=r"header describes a \[1048576, 1048576, 1024\] float32 array"):
        open_calibration_data(tmp_path, [SPEC])


def test_an_npy_whose_body_is_short_is_refused(tmp_path):
    (tmp_path / "short.npy").write_bytes(_npy_header((1, 1, 28, 28)) + b"\0" * 100)
    with pytest.raises(CalibrationError, match="but the file has"):
        open_calibration_data(tmp_path, [SPEC])


def test_a_damaged_npy_header_is_a_calibration_error(tmp_path):
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", 54) + b"{'descr': '<f4', 'shape': (1,\0" + b" " * 23 + b"\n")
    with pytest.raises(CalibrationError, match="cannot be read"):
        open_calibration_data(tmp_path, [SPEC])


def test_an_image_with_huge_dimensions_is_refused_from_its_header(tmp_path):
    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, format="PNG")
    png = bytearray(buffer.getvalue())
    png[16:24] = struct.pack(">II", 9000, 9000)  # IHDR width, height: 81 MP, under Pillow's own bomb limit
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
    (tmp_path / "bomb.png").write_bytes(bytes(png))
    with pytest.raises(CalibrationError, match="9000x9000 pixels, more than the 64 megapixel limit"):
        open_calibration_data(tmp_path, [SPEC])


def test_a_jpeg_over_the_limit_is_read_at_a_reduced_scale(tmp_path):
    """A 108-megapixel phone photo was refused ("more than the 64 megapixel limit"): a JPEG decodes at 1/2, 1/4 or
    1/8 of its size for little work, and the pipeline then resizes it as any other photo."""
    from compiler_core.calibration.validate import probe_image

    image = Image.new("L", (8200, 8000))  # 65.6 megapixels, a gradient so that the reduced decode has content
    image.paste(Image.linear_gradient("L").resize((8200, 8000), Image.Resampling.NEAREST))
    image.save(tmp_path / "large.jpg", quality=70)
    assert probe_image(tmp_path / "large.jpg").size == (4000, 4100)  # the size the pipeline sees (half)
    data = open_calibration_data(tmp_path, [SPEC], preprocessing={
        "apply": True, "pipeline": [{"op": "resize", "height": 28, "width": 28}]})
    sample = next(iter(data))["image"]
    assert sample.shape == (1, 1, 28, 28)
    column = sample[0, 0, :, 14]  # the gradient runs top (0) to bottom (255); a pipeline without normalize keeps 0-255
    assert column[0] < 20 and column[-1] > 235 and np.all(np.diff(column) >= 0)
