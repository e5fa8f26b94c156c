"""The workbench window: menus, toolbar, docks and tabs, wired to the project and the background jobs.

Over 800 lines (955) because it is the one place where every panel meets the project: each method is
one user action or one job outcome; the panels and the Qt-free state hold the logic. Splitting the
project lifecycle (new/open/import/save) into its own controller is the next step.
"""

from __future__ import annotations

import html
import json
import logging
import shutil
import time
import uuid
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QByteArray, QLockFile, QPoint, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QGuiApplication, QKeySequence
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
    QStackedWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from compiler_core import __version__ as core_version
from compiler_core.errors import QBCompilerError
from compiler_core.fileio import sha256_file
from compiler_core.formats import (
    CALIBRATION_FILE_SUFFIXES,
    MODEL_FOLDER_MARKERS,
    is_model_path,
    model_file_patterns,
)
from qbstudio import dialogs
from qbstudio._compat import guard_none_refcount
from qbstudio.process_jobs import run_in_process, warm_up
from qbstudio.session import Session
from qbstudio.state.model_fit import CALIBRATION_NOTE, compile_readiness, fit_to_model
from qbstudio.state.performance import CYCLES_COLOURING
from qbstudio.state.preferences import AppDirs, Preferences
from qbstudio.state.project import PROJECT_LOCK_NAME, PROJECT_SUFFIX, ModelRef, Project
from qbstudio.state.runs import RunHistory, RunRecord
from qbstudio.state.settings import devices, presets
from qbstudio.widgets.graph_view import GraphView, statuses_from_report
from qbstudio.widgets.log_dock import LogDock, QtLogHandler
from qbstudio.widgets.node_details import NodeDetails
from qbstudio.widgets.run_panel import RunPanel
from qbstudio.widgets.screen_fit import ScreenFitArea, ScreenLimits, fits, screen_limits
from qbstudio.widgets.summary import open_folder
from qbstudio.widgets.support_panel import SupportPanel
from qbstudio.widgets.welcome import DOCS_DIR, SAMPLE_PROJECT, WelcomePage
from qbstudio.widgets.wheel_guard import guard_wheel
from qbstudio.workers import JobRunner, Worker, import_modules

if TYPE_CHECKING:
    from compiler_core.progress import ProgressEvent
    from qbstudio.tasks import CompileOutcome, LoadedModel

logger = logging.getLogger(__name__)

DEFAULT_WINDOW_SIZE = QSize(1400, 900)


def default_window_size(available: QSize | None) -> QSize:
    """The first window's size: 1400x900, or 95 % of a smaller screen's free area (a 1366x768 laptop)."""
    if available is None or not available.isValid():
        return QSize(DEFAULT_WINDOW_SIZE)
    return DEFAULT_WINDOW_SIZE.boundedTo(QSize(int(available.width() * 0.95), int(available.height() * 0.95)))


def unknown_model_error(path: Path, error: QBCompilerError) -> QBCompilerError:
    """The workbench's words for a file no frontend claims (the CLI's hint says "pass --backend")."""
    hint = (f"The workbench imports these files: {MODEL_PATTERNS}; and TensorFlow SavedModel or transformers "
            "folders (File > Import Model Folder).")
    return type(error)(error.message, hint=hint, **error.fields)


LLM_BACKEND = "llm"
"""``ModelRef.backend`` of a decoder LLM (GGUF file, ``*ForCausalLM`` folder): a prefill and a decode graph."""


def llm_graph_tips() -> dict[str, str]:
    """Tooltips of a decoder LLM's graph tabs (imported on use: the LLM frontend pulls in numpy and onnx-ir)."""
    from compiler_core.frontends.llm import DEFAULT_MAX_LEN, DEFAULT_PREFILL_LEN

    return {"Prefill": f"The prompt graph: {DEFAULT_PREFILL_LEN} tokens in; their logits and KV-cache entries out",
            "Decode": f"The generation graph: 1 token and the KV cache ({DEFAULT_MAX_LEN} positions) in; the next "
                      "token's logits and KV-cache entries out"}


LLM_CALIBRATION_NOTE = (
    "A decoder LLM calibrates on plain text, which Compile asks for, with the preset, the prefill length and the "
    "KV-cache length. The image settings of this tab do not apply. (Command line: qbcompiler compile --model "
    "MODEL --output NAME.llm.json --calib-data-path TEXT.txt.)")


MODEL_PATTERNS = " ".join(model_file_patterns())
MODEL_FILTER = f"Models ({MODEL_PATTERNS});;All files (*)"
PROJECT_FILTER = f"qb Studio project (*{PROJECT_SUFFIX})"
OPEN_FILTER = f"Projects and models (*{PROJECT_SUFFIX} {MODEL_PATTERNS});;All files (*)"
AUTOSAVE_DELAY_MS = 1500
WARM_UP_DELAY_MS = 3000
COMPILE_TARGET = "qbstudio.tasks:compile_run"
TABS = ("Graph", "Calibration", "Compile", "Runs && Compare")
PERSISTENT_SPLITTERS = ("compileSplitter", "layersSplitter", "runsSplitter")
"""Splitters whose sizes are remembered across restarts: the Compile tab's settings | run panel, the layer list |
node details, and the runs table | comparison."""
DROP_KINDS = ("a model file or folder, a .qbproj project, or calibration data (a folder, a .txt list or a .json "
              "manifest)")
"""What can be dropped on the window, as the refusals say it."""
TRY_SLOT = "try"
"""Runner slot of "Try on inputs…"."""
FIT_SLOT = "fit"
"""Runner slot of the background fit check of the graph shown (every layer tiled; seconds on a large model)."""
PRELOAD_MODULES = ("numpy", "onnx", "onnx_ir", "onnxscript", "compiler_core.calibration",
                   "qbstudio.widgets.calibration_panel", "qbstudio.widgets.options_panel",
                   "qbstudio.widgets.compare_view", "qbstudio.state.model_info", "compiler_core.targets",
                   "qbstudio.tasks")
"""What the deferred build imports, one per event-loop turn, before building the panels (heaviest first)."""


def _profile_job(path: str, *, callback=None, cancel_token=None) -> dict:
    """Per-layer performance report of an MXQ (run in a worker thread)."""
    from compiler_core.runtime.profile import profile_mxq

    return profile_mxq(path)


