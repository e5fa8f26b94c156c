"""ONNX backend node-test conformance of the parse stage.

The node tests are regenerated from the installed ``onnx`` wheel (offline, cached under
``build/testdata/onnx-node-tests/``). A case is *claimed* when every node is a default-domain op in
the MBLT operator set (``compiler_core.mblt.opset.is_mblt_op``) and every graph input and output is a tensor, whatever the model's opset (newer models
are converted down to 21). An MBLT has static shapes, so shape operands fed as graph inputs (axes,
sizes, scales, pads, repeats: rank <= 1 inputs in a non-data position) are bound as constants with
the test's values, as a user does with ``constant_inputs`` / ``--bind-input``; the report lists them.
For each claimed case the other input shapes are pinned from the test
data, the model is canonicalized in memory, run in onnxruntime, and compared to the expected outputs
exactly as ``onnx.backend.test.runner.Runner.assert_similar_outputs`` does (same shape and dtype,
``np.testing.assert_allclose(rtol=1e-3, atol=1e-7)``, bfloat16 rtol widened to 2**-6, strings equal).

The source model is also run in onnxruntime: cases onnxruntime itself fails are reported as
``reference_fail`` and left out of the pass-rate denominator (they measure onnxruntime, not us).
Results go to ``build/conformance/report.json`` and ``build/conformance/summary.txt``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing
import os
import time
import traceback
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

pytestmark = pytest.mark.conformance

REPO_ROOT = Path(__file__).resolve().parents[1]
NODE_TESTS_DIR = REPO_ROOT / "build" / "testdata" / "onnx-node-tests"
REPORT_DIR = REPO_ROOT / "build" / "conformance"
RTOL, ATOL = 1e-3, 1e-7  # onnx.backend.test.case.node.expect() gives every node case these
BFLOAT16_RTOL = 2**-6  # Runner.assert_similar_outputs: two bfloat16 ULPs
WIDENED_FLOATS = ("float16", "bfloat16", "float64")
"""Float types the MBLT carries as float32: their outputs are compared as float32 at the source type's tolerance."""
MIN_PASS_RATE = 0.95
WORKERS = 2
SMOKE_CASES = (
    "test_add_bcast", "test_matmul_4d", "test_gemm_default_matrix_bias", "test_prelu_broadcast",
    "test_softmax_axis_1", "test_reduce_mean_default_axes_keepdims_example", "test_resize_upsample_scales_linear",
    "test_layer_normalization_4d_axis1", "test_split_equal_parts_1d_opset18", "test_argmax_default_axis_example",
    "test_clip_default_inbounds", "test_concat_2d_axis_1",
)


# -- regenerating and selecting the cases ------------------------------------------------------------


