"""A log front end on the CPU (``cpuLayers.head``) vs everything on the NPU, on the corpus's log-spectrum models.

For each model (``basic_pitch``, ``oww_melspectrogram`` of ``tests/corpus.py``, real LibriVox speech: ``N_CALIB``
calibration and ``N_EVAL`` held-out samples) and each precision (default int8, preset a16w8), the same MBLT is
compiled all on the NPU and with the chosen head layers on the CPU, in the same run. Per variant: the worst output's
cosine to onnxruntime FP32 (mean / min over the held-out samples), the compile's estimated NPU latency (cost model,
first core mode), and the ratio of the errors ``(1 - cos head) / (1 - cos NPU)``; for the head variants the CPU
head's op counts and its median onnxruntime time per sample on this machine (wall clock, noisy).

Usage: ``PYTHONPATH=$PWD python bench/cpu_front_end.py [--models a,b] [--json FILE]``. Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

import corpus  # noqa: E402
from corpus import N_CALIB, N_EVAL  # noqa: E402

HEADS = {"oww_melspectrogram": ["Log_0"], "basic_pitch": ["Log_0"]}
"""MBLT node names of each model's Log of a power (the head takes every layer before it)."""
PRECISIONS = {"int8": None, "a16w8": "a16w8"}


def _head_cost(mxq: Path, sample: dict[str, np.ndarray]) -> dict:
    import onnx
    import onnxruntime as ort

    from compiler_core.runtime import Model

    artifact = Model(mxq).artifact
    head = artifact.cpu_models.get("head")
    if head is None:
        return {}
    proto = onnx.load_from_string(head)
    session = ort.InferenceSession(head, providers=["CPUExecutionProvider"])
    feeds = {item.name: sample[item.name] for item in session.get_inputs()}
    times = []
    for _ in range(5):
        started = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - started)
    return {"ops": dict(Counter(node.op_type for node in proto.graph.node).most_common()),
            "nodes": len(proto.graph.node), "ort_ms_median": round(1000 * float(np.median(times)), 3)}


def measure(name: str, scratch: Path) -> list[dict]:
    from compiler_core.api import mblt_compile, mxq_compile

    entry = corpus.corpus_by_name()[name]
    mblt = mblt_compile(entry.source(), scratch / f"{name}.mblt", input_shape_dict=entry.input_shape_dict or None,
                        output_names=list(entry.output_names) or None)
    specs = corpus._mblt_inputs(mblt)
    calib = [entry.feed(specs, "calib", index) for index in range(N_CALIB)]
    evaluation = [entry.feed(specs, "eval", index) for index in range(N_EVAL)]
    manifest = corpus.write_manifest(scratch / f"{name}-calib", calib)
    rows = []
    for precision, preset in PRECISIONS.items():
        for where in ("npu", "cpu head"):
            mxq = scratch / f"{name}-{precision}-{where.replace(' ', '_')}.mxq"
            layers = {"head": HEADS[name]} if where == "cpu head" else None
            started = time.perf_counter()
            mxq_compile(mblt, target_device=corpus.DEVICE, calib_data_path=manifest, save_path=mxq,
                        config_preset=preset, analysis_holdout=0, cpu_layers=layers)
            seconds = time.perf_counter() - started
            cosine = corpus._accuracy(mblt, mxq, evaluation)
            worst = min(cosine, key=lambda output: cosine[output]["mean"])
            row = {"model": name, "precision": precision, "where": where, "compile_s": round(seconds, 1),
                   "worst_output": worst, "cosine_mean": cosine[worst]["mean"], "cosine_min": cosine[worst]["min"],
                   "outputs": cosine, "latency_ms": _latency(mxq), "samples": {"calib": N_CALIB, "eval": N_EVAL}}
            if layers:
                row["head"] = _head_cost(mxq, evaluation[0])
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def _latency(mxq: Path) -> float:
    from compiler_core.runtime import Accelerator, Model

    model = Model(mxq)
    model.launch(Accelerator(model.artifact.device))
    return model.estimate()["latency_ms"]


def _line(row: dict) -> str:
    head = row.get("head") or {}
    cost = f"; CPU head {head['nodes']} nodes, ort {head['ort_ms_median']} ms" if head else ""
    return (f"{row['model']:20s} {row['precision']:6s} {row['where']:9s} cosine mean {row['cosine_mean']:.5f} "
            f"min {row['cosine_min']:.5f} ({row['worst_output']}), NPU latency {row['latency_ms']:.3f} ms (estimate), "
            f"compile {row['compile_s']} s{cost}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(HEADS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="cpu-front-end-") as folder:
        for name in args.models.split(","):
            rows += measure(name, Path(folder))
    print("\nerror ratio (1 - cos, CPU head / all NPU), worst output mean:")
    for npu, cpu in zip(rows[::2], rows[1::2]):
        ratio = (1 - cpu["cosine_mean"]) / max(1 - npu["cosine_mean"], 1e-12)
        print(f"  {npu['model']:20s} {npu['precision']:6s} {ratio:.4f}; NPU latency "
              f"{cpu['latency_ms'] / npu['latency_ms']:.3f}x of all-NPU")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
