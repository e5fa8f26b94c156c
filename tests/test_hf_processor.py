"""A transformers folder's image processor as a preprocessing pipeline (compiler_core.calibration.hf_processor)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from compiler_core.calibration import folder_pipeline, preprocess_image
from compiler_core.calibration.hf_processor import processor_pipeline
from compiler_core.config import CompileConfig

PHOTO = "chelsea.png"  # scikit-image's cat photo (451x300)


def _photo_path():
    skimage = pytest.importorskip("skimage")
    from pathlib import Path

    return Path(skimage.__file__).parent / "data" / PHOTO


@pytest.mark.parametrize("processor", ["vit", "convnext"])
def test_the_pipeline_prepares_a_photo_as_the_model_s_own_processor(processor, tmp_path):
    """ViT (resize 64x64, mean/std 0.5) and ConvNeXt (short side 224 / crop_pct 0.875 = 256, crop 224, ImageNet mean/
    std): the pipeline made from the saved preprocessor_config.json gives transformers' own processor output on a
    real photo: exactly for ViT; ConvNeXt's processor resizes bicubic, ours bilinear (said in a note)."""
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if processor == "vit":
            hf = transformers.ViTImageProcessor(size={"height": 64, "width": 64})
        else:
            hf = transformers.ConvNextImageProcessor(size={"shortest_edge": 224}, crop_pct=0.875)
        hf.save_pretrained(tmp_path)
    preprocessing, notes = folder_pipeline(tmp_path)
    config = CompileConfig.from_dict({"preprocessing": preprocessing}).preprocessing
    ours = preprocess_image(_photo_path(), config.pipeline, 3).transpose(2, 0, 1)
    from PIL import Image

    theirs = hf(Image.open(_photo_path()).convert("RGB"), return_tensors="np")["pixel_values"][0]
    assert ours.shape == theirs.shape
    error = np.abs(ours - theirs)
    if processor == "vit":
        assert not notes and error.max() < 1e-5  # the same Pillow bilinear resize: float rounding only (6e-8)
    else:
        assert "bilinear is used" in notes[0]
        # bicubic against bilinear: median 0.008, correlation 0.9994 here
        assert np.corrcoef(ours.ravel(), theirs.ravel())[0, 1] > 0.999 and np.median(error) < 0.02


def test_settings_it_cannot_translate_leave_the_folder_s_processor_unused(tmp_path):
    assert folder_pipeline(tmp_path) is None  # no processor file
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"do_resize": True, "do_pad": True,
                                                                   "size": {"height": 32, "width": 32}}))
    assert folder_pipeline(tmp_path) is None
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    assert folder_pipeline(tmp_path) is None
    with pytest.raises(ValueError, match="longest_edge"):
        processor_pipeline({"do_resize": True, "size": {"shortest_edge": 800, "longest_edge": 1333}})
    with pytest.raises(ValueError, match="no image processor"):
        processor_pipeline({"feature_size": 80, "sampling_rate": 16000})  # an audio feature extractor


def test_compiling_a_model_folder_uses_its_processor_unless_the_config_sets_a_pipeline(tmp_path):
    """mxq_compile of a transformers folder: with no pipeline in the config, its processor prepares the photos (the
    CLI compiled a ViT folder on photos with it); a config pipeline, or a processor for another size, wins."""
    from onnx import TensorProto, helper, numpy_helper, save

    from compiler_core.api import _folder_preprocessing, mblt_compile

    conv = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 64, 64])],
                             [numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")])
    save(helper.make_model(conv, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "m.onnx")
    mblt = mblt_compile(str(tmp_path / "m.onnx"), tmp_path / "m.mblt")
    folder = tmp_path / "folder"
    folder.mkdir()
    assert _folder_preprocessing(folder, mblt, {}) is None  # no processor file
    processor = {"do_resize": True, "size": {"height": 64, "width": 64}, "image_mean": [0.5] * 3,
                 "image_std": [0.5] * 3}
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    pipeline = _folder_preprocessing(folder, mblt, {})
    assert [step["op"] for step in pipeline["pipeline"]] == ["colorConvert", "resize", "normalize"]
    own = {"preprocessing": {"apply": True, "pipeline": [{"op": "resize", "height": 64, "width": 64}]}}
    assert _folder_preprocessing(folder, mblt, {"compile_config": own}) is None
    (folder / "preprocessor_config.json").write_text(json.dumps({**processor, "size": {"height": 32, "width": 32}}))
    assert _folder_preprocessing(folder, mblt, {}) is None
