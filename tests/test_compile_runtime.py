"""End-to-end compile to MXQ and the simulator runtime: CLI, devices, bit-exactness, cancel, JSONL, CPU offload.

Every model is compiled once per module (module-scoped fixtures, one statistics cache per module, so
the devices after the first reuse the calibration). Container integrity has its own tests
(``test_mxq_container.py``); here a *real* compiled MXQ goes through ``qbcompiler validate``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from compiler_core.api import mblt_compile, mxq_compile
from compiler_core.cli import run
from compiler_core.config import CompileConfig
from compiler_core.errors import (
    ArgumentError,
    CalibrationError,
    CancelledError,
    QBCompilerError,
    UnsupportedOpsError,
)
from compiler_core.fileio import sha256_file
from compiler_core.mxq import read_mxq
from compiler_core.progress import CancelToken, ProgressEvent
from compiler_core.quantization import executor
from compiler_core.runtime import Accelerator, Model, ModelConfig, get_model_summary
from compiler_core.runtime.inputs import load_run_inputs
from compiler_core.targets import list_devices

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"
SAMPLE = SAMPLE_DIR / "model.onnx"
SAMPLE_CONFIG = SAMPLE_DIR / "compile_config.yaml"
ARIES_MODES = ["single", "multi", "global4", "global8"]
JSONL_KINDS = {"status", "progress", "log", "result", "error"}
# The compile pipeline's stages in order (the names the progress callback and the JSONL channel carry).
PIPELINE_STAGES = ["load", "canonicalize", "check", "calibrate", "quantize", "analyze", "schedule", "write mxq"]
CANCEL_LATENCY_S = 1.0
MOBILENET_CALIB_PHOTOS = 16
MOBILENET_EVAL_PHOTOS = 2
MINILM_CALIB_SENTENCES = 8


def _real(builder: Callable, *args):
    """Build a real model or data set, or skip with the install line that fixes it."""
    import realmodels

    try:
        return builder(*args)
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))


def _run_cli(*argv) -> int:
    """``qbcompiler`` in-process; the root logger is restored afterwards (``run`` replaces its handlers)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return run([str(arg) for arg in argv])
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = _run_cli(*argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _files(folder: Path) -> list[str]:
    """Every file in ``folder``, hidden ``.part`` leftovers included."""
    return sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []


def _launched(path: Path, config: ModelConfig | None = None, **options) -> Model:
    model = Model(path, config, **options)
    model.launch(Accelerator(model.artifact.device))
    return model


def _sample_feeds(mxq: Path, count: int = 20) -> list[np.ndarray]:
    """The sample's test images, preprocessed as its calibration data was (NCHW float32)."""
    artifact = Model(mxq).artifact
    feeds = [feed["image"] for _, feed in load_run_inputs(artifact, [str(SAMPLE_DIR / "test")])]
    return feeds[:count]


def _nhwc(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array.transpose(0, 2, 3, 1))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# -- module fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def statistics_cache(tmp_path_factory):
    """A statistics cache of this module's own (subprocesses inherit it through the environment)."""
    folder = tmp_path_factory.mktemp("statistics-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QBCOMPILER_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="module")
def sample_mblt(tmp_path_factory) -> Path:
    return mblt_compile(SAMPLE, tmp_path_factory.mktemp("sample") / "model.mblt")


@pytest.fixture(scope="module")
def sample_cli(tmp_path_factory) -> dict[str, Path]:
    """The sample compiled with ``qbcompiler compile`` (analysis and resolved config written)."""
    folder = tmp_path_factory.mktemp("sample-cli")
    paths = {"mxq": folder / "fashion.mxq", "config": folder / "resolved.json", "folder": folder}
    code = _run_cli("compile", "--model", SAMPLE, "--target-device", "aries-rb", "--calib-data-path",
                    SAMPLE_DIR / "calib", "--compile-config", SAMPLE_CONFIG, "--output", paths["mxq"],
                    "--config-save-path", paths["config"], "-q")
    assert code == 0
    return paths


@pytest.fixture(scope="module")
def sample_all_modes(sample_mblt, tmp_path_factory):
    """The sample compiled for every ARIES core mode."""
    return mxq_compile(sample_mblt, "aries-rb", SAMPLE_DIR / "calib", tmp_path_factory.mktemp("all") / "all.mxq",
                       compile_config=SAMPLE_CONFIG, inference_scheme="all")


@pytest.fixture(scope="module")
def softmax_model(tmp_path_factory) -> Path:
    """The sample with a trailing Softmax over its logits (the MFU-less regulus-ra cannot run it)."""
    model = onnx.load(str(SAMPLE))
    logits = model.graph.output[0]
    dims = [dim.dim_value for dim in logits.type.tensor_type.shape.dim]
    model.graph.node.append(helper.make_node("Softmax", [logits.name], ["probabilities"], axis=-1,
                                             name="tail_softmax"))
    model.graph.output.remove(logits)
    model.graph.output.append(helper.make_tensor_value_info("probabilities", onnx.TensorProto.FLOAT, dims))
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path_factory.mktemp("softmax") / "fashion_softmax.onnx"
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory) -> dict:
    """MobileNetV2 parsed once and compiled through the API from its MBLT, with photo calibration."""
    import realdata
    import realmodels

    source = _real(realmodels.mobilenet_v2_onnx)
    calib, evaluation = _real(realdata.imagenet_photo_sets, MOBILENET_CALIB_PHOTOS, MOBILENET_EVAL_PHOTOS)
    folder = tmp_path_factory.mktemp("mobilenet")
    config = folder / "compile_config.json"  # preprocessing as at run time; analysis is covered by the sample
    config.write_text(json.dumps({"preprocessing": realdata.IMAGENET_PREPROCESSING, "analysisHoldout": 0}))
    mblt = mblt_compile(source, folder / "mobilenet_v2.mblt")
    result = mxq_compile(mblt, "aries-rb", calib, folder / "api.mxq", compile_config=config)
    photos = realdata.imagenet_tensors(evaluation)[:MOBILENET_EVAL_PHOTOS]
    golden = [executor.run_codes(result.quantize.model, {"input": photo[None]})["logits"] for photo in photos]
    return {"source": source, "mblt": mblt, "calib": calib, "config": config, "folder": folder,
            "result": result, "photos": photos, "golden": golden}


@pytest.fixture(scope="module")
def mobilenet_cli(mobilenet) -> Path:
    """``qbcompiler compile --model mobilenet_v2.onnx --target-device aries-rb --calib-data-path DIR``."""
    output = mobilenet["folder"] / "cli" / "m.mxq"
    code = _run_cli("compile", "--model", mobilenet["source"], "--target-device", "aries-rb", "--calib-data-path",
                    mobilenet["calib"], "--compile-config", mobilenet["config"], "--output", output, "-q")
    assert code == 0
    return output


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> dict:
    """all-MiniLM-L6-v2 (S=128) parsed once and compiled for aries-rb with the transformer_encoder preset."""
    import realdata
    import realmodels

    source = _real(realmodels.minilm_onnx, 128)
    manifest = _real(realdata.minilm_calibration_manifest, MINILM_CALIB_SENTENCES)
    folder = tmp_path_factory.mktemp("minilm")
    mblt = mblt_compile(source, folder / "minilm.mblt")
    options = {"config_preset": "transformer_encoder", "analysis_holdout": 0}
    result = mxq_compile(mblt, "aries-rb", manifest, folder / "aries.mxq", **options)
    return {"mblt": mblt, "manifest": manifest, "folder": folder, "result": result, "options": options}


# -- the sample on every device, core modes ------------------------------------------------------


@pytest.mark.parametrize("device", list_devices())
def test_every_device_compiles_the_sample_and_runs_it_bit_exactly(sample_mblt, tmp_path, device):
    result = mxq_compile(sample_mblt, device, SAMPLE_DIR / "calib", tmp_path / "s.mxq", compile_config=SAMPLE_CONFIG)
    assert (result.device, result.core_modes) == (device, ["single"])
    model = _launched(result.mxq_path)
    image = _sample_feeds(result.mxq_path, 1)[0]
    codes = model.infer(_nhwc(image), raw=True)[0]
    np.testing.assert_array_equal(codes, executor.run_codes(result.quantize.model, {"image": image})["logits"])


def test_scheme_all_compiles_four_modes_on_aries_and_each_launches(sample_all_modes):
    assert sample_all_modes.core_modes == ARIES_MODES
    summary = get_model_summary(sample_all_modes.mxq_path)
    assert summary["core_modes"] == ARIES_MODES and sorted(summary["schedule"]) == sorted(ARIES_MODES)
    setters = {"single": "set_single_core_mode", "multi": "set_multi_core_mode",
               "global4": "set_global4_core_mode", "global8": "set_global8_core_mode"}
    latency = {}
    for mode, setter in setters.items():
        config = ModelConfig()
        getattr(config, setter)()
        model = _launched(sample_all_modes.mxq_path, config)
        assert model.core_mode == mode
        latency[mode] = model.estimate()["latency_ms"]
    print(f"\nsample cost-model latency per core mode (ms): {latency}")
    # more cores on one input: lower latency; one-core modes keep activations in SRAM (the global modes do
    # not yet), so on a model this small single is not slower than global4 (docs/cost-model.md)
    assert latency["global8"] < latency["global4"] and all(value > 0 for value in latency.values())


def test_scheme_all_narrows_to_single_on_regulus(sample_mblt, tmp_path):
    result = mxq_compile(sample_mblt, "regulus-rb", SAMPLE_DIR / "calib", tmp_path / "r.mxq",
                         compile_config=SAMPLE_CONFIG, inference_scheme="all")
    assert result.core_modes == ["single"] == get_model_summary(result.mxq_path)["core_modes"]


def test_multi_on_regulus_is_an_argument_error_and_writes_nothing(sample_mblt, tmp_path):
    with pytest.raises(ArgumentError, match="regulus-rb.*allowed: single"):
        mxq_compile(sample_mblt, "regulus-rb", SAMPLE_DIR / "calib", tmp_path / "out" / "r.mxq",
                    compile_config=SAMPLE_CONFIG, inference_scheme="multi")
    assert _files(tmp_path / "out") == []


# -- runtime behaviour ---------------------------------------------------------------------------


def test_launch_on_the_wrong_device_names_both_devices(sample_cli):
    model = Model(sample_cli["mxq"])
    with pytest.raises(ArgumentError, match="compiled for aries-rb, not regulus-rb") as caught:
        model.launch(Accelerator("regulus-rb"))
    assert "Accelerator('aries-rb')" in caught.value.hint


def test_core_mode_not_compiled_names_the_compiled_modes(sample_cli):
    config = ModelConfig()
    config.set_global8_core_mode()
    with pytest.raises(ArgumentError, match=r"not compiled for the global8 core mode \(compiled modes: single\)"):
        Model(sample_cli["mxq"], config).launch(Accelerator("aries-rb"))


def test_nhwc_default_and_nchw_layout_give_identical_outputs(sample_cli):
    nhwc, nchw = _launched(sample_cli["mxq"]), _launched(sample_cli["mxq"], input_layout="NCHW")
    images = _sample_feeds(sample_cli["mxq"], 4)
    for image in images:
        from_nhwc = nhwc.infer(_nhwc(image))[0]
        np.testing.assert_array_equal(from_nhwc, nchw.infer(image)[0])
        np.testing.assert_array_equal(from_nhwc, executor.run(nhwc.program, {"image": image})["logits"])
    assert from_nhwc.dtype == np.float32 and from_nhwc.shape == (1, 10)


@pytest.mark.parametrize(("layout", "given", "words"), [
    ("NHWC", (1, 1, 28, 28), ["[1, 1, 28, 28]", "expected [1, 28, 28, 1] (NHWC)", "input_layout='NCHW'"]),
    ("NCHW", (1, 28, 28, 1), ["[1, 28, 28, 1]", "expected [1, 1, 28, 28] (NCHW)"]),
    ("NHWC", (1, 28, 28), ["[1, 28, 28]", "expected [1, 28, 28, 1]"]),
])
def test_a_wrong_shape_names_expected_and_given(sample_cli, layout, given, words):
    model = _launched(sample_cli["mxq"], input_layout=layout)
    with pytest.raises(ArgumentError) as caught:
        model.infer(np.zeros(given, np.float32))
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_infer_before_launch_and_wrong_input_count_are_argument_errors(sample_cli):
    model = Model(sample_cli["mxq"])
    with pytest.raises(ArgumentError, match="not launched"):
        model.infer(np.zeros((1, 28, 28, 1), np.float32))
    model.launch(Accelerator("aries-rb"))
    with pytest.raises(ArgumentError, match="takes 1 input"):
        model.infer([np.zeros((1, 28, 28, 1), np.float32)] * 2)
    model.dispose()
    with pytest.raises(ArgumentError, match="not launched"):
        model.infer(np.zeros((1, 28, 28, 1), np.float32))


def test_model_summary_fields_and_info_command(sample_cli, capsys):
    mxq = sample_cli["mxq"]
    summary = get_model_summary(mxq)
    assert (summary["device"], summary["core_modes"]) == ("aries-rb", ["single"])
    assert summary["file_size"] == mxq.stat().st_size
    (image,) = summary["inputs"]
    assert image["name"] == "image" and image["dtype"] == "float32" and image["layout"] == "NHWC"
    assert image["shape_nhwc"] == [1, 28, 28, 1] and image["shape_nchw"] == [1, 1, 28, 28]
    assert image["scale"] > 0 and image["code_dtype"] == "int8"
    assert [output["shape_nchw"] for output in summary["outputs"]] == [[1, 10]]
    assert summary["layers"] and all(layer["precision"] for layer in summary["layers"])
    assert sum(layer["const_bytes"] for layer in summary["layers"]) == summary["program"]["const_bytes"] > 0
    assert summary["provenance"]["source_sha256"] == sha256_file(SAMPLE)
    assert summary["compiler_version"] and summary["schedule"]["single"]["latency_ms"] > 0
    code, out, _ = _cli(capsys, "info", "--mxq", mxq)
    assert code == 0 and json.loads(out)["layers"] == json.loads(json.dumps(summary["layers"]))


def test_cli_run_prints_top_k_with_labels_and_saves_npy(sample_cli, tmp_path, capsys):
    labels = (SAMPLE_DIR / "labels.txt").read_text().splitlines()
    code, out, _ = _cli(capsys, "run", "--mxq", sample_cli["mxq"], "--input", SAMPLE_DIR / "test", "--labels",
                        SAMPLE_DIR / "labels.txt", "--top-k", "3", "--output-dir", tmp_path)
    assert code == 0
    result_lines = [line for line in out.splitlines() if "top-k:" in line]
    tests = sorted((SAMPLE_DIR / "test").glob("*.png"))
    assert len(result_lines) == len(tests) == 20
    model = _launched(sample_cli["mxq"], input_layout="NCHW")
    for path, line, image in zip(tests, result_lines, _sample_feeds(sample_cli["mxq"])):
        saved = np.load(tmp_path / f"{path.stem}.logits.npy")
        np.testing.assert_array_equal(saved, model.infer(image)[0])
        listed = [item.rsplit(" (", 1)[0] for item in line.split("top-k: ", 1)[1].split("), ")]
        assert line.split(": ", 1)[0].endswith(path.name) and listed == [labels[i] for i in np.argsort(-saved.ravel())[:3]]


def test_analysis_json_is_written_beside_the_mxq(sample_cli):
    analysis = json.loads(sample_cli["mxq"].with_suffix(".analysis.json").read_text())
    logits = analysis["outputs"]["logits"]
    assert logits["samples"] == 12  # analysisHoldout of the sample's config
    assert logits["sqnr_db"] > 25 and logits["top1_agreement"] >= 0.9
    assert analysis["summary"]["verdict"] == "ok"


def test_config_save_path_writes_the_resolved_config_that_reproduces_the_compile(sample_cli, tmp_path):
    saved = json.loads(sample_cli["config"].read_text())
    config = CompileConfig.model_validate(saved)
    assert (config.target_device, config.image_channels, config.inference_scheme) == ("aries-rb", 1, "single")
    assert saved["preprocessing"]["pipeline"][0]["mean"] == [0.286041] and saved["analysisHoldout"] == 12
    again = mxq_compile(SAMPLE, calib_data_path=SAMPLE_DIR / "calib", save_path=tmp_path / "again.mxq",
                        compile_config=sample_cli["config"])
    first, second = read_mxq(sample_cli["mxq"]), read_mxq(again.mxq_path)
    assert first.program == second.program and list(first.consts) == list(second.consts)
    for name, array in first.consts.items():
        np.testing.assert_array_equal(array, second.consts[name], err_msg=name)


def test_resolved_config_records_the_paths_of_the_compile(sample_cli):
    saved = json.loads(sample_cli["config"].read_text())
    assert saved["savePaths"] == [str(sample_cli["mxq"])]
    assert saved["calibDataPaths"] == [str(SAMPLE_DIR / "calib")]


# -- JSONL machine channel -----------------------------------------------------------------------


def test_jsonl_channel_of_a_real_compile(tmp_path):
    output = tmp_path / "out" / "fashion.mxq"
    completed = subprocess.run(
        [sys.executable, "-m", "compiler_core", "compile", "--model", str(SAMPLE), "--target-device", "aries-rb",
         "--calib-data-path", str(SAMPLE_DIR / "calib"), "--compile-config", str(SAMPLE_CONFIG),
         "--output", str(output)],
        capture_output=True, text=True, env={**os.environ, "QBCOMPILER_JSONL": "1"}, cwd=ROOT, timeout=300)
    assert completed.returncode == 0, completed.stderr
    lines = [json.loads(line) for line in completed.stdout.splitlines()]  # every line is one JSON object
    assert {line["type"] for line in lines} <= JSONL_KINDS
    assert [line["type"] for line in lines].count("result") == 1 and lines[-1]["type"] == "result"
    progress = [line for line in lines if line["type"] == "progress"]
    assert all(0 <= line["done"] <= line["total"] for line in progress if line["total"])
    stages = list(dict.fromkeys(line["stage"] for line in progress))
    print(f"\nstages emitted: {stages}")
    assert [stage for stage in stages if stage in PIPELINE_STAGES] == PIPELINE_STAGES
    result = lines[-1]
    assert result["command"] == "compile" and Path(result["output"]) == output
    assert result["size_bytes"] == output.stat().st_size
    assert (result["device"], result["core_modes"]) == ("aries-rb", ["single"])
    assert Path(result["analysis_file"]).is_file() and result["outputs"]["logits"]["verdict"] == "ok"
    assert result["samples"] == {"calibration": 36, "holdout": 12, "random": False}


# -- cancel --------------------------------------------------------------------------------------


def _compile_then_cancel(compile_call: Callable, at: Callable[[ProgressEvent], bool], *,
                         hold: bool) -> tuple[BaseException | None, float, list[str]]:
    """Run ``compile_call`` in a worker thread and cancel it from this thread when ``at(event)`` first holds.

    With ``hold`` the worker waits in its callback until the cancel was sent (for stages too short to
    catch otherwise); without it the worker keeps computing while this thread cancels.

    Returns:
        The worker's exception, the seconds from ``cancel()`` to that exception, and the stages seen.
    """
    token, reached, sent = CancelToken(), threading.Event(), threading.Event()
    stages: list[str] = []
    outcome: dict = {}

    def callback(event: ProgressEvent) -> None:
        if not stages or stages[-1] != event.stage:
            stages.append(event.stage)
        if not reached.is_set() and at(event):
            reached.set()
            if hold:
                sent.wait(30)

    def work() -> None:
        try:
            compile_call(callback=callback, cancel_token=token)
        except BaseException as error:  # handed to the test thread
            outcome["error"], outcome["at"] = error, time.perf_counter()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    assert reached.wait(300), f"the cancel point never came; stages seen: {stages}"
    cancelled_at = time.perf_counter()
    token.cancel()
    sent.set()
    worker.join(60)
    assert not worker.is_alive()
    return outcome.get("error"), outcome.get("at", math.inf) - cancelled_at, stages


@pytest.mark.slow
def test_cancel_during_calibration_returns_within_a_second_and_writes_nothing(mobilenet, tmp_path, monkeypatch):
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(tmp_path / "fresh-cache"))  # calibration must really run
    output = tmp_path / "out" / "m.mxq"

    def compile_call(**progress):
        mxq_compile(mobilenet["mblt"], "aries-rb", mobilenet["calib"], output, compile_config=mobilenet["config"],
                    **progress)

    error, latency, stages = _compile_then_cancel(
        compile_call, lambda event: event.stage == "calibrate" and event.done >= 1, hold=False)
    print(f"\ncancel during calibration: {latency * 1e3:.0f} ms; stages {stages}")
    assert isinstance(error, CancelledError) and error.code == "CANCELLED", error
    assert error.fields["stage"] == "calibrate"
    assert latency < CANCEL_LATENCY_S
    assert _files(output.parent) == [] and not list((tmp_path / "fresh-cache").rglob("*.npz"))


