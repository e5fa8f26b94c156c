"""GUI test set-up: QtWebEngine is imported and the ``qbnetron`` scheme registered before the QApplication.

pytest-qt creates the QApplication lazily in its ``qapp`` fixture, so registering here, in
``pytest_configure``, is early enough (also in each pytest-xdist worker). The headless Chromium
flags are set by ``tests/conftest.py`` at import time.
"""

from __future__ import annotations

import importlib.util

import pytest


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


@pytest.fixture(autouse=True)
def no_blocking_dialogs(monkeypatch):
    """A modal dialog a test did not answer fails the test at once (it waited for a click until CI's timeout)."""
    if importlib.util.find_spec("PySide6") is None:
        return
    from PySide6.QtWidgets import QDialog, QMessageBox

    def refuse(dialog, *args, **kwargs):
        text = dialog.text() if isinstance(dialog, QMessageBox) else dialog.windowTitle()
        raise AssertionError(f"a test opened a modal {type(dialog).__name__} nobody answers: {text!r}")

    monkeypatch.setattr(QMessageBox, "exec", refuse)
    monkeypatch.setattr(QDialog, "exec", refuse)


@pytest.fixture
def dialog_calls(monkeypatch) -> list:
    """Error dialogs shown (title, message) instead of blocking; "save changes?" answers Discard."""
    from qbstudio import dialogs

    calls: list = []
    monkeypatch.setattr(dialogs, "show_error", lambda parent, title, error: calls.append((title, str(error))))
    monkeypatch.setattr(dialogs, "ask_save_changes", lambda *args: dialogs.DISCARD)
    return calls


@pytest.fixture
def shown_window(qtbot, tmp_path, monkeypatch, dialog_calls):
    """A shown 1400x900 main window with its own QBSTUDIO_HOME; closed at teardown."""
    from PySide6.QtWidgets import QApplication

    from qbstudio.main_window import MainWindow
    from qbstudio.state.preferences import AppDirs

    monkeypatch.setenv("QBSTUDIO_HOME", str(tmp_path / "home"))
    main = MainWindow(AppDirs.default())
    main.resize(1400, 900)
    main.show()
    qtbot.waitExposed(main)
    yield main
    main.close()
    main.deleteLater()
    QApplication.processEvents()
