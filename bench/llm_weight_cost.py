"""Cost of int16 weights for a compiled LLM: its MXQs' cost-model latency beside the same programs with int8 weights.

Reads a manifest compiled with int16 weights (``llm_accurate``), and per graph (prefill, decode) and
core mode prints the cost model's latency of the program as compiled and of the same program with
every weight stored as int8 (one byte per weight, int16 x int8 MAC passes), both lowered by the
backend in this run (the same method for both; weights do not change latency, only their width).
Then TTFT (a prompt of N tokens) and tokens/s per core mode for each.

Usage: ``python bench/llm_weight_cost.py build/llm/smollm2-w16/smollm2.llm.json [--modes global8 single]``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402


def with_int8_weights(program):
    """A copy of ``program`` whose weights are int8 (values halved in width; only the width matters here)."""
    narrowed = copy.copy(program)
    narrowed.ops = []
    for op in program.ops:
        if "weight" in op.consts and op.consts["weight"].dtype == np.int16:
            op = copy.copy(op)
            op.consts = {**op.consts, "weight": (op.consts["weight"] >> 8).astype(np.int8)}
        narrowed.ops.append(op)
    return narrowed


def latency_ms(program, device, mode: str) -> float:
    """Cost-model latency of ``program`` in ``mode``, lowered by the backend here."""
    from compiler_core.runtime.cost import estimate

    rows = estimate(program, device, mode).layers
    return sum(row["cycles"] for row in rows) / device.clock_hz * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest")
    parser.add_argument("--modes", nargs="+", default=["single", "global8"])
    args = parser.parse_args()

    from compiler_core.llm import read_manifest
    from compiler_core.runtime.artifact import load_artifact
    from compiler_core.targets.devices import get_device

    path = Path(args.manifest)
    manifest = read_manifest(path)
    found = {}
    for kind in ("prefill", "decode"):
        artifact = load_artifact(path.parent / manifest[kind])
        device = get_device(artifact.device)
        for mode in args.modes:
            found[kind, mode] = {"int16": latency_ms(artifact.program, device, mode),
                                 "int8": latency_ms(with_int8_weights(artifact.program), device, mode)}
            print(f"{kind:8s} {mode:8s} int16 weights {found[kind, mode]['int16']:8.2f} ms, int8 weights "
                  f"{found[kind, mode]['int8']:8.2f} ms ({found[kind, mode]['int16'] / found[kind, mode]['int8']:.2f}x)",
                  flush=True)
    n = manifest["prefill_len"]
    for mode in args.modes:
        for width in ("int8", "int16"):
            print(f"{mode:8s} {width:5s} weights: TTFT ({n} tokens) {found['prefill', mode][width]:7.2f} ms, "
                  f"{1e3 / found['decode', mode][width]:7.1f} tokens/s")


if __name__ == "__main__":
    main()
