"""Property-based fuzzing of every reader: a coded error or success, never a raw exception, hang or partial file.

Each test runs :data:`fuzzing.CASES` cases (300 in ``make test``, 10,000 in ``make fuzz``) and prints
its outcome counts. Mutations are structure-aware where the format has structure (ONNX protos,
MXQ programs re-written with valid CRCs, TFLite flatbuffers built from random specs, zip members)
and byte-level otherwise.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import shutil
import string
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from fuzzing import (
    CASES,
    FUZZ,
    OUTCOMES,
    SAMPLE_DIR,
    check_case,
    sample_mxq,
    scratch,
    seed_mblt_bytes,
    seed_onnx,
    summary,
)
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from compiler_core.api import mblt_compile
from compiler_core.calibration import InputSpec, open_calibration_data
from compiler_core.config import CompileConfig
from compiler_core.mblt.io import load_mblt
from qbstudio.state.project import Project
from qbstudio.state.runs import RunRecord

TEXT = st.text(alphabet=string.printable + "\u00e9\u4e2d\u0000", max_size=12)  # a fixed alphabet: no charmap build
JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False, allow_infinity=False), TEXT)
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(TEXT, inner, max_size=4)),
                           max_leaves=8)


@st.composite
def byte_mutations(draw, data: bytes) -> bytes:
    """Flip, overwrite, insert, delete or truncate a few bytes of ``data``."""
    buffer = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        position = draw(st.integers(0, max(len(buffer) - 1, 0)))
        if kind == "flip" and buffer:
            buffer[position] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and buffer:
            buffer[position] = draw(st.integers(0, 255))
        elif kind == "insert":
            buffer[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del buffer[position:position + draw(st.integers(1, 8))]
        else:
            del buffer[position:]
    return bytes(buffer)


def _report(reader: str) -> None:
    print("\n" + summary(reader))
    assert sum(OUTCOMES[reader].values()) >= CASES, f"{reader}: fewer cases than the profile's {CASES}"


# -- ONNX ------------------------------------------------------------------------------------------

_OP_TYPES = ["Relu", "Conv", "Gemm", "Add", "Reshape", "Foo", "If", "MaxPool", "Softmax", "Identity", ""]


@st.composite
def onnx_mutations(draw) -> bytes:
    """A structurally mutated seed model (names, op types, attributes, dims, data, opset), serialized."""
    model = seed_onnx()
    graph = model.graph
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["input", "op", "attr", "dims", "raw", "value", "opset", "drop", "dtype"]))
        node = graph.node[draw(st.integers(0, len(graph.node) - 1))] if graph.node else None
        tensor = graph.initializer[draw(st.integers(0, len(graph.initializer) - 1))]
        if kind == "input" and node is not None and node.input:
            node.input[draw(st.integers(0, len(node.input) - 1))] = draw(st.sampled_from(["", "ghost", "x", "y", "c"]))
        elif kind == "op" and node is not None:
            node.op_type = draw(st.sampled_from(_OP_TYPES))
        elif kind == "attr" and node is not None and node.attribute:
            attribute = node.attribute[draw(st.integers(0, len(node.attribute) - 1))]
            attribute.ints[:] = draw(st.lists(st.integers(-3, 2**33), max_size=5))
        elif kind == "dims":
            tensor.dims[:] = draw(st.lists(st.integers(-2, 2**31), max_size=4))
        elif kind == "raw":
            tensor.raw_data = tensor.raw_data[: draw(st.integers(0, len(tensor.raw_data)))]
        elif kind == "value":
            dims = graph.input[0].type.tensor_type.shape.dim
            dims[draw(st.integers(0, len(dims) - 1))].dim_value = draw(st.integers(0, 2**20))
        elif kind == "opset":
            model.opset_import[0].version = draw(st.integers(1, 30))
        elif kind == "drop" and node is not None:
            graph.node.remove(node)
        elif kind == "dtype":
            tensor.data_type = draw(st.integers(0, 25))
    return model.SerializeToString()


def test_fuzz_onnx_parse():
    seed = seed_onnx().SerializeToString()

    @FUZZ
    @given(st.one_of(onnx_mutations(), byte_mutations(seed)))
    def case(data: bytes) -> None:
        folder = scratch()
        try:
            (folder / "m.onnx").write_bytes(data)
            out = folder / "out"
            out.mkdir()
            check_case("onnx", lambda: mblt_compile(folder / "m.onnx", out / "m.mblt"), out, ("m.mblt",))
        finally:
            shutil.rmtree(folder)

    case()
    _report("onnx")


def test_fuzz_mblt_load():
    seed = seed_mblt_bytes()

    @FUZZ
    @given(byte_mutations(seed))
    def case(data: bytes) -> None:
        folder = scratch()
        try:
            (folder / "m.mblt").write_bytes(data)
            check_case("mblt", lambda: load_mblt(folder / "m.mblt"))
        finally:
            shutil.rmtree(folder)

    case()
    _report("mblt")


# -- MXQ -------------------------------------------------------------------------------------------


def _paths(value, prefix=()):
    """Every (path, leaf) of a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))
    yield prefix, value


