"""Backend lowering: the tile-level program of every core mode computes exactly the golden codes.

- The tile-level simulator (every DMA, every tile, through the activation arena) against the golden
  executor: one small model per op family, the Fashion sample CNN (compiled to an MXQ, read back),
  MobileNetV2, PP-OCR cls and Silero VAD, in single, multi, global4 and global8.
- A corrupted memory plan (two live buffers overlapping) changes the codes and is refused at load.
- A layer whose smallest tile exceeds the core SRAM is refused with the layer and the numbers.
- The MXQ holds a different program per core mode; ``qbcompiler profile`` reports each.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_fast_executor import FAMILIES

from compiler_core.api import mblt_compile, mxq_compile, quantize
from compiler_core.backend.fusion import fuse
from compiler_core.backend.layout import assign_layouts
from compiler_core.backend.memplan import overlapping, plan_memory, plan_resident
from compiler_core.backend.program import NpuProgram, decode, lower, to_document
from compiler_core.backend.schedule import RESIDENT_SHARE, schedule_mode
from compiler_core.backend.tiling import row_tiled, tile_layer, working_set
from compiler_core.backend.verify import npu_problem
from compiler_core.cli import run
from compiler_core.errors import DoesNotFitError, InternalError, MxqFormatError
from compiler_core.mxq import read_mxq, write_mxq
from compiler_core.quantization import executor
from compiler_core.runtime.artifact import load_artifact
from compiler_core.runtime.tilesim import run_tiles
from compiler_core.targets import CORE_MODES, get_device

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"
ARIES = get_device("aries-rb")
MODES = list(CORE_MODES)


def _codes(model, seed: int = 0, amplitude: float = 1.0):
    rng = np.random.default_rng(seed)
    feeds = {spec.name: (rng.standard_normal(spec.shape) * amplitude).astype(np.float32) for spec in model.inputs}
    return executor.quantize_inputs(model, feeds), executor.run_codes(model, feeds)


def _assert_tile_program_exact(model, program, codes, golden):
    for mode in MODES:
        outputs = run_tiles(model, program, ARIES, mode, codes)
        for name, expected in golden.items():
            assert np.array_equal(outputs[name], expected), (mode, name)


def _channel_slices():
    """Split along channels (C2f/C3k2 style) and a flattened concat: both tile by rows."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    init = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
            *(numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("s0", [0]), ("e0", [4]), ("s1", [4]), ("e1", [8]), ("ax", [1]), ("shape", [1, 4, -1])))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Slice", ["c", "s0", "e0", "ax"], ["a"]),
             helper.make_node("Slice", ["c", "s1", "e1", "ax"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["g"]),
             helper.make_node("Reshape", ["a", "shape"], ["fa"]), helper.make_node("Reshape", ["g", "shape"], ["fg"]),
             helper.make_node("Concat", ["fa", "fg"], ["y"], axis=2)]
    graph = helper.make_graph(nodes, "slices", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.fixture(scope="module", params=sorted([*FAMILIES, "channel_slices"]))
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    build = _channel_slices if request.param == "channel_slices" else FAMILIES[request.param]
    onnx.save(build(), str(folder / "model.onnx"))
    mblt = mblt_compile(folder / "model.onnx", folder / "model.mblt", backend="onnx")
    return quantize(mblt, use_random_calib=True, analysis=False).model


def test_tile_programs_of_every_mode_match_golden_codes(family):
    lowered = lower(family, ARIES, MODES)
    program = decode(lowered)
    if any(op.op_type == "Slice" and np.asarray(op.consts.get("input3", [2])).tolist() == [1] for op in family.ops):
        sliced = [t for layer, t in zip(lowered.layers, lowered.modes["global4"].tilings)
                  if layer.main(family).op_type == "Slice"]
        assert any(t.rows and t.split == "spatial" for t in sliced)
    for seed, amplitude in ((0, 1.0), (1, 30.0)):
        _assert_tile_program_exact(family, program, *_codes(family, seed, amplitude))


@pytest.fixture(scope="module")
def residual_model(tmp_path_factory):
    """The conv family: a residual Add keeps a tensor live while later layers write theirs."""
    folder = tmp_path_factory.mktemp("residual")
    onnx.save(FAMILIES["conv"](), str(folder / "model.onnx"))
    mblt = mblt_compile(folder / "model.onnx", folder / "model.mblt", backend="onnx")
    return quantize(mblt, use_random_calib=True, analysis=False).model


def _clobber(buffers):
    """A memory-plan bug: a tensor written while another is still to be read gets the other's address."""
    kept, written = next((a, b) for a in buffers.values() for b in buffers.values() if a.first < b.first < a.last)
    buffers[written.name] = dataclasses.replace(written, offset=kept.offset)
    assert overlapping(buffers)


def _scheduled(model, buffers, resident):
    layers = fuse(model)
    layouts = assign_layouts(model, layers)
    programs = {mode: schedule_mode(model, layers, layouts, buffers, ARIES, CORE_MODES[mode], resident=resident)
                for mode in MODES}
    return NpuProgram(layers, layouts, buffers, programs, [[] for _ in layers])


def test_overlapping_live_buffers_change_the_codes_and_are_refused(residual_model):
    model = residual_model
    layers = fuse(model)
    layouts = assign_layouts(model, layers)
    buffers = plan_memory(model, layers, layouts)
    resident = plan_resident(model, layers, layouts, ARIES.sram_bytes_per_core // RESIDENT_SHARE)
    assert not overlapping(buffers) and not overlapping(resident)
    assert {len(program.resident) > 0 for program in _scheduled(model, buffers, resident).modes.values()} == {True, False}
    _clobber(buffers)  # the DRAM arena (global modes) ...
    _clobber(resident)  # ... and the SRAM-resident region (single, multi)
    lowered = _scheduled(model, buffers, resident)
    program = decode(lowered)
    codes, golden = _codes(model, 0, 1.0)
    wrong = [mode for mode in MODES
             if any(not np.array_equal(run_tiles(model, program, ARIES, mode, codes)[name], value)
                    for name, value in golden.items())]
    assert wrong == MODES
    document, consts = to_document(lowered)
    problem = npu_problem(document, consts, len(model.ops))
    assert problem and "overlaps live buffers" in problem
    document, consts = to_document(_scheduled(model, plan_memory(model, layers, layouts), resident))
    problem = npu_problem(document, consts, len(model.ops))
    assert problem and "SRAM plan overlaps live buffers" in problem


def test_smallest_tile_over_sram_is_refused_with_layer_and_numbers(residual_model):
    model = residual_model
    lowered = lower(model, ARIES, ["single"])
    layer = next(layer for layer in lowered.layers if layer.main(model).kind == "linear")
    with pytest.raises(DoesNotFitError) as caught:
        tile_layer(model, layer, lowered.layouts, 64, 1)
    fields = caught.value.fields
    assert fields["layer"] == layer.main(model).name and fields["sram_bytes"] == 64
    assert fields["needed_bytes"] > 64 and f"{fields['needed_bytes']:,} bytes" in caught.value.message


def test_every_tile_fits_the_sram_it_was_tiled_for(residual_model):
    """Interior tiles read a halo on both sides: the largest tile, not the first, must fit (a real export
    compiled to a program the reader refused before)."""
    model = residual_model
    lowered = lower(model, ARIES, ["single"])
    checked = 0
    for layer in lowered.layers:
        if not row_tiled(model, layer, lowered.layouts):
            continue
        whole = working_set(model, layer, lowered.layouts, True, 0, lowered.layouts[layer.outputs[0]].rows, 0, 1 << 30)
        for sram in np.unique(np.geomspace(256, whole["total"], 120).astype(int)):
            try:
                tiling = tile_layer(model, layer, lowered.layouts, int(sram), 1)
            except DoesNotFitError:
                continue
            sets = [working_set(model, layer, lowered.layouts, True, t.r0, t.r1, t.c0, t.c1)["total"] for t in tiling.tiles]
            assert max(sets) <= sram and tiling.sram["total"] == max(sets), (layer.index, int(sram))
            checked += len(tiling.tiles) > 2
    assert checked  # some budgets give interior tiles


def test_compile_writes_no_program_the_reader_would_refuse(tmp_path, monkeypatch):
    """The reader's checks run before the MXQ is written: a backend bug is an INTERNAL_ERROR at compile, no file."""
    import compiler_core.backend.verify as verify

    monkeypatch.setattr(verify, "_commands_problem", lambda mode, *args: f"the {mode} command 7 is made up")
    mblt = mblt_compile(SAMPLE_DIR / "model.onnx", tmp_path / "model.mblt")
    with pytest.raises(InternalError, match="fails the MXQ reader's checks.*command 7 is made up"):
        mxq_compile(mblt, "aries-rb", None, tmp_path / "out.mxq", use_random_calib=True)
    assert not (tmp_path / "out.mxq").exists()


@pytest.fixture(scope="module")
def sample_mxq(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sample")
    mblt = mblt_compile(SAMPLE_DIR / "model.onnx", folder / "model.mblt")
    return mxq_compile(mblt, "aries-rb", SAMPLE_DIR / "calib", folder / "all.mxq",
                       compile_config=SAMPLE_DIR / "compile_config.yaml", inference_scheme="all").mxq_path


def test_sample_mxq_programs_differ_per_mode_and_run_exactly(sample_mxq):
    artifact = load_artifact(sample_mxq)
    commands = artifact.npu.commands
    assert sorted(commands) == sorted(MODES)
    assert len({commands[mode].tobytes() for mode in MODES}) == len(MODES)
    _assert_tile_program_exact(artifact.program, artifact.npu, *_codes(artifact.program, 3, 2.0))


def test_profile_reports_every_mode(sample_mxq, capsys):
    assert run(["profile", "--mxq", str(sample_mxq), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["modes"]) == MODES
    for entry in report["modes"].values():
        assert entry["throughput_fps"] > 0 and entry["layers"]
        assert sum(row["macs"] for row in entry["layers"]) == entry["macs"]
        assert abs(sum(row["share"] for row in entry["layers"]) - 1) < 0.01
        assert all(row["sram"]["total"] <= ARIES.sram_bytes_per_core for row in entry["layers"])
    assert run(["profile", "--mxq", str(sample_mxq), "--top", "3"]) == 0
    assert "[global8]" in capsys.readouterr().out


def test_tampered_tile_program_is_rejected_at_load(sample_mxq, tmp_path):
    mxq = read_mxq(sample_mxq)
    program = json.loads(json.dumps(mxq.program))
    tensors = program["npu"]["tensors"]
    layer = program["npu"]["layers"][0]
    tensors[layer["outputs"][0]]["offset"] = tensors[layer["inputs"][0]]["offset"]  # both live at layer 0
    path = tmp_path / "tampered.mxq"
    write_mxq(path, target_device=mxq.target_device, meta=mxq.meta, program=program, consts=dict(mxq.consts),
              calib=mxq.calib)
    with pytest.raises(MxqFormatError, match="tile-level program"):
        read_mxq(path)


@pytest.mark.slow
def test_mobilenet_v2_tile_programs_match_golden_codes(tmp_path):
    import realmodels

    mblt = mblt_compile(realmodels.mobilenet_v2_onnx(), tmp_path / "m.mblt")
    model = quantize(mblt, use_random_calib=True, analysis=False).model
    program = decode(lower(model, ARIES, MODES))
    image = realmodels.photo(0)
    feeds = {model.inputs[0].name: realmodels.imagenet_tensor(image) if image is not None
             else np.random.default_rng(0).standard_normal(model.inputs[0].shape).astype(np.float32)}
    _assert_tile_program_exact(model, program, executor.quantize_inputs(model, feeds),
                               executor.run_codes(model, feeds))


def test_check_refuses_a_layer_whose_smallest_tile_exceeds_sram(tmp_path, capsys):
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.zeros((16, 512, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="WideConv")], "wide",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512, 8, 2048])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 2048])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
              str(tmp_path / "wide.onnx"))
    assert run(["check", "--model", str(tmp_path / "wide.onnx"), "--target-device", "aries-rb"]) == 1
    error = capsys.readouterr().err
    assert "WideConv" in error and "4,194,304" in error and "DOES_NOT_FIT" in error
    assert run(["check", "--model", str(SAMPLE_DIR / "model.onnx"), "--target-device", "aries-rb"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppocr_cls", "silero_ifless"])
def test_corpus_models_tile_programs_match_golden_codes(name, tmp_path):
    import realmodels

    path, shapes, constants = realmodels.real_models()[name]()
    mblt = mblt_compile(path, tmp_path / "m.mblt", input_shape_dict=shapes or None, constant_inputs=constants or None)
    model = quantize(mblt, use_random_calib=True, analysis=False, compile_config={"calibration": {"numSamples": 4}}).model
    feeds = realmodels.sample_inputs(path, shapes or None, seed=1, constant_inputs=constants or None)
    feeds = {spec.name: feeds[spec.name] for spec in model.inputs}
    _assert_tile_program_exact(model, decode(lower(model, ARIES, MODES)), executor.quantize_inputs(model, feeds),
                               executor.run_codes(model, feeds))


def _channel_local():
    """Global pooling, a reflection Pad, nearest Resize by scales, a ConvTranspose (stride 2, PP-OCR det's head),
    MaxPool and AveragePool, each with tensors larger than a small core SRAM."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    init = [numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal((3, 16, 6, 6)).astype(np.float32), "wt"),
            numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
            numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
            numpy_helper.from_array(np.array([1, 16, 96, 96], np.int64), "sizes")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Mul", ["c", "g"], ["m"]),
             helper.make_node("Pad", ["m", "pads"], ["pm"], mode="reflect"),
             helper.make_node("Resize", ["pm", "", "scales"], ["r"], mode="nearest"),
             helper.make_node("ConvTranspose", ["x", "wt"], ["t"], strides=[2, 2]),
             helper.make_node("Add", ["r", "t"], ["s"]),
             # windowed pooling at full size (ISNet's first MaxPool did not fit a core: 10 MiB in one tile)
             helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
             helper.make_node("AveragePool", ["s"], ["a"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0]),
             helper.make_node("Add", ["p", "a"], ["pa"]),
             # a linear Resize to constant sizes (ISNet's upsamplings, after their Shape/Slice/Concat fold)
             helper.make_node("Resize", ["pa", "", "", "sizes"], ["y"], mode="linear")]
    graph = helper.make_graph(nodes, "channel_local", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_channel_local_layers_split_channels_when_their_tensors_exceed_sram(tmp_path):
    onnx.save(_channel_local(), str(tmp_path / "model.onnx"))
    mblt = mblt_compile(tmp_path / "model.onnx", tmp_path / "model.mblt", backend="onnx")
    model = quantize(mblt, use_random_calib=True, analysis=False).model
    small = dataclasses.replace(ARIES, sram_bytes_per_core=64 * 1024)  # 16 x 64 x 64 is 64 KiB, 256 KiB resized
    lowered = lower(model, small, MODES)
    kinds = {layer.main(model).op_type: tiling for layer, tiling in zip(lowered.layers, lowered.modes["single"].tilings)}
    resizes = [tiling for layer, tiling in zip(lowered.layers, lowered.modes["single"].tilings)
               if layer.main(model).op_type == "Resize"]
    assert len(resizes) == 2 and all(len(tiling.tiles) > 1 for tiling in resizes)  # channel ranges or row bands
    for op_type in ("GlobalAveragePool", "Pad", "MaxPool", "AveragePool"):  # channel ranges, each reading its
        # channels of the input
        assert len({(t.c0, t.c1) for t in kinds[op_type].tiles}) > 1, op_type
    assert kinds["ConvTranspose"].rows and len(kinds["ConvTranspose"].tiles) > 1  # bands of the zero-inserted input
    program = decode(lowered)
    codes, golden = _codes(model, 2, 1.0)
    for mode in MODES:
        outputs = run_tiles(model, program, small, mode, codes)
        assert all(np.array_equal(outputs[name], value) for name, value in golden.items()), mode


@pytest.mark.parametrize("mode_attributes", [{}, {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}])
def test_nearest_resize_to_constant_sizes_splits_channels_and_stays_exact(tmp_path, mode_attributes):
    """Sizes that keep N and C are lowered as sizes of axes [2, 3], so the Resize is channel-local like one by scales
    (it was one tile of every channel: 16 x 150 x 150 int8 output alone is 352 KiB)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "", "sizes"], ["y"], mode="nearest", **mode_attributes)]
    init = [numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([1, 16, 150, 150], np.int64), "sizes")]  # not a whole scale
    graph = helper.make_graph(nodes, "sizes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
              str(tmp_path / "model.onnx"))
    model = quantize(mblt_compile(tmp_path / "model.onnx", tmp_path / "model.mblt"), use_random_calib=True,
                     analysis=False).model
    small = dataclasses.replace(ARIES, sram_bytes_per_core=96 * 1024)
    lowered = lower(model, small, MODES)
    resize = next(tiling for layer, tiling in zip(lowered.layers, lowered.modes["single"].tilings)
                  if layer.main(model).op_type == "Resize")
    assert len({(tile.c0, tile.c1) for tile in resize.tiles}) > 1  # channel ranges
    program = decode(lowered)
    codes, golden = _codes(model, 3, 1.0)
    assert golden["y"].shape == (1, 16, 150, 150)
    for mode in MODES:
        outputs = run_tiles(model, program, small, mode, codes)
        assert all(np.array_equal(outputs[name], value) for name, value in golden.items()), mode


