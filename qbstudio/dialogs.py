"""Message boxes and small dialogs, as module-level functions so tests can replace them.

Call them as ``dialogs.show_error(...)`` (attribute access at call time), never ``from ... import``,
so a monkeypatched function is the one used.
"""

from __future__ import annotations

import html
import logging
import traceback
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from qbstudio.state.shapes import (
    InputShape,
    dynamic_dim_keys,
    is_scalar_type,
    read_input_answer,
    resolve_shapes,
    suggest_dims,
)
from qbstudio.widgets.wheel_guard import guard_wheel

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


def documents_folder(widget: QWidget | None) -> Path:
    """Where a save dialog of ``widget`` starts: its main window's
    :meth:`~qbstudio.main_window.MainWindow.documents_folder`, else the home folder (a widget on its own)."""
    window = widget.window() if widget is not None else None
    folder = getattr(window, "documents_folder", None)
    return folder() if callable(folder) else Path.home()


def _plain_text_box(icon: QMessageBox.Icon, title: str, message: str, buttons: QMessageBox.StandardButton,
                    parent: QWidget | None) -> QMessageBox:
    """A message box whose main text is shown as written: an error message is never HTML (Qt guesses from the text
    otherwise, and an escaped one showed its entities, ``&#x27;`` for each quote)."""
    box = QMessageBox(icon, title, message, buttons, parent)
    box.setTextFormat(Qt.TextFormat.PlainText)
    return box


def show_error(parent: QWidget | None, title: str, error: BaseException | str) -> None:
    """A modal error box: the message, what to do about it, and the details (code, fields, traceback)."""
    if isinstance(error, str):
        message, hint, details = error, "", ""
    else:
        message, hint, details = error_parts(error)
    logger.error("%s: %s %s", title, message, hint)
    box = _plain_text_box(QMessageBox.Icon.Critical, title, message, QMessageBox.StandardButton.Ok, parent)
    if hint:
        box.setInformativeText(hint)
    if details:
        box.setDetailedText(details)
    box.exec()


def show_info(parent: QWidget | None, title: str, text: str) -> None:
    """A modal information box (built and ``exec``'d like every box here: the tests' guard refuses unanswered ones)."""
    QMessageBox(QMessageBox.Icon.Information, title, text, QMessageBox.StandardButton.Ok, parent).exec()


def ask_yes_no(parent: QWidget | None, title: str, text: str) -> bool:
    """A Yes/No question; True for Yes."""
    buttons = QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No
    return QMessageBox(QMessageBox.Icon.Question, title, text, buttons, parent).exec() == QMessageBox.StandardButton.Yes


def ask_text(parent: QWidget | None, title: str, label: str, text: str = "") -> str | None:
    """One line of text (Enter accepts, Escape cancels); None when cancelled."""
    dialog = QInputDialog(parent, windowTitle=title, labelText=label, textValue=text)
    return dialog.textValue() if dialog.exec() == QDialog.DialogCode.Accepted else None


IMPORT_NEW, IMPORT_REPLACE = "new", "replace"
SAVE, DISCARD = "save", "discard"


def ask_import_choice(parent: QWidget | None, new_model: str, current_model: str) -> str | None:
    """Importing ``new_model`` while ``current_model`` is open: ``new`` project, ``replace``, or None (cancel)."""
    box = QMessageBox(QMessageBox.Icon.Question, "Import model",
                      f"This project holds <b>{html.escape(current_model)}</b>. Import "
                      f"<b>{html.escape(new_model)}</b> into:", QMessageBox.StandardButton.Cancel, parent)
    box.setInformativeText("A new project keeps this one as it is. Replacing the model keeps this project's "
                           "settings (those that depend on the model are re-derived); runs of the current "
                           "model stay in the project file but are not shown for the new model.")
    new = box.addButton("New project", QMessageBox.ButtonRole.AcceptRole)
    replace = box.addButton("Replace the model", QMessageBox.ButtonRole.DestructiveRole)
    box.setDefaultButton(new)
    box.exec()
    return {id(new): IMPORT_NEW, id(replace): IMPORT_REPLACE}.get(id(box.clickedButton()))


def ask_cut_graph(parent: QWidget | None, error: BaseException, cut_at: list[str], *, keep: bool = False) -> bool:
    """The model ends in post-processing a static graph cannot hold: import it up to ``cut_at`` instead? With
    ``keep``: ``cut_at`` are model outputs the unconvertible operators do not feed: import with only those?"""
    box, cut = cut_graph_box(parent, error, cut_at, keep=keep)
    box.exec()
    return box.clickedButton() is cut