def _set(document, path, value):
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


@st.composite
def mxq_mutations(draw, parts: dict) -> dict:
    """Valid container, mutated content: JSON values of program/meta, or constant arrays."""
    tampered = copy.copy(parts)
    kind = draw(st.sampled_from(["program", "program", "meta", "const"]))
    if kind == "const":
        name = draw(st.sampled_from(sorted(parts["consts"])))
        dtype = draw(st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "float32", "bool"]))
        shape = draw(st.lists(st.integers(0, 6), max_size=4))
        tampered["consts"] = {**parts["consts"], name: np.zeros(shape, dtype)}
        return tampered
    document = copy.deepcopy(parts[kind])
    paths = [path for path, _ in _paths(document) if path]
    path = draw(st.sampled_from(paths))
    _set(document, path, draw(JSON_VALUES))
    tampered[kind] = document
    return tampered


def test_fuzz_mxq_load_and_infer():
    from mxq_tamper import load_parts, write_parts

    from compiler_core.runtime import Accelerator, Model

    source = sample_mxq()
    parts = load_parts(source)
    image = np.zeros((1, 1, 28, 28), np.float32)

    def load_and_run(path: Path) -> None:
        model = Model(path, input_layout="NCHW")
        model.launch(Accelerator(model.artifact.device))
        model.infer(image)

    @FUZZ
    @given(st.one_of(mxq_mutations(parts), byte_mutations(source.read_bytes())))
    def case(mutation) -> None:
        folder = scratch()
        try:
            path = folder / "m.mxq"
            if isinstance(mutation, bytes):
                path.write_bytes(mutation)
            else:
                try:
                    write_parts(mutation, path)
                except Exception:  # noqa: BLE001 - the writer refuses some values (not JSON, bad dtype)
                    return
            check_case("mxq", lambda: load_and_run(path))
        finally:
            shutil.rmtree(folder)

    case()
    _report("mxq")


# -- TFLite ----------------------------------------------------------------------------------------


