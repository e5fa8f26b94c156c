"""Convolutions refitted to their quantized inputs (``bit.weightRounding: sequential``).

On the mobile-backbone block of ``test_channel_scales`` (Conv -> HardSwish -> depthwise Conv -> HardSwish ->
pointwise Conv, two channels 40x wider than the rest; int8 activations with per-channel scales and zero
points): the refit changes only the Conv layers' weight codes and biases (same scales and multipliers), the
program stays exact across executors (golden, fast path, tile simulator, MXQ runtime), and on held-out samples the output is closer to FP32 than with
round-to-nearest or with GPTQ on the FP32 inputs (Gaussian inputs, whose rounding is nearly independent noise:
a small gain, 0.4 dB; per-tensor scales, where the narrow channels keep a few codes, 0.7 dB).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from test_channel_scales import _programs as _block_programs
from test_channel_scales import _samples

from compiler_core.api import mxq_compile
from compiler_core.backend.program import decode, lower
from compiler_core.quantization import executor
from compiler_core.runtime import Accelerator, Model
from compiler_core.runtime.fastpath.plan import executor_for
from compiler_core.runtime.tilesim import run_tiles
from compiler_core.targets import CORE_MODES, get_device

pytest.importorskip("torch")

SCALES = "channel"
SETTINGS = {"calibration_config": {"method": 2}, "analysis": False, "analysis_holdout": 0}


def _programs(tmp_path):
    return _block_programs(tmp_path, {rounding: {"activationScales": SCALES, "weightRounding": rounding}
                                      for rounding in ("nearest", "gptq", "sequential")})


def test_sequential_refit_changes_only_codes_and_biases_and_brings_the_output_closer(tmp_path):
    source, mblt, calib, programs = _programs(tmp_path)
    nearest, refit = ({op.name: op for op in programs[key].ops if op.kind == "linear"} for key in ("nearest", "sequential"))
    assert set(nearest) == set(refit) and len(refit) == 3
    changed = 0
    for name, op in refit.items():
        before = nearest[name]
        assert op.attrs == before.attrs  # same weight scales, zero points, clamp
        for const in ("multiplier", "shift"):
            np.testing.assert_array_equal(op.consts[const], before.consts[const])
        assert op.consts["weight"].dtype == np.int8 and op.consts["bias"].dtype == np.int32
        changed += not np.array_equal(op.consts["weight"], before.consts["weight"])
    assert changed == 3
    reference = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    fast = executor_for(programs["sequential"])
    errors = {key: [] for key in programs}
    held_out = _samples(8, 7)
    for sample in held_out:
        expected = reference.run(None, sample)[0]
        golden = executor.run(programs["sequential"], sample)["y"]
        np.testing.assert_array_equal(fast.run(sample)["y"], golden)
        for key, program in programs.items():
            errors[key].append(float(np.mean((executor.run(program, sample)["y"] - expected) ** 2)))
    gain = {key: 10 * np.log10(np.mean(errors[key]) / np.mean(errors["sequential"])) for key in ("nearest", "gptq")}
    assert gain["nearest"] > 0.2 and gain["gptq"] > 0.2, (gain, errors)  # 0.41 / 0.46 dB measured
    model = programs["sequential"]
    small = dataclasses.replace(get_device("aries-rb"), sram_bytes_per_core=16 * 1024)  # several tiles per layer
    program = decode(lower(model, small, list(CORE_MODES)))
    codes, golden = executor.quantize_inputs(model, held_out[0]), executor.run_codes(model, held_out[0])
    for mode in CORE_MODES:
        outputs = run_tiles(model, program, small, mode, codes)
        assert all(np.array_equal(outputs[name], value) for name, value in golden.items()), mode
    compiled = mxq_compile(mblt, save_path=tmp_path / "block.mxq", calib_data_path=calib, target_device="aries-rb",
                           bit_config={"activationScales": "channel", "weightRounding": "sequential"}, **{
                               k: v for k, v in SETTINGS.items() if k != "analysis"})
    runtime = Model(compiled.mxq_path, input_layout="NCHW")
    runtime.launch(Accelerator("aries-rb"))
    np.testing.assert_array_equal(np.asarray(runtime.infer(held_out[0])[0]), executor.run(programs["sequential"],
                                                                                          held_out[0])["y"])
