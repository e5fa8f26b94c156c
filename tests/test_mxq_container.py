"""Tests for compiler_core.mxq: round trips, atomic writes, integrity checks and the golden file.

Regenerate ``tests/golden/small.mxq`` (only after a deliberate format change) with
``QBCOMPILER_REGEN_GOLDEN=1 pytest tests/test_mxq_container.py`` (that run only writes the
file; the next run compares).
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from compiler_core.errors import ArgumentError, CancelledError, MxqFormatError
from compiler_core.mxq import MAGIC, FormatVersion, read_mxq, validate_mxq, write_mxq
from compiler_core.mxq.layout import (
    ENTRY_SIZE,
    HEADER_SIZE,
    Encoding,
    Header,
    SectionEntry,
)
from compiler_core.mxq.writer import SectionPayload, write_sections
from compiler_core.progress import CancelToken, Reporter

GOLDEN = Path(__file__).parent / "golden" / "small.mxq"
ALL_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
              "float16", "float32", "float64"]


# -- fixtures and helpers ------------------------------------------------------------------------


def small_sections() -> dict:
    """The deterministic content of the golden file (all five sections, a few KB)."""
    weights = (np.arange(4 * 3 * 3 * 3) % 255 - 127).astype(np.int8).reshape(4, 3, 3, 3)
    return {
        "target_device": "regulus-rb",
        "meta": {"compiler": "qbcompiler", "compiler_version": "golden", "device": "regulus-rb",
                 "core_modes": ["single"], "note": "größe ✓",
                 "inputs": [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "int8", "layout": "NHWC",
                             "scale": 0.0078125, "zero_point": 0}],
                 "outputs": [{"name": "output", "shape": [1, 4], "dtype": "int8", "scale": 0.05, "zero_point": 0}],
                 "layers": [{"name": "Conv_0", "precision": "int8"}, {"name": "Sigmoid_1", "precision": "lut8"}]},
        "program": {"single": {"instructions": [{"op": "conv", "weights": "Conv_0.W", "bias": "Conv_0.B"},
                                                {"op": "lut", "table": "Sigmoid_1.lut"}]}},
        "consts": {
            "Conv_0.W": weights,
            "Conv_0.B": np.array([-1000, 0, 1000, 2**31 - 1], dtype=np.int32),
            "Conv_0.multiplier": np.array([1 << 30, 1 << 29, 3 << 28, 1], dtype=np.int32),
            "Conv_0.shift": np.array([7, 8, 9, 31], dtype=np.int8),
            "Sigmoid_1.lut": (np.arange(256) - 128).astype(np.int8),
            "output.scale": np.array(0.05, dtype=np.float32),
            "unused.empty": np.zeros((0, 3), dtype=np.int16),
        },
        "cpu": {"head": bytes(range(256)) * 2, "tail": b"\x08\x09onnx-tail"},
        "calib": {"method": 1, "ranges": {"input": [-1.0, 0.9921875], "Conv_0": [-3.5, 4.25]}},
    }


def write_small(path: Path) -> Path:
    """Write the golden content to ``path``."""
    return write_mxq(path, **small_sections())


@pytest.fixture
def small_file(tmp_path) -> Path:
    return write_small(tmp_path / "small.mxq")


@pytest.fixture(scope="module")
def small_bytes(tmp_path_factory) -> bytes:
    return write_small(tmp_path_factory.mktemp("mxq") / "small.mxq").read_bytes()


@pytest.fixture(scope="module")
def case_log(request):
    """Collects ``(group, count)`` of the integrity cases; reported in the terminal summary line."""
    counts: list[tuple[str, int]] = []
    yield counts
    plugins = request.config.pluginmanager
    terminal, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if terminal is None or capture is None or not counts:
        return  # e.g. an xdist worker: the per-test count assertions still hold
    total = sum(count for _, count in counts)
    detail = ", ".join(f"{group} {count}" for group, count in counts)
    with capture.global_and_fixture_disabled():
        terminal.write_line(f"\nMXQ integrity: {total} corrupted files rejected ({detail})")


def parse_table(data: bytes) -> tuple[Header, list[SectionEntry]]:
    header = Header.unpack(data)
    entries = [SectionEntry.unpack(data, HEADER_SIZE + number * ENTRY_SIZE) for number in range(header.section_count)]
    return header, entries


def rebuild(data: bytes, header: Header, entries: list[SectionEntry], body: bytes | None = None) -> bytes:
    """Re-pack header and table with valid CRCs (so a structural check, not a CRC, must fire)."""
    table = b"".join(entry.pack() for entry in entries)
    body = data[HEADER_SIZE + len(table):] if body is None else body
    size = HEADER_SIZE + len(table) + len(body)
    header = dataclasses.replace(header, section_count=len(entries), table_crc=zlib.crc32(table), file_size=size)
    return header.pack() + table + body


def assert_rejected(path: Path, data: bytes) -> MxqFormatError:
    """Write ``data`` to ``path`` and check that both the reader and the validator reject it."""
    path.write_bytes(data)
    with pytest.raises(MxqFormatError) as caught:
        read_mxq(path)
    error = caught.value
    assert "compile it again" in str(error), str(error)
    assert "offset" in error.fields or "section" in error.fields, str(error)
    return error


def section(data: bytes, name: str) -> SectionEntry:
    return next(entry for entry in parse_table(data)[1] if entry.name.rstrip(b"\0") == name.encode())


def blob_section(blobs: list[dict], data_area: bytes) -> bytes:
    index = json.dumps({"blobs": blobs}).encode()
    return data_area + index + struct.pack("<Q", len(index))


def write_raw(path: Path, **payloads) -> Path:
    """A container whose sections are given as raw bytes (name -> (encoding, bytes))."""
    sections = [SectionPayload(name, encoding, lambda sink, _, data=data: sink.write(data))
                for name, (encoding, data) in payloads.items()]
    return write_sections(path, target_device="aries-rb", sections=sections, reporter=Reporter())


def valid_raw_sections(**overrides) -> dict:
    sections = {"meta": (Encoding.JSON, b"{}"), "program": (Encoding.JSON, b"{}"),
                "const": (Encoding.RAW, blob_section([], b""))}
    sections.update(overrides)
    return sections


def leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


# -- round trip ----------------------------------------------------------------------------------


@pytest.mark.parametrize("use_mmap", [False, True])
def test_round_trip_restores_every_section(tmp_path, use_mmap):
    content = small_sections()
    arrays = {f"a_{dtype}": np.arange(-6, 6).astype(dtype).reshape(3, 4) for dtype in ALL_DTYPES}
    arrays.update({"scalar": np.array(-7, dtype=np.int32), "empty": np.zeros(0, dtype=np.float32),
                   "empty_2d": np.zeros((2, 0, 5), dtype=np.int8),
                   "transposed": np.arange(12, dtype=np.int16).reshape(3, 4).T,
                   "big_endian": np.arange(5, dtype=">i4"), "list": [[1.5, 2.5]]})
    content["consts"] = arrays
    path = write_mxq(tmp_path / "m.mxq", **content)
    mxq = read_mxq(path, mmap=use_mmap)
    # int8 and uint8 of -6..5 are the same bytes: stored once, which needs format 2.0
    assert (mxq.target_device, mxq.version, str(mxq.version)) == ("regulus-rb", (2, 0), "2.0")
    offsets = {entry.name: entry.offset for entry in mxq.const_index}
    assert offsets["a_uint8"] == offsets["a_int8"] and len(set(offsets.values())) < len(offsets)
    assert (mxq.meta, mxq.program, mxq.calib, mxq.cpu) == (content["meta"], content["program"],
                                                           content["calib"], content["cpu"])
    assert list(mxq.consts) == list(arrays)
    for name, expected in arrays.items():
        expected = np.asarray(expected)
        got = mxq.consts[name]
        assert got.shape == expected.shape and got.dtype == expected.dtype.newbyteorder("<"), name
        np.testing.assert_array_equal(got, expected)
    assert mxq.consts["scalar"].shape == () and mxq.consts["scalar"] == -7
    assert mxq.file_size == path.stat().st_size


def test_sections_and_arrays_are_64_byte_aligned(small_file):
    mxq = read_mxq(small_file)
    assert [info.name for info in mxq.sections] == ["meta", "program", "calib", "cpu", "const"]
    assert all(info.offset % 64 == 0 for info in mxq.sections)
    const = next(info for info in mxq.sections if info.name == "const")
    assert [entry.name for entry in mxq.const_index] == list(small_sections()["consts"])
    assert all((const.offset + entry.offset) % 64 == 0 for entry in mxq.const_index)
    assert mxq.sections[-1].offset + mxq.sections[-1].size == mxq.file_size


def test_arrays_are_read_only_and_mapping_is_immutable(small_file):
    mxq = read_mxq(small_file)
    weights = mxq.consts["Conv_0.W"]
    with pytest.raises(ValueError):
        weights[0, 0, 0, 0] = 1
    with pytest.raises(ValueError):
        weights.flags.writeable = True
    with pytest.raises(TypeError):
        mxq.consts["new"] = weights


def test_optional_sections_may_be_absent(tmp_path):
    path = write_mxq(tmp_path / "m.mxq", target_device="aries-rb", meta={}, program={}, consts={})
    mxq = read_mxq(path)
    assert [info.name for info in mxq.sections] == ["meta", "program", "const"]
    assert (mxq.cpu, mxq.calib, dict(mxq.consts)) == ({}, None, {})


def test_consts_may_be_a_generator_and_device_is_canonical(tmp_path):
    pairs = ((f"w{index}", np.full((index, 2), index, dtype=np.int8)) for index in range(4))
    path = write_mxq(tmp_path / "m.mxq", target_device=" Aries-RB ", meta={"n": np.int64(4)},
                     program={"scales": np.array([0.5, 0.25])}, consts=pairs)
    mxq = read_mxq(path)
    assert mxq.target_device == "aries-rb"
    assert mxq.meta == {"n": 4} and mxq.program == {"scales": [0.5, 0.25]}
    assert [mxq.consts[f"w{index}"].sum() for index in range(4)] == [0, 2, 8, 18]


def test_unknown_sections_are_read_and_ignored(tmp_path):
    path = write_raw(tmp_path / "m.mxq", **valid_raw_sections(future=(Encoding.RAW, b"\x01" * 100)))
    mxq = read_mxq(path)
    assert [info.name for info in mxq.sections] == ["meta", "program", "const", "future"]
    assert validate_mxq(path)["ok"]


def test_writer_reports_progress_in_bytes(tmp_path):
    events = []
    consts = {"big": np.ones(9 << 20, dtype=np.int8), "small": np.ones(10, dtype=np.int32)}
    write_mxq(tmp_path / "m.mxq", target_device="aries-rb", meta={}, program={}, consts=consts,
              reporter=events.append)
    assert events[0].total == (9 << 20) + 40 and events[0].done == 0
    assert any(0 < event.done < event.total for event in events)
    assert events[-1].done == events[-1].total and "finished" in events[-1].message


# -- writer input errors and atomicity -----------------------------------------------------------


@pytest.mark.parametrize("change, words", [
    ({"target_device": "aries-zz"}, "aries-zz"),
    ({"target_device": "ARIES"}, "chip name"),
    ({"meta": {"loss": float("nan")}}, "meta"),
    ({"program": ["not", "a", "dict"]}, "program"),
    ({"calib": {"when": object()}}, "calib"),
    ({"consts": {"c": np.zeros(2, dtype=np.complex64)}}, "complex"),
    ({"consts": {"": np.zeros(2)}}, "name"),
    ({"consts": iter([("a", np.zeros(1)), ("a", np.zeros(1))])}, "'a'"),
    ({"cpu": {"head": "not bytes"}}, "bytes"),
])
def test_bad_writer_input_is_an_argument_error_and_writes_nothing(tmp_path, change, words):
    content = {**small_sections(), **change}
    with pytest.raises(ArgumentError) as caught:
        write_mxq(tmp_path / "m.mxq", **content)
    assert words in str(caught.value)
    assert leftovers(tmp_path) == []


def failing_consts():
    yield "ok", np.ones((1 << 20,), dtype=np.int32)
    raise RuntimeError("quantizer exploded")


def test_failure_mid_write_leaves_no_file_and_keeps_the_old_one(tmp_path):
    existing = write_small(tmp_path / "m.mxq")
    before = existing.read_bytes()
    with pytest.raises(RuntimeError, match="exploded"):
        write_mxq(existing, target_device="aries-rb", meta={}, program={}, consts=failing_consts())
    assert leftovers(tmp_path) == ["m.mxq"] and existing.read_bytes() == before
    with pytest.raises(RuntimeError):
        write_mxq(tmp_path / "new.mxq", target_device="aries-rb", meta={}, program={}, consts=failing_consts())
    assert leftovers(tmp_path) == ["m.mxq"]


def test_pre_cancelled_token_writes_nothing(tmp_path):
    token = CancelToken()
    token.cancel()
    with pytest.raises(CancelledError):
        write_mxq(tmp_path / "m.mxq", **small_sections(), reporter=Reporter(cancel_token=token))
    assert leftovers(tmp_path) == []


def test_cancel_during_a_large_write_stops_within_a_second(tmp_path):
    token = CancelToken()
    cancelled_at: list[float] = []

    def on_progress(event):
        if event.done > 0 and not token.cancelled:
            cancelled_at.append(time.perf_counter())
            token.cancel()

    # 320 MB of constants; broadcast views, so only the array being written is materialised
    consts = {f"w{index}": np.broadcast_to(np.int8(index), (40 << 20,)) for index in range(8)}
    with pytest.raises(CancelledError):
        write_mxq(tmp_path / "m.mxq", target_device="aries-rb", meta={}, program={}, consts=consts,
                  reporter=Reporter(on_progress, token))
    assert cancelled_at and time.perf_counter() - cancelled_at[0] < 1.0
    assert leftovers(tmp_path) == []


# -- integrity: every corruption is an MxqFormatError -------------------------------------------


def test_every_header_and_table_byte_is_checked(tmp_path, small_bytes, case_log):
    header, _ = parse_table(small_bytes)
    end = HEADER_SIZE + header.table_size
    for position in range(end):
        data = bytearray(small_bytes)
        data[position] ^= 0xFF
        assert_rejected(tmp_path / "bad.mxq", bytes(data))
    case_log.append(("header/table byte flips", end))
    assert end == HEADER_SIZE + 5 * ENTRY_SIZE


def test_bytes_inside_every_section_are_checked(tmp_path, small_bytes, case_log):
    cases = 0
    for entry in parse_table(small_bytes)[1]:
        positions = {entry.offset, entry.end - 1} | {int(p) for p in np.linspace(entry.offset, entry.end - 1, 50)}
        for position in sorted(positions):
            data = bytearray(small_bytes)
            data[position] ^= 0xFF
            error = assert_rejected(tmp_path / "bad.mxq", bytes(data))
            assert error.fields["section"] == entry.name.rstrip(b"\0").decode()
            cases += 1
    case_log.append(("section byte flips", cases))
    assert cases >= 5 * 20


def test_padding_bytes_are_checked(tmp_path, small_bytes, case_log):
    header, entries = parse_table(small_bytes)
    gaps, previous_end = [], HEADER_SIZE + header.table_size
    for entry in entries:
        gaps.extend(range(previous_end, entry.offset))
        previous_end = entry.end
    for position in gaps:
        data = bytearray(small_bytes)
        data[position] ^= 0xFF
        assert "padding" in str(assert_rejected(tmp_path / "bad.mxq", bytes(data)))
    case_log.append(("padding byte flips", len(gaps)))
    assert len(gaps) > 50


def test_truncation_anywhere_is_detected(tmp_path, small_bytes, case_log):
    positions = sorted({int(p) for p in np.linspace(0, len(small_bytes) - 1, 100)})
    for position in positions:
        assert_rejected(tmp_path / "bad.mxq", small_bytes[:position])
    case_log.append(("truncations", len(positions)))
    assert len(positions) == 100 and positions[0] == 0 and positions[-1] == len(small_bytes) - 1


@pytest.mark.parametrize("tail", [b"\0", b"\0" * 64, b"junk", MAGIC])
def test_trailing_bytes_are_detected(tmp_path, small_bytes, tail, case_log):
    error = assert_rejected(tmp_path / "bad.mxq", small_bytes + tail)
    assert "unexpected bytes" in str(error)
    case_log.append((f"trailing {len(tail)} bytes", 1))


# -- messages for specific problems --------------------------------------------------------------


def test_major_version_mismatch_names_both_versions(tmp_path, small_bytes):
    header, entries = parse_table(small_bytes)
    data = rebuild(small_bytes, dataclasses.replace(header, major=3, minor=3), entries)
    error = assert_rejected(tmp_path / "v3.mxq", data)
    assert "3.3" in str(error) and "1.x and 2.x" in str(error) and error.fields["version"] == "3.3"


def test_equal_arrays_are_stored_once_and_read_back_under_each_name(tmp_path):
    """An unrolled LSTM's steps each carry the same recurrent weights: one copy in the file, every name reads it."""
    content = small_sections()
    step = (np.arange(256 * 64) % 251 - 125).astype(np.int8).reshape(256, 64)
    content["consts"] = {f"op{index}.weight": step.copy() for index in range(20)}
    content["consts"]["op0.bias"] = np.arange(256, dtype=np.int32)
    content["consts"]["reinterpreted"] = step.view(np.uint8)  # same bytes, another dtype: shares them too
    path = write_mxq(tmp_path / "lstm.mxq", **content)
    assert path.stat().st_size < 2 * step.nbytes + 8192  # was 21 copies
    mxq = read_mxq(path)
    assert mxq.version == (2, 0)
    for name, expected in content["consts"].items():
        np.testing.assert_array_equal(mxq.consts[name], expected)
        assert mxq.consts[name].dtype == expected.dtype
    assert len({entry.offset for entry in mxq.const_index}) == 2
    assert validate_mxq(path)["ok"]


