"""Architecture rules that must keep holding: the core never imports Qt or the workbench."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_BLOCK_QT = """
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('PySide6', 'pyqtgraph', 'qbstudio', 'shiboken6'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import compiler_core
for info in pkgutil.walk_packages(compiler_core.__path__, 'compiler_core.'):
    if info.name != 'compiler_core.__main__':
        importlib.import_module(info.name)
print('ok')
"""


def test_core_imports_without_qt():
    result = subprocess.run([sys.executable, "-c", _BLOCK_QT], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def test_core_sources_never_mention_qt():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "compiler_core").rglob("*.py")
                 if any(line.lstrip().startswith(("import PySide6", "from PySide6", "import qbstudio", "from qbstudio"))
                        for line in p.read_text().splitlines())]
    assert offenders == []


_HEAVY_AT_START = ("numpy", "onnx", "onnx_ir", "sympy", "onnxscript", "onnxruntime", "pyqtgraph", "torch")


def test_main_window_module_loads_without_the_heavy_libraries():
    """The window is shown before numpy/onnx load (they come one per event-loop turn afterwards);
    a module-level import of one of them in a widget the main window imports delays the first paint."""
    code = ("import sys, qbstudio.main_window; "
            f"print(sorted(name for name in {_HEAVY_AT_START!r} if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
