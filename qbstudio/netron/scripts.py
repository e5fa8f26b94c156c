"""User scripts and CSS injected into the embedded Netron page.

The scripts live in ``resources/netron/``, found with :func:`compiler_core.resources.resource_path`
(``privacy.js``: consent cookie and a no-op ``sendBeacon``; ``bridge.js``: events to Python,
colouring and selection API, readiness). Each is wrapped here in a
``try``/``catch`` with two helpers, because an uncaught error in an injected script makes Netron
blank the graph:

* ``qbPost(event, data)`` logs ``'qbnetron:' + JSON`` with ``console.debug``, which
  :class:`~qbstudio.netron.page.NetronPage` reads in ``javaScriptConsoleMessage``;
* ``qbGuard(where, fn)`` returns ``fn`` wrapped in ``try``/``catch`` for later callbacks.

The status CSS is generated from :data:`~qbstudio.netron.palette.SUPPORT_PALETTE`.
"""

from __future__ import annotations

import json
import logging

from PySide6.QtWebEngineCore import QWebEngineScript, QWebEngineScriptCollection

from compiler_core.resources import resource_path
from qbstudio.netron.palette import (
    SELECTION_COLOUR,
    SUPPORT_PALETTE,
    UNCLASSIFIED,
    StatusStyle,
    status_css_class,
)

logger = logging.getLogger(__name__)

BRIDGE_PREFIX = "qbnetron:"

_PROLOGUE = """(function () {
'use strict';
const qbPost = (event, data) => {
    try {
        console.debug(%(prefix)s + JSON.stringify(Object.assign({ event: event }, data || {})));
    } catch (error) {
        // never let reporting break the page
    }
};
const qbGuard = (where, fn) => function () {
    try {
        return fn.apply(this, arguments);
    } catch (error) {
        qbPost('script-error', { where: where, message: String(error && error.stack || error) });
        return undefined;
    }
};
try {
"""
_EPILOGUE = """
} catch (error) {
    qbPost('script-error', { where: %(name)s, message: String(error && error.stack || error) });
}
})();
"""


def wrap_script(name: str, body: str) -> str:
    """``body`` inside an IIFE with ``qbPost``/``qbGuard`` and a catch-all that reports to Python."""
    return (_PROLOGUE % {"prefix": json.dumps(BRIDGE_PREFIX)} + body
            + _EPILOGUE % {"name": json.dumps(name)})


def _node_rules(node: str, style: StatusStyle) -> list[str]:
    return [
        f"{node} > g.node-item-type > path {{ fill: {style.fill}; }}",
        f"{node} > g.node-item-type > text {{ fill: {style.text}; }}",
        f"{node} > g.node-item-type:hover > path {{ fill: {style.tint}; }}",
        f"{node} > g.node-item-type:hover > text {{ fill: #000000; }}",
        f"{node} > g.node-argument-list > path {{ fill: {style.tint}; }}",
        f"{node} > path.node-border {{ stroke: {style.fill}; stroke-width: 1.5px; }}",
    ]


def status_css() -> str:
    """CSS colouring nodes by status class, and the selection outline, from the palette.

    While any status is set (``data-qb-statuses`` on ``<html>``), nodes without one are grey, so
    that Netron's category colours (a dark red Relu, say) are not read as statuses.
    """
    rules = _node_rules('html[data-qb-statuses] svg g.node[id^="node-"]:not([class*="qb-status-"])', UNCLASSIFIED)
    for status, style in SUPPORT_PALETTE.items():
        rules += _node_rules(f"svg g.node.{status_css_class(status)}", style)
    rules += [
        f"svg g.node.select > path.node.node-border {{ stroke: {SELECTION_COLOUR}; stroke-width: 3px; }}",
        f"svg .select.edge-path {{ stroke: {SELECTION_COLOUR}; stroke-width: 2px; }}",
        f"#arrowhead-select {{ fill: {SELECTION_COLOUR}; }}",
    ]
    return "\n".join(rules)


def _style_body() -> str:
    return ("const style = document.createElement('style');\n"
            "style.id = 'qb-status-style';\n"
            f"style.textContent = {json.dumps(status_css())};\n"
            "(document.head || document.documentElement).appendChild(style);\n")


def _script(name: str, body: str, point: QWebEngineScript.InjectionPoint) -> QWebEngineScript:
    script = QWebEngineScript()
    script.setName(f"qbstudio-{name}")
    script.setSourceCode(wrap_script(name, body))
    script.setInjectionPoint(point)
    script.setWorldId(QWebEngineScript.ScriptWorldId.MainWorld)
    script.setRunsOnSubFrames(False)
    return script


def user_scripts() -> list[QWebEngineScript]:
    """The scripts to inject, in order (privacy first: it must precede Netron's own start-up)."""
    creation = QWebEngineScript.InjectionPoint.DocumentCreation
    return [
        _script("privacy", _read_script("privacy.js"), creation),
        _script("bridge", _read_script("bridge.js"), creation),
        _script("style", _style_body(), QWebEngineScript.InjectionPoint.DocumentReady),
    ]


def _read_script(name: str) -> str:
    return resource_path("netron", name).read_text(encoding="utf-8")


def install_scripts(collection: QWebEngineScriptCollection) -> None:
    """Replace any earlier qb Studio scripts in ``collection`` with :func:`user_scripts`."""
    for script in collection.toList():
        if script.name().startswith("qbstudio-"):
            collection.remove(script)
    for script in user_scripts():
        collection.insert(script)
    logger.debug("Injected the qb Studio user scripts into the Netron page")


def js_call(function: str, *args: object) -> str:
    """JavaScript source calling ``window.<function>(args...)`` with JSON-encoded arguments.

    The result is JSON-stringified, because PySide6 passes arrays, objects and null to callbacks as ``''``.
    """
    arguments = ", ".join(json.dumps(arg) for arg in args)
    return f"JSON.stringify(window.{function} ? window.{function}({arguments}) : null)"