class MainWindow(QMainWindow):
    """The qb Studio main window.

    Args:
        dirs: Where preferences, logs, untitled work folders and autosaves go.
        preferences: Loaded preferences (read from ``dirs`` if omitted).

    Signals:
        model_ready(): a model was parsed/loaded and the panels show it.
        compile_finished(str): a compile ended: ``done``, ``cancelled`` or ``failed``.
        project_loaded(): a project was opened and its model (if any) is loading.
        workbench_built(): the panels exist (at once, or after the first show with ``defer_workbench``).
    """

    model_ready = Signal()
    compile_finished = Signal(str)
    project_loaded = Signal()
    workbench_built = Signal()

    def __init__(self, dirs: AppDirs | None = None, preferences: Preferences | None = None, *,
                 defer_workbench: bool = False) -> None:
        super().__init__()
        guard_none_refcount()
        self.dirs = dirs or AppDirs.default()
        self.preferences = preferences or Preferences.load(self.dirs.preferences_file)
        self.dirs.prune_untitled()
        self.runner = JobRunner(self)
        self.session = Session(self._untitled_project(), self)
        self._outcomes: dict[str, str] = {}
        self._stop_agreed = False  # File > Quit asked already whether to stop the running job
        self._llm_request = None  # the last LLM compile dialog's answers, offered again
        self._compile_run_id: int | None = None  # the run folder the running compile claimed
        self._project_lock: QLockFile | None = None  # held on the open project's work folder
        self.sensitivity_dialog = None  # created on the first sensitivity analysis
        self._pending_model: ModelRef | None = None
        self._previous_specs: list | None = None
        self.fit_notes: list[str] = []
        self._fit_source: str | None = None
        self._support_report = None  # the graph shown's support report before the fit check flagged anything
        self._shown_cpu_split = None  # the cpuLayers and cpuOffload the graph's colours show
        self._fit_checked: tuple | None = None  # what the last fit check started on (_fit_key)
        self._fit_again = False  # the settings or the graph changed while a fit check ran
        self.source_missing = False  # the project's source model is not where it was imported from
        self._dirty = False
        self.setWindowTitle("qb Studio")
        self.setAcceptDrops(True)
        self._autosave_timer = QTimer(self, singleShot=True, interval=AUTOSAVE_DELAY_MS)
        self._autosave_timer.timeout.connect(self.autosave)
        self.workbench_ready = False
        self.graph: GraphView | None = None
        self._imports_left: list[str] = []
        self._build_shell()
        self._build_actions()
        self._build_menus()
        self._build_toolbar()
        self._restore_layout()
        self.shown_at: float | None = None
        self._defer_build = defer_workbench
        if defer_workbench:
            self._set_shell_enabled(False)
        else:
            self.build_workbench()

    def build_workbench(self) -> None:
        """Build the panels (they import onnx, the calibration readers and pyqtgraph) and show the project.

        With ``defer_workbench`` this runs right after the first show, so the window appears first.
        """
        if self.workbench_ready:
            return
        self._build_panels()
        self.device_combo.addItems(devices())
        self._connect()
        self.tabs.setCurrentIndex(int(self.preferences.window.get("tab", 0)))
        self._restore_splitters()
        guard_wheel(self)
        self.workbench_ready = True
        self._set_shell_enabled(True)
        self._on_project_changed()
        self.fit_to_screen()
        self.workbench_built.emit()

    def _set_shell_enabled(self, enabled: bool) -> None:
        for widget in (self.menuBar(), self.toolbar, self.welcome):
            widget.setEnabled(enabled)
        self.setAcceptDrops(enabled)

    @property
    def project(self) -> Project:
        """The open project (held by :attr:`session`)."""
        return self.session.project

    @property
    def loaded(self) -> LoadedModel | None:
        """The project's loaded model, or None."""
        return self.session.loaded

    @property
    def report(self) -> Any:
        """The support report, on the current device, of the graph shown, or None."""
        return self.session.report

    @property
    def shown_model(self) -> Any:
        """The ``ir.Model`` of the graph shown (a decoder LLM's prefill or decode graph), or None."""
        return self.loaded.graph(self.graph.graph_name)[1] if self.loaded else None

    @property
    def llm_manifests(self) -> list[Path]:
        """The decoder LLMs compiled in this project (``llm/compile-NNN/*.llm.json``), the newest last."""
        return sorted(self.project.work_dir.glob("llm/compile-*/*.llm.json"))

    @property
    def is_llm(self) -> bool:
        """Whether the project's model is a decoder LLM (two graphs: prefill and decode)."""
        return self.project.model is not None and self.project.model.backend == LLM_BACKEND

    # ================================================================== building

    def _build_deferred(self) -> None:
        """The deferred build: the graph view first, then the heavy imports, then the panels.

        Netron's page is served by this (GUI) thread, so the imports run one module per event-loop
        turn: between them the page's requests are answered, and Chromium starts its renderer and
        reads Netron's scripts while onnx and the parser load. (Not in a thread: PySide6's import
        hook is not safe against imports in two threads at once.)
        """
        self._build_graph()
        self._imports_left = list(PRELOAD_MODULES)
        QTimer.singleShot(0, self._import_next)

    def _import_next(self) -> None:
        if self._imports_left:
            import_modules((self._imports_left.pop(0),))
            QTimer.singleShot(0, self._import_next)
        else:
            self.build_workbench()

    def _build_graph(self) -> None:
        if self.graph is None:
            self.graph = GraphView()
            self.graph.warm_up()  # Chromium starts its renderer while the other panels are built

    def _build_panels(self) -> None:
        from qbstudio.widgets.calibration_panel import CalibrationPanel
        from qbstudio.widgets.compare_view import CompareView
        from qbstudio.widgets.options_panel import OptionsPanel

        self._build_graph()
        self.calibration = CalibrationPanel(self.runner)
        self.options = OptionsPanel()
        self.run_panel = RunPanel()
        self.compare = CompareView(self.runner, presets())
        self.tabs = QTabWidget(objectName="mainTabs", documentMode=True)
        self.tabs.addTab(self.graph, "Graph")
        self.tabs.addTab(self.calibration, "Calibration")
        self.tabs.addTab(self._compile_tab(), "Compile")
        self.tabs.addTab(self.compare, "Runs && Compare")
        self.central.addWidget(self.tabs)

    def _build_shell(self) -> None:
        """What the first paint needs: welcome page, docks, status bar (no onnx, no pyqtgraph)."""
        self.welcome = WelcomePage()
        self.central = QStackedWidget(objectName="central")
        self.central.addWidget(self.welcome)
        self.central_area = ScreenFitArea(self.central, "centralArea")
        self.setCentralWidget(self.central_area)
        self._build_layers_dock()
        self.log_handler = QtLogHandler(self)
        logging.getLogger().addHandler(self.log_handler)
        self.log_dock = LogDock(self.log_handler, self)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.log_dock)
        self._log_beside_layers = False
        self._set_screen_limits(ScreenLimits())
        self.status_label = QLabel()
        self.statusBar().addPermanentWidget(self.status_label)

    def _compile_tab(self) -> QWidget:
        scroll = QScrollArea(widgetResizable=True)
        scroll.setWidget(self.options)
        scroll.setMinimumWidth(420)  # with the run panel's 215 and the layers dock: a 1024-pixel window fits
        splitter = QSplitter(Qt.Orientation.Horizontal, objectName="compileSplitter")
        splitter.addWidget(scroll)
        splitter.addWidget(self.run_panel)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([480, 700])
        return splitter

    def _build_layers_dock(self) -> None:
        self.model_label = QLabel(wordWrap=True, objectName="modelLabel")
        self.support = SupportPanel()
        self.details = NodeDetails()
        splitter = QSplitter(Qt.Orientation.Vertical, objectName="layersSplitter")
        splitter.addWidget(self.support)
        splitter.addWidget(self.details)
        splitter.setSizes([420, 260])
        holder = QWidget()
        layout = QVBoxLayout(holder)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.model_label)
        layout.addWidget(splitter, 1)
        self.layers_dock = QDockWidget("Model && layer support", self, objectName="layersDock")
        self.layers_area = ScreenFitArea(holder, "layersArea")
        self.layers_dock.setWidget(self.layers_area)
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
        self.act_import_folder = self._action("Import Model &Folder…", self._on_import_folder, None,
                                              "Import a TensorFlow SavedModel or HuggingFace model folder")
        self.act_outputs = self._action("Choose Model Ou&tputs…", lambda: self.choose_outputs(), None,
                                        "Keep only the outputs you use: the model is parsed again up to them")
        self.act_save = self._action("&Save Project", self._on_save, keys.Save, "Save the project")
        self.act_save_as = self._action("Save Project &As…", self._on_save_as, keys.SaveAs)
        self.act_load_config = self._action("&Load Compile Config…", lambda: self.options.ask_load_config())
        self.act_save_config = self._action("Save Compile &Config…", lambda: self.options.ask_save_config())
        self.act_quit = self._action("&Quit", self._on_quit, keys.Quit)
        self.act_compile = self._action("&Compile", self.start_compile, "F5", "Quantize and compile to an MXQ")
        self.act_cancel = self._action("Ca&ncel", self.cancel_jobs, "Ctrl+.", "Cancel the running job")
        self.act_sensitivity = self._action("Analyze Layer &Sensitivity…", self.start_sensitivity, None,
                                            "Rank the layers by the accuracy each one loses (cached statistics)")
        self.act_try = self._action("&Try on Inputs…", self._on_try, "Ctrl+T",
                                    "Run images, recordings or .npy files of your own through the shown run's MXQ")
        self.act_try.setEnabled(False)
        self.act_cancel.setEnabled(False)
        self.act_about = self._action("&About qb Studio", self.show_about)
        self.act_about_qt = self._action("About &Qt", lambda: QMessageBox.aboutQt(self))
        self.act_logs = self._action("Open &Log Folder", lambda: self._open_folder(self.dirs.log_file))
        self.act_docs = self._action("&Documentation", self.open_docs, "F1", "The documentation shipped with the app")

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        file_menu.addActions([self.act_new, self.act_open, self.act_import, self.act_import_folder, self.act_outputs])
        self.recent_projects_menu = file_menu.addMenu("Recent &Projects")
        self.recent_projects_menu.aboutToShow.connect(self._fill_recent_menus)  # autosave times move on
        self.recent_models_menu = file_menu.addMenu("Recent &Models")
        file_menu.addSeparator()
        file_menu.addActions([self.act_save, self.act_save_as])
        file_menu.addSeparator()
        file_menu.addActions([self.act_load_config, self.act_save_config])
        file_menu.addSeparator()
        file_menu.addAction(self.act_quit)
        compile_menu = bar.addMenu("&Compile")
        compile_menu.addActions([self.act_compile, self.act_sensitivity, self.act_try, self.act_cancel])
        view_menu = bar.addMenu("&View")
        for index, title in enumerate(TABS):
            action = self._action(title, lambda _=False, i=index: self.tabs.setCurrentIndex(i), f"Ctrl+{index + 1}")
            action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)  # also while the web view has focus
            view_menu.addAction(action)
            self.addAction(action)
        view_menu.addSeparator()
        view_menu.addActions([self.layers_dock.toggleViewAction(), self.log_dock.toggleViewAction()])
        help_menu = bar.addMenu("&Help")
        help_menu.addActions([self.act_docs, self.act_about, self.act_about_qt, self.act_logs])
        help_menu.addAction(self._action("Check My &Setup…", self.show_setup_check))
        compile_menu.addAction(self._action("Try a Compiled &LLM…", self.show_llm_try))
        self._fill_recent_menus()

    def _build_toolbar(self) -> None:
        self.toolbar = toolbar = self.addToolBar("Main")
        toolbar.setObjectName("mainToolbar")
        toolbar.addActions([self.act_open, self.act_import, self.act_save])
        toolbar.addSeparator()
        toolbar.addWidget(QLabel(" Device "))
        self.device_combo = QComboBox(objectName="toolbarDevice")  # filled by build_workbench
        self.device_combo.setToolTip("Target device: nodes are coloured by support on it")
        # filled after the first show: sized then, it cut "regulus-ra" to "regulus-r"
        self.device_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.device_combo.textActivated.connect(self.set_device)
        toolbar.addWidget(self.device_combo)
        toolbar.addSeparator()
        toolbar.addActions([self.act_compile, self.act_cancel])

    def _connect(self) -> None:
        self.graph.node_selected.connect(self._on_graph_selection)
        self.graph.graph_chosen.connect(self.show_graph)
        self.graph.node_context_requested.connect(self._on_node_context)
        self.graph.load_failed.connect(lambda text: self.statusBar().showMessage(f"Graph: {text}", 8000))
        self.support.node_activated.connect(self._on_support_selection)
        self.support.node_context_requested.connect(lambda name, position: self.node_menu(name).popup(position))
        self.options.changed.connect(self._on_settings_changed)
        self.options.device_changed.connect(self._on_device_changed)
        self.calibration.changed.connect(self._on_calibration_changed)
        self.calibration.preview_ready.connect(lambda preview: self.options.set_sample_count(preview.total))
        self.calibration.preview_failed.connect(lambda _error: self.options.set_sample_count(None))
        self.run_panel.compile_requested.connect(self.start_compile)
        self.run_panel.cancel_requested.connect(lambda: self.runner.cancel("compile"))
        self.compare.run_selected.connect(lambda run_id: self.run_panel.summary.show_run(self.session.runs.get(run_id)))
        self.run_panel.summary.try_requested.connect(lambda run: self.try_on_inputs(run))
        self.run_panel.offload_requested.connect(self.enable_cpu_offload)
        self.runner.busy_changed.connect(self._on_busy_changed)
        self.welcome.sample_requested.connect(lambda: self.open_path(SAMPLE_PROJECT))
        self.welcome.import_requested.connect(self._on_import)
        self.welcome.open_requested.connect(self._on_open)
        self.welcome.recent_requested.connect(self.open_path)
        self.session.project_changed.connect(self._on_project_changed)
        self.session.model_changed.connect(self._on_model_changed)
        self.session.runs_changed.connect(self._on_runs_changed)
        from qbstudio.compare_controller import CompareController

        self.compare_controller = CompareController(self)
        self.details.performance.colour_by_cycles.connect(self.colour_graph_by_cycles)
        self.details.tabs.currentChanged.connect(lambda _index: self._refresh_performance())
        self.graph.colouring_changed.connect(self._on_graph_colouring)

    # ================================================================== project lifecycle

    def _untitled_project(self) -> Project:
        return Project.new("Untitled", self.dirs.untitled_dir / uuid.uuid4().hex[:12])

    def new_project(self) -> bool:
        """Start an empty, untitled project (asks to save unsaved work first); False if the user cancelled."""
        if not self._idle("start a new project") or not self.confirm_leave("starting a new project"):
            return False
        self.autosave()
        self._set_project(self._untitled_project())
        return True

    def _set_project(self, project: Project) -> None:
        self._dirty = False
        self.fit_notes = []
        self.source_missing = False
        self.session.set_project(project)
        self._hold_project_lock()

    def _hold_project_lock(self) -> None:
        """Lock the project's work folder while it is open here (released on a switch or close). When another window
        holds it, say what happens when both save (two windows silently overwrote each other's settings)."""
        if self._project_lock is not None:
            self._project_lock.unlock()
            self._project_lock = None
        if not self.project.writable:
            return
        lock = QLockFile(str(self.project.work_dir / PROJECT_LOCK_NAME))
        try:
            self.project.work_dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            return self._say_read_only()
        if lock.tryLock(0):
            self._project_lock = lock
            return
        if lock.error() != QLockFile.LockError.LockFailedError:
            return self._say_read_only()  # no lock, and no other window either
        info = lock.getLockInfo()  # (pid, host name, application name)
        pid, host = (info[0], info[1]) if isinstance(info, tuple) and len(info) >= 2 else ("?", "")
        dialogs.show_info(self, "Project open in another window",
                          f"{self.project.path.name} is already open in another qb Studio window (process {pid} on "
                          f"{host or 'this computer'}).\n\nBoth windows save to it: the runs compiled in either are "
                          "kept, but the compile settings and calibration saved last replace the other window's. Edit "
                          "in one window, or close the project in the other.")

    def _on_project_changed(self) -> None:
        """Every panel starts over from the session's (new) project: nothing of the previous one stays."""
        project = self.project
        self.graph.clear()
        self.options.set_settings(project.settings)
        self.device_combo.setCurrentText(project.settings.device)
        self.calibration.set_context(project.calibration, project.settings, project.work_dir, [])
        self.options.set_sample_count(None)
        self.options.set_model_channels(set())
        self.compare.set_history(self.session.runs)
        self.run_panel.reset()
        self.support.set_report(None)
        self.details.clear()
        self.log_dock.start_section(f"project {project.name}")
        self._update_title()
        self._update_model_label()
        self._update_can_compile()
        self._show_welcome_if_empty()

    def _show_welcome_if_empty(self) -> None:
        """The welcome page while no model is open or loading; the tabs otherwise."""
        empty = self.project.model is None and self._pending_model is None and not self.runner.is_busy("model")
        if empty:  # the autosave times of the Recent list moved on since it was filled (found under Xvfb)
            self._fill_recent_menus()
        self.central.setCurrentWidget(self.welcome if empty else self.tabs)

    def _on_model_changed(self) -> None:
        """Graph, support, calibration inputs, runs and details follow the session's model."""
        loaded = self.loaded
        if loaded is None:
            self.graph.clear()
        else:
            self.tabs.setCurrentWidget(self.graph)  # Chromium does not lay out pages in hidden tabs
            self.graph.set_graphs(loaded.graph_names, llm_graph_tips(), current=loaded.name)
            self.graph.load_mblt(loaded.mblt_path)
        self.details.clear()
        self.support.set_report(None)
        self.support.clear_filter()  # "Log_0" typed for the previous model hid every node of the next one
        self.check_support()
        self.calibration.model_path = Path(self.project.model.path) if self.project.model else None  # its tokenizer
        self.calibration.set_context(self.project.calibration, self.project.settings, self.project.work_dir,
                                     [] if self.is_llm else self._specs())
        self.calibration.set_note(LLM_CALIBRATION_NOTE if self.is_llm else None)
        self.options.set_llm(self.is_llm)
        self.options.set_sample_count(None)
        self.options.set_model_channels({spec.channels for spec in self._specs() if spec.is_image})
        self._on_runs_changed()
        self._update_model_label()
        self._update_can_compile()
        self._show_welcome_if_empty()

    def _on_runs_changed(self) -> None:
        runs = self._show_history()
        if not self.run_panel.running and self.is_llm:
            self._show_llm_summary()
        elif not self.run_panel.running:
            self.run_panel.summary.show_run(runs.latest)
        self.act_try.setEnabled(runs.latest is not None and not self.is_llm)
        if self.details.node:
            self.show_node(self.details.node)
        self._refresh_performance()

    def _refresh_performance(self) -> None:
        """The Performance tab, when shown, profiles the latest run (it said "Compile the model" after a compile
        until a node was selected)."""
        if self.details.tabs.currentWidget() is self.details.performance and not self.is_llm:
            self._update_performance(self.session.latest_run)

    def _show_history(self) -> RunHistory:
        """The open model's runs in Runs & Compare, which says how many runs of other models the project keeps (a
        replaced model's runs vanished from view without a word)."""
        runs = self.session.runs
        self.compare.set_history(runs, other_models=len(self.project.runs) - len(runs))
        return runs

    def _on_try(self) -> None:
        """Compile › Try on Inputs…: the run the summary shows (the newest, or the one picked in Runs & Compare)."""
        run = self.run_panel.summary.run or self.session.runs.latest
        if run is None or not Path(run.mxq_path).is_file():
            self.statusBar().showMessage("No compiled run of this model to try: compile first.", 8000)
            return
        self.try_on_inputs(run)

    def open_path(self, path: str | Path) -> None:
        """Open a project (``.qbproj``) or import a model, by file type."""
        path = Path(path).absolute()
        if not path.exists():  # a Recent entry or a command-line path: it read "not a readable ONNX model"
            dialogs.show_error(self, "Cannot open", f"'{path}' does not exist (moved, renamed or deleted?). Choose it "
                                                    "again with File › Open….")
            return
        if path.suffix.lower() == PROJECT_SUFFIX:
            self.open_project(path)
        else:
            self.import_model(path)

    def open_project(self, path: str | Path) -> bool:
        """Open a project file and restore its model, graph, calibration, settings and runs."""
        if not self._idle("open a project") or not self.confirm_leave("opening another project"):
            return False
        self.autosave()
        try:
            project = Project.load(path, scratch_dir=self.dirs.untitled_dir / uuid.uuid4().hex[:12])
        except QBCompilerError as error:
            dialogs.show_error(self, "Cannot open project", error)
            return False
        recovered = self._is_autosave(project.path)
        if recovered:
            project.path = None  # a recovered untitled project: it stays untitled, autosaved where it was
        self._set_project(project)
        if not project.template:
            self.preferences.add_recent_project(path)
            if not recovered:  # the app's autosave folder is no place to propose for the user's projects
                self._remember("project", path)
        self._restore_model()
        self.project_loaded.emit()
        return True

    def _restore_model(self) -> None:
        model = self.project.model
        if model is None:
            return
        if not Path(model.path).exists():  # moved, deleted, or the project came from another computer
            self.source_missing = True
            self._update_model_label()
            if not self.project.has_mblt:
                dialogs.show_error(self, "Model not found", f"The project's model '{model.path}' does not exist.\n\n"
                                   "Import it again from where it is now (File › Import Model…).")
                return
            logger.warning("The project's model %s does not exist; opening the graph parsed from it at import, "
                           "saved in the project", model.path)
        if self.project.has_mblt and not model.changed_on_disk():
            from qbstudio.tasks import llm_decode_path, open_llm, open_mblt

            if model.backend != LLM_BACKEND:
                self._start_model_job("open", open_mblt, self.project.mblt_path)
                return
            if llm_decode_path(self.project.mblt_path).is_file():
                self._start_model_job("open", open_llm, self.project.mblt_path)
                return
        if model.changed_on_disk():
            logger.warning("%s changed since it was imported; parsing it again", model.path)
        self._start_parse(model)

    def running_job(self) -> str | None:
        """What the project's running background job is ("the compile", ...), or None: while one runs, the project
        and its model stay as they are (one heavy job at a time)."""
        for slot, job in zip(self._job_slots(), ("the compile", "the sweep", "the model's parse",
                                                   "the writing of the calibration set", "the run on inputs")):
            worker = self.runner.worker(slot)
            if worker is not None:
                return "the sensitivity analysis" if worker.name == "sensitivity" else job  # it shares the slot
        return None

    @staticmethod
    def _job_slots() -> tuple[str, ...]:
        """The runner slots of the jobs Cancel stops and that keep the project as it is while they run."""
        from qbstudio.compare_controller import SWEEP_SLOT

        return "compile", SWEEP_SLOT, "model", "make_calib", TRY_SLOT

    def _idle(self, what: str) -> bool:
        """True if no job runs; else says so in a message box (a status line is missed: the user just chose a
        file) and returns False."""
        job = self.running_job()
        if job is None:
            return True
        message = f"Cannot {what} while {job} runs."
        self.statusBar().showMessage(f"{message} Cancel it first.", 6000)
        dialogs.show_info(self, "A job is running", f"{message}\n\nWait for it to finish, or press Cancel "
                                                    "(toolbar, Ctrl+.) to stop it, then try again.")
        return False

    # ================================================================== model import

    def import_model(self, path: str | Path, input_shapes: dict[str, list[int]] | None = None) -> bool:
        """Import a model: detect its backend, ask for static input shapes if needed, parse in the background."""
        if not self._idle("import a model"):
            return False
        from compiler_core.frontends import detect_backend
        from compiler_core.frontends.llm import is_causal_lm_source

        path = Path(path).absolute()
        try:
            backend = LLM_BACKEND if is_causal_lm_source(path) else detect_backend(path)
        except QBCompilerError as error:
            dialogs.show_error(self, "Cannot import model", unknown_model_error(path, error))
            return False
        try:  # an unreadable file is refused before the project changes ("new project" would leave this one)
            inputs = self._onnx_inputs(path, backend) if input_shapes is None else []
        except QBCompilerError as error:
            dialogs.show_error(self, "Cannot import model", error)
            return False
        if not self._make_room_for(path):
            return False
        shapes = input_shapes if input_shapes is not None else self._ask_shapes(path, inputs)
        if shapes is None:
            return False
        sha = sha256_file(path) if path.is_file() else ""
        self._previous_specs = self._specs() if self.project.model is not None else None
        self._start_parse(ModelRef(str(path), backend, sha, shapes))
        self.preferences.add_recent_model(path)
        self._remember("model", path)
        return True

    def choose_outputs(self, names: list[str] | None = None) -> bool:
        """Parse the model again up to the outputs the user keeps (asked for when ``names`` is None; ``[]`` gives back
        every output of the source model). The inputs, calibration data and settings stay."""
        model = self.project.model
        if model is None or self.loaded is None or self.is_llm:
            dialogs.show_info(self, "Model outputs", "Import a model first (a decoder LLM's outputs are fixed).")
            return False
        if not self._idle("choose the model's outputs"):
            return False
        if names is None:
            outputs = [(value.name, [int(dim) if isinstance(dim, int) else str(dim) for dim in value.shape or []])
                       for value in self.loaded.model.graph.outputs]
            answer = dialogs.ask_model_outputs(self, outputs, bool(model.output_names))
            if answer is None:
                return False
            names = [] if answer is dialogs.ModelOutputsDialog.ALL_OUTPUTS else list(answer)
        self._previous_specs = self._specs()
        self._start_parse(replace(model, output_names=list(names)))
        return True

    def _make_room_for(self, path: Path) -> bool:
        """A project holds one model: importing another asks "new project or replace"; False if cancelled."""
        current = self.project.model
        if current is None or Path(current.path) == path:
            return True
        choice = dialogs.ask_import_choice(self, path.name, Path(current.path).name)
        if choice == dialogs.IMPORT_NEW:
            return self.new_project()
        return choice == dialogs.IMPORT_REPLACE

    @staticmethod
    def _onnx_inputs(path: Path, backend: str) -> list:
        """The graph inputs of an ONNX source (:class:`~qbstudio.state.model_info.InputShape`), read from the file;
        [] for other sources: their frontends ask through their errors' fields (_answer_for), an LLM's are fixed.

        Raises:
            ModelLoadError: the file is not a readable ONNX model.
        """
        from qbstudio.state.model_info import onnx_input_shapes

        if backend != "onnx" or path.suffix.lower() == ".mblt":
            return []
        return onnx_input_shapes(path)

    def _ask_shapes(self, path: Path, inputs: list) -> dict[str, list[int]] | None:
        """Static values for the dynamic dimensions of ``inputs`` ({} if none); None if the user cancelled."""
        from qbstudio.state.model_info import dynamic_inputs

        if not dynamic_inputs(inputs):
            return {}
        return dialogs.ask_input_shapes(self, inputs, model_name=path.name)

    def _start_parse(self, model: ModelRef) -> None:
        from qbstudio.tasks import parse_llm_model, parse_model

        self._pending_model = model
        self.tabs.setCurrentIndex(0)  # where the parsed graph appears (and, until then, what the parse does)
        if model.backend == LLM_BACKEND:
            self._start_model_job("parse", parse_llm_model, model.path, self.project.mblt_path,
                                  busy=f"Parsing the decoder LLM {Path(model.path).name} to its prefill and "
                                       "decode graphs (transformers loads it; a minute or more)")
            self.statusBar().showMessage(f"Parsing {Path(model.path).name} (decoder LLM)…")
            return
        self._start_model_job("parse", parse_model, model.path, self.project.mblt_path, backend=model.backend,
                              input_shapes=model.input_shapes, output_names=model.output_names,
                              constant_inputs=model.constant_inputs, allow_pickle=model.allow_pickle,
                              submodule=model.submodule,
                              busy=f"Parsing {Path(model.path).name} ({model.backend})")
        self.statusBar().showMessage(f"Parsing {Path(model.path).name} ({model.backend})…")

    def _start_model_job(self, name: str, function: Any, *args: Any, busy: str = "Opening the parsed model",
                         **kwargs: Any) -> None:
        self.central.setCurrentWidget(self.tabs)
        worker = Worker(name, function, *args, **kwargs)
        self.graph.show_progress(f"{busy}…")
        worker.progress.connect(lambda event: self._show_model_progress(name, busy, event))
        worker.succeeded.connect(self._on_model_loaded)
        worker.failed.connect(self._on_model_failed)
        worker.cancelled.connect(self._on_model_cancelled)
        self.runner.start("model", worker)

    def _show_model_progress(self, name: str, busy: str, event: ProgressEvent) -> None:
        self.statusBar().showMessage(f"{name}: {event.stage} {event.message}".strip())
        self.graph.show_progress(f"{busy}…\n\n{event.stage}: {event.message}" if event.message else f"{busy}…")

    def _on_model_cancelled(self) -> None:
        self.graph.show_progress(None)
        self.statusBar().showMessage("Model loading cancelled.", 5000)

    def _on_model_loaded(self, loaded: LoadedModel) -> None:
        pending, self._pending_model = self._pending_model, None
        imported = pending is not None and pending is not self.project.model  # not the project's own, restored
        if pending is not None:
            self.project.model = pending
        if imported:
            self.source_missing = False
        previous, self._previous_specs = self._previous_specs, None
        if imported and not self.is_llm:  # a decoder LLM's decode graph, replaced: hundreds of MB
            from qbstudio.tasks import llm_decode_path

            llm_decode_path(self.project.mblt_path).unlink(missing_ok=True)
        self.session.set_model(loaded)
        self.fit_notes = fit_to_model(self.project.settings, self.project.calibration, self._specs(), previous,
                                      source=self.project.model.path if imported and self.project.model else None)
        self._fit_source = self.project.calibration.path
        if self.fit_notes:
            self.options.refresh()
            self.calibration.set_context(self.project.calibration, self.project.settings, self.project.work_dir,
                                         self._specs())
            self._update_model_label()
        QTimer.singleShot(WARM_UP_DELAY_MS, warm_up)  # not while the graph renders: two cores only
        self.statusBar().showMessage(f"Model ready: {len(loaded.model.graph)} nodes", 5000)
        if imported or self.fit_notes:  # an opened project, as it was, is neither edited nor autosaved
            self.mark_dirty()
        self._outcomes["model"] = "ready"

    def _on_model_failed(self, error: Exception) -> None:
        pending, previous = self._pending_model, self._previous_specs
        self._pending_model, self._previous_specs = None, None
        retry = self._answer_for(pending, error) if pending is not None else None
        if retry is not None:
            def reparse() -> None:
                self._previous_specs = previous
                self._start_parse(retry)

            self._when_model_slot_free(reparse)
            return
        self.graph.show_progress(None)
        self.statusBar().showMessage("Model import failed.", 5000)
        dialogs.show_error(self, "Cannot import model", error)

    def _when_model_slot_free(self, action: Any) -> None:
        """Call ``action`` once the failed model job has left the runner (its slot frees after this signal)."""
        if not self.runner.is_busy("model"):
            QTimer.singleShot(0, action)
            return

        def once(slot: str, busy: bool) -> None:
            if slot == "model" and not busy:
                self.runner.busy_changed.disconnect(once)
                QTimer.singleShot(0, action)

        self.runner.busy_changed.connect(once)

    def _answer_for(self, pending: ModelRef, error: Exception) -> ModelRef | None:
        """What the user gives for a parse that stopped on a question (cut the graph, inputs, pickle), or None."""
        fields = error.fields if isinstance(error, QBCompilerError) else {}
        cut_at, needed = fields.get("cut_at"), fields.get("inputs_needed")
        if cut_at and not pending.output_names and dialogs.ask_cut_graph(self, error, cut_at):
            return replace(pending, output_names=list(cut_at))
        keep = fields.get("keep_outputs")
        if keep and not pending.output_names and dialogs.ask_cut_graph(self, error, keep, keep=True):
            return replace(pending, output_names=list(keep))
        if fields.get("needs_allow_pickle") and not pending.allow_pickle and dialogs.ask_yes_no(
                self, "Load a pickled module?",
                f"{error.message}\n\nLoad it only if you trust where the file comes from. (A model saved with "
                "torch.export.save as .pt2 needs no such trust.)"):
            return replace(pending, allow_pickle=True)
        children = fields.get("submodules")
        if children and not pending.submodule:
            child = dialogs.ask_submodule(self, error, children)
            if child:  # another module, other inputs: the answers given for the whole one do not apply
                return replace(pending, submodule=child, input_shapes={}, constant_inputs={})
        if needed:
            answer = dialogs.ask_model_inputs(self, needed, Path(pending.path).name, error)
            if answer is not None:
                shapes, constants = answer
                return replace(pending, input_shapes={**pending.input_shapes, **shapes},
                               constant_inputs={**pending.constant_inputs, **constants})
        return None

    def show_graph(self, name: str) -> None:
        """Show the model's graph ``name`` (a decoder LLM's "Prefill" or "Decode"), with its support colours."""
        if self.loaded is None:
            return
        if self.graph.graph_name != name:
            self.graph.set_graphs(self.loaded.graph_names, llm_graph_tips(), current=name)
        self.graph.load_mblt(self.loaded.graph(name)[0])
        self.details.clear()
        self.check_support()

    def _specs(self) -> list:
        if self.loaded is None:
            return []
        from compiler_core.calibration import input_specs

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
        """Check every node against the device; colour the graph and fill the Layer support panel. The fit check
        follows in the background (:meth:`check_fit`)."""
        if self.loaded is None:
            return
        from compiler_core.targets import check_support

        self._support_report = check_support(self.shown_model, self.project.settings.device)
        self.session.set_report(self._support_report)
        self._show_report()
        self.check_fit()

    def _show_report(self) -> None:
        self._shown_cpu_split = self._cpu_split()
        report = self._with_cpu_layers(self.report)
        statuses, reasons = statuses_from_report(report)
        self.graph.set_support(statuses, reasons)
        self.support.set_report(report.to_dict())
        if self.details.node:
            self.show_node(self.details.node)
        self._update_can_compile()

    def check_fit(self) -> None:
        """Tile every layer of the graph shown, in the background, as the compile will (int16 layers from the compile
        settings): the layers whose smallest tile exceeds a core's SRAM turn ``unsupported``, the refusal as reason
        (:func:`~compiler_core.backend.fit.flag_fit_failures`). With unsupported nodes at the start or end, the layers
        CPU offload would leave to the NPU (:func:`~compiler_core.backend.fit.npu_fit_failures`). Not for decoder LLMs
        (compiled by their own path)."""
        if self.loaded is None or self.is_llm or self._support_report is None:
            return
        if self.runner.is_busy(FIT_SLOT):
            self._fit_again = True
            self.runner.cancel(FIT_SLOT)
            return
        from compiler_core.backend.fit import npu_fit_failures
        from compiler_core.targets import get_device

        settings = self.project.settings
        key = self._fit_checked = self._fit_key()
        worker = Worker("fit", npu_fit_failures, self.shown_model, self._support_report, get_device(settings.device),
                        settings.config)
        worker.succeeded.connect(lambda failures: self._on_fit(key, failures))
        worker.failed.connect(lambda error: logger.warning("The fit check failed: %s", error))
        self.runner.start(FIT_SLOT, worker)

    def _fit_key(self) -> tuple:
        """What the fit check's verdict depends on: the graph shown, the device, the settings that choose widths."""
        config = self.project.settings.config
        return (id(self.shown_model), self.project.settings.device, config.bit.model_dump_json(),
                config.calibration.method, config.uint8_input.model_dump_json())

    def _on_fit(self, key: tuple, failures: list) -> None:
        if key != self._fit_key() or self._support_report is None:
            return  # the graph, device or widths changed meanwhile: a newer check runs
        from compiler_core.backend.fit import flag_fit_failures

        if failures:
            logger.warning("%d layer(s) do not fit a core's SRAM on %s: %s", len(failures), self._support_report.device,
                           failures[0].message)
        self.session.set_report(flag_fit_failures(self._support_report, failures))
        self._show_report()

    def _on_graph_selection(self, name: str) -> None:
        self.support.select_node(name)
        self.show_node(name)

    def _on_support_selection(self, name: str) -> None:
        self.graph.select_node(name)
        self.show_node(name)

    def show_node(self, name: str) -> None:
        """Show node ``name``'s details, with support and the latest run's precision and SQNR."""
        from qbstudio.state.model_info import node_info

        info = node_info(self.shown_model, name) if self.loaded else None
        if info is None:
            self.details.clear()
            return
        report = self._with_cpu_layers(self.report)  # the split the graph shows
        entry = report.entries.get(name) if report else None
        run = self.session.latest_run  # only a run of this very model (matched by MBLT hash)
        layer = run.layer_row(name) if run else None
        precision = run.precisions.get(name) if run else None
        self.details.show_node(info, entry.to_dict() if entry else None, layer, precision)
        self._update_performance(run)

    def _update_performance(self, run) -> None:
        """Profile the run's MXQ in the background once; the Performance tab shows it."""
        path = str(run.mxq_path) if run else None
        if path == getattr(self, "_profiled", None):
            return
        self._profiled = path
        if path is None:
            self.details.performance.set_report(None, "Compile the model to see where the time goes.")
            return
        self.details.performance.set_report(None, "Profiling the compiled program…", pending=True)
        if self.runner.is_busy("profile"):
            self._profiled = None  # retried on the next node shown, once the running profile ends
            return
        worker = Worker("profile", _profile_job, path)
        worker.succeeded.connect(lambda report: self._on_profiled(path, report))
        worker.failed.connect(lambda error: self._on_profiled(path, None, error))
        self.runner.start("profile", worker)

    def _on_profiled(self, path: str, report, error: Exception | None = None) -> None:
        if path != getattr(self, "_profiled", None):
            return  # a newer run was selected meanwhile
        message = "" if report else f"No performance report: {getattr(error, 'message', error)}"
        self.details.performance.set_report(report, message)

    def colour_graph_by_cycles(self, mode: str) -> None:
        """Colour the graph by each layer's share of ``mode``'s estimated latency (``""``: back to support status).

        The graph's colour selector is the one source of truth: the Performance tab's switch chooses
        (or withdraws) its ``cycles:<mode>`` entry, and choosing another entry there unchecks the switch.
        """
        report = self.details.performance.report
        if not mode or not report or mode not in report["modes"]:
            self.graph.set_extra_colouring(None)
            return
        key = CYCLES_COLOURING + mode
        if self.graph.colouring == key:  # the same entry, a new run's report: the selector does not change
            self._on_graph_colouring(key)
            return
        self.graph.set_extra_colouring((key, f"Colours: cycles ({mode})"), select=True)

    def _on_graph_colouring(self, key: str) -> None:
        """The graph's colour selector changed: paint the cycles heatmap, or leave the Performance switch off."""
        from qbstudio.state.performance import cycle_heat

        report = self.details.performance.report
        if not key.startswith(CYCLES_COLOURING) or not report or key[len(CYCLES_COLOURING):] not in report["modes"]:
            self.details.performance.stop_colouring()
            self.graph.set_extra_colouring(None)
            return
        heat = cycle_heat(report, key[len(CYCLES_COLOURING):])
        self.graph.set_heatmap(heat.colours, heat.tooltips, title=heat.title, stops=heat.scale.stops(),
                               low=heat.scale.low, high=heat.scale.high, ticks=heat.scale.ticks)

    def node_menu(self, name: str) -> QMenu:
        """The context menu of a graph node."""
        menu = QMenu(self)
        use16 = menu.addAction("Use int16 for this layer")
        use16.setEnabled(name not in self.project.settings.int16_layers)
        use16.triggered.connect(lambda: self.use_int16_for(name))
        part = self.project.settings.cpu_layer_part(name)
        for label, target in (("Run on the CPU with every layer before it (CPU head)", "head"),
                              ("Run on the CPU with every layer after it (CPU tail)", "tail")):
            action = menu.addAction(label)
            action.setEnabled(part != target)
            action.setToolTip("cpuLayers: e.g. a log-mel front end whose Log needs more range than int16 holds")
            action.triggered.connect(lambda _=False, target=target: self.run_on_cpu(name, target))
        back = menu.addAction("Run on the NPU again (remove from cpuLayers)")
        back.setEnabled(part is not None)
        back.triggered.connect(lambda: self.run_on_cpu(name, None))
        menu.addAction("Show details").triggered.connect(lambda: self._on_graph_selection(name))
        return menu

    def run_on_cpu(self, name: str, part: str | None) -> None:
        """List node ``name`` in ``cpuLayers.head``/``.tail`` (``part``) or in neither; the graph shows the split.
        A choice the split refuses (a head layer after a tail layer) is taken back and the error shown."""
        previous = self.project.settings.cpu_layer_part(name)
        if not self.options.set_cpu_layer(name, part):
            return
        _, error = self._cpu_layer_plan(self.report)
        if error is not None:
            self.options.set_cpu_layer(name, previous)
            dialogs.show_error(self, "Cannot run this layer on the CPU", error)
            return
        where = {"head": "on the CPU with every layer before it", "tail": "on the CPU with every layer after it",
                 None: "on the NPU"}[part]
        self.statusBar().showMessage(f"{name}: runs {where} in the next compile", 5000)

    def _cpu_split(self) -> tuple:
        config = self.project.settings.config
        return config.cpu_layers.model_dump_json(), config.cpu_offload

    def _cpu_layer_plan(self, report):
        """``(plan, error)``: the compile's CPU-offload split with ``cpuLayers`` and CPU offload on the graph shown
        (``(None, None)`` with neither, or with nothing to offload), or the error that refuses it."""
        config = self.project.settings.config
        cpu_layers = config.cpu_layers
        offload = config.cpu_offload and report is not None and not report.all_supported
        if report is None or not (cpu_layers.patterns or offload) or self.shown_model is None:
            return None, None
        from compiler_core.errors import QBCompilerError
        from compiler_core.targets import plan_cpu_offload

        try:
            return plan_cpu_offload(self.shown_model, report, cpu_layers), None
        except QBCompilerError as error:
            return None, error

    def _with_cpu_layers(self, report):
        """``report`` with the nodes the compile runs on the CPU marked ``cpu_offloaded``: those ``cpuLayers`` puts
        there and, with CPU offload on, the unsupported head and tail (the same split the compile makes; the graph
        and the Layer support list kept them "needs MFU"/"unsupported" and "not compilable" while the compile
        offloaded them). A choice the split refuses leaves the report as is and says why in the status bar."""
        plan, error = self._cpu_layer_plan(report)
        if error is not None:
            self.statusBar().showMessage(f"cpuLayers: {error.message}", 10000)
        if plan is None:
            return report
        from compiler_core.targets import OffloadPlan, apply_offload

        if not self.project.settings.config.cpu_offload:  # only cpuLayers' choice moves: the unsupported stay
            chosen = set(plan.chosen)
            plan = OffloadPlan(cpu_head=[n for n in plan.cpu_head if n in chosen],
                               cpu_tail=[n for n in plan.cpu_tail if n in chosen], chosen=plan.chosen)
        return apply_offload(report, plan)

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
        readiness = self.readiness()
        if not readiness.ok:
            dialogs.show_error(self, "Cannot compile", readiness.reason)
            return False
        if self.is_llm:
            return self.start_llm_compile()
        if not self._has_calibration_data():
            return False
        calibration = self.project.calibration
        try:
            run_id = self._compile_run_id = self.project.claim_run_dir()  # not another window's run folder
        except QBCompilerError as error:
            dialogs.show_error(self, "Cannot compile", error)
            return False
        save_path = self.project.run_dir(run_id) / f"{Path(self.project.model.path).stem}.mxq"
        worker = Worker("compile", run_in_process, COMPILE_TARGET, self.project.mblt_path, save_path,
                        self.project.settings.config, calibration.path, calibration.use_random)
        worker.progress.connect(self.run_panel.show_progress)
        worker.succeeded.connect(lambda outcome: self._on_compiled(run_id, outcome))
        worker.failed.connect(self._on_compile_failed)
        worker.cancelled.connect(self._on_compile_cancelled)
        self._compile_settings = (self.project.settings.to_dict()["config"], self.project.settings.summary(),
                                  self.session.model_sha256, self.project.settings.preset or "")
        self._compile_calibration = {"path": calibration.path, "use_random": calibration.use_random}
        self.run_panel.started()
        self.tabs.setCurrentIndex(2)
        self.runner.start("compile", worker)
        return True

    def _has_calibration_data(self) -> bool:
        """True if calibration data (or random data) is chosen; else says where to choose it, shows that tab and
        returns False (the job would fail with CALIBRATION_ERROR in the API's words)."""
        calibration, config = self.project.calibration, self.project.settings.config
        if calibration.path or calibration.use_random or config.calib_data_paths or config.use_random_calib:
            return True
        self.tabs.setCurrentIndex(1)  # where the data is chosen
        dialogs.show_error(self, "No calibration data", "Choose calibration data first.\n\nIn the Calibration tab: "
                           "Folder… (images, .wav recordings or .npy files) or List/manifest…, or tick Random data for a smoke test.")
        return False

    def start_llm_compile(self) -> bool:
        """Ask for calibration text and LLM options, then compile the decoder LLM in the background.

        The prefill MXQ, decode MXQ and ``.llm.json`` manifest go to a new folder under the project's
        ``llm/``; when they are written, Try a Compiled LLM opens on the manifest.
        """
        from compiler_core.llm import MAX_CACHE_LEN
        from qbstudio.tasks import LLM_COMPILE_TARGET, LlmCompileRequest

        model, device = Path(self.project.model.path), self.project.settings.device
        request = dialogs.ask_llm_compile(self, model.name, device,
                                          self._llm_request or LlmCompileRequest(text_path=""),
                                          MAX_CACHE_LEN.get(device))
        if request is None:
            return False
        self._llm_request = request
        base = self.project.work_dir / "llm"
        number = 1 + max((int(p.name.rsplit("-", 1)[-1]) for p in base.glob("compile-*")
                          if p.name.rsplit("-", 1)[-1].isdigit()), default=0)
        manifest = base / f"compile-{number:03d}" / f"{model.stem}.llm.json"
        worker = Worker("compile", run_in_process, LLM_COMPILE_TARGET, str(model), str(manifest), device, request,
                        inference_scheme=self.project.settings.config.inference_scheme)
        worker.progress.connect(self.run_panel.show_progress)
        worker.succeeded.connect(self._on_llm_compiled)
        worker.failed.connect(self._on_compile_failed)
        worker.cancelled.connect(self._on_compile_cancelled)
        self.run_panel.started(compiling=False)
        self.tabs.setCurrentIndex(2)
        self.log_dock.start_section(f"LLM compile {manifest.parent.name} ({request.preset}, {device})")
        self.runner.start("compile", worker)
        return True

    def _on_llm_compiled(self, manifest: dict) -> None:
        path = manifest["path"]
        self.run_panel.finished("Done")
        self._show_llm_summary()
        logger.info("Wrote %s (%s, %s)", path, manifest.get("prefill"), manifest.get("decode"))
        self.statusBar().showMessage(f"Compiled {Path(path).name}: try it in the window that opened", 8000)
        self._outcomes["compile"] = "done"
        self._llm_try = dialogs.open_llm_try(self, path)

    def _show_llm_summary(self) -> None:
        """The Compile tab's summary of a decoder LLM: its newest compile (manifest, MXQs, accuracy) or the hint."""
        manifests = self.llm_manifests
        if not manifests:
            self.run_panel.summary.show_note("<i>No LLM compiled yet. Compile asks for calibration text, then writes a "
                                             "prefill MXQ, a decode MXQ and a manifest for Try a Compiled LLM.</i>")
            return
        path = manifests[-1]
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            self.run_panel.summary.show_note(f"<b>{html.escape(str(path))}</b> cannot be read: {html.escape(str(error))}")
            return
        accuracy = "".join(
            f"<br>{kind}: mean output cosine {summary['mean_output_cosine']:.4f}, min SQNR "
            f"{summary.get('min_output_sqnr_db', float('nan')):.1f} dB on held-out samples ({summary.get('verdict')})"
            for kind, summary in manifest.get("analysis", {}).items()
            if isinstance(summary, dict) and isinstance(summary.get("mean_output_cosine"), float))
        self.run_panel.summary.show_note(
            f"<b>Compiled LLM</b> ({len(manifests)} in this project)<br><b>Manifest</b> {html.escape(str(path))}<br>"
            f"<b>MXQs</b> {html.escape(str(manifest.get('prefill')))}, {html.escape(str(manifest.get('decode')))}<br>"
            f"<b>Device</b> {html.escape(str(manifest.get('device')))} · <b>preset</b> "
            f"{html.escape(str(manifest.get('preset')))} · prefill {manifest.get('prefill_len')} tokens, cache "
            f"{manifest.get('max_len')} positions{accuracy}<br>Compile › Try a Compiled LLM generates with it beside "
            "FP32.")

    def _on_compiled(self, run_id: int, outcome: CompileOutcome) -> None:
        config, summary, model_sha256, preset = self._compile_settings
        self._compile_run_id = None  # the folder is the run's now
        run = RunRecord.from_result(run_id, outcome.result, outcome.analysis, config=config, config_summary=summary,
                                    precisions=outcome.precisions, duration_s=outcome.duration_s,
                                    model_sha256=model_sha256, calibration=self._compile_calibration, preset=preset)
        self.run_panel.finished("Done")
        self.session.add_run(run)  # the summary, compare view and details follow runs_changed
        self.statusBar().showMessage(f"Compiled {Path(run.mxq_path).name} in {run.duration_s:.1f} s", 8000)
        self.mark_dirty()
        self._outcomes["compile"] = "done"

    def _discard_run_dir(self) -> None:
        if self._compile_run_id is None:  # an LLM compile (its child removed its own folder)
            return
        run_dir, self._compile_run_id = self.project.run_dir(self._compile_run_id), None
        if run_dir.exists():  # a fresh folder of this compile only (the child normally removed it)
            shutil.rmtree(run_dir, ignore_errors=True)

    def _on_compile_failed(self, error: Exception) -> None:
        self._discard_run_dir()
        self.run_panel.finished(f"Failed: {getattr(error, 'code', type(error).__name__)}")
        if self.is_llm:
            self._show_llm_summary()
        self._outcomes["compile"] = "failed"
        dialogs.show_error(self, "Compile failed", error)

    def _on_compile_cancelled(self) -> None:
        self._discard_run_dir()  # (an LLM compile's child removed its own folder)
        self.run_panel.finished("Cancelled")
        if self.is_llm:
            self._show_llm_summary()
        self.statusBar().showMessage("Compile cancelled; nothing was written.", 6000)
        self._outcomes["compile"] = "cancelled"

    def start_sensitivity(self) -> bool:
        """Run the layer sensitivity analysis with the current settings in the background; show its table."""
        from qbstudio.tasks import sensitivity_report

        if self.loaded is None or not self.project.has_mblt:
            dialogs.show_error(self, "Nothing to analyze", "Import a model first.")
            return False
        if not self._idle("analyze sensitivity"):
            return False
        readiness = self.readiness()
        if not readiness.ok:
            dialogs.show_error(self, "Cannot analyze", readiness.reason)
            return False
        if not self._has_calibration_data():
            return False
        calibration = self.project.calibration
        worker = Worker("sensitivity", sensitivity_report, self.project.mblt_path, self.project.settings.config,
                        calibration.path, calibration.use_random)
        worker.progress.connect(self.run_panel.show_progress)
        worker.succeeded.connect(self._on_sensitivity)
        worker.failed.connect(self._on_sensitivity_failed)
        worker.cancelled.connect(lambda: self.run_panel.finished("Sensitivity analysis cancelled"))
        self.tabs.setCurrentIndex(2)
        self.run_panel.started(compiling=False)  # its clock, progress and Cancel; the last run's summary stays
        self.runner.start("compile", worker)  # one heavy job at a time: it shares the compile slot
        return True

    def _on_sensitivity(self, report: dict) -> None:
        from qbstudio.widgets.sensitivity_view import SensitivityDialog

        self.run_panel.finished("Sensitivity analysis done", complete=True)  # its bar read 0 % when done
        if self.sensitivity_dialog is None:
            self.sensitivity_dialog = SensitivityDialog(self)
            self.sensitivity_dialog.view.use_int16.connect(self.use_int16_for)
        self.sensitivity_dialog.view.set_report(report)
        self.sensitivity_dialog.show()
        self.sensitivity_dialog.raise_()

    def _on_sensitivity_failed(self, error: Exception) -> None:
        self.run_panel.finished(f"Failed: {getattr(error, 'code', type(error).__name__)}")
        dialogs.show_error(self, "Sensitivity analysis failed", error)

    def cancel_jobs(self) -> None:
        """Cancel the running compile, sweep, model or calibration-set job."""
        for slot in self._job_slots():
            self.runner.cancel(slot)

    def _on_busy_changed(self, slot: str, busy: bool) -> None:
        self.act_cancel.setEnabled(self.running_job() is not None)
        self._update_can_compile()
        if slot == FIT_SLOT and not busy and self._fit_again:
            self._fit_again = False
            self.check_fit()
        outcome = None if busy else self._outcomes.pop(slot, None)
        if slot == "compile" and outcome:  # announced once the job slot is free for the next one
            self.compile_finished.emit(outcome)
        elif slot == "model" and outcome:
            self.model_ready.emit()

    def readiness(self):
        """Whether Compile can start now, and why not (:class:`~qbstudio.state.model_fit.Readiness`)."""
        from qbstudio.state.model_fit import Readiness

        if self.loaded is None:
            return Readiness(False, "Import a model first.")
        if self.runner.is_busy("model"):
            return Readiness(False, "The model is still loading.")
        if self.is_llm:
            return Readiness(True)  # its compile asks for calibration text (start_llm_compile)
        calibration = self.project.calibration.path
        if calibration and not Path(calibration).exists():  # a project reopened after its data folder moved
            return Readiness(False, f"The calibration data '{calibration}' is not there any more (moved or "
                                    f"renamed?): choose it again in the Calibration tab.")
        return compile_readiness(self.loaded.model, self.report, self.project.settings.config.cpu_offload)

    def _update_can_compile(self) -> None:
        readiness = self.readiness()
        ready = readiness.ok and not self.runner.is_busy("compile")
        self.act_compile.setEnabled(ready)
        self.act_compile.setToolTip("Quantize and compile to an MXQ" if ready else readiness.reason)
        self.run_panel.set_can_compile(ready, readiness.reason, offload_helps=readiness.offload_helps)

    def enable_cpu_offload(self) -> None:
        """Run the unsupported head/tail layers on the host CPU (the one-click fix Compile offers)."""
        self.options.set_value("cpuOffload", True)
        self.statusBar().showMessage("CPU offload on: the unsupported head/tail layers run on the host CPU.", 6000)

    # ================================================================== saving

    def mark_dirty(self) -> None:
        """Note an edit: the project is autosaved shortly."""
        self._dirty = True
        self._update_title()
        self._update_can_compile()
        self._autosave_timer.start()

    @property
    def has_unsaved_work(self) -> bool:
        """Whether the project has runs but no project file of its own (untitled or the sample)."""
        return not self.project.writable and len(self.project.runs) > 0

    def confirm_leave(self, why: str) -> bool:
        """Before ``why`` (closing, New ...): offer to save unsaved runs, or edits its own file refused (a read-only
        folder); False if the user cancelled."""
        refused = self.project.writable and self._dirty and self.autosave() is None
        if not self.has_unsaved_work and not refused:
            return True
        answer = dialogs.ask_save_changes(self, self.project.name, why)
        if answer == dialogs.SAVE:
            return self._on_save_as()
        return answer == dialogs.DISCARD  # discarded work still has its autosave in File > Recent Projects

    def _autosave_path(self) -> Path:
        return self.dirs.autosave_dir / f"{self.project.work_dir.name}{PROJECT_SUFFIX}"

    def _is_autosave(self, path: Path | None) -> bool:
        return path is not None and Path(path).parent.resolve() == self.dirs.autosave_dir.resolve()

    def autosave(self) -> Path | None:
        """Save now: to the project file when it has one, else to the autosave folder (listed in Recent)."""
        self._autosave_timer.stop()
        try:
            if self.project.writable:
                path = self.project.save()
                self._show_adopted_runs()
            elif self.project.model is not None and (self._dirty or self._autosave_path().exists()):
                path = self.project.write_copy(self._autosave_path())  # not for a sample opened and left as it is
                if self.preferences.recent_projects[:1] != [str(path)]:
                    self.preferences.add_recent_project(path)
                    self._fill_recent_menus()
                    self._save_preferences()
            else:
                return None
        except QBCompilerError as error:
            logger.error("autosave failed: %s", error)
            return None
        self._dirty = False
        self._update_title()
        return path

    def _say_read_only(self) -> None:
        """The project's folder cannot be written (a read-only share or medium): say so on open, not only when a compile
        or the autosave fails."""
        text = (f"{self.project.path.parent} cannot be written: compiles and saves need a copy elsewhere (File › Save "
                "Project As…).")
        logger.warning("%s", text)
        dialogs.show_info(self, "Read-only project", f"{text}\n\nYou can look at its graph, settings and runs here.")

    def _show_adopted_runs(self) -> None:
        """Runs another window (the project open twice) saved in the project file are listed here too."""
        adopted = self.project.adopted_run_ids
        if adopted:
            self.session.runs_changed.emit()
            self.statusBar().showMessage(
                f"{self.project.path.name} was also changed by another window: its run(s) "
                f"{', '.join(f'#{run_id}' for run_id in adopted)} are kept and listed in Runs & Compare.", 15000)

    def save_project_as(self, path: str | Path) -> bool:
        """Save the project to ``path`` (its work folder moves beside it).

        An untitled project's autosave and work folder go once it is saved: Recent lists the saved file only.
        """
        autosave = None if self.project.writable else self._autosave_path()
        try:
            saved = self.project.save(path)
        except (QBCompilerError, OSError) as error:
            dialogs.show_error(self, "Cannot save project", error)
            return False
        if autosave is not None:
            self._forget_autosave(autosave)
        self.preferences.add_recent_project(saved)
        self._remember("project", saved)
        self.calibration.work_dir = self.project.work_dir
        self._hold_project_lock()  # the new place's (Save As to a project open elsewhere says so)
        self._show_moved_runs()
        self._update_title()
        self.statusBar().showMessage(f"Saved {saved}", 5000)
        return True

    def _show_moved_runs(self) -> None:
        """Show the runs again after Save As moved their files with the work folder (the run panel kept the old
        MXQ path, in the untitled project's folder that is pruned later)."""
        self._show_history()
        shown = self.run_panel.summary.run
        if not self.run_panel.running and shown is not None and not self.is_llm:
            self.run_panel.summary.show_run(shown)

    def _forget_autosave(self, autosave: Path) -> None:
        """Delete a just-saved untitled project's autosave and its Recent entry (its old work folder is pruned at
        a later start, once nothing shows it: :meth:`AppDirs.prune_untitled`)."""
        autosave.unlink(missing_ok=True)
        self.preferences.recent_projects = [item for item in self.preferences.recent_projects
                                            if Path(item).resolve() != autosave.resolve()]
        self._fill_recent_menus()

    def _on_save(self) -> None:
        if self.project.writable:
            self.save_project_as(self.project.path)
        else:
            self._on_save_as()

    def suggested_project_name(self) -> str:
        """The file name Save As proposes: the project's, or for an untitled one its model's ("Untitled" says
        nothing in a folder of projects)."""
        project = self.project
        if project.path is None and project.model is not None:
            return f"{Path(project.model.path).stem}{PROJECT_SUFFIX}"
        return f"{project.name}{PROJECT_SUFFIX}"

    def save_as_folder(self) -> Path:
        """Where Save As starts: the last folder a project was opened from or saved to, else the model's folder."""
        model = self.project.model
        remembered = self.preferences.last_dir("project")
        if remembered and Path(remembered).resolve() != self.dirs.autosave_dir.resolve():  # (older versions kept it)
            return Path(remembered)
        return Path(model.path).parent if model is not None and Path(model.path).parent.is_dir() else Path.home()

    def documents_folder(self) -> Path:
        """Where exports (reports, CSVs, configs, calibration sets) start: the saved project's folder, else where
        Save As starts; never the project's work folder or the app's autosave folder, which the app manages."""
        if self.project.writable and self.project.path is not None:
            return Path(self.project.path).parent
        return self.save_as_folder()

    def _on_save_as(self) -> bool:
        start = str(self.save_as_folder() / self.suggested_project_name())
        path, _ = QFileDialog.getSaveFileName(self, "Save project", start, PROJECT_FILTER)
        return bool(path) and self.save_project_as(path)

    def _on_open(self) -> None:
        if not self._idle("open a project or model"):  # before the file dialog: the choice would be lost
            return
        path, _ = QFileDialog.getOpenFileName(self, "Open project or model", self.preferences.last_dir("project"),
                                              OPEN_FILTER)
        if path:
            self.open_path(path)

    def _on_import(self) -> None:
        if not self._idle("import a model"):
            return
        path, _ = QFileDialog.getOpenFileName(self, "Import model", self.preferences.last_dir("model"), MODEL_FILTER)
        if path:
            # saved_model.pb or a HuggingFace config.json stands for the model folder holding it
            self.import_model(Path(path).parent if Path(path).name in MODEL_FOLDER_MARKERS else path)

    def _on_import_folder(self) -> None:
        if not self._idle("import a model"):
            return
        path = QFileDialog.getExistingDirectory(self, "Import model folder (SavedModel or HuggingFace)",
                                                self.preferences.last_dir("model"))
        if path:
            self.import_model(path)

    def _on_settings_changed(self) -> None:
        self.calibration.refresh()
        self.mark_dirty()
        if self.report is not None and self._shown_cpu_split != self._cpu_split():
            self._show_report()  # cpuLayers or CPU offload changed (a loaded config, a preset): the graph shows the split
        if self.loaded is not None and self._fit_key() != self._fit_checked:
            self.check_fit()  # an int16 preset or override may make a layer too large

    def _on_calibration_changed(self) -> None:
        self.options.refresh()
        self._update_can_compile()
        kept = [note for note in self.fit_notes if not note.startswith(CALIBRATION_NOTE)]
        if len(kept) != len(self.fit_notes) and self.project.calibration.path != self._fit_source:
            self.fit_notes = kept  # the note named the source the user has just replaced
            self._update_model_label()
        self.mark_dirty()

    # ================================================================== window chrome

    def _update_title(self) -> None:
        self.setWindowTitle(f"{self.project_title()}{' •' if self._dirty else ''} — qb Studio")
        model = self.project.model
        where = "sample project (not saved yet)" if self.project.template else str(self.project.path or "untitled")
        self.status_label.setText(f"{where} · {Path(model.path).name if model else 'no model'}")

    def project_title(self) -> str:
        """The project's name as the title bar and Recent list show it (untitled ones by their model)."""
        project = self.project
        if project.template:
            return f"{project.name} (sample)"
        if project.path is None and project.model is not None:
            return f"{project.name} — {Path(project.model.path).name}"
        return project.name

    def _outputs_text(self, shown: int = 4) -> str:
        """The graph's outputs for the model label: the first ``shown`` with their shapes, then how many more (and
        where to choose them)."""
        if self.loaded is None or self.is_llm:
            return ""
        outputs = list(self.loaded.model.graph.outputs)
        text = "".join(f"<br>output {html.escape(value.name)}: {list(value.shape or [])}" for value in outputs[:shown])
        if len(outputs) > shown:
            text += f"<br>… and {len(outputs) - shown} more output(s) (File › Choose Model Outputs…)"
        return text

    def _update_model_label(self) -> None:
        model = self.project.model
        if model is None:
            self.model_label.setText("<i>No model. File › Import Model… or drop a model file here.</i>")
            return
        nodes = (" (source not found)" if self.source_missing and not self.loaded and not self.project.has_mblt
                 else " (loading…)" if not self.loaded else
                 "".join(f", {name.lower()} {len(self.loaded.graph(name)[1].graph)} nodes"
                         for name in self.loaded.graph_names) or f", {len(self.loaded.model.graph)} nodes")
        shapes = "".join(f"<br>{name}: {dims}" for name, dims in model.input_shapes.items())
        cut = f"<br>cut at: {html.escape(', '.join(model.output_names))}" if model.output_names else ""
        inputs = "".join(f"<br>input {spec.name}: {list(spec.shape)} {spec.dtype.name}" for spec in self._specs())
        inputs += self._outputs_text()
        notes = "".join(f"<li>{html.escape(note)}</li>" for note in self.fit_notes)
        notes = f"<div style='color:#b26a00'><b>Settings re-derived for this model:</b><ul>{notes}</ul></div>" if notes else ""
        if self.source_missing and self.project.has_mblt:
            notes += ("<div style='color:#b26a00'>The source file is not at this path any more: shown and compiled "
                      "is the graph parsed from it at import, saved in the project. Import Model… parses it anew.</div>")
        self.model_label.setText(f"<b>{Path(model.path).name}</b><br>backend: <b>{model.backend}</b>{nodes}"
                                 f"{shapes if not inputs else ''}{inputs}{cut}{notes}")

    def _fill_recent_menus(self) -> None:
        for menu, items in ((self.recent_projects_menu, self.preferences.recent_projects),
                            (self.recent_models_menu, self.preferences.recent_models)):
            menu.clear()
            for item in items:
                menu.addAction(self.recent_label(item)).triggered.connect(lambda _=False, p=item: self.open_path(p))
            menu.setEnabled(bool(items))
        self.welcome.set_recent([(self.recent_label(path), path) for path in self.preferences.recent_projects])

    def recent_label(self, path: str) -> str:
        """How a Recent entry reads: autosaved untitled projects by their model, others by path."""
        if not self._is_autosave(Path(path)):
            return path
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            model = Path((data.get("model") or {}).get("path") or "no model").name
            when = datetime.fromtimestamp(Path(path).stat().st_mtime).strftime(" %Y-%m-%d %H:%M")
        except (OSError, ValueError):
            model, when = "unreadable", ""
        # the time tells two untitled projects of one model apart (found under Xvfb: two identical lines)
        return f"{data.get('name', 'Untitled') if model != 'unreadable' else 'Untitled'} — {model} (autosaved{when})"

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
        screen = self.screen() or QGuiApplication.primaryScreen()
        available = screen.availableGeometry().size() if screen is not None else None
        if window.get("geometry"):
            self.restoreGeometry(QByteArray.fromBase64(window["geometry"].encode()))
            if available is not None:  # saved on a larger screen: no bigger than this one
                self.resize(self.size().boundedTo(available))
        else:
            self.resize(default_window_size(available))
        if window.get("state"):
            self.restoreState(QByteArray.fromBase64(window["state"].encode()))
            self._log_beside_layers = bool(window.get("logBesideLayers"))  # put there on a small screen
        self._default_docks = not window.get("state")

    def _splitters(self) -> dict[str, QSplitter]:
        """The splitters whose sizes persist, by object name (the docks' sizes are in ``saveState``)."""
        return {splitter.objectName(): splitter for splitter in self.findChildren(QSplitter)
                if splitter.objectName() in PERSISTENT_SPLITTERS}

    def _restore_splitters(self) -> None:
        saved = self.preferences.window.get("splitters") or {}
        for name, splitter in self._splitters().items():
            if isinstance(saved.get(name), str):
                splitter.restoreState(QByteArray.fromBase64(saved[name].encode()))

    def _store_layout(self) -> None:
        window = self.preferences.window
        tab = self.tabs.currentIndex() if self.workbench_ready else window.get("tab", 0)
        splitters = ({name: bytes(splitter.saveState().toBase64()).decode() for name, splitter in
                      self._splitters().items()} if self.workbench_ready else window.get("splitters", {}))
        self.preferences.window = {"geometry": bytes(self.saveGeometry().toBase64()).decode(),
                                   "state": bytes(self.saveState().toBase64()).decode(), "tab": tab,
                                   "splitters": splitters, "logBesideLayers": self._log_beside_layers}

    def show_about(self) -> None:
        """The About box."""
        from PySide6 import __version__ as pyside_version

        QMessageBox.about(self, "About qb Studio", dialogs.about_text({
            "compiler_core": core_version, "PySide6": pyside_version, "Log file": self.dirs.log_file}))

    def show_setup_check(self) -> None:
        """The Check My Setup dialog (imported on use: it pulls in the calibration stack)."""
        from qbstudio.widgets import setup_check

        setup_check.show_dialog(self, self.dirs)

    def try_on_inputs(self, run: RunRecord, paths: list[str] | None = None) -> Worker | None:
        """Run images or ``.npy`` files (asked for when ``paths`` is None) through ``run``'s MXQ beside the FP32 graph;
        the results open in a window."""
        if not self._idle("run inputs"):
            return None
        from qbstudio.widgets.try_inputs import TryResultsDialog, compare_job, try_inputs_filter

        if paths is None:
            paths, _ = QFileDialog.getOpenFileNames(self, "Inputs to run through the MXQ",
                                                    str(Path(self.project.calibration.path or "").parent),
                                                    try_inputs_filter(len(self.calibration.specs)))
            if not paths:
                return None
        worker = Worker("try", compare_job, run.mxq_path, str(self.project.mblt_path), list(paths))
        label = f"Run #{run.run_id} ({run.config_summary or run.device})"

        def show(results) -> None:
            self.try_dialog = TryResultsDialog(results, label, self)
            self.try_dialog.show()

        worker.succeeded.connect(show)
        worker.failed.connect(lambda error: dialogs.show_error(self, "Cannot run the inputs", error))
        self.runner.start(TRY_SLOT, worker)
        return worker

    def show_llm_try(self) -> None:
        """The "Try it" window of a compiled LLM (imported on use)."""
        manifests = self.llm_manifests if self.is_llm else []
        self._llm_try = dialogs.open_llm_try(self, str(manifests[-1]) if manifests else None)

    def _open_folder(self, path: Path) -> None:
        if not open_folder(path):
            dialogs.show_info(self, "Cannot open the folder", f"No file manager could be started. The folder is:\n"
                                                              f"{Path(path).parent}")

    def open_docs(self) -> None:
        """Open the documentation folder that ships with the app."""
        self._open_folder(DOCS_DIR / "README.md")

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """On the first show: note the time, build the deferred panels, size the docks if no layout was saved."""
        super().showEvent(event)
        if self.shown_at is None:
            self.shown_at = time.perf_counter()
            self.windowHandle().screenChanged.connect(lambda screen: self.fit_to_screen())
            self.fit_to_screen()
        if self._defer_build:
            self._defer_build = False
            QTimer.singleShot(0, self._build_deferred)
        if self._default_docks:
            self._default_docks = False
            self.resizeDocks([self.layers_dock], [430], Qt.Orientation.Horizontal)
            self.resizeDocks([self.log_dock], [130], Qt.Orientation.Vertical)

    def fit_to_screen(self, available: QSize | None = None) -> None:
        """Make the window's minimum size fit ``available`` (default: its screen's free area, in logical pixels).

        On a small or scaled screen the log shares the layer dock's column (as a tab), the layer dock may be
        narrower and the tab pages scroll if they must; where the window fits, the layout is the usual one. The
        window is made no larger than the screen.
        """
        if available is None:
            screen = self.screen() or QGuiApplication.primaryScreen()
            if screen is None:
                return
            available = screen.availableGeometry().size()
        self._set_screen_limits(ScreenLimits())
        small = not fits(self._measured_minimum(), available)
        self._place_log(beside_layers=small)
        if not small:
            return
        limits = screen_limits(self._measured_minimum(), self.central.minimumSizeHint(), available)
        self._set_screen_limits(limits)
        logger.info("the screen (%dx%d) is smaller than the window's usual minimum: the log is a tab beside the "
                    "layer support", available.width(), available.height())
        self.layout().activate()  # the window's new minimum, before it is resized to the screen
        self.resize(self.size().boundedTo(available))

    def _measured_minimum(self) -> QSize:
        self.layout().invalidate()
        return self.minimumSizeHint()

    def _set_screen_limits(self, limits: ScreenLimits) -> None:
        self.layers_dock.setMinimumWidth(limits.dock_width)
        self.layers_area.set_limit(limits.dock)
        self.central_area.set_limit(limits.central)

    def _place_log(self, beside_layers: bool) -> None:
        """The log below the tabs, or (on a small screen) a tab beside the layer support, which stays in front."""
        if beside_layers == self._log_beside_layers or self.log_dock.isFloating():
            return
        self._log_beside_layers = beside_layers
        if beside_layers:
            self.tabifyDockWidget(self.layers_dock, self.log_dock)
            self.layers_dock.raise_()
        else:
            self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.log_dock)
            self.resizeDocks([self.log_dock], [130], Qt.Orientation.Vertical)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 (Qt override)
        """Accept dropped local files."""
        if event.mimeData().hasUrls() and any(url.isLocalFile() for url in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 (Qt override)
        """Open what was dropped: a project, a model, or calibration data (see :meth:`open_dropped`)."""
        files = [url.toLocalFile() for url in event.mimeData().urls() if url.isLocalFile()]
        if files:
            event.acceptProposedAction()
            self.open_dropped([Path(file) for file in files])

    def open_dropped(self, paths: list[Path]) -> bool:
        """One dropped item: a project or a model opens; a data folder, ``.txt`` list or ``.json`` manifest becomes the
        calibration data of the open model. Anything else, or several items, is refused saying what can be dropped.
        """
        if len(paths) != 1:
            names = ", ".join(path.name for path in paths[:3]) + (" ..." if len(paths) > 3 else "")
            dialogs.show_info(self, "Drop one item", f"{len(paths)} items were dropped ({names}). Drop one model, "
                                                     f"project, or calibration folder at a time ({DROP_KINDS}).")
            return False
        path = paths[0].parent if paths[0].name in MODEL_FOLDER_MARKERS else paths[0]  # a HuggingFace config.json
        if path.suffix.lower() == PROJECT_SUFFIX or is_model_path(path):
            self.open_path(path)
            return True
        if not (path.is_dir() or path.suffix.lower() in CALIBRATION_FILE_SUFFIXES):
            dialogs.show_info(self, "Cannot open the dropped file", f"'{path.name}' is neither a model, a project "
                                                                     f"nor calibration data. Drop {DROP_KINDS}.")
            return False
        if self.loaded is None or self.is_llm:
            dialogs.show_info(self, "Import a model first", f"'{path.name}' is not a model: as calibration data it "
                                                            "needs a model. Import the model first, then drop its "
                                                            "calibration data on the window.")
            return False
        self.calibration.set_source(path)
        self.tabs.setCurrentWidget(self.calibration)
        self.statusBar().showMessage(f"Calibration data: {path}", 6000)
        return True

    def emergency_save(self) -> None:
        """Save whatever can be saved (called by the exception hook); never raises."""
        try:
            self.autosave()
        except Exception:  # noqa: BLE001 - last resort
            logger.exception("emergency save failed")

    def _on_quit(self) -> None:
        if self._may_stop_job():
            self._stop_agreed = True
            self.close()
            self._stop_agreed = False  # the close was refused (save changes? Cancel)

    def _may_stop_job(self) -> bool:
        """True if no job runs, or if the user agrees to stop it to quit."""
        job = self.running_job()
        return job is None or dialogs.ask_yes_no(
            self, "A job is running", f"{job[:1].upper()}{job[1:]} is still running. Stop it and quit? What it has "
                                      "done so far is lost.")

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt override)
        """Offer to stop a running job (when the user closes the window) and to save unsaved runs; stop jobs,
        autosave, remember the layout."""
        if event.spontaneous() and not self._stop_agreed and not self._may_stop_job():
            event.ignore()
            return
        if not self.confirm_leave("closing"):
            event.ignore()
            return
        self.runner.shutdown()
        self.autosave()
        if self._project_lock is not None:
            self._project_lock.unlock()
        self._store_layout()
        self._save_preferences()
        logging.getLogger().removeHandler(self.log_handler)
        self.log_handler.stop()
        super().closeEvent(event)
