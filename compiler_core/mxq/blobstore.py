"""The blob store inside the ``const`` and ``cpu`` sections: 64-byte aligned arrays and a JSON index.

Layout (section-relative offsets): the arrays one after the other, each at a multiple of 64, then
the UTF-8 JSON index, then the index size as a little-endian u64. The index comes last so the
writer can stream arrays as they are produced (see docs/mxq-format.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from compiler_core.errors import ArgumentError
from compiler_core.mxq.layout import ALIGNMENT, corrupt

logger = logging.getLogger(__name__)

ALLOWED_DTYPES = frozenset({"|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8"})
BYTES_DTYPE = "|u1"
FOOTER = struct.Struct("<Q")
WRITE_CHUNK = 4 << 20  # bytes per write: progress and cancellation granularity


@dataclass(frozen=True)
class BlobEntry:
    """One array of a blob store.

    Attributes:
        name: Blob name (unique in its store).
        dtype: Little-endian numpy dtype string such as ``"|i1"`` or ``"<f4"``.
        shape: Array shape (``()`` for a 0-d array).
        offset: Section-relative byte offset, a multiple of 64.
        nbytes: Bytes of the array.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def to_dict(self) -> dict[str, Any]:
        """The JSON form stored in the index."""
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "offset": self.offset, "nbytes": self.nbytes}


class SectionSink(Protocol):
    """Where a section's bytes go (the writer's CRC-tracking file wrapper)."""

    position: int

    def write(self, data) -> None:
        """Append ``data`` to the section."""

    def pad_to(self, alignment: int) -> None:
        """Append zeros up to the next section-relative multiple of ``alignment``."""


# -- writing -----------------------------------------------------------------------------------


