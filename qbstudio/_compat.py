"""Work-arounds for defects of the pinned Qt binding, each with the test that shows it is still needed.

PySide6 6.12.0 on CPython 3.11 drops one reference to ``None`` on every call of a void C++ method
(``QLabel.setText``, ``QCoreApplication.processEvents`` ...) and one to ``True`` on every Python-side
``Signal.emit``: it assumes PEP 683's immortal singletons of CPython 3.12+. They start with a few
thousand references, so after a few thousand such calls CPython aborts ("Fatal Python error:
none_dealloc" / "bool_dealloc"). :func:`guard_none_refcount` gives ``None``, ``True`` and ``False``
the effectively infinite count they have on 3.12+, exactly the assumption the binding makes.
``tests/gui/test_app.py::test_none_refcount_guard`` tells when it can go.
"""

from __future__ import annotations

import ctypes
import logging
import sys

logger = logging.getLogger(__name__)

_IMMORTAL_REFERENCES = 1 << 40
_guarded = False


def needs_none_guard() -> bool:
    """Whether ``None`` is mortal on this interpreter (CPython before 3.12)."""
    return sys.implementation.name == "cpython" and sys.version_info < (3, 12)


def guard_none_refcount() -> bool:
    """Make ``None``'s reference count effectively infinite on CPython < 3.12 (once per process).

    Returns:
        True if the guard is (now) in place, False if the interpreter does not need it.
    """
    global _guarded
    if not needs_none_guard():
        return False
    if not _guarded:
        for singleton in (None, True, False):
            ctypes.c_ssize_t.from_address(id(singleton)).value += _IMMORTAL_REFERENCES
        _guarded = True
        logger.debug("None reference count raised (PySide6 void-call reference leak on CPython < 3.12)")
    return True
