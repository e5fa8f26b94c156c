"""Cost model vs the published ARIES throughputs (out-of-sample: nothing is fitted to them).

Builds ResNet-50, MobileNetV2, YOLOv5n and YOLO11 s/m/l in torch with random weights
(bench/architectures.py; MobileNetV2 is the test corpus's), exports each to ONNX, parses it,
quantizes it (random calibration: latency does not depend on the values), lowers it for aries-rb in
every core mode (compiler_core/backend) and reads the estimate from the tile-level program
(compiler_core/runtime/cost.py). Prints, per model, the FPS of each core mode, the best one, the
published figure and the relative error. No constant of the cost model was calibrated.

Usage: ``python bench/cost_model.py [--models resnet50,mobilenet_v2,...] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

PUBLISHED_FPS = {"resnet50": 3082, "mobilenet_v2": 11551, "yolo11s": 784, "yolo11m": 340, "yolo11l": 259,
                 "yolov5n": 3040}
"""ARIES throughput published by the vendor (third-party figures; the out-of-sample check)."""
INPUT_SIZE = {"resnet50": 224, "mobilenet_v2": 224, "yolo11s": 640, "yolo11m": 640, "yolo11l": 640, "yolov5n": 640}
MODES = ("single", "multi", "global4", "global8")


def _module(name: str):
    import architectures

    if name == "resnet50":
        return architectures.ResNet50()
    if name == "yolov5n":
        return architectures.Yolov5n()
    return architectures.Yolo11(name[-1])


def export(name: str, folder: Path) -> Path:
    """The model as ONNX (MobileNetV2: the corpus export)."""
    if name == "mobilenet_v2":
        import realmodels

        return realmodels.mobilenet_v2_onnx()
    import torch

    torch.manual_seed(0)
    path = folder / f"{name}.onnx"
    example = torch.zeros(1, 3, INPUT_SIZE[name], INPUT_SIZE[name])
    with torch.no_grad():
        torch.onnx.export(_module(name).eval(), (example,), str(path), dynamo=False, opset_version=17,
                          input_names=["images"], output_names=["output"])
    return path


def measure(name: str, folder: Path) -> dict:
    """Estimates of every core mode for one model."""
    from compiler_core.api import mblt_compile, quantize
    from compiler_core.backend.program import decode, lower
    from compiler_core.runtime.cost import estimate
    from compiler_core.targets import get_device

    device = get_device("aries-rb")
    started = time.perf_counter()
    mblt = mblt_compile(export(name, folder), folder / f"{name}.mblt")
    model = quantize(mblt, use_random_calib=True, analysis=False,
                     compile_config={"calibration": {"numSamples": 2}}).model
    program = decode(lower(model, device, MODES))
    modes = {mode: estimate(model, device, mode, program) for mode in MODES}
    best = max(modes.values(), key=lambda e: e.throughput_fps)
    published = PUBLISHED_FPS[name]
    return {"model": name, "gmacs": best.macs / 1e9, "fps": {m: e.throughput_fps for m, e in modes.items()},
            "latency_ms": {m: e.latency_ms for m, e in modes.items()},
            "dram_mb": {m: e.dram_bytes / 1e6 for m, e in modes.items()}, "best_mode": best.mode,
            "best_fps": best.throughput_fps, "published_fps": published,
            "error": best.throughput_fps / published - 1, "seconds": time.perf_counter() - started}


def table(rows: list[dict]) -> str:
    """The markdown table of docs/cost-model.md."""
    lines = ["| model | GMACs | single | multi | global4 | global8 | best | published | error |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for row in rows:
        fps = row["fps"]
        lines.append(f"| {row['model']} | {row['gmacs']:.2f} | " + " | ".join(f"{fps[m]:,.0f}" for m in MODES)
                     + f" | {row['best_mode']} | {row['published_fps']:,} | {row['error']:+.0%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(PUBLISHED_FPS), help="comma-separated subset")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as temp:
        for name in args.models.split(","):
            row = measure(name, Path(temp))
            rows.append(row)
            print(f"{name}: best {row['best_mode']} {row['best_fps']:,.0f} FPS vs published {row['published_fps']:,} "
                  f"({row['error']:+.0%}); {row['seconds']:.0f} s", flush=True)
    print()
    print(table(rows))
    within = sum(abs(row["error"]) <= 0.25 for row in rows)
    print(f"\n{within} of {len(rows)} within +-25 %; nothing fitted to these figures.")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
