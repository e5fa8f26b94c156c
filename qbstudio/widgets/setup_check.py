"""Check my setup: versions, Netron, folders, the statistics cache and a test compile of the sample.

The same report backs the Help-menu dialog (:class:`SetupCheckDialog`) and ``qbstudio --check-setup``
(:func:`run_check`, no window: for bug reports and for testing an installation or the bundle). The test
compile parses and compiles the bundled sample in a child process exactly as the workbench compiles
a project (:func:`qbstudio.process_jobs.run_in_process`), so it also proves the compile process
starts in a frozen bundle.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
)

from compiler_core import __version__
from compiler_core.calibration.cache import StatisticsCache, default_cache_root
from compiler_core.errors import QBCompilerError
from compiler_core.resources import resource_dir, resource_path
from qbstudio import dialogs
from qbstudio.state.preferences import AppDirs
from qbstudio.widgets.screen_fit import resize_within_screen
from qbstudio.workers import JobRunner, Worker

logger = logging.getLogger(__name__)

COMPILE_TARGET = "qbstudio.tasks:compile_run"
OPTIONAL_FRONTENDS = {"PyTorch": "torch", "TensorFlow": "tensorflow", "TFLite reader": "tflite"}


@dataclass(frozen=True)
class Item:
    """One line of the report.

    Attributes:
        label: What is checked.
        value: What was found.
        ok: ``True`` fine, ``False`` a problem, ``None`` information only.
    """

    label: str
    value: str
    ok: bool | None = None


@dataclass(frozen=True)
class SampleCompile:
    """Outcome of :func:`compile_sample`.

    Attributes:
        mxq: The compiled sample.
        seconds: Wall time of parse plus compile.
        sha256: Hash of the MXQ file.
    """

    mxq: Path
    seconds: float
    sha256: str


def folder_size(folder: Path) -> tuple[int, int]:
    """``(bytes, files)`` under ``folder`` (0, 0 when it does not exist)."""
    if not folder.is_dir():
        return 0, 0
    sizes = [path.stat().st_size for path in folder.rglob("*") if path.is_file()]
    return sum(sizes), len(sizes)


def human_size(size: int) -> str:
    """``1.2 MB`` style size."""
    value = float(size)
    for unit in ("bytes", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def versions() -> list[Item]:
    """qb Studio, Python, Qt, PySide6 and QtWebEngine (Chromium) versions."""
    from PySide6 import __version__ as pyside_version
    from PySide6.QtCore import qVersion

    items = [Item("qb Studio", __version__), Item("Python", f"{platform.python_version()} ({sys.executable})"),
             Item("Platform", platform.platform()),
             Item("Bundle", "standalone (frozen)" if getattr(sys, "frozen", False) else "no (Python install)"),
             Item("Qt / PySide6", f"{qVersion()} / {pyside_version}")]
    try:
        from PySide6.QtWebEngineCore import qWebEngineChromiumVersion, qWebEngineVersion
    except ImportError as error:
        items.append(Item("QtWebEngine", f"missing ({error}): the graph view cannot work", False))
    else:
        items.append(Item("QtWebEngine", f"{qWebEngineVersion()} (Chromium {qWebEngineChromiumVersion()})", True))
    return items


def components() -> list[Item]:
    """Netron, our data files and the optional model frontends."""
    items = [_netron_item()]
    try:
        items.append(Item("Data files", str(resource_dir()), resource_path("netron", "bridge.js").is_file()))
    except QBCompilerError as error:
        items.append(Item("Data files", str(error), False))
    for label, module in OPTIONAL_FRONTENDS.items():
        found = importlib.util.find_spec(module) is not None
        items.append(Item(f"{label} frontend", "installed" if found else "not installed (optional)"))
    return items


def _netron_item() -> Item:
    try:
        from qbstudio.netron.scheme import netron_static_dir

        folder = netron_static_dir()
    except ImportError as error:
        return Item("Netron", f"missing ({error}): the graph view cannot work", False)
    import netron

    present = (folder / "index.html").is_file()
    version = getattr(netron, "__version__", "unknown version")
    return Item("Netron", f"{version} at {folder}" if present else f"{folder} has no index.html", present)


def folders(dirs: AppDirs) -> list[Item]:
    """Where settings, projects' work files, logs and the statistics cache are, with the cache's size."""
    size, files = folder_size(default_cache_root())
    return [Item("Settings", str(dirs.preferences_file)), Item("Data (untitled projects, autosave)", str(dirs.data)),
            Item("Log file", str(dirs.log_file)),
            Item("Statistics cache", f"{default_cache_root()} ({human_size(size)}, {files} files)")]


def report(dirs: AppDirs) -> list[tuple[str, list[Item]]]:
    """Every section of the report, in order."""
    return [("Versions", versions()), ("Components", components()), ("Folders", folders(dirs))]


def report_text(sections: list[tuple[str, list[Item]]]) -> str:
    """Plain-text form (for the clipboard and ``--check-setup``)."""
    marks = {True: "ok", False: "PROBLEM", None: ""}
    lines = []
    for title, items in sections:
        lines.append(f"[{title}]")
        lines += [f"  {item.label}: {item.value}" + (f"  [{marks[item.ok]}]" if item.ok is not None else "")
                  for item in items]
    return "\n".join(lines)


def clear_statistics_cache() -> int:
    """Delete the calibration-statistics cache entries; returns how many were deleted."""
    count = StatisticsCache(default_cache_root()).clear()
    logger.info("Cleared %d statistics cache entries in %s", count, default_cache_root())
    return count


def compile_sample(out_dir: Path, *, callback=None, cancel_token=None) -> SampleCompile:
    """Parse and compile the bundled sample in a child process, as the workbench does, into ``out_dir``.

    Raises:
        QBCompilerError: the parse or the compile failed (the same error the workbench would show).
    """
    from compiler_core.config.models import CompileConfig
    from qbstudio.process_jobs import run_in_process
    from qbstudio.tasks import PARSE_TARGET

    sample = resource_path("samples", "fashion_cnn")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    mblt = run_in_process(PARSE_TARGET, str(sample / "model.onnx"), str(out_dir / "model.mblt"), backend="onnx",
                          input_shapes={}, callback=callback, cancel_token=cancel_token)
    config = CompileConfig.from_file(sample / "compile_config.yaml")
    save_path = out_dir / "run" / "fashion_cnn.mxq"
    run_in_process(COMPILE_TARGET, Path(mblt), save_path, config, str(sample / "calib"), False,
                   callback=callback, cancel_token=cancel_token)
    digest = hashlib.sha256(save_path.read_bytes()).hexdigest()
    return SampleCompile(save_path, time.perf_counter() - started, digest)


def run_check(dirs: AppDirs, output: str | None = None) -> int:
    """``qbstudio --check-setup``: print the report and the test compile's outcome; 0 when all is well.

    Args:
        dirs: The user folders.
        output: Keep the test compile in this folder (default: a temporary folder, deleted).
    """
    sections = report(dirs)
    print(report_text(sections), flush=True)
    problems = sum(item.ok is False for _title, items in sections for item in items)
    out_dir = Path(output) if output else Path(tempfile.mkdtemp(prefix="qbstudio-check-"))
    try:
        result = compile_sample(out_dir)
    except QBCompilerError as error:
        print(f"[Test compile]\n  failed: {error.one_line()}  [PROBLEM]")
        problems += 1
    else:
        print(f"[Test compile]\n  sample compiled in a child process in {result.seconds:.1f} s: "
              f"{result.mxq if output else result.mxq.name} (sha256 {result.sha256[:16]})  [ok]")
    finally:
        if not output:
            shutil.rmtree(out_dir, ignore_errors=True)
    print(f"{problems} problem(s) found." if problems else "No problems found.")
    return 1 if problems else 0


# ------------------------------------------------------------------------------------------ dialog


def show_dialog(parent, dirs: AppDirs) -> None:
    """Open the Check my setup dialog (modal)."""
    SetupCheckDialog(dirs, parent).exec()


class SetupCheckDialog(QDialog):
    """The report as a tree, with Copy, Clear cache and Test compile buttons."""

    def __init__(self, dirs: AppDirs, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Check My Setup")
        self.setObjectName("setupCheckDialog")
        resize_within_screen(self, 760, 520)
        self.dirs = dirs
        self.runner = JobRunner(self)
        self.tree = QTreeWidget(objectName="setupTree")
        self.tree.setHeaderLabels(["Item", "Found", "Status"])
        self.tree.setRootIsDecorated(False)
        self.status = QLabel(objectName="setupStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.clear_button = QPushButton("Clear Statistics Cache", objectName="setupClearCache")
        self.clear_button.setToolTip("Delete the cached calibration statistics (the next compile recomputes them)")
        self.clear_button.clicked.connect(self.clear_cache)
        self.compile_button = QPushButton("Test Compile", objectName="setupTestCompile")
        self.compile_button.setToolTip("Compile the bundled sample in a child process, as a project compile does")
        self.compile_button.clicked.connect(self.start_sample_compile)
        copy_button = QPushButton("Copy Report", objectName="setupCopy")
        copy_button.clicked.connect(self.copy_report)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        row = QHBoxLayout()
        for button in (self.compile_button, self.clear_button, copy_button):
            row.addWidget(button)
        row.addStretch(1)
        row.addWidget(buttons)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.status)
        layout.addLayout(row)
        self._scratch = Path(tempfile.mkdtemp(prefix="qbstudio-check-"))
        self.refresh()

    def refresh(self) -> None:
        """Collect the report again and show it."""
        self.sections = report(self.dirs)
        self.tree.clear()
        marks = {True: "✓ ok", False: "✗ problem", None: ""}
        for title, items in self.sections:
            header = QTreeWidgetItem(self.tree, [title])
            font = header.font(0)
            font.setBold(True)
            header.setFont(0, font)
            for item in items:
                QTreeWidgetItem(self.tree, [item.label, item.value, marks[item.ok]])
        for column in range(3):
            self.tree.resizeColumnToContents(column)

    def report_text(self) -> str:
        """The report as shown, plus the status line."""
        return report_text(self.sections) + (f"\n{self.status.text()}" if self.status.text() else "")

    def copy_report(self) -> None:
        """Put the report on the clipboard (for a bug report)."""
        QGuiApplication.clipboard().setText(self.report_text())
        self.status.setText("Report copied to the clipboard.")

    def clear_cache(self) -> None:
        """Delete the statistics cache after a confirmation."""
        if not dialogs.ask_yes_no(self, "Clear the statistics cache?",
                                  f"Delete the cached calibration statistics in {default_cache_root()}?"):
            return
        try:
            count = clear_statistics_cache()
        except OSError as error:
            dialogs.show_error(self, "Could not clear the cache", error)
            return
        self.status.setText(f"Deleted {count} cache entr{'y' if count == 1 else 'ies'}.")
        self.refresh()

    def start_sample_compile(self) -> None:
        """Compile the sample in the background."""
        self.compile_button.setEnabled(False)
        self.status.setText("Compiling the sample…")
        worker = Worker("setup-check", compile_sample, self._scratch / "sample")
        worker.progress.connect(self._on_progress)
        worker.succeeded.connect(self._on_compiled)
        worker.failed.connect(self._on_failed)
        worker.finished.connect(lambda: self.compile_button.setEnabled(True))
        self.runner.start("setup-check", worker)

    def _on_progress(self, event) -> None:
        if not self.compile_button.isEnabled():  # a late event must not hide the outcome
            self.status.setText(f"Compiling the sample: {event.stage}…")

    def _on_compiled(self, result: SampleCompile) -> None:
        self.status.setText(f"✓ Test compile: the sample compiled in a child process in {result.seconds:.1f} s.")

    def _on_failed(self, error: BaseException) -> None:
        self.status.setText("✗ Test compile failed.")
        dialogs.show_error(self, "Test compile failed", error)

    def done(self, result: int) -> None:  # noqa: D102 (QDialog override)
        if self.runner.is_busy("setup-check"):
            self.runner.shutdown()
        shutil.rmtree(self._scratch, ignore_errors=True)
        super().done(result)