def _tflite_seed() -> tuple[list[dict], list[dict]]:
    import tflite

    rng = np.random.default_rng(0)
    tensors = [{"name": "image", "shape": [1, 6, 6, 2]},
               {"name": "w", "shape": [3, 3, 3, 2], "data": rng.standard_normal((3, 3, 3, 2)).astype(np.float32)},
               {"name": "b", "shape": [3], "data": rng.standard_normal(3).astype(np.float32)},
               {"name": "conv", "shape": [1, 6, 6, 3]},
               {"name": "shape", "shape": [2], "type": tflite.TensorType.INT32, "data": np.array([1, 108], np.int32)},
               {"name": "flat", "shape": [1, 108]},
               {"name": "out", "shape": [1, 108]}]
    operators = [{"op": "CONV_2D", "inputs": [0, 1, 2], "outputs": [3], "options": ("Conv2DOptions", {
                      "Padding": 0, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": 1})},
                 {"op": "RESHAPE", "inputs": [3, 4], "outputs": [5]},
                 {"op": "SOFTMAX", "inputs": [5], "outputs": [6], "options": ("SoftmaxOptions", {"Beta": 1.0})}]
    return tensors, operators


@st.composite
def tflite_specs(draw) -> bytes:
    """A TFLite model built from a mutated spec (indices, shapes, options, op types)."""
    from test_frontends_tflite import build_tflite

    tensors, operators = copy.deepcopy(_tflite_seed())
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["index", "shape", "op", "stride", "data"]))
        op = operators[draw(st.integers(0, len(operators) - 1))]
        tensor = tensors[draw(st.integers(0, len(tensors) - 1))]
        if kind == "index":
            slots = op["inputs"] if draw(st.booleans()) else op["outputs"]
            slots[draw(st.integers(0, len(slots) - 1))] = draw(st.integers(-2, 9))
        elif kind == "shape":
            tensor["shape"] = draw(st.lists(st.integers(-1, 40), max_size=5))
        elif kind == "op":
            op["op"] = draw(st.sampled_from(["CONV_2D", "DEPTHWISE_CONV_2D", "RESHAPE", "SOFTMAX", "ADD", "MEAN",
                                             "FULLY_CONNECTED", "AVERAGE_POOL_2D", "CONCATENATION", "PAD"]))
            op.pop("options", None)
        elif kind == "stride" and "options" in op and op["options"][0] == "Conv2DOptions":
            op["options"][1]["StrideW"] = draw(st.integers(-2, 3))
            op["options"][1]["Padding"] = draw(st.integers(0, 3))
        elif kind == "data" and tensor.get("data") is not None:
            tensor["data"] = tensor["data"].reshape(-1)[: draw(st.integers(0, tensor["data"].size))]
    return build_tflite(tensors, operators, inputs=[0], outputs=[6])


def test_fuzz_tflite():
    pytest.importorskip("tflite")
    from test_frontends_tflite import build_tflite

    from compiler_core.frontends.tflite import load_tflite

    seed = build_tflite(*_tflite_seed(), inputs=[0], outputs=[6])

    @FUZZ
    @given(st.one_of(tflite_specs(), byte_mutations(seed)))
    def case(data: bytes) -> None:
        folder = scratch()
        try:
            (folder / "m.tflite").write_bytes(data)
            check_case("tflite", lambda: load_tflite(folder / "m.tflite"))
        finally:
            shutil.rmtree(folder)

    case()
    _report("tflite")


# -- TorchScript / torch.save zips -------------------------------------------------------------------


@st.composite
def zip_mutations(draw, data: bytes) -> bytes:
    """Rewrite one member of the archive with mutated bytes (valid zip, bad content), or mutate the zip."""
    if draw(st.booleans()):
        return draw(byte_mutations(data))
    source = zipfile.ZipFile(io.BytesIO(data))
    names = source.namelist()
    target = draw(st.sampled_from(names))
    output = io.BytesIO()
    with zipfile.ZipFile(output, "w", zipfile.ZIP_STORED) as archive:
        for name in names:
            content = source.read(name)
            if name == target:
                content = draw(byte_mutations(content)) if content else draw(st.binary(max_size=16))
            if name != target or draw(st.integers(0, 5)):
                archive.writestr(name, content)
    return output.getvalue()


def _torch_seeds(torch, folder: Path) -> dict[str, tuple[bytes, Callable[[Path], object]]]:
    """TorchScript, torch.export (.pt2) and torch.save archives of a tiny model, with their readers."""
    from compiler_core.frontends.torch import _load_exported_program, load_pickled_module
    from compiler_core.frontends.torchscript import load_script_module

    module = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU())
    torch.jit.save(torch.jit.script(module), folder / "m.jit")
    torch.export.save(torch.export.export(module, (torch.zeros(1, 4),)), folder / "m.pt2")
    torch.save(module.state_dict(), folder / "m.pth")
    return {"jit": ((folder / "m.jit").read_bytes(), load_script_module),
            "pt2": ((folder / "m.pt2").read_bytes(), _load_exported_program),
            "pth": ((folder / "m.pth").read_bytes(), load_pickled_module)}


