"""The workbench on a small or scaled screen: the central area scrolls instead of pushing the window off screen.

At 150 % on a 1366x768 laptop (911x512 logical pixels), or 200 % on 1920x1080 (960x540), the window's minimum
size (1023x560: the Compile tab's options and run panel beside the layer support dock, the log below) was larger
than the screen: its right edge and status bar were off screen, out of reach without a window manager's help.
:func:`screen_limits` works out what each part may ask for on a given screen; on a screen where the window fits,
nothing changes (the same minimums, no scroll bars).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QObject, QSize
from PySide6.QtWidgets import QFrame, QScrollArea, QWidget

logger = logging.getLogger(__name__)

QWIDGETSIZE_MAX = (1 << 24) - 1

LAYERS_DOCK_WIDTH = 360
"""The layer support dock's minimum width where the screen has room: the Reason column stays in view."""
LAYERS_DOCK_NARROWEST = 240
"""Its minimum on a small screen: the layer names and statuses in view, the Reason column scrolled to."""
CENTRAL_SMALLEST = QSize(320, 200)
"""The least the tab pages are given on any screen (they scroll within it)."""


@dataclass(frozen=True)
class ScreenLimits:
    """What the layer dock and the central area may ask for on one screen.

    Attributes:
        dock_width: the layer support dock's minimum width.
        central: the most the central area asks for as its minimum (None: all its pages need).
    """

    dock_width: int = LAYERS_DOCK_WIDTH
    central: QSize | None = None

    @property
    def dock(self) -> QSize | None:
        """The cap on the layer dock content's minimum size (None: no cap)."""
        return None if self.dock_width == LAYERS_DOCK_WIDTH else QSize(self.dock_width, QWIDGETSIZE_MAX)


def fits(size: QSize, available: QSize) -> bool:
    """``size`` fits within ``available`` in both directions."""
    return size.width() <= available.width() and size.height() <= available.height()


def screen_limits(window_minimum: QSize, central_minimum: QSize, available: QSize) -> ScreenLimits:
    """The limits that make a window of minimum ``window_minimum`` (measured with no limits) fit ``available``.

    The dock gives up width first (down to :data:`LAYERS_DOCK_NARROWEST`), then the central area (down to
    :data:`CENTRAL_SMALLEST`); the central area alone gives up height.
    """
    over_width = max(0, window_minimum.width() - available.width())
    over_height = max(0, window_minimum.height() - available.height())
    if not over_width and not over_height:
        return ScreenLimits()
    dock_cut = min(over_width, LAYERS_DOCK_WIDTH - LAYERS_DOCK_NARROWEST)
    central = QSize(central_minimum.width() - (over_width - dock_cut), central_minimum.height() - over_height)
    return ScreenLimits(LAYERS_DOCK_WIDTH - dock_cut, central.expandedTo(CENTRAL_SMALLEST))


def resize_within_screen(window: QWidget, width: int, height: int) -> None:
    """Give a new window the size ``width`` x ``height``, no larger than the free area of the screen it opens on
    (its parent's): a 1040x560 window on a 911x512 screen (1366x768 at 150 %) had its buttons off screen."""
    anchor = window.parentWidget().window() if window.parentWidget() is not None else window
    screen = anchor.screen()
    size = QSize(width, height)
    window.resize(size.boundedTo(screen.availableGeometry().size()) if screen is not None else size)


class ScreenFitArea(QScrollArea):
    """A frameless scroll area (around the central widget, the layer dock's content) whose minimum size can be capped.

    Uncapped it asks for all its widget's minimum (no scroll bar ever shows); capped, the widget scrolls.
    """

    def __init__(self, widget: QWidget, name: str) -> None:
        # Not widgetResizable: that gives a widget with word-wrapped labels its preferred height for the width
        # (heightForWidth), so the layer dock's details pane was scrolled away on a screen with room for it.
        super().__init__(frameShape=QFrame.Shape.NoFrame, objectName=name)
        self.setWidget(widget)
        self.limit: QSize | None = None
        widget.installEventFilter(self)
        self.viewport().installEventFilter(self)

    def set_limit(self, limit: QSize | None) -> None:
        """Cap the minimum size this area asks for (None: no cap)."""
        self.limit = limit
        self.updateGeometry()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """The widget's minimum size, no more than the cap."""
        hint = self.widget().minimumSizeHint()
        return hint if self.limit is None else hint.boundedTo(self.limit)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """The widget's preferred size."""
        return self.widget().sizeHint()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        """The widget fills the viewport and is never smaller than its minimum (scrolled if the viewport is).

        A new page or a wider form changes the widget's minimum: the window's layout asks again.
        """
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self.updateGeometry()
            self._fit_widget()
        elif watched is self.viewport() and event.type() == QEvent.Type.Resize:
            self._fit_widget()
        return super().eventFilter(watched, event)

    def _fit_widget(self) -> None:
        self.widget().resize(self.viewport().size().expandedTo(self.widget().minimumSizeHint()))