def cut_graph_box(parent: QWidget | None, error: BaseException, cut_at: list[str], *,
                  keep: bool = False) -> tuple[QMessageBox, object]:
    """The question of :func:`ask_cut_graph` and its accept button (not shown yet)."""
    message, _, details = error_parts(error)
    names = ", ".join(cut_at)  # plain text: the box shows its informative text in the main text's format
    option = f"--output-names {','.join(cut_at)}"
    box = _plain_text_box(QMessageBox.Icon.Question, "Import model", message, QMessageBox.StandardButton.Cancel, parent)
    if keep:
        box.setInformativeText(f"The model's outputs {names} are computed without these operators. Import the model "
                               f"with only {'this output' if len(cut_at) == 1 else 'these outputs'}? The others "
                               f"are left out (the command line does the same with {option}; File › Choose Model "
                               "Outputs… changes the choice later).")
    else:
        box.setInformativeText(f"Import the model up to {names} instead? Those tensors become its outputs; run the "
                               f"post-processing on them after the MXQ (the command line does the same with {option}).")
    if details:
        box.setDetailedText(details)
    cut = box.addButton("Import with only these outputs" if keep else "Import up to these tensors",
                        QMessageBox.ButtonRole.AcceptRole)
    box.setDefaultButton(cut)
    return box, cut


TOKEN_SHAPE_EXAMPLE = "1, 128"
"""The shape offered for a transformer's token ids: one sequence of 128 tokens (BERT-style encoders' usual length)."""


class ModelInputsDialog(QDialog):
    """Asks for what a torch or TorchScript ``forward`` needs to be traced: each tensor's shape, each scalar's value.

    Args:
        needed: ``{"name", "type", "optional"}`` of each parameter (the error's ``inputs_needed``); an optional
            one (it has a default in forward) may be left empty.
        parent: Parent widget.
        model_name: The model's file name.
        signature: The error's hint, which shows ``forward``'s signature.
    """

    def __init__(self, needed: list[dict[str, str]], parent: QWidget | None = None, model_name: str = "",
                 signature: str = "") -> None:
        super().__init__(parent)
        self.setWindowTitle("Model inputs")
        self.setMinimumWidth(520)
        self._needed = needed
        self.fields: dict[str, QLineEdit] = {}
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(f"To trace <b>{html.escape(model_name)}</b>, the compiler runs its forward once. "
                                "Give the shape of each tensor input and the value of each number (numbers become "
                                "constants of the graph):", wordWrap=True))
        form = QFormLayout()
        from compiler_core.calibration.specs import TOKEN_INPUT_ROLES

        token_names = {name for names in TOKEN_INPUT_ROLES.values() for name in names}
        for item in needed:
            scalar = is_scalar_type(item["type"])
            tokens = item["name"].lower() in token_names  # a transformer's token input: [batch, sequence]
            field = QLineEdit(objectName=f"input:{item['name']}")
            example = TOKEN_SHAPE_EXAMPLE if tokens else "1, 3, 224, 224"
            field.setPlaceholderText(("optional: " if item.get("optional") else "")
                                     + (f"a value ({item['type']})" if scalar else f"shape, e.g. {example}"))
            if tokens and not scalar and not item.get("optional"):
                field.setText(TOKEN_SHAPE_EXAMPLE)  # OK works at once; the sequence length is the user's to change
            field.textChanged.connect(self._validate)
            self.fields[item["name"]] = field
            form.addRow(QLabel(f"<b>{html.escape(item['name'])}</b> <small>({html.escape(item['type'])})</small>"),
                        field)
        layout.addLayout(form)
        if signature:
            layout.addWidget(QLabel(f"<small>{html.escape(signature)}</small>", wordWrap=True))
        self.problem = QLabel(objectName="inputsProblem", styleSheet="color: #c62828;", wordWrap=True)
        layout.addWidget(self.problem)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self._validate()

    def answers(self) -> tuple[dict[str, list[int]], dict[str, Any]]:
        """``(shapes of the tensor inputs, values of the scalar inputs)``.

        Raises:
            ValueError: a field does not hold what its type needs (the message names the input).
        """
        shapes: dict[str, list[int]] = {}
        constants: dict[str, Any] = {}
        for item in self._needed:
            text = self.fields[item["name"]].text()
            if item.get("optional") and not text.strip():
                continue  # forward's default (a tensor input with a default value may also be given)
            try:
                value = read_input_answer(item["type"], text)
            except ValueError as error:
                raise ValueError(f"{item['name']}: expected {error}") from None
            (shapes if isinstance(value, list) else constants)[item["name"]] = value
        return shapes, constants

    def _validate(self) -> None:
        try:
            self.answers()
        except ValueError as error:  # said once something is typed; OK waits for every field
            typed = any(field.text().strip() for field in self.fields.values())
            self.problem.setText(str(error) if typed else "")
            self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(False)
            return
        self.problem.setText("")
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(True)


