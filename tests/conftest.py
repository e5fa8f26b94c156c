"""Test-wide set-up: headless Qt and Chromium flags must be set before any QApplication exists."""

from __future__ import annotations

import os
from pathlib import Path

OFFSCREEN_SCREENS = Path(__file__).parent / "gui" / "offscreen_screens.json"
"""A 1920x1080 desktop (the offscreen default, 800x800, is smaller than the window's minimum) and two small logical
screens (1366x768 at 150 %, 1920x1080 at 200 %) a test moves the window to."""

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
if os.environ["QT_QPA_PLATFORM"] == "offscreen":
    os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={OFFSCREEN_SCREENS}"
os.environ.setdefault("QTWEBENGINE_CHROMIUM_FLAGS", "--no-sandbox --disable-gpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
