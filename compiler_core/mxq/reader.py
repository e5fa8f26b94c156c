"""Integrity checks of an MXQ container, in the order of docs/mxq-format.md ("Reading").

:class:`ContainerReader` verifies every byte of the file (magic, version, header CRC, file size,
table CRC, bounds, zero gaps, section CRCs) before anything is parsed. It records what it has
learnt as it goes, so :func:`compiler_core.mxq.validate_mxq` can report it even for a bad file.
"""

from __future__ import annotations

import logging
import mmap
from typing import NamedTuple

from compiler_core.errors import MxqFormatError
from compiler_core.mxq.layout import (
    ALIGNMENT,
    ENTRY_SIZE,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER_SIZE,
    MAGIC,
    MAX_RECORD_SIZE,
    PREFIX_SIZE,
    READ_MAJORS,
    Encoding,
    Header,
    SectionEntry,
    SectionInfo,
    corrupt,
    crc32,
    stored_header_crc,
    unpack_prefix,
    unpad_field,
)
from compiler_core.targets import DEVICES

logger = logging.getLogger(__name__)

REQUIRED_SECTIONS = {"meta": Encoding.JSON, "program": Encoding.JSON, "const": Encoding.RAW}
OPTIONAL_SECTIONS = {"calib": Encoding.JSON, "cpu": Encoding.RAW}
_KNOWN_ENCODINGS = frozenset(int(encoding) for encoding in Encoding)
_ZERO_CHUNK = 1 << 20