def test_fuzz_torch_zips(tmp_path):
    torch = pytest.importorskip("torch")
    seeds = _torch_seeds(torch, tmp_path)

    @st.composite
    def archives(draw) -> tuple[str, bytes]:
        kind = draw(st.sampled_from(sorted(seeds)))
        return kind, draw(zip_mutations(seeds[kind][0]))

    @FUZZ
    @given(archives())
    def case(archive: tuple[str, bytes]) -> None:
        kind, data = archive
        folder = scratch()
        try:
            path = folder / f"m.{kind}"
            path.write_bytes(data)
            check_case("torch zips", lambda: seeds[kind][1](path))
        finally:
            shutil.rmtree(folder)

    case()
    _report("torch zips")


# -- calibration data: .npy, images, manifests -------------------------------------------------------

SPEC = InputSpec("image", (1, 1, 28, 28), np.dtype(np.float32), "NCHW")


def _read_all(path: Path) -> None:
    dataset = open_calibration_data(path, [SPEC], preprocessing={"apply": False})
    for index in range(len(dataset)):
        dataset.sample(index)


@st.composite
def npy_files(draw) -> bytes:
    """A .npy with a mutated header (shape, dtype, version) or body, or random bytes."""
    array = np.zeros(draw(st.sampled_from([(1, 1, 28, 28), (28, 28, 1), (1, 28, 28), (2, 3)])), np.float32)
    data = io.BytesIO()
    np.save(data, array)
    raw = data.getvalue()
    kind = draw(st.sampled_from(["header", "bytes", "shape"]))
    if kind == "shape":
        shape = tuple(draw(st.lists(st.integers(0, 2**40), max_size=4)))
        descr = draw(st.sampled_from(["<f4", "<f8", "|u1", "<i8", "|O", "<c16", "|b1"]))
        header = repr({"descr": descr, "fortran_order": draw(st.booleans()), "shape": shape}).encode()
        header += b" " * ((-len(header) - 11) % 64) + b"\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + raw[128:128 + draw(st.integers(0, 4096))]
    if kind == "header":
        return draw(byte_mutations(raw[:128])) + raw[128:]
    return draw(byte_mutations(raw))


def test_fuzz_npy():
    @FUZZ
    @given(npy_files())
    def case(data: bytes) -> None:
        folder = scratch()
        try:
            (folder / "a.npy").write_bytes(data)
            check_case("npy", lambda: _read_all(folder))
        finally:
            shutil.rmtree(folder)

    case()
    _report("npy")


@st.composite
def image_files(draw) -> tuple[str, bytes]:
    """A real PNG/JPEG/BMP of a random mode and size, then truncated or mutated; or a huge-dimension header."""
    kind = draw(st.sampled_from(["PNG", "JPEG", "BMP", "huge"]))
    if kind == "huge":
        width, height = draw(st.integers(1, 2**31 - 1)), draw(st.integers(1, 2**31 - 1))
        ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
        import zlib

        chunk = b"IHDR" + ihdr
        png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
        return "huge.png", png + draw(st.binary(max_size=64))
    mode = draw(st.sampled_from(["L", "RGB", "RGBA", "P", "1", "I", "F", "CMYK", "LA"]))
    size = (28, 28) if draw(st.booleans()) else (draw(st.integers(1, 64)), draw(st.integers(1, 64)))
    image = Image.new(mode if not (kind == "JPEG" and mode not in ("L", "RGB", "CMYK")) else "RGB", size)
    buffer = io.BytesIO()
    try:
        image.save(buffer, format=kind)
    except (OSError, ValueError, KeyError):
        image.convert("RGB").save(buffer, format=kind)
    data = buffer.getvalue()
    if draw(st.booleans()):
        data = draw(byte_mutations(data))
    return f"image.{kind.lower()}", data


def test_fuzz_images():
    @FUZZ
    @given(image_files())
    def case(file: tuple[str, bytes]) -> None:
        folder = scratch()
        try:
            (folder / file[0]).write_bytes(file[1])
            check_case("image", lambda: _read_all(folder))
        finally:
            shutil.rmtree(folder)

    case()
    _report("image")


@st.composite
def manifests(draw) -> str:
    """A calibration manifest with mutated keys, values and paths."""
    document = {"info": {"input names": ["image"], "input shapes": [[1, 1, 28, 28]]},
                "calib paths": [["a.npy"], ["b.npy"]]}
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from([p for p, _ in _paths(document) if p]))
        _set(document, path, draw(JSON_VALUES))
    text = json.dumps(document)
    return draw(byte_mutations(text.encode())).decode("utf-8", "replace") if draw(st.booleans()) else text