@pytest.mark.slow
def test_cancel_mid_write_returns_within_a_second_and_keeps_the_old_file(minilm, tmp_path):
    output = tmp_path / "out" / "minilm.mxq"
    output.parent.mkdir()
    output.write_bytes(b"the previous compile")

    def compile_call(**progress):
        mxq_compile(minilm["mblt"], "aries-rb", minilm["manifest"], output, **minilm["options"], **progress)

    error, latency, stages = _compile_then_cancel(  # after the first 4 MiB chunk of constants
        compile_call, lambda event: event.stage == "write mxq" and 0 < event.done < event.total, hold=True)
    print(f"\ncancel mid-write: {latency * 1e3:.0f} ms; stages {stages}")
    assert isinstance(error, CancelledError) and error.fields["stage"] == "write mxq", error
    assert latency < CANCEL_LATENCY_S
    assert _files(output.parent) == ["minilm.mxq"] and output.read_bytes() == b"the previous compile"


def test_cancel_after_the_file_is_finalised_does_not_report_cancelled_with_a_file(sample_mblt, tmp_path):
    output = tmp_path / "s.mxq"
    token = CancelToken()

    def cancel_when_written(event: ProgressEvent) -> None:
        if event.stage == "write mxq" and event.total and event.done == event.total:
            token.cancel()

    try:
        mxq_compile(sample_mblt, "aries-rb", SAMPLE_DIR / "calib", output, compile_config=SAMPLE_CONFIG,
                    callback=cancel_when_written, cancel_token=token)
    except CancelledError:
        assert not output.exists(), "CANCELLED was raised, yet the MXQ was written"


