"""``cpuLayers``: supported layers the user puts on the CPU (a log front end), through the CPU-offload split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from compiler_core.api import mxq_compile
from compiler_core.config import CompileConfig, CpuLayersConfig
from compiler_core.errors import ConfigError
from compiler_core.runtime import Accelerator, Model

SHAPE = [1, 1, 16, 16]
CALIB, HELD_OUT = 24, 8


def _log_front_end_model(path: Path) -> Path:
    """x (a power, 1e-8 .. 1e2) -> Mul -> Log -> Conv -> Relu: the Log needs 100 dB of input range."""
    rng = np.random.default_rng(0)
    weight = rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "gain"], ["scaled"], name="gain_mul"),
             helper.make_node("Log", ["scaled"], ["logged"], name="log"),
             helper.make_node("Conv", ["logged", "w", "b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "log_front_end", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 16, 16])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "gain"), numpy_helper.from_array(weight, "w"),
         numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def _powers(count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(10.0 ** rng.uniform(-8, 2, SHAPE)).astype(np.float32) for _ in range(count)]


@pytest.fixture(scope="module")
def log_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cpu_layers")
    calib = folder / "calib"
    calib.mkdir()
    for index, sample in enumerate(_powers(CALIB, 1)):
        np.save(calib / f"{index:06d}.npy", sample)
    return {"folder": folder, "model": _log_front_end_model(folder / "log.onnx"), "calib": calib}


def _cosines(mxq: Path, model_path: Path) -> list[float]:
    model = Model(mxq, input_layout="NCHW")
    model.launch(Accelerator(model.artifact.device))
    fp32 = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    result = []
    for sample in _powers(HELD_OUT, 2):
        a = model.infer(sample)[0].ravel().astype(np.float64)
        b = fp32.run(None, {"x": sample})[0].ravel().astype(np.float64)
        result.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
    return result


def test_the_log_front_end_on_the_cpu_matches_fp32_far_better_than_all_on_the_npu(log_model):
    folder = log_model["folder"]
    npu = mxq_compile(log_model["model"], "aries-rb", log_model["calib"], folder / "npu.mxq")
    cpu = mxq_compile(log_model["model"], "aries-rb", log_model["calib"], folder / "cpu.mxq",
                       cpu_layers={"head": ["log"]})
    assert npu.cpu_offload == {}
    # the analysis finds where the error is born (the Log, its input fine), and the accuracy hint names the option
    loss = npu.to_dict()["range_loss"]
    assert loss["op"] == "Log" and loss["sqnr_db"] < 20 and loss["input_sqnr_db"] > loss["sqnr_db"] + 10
    assert cpu.to_dict()["range_loss"] is None
    from compiler_core.cli import _compile_text

    text = _compile_text({**npu.to_dict(), "seconds": 1.0, "config_preset": None})
    assert f"hint: the error starts at {loss['layer']} (Log" in text and f"--cpu-head {loss['layer']}" in text
    assert cpu.cpu_offload["head"] and not cpu.cpu_offload["tail"] and len(cpu.cpu_offload["body_inputs"]) == 1
    assert cpu.support["cpu_offloaded"] == 2  # the Log and the Mul it depends on
    artifact = Model(folder / "cpu.mxq").artifact
    assert "Log" not in {row["op_type"] for row in artifact.meta["layers"]}  # the NPU program has no Log
    on_npu, on_cpu = _cosines(folder / "npu.mxq", log_model["model"]), _cosines(folder / "cpu.mxq", log_model["model"])
    print(f"\nlog front end vs FP32 over {HELD_OUT} samples: all on the NPU min cosine {min(on_npu):.4f}, "
          f"Mul+Log on the CPU {min(on_cpu):.5f}")
    assert min(on_cpu) > 0.999 and min(on_npu) < 0.99
    assert 1 - min(on_cpu) < (1 - min(on_npu)) / 10


def test_a_tail_choice_takes_every_layer_after_it(log_model):
    from compiler_core.api import parse_model
    from compiler_core.targets import check_support, plan_cpu_offload

    graph, _ = parse_model(log_model["model"])
    report = check_support(graph, "aries-rb")
    plan = plan_cpu_offload(graph, report, CpuLayersConfig(tail=["relu"]))
    assert plan.cpu_tail == plan.chosen == ["Relu_0"] and not plan.cpu_head  # matched by its source name
    plan = plan_cpu_offload(graph, report, CpuLayersConfig(tail=["conv"]))
    assert len(plan.cpu_tail) == 2 and not plan.cpu_head  # the Conv and the Relu after it
    plan = plan_cpu_offload(graph, report, CpuLayersConfig(head=["LOG*"]))  # globs, any case
    assert plan.cpu_head == plan.chosen and len(plan.cpu_head) == 2


def _chain_model(path: Path) -> Path:
    """x -> a -> b -> ... -> f (Conv, Relu in turn), g = Add(f, a) -> y (a skip from a to the end)."""
    nodes = [helper.make_node("Conv", [src, "w"], [dst], name=dst) if index % 2 == 0 else
             helper.make_node("Relu", [src], [dst], name=dst) for index, (src, dst) in enumerate(zip("xabcde", "abcdef"))]
    nodes.append(helper.make_node("Add", ["f", "a"], ["y"], name="g"))
    weight = numpy_helper.from_array(np.full((1, 1, 1, 1), 0.5, np.float32), "w")
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, SHAPE)], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_tail_before_a_head_and_a_choice_leaving_the_npu_nothing_are_refused(tmp_path):
    model = _chain_model(tmp_path / "chain.onnx")
    out = tmp_path / "out" / "x.mxq"
    with pytest.raises(ConfigError) as caught:  # d needs c, which the tail from b takes: CPU on both sides
        mxq_compile(model, "aries-rb", None, out, use_random_calib=True, cpu_layers={"head": ["d"], "tail": ["b"]})
    error = caught.value
    assert error.code == "CONFIG_ERROR" and "head layer" in error.message and "tail layer" in error.message
    assert len(error.fields["layers"]) == 3  # b, c, d: in both groups
    with pytest.raises(ConfigError) as caught:  # every computing layer on the CPU
        mxq_compile(model, "aries-rb", None, out, use_random_calib=True, cpu_layers={"head": ["g"]})
    assert "leaves nothing for the NPU" in caught.value.message and len(caught.value.fields["layers"]) == 7
    with pytest.raises(ConfigError, match="match no layer"):
        mxq_compile(model, "aries-rb", None, out, use_random_calib=True, cpu_layers={"tail": ["nope*"]})
    assert not out.exists()
    result = mxq_compile(model, "aries-rb", None, out, use_random_calib=True,
                         cpu_layers={"head": ["b"], "tail": ["f"]})
    assert result.cpu_offload["head"] and result.cpu_offload["tail"] and result.support["cpu_offloaded"] == 4


def test_the_config_key_round_trips():
    config = CompileConfig.from_dict({"cpuLayers": {"head": ["log", "*/mel*"]}})
    assert config.cpu_layers.head == ["log", "*/mel*"] and config.to_dict()["cpuLayers"] == {
        "head": ["log", "*/mel*"], "tail": []}
    with pytest.raises(ConfigError):
        CompileConfig.from_dict({"cpuLayers": ["log"]})


def test_the_cli_check_shows_the_split_and_compile_takes_the_flags(log_model, tmp_path, capsys):
    from compiler_core.cli import run

    model = log_model["model"]
    assert run(["check", "--model", str(model), "--target-device", "aries-rb", "--cpu-head", "log"]) == 0
    out = capsys.readouterr().out
    assert "CPU offload plan: head 2 node(s), NPU body 2, tail 0 (2 chosen by cpuLayers)" in out
    assert "2 cpu_offloaded" in out and out.count("cpuLayers chose it") == 2
    output = tmp_path / "cli.mxq"
    assert run(["compile", "--model", str(model), "--target-device", "aries-rb", "--calib-data-path",
                str(log_model["calib"]), "--cpu-tail", "relu", "--output", str(output)]) == 0
    assert "CPU offload: head=False tail=True" in capsys.readouterr().out
    assert run(["compile", "--model", str(model), "--target-device", "aries-rb", "--use-random-calib",
                "--cpu-head", "relu", "--cpu-tail", "mul*", "--output", str(tmp_path / "no.mxq")]) != 0
    assert "cpuLayers cannot split the model" in capsys.readouterr().err


def test_mixed_precision_searches_the_npu_body_between_a_cpu_head_and_tail(tmp_path):
    """AMP with user-chosen CPU layers: the search quantizes the body, feeds it through the FP32 head and judges the
    model's outputs through the FP32 tail (which also reads the head's ``a``), as the compile's own analysis does."""
    from compiler_core.quantization.mixed_precision import target_metric

    model = _chain_model(tmp_path / "chain.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(3)
    for index in range(16):
        np.save(calib / f"{index:03d}.npy", rng.normal(0, 1, SHAPE).astype(np.float32))
    settings = {"apply": True, "target": {"kind": "sqnrDb", "value": 99.0}, "maxInt16Fraction": 1.0,
                "latencyBudget": 10.0}
    result = mxq_compile(model, "aries-rb", calib, tmp_path / "amp.mxq", analysis_holdout=6,
                         cpu_layers={"head": ["b"], "tail": ["f"]}, mixed_precision_config=settings)
    assert result.cpu_offload["head"] and result.cpu_offload["tail"]
    mixed = result.mixed_precision
    chosen = mixed["points"][mixed["chosen"]]
    assert len(mixed["points"]) > 1 and chosen["int16_layers"] > 0  # 99 dB is out of int8's reach: it searched
    assert target_metric(result.quantize.analysis, "sqnrDb") == pytest.approx(chosen["metric"])
    body = {op.name for op in result.quantize.model.ops}
    from qbstudio.state.runs import RunRecord

    record = RunRecord.from_result(1, result.to_dict(), None, config={}, config_summary="")
    assert record.int16_layers == chosen["int16_layers"]  # one count of int16 layers (it showed int16 tensors)
    promoted = mixed["overrides"]["activation16Bits"] + mixed["overrides"]["weight16Bits"]
    assert promoted and set(promoted) <= body, mixed["overrides"]  # the head's Conv_0 stays FP32 on the CPU


def test_latency_figures_of_an_mxq_with_a_cpu_head_say_they_leave_the_host_part_out(log_model, tmp_path, capsys):
    """With the Log on the CPU the NPU estimate drops to microseconds (millions of FPS): every place that prints it
    (run, profile, the workbench's run record and comparison) says the CPU part is not counted."""
    from compiler_core.cli import run
    from compiler_core.runtime.profile import format_profile, profile_mxq
    from qbstudio.state.compare import metric_rows
    from qbstudio.state.runs import RunRecord

    result = mxq_compile(log_model["model"], "aries-rb", log_model["calib"], tmp_path / "head.mxq",
                         cpu_layers={"head": ["log"]})
    plain = mxq_compile(log_model["model"], "aries-rb", log_model["calib"], tmp_path / "plain.mxq")
    note = "the NPU part; the CPU head runs on the host, not counted"
    sample = tmp_path / "x.npy"
    np.save(sample, _powers(1, 5)[0])
    assert run(["run", "--mxq", str(tmp_path / "head.mxq"), "--input", str(sample)]) == 0
    assert f"FPS on the device ({note})" in capsys.readouterr().out
    assert run(["run", "--mxq", str(tmp_path / "plain.mxq"), "--input", str(sample)]) == 0
    assert "not counted" not in capsys.readouterr().out
    assert note in format_profile(profile_mxq(tmp_path / "head.mxq"))
    assert "not counted" not in format_profile(profile_mxq(tmp_path / "plain.mxq"))
    records = [RunRecord.from_result(index, compiled.to_dict(), None, config={}, config_summary="")
               for index, compiled in enumerate((result, plain), 1)]
    assert [record.cpu_parts for record in records] == [["head"], []]
    assert RunRecord.from_dict(records[0].to_dict()).cpu_parts == ["head"]  # saved with the project
    older = {key: value for key, value in records[0].to_dict().items() if key != "cpu_parts"}
    older["config"] = {"cpuLayers": {"head": ["log"], "tail": []}}
    assert RunRecord.from_dict(older).cpu_parts == ["head"]  # a project saved before: from the chosen layers
    assert dict(metric_rows(records))["on the host CPU (not in the estimates)"] == ["head", "-"]


def _rgb_classifier(path: Path) -> Path:
    """image [1, 3, 16, 16] -> Conv (8 channels) -> Relu -> Conv (4) -> GlobalAveragePool: a CPU head ending at the
    first Conv hands the NPU 8 channels, not the 3 of the pixels."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["image", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c2"], ["y"], name="pool")]
    graph = helper.make_graph(
        nodes, "rgb", [helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 1, 1])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w1"),
         numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32), "w2")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_uint8_input_behind_a_cpu_head_stays_float_on_the_npu(tmp_path, caplog):
    """MobileNetV2 with the classification preset (uint8Input on) and a CPU head ending at a 32-channel Conv stopped
    with an INTERNAL_ERROR (the pixels' 3 means broadcast against 32 channels), found in the workbench (s15)."""
    model = _rgb_classifier(tmp_path / "rgb.onnx")
    preprocessing = {"apply": True, "pipeline": [{"op": "normalize", "mean": [0.485, 0.456, 0.406],
                                                  "std": [0.229, 0.224, 0.225], "scale": 1 / 255}]}
    options = {"use_random_calib": True, "uint8_input_config": {"apply": True}, "preprocessing_config": preprocessing}
    with caplog.at_level("INFO", logger="compiler_core.compile"):
        result = mxq_compile(model, "aries-rb", None, tmp_path / "head.mxq", cpu_layers={"head": ["conv1"]},
                             **options)
    assert result.cpu_offload["head"] and "uint8Input does not apply" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="compiler_core.compile"):
        mxq_compile(model, "aries-rb", None, tmp_path / "all.mxq", **options)  # no head: raw pixels on the NPU
    assert "uint8Input does not apply" not in caplog.text
    npu = Model(tmp_path / "head.mxq", input_layout="NCHW")
    npu.launch(Accelerator("aries-rb"))
    sample = np.random.default_rng(4).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    fp32 = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"image": sample})[0]
    got = npu.infer(sample)[0]
    assert np.corrcoef(got.ravel(), fp32.ravel())[0, 1] > 0.9