def test_fuzz_calibration_manifests():
    @FUZZ
    @given(manifests())
    def case(text: str) -> None:
        folder = scratch()
        try:
            np.save(folder / "a.npy", np.zeros((1, 1, 28, 28), np.float32))
            np.save(folder / "b.npy", np.ones((1, 1, 28, 28), np.float32))
            (folder / "manifest.json").write_text(text, encoding="utf-8")
            check_case("manifest", lambda: _read_all(folder / "manifest.json"))
        finally:
            shutil.rmtree(folder)

    case()
    _report("manifest")


@functools.cache
def _sample_config() -> dict:
    return CompileConfig.from_file(SAMPLE_DIR / "compile_config.yaml").model_dump(mode="json", by_alias=True)


@st.composite
def config_files(draw) -> tuple[str, str]:
    """The sample's YAML config, or its JSON form, with mutated values or bytes."""
    base = copy.deepcopy(_sample_config())
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from([p for p, _ in _paths(base) if p]))
        _set(base, path, draw(JSON_VALUES))
    if draw(st.booleans()):
        text = (SAMPLE_DIR / "compile_config.yaml").read_text()
        return "c.yaml", draw(byte_mutations(text.encode())).decode("utf-8", "replace")
    return "c.json", json.dumps(base)


def test_fuzz_config_files():
    @FUZZ
    @given(config_files())
    def case(file: tuple[str, str]) -> None:
        folder = scratch()
        try:
            (folder / file[0]).write_text(file[1], encoding="utf-8")
            check_case("config", lambda: CompileConfig.from_file(folder / file[0]))
        finally:
            shutil.rmtree(folder)

    case()
    _report("config")


@functools.cache
def _seed_projects() -> tuple[dict, dict]:
    """The bundled sample project (a template), and a saved project with settings and one run."""
    template = json.loads((SAMPLE_DIR.parent / "fashion_cnn.qbproj").read_text(encoding="utf-8"))
    folder = scratch()
    try:
        project = Project.load(SAMPLE_DIR.parent / "fashion_cnn.qbproj", scratch_dir=folder / "work")
        project.runs.add(RunRecord(run_id=1, created="2026-12-03T00:00:00Z", device="aries-rb", core_modes=["single"],
                                   mxq_path=str(folder / "work" / "runs" / "run-001" / "model.mxq"), size_bytes=1000,
                                   config=project.settings.to_dict()["config"], metrics={"verdict": "ok"},
                                   layers=[{"layer": "Conv_0", "sqnr_db": 30.0}], precisions={"Conv_0": "a8w8"}))
        saved = project.to_dict(folder)
    finally:
        shutil.rmtree(folder)
    return template, saved


@st.composite
def projects(draw) -> str:
    """A seed project with mutated values (any JSON value at any path), or with mutated bytes."""
    base = copy.deepcopy(draw(st.sampled_from(_seed_projects())))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from([p for p, _ in _paths(base) if p]))
        _set(base, path, draw(JSON_VALUES))
    text = json.dumps(base)
    return draw(byte_mutations(text.encode())).decode("utf-8", "replace") if draw(st.booleans()) else text


def test_fuzz_projects():
    @FUZZ
    @given(projects())
    def case(text: str) -> None:
        folder = scratch()
        try:
            (folder / "p.qbproj").write_text(text, encoding="utf-8")
            check_case("qbproj", lambda: Project.load(folder / "p.qbproj", scratch_dir=folder / "work"))
        finally:
            shutil.rmtree(folder)

    case()
    _report("qbproj")


def test_the_seeds_are_valid():
    """The fuzzers start from files the readers accept (so the mutations test real parsing)."""
    onnx.checker.check_model(seed_onnx(), full_check=True)
    folder = scratch()
    try:
        (folder / "m.mblt").write_bytes(seed_mblt_bytes())
        assert load_mblt(folder / "m.mblt").graph.inputs[0].name == "x"
        np.save(folder / "a.npy", np.zeros((1, 1, 28, 28), np.float32))
        _read_all(folder)
    finally:
        shutil.rmtree(folder)
