"""Shared pieces of the reader fuzz tests: profiles, the time box, the outcome check, seed files.

Profiles (``QB_FUZZ_PROFILE``): ``fast`` (300 cases per reader, derandomized, part of ``make
test``) and ``long`` (10,000 cases per reader, ``make fuzz``). The property every reader must hold:
it returns, or raises a coded :class:`QBCompilerError`; never another exception, never a hang
(each case is time-boxed to :data:`CASE_SECONDS` of CPU time and :data:`WALL_SECONDS` of wall
time), and never a partial output file.
"""

from __future__ import annotations

import functools
import os
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, settings
from onnx import TensorProto, helper, numpy_helper

from compiler_core.errors import QBCompilerError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "resources" / "samples" / "fashion_cnn"
PROFILE = os.environ.get("QB_FUZZ_PROFILE", "fast")
CASES = {"fast": 300, "long": 10_000}[PROFILE]
CASE_SECONDS = 5
"""CPU seconds a case may use (the hang criterion)."""
WALL_SECONDS = 60
"""Wall-clock seconds a case may take (a case that blocks instead of computing)."""

settings.register_profile(
    "fuzz", max_examples=CASES, deadline=None, derandomize=PROFILE == "fast", database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.function_scoped_fixture, HealthCheck.large_base_example])
FUZZ = settings.get_profile("fuzz")

OUTCOMES: dict[str, Counter] = {}
"""Reader -> outcome (``ok`` or the error code) -> number of cases, for the summary line."""
SLOWEST: dict[str, tuple[float, float]] = {}
"""Reader -> (most CPU seconds, most wall seconds) any one case took."""


class Hang(AssertionError):
    """A case ran longer than :data:`CASE_SECONDS`."""


@contextmanager
def time_box(seconds: float = CASE_SECONDS, wall_seconds: float = WALL_SECONDS):
    """Fail the case (raise :class:`Hang`) once it has used ``seconds`` of CPU time, or ``wall_seconds`` of wall time.

    The CPU clock (``ITIMER_PROF``: this process's user + system time) measures what the case itself
    costs, whatever else runs on the machine (the test machine has 2 cores for several jobs: a 0.2 s
    parse took 7.7 s of wall time in a loaded long run). The wall clock catches a case that blocks
    without computing. Main thread only (signals).
    """
    def expired(signum, frame):
        clock = "CPU" if signum == signal.SIGPROF else "wall-clock"
        raise Hang(f"the case ran longer than {seconds if signum == signal.SIGPROF else wall_seconds} s ({clock})")

    previous = signal.signal(signal.SIGALRM, expired), signal.signal(signal.SIGPROF, expired)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, wall_seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous[0])
        signal.signal(signal.SIGPROF, previous[1])


def check_case(reader: str, call: Callable[[], object], output_dir: Path | None = None,
               expected_outputs: tuple[str, ...] = ()) -> str:
    """Run one case: success or a coded error; no other exception, no hang, no partial file.

    Args:
        reader: Name for the counts.
        call: The reader call.
        output_dir: A folder the call writes into (checked afterwards), if any.
        expected_outputs: The files a successful call leaves there.

    Returns:
        ``"ok"`` or the error code.
    """
    cpu, wall = time.process_time(), time.perf_counter()
    with time_box():
        try:
            call()
            outcome = "ok"
        except QBCompilerError as error:
            assert error.code and error.code != "INTERNAL_ERROR", f"{reader}: {error.one_line()}"
            outcome = error.code
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    previous = SLOWEST.get(reader, (0.0, 0.0))
    SLOWEST[reader] = (max(previous[0], cpu), max(previous[1], wall))
    if output_dir is not None:
        left = sorted(path.name for path in output_dir.iterdir())
        allowed = list(expected_outputs) if outcome == "ok" else []
        assert left == sorted(allowed), f"{reader}: files left after {outcome}: {left}"
    OUTCOMES.setdefault(reader, Counter())[outcome] += 1
    return outcome


def summary(reader: str) -> str:
    """``reader: N cases (ok 12, MODEL_LOAD_ERROR 280, ...)`` and the slowest case's CPU and wall time."""
    counts = OUTCOMES.get(reader, Counter())
    detail = ", ".join(f"{code} {count}" for code, count in counts.most_common())
    cpu, wall = SLOWEST.get(reader, (0.0, 0.0))
    return (f"fuzz {reader} [{PROFILE}]: {sum(counts.values())} cases ({detail}), 0 non-coded exceptions, 0 hangs "
            f"(slowest case {cpu:.2f} s CPU, {wall:.2f} s wall)")


def scratch() -> Path:
    """A fresh empty folder for one case."""
    return Path(tempfile.mkdtemp(prefix="qbfuzz-"))


# -- seed files ----------------------------------------------------------------------------------


def seed_onnx() -> onnx.ModelProto:
    """A small valid model: Conv (+ bias) -> Relu -> MaxPool -> Flatten -> Gemm, opset 13."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w", (4, 1, 3, 3)), ("b", (4,)), ("fc", (4 * 4 * 4, 3)), ("fc_b", (3,)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc", "fc_b"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "seed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@functools.cache
def seed_mblt_bytes() -> bytes:
    """The seed model parsed to an MBLT."""
    from compiler_core.api import mblt_compile

    folder = scratch()
    onnx.save(seed_onnx(), str(folder / "seed.onnx"))
    return mblt_compile(folder / "seed.onnx", folder / "seed.mblt").read_bytes()


@functools.cache
def sample_mxq() -> Path:
    """The bundled sample compiled for aries-rb once per process."""
    from compiler_core.api import mblt_compile, mxq_compile

    folder = scratch()
    mblt = mblt_compile(SAMPLE_DIR / "model.onnx", folder / "sample.mblt")
    return mxq_compile(mblt, "aries-rb", SAMPLE_DIR / "calib", folder / "sample.mxq",
                       compile_config=SAMPLE_DIR / "compile_config.yaml", analysis_holdout=0).mxq_path
