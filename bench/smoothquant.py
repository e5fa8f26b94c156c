"""SmoothQuant benchmark: all-MiniLM-L6-v2 (S=128) sentence embeddings under lighter precisions, same run.

Calibration on ``--calib`` sentences (``tests/realdata.py`` calibration split, the test's manifest),
evaluation on ``--eval`` held-out sentences (the disjoint ``eval`` split: other standard-library
modules' docstrings). Per configuration, the mean-pooled sentence embedding's cosine to FP32
(the fast executor of the integer program against onnxruntime on the MBLT), the number of weight
MatMuls whose activation input is int8 (of 36), the int16 tensors, and the estimated aries-rb
latency (``single`` core mode, the cost model) against the a16w8 ``transformer_encoder`` row of the
same run. The statistics are collected once and cached; every row re-quantizes from them.

Rows ("strict": a8w8 with int16 only for Softmax/LayerNorm/GELU, the rule of issue 12):

- ``transformer_encoder``: int16 activations everywhere (a16w8), the reference for latency.
- strict, MaxPercentile (the figure of issue 12) and Max.
- diagnosis: strict Max with int16 on one class of tensors only (``--diagnose`` adds every class): the
  FFN-down outputs alone recover the loss, no other class does.
- ``bit.residualBits 16`` (int16 residual-branch outputs: not strict).
- strict + SmoothQuant (LayerNorm copies, alpha 0.7) with one scale per residual-branch output.
- strict + per-feature residual-branch scales (``bit.residualScales channel``) with LayerNorm copies but no
  smoothing (alpha 0).
- ``transformer_encoder_int8``: strict + SmoothQuant (alpha 0.7) + per-feature residual-branch scales, and
  with alpha 0.5.

Usage: ``python bench/smoothquant.py [--calib 64] [--eval 128] [--diagnose] [--json out.json]``.
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
LAYERS = 6
CLASSES = {  # MBLT MatMul names per layer of all-MiniLM-L6-v2 (8 per layer): output class -> offsets
    "FFN-down outputs": (7,), "attention-output outputs": (5,), "Q/K/V outputs": (0, 1, 2),
    "FFN-up outputs (GELU input)": (6,), "scores and context": (3, 4)}
COPIES = {"apply": True, "duplicateNorms": True}


def _strict_with(extra: list[str]) -> dict:
    return {"calibration_config": MAX, "bit_config": {"layerOverrides": {"activation16Bits": NORMS + extra}}}


def _diagnosis(every_class: bool) -> dict[str, dict]:
    """Strict Max with int16 on the outputs of one class of MatMuls."""
    chosen = CLASSES if every_class else {key: CLASSES[key] for key in list(CLASSES)[:2]}
    return {f"  strict + int16 {label}": _strict_with([f"MatMul_{8 * layer + offset}" for layer in range(LAYERS)
                                                      for offset in offsets]) for label, offsets in chosen.items()}


def rows(diagnose: bool = False) -> dict[str, dict]:
    """Configuration label -> ``quantize()`` keyword arguments."""
    strict = {"layerOverrides": {"activation16Bits": NORMS}}
    channel = {"residualScales": "channel", **strict}
    return {
        "transformer_encoder (a16w8)": {"config_preset": "transformer_encoder"},
        "strict, MaxPercentile": {"calibration_config": {"method": 1, "mode": 1}, "bit_config": strict},
        "strict, Max": {"calibration_config": MAX, "bit_config": strict},
        **_diagnosis(diagnose),
        "residualBits 16 (not strict)": {"calibration_config": MAX, "bit_config": {"residualBits": 16, **strict}},
        "strict + SmoothQuant 0.7, one residual scale": {
            "calibration_config": MAX, "bit_config": strict,
            "equivalent_transformation_config": {**COPIES, "alpha": 0.7}},
        "strict + per-feature residual, LN copies, alpha 0": {
            "calibration_config": MAX, "bit_config": channel,
            "equivalent_transformation_config": {**COPIES, "alpha": 0.0}},
        "transformer_encoder_int8 (alpha 0.7)": {"config_preset": "transformer_encoder_int8"},
        "  same, alpha 0.5": {"config_preset": "transformer_encoder_int8",
                              "equivalent_transformation_config": {**COPIES, "alpha": 0.5}},
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
    parser.add_argument("--eval", type=int, default=128)
    parser.add_argument("--diagnose", action="store_true", help="int16 on every class of MatMul outputs, one at a time")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from compiler_core.api import mblt_compile

    with tempfile.TemporaryDirectory(prefix="bench-smoothquant-") as folder:
        shapes = {name: [1, 128] for name in realmodels.MINILM_INPUT_NAMES}
        mblt = mblt_compile(realmodels.minilm_onnx(128), Path(folder) / "minilm.mblt", input_shape_dict=shapes)
        manifest = realdata.minilm_calibration_manifest(args.calib)
        feeds = realmodels.tokenize(realdata.english_sentences(args.eval, "eval"))
        fp32 = realdata.run_float(mblt, feeds, "last_hidden_state")
        report = {label: measure(mblt, manifest, feeds, fp32, options) for label, options in rows(args.diagnose).items()}
    reference = next(iter(report.values()))["latency_ms"]
    print(f"all-MiniLM-L6-v2 S=128: {args.calib} calibration, {args.eval} held-out sentences; latency aries-rb single")
    print(f"{'configuration':52s} {'cos mean':>8s} {'cos min':>8s} {'int8-in MatMuls':>15s} {'int16 tensors':>13s} "
          f"{'latency ms':>10s} {'vs a16w8':>8s}")
    for label, row in report.items():
        print(f"{label:52s} {row['cosine_mean']:8.4f} {row['cosine_min']:8.4f} "
              f"{row['int8_input_matmuls']:>9d} of {row['matmuls']:<3d} {row['int16_tensors']:>6d} of {row['tensors']:<4d} "
              f"{row['latency_ms']:10.3f} {row['latency_ms'] / reference:8.3f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
