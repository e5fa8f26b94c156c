"""The workbench's Qt-free state: compile settings, projects, runs, preferences, calibration form, model facts.

Runs without a display and without Qt: a test proves ``qbstudio.state`` never imports it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from compiler_core.api import mblt_compile
from compiler_core.calibration import InputSpec
from compiler_core.config import PreprocessingConfig
from compiler_core.config.presets import preset_config
from compiler_core.errors import ArgumentError, ConfigError
from qbstudio.state.calibration import (
    PreprocessForm,
    pipeline_preset,
    pipeline_presets,
    review_samples,
    sample_stats,
)
from qbstudio.state.model_info import dynamic_inputs, node_info, onnx_input_shapes
from qbstudio.state.preferences import MAX_RECENT, AppDirs, Preferences
from qbstudio.state.project import CalibrationSource, ModelRef, Project, ProjectError
from qbstudio.state.runs import RunHistory, RunRecord, compare_layers
from qbstudio.state.settings import CompileSettings, allowed_schemes, device_card

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "resources" / "samples"
IMAGE_SPEC = InputSpec("image", (1, 3, 8, 8), np.dtype("float32"), "NCHW")


# ---------------------------------------------------------------- architecture

def test_state_imports_without_qt():
    code = ("import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph'):\n"
            "            raise ImportError(name)\nsys.meta_path.insert(0, Block())\n"
            "import qbstudio.state.project, qbstudio.state.calibration, qbstudio.state.model_info, qbstudio.tasks\n"
            "print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


# ---------------------------------------------------------------- settings

def test_settings_validate_every_edit():
    settings = CompileSettings()
    settings.set("calibration.maxPercentile.percentile", 0.999)
    assert settings.config.calibration.max_percentile.percentile == 0.999
    with pytest.raises(ConfigError):
        settings.set("calibration.mode", 9)
    assert settings.get("calibration.mode") == 0


def test_device_change_limits_the_scheme():
    settings = CompileSettings()
    settings.set_scheme("global8")
    assert allowed_schemes("aries-rb") == ["single", "multi", "global4", "global8", "all"]
    assert settings.set_device("regulus-ra") == "single"
    assert allowed_schemes("regulus-ra") == ["single"]  # the README's "single" only: the card says the same
    with pytest.raises(ArgumentError):
        settings.set_scheme("multi")
    card = device_card("regulus-ra")
    assert card["schemes"] == ["single"]
    assert card["cores"] == 1 and not card["mfu"] and card["tops"] == pytest.approx(10, abs=0.1)


def test_preset_and_int16_overrides(tmp_path):
    settings = CompileSettings()
    settings.set_device("regulus-rb")
    settings.apply_preset("transformer_encoder")
    assert settings.device == "regulus-rb" and settings.preset == "transformer_encoder"
    assert settings.int16_layers == preset_config("transformer_encoder")["bit"]["layerOverrides"]["activation16Bits"]
    assert settings.add_int16_layer("Conv_3") and not settings.add_int16_layer("Conv_3")
    path = tmp_path / "config.yaml"
    settings.save(path)
    loaded = CompileSettings()
    loaded.load(path)
    assert loaded.config == settings.config
    assert "transformer_encoder" in settings.summary() and "int16 x" in settings.summary()
    settings.remove_int16_layer("Conv_3")
    assert "Conv_3" not in settings.int16_layers


def test_the_run_summary_tells_runs_apart_by_cpu_layers_and_mixed_precision():
    """Two runs of the log-mel front end, one with its Log on the CPU and automatic mixed precision, one all on the
    NPU, had the same line in the runs table ("aries-rb · single · mode Max · method WChALayer")."""
    settings = CompileSettings()
    settings.set_device("aries-rb")
    plain = settings.summary()
    settings.set("cpuLayers", {"head": ["Log_0"], "tail": []})
    settings.set("mixedPrecision.apply", True)
    settings.set("mixedPrecision.target", {"kind": "cosine", "value": 0.999})
    summary = settings.summary()
    assert summary != plain and "CPU head x1" in summary and "mixed precision cosine >= 0.999" in summary
    settings.set("cpuOffload", True)
    assert "CPU offload" in settings.summary()


def test_reset_undoes_layered_presets_and_keeps_the_target_and_the_data_pipeline():
    """Found under Xvfb: after a16w8 then a16w16 (presets layer over the current settings) nothing led back to the
    defaults; choosing another preset kept the int16 layers of the earlier ones."""
    from qbstudio.state.calibration import pipeline_preset

    preprocessing, uint8 = pipeline_preset("classification_torchvision")
    settings = CompileSettings()
    settings.set_device("regulus-rb")
    settings.set("preprocessing", preprocessing)
    settings.set("uint8Input.apply", uint8)
    settings.apply_preset("a16w16")
    settings.apply_preset("classification")
    assert settings.int16_layers == ["*"]  # layered: the earlier preset's int16 stays
    pipeline = settings.preprocessing
    settings.reset()
    defaults = CompileSettings().config
    assert settings.preset is None and settings.int16_layers == [] and settings.device == "regulus-rb"
    assert settings.config.calibration == defaults.calibration and settings.config.bit == defaults.bit
    assert settings.preprocessing == pipeline and settings.config.uint8_input.apply is uint8 is True


def test_loading_an_invalid_config_keeps_the_settings(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"calibration": {"mode": 1, "unknownKey": 2}}')
    settings = CompileSettings()
    before = settings.to_dict()
    with pytest.raises(ConfigError, match="bad.json"):
        settings.load(bad)
    assert settings.to_dict() == before


# ---------------------------------------------------------------- runs

def _run(run_id: int, sqnr: dict[str, float]) -> RunRecord:
    result = {"device": "aries-rb", "core_modes": ["single"], "output": f"/x/run{run_id}.mxq", "size_bytes": 10,
              "analysis": {"verdict": "ok", "min_output_sqnr_db": min(sqnr.values()), "mean_output_cosine": 0.99},
              "outputs": {"logits": {"top1_agreement": 0.9}}, "samples": {"calibration": 4, "holdout": 2}}
    analysis = {"layers": [{"layer": name, "op": "Conv", "precision": "a8w8", "sqnr_db": value}
                           for name, value in sqnr.items()]}
    return RunRecord.from_result(run_id, result, analysis, config={}, config_summary="s", precisions={"a": "a8"})


def test_runs_rank_and_compare_layers():
    first, second = _run(1, {"a": 30.0, "b": 12.5, "c": 40.0}), _run(2, {"a": 31.0, "c": 20.0, "d": 25.0})
    assert [row["layer"] for row in first.worst_layers()] == ["b", "a", "c"]
    assert first.headline() == {"verdict": "ok", "sqnr_db": 12.5, "cosine": 0.99, "top1": 0.9}
    names, sqnr_a, sqnr_b = compare_layers(first, second)
    assert names == ["b", "a", "c", "d"]
    assert sqnr_a[:3] == [12.5, 30.0, 40.0] and math.isnan(sqnr_a[3])
    assert math.isnan(sqnr_b[0]) and sqnr_b[1:] == [31.0, 20.0, 25.0]
    history = RunHistory([first])
    history.add(second)
    assert history.next_id() == 3 and history.latest is second
    assert RunHistory.from_list(history.to_list()).to_list() == history.to_list()
    mixed = {"target": {"kind": "cosine", "value": 0.99}, "target_met": True, "metric": 0.992}
    result = {"device": "aries-rb", "core_modes": ["single"], "output": "/x/run3.mxq", "size_bytes": 10,
              "mixed_precision": mixed}
    record = RunRecord.from_result(3, result, None, config={}, config_summary="s")
    assert record.mixed_precision == mixed and _run(4, {"a": 1.0}).mixed_precision == {}


# ---------------------------------------------------------------- projects

def test_project_round_trip_with_relative_paths(tmp_path):
    folder = tmp_path / "proj"
    project = Project.new("p", tmp_path / "scratch")
    project.work_dir.mkdir(parents=True)
    (project.work_dir / "model.mblt").write_bytes(b"mblt")
    run_mxq = project.run_dir(1) / "m.mxq"
    run_mxq.parent.mkdir(parents=True)
    run_mxq.write_bytes(b"mxq")
    project.model = ModelRef(str(tmp_path / "models" / "m.onnx"), "onnx", "abc", {"x": [1, 3]})
    project.calibration = CalibrationSource(str(folder / "calib"), False)
    project.settings.set_device("regulus-rb")
    run = _run(1, {"a": 30.0})
    run.mxq_path = str(run_mxq)
    project.runs.add(run)

    saved = project.save(folder / "p.qbproj")
    data = json.loads(saved.read_text())
    assert data["workDir"] == "p.qbstudio" and data["calibration"]["path"] == "calib"
    assert data["runs"][0]["mxq_path"] == "p.qbstudio/runs/run-001/m.mxq"
    assert Path(data["model"]["path"]).is_absolute()  # outside the project folder

    loaded = Project.load(saved)
    assert loaded.has_mblt and loaded.work_dir == folder / "p.qbstudio"
    assert Path(loaded.runs.latest.mxq_path).read_bytes() == b"mxq"
    assert loaded.model == project.model and loaded.settings.device == "regulus-rb"
    assert loaded.calibration.path == str(folder / "calib")


def test_a_refused_save_leaves_the_project_as_it_was(tmp_path, monkeypatch):
    """Found under Xvfb (s14): Save As into a read-only folder showed "[Errno 1] Operation not permitted:
    '.../fer2.qbstudio'"; and a save whose file write failed after the work folder was copied left the project
    pointing at the unsaved file and folder."""
    import qbstudio.state.project as project_module
    from compiler_core.errors import OutputWriteError

    project = Project.new("p", tmp_path / "scratch")
    run_mxq = project.run_dir(1) / "m.mxq"
    run_mxq.parent.mkdir(parents=True)
    run_mxq.write_bytes(b"mxq")
    run = _run(1, {"a": 30.0})
    run.mxq_path = str(run_mxq)
    project.runs.add(run)
    project.calibration = CalibrationSource(str(project.work_dir / "calib_folders.json"), False)
    before = (project.path, project.name, project.work_dir, project.calibration.path, run.mxq_path)

    def refuse(source, target, **kwargs):  # what a read-only folder does (chmod does not stop root: simulated)
        raise PermissionError(1, "Operation not permitted", str(target))

    monkeypatch.setattr(project_module.shutil, "copytree", refuse)
    with pytest.raises(OutputWriteError, match=r"Cannot write to '.*locked': Operation not permitted\.") as caught:
        project.save(tmp_path / "locked" / "p.qbproj")
    assert "Save Project As" in caught.value.hint and "Errno" not in caught.value.message
    assert (project.path, project.name, project.work_dir, project.calibration.path, run.mxq_path) == before
    monkeypatch.undo()

    def full_disk(path, text):
        raise OutputWriteError(f"Cannot write '{path}': No space left on device.")

    monkeypatch.setattr(project_module, "atomic_write_text", full_disk)
    with pytest.raises(OutputWriteError, match="No space left"):
        project.save(tmp_path / "full" / "p.qbproj")
    assert (project.path, project.name, project.work_dir, project.calibration.path, run.mxq_path) == before
    assert not (tmp_path / "full" / "p.qbstudio").exists() and run_mxq.read_bytes() == b"mxq"
    monkeypatch.undo()
    assert project.save(tmp_path / "ok" / "p.qbproj").is_file()  # and it saves once the folder allows it


def test_bundled_sample_is_a_template(tmp_path):
    with pytest.raises(ProjectError, match="template"):
        Project.load(SAMPLE / "fashion_cnn.qbproj")
    sample = Project.load(SAMPLE / "fashion_cnn.qbproj", scratch_dir=tmp_path / "scratch")
    assert sample.template and not sample.writable
    assert Path(sample.model.path) == SAMPLE / "fashion_cnn" / "model.onnx" and not sample.model.changed_on_disk()
    assert sample.calibration.path == str(SAMPLE / "fashion_cnn" / "calib")
    assert sample.settings.config.image_channels == 1 and sample.settings.config.calibration.mode == 1
    with pytest.raises(ProjectError):
        sample.save()


@pytest.mark.parametrize("text", ["not json", '{"format": "other"}', '{"format": "qbstudio-project", "version": 9}'])
def test_bad_project_files_raise_project_error(tmp_path, text):
    path = tmp_path / "bad.qbproj"
    path.write_text(text)
    with pytest.raises(ProjectError):
        Project.load(path)


# ---------------------------------------------------------------- preferences

def test_preferences_recent_and_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("QBSTUDIO_HOME", str(tmp_path))
    dirs = AppDirs.default()
    assert dirs.preferences_file == tmp_path / "config" / "preferences.json"
    prefs = Preferences()
    for index in range(MAX_RECENT + 2):
        prefs.add_recent_model(tmp_path / f"m{index}.onnx")
    prefs.add_recent_model(tmp_path / "m3.onnx")
    assert len(prefs.recent_models) == MAX_RECENT and prefs.recent_models[0].endswith("m3.onnx")
    prefs.remember_dir("model", tmp_path / "m3.onnx")
    prefs.window = {"geometry": "abc", "tab": 2}
    prefs.save(dirs.preferences_file)
    again = Preferences.load(dirs.preferences_file)
    assert again == prefs and again.last_dir("model") == str(tmp_path)
    dirs.preferences_file.write_text("{broken")
    assert Preferences.load(dirs.preferences_file) == Preferences()


# ---------------------------------------------------------------- calibration form and checks

@pytest.mark.parametrize("name", list(pipeline_presets()))
def test_pipeline_presets_round_trip_through_the_form(name):
    preprocessing, _ = pipeline_preset(name)
    form = PreprocessForm.from_preprocessing(preprocessing)
    again = form.to_preprocessing()
    canonical = PreprocessingConfig.model_validate(preprocessing).model_dump(mode="json", by_alias=True)
    assert again == canonical
    assert PreprocessForm.from_preprocessing(again) == form


def test_imagenet_preset_asks_for_uint8_and_fuses_normalize():
    preprocessing, uint8 = pipeline_preset("classification_torchvision")
    form = PreprocessForm.from_preprocessing(preprocessing)
    assert uint8 and form.fuse and form.resize and form.keep_aspect and form.crop
    assert form.expected_range(uint8) == (0.0, 255.0)


def test_review_flags_constant_unnormalized_and_few_samples():
    rng = np.random.default_rng(0)
    good = [sample_stats(i, f"{i}.png", rng.normal(size=IMAGE_SPEC.shape), IMAGE_SPEC) for i in range(3)]
    form = PreprocessForm(apply=True, normalize=True, mean=[0.5] * 3, std=[0.2] * 3)
    assert review_samples(good, 64, IMAGE_SPEC, form) == []
    raw = [sample_stats(0, "raw.png", rng.uniform(0, 255, size=IMAGE_SPEC.shape), IMAGE_SPEC)]
    zero = [sample_stats(1, "zero.png", np.zeros(IMAGE_SPEC.shape), IMAGE_SPEC)]
    warnings = review_samples(raw + zero, 8, IMAGE_SPEC, PreprocessForm(apply=True, normalize=True, mean=[0.5, 0.5],
                                                                       std=[0.2, 0.2]))
    assert any("Only 8" in text for text in warnings)
    assert any("zero.png" in text and "all zeros" in text for text in warnings)
    assert any("far outside" in text for text in warnings)
    assert any("3 channel" in text for text in warnings)
    assert good[0].describe().count("c") == 3 and len(good[0].minimum) == 3


def test_review_of_npy_files_does_not_send_the_user_to_the_image_pipeline():
    """Found under Xvfb (s14): openWakeWord's log-mel .npy files (values 3.5-12) were told to "check normalize", which
    the .npy files never go through."""
    mels = [sample_stats(i, f"{i:06d}.npy", np.linspace(3.5, 12.2, 3 * 8 * 8).reshape(IMAGE_SPEC.shape), IMAGE_SPEC)
            for i in range(2)]
    warnings = review_samples(mels, 64, IMAGE_SPEC, PreprocessForm())
    assert len(warnings) == 1 and "fed as they are" in warnings[0] and "normalize" not in warnings[0]
    pngs = [sample_stats(0, "raw.png", np.linspace(0, 255, 3 * 8 * 8).reshape(IMAGE_SPEC.shape), IMAGE_SPEC)]
    assert "check normalize" in review_samples(pngs, 64, IMAGE_SPEC, PreprocessForm())[0]


# ---------------------------------------------------------------- model facts

def test_onnx_input_shapes_finds_dynamic_dims(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, None, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph), path)
    (shape,) = onnx_input_shapes(path)
    assert shape.dims == ("batch", 3, None, 8) and shape.dtype == "float32"
    assert dynamic_inputs([shape]) == [shape] and shape.suggested() == [1, 3, 0, 8]


def test_node_info_of_the_sample(tmp_path):
    from compiler_core.api import load_mblt

    model = load_mblt(mblt_compile(SAMPLE / "fashion_cnn" / "model.onnx", tmp_path / "m.mblt"))
    info = node_info(model, "Conv_0")
    assert info["op"] == "Conv" and info["outputs"][0]["shape"] == [1, 16, 28, 28]
    assert info["inputs"][0]["shape"] == [1, 1, 28, 28] and info["inputs"][1]["constant"]
    assert "kernel_shape" in info["attributes"]
    assert node_info(model, "nope") is None


def test_runs_belong_to_the_model_they_compiled():
    history = RunHistory([RunRecord(1, "t", "aries-rb", ["single"], "a.mxq", 1, {}, model_sha256="aaa"),
                          RunRecord(2, "t", "aries-rb", ["single"], "b.mxq", 1, {}, model_sha256="bbb"),
                          RunRecord(3, "t", "aries-rb", ["single"], "c.mxq", 1, {})])
    assert [run.run_id for run in history.for_model("aaa").runs] == [1]
    assert len(history.for_model("")) == 0
    assert history.adopt("bbb") == 1  # a run saved before runs carried a hash
    assert [run.run_id for run in history.for_model("bbb").runs] == [2, 3]
    again = RunHistory.from_list(history.to_list())
    assert [run.model_sha256 for run in again.runs] == ["aaa", "bbb", "bbb"]


def test_holdout_split_matches_the_compiler():
    from compiler_core.quantization import run as quantization_run
    from qbstudio.state.model_fit import MIN_CALIBRATION_SAMPLES, holdout_note, holdout_split

    assert MIN_CALIBRATION_SAMPLES == quantization_run.MIN_CALIBRATION_SAMPLES

    class Config:  # what _split reads
        analysis_holdout = 16

        class calibration:  # noqa: N801
            num_samples = 128

    for total in (5, 13, 48, 200):
        class Dataset(list):
            def split(self, holdout, seed=0):
                return Dataset(self[holdout:]), Dataset(self[:holdout])

        calibration, held = quantization_run._split(Dataset(range(total)), Config)
        assert holdout_split(total, 16, 128) == (len(calibration), len(held))
    text, adjusted = holdout_note(13, 16, 128)
    assert adjusted and "10 for calibration, 3 held out" in text


def test_fit_to_model_rederives_channels_preprocessing_and_calibration():
    from qbstudio.state.model_fit import fit_to_model

    settings = CompileSettings()
    settings.set("imageChannels", 1)
    settings.set("preprocessing", pipeline_preset("yolo_640")[0])
    source = CalibrationSource(path="/data/fashion")
    gray = [InputSpec("image", (1, 1, 28, 28), np.dtype("float32"), "NCHW")]
    rgb = [InputSpec("image", (1, 3, 224, 224), np.dtype("float32"), "NCHW")]
    assert fit_to_model(settings, source, gray, None) == []
    notes = fit_to_model(settings, source, rgb, gray)
    assert settings.config.image_channels == 0 and source.path is None
    assert not settings.preprocessing["pipeline"] and len(notes) == 3
    assert fit_to_model(settings, source, rgb, rgb) == []


def test_shape_suggestions_share_named_dims():
    from qbstudio.state.shapes import InputShape, dynamic_dim_keys, resolve_shapes, suggest_dims

    shapes = [InputShape("ids", ("batch", "seq"), "int64"), InputShape("mask", ("batch", "seq"), "int64"),
              InputShape("img", (None, 3, None, None), "float32")]
    assert dynamic_dim_keys(shapes) == {"batch": ["ids", "mask"], "seq": ["ids", "mask"], "img[0]": ["img"],
                                        "img[2]": ["img"], "img[3]": ["img"]}
    values = suggest_dims(shapes, "yolov8n.onnx")
    assert values == {"batch": 1, "seq": 128, "img[0]": 1, "img[2]": 640, "img[3]": 640}
    assert resolve_shapes(shapes, values)["mask"] == [1, 128]


def test_tooltips_come_from_the_config_schema():
    from qbstudio.state.settings import choice_descriptions, field_description

    assert field_description("analysisHoldout").startswith("Calibration samples held out")
    assert "MaxPercentile" in field_description("calibration.maxPercentile.percentile")
    assert set(choice_descriptions("calibration.mode")) == {0, 1, 2, 3}
    assert set(choice_descriptions("imageChannels")) == {0, 1, 3}


def test_replacing_the_model_drops_layers_chosen_by_name_and_keeps_patterns():
    """Found under Xvfb: after importing another model into a project, its CPU head (`Log_0`) and int16 layers stayed
    set: refused at compile ("matches no layer"), or worse, applied to another model's `Conv_3`."""
    from qbstudio.state.model_fit import fit_to_model

    settings = CompileSettings()
    settings.set("cpuLayers", {"head": ["Log_0"], "tail": []})
    settings.set("bit.layerOverrides.activation16Bits", ["Conv_3", "*Softmax*"])
    settings.set("calibration.layerOverrides", {"Conv_1": {"mode": 1}, "*/head/*": {"mode": 2}})
    source = CalibrationSource(path=None)
    audio = [InputSpec("input", (1, 16000), np.dtype("float32"), "")]
    image = [InputSpec("x", (1, 64, 64, 1), np.dtype("float32"), "NHWC")]
    assert fit_to_model(settings, source, audio, audio) == []  # a project reopened as it was (no model imported)
    notes = fit_to_model(settings, source, image, audio, source="/models/emotion.tflite")
    assert settings.get("cpuLayers") == {"head": [], "tail": []}
    assert settings.int16_layers == ["*Softmax*"]
    assert list(settings.get("calibration.layerOverrides")) == ["*/head/*"]
    assert any("Log_0" in note and "CPU head" in note for note in notes)
    assert any("Conv_3" in note for note in notes) and any("Conv_1" in note for note in notes)


