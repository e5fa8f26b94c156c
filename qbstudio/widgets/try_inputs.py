"""The results of "Try on inputs…": a compiled run's outputs on the user's own inputs, beside FP32."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFileDialog, QTextBrowser, QVBoxLayout, QWidget

from compiler_core.calibration.readers import file_patterns
from compiler_core.progress import as_reporter
from qbstudio.widgets.screen_fit import resize_within_screen


def try_inputs_filter(input_count: int) -> str:
    """The file dialog filter of "Try on inputs…": one file per sample feeds one input; a model with several inputs
    needs a manifest (or a list of them), as its calibration data does."""
    single = f"Images, recordings or arrays ({file_patterns()})"
    lists = "Calibration lists or manifests (*.txt *.json)"
    if input_count > 1:
        return f"Manifests, one entry per sample (*.json);;{lists};;All files (*)"
    return f"{single};;{lists};;All files (*)"


def compare_job(mxq_path: str, mblt_path: str, paths: list[str], *, callback=None, cancel_token=None
                ) -> list[dict[str, Any]]:
    """``compiler_core.runtime.inputs.compare_with_fp32`` as a worker job."""
    from compiler_core.runtime.inputs import compare_with_fp32

    return compare_with_fp32(mxq_path, mblt_path, paths, reporter=as_reporter(callback, cancel_token))


def _classes(items: list[dict[str, Any]], labels: list[str]) -> str:
    return ", ".join(f"{html.escape(labels[item['index']]) if item['index'] < len(labels) else item['index']} "
                     f"({item['score']:.3g})" for item in items)


def _cosine(value: float | None) -> str:
    return "—" if value is None else f"{value:.5f}"  # None: a one-element output (its cosine is only its sign)


def results_html(results: list[dict[str, Any]], run_label: str, labels: list[str] | None = None) -> str:
    """One table row per input and output: shape, cosine, SQNR, largest error, and the top classes of class scores."""
    rows = []
    classes = any(output["fp32_top_k"] for entry in results for output in entry["outputs"])  # else no such column
    for entry in results:
        if entry.get("error"):  # a file that could not be read: the others ran
            rows.append(f"<tr><td title='{html.escape(entry['input'])}'>{html.escape(entry['label'])}</td>"
                        f"<td colspan='{6 if classes else 5}' style='color:#c62828'>{html.escape(entry['error'])}"
                        "</td></tr>")
        for output in entry["outputs"]:
            top = ""
            if output["fp32_top_k"]:
                same = output["fp32_top_k"][0]["index"] == output["mxq_top_k"][0]["index"]
                colour = "#2e7d32" if same else "#c62828"
                top = (f"<span style='color:{colour}'>{_classes(output['mxq_top_k'], labels or [])}</span><br>"
                       f"<small>FP32: {_classes(output['fp32_top_k'], labels or [])}</small>")
            rows.append(f"<tr><td title='{html.escape(entry['input'])}'>{html.escape(entry['label'])}</td><td>{html.escape(output['name'])}</td>"
                        f"<td>{output['shape']}</td><td>{_cosine(output['cosine'])}</td><td>{output['sqnr_db']:.1f}</td>"
                        f"<td>{output['max_abs_error']:.4g}</td>" + (f"<td>{top}</td>" if classes else "") + "</tr>")
    head = "".join(f"<th>{name}</th>" for name in ("input", "output", "shape", "cosine", "SQNR (dB)", "max |error|",
                                                 "top classes, MXQ (FP32 below)")[:7 if classes else 6])
    return (f"<p><b>{html.escape(run_label)}</b>: the MXQ on the bit-exact simulator beside the FP32 graph, each input "
            "preprocessed as the calibration data was.</p>"
            f"<table border='1' cellspacing='0' cellpadding='3'><tr>{head}</tr>{''.join(rows)}</table>")


class TryResultsDialog(QDialog):
    """Shows :func:`results_html` (not modal: the workbench stays usable); "Class names…" reads a labels file (one
    name per line, as ``qbcompiler run --labels``) to name the classes."""

    def __init__(self, results: list[dict[str, Any]], run_label: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Try on inputs")
        resize_within_screen(self, 820, 420)
        self.results, self.run_label = results, run_label
        self.browser = QTextBrowser(objectName="tryResults")
        self.browser.setHtml(results_html(results, run_label))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        if any(output["fp32_top_k"] for entry in results for output in entry["outputs"]):
            names = buttons.addButton("Class names…", QDialogButtonBox.ButtonRole.ActionRole)
            names.clicked.connect(self._on_labels)
        layout = QVBoxLayout(self)
        layout.addWidget(self.browser)
        layout.addWidget(buttons)

    def _on_labels(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Class names, one per line", "", "Text (*.txt);;All files (*)")
        if path:
            self.show_labels(path)

    def show_labels(self, path: str | Path) -> None:
        """Name the classes with the lines of ``path``."""
        try:
            labels = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            from qbstudio import dialogs

            dialogs.show_error(self, "Cannot read the class names", f"'{path}' cannot be read: {error}")
            return
        self.browser.setHtml(results_html(self.results, self.run_label, labels))