class FormatVersion(NamedTuple):
    """An MXQ format version; ``str()`` gives ``"1.0"``."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


CURRENT_VERSION = FormatVersion(FORMAT_MAJOR, FORMAT_MINOR)


def load_bytes(path: str, use_mmap: bool = False):
    """The whole file as a read-only memoryview (bytes in memory, or a read-only memory map).

    The magic is checked on the first bytes before the rest is read, so a large file of another
    kind is rejected without reading it.

    Raises:
        MxqFormatError: the file cannot be read or is not an MXQ file.
    """
    try:
        with open(path, "rb") as handle:
            check_magic(handle.read(len(MAGIC)), path)
            if use_mmap:
                return memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
            handle.seek(0)
            return memoryview(handle.read())
    except OSError as error:
        raise MxqFormatError(f"Cannot read '{path}': {error.strerror or error}.",
                             hint="Check the path and the file's permissions.", file=path) from error


def check_magic(head: bytes, path: str) -> None:
    """Check the first eight bytes; text-mode copies and truncated stubs get their own message."""
    if head == MAGIC:
        return
    if not head:
        raise corrupt("the file is empty.", path=path, offset=0)
    if MAGIC.startswith(head):
        raise corrupt(f"the file is only {len(head)} bytes long; it is truncated.", path=path, offset=len(head))
    if head.startswith((b"\x89MXQ\n\x1a\n", b"\x89MXQ\r\r\n")):
        raise corrupt("its line endings were converted (it was copied in text mode).", path=path, offset=4,
                      hint="Copy the file in binary mode, or compile it again.")
    if str(path).lower().endswith((".mblt", ".onnx")) and head.startswith(b"\x08"):  # ModelProto: ir_version first
        raise corrupt("it is a parsed model (an MBLT / ONNX file), not a compiled MXQ.", path=path, offset=0,
                      hint="Compile it first (mxq_compile / qbcompiler compile); an MBLT's record is read with "
                           "read_provenance / qbcompiler info --mblt.")
    raise corrupt(f"it does not start with the MXQ signature (found {head.hex(' ')}); it is not an MXQ "
                  "file or its first bytes are damaged.", path=path, offset=0)


class ContainerReader:
    """Verifies the container structure of one MXQ file held in ``data``.

    Attributes:
        path: The file, for messages.
        data: The file's bytes (a memoryview).
        version: Format version, once read.
        device: Target device string, once the header is verified.
        sections: Section-table entries, once the table is verified.
    """

    def __init__(self, data, path: str) -> None:
        self.data = data
        self.path = path
        self.size = len(data)
        self.version: FormatVersion | None = None
        self.device: str | None = None
        self.sections: list[SectionInfo] = []

    def verify(self) -> list[SectionInfo]:
        """Run every container check in order; returns the verified section list.

        Raises:
            MxqFormatError: the first failed check (all CRC failures are listed together).
        """
        check_magic(bytes(self.data[:len(MAGIC)]), self.path)
        header = self._check_header()
        self._check_file_size(header)
        sections = self._check_table(header)
        self._check_bounds(sections, header)
        self._check_gaps(sections, header)
        self._check_section_crcs(sections)
        self._check_section_set(sections)
        return sections

    def section(self, info: SectionInfo):
        """The bytes of one verified section (a memoryview slice, no copy)."""
        return self.data[info.offset:info.offset + info.size]

    def _fail(self, message: str, **where) -> MxqFormatError:
        return corrupt(message, path=self.path, **where)

    # -- header ---------------------------------------------------------------------------------

    def _check_header(self) -> Header:
        if self.size < PREFIX_SIZE:
            raise self._fail(f"the file is only {self.size} bytes long; it is truncated.", offset=self.size)
        major, minor, header_size, _ = unpack_prefix(self.data)
        self.version = FormatVersion(major, minor)
        if major not in READ_MAJORS:
            raise self._version_error()
        self._check_record_size("header size", header_size, HEADER_SIZE, offset=12)
        if self.size < header_size:
            raise self._fail(f"the file is only {self.size} bytes long, shorter than its {header_size}-byte "
                             "header; it is truncated.", offset=self.size)
        stored, computed = stored_header_crc(self.data, header_size), crc32(self.data[:header_size - 4])
        if stored != computed:
            raise self._fail(f"the header (bytes 0-{header_size - 1}) fails its CRC32 check (stored "
                             f"0x{stored:08x}, computed 0x{computed:08x}).", offset=0)
        header = Header.unpack(self.data)
        self._check_header_fields(header)
        return header

    def _version_error(self) -> MxqFormatError:
        return MxqFormatError(
            f"{self.path}: MXQ format version {self.version} is not supported; this compiler reads "
            f"versions {' and '.join(f'{major}.x' for major in READ_MAJORS)} (it writes {CURRENT_VERSION}).",
            hint="Compile the model again with this compiler, or read it with the compiler that wrote it. "
                 f"If the file should be version {READ_MAJORS[0]}.x or {READ_MAJORS[-1]}.x, it is corrupt; compile "
                 "it again.",
            file=self.path, offset=8, version=str(self.version), supported=str(CURRENT_VERSION))

    def _knows_minor(self) -> bool:
        """Files of a minor version this reader knows must use the exact 1.0 rules."""
        return self.version is not None and self.version.minor <= FORMAT_MINOR

    def _check_record_size(self, what: str, value: int, expected: int, offset: int) -> None:
        exact = self._knows_minor()
        if (value != expected) if exact else (value < expected or value > MAX_RECORD_SIZE or value % 8):
            rule = f"{expected}" if exact else f"a multiple of 8 from {expected} to {MAX_RECORD_SIZE}"
            raise self._fail(f"the {what} at byte {offset} is {value}, expected {rule}.", offset=offset)

    def _check_header_fields(self, header: Header) -> None:
        self._check_record_size("section entry size", header.entry_size, ENTRY_SIZE, offset=14)
        if self._knows_minor() and (header.flags or any(header.reserved)):
            raise self._fail("the header's flags or reserved bytes (bytes 36-39, 52-59) are not zero.", offset=36)
        device = unpad_field(header.device)
        if device is None:
            raise self._fail(f"the target device field (bytes 16-31) is malformed: {header.device!r}.", offset=16)
        if device not in DEVICES:
            raise MxqFormatError(
                f"{self.path}: the file targets device '{device}', which this compiler does not know "
                f"(known: {', '.join(DEVICES)}).",
                hint="Use the compiler version that wrote the file, or compile it again for a known device.",
                file=self.path, offset=16, device=device)
        self.device = device

    def _check_file_size(self, header: Header) -> None:
        if header.file_size > self.size:
            raise self._fail(f"the file is {self.size} bytes but its header records {header.file_size}; "
                             "it is truncated.", offset=self.size)
        if header.file_size < self.size:
            raise self._fail(f"{self.size - header.file_size} unexpected bytes follow the recorded end of "
                             f"the file at byte {header.file_size}.", offset=header.file_size)

    # -- section table --------------------------------------------------------------------------

    def _check_table(self, header: Header) -> list[SectionInfo]:
        start, end = header.header_size, header.header_size + header.table_size
        if end > self.size:
            raise self._fail(f"the section table ({header.section_count} entries of {header.entry_size} bytes "
                             f"at byte {start}) runs past the end of the file ({self.size} bytes).", offset=start)
        computed = crc32(self.data[start:end])
        if computed != header.table_crc:
            raise self._fail(f"the section table (bytes {start}-{end - 1}) fails its CRC32 check (stored "
                             f"0x{header.table_crc:08x}, computed 0x{computed:08x}).", offset=start)
        entries = (SectionEntry.unpack(self.data, start + number * header.entry_size)
                   for number in range(header.section_count))
        return [self._check_entry(number, entry, start + number * header.entry_size)
                for number, entry in enumerate(entries)]

    def _check_entry(self, number: int, entry: SectionEntry, at: int) -> SectionInfo:
        name = unpad_field(entry.name)
        if name is None:
            raise self._fail(f"section table entry {number} (byte {at}) has a malformed name {entry.name!r}.",
                             offset=at)
        if self._knows_minor() and (entry.encoding not in _KNOWN_ENCODINGS or any(entry.reserved)):
            raise self._fail(f"section '{name}' (table entry {number}, byte {at}) has an unknown encoding "
                             f"{entry.encoding} or non-zero reserved bytes.", offset=at, section=name)
        return SectionInfo(name, entry.offset, entry.size, entry.crc, entry.encoding)

    def _check_bounds(self, sections: list[SectionInfo], header: Header) -> None:
        previous_end, seen = header.header_size + header.table_size, set()
        for info in sections:
            where = {"offset": info.offset, "section": info.name}
            label = f"section '{info.name}' (at byte {info.offset}, {info.size} bytes)"
            if info.name in seen:
                raise self._fail(f"{label} repeats a section name.", **where)
            if info.offset % ALIGNMENT:
                raise self._fail(f"{label} is not {ALIGNMENT}-byte aligned.", **where)
            if info.offset < previous_end:
                raise self._fail(f"{label} starts before byte {previous_end}, where the previous section or "
                                 "the table ends (sections overlap or are out of order).", **where)
            if info.offset + info.size > self.size:
                raise self._fail(f"{label} runs past the end of the file ({self.size} bytes).", **where)
            seen.add(info.name)
            previous_end = info.offset + info.size
        if previous_end != self.size:
            raise self._fail(f"{self.size - previous_end} bytes follow the last section, which ends at byte "
                             f"{previous_end}.", offset=previous_end)
        self.sections = sections

    def _check_gaps(self, sections: list[SectionInfo], header: Header) -> None:
        gap_start, before = header.header_size + header.table_size, "the section table"
        for info in sections:
            nonzero = _first_nonzero(self.data, gap_start, info.offset)
            if nonzero is not None:
                raise self._fail(f"padding byte {nonzero} between {before} and section '{info.name}' is "
                                 f"0x{self.data[nonzero]:02x}, not zero.", offset=nonzero, section=info.name)
            gap_start, before = info.offset + info.size, f"section '{info.name}'"

    def _check_section_crcs(self, sections: list[SectionInfo]) -> None:
        failures = [(info, computed) for info in sections if (computed := crc32(self.section(info))) != info.crc]
        if failures:
            text = "; ".join(f"section '{info.name}' (bytes {info.offset}-{info.offset + info.size - 1}) fails "
                             f"its CRC32 check (stored 0x{info.crc:08x}, computed 0x{computed:08x})"
                             for info, computed in failures)
            first = failures[0][0]
            raise self._fail(text + ".", offset=first.offset, section=first.name)

    def _check_section_set(self, sections: list[SectionInfo]) -> None:
        present = {info.name: info for info in sections}
        missing = [name for name in REQUIRED_SECTIONS if name not in present]
        if missing:
            raise self._fail(f"required sections are missing: {', '.join(missing)}.")
        for name, encoding in {**REQUIRED_SECTIONS, **OPTIONAL_SECTIONS}.items():
            info = present.get(name)
            if info is not None and info.encoding != encoding:
                raise self._fail(f"section '{name}' (at byte {info.offset}) has encoding {info.encoding}, "
                                 f"expected {int(encoding)} ({encoding.name.lower()}).",
                                 offset=info.offset, section=name)


def _first_nonzero(data, start: int, end: int) -> int | None:
    """Offset of the first non-zero byte in ``data[start:end]``, or None; reads in 1 MiB chunks."""
    for chunk_start in range(start, end, _ZERO_CHUNK):
        chunk = bytes(data[chunk_start:min(end, chunk_start + _ZERO_CHUNK)])
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return chunk_start + len(chunk) - len(stripped)
    return None
