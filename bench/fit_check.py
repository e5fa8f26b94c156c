"""Time of the fit check before calibration (compiler_core/backend/fit.py) on real models, against its peer.

For each model, in its own child process (so the per-process memos start empty): the support check,
the fit check (stand-in quantization + tiling of every layer) the first time and again (the memos of
interpolation matrices warm, as on a device switch in the workbench), and the peer: the same stand-in
quantization with the weight-clip search the compile runs (``weight_clip_search=True``), i.e. what the
check would cost with the quantizer used unchanged. Prints seconds and the peer / check ratio.

Usage: ``python bench/fit_check.py [--models mobilenet_v2,ppocr_det] [--mblt PATH ...]`` (an MBLT path such
as a parsed ISNet is measured as is).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

DEFAULT_MODELS = ("mobilenet_v2", "ppocr_det", "ppocr_rec", "ppocr_cls", "silero_ifless")
DEVICE = "aries-rb"


def measure(mblt: str, preset: str | None) -> dict:
    """Seconds of each step on one MBLT (run in a child process)."""
    from compiler_core.backend.fit import STAND_IN_RANGE, fit_failures
    from compiler_core.config import CompileConfig, resolve_config
    from compiler_core.mblt.io import load_mblt
    from compiler_core.quantization.pipeline import quantize_graph
    from compiler_core.targets import check_support, get_device

    graph = load_mblt(mblt)
    config = resolve_config(config_preset=preset) if preset else CompileConfig()
    device = get_device(DEVICE)
    row: dict = {"nodes": len(graph.graph)}
    started = time.perf_counter()
    row["all_supported"] = check_support(graph, DEVICE).all_supported
    row["support_s"] = time.perf_counter() - started
    for key in ("fit_first_s", "fit_again_s"):
        started = time.perf_counter()
        failures = fit_failures(graph, device, config)
        row[key] = time.perf_counter() - started
    row["too_large"] = [error.fields["layer"] for error in failures]
    started = time.perf_counter()
    quantize_graph(graph, lambda names, bits: dict.fromkeys(names, STAND_IN_RANGE), config, weight_clip_search=True)
    row["peer_clip_search_s"] = time.perf_counter() - started
    return row


def _mblt_of(name: str, folder: Path) -> str:
    import realmodels

    from compiler_core.api import mblt_compile

    path, shapes, constants = realmodels.real_models()[name]()
    return str(mblt_compile(path, folder / f"{name}.mblt", input_shape_dict=shapes or None,
                            constant_inputs=constants or None))


def _child(mblt: str, preset: str | None) -> dict:
    command = [sys.executable, __file__, "--child", mblt] + (["--preset", preset] if preset else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--mblt", action="append", default=[], help="also measure this MBLT (repeatable)")
    parser.add_argument("--preset", help="config preset (e.g. a16w8)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.preset)))
        return 0
    print(f"load average before: {os.getloadavg()}")
    header = f"{'model':16} {'nodes':>6} {'support':>8} {'fit 1st':>8} {'fit again':>9} {'peer':>8} {'peer/fit':>8}  too large"
    print(header)
    with tempfile.TemporaryDirectory(prefix="fit-bench-") as folder:
        targets = [(name, _mblt_of(name, Path(folder))) for name in args.models.split(",") if name]
        targets += [(Path(path).stem, path) for path in args.mblt]
        for name, mblt in targets:
            row = _child(mblt, args.preset)
            if "error" in row:
                print(f"{name:16} failed: {row['error']}")
                continue
            print(f"{name:16} {row['nodes']:>6} {row['support_s']:>7.3f}s {row['fit_first_s']:>7.2f}s "
                  f"{row['fit_again_s']:>8.2f}s {row['peer_clip_search_s']:>7.2f}s "
                  f"{row['peer_clip_search_s'] / row['fit_first_s']:>7.1f}x  {', '.join(row['too_large']) or '-'}")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
