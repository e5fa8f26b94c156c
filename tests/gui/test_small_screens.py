"""The workbench on small and scaled screens (s16, found under Xvfb at QT_SCALE_FACTOR 1.5 and 2).

The offscreen platform shows the screens of ``offscreen_screens.json`` (set by ``tests/conftest.py``): a 1920x1080
desktop and two small logical screens, 1366x768 at 150 % (911x512) and 1920x1080 at 200 % (960x540).
"""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtCore import QPoint, QRect, QSize, Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402
from PySide6.QtWidgets import QApplication, QWidget  # noqa: E402
from test_user_path import SAMPLE_PROJECT, SCREENSHOTS, answers, fake_run, make_window, wait_model  # noqa: E402, F401  (fixtures)

from qbstudio.widgets.screen_fit import LAYERS_DOCK_NARROWEST, LAYERS_DOCK_WIDTH, screen_limits  # noqa: E402

SMALL_SCREENS = {"1366x768 at 150%": QSize(911, 512), "1920x1080 at 200%": QSize(960, 540)}


def screen_named(name: str):
    return next(screen for screen in QGuiApplication.screens() if screen.name() == name)


def move_to(qtbot, window, name: str) -> None:
    """Move ``window`` to the screen called ``name`` (looked up each time: a QScreen's wrapper can outlive it)."""
    window.move(screen_named(name).geometry().topLeft())
    qtbot.waitUntil(lambda: window.screen().name() == name)
    QApplication.processEvents()


def reachable(window, widget: QWidget) -> bool:
    """``widget`` is inside the window once the central area has scrolled to it."""
    window.central_area.ensureWidgetVisible(widget, 0, 0)
    QApplication.processEvents()
    top_left = widget.mapTo(window, QPoint(0, 0))
    return window.rect().contains(QRect(top_left, widget.size()))


