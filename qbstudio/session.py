"""The one session state every panel observes: the open project, its loaded model, the support report.

napari-style: panels never keep their own copy of the project. They render from :class:`Session`
when it announces a change, so switching project or model cannot leave a stale plot, thumbnail or
summary behind.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from qbstudio.state.project import Project
from qbstudio.state.runs import RunHistory, RunRecord

if TYPE_CHECKING:
    from qbstudio.tasks import LoadedModel

logger = logging.getLogger(__name__)


class Session(QObject):
    """The open project, the model loaded for it and the support report of that model.

    Args:
        project: The starting project.
        parent: Owner.

    Signals:
        project_changed(): another project is open (or New): every panel starts over.
        model_changed(): the loaded model changed (or was cleared): graph, support, calibration inputs.
        report_changed(): the support report was recomputed (device change).
        runs_changed(): a run was added for the current model.
    """

    project_changed = Signal()
    model_changed = Signal()
    report_changed = Signal()
    runs_changed = Signal()

    def __init__(self, project: Project, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.project = project
        self.loaded: LoadedModel | None = None
        self.report: Any = None

    def set_project(self, project: Project) -> None:
        """Open ``project``: its model is not loaded yet."""
        self.project, self.loaded, self.report = project, None, None
        logger.debug("session: project %s", project.name)
        self.project_changed.emit()

    def set_model(self, loaded: LoadedModel | None) -> None:
        """The project's model is now ``loaded`` (None: no model)."""
        self.loaded, self.report = loaded, None
        if loaded is not None and loaded.sha256:
            adopted = self.project.runs.adopt(loaded.sha256)
            if adopted:
                logger.info("%d run(s) saved before runs carried a model hash now belong to this model", adopted)
        self.model_changed.emit()

    def set_report(self, report: Any) -> None:
        """The support report of the loaded model on the current device."""
        self.report = report
        self.report_changed.emit()

    @property
    def model_sha256(self) -> str:
        """The loaded MBLT's hash ("" while none is loaded)."""
        return self.loaded.sha256 if self.loaded else ""

    @property
    def runs(self) -> RunHistory:
        """The project's runs of the loaded model only."""
        return self.project.runs.for_model(self.model_sha256)

    @property
    def latest_run(self) -> RunRecord | None:
        """The newest run of the loaded model."""
        return self.runs.latest

    def add_run(self, run: RunRecord) -> None:
        """Record a finished compile of the loaded model."""
        self.project.runs.add(run)
        self.runs_changed.emit()

    def rename_run(self, run_id: int, name: str) -> bool:
        """Name run ``run_id`` (an empty name gives back its default label); False if there is no such run."""
        run = self.project.runs.get(run_id)
        if run is None or run.name == name.strip():
            return False
        run.name = name.strip()
        self.runs_changed.emit()
        return True

    def remove_run(self, run_id: int) -> bool:
        """Forget run ``run_id`` of the project (its files stay on disk); False if there is no such run."""
        if self.project.runs.get(run_id) is None:
            return False
        self.project.runs.remove(run_id)
        self.runs_changed.emit()
        return True
