"""No wheel edits on unfocused fields: scrolling a form scrolls the form, not the value under the pointer.

One event filter, installed on every spin box, combo box and slider below a window: they take focus
only by click or Tab (never by the wheel), and a wheel event on one that has no focus is passed on to
its parent (the scroll area) instead of changing the value. (An application-wide filter would see
every event of QtWebEngine's widgets too, and crashed PySide6 6.12 here.)
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QApplication, QComboBox, QWidget

logger = logging.getLogger(__name__)

GUARDED = (QAbstractSpinBox, QComboBox, QAbstractSlider)


class WheelGuard(QObject):
    """The event filter; install it with :func:`guard_wheel`."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt API)
        """Swallow wheel events on unfocused value fields (ignored, so the parent scrolls)."""
        if event.type() == QEvent.Type.Wheel and not _focused(watched):
            event.ignore()  # QApplication then offers the event to the parent widgets
            return True
        return False


def _focused(widget: QWidget) -> bool:
    focus = QApplication.focusWidget()
    return focus is not None and (focus is widget or widget.isAncestorOf(focus))


def guard_wheel(root: QWidget) -> int:
    """Guard every spin box, combo box and slider below ``root`` (again for ones added later); returns how many."""
    guard = root.findChild(WheelGuard, "wheelGuard", Qt.FindChildOption.FindDirectChildrenOnly)
    if guard is None:
        guard = WheelGuard(root, objectName="wheelGuard")
    count = 0
    for kind in GUARDED:
        for widget in root.findChildren(kind):
            if widget.property("wheelGuarded"):
                continue
            if widget.focusPolicy() == Qt.FocusPolicy.WheelFocus:
                widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            widget.installEventFilter(guard)
            widget.setProperty("wheelGuarded", True)
            count += 1
    return count