def ask_model_inputs(parent: QWidget | None, needed: list[dict[str, str]], model_name: str, error: BaseException
                     ) -> tuple[dict[str, list[int]], dict[str, Any]] | None:
    """Show :class:`ModelInputsDialog`: ``(shapes, scalar values)``, or None if cancelled."""
    dialog = ModelInputsDialog(needed, parent, model_name, getattr(error, "hint", ""))
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return None
    return dialog.answers()


def ask_submodule(parent: QWidget | None, error: BaseException, children: list[str]) -> str | None:
    """A TorchScript module that does not convert as a whole: compile one of its ``children`` instead?"""
    box, buttons = submodule_box(parent, error, children)
    box.exec()
    return buttons.get(box.clickedButton())


def submodule_box(parent: QWidget | None, error: BaseException,
                  children: list[str]) -> tuple[QMessageBox, dict[object, str]]:
    """The question of :func:`ask_submodule` and its buttons, by the child each chooses (not shown yet)."""
    message, _, details = error_parts(error)
    box = _plain_text_box(QMessageBox.Icon.Question, "Import model", message, QMessageBox.StandardButton.Cancel, parent)
    box.setInformativeText("A forward that keeps state in attributes or checks its inputs in Python does not "
                           "convert. Compile one of its submodules instead (often the stateless network inside; "
                           "the command line does the same with <code>--submodule NAME</code>):")
    if details:
        box.setDetailedText(details)
    buttons = {box.addButton(name, QMessageBox.ButtonRole.AcceptRole): name for name in children}
    return box, buttons


class ModelOutputsDialog(QDialog):
    """Which of the model's outputs to keep: the graph is cut to them (what only the others need goes).

    Args:
        outputs: ``(name, shape)`` of the graph's outputs now.
        cut: Whether the graph is already cut (then "Keep every output of the source model" undoes it).
        parent: Parent widget.
    """

    ALL_OUTPUTS = object()
    """:meth:`chosen` when the user asks for every output of the source model back."""

    def __init__(self, outputs: list[tuple[str, list[int]]], cut: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Model outputs")
        self.setMinimumWidth(480)  # the explanation in three lines, not six
        self._restore = False
        layout = QVBoxLayout(self)
        intro = QLabel("Keep the outputs you use. The model is parsed again up to them: layers that only the other "
                       "outputs need are removed, and accuracy is measured on the kept ones (the command line does the "
                       "same with <code>--output-names</code>).")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.list = QListWidget()
        for name, shape in outputs:
            item = QListWidgetItem(f"{name}  {shape}")
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked)
            self.list.addItem(item)
        self.list.itemChanged.connect(self._update)
        layout.addWidget(self.list)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        if cut:
            restore = buttons.addButton("Keep every output of the source model", QDialogButtonBox.ButtonRole.ResetRole)
            restore.clicked.connect(self._on_restore)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.ok_button = buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.note = QLabel()
        layout.addWidget(self.note)
        layout.addWidget(buttons)
        self._update()

    def _items(self) -> list[QListWidgetItem]:
        return [self.list.item(row) for row in range(self.list.count())]

    def _update(self) -> None:
        kept = sum(item.checkState() == Qt.CheckState.Checked for item in self._items())
        self.ok_button.setEnabled(0 < kept < self.list.count())
        self.note.setText("Keep at least one output." if kept == 0 else
                          "Untick the outputs you do not use." if kept == self.list.count() else
                          f"{kept} of {self.list.count()} output(s) kept.")

    def _on_restore(self) -> None:
        self._restore = True
        self.accept()

    def chosen(self) -> list[str] | object:
        """The ticked output names, or :attr:`ALL_OUTPUTS`."""
        if self._restore:
            return self.ALL_OUTPUTS
        return [item.data(Qt.ItemDataRole.UserRole) for item in self._items()
                if item.checkState() == Qt.CheckState.Checked]


def ask_model_outputs(parent: QWidget | None, outputs: list[tuple[str, list[int]]], cut: bool
                      ) -> list[str] | object | None:
    """:class:`ModelOutputsDialog`: the outputs to keep, :attr:`ModelOutputsDialog.ALL_OUTPUTS`, or None (cancelled)."""
    dialog = ModelOutputsDialog(outputs, cut, parent)
    return dialog.chosen() if dialog.exec() == QDialog.DialogCode.Accepted else None


