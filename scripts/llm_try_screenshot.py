"""Screenshot of the workbench's "Try a Compiled LLM" window: ``python scripts/llm_try_screenshot.py X.llm.json OUT.png``.

Generates (greedy, both the MXQ on the simulator and the FP32 reference) in this process, shows the
result in the panel and saves the window as a PNG (offscreen; no display needed).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def main() -> None:
    from PySide6.QtWidgets import QApplication

    from qbstudio.widgets.llm_try import generate_both, show_dialog

    manifest, output = sys.argv[1], sys.argv[2]
    prompt = sys.argv[3] if len(sys.argv) > 3 else "Once upon a time"
    app = QApplication.instance() or QApplication([])
    dialog = show_dialog(None, manifest)
    dialog.panel.prompt_edit.setText(prompt)
    dialog.panel.show_result(generate_both(manifest, prompt, dialog.panel.tokens_spin.value()))
    app.processEvents()
    dialog.grab().save(output)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
