"""Parse-stage benchmark: ``mblt_compile`` beside ``onnxsim.simplify`` on the real models, same run.

For every model and tool, each of ``--runs`` measurements runs in a fresh Python subprocess that
imports the tool, then times load + transform + save of the source file (wall clock,
``time.perf_counter``). Peak memory is the subprocess's own peak resident set size, the kernel's
high-water mark ``VmHWM`` from ``/proc/self/status`` (so it covers C++ and Python allocations alike;
not tracemalloc, not ``ru_maxrss``, which on Linux carries the parent's peak across ``exec``), reported
whole and as the growth over the post-import high-water mark. Medians of
the runs are shown with the ratios ours / onnxsim (below 1 is better for us).

onnxsim gets the same information as our parser: the pinned input shapes (``overwrite_input_shapes``)
and the constant inputs folded in as initializers; ``check_n=0`` so it does not run onnxruntime.
Node counts include the nodes of subgraphs (``If`` branches).

Usage: ``python bench/parse.py [--models mobilenet_v2,ppocr_det] [--runs 3] [--json out.json]``.
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
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT))

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


def _run_ours(source: Path, shapes: dict, constants: dict, output: Path) -> int:
    import onnx

    from compiler_core.api import mblt_compile

    written = mblt_compile(source, output, backend="onnx", input_shape_dict=shapes, constant_inputs=constants)
    return count_nodes(onnx.load(str(written), load_external_data=False).graph)


def _run_onnxsim(source: Path, shapes: dict, constants: dict, output: Path) -> int:
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
    baseline = _peak_rss_mb()
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        nodes_after = runner(Path(spec["source"]), spec["shapes"], constants, Path(folder) / "model.out")
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "peak_rss_mb": _peak_rss_mb(), "growth_mb": _peak_rss_mb() - baseline,
            "nodes_after": nodes_after}


# -- parent process --------------------------------------------------------------------------------


def model_spec(model_name: str) -> dict:
    """Source path, pinned shapes and constant inputs of a real model, as JSON for the child."""
    source, shapes, constants = realmodels.real_models()[model_name]()
    return {"name": model_name, "source": str(source), "shapes": shapes,
            "constants": {k: (str(v.dtype), v.tolist()) for k, v in constants.items()}}


def measure(tool: str, spec: dict) -> dict:
    """Run one measurement in a fresh interpreter and return its JSON record."""
    command = [sys.executable, __file__, "--child", tool, json.dumps(spec)]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"{tool} on {spec['name']} failed: {tail}"}
    return json.loads(lines[-1])


def benchmark(model_name: str, runs: int) -> dict:
    """Median time and memory of ``runs`` fresh-process measurements per tool, plus node counts."""
    import onnx

    spec = model_spec(model_name)
    result = {"model": model_name, "nodes_before": count_nodes(onnx.load(spec["source"]).graph)}
    for tool in TOOLS:
        records = [measure(tool, spec) for _ in range(runs)]
        errors = [r["error"] for r in records if "error" in r]
        if errors:
            result[tool] = {"error": errors[0]}
            continue
        result[tool] = {key: statistics.median(r[key] for r in records)
                        for key in ("seconds", "peak_rss_mb", "growth_mb", "nodes_after")}
    return result


def _ratio(result: dict, key: str) -> str:
    ours, peer = result["ours"].get(key), result["onnxsim"].get(key)
    return f"{ours / peer:.2f}" if ours is not None and peer else "-"


def format_table(results: list[dict]) -> str:
    """Plain-text table, one row per model."""
    header = (f"{'model':<14}{'nodes':>7}{'ours':>7}{'sim':>7}  {'ours s':>7}{'sim s':>7}{'ratio':>7}  "
              f"{'ours MB':>8}{'sim MB':>8}{'ratio':>7}  {'ours +MB':>9}{'sim +MB':>9}{'ratio':>7}")
    rows = [header, "-" * len(header)]
    for result in results:
        ours, sim = result["ours"], result["onnxsim"]
        if "error" in ours or "error" in sim:
            rows.append(f"{result['model']:<14}{result['nodes_before']:>7}  {ours.get('error') or sim.get('error')}")
            continue
        rows.append(f"{result['model']:<14}{result['nodes_before']:>7}{ours['nodes_after']:>7.0f}"
                    f"{sim['nodes_after']:>7.0f}  {ours['seconds']:>7.2f}{sim['seconds']:>7.2f}"
                    f"{_ratio(result, 'seconds'):>7}  {ours['peak_rss_mb']:>8.0f}{sim['peak_rss_mb']:>8.0f}"
                    f"{_ratio(result, 'peak_rss_mb'):>7}  {ours['growth_mb']:>9.0f}{sim['growth_mb']:>9.0f}"
                    f"{_ratio(result, 'growth_mb'):>7}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset of: " + ", ".join(realmodels.real_models()))
    parser.add_argument("--runs", type=int, default=3, help="fresh-process measurements per tool (median)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "SPEC_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_in_child(args.child[0], json.loads(args.child[1]))))
        return 0
    names = args.models.split(",") if args.models else list(realmodels.real_models())
    unknown = sorted(set(names) - set(realmodels.real_models()))
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    results = []
    for name in names:
        try:
            results.append(benchmark(name, args.runs))
        except realmodels.RealModelUnavailable as error:
            print(f"{name}: skipped ({error})", file=sys.stderr)
    print(f"parse benchmark, median of {args.runs} fresh processes per cell; time = load + transform + save; "
          "MB = peak RSS (VmHWM), +MB = growth over the post-import peak")
    print(format_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