def ask_save_changes(parent: QWidget | None, project_name: str, why: str) -> str | None:
    """Unsaved work before ``why`` (e.g. "closing"): ``save``, ``discard`` or None (cancel)."""
    box = QMessageBox(QMessageBox.Icon.Question, "Unsaved project",
                      f"'{project_name}' has runs or changes that are not saved in a project file. Save it before "
                      f"{why}?", QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Discard
                      | QMessageBox.StandardButton.Cancel, parent)
    box.setDefaultButton(QMessageBox.StandardButton.Save)
    answer = box.exec()
    return {QMessageBox.StandardButton.Save: SAVE, QMessageBox.StandardButton.Discard: DISCARD}.get(answer)


class InputShapesDialog(QDialog):
    """Asks once for every dynamic dimension; inputs sharing a symbolic dim share its value.

    Each field starts at a value suggested from the dim's name, its position and the model's name
    (:func:`qbstudio.state.model_info.suggest_dims`), so OK works at once for common models.

    Args:
        shapes: The model's inputs (static ones are listed for context).
        parent: Parent widget.
        model_name: The model's file name (a detector's name suggests 640-pixel images).
    """

    def __init__(self, shapes: list[InputShape], parent: QWidget | None = None, model_name: str = "") -> None:
        super().__init__(parent)
        self.setWindowTitle("Input shapes")
        self._shapes = shapes
        self.spins: dict[str, QSpinBox] = {}
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("The model has dynamic dimensions. The compiler needs one static value for each "
                                "(inputs that share a named dimension share its value):", wordWrap=True))
        layout.addLayout(self._dim_form(suggest_dims(shapes, model_name), dynamic_dim_keys(shapes)))
        layout.addWidget(QLabel("<b>Resulting input shapes</b>"))
        self.preview = QLabel(objectName="shapePreview", textFormat=Qt.TextFormat.RichText)
        layout.addWidget(self.preview)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self._update_preview()
        guard_wheel(self)

    def _dim_form(self, values: dict[str, int], users: dict[str, list[str]]) -> QFormLayout:
        form = QFormLayout()
        for key, value in values.items():
            spin = QSpinBox(minimum=1, maximum=1_000_000, value=value, objectName=f"dim:{key}")
            spin.valueChanged.connect(self._update_preview)
            self.spins[key] = spin
            form.addRow(QLabel(f"<b>{html.escape(key)}</b> <small>({html.escape(', '.join(users[key]))})</small>"),
                        spin)
        return form

    def values(self) -> dict[str, int]:
        """Dynamic dim key -> the value entered."""
        return {key: spin.value() for key, spin in self.spins.items()}

    def shapes(self) -> dict[str, list[int]]:
        """The static shape of every dynamic input."""
        return resolve_shapes(self._shapes, self.values())

    def _update_preview(self) -> None:
        resolved = self.shapes()
        rows = []
        for shape in self._shapes:
            dims = resolved.get(shape.name, list(shape.dims))
            declared = ", ".join("?" if d is None else str(d) for d in shape.dims)
            rows.append(f"{html.escape(shape.name)}: [{declared}] &rarr; <b>{dims}</b> {shape.dtype}")
        self.preview.setText("<br>".join(rows))


def ask_input_shapes(parent: QWidget | None, shapes: list[InputShape], model_name: str = ""
                     ) -> dict[str, list[int]] | None:
    """Show :class:`InputShapesDialog`; the shapes of the dynamic inputs, or None if cancelled."""
    dialog = InputShapesDialog(shapes, parent, model_name)
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return None
    return dialog.shapes()


def about_text(extra: dict[str, Any]) -> str:
    """Rich text of the About box."""
    rows = "".join(f"<tr><td><b>{key}</b></td><td>{value}</td></tr>" for key, value in extra.items())
    return ("<h3>qb Studio</h3><p>Open, offline model compiler workbench for Mobilint-style NPUs.</p>"
            f"<table>{rows}</table>")