def node_tests_dir() -> Path:
    """``build/testdata/onnx-node-tests/node``, generated once from the installed onnx wheel."""
    node_dir = NODE_TESTS_DIR / "node"
    stamp = NODE_TESTS_DIR / f".generated-onnx-{onnx.__version__}"
    if stamp.is_file():
        return node_dir
    NODE_TESTS_DIR.mkdir(parents=True, exist_ok=True)
    with open(NODE_TESTS_DIR.parent / ".onnx-node-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.is_file():
            _generate_node_tests()
            stamp.touch()
    return node_dir


def _generate_node_tests() -> None:
    import onnx.backend.test.case.node as node_cases
    import onnx.backend.test.cmd_tools as cmd_tools

    with warnings.catch_warnings(), np.errstate(all="ignore"):  # the case generators divide by zero
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases()
        cmd_tools.model_test.collect_testcases = lambda: cases
        cmd_tools.generate_data(argparse.Namespace(output=str(NODE_TESTS_DIR)))


def classify(model: onnx.ModelProto) -> str:
    """``claimed``, ``unclaimed_ops`` or ``non_tensor`` for one node-test model."""
    from compiler_core.mblt.opset import is_mblt_op

    if not all(is_mblt_op(node.domain, node.op_type) for node in model.graph.node):
        return "unclaimed_ops"
    if not all(value.type.HasField("tensor_type") for value in [*model.graph.input, *model.graph.output]):
        return "non_tensor"
    return "claimed"


def select_cases(node_dir: Path) -> dict[str, list[str]]:
    """Case names by classification, sorted."""
    groups: dict[str, list[str]] = {}
    for case in sorted(path for path in node_dir.iterdir() if (path / "model.onnx").is_file()):
        kind = classify(onnx.load(str(case / "model.onnx")))
        groups.setdefault(kind, []).append(case.name)
    return groups


# -- running one case ---------------------------------------------------------------------------------


def _read_tensors(data_dir: Path, prefix: str) -> list[np.ndarray]:
    count = len(list(data_dir.glob(f"{prefix}_*.pb")))
    tensors = []
    for index in range(count):
        proto = onnx.TensorProto()
        proto.ParseFromString((data_dir / f"{prefix}_{index}.pb").read_bytes())
        tensors.append(numpy_helper.to_array(proto))
    return tensors


def _session(model_bytes: bytes):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def _run(model_bytes: bytes, names: list[str], inputs: list[np.ndarray]) -> list[np.ndarray]:
    session = _session(model_bytes)
    feed_names = [value.name for value in session.get_inputs()]
    missing = sorted(set(feed_names) - set(names))
    if missing:
        raise KeyError(f"the canonical model has inputs the test data lacks: {missing}")
    types = {value.name: value.type for value in session.get_inputs()}
    # The MBLT computes float16/bfloat16/float64 models in float32 (compiler_core/mblt/precision.py):
    # feed it the case's float data as float32, as a user would.
    return session.run(None, {name: array.astype(np.float32) if types[name] == "tensor(float)" and is_float(array)
                              else array for name, array in zip(names, inputs) if name in feed_names})


def is_float(array: np.ndarray) -> bool:
    """Float data of any width (ml_dtypes' bfloat16 is not numpy kind "f")."""
    return array.dtype.kind == "f" or array.dtype.name == "bfloat16"


def compare(actual: list[np.ndarray], expected: list[np.ndarray]) -> str | None:
    """None when ``actual`` matches like the ONNX backend runner wants, else why not."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for index, (out, ref) in enumerate(zip(actual, expected)):
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape:
            return f"output {index} shape {list(out.shape)}, expected {list(ref.shape)}"
        if ref.dtype == object:
            if not np.array_equal(out, ref):
                return f"output {index} strings differ"
            continue
        widened = out.dtype == np.float32 and ref.dtype.name in WIDENED_FLOATS
        if out.dtype != ref.dtype and not widened:
            return f"output {index} dtype {out.dtype}, expected {ref.dtype}"
        rtol = BFLOAT16_RTOL if ref.dtype.name == "bfloat16" else RTOL
        out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
        if not np.allclose(out64, ref64, rtol=rtol, atol=ATOL, equal_nan=True):
            error = np.nanmax(np.abs(out64 - ref64)) if out.size else 0.0
            return f"output {index} differs: max abs error {error:.3g} (rtol {rtol:g}, atol {ATOL:g})"
    return None


def run_case(case_dir: str) -> dict:
    """Canonicalize one node test, run it and compare; returns a JSON-able record."""
    case = Path(case_dir)
    started = time.perf_counter()
    model = onnx.load(str(case / "model.onnx"))
    data = case / "test_data_set_0"
    inputs, expected = _read_tensors(data, "input"), _read_tensors(data, "output")
    record = {"name": case.name, "ops": sorted({node.op_type for node in model.graph.node}),
              "source_opset": {e.domain: e.version for e in model.opset_import}.get("", 0),
              "bound": sorted(_shape_like_inputs(model, inputs)),
              **_canonical_outcome(model, inputs, expected, _shape_like_inputs(model, inputs))}
    if record["status"] == "fail":
        reference_error = _reference_error(model, inputs, expected)
        if reference_error:
            record.update(status="reference_fail", reference_reason=reference_error)
    record["seconds"] = round(time.perf_counter() - started, 3)
    return record


def _canonical_outcome(model: onnx.ModelProto, inputs: list[np.ndarray], expected: list[np.ndarray],
                       constant_inputs: dict[str, np.ndarray]) -> dict:
    """``{status, code, reason}`` of canonicalizing ``model`` and running it on ``inputs``."""
    import onnx_ir as ir

    from compiler_core.errors import QBCompilerError
    from compiler_core.mblt.canonicalize import canonicalize

    names = [value.name for value in model.graph.input]
    shapes = {name: list(array.shape) for name, array in zip(names, inputs) if name not in constant_inputs}
    try:
        canonical = canonicalize(onnx.ModelProto.FromString(model.SerializeToString()),
                                 input_shape_dict=shapes, constant_inputs=constant_inputs)
        reason = compare(_run(ir.to_proto(canonical).SerializeToString(), names, inputs), expected)
    except QBCompilerError as error:
        return {"status": "fail", "code": error.code, "reason": _first_line(error)}
    except Exception as error:  # onnxruntime or an internal crash: keep going, report it
        where = traceback.format_exc(limit=-1).strip().splitlines()[-3:-1]
        return {"status": "fail", "code": type(error).__name__, "reason": _first_line(error), "where": where}
    return {"status": "fail" if reason else "pass", "code": "MISMATCH" if reason else "", "reason": reason or ""}


def _shape_like_inputs(model: onnx.ModelProto, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Graph inputs of rank <= 1 that feed a non-data operand (axes, scales, pads, shape, k, ...)."""
    operands = {name for node in model.graph.node for name in node.input[1:] if name}
    return {value.name: array for value, array in zip(model.graph.input, inputs)
            if value.name in operands and array.ndim <= 1}


def _reference_error(model: onnx.ModelProto, inputs: list[np.ndarray], expected: list[np.ndarray]) -> str | None:
    """Why onnxruntime fails the *source* model on this case, or None if it passes."""
    try:
        return compare(_run(model.SerializeToString(), [v.name for v in model.graph.input], inputs), expected)
    except Exception as error:  # onnxruntime rejects the source model itself
        return f"{type(error).__name__}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:400]


def run_cases(case_dirs: list[Path], workers: int = WORKERS) -> list[dict]:
    """Run every case in a pool of ``workers`` fresh processes (spawned: no inherited threads)."""
    names = [str(path) for path in case_dirs]
    if workers <= 1:
        return [run_case(name) for name in names]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(run_case, names, chunksize=8))