def test_fit_to_model_resets_normalization_chosen_for_another_channel_count():
    """The sample's one-value Fashion-MNIST mean/std would otherwise normalize a photo model's input."""
    from qbstudio.state.calibration import PreprocessForm
    from qbstudio.state.model_fit import fit_to_model

    fashion = PreprocessForm(apply=True, normalize=True, mean=[0.286041], std=[0.353024]).to_preprocessing()
    gray = [InputSpec("image", (1, 1, 28, 28), np.dtype("float32"), "NCHW")]
    rgb = [InputSpec("input_1", (1, 256, 256, 3), np.dtype("float32"), "NHWC")]
    rgb_other = [InputSpec("input_1", (1, 192, 192, 3), np.dtype("float32"), "NHWC")]
    settings = CompileSettings()
    settings.set("preprocessing", fashion)
    notes = fit_to_model(settings, CalibrationSource(), rgb, gray)
    assert not settings.preprocessing["pipeline"]
    assert any(note.startswith("Preprocessing reset") for note in notes)
    settings.set("preprocessing", fashion)
    assert fit_to_model(settings, CalibrationSource(), rgb_other, rgb) == []  # same channels: kept
    assert settings.preprocessing == fashion


def test_a_preprocessing_reset_also_turns_off_the_uint8_input_its_preset_chose():
    """Found under Xvfb: the ImageNet pipeline preset (uint8 input, normalization fused) chosen for MobileNetV2 was
    reset when a 256x256 pose model replaced it, but the uint8 input stayed on for the new model."""
    from qbstudio.state.calibration import pipeline_preset
    from qbstudio.state.model_fit import fit_to_model

    preprocessing, uint8 = pipeline_preset("classification_torchvision")
    settings = CompileSettings()
    settings.set("preprocessing", preprocessing)
    settings.set("uint8Input.apply", uint8)
    rgb = [InputSpec("input", (1, 3, 224, 224), np.dtype("float32"), "NCHW")]
    pose = [InputSpec("input_1", (1, 256, 256, 3), np.dtype("float32"), "NHWC")]
    notes = fit_to_model(settings, CalibrationSource(), pose, rgb)
    assert uint8 and not settings.config.uint8_input.apply and not settings.preprocessing["pipeline"]
    assert any(note.startswith("Preprocessing reset (and uint8 model input off)") for note in notes)


