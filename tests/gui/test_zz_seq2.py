import sys
sys.path.insert(0, "/work/wt/s16-gui3/tests/gui")
from pathlib import Path
from PySide6.QtWidgets import QApplication
from test_user_path import TIMEOUT_MS, answers, make_window, open_sample_with_preview  # noqa
OUT = Path("/tmp/s16-gui3/seq2"); OUT.mkdir(parents=True, exist_ok=True)

def compile_now(qtbot, window):
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as b:
        assert window.start_compile()
    print("compile", b.args, answers)

def test_seq(qtbot, make_window, answers):
    window = make_window()
    open_sample_with_preview(qtbot, window)
    view = window.details.performance
    window.details.tabs.setCurrentWidget(view)
    window.set_device("regulus-ra") if hasattr(window, "set_device") else None
    print("device", window.project.settings.device)
    compile_now(qtbot, window)
    qtbot.waitUntil(lambda: view.report is not None, timeout=TIMEOUT_MS)
    print("modes", [view.mode.itemText(i) for i in range(view.mode.count())], "| summary:", view.summary.text())
    with qtbot.waitSignal(window.graph.heat_painted, timeout=5000):
        view.colour.setChecked(True)
    print("combo", window.graph.colour_combo.currentText(), "| legend", window.graph.heat_legend.title)
    qtbot.wait(1000); window.grab().save(str(OUT / "heat1.png"))
    first = view.report
    window.set_device("aries-rb")
    print("device", window.project.settings.device, "| perf report same object:", view.report is first, "| colour on:", view.colour.isChecked(), "| combo", window.graph.colour_combo.currentText())
    compile_now(qtbot, window)
    qtbot.waitUntil(lambda: view.report is not first and view.report is not None, timeout=TIMEOUT_MS)
    qtbot.wait(1500)
    print("modes2", [view.mode.itemText(i) for i in range(view.mode.count())], "| colour on:", view.colour.isChecked(), "| combo", window.graph.colour_combo.currentText(), "| legend", window.graph.heat_legend.title if window.graph.heat_legend.isVisible() else "-")
    window.grab().save(str(OUT / "heat2.png"))
    runs = window.session.runs.runs
    print("runs", [(r.run_id, r.device, r.config_summary) for r in runs])
    window.tabs.setCurrentWidget(window.compare)
    window.compare.set_picks([r.run_id for r in runs])
    qtbot.wait(500)
    side = window.compare.side
    t = side.table
    for r in range(t.rowCount()):
        print("  ", t.verticalHeaderItem(r).text() if t.verticalHeaderItem(r) else "", "|", " | ".join(t.item(r, c).text() if t.item(r, c) else "-" for c in range(t.columnCount())))
    window.grab().save(str(OUT / "compare.png"))
