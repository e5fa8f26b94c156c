"""The qbcompiler CLI: results, the one-line error contract, JSONL, and no partial output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from compiler_core.cli import run

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "resources" / "samples" / "fashion_cnn" / "model.onnx"


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = run(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected exactly one error line, got: {err!r}"
    assert lines[0].startswith("ERROR [")
    return lines[0]


def test_parse_and_info(capsys, tmp_path):
    code, out, _ = _cli(capsys, "parse", "--model", str(SAMPLE), "--output", str(tmp_path / "s.mblt"),
                        "--target-device", "regulus-ra")
    assert code == 0
    assert "13 nodes" in out and "13 supported" in out
    code, out, _ = _cli(capsys, "info", "--mblt", str(tmp_path / "s.mblt"))
    info = json.loads(out)
    assert info["nodes"] == 13 and info["provenance"]["backend"] == "onnx"
    assert "BatchNormalization" not in info["ops"]


def test_check_table_and_json(capsys, tmp_path):
    assert _cli(capsys, "parse", "--model", str(SAMPLE), "-o", str(tmp_path / "s.mblt"))[0] == 0
    code, out, _ = _cli(capsys, "check", "--mblt", str(tmp_path / "s.mblt"), "--target-device", "aries-rb", "--all")
    assert code == 0 and "Conv_0" in out and "13 supported" in out
    assert out.rstrip().endswith("fit: every layer tiles within a core's 4,096 KiB")  # it said nothing of the fit
    code, out, _ = _cli(capsys, "check", "--model", str(SAMPLE), "--target-device", "regulus-rb", "--json")
    report = json.loads(out)
    assert report["device"] == "regulus-rb" and len(report["nodes"]) == 13 and report["fit_checked"]


def test_presets_and_dump_config(capsys, tmp_path):
    code, out, _ = _cli(capsys, "presets")
    assert code == 0 and "classification_torchvision" in out
    code, _, _ = _cli(capsys, "dump-config", "--output", str(tmp_path / "c.yaml"), "--preset", "detection")
    assert code == 0 and "calibration" in (tmp_path / "c.yaml").read_text()


def _bad_models(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "truncated.onnx").write_bytes(SAMPLE.read_bytes()[:5000])
    (tmp_path / "notonnx.onnx").write_text("this is a text file\n")
    onnx.save(onnx.load(str(SAMPLE)), str(tmp_path / "ext.onnx"), save_as_external_data=True,
              location="ext.bin", size_threshold=0)
    (tmp_path / "ext.bin").unlink()
    unknown = helper.make_model(helper.make_graph(
        [helper.make_node("MyCustomOp", ["x"], ["y"], domain="acme")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("acme", 1)])
    onnx.save(unknown, str(tmp_path / "unknown.onnx"))
    dynamic = onnx.load(str(SAMPLE))
    dynamic.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "width"
    onnx.save(dynamic, str(tmp_path / "dynamic.onnx"))
    (tmp_path / "unknown_key.yaml").write_text("calibration:\n  mode: 1\n  maxPercentil: {percentile: 0.999}\n")
    (tmp_path / "wrong_type.json").write_text('{"calibration": {"mode": "fast"}}')
    return {name: tmp_path / f"{name}.onnx" for name in ("truncated", "notonnx", "ext", "unknown", "dynamic")}


BAD_CASES = {
    "missing": (["--model", "{tmp}/absent.onnx"], "MODEL_LOAD_ERROR", "does not exist"),
    "truncated": (["--model", "{tmp}/truncated.onnx"], "MODEL_LOAD_ERROR", "truncated"),
    "notonnx": (["--model", "{tmp}/notonnx.onnx"], "MODEL_LOAD_ERROR", "notonnx.onnx"),
    "external": (["--model", "{tmp}/ext.onnx"], "MODEL_LOAD_ERROR", "ext.bin"),
    "unknown_op": (["--model", "{tmp}/unknown.onnx"], "UNSUPPORTED_OPS", "acme::MyCustomOp"),
    "dynamic": (["--model", "{tmp}/dynamic.onnx"], "DYNAMIC_SHAPE", "width"),
    "unknown_key": (["--model", str(SAMPLE), "--compile-config", "{tmp}/unknown_key.yaml"], "CONFIG_ERROR",
                    "maxPercentil"),
    "wrong_type": (["--model", str(SAMPLE), "--compile-config", "{tmp}/wrong_type.json"], "CONFIG_ERROR",
                   "calibration.mode"),
    "device": (["--model", str(SAMPLE), "--target-device", "REGULUS"], "ARGUMENT_ERROR", "regulus-ra"),
    "bad_flag": (["--model", str(SAMPLE), "--frobnicate"], "ARGUMENT_ERROR", "frobnicate"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_one_error_line_no_output(capsys, tmp_path, case):
    _bad_models(tmp_path)
    argv, code_name, needle = BAD_CASES[case]
    out_dir = tmp_path / "out"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, _, err = _cli(capsys, "parse", *argv, "--output", str(out_dir / "m.mblt"))
    line = _error_line(err)
    assert code != 0
    assert line.startswith(f"ERROR [{code_name}]: "), line
    assert needle in line
    assert not out_dir.exists() or not any(out_dir.iterdir())


def test_jsonl_channel(tmp_path):
    env = {**__import__("os").environ, "QBCOMPILER_JSONL": "1"}
    result = subprocess.run([sys.executable, "-m", "compiler_core", "parse", "--model", str(SAMPLE),
                             "-o", str(tmp_path / "s.mblt"), "--target-device", "aries-rb"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = {line["type"] for line in lines}
    assert "progress" in kinds and lines[-1]["type"] == "result"
    assert lines[-1]["nodes"] == 13 and lines[-1]["support"]["supported"] == 13
    failed = subprocess.run([sys.executable, "-m", "compiler_core", "parse", "--model", str(tmp_path / "x.onnx")],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    last = json.loads(failed.stdout.splitlines()[-1])
    assert failed.returncode == 1 and last["type"] == "error" and last["code"] == "MODEL_LOAD_ERROR"


def test_console_script_usage_error():
    exe = Path(sys.executable).with_name("qbcompiler")
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("ERROR [ARGUMENT_ERROR]: No command given.")


def _dynamic_conv(tmp_path: Path) -> Path:
    """A small Conv model whose height and width are dynamic (``h``, ``w``)."""
    import numpy as np

    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.random.default_rng(0).standard_normal(108))
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"])], "dyn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    path = tmp_path / "dynamic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("source", ["config", "flag"])
def test_compile_takes_the_input_shape_from_the_config_file_or_the_flag(capsys, tmp_path, source):
    model = _dynamic_conv(tmp_path)
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"inputShapeDict": {"x": [1, 3, 16, 24]}} if source == "config" else {}))
    extra = ["--input-shape", "x=1,3,16,24"] if source == "flag" else []
    code, out, err = _cli(capsys, "compile", "--model", str(model), "--target-device", "aries-rb",
                          "--use-random-calib", "--compile-config", str(config), "--output", str(tmp_path / "m.mxq"),
                          *extra)
    assert code == 0, err
    from compiler_core.runtime import Model

    assert Model(str(tmp_path / "m.mxq")).program.inputs[0].shape == [1, 3, 16, 24]


def test_compile_without_a_shape_names_the_dynamic_input(capsys, tmp_path):
    code, _, err = _cli(capsys, "compile", "--model", str(_dynamic_conv(tmp_path)), "--target-device", "aries-rb",
                        "--use-random-calib", "--output", str(tmp_path / "m.mxq"))
    assert code == 1 and "DYNAMIC_SHAPE" in _error_line(err) and "'x'" in err


def test_output_names_end_the_graph_early_in_parse_and_compile(capsys, tmp_path):
    import onnx

    middle = onnx.load(str(SAMPLE)).graph.node[3].output[0]
    code, out, _ = _cli(capsys, "parse", "--model", str(SAMPLE), "-o", str(tmp_path / "cut.mblt"),
                        "--output-names", middle)
    assert code == 0
    assert [value.name for value in onnx.load(str(tmp_path / "cut.mblt")).graph.output] == [middle]
    code, _, _ = _cli(capsys, "compile", "--model", str(SAMPLE), "-o", str(tmp_path / "cut.mxq"),
                      "--target-device", "aries-rb", "--use-random-calib", "--output-names", middle)
    assert code == 0
    from compiler_core.runtime import Model
    assert [spec.name for spec in Model(str(tmp_path / "cut.mxq")).program.outputs] == [middle]
    code, _, err = _cli(capsys, "parse", "--model", str(SAMPLE), "-o", str(tmp_path / "x.mblt"), "--output-names", "nope")
    assert code != 0 and "ERROR [ARGUMENT_ERROR]" in _error_line(err)


@pytest.mark.parametrize(("verdict", "hinted"), [("ok", False), ("warn", True), ("flag", True)])
def test_a_compile_below_the_usual_accuracy_says_what_to_try(verdict, hinted):
    from compiler_core.cli import _compile_text

    payload = {"output": "m.mxq", "size_bytes": 1000, "device": "aries-rb", "core_modes": ["single"], "seconds": 1.0,
               "samples": {"calibration": 16, "holdout": 4}, "program": {"operations": 7, "int16_tensors": 0},
               "statistics_from_cache": False, "cpu_offload": None, "analysis_file": None, "config_file": None,
               "outputs": {"y": {"sqnr_db": 18.7, "cosine_mean": 0.995, "verdict": verdict}}}
    text = _compile_text(payload)
    assert ("--mixed-precision" in text and "a16w8" in text) is hinted
    suited = {"name": "transformer_encoder", "why": "attention layers (Softmax, MatMul, LayerNormalization) over token "
                                                     "inputs"}
    text = _compile_text({**payload, "suited_preset": suited, "config_preset": None})
    assert ("--config-preset transformer_encoder" in text and "--mixed-precision" in text) is hinted
    text = _compile_text({**payload, "suited_preset": suited, "config_preset": "transformer_encoder"})
    assert "--config-preset transformer_encoder" not in text  # used already: the general hint
    suited = {"name": "classification", "why": "class scores computed from an image",
              "covers": ["classification_torchvision"]}
    text = _compile_text({**payload, "suited_preset": suited, "config_preset": "classification_torchvision"})
    assert "--config-preset classification" not in text  # a preset that includes it was used
    text = _compile_text({**payload, "config_preset": "a16w8"})
    assert "--config-preset a16w8" not in text and ("a16w16" in text) is hinted  # not the preset it just used
    text = _compile_text({**payload, "config_preset": "a16w16", "analysis": {"worst_layers": ["Log_0", "Max_0"]}})
    assert "--config-preset" not in text  # all int16 already (openWakeWord's log-mel was told to try a16w16 again)
    assert ("Log_0" in text and "--cpu-head" in text) is hinted
    loss = {"layer": "Log_0", "op": "Log", "sqnr_db": 5.3, "input_sqnr_db": 52.6}  # openWakeWord's log-mel, a16w8
    text = _compile_text({**payload, "config_preset": "a16w8", "range_loss": loss})
    assert ("--cpu-head Log_0" in text and "a16w16" not in text) is hinted  # no bit width helps: the CPU does
    all_int16 = {**payload["program"], "tensors": 9, "int16_tensors": 9}
    text = _compile_text({**payload, "config_preset": "ocr", "program": all_int16})
    assert "a16w8" not in text and ("a16w16" in text) is hinted  # ocr is int16 activations (PP-OCRv5 was told a16w8)
    quiet = {"y": {**payload["outputs"]["y"], "quiet_probability": True}}
    text = _compile_text({**payload, "outputs": quiet})
    assert "hint" not in text and "stays near 0" in text  # a score that never fired: no precision hint


def test_a_compile_on_random_data_says_its_figures_mean_nothing_instead_of_what_to_try(tmp_path, capsys):
    code, out, _ = _cli(capsys, "compile", "--model", str(SAMPLE), "-o", str(tmp_path / "r.mxq"),
                        "--target-device", "aries-rb", "--use-random-calib")
    assert code == 0 and "random data" in out and "--calib-data-path" in out and "--mixed-precision" not in out


def test_run_ranks_scores_with_singleton_dimensions():
    import numpy as np

    from compiler_core.runtime.inputs import top_k as _top_k

    scores = np.zeros((1, 10, 1, 1), np.float32)
    scores[0, 7] = 1.0
    assert _top_k(scores, 3, None)["top_k"][0]["index"] == 7
    assert _top_k(scores.reshape(1, 1, 1, 10), 1, None)["top_k"][0]["index"] == 7
    assert _top_k(np.zeros((1, 4, 8, 8), np.float32), 3, None) == {}  # a feature map is not scores


def test_compile_calibrates_a_token_model_on_text(tmp_path, capsys):
    """--calib-text: sentences through the tokenizer into the model's token inputs (a small embedding model here)."""
    import numpy as np
    import onnx
    import realmodels
    from onnx import TensorProto, helper, numpy_helper

    try:
        tokenizer = realmodels.minilm_dir()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))
    table = np.random.default_rng(0).standard_normal((30522, 8)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["embedded"]),
             helper.make_node("Relu", ["embedded"], ["y"])]
    graph = helper.make_graph(nodes, "tokens", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8])],
                              [numpy_helper.from_array(table, "table")])
    model = tmp_path / "tokens.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(model))
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(realmodels.SENTENCES * 3), encoding="utf-8")
    args = ["compile", "--model", str(model), "--calib-text", str(text), "--target-device", "aries-rb",
            "-o", str(tmp_path / "tokens.mxq")]
    code, _, err = _cli(capsys, *args)
    assert code != 0 and "--calib-text needs the model's tokenizer" in err  # an .onnx file has none of its own
    code, out, _ = _cli(capsys, *args, "--tokenizer", str(tokenizer))
    assert code == 0 and (tmp_path / "tokens.mxq").is_file()
    assert f"calibrated on {len(realmodels.SENTENCES) * 3 - 4} samples" in out  # 4 held out for the analysis
    code, _, err = _cli(capsys, *args, "--tokenizer", str(tokenizer), "--calib-data-path", str(tmp_path))
    assert code != 0 and "give one of them" in err


def test_milliseconds_keep_their_digits_for_tiny_models():
    """A toy model's estimate read "0.000 ms per inference"."""
    from compiler_core.cli import _ms

    assert [_ms(value) for value in (0.3471, 12.5, 0.0, 0.00014)] == ["0.347", "12.500", "0.000", "0.00014"]


def test_an_in_process_run_leaves_the_library_loggers_as_it_found_them():
    """``run`` set onnx_ir / onnxscript to ERROR for good: a later workbench log in the same process showed none of
    their warnings (found by a clean-clone CI whose test order put an in-process CLI run first)."""
    import logging

    from compiler_core.cli import run

    logger = logging.getLogger("onnx_ir")
    before = logger.level
    logger.setLevel(logging.INFO)
    try:
        run(["presets"])
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(before)