def test_fit_to_model_keeps_a_folder_of_raw_images_for_another_image_model(tmp_path):
    """Raw photos feed any one-image model through the pipeline: replacing a 224x224 classifier by a 256x256 NHWC
    model keeps the folder (and says so); a folder of .npy arrays made for the old shape, a model with a second
    input or a gray model's images for a colour model clear it."""
    from qbstudio.state.model_fit import fit_to_model

    photos, arrays = tmp_path / "photos", tmp_path / "arrays"
    photos.mkdir()
    arrays.mkdir()
    (photos / "a.JPG").write_bytes(b"")
    (arrays / "a.npy").write_bytes(b"")
    rgb = [InputSpec("input", (1, 3, 224, 224), np.dtype("float32"), "NCHW")]
    nhwc = [InputSpec("input_1", (1, 256, 256, 3), np.dtype("float32"), "NHWC")]
    two = [*nhwc, InputSpec("mask", (1, 16), np.dtype("float32"), "")]
    source = CalibrationSource(path=str(photos))
    notes = fit_to_model(CompileSettings(), source, nhwc, rgb)
    assert source.path == str(photos) and any(note.startswith("Calibration data kept") for note in notes)
    gray = [InputSpec("image", (1, 1, 28, 28), np.dtype("float32"), "NCHW")]
    for path, specs, previous in ((arrays, nhwc, rgb), (photos, two, rgb), (photos, rgb, gray)):
        source = CalibrationSource(path=str(path))
        notes = fit_to_model(CompileSettings(), source, specs, previous)
        assert source.path is None and any(note.startswith("Calibration data cleared") for note in notes)
    classes = tmp_path / "classes"  # photos in class subfolders, as the calibration reader reads them
    (classes / "cat").mkdir(parents=True)
    (classes / "cat" / "a.jpg").write_bytes(b"")
    source = CalibrationSource(path=str(classes))
    fit_to_model(CompileSettings(), source, nhwc, rgb)
    assert source.path == str(classes)


