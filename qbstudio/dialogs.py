"""Message boxes and small dialogs, as module-level functions so tests can replace them.

Call them as ``dialogs.show_error(...)`` (attribute access at call time), never ``from ... import``,
so a monkeypatched function is the one used.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QVBoxLayout,
    QWidget,
)

from qbstudio.state.model_info import InputShape

logger = logging.getLogger(__name__)


def error_parts(error: BaseException) -> tuple[str, str, str]:
    """``(message, hint, details)`` of an exception; QBCompilerError fields are used when present."""
    code = getattr(error, "code", None)
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    hint = getattr(error, "hint", "") or ""
    fields = getattr(error, "fields", {}) or {}
    details = [f"code: {code}"] if code else [f"type: {type(error).__name__}"]
    details += [f"{key}: {value}" for key, value in fields.items()]
    if not code:
        details.append("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    return message, hint, "\n".join(details)


def show_error(parent: QWidget | None, title: str, error: BaseException | str) -> None:
    """A modal error box: the message, what to do about it, and the details (code, fields, traceback)."""
    if isinstance(error, str):
        message, hint, details = error, "", ""
    else:
        message, hint, details = error_parts(error)
    logger.error("%s: %s %s", title, message, hint)
    box = QMessageBox(QMessageBox.Icon.Critical, title, message, QMessageBox.StandardButton.Ok, parent)
    if hint:
        box.setInformativeText(hint)
    if details:
        box.setDetailedText(details)
    box.exec()


def show_info(parent: QWidget | None, title: str, text: str) -> None:
    """A modal information box."""
    QMessageBox.information(parent, title, text)


def ask_yes_no(parent: QWidget | None, title: str, text: str) -> bool:
    """A Yes/No question; True for Yes."""
    answer = QMessageBox.question(parent, title, text)
    return answer == QMessageBox.StandardButton.Yes


class InputShapesDialog(QDialog):
    """Asks for a static shape for every input with dynamic dimensions.

    Args:
        shapes: The model's inputs (static ones are shown read-only for context).
        parent: Parent widget.
    """

    def __init__(self, shapes: list[InputShape], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Input shapes")
        self._edits: dict[str, QLineEdit] = {}
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Some inputs have dynamic dimensions. Give a static shape for each "
                                "(comma-separated, e.g. 1, 3, 224, 224):", wordWrap=True))
        form = QFormLayout()
        for shape in shapes:
            form.addRow(self._row_label(shape), self._editor(shape))
        layout.addLayout(form)
        self._error = QLabel(styleSheet="color: #c62828")
        layout.addWidget(self._error)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._accept_if_valid)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    @staticmethod
    def _row_label(shape: InputShape) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in shape.dims)
        return f"{shape.name} [{dims}] {shape.dtype}"

    def _editor(self, shape: InputShape) -> QLineEdit:
        edit = QLineEdit(", ".join(str(d) for d in shape.suggested()))
        edit.setReadOnly(not shape.dynamic)
        if shape.dynamic:
            self._edits[shape.name] = edit
        return edit

    def shapes(self) -> dict[str, list[int]]:
        """The entered shapes (raises ValueError for a malformed one)."""
        result = {}
        for name, edit in self._edits.items():
            dims = [int(part) for part in edit.text().replace("x", ",").split(",") if part.strip()]
            if not dims or any(d <= 0 for d in dims):
                raise ValueError(f"{name}: every dimension must be a positive integer")
            result[name] = dims
        return result

    def _accept_if_valid(self) -> None:
        try:
            self.shapes()
        except ValueError as error:
            self._error.setText(str(error))
            return
        self.accept()


def ask_input_shapes(parent: QWidget | None, shapes: list[InputShape]) -> dict[str, list[int]] | None:
    """Show :class:`InputShapesDialog`; the shapes of the dynamic inputs, or None if cancelled."""
    dialog = InputShapesDialog(shapes, parent)
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return None
    return dialog.shapes()


def about_text(extra: dict[str, Any]) -> str:
    """Rich text of the About box."""
    rows = "".join(f"<tr><td><b>{key}</b></td><td>{value}</td></tr>" for key, value in extra.items())
    return ("<h3>qb Studio</h3><p>Open, offline model compiler workbench for Mobilint-style NPUs.</p>"
            f"<table>{rows}</table>")
