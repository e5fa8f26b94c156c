"""The fit check before calibration (compiler_core/backend/fit.py): every layer tiled, with the compile's own code.

Each graph below has a Conv that fits a core's 4 MiB and one layer the backend cannot cut small enough;
``qbcompiler check`` must refuse it naming that layer, before any calibration, as the compile's
post-quantization check (``check_tiles_fit``) would, and a real model's stand-in program must tile
exactly like its calibrated one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from compiler_core.api import parse_model
from compiler_core.backend.fit import check_fit, fit_failures, flag_fit_failures, stand_in_program
from compiler_core.backend.fusion import fuse
from compiler_core.backend.layout import assign_layouts
from compiler_core.backend.tiling import tile_layer
from compiler_core.cli import run
from compiler_core.config import CompileConfig, resolve_config
from compiler_core.errors import DoesNotFitError
from compiler_core.mblt.io import load_mblt
from compiler_core.targets import check_support, get_device

ARIES = get_device("aries-rb")
SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "samples" / "fashion_cnn" / "model.onnx"


def _conv_then(path: Path, shape: list[int], channels: int, tail: onnx.NodeProto, out_shape: list[int],
               *initializers: onnx.TensorProto) -> Path:
    """``x -> 1x1 Conv (SmallConv) -> tail``: the Conv's row tiles are small; ``tail`` is the layer under test."""
    weight = numpy_helper.from_array(np.full((channels, shape[1], 1, 1), 0.1, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="SmallConv"), tail], "fit",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [weight, *initializers])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), str(path))
    return path


TOO_LARGE = {
    # windowed pooling: a tile holds whole 2048x2048 channels
    "BigPool": ([1, 4, 2048, 2048], 4, helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                                                        name="BigPool"), [1, 4, 1024, 1024], []),
    # a transposing DMA moves whole tensors: 4 MiB in and 4 MiB out
    "BigTranspose": ([1, 16, 512, 512], 16, helper.make_node("Transpose", ["c"], ["y"], perm=[0, 1, 3, 2],
                                                             name="BigTranspose"), [1, 16, 512, 512], []),
    # a linear Resize's band of one output row reads two input rows of 2048 channels x 1024 (2 x 2 MiB)
    "BigResize": ([1, 1, 8, 1024], 2048, helper.make_node("Resize", ["c", "", "s"], ["y"], mode="linear",
                                                          name="BigResize"), [1, 2048, 16, 1024],
                  [numpy_helper.from_array(np.array([1, 1, 2, 1], np.float32), "s")]),
    # a Softmax over W holds whole rows of all 256 channels: 2 MiB in, 2 MiB out, double-buffered
    "BigSoftmax": ([1, 1, 4, 8192], 256, helper.make_node("Softmax", ["c"], ["y"], axis=-1, name="BigSoftmax"),
                   [1, 256, 4, 8192], []),
}


@pytest.mark.parametrize("source", list(TOO_LARGE))
def test_check_refuses_a_layer_too_large_naming_it_and_the_bytes(source, tmp_path, capsys):
    shape, channels, tail, out_shape, initializers = TOO_LARGE[source]
    path = _conv_then(tmp_path / "m.onnx", shape, channels, tail, out_shape, *initializers)
    graph, _ = parse_model(str(path))
    assert check_support(graph, "aries-rb").all_supported  # the support check alone says "compilable"
    failures = fit_failures(graph, ARIES)
    assert [error.fields["sram_bytes"] for error in failures] == [4 * 1024 * 1024]  # the Conv fits
    assert failures[0].fields["needed_bytes"] > 4 * 1024 * 1024
    assert run(["check", "--model", str(path), "--target-device", "aries-rb"]) == 1
    error = capsys.readouterr().err
    assert "DOES_NOT_FIT" in error and f"source node {source}" in error and "4,194,304" in error
    assert f"{failures[0].fields['needed_bytes']:,} bytes" in error


