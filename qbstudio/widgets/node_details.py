"""Node details: op, shapes, attributes, support verdict and, after a compile, precision, SQNR and performance."""

from __future__ import annotations

import html
import logging
from typing import Any

from PySide6.QtWidgets import QTabWidget, QTextBrowser, QVBoxLayout, QWidget

from qbstudio.netron.palette import SUPPORT_PALETTE
from qbstudio.widgets.performance_view import PerformanceView

logger = logging.getLogger(__name__)


def _shape_text(value: dict[str, Any]) -> str:
    shape = "?" if value["shape"] is None else "×".join(str(d) for d in value["shape"]) or "scalar"
    kind = " (constant)" if value["constant"] else ""
    return f"{html.escape(value['name'])}: {value['dtype']} [{shape}]{kind}"


def details_html(info: dict[str, Any], support: dict[str, str] | None, layer: dict[str, Any] | None,
                 precision: str | None) -> str:
    """Rich text for one node.

    Args:
        info: :func:`qbstudio.state.model_info.node_info` of the node.
        support: Its row of the support report (status, reason, unit), if checked.
        layer: Its row of the last run's analysis (precision, sqnr_db, cosine_mean), if any.
        precision: Its precision in the last run's program, if known.
    """
    rows = [("Op", html.escape(f"{info['domain']}::{info['op']}" if info["domain"] else info["op"]))]
    if info["source_name"]:
        rows.append(("Source name", html.escape(info["source_name"])))
    rows += _support_rows(support)
    rows += _run_rows(layer, precision)
    rows.append(("Inputs", "<br>".join(_shape_text(v) for v in info["inputs"]) or "—"))
    rows.append(("Outputs", "<br>".join(_shape_text(v) for v in info["outputs"]) or "—"))
    attributes = "<br>".join(f"{html.escape(k)} = {html.escape(v)}" for k, v in info["attributes"].items())
    rows.append(("Attributes", attributes or "—"))
    body = "".join(f"<tr><td valign='top'><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows)
    return f"<h3>{html.escape(info['name'])}</h3><table cellspacing='4'>{body}</table>"


def _support_rows(support: dict[str, str] | None) -> list[tuple[str, str]]:
    if not support:
        return []
    style = SUPPORT_PALETTE[support["status"]]
    badge = f"<span style='background:{style.fill};color:{style.text}'>&nbsp;{style.label}&nbsp;</span>"
    rows = [("Support", badge + (f" on unit {support['unit']}" if support.get("unit") else ""))]
    if support.get("reason"):
        rows.append(("Reason", html.escape(support["reason"])))
    return rows


def _run_rows(layer: dict[str, Any] | None, precision: str | None) -> list[tuple[str, str]]:
    rows = []
    precision = (layer or {}).get("precision") or precision
    if precision:
        rows.append(("Precision", html.escape(precision)))
    if layer and isinstance(layer.get("sqnr_db"), (int, float)):
        rows.append(("SQNR", f"{layer['sqnr_db']:.1f} dB ({layer.get('verdict', '')})"))
    return rows


class NodeDetails(QWidget):
    """Shows the details of the selected node."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.browser = QTextBrowser(self)
        self.browser.setOpenLinks(False)
        self.performance = PerformanceView(self)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.browser, "Details")
        self.tabs.addTab(self.performance, "Performance")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.tabs)
        self.clear()

    def clear(self) -> None:
        """Show the hint instead of a node."""
        self.node: str | None = None
        self.browser.setHtml("<p style='color:#666'>Select a node in the graph or in the Layer support list.</p>")
        self.performance.select_layer(None)

    def show_node(self, info: dict[str, Any], support: dict[str, str] | None = None,
                  layer: dict[str, Any] | None = None, precision: str | None = None) -> None:
        """Show one node (see :func:`details_html`)."""
        self.node = info["name"]
        self.browser.setHtml(details_html(info, support, layer, precision))
        self.performance.select_layer(info["name"])

    def text(self) -> str:
        """Plain text shown (for tests)."""
        return self.browser.toPlainText()
