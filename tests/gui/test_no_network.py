"""A full GUI session makes no network connection: open the sample, check, compile (with its analysis run),
run the compiled model, with a socket-level guard that records and refuses every connection attempt.

The guard wraps Python's socket layer (connect, connect_ex, sendto, sendmsg, DNS lookups); the Netron
page's own requests go through Chromium, whose request interceptor records what it blocks. Both
records must stay empty for the whole session.
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from compiler_core.runtime import Accelerator, Model  # noqa: E402
from qbstudio.main_window import MainWindow  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_PROJECT = ROOT / "resources" / "samples" / "fashion_cnn.qbproj"
TIMEOUT_MS = 240_000


class NetworkGuard:
    """Records every non-local-socket connection attempt or name lookup, and refuses it (ENETUNREACH)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.attempts: list[str] = []
        original_connect, original_connect_ex = socket.socket.connect, socket.socket.connect_ex
        original_sendto, original_sendmsg = socket.socket.sendto, socket.socket.sendmsg

        def guarded(original, what):
            def call(sock, *args, **kwargs):
                if sock.family == socket.AF_UNIX:
                    return original(sock, *args, **kwargs)
                self.attempts.append(f"{what} {args[-1] if args else ''}")
                raise OSError(101, "Network is unreachable (blocked by the test's network guard)")
            return call

        def lookup(host, *args, **kwargs):
            self.attempts.append(f"getaddrinfo {host}")
            raise socket.gaierror(socket.EAI_NONAME, "name lookups are blocked by the test's network guard")

        monkeypatch.setattr(socket.socket, "connect", guarded(original_connect, "connect"))
        monkeypatch.setattr(socket.socket, "connect_ex", guarded(original_connect_ex, "connect_ex"))
        monkeypatch.setattr(socket.socket, "sendto", guarded(original_sendto, "sendto"))
        monkeypatch.setattr(socket.socket, "sendmsg", guarded(original_sendmsg, "sendmsg"))
        monkeypatch.setattr(socket, "getaddrinfo", lookup)
        monkeypatch.setattr(socket, "gethostbyname", lookup)


def test_the_guard_sees_an_attempt(monkeypatch):
    """The guard is not blind: a plain HTTP request is recorded and refused."""
    guard = NetworkGuard(monkeypatch)
    with pytest.raises(OSError):
        urllib.request.urlopen("http://example.com/", timeout=2)  # noqa: S310 (the attempt is the point)
    with pytest.raises(OSError):
        socket.socket().connect(("10.0.0.1", 80))
    assert guard.attempts[0] == "getaddrinfo example.com" and guard.attempts[-1] == "connect ('10.0.0.1', 80)"


def test_a_full_session_makes_no_connection(qtbot, shown_window: MainWindow, dialog_calls, monkeypatch):
    guard = NetworkGuard(monkeypatch)
    window = shown_window
    with qtbot.waitSignal(window.model_ready, timeout=TIMEOUT_MS):
        window.open_path(SAMPLE_PROJECT)
    qtbot.waitUntil(lambda: window.graph.is_ready, timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: window.calibration.preview is not None, timeout=TIMEOUT_MS)

    window.set_device("aries-rb")  # check: every node coloured from the support report
    window.check_support()
    assert window.support.model.rowCount() > 0 and window.report is not None

    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS) as blocker:
        assert window.start_compile()
    assert blocker.args == ["done"], dialog_calls
    run = window.session.latest_run
    assert run.metrics.get("verdict") and Path(run.mxq_path).is_file()  # the analysis ran the MXQ

    model = Model(run.mxq_path, input_layout="NCHW")  # and a run of the compiled model, as a user script would
    model.launch(Accelerator(model.artifact.device))
    shape = model.artifact.input_specs[0].shape
    assert np.asarray(model.infer(np.zeros(shape, np.float32))[0]).size > 0

    assert guard.attempts == []
    assert window.graph.blocked_requests == [] and window.graph.refused_navigations == []
    assert dialog_calls == []
