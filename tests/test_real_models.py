"""End-to-end parse of real trained models: the MBLT is canonical and computes what the source computes.

Models (see ``realmodels.py``): MobileNetV2 (torch export, BatchNorm kept), PP-OCRv4 det/rec and
mobile v2.0 cls (Paddle exports, weights in Constant nodes, dynamic H/W pinned), all-MiniLM-L6-v2
(transformers, S=128) and Silero VAD v6 with the LSTM unrolled (``sr`` bound to 16000).

Numerical agreement uses the *relative error* ``max|a - b| / max(max|b|, 1e-6)`` per output, where
``b`` is the source model's onnxruntime output and ``a`` the MBLT's on the same (real) inputs: the
largest absolute deviation measured against the output's dynamic range, so tiny elements of a
large-range output do not blow it up. Each model is parsed once per test module (and per worker).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import realmodels

pytestmark = pytest.mark.slow

MAX_RELATIVE_ERROR = 1e-4
FORBIDDEN_OPS = {"BatchNormalization", "Identity", "Dropout", "Constant"}
SEEDS = (0, 1)


@dataclass
class Parsed:
    """A real model and the MBLT parsed from it."""

    name: str
    source: Path
    input_shape_dict: dict
    constant_inputs: dict
    mblt: Path
    proto: onnx.ModelProto
    parse_seconds: float


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """``max|actual - expected| / max(max|expected|, 1e-6)``."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if expected.size == 0:
        return 0.0
    return float(np.max(np.abs(actual - expected)) / max(float(np.max(np.abs(expected))), 1e-6))


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # unused-initializer warnings of the sources are noise here
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module", params=list(realmodels.real_models()))
def parsed(request, tmp_path_factory) -> Parsed:
    """Build (or find) one real model and parse it with ``mblt_compile``."""
    from compiler_core.api import mblt_compile

    try:
        source, shapes, constants = realmodels.real_models()[request.param]()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(f"{request.param}: {error}")
    target = tmp_path_factory.mktemp(request.param) / f"{request.param}.mblt"
    started = time.process_time()  # CPU time: on a shared machine wall time measures the load
    written = mblt_compile(source, target, backend="onnx", input_shape_dict=shapes, constant_inputs=constants)
    seconds = time.process_time() - started
    return Parsed(request.param, Path(source), shapes, constants, Path(written),
                  onnx.load(str(written)), seconds)