# -- CPU offload -----------------------------------------------------------------------------------


def test_cpu_offload_runs_the_softmax_tail_on_the_cpu(softmax_model, tmp_path):
    import onnxruntime as ort

    result = mxq_compile(softmax_model, "regulus-ra", SAMPLE_DIR / "calib", tmp_path / "tail.mxq",
                         compile_config=SAMPLE_CONFIG, cpu_offload=True)
    assert result.cpu_offload["tail"] and not result.cpu_offload["head"]
    assert result.support["cpu_offloaded"] == 1 and result.support["needs_mfu"] == 0
    summary = get_model_summary(result.mxq_path)
    assert summary["cpu_offload"]["tail"] and [o["name"] for o in summary["outputs"]] == ["probabilities"]
    model = _launched(result.mxq_path, input_layout="NCHW")
    fp32 = ort.InferenceSession(str(softmax_model), providers=["CPUExecutionProvider"])
    cosines = []
    for image in _sample_feeds(result.mxq_path):
        probabilities = model.infer(image)[0]
        logits = executor.run(model.program, {"image": image})[model.program.outputs[0].name]
        exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
        np.testing.assert_allclose(probabilities, exp / exp.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-7)
        cosines.append(_cosine(probabilities, fp32.run(None, {"image": image})[0]))
    print(f"\nCPU-tail softmax vs FP32: min cosine {min(cosines):.5f} over {len(cosines)} test images")
    assert min(cosines) > 0.999
    # the compile's analysis measures the model's output through the tail, as the runtime runs it (it measured the
    # body's inner logits tensor under its internal name; found with FunASR's FSMN-VAD on regulus-ra)
    outputs = result.quantize.analysis["outputs"]
    assert list(outputs) == ["probabilities"] and outputs["probabilities"]["cosine_mean"] > 0.959
    assert outputs["probabilities"]["top1_agreement"] is not None  # class scores after the softmax