@pytest.mark.parametrize("name", ["mtcnn_pnet", "silero_vad"])
def test_tile_exact_bench_on_corpus_models(name):
    """The fast subset of ``make tile-exact``: compiled with every core mode (CPU offload, presets) and bit-exact."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tile_exact", ROOT / "bench" / "tile_exact.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = bench.check_model(name)
    if "skipped" in row:
        pytest.skip(row["skipped"])
    assert "error" not in row, row
    assert sorted(row["modes"]) == sorted(MODES) and all(entry["exact"] for entry in row["modes"].values()), row


def _attention_products(heads_axis: bool = False):
    """Two MatMuls of activations (scores-like with a fused Sigmoid, then a product with a third input), batch 3.

    ``heads_axis``: rank-4 operands ``[1, 3, ...]`` (stored NHWC, heads innermost), a constant causal mask
    (``Where``, one row of it per row of scores) and a Softmax instead of the Sigmoid.
    """
    from onnx import TensorProto, helper, numpy_helper

    lead = [1, 3] if heads_axis else [3]
    shapes = {"a": [*lead, 20, 64], "b": [*lead, 64, 20], "v": [*lead, 20, 20]}
    nodes = [helper.make_node("MatMul", ["a", "b"], ["s"]), helper.make_node("Sigmoid", ["s"], ["p"]),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    init = []
    if heads_axis:
        init = [numpy_helper.from_array(np.tril(np.ones((1, 1, 20, 20), bool)), "mask"),
                numpy_helper.from_array(np.array(-1e4, np.float32), "low")]
        nodes[1:2] = [helper.make_node("Where", ["mask", "s", "low"], ["m"]),
                      helper.make_node("Softmax", ["m"], ["p"], axis=-1)]
    graph = helper.make_graph(nodes, "products", [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
                                                  for name, shape in shapes.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_dense_layers_over_tokens_tile_by_rows_and_channels(tmp_path):
    """Dense layers (MatMul with constant weights) over [1, tokens, features]: bands of tokens x output channels."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    init = [numpy_helper.from_array(rng.standard_normal((40, 48)).astype(np.float32), "w0"),
            numpy_helper.from_array(rng.standard_normal((48, 16)).astype(np.float32), "w1")]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("Sigmoid", ["h"], ["g"]),
             helper.make_node("MatMul", ["g", "w1"], ["y"])]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 40])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
              str(tmp_path / "model.onnx"))
    model = quantize(mblt_compile(tmp_path / "model.onnx", tmp_path / "model.mblt", backend="onnx"),
                     use_random_calib=True, analysis=False).model
    small = dataclasses.replace(ARIES, sram_bytes_per_core=3072)  # 48 x 40 weights: 2.5 KB with their parameters
    lowered = lower(model, small, MODES)
    first = lowered.modes["single"].tilings[0]
    assert first.rows and len({(t.r0, t.r1) for t in first.tiles}) > 1 and len({(t.c0, t.c1) for t in first.tiles}) > 1
    program = decode(lowered)
    codes, golden = _codes(model, 6, 1.0)
    for mode in MODES:
        outputs = run_tiles(model, program, small, mode, codes)
        assert all(np.array_equal(outputs[name], value) for name, value in golden.items()), mode


