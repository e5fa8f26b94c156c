"""Parse-stage benchmark: ``mblt_compile`` on a real model of every backend, beside ``onnxsim`` for ONNX.

Backends and models: ONNX (the ``realmodels`` catalogue: MobileNetV2, PP-OCRv4 det/rec/cls,
MiniLM, Silero without If), a live torch module (MobileNetV2), a ``torch.export`` ``.pt2`` program
(MobileNetV2), a transformers folder (all-MiniLM-L6-v2, S=128), TorchScript (Silero VAD's
``silero_vad.jit``, submodule ``_model``), TFLite (MediaPipe models) and Keras (a small CNN, only
when tensorflow imports). onnxsim only runs where the source is ONNX; other rows show ``-``.

For every model and tool, each of ``--runs`` measurements runs in a fresh Python subprocess that
imports the tool, then times load + transform + save of the source file (wall clock,
``time.perf_counter``) and CPU time (user + system, ``getrusage``: on a loaded machine the steadier
number). Peak memory is the subprocess's own peak resident set size, the kernel's
high-water mark ``VmHWM`` from ``/proc/self/status`` (so it covers C++ and Python allocations alike;
not tracemalloc, not ``ru_maxrss``, which on Linux carries the parent's peak across ``exec``), reported
whole and as the growth over the post-import high-water mark. Medians of
the runs are shown with the ratios ours / onnxsim (below 1 is better for us), and the minimum CPU time
of each tool: other processes on a shared machine only ever add time (cache and scheduler
interference), so the minimum is the least noisy estimate of the work itself. The runs of the two
tools are interleaved (ours, onnxsim, ours, ...) so that a burst of load hits both alike.

onnxsim gets the same information as our parser: the pinned input shapes (``overwrite_input_shapes``)
and the constant inputs folded in as initializers; ``check_n=0`` so it does not run onnxruntime.
Node counts include the nodes of subgraphs (``If`` branches).

For a live torch module, building the module (weights loaded) happens in the child before the
timer starts, like an import: the measured parse is the export + canonicalization + save.

Usage: ``python bench/parse.py [--models mobilenet_v2,torch_live_mobilenet_v2] [--runs 3] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
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

import numpy as np  # noqa: E402
import realmodels  # noqa: E402

TOOLS = ("ours", "onnxsim")


# -- child process: one measurement ------------------------------------------------------------------


def _peak_rss_mb() -> float:
    """This process's peak RSS: ``VmHWM`` of the current address space.

    ``getrusage(RUSAGE_SELF).ru_maxrss`` would include the parent's peak (Linux keeps the larger of
    the pre-exec and post-exec high-water marks), so it is only the fallback off Linux.
    """
    with contextlib.suppress(OSError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, bytes on macOS


def count_nodes(graph) -> int:
    """Nodes of an ``onnx.GraphProto``, subgraphs included."""
    total = 0
    for node in graph.node:
        total += 1
        for attribute in node.attribute:
            total += sum(count_nodes(g) for g in ([attribute.g] if attribute.HasField("g") else []))
            total += sum(count_nodes(g) for g in attribute.graphs)
    return total


def _run_ours(source, shapes: dict, constants: dict, output: Path, backend: str = "onnx", **options) -> int:
    import onnx

    from compiler_core.api import mblt_compile

    written = mblt_compile(source, output, backend=backend, input_shape_dict=shapes or None,
                           constant_inputs=constants, **options)
    return count_nodes(onnx.load(str(written), load_external_data=False).graph)


def _run_onnxsim(source: Path, shapes: dict, constants: dict, output: Path, backend: str = "onnx") -> int:
    import onnx
    import onnxsim

    model = onnx.load(str(source))
    _bind_constants(model, constants)
    simplified, _ = onnxsim.simplify(model, check_n=0, overwrite_input_shapes=shapes or None)
    onnx.save(simplified, str(output))
    return count_nodes(simplified.graph)


def _bind_constants(model, constants: dict) -> None:
    """Turn the inputs named in ``constants`` into initializers (what ``constant_inputs`` does for us)."""
    from onnx import numpy_helper

    for value in [v for v in model.graph.input if v.name in constants]:
        model.graph.input.remove(value)
        model.graph.initializer.append(numpy_helper.from_array(constants[value.name], value.name))


def measure_in_child(tool: str, spec: dict) -> dict:
    """Body of the child process: import the tool, then time one parse of the model in ``spec``."""
    import numpy as np

    runner = {"ours": _run_ours, "onnxsim": _run_onnxsim}[tool]
    if tool == "ours":
        import compiler_core.api  # noqa: F401  (import cost is not parse cost)
    else:
        import onnxsim  # noqa: F401
    constants = {name: np.array(value, dtype=dtype) for name, (dtype, value) in spec["constants"].items()}
    source, options = _child_source(spec)
    baseline = _peak_rss_mb()
    with tempfile.TemporaryDirectory() as folder:
        started, cpu_started = time.perf_counter(), _cpu_seconds()
        nodes_after = runner(source, spec["shapes"], constants, Path(folder) / "model.out", spec["backend"], **options)
        seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_started
    return {"seconds": seconds, "cpu_s": cpu, "peak_rss_mb": _peak_rss_mb(), "growth_mb": _peak_rss_mb() - baseline,
            "nodes_after": nodes_after}


def _cpu_seconds() -> float:
    """User + system CPU time of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _child_source(spec: dict):
    """The model argument and frontend options; a live module is built here, before the timer."""
    import numpy as np

    options = dict(spec.get("options", {}))
    if "feed_dict" in options:
        options["feed_dict"] = {name: np.array(value, dtype=dtype) for name, (dtype, value) in options["feed_dict"].items()}
    if spec["source"] == "live:mobilenet_v2":
        return realmodels.mobilenet_v2_module(), options
    return Path(spec["source"]), options