def test_an_imported_transformers_folder_brings_its_image_processor_as_the_pipeline(tmp_path):
    """Found under Xvfb: a ViT folder with its preprocessor_config.json, calibrated on photos, was "no preprocessing
    pipeline is given"; the model's own processor (resize 64x64, mean/std 0.5) is now the pipeline."""
    import json

    from qbstudio.state.model_fit import fit_to_model

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "do_resize": True, "size": {"height": 64, "width": 64}, "resample": 2, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    vit = [InputSpec("pixel_values", (1, 3, 64, 64), np.dtype("float32"), "NCHW")]
    settings = CompileSettings()
    notes = fit_to_model(settings, CalibrationSource(), vit, None, source=str(tmp_path))
    ops = [step["op"] for step in settings.preprocessing["pipeline"]]
    assert settings.preprocessing["apply"] and ops == ["colorConvert", "resize", "normalize"]
    assert notes[0].startswith("Preprocessing from the folder's preprocessor_config.json")
    assert fit_to_model(settings, CalibrationSource(), vit, vit, source=str(tmp_path)) == []  # set: kept
    other = CompileSettings()
    assert fit_to_model(other, CalibrationSource(), vit, None) == []  # a project reopened as it was
    pinned = [InputSpec("pixel_values", (1, 3, 96, 96), np.dtype("float32"), "NCHW")]
    notes = fit_to_model(other, CalibrationSource(), pinned, None, source=str(tmp_path))
    assert not other.preprocessing["apply"] and "another size" in notes[0]


