"""Screenshots of Runs & Compare for a finished ``qbcompiler sweep``: Pareto chart, 3 runs side by side, per-layer
plots and the graph heatmap of the worst point (offscreen Qt, no project needed).

Usage: ``python scripts/sweep_screenshots.py SWEEP_DIR [--out build/screenshots] [--prefix sweep]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("QTWEBENGINE_CHROMIUM_FLAGS", "--no-sandbox --disable-gpu")


def _settle(app, seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        app.processEvents()
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    """Write ``<prefix>_pareto.png``, ``_side_by_side.png``, ``_per_layer.png`` and ``_heatmap.png``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "screenshots")
    parser.add_argument("--prefix", default="sweep")
    args = parser.parse_args(argv)
    from PySide6 import QtWebEngineWidgets  # noqa: F401  (before the QApplication)
    from PySide6.QtWidgets import QApplication

    from qbstudio._compat import guard_none_refcount
    from qbstudio.netron.scheme import register_scheme

    guard_none_refcount()
    register_scheme()
    app = QApplication(sys.argv[:1])
    from compiler_core.api import load_mblt
    from qbstudio.state.compare import HeatScale, heat_colours, node_values
    from qbstudio.state.runs import RunHistory, RunRecord
    from qbstudio.widgets.compare_view import CompareView
    from qbstudio.widgets.graph_view import GraphView

    data = json.loads((args.sweep_dir / "sweep.json").read_text())
    runs = [RunRecord.from_sweep_record(i + 1, record, model_sha256="", origin=record["name"])
            for i, record in enumerate(r for r in data["records"] if r["status"] == "ok")]
    args.out.mkdir(parents=True, exist_ok=True)
    view = CompareView()
    view.resize(1400, 900)
    view.set_history(RunHistory(runs))
    view.set_layer_order([node.name for node in load_mblt(data["mblt"]).graph])
    ranked = sorted(runs, key=lambda run: run.accuracy() or 0)
    view.set_picks([ranked[-1].run_id, ranked[len(ranked) // 2].run_id, ranked[0].run_id], baseline=ranked[-1].run_id)
    view.show()
    for name, tab in (("side_by_side", view.side), ("per_layer", view.layers), ("pareto", view.sweep)):
        view.tabs.setCurrentWidget(tab)
        _settle(app, 0.5)
        view.grab().save(str(args.out / f"{args.prefix}_{name}.png"))
    graph = GraphView()
    graph.resize(1200, 900)
    graph.show()
    graph.load_mblt(data["mblt"])
    while not graph.is_ready:
        _settle(app, 0.1)
    worst, scale = ranked[0], HeatScale.sqnr()
    colours, tips = heat_colours(node_values(worst), scale, label=f"SQNR of {worst.label}")
    graph.set_colourings([("sqnr", f"Colours: SQNR of #{worst.run_id} ({worst.origin})")])
    graph.colour_combo.setCurrentIndex(1)
    graph.set_heatmap(colours, tips, title=f"SQNR of #{worst.run_id} (dB)", stops=scale.stops(), low=scale.low,
                      high=scale.high, ticks=scale.ticks)
    _settle(app, 1.0)
    graph.grab().save(str(args.out / f"{args.prefix}_heatmap.png"))
    graph._release_web_engine()
    print(f"wrote {args.out}/{args.prefix}_{{pareto,side_by_side,per_layer,heatmap}}.png from {len(runs)} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
