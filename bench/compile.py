"""Compile and runtime benchmark: MXQ compile beside onnxruntime ``quantize_static``, and inference latency.

**Compile.** For every model, each of ``--runs`` measurements runs in a fresh Python subprocess that
imports the tool, then times the whole job from the source ONNX: ours is ``mxq_compile`` (parse,
support check, calibration, quantization, schedule of every ARIES core mode, MXQ write), the peer is
onnxruntime's recommended ``quant_pre_process`` + ``quantize_static`` (QDQ, per-channel int8
weights and activations, MinMax) saving an int8 QDQ model. Both read the same calibration samples
through the compiler's own calibration reader (photos through the ImageNet pipeline, or the
tokenized sentences of a JSON manifest). Each child uses an empty statistics cache, so every run
really calibrates. Beside the wall time, the child's CPU time (user + system, every thread: on a loaded
machine it is the steadier number). Peak memory is the child's ``VmHWM`` (as in ``bench/parse.py``), whole and as the
growth over the post-import high-water mark. The accuracy analysis on held-out samples is off by
default (``--analysis-holdout``), since the peer has none; its share shows in our stage timings.

**Runtime.** In this process: the wall time of our ``Model.infer`` (the bit-exact simulator in numpy)
beside onnxruntime on the FP32 source and on the int8 QDQ model, median over ``--infer-runs`` calls
(onnxruntime gets ten times as many, it is fast), on held-out inputs, with the ratios ours / peer.
The calls alternate in blocks over three rounds (ours, then each onnxruntime session), so a change
of machine load during the measurement weighs on both sides alike.
Beside them the cosine of each output to FP32 (mean-pooled sentence embeddings for MiniLM), and our
cost-model estimate of the virtual NPU per core mode (ARIES modes, and REGULUS single).

Usage: ``python bench/compile.py [--models mobilenet_v2,minilm_l6,ppocr_det] [--runs 1] [--infer-runs 5] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

import numpy as np  # noqa: E402
import realdata  # noqa: E402
import realmodels  # noqa: E402
from parse import _peak_rss_mb  # noqa: E402

TOOLS = ("ours", "ort_qdq")
ORT_RUNS_FACTOR = 10
EVAL_SAMPLES = 8


# -- the models ----------------------------------------------------------------------------------


def _mobilenet_spec() -> dict:
    calib, evaluation = realdata.imagenet_photo_sets()
    return {"name": "mobilenet_v2", "source": str(realmodels.mobilenet_v2_onnx()), "calib": str(calib),
            "eval": str(evaluation), "preprocessing": realdata.IMAGENET_PREPROCESSING,
            "options": {"config_preset": "classification", "preprocessing_config": realdata.IMAGENET_PREPROCESSING}}


def _minilm_spec() -> dict:
    return {"name": "minilm_l6", "source": str(realmodels.minilm_onnx(128)),
            "calib": str(realdata.minilm_calibration_manifest()), "eval": None, "preprocessing": None,
            "options": {"config_preset": "transformer_encoder"}}


OCR_DET_SIZE = 640
OCR_DET_CALIB, OCR_DET_HOLDOUT = 32, 8


def _ppocr_det_spec() -> dict:
    """PP-OCRv4 det at 640x640: 32 calibration photos and (ours) the analysis on 8 held-out ones."""
    source, shapes = realmodels.ppocr_models()["det"]
    calib, _ = realdata.imagenet_photo_sets(n_calib=OCR_DET_CALIB + OCR_DET_HOLDOUT)
    pipeline = [{"op": "resize", "height": OCR_DET_SIZE, "width": OCR_DET_SIZE, "mode": "bilinear"},
                *realdata.IMAGENET_PIPELINE[2:]]
    preprocessing = {"apply": True, "pipeline": pipeline}
    shapes = {name: [1, 3, OCR_DET_SIZE, OCR_DET_SIZE] for name in shapes}
    return {"name": "ppocr_det", "source": str(source), "calib": str(calib), "eval": None,
            "preprocessing": preprocessing, "input_shape_dict": shapes, "peer_samples": OCR_DET_CALIB,
            "analysis_holdout": OCR_DET_HOLDOUT,
            "options": {"preprocessing_config": preprocessing, "input_shape_dict": shapes,
                        "calibration_config": {"numSamples": OCR_DET_CALIB}}}


MODELS: dict[str, Callable[[], dict]] = {"mobilenet_v2": _mobilenet_spec, "minilm_l6": _minilm_spec,
                                         "ppocr_det": _ppocr_det_spec}


def eval_feeds(spec: dict, count: int) -> list[dict[str, np.ndarray]]:
    """Held-out inputs: photos of other scenes than the calibration ones, held-out sentences, or (OCR) samples."""
    if spec["name"] == "ppocr_det":
        dataset = calibration_dataset(spec)
        return [{name: value[None] if value.shape[0] != 1 else value for name, value in dataset.sample(i).items()}
                for i in range(min(count, len(dataset)))]
    if spec["eval"]:
        return [{"input": tensor[None]} for tensor in realdata.imagenet_tensors(Path(spec["eval"]))[:count]]
    tokens = realmodels.tokenize(realdata.english_sentences(count, "eval"))
    return [{name: array[i:i + 1] for name, array in tokens.items()} for i in range(count)]


# -- child process: one compile ----------------------------------------------------------------------


def calibration_dataset(spec: dict):
    """The calibration samples as the compiler reads them (model layout, batch 1)."""
    import onnx_ir as ir

    from compiler_core.calibration import input_specs, open_calibration_data

    graph = ir.load(spec["source"])
    for value in graph.graph.inputs:  # dynamic sources (PP-OCR) read at the benchmark's pinned shape
        if value.name in spec.get("input_shape_dict", {}):
            value.shape = ir.Shape(spec["input_shape_dict"][value.name])
    return open_calibration_data(spec["calib"], input_specs(graph), preprocessing=spec["preprocessing"])


class DatasetReader:
    """An onnxruntime ``CalibrationDataReader`` over a compiler calibration dataset (same samples as ours)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset
        self.position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.position >= len(self.dataset):
            return None
        self.position += 1
        return self.dataset.sample(self.position - 1)

    def rewind(self) -> None:
        self.position = 0


