"""The "Try it" box of a compiled LLM: generate from a prompt with the MXQ beside the FP32 reference.

Both generations are greedy from the same prompt; the compiled model runs on the simulator, the
reference on the FP32 ONNX exports written beside the ``.llm.json``. Tokens from the first divergence
on are highlighted (compiled: red, FP32: blue). Generation runs in a background job with progress per
token and Cancel.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from compiler_core.errors import QBCompilerError
from compiler_core.progress import ProgressEvent
from qbstudio.widgets.screen_fit import resize_within_screen
from qbstudio.workers import JobRunner, Worker

logger = logging.getLogger(__name__)

DIVERGED_MXQ = "#ffd2d2"
DIVERGED_FP32 = "#d2e2ff"
_SLOT = "llm"


def generate_both(manifest: str, prompt: str, max_new_tokens: int, *, callback=None, cancel_token=None
                  ) -> dict[str, Any]:
    """Greedy generations of the MXQ (simulator) and the FP32 reference, with their token texts.

    Returns:
        ``{"mxq": [piece, ...], "fp32": [piece, ...], "divergence": index, "seconds_per_token": float}``.
    """
    from compiler_core.runtime.llm import LlmModel, first_divergence

    compiled = LlmModel(manifest)
    tokenizer = compiled.tokenizer()
    if tokenizer is None:
        raise QBCompilerError(f"{Path(manifest).name} has no tokenizer, so a text prompt cannot be encoded.",
                              hint="Compile from a GGUF file or a transformers folder that has a tokenizer.")
    ids = tokenizer(prompt)["input_ids"]
    runs = {}
    for index, (key, model) in enumerate((("mxq", compiled), ("fp32", LlmModel(manifest, reference=True)))):
        tokens = []
        for token in model.stream(ids, max_new_tokens):
            tokens.append(token)
            if cancel_token is not None:
                cancel_token.raise_if_cancelled("generate")
            if callback is not None:
                callback(ProgressEvent("generate", index * max_new_tokens + len(tokens), 2 * max_new_tokens,
                                       f"{key}: {len(tokens)} tokens"))
        runs[key] = tokens
    return {"mxq": token_pieces(tokenizer, runs["mxq"]), "fp32": token_pieces(tokenizer, runs["fp32"]),
            "divergence": first_divergence(runs["mxq"], runs["fp32"]), "prompt_tokens": len(ids)}


def token_pieces(tokenizer, tokens: list[int]) -> list[str]:
    """The text each token adds when the sequence is decoded left to right."""
    pieces, text = [], ""
    for end in range(1, len(tokens) + 1):
        decoded = tokenizer.decode(tokens[:end], skip_special_tokens=True)
        pieces.append(decoded[len(text):])
        text = decoded
    return pieces


def pieces_html(pieces: list[str], divergence: int, colour: str) -> str:
    """Tokens as HTML; from ``divergence`` on, each with a background colour."""
    parts = []
    for index, piece in enumerate(pieces):
        text = html.escape(piece).replace("\n", "<br>")
        parts.append(f'<span style="background-color:{colour}">{text}</span>' if index >= divergence else text)
    return "".join(parts)


class LlmTryPanel(QWidget):
    """Pick an ``.llm.json``, type a prompt, Generate: MXQ and FP32 text side by side."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = JobRunner(self)
        self.manifest_edit = QLineEdit(objectName="llmManifest", placeholderText="compiled LLM (.llm.json)")
        self.browse_button = QPushButton("Open…", objectName="llmBrowse")
        self.browse_button.clicked.connect(self.browse)
        self.prompt_edit = QLineEdit("Once upon a time", objectName="llmPrompt")
        self.prompt_edit.returnPressed.connect(self.generate)
        self.tokens_spin = QSpinBox(objectName="llmTokens", minimum=1, maximum=1024, value=32)
        self.generate_button = QPushButton("Generate", objectName="llmGenerate")
        self.generate_button.clicked.connect(self.generate)
        self.cancel_button = QPushButton("Cancel", objectName="llmCancel", enabled=False)
        self.cancel_button.clicked.connect(lambda: self.runner.cancel(_SLOT))
        self.progress = QProgressBar(objectName="llmProgress")
        self.status = QLabel("", objectName="llmStatus", wordWrap=True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.mxq_view = QTextBrowser(objectName="llmMxqText")
        self.fp32_view = QTextBrowser(objectName="llmFp32Text")
        self._build()

    def _build(self) -> None:
        source = QHBoxLayout()
        source.addWidget(self.manifest_edit, 1)
        source.addWidget(self.browse_button)
        prompt = QHBoxLayout()
        prompt.addWidget(QLabel("Prompt:"))
        prompt.addWidget(self.prompt_edit, 1)
        prompt.addWidget(QLabel("New tokens:"))
        prompt.addWidget(self.tokens_spin)
        prompt.addWidget(self.generate_button)
        prompt.addWidget(self.cancel_button)
        texts = QGridLayout()
        texts.addWidget(QLabel("<b>Compiled MXQ</b> (simulator; red from the first divergence)"), 0, 0)
        texts.addWidget(QLabel("<b>FP32 reference</b> (blue from the first divergence)"), 0, 1)
        texts.addWidget(self.mxq_view, 1, 0)
        texts.addWidget(self.fp32_view, 1, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(source)
        layout.addLayout(prompt)
        layout.addWidget(self.progress)
        layout.addLayout(texts, 1)
        layout.addWidget(self.status)

    def browse(self) -> None:
        """Choose the ``.llm.json`` of a compiled LLM."""
        path, _ = QFileDialog.getOpenFileName(self, "Open a compiled LLM", "", "Compiled LLM (*.llm.json)")
        if path:
            self.manifest_edit.setText(path)

    def generate(self) -> None:
        """Start both generations in the background."""
        manifest, prompt = self.manifest_edit.text().strip(), self.prompt_edit.text()
        if not manifest:
            self._show_status("Choose a compiled LLM (.llm.json) first.", error=True)
            return
        if self.runner.is_busy(_SLOT):
            return
        worker = Worker("generate", generate_both, manifest, prompt, self.tokens_spin.value())
        worker.progress.connect(self._on_progress)
        worker.succeeded.connect(self.show_result)
        worker.failed.connect(lambda error: self._show_status(_error_text(error), error=True))
        worker.cancelled.connect(lambda: self._show_status("Cancelled."))
        worker.finished.connect(lambda: self._set_busy(False))
        self._set_busy(True)
        self._show_status("Generating…")
        self.runner.start(_SLOT, worker)

    def show_result(self, result: dict[str, Any]) -> None:
        """Show both generations, highlighted from the first divergence."""
        divergence = result["divergence"]
        self.mxq_view.setHtml(pieces_html(result["mxq"], divergence, DIVERGED_MXQ))
        self.fp32_view.setHtml(pieces_html(result["fp32"], divergence, DIVERGED_FP32))
        total = max(len(result["mxq"]), len(result["fp32"]))
        same = "identical" if divergence >= total else f"the same for the first {divergence} of {total} tokens"
        self._show_status(f"Prompt of {result['prompt_tokens']} tokens; the generations are {same}.")

    def _on_progress(self, event: ProgressEvent) -> None:
        self.progress.setRange(0, max(event.total, 1))
        self.progress.setValue(event.done)

    def _set_busy(self, busy: bool) -> None:
        self.generate_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)

    def _show_status(self, text: str, *, error: bool = False) -> None:
        self.status.setStyleSheet("color: #b00020" if error else "")
        self.status.setText(text)


def _error_text(error: BaseException) -> str:
    if isinstance(error, QBCompilerError):
        return str(error)  # the message and its hint
    return f"Generation failed: {type(error).__name__}: {error}"


def show_dialog(parent: QWidget | None = None, manifest: str | None = None) -> QDialog:
    """A non-modal "Try an LLM" window holding an :class:`LlmTryPanel`."""
    dialog = QDialog(parent, objectName="llmTryDialog")
    dialog.setWindowTitle("Try a Compiled LLM")
    resize_within_screen(dialog, 980, 560)
    panel = LlmTryPanel(dialog)
    if manifest:
        panel.manifest_edit.setText(manifest)
    layout = QVBoxLayout(dialog)
    layout.addWidget(panel)
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, dialog)  # Escape alone closed it
    buttons.rejected.connect(dialog.reject)
    layout.addWidget(buttons)
    dialog.panel = panel
    dialog.show()
    return dialog