# -- reporting ----------------------------------------------------------------------------------------


def summarize(records: list[dict], groups: dict[str, list[str]]) -> dict:
    """Counts and the pass rate over the claimed cases onnxruntime itself can run."""
    status = Counter(record["status"] for record in records)
    judged = len(records) - status["reference_fail"]
    return {
        "onnx_version": onnx.__version__, "generated_cases": sum(len(v) for v in groups.values()),
        "claimed": len(records), "passed": status["pass"], "failed": status["fail"],
        "reference_fail": status["reference_fail"], "judged": judged,
        "pass_rate": status["pass"] / judged if judged else 0.0,
        "unclaimed_ops": len(groups.get("unclaimed_ops", [])), "non_tensor": len(groups.get("non_tensor", [])),
        "cases_with_bound_shape_operands": sum(1 for r in records if r.get("bound")),
    }


def failure_groups(records: list[dict]) -> Counter:
    """Failures grouped by error code and the reason with numbers and names blurred."""
    import re

    def key(record):
        reason = re.sub(r"'[^']*'|\"[^\"]*\"|\d+(\.\d+)?(e-?\d+)?", "#", record["reason"])
        return f"[{record['code']}] {reason[:160]}"

    return Counter(key(record) for record in records if record["status"] == "fail")


def write_report(records: list[dict], summary: dict) -> Path:
    """Write report.json and summary.txt; returns the summary path."""
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    (REPORT_DIR / "report.json").write_text(json.dumps({"summary": summary, "cases": records}, indent=1))
    lines = [f"ONNX node-test conformance (onnx {summary['onnx_version']}): {summary['passed']}/"
             f"{summary['judged']} passed ({100 * summary['pass_rate']:.1f} %)",
             *(f"  {key}: {summary[key]}" for key in ("generated_cases", "claimed", "reference_fail",
                                                     "unclaimed_ops", "non_tensor",
                                                     "cases_with_bound_shape_operands")),
             "", "Failures by reason:",
             *(f"  {count:4d}  {reason}" for reason, count in failure_groups(records).most_common()),
             "", "Failures:",
             *(f"  {r['name']} [{r['code']}] {r['reason']}{_retry_note(r)}" for r in records if r["status"] == "fail"),
             "", "onnxruntime fails the source model too (not counted):",
             *(f"  {r['name']}: {r.get('reference_reason', '')}" for r in records if r["status"] == "reference_fail")]
    path = REPORT_DIR / "summary.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _retry_note(record: dict) -> str:
    bound = record.get("bound")
    return f"  (bound as constants: {', '.join(bound)})" if bound else ""


# -- tests --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_cases() -> tuple[Path, dict[str, list[str]]]:
    """The generated node-test folder and its cases grouped by :func:`classify`."""
    node_dir = node_tests_dir()
    return node_dir, select_cases(node_dir)


def test_conformance_pass_rate(node_cases):
    node_dir, groups = node_cases
    claimed = groups.get("claimed", [])
    assert len(claimed) > 300, f"only {len(claimed)} claimed cases: is the MBLT op set or the generation broken?"
    records = run_cases([node_dir / name for name in claimed], workers=min(WORKERS, os.cpu_count() or 1))
    summary = summarize(records, groups)
    summary_path = write_report(records, summary)
    print(f"\nONNX conformance: {summary['passed']}/{summary['judged']} claimed cases passed "
          f"({100 * summary['pass_rate']:.1f} %); {summary['reference_fail']} that onnxruntime fails too; "
          f"{summary['cases_with_bound_shape_operands']} with shape operands bound. Report: {summary_path}")
    assert summary["pass_rate"] >= MIN_PASS_RATE, summary_path.read_text()[:4000]


@pytest.mark.parametrize("name", SMOKE_CASES)
def test_conformance_smoke(node_cases, name: str):
    node_dir, groups = node_cases
    if name not in groups.get("claimed", []):
        kind = next((k for k, names in groups.items() if name in names), "missing from this onnx version")
        pytest.skip(f"{name}: {kind}")
    record = run_case(str(node_dir / name))
    assert record["status"] == "pass", f"[{record['code']}] {record['reason']}"