def test_without_cpu_offload_the_softmax_is_an_unsupported_ops_error(softmax_model, tmp_path):
    with pytest.raises(UnsupportedOpsError) as caught:
        mxq_compile(softmax_model, "regulus-ra", SAMPLE_DIR / "calib", tmp_path / "out" / "tail.mxq",
                    compile_config=SAMPLE_CONFIG)
    assert caught.value.code == "UNSUPPORTED_OPS" and "cpu_offload" in str(caught.value)
    assert [op["op"] for op in caught.value.fields["ops"]] == ["Softmax"]
    assert _files(tmp_path / "out") == []


# -- MobileNetV2 ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_compile_of_mobilenet_is_bit_identical_to_the_golden_executor(mobilenet, mobilenet_cli):
    model = _launched(mobilenet_cli)  # NHWC, the default
    for photo, golden in zip(mobilenet["photos"], mobilenet["golden"]):
        np.testing.assert_array_equal(model.infer(_nhwc(photo[None]), raw=True)[0], golden)


@pytest.mark.slow
def test_cli_quantize_of_the_mobilenet_mblt_is_bit_identical_to_the_golden_executor(mobilenet, capsys):
    output = mobilenet["folder"] / "quantize" / "q.mxq"
    code, out, _ = _cli(capsys, "quantize", "--mblt", mobilenet["mblt"], "--target-device", "aries-rb",
                        "--calib-data-path", mobilenet["calib"], "--compile-config", mobilenet["config"],
                        "--output", output)
    assert code == 0 and f"Wrote {output}" in out
    model = _launched(output, input_layout="NCHW")
    photo, golden = mobilenet["photos"][0], mobilenet["golden"][0]
    np.testing.assert_array_equal(model.infer(photo[None], raw=True)[0], golden)


