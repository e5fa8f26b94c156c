"""MXQ: the compiled-model container (header, section table, CRC-checked 64-byte aligned sections).

Spec: docs/mxq-format.md. ``write_mxq`` writes atomically with progress and cancellation;
``read_mxq`` verifies every byte before parsing; ``validate_mxq`` reports without raising.
"""

from compiler_core.mxq.blobstore import BlobEntry
from compiler_core.mxq.container import MxqFile, read_mxq, validate_mxq, write_mxq
from compiler_core.mxq.layout import FORMAT_MAJOR, FORMAT_MINOR, MAGIC, Encoding, SectionInfo
from compiler_core.mxq.reader import CURRENT_VERSION, FormatVersion

__all__ = [
    "CURRENT_VERSION",
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "MAGIC",
    "BlobEntry",
    "Encoding",
    "FormatVersion",
    "MxqFile",
    "SectionInfo",
    "read_mxq",
    "validate_mxq",
    "write_mxq",
]
