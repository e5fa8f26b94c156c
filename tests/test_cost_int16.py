"""int16 in the cost model: wider data costs MAC passes, vector passes, DMA bytes and SRAM, and the
automatic mixed-precision latency budget binds on those estimates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from test_fast_executor import FAMILIES
from test_sensitivity_amp import _model_and_data

from compiler_core.api import mblt_compile, mxq_compile, quantize
from compiler_core.calibration.cache import CACHE_DIR_ENV
from compiler_core.runtime.cost import estimate
from compiler_core.targets import get_device

ARIES = get_device("aries-rb")


@pytest.fixture(autouse=True)
def statistics_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))


def test_mac_passes_follow_the_operand_widths():
    assert ARIES.mac_passes(8, 8) == 1 and ARIES.mac_passes(8, 4) == 1
    assert ARIES.mac_passes(16, 8) == 2 and ARIES.mac_passes(8, 16) == 2 and ARIES.mac_passes(16, 16) == 4


@pytest.fixture(scope="module")
def conv_mblt(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("conv16")
    onnx.save(FAMILIES["conv"](), str(folder / "model.onnx"))
    return mblt_compile(folder / "model.onnx", folder / "model.mblt", backend="onnx")


def test_int16_activations_cost_mac_passes_and_dram_bytes(conv_mblt):
    int8 = quantize(conv_mblt, use_random_calib=True, analysis=False).model
    int16 = quantize(conv_mblt, use_random_calib=True, analysis=False, config_preset="a16w8").model
    for mode in ("single", "global8"):
        low, high = estimate(int8, ARIES, mode), estimate(int16, ARIES, mode)
        assert high.macs == low.macs
        assert high.latency_ms > low.latency_ms
        macs = [(a, b) for a, b in zip(low.layers, high.layers) if a["unit"] == "mac"]
        assert macs and all(b["cycles"] >= a["cycles"] for a, b in macs)
        if mode == "global8":  # every activation through DRAM: twice the bytes of int8 codes
            assert high.dram_bytes > 1.5 * low.dram_bytes
        assert max(b["sram"]["activations"] for b in high.layers) > max(a["sram"]["activations"] for a in low.layers)


def test_a_tight_latency_budget_changes_the_mixed_precision_choice(tmp_path):
    mblt, calib = _model_and_data(tmp_path, 1000.0)
    settings = {"apply": True, "target": {"kind": "sqnrDb", "value": 20.0}, "maxInt16Fraction": 0.7,
                "channelScales": False}  # channel scales alone meet the target here (test_sensitivity_amp)
    free = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "free.mxq",
                       analysis_holdout=6, mixed_precision_config=settings).mixed_precision
    chosen = free["points"][free["chosen"]]
    assert free["target_met"] and chosen["int16_layers"] > 0 and chosen["latency_increase"] > 0.01
    budget = chosen["latency_increase"] / 2
    tight = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=tmp_path / "tight.mxq",
                        analysis_holdout=6, mixed_precision_config={**settings, "latencyBudget": budget}).mixed_precision
    picked = tight["points"][tight["chosen"]]
    assert picked["latency_increase"] <= budget + 1e-9
    assert picked["overrides"] != chosen["overrides"]
    assert not tight["target_met"] or picked["int16_layers"] < chosen["int16_layers"]
    assert all(not p["within_limits"] for p in tight["points"] if p["latency_increase"] > budget + 1e-9)
    assert np.isfinite(picked["metric"])