def iter_blobs(blobs: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` pairs of a mapping or of an iterable of pairs (consumed lazily)."""
    if blobs is None:
        return iter(())
    return iter(blobs.items()) if isinstance(blobs, Mapping) else iter(blobs)


def as_blob_array(name: str, value: Any, store: str) -> np.ndarray:
    """``value`` as a C-contiguous little-endian array of an allowed dtype.

    Raises:
        ArgumentError: the name is not a non-empty string or the dtype cannot be stored.
    """
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"Every {store} entry needs a non-empty string name, got {name!r}.",
                            hint="Name each array.")
    array = np.asarray(value)
    little = array.dtype.newbyteorder("<") if array.dtype.kind in "biuf" else array.dtype
    if little.str not in ALLOWED_DTYPES:
        raise ArgumentError(f"{store} entry '{name}' has dtype {array.dtype}, which an MXQ cannot store.",
                            hint="Store bool, integer (8-64 bit) or float (16/32/64 bit) arrays.")
    return array.astype(little, order="C", copy=False)  # np.ascontiguousarray would make 0-d arrays 1-d


def write_blob_store(sink: SectionSink, blobs: Iterable[tuple[str, np.ndarray]],
                     on_chunk=None) -> list[BlobEntry]:
    """Write ``blobs`` (already converted by :func:`as_blob_array`) then the index and its size.

    A blob whose bytes equal an earlier blob's is not written again: its entry points at the earlier copy (an
    unrolled LSTM's steps all read one recurrent weight). Such a store needs format 2.0 (:func:`shares_bytes`).

    Args:
        sink: The section being written.
        blobs: ``(name, array)`` pairs; consumed once.
        on_chunk: Called with the byte count after every written chunk (progress, cancellation).

    Returns:
        The index entries, in file order.
    """
    entries: list[BlobEntry] = []
    seen: set[str] = set()
    copies: dict[tuple[int, bytes], int] = {}  # (byte count, digest of the bytes) -> offset of the copy written
    for name, array in blobs:
        if name in seen:
            raise ArgumentError(f"Two arrays are named '{name}'.", hint="Give every array a unique name.")
        seen.add(name)
        raw = memoryview(array.reshape(-1).view(np.uint8))
        key = (array.nbytes, hashlib.blake2b(raw, digest_size=32).digest())
        if array.nbytes and key in copies:
            entries.append(BlobEntry(name, array.dtype.str, tuple(array.shape), copies[key], array.nbytes))
            if on_chunk is not None:
                on_chunk(array.nbytes)  # counted as written: the progress total holds every blob's bytes
            continue
        sink.pad_to(ALIGNMENT)
        copies.setdefault(key, sink.position)
        entries.append(BlobEntry(name, array.dtype.str, tuple(array.shape), sink.position, array.nbytes))
        _write_chunked(sink, raw, on_chunk)
    index = json.dumps({"blobs": [entry.to_dict() for entry in entries]}, separators=(",", ":"),
                       ensure_ascii=False).encode("utf-8")
    sink.write(index)
    sink.write(FOOTER.pack(len(index)))
    return entries


def shares_bytes(entries: Iterable[BlobEntry]) -> bool:
    """Whether two entries of a store point at one copy of their bytes (format 2.0 and later)."""
    placements = [(entry.offset, entry.nbytes) for entry in entries if entry.nbytes]
    return len(set(placements)) < len(placements)


def _write_chunked(sink: SectionSink, raw: memoryview, on_chunk) -> None:
    for start in range(0, len(raw), WRITE_CHUNK):
        chunk = raw[start:start + WRITE_CHUNK]
        sink.write(chunk)
        if on_chunk is not None:
            on_chunk(len(chunk))


# -- reading -----------------------------------------------------------------------------------


def read_blob_index(section, *, section_name: str, section_offset: int, path: str,
                    shared: bool = False) -> list[BlobEntry]:
    """Parse and check the index of a blob store whose CRC has been verified.

    Args:
        section: The section's bytes (a memoryview slice).
        section_name: ``"const"`` or ``"cpu"``, for messages.
        section_offset: The section's file offset, for messages.
        path: The file, for messages.
        shared: Entries may point at an earlier entry's bytes (exactly its offset and size; format 2.0).

    Raises:
        MxqFormatError: the footer, the JSON or an entry is inconsistent with the section.
    """
    where = {"path": path, "section": section_name, "offset": section_offset}
    size = len(section)
    if size < FOOTER.size:
        raise corrupt(f"section '{section_name}' is {size} bytes, too small for its blob index.", **where)
    (index_size,) = FOOTER.unpack_from(section, size - FOOTER.size)
    data_end = size - FOOTER.size - index_size
    if data_end < 0:
        raise corrupt(f"section '{section_name}' (at byte {section_offset}) records a {index_size}-byte "
                      f"blob index, larger than the section ({size} bytes).", **where)
    raw_entries = _parse_index_json(section[data_end:size - FOOTER.size], section_name, where)
    entries = [_check_entry(raw, number, section_name, where) for number, raw in enumerate(raw_entries)]
    _check_placement(entries, data_end, section_name, where, shared)
    return entries


def _parse_index_json(raw, section_name: str, where: dict) -> list:
    try:
        index = json.loads(bytes(raw).decode("utf-8"))
    except (ValueError, RecursionError) as error:
        raise corrupt(f"the blob index of section '{section_name}' is not valid JSON ({error}).",
                      **where) from error
    blobs = index.get("blobs") if isinstance(index, dict) else None
    if not isinstance(blobs, list):
        raise corrupt(f"the blob index of section '{section_name}' has no 'blobs' list.", **where)
    return blobs


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a damaged index cannot flood a message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_entry(raw: Any, number: int, section_name: str, where: dict) -> BlobEntry:
    label = f"blob #{number} of section '{section_name}'"
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise corrupt(f"{label} has no name.", **where)
    label = f"blob {_short(raw['name'])} of section '{section_name}'"
    dtype, shape = raw.get("dtype"), raw.get("shape")
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise corrupt(f"{label} has an unknown dtype {_short(dtype)}.", **where)
    if not isinstance(shape, list) or not all(_is_count(dim) for dim in shape):
        raise corrupt(f"{label} has an invalid shape {_short(shape)}.", **where)
    offset, nbytes = raw.get("offset"), raw.get("nbytes")
    if not (_is_count(offset) and _is_count(nbytes)):
        raise corrupt(f"{label} has an invalid offset or size ({_short(offset)}, {_short(nbytes)}).", **where)
    expected = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes != expected:
        raise corrupt(f"{label} records {nbytes} bytes but its shape {shape} of {dtype} needs {expected}.",
                      **where)
    return BlobEntry(raw["name"], dtype, tuple(shape), offset, nbytes)


def _check_placement(entries: list[BlobEntry], data_end: int, section_name: str, where: dict,
                     shared: bool = False) -> None:
    previous_end, names, copies = 0, set(), set()
    for entry in entries:
        label = f"blob {_short(entry.name)} of section '{section_name}' (section offset {entry.offset})"
        if entry.name in names:
            raise corrupt(f"{label} repeats a name.", **where)
        if entry.offset % ALIGNMENT:
            raise corrupt(f"{label} is not {ALIGNMENT}-byte aligned.", **where)
        if shared and entry.nbytes and (entry.offset, entry.nbytes) in copies:
            names.add(entry.name)  # reads the bytes of an earlier blob of the same size
            continue
        if entry.offset < previous_end:
            raise corrupt(f"{label} overlaps the previous blob or is out of order.", **where)
        if entry.offset + entry.nbytes > data_end:
            raise corrupt(f"{label} with {entry.nbytes} bytes runs past the data area "
                          f"({data_end} bytes).", **where)
        names.add(entry.name)
        copies.add((entry.offset, entry.nbytes))
        previous_end = entry.offset + entry.nbytes


def blob_array(data, section_offset: int, entry: BlobEntry) -> np.ndarray:
    """Read-only zero-copy view of one checked blob inside the whole-file buffer ``data``."""
    count = math.prod(entry.shape)
    flat = np.frombuffer(data, dtype=entry.dtype, count=count, offset=section_offset + entry.offset)
    flat.flags.writeable = False
    return flat.reshape(entry.shape)
