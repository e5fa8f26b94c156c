"""Graph heatmap repaint time: colouring Netron's nodes by per-layer error on 300- and 1,000-node graphs.

Builds chain models of N nodes (alternating Conv / Relu / Add, the shapes of a small CNN), renders
each in the workbench's :class:`~qbstudio.widgets.graph_view.GraphView` (offscreen Qt) and times,
from the Python call to the page's answer:

- **heat**: colouring every node by a run's SQNR (:meth:`GraphView.set_heatmap`), first time;
- **switch**: switching to another run's colours (what picking another heatmap run does), median of ``--runs``;
- **support** (the peer): colouring the same nodes by support status (:meth:`GraphView.set_support`,
  the colouring the workbench already had), median of ``--runs``;
- **compare switch**: switching the compared runs in Runs & Compare (4 runs of N layers each: settings
  diff, metrics table and the per-layer plots redrawn), median of ``--runs``.

Targets from issue 11: a switch <= 100 ms on 300 nodes, colouring 1,000 nodes <= 1 s.

Usage: ``QT_QPA_PLATFORM=offscreen python bench/heatmap.py [--runs 5] [--nodes 300 1000]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("QTWEBENGINE_CHROMIUM_FLAGS", "--no-sandbox --disable-gpu")


def chain_model(path: Path, nodes: int) -> list[str]:
    """An ONNX chain of ``nodes`` nodes (Conv, Relu, Add repeating); returns the node names in order."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.full((8, 8, 1, 1), 0.1, dtype=np.float32), "w")
    bias = numpy_helper.from_array(np.zeros(8, dtype=np.float32), "b")
    graph_nodes, names, previous = [], [], "x"
    for index in range(nodes):
        name, kind = f"n{index}", ("Conv", "Relu", "Add")[index % 3]
        inputs = [previous, "w", "b"] if kind == "Conv" else [previous] if kind == "Relu" else [previous, previous]
        graph_nodes.append(helper.make_node(kind, inputs, [f"t{index}"], name=name))
        names.append(name)
        previous = f"t{index}"
    graph = helper.make_graph(graph_nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [1, 8, 4, 4])],
                              [weight, bias])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return names


