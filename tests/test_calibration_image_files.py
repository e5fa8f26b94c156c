"""Image files as phones, cameras, scanners and dataset tools write them: EXIF orientation, WebP/TIFF/GIF, animated
files, odd Pillow modes and links, read the same way by calibration, ``make_calib`` and Try (one decoder)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from compiler_core.calibration import InputSpec, make_calib, open_calibration_data
from compiler_core.calibration.preprocess import IMAGE_SUFFIXES, ORIENTATION_TRANSPOSE
from compiler_core.errors import CalibrationError
from tests.realdata import WALLPAPER_SOURCES
from tests.realmodels import RealModelUnavailable

HEIGHT, WIDTH = 60, 96  # not square: a sideways photo has another size
SPEC = InputSpec("image", (1, 3, HEIGHT, WIDTH), np.dtype(np.float32), "NCHW")
RESIZE = {"apply": True, "pipeline": [{"op": "resize", "height": HEIGHT, "width": WIDTH},
                                      {"op": "normalize", "mean": [0.0], "std": [1.0]}]}


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    """A real photo (Debian's mate-backgrounds ``Dune.jpg``) at the model's size, upright."""
    try:
        pixels = WALLPAPER_SOURCES["mate_Dune"]()
    except RealModelUnavailable as error:
        pytest.skip(str(error))
    return Image.fromarray(pixels).resize((WIDTH, HEIGHT), Image.Resampling.LANCZOS)


def _stored_as(photo: Image.Image, orientation: int) -> Image.Image:
    """The pixels a camera stores with ``orientation`` for a photo that is shown as ``photo``."""
    inverse = {2: 2, 3: 3, 4: 4, 5: 5, 6: 8, 7: 7, 8: 6}[orientation]  # the transpose undoing each one
    stored = photo.transpose(ORIENTATION_TRANSPOSE[inverse])
    assert np.array_equal(np.asarray(stored.transpose(ORIENTATION_TRANSPOSE[orientation])), np.asarray(photo))
    return stored


def _save_oriented(image: Image.Image, path, orientation: int, **options) -> None:
    exif = image.getexif()
    exif[0x0112] = orientation
    image.save(path, exif=exif, **options)


def _pixels(folder, spec=SPEC, preprocessing=None):
    dataset = open_calibration_data(folder, [spec], preprocessing=preprocessing)
    return dataset, [dataset.sample(index)[spec.name] for index in range(len(dataset))]


@pytest.mark.parametrize("orientation", range(2, 9))
def test_a_photo_stored_turned_is_read_upright_by_its_exif_orientation(tmp_path, photo, orientation):
    """A phone held upright stores the sensor's sideways pixels and an EXIF orientation tag; every viewer shows the
    photo upright. The reader fed the stored pixels: sideways (or mirrored), and for 90/270 degrees of another size,
    so a model-sized photo was refused as 60x96 for a 96x60 input."""
    (tmp_path / "upright").mkdir()
    photo.save(tmp_path / "upright" / "a.png")
    (tmp_path / "phone").mkdir()
    _save_oriented(_stored_as(photo, orientation), tmp_path / "phone" / "a.png", orientation)
    _, upright = _pixels(tmp_path / "upright")
    dataset, turned = _pixels(tmp_path / "phone")
    np.testing.assert_array_equal(turned[0], upright[0])
    assert "1 image(s) turned upright by their EXIF orientation" in dataset.notes
    assert dataset.settings["images"]["image"]["exifOrientation"] == "applied"  # a new statistics-cache key


def test_a_turned_jpeg_through_a_resize_matches_pillows_exif_transpose(tmp_path, photo):
    """The same pixels in calibration and make_calib as ``ImageOps.exif_transpose`` gives (the FP32 reference of Try
    opens its inputs through the same reader)."""
    big = photo.resize((WIDTH * 3, HEIGHT * 3))
    _save_oriented(_stored_as(big, 6), tmp_path / "a.jpg", 6, quality=92)
    with Image.open(tmp_path / "a.jpg") as image:
        expected = np.asarray(ImageOps.exif_transpose(image).convert("RGB").resize((WIDTH, HEIGHT), Image.Resampling.BILINEAR),
                              np.float32)
    expected = expected.transpose(2, 0, 1)[None] / 255
    _, read = _pixels(tmp_path, preprocessing=RESIZE)
    np.testing.assert_allclose(read[0], expected, atol=1e-6)
    listed = make_calib(RESIZE, tmp_path, tmp_path / "out", "calib", -1)
    written = np.load(listed.parent / listed.read_text().split()[0])
    np.testing.assert_allclose(written, expected[0].transpose(1, 2, 0), atol=1e-6)


@pytest.mark.parametrize("name", ["a.webp", "a.tif", "a.tiff", "A.WEBP", "A.TIFF"])
def test_webp_and_tiff_files_are_read_like_png(tmp_path, photo, name):
    """Pillow reads them; the folder reader listed only .jpg/.jpeg/.png/.bmp ("has no usable files ... found 1 .webp
    file")."""
    (tmp_path / "png").mkdir()
    photo.save(tmp_path / "png" / "a.png")
    (tmp_path / "other").mkdir()
    photo.save(tmp_path / "other" / name, lossless=True)
    _, expected = _pixels(tmp_path / "png")
    _, read = _pixels(tmp_path / "other")
    np.testing.assert_array_equal(read[0], expected[0])


def test_an_animated_gif_gives_its_first_frame_and_says_so(tmp_path, photo):
    frames = [photo.quantize(), ImageOps.invert(photo).quantize()]
    frames[0].save(tmp_path / "clip.gif", save_all=True, append_images=frames[1:], duration=100)
    dataset, read = _pixels(tmp_path)
    expected = np.asarray(frames[0].convert("RGB"), np.float32).transpose(2, 0, 1)[None] / 255
    np.testing.assert_allclose(read[0], expected, atol=1e-6)
    assert "1 animated or multi-page image(s): first frame read" in dataset.notes


def test_every_image_suffix_is_a_calibration_file_form(tmp_path, photo):
    """One registry: a single image file of each suffix is accepted as calib_data_path."""
    for suffix in IMAGE_SUFFIXES:
        photo.save(tmp_path / f"a{suffix}")
        assert len(open_calibration_data(tmp_path / f"a{suffix}", [SPEC])) == 1


@pytest.mark.parametrize("mode", ["CMYK", "P", "LA", "RGBA", "1", "I;16"])
def test_pillow_modes_are_read_as_the_models_channels(tmp_path, photo, mode):
    """CMYK JPEGs from print workflows, palette PNGs with transparency, gray+alpha, 1-bit scans and 16-bit gray: each
    is read as RGB for a 3-channel input and as gray for a 1-channel one; alpha is dropped."""
    if mode == "I;16":
        image = Image.fromarray(np.asarray(photo.convert("L")).astype(np.uint16) * 257)
    else:
        image = photo.convert(mode)
    options = {"transparency": 0} if mode == "P" else {}
    image.save(tmp_path / ("a.jpg" if mode == "CMYK" else "a.png"), **options)
    for channels in (3, 1):
        spec = InputSpec("image", (1, channels, HEIGHT, WIDTH), np.dtype(np.float32), "NCHW")
        _, read = _pixels(tmp_path, spec)
        assert read[0].shape == spec.shape and 0.05 < read[0].mean() < 0.95


def test_a_link_to_a_missing_file_is_refused_by_name(tmp_path, photo):
    """It was left out without a word: the data shrank by one file."""
    photo.save(tmp_path / "a.png")
    os.symlink(tmp_path / "gone.png", tmp_path / "b.png")
    with pytest.raises(CalibrationError, match="1 file\\(s\\) in .* are links to files that do not exist: b.png"):
        open_calibration_data(tmp_path, [SPEC])
    with pytest.raises(CalibrationError, match="links to files that do not exist: b.png"):
        make_calib(RESIZE, tmp_path, tmp_path / "out", "calib", -1)


def test_a_link_to_a_photo_is_read(tmp_path, photo):
    photo.save(tmp_path / "a.png")
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path / "a.png", tmp_path / "data" / "b.png")
    assert len(open_calibration_data(tmp_path / "data", [SPEC])) == 1


def test_class_folders_linked_in_from_elsewhere_are_read_once_each(tmp_path, photo):
    """A calibration folder assembled from links to class folders of a dataset read as "holds only subfolders
    (cat, dog), with no files in them"; a link back up the tree must not loop."""
    for name in ("cat", "dog"):
        (tmp_path / "dataset" / name).mkdir(parents=True)
        photo.save(tmp_path / "dataset" / name / "a.png")
        (tmp_path / "calib").mkdir(exist_ok=True)
        os.symlink(tmp_path / "dataset" / name, tmp_path / "calib" / name)
    os.symlink(tmp_path / "calib", tmp_path / "dataset" / "cat" / "loop")
    dataset = open_calibration_data(tmp_path / "calib", [SPEC])
    assert [Path(source).relative_to(tmp_path / "calib").as_posix() for source in dataset.sources] == \
        ["cat/a.png", "dog/a.png"]