@pytest.mark.slow
@pytest.mark.parametrize("device", [device for device in list_devices() if device != "aries-rb"])
def test_mobilenet_compiles_for_every_device(mobilenet, device):
    result = mxq_compile(mobilenet["mblt"], device, mobilenet["calib"], mobilenet["folder"] / f"{device}.mxq",
                         compile_config=mobilenet["config"])
    assert (result.device, result.core_modes) == (device, ["single"])
    assert result.support == {**result.support, "unsupported": 0, "needs_mfu": 0}
    estimate, on_aries = _launched(result.mxq_path).estimate(), _launched(mobilenet["result"].mxq_path).estimate()
    print(f"\nMobileNetV2 on {device}: {estimate['latency_ms']} ms (aries-rb single: {on_aries['latency_ms']} ms)")
    assert estimate["macs"] == on_aries["macs"] > 250e6  # about 300 M multiply-accumulates


@pytest.mark.slow
def test_validate_a_good_and_a_corrupted_real_mxq(mobilenet, tmp_path, capsys):
    good = mobilenet["result"].mxq_path
    code, out, err = _cli(capsys, "validate", good)
    assert code == 0 and out.strip() == f"{good.name}: OK (MXQ)" and err == ""
    data = good.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    damaged = {"flipped.mxq": bytes(flipped), "truncated.mxq": data[: len(data) // 3]}
    for name, content in damaged.items():
        (tmp_path / name).write_bytes(content)
        code, _, err = _cli(capsys, "validate", tmp_path / name)
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1, err
        assert lines[0].startswith(f"ERROR [MXQ_FORMAT_ERROR]: {name} is invalid: "), lines[0]
    assert "CRC32" in _cli(capsys, "validate", tmp_path / "flipped.mxq")[2]


# -- MiniLM ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_minilm_compiles_for_aries_and_runs_bit_exactly(minilm):
    import realmodels

    result = minilm["result"]
    assert (result.device, result.core_modes) == ("aries-rb", ["single"]) and result.mxq_path.is_file()
    model = _launched(result.mxq_path)
    feeds = realmodels.tokenize(realmodels.SENTENCES[1:2], 128)
    codes = model.infer([feeds[name] for name in realmodels.MINILM_INPUT_NAMES], raw=True)[0]
    np.testing.assert_array_equal(codes, executor.run_codes(result.quantize.model, feeds)["last_hidden_state"])


@pytest.mark.slow
def test_minilm_on_regulus_ra_lists_the_mfu_less_ops_and_writes_nothing(minilm):
    output = minilm["folder"] / "regulus-ra" / "minilm.mxq"
    with pytest.raises(UnsupportedOpsError) as caught:
        mxq_compile(minilm["mblt"], "regulus-ra", minilm["manifest"], output, **minilm["options"])
    error: QBCompilerError = caught.value
    assert {op["op"] for op in error.fields["ops"]} == {"LayerNormalization", "Softmax", "Gelu"}
    assert all("multi-function unit (MFU)" in op["reason"] for op in error.fields["ops"])
    assert error.fields["device"] == "regulus-ra" and "regulus-rb" in error.hint
    assert _files(output.parent) == []


def test_inputs_run_through_the_mxq_beside_fp32(sample_cli, sample_mblt):
    """compare_with_fp32 (the workbench's "Try on inputs"): the MXQ's outputs beside onnxruntime's on the MBLT, for
    the same preprocessed test images, with the top classes of each."""
    from compiler_core.runtime.inputs import compare_with_fp32

    tests = [str(path) for path in sorted((SAMPLE_DIR / "test").glob("*.png"))[:4]]
    results = compare_with_fp32(sample_cli["mxq"], sample_mblt, tests, k=3)
    assert [Path(entry["input"]).name for entry in results] == [Path(path).name for path in tests]
    model = _launched(sample_cli["mxq"], input_layout="NCHW")
    session = ort.InferenceSession(str(sample_mblt))
    for entry, feeds in zip(results, _sample_feeds(sample_cli["mxq"])):
        [logits] = entry["outputs"]
        ours, = model.infer(feeds)
        reference = session.run(None, {session.get_inputs()[0].name: feeds})[0]
        assert logits["shape"] == [1, 10] and logits["cosine"] > 0.99 and logits["sqnr_db"] > 15
        assert [item["index"] for item in logits["mxq_top_k"]] == list(np.argsort(-ours.ravel())[:3])
        assert [item["index"] for item in logits["fp32_top_k"]] == list(np.argsort(-reference.ravel())[:3])


def test_one_unreadable_input_among_many_costs_only_its_own_result(sample_cli, sample_mblt, tmp_path, capsys):
    """Found trying a face mesh on eight photos in the workbench: one truncated JPEG and one text file named .png
    refused the whole run, in calibration words ("only real JPEG, PNG and BMP images may be in the folder"). The
    readable inputs run; each unreadable one is a row with Pillow's reason (and `qbcompiler run` exits 1 after the
    others' results)."""
    from compiler_core.runtime.inputs import compare_with_fp32
    from qbstudio.widgets.try_inputs import results_html

    good = [str(path) for path in sorted((SAMPLE_DIR / "test").glob("*.png"))[:2]]
    (tmp_path / "notes.png").write_text("not an image")
    data = Path(good[0]).read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    inputs = [good[0], str(tmp_path / "notes.png"), good[1], str(tmp_path / "cut.png")]
    results = compare_with_fp32(sample_cli["mxq"], sample_mblt, inputs, k=3)
    assert [entry["label"] for entry in results] == [Path(good[0]).name, Path(good[1]).name, "notes.png", "cut.png"]
    assert all(entry["outputs"][0]["cosine"] > 0.99 for entry in results[:2])
    assert "cannot identify image file" in results[2]["error"] and results[2]["outputs"] == []
    assert results[3]["error"].startswith("cannot be read: ")
    assert "cannot identify image file" in results_html(results, "run 1")
    code, out, err = _cli(capsys, "run", "--mxq", sample_cli["mxq"], *[arg for path in inputs for arg in ("--input", path)])
    assert code == 1 and sum(line.startswith(Path(path).name) or Path(path).name in line
                             for line in out.splitlines() for path in good) == 2
    assert "2 of the 4 input file(s) cannot be read and were not run (the others were): " in err
    with pytest.raises(CalibrationError, match="None of the 2 input file"):
        compare_with_fp32(sample_cli["mxq"], sample_mblt, inputs[1::2])


def test_an_input_that_does_not_fit_the_model_costs_only_its_own_result(sample_cli, sample_mblt, tmp_path):
    """Found under Xvfb (s16): in Try on Inputs, one .npy of the wrong shape among good inputs refused them all. Each
    input that does not fit is a row saying why; the others run. None fitting is still refused, naming the first."""
    from compiler_core.runtime.inputs import compare_with_fp32

    good = [str(path) for path in sorted((SAMPLE_DIR / "test").glob("*.png"))[:2]]
    np.save(tmp_path / "wrong.npy", np.zeros((3, 5), np.float32))
    np.save(tmp_path / "flat.npy", np.zeros((784,), np.float32))
    inputs = [good[0], str(tmp_path / "wrong.npy"), good[1]]
    results = compare_with_fp32(sample_cli["mxq"], sample_mblt, inputs, k=3)
    assert [entry["label"] for entry in results] == [Path(good[0]).name, Path(good[1]).name, "wrong.npy"]
    assert all(entry["outputs"][0]["cosine"] > 0.99 for entry in results[:2])
    assert "got [3, 5] in wrong.npy" in results[2]["error"] and results[2]["outputs"] == []
    with pytest.raises(CalibrationError, match="None of the 2 input file.* fits the model; the first: .*wrong.npy"):
        compare_with_fp32(sample_cli["mxq"], sample_mblt, [str(tmp_path / "wrong.npy"), str(tmp_path / "flat.npy")])
    from PIL import Image

    Image.new("L", (56, 56)).save(tmp_path / "large.png")  # Try's row said "Calibration images are 56x56 ..."
    (large,) = [entry for entry in compare_with_fp32(sample_cli["mxq"], sample_mblt, [good[0], str(tmp_path / "large.png")])
                if entry["label"] == "large.png"]
    assert large["error"].startswith("The images are 56x56") and "Calibration" not in large["error"]


def test_landmarks_beside_a_score_get_no_top_k_but_class_scores_do(tmp_path, capsys):
    """`qbcompiler run` and "Try on inputs" ranked any [1, N] output as classes (a face mesh's 1,404 coordinates got
    "top-k: 457 (147.4), 445 (147.4)"); they follow the analysis's rule now: a linear [1, N] output beside others is a
    regression, a Softmax output is class scores."""
    from compiler_core.runtime.inputs import compare_with_fp32

    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
               for name, shape in (("w_mesh", (8, 30)), ("w_flag", (8, 1)), ("w_cls", (8, 12)))]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w_mesh"], ["mesh"]), helper.make_node("MatMul", ["x", "w_flag"], ["f"]),
         helper.make_node("Sigmoid", ["f"], ["flag"]), helper.make_node("MatMul", ["x", "w_cls"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["classes"])], "heads",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in ("mesh", "flag", "classes")],
        weights)
    source = tmp_path / "heads.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    for index in range(8):
        np.save(tmp_path / f"s{index}.npy", rng.normal(size=(1, 8)).astype(np.float32))
    mblt = mblt_compile(str(source), tmp_path / "heads.mblt")
    mxq_compile(str(mblt), "aries-rb", str(tmp_path), tmp_path / "heads.mxq")
    code, out, _ = _cli(capsys, "run", "--mxq", tmp_path / "heads.mxq", "--input", tmp_path / "s0.npy")
    lines = {line.split("s0.npy: ")[1].split()[0]: line for line in out.splitlines() if "s0.npy: " in line}
    assert code == 0 and "top-k" not in lines["mesh"] and "top-k" in lines["classes"]
    [entry] = compare_with_fp32(tmp_path / "heads.mxq", mblt, [str(tmp_path / "s1.npy")])
    tops = {output["name"]: output["mxq_top_k"] for output in entry["outputs"]}
    assert tops["mesh"] == [] and tops["flag"] == [] and len(tops["classes"]) == 5


