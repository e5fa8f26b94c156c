"""The MXQ file API: ``write_mxq``, ``read_mxq`` and ``validate_mxq`` (spec: docs/mxq-format.md).

An MXQ holds the sections ``meta``, ``program`` (JSON), ``const`` (numeric arrays), and the
optional ``cpu`` (ONNX bytes of the CPU head/tail) and ``calib`` (JSON). This module maps them to
Python values; :mod:`compiler_core.mxq.writer` and :mod:`compiler_core.mxq.reader` own the bytes.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from compiler_core.errors import ArgumentError, MxqFormatError
from compiler_core.mxq import blobstore
from compiler_core.mxq.blobstore import BlobEntry
from compiler_core.mxq.layout import PLAIN_MAJOR, Encoding, SectionInfo, corrupt
from compiler_core.mxq.reader import ContainerReader, FormatVersion, load_bytes
from compiler_core.mxq.schema import PROGRAM_ENCODING, validate_meta, validate_program
from compiler_core.mxq.writer import SectionPayload, write_sections
from compiler_core.progress import ProgressCallback, Reporter, as_reporter

logger = logging.getLogger(__name__)

ArrayItems = Mapping[str, Any] | Iterable[tuple[str, Any]]


@dataclass(frozen=True)
class MxqFile:
    """A verified, decoded MXQ file.

    Attributes:
        path: The file that was read.
        version: Format version of the file (``str(version)`` gives ``"1.0"``).
        target_device: Device string the file was compiled for.
        file_size: Size of the file in bytes.
        sections: ``(name, offset, size, crc, encoding)`` of every section, in file order.
        meta: The ``meta`` section.
        program: The ``program`` section.
        consts: Read-only mapping of name to read-only array (views of the file's bytes).
        const_index: Name, dtype, shape, offset and size of every constant, in file order.
        cpu: Name to bytes of the CPU-offloaded ONNX models (empty if the section is absent).
        calib: The ``calib`` section, or None if absent.
    """

    path: Path
    version: FormatVersion
    target_device: str
    file_size: int
    sections: list[SectionInfo]
    meta: dict[str, Any]
    program: dict[str, Any]
    consts: Mapping[str, np.ndarray]
    const_index: list[BlobEntry] = field(default_factory=list)
    cpu: dict[str, bytes] = field(default_factory=dict)
    calib: dict[str, Any] | None = None


def write_mxq(path: str | os.PathLike, *, target_device: str, meta: Mapping[str, Any],
              program: Mapping[str, Any], consts: ArrayItems, cpu: Mapping[str, bytes] | None = None,
              calib: Mapping[str, Any] | None = None,
              reporter: ProgressCallback | Reporter | None = None) -> Path:
    """Write an MXQ file atomically.

    Args:
        path: Output file; its folder is created if needed.
        target_device: A device string of the registry (e.g. ``"aries-rb"``); stored canonical.
        meta: JSON-serialisable metadata (numpy scalars/arrays are converted).
        program: JSON-serialisable program document (the quantized op graph, ``qbops-1``).
        consts: Name to array (bool, integer or float, any shape), or an iterable of
            ``(name, array)`` pairs consumed while writing.
        cpu: Name to ONNX model bytes of CPU-offloaded parts; the section is omitted if None.
        calib: JSON-serialisable activation ranges; the section is omitted if None.
        reporter: Progress callback or :class:`~compiler_core.progress.Reporter` (cancel token).

    Returns:
        The path written.

    Raises:
        ArgumentError: bad device string, a section that is not JSON-serialisable, an array of an
            unsupported dtype, or repeated array names.
        CancelledError: cancelled; no file (and no temporary file) is left.
        OutputWriteError: the file cannot be written; no file is left.
    """
    sections = [SectionPayload.json("meta", meta), SectionPayload.json("program", program)]
    if calib is not None:
        sections.append(SectionPayload.json("calib", calib))
    if cpu is not None:
        sections.append(SectionPayload.blobs("cpu", _bytes_blobs(cpu)))
    sections.append(SectionPayload.blobs("const", consts))
    return write_sections(path, target_device=target_device, sections=sections, reporter=as_reporter(reporter))


def _bytes_blobs(cpu: Mapping[str, bytes]) -> dict[str, np.ndarray]:
    if not isinstance(cpu, Mapping):
        raise ArgumentError(f"cpu must be a dict of name to bytes, got {type(cpu).__name__}.",
                            hint="Pass {name: onnx_model_bytes}.")
    bad = [name for name, data in cpu.items() if not isinstance(data, (bytes, bytearray, memoryview))]
    if bad:
        raise ArgumentError(f"cpu entries must be bytes: {', '.join(map(str, bad))}.",
                            hint="Pass serialised ONNX models (model.SerializeToString()).")
    return {name: np.frombuffer(data, dtype=np.uint8) for name, data in cpu.items()}


def read_mxq(path: str | os.PathLike, *, mmap: bool = False) -> MxqFile:
    """Read and verify an MXQ file.

    Every byte is checked (magic, version, header and table CRCs, bounds, zero padding, section
    CRCs) before anything is parsed.

    Args:
        path: The ``.mxq`` file.
        mmap: Map the file instead of reading it into memory; the arrays then view the map.

    Returns:
        The decoded :class:`MxqFile`.

    Raises:
        MxqFormatError: the file cannot be read, is not an MXQ, is of another major version,
            or is corrupt or truncated; the message says what is wrong and where.
    """
    reader = ContainerReader(load_bytes(str(path), use_mmap=mmap), str(path))
    sections = reader.verify()
    return _decode(reader, sections, Path(path))


def _decode(reader: ContainerReader, sections: list[SectionInfo], path: Path) -> MxqFile:
    by_name = {info.name: info for info in sections}
    const_index, consts = _read_blobs(reader, by_name["const"])
    cpu = {}
    if "cpu" in by_name:
        cpu = {name: array.tobytes() for name, array in _read_blobs(reader, by_name["cpu"], bytes_only=True)[1].items()}
    calib = _read_json(reader, by_name["calib"]) if "calib" in by_name else None
    program = _read_json(reader, by_name["program"])
    meta = _read_json(reader, by_name["meta"])
    if program.get("encoding") == PROGRAM_ENCODING:
        for name, check in (("program", lambda: validate_program(program, consts, path=reader.path)),
                            ("meta", lambda: validate_meta(meta, program, list(cpu), path=reader.path))):
            try:
                check()
            except MxqFormatError as error:
                error.fields.setdefault("offset", by_name[name].offset)
                raise
    return MxqFile(path=path, version=reader.version, target_device=reader.device, file_size=reader.size,
                   sections=sections, meta=meta,
                   program=program, consts=MappingProxyType(consts),
                   const_index=const_index, cpu=cpu, calib=calib)


def _read_json(reader: ContainerReader, info: SectionInfo) -> dict[str, Any]:
    where = {"path": reader.path, "offset": info.offset, "section": info.name}
    try:
        value = json.loads(bytes(reader.section(info)).decode("utf-8"))
    except (ValueError, RecursionError) as error:
        raise corrupt(f"section '{info.name}' (at byte {info.offset}) is not valid UTF-8 JSON ({error}).",
                      **where) from error
    if not isinstance(value, dict):
        raise corrupt(f"section '{info.name}' (at byte {info.offset}) holds a JSON {type(value).__name__}, "
                      "not an object.", **where)
    return value


def _read_blobs(reader: ContainerReader, info: SectionInfo,
                bytes_only: bool = False) -> tuple[list[BlobEntry], dict[str, np.ndarray]]:
    entries = blobstore.read_blob_index(reader.section(info), section_name=info.name,
                                        section_offset=info.offset, path=reader.path,
                                        shared=reader.version.major > PLAIN_MAJOR)
    if bytes_only:
        bad = next((entry for entry in entries if entry.dtype != blobstore.BYTES_DTYPE or len(entry.shape) != 1),
                   None)
        if bad is not None:
            raise corrupt(f"blob '{bad.name}' of section '{info.name}' must be 1-D {blobstore.BYTES_DTYPE}, "
                          f"found {bad.dtype} {list(bad.shape)}.", path=reader.path, offset=info.offset,
                          section=info.name)
    return entries, {entry.name: blobstore.blob_array(reader.data, info.offset, entry) for entry in entries}


def validate_mxq(path: str | os.PathLike) -> dict[str, Any]:
    """Check an MXQ file and describe it, without raising on a bad file (``qbcompiler validate``).

    Returns:
        ``{"ok", "path", "version", "device", "file_size", "sections", "consts", "problems",
        "errors"}``: ``sections`` lists ``name``, ``offset``, ``size``, ``crc32``, ``encoding``
        (known as far as the file could be read); ``consts`` counts the arrays and their bytes;
        ``problems`` holds one sentence per problem and ``errors`` the matching error records
        (``code``, ``message``, ``hint``, ``offset``, ``section``) — both empty when ``ok``.
    """
    report: dict[str, Any] = {"ok": False, "path": str(path), "version": None, "device": None,
                              "file_size": None, "sections": [], "consts": None, "problems": [], "errors": []}
    reader = None
    try:
        reader = ContainerReader(load_bytes(str(path)), str(path))
        sections = reader.verify()
        mxq = _decode(reader, sections, Path(path))
        report["consts"] = {"count": len(mxq.const_index), "bytes": sum(e.nbytes for e in mxq.const_index)}
        report["ok"] = True
    except MxqFormatError as error:
        report["problems"].append(error.message.removeprefix(f"{path}: ").rstrip("."))
        report["errors"].append(error.to_dict())
    if reader is not None:
        report.update(_describe(reader))
    return report


def _describe(reader: ContainerReader) -> dict[str, Any]:
    return {
        "version": None if reader.version is None else str(reader.version),
        "device": reader.device,
        "file_size": reader.size,
        "sections": [{"name": info.name, "offset": info.offset, "size": info.size, "crc32": f"0x{info.crc:08x}",
                      "encoding": _encoding_name(info.encoding)} for info in reader.sections],
    }


def _encoding_name(value: int) -> str:
    return Encoding(value).name.lower() if value in {int(e) for e in Encoding} else str(value)