def test_an_int16_preset_is_tiled_at_its_width(tmp_path, capsys):
    """2 MiB in and 2 MiB out fit at int8; the a16w8 preset's int16 activations need twice that."""
    tail = helper.make_node("Transpose", ["c"], ["y"], perm=[0, 1, 3, 2], name="Transpose16")
    path = _conv_then(tmp_path / "t.onnx", [1, 8, 512, 512], 8, tail, [1, 8, 512, 512])
    graph, _ = parse_model(str(path))
    assert fit_failures(graph, ARIES) == []
    with pytest.raises(DoesNotFitError, match="Transpose16"):
        check_fit(graph, ARIES, resolve_config(config_preset="a16w8"))
    assert run(["check", "--model", str(path), "--target-device", "aries-rb"]) == 0
    capsys.readouterr()
    assert run(["check", "--model", str(path), "--target-device", "aries-rb", "--config-preset", "a16w8"]) == 1
    assert "source node Transpose16" in capsys.readouterr().err


def _large_map_model(path: Path, nodes: list[onnx.NodeProto]):
    """``nodes`` from ``x`` [1, 16, 512, 512] to ``y`` of the same shape (a 1x1 weight ``w``), parsed to an MBLT."""
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 512, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 512, 512])],
                              [numpy_helper.from_array(np.full((16, 16, 1, 1), 0.1, np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), str(path))
    return parse_model(str(path))[0]


def test_every_layer_too_large_is_listed_and_flagged_in_the_report(tmp_path):
    model = _large_map_model(tmp_path / "two.onnx", [
        helper.make_node("Conv", ["x", "w"], ["c"], name="SmallConv"),
        helper.make_node("Transpose", ["c"], ["t"], perm=[0, 1, 3, 2], name="FirstTranspose"),
        helper.make_node("Conv", ["t", "w"], ["d"], name="OtherConv"),
        helper.make_node("Transpose", ["d"], ["y"], perm=[0, 1, 3, 2], name="SecondTranspose")])
    failures = fit_failures(model, ARIES)
    with pytest.raises(DoesNotFitError) as caught:
        check_fit(model, ARIES)
    assert caught.value.fields["layers"] == [error.fields["layer"] for error in failures] and len(failures) == 2
    assert "1 more layer(s) do not fit" in caught.value.message
    report = flag_fit_failures(check_support(model, "aries-rb"), failures)
    flagged = {entry.source_name: entry for entry in report.blocking()}
    assert sorted(flagged) == ["FirstTranspose", "SecondTranspose"] and not report.compilable
    assert all("does not fit the core SRAM" in entry.reason for entry in flagged.values())
    assert report.entries[next(n for n, e in report.entries.items() if e.source_name == "SmallConv")].status == "supported"


def test_a_model_that_fits_passes(capsys):
    assert run(["check", "--model", str(SAMPLE), "--target-device", "aries-rb"]) == 0
    assert "DOES_NOT_FIT" not in capsys.readouterr().err


def _tiling(model, sram: int) -> list[tuple]:
    """Per layer: its operations, unit, tensor element types and the tiling's shape and working set."""
    layers = fuse(model)
    layouts = assign_layouts(model, layers)
    rows = []
    for layer in layers:
        names = [*layer.inputs, *layer.outputs]
        try:
            tiling = tile_layer(model, layer, layouts, sram, 1)
            verdict = (tiling.split, len(tiling.tiles), tiling.sram["total"])
        except DoesNotFitError as error:
            verdict = ("does not fit", error.fields["needed_bytes"])
        rows.append((tuple(model.ops[i].name for i in layer.ops), layer.unit,
                     tuple(layouts[name].dtype for name in names if name in layouts), verdict))
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v2", "ppocr_cls", "silero_ifless", "ppocr_det"])
@pytest.mark.parametrize("preset", [None, "a16w8"])
def test_the_stand_in_program_tiles_like_the_calibrated_one(name, preset, tmp_path):
    """The check's verdict is the compile's: the same layers, element types and tiles as the program quantized on
    real calibration statistics, at the real SRAM and at a budget small enough that some layers do not fit."""
    import realmodels

    from compiler_core.api import mblt_compile, quantize

    path, shapes, constants = realmodels.real_models()[name]()
    mblt = mblt_compile(path, tmp_path / "m.mblt", input_shape_dict=shapes or None, constant_inputs=constants or None)
    overrides = {"calibration": {"numSamples": 4}}
    calibrated = quantize(mblt, use_random_calib=True, analysis=False, compile_config=overrides,
                          config_preset=preset).model
    config = resolve_config(config_preset=preset) if preset else CompileConfig()
    stand_in = stand_in_program(load_mblt(mblt), config)
    for sram in (ARIES.sram_bytes_per_core, 64 * 1024):
        assert _tiling(stand_in, sram) == _tiling(calibrated, sram), sram


def test_with_cpu_offload_a_too_large_tail_layer_runs_on_the_cpu(tmp_path, monkeypatch):
    """The workbench offers CPU offload for a flagged head/tail layer (compile readiness reads the flagged report):
    the compile must then move it to the CPU, not refuse it; one inside the body stays DOES_NOT_FIT."""
    import dataclasses

    import compiler_core.compile as compile_module
    from compiler_core.api import mxq_compile

    small = dataclasses.replace(ARIES, sram_bytes_per_core=6 * 1024)  # a 8x32x32 Transpose needs 8 KiB in, 8 out
    monkeypatch.setattr(compile_module, "get_device", lambda name: small)
    tail = helper.make_node("Transpose", ["c"], ["y"], perm=[0, 1, 3, 2], name="TailTranspose")
    source = _conv_then(tmp_path / "tail.onnx", [1, 8, 32, 32], 8, tail, [1, 8, 32, 32])
    result = mxq_compile(str(source), "aries-rb", save_path=tmp_path / "m.mxq", use_random_calib=True,
                         cpu_offload=True)
    assert result.cpu_offload["tail"] and not result.cpu_offload["head"] and result.support["cpu_offloaded"] == 1
    with pytest.raises(DoesNotFitError, match="TailTranspose"):
        mxq_compile(str(source), "aries-rb", save_path=tmp_path / "n.mxq", use_random_calib=True)
    assert not (tmp_path / "n.mxq").exists()
    inner = onnx.load(str(source))
    inner.graph.node[1].output[0] = "t"
    inner.graph.node.append(helper.make_node("Conv", ["t", "w"], ["y"], name="LastConv"))
    onnx.save(inner, str(tmp_path / "inner.onnx"))
    with pytest.raises(DoesNotFitError, match="TailTranspose"):
        mxq_compile(str(tmp_path / "inner.onnx"), "aries-rb", save_path=tmp_path / "i.mxq", use_random_calib=True,
                    cpu_offload=True)


def test_with_an_offloadable_tail_the_npu_body_is_checked(tmp_path):
    """On regulus-ra (no MFU) a trailing Softmax goes to the CPU; the Transpose before it stays on the NPU and is
    checked (the workbench flags it), the Softmax is not tiled."""
    from compiler_core.backend.fit import npu_fit_failures

    model = _large_map_model(tmp_path / "tail.onnx", [
        helper.make_node("Conv", ["x", "w"], ["c"], name="SmallConv"),
        helper.make_node("Transpose", ["c"], ["t"], perm=[0, 1, 3, 2], name="BigTranspose"),
        helper.make_node("Softmax", ["t"], ["y"], axis=1, name="TailSoftmax")])
    report = check_support(model, "regulus-ra")
    assert [entry.source_name for entry in report.blocking()] == ["TailSoftmax"]
    failures = npu_fit_failures(model, report, get_device("regulus-ra"))
    assert [error.fields["layer"] for error in failures] == [
        name for name, entry in report.entries.items() if entry.source_name == "BigTranspose"]
    assert npu_fit_failures(model, check_support(model, "aries-rb"), ARIES)[0].fields["layer"] == failures[0].fields["layer"]