def test_try_on_inputs_of_a_two_input_model_labels_each_manifest_entry(tmp_path, capsys):
    """A manifest entry feeds every input; "Try on inputs" names it by its first file and the count of the others
    (it showed the last file's name alone, found with FunASR's FSMN-VAD in the workbench)."""
    from compiler_core.runtime.inputs import compare_with_fp32

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["out"])], "two",
        [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 4, 8]) for name in ("x", "y")],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [1, 4, 8])])
    source = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    rng = np.random.default_rng(0)
    rows = []
    for index in range(8):
        for name in ("x", "y"):
            np.save(tmp_path / f"{index}_{name}.npy", rng.normal(size=(1, 4, 8)).astype(np.float32))
        rows.append([f"{index}_x.npy", f"{index}_y.npy"])
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"info": {"input names": ["x", "y"]}, "calib paths": rows}))
    mblt = mblt_compile(str(source), tmp_path / "two.mblt")
    mxq_compile(str(mblt), "aries-rb", str(manifest), tmp_path / "two.mxq")
    results = compare_with_fp32(tmp_path / "two.mxq", mblt, [str(manifest)])
    assert [entry["label"] for entry in results] == [f"{index}_x.npy + 1 more" for index in range(8)]
    assert results[0]["input"] == f"{tmp_path / '0_x.npy'}, {tmp_path / '0_y.npy'}"
    assert all(entry["outputs"][0]["cosine"] > 0.99 for entry in results)
    # `qbcompiler run` the same way (each line repeated all of the entry's paths; the saved files took the last one's)
    code, out, _ = _cli(capsys, "run", "--mxq", tmp_path / "two.mxq", "--input", manifest, "--output-dir",
                        tmp_path / "out")
    assert code == 0 and "0_x.npy + 1 more: out [1, 4, 8]" in out.splitlines()
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [f"{index}_x.out.npy" for index in range(8)]


