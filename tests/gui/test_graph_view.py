"""GraphView: embedded Netron renders MBLTs offline, colours nodes by support and syncs selection.

Everything Netron-internal the overlay relies on (``window.__view__``, ``showNodeProperties``,
``target.select``/``scrollTo``, ``g#node-name-*`` ids, the 180-day date lock, the consent cookie,
``sendBeacon`` telemetry) is exercised here against the pinned netron package, offscreen.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

pytest.importorskip("PySide6.QtWebEngineWidgets")

from PySide6.QtCore import QPoint, Qt, QTimer, QUrl  # noqa: E402
from PySide6.QtGui import QColor  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402

from compiler_core.api import mblt_compile  # noqa: E402
from compiler_core.mblt.io import load_mblt  # noqa: E402
from compiler_core.targets import apply_offload, check_support, plan_cpu_offload  # noqa: E402
from qbstudio.netron.page import is_local_url  # noqa: E402
from qbstudio.netron.palette import SELECTION_COLOUR, SUPPORT_PALETTE  # noqa: E402
from qbstudio.netron.scheme import NetronSchemeHandler, model_url_path  # noqa: E402
from qbstudio.widgets.graph_view import GraphView, statuses_from_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "resources" / "samples" / "fashion_cnn" / "model.onnx"
SCREENSHOT = ROOT / "build" / "screenshots" / "graph_view.png"
SAMPLE_NODES = 13
RENDER_TIMEOUT_MS = 30_000
OLD_DATE = '<meta name="date" content="2020-01-01 00:00:00">'

# A mix of all four statuses on the sample (its real report is all "supported" on every device).
MIXED = {"Conv_0": "supported", "Relu_0": "needs_mfu", "MaxPool_0": "unsupported", "Conv_1": "cpu_offloaded"}
SWAPPED = {"Conv_0": "unsupported", "Relu_0": "supported", "MaxPool_0": "cpu_offloaded", "Conv_1": "needs_mfu"}


@pytest.fixture(scope="module")
def sample_mblt(tmp_path_factory) -> Path:
    return mblt_compile(SAMPLE, tmp_path_factory.mktemp("sample") / "fashion_cnn.mblt")


@pytest.fixture
def make_view(qtbot):
    """Factory for shown GraphViews; each is deleted (page before profile) at teardown."""
    views = []

    def make(**kwargs) -> GraphView:
        view = GraphView(**kwargs)
        view.resize(1000, 800)
        view.show()
        qtbot.waitExposed(view)
        views.append(view)
        return view

    yield make
    for view in views:
        delete_now(qtbot, view)


def delete_now(qtbot, view: GraphView) -> None:
    """``deleteLater`` and wait until it happened (children in order: the page, then the profile)."""
    deleted = []
    view.destroyed.connect(lambda: deleted.append(True))
    view.deleteLater()
    qtbot.waitUntil(lambda: bool(deleted), timeout=5000)


def open_model(qtbot, view: GraphView, path: Path) -> GraphView:
    with qtbot.waitSignal(view.ready, timeout=RENDER_TIMEOUT_MS):
        view.load_mblt(path)
    return view


def run_js(qtbot, view: GraphView, expression: str):
    """Evaluate ``expression`` in the page and return its JSON value."""
    results = []
    view.web_view.page().runJavaScript(f"JSON.stringify({expression})", 0, results.append)
    qtbot.waitUntil(lambda: len(results) > 0, timeout=5000)
    return json.loads(results[0]) if results[0] else None


def node_classes(qtbot, view: GraphView, names) -> dict[str, list[str]]:
    script = (f"Object.fromEntries({json.dumps(list(names))}.map(n => [n, Array.from("
              "document.getElementById('node-name-' + n).classList).filter(c => c.startsWith('qb-status-'))]))")
    return run_js(qtbot, view, script)


def header_fill(qtbot, view: GraphView, name: str) -> str:
    return run_js(qtbot, view, f"getComputedStyle(document.querySelector("
                               f"'#node-name-{name} > g.node-item-type > path')).fill")


def rgb(hex_colour: str) -> str:
    colour = QColor(hex_colour)
    return f"rgb({colour.red()}, {colour.green()}, {colour.blue()})"


def node_centre(qtbot, view: GraphView, name: str) -> QPoint:
    rect = run_js(qtbot, view, f"(() => {{ const r = document.querySelector("
                               f"'#node-name-{name} > g.node-item-type').getBoundingClientRect();"
                               " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
    zoom = view.web_view.page().zoomFactor()
    return QPoint(round(rect[0] * zoom), round(rect[1] * zoom))


def test_sample_renders_every_node_under_its_mblt_name(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(), sample_mblt)
    names = [node.name for node in load_mblt(sample_mblt).graph]
    assert len(names) == SAMPLE_NODES
    assert run_js(qtbot, view, "document.querySelectorAll('g[id^=node-name-]').length") == SAMPLE_NODES
    assert view.node_count == SAMPLE_NODES and view.is_ready
    assert run_js(qtbot, view, "window.__view__.activeTarget.nodes.map(n => n.name)") == names
    assert run_js(qtbot, view, "document.body.className") == "default"  # no consent dialog, no message
    assert view.legend.isVisible()
    assert view.notice == ""


def test_statuses_set_before_ready_are_applied_when_the_graph_appears(qtbot, make_view, sample_mblt):
    view = make_view()
    with qtbot.waitSignal(view.ready, timeout=RENDER_TIMEOUT_MS):
        view.load_mblt(sample_mblt)
        view.set_support(MIXED, {"MaxPool_0": "kernel 9x9 is larger than the pooling unit's 8x8"})
    assert node_classes(qtbot, view, MIXED) == {name: [f"qb-status-{s}"] for name, s in MIXED.items()}
    tooltip = run_js(qtbot, view, "document.querySelector('#node-name-MaxPool_0 > title.qb-tooltip').textContent")
    assert tooltip == "Unsupported: kernel 9x9 is larger than the pooling unit's 8x8"


def test_set_support_recolours_without_reloading(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(), sample_mblt)
    reloads = []
    view.web_view.page().loadStarted.connect(lambda: reloads.append(True))

    statuses, reasons = statuses_from_report(check_support(load_mblt(sample_mblt), "regulus-ra"))
    statuses.update(MIXED)
    view.set_support(statuses, reasons)
    qtbot.waitUntil(lambda: node_classes(qtbot, view, ["Conv_1"])["Conv_1"] == ["qb-status-cpu_offloaded"])
    for name, status in MIXED.items():
        assert header_fill(qtbot, view, name) == rgb(SUPPORT_PALETTE[status].fill)
    assert header_fill(qtbot, view, "Gemm_1") == rgb(SUPPORT_PALETTE["supported"].fill)

    view.set_support(SWAPPED)
    qtbot.waitUntil(lambda: node_classes(qtbot, view, ["Conv_1"])["Conv_1"] == ["qb-status-needs_mfu"])
    assert node_classes(qtbot, view, SWAPPED) == {name: [f"qb-status-{s}"] for name, s in SWAPPED.items()}
    assert node_classes(qtbot, view, ["Gemm_1"]) == {"Gemm_1": []}  # dropped from the map: uncoloured
    for name, status in SWAPPED.items():
        assert header_fill(qtbot, view, name) == rgb(SUPPORT_PALETTE[status].fill)
    assert reloads == []


def test_set_support_rejects_unknown_statuses(qtbot, make_view):
    view = make_view()
    with pytest.raises(ValueError, match="Unknown support status maybe"):
        view.set_support({"Conv_0": "maybe"})


def test_select_node_selects_and_scrolls_without_emitting(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(), sample_mblt)
    assert run_js(qtbot, view, "document.getElementById('target').scrollTop") == 0
    with qtbot.assertNotEmitted(view.node_selected, wait=200):
        view.select_node("Gemm_1", smooth=False)
        qtbot.waitUntil(lambda: run_js(qtbot, view, "Array.from(window.__view__.target.selection)"
                                                    ".map(e => e.value.name)") == ["Gemm_1"])
    assert run_js(qtbot, view, "document.querySelector('#node-name-Gemm_1').classList.contains('select')")
    assert run_js(qtbot, view, "document.getElementById('target').scrollTop") > 0
    visible = run_js(qtbot, view, "(() => { const r = document.getElementById('node-name-Gemm_1')"
                                  ".getBoundingClientRect(); return r.top >= 0 && r.bottom <= innerHeight; })()")
    assert visible
    border = run_js(qtbot, view, "getComputedStyle(document.querySelector('#node-name-Gemm_1 > path.node-border')).stroke")
    assert border == rgb(SELECTION_COLOUR)


def test_clicking_a_node_emits_node_selected(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(), sample_mblt)
    position = node_centre(qtbot, view, "Conv_1")
    with qtbot.waitSignal(view.node_selected, timeout=5000) as blocker:
        QTest.mouseClick(view.web_view.focusProxy(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                         position)
    assert blocker.args == ["Conv_1"]
    qtbot.waitUntil(lambda: run_js(qtbot, view, "Array.from(window.__view__.target.selection)"
                                                ".map(e => e.value.name)") == ["Conv_1"])


def test_a_node_chosen_in_netrons_find_sidebar_emits_node_selected(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(), sample_mblt)
    with qtbot.waitSignal(view.node_selected, timeout=5000) as blocker:  # what the Find sidebar's 'select' does
        run_js(qtbot, view, "(() => { const v = window.__view__; v.find();"
                            " const node = v.activeTarget.nodes.find(n => n.name === 'MaxPool_0');"
                            " v.target.scrollTo(v.target.select([node], 'sidebar')); return true; })()")
    assert blocker.args == ["MaxPool_0"]
    with qtbot.assertNotEmitted(view.node_selected, wait=300):
        view.select_node("Conv_1")  # a selection made from Python is not echoed


def test_right_click_on_a_node_requests_a_context_menu(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(), sample_mblt)
    position = node_centre(qtbot, view, "Relu_0")
    with qtbot.waitSignal(view.node_context_requested, timeout=5000) as blocker:
        QTest.mouseClick(view.web_view.focusProxy(), Qt.MouseButton.RightButton, Qt.KeyboardModifier.NoModifier,
                         position)
    name, global_position = blocker.args
    assert name == "Relu_0"
    expected = view.web_view.mapToGlobal(position)
    assert (global_position - expected).manhattanLength() <= 2


def test_no_network_access_is_attempted(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(), sample_mblt)
    # Netron's telemetry fired on start-up and went to the sendBeacon stub, not the network.
    assert view.suppressed_beacons
    assert all(url.startswith("https://analytics.google.com/") for url in view.suppressed_beacons)
    # Page actions that report telemetry: a node click, and an error report.
    with qtbot.waitSignal(view.node_selected, timeout=5000):
        QTest.mouseClick(view.web_view.focusProxy(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                         node_centre(qtbot, view, "Conv_0"))
    reported = len(view.suppressed_beacons)
    run_js(qtbot, view, "window.__view__.host.exception(new Error('qb test report'), false)")
    qtbot.waitUntil(lambda: len(view.suppressed_beacons) > reported)
    # Update/Report buttons navigate away: refused, the page stays.
    run_js(qtbot, view, "window.__view__.host.openURL('https://github.com/lutzroeder/netron/releases')")
    qtbot.waitUntil(lambda: len(view.refused_navigations) == 1)
    assert run_js(qtbot, view, "location.href") == "qbnetron://app/index.html"
    assert view.blocked_requests == []
    assert run_js(qtbot, view, "document.cookie") == "consent=1"  # so no IP lookup for the consent dialog
    # The recorder works: an explicit attempt is refused and recorded, and the graph survives it.
    run_js(qtbot, view, "fetch('https://ipinfo.io/json').catch(() => null) && 0")
    qtbot.waitUntil(lambda: view.blocked_requests == ["https://ipinfo.io/json"])
    assert run_js(qtbot, view, "document.querySelectorAll('g[id^=node-name-]').length") == SAMPLE_NODES


def test_local_url_rule():
    assert is_local_url(QUrl("qbnetron://app/index.html"))
    assert is_local_url(QUrl("data:text/plain,x")) and is_local_url(QUrl("blob:qbnetron://app/1"))
    assert not is_local_url(QUrl("https://analytics.google.com/g/collect"))
    assert not is_local_url(QUrl("http://127.0.0.1:8080/data/model.onnx"))


def fetch_status(qtbot, view: GraphView, url: str):
    """HTTP status of ``fetch(url)`` in the page, or ``"failed"`` if it failed without one."""
    key = f"__qbFetch{abs(hash(url))}"
    run_js(qtbot, view, f"fetch({json.dumps(url)}).then(r => window.{key} = r.status, "
                        f"() => window.{key} = 'failed') && 0")
    qtbot.waitUntil(lambda: run_js(qtbot, view, f"window.{key} !== undefined"))
    return run_js(qtbot, view, f"window.{key}")


def test_scheme_serves_netron_files_and_the_model_only(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(), sample_mblt)
    assert fetch_status(qtbot, view, "/index.html?cb=123") == 200  # the query string is ignored
    assert fetch_status(qtbot, view, f"/data/{sample_mblt.stem}.onnx?cb=1") == 200
    assert fetch_status(qtbot, view, "/data/other.onnx") == 404
    assert fetch_status(qtbot, view, "/server.py") == 404  # in the package, but not a web file
    assert fetch_status(qtbot, view, "/..%2F..%2Fnetron%2Findex.html") == 404  # outside the package
    assert fetch_status(qtbot, view, "qbnetron://other/index.html") == 403  # another host: denied


def _old_date(html: str) -> str:
    return re.sub(r'<meta name="date" content="[^"]*">', OLD_DATE, html)


def test_date_lock_is_real(qtbot, make_view, sample_mblt):
    """Without the rewrite, an old release date makes Netron refuse to show the model."""
    view = make_view(scheme_handler=NetronSchemeHandler(index_preprocessor=_old_date, rewrite_date=False))
    with qtbot.assertNotEmitted(view.ready), qtbot.waitSignal(view.load_failed, timeout=RENDER_TIMEOUT_MS) as blocker:
        view.load_mblt(sample_mblt)
    assert blocker.args == ["Please update to the newest version."]


def test_date_rewrite_beats_an_old_release_date(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(scheme_handler=NetronSchemeHandler(index_preprocessor=_old_date)), sample_mblt)
    assert view.node_count == SAMPLE_NODES
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    assert run_js(qtbot, view, "document.querySelector('meta[name=date]').content").startswith(today)


@pytest.fixture(scope="module")
def chain_onnx(tmp_path_factory) -> Path:
    """A 1,200-node chain of activations: over the 1,000-node notice threshold, quick to lay out."""
    import onnx
    from onnx import TensorProto, helper

    ops = ("Relu", "Sigmoid", "Tanh")
    nodes = [helper.make_node(ops[i % 3], [f"t{i - 1}" if i else "x"], [f"t{i}"], name=f"{ops[i % 3]}_{i}")
             for i in range(1200)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("t1199", TensorProto.FLOAT, [1, 8])])
    path = tmp_path_factory.mktemp("chain") / "chain.onnx"
    onnx.save(helper.make_model(graph), path)
    return path


def test_large_graph_shows_a_notice_and_stays_usable(qtbot, make_view, chain_onnx):
    view = make_view()
    notices, ticks = [], []
    view.web_view.page().model_opened.connect(lambda file, nodes: notices.append(view.notice))
    timer = QTimer(view)
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(10)
    with qtbot.waitSignal(view.ready, timeout=RENDER_TIMEOUT_MS):
        view.load_mblt(chain_onnx)
    timer.stop()
    assert notices and notices[0].startswith("Large graph: 1,200 nodes. Netron is laying it out")
    assert view.notice == "Large graph: 1,200 nodes. Scrolling and zooming may be slow."
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < 0.5  # the Qt event loop kept running
    view.set_support({"Tanh_1199": "unsupported"})
    view.select_node("Tanh_1199", smooth=False)
    qtbot.waitUntil(lambda: run_js(qtbot, view, "Array.from(window.__view__.target.selection)"
                                                ".map(e => e.value.name)") == ["Tanh_1199"], timeout=RENDER_TIMEOUT_MS)
    assert node_classes(qtbot, view, ["Tanh_1199"]) == {"Tanh_1199": ["qb-status-unsupported"]}


def test_layout_notice_is_progress_but_other_dialogs_fail(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(), sample_mblt)
    page, served = view.web_view.page(), model_url_path(f"{sample_mblt.stem}.onnx")
    with qtbot.assertNotEmitted(view.load_failed):
        page.message_shown.emit(served, "This large graph layout might take a very long time to complete.",
                                "notification", "Cancel")
    assert view.notice.startswith("This large graph layout might take a very long time to complete.")
    with qtbot.waitSignal(view.load_failed) as blocker:
        page.message_shown.emit(served, "Please update to the newest version.", "notification", "Update")
    assert blocker.args == ["Please update to the newest version."]


def test_warm_up_loads_netron_without_a_model_and_the_first_model_then_opens(qtbot, make_view, sample_mblt):
    view = make_view()
    with qtbot.assertNotEmitted(view.ready), qtbot.assertNotEmitted(view.load_failed):
        with qtbot.waitSignal(view.web_view.page().loadFinished, timeout=RENDER_TIMEOUT_MS):
            view.warm_up()
        qtbot.waitUntil(lambda: run_js(qtbot, view, "typeof window.__view__") == "object", timeout=RENDER_TIMEOUT_MS)
    assert not view.is_ready and view.model_path is None
    assert run_js(qtbot, view, "document.querySelectorAll('g[id^=\"node-\"]').length") == 0
    open_model(qtbot, view, sample_mblt)
    assert view.node_count == SAMPLE_NODES
    view.warm_up()  # a no-op once a model is shown
    assert view.is_ready and view.model_path == sample_mblt


def test_clear_then_reload(qtbot, make_view, sample_mblt):
    view = open_model(qtbot, make_view(), sample_mblt)
    with qtbot.waitSignal(view.web_view.page().loadFinished, timeout=5000):
        view.clear()
    assert not view.is_ready and view.node_count is None and view.model_path is None
    # Netron without a model stays loaded behind the placeholder (a warm renderer): no node of the old graph
    assert run_js(qtbot, view, "document.querySelectorAll('g[id^=\"node-\"]').length") == 0
    assert run_js(qtbot, view, "document.querySelector('meta[name=\"file\"]') === null") is True
    open_model(qtbot, view, sample_mblt)
    assert view.node_count == SAMPLE_NODES


def test_mobilenet_v2_renders(qtbot, make_view, tmp_path):
    realmodels = pytest.importorskip("realmodels")
    try:
        source = realmodels.mobilenet_v2_onnx()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))
    mblt = mblt_compile(source, tmp_path / "mobilenet_v2.mblt")
    view = open_model(qtbot, make_view(), mblt)
    assert run_js(qtbot, view, "document.querySelectorAll('g[id^=node-name-]').length") == 100
    assert view.node_count == 100


def test_page_is_deleted_before_its_profile(qtbot, qtlog, sample_mblt):
    """Otherwise Qt warns "Release of profile requested but WebEnginePage still not deleted"."""
    view = GraphView()
    view.show()
    open_model(qtbot, view, sample_mblt)
    delete_now(qtbot, view)
    assert not [record for record in qtlog.records if "Release of profile" in record.message]


_LEFT_ALIVE = """
import sys
sys.path[:0] = [{root!r}, {here!r}]
from conftest import pytest_configure
pytest_configure(None)
from PySide6.QtCore import QEventLoop
from PySide6.QtWidgets import QApplication, QMainWindow
app = QApplication([])
from qbstudio.widgets.graph_view import GraphView
window = QMainWindow()
view = GraphView()
window.setCentralWidget(view)
window.show()
loop = QEventLoop()
view.ready.connect(loop.quit)
view.load_mblt({model!r})
loop.exec()
print("rendered", view.node_count)
window.close()
window.deleteLater()  # never runs: no event loop after this, as in a test's teardown
"""


def test_views_left_alive_at_exit_do_not_crash(sample_mblt):
    """Pages still alive at interpreter exit are released before their profile and the QApplication."""
    script = _LEFT_ALIVE.format(root=str(ROOT), here=str(Path(__file__).parent), model=str(sample_mblt))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == f"rendered {SAMPLE_NODES}"
    assert "Release of profile requested" not in result.stderr


def test_screenshot(qtbot, make_view, tmp_path):
    """MiniLM on regulus-ra (no MFU) with the CPU-offload plan: the real support report, coloured."""
    realmodels = pytest.importorskip("realmodels")
    try:
        source = realmodels.minilm_onnx()
    except realmodels.RealModelUnavailable as error:
        pytest.skip(str(error))
    mblt = mblt_compile(source, tmp_path / "minilm.mblt")
    model = load_mblt(mblt)
    report = check_support(model, "regulus-ra")
    report = apply_offload(report, plan_cpu_offload(model, report))
    view = make_view()
    view.resize(1100, 850)
    with qtbot.waitSignal(view.ready, timeout=RENDER_TIMEOUT_MS):
        view.load_mblt(mblt)
        view.set_support(*statuses_from_report(report))
    # Show the CPU-offloaded tail if there is one (it sits next to MFU-bound nodes), else an MFU node.
    flagged = [entry for entry in report.entries.values() if entry.status != "supported"]
    focus = max(flagged, key=lambda entry: entry.status == "cpu_offloaded").node
    view.select_node(focus, smooth=False)
    # Netron's splash fades out after the graph is ready (see notes/qt-netron.md), and under load the
    # offscreen compositor may paint the scrolled viewport later still: grab until the colours show.
    grabbed = {}

    def coloured() -> bool:
        grabbed["image"] = image = view.grab().toImage()
        grabbed["shown"] = {status for status, style in SUPPORT_PALETTE.items()
                            if _count_pixels(image, style.fill) > 100}
        return {"supported", "needs_mfu"} <= grabbed["shown"]

    try:
        qtbot.waitUntil(coloured, timeout=15_000)
    finally:  # the last grab is kept either way, to look at when the assertion fails
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        if "image" in grabbed:
            grabbed["image"].save(str(SCREENSHOT))
    assert {"supported", "needs_mfu"} <= grabbed["shown"]


def _count_pixels(image, hex_colour: str) -> int:
    target = QColor(hex_colour).rgb()
    step = 2
    return sum(1 for y in range(0, image.height(), step) for x in range(0, image.width(), step)
               if image.pixel(x, y) == target)
