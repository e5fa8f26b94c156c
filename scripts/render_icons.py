"""Render packaging/icons/qbstudio.svg to the PNG sizes desktops use (hicolor theme layout).

Usage: ``python scripts/render_icons.py`` (needs PySide6; run again after editing the SVG and commit
the PNGs). Writes ``packaging/icons/hicolor/<N>x<N>/apps/qbstudio.png``.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
ICONS = ROOT / "packaging" / "icons"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def render(svg: Path, out_dir: Path, sizes: tuple[int, ...] = SIZES) -> list[Path]:
    """Write ``<out_dir>/<N>x<N>/apps/<svg stem>.png`` for each size; returns the files written."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (needed by QPainter)
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"not a valid SVG: {svg}")
    written = []
    for size in sizes:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        target = out_dir / f"{size}x{size}" / "apps" / f"{svg.stem}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not image.save(str(target), "PNG"):
            raise SystemExit(f"could not write {target}")
        written.append(target)
    return written


def main() -> None:
    """Render the application icon."""
    for path in render(ICONS / "qbstudio.svg", ICONS / "hicolor"):
        print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