@pytest.mark.parametrize(("kwargs", "words"), [({}, "No target device given"),
                                               ({"target_device": "aries-rx"}, "Did you mean 'aries-rb'"),
                                               ({"target_device": "aries-rb", "config_preset": "nope"}, "nope")])
def test_a_bad_device_or_preset_is_said_before_the_parse(tmp_path, monkeypatch, kwargs, words):
    """Found with CREPE (a TorchScript file): `qbcompiler compile` without --target-device parsed for 10 s, then said
    the device was missing; a large model would parse for minutes first."""
    import compiler_core.api as api

    parses = []
    monkeypatch.setattr(api, "mblt_compile", lambda *args, **kw: parses.append(args))
    with pytest.raises((ArgumentError, QBCompilerError), match=words):
        mxq_compile(str(tmp_path / "any.onnx"), calib_data_path=str(tmp_path), save_path=tmp_path / "m.mxq", **kwargs)
    assert parses == [] and list(tmp_path.iterdir()) == []


def test_a_layer_too_large_for_a_core_is_refused_before_the_calibration(tmp_path, monkeypatch):
    """Found with ISNet: a MaxPool whose one tile needed 10 MiB failed only when the program was lowered, after
    calibration (141 s) and the analysis (about 250 s); every layer is now tiled in the support check, on a stand-in
    quantization of the parsed graph (compiler_core/backend/fit.py)."""
    import dataclasses

    import compiler_core.compile as compile_module

    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 1, 3, 2]),
             helper.make_node("Conv", ["t", "w"], ["y"])]
    graph = helper.make_graph(nodes, "transposed", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                                   [1, 8, 32, 32])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 32, 32])],
                              [onnx.numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 1, 1)).astype(np.float32), "w")])
    source = tmp_path / "transposed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    small = dataclasses.replace(compile_module.get_device("aries-rb"), sram_bytes_per_core=6 * 1024)
    monkeypatch.setattr(compile_module, "get_device", lambda name: small)  # the Transpose needs 8 KiB in, 8 out
    stages = []
    with pytest.raises(QBCompilerError) as caught:
        mxq_compile(str(source), "aries-rb", save_path=tmp_path / "m.mxq", use_random_calib=True,
                    callback=lambda event: stages.append(event.stage))
    assert caught.value.code == "DOES_NOT_FIT" and "Transpose" in caught.value.message
    assert "check" in stages and not {"calibrate", "quantize", "analyze"} & set(stages)
    assert not (tmp_path / "m.mxq").exists()