def _wait(app, predicate, timeout_s: float = 600.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while not predicate():
        if time.perf_counter() > deadline:
            raise TimeoutError("graph view did not answer in time")
        app.processEvents()
        time.sleep(0.001)


def _heat(view, app, colours, tips, scale) -> float:
    answers: list[float] = []
    view.heat_painted.connect(lambda _count, ms: answers.append(ms))
    view.set_heatmap(colours, tips, title="SQNR (dB)", stops=scale.stops(), low=scale.low, high=scale.high,
                     ticks=scale.ticks)
    _wait(app, lambda: bool(answers))
    view.heat_painted.disconnect()
    return answers[0]


def _support(view, app, statuses) -> float:
    done: list[float] = []
    started = time.perf_counter()
    view.set_support(statuses)
    view._page.runJavaScript("1", 0, lambda _r: done.append(time.perf_counter() - started))  # queued after it
    _wait(app, lambda: bool(done))
    return done[0] * 1000.0


def measure(nodes: int, runs: int, folder: Path) -> dict[str, float]:
    """Render a ``nodes``-node chain and time the heat colouring, the switch and the support peer (ms)."""
    import numpy as np
    from PySide6.QtWidgets import QApplication

    from qbstudio.state.compare import HeatScale, heat_colours
    from qbstudio.widgets.graph_view import GraphView

    app = QApplication.instance()
    path = folder / f"chain_{nodes}.onnx"
    names = chain_model(path, nodes)
    view = GraphView(large_graph_threshold=10**6)
    view.resize(1200, 900)
    view.show()
    started = time.perf_counter()
    view.load_mblt(path)
    _wait(app, lambda: view.is_ready)
    render_s = time.perf_counter() - started
    scale = HeatScale.sqnr()
    rng = np.random.default_rng(nodes)
    runs_values = [dict(zip(names, rng.uniform(5, 45, len(names)).tolist())) for _ in range(2)]
    painted = [heat_colours(values, scale, label="SQNR") for values in runs_values]
    first = _heat(view, app, *painted[0], scale)
    switches = [_heat(view, app, *painted[(i + 1) % 2], scale) for i in range(runs)]
    statuses = [{name: ("supported", "needs_mfu")[(i + k) % 2] for k, name in enumerate(names)} for i in range(2)]
    support = [_support(view, app, statuses[i % 2]) for i in range(runs)]
    view.clear_heatmap()
    view._release_web_engine()
    view.deleteLater()
    app.processEvents()
    return {"nodes": view.node_count or nodes, "render_s": render_s, "heat_first_ms": first,
            "switch_ms": statistics.median(switches), "support_ms": statistics.median(support)}


def compare_switch(layers: int, runs: int) -> tuple[float, float]:
    """Median wall and CPU ms to switch Runs & Compare between two sets of 4 picked runs of ``layers`` layers."""
    import numpy as np
    from PySide6.QtWidgets import QApplication

    from qbstudio.state.runs import RunHistory, RunRecord
    from qbstudio.widgets.compare_view import CompareView

    app = QApplication.instance()
    rng = np.random.default_rng(layers)
    names = [f"n{i}" for i in range(layers)]
    records = []
    for run_id in range(1, 9):
        rows = [{"layer": name, "tensor": f"t{i}", "op": "Conv", "precision": "a8w8",
                 "sqnr_db": float(rng.uniform(10, 45)), "cosine_mean": float(rng.uniform(0.99, 1.0)), "verdict": "ok"}
                for i, name in enumerate(names)]
        records.append(RunRecord(run_id, "2026-12-03T00:00:00+00:00", "aries-rb", ["single"], f"/nonexistent/{run_id}.mxq",
                                 1000 + run_id, {"targetDevice": "aries-rb", "calibration": {"mode": run_id % 4}},
                                 f"run {run_id}", {"min_output_sqnr_db": 30.0 + run_id}, {"out": {"sqnr_db": 30.0}},
                                 rows, estimate={"single": {"latency_ms": 1.0 + run_id, "throughput_fps": 100.0}}))
    view = CompareView()
    view.resize(1300, 860)
    view.set_history(RunHistory(records))
    view.set_layer_order(names)
    view.show()
    view.tabs.setCurrentWidget(view.layers)
    app.processEvents()
    wall, cpu = [], []
    for index in range(runs):
        picks = [1, 2, 3, 4] if index % 2 else [5, 6, 7, 8]
        started, started_cpu = time.perf_counter(), time.thread_time()
        view.set_picks(picks)
        app.processEvents()  # the repaint
        wall.append((time.perf_counter() - started) * 1000.0)
        cpu.append((time.thread_time() - started_cpu) * 1000.0)
    view.close()
    view.deleteLater()
    return statistics.median(wall), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    """Print the timings per graph size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, nargs="+", default=[300, 1000])
    args = parser.parse_args(argv)
    from PySide6 import QtWebEngineWidgets  # noqa: F401  (before the QApplication)
    from PySide6.QtWidgets import QApplication

    from qbstudio._compat import guard_none_refcount
    from qbstudio.netron.scheme import register_scheme

    guard_none_refcount()  # PySide6 6.12.0 reference leaks on CPython 3.11 (see qbstudio/_compat.py)
    register_scheme()
    app = QApplication(sys.argv[:1])  # noqa: F841 (kept alive for the measurements)
    print(f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as folder:
        for nodes in args.nodes:
            row = measure(nodes, args.runs, Path(folder))
            print(f"{row['nodes']:5d} nodes: layout {row['render_s']:.1f} s | heat colours first {row['heat_first_ms']:.1f} ms"
                  f" | switch run (median of {args.runs}) {row['switch_ms']:.1f} ms | support colours (peer) "
                  f"{row['support_ms']:.1f} ms | switch/peer {row['switch_ms'] / max(row['support_ms'], 1e-9):.2f}x")
    for nodes in args.nodes:
        wall, cpu = compare_switch(nodes, args.runs)
        print(f"{nodes:5d} layers: switching 4 compared runs and repainting (median of {args.runs}) {wall:.1f} ms "
              f"wall, {cpu:.1f} ms CPU of the GUI thread")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
