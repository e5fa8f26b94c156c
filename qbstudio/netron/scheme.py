"""The ``qbnetron:`` URL scheme: Netron's static web UI and the open model, served without a TCP port.

:func:`register_scheme` must run before the ``QApplication`` exists. :class:`NetronSchemeHandler`
then serves, on an off-the-record profile, the files of the pinned ``netron`` package and the model
bytes at ``/data/<name>.onnx``. It rewrites ``index.html`` on the way: ``<meta name="date">`` becomes
today (Netron otherwise refuses to run 180 days after its release date) and a
``<meta name="file">`` tells Netron which model to open (as Netron's own Python server does).
"""

from __future__ import annotations

import html
import importlib.util
import logging
import re
import urllib.parse
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QFile, QIODevice, QObject, QUrl
from PySide6.QtWebEngineCore import QWebEngineUrlRequestJob, QWebEngineUrlScheme, QWebEngineUrlSchemeHandler

logger = logging.getLogger(__name__)

SCHEME = "qbnetron"
HOST = "app"
INDEX_URL = QUrl(f"{SCHEME}://{HOST}/index.html")
DATA_PREFIX = "/data/"

_MIME_TYPES = {
    ".html": b"text/html",
    ".js": b"text/javascript",
    ".css": b"text/css",
    ".json": b"application/json",
    ".png": b"image/png",
    ".ico": b"image/x-icon",
    ".svg": b"image/svg+xml",
    ".woff": b"font/woff",
    ".woff2": b"font/woff2",
}
_DATE_META = re.compile(r'<meta name="date" content="[^"]*">')


def register_scheme() -> None:
    """Register the ``qbnetron`` scheme with QtWebEngine; call once, before the QApplication exists.

    Secure + local: Chromium then treats the pages like local files, so Netron's ES modules, its
    layout worker and its ``fetch`` of the model work, and requests to http(s) hosts are refused.

    Raises:
        RuntimeError: a QApplication already exists (registration would be ignored silently).
    """
    from PySide6.QtCore import QCoreApplication

    if QWebEngineUrlScheme.schemeByName(SCHEME.encode()).name():
        return
    if QCoreApplication.instance() is not None:
        raise RuntimeError(f"register_scheme() must be called before the QApplication is created ({SCHEME}:).")
    scheme = QWebEngineUrlScheme(SCHEME.encode())
    scheme.setSyntax(QWebEngineUrlScheme.Syntax.Host)
    flags = QWebEngineUrlScheme.Flag
    scheme.setFlags(flags.SecureScheme | flags.LocalScheme | flags.LocalAccessAllowed
                    | flags.CorsEnabled | flags.FetchApiAllowed)
    QWebEngineUrlScheme.registerScheme(scheme)
    logger.debug("Registered the %s: URL scheme", SCHEME)


def netron_static_dir() -> Path:
    """Folder of the installed ``netron`` package, which holds Netron's whole web UI.

    Found without importing the package: ``netron/__init__`` imports its HTTP server (http.server,
    ssl: about 0.2 s at start-up) that the workbench never uses.
    """
    spec = importlib.util.find_spec("netron")
    if spec is None or not spec.submodule_search_locations:
        import netron  # raises the ImportError the callers report

        return Path(netron.__file__).resolve().parent
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def model_url_path(name: str) -> str:
    """URL path (percent-encoded) under which the model called ``name`` is served."""
    return DATA_PREFIX + urllib.parse.quote(name)


def rewrite_index(source: str, *, model_name: str | None, now: datetime | None = None,
                  stamp_date: bool = True) -> str:
    """Netron's ``index.html`` with today's date and the model to open.

    Args:
        source: The packaged ``index.html``.
        model_name: Name the model is served under (``/data/<name>``), or None for no model.
        now: Date to stamp (UTC now if omitted).
        stamp_date: Replace the release date (False only to show that the age lock exists).

    Returns:
        The page to serve.
    """
    page = source
    if stamp_date:
        stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M:%S")
        page, count = _DATE_META.subn(f'<meta name="date" content="{stamp}">', source, count=1)
        if count == 0:
            logger.debug("Netron's index.html has no date meta; nothing to rewrite")
    if model_name:
        meta = f'<meta name="file" content="{html.escape(model_url_path(model_name))}">\n'
        page = page.replace("</head>", meta + "</head>", 1)
    return page


