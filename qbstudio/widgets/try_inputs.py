"""The results of "Try on inputs…": a compiled run's outputs on the user's own inputs, beside FP32."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTextBrowser, QVBoxLayout, QWidget

from compiler_core.progress import as_reporter


def compare_job(mxq_path: str, mblt_path: str, paths: list[str], *, callback=None, cancel_token=None
                ) -> list[dict[str, Any]]:
    """``compiler_core.runtime.inputs.compare_with_fp32`` as a worker job."""
    from compiler_core.runtime.inputs import compare_with_fp32

    return compare_with_fp32(mxq_path, mblt_path, paths, reporter=as_reporter(callback, cancel_token))


def _classes(items: list[dict[str, Any]]) -> str:
    return ", ".join(f"{item['index']} ({item['score']:.3g})" for item in items)


def results_html(results: list[dict[str, Any]], run_label: str) -> str:
    """One table row per input and output: shape, cosine, SQNR, largest error, and the top classes of class scores."""
    rows = []
    for entry in results:
        for output in entry["outputs"]:
            top = ""
            if output["fp32_top_k"]:
                same = output["fp32_top_k"][0]["index"] == output["mxq_top_k"][0]["index"]
                colour = "#2e7d32" if same else "#c62828"
                top = (f"<span style='color:{colour}'>{_classes(output['mxq_top_k'])}</span><br>"
                       f"<small>FP32: {_classes(output['fp32_top_k'])}</small>")
            rows.append(f"<tr><td>{html.escape(Path(entry['input']).name)}</td><td>{html.escape(output['name'])}</td>"
                        f"<td>{output['shape']}</td><td>{output['cosine']:.5f}</td><td>{output['sqnr_db']:.1f}</td>"
                        f"<td>{output['max_abs_error']:.4g}</td><td>{top}</td></tr>")
    head = "".join(f"<th>{name}</th>" for name in ("input", "output", "shape", "cosine", "SQNR (dB)", "max |error|",
                                                 "top classes, MXQ (FP32 below)"))
    return (f"<p><b>{html.escape(run_label)}</b>: the MXQ on the bit-exact simulator beside the FP32 graph, each input "
            "preprocessed as the calibration data was.</p>"
            f"<table border='1' cellspacing='0' cellpadding='3'><tr>{head}</tr>{''.join(rows)}</table>")


class TryResultsDialog(QDialog):
    """Shows :func:`results_html` (not modal: the workbench stays usable)."""

    def __init__(self, results: list[dict[str, Any]], run_label: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Try on inputs")
        self.resize(820, 420)
        self.browser = QTextBrowser(objectName="tryResults")
        self.browser.setHtml(results_html(results, run_label))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.browser)
        layout.addWidget(buttons)
