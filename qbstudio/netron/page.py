"""The Netron web page: a locked-down, offline QWebEnginePage with a JS -> Python event bridge.

* :class:`LocalOnlyInterceptor` blocks every request that is not for the ``qbnetron`` scheme (or an
  in-page ``data:``/``blob:`` URL) and records it.
* :class:`NetronPage` refuses navigation away from the scheme (Netron's Update/Report buttons set
  ``window.location``), records the non-local ``fetch``/XHR attempts the injected guard refused, reads ``qbnetron:{json}`` console messages posted by the injected scripts and
  re-emits them as typed signals.
* :func:`create_profile` builds the off-the-record profile with the scheme handler and interceptor.
"""

from __future__ import annotations

import json
import logging

from PySide6.QtCore import QObject, QUrl, Signal
from PySide6.QtWebEngineCore import (
    QWebEnginePage,
    QWebEngineProfile,
    QWebEngineSettings,
    QWebEngineUrlRequestInfo,
    QWebEngineUrlRequestInterceptor,
)

from qbstudio.netron.scheme import SCHEME, NetronSchemeHandler
from qbstudio.netron.scripts import BRIDGE_PREFIX, install_scripts

logger = logging.getLogger(__name__)

LOCAL_SCHEMES = frozenset({SCHEME, "data", "blob"})
"""URL schemes the page may load; everything else is blocked."""

_CONSOLE_LEVELS = {
    QWebEnginePage.JavaScriptConsoleMessageLevel.InfoMessageLevel: logging.DEBUG,
    QWebEnginePage.JavaScriptConsoleMessageLevel.WarningMessageLevel: logging.INFO,
    QWebEnginePage.JavaScriptConsoleMessageLevel.ErrorMessageLevel: logging.WARNING,
}


def is_local_url(url: QUrl) -> bool:
    """True if ``url`` is served by the application itself (never the network)."""
    return url.scheme() in LOCAL_SCHEMES


class LocalOnlyInterceptor(QWebEngineUrlRequestInterceptor):
    """Blocks and records every request the page makes outside :data:`LOCAL_SCHEMES`.

    Chromium already refuses http(s) requests from a ``LocalScheme`` page before they get here, so
    an empty record alone does not prove nothing was attempted (see the no-op ``sendBeacon``).
    """

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.blocked: list[str] = []

    def interceptRequest(self, info: QWebEngineUrlRequestInfo) -> None:  # noqa: N802 (Qt override)
        """Block ``info`` unless it is local (Qt 6 calls this on the UI thread)."""
        url = info.requestUrl()
        if not is_local_url(url):
            info.block(True)
            self.blocked.append(url.toString())
            logger.warning("Blocked a network request from the graph view: %s", url.toString())


def create_profile(handler: NetronSchemeHandler, interceptor: LocalOnlyInterceptor,
                   parent: QObject | None = None) -> QWebEngineProfile:
    """An off-the-record profile serving ``qbnetron:`` through ``handler``, filtered by ``interceptor``.

    Delete every page that uses the profile before the profile itself (Qt warns otherwise).
    """
    profile = QWebEngineProfile(parent)
    assert profile.isOffTheRecord()
    profile.setHttpCacheType(QWebEngineProfile.HttpCacheType.MemoryHttpCache)
    profile.setPersistentCookiesPolicy(QWebEngineProfile.PersistentCookiesPolicy.NoPersistentCookies)
    profile.setSpellCheckEnabled(False)
    profile.installUrlSchemeHandler(SCHEME.encode(), handler)
    profile.setUrlRequestInterceptor(interceptor)
    return profile