def test_a_project_open_twice_keeps_both_windows_runs_numbered_apart(tmp_path):
    """Two windows on one project (s16): a sweep point of one and a compile of the other both took id 1 (a sweep's
    points have no run folder to claim); each save keeps the other's run under a free id, once, and a run deleted
    here is not taken back from the file."""
    Project.new("p", tmp_path / "p.qbstudio").save(tmp_path / "p.qbproj")
    first, second = Project.load(tmp_path / "p.qbproj"), Project.load(tmp_path / "p.qbproj")
    first.runs.add(RunRecord(1, "t", "aries-rb", ["single"], str(tmp_path / "sweeps/a.mxq"), 1, {}))
    first.save()
    second.runs.add(RunRecord(first.runs.next_id() - 1, "t", "regulus-rb", ["single"], str(first.run_dir(1)), 1, {}))
    second.save()
    assert second.adopted_run_ids == [2]
    assert [(run.run_id, run.device) for run in second.runs.runs] == [(1, "regulus-rb"), (2, "aries-rb")]
    first.save()
    assert first.adopted_run_ids == [2] and len(first.runs) == 2
    second.save()
    assert second.adopted_run_ids == [] and len(Project.load(tmp_path / "p.qbproj").runs) == 2
    second.runs.remove(2)
    second.save()
    assert second.adopted_run_ids == [] and len(Project.load(tmp_path / "p.qbproj").runs) == 1