def test_a_file_without_shared_arrays_stays_version_1_0(small_file):
    """1.x readers (qb Studio before format 2.0) keep reading every MXQ whose arrays all have their own bytes."""
    assert read_mxq(small_file).version == (1, 0)


def test_shared_bytes_are_corrupt_in_a_1_x_file_and_must_repeat_an_earlier_blob_exactly(tmp_path):
    def container(blobs: list[dict], major: int) -> bytes:
        path = write_raw(tmp_path / "raw.mxq", **valid_raw_sections(const=(Encoding.RAW, blob_section(blobs, bytes(range(8))))))
        data = path.read_bytes()
        header, entries = parse_table(data)
        return rebuild(data, dataclasses.replace(header, major=major), entries)

    blobs = [{"name": "a", "dtype": "|i1", "shape": [8], "offset": 0, "nbytes": 8},
             {"name": "b", "dtype": "|u1", "shape": [2, 4], "offset": 0, "nbytes": 8}]
    path = tmp_path / "shared.mxq"
    path.write_bytes(container(blobs, 2))
    assert read_mxq(path).consts["b"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert "overlaps" in str(assert_rejected(tmp_path / "v1.mxq", container(blobs, 1)))
    inside = [blobs[0], {**blobs[1], "shape": [4], "nbytes": 4}]  # within an earlier blob, not its placement
    assert "overlaps" in str(assert_rejected(tmp_path / "inside.mxq", container(inside, 2)))


def test_higher_minor_version_is_accepted(tmp_path, small_bytes):
    header, entries = parse_table(small_bytes)
    path = tmp_path / "v1_7.mxq"
    path.write_bytes(rebuild(small_bytes, dataclasses.replace(header, minor=7, flags=1, reserved=b"future!!"), entries))
    mxq = read_mxq(path)
    assert mxq.version == FormatVersion(1, 7) and mxq.consts["Conv_0.B"][2] == 1000


def test_higher_minor_may_grow_the_header(tmp_path, small_bytes):
    header, entries = parse_table(small_bytes)
    table_end = HEADER_SIZE + header.table_size
    assert entries[0].offset - table_end >= 8, "the golden layout leaves room for 8 more header bytes"
    grown = dataclasses.replace(header, minor=1, header_size=72)
    fields = grown.pack()[:60] + b"EXTENDED"
    data = fields + struct.pack("<I", zlib.crc32(fields)) + small_bytes[HEADER_SIZE:table_end]
    data += bytes(entries[0].offset - len(data)) + small_bytes[entries[0].offset:]
    path = tmp_path / "grown.mxq"
    path.write_bytes(data)
    assert read_mxq(path).version == (1, 1)


def test_unknown_device_is_rejected(tmp_path, small_bytes):
    header, entries = parse_table(small_bytes)
    error = assert_rejected(tmp_path / "dev.mxq", rebuild(small_bytes, dataclasses.replace(header, device=b"aries-zz"), entries))
    assert "aries-zz" in str(error) and "regulus-rb" in str(error)


def test_nonzero_flags_or_reserved_bytes_are_rejected_in_a_known_version(tmp_path, small_bytes):
    header, entries = parse_table(small_bytes)
    for change in ({"flags": 4}, {"reserved": b"\0\0\0\0\0\0\0\x01"}):
        assert_rejected(tmp_path / "bad.mxq", rebuild(small_bytes, dataclasses.replace(header, **change), entries))
    bad_entries = [dataclasses.replace(entries[0], reserved=b"\x01" + bytes(7)), *entries[1:]]
    assert_rejected(tmp_path / "bad.mxq", rebuild(small_bytes, header, bad_entries))


@pytest.mark.parametrize("mutate, words", [
    (lambda es: [dataclasses.replace(es[0], offset=es[0].offset + 8), *es[1:]], "aligned"),
    (lambda es: [es[0], dataclasses.replace(es[1], offset=es[0].offset), *es[2:]], "overlap"),
    (lambda es: [*es[:-1], dataclasses.replace(es[-1], size=es[-1].size + 1)], "past the end"),
    (lambda es: [*es[:-1], dataclasses.replace(es[-1], size=es[-1].size - 1)], "follow the last section"),
    (lambda es: [es[0], dataclasses.replace(es[1], name=b"meta"), *es[2:]], "repeats"),
    (lambda es: [dataclasses.replace(es[0], name=b"me ta"), *es[1:]], "malformed name"),
    (lambda es: [dataclasses.replace(es[0], encoding=9), *es[1:]], "unknown encoding"),
    (lambda es: [dataclasses.replace(es[0], encoding=0), *es[1:]], "expected 1 (json)"),
    (lambda es: [es[0], es[1], *es[4:]], "padding"),  # calib and cpu dropped: their bytes become a gap
    (lambda es: es * 0, "follow"),
])
def test_structural_problems_with_valid_crcs(tmp_path, small_bytes, mutate, words):
    header, entries = parse_table(small_bytes)
    new_entries = mutate(entries)
    body = small_bytes[HEADER_SIZE + header.table_size:]
    shift = (len(new_entries) - len(entries)) * ENTRY_SIZE
    if shift < 0:  # keep section offsets valid: refill the shortened table's room with zeros
        body = bytes(-shift) + body
    error = assert_rejected(tmp_path / "bad.mxq", rebuild(small_bytes, header, new_entries, body))
    assert words in str(error)


def test_section_table_past_end_of_file(tmp_path, small_bytes):
    header, entries = parse_table(small_bytes)
    many = dataclasses.replace(header, section_count=10**6)
    fields = many.pack()
    error = assert_rejected(tmp_path / "bad.mxq", fields + small_bytes[HEADER_SIZE:])
    assert "runs past the end" in str(error)


@pytest.mark.parametrize("sections, words", [
    ({"meta": (Encoding.JSON, b"{not json")}, "not valid UTF-8 JSON"),
    ({"meta": (Encoding.JSON, b"\xff\xfe")}, "not valid UTF-8 JSON"),
    ({"program": (Encoding.JSON, b"[1, 2]")}, "not an object"),
    ({"calib": (Encoding.JSON, b"[" * 100000)}, "not valid"),
    ({"const": (Encoding.RAW, b"\x01")}, "too small"),
    ({"const": (Encoding.RAW, struct.pack("<Q", 99))}, "larger than the section"),
    ({"const": (Encoding.RAW, blob_section([{"name": "w", "dtype": "<c8", "shape": [1], "offset": 0,
                                              "nbytes": 8}], bytes(8)))}, "unknown dtype"),
    ({"const": (Encoding.RAW, blob_section([{"name": "w", "dtype": "<i4", "shape": [3], "offset": 0,
                                              "nbytes": 8}], bytes(12)))}, "needs 12"),
    ({"const": (Encoding.RAW, blob_section([{"name": "w", "dtype": "<i4", "shape": [2**40, 2**40],
                                              "offset": 0, "nbytes": 2**82}], bytes(8)))}, "runs past"),
    ({"const": (Encoding.RAW, blob_section([{"name": "w", "dtype": "|i1", "shape": [4], "offset": 8,
                                              "nbytes": 4}], bytes(16)))}, "aligned"),
    ({"const": (Encoding.RAW, blob_section([{"name": "w", "dtype": "|i1", "shape": [-1], "offset": 0,
                                              "nbytes": 4}], bytes(16)))}, "invalid shape"),
    ({"const": (Encoding.RAW, blob_section([{"name": "w", "dtype": "|i1", "shape": [4], "offset": 0,
                                              "nbytes": 4}] * 2, bytes(16)))}, "repeats"),
    ({"const": (Encoding.RAW, blob_section([{"dtype": "|i1"}], bytes(16)))}, "no name"),
    ({"const": (Encoding.RAW, b"{}" + struct.pack("<Q", 2))}, "no 'blobs' list"),
    ({"cpu": (Encoding.RAW, blob_section([{"name": "head", "dtype": "<f4", "shape": [1], "offset": 0,
                                            "nbytes": 4}], bytes(4)))}, "must be 1-D |u1"),
])
def test_content_problems_are_format_errors(tmp_path, sections, words):
    path = write_raw(tmp_path / "bad.mxq", **valid_raw_sections(**sections))
    error = assert_rejected(path, path.read_bytes())
    assert words in str(error) and error.fields["section"] in sections


def test_missing_required_section(tmp_path):
    sections = valid_raw_sections()
    del sections["program"]
    path = write_raw(tmp_path / "bad.mxq", **sections)
    with pytest.raises(MxqFormatError, match="required sections are missing: program"):
        read_mxq(path)


def test_other_files_get_clear_messages(tmp_path, small_bytes):
    cases = {
        "empty.mxq": (b"", "empty"),
        "stub.mxq": (MAGIC[:5], "truncated"),
        "model.onnx": (b"\x08\x0a\x12\x07pytorch" + bytes(100), "a parsed model .*not a compiled MXQ"),
        "text.mxq": (small_bytes.replace(b"\r\n", b"\n"), "text mode"),
    }
    for name, (data, words) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(MxqFormatError, match=words):
            read_mxq(tmp_path / name)
    with pytest.raises(MxqFormatError, match="Cannot read"):
        read_mxq(tmp_path / "missing.mxq")
    with pytest.raises(MxqFormatError, match="Cannot read"):
        read_mxq(tmp_path)


# -- validate ------------------------------------------------------------------------------------


def test_validate_reports_a_good_file(small_file):
    report = validate_mxq(small_file)
    assert report["ok"] and report["problems"] == report["errors"] == []
    assert (report["version"], report["device"], report["file_size"]) == ("1.0", "regulus-rb",
                                                                          small_file.stat().st_size)
    assert [(s["name"], s["encoding"]) for s in report["sections"]] == [
        ("meta", "json"), ("program", "json"), ("calib", "json"), ("cpu", "raw"), ("const", "raw")]
    assert report["consts"]["count"] == 7


def test_validate_reports_every_damaged_section(tmp_path, small_bytes):
    data = bytearray(small_bytes)
    for entry in parse_table(small_bytes)[1][1::2]:
        data[entry.offset] ^= 1
    path = tmp_path / "bad.mxq"
    path.write_bytes(bytes(data))
    report = validate_mxq(path)
    assert not report["ok"] and report["device"] == "regulus-rb" and len(report["sections"]) == 5
    (problem,) = report["problems"]
    assert problem.startswith("section 'program'") and "'cpu'" in problem and "CRC32" in problem
    (error,) = report["errors"]
    assert error["code"] == "MXQ_FORMAT_ERROR" and error["section"] == "program"
    assert "corrupt or truncated" in error["hint"]


# -- golden file and performance -----------------------------------------------------------------


def test_writer_reproduces_the_golden_file(tmp_path):
    if os.environ.get("QBCOMPILER_REGEN_GOLDEN") == "1":  # regenerate, and compare only in the next run
        GOLDEN.parent.mkdir(exist_ok=True)
        write_small(GOLDEN)
        pytest.skip(f"regenerated {GOLDEN.name}; run again without QBCOMPILER_REGEN_GOLDEN to compare")
    written = write_small(tmp_path / "small.mxq").read_bytes()
    golden = GOLDEN.read_bytes()
    assert 1000 < len(golden) < 16000
    assert written == golden, "the MXQ bytes changed: update docs/mxq-format.md and regenerate the golden file"
    mxq = read_mxq(GOLDEN)
    np.testing.assert_array_equal(mxq.consts["Sigmoid_1.lut"], np.arange(256) - 128)
    assert mxq.meta["note"] == "größe ✓" and mxq.cpu["tail"] == b"\x08\x09onnx-tail"


def test_reading_50_mb_is_fast(tmp_path):
    consts = {f"layer{index}": np.full(5 << 20, index, dtype=np.int8) for index in range(10)}
    path = write_mxq(tmp_path / "big.mxq", target_device="aries-rb", meta={}, program={}, consts=consts)
    started = time.perf_counter()
    mxq = read_mxq(path)
    elapsed = time.perf_counter() - started
    assert mxq.consts["layer9"][-1] == 9
    assert elapsed < 2.0, f"reading 50 MB took {elapsed:.2f} s"  # typically ~0.05 s; loose for loaded CI