def _compile_ours(spec: dict, output: Path, analysis_holdout: int) -> dict:
    from compiler_core.api import mxq_compile

    holdout = spec.get("analysis_holdout", analysis_holdout)
    result = mxq_compile(spec["source"], "aries-rb", spec["calib"], output / "model.mxq", inference_scheme="all",
                         analysis_holdout=holdout, **spec["options"])
    return {"artifact": str(result.mxq_path), "timings": result.quantize.timings, "samples": result.quantize.samples,
            "size_mb": result.mxq_path.stat().st_size / 1e6}


def _compile_ort(spec: dict, output: Path, analysis_holdout: int) -> dict:
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    ort.set_default_logger_severity(3)
    prepared = realdata.ort_preprocess(_static_source(spec, output), output / "model.pre.onnx")
    target = output / "model.qdq.onnx"
    dataset = calibration_dataset(spec)
    if spec.get("peer_samples"):
        dataset = dataset.split(len(dataset) - spec["peer_samples"])[0]
    quantize_static(str(prepared), str(target), DatasetReader(dataset),
                    quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
    return {"artifact": str(target), "size_mb": target.stat().st_size / 1e6}


def _static_source(spec: dict, output: Path) -> Path:
    """The source with the benchmark's pinned input shapes (quant_pre_process needs static shapes), opset >= 13."""
    if not spec.get("input_shape_dict"):
        return Path(spec["source"])
    import onnx
    import onnx.version_converter

    model = onnx.load(spec["source"])
    for value in model.graph.input:
        for dim, size in zip(value.type.tensor_type.shape.dim, spec["input_shape_dict"].get(value.name, [])):
            dim.Clear()
            dim.dim_value = size
    del model.graph.value_info[:]
    if model.opset_import[0].version < 13:  # per-channel QDQ (DequantizeLinear axis) needs opset 13
        model = onnx.version_converter.convert_version(model, 13)
    target = output / "model.static.onnx"
    onnx.save(model, str(target))
    return target


def measure_in_child(tool: str, spec: dict, output: Path, analysis_holdout: int) -> dict:
    """Body of the child process: import the tool, then time one compile of the model in ``spec``."""
    import os

    if tool == "ours":
        import compiler_core.api  # noqa: F401  (import cost is not compile cost)
    else:
        import onnxruntime.quantization  # noqa: F401
    compile_with = {"ours": _compile_ours, "ort_qdq": _compile_ort}[tool]
    output.mkdir(parents=True, exist_ok=True)
    os.environ["QBCOMPILER_CACHE_DIR"] = str(output / "statistics-cache")
    baseline = _peak_rss_mb()
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    record = compile_with(spec, output, analysis_holdout)
    seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_started
    return {"seconds": seconds, "cpu_s": cpu, "peak_rss_mb": _peak_rss_mb(), "growth_mb": _peak_rss_mb() - baseline,
            **record}


def _cpu_seconds() -> float:
    """User + system CPU time of this process, all its threads (onnxruntime's and BLAS's workers included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- parent process: compiles ----------------------------------------------------------------------


def measure(tool: str, spec: dict, output: Path, analysis_holdout: int) -> dict:
    """Run one compile in a fresh interpreter and return its JSON record."""
    command = [sys.executable, __file__, "--child", tool, json.dumps(spec), str(output), str(analysis_holdout)]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"{tool} on {spec['name']} failed: {tail}"}
    return json.loads(lines[-1])


def compile_both(spec: dict, runs: int, scratch: Path, analysis_holdout: int) -> dict:
    """Median seconds and memory of ``runs`` fresh-process compiles per tool; the last run's artifacts."""
    result = {}
    for tool in TOOLS:
        records = [measure(tool, spec, scratch / f"{tool}-{run}", analysis_holdout) for run in range(runs)]
        errors = [record["error"] for record in records if "error" in record]
        if errors:
            result[tool] = {"error": errors[0]}
            continue
        result[tool] = {key: statistics.median(r[key] for r in records)
                        for key in ("seconds", "cpu_s", "peak_rss_mb", "growth_mb", "size_mb")}
        result[tool].update({key: records[-1][key] for key in ("artifact", "timings", "samples") if key in records[-1]})
    return result


# -- parent process: inference ----------------------------------------------------------------------


def _median_seconds(call: Callable[[dict], object], feeds: list[dict], runs: int) -> float:
    call(feeds[0])  # warm-up: sessions, kernel registry, page cache
    times = []
    for index in range(runs):
        started = time.perf_counter()
        call(feeds[index % len(feeds)])
        times.append(time.perf_counter() - started)
    return statistics.median(times)


ROUNDS = 3


def _interleaved_medians(runners: dict[str, Callable[[dict], object]], feeds: list[dict], runs: int) -> dict[str, float]:
    """Median seconds per call of every runner, timed in alternating blocks so that all see similar machine load.

    Each of :data:`ROUNDS` rounds times a block of calls per runner in turn (``ours`` ``runs / ROUNDS``
    calls, each onnxruntime session ``ORT_RUNS_FACTOR`` times as many). Blocks rather than single calls:
    onnxruntime's worker threads spin for a while after a run and would slow the call right after it.
    """
    for run in runners.values():
        run(feeds[0])  # warm-up: sessions, kernel registry, page cache
    times: dict[str, list[float]] = {name: [] for name in runners}
    per_round = max(1, runs // ROUNDS)
    for _ in range(ROUNDS):
        for name, run in runners.items():
            for index in range(per_round if name == "ours" else per_round * ORT_RUNS_FACTOR):
                feed = feeds[index % len(feeds)]
                started = time.perf_counter()
                run(feed)
                times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def _similarity(output: np.ndarray, reference: np.ndarray, feed: dict) -> float | None:
    """Cosine to FP32: of mean-pooled token embeddings for text, of the whole output otherwise (None: undefined)."""
    if "attention_mask" in feed:
        weights = feed["attention_mask"][..., None].astype(np.float64)
        output, reference = (output * weights).sum(1), (reference * weights).sum(1)
    a, b = np.ravel(output).astype(np.float64), np.ravel(reference).astype(np.float64)
    if not b.any():  # undefined, e.g. a blank page whose FP32 text map underflows to exact zeros: left out
        return None
    if not a.any():  # a collapsed output (all zeros) against a real reference
        return 0.0
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def infer_all(spec: dict, compiled: dict, runs: int) -> dict:
    """Latency of ours / onnxruntime FP32 / onnxruntime int8 QDQ, cosine to FP32, cost-model estimates."""
    import onnxruntime as ort

    from compiler_core.runtime import Accelerator, Model, get_model_summary
    from compiler_core.runtime.cost import estimate
    from compiler_core.targets import get_device

    feeds = eval_feeds(spec, EVAL_SAMPLES)
    model = Model(compiled["ours"]["artifact"], input_layout="NCHW")
    model.launch(Accelerator("aries-rb"))
    sessions = {"ort_fp32": ort.InferenceSession(spec["source"], providers=["CPUExecutionProvider"]),
                "ort_int8": ort.InferenceSession(compiled["ort_qdq"]["artifact"], providers=["CPUExecutionProvider"])}
    runners = {"ours": lambda feed: model.infer(feed)[0],
               **{name: (lambda feed, s=session: s.run(None, feed)[0]) for name, session in sessions.items()}}
    latency = _interleaved_medians(runners, feeds, runs)
    stacked = {name: np.concatenate([feed[name] for feed in feeds]) for name in feeds[0]}
    latency["ours_batched"] = _median_seconds(lambda batch: model.infer(batch)[0], [stacked], 3) / len(feeds)
    references = [runners["ort_fp32"](feed) for feed in feeds]
    cosine = {}
    for name in ("ours", "ort_int8"):
        values = [_similarity(runners[name](feed), reference, feed) for feed, reference in zip(feeds, references)]
        defined = [value for value in values if value is not None]
        cosine[name] = statistics.mean(defined) if defined else float("nan")
    compiled_modes = get_model_summary(compiled["ours"]["artifact"])["schedule"]
    schedule = {mode: compiled_modes[mode] for mode in model.artifact.core_modes}  # single, multi, global4, global8
    schedule["regulus-rb single"] = estimate(model.program, get_device("regulus-rb"), "single").to_dict()
    return {"latency_s": latency, "cosine_to_fp32": cosine, "estimates": schedule, "eval_samples": len(feeds)}


# -- report ----------------------------------------------------------------------------------------


def _ratio(ours: float | None, peer: float | None) -> str:
    return f"{ours / peer:.2f}" if ours is not None and peer else "-"


def format_compile_table(results: list[dict]) -> str:
    header = (f"{'model':<14}{'ours s':>8}{'ort s':>8}{'ratio':>7}  {'ours cpu':>9}{'ort cpu':>8}{'ratio':>7}  "
              f"{'ours MB':>8}{'ort MB':>8}{'ratio':>7}  "
              f"{'ours +MB':>9}{'ort +MB':>9}{'ratio':>7}  {'ours file':>10}{'ort file':>9}")
    rows = [header, "-" * len(header)]
    for result in results:
        ours, peer = result["compile"]["ours"], result["compile"]["ort_qdq"]
        if "error" in ours or "error" in peer:
            rows.append(f"{result['model']:<14}{ours.get('error') or peer.get('error')}")
            if "error" not in ours:
                rows.append(f"{'':<14}ours {ours['seconds']:.1f} s ({ours['cpu_s']:.1f} s CPU); by stage: " + ", ".join(
                    f"{stage} {seconds:.1f} s" for stage, seconds in ours.get("timings", {}).items()))
            continue
        rows.append(f"{result['model']:<14}{ours['seconds']:>8.1f}{peer['seconds']:>8.1f}"
                    f"{_ratio(ours['seconds'], peer['seconds']):>7}  {ours['cpu_s']:>9.1f}{peer['cpu_s']:>8.1f}"
                    f"{_ratio(ours['cpu_s'], peer['cpu_s']):>7}  {ours['peak_rss_mb']:>8.0f}"
                    f"{peer['peak_rss_mb']:>8.0f}{_ratio(ours['peak_rss_mb'], peer['peak_rss_mb']):>7}  "
                    f"{ours['growth_mb']:>9.0f}{peer['growth_mb']:>9.0f}{_ratio(ours['growth_mb'], peer['growth_mb']):>7}"
                    f"  {ours['size_mb']:>8.1f}MB{peer['size_mb']:>7.1f}MB")
        stages = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in ours.get("timings", {}).items())
        rows.append(f"{'':<14}ours by stage: {stages}; samples {ours.get('samples')}")
    return "\n".join(rows)


def format_runtime_table(results: list[dict]) -> str:
    header = (f"{'model':<14}{'ours ms':>9}{'fp32 ms':>9}{'int8 ms':>9}{'/fp32':>8}{'/int8':>8}  "
              f"{'batch ms':>9}{'/int8':>7}  {'cos ours':>9}{'cos int8':>9}")
    rows = [header, "-" * len(header)]
    for result in results:
        runtime = result.get("runtime")
        if not runtime:
            continue
        ms = {name: seconds * 1e3 for name, seconds in runtime["latency_s"].items()}
        rows.append(f"{result['model']:<14}{ms['ours']:>9.1f}{ms['ort_fp32']:>9.2f}{ms['ort_int8']:>9.2f}"
                    f"{_ratio(ms['ours'], ms['ort_fp32']):>8}{_ratio(ms['ours'], ms['ort_int8']):>8}  "
                    f"{ms['ours_batched']:>9.1f}{_ratio(ms['ours_batched'], ms['ort_int8']):>7}  "
                    f"{runtime['cosine_to_fp32']['ours']:>9.4f}{runtime['cosine_to_fp32']['ort_int8']:>9.4f}")
        estimates = "; ".join(f"{mode} {entry['latency_ms']:.3f} ms, {entry['throughput_fps']:.0f} FPS"
                              for mode, entry in runtime["estimates"].items())
        rows.append(f"{'':<14}cost model (virtual NPU): {estimates}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset of: " + ", ".join(MODELS))
    parser.add_argument("--runs", type=int, default=1, help="fresh-process compiles per tool (median)")
    parser.add_argument("--infer-runs", type=int, default=5, help="timed Model.infer calls (median)")
    parser.add_argument("--analysis-holdout", type=int, default=0, help="our held-out analysis samples")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--child", nargs=4, metavar=("TOOL", "SPEC_JSON", "OUTPUT", "HOLDOUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        tool, spec, output, holdout = args.child
        print(json.dumps(measure_in_child(tool, json.loads(spec), Path(output), int(holdout))))
        return 0
    names = args.models.split(",") if args.models else list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as scratch:
        for name in names:
            try:
                spec = MODELS[name]()
            except realmodels.RealModelUnavailable as error:
                print(f"{name}: skipped ({error})", file=sys.stderr)
                continue
            result = {"model": name, "compile": compile_both(spec, args.runs, Path(scratch) / name,
                                                             args.analysis_holdout)}
            if not any("error" in entry for entry in result["compile"].values()):
                result["runtime"] = infer_all(spec, result["compile"], args.infer_runs)
            results.append(result)
    print(f"compile benchmark, median of {args.runs} fresh process(es) per cell, from the source ONNX: ours = "
          f"mxq_compile (aries-rb, every core mode, analysis holdout {args.analysis_holdout}); ort = quant_pre_process "
          "+ quantize_static (QDQ int8, per-channel, MinMax); same calibration samples; s = wall, cpu = user + "
          "system CPU seconds of the child (all threads); MB = peak RSS (VmHWM)")
    print(format_compile_table(results))
    print(f"\nruntime, median wall time of one inference (batch 1) on {EVAL_SAMPLES} held-out inputs: ours = "
          f"Model.infer on the simulator ({args.infer_runs} calls), onnxruntime FP32 / int8 QDQ "
          f"({args.infer_runs * ORT_RUNS_FACTOR} calls); ratios ours / peer; batch = ours per sample when "
          f"the {EVAL_SAMPLES} inputs run as one batch; cos = mean cosine to FP32")
    print(format_runtime_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