def test_concat_along_w_of_nhwc_bands_is_exact(tmp_path):
    """RoPE's rotate-half: a Concat along the last axis of rank-4 tensors, row-tiled on NHWC bands."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Concat", ["n", "s"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "rotate", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
              str(tmp_path / "model.onnx"))
    model = quantize(mblt_compile(tmp_path / "model.onnx", tmp_path / "model.mblt", backend="onnx"),
                     use_random_calib=True, analysis=False).model
    small = dataclasses.replace(ARIES, sram_bytes_per_core=2048)
    lowered = lower(model, small, MODES)
    assert all(t.rows and len(t.tiles) > 1 for t in lowered.modes["single"].tilings)
    program = decode(lowered)
    codes, golden = _codes(model, 5, 1.0)
    for mode in MODES:
        outputs = run_tiles(model, program, small, mode, codes)
        assert all(np.array_equal(outputs[name], value) for name, value in golden.items()), mode


def test_matmul_of_activations_with_heads_innermost_and_softmax_tile_by_rows(tmp_path):
    onnx.save(_attention_products(heads_axis=True), str(tmp_path / "model.onnx"))
    mblt = mblt_compile(tmp_path / "model.onnx", tmp_path / "model.mblt", backend="onnx")
    model = quantize(mblt, use_random_calib=True, analysis=False).model
    small = dataclasses.replace(ARIES, sram_bytes_per_core=8192)  # the first product is 8.9 KB as one tile
    lowered = lower(model, small, MODES)
    for mode in MODES:
        tilings = {layer.main(model).kind: t for layer, t in zip(lowered.layers, lowered.modes[mode].tilings)}
        assert tilings["softmax"].rows and len(tilings["softmax"].tiles) > 1, mode
        assert tilings["select"].rows and len(tilings["select"].tiles) > 1, mode  # the mask's rows per tile
        assert tilings["matmul"].rows and len(tilings["matmul"].tiles) > 1, mode  # bands of rows of every head
    program = decode(lowered)
    codes, golden = _codes(model, 4, 1.0)
    for mode in MODES:
        outputs = run_tiles(model, program, small, mode, codes)
        assert all(np.array_equal(outputs[name], value) for name, value in golden.items()), mode


def test_matmul_of_activations_tiles_by_rows_and_columns_and_stays_exact(tmp_path):
    onnx.save(_attention_products(), str(tmp_path / "model.onnx"))
    mblt = mblt_compile(tmp_path / "model.onnx", tmp_path / "model.mblt", backend="onnx")
    model = quantize(mblt, use_random_calib=True, analysis=False).model
    tiles = []
    for sram in (4096, 8192):  # the first product is 8.9 KB as one tile
        small = dataclasses.replace(ARIES, sram_bytes_per_core=sram)
        lowered = lower(model, small, MODES)
        for mode in MODES:
            scores = next(t for layer, t in zip(lowered.layers, lowered.modes[mode].tilings)
                          if layer.main(model).kind == "matmul")
            assert scores.rows and scores.sram["total"] <= sram, mode
            assert len({(t.r0, t.r1) for t in scores.tiles}) > 3, mode  # rows of A over the three matrices
            tiles += scores.tiles
        program = decode(lowered)
        for seed in (0, 1):
            codes, golden = _codes(model, seed, 1.0)
            for mode in MODES:
                outputs = run_tiles(model, program, small, mode, codes)
                assert all(np.array_equal(outputs[name], value) for name, value in golden.items()), (sram, mode)
    assert any(t.r0 // 20 != (t.r1 - 1) // 20 for t in tiles)  # a tile reading two matrices of B
    assert any(t.c1 - t.c0 < 20 for t in tiles)  # a tile of some columns of B


def _wide_middle():
    """Convolutions around a Transpose (H <-> W: one tile holding both 4 KiB tensors) in the middle."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    init = [numpy_helper.from_array(rng.standard_normal((16, c, 3, 3)).astype(np.float32), f"w{i}")
            for i, c in enumerate((3, 16, 16, 16))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["b"], ["t"], perm=[0, 1, 3, 2]),
             helper.make_node("Conv", ["t", "w2"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w3"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_a_layer_needing_the_whole_sram_keeps_the_others_resident(tmp_path):
    onnx.save(_wide_middle(), str(tmp_path / "model.onnx"))
    mblt = mblt_compile(tmp_path / "model.onnx", tmp_path / "model.mblt", backend="onnx")
    model = quantize(mblt, use_random_calib=True, analysis=False).model
    small = dataclasses.replace(ARIES, sram_bytes_per_core=12 * 1024)  # the Transpose needs 8 KiB, half is 6
    lowered = lower(model, small, ["single", "multi"])
    wide = next(layer.index for layer in lowered.layers if layer.main(model).op_type == "Transpose")
    for mode in ("single", "multi"):
        program = lowered.modes[mode]
        assert program.tilings[wide].sram["total"] > program.sram_base  # it takes the whole SRAM
        assert program.resident and all(not buffer.first <= wide <= buffer.last for buffer in program.resident.values())
    document, consts = to_document(lowered)
    assert npu_problem(document, consts, len(model.ops)) is None
    program = decode(lowered)
    codes, golden = _codes(model, 3, 1.0)
    for mode in ("single", "multi"):
        assert all(np.array_equal(run_tiles(model, program, small, mode, codes)[name], value)
                   for name, value in golden.items()), mode
    name = next(iter(lowered.modes["single"].resident))  # a resident tensor live across the wide layer is refused
    entry = document["modes"]["single"]["resident"][name]
    document["modes"]["single"]["resident"] = {name: {**entry, "live": [0, len(lowered.layers) - 1]}}
    assert "SRAM-resident region" in npu_problem(document, consts, len(model.ops))


def _upsampling():
    """A 4-channel 32x32 map resized bilinearly to 96x80 (ISNet's full-size upsamplings, scaled down)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    init = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([1, 4, 96, 80], np.int64), "sizes")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "", "sizes"], ["y"], mode="linear")]
    graph = helper.make_graph(nodes, "upsampling", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_a_linear_resize_whose_one_channel_exceeds_sram_tiles_by_bands_of_rows(tmp_path):
    """Found with ISNet at a16w8: one int16 channel of a 1024x1024 upsampling, double-buffered, needs 5 MiB of a
    core's 4 MiB; a band of output rows reads only the input rows its H matrix weights."""
    onnx.save(_upsampling(), str(tmp_path / "model.onnx"))
    mblt = mblt_compile(tmp_path / "model.onnx", tmp_path / "model.mblt", backend="onnx")
    model = quantize(mblt, use_random_calib=True, analysis=False).model
    small = dataclasses.replace(ARIES, sram_bytes_per_core=12 * 1024)  # one channel: 1 KiB in + 7.5 KiB out, x2
    lowered = lower(model, small, MODES)
    [resize] = [tiling for layer, tiling in zip(lowered.layers, lowered.modes["single"].tilings)
                if layer.main(model).op_type == "Resize"]
    assert resize.rows and len({(t.r0, t.r1) for t in resize.tiles}) > 1
    program = decode(lowered)
    codes, golden = _codes(model, 4, 1.0)
    for mode in MODES:
        outputs = run_tiles(model, program, small, mode, codes)
        assert all(np.array_equal(outputs[name], value) for name, value in golden.items()), mode


def test_a_dense_layer_over_the_last_axis_of_a_rank4_tensor_tiles_by_rows_with_all_its_weights(tmp_path):
    """A MatMul by a constant over the last axis of a [1, H, W, C] tensor (an additive-attention score, a Linear over
    a channels-last feature map) is stored NHWC. It was one tile: text2tashkeel's [1, 64, 64, 512] x [512, 1] needed
    4 MiB and was refused (DOES_NOT_FIT), and its program loaded only as many weight rows as the tensor has
    channels (H here), so the tile-level program was not the golden executor's. Now it tiles by rows, keeps every
    weight resident and runs bit-exact in every mode."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("MatMul", ["t", "w"], ["y"])]
    graph = helper.make_graph(nodes, "dense4d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 32, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 32, 24])],
                              [numpy_helper.from_array(rng.standard_normal((64, 24)).astype(np.float32) * 0.2, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10),
              str(tmp_path / "model.onnx"))
    mblt = mblt_compile(tmp_path / "model.onnx", tmp_path / "model.mblt", backend="onnx")
    model = quantize(mblt, use_random_calib=True, analysis=False).model
    small = dataclasses.replace(ARIES, sram_bytes_per_core=64 * 1024)  # the 64 KiB input alone, double-buffered
    lowered = lower(model, small, MODES)
    dense = next(tiling for layer, tiling in zip(lowered.layers, lowered.modes["single"].tilings)
                 if layer.main(model).op_type == "MatMul")
    assert dense.rows and len(dense.tiles) > 1
    _assert_tile_program_exact(model, decode(lowered), *_codes(model, 2, 1.0))
