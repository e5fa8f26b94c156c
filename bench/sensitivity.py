"""Sensitivity analysis cost and fidelity on MobileNetV2 (real photos), against a compile in the same run.

1. One ``mxq_compile`` of MobileNetV2 (preset ``classification``, 64 calibration photos, 16 held out)
   fills the statistics cache; a second compile, timed, hits it (the reference: "one compile").
2. ``api.sensitivity`` on the same data and cache (``--samples`` held-out photos per variant), timed;
   the bench prints the ratio sensitivity / compile (the issue's bound: <= 2).
3. Fidelity of the fake-quantization proxy: for the ``--check`` layers with the largest and the
   ``--check`` with the smallest proxy int16 gain, the bit-exact program is rebuilt with only that layer
   in int16 (activations and weights, on the cached statistics) and its output SQNR on the same samples
   measured by the fast simulator; the bench prints both gains per layer and their Spearman rank
   correlation.

Usage: ``python bench/sensitivity.py [--samples 2] [--check 6] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
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


def spearman(first: list[float], second: list[float]) -> float:
    """Spearman rank correlation (no ties expected)."""
    a = np.argsort(np.argsort(first)).astype(float)
    b = np.argsort(np.argsort(second)).astype(float)
    return float(np.corrcoef(a, b)[0, 1])


def bit_exact_gains(mblt: Path, calib: Path, layers: list[str], samples: int) -> tuple[float, dict[str, float]]:
    """Output SQNR of the int8 program and the SQNR gain with each layer alone in int16 (bit-exact)."""
    from compiler_core.analysis.compare import analyze
    from compiler_core.config import resolve_config
    from compiler_core.progress import Reporter
    from compiler_core.quantization.mixed_precision import exact_pattern, target_metric, with_overrides
    from compiler_core.quantization.run import calibration_statistics, quantize_from_statistics
    from compiler_core.session import MbltSession

    config = resolve_config(config_preset="classification", target_device="aries-rb",
                            preprocessing_config=realdata.IMAGENET_PREPROCESSING)
    session = MbltSession.open(mblt)
    _, holdout, stats, _ = calibration_statistics(session, config, calib_data_path=str(calib), reporter=Reporter())
    chosen = [sample for _, sample in zip(range(samples), holdout)]

    def sqnr(cfg) -> float:
        graph, model = quantize_from_statistics(session.graph, stats, cfg)
        return target_metric(analyze(graph, model, chosen, num_samples=len(chosen), per_layer=False), "sqnrDb")

    base = sqnr(config)
    gains = {}
    for layer in layers:
        cfg = with_overrides(config, [layer], [layer])
        gains[layer] = sqnr(cfg) - base
        assert exact_pattern(layer) in cfg.bit.layer_overrides.activation16_bits
    return base, gains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2, help="held-out photos per variant (default 2)")
    parser.add_argument("--check", type=int, default=6, help="layers from each end of the ranking checked bit-exactly")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    from compiler_core.api import mblt_compile, mxq_compile, sensitivity

    calib, _ = realdata.imagenet_photo_sets(64, 40)
    common = {"config_preset": "classification", "preprocessing_config": realdata.IMAGENET_PREPROCESSING}
    with tempfile.TemporaryDirectory(prefix="bench-sensitivity-") as scratch:
        folder = Path(scratch)
        os.environ["QBCOMPILER_CACHE_DIR"] = str(folder / "cache")
        mblt = mblt_compile(realmodels.mobilenet_v2_onnx(), folder / "mobilenet_v2.mblt",
                            input_shape_dict={"input": realmodels.MOBILENET_SHAPE})
        mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=folder / "a.mxq", **common)
        started = time.perf_counter()
        compiled = mxq_compile(mblt, target_device="aries-rb", calib_data_path=calib, save_path=folder / "b.mxq",
                               **common)
        compile_seconds = time.perf_counter() - started
        assert compiled.quantize.statistics_from_cache
        started = time.perf_counter()
        report = sensitivity(mblt, calib, target_device="aries-rb", samples=args.samples, **common)
        sensitivity_seconds = time.perf_counter() - started
        assert report.statistics_from_cache
        ranked = sorted((row for row in report.layers if row["gain_db"] is not None and row["op"] != "input"),
                        key=lambda row: -row["gain_db"])
        checked = ranked[:args.check] + ranked[-args.check:]
        base, exact = bit_exact_gains(mblt, calib, [row["layer"] for row in checked], args.samples)
    proxy = {row["layer"]: row["gain_db"] for row in checked}
    rho = spearman([proxy[name] for name in exact], [exact[name] for name in exact])
    result = {"compile_seconds": compile_seconds, "sensitivity_seconds": sensitivity_seconds,
              "ratio": sensitivity_seconds / compile_seconds, "layers": len(report.layers),
              "variants": report.variants, "samples": report.samples, "stages": report.seconds,
              "proxy_baseline": report.baseline, "bit_exact_base_sqnr_db": base,
              "checked": {name: {"proxy_gain_db": proxy[name], "bit_exact_gain_db": exact[name]} for name in exact},
              "spearman": rho}
    print(f"MobileNetV2: compile (cached statistics) {compile_seconds:.1f} s, sensitivity of {len(report.layers)} "
          f"layers ({report.variants} proxy runs, {report.samples} samples) {sensitivity_seconds:.1f} s: "
          f"ratio {result['ratio']:.2f}")
    print(f"int8 output SQNR: proxy {report.baseline['sqnr_db']:.2f} dB, bit-exact {base:.2f} dB")
    print(f"{'layer':16s} {'proxy int16 gain':>17s} {'bit-exact gain':>15s}")
    for name in exact:
        print(f"{name:16s} {proxy[name]:17.2f} {exact[name]:15.2f}")
    print(f"Spearman rank correlation (proxy vs bit-exact, {len(exact)} layers): {rho:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
