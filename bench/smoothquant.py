"""SmoothQuant benchmark: all-MiniLM-L6-v2 (S=128) sentence embeddings under lighter precisions, same run.

Calibration on ``--calib`` sentences (``tests/realdata.py`` calibration split, the test's manifest),
evaluation on ``--eval`` held-out sentences (the disjoint ``eval`` split). Per configuration, the
mean-pooled sentence embedding's cosine to FP32 (onnxruntime on the MBLT), the number of weight
MatMuls whose activation input is int8 (of 36), the int16 tensors, and the estimated aries-rb
latency (``single`` core mode, the cost model) against the a16w8 ``transformer_encoder`` row of the
same run. The statistics are collected once and cached; every row re-quantizes from them.

Rows:

- ``transformer_encoder``: int16 activations everywhere (a16w8), the reference for latency.
- int16 only for Softmax/LayerNorm/GELU, MaxPercentile (the figure of issue 12) and Max.
- plus ``bit.residualBits 16`` (attention-output and FFN-down outputs, the residual stream's outliers).
- plus LayerNorm copies with int8 outputs for the MatMuls, without SmoothQuant (alpha 0).
- ``transformer_encoder_int8``: the same with SmoothQuant (alpha 0.7), and with alpha 0.5.

Usage: ``python bench/smoothquant.py [--calib 64] [--eval 32] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

import realdata  # noqa: E402
import realmodels  # noqa: E402

NORMS = ["LayerNormalization*", "Softmax*", "Gelu*"]
MAX = {"method": 1, "mode": 0}


def rows() -> dict[str, dict]:
    """Configuration label -> ``quantize()`` keyword arguments."""
    only = {"layerOverrides": {"activation16Bits": NORMS}}
    residual = {"residualBits": 16, **only}
    copies = {"apply": True, "duplicateNorms": True}
    return {
        "transformer_encoder (a16w8)": {"config_preset": "transformer_encoder"},
        "int16 Softmax/LN/GELU, MaxPercentile": {"calibration_config": {"method": 1, "mode": 1}, "bit_config": only},
        "int16 Softmax/LN/GELU, Max": {"calibration_config": MAX, "bit_config": only},
        "+ residualBits 16": {"calibration_config": MAX, "bit_config": residual},
        "+ int8 LN copies, no SmoothQuant": {"calibration_config": MAX, "bit_config": residual,
                                             "equivalent_transformation_config": {**copies, "alpha": 0.0}},
        "transformer_encoder_int8 (alpha 0.7)": {"config_preset": "transformer_encoder_int8"},
        "  same, alpha 0.5": {"config_preset": "transformer_encoder_int8",
                              "equivalent_transformation_config": {**copies, "alpha": 0.5}},
    }


def pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over the attended tokens."""
    weights = mask[..., None].astype(np.float64)
    return (hidden * weights).sum(1) / weights.sum(1)


def measure(mblt: Path, manifest: Path, feeds: dict, fp32: np.ndarray, options: dict) -> dict:
    """One row: cosine, int8-input MatMuls, int16 tensors, latency."""
    from compiler_core.api import quantize
    from compiler_core.runtime.cost import estimate
    from compiler_core.runtime.fastpath.plan import executor_for
    from compiler_core.targets.devices import get_device

    started = time.perf_counter()
    model = quantize(mblt, manifest, analysis_holdout=0, analysis=False, **options).model
    seconds = time.perf_counter() - started
    fast = executor_for(model)
    count = len(fp32)
    hidden = np.concatenate([fast.run({k: v[i:i + 1] for k, v in feeds.items()})["last_hidden_state"]
                             for i in range(count)]).astype(np.float64)
    similarity = realdata.cosine(pooled(fp32, feeds["attention_mask"]), pooled(hidden, feeds["attention_mask"]))
    linears = [op for op in model.ops if op.kind == "linear"]
    summary = model.summary()
    return {"cosine_mean": float(similarity.mean()), "cosine_min": float(similarity.min()),
            "int8_input_matmuls": sum(model.params(op.inputs[0]).bits == 8 for op in linears),
            "matmuls": len(linears), "int16_tensors": summary["int16_tensors"], "tensors": summary["tensors"],
            "latency_ms": estimate(model, get_device("aries-rb"), "single").latency_ms, "quantize_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calib", type=int, default=64)
    parser.add_argument("--eval", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from compiler_core.api import mblt_compile

    with tempfile.TemporaryDirectory(prefix="bench-smoothquant-") as folder:
        shapes = {name: [1, 128] for name in realmodels.MINILM_INPUT_NAMES}
        mblt = mblt_compile(realmodels.minilm_onnx(128), Path(folder) / "minilm.mblt", input_shape_dict=shapes)
        manifest = realdata.minilm_calibration_manifest(args.calib)
        feeds = realmodels.tokenize(realdata.english_sentences(args.eval, "eval"))
        fp32 = realdata.run_float(mblt, feeds, "last_hidden_state")
        report = {label: measure(mblt, manifest, feeds, fp32, options) for label, options in rows().items()}
    reference = next(iter(report.values()))["latency_ms"]
    print(f"all-MiniLM-L6-v2 S=128: {args.calib} calibration, {args.eval} held-out sentences; latency aries-rb single")
    print(f"{'configuration':40s} {'cos mean':>8s} {'cos min':>8s} {'int8-in MatMuls':>15s} {'int16 tensors':>13s} "
          f"{'latency ms':>10s} {'vs a16w8':>8s}")
    for label, row in report.items():
        print(f"{label:40s} {row['cosine_mean']:8.4f} {row['cosine_min']:8.4f} "
              f"{row['int8_input_matmuls']:>9d} of {row['matmuls']:<3d} {row['int16_tensors']:>6d} of {row['tensors']:<4d} "
              f"{row['latency_ms']:10.3f} {row['latency_ms'] / reference:8.3f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
