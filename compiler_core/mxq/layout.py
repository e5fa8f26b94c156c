"""Binary records of the MXQ container: the header and the section-table entry (docs/mxq-format.md)."""

from __future__ import annotations

import enum
import logging
import struct
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from compiler_core.errors import MxqFormatError

logger = logging.getLogger(__name__)

MAGIC = b"\x89MXQ\r\n\x1a\n"
FORMAT_MAJOR = 2
FORMAT_MINOR = 0
PLAIN_MAJOR = 1
"""A file whose blobs all have their own bytes is written as 1.0, which every 1.x reader reads; a file where two
blobs share one copy of their bytes (an unrolled LSTM's steps) needs 2.0 (docs/mxq-format.md)."""
READ_MAJORS = (1, 2)
ALIGNMENT = 64
HEADER_SIZE = 64
ENTRY_SIZE = 48
MAX_RECORD_SIZE = 4096  # upper bound for header_size / entry_size of any 1.x or 2.x file
NAME_FIELD_SIZE = 16
DEVICE_FIELD_SIZE = 16
RESERVED_SIZE = 8
CRC_SIZE = 4

# Header fields before the trailing CRC; later minor versions may append fields before the CRC.
_HEADER_FIELDS = struct.Struct("<8sHHHH16sIIQI8s")
_CRC = struct.Struct("<I")
_ENTRY = struct.Struct("<16sQQII8s")
PREFIX_SIZE = 16  # magic, version and the two record sizes: enough to know how to read the rest

assert _HEADER_FIELDS.size + CRC_SIZE == HEADER_SIZE and _ENTRY.size == ENTRY_SIZE


class Encoding(enum.IntEnum):
    """How a section's bytes are to be interpreted."""

    RAW = 0
    JSON = 1


class SectionInfo(NamedTuple):
    """One section as listed in the table: ``(name, offset, size, crc, encoding)``."""

    name: str
    offset: int
    size: int
    crc: int
    encoding: int


def align(value: int, alignment: int = ALIGNMENT) -> int:
    """Round ``value`` up to a multiple of ``alignment``."""
    return -(-value // alignment) * alignment


def crc32(data, crc: int = 0, chunk_size: int = 16 << 20) -> int:
    """CRC32 (zlib) of a bytes-like object, fed in chunks so huge buffers are never copied."""
    view = memoryview(data).cast("B")
    for start in range(0, len(view), chunk_size):
        crc = zlib.crc32(view[start:start + chunk_size], crc)
    return crc


def pad_field(text: str, size: int) -> bytes:
    """ASCII ``text`` NUL-padded to ``size`` bytes (the caller has checked that it fits)."""
    return text.encode("ascii").ljust(size, b"\0")


def unpad_field(raw: bytes) -> str | None:
    """The name in a NUL-padded field, or None if it is empty, not printable ASCII or badly padded."""
    text, _, padding = raw.partition(b"\0")
    if not text or padding.strip(b"\0") or any(byte < 0x21 or byte > 0x7E for byte in text):
        return None
    return text.decode("ascii")


@dataclass(frozen=True)
class Header:
    """The fixed header fields (version 1.0 layout; raw values, not validated).

    Attributes:
        major: Format major version.
        minor: Format minor version.
        header_size: Bytes of the header, CRC included.
        entry_size: Bytes of one section-table entry.
        device: Raw NUL-padded target device field.
        section_count: Number of section-table entries.
        flags: Feature flags (none defined in 1.0).
        file_size: Total file size in bytes.
        table_crc: CRC32 of the section table.
        reserved: Reserved bytes, zero in 1.0.
    """

    major: int
    minor: int
    header_size: int
    entry_size: int
    device: bytes
    section_count: int
    flags: int
    file_size: int
    table_crc: int
    reserved: bytes = bytes(RESERVED_SIZE)

    def pack(self) -> bytes:
        """The 64-byte header with its CRC (writers always write the 1.0 layout)."""
        fields = _HEADER_FIELDS.pack(MAGIC, self.major, self.minor, self.header_size, self.entry_size,
                                     self.device.ljust(DEVICE_FIELD_SIZE, b"\0"), self.section_count,
                                     self.flags, self.file_size, self.table_crc, self.reserved)
        return fields + _CRC.pack(zlib.crc32(fields))

    @classmethod
    def unpack(cls, data) -> Header:
        """Read the 1.0 fields from the first 60 bytes of ``data`` (magic excluded)."""
        _, *fields = _HEADER_FIELDS.unpack_from(data, 0)
        return cls(*fields)

    @property
    def table_size(self) -> int:
        """Bytes of the section table."""
        return self.section_count * self.entry_size


def unpack_prefix(data) -> tuple[int, int, int, int]:
    """``(major, minor, header_size, entry_size)`` from the first 16 bytes."""
    return struct.unpack_from("<HHHH", data, len(MAGIC))


def stored_header_crc(data, header_size: int) -> int:
    """The header CRC: always the last four bytes of the header."""
    return _CRC.unpack_from(data, header_size - CRC_SIZE)[0]


@dataclass(frozen=True)
class SectionEntry:
    """One section-table entry (raw values, not validated).

    Attributes:
        name: Raw NUL-padded name field.
        offset: Absolute file offset.
        size: Bytes of the section.
        crc: CRC32 of the section bytes.
        encoding: :class:`Encoding` value.
        reserved: Reserved bytes, zero in 1.0.
    """

    name: bytes
    offset: int
    size: int
    crc: int
    encoding: int
    reserved: bytes = bytes(RESERVED_SIZE)

    def pack(self) -> bytes:
        """The 48-byte table entry."""
        return _ENTRY.pack(self.name.ljust(NAME_FIELD_SIZE, b"\0"), self.offset, self.size, self.crc,
                           self.encoding, self.reserved)

    @classmethod
    def unpack(cls, data, offset: int) -> SectionEntry:
        """Read the 1.0 entry fields at ``offset`` of ``data``."""
        return cls(*_ENTRY.unpack_from(data, offset))

    @property
    def end(self) -> int:
        """File offset just past the section."""
        return self.offset + self.size


CORRUPT_HINT = "The file is corrupt or truncated; compile it again."


def corrupt(message: str, *, path: str, offset: int | None = None, section: str | None = None,
            hint: str = CORRUPT_HINT) -> MxqFormatError:
    """The :class:`MxqFormatError` for a damaged file; ``message`` names what is wrong and where."""
    return MxqFormatError(f"{path}: {message}", hint=hint, file=path, offset=offset, section=section)