# -- parent process --------------------------------------------------------------------------------


SITE_PACKAGES = Path(realmodels.package_dir("numpy", "numpy")).parent
TFLITE_MODELS = {
    "tflite_face_landmark": "mediapipe/modules/face_landmark/face_landmark.tflite",
    "tflite_palm_detection_lite": "mediapipe/modules/palm_detection/palm_detection_lite.tflite",
    "tflite_selfie_segmentation": "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite",
    "tflite_pose_landmark_full": "mediapipe/modules/pose_landmark/pose_landmark_full.tflite",
}


def _array_json(array) -> tuple[str, list]:
    return str(array.dtype), array.tolist()


def _onnx_spec(name: str) -> dict:
    source, shapes, constants = realmodels.real_models()[name]()
    return {"source": str(source), "backend": "onnx", "shapes": shapes,
            "constants": {k: _array_json(v) for k, v in constants.items()}}


def _torch_live_spec() -> dict:
    realmodels.mobilenet_weights_path()
    feed = {"x": _array_json(np.zeros(realmodels.MOBILENET_SHAPE, np.float32))}
    return {"source": "live:mobilenet_v2", "backend": "torch", "options": {"feed_dict": feed}}


def _build_pt2(temp: Path) -> None:
    import torch

    example = torch.zeros(realmodels.MOBILENET_SHAPE)
    with open(temp, "wb") as handle:
        torch.export.save(torch.export.export(realmodels.mobilenet_v2_module(), (example,)), handle)


def _torch_pt2_spec() -> dict:
    realmodels.mobilenet_weights_path()
    return {"source": str(realmodels._cached("mobilenet_v2.pt2", _build_pt2)), "backend": "torch"}


def _transformers_spec() -> dict:
    tokens = realmodels.tokenize(realmodels.SENTENCES[:1])
    return {"source": str(realmodels.minilm_dir()), "backend": "torch",
            "options": {"feed_dict": {k: _array_json(v) for k, v in tokens.items()}}}