class LlmCompileDialog(QDialog):
    """What compiling a decoder LLM needs: calibration text, preset, prefill length, KV-cache length, windows.

    Args:
        model_name: The model's file or folder name.
        device: The target device (the toolbar's).
        request: The previous answers (:class:`qbstudio.tasks.LlmCompileRequest`), shown again.
        max_cache: The device's longest KV cache (None: not limited).
        parent: Parent widget.
    """

    def __init__(self, model_name: str, device: str, request: Any, max_cache: int | None = None,
                 parent: QWidget | None = None) -> None:
        from compiler_core.config.presets import PRESETS
        from qbstudio.tasks import LLM_PRESETS

        super().__init__(parent)
        self.setWindowTitle("Compile a decoder LLM")
        self.setMinimumWidth(560)
        self._request = request
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(
            f"<b>{html.escape(model_name)}</b> compiles for <b>{html.escape(device)}</b> to a prefill MXQ, a decode "
            "MXQ and a manifest (<code>.llm.json</code>) that Try a Compiled LLM runs. Calibration runs the FP32 "
            "model on windows of your text; a model of 100M+ parameters takes many minutes.", wordWrap=True))
        form = QFormLayout()
        self.text_edit = QLineEdit(request.text_path, objectName="llmCalibrationText")
        self.text_edit.setPlaceholderText("a plain UTF-8 text file in the model's language")
        self.text_edit.textChanged.connect(self._validate)
        browse = QPushButton("Choose…")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.text_edit, 1)
        row.addWidget(browse)
        form.addRow("Calibration text", row)
        self.preset_combo = QComboBox(objectName="llmPreset")
        for name in LLM_PRESETS:
            self.preset_combo.addItem(name, name)
            self.preset_combo.setItemData(self.preset_combo.count() - 1, PRESETS[name].description,
                                          Qt.ItemDataRole.ToolTipRole)
        self.preset_combo.setCurrentIndex(max(self.preset_combo.findData(request.preset), 0))
        form.addRow("Preset", self.preset_combo)
        self.prefill_spin = QSpinBox(objectName="llmPrefillLen", minimum=1, maximum=4096, value=request.prefill_len)
        self.prefill_spin.setToolTip("Tokens per prefill call; longer prompts are prefilled in chunks")
        form.addRow("Prefill tokens", self.prefill_spin)
        self.cache_spin = QSpinBox(objectName="llmMaxLen", minimum=2, maximum=max_cache or 131072,
                                   value=min(request.max_len, max_cache or request.max_len))
        self.cache_spin.setToolTip("KV-cache positions: the longest prompt plus generation"
                                   + (f" ({device} allows {max_cache})" if max_cache else ""))
        form.addRow("KV-cache length", self.cache_spin)
        self.windows_spin = QSpinBox(objectName="llmWindows", minimum=1, maximum=1024, value=request.num_samples)
        self.windows_spin.setToolTip("Calibration windows of 'prefill tokens' tokens taken from the text")
        form.addRow("Calibration windows", self.windows_spin)
        for spin in (self.prefill_spin, self.cache_spin, self.windows_spin):
            guard_wheel(spin)
            spin.valueChanged.connect(self._validate)
        layout.addLayout(form)
        self.problem = QLabel(objectName="llmProblem", styleSheet="color: #c62828;", wordWrap=True)
        layout.addWidget(self.problem)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Compile")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self._validate()

    def answers(self) -> Any:
        """The :class:`qbstudio.tasks.LlmCompileRequest` of the form."""
        from dataclasses import replace

        return replace(self._request, text_path=self.text_edit.text().strip(),
                       preset=self.preset_combo.currentData(), prefill_len=self.prefill_spin.value(),
                       max_len=self.cache_spin.value(), num_samples=self.windows_spin.value())

    def problem_text(self) -> str:
        """Why the form cannot be compiled as it is ("" when it can)."""
        from pathlib import Path

        answers = self.answers()
        if not answers.text_path:
            return ""  # nothing typed yet: Compile waits, nothing to complain about
        path = Path(answers.text_path)
        if not path.is_file():
            return f"No file at '{path}'."
        if path.stat().st_size == 0:
            return f"'{path.name}' is empty."
        if answers.prefill_len >= answers.max_len:
            return "The KV cache must hold more positions than one prefill call."
        return ""

    def _validate(self) -> None:
        problem = self.problem_text()
        self.problem.setText(problem)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(
            not problem and bool(self.text_edit.text().strip()))

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Calibration text", self.text_edit.text(),
                                              "Text (*.txt *.md);;All files (*)")
        if path:
            self.text_edit.setText(path)


def ask_llm_compile(parent: QWidget | None, model_name: str, device: str, request: Any,
                    max_cache: int | None = None) -> Any:
    """Show :class:`LlmCompileDialog`: the :class:`qbstudio.tasks.LlmCompileRequest`, or None if cancelled."""
    dialog = LlmCompileDialog(model_name, device, request, max_cache, parent)
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return None
    return dialog.answers()


def open_llm_try(parent: QWidget | None, manifest: str | None = None) -> QDialog:
    """The non-modal Try a Compiled LLM window, on ``manifest`` when given."""
    from qbstudio.widgets import llm_try

    return llm_try.show_dialog(parent, manifest)
