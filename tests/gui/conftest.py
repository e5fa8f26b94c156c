"""GUI test set-up: QtWebEngine is imported and the ``qbnetron`` scheme registered before the QApplication.

pytest-qt creates the QApplication lazily in its ``qapp`` fixture, so registering here, in
``pytest_configure``, is early enough (also in each pytest-xdist worker). The headless Chromium
flags are set by ``tests/conftest.py`` at import time.
"""

from __future__ import annotations

import importlib.util


def pytest_configure(config) -> None:
    if importlib.util.find_spec("PySide6") is None:
        return
    try:
        from PySide6 import QtWebEngineWidgets  # noqa: F401  (must be imported before the QApplication)
    except ImportError:
        return
    from qbstudio._compat import guard_none_refcount
    from qbstudio.netron.scheme import register_scheme

    guard_none_refcount()  # PySide6 6.12.0 reference leaks on CPython 3.11 (see qbstudio/_compat.py)
    register_scheme()
