"""The workbench window: menus, toolbar, docks and tabs, wired to the project and the background jobs.

Over 500 lines because it is the one place where every panel meets the project: each method is
one user action or one job outcome; the panels and the Qt-free state hold the logic.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import (
    QComboBox,
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from compiler_core import __version__ as core_version
from compiler_core.calibration import input_specs
from compiler_core.errors import QBCompilerError
from compiler_core.fileio import sha256_file
from compiler_core.frontends import detect_backend
from compiler_core.targets import check_support
from qbstudio import dialogs
from qbstudio._compat import guard_none_refcount
from qbstudio.process_jobs import run_in_process, warm_up
from qbstudio.state.model_info import dynamic_inputs, node_info, onnx_input_shapes
from qbstudio.state.preferences import AppDirs, Preferences
from qbstudio.state.project import PROJECT_SUFFIX, ModelRef, Project
from qbstudio.state.runs import RunRecord
from qbstudio.state.settings import devices
from qbstudio.tasks import CompileOutcome, LoadedModel, open_mblt, parse_model
from qbstudio.widgets import setup_check
from qbstudio.widgets.calibration_panel import CalibrationPanel
from qbstudio.widgets.compare_view import CompareView
from qbstudio.widgets.graph_view import GraphView, statuses_from_report
from qbstudio.widgets.log_dock import LogDock, QtLogHandler
from qbstudio.widgets.node_details import NodeDetails
from qbstudio.widgets.options_panel import OptionsPanel
from qbstudio.widgets.run_panel import RunPanel
from qbstudio.widgets.summary import open_folder
from qbstudio.widgets.support_panel import SupportPanel
from qbstudio.workers import JobRunner, Worker

logger = logging.getLogger(__name__)

MODEL_FILTER = "Models (*.onnx *.mblt *.tflite);;All files (*)"
PROJECT_FILTER = f"qb Studio project (*{PROJECT_SUFFIX})"
OPEN_FILTER = f"Projects and models (*{PROJECT_SUFFIX} *.onnx *.mblt *.tflite);;All files (*)"
AUTOSAVE_DELAY_MS = 1500
COMPILE_TARGET = "qbstudio.tasks:compile_run"
TABS = ("Graph", "Calibration", "Compile", "Runs && Compare")


class MainWindow(QMainWindow):
    """The qb Studio main window.

    Args:
        dirs: Where preferences, logs, untitled work folders and autosaves go.
        preferences: Loaded preferences (read from ``dirs`` if omitted).

    Signals:
        model_ready(): a model was parsed/loaded and the panels show it.
        compile_finished(str): a compile ended: ``done``, ``cancelled`` or ``failed``.
        project_loaded(): a project was opened and its model (if any) is loading.
    """

    model_ready = Signal()
    compile_finished = Signal(str)
    project_loaded = Signal()

    def __init__(self, dirs: AppDirs | None = None, preferences: Preferences | None = None) -> None:
        super().__init__()
        guard_none_refcount()
        self.dirs = dirs or AppDirs.default()
        self.preferences = preferences or Preferences.load(self.dirs.preferences_file)
        self.runner = JobRunner(self)
        self.project = self._untitled_project()
        self.loaded: LoadedModel | None = None
        self.report: Any = None
        self._outcomes: dict[str, str] = {}
        self.setWindowTitle("qb Studio")
        self.setAcceptDrops(True)
        self._autosave_timer = QTimer(self, singleShot=True, interval=AUTOSAVE_DELAY_MS)
        self._autosave_timer.timeout.connect(self.autosave)
        self._build_widgets()
        self._build_actions()
        self._build_menus()
        self._build_toolbar()
        self._connect()
        self._restore_layout()
        self._show_project()

    # ================================================================== building

    def _build_widgets(self) -> None:
        self.graph = GraphView()
        self.calibration = CalibrationPanel(self.runner)
        self.options = OptionsPanel()
        self.run_panel = RunPanel()
        self.compare = CompareView()
        self.tabs = QTabWidget(objectName="mainTabs", documentMode=True)
        self.tabs.addTab(self.graph, "Graph")
        self.tabs.addTab(self.calibration, "Calibration")
        self.tabs.addTab(self._compile_tab(), "Compile")
        self.tabs.addTab(self.compare, "Runs && Compare")
        self.setCentralWidget(self.tabs)
        self._build_layers_dock()
        self.log_handler = QtLogHandler(self)
        logging.getLogger().addHandler(self.log_handler)
        self.log_dock = LogDock(self.log_handler, self)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.log_dock)
        self.status_label = QLabel()
        self.statusBar().addPermanentWidget(self.status_label)

    def _compile_tab(self) -> QWidget:
        scroll = QScrollArea(widgetResizable=True)
        scroll.setWidget(self.options)
        scroll.setMinimumWidth(440)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(scroll)
        splitter.addWidget(self.run_panel)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([480, 700])
        return splitter

    def _build_layers_dock(self) -> None:
        self.model_label = QLabel(wordWrap=True, objectName="modelLabel")
        self.support = SupportPanel()
        self.details = NodeDetails()
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self.support)
        splitter.addWidget(self.details)
        splitter.setSizes([420, 260])
        holder = QWidget()
        layout = QVBoxLayout(holder)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.model_label)
        layout.addWidget(splitter, 1)
        self.layers_dock = QDockWidget("Model && layer support", self, objectName="layersDock")
        self.layers_dock.setWidget(holder)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.layers_dock)

    def _action(self, text: str, slot: Any, shortcut: Any = None, tip: str = "") -> QAction:
        action = QAction(text, self)
        action.triggered.connect(slot)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.setStatusTip(tip)
        return action

    def _build_actions(self) -> None:
        keys = QKeySequence.StandardKey
        self.act_new = self._action("&New Project", self.new_project, keys.New, "Start an empty project")
        self.act_open = self._action("&Open…", self._on_open, keys.Open, "Open a project or a model")
        self.act_import = self._action("&Import Model…", self._on_import, "Ctrl+I", "Import a model into this project")
        self.act_save = self._action("&Save Project", self._on_save, keys.Save, "Save the project")
        self.act_save_as = self._action("Save Project &As…", self._on_save_as, keys.SaveAs)
        self.act_load_config = self._action("Load Compile Config…", self.options.ask_load_config)
        self.act_save_config = self._action("Save Compile Config…", self.options.ask_save_config)
        self.act_quit = self._action("&Quit", self.close, keys.Quit)
        self.act_compile = self._action("&Compile", self.start_compile, "F5", "Quantize and compile to an MXQ")
        self.act_cancel = self._action("Ca&ncel", self.cancel_jobs, "Ctrl+.", "Cancel the running job")
        self.act_cancel.setEnabled(False)
        self.act_about = self._action("&About qb Studio", self.show_about)
        self.act_about_qt = self._action("About &Qt", lambda: QMessageBox.aboutQt(self))
        self.act_logs = self._action("Open &Log Folder", lambda: self._open_folder(self.dirs.log_file))

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        file_menu.addActions([self.act_new, self.act_open, self.act_import])
        self.recent_projects_menu = file_menu.addMenu("Recent &Projects")
        self.recent_models_menu = file_menu.addMenu("Recent &Models")
        file_menu.addSeparator()
        file_menu.addActions([self.act_save, self.act_save_as])
        file_menu.addSeparator()
        file_menu.addActions([self.act_load_config, self.act_save_config])
        file_menu.addSeparator()
        file_menu.addAction(self.act_quit)
        compile_menu = bar.addMenu("&Compile")
        compile_menu.addActions([self.act_compile, self.act_cancel])
        view_menu = bar.addMenu("&View")
        for index, title in enumerate(TABS):
            view_menu.addAction(self._action(title.replace("&&", "&"), lambda _=False, i=index: self.tabs.setCurrentIndex(i),
                                             f"Ctrl+{index + 1}"))
        view_menu.addSeparator()
        view_menu.addActions([self.layers_dock.toggleViewAction(), self.log_dock.toggleViewAction()])
        help_menu = bar.addMenu("&Help")
        help_menu.addActions([self.act_about, self.act_about_qt, self.act_logs])
        help_menu.addAction(self._action("Check My &Setup…", lambda: setup_check.show_dialog(self, self.dirs)))
        self._fill_recent_menus()

    def _build_toolbar(self) -> None:
        toolbar = self.addToolBar("Main")
        toolbar.setObjectName("mainToolbar")
        toolbar.addActions([self.act_open, self.act_import, self.act_save])
        toolbar.addSeparator()
        toolbar.addWidget(QLabel(" Device "))
        self.device_combo = QComboBox(objectName="toolbarDevice")
        self.device_combo.addItems(devices())
        self.device_combo.setToolTip("Target device: nodes are coloured by support on it")
        self.device_combo.textActivated.connect(self.set_device)
        toolbar.addWidget(self.device_combo)
        toolbar.addSeparator()
        toolbar.addActions([self.act_compile, self.act_cancel])

    def _connect(self) -> None:
        self.graph.node_selected.connect(self._on_graph_selection)
        self.graph.node_context_requested.connect(self._on_node_context)
        self.graph.load_failed.connect(lambda text: self.statusBar().showMessage(f"Graph: {text}", 8000))
        self.support.node_activated.connect(self._on_support_selection)
        self.options.changed.connect(self._on_settings_changed)
        self.options.device_changed.connect(self._on_device_changed)
        self.calibration.changed.connect(self._on_calibration_changed)
        self.run_panel.compile_requested.connect(self.start_compile)
        self.run_panel.cancel_requested.connect(lambda: self.runner.cancel("compile"))
        self.compare.run_selected.connect(lambda run_id: self.run_panel.summary.show_run(self.project.runs.get(run_id)))
        self.runner.busy_changed.connect(self._on_busy_changed)

    # ================================================================== project lifecycle

    def _untitled_project(self) -> Project:
        return Project.new("Untitled", self.dirs.untitled_dir / uuid.uuid4().hex[:12])

    def new_project(self) -> None:
        """Start an empty, untitled project (the current one is autosaved first)."""
        if not self._idle("start a new project"):
            return
        self.autosave()
        self._set_project(self._untitled_project())

    def _set_project(self, project: Project) -> None:
        self.project = project
        self.loaded, self.report = None, None
        self.graph.clear()
        self._show_project()

    def _show_project(self) -> None:
        project = self.project
        self.options.set_settings(project.settings)
        self.device_combo.setCurrentText(project.settings.device)
        self.calibration.set_context(project.calibration, project.settings, project.work_dir, self._specs())
        self.compare.set_history(project.runs)
        self.run_panel.summary.show_run(project.runs.latest)
        self.support.set_report(None)
        self.details.clear()
        self._update_title()
        self._update_model_label()
        self._update_can_compile()

    def open_path(self, path: str | Path) -> None:
        """Open a project (``.qbproj``) or import a model, by file type."""
        path = Path(path)
        if path.suffix.lower() == PROJECT_SUFFIX:
            self.open_project(path)
        else:
            self.import_model(path)

    def open_project(self, path: str | Path) -> bool:
        """Open a project file and restore its model, graph, calibration, settings and runs."""
        if not self._idle("open a project"):
            return False
        self.autosave()
        try:
            project = Project.load(path, scratch_dir=self.dirs.untitled_dir / uuid.uuid4().hex[:12])
        except QBCompilerError as error:
            dialogs.show_error(self, "Cannot open project", error)
            return False
        self._set_project(project)
        if not project.template:
            self.preferences.add_recent_project(path)
            self._remember("project", path)
        self._restore_model()
        self.project_loaded.emit()
        return True

    def _restore_model(self) -> None:
        model = self.project.model
        if model is None:
            return
        if not Path(model.path).exists():
            dialogs.show_error(self, "Model not found", f"The project's model '{model.path}' does not exist.")
            return
        if self.project.has_mblt and not model.changed_on_disk():
            self._start_model_job("open", open_mblt, self.project.mblt_path)
            return
        if model.changed_on_disk():
            logger.warning("%s changed since it was imported; parsing it again", model.path)
        self._start_parse(model)

    def _idle(self, what: str) -> bool:
        if self.runner.is_busy("compile") or self.runner.is_busy("model"):
            self.statusBar().showMessage(f"Cannot {what} while a job runs; cancel it first.", 6000)
            return False
        return True

    # ================================================================== model import

    def import_model(self, path: str | Path, input_shapes: dict[str, list[int]] | None = None) -> bool:
        """Import a model: detect its backend, ask for static input shapes if needed, parse in the background."""
        if not self._idle("import a model"):
            return False
        path = Path(path).absolute()
        try:
            backend = detect_backend(path)
            shapes = input_shapes if input_shapes is not None else self._ask_shapes(path, backend)
        except QBCompilerError as error:
            dialogs.show_error(self, "Cannot import model", error)
            return False
        if shapes is None:
            return False
        sha = sha256_file(path) if path.is_file() else ""
        self._start_parse(ModelRef(str(path), backend, sha, shapes))
        self.preferences.add_recent_model(path)
        self._remember("model", path)
        return True

    def _ask_shapes(self, path: Path, backend: str) -> dict[str, list[int]] | None:
        if backend != "onnx" or path.suffix.lower() == ".mblt":
            return {}
        dynamic = dynamic_inputs(onnx_input_shapes(path))
        if not dynamic:
            return {}
        return dialogs.ask_input_shapes(self, onnx_input_shapes(path))

    def _start_parse(self, model: ModelRef) -> None:
        self._pending_model = model
        self._start_model_job("parse", parse_model, model.path, self.project.mblt_path, backend=model.backend,
                              input_shapes=model.input_shapes)
        self.statusBar().showMessage(f"Parsing {Path(model.path).name} ({model.backend})…")

    def _start_model_job(self, name: str, function: Any, *args: Any, **kwargs: Any) -> None:
        worker = Worker(name, function, *args, **kwargs)
        worker.progress.connect(lambda event: self.statusBar().showMessage(
            f"{name}: {event.stage} {event.message}".strip()))
        worker.succeeded.connect(self._on_model_loaded)
        worker.failed.connect(self._on_model_failed)
        worker.cancelled.connect(lambda: self.statusBar().showMessage("Model loading cancelled.", 5000))
        self.runner.start("model", worker)

    def _on_model_loaded(self, loaded: LoadedModel) -> None:
        pending = getattr(self, "_pending_model", None)
        if pending is not None:
            self.project.model, self._pending_model = pending, None
        self.loaded = loaded
        self.tabs.setCurrentWidget(self.graph)  # Chromium does not lay out pages in hidden tabs
        self.graph.load_mblt(loaded.mblt_path)
        self.check_support()
        self.calibration.set_context(self.project.calibration, self.project.settings, self.project.work_dir,
                                     self._specs())
        self._update_model_label()
        self._update_can_compile()
        warm_up()
        self.statusBar().showMessage(f"Model ready: {len(loaded.model.graph)} nodes", 5000)
        self.mark_dirty()
        self._outcomes["model"] = "ready"

    def _on_model_failed(self, error: Exception) -> None:
        self._pending_model = None
        self.statusBar().showMessage("Model import failed.", 5000)
        dialogs.show_error(self, "Cannot import model", error)

    def _specs(self) -> list:
        if self.loaded is None:
            return []
        try:
            return input_specs(self.loaded.model)
        except QBCompilerError as error:
            logger.warning("model inputs are not usable for calibration: %s", error)
            return []

    # ================================================================== support, selection, details

    def set_device(self, name: str) -> None:
        """Target device ``name`` (the toolbar and the Compile tab stay in sync)."""
        if name != self.project.settings.device:
            self.options.set_device(name)

    def _on_device_changed(self, name: str) -> None:
        self.device_combo.setCurrentText(name)
        self.check_support()
        self.mark_dirty()

    def check_support(self) -> None:
        """Check every node against the device; colour the graph and fill the Layer support panel."""
        if self.loaded is None:
            return
        self.report = check_support(self.loaded.model, self.project.settings.device)
        statuses, reasons = statuses_from_report(self.report)
        self.graph.set_support(statuses, reasons)
        self.support.set_report(self.report.to_dict())
        if self.details.node:
            self.show_node(self.details.node)

    def _on_graph_selection(self, name: str) -> None:
        self.support.select_node(name)
        self.show_node(name)

    def _on_support_selection(self, name: str) -> None:
        self.graph.select_node(name)
        self.show_node(name)

    def show_node(self, name: str) -> None:
        """Show node ``name``'s details, with support and the latest run's precision and SQNR."""
        info = node_info(self.loaded.model, name) if self.loaded else None
        if info is None:
            self.details.clear()
            return
        entry = self.report.entries.get(name) if self.report else None
        run = self.project.runs.latest
        layer = run.layer_row(name) if run else None
        precision = run.precisions.get(name) if run else None
        self.details.show_node(info, entry.to_dict() if entry else None, layer, precision)

    def node_menu(self, name: str) -> QMenu:
        """The context menu of a graph node."""
        menu = QMenu(self)
        use16 = menu.addAction("Use int16 for this layer")
        use16.setEnabled(name not in self.project.settings.int16_layers)
        use16.triggered.connect(lambda: self.use_int16_for(name))
        menu.addAction("Show details").triggered.connect(lambda: self._on_graph_selection(name))
        return menu

    def _on_node_context(self, name: str, position: QPoint) -> None:
        self._on_graph_selection(name)
        self.node_menu(name).popup(position)

    def use_int16_for(self, name: str) -> None:
        """Add node ``name`` to ``bit.layerOverrides.activation16Bits``."""
        self.options.add_int16_layer(name)
        self.statusBar().showMessage(f"{name}: int16 activations for the next compile", 5000)

    # ================================================================== compile

    def start_compile(self) -> bool:
        """Compile the project's MBLT with the current settings in the background."""
        if self.loaded is None or not self.project.has_mblt:
            dialogs.show_error(self, "Nothing to compile", "Import a model first.")
            return False
        if not self._idle("start a compile"):
            return False
        run_id = self.project.runs.next_id()
        save_path = self.project.run_dir(run_id) / f"{Path(self.project.model.path).stem}.mxq"
        calibration = self.project.calibration
        worker = Worker("compile", run_in_process, COMPILE_TARGET, self.project.mblt_path, save_path,
                        self.project.settings.config, calibration.path, calibration.use_random)
        worker.progress.connect(self.run_panel.show_progress)
        worker.succeeded.connect(lambda outcome: self._on_compiled(run_id, outcome))
        worker.failed.connect(self._on_compile_failed)
        worker.cancelled.connect(self._on_compile_cancelled)
        self._compile_settings = (self.project.settings.to_dict()["config"], self.project.settings.summary())
        self.run_panel.started()
        self.tabs.setCurrentIndex(2)
        self.runner.start("compile", worker)
        return True

    def _on_compiled(self, run_id: int, outcome: CompileOutcome) -> None:
        config, summary = self._compile_settings
        run = RunRecord.from_result(run_id, outcome.result, outcome.analysis, config=config, config_summary=summary,
                                    precisions=outcome.precisions, duration_s=outcome.duration_s)
        self.project.runs.add(run)
        self.run_panel.finished("Done")
        self.run_panel.summary.show_run(run)
        self.compare.set_history(self.project.runs)
        if self.details.node:
            self.show_node(self.details.node)
        self.statusBar().showMessage(f"Compiled {Path(run.mxq_path).name} in {run.duration_s:.1f} s", 8000)
        self.mark_dirty()
        self._outcomes["compile"] = "done"

    def _discard_run_dir(self) -> None:
        run_dir = self.project.run_dir(self.project.runs.next_id())
        if run_dir.exists():  # a fresh folder of this compile only (the child normally removed it)
            shutil.rmtree(run_dir, ignore_errors=True)

    def _on_compile_failed(self, error: Exception) -> None:
        self._discard_run_dir()
        self.run_panel.finished(f"Failed: {getattr(error, 'code', type(error).__name__)}")
        self._outcomes["compile"] = "failed"
        dialogs.show_error(self, "Compile failed", error)

    def _on_compile_cancelled(self) -> None:
        self._discard_run_dir()
        self.run_panel.finished("Cancelled")
        self.statusBar().showMessage("Compile cancelled; nothing was written.", 6000)
        self._outcomes["compile"] = "cancelled"

    def cancel_jobs(self) -> None:
        """Cancel the running compile or model job."""
        for slot in ("compile", "model", "make_calib"):
            self.runner.cancel(slot)

    def _on_busy_changed(self, slot: str, busy: bool) -> None:
        self.act_cancel.setEnabled(any(self.runner.is_busy(s) for s in ("compile", "model", "make_calib")))
        self._update_can_compile()
        outcome = None if busy else self._outcomes.pop(slot, None)
        if slot == "compile" and outcome:  # announced once the job slot is free for the next one
            self.compile_finished.emit(outcome)
        elif slot == "model" and outcome:
            self.model_ready.emit()

    def _update_can_compile(self) -> None:
        ready = self.loaded is not None and not self.runner.is_busy("compile") and not self.runner.is_busy("model")
        self.act_compile.setEnabled(ready)
        self.run_panel.set_can_compile(ready, "" if ready else "Import a model first.")

    # ================================================================== saving

    def mark_dirty(self) -> None:
        """Note an edit: the project is autosaved shortly."""
        self._update_title(dirty=True)
        self._autosave_timer.start()

    def autosave(self) -> Path | None:
        """Save now: to the project file when it has one, else to the autosave folder."""
        self._autosave_timer.stop()
        try:
            if self.project.writable:
                path = self.project.save()
            elif self.project.model is not None:
                path = self.project.write_copy(self.dirs.autosave_dir / f"{self.project.work_dir.name}{PROJECT_SUFFIX}")
            else:
                return None
        except QBCompilerError as error:
            logger.error("autosave failed: %s", error)
            return None
        self._update_title()
        return path

    def save_project_as(self, path: str | Path) -> bool:
        """Save the project to ``path`` (its work folder moves beside it)."""
        try:
            saved = self.project.save(path)
        except (QBCompilerError, OSError) as error:
            dialogs.show_error(self, "Cannot save project", error)
            return False
        self.preferences.add_recent_project(saved)
        self._remember("project", saved)
        self.calibration.work_dir = self.project.work_dir
        self._update_title()
        self.statusBar().showMessage(f"Saved {saved}", 5000)
        return True

    def _on_save(self) -> None:
        if self.project.writable:
            self.save_project_as(self.project.path)
        else:
            self._on_save_as()

    def _on_save_as(self) -> None:
        start = str(Path(self.preferences.last_dir("project") or Path.home()) / f"{self.project.name}{PROJECT_SUFFIX}")
        path, _ = QFileDialog.getSaveFileName(self, "Save project", start, PROJECT_FILTER)
        if path:
            self.save_project_as(path)

    def _on_open(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open project or model", self.preferences.last_dir("project"),
                                              OPEN_FILTER)
        if path:
            self.open_path(path)

    def _on_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import model", self.preferences.last_dir("model"), MODEL_FILTER)
        if path:
            self.import_model(path)

    def _on_settings_changed(self) -> None:
        self.calibration.refresh()
        self.mark_dirty()

    def _on_calibration_changed(self) -> None:
        self.options.refresh()
        self.mark_dirty()

    # ================================================================== window chrome

    def _update_title(self, dirty: bool = False) -> None:
        name = self.project.name + (" (sample)" if self.project.template else "")
        self.setWindowTitle(f"{name}{' •' if dirty else ''} — qb Studio")
        model = self.project.model
        where = "sample project (not saved yet)" if self.project.template else str(self.project.path or "untitled")
        self.status_label.setText(f"{where} · {Path(model.path).name if model else 'no model'}")

    def _update_model_label(self) -> None:
        model = self.project.model
        if model is None:
            self.model_label.setText("<i>No model. File › Import Model… or drop a model file here.</i>")
            return
        nodes = f", {len(self.loaded.model.graph)} nodes" if self.loaded else " (loading…)"
        shapes = "".join(f"<br>{name}: {dims}" for name, dims in model.input_shapes.items())
        self.model_label.setText(f"<b>{Path(model.path).name}</b><br>backend: <b>{model.backend}</b>{nodes}{shapes}")

    def _fill_recent_menus(self) -> None:
        for menu, items in ((self.recent_projects_menu, self.preferences.recent_projects),
                            (self.recent_models_menu, self.preferences.recent_models)):
            menu.clear()
            for item in items:
                menu.addAction(item).triggered.connect(lambda _=False, p=item: self.open_path(p))
            menu.setEnabled(bool(items))

    def _remember(self, purpose: str, path: str | Path) -> None:
        self.preferences.remember_dir(purpose, path)
        self._fill_recent_menus()
        self._save_preferences()

    def _save_preferences(self) -> None:
        try:
            self.preferences.save(self.dirs.preferences_file)
        except QBCompilerError as error:
            logger.warning("cannot save preferences: %s", error)

    def _restore_layout(self) -> None:
        window = self.preferences.window
        if window.get("geometry"):
            self.restoreGeometry(QByteArray.fromBase64(window["geometry"].encode()))
        else:
            self.resize(1400, 900)
        if window.get("state"):
            self.restoreState(QByteArray.fromBase64(window["state"].encode()))
        self._default_docks = not window.get("state")
        self.tabs.setCurrentIndex(int(window.get("tab", 0)))

    def _store_layout(self) -> None:
        self.preferences.window = {"geometry": bytes(self.saveGeometry().toBase64()).decode(),
                                   "state": bytes(self.saveState().toBase64()).decode(),
                                   "tab": self.tabs.currentIndex()}

    def show_about(self) -> None:
        """The About box."""
        from PySide6 import __version__ as pyside_version

        QMessageBox.about(self, "About qb Studio", dialogs.about_text({
            "compiler_core": core_version, "PySide6": pyside_version, "Log file": self.dirs.log_file}))

    def _open_folder(self, path: Path) -> None:
        open_folder(path)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """On the first show without a saved layout, give the docks sensible sizes."""
        super().showEvent(event)
        if self._default_docks:
            self._default_docks = False
            self.resizeDocks([self.layers_dock], [430], Qt.Orientation.Horizontal)
            self.resizeDocks([self.log_dock], [130], Qt.Orientation.Vertical)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 (Qt override)
        """Accept dropped local files."""
        if event.mimeData().hasUrls() and any(url.isLocalFile() for url in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 (Qt override)
        """Open the first dropped file (project or model)."""
        files = [url.toLocalFile() for url in event.mimeData().urls() if url.isLocalFile()]
        if files:
            event.acceptProposedAction()
            self.open_path(files[0])

    def emergency_save(self) -> None:
        """Save whatever can be saved (called by the exception hook); never raises."""
        try:
            self.autosave()
        except Exception:  # noqa: BLE001 - last resort
            logger.exception("emergency save failed")

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt override)
        """Stop jobs, autosave, remember the layout."""
        self.runner.shutdown()
        self.autosave()
        self._store_layout()
        self._save_preferences()
        logging.getLogger().removeHandler(self.log_handler)
        self.log_handler.stop()
        super().closeEvent(event)
