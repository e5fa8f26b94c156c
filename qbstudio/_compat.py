"""Work-arounds for defects of the pinned Qt binding, each with the test that shows it is still needed.

PySide6 6.12.0 on CPython 3.11 drops one reference to ``None`` on every call of a void C++ method
(``QLabel.setText``, ``QCoreApplication.processEvents`` ...) and one to ``True`` on every Python-side
``Signal.emit``: it assumes PEP 683's immortal singletons of CPython 3.12+. They start with a few
thousand references, so after a few thousand such calls CPython aborts ("Fatal Python error:
none_dealloc" / "bool_dealloc"). :func:`guard_none_refcount` gives ``None``, ``True`` and ``False``
the effectively infinite count they have on 3.12+, exactly the assumption the binding makes.
``tests/gui/test_app.py::test_none_refcount_guard`` tells when it can go.

Once ``PySide6.QtCore`` is imported, PySide6 replaces ``builtins.__import__`` and, after every
module import in the process, reads the new module's *source file* (``inspect.getsource``) to decide
whether it uses the binding, for its opt-in ``from __feature__ import snake_case`` syntax. With
onnx, onnxscript, sympy and pyqtgraph loaded after the window is shown, that is about 1,100 source
reads and 0.3-0.4 s of CPU at start-up. We never select a feature, so :func:`skip_feature_source_scan`
replaces the source read by a check of the module's package name (``tests/gui/test_app.py`` tells
when the hook is gone).
"""

from __future__ import annotations

import ctypes
import logging
import sys

logger = logging.getLogger(__name__)

_IMMORTAL_REFERENCES = 1 << 40
_guarded = False
# Packages whose modules use the binding: they keep PySide6's "uses PySide" default (feature set 0).
_QT_PACKAGES = frozenset({"qbstudio", "pyqtgraph", "PySide6", "shiboken6", "pytestqt"})


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


def _uses_qt_package(module) -> bool:
    return getattr(module, "__name__", "").partition(".")[0] in _QT_PACKAGES


def skip_feature_source_scan() -> bool:
    """Decide PySide6's per-module feature default from the package name, not from the module's source.

    Call after ``PySide6.QtCore`` is imported. Modules of :data:`_QT_PACKAGES` get the binding's
    "uses PySide" default, all others its "ignore this module" default; with no feature ever
    selected both mean plain camelCase Qt, as before.

    Returns:
        True if the hook was replaced, False if this PySide6 has no such hook (nothing to do).
    """
    try:
        from shibokensupport import feature
    except ImportError:
        return False
    if not callable(getattr(feature, "_mod_uses_pyside", None)):
        return False
    if feature._mod_uses_pyside is not _uses_qt_package:
        feature._mod_uses_pyside = _uses_qt_package
        logger.debug("PySide6 feature hook: module source reads skipped")
    return True