class NetronSchemeHandler(QWebEngineUrlSchemeHandler):
    """Serves Netron's files and the current model under ``qbnetron://app/``.

    The query string is ignored (Netron appends ``?cb=<time>`` to defeat caches). Only files inside
    the netron package and the models given to :meth:`serve_model` are reachable.

    Args:
        parent: Owning QObject.
        index_preprocessor: Applied to the packaged ``index.html`` *before* the date rewrite; tests
            use it to inject an old release date.
        rewrite_date: Stamp today's date into ``index.html`` (turn off only to prove the lock exists).
    """

    def __init__(self, parent: QObject | None = None, *,
                 index_preprocessor: Callable[[str], str] | None = None, rewrite_date: bool = True) -> None:
        super().__init__(parent)
        self._static_dir = netron_static_dir()
        self._static_cache: dict[str, bytes] = {}
        self._models: dict[str, Path] = {}
        self._model_name: str | None = None
        self._index_preprocessor = index_preprocessor
        self._rewrite_date = rewrite_date

    @property
    def model_name(self) -> str | None:
        """Name the current model is served under, or None."""
        return self._model_name

    def serve_model(self, path: str | Path, name: str | None = None) -> str:
        """Serve the file at ``path`` as the model Netron opens next; returns its served name.

        Netron picks its reader from the extension, so an MBLT is served as ``<stem>.onnx``.
        A ``<file>.data`` external-weights file beside it is served under its own name.
        """
        path = Path(path)
        name = name or f"{path.stem}.onnx"
        self._models = {name: path}
        external = path.with_name(path.name + ".data")
        if external.is_file():
            self._models[external.name] = external
        self._model_name = name
        return name

    def clear_model(self) -> None:
        """Stop serving any model."""
        self._models = {}
        self._model_name = None

    def requestStarted(self, job: QWebEngineUrlRequestJob) -> None:  # noqa: N802 (Qt override)
        """Answer one request of the page (called by QtWebEngine on the UI thread)."""
        url = job.requestUrl()
        path = url.path(QUrl.ComponentFormattingOption.FullyDecoded) or "/"
        if url.host() != HOST or job.requestMethod() not in (b"GET", b"HEAD"):
            self._fail(job, path, QWebEngineUrlRequestJob.Error.RequestDenied)
        elif path.startswith(DATA_PREFIX):
            self._reply_model(job, path[len(DATA_PREFIX):])
        elif path in ("/", "/index.html"):
            self._reply_bytes(job, b"text/html", self._index_html().encode("utf-8"))
        else:
            self._reply_static(job, path)

    def _index_html(self) -> str:
        source = (self._static_dir / "index.html").read_text(encoding="utf-8")
        if self._index_preprocessor is not None:
            source = self._index_preprocessor(source)
        return rewrite_index(source, model_name=self._model_name, stamp_date=self._rewrite_date)

    def _reply_model(self, job: QWebEngineUrlRequestJob, name: str) -> None:
        path = self._models.get(name)
        if path is None or not path.is_file():
            self._fail(job, name, QWebEngineUrlRequestJob.Error.UrlNotFound)
            return
        device = QFile(str(path), job)
        if not device.open(QIODevice.OpenModeFlag.ReadOnly):
            self._fail(job, name, QWebEngineUrlRequestJob.Error.RequestFailed)
            return
        logger.debug("Serving model %s (%d bytes) from %s", name, device.size(), path)
        job.reply(b"application/octet-stream", device)

    def _reply_static(self, job: QWebEngineUrlRequestJob, path: str) -> None:
        data = self._static_cache.get(path)
        if data is None:
            file = (self._static_dir / path.lstrip("/")).resolve()
            mime = _MIME_TYPES.get(file.suffix)
            if mime is None or not file.is_relative_to(self._static_dir) or not file.is_file():
                self._fail(job, path, QWebEngineUrlRequestJob.Error.UrlNotFound)
                return
            data = self._static_cache[path] = file.read_bytes()
        self._reply_bytes(job, _MIME_TYPES[Path(path).suffix], data)

    @staticmethod
    def _reply_bytes(job: QWebEngineUrlRequestJob, mime: bytes, data: bytes) -> None:
        buffer = QBuffer(job)
        buffer.setData(QByteArray(data))
        buffer.open(QIODevice.OpenModeFlag.ReadOnly)
        job.reply(mime, buffer)

    @staticmethod
    def _fail(job: QWebEngineUrlRequestJob, what: str, error: QWebEngineUrlRequestJob.Error) -> None:
        logger.debug("qbnetron: refusing %s (%s)", what, error.name)
        job.fail(error)