def test_a_scalar_tensor_inside_the_model_is_compared_by_the_analysis(tmp_path):
    """openWakeWord's log-mel clamps to ``ReduceMax(x) - 80`` with ``keepdims=0``: the analysis of the compile
    met the 0-d tensor and stopped with INTERNAL_ERROR (``too many indices for array``)."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["peak"], keepdims=0),
             helper.make_node("Sub", ["peak", "db"], ["low"]),
             helper.make_node("Clip", ["x", "low"], ["clamped"]),
             helper.make_node("Mul", ["clamped", "db"], ["y"])]
    graph = helper.make_graph(nodes, "top_db", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 50])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 50])],
                              [onnx.numpy_helper.from_array(np.array(2.0, np.float32), "db")])
    source = tmp_path / "top_db.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), source)
    calib = tmp_path / "calib"
    calib.mkdir()
    for index in range(6):
        np.save(calib / f"{index}.npy", np.random.default_rng(index).standard_normal((1, 4, 50)).astype(np.float32))
    result = mxq_compile(str(source), "aries-rb", save_path=tmp_path / "m.mxq", calib_data_path=calib,
                         analysis_holdout=2)
    analysis = json.loads(result.mxq_path.with_suffix(".analysis.json").read_text())
    assert analysis["outputs"]["y"]["samples"] >= 1 and analysis["outputs"]["y"]["cosine_mean"] > 0.95
    assert any(row["op"] == "ReduceMax" for row in analysis["layers"])


def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    """`--output some/folder` compiled the whole model and then failed ("Is a directory. Check free disk space");
    refused first now (the missing calibration folder proves nothing ran before: it would be the error otherwise)."""
    from compiler_core.errors import OutputWriteError

    (tmp_path / "plain_file").write_text("x")
    for target, words in ((tmp_path, "is a folder"), (tmp_path / "plain_file" / "m.mxq", "is a file")):
        with pytest.raises(OutputWriteError, match=words) as caught:
            mxq_compile(SAMPLE, "aries-rb", tmp_path / "no such folder", target)
        assert "e.g." in caught.value.hint or "writable" in caught.value.hint
    with pytest.raises(OutputWriteError, match="is a folder"):
        mblt_compile(SAMPLE, tmp_path)
