"""Streaming MXQ writer: sections are written in chunks, the header and section table last.

The file is written through :func:`compiler_core.fileio.atomic_write`, so a failure or a
cancellation (checked between chunks of at most 4 MiB) leaves neither the file nor its
temporary sibling behind. Layout: docs/mxq-format.md.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler_core.errors import ArgumentError
from compiler_core.fileio import atomic_write
from compiler_core.mxq import blobstore
from compiler_core.mxq.layout import (
    ALIGNMENT,
    DEVICE_FIELD_SIZE,
    ENTRY_SIZE,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER_SIZE,
    NAME_FIELD_SIZE,
    PLAIN_MAJOR,
    Encoding,
    Header,
    SectionEntry,
    align,
)
from compiler_core.progress import Reporter
from compiler_core.targets import get_device

logger = logging.getLogger(__name__)

STAGE = "write mxq"
ChunkCallback = Callable[[int], None]


@dataclass(frozen=True)
class SectionPayload:
    """A section to be written: its name, encoding and a function that streams its bytes.

    Attributes:
        name: Section name (printable ASCII, at most 16 bytes).
        encoding: :class:`Encoding` recorded in the table.
        emit: ``emit(sink, on_chunk)`` writes the section's bytes to ``sink``.
        known_bytes: Bytes of array data known in advance (the progress total), 0 if unknown.
    """

    name: str
    encoding: Encoding
    emit: Callable[[Any, ChunkCallback], None]
    known_bytes: int = 0

    @classmethod
    def json(cls, name: str, value: Mapping[str, Any]) -> SectionPayload:
        """A JSON section; ``value`` is serialised now, so bad input fails before any file exists."""
        data = encode_json(value, name)
        return cls(name, Encoding.JSON, lambda sink, _: sink.write(data))

    @classmethod
    def raw(cls, name: str, data: bytes) -> SectionPayload:
        """A section of raw bytes."""
        return cls(name, Encoding.RAW, lambda sink, _: sink.write(data), len(data))

    @classmethod
    def blobs(cls, name: str, items: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> SectionPayload:
        """A blob store of arrays; an iterable of pairs is consumed while the file is written."""
        known = sum(np.asarray(v).nbytes for v in items.values()) if isinstance(items, Mapping) else 0

        def emit(sink, on_chunk: ChunkCallback) -> None:
            arrays = ((key, blobstore.as_blob_array(key, value, name))
                      for key, value in blobstore.iter_blobs(items))
            entries = blobstore.write_blob_store(sink, arrays, on_chunk)
            sink.shared_blobs = blobstore.shares_bytes(entries)
        return cls(name, Encoding.RAW, emit, known)


def encode_json(value: Mapping[str, Any], section: str) -> bytes:
    """Deterministic UTF-8 JSON of a section object (sorted keys, compact, no NaN).

    Raises:
        ArgumentError: ``value`` is not a mapping or holds something JSON cannot represent.
    """
    if not isinstance(value, Mapping):
        raise ArgumentError(f"The '{section}' section must be a dict, got {type(value).__name__}.",
                            hint="Pass a JSON-serialisable dict.")
    try:
        text = json.dumps(dict(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False, default=_json_default)
    except (TypeError, ValueError, RecursionError) as error:
        raise ArgumentError(f"The '{section}' section cannot be stored as JSON: {error}.",
                            hint="Use str keys and JSON values; write NaN/Infinity as null or strings.",
                            section=section) from error
    return text.encode("utf-8")


def _json_default(value: Any) -> Any:
    """numpy scalars and arrays become plain JSON values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def device_field(target_device: str) -> bytes:
    """The canonical device string as stored in the header.

    Raises:
        ArgumentError: not a device string of the registry.
    """
    name = get_device(target_device).name
    if len(name) > DEVICE_FIELD_SIZE or not name.isascii():
        raise ArgumentError(f"Device string '{name}' does not fit the MXQ header.",
                            hint="Report this as a bug.")
    return name.encode("ascii")