def _graph_values(graph: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    return {value.name: value for value in [*graph.input, *graph.value_info, *graph.output]}


def _is_static(value: onnx.ValueInfoProto) -> bool:
    tensor = value.type.tensor_type
    return (value.type.HasField("tensor_type") and tensor.HasField("shape")
            and all(dim.HasField("dim_value") and dim.dim_value >= 0 for dim in tensor.shape.dim))


def test_mblt_written_where_asked(parsed: Parsed):
    assert parsed.mblt.is_file() and parsed.mblt.stat().st_size > 0


def test_passes_full_checker(parsed: Parsed):
    onnx.checker.check_model(str(parsed.mblt), full_check=True)


def test_canonical_opset_and_ir_version(parsed: Parsed):
    opsets = {entry.domain: entry.version for entry in parsed.proto.opset_import}
    assert opsets.get("", opsets.get("ai.onnx")) == 21, opsets
    assert parsed.proto.ir_version == 10


def test_every_value_has_a_static_shape(parsed: Parsed):
    graph = parsed.proto.graph
    values = _graph_values(graph)
    names = [value.name for value in graph.input] + [out for node in graph.node for out in node.output if out]
    missing = [name for name in names if name not in values]
    dynamic = [name for name in names if name in values and not _is_static(values[name])]
    assert not missing, f"{len(missing)} values without type/shape info, e.g. {missing[:5]}"
    assert not dynamic, f"{len(dynamic)} values with dynamic shapes, e.g. {dynamic[:5]}"


def test_no_forbidden_ops(parsed: Parsed):
    found = sorted({node.op_type for node in parsed.proto.graph.node} & FORBIDDEN_OPS)
    assert not found, f"ops that canonicalization must remove are left: {found}"


def test_only_mblt_ops(parsed: Parsed):
    from compiler_core.mblt.opset import is_mblt_op

    found = sorted({f"{n.domain}::{n.op_type}" for n in parsed.proto.graph.node if not is_mblt_op(n.domain, n.op_type)})
    assert not found


def test_no_constant_subgraphs(parsed: Parsed):
    graph = parsed.proto.graph
    initializers = {init.name for init in graph.initializer}
    constant = [f"{node.op_type} {node.name}" for node in graph.node
                if all(name in initializers for name in node.input if name)]
    assert not constant, f"{len(constant)} nodes compute only from constants, e.g. {constant[:5]}"


def test_topologically_sorted(parsed: Parsed):
    graph = parsed.proto.graph
    available = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    for node in graph.node:
        late = [name for name in node.input if name and name not in available]
        assert not late, f"{node.op_type} {node.name} reads {late} before they are produced"
        available.update(node.output)


def test_provenance_names_the_source(parsed: Parsed):
    from compiler_core.api import read_provenance

    record = read_provenance(parsed.mblt)
    assert record["source_sha256"] == hashlib.sha256(parsed.source.read_bytes()).hexdigest()
    assert record["backend"] == "onnx"


@pytest.mark.parametrize("seed", SEEDS)
def test_outputs_match_source(parsed: Parsed, seed: int):
    feed = realmodels.sample_inputs(parsed.source, parsed.input_shape_dict, seed, parsed.constant_inputs)
    expected = _session(parsed.source).run(None, feed)
    mblt = _session(parsed.mblt)
    mblt_feed = {value.name: feed[value.name] for value in mblt.get_inputs()}
    assert set(feed) - set(mblt_feed) == set(parsed.constant_inputs), "inputs changed beyond the bound constants"
    actual = mblt.run(None, mblt_feed)
    assert len(actual) == len(expected)
    errors = [relative_error(a, b) for a, b in zip(actual, expected)]
    for index, (a, b) in enumerate(zip(actual, expected)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"output {index}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    assert max(errors) < MAX_RELATIVE_ERROR, f"relative errors per output: {errors}"


def test_parse_is_quick(parsed: Parsed):
    """Guards against pathological slowdowns (CPU seconds of the parse; 0.4-1.1 s per model measured here)."""
    assert parsed.parse_seconds < 20, f"{parsed.name} took {parsed.parse_seconds:.1f} s of CPU to parse"


# -- model-specific end-to-end checks -----------------------------------------------------------------


def test_mobilenet_top1_matches_pytorch(tmp_path):
    """On real photos the MBLT's top-1 ImageNet class is PyTorch's (chelsea is an Egyptian cat, 285)."""
    import torch

    from compiler_core.api import mblt_compile

    try:
        module, source = realmodels.mobilenet_v2_module(), realmodels.mobilenet_v2_onnx()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))
    session = _session(mblt_compile(source, tmp_path / "mobilenet.mblt"))
    input_name = session.get_inputs()[0].name
    classes = []
    for seed in range(4):
        image = realmodels.sample_inputs(source, None, seed)["input"]
        with torch.no_grad():
            reference = module(torch.from_numpy(image)).numpy()
        classes.append(int(session.run(None, {input_name: image})[0].argmax()))
        assert classes[-1] == reference.argmax()
    if realmodels.photo(0) is not None:
        assert classes[0] == 285, f"chelsea classified as {classes[0]}"


def test_minilm_export_matches_pytorch():
    """The exported MiniLM itself is right (the legacy exporter was not: see ``MINILM_EXPORTER``)."""
    import torch

    try:
        path, module = realmodels.minilm_onnx(128), realmodels.minilm_module()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))
    tokens = realmodels.tokenize(realmodels.SENTENCES[1:2])
    with torch.no_grad():
        reference = module(**{name: torch.from_numpy(array) for name, array in tokens.items()}).numpy()
    exported = _session(path).run(None, tokens)[0]
    assert relative_error(exported, reference) < 1e-4