@pytest.mark.parametrize("name", SMALL_SCREENS)
def test_every_control_is_on_a_small_or_scaled_screen(qtbot, make_window, answers, name):  # noqa: F811
    """The window's minimum was 1023x560 on any screen: at 911x512 its right edge and status bar were off screen."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.open_path(SAMPLE_PROJECT))
    fake_run(window)
    move_to(qtbot, window, name)
    screen = screen_named(name)
    size = SMALL_SCREENS[name]
    assert screen.availableGeometry().size() == size
    for index in range(window.tabs.count()):
        window.tabs.setCurrentIndex(index)
        QApplication.processEvents()
        hint = window.minimumSizeHint()
        assert hint.width() <= size.width() and hint.height() <= size.height(), (
            window.tabs.tabText(index),
            hint,
        )
    assert window.width() <= size.width() and window.height() <= size.height()
    assert window.rect().contains(window.statusBar().geometry())
    assert window.tabifiedDockWidgets(window.layers_dock) == [
        window.log_dock
    ]  # the log: a tab beside the layers
    window.tabs.setCurrentWidget(window.compare)
    assert reachable(window, window.compare.csv_button)
    window.tabs.setCurrentIndex(2)
    for button in (window.run_panel.compile_button, window.run_panel.cancel_button):
        assert reachable(window, button), button.text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(SCREENSHOTS / f"s16_small_screen_{size.width()}x{size.height()}.png"))
    move_to(qtbot, window, "desktop")  # back on a large screen: the usual minimums
    assert window.central_area.limit is None and window.layers_area.limit is None
    assert window.dockWidgetArea(window.log_dock) == Qt.DockWidgetArea.BottomDockWidgetArea
    assert not window.tabifiedDockWidgets(window.layers_dock)


def test_a_screen_with_room_keeps_the_usual_minimums():
    usual = QSize(1023, 560)
    assert screen_limits(usual, QSize(643, 378), QSize(1024, 700)).central is None
    limits = screen_limits(usual, QSize(643, 378), QSize(911, 512))
    assert limits.dock_width == LAYERS_DOCK_WIDTH - 112 and limits.central == QSize(643, 330)
    assert (
        screen_limits(QSize(1200, 560), QSize(643, 378), QSize(911, 512)).dock_width == LAYERS_DOCK_NARROWEST
    )


@pytest.mark.parametrize("size", [QSize(1024, 700), QSize(1297, 691)])
def test_a_window_with_room_scrolls_nothing(qtbot, make_window, answers, size):  # noqa: F811
    """The central area and the layer dock scroll only on a small screen: where the window has room (1024x700, and
    1366x768's first window) every tab and the layer details pane show whole, as before."""
    window = make_window()
    wait_model(qtbot, window, lambda: window.open_path(SAMPLE_PROJECT))
    fake_run(window)
    window.resize(size)
    for index in range(window.tabs.count()):
        window.tabs.setCurrentIndex(index)
        QApplication.processEvents()
        for area in (window.central_area, window.layers_area):
            bars = (area.horizontalScrollBar(), area.verticalScrollBar())
            assert not any(bar.isVisible() for bar in bars), (window.tabs.tabText(index), area.objectName())
    assert (
        window.details.isVisible()
        and window.layers_area.widget().height() == window.layers_area.viewport().height()
    )
    assert window.dockWidgetArea(window.log_dock) == Qt.DockWidgetArea.BottomDockWidgetArea


def test_a_layout_saved_on_a_small_screen_has_the_log_below_on_a_large_one(qtbot, make_window, answers):  # noqa: F811
    """The window closed on a small screen (log tabbed beside the layer dock, saved so) opened on a large screen with
    the log still beside the layers: only the moves of the same session were undone."""
    from qbstudio.state.preferences import AppDirs, Preferences

    window = make_window()
    move_to(qtbot, window, "1366x768 at 150%")
    assert window.tabifiedDockWidgets(window.layers_dock) == [window.log_dock]
    window.close()
    path = AppDirs.default().preferences_file
    preferences = Preferences.load(path)
    del preferences.window["geometry"]  # the next start is on the desktop (another monitor, another scale)
    preferences.save(path)
    again = make_window()
    assert again.screen().name() == "desktop"
    assert again.dockWidgetArea(again.log_dock) == Qt.DockWidgetArea.BottomDockWidgetArea
    assert not again.tabifiedDockWidgets(again.layers_dock)


def test_the_workbench_s_windows_open_within_a_small_screen(qtbot, make_window, answers):  # noqa: F811
    """At 150 % on 1366x768 (911x512) Layer sensitivity opened 1040x560, Try a Compiled LLM 980x560 and Check My Setup
    760x520: their lower buttons and right edge off screen."""
    from qbstudio import dialogs
    from qbstudio.state.preferences import AppDirs
    from qbstudio.widgets.sensitivity_view import SensitivityDialog
    from qbstudio.widgets.setup_check import SetupCheckDialog
    from qbstudio.widgets.try_inputs import TryResultsDialog

    window = make_window()
    move_to(qtbot, window, "1366x768 at 150%")
    size = screen_named("1366x768 at 150%").availableGeometry().size()
    opened = [
        SensitivityDialog(window),
        dialogs.open_llm_try(window),
        SetupCheckDialog(AppDirs.default(), window),
        TryResultsDialog([], "Run #1", window),
    ]
    for dialog in opened:
        dialog.show()
        qtbot.waitExposed(dialog)
        hint = dialog.minimumSizeHint()
        assert dialog.width() <= size.width() and dialog.height() <= size.height(), (
            dialog.windowTitle(),
            dialog.size(),
        )
        assert hint.width() <= size.width() and hint.height() <= size.height(), (dialog.windowTitle(), hint)
        dialog.close()
    desktop = SensitivityDialog(make_window())  # a screen with room: the size it always had
    assert desktop.size() == QSize(1040, 560)