class NetronPage(QWebEnginePage):
    """Netron's page: offline settings, injected scripts, and the console-message bridge.

    Signals:
        model_opened(str, int): Netron parsed the model served as ``file`` with this many nodes
            (sent before the layout, which is the slow part for big graphs).
        graph_ready(str, int): The graph for ``file`` is shown with this many node elements.
        node_selected(str): The user clicked (activated) the node with this name.
        node_context_requested(str, int, int): Right click on a node, at page coordinates x, y.
        message_shown(str, str, str, str): Netron shows a message over the graph of ``file``: its text,
            kind (``alert`` for errors, ``notification`` otherwise) and button label (``Cancel`` while a
            long layout runs; ``Update``/``Accept``/``OK`` for dialogs Netron waits on).
    """

    model_opened = Signal(str, int)
    graph_ready = Signal(str, int)
    node_selected = Signal(str)
    node_context_requested = Signal(str, int, int)
    message_shown = Signal(str, str, str, str)

    def __init__(self, profile: QWebEngineProfile, parent: QObject | None = None) -> None:
        super().__init__(profile, parent)
        self.refused_navigations: list[str] = []
        self.refused_requests: list[str] = []
        self.suppressed_beacons: list[str] = []
        self._configure()
        install_scripts(self.scripts())

    def _configure(self) -> None:
        settings = self.settings()
        attribute = QWebEngineSettings.WebAttribute
        # LocalContentCanAccessRemoteUrls must stay off: it also breaks Netron's layout worker.
        for off in (attribute.LocalContentCanAccessRemoteUrls, attribute.JavascriptCanOpenWindows,
                    attribute.PluginsEnabled, attribute.DnsPrefetchEnabled, attribute.NavigateOnDropEnabled,
                    attribute.AutoLoadIconsForPage, attribute.HyperlinkAuditingEnabled):
            settings.setAttribute(off, False)
        settings.setAttribute(attribute.JavascriptEnabled, True)

    def acceptNavigationRequest(self, url: QUrl | str, navigation_type: QWebEnginePage.NavigationType,  # noqa: N802
                                is_main_frame: bool) -> bool:
        """Allow only the ``qbnetron`` scheme (and ``about:blank``); Netron's links would replace the UI."""
        url = QUrl(url)
        if url.scheme() == SCHEME or url.toString() == "about:blank":
            return True
        self.refused_navigations.append(url.toString())
        logger.info("Graph view: refused to navigate to %s", url.toString())
        return False

    def javaScriptConsoleMessage(self, level: QWebEnginePage.JavaScriptConsoleMessageLevel, message: str,  # noqa: N802
                                 line: int, source: str) -> None:
        """Dispatch ``qbnetron:`` bridge messages; log everything else at a matching level."""
        if message.startswith(BRIDGE_PREFIX):
            self._dispatch(message[len(BRIDGE_PREFIX):])
        else:
            logger.log(_CONSOLE_LEVELS.get(level, logging.DEBUG), "netron: %s (%s:%d)", message, source, line)

    def _dispatch(self, payload: str) -> None:
        try:
            event = json.loads(payload)
            kind = event["event"]
        except (ValueError, KeyError, TypeError):
            logger.warning("Graph view: unreadable bridge message %r", payload[:200])
            return
        handler = getattr(self, "_on_" + str(kind).replace("-", "_"), None)
        if handler is None:
            logger.debug("Graph view: unhandled bridge event %r", kind)
            return
        try:
            handler(event)
        except (KeyError, TypeError, ValueError) as error:
            logger.warning("Graph view: malformed %r event (%s)", kind, error)

    def _on_opened(self, event: dict) -> None:
        self.model_opened.emit(str(event["file"]), int(event["nodes"]))

    def _on_ready(self, event: dict) -> None:
        self.graph_ready.emit(str(event["file"]), int(event["nodes"]))

    def _on_select(self, event: dict) -> None:
        if event["node"]:
            self.node_selected.emit(str(event["node"]))

    def _on_context(self, event: dict) -> None:
        self.node_context_requested.emit(str(event["node"]), round(event["x"]), round(event["y"]))

    def _on_message(self, event: dict) -> None:
        logger.info("Netron shows a %s: %s [%s]", event["kind"], event["text"], event["button"])
        self.message_shown.emit(str(event["file"]), str(event["text"]), str(event["kind"]), str(event["button"]))

    def _on_beacon(self, event: dict) -> None:
        url = str(event["url"])
        self.suppressed_beacons.append(url)
        logger.debug("Suppressed a Netron telemetry beacon to %s", url.split("?", 1)[0])

    def _on_request_blocked(self, event: dict) -> None:
        self.refused_requests.append(str(event["url"]))
        logger.warning("Graph view: refused a network request in the page: %s", event["url"])

    def _on_script_error(self, event: dict) -> None:
        logger.warning("Graph view overlay script failed in %s: %s", event.get("where"), event.get("message"))