def write_sections(path: str | Path, *, target_device: str, sections: list[SectionPayload],
                   reporter: Reporter) -> Path:
    """Write an MXQ container holding ``sections`` in the given order, atomically.

    This is the container-level writer behind :func:`compiler_core.mxq.write_mxq`; it does not
    check that the required sections are present.

    Raises:
        ArgumentError: bad device string, section name or content.
        CancelledError: the reporter's cancel token fired; nothing was written.
        OutputWriteError: the file cannot be written; nothing was written.
    """
    device = device_field(target_device)
    _check_names([section.name for section in sections])
    total = sum(section.known_bytes for section in sections)
    meter = _ProgressMeter(reporter)
    with reporter.stage(STAGE, total=total, message=f"Writing {Path(path).name}"):
        written = atomic_write(path, lambda temp: _write_file(temp, device, sections, meter))
    logger.debug("wrote %s (%d sections)", written, len(sections))
    return written


def _check_names(names: list[str]) -> None:
    for name in names:
        if not (isinstance(name, str) and name.isascii() and name.isprintable() and " " not in name
                and 0 < len(name) <= NAME_FIELD_SIZE):
            raise ArgumentError(f"Invalid MXQ section name {name!r}.",
                                hint=f"Use 1-{NAME_FIELD_SIZE} printable ASCII characters without spaces.")
    if len(set(names)) != len(names):
        raise ArgumentError(f"MXQ section names repeat: {names}.", hint="Give every section a unique name.")


def _write_file(temp: Path, device: bytes, sections: list[SectionPayload], meter: _ProgressMeter) -> None:
    table_size = len(sections) * ENTRY_SIZE
    with open(temp, "wb") as handle:
        handle.write(bytes(HEADER_SIZE + table_size))  # zeros for now; rewritten once sizes and CRCs are known
        sinks = [_SectionSink(handle) for _ in sections]
        entries = [sink.write_section(section, meter) for sink, section in zip(sinks, sections)]
        file_size = handle.tell()
        table = b"".join(entry.pack() for entry in entries)
        major = FORMAT_MAJOR if any(sink.shared_blobs for sink in sinks) else PLAIN_MAJOR  # 1.x readers read 1.0
        header = Header(major, FORMAT_MINOR, HEADER_SIZE, ENTRY_SIZE, device, len(entries),
                        0, file_size, zlib.crc32(table))
        handle.seek(0)
        handle.write(header.pack() + table)


class _SectionSink:
    """Appends one section to the open file, tracking its section-relative position and CRC."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.position = 0
        self.crc = 0
        self.shared_blobs = False  # a blob store whose entries share bytes (format 2.0)

    def write(self, data) -> None:
        """Append ``data`` to the section."""
        self.handle.write(data)
        self.crc = zlib.crc32(data, self.crc)
        self.position += len(data)

    def pad_to(self, alignment: int) -> None:
        """Append zeros up to the next section-relative multiple of ``alignment``."""
        self.write(bytes(align(self.position, alignment) - self.position))

    def write_section(self, section: SectionPayload, meter: _ProgressMeter) -> SectionEntry:
        """Pad the file to the next 64-byte boundary, stream ``section``, return its table entry."""
        start = self.handle.tell()
        self.handle.write(bytes(align(start, ALIGNMENT) - start))
        offset = self.handle.tell()
        section.emit(self, meter)
        meter.check()
        return SectionEntry(section.name.encode("ascii"), offset, self.position, self.crc, int(section.encoding))


class _ProgressMeter:
    """Turns written chunks into progress events (at most one per 4 MiB) and cancellation checks."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.pending = 0

    def __call__(self, nbytes: int) -> None:
        self.pending += nbytes
        if self.pending >= blobstore.WRITE_CHUNK:
            self.reporter.advance(self.pending, "writing constants")
            self.pending = 0
        else:
            self.reporter.check()

    def check(self) -> None:
        """Check for cancellation between sections."""
        self.reporter.check()