def _grid_sample_between_convs(path: Path) -> Path:
    """Conv -> (flow) GridSample -> Conv: the GridSample (no NPU kernel) sits between layers the NPU runs."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "wf"], ["flow_nchw"], name="flow", pads=[1, 1, 1, 1]),
             helper.make_node("Tanh", ["flow_nchw"], ["flow_t"], name="flow_tanh"),
             helper.make_node("Transpose", ["flow_t"], ["grid"], name="flow_nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("GridSample", ["x", "grid"], ["warped"], name="warp"),
             helper.make_node("Conv", ["warped", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "warp", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 16, 16])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (2, 3, 3, 3)).astype(np.float32), "wf"),
         numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_refused_layer_inside_the_model_gets_the_cpu_head_or_tail_that_compiles(tmp_path):
    """A GridSample between Convs (an optical-flow warp): the refusal offered cpu_offload, which was refused in turn
    ("only a leading or trailing group"); both refusals now name the --cpu-tail / --cpu-head layer, and each
    offered choice compiles."""
    from compiler_core.errors import UnsupportedOpsError

    model = _grid_sample_between_convs(tmp_path / "warp.onnx")
    out = tmp_path / "warp.mxq"
    hints = []
    for offload in (False, True):
        with pytest.raises(UnsupportedOpsError) as caught:
            mxq_compile(model, "aries-rb", None, out, use_random_calib=True, cpu_offload=offload)
        hints.append(caught.value.hint)
    for hint in hints:
        assert "--cpu-tail GridSample_0" in hint and "--cpu-head GridSample_0" in hint
        assert not hint.startswith("Compile with cpu_offload")
    from compiler_core.api import load_mblt, mblt_compile
    from compiler_core.targets import check_support

    report = check_support(load_mblt(mblt_compile(model, tmp_path / "warp.mblt")), "aries-rb")  # check, graph view
    assert report.inner_unsupported == ["GridSample_0"] and report.unsupported_error().hint == hints[0]
    for choice in ({"tail": ["GridSample_0"]}, {"head": ["GridSample_0"]}):
        result = mxq_compile(model, "aries-rb", None, out, use_random_calib=True, cpu_layers=choice)
        assert result.support["cpu_offloaded"] >= 1