def _torchscript_spec() -> dict:
    folder = realmodels.package_dir("silero_vad", "silero-vad==6.2.3")
    return {"source": str(realmodels._require_file(folder / "data" / "silero_vad.jit", "silero-vad==6.2.3")),
            "backend": "torchscript", "shapes": {"x": [1, 576], "state": [2, 1, 128]},
            "options": {"submodule": "_model"}}


def _tflite_spec(relative: str) -> Callable[[], dict]:
    def build() -> dict:
        path = SITE_PACKAGES / relative
        if not path.is_file():
            raise realmodels.RealModelUnavailable(f"{relative} is missing: pip install mediapipe==0.10.14")
        return {"source": str(path), "backend": "tflite"}
    return build


def _build_keras(temp: Path) -> None:
    import tensorflow as tf

    layers = tf.keras.layers
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input((64, 64, 3), name="image"),
        layers.Conv2D(16, 3, strides=2, padding="same"), layers.BatchNormalization(), layers.ReLU(6.0),
        layers.DepthwiseConv2D(3, padding="same", activation="relu"), layers.Conv2D(32, 1),
        layers.UpSampling2D(interpolation="bilinear"), layers.MaxPooling2D(), layers.GlobalAveragePooling2D(),
        layers.Dense(10), layers.Softmax()])
    model.save(temp.with_suffix(".keras"))
    temp.with_suffix(".keras").rename(temp)


def _keras_spec() -> dict:
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        raise realmodels.RealModelUnavailable("tensorflow is not installed: pip install 'qbcompiler[tf]'")
    return {"source": str(realmodels._cached("small_cnn.keras", _build_keras)), "backend": "tf"}


def catalogue() -> dict[str, Callable[[], dict]]:
    """Benchmark name -> builder of the child's spec (source, backend, shapes, constants, options)."""
    models = {name: (lambda name=name: _onnx_spec(name)) for name in realmodels.real_models()}
    models.update({"torch_live_mobilenet_v2": _torch_live_spec, "torch_pt2_mobilenet_v2": _torch_pt2_spec,
                   "transformers_minilm": _transformers_spec, "torchscript_silero": _torchscript_spec,
                   **{name: _tflite_spec(relative) for name, relative in TFLITE_MODELS.items()},
                   "keras_small_cnn": _keras_spec})
    return models


def model_spec(model_name: str) -> dict:
    """The child's JSON spec of one benchmark model (defaults filled in)."""
    spec = {"shapes": {}, "constants": {}, "options": {}, **catalogue()[model_name]()}
    return {"name": model_name, **spec}


def measure(tool: str, spec: dict) -> dict:
    """Run one measurement in a fresh interpreter and return its JSON record."""
    command = [sys.executable, __file__, "--child", tool, "-"]  # the spec (with feeds) goes through stdin
    completed = subprocess.run(command, input=json.dumps(spec), capture_output=True, text=True, cwd=REPO_ROOT,
                               check=False)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"{tool} on {spec['name']} failed: {tail}"}
    return json.loads(lines[-1])


def benchmark(model_name: str, runs: int) -> dict:
    """Median time and memory of ``runs`` fresh-process measurements per tool, plus node counts."""
    import onnx

    spec = model_spec(model_name)
    is_onnx = spec["backend"] == "onnx"
    result = {"model": model_name, "backend": spec["backend"],
              "nodes_before": count_nodes(onnx.load(spec["source"]).graph) if is_onnx else None}
    tools = TOOLS if is_onnx else TOOLS[:1]
    records: dict[str, list[dict]] = {tool: [] for tool in tools}
    for _ in range(runs):  # interleaved: a burst of load on the machine hits both tools alike
        for tool in tools:
            records[tool].append(measure(tool, spec))
    for tool in tools:
        errors = [r["error"] for r in records[tool] if "error" in r]
        if errors:
            result[tool] = {"error": errors[0]}
            continue
        result[tool] = {key: statistics.median(r[key] for r in records[tool])
                        for key in ("seconds", "cpu_s", "peak_rss_mb", "growth_mb", "nodes_after")}
        result[tool]["min_cpu_s"] = min(r["cpu_s"] for r in records[tool])
    return result


