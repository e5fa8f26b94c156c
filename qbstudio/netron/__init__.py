"""Netron embedded offline: the ``qbnetron:`` scheme, the locked-down page, injected scripts, palette.

Call :func:`register_scheme` before the QApplication is created; then use
:class:`qbstudio.widgets.graph_view.GraphView`, which puts these parts together. The palette is
Qt-free; the Qt parts are imported on first use, so ``qbstudio.netron.palette`` needs no Qt.
"""

from __future__ import annotations

import importlib
from typing import Any

from qbstudio.netron.palette import SELECTION_COLOUR, SUPPORT_PALETTE, StatusStyle, status_css_class

_LAZY = {"SCHEME": "scheme", "NetronSchemeHandler": "scheme", "register_scheme": "scheme",
         "rewrite_index": "scheme", "NetronPage": "page", "LocalOnlyInterceptor": "page"}

__all__ = ["SELECTION_COLOUR", "SUPPORT_PALETTE", "StatusStyle", "status_css_class", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"qbstudio.netron.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
