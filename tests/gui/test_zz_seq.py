import sys
sys.path.insert(0, "/work/wt/s16-gui3/tests/gui")
from pathlib import Path
from PySide6.QtWidgets import QApplication, QLabel, QAbstractButton, QTableWidget
from test_user_path import SAMPLE_PROJECT, TIMEOUT_MS, answers, make_window, wait_model, open_sample_with_preview  # noqa
OUT = Path("/tmp/s16-gui3/seq"); OUT.mkdir(parents=True, exist_ok=True)

def texts(w):
    out = []
    for lab in w.findChildren(QLabel):
        if lab.isVisible() and lab.text().strip(): out.append("L:" + lab.text()[:160].replace("\n", " | "))
    for b in w.findChildren(QAbstractButton):
        if b.isVisible() and b.text(): out.append("B:" + b.text())
    for t in w.findChildren(QTableWidget):
        if t.isVisible():
            hdr = [t.horizontalHeaderItem(i).text() if t.horizontalHeaderItem(i) else "?" for i in range(t.columnCount())]
            out.append(f"T:{t.objectName()} {t.rowCount()}x{t.columnCount()} {hdr}")
            for r in range(min(3, t.rowCount())):
                out.append("   " + " | ".join((t.item(r, c).text() if t.item(r, c) else "-") for c in range(t.columnCount())))
    return out

def snap(window, name):
    QApplication.processEvents()
    window.grab().save(str(OUT / f"{name}.png"))
    (OUT / f"{name}.txt").write_text("\n".join(texts(window)))

def test_seq(qtbot, make_window, answers):
    window = make_window()
    open_sample_with_preview(qtbot, window)
    combo = window.device_combo
    print("devices", [combo.itemText(i) for i in range(combo.count())], combo.currentText())
    combo.setCurrentIndex((combo.currentIndex() + 1) % combo.count())
    QApplication.processEvents(); qtbot.wait(300)
    print("device now", combo.currentText(), "| options device", window.options.settings.device)
    window.tabs.setCurrentIndex(2)
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as b:
        assert window.start_compile()
    print("compile1", b.args, answers.errors)
    snap(window, "1_compiled")
    window.details.tabs.setCurrentWidget(window.details.performance)
    snap(window, "2_performance")
    view = window.details.performance
    if view.colour.isEnabled():
        view.colour.setChecked(True); qtbot.wait(1500)
    window.tabs.setCurrentIndex(0); qtbot.wait(1500)
    snap(window, "3_heatmap")
    m = window.options.method_combo
    m.setCurrentIndex((m.currentIndex() + 1) % m.count())
    print("method ->", m.currentText())
    window.tabs.setCurrentIndex(2)
    with qtbot.waitSignal(window.compile_finished, timeout=TIMEOUT_MS * 3) as b:
        assert window.start_compile()
    print("compile2", b.args, answers.errors)
    snap(window, "4_compiled2")
    ids = [r.run_id for r in window.session.runs.runs]
    print("runs", [(r.run_id, r.device, r.config_summary, r.label) for r in window.session.runs.runs])
    window.tabs.setCurrentWidget(window.compare)
    window.compare.set_picks(ids)
    for i in range(window.compare.tabs.count()):
        window.compare.tabs.setCurrentIndex(i); qtbot.wait(800)
        snap(window, f"5_compare_{i}_" + window.compare.tabs.tabText(i).replace(" ", "_").replace("&", ""))