def _ratio(result: dict, key: str) -> str:
    ours, peer = result["ours"].get(key), result.get("onnxsim", {}).get(key)
    return f"{ours / peer:.2f}" if ours is not None and peer else "-"


def _cell(record: dict | None, key: str, width: int, digits: int) -> str:
    value = (record or {}).get(key)
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def format_table(results: list[dict]) -> str:
    """Plain-text table, one row per model (onnxsim columns ``-`` where the source is not ONNX)."""
    header = (f"{'model':<28}{'backend':<12}{'nodes':>7}{'ours':>7}{'sim':>7}  {'ours s':>7}{'sim s':>7}{'ratio':>7}  "
              f"{'our cpu':>8}{'sim cpu':>8}{'ratio':>7}  {'our min':>8}{'sim min':>8}{'ratio':>7}  {'ours MB':>8}{'sim MB':>8}{'ratio':>7}  {'ours +MB':>9}{'sim +MB':>9}{'ratio':>7}")
    rows = [header, "-" * len(header)]
    for result in results:
        ours, sim = result["ours"], result.get("onnxsim")
        before = f"{result['nodes_before']:>7}" if result["nodes_before"] is not None else f"{'-':>7}"
        prefix = f"{result['model']:<28}{result['backend']:<12}{before}"
        if "error" in ours or (sim and "error" in sim):
            rows.append(f"{prefix}  {ours.get('error') or sim.get('error')}")
            continue
        rows.append(f"{prefix}{_cell(ours, 'nodes_after', 7, 0)}{_cell(sim, 'nodes_after', 7, 0)}  "
                    f"{_cell(ours, 'seconds', 7, 2)}{_cell(sim, 'seconds', 7, 2)}{_ratio(result, 'seconds'):>7}  "
                    f"{_cell(ours, 'cpu_s', 8, 2)}{_cell(sim, 'cpu_s', 8, 2)}{_ratio(result, 'cpu_s'):>7}  "
                    f"{_cell(ours, 'min_cpu_s', 8, 2)}{_cell(sim, 'min_cpu_s', 8, 2)}{_ratio(result, 'min_cpu_s'):>7}  "
                    f"{_cell(ours, 'peak_rss_mb', 8, 0)}{_cell(sim, 'peak_rss_mb', 8, 0)}"
                    f"{_ratio(result, 'peak_rss_mb'):>7}  {_cell(ours, 'growth_mb', 9, 0)}"
                    f"{_cell(sim, 'growth_mb', 9, 0)}{_ratio(result, 'growth_mb'):>7}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset of: " + ", ".join(catalogue()))
    parser.add_argument("--runs", type=int, default=3, help="fresh-process measurements per tool (median and minimum)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "SPEC_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec_text = sys.stdin.read() if args.child[1] == "-" else args.child[1]
        print(json.dumps(measure_in_child(args.child[0], json.loads(spec_text))))
        return 0
    names = args.models.split(",") if args.models else list(catalogue())
    unknown = sorted(set(names) - set(catalogue()))
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    results = []
    for name in names:
        try:
            results.append(benchmark(name, args.runs))
        except realmodels.RealModelUnavailable as error:
            print(f"{name}: skipped ({error})", file=sys.stderr)
    print(f"parse benchmark, median of {args.runs} fresh processes per cell (interleaved ours/onnxsim; min = minimum "
          "CPU time); time = load + transform + save (s = wall, cpu = user + system CPU seconds of the child); MB = peak RSS (VmHWM), +MB = growth over "
          "the post-import peak; onnxsim only for ONNX sources")
    print(format_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
