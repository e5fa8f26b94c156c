"""Atomic file writes and content hashes shared by every writer (.mblt, .mxq, configs, projects)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from compiler_core.errors import OutputWriteError


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def check_output_path(path: str | os.PathLike, kind: str) -> None:
    """Refuse an output path that can never be written, before the work that would fill it (a compile can take
    minutes): an existing folder, or a file in a folder that cannot be created or written. ``kind`` names the file
    in the message ("MXQ", "MBLT").

    Raises:
        OutputWriteError: as :func:`atomic_write` would at the end.
    """
    target = Path(path)
    if target.is_dir():
        raise OutputWriteError(f"'{target}' is a folder, not a file to write the {kind} to.",
                               hint=f"Give a file name in it, e.g. '{target / ('model.' + kind.lower())}'.",
                               file=str(target))
    folder = next((parent for parent in target.parents if parent.exists()), None)
    if folder is not None and (not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK)):
        raise OutputWriteError(f"Cannot write the {kind} to '{target.parent}': '{folder}' is "
                               f"{'a file' if not folder.is_dir() else 'not writable'}.",
                               hint="Choose a writable output folder.", file=str(target))


def atomic_write(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Write a file through ``writer(temp_path)`` and rename it into place.

    A failed or cancelled ``writer`` leaves neither the target nor the temporary file behind.

    Raises:
        OutputWriteError: the folder cannot be created or the file cannot be written.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        os.close(handle)
    except OSError as error:
        raise OutputWriteError(f"Cannot write to '{target.parent}': {error.strerror}.",
                               hint="Choose a writable output folder.", file=str(target)) from error
    temp_path = Path(temp_name)
    try:
        writer(temp_path)
        os.chmod(temp_path, 0o666 & ~_umask())  # mkstemp makes 0600; outputs follow the umask like any file
        os.replace(temp_path, target)
    except OSError as error:
        raise OutputWriteError(f"Cannot write '{target}': {error.strerror or error}.",
                               hint="Check free disk space and permissions.", file=str(target)) from error
    finally:
        temp_path.unlink(missing_ok=True)
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda temp: temp.write_bytes(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write(path, lambda temp: temp.write_text(text, encoding="utf-8"))
