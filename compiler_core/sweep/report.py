"""A self-contained HTML report of a sweep or of compared runs: settings diff, metrics, per-layer plot, Pareto chart.

One file with inline CSS and inline SVG charts drawn here (no script, no external resource, no
Qt), so it opens in any browser offline and can be mailed around. Sections (each a ``<section>``
with a stable ``id``): ``summary``, ``settings`` (only the keys that differ from the base config,
the base config itself folded), ``metrics`` (per point and output), ``layers`` (per-layer SQNR of
every point in graph order, from each point's ``.analysis.json``), ``pareto`` (worst output SQNR
vs estimated latency, the front highlighted) and ``commands`` (the command reproducing each point).

The same renderer draws the workbench's "Export report" of up to four compared runs
(:func:`write_runs_report`): the data then has the format ``qbstudio-runs``, each record is a run,
its ``settings`` hold every key that differs between the runs, and the base config is the baseline
run's. :func:`layers_csv` writes the per-layer metrics of several runs or points as CSV.
"""

from __future__ import annotations

import csv
import html
import io
import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compiler_core.errors import ArgumentError
from compiler_core.fileio import atomic_write_text

logger = logging.getLogger(__name__)

SECTIONS = ("summary", "settings", "metrics", "layers", "pareto", "commands")
SWEEP_FORMAT, RUNS_FORMAT = "qbcompiler-sweep", "qbstudio-runs"
LAYER_CSV_COLUMNS = ("run", "position", "layer", "tensor", "op", "precision", "sqnr_db", "cosine_mean", "verdict")
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#637939")
WIDTH, HEIGHT, MARGIN = 860, 320, 56
SQNR_CAP_DB = 80.0  # exact matches (999 dB) are drawn at the top of the plot, not off it

_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.9em; } th, td { border: 1px solid #ddd; padding: 3px 8px; }
th { background: #f3f3f3; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.diff { background: #fff3c4; } tr.front td:first-child { font-weight: bold; } td:first-child { white-space: nowrap; }
.failed { color: #b00020; } code { font-size: 0.85em; word-break: break-all; } .note { color: #666; }
svg text { font-family: system-ui, sans-serif; font-size: 11px; }
"""


def write_report(sweep: str | Path | Mapping[str, Any], path: str | Path) -> Path:
    """Write the HTML report of ``sweep`` (a ``sweep.json`` path or its content) to ``path``.

    Raises:
        ArgumentError: ``sweep`` is not a readable sweep result.
        OutputWriteError: ``path`` cannot be written.
    """
    data = _load(sweep)
    layers = {record["name"]: _layer_rows(record) for record in data["records"]}
    return Path(atomic_write_text(path, render_report(data, layers)))


def write_runs_report(runs: Mapping[str, Any], layers: Mapping[str, Sequence[Mapping[str, Any]]],
                      path: str | Path) -> Path:
    """Write the HTML report of compared runs (format ``qbstudio-runs``, see the module docstring) to ``path``.

    Args:
        runs: ``{"format": "qbstudio-runs", "model", "baseline" (a record name), "base_config",
            "pareto_axes", "records": [...]}``; each record like a sweep record (``name``, ``status``,
            ``settings``, ``outputs``, ``worst_sqnr_db``, ``latency_ms``, ``pareto``, ``command`` ...).
        layers: Record name -> analysis layer rows in graph order.
        path: The ``.html`` file.

    Raises:
        OutputWriteError: ``path`` cannot be written.
    """
    return Path(atomic_write_text(path, render_report(runs, layers)))


def render_report(sweep: Mapping[str, Any], layers: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> str:
    """The report as an HTML string; ``layers`` maps point (or run) names to their analysis layer rows."""
    records = list(sweep["records"])
    noun = _noun(sweep)
    colours = {record["name"]: PALETTE[i % len(PALETTE)] for i, record in enumerate(records)}
    body = [_summary(sweep), _settings(sweep, records), _metrics(records, noun),
            _layers(records, layers or {}, colours), _pareto(sweep, records, colours), _commands(records, noun)]
    title = "Runs report" if noun == "run" else "Sweep report"
    model = Path(str(sweep.get("model") or sweep.get("mblt", ""))).name
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{title}: {_e(model)}</title><style>{_CSS}</style></head>"
            f"<body><h1>{title}</h1>{''.join(body)}</body></html>\n")


def layers_csv(layers: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """One CSV row per layer per run (or point): :data:`LAYER_CSV_COLUMNS`, numbers as the analysis has them."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(LAYER_CSV_COLUMNS)
    for name, rows in layers.items():
        for position, row in enumerate(rows):
            writer.writerow([name, position, *("" if row.get(key) is None else row.get(key)
                                               for key in LAYER_CSV_COLUMNS[2:])])
    return buffer.getvalue()


def _noun(data: Mapping[str, Any]) -> str:
    return "run" if data.get("format") == RUNS_FORMAT else "point"


def _load(sweep: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(sweep, Mapping):
        data = dict(sweep)
    else:
        try:
            data = json.loads(Path(sweep).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ArgumentError(f"Cannot read the sweep result '{sweep}': {error}.",
                                hint="Give the sweep.json a `qbcompiler sweep` wrote.") from error
    if data.get("format") != SWEEP_FORMAT or not isinstance(data.get("records"), list):
        raise ArgumentError("Not a sweep result (no 'qbcompiler-sweep' format with records).",
                            hint="Give the sweep.json a `qbcompiler sweep` wrote.")
    return data


def _layer_rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-layer rows of a point's ``.analysis.json`` beside its MXQ, in graph order (empty if none)."""
    if record.get("status") != "ok" or not record.get("mxq"):
        return []
    path = Path(record["mxq"]).with_suffix(".analysis.json")
    try:
        rows = json.loads(path.read_text(encoding="utf-8")).get("layers", [])
    except (OSError, ValueError):
        logger.info("no analysis for %s at %s", record["name"], path)
        return []
    return sorted(rows, key=lambda row: row.get("position", 0))


# -- sections --------------------------------------------------------------------------------------


def _section(key: str, title: str, content: str) -> str:
    return f'<section id="{key}"><h2>{_e(title)}</h2>{content}</section>'


def _summary(sweep: Mapping[str, Any]) -> str:
    if _noun(sweep) == "run":
        return _runs_summary(sweep)
    seconds = sweep.get("seconds", {})
    stages = ", ".join(f"{_e(stage)} {value:.1f} s" for stage, value in seconds.items())
    items = [f"Model: <code>{_e(sweep.get('mblt', ''))}</code>",
             f"{sweep.get('points', len(sweep['records']))} points, {sweep.get('ok', 0)} compiled, "
             f"{sweep.get('calibrations', 0)} calibration run(s)", f"Wall time: {stages}"]
    axes = sweep.get("pareto_axes", {})
    if axes:
        items.append(f"Pareto axes: {_e(axes.get('accuracy', ''))} vs {_e(axes.get('latency', ''))}")
    return _section("summary", "Summary", "<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>")


def _runs_summary(runs: Mapping[str, Any]) -> str:
    records = runs["records"]
    items = [f"Model: <code>{_e(runs.get('model', ''))}</code>",
             f"{len(records)} run(s) compared; baseline: {_e(runs.get('baseline', ''))}"]
    items += [f"{_e(r['name'])}: {_e(r.get('summary', ''))} (finished {_e(r.get('created', ''))})" for r in records]
    axes = runs.get("pareto_axes", {})
    if axes:
        items.append(f"Pareto axes: {_e(axes.get('accuracy', ''))} vs {_e(axes.get('latency', ''))}")
    return _section("summary", "Summary", "<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>")


def _settings(sweep: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    keys = sorted({key for record in records for key in record.get("settings", {})})
    noun = _noun(sweep)
    head = f"<tr><th>{noun}</th>" + "".join(f"<th>{_e(key)}</th>" for key in keys) + "</tr>"
    rows = []
    for record in records:
        settings = record.get("settings", {})
        cells = "".join(f'<td class="diff">{_e(_text(settings[key]))}</td>' if key in settings else
                        '<td class="note">base</td>' for key in keys)
        rows.append(f"<tr><td>{_e(record['name'])}</td>{cells}</tr>")
    base = json.dumps(sweep.get("base_config", {}), indent=2, sort_keys=True)
    if noun == "run":
        note = ("<p class=\"note\">Only the settings that differ between the compared runs are shown "
                f"({len(keys)}, highlighted); the baseline's full resolved config is folded below.</p>")
        folded = f"Full config of the baseline ({_e(sweep.get('baseline', ''))})"
    else:
        note = ("<p class=\"note\">Only the settings that differ from the base config are shown (highlighted); "
                "empty columns mean every point uses the base value.</p>")
        folded = "Base config"
    return _section("settings", "Settings diff", note + f"<table>{head}{''.join(rows)}</table>"
                    f"<details><summary>{folded}</summary><pre>{_e(base)}</pre></details>")


def _metrics(records: Sequence[Mapping[str, Any]], noun: str = "point") -> str:
    head = (f"<tr><th>{noun}</th><th>status</th><th>output</th><th>SQNR dB</th><th>cosine</th><th>top-1</th>"
            "<th>top-5</th><th>max |err|</th><th>latency ms (est.)</th><th>MXQ bytes</th><th>int16 layers</th>"
            "<th>compile s</th><th>Pareto</th></tr>")
    rows = []
    for record in records:
        front = ' class="front"' if record.get("pareto") else ""
        if record.get("status") != "ok":
            message = (record.get("error") or {}).get("message", "")
            rows.append(f'<tr><td>{_e(record["name"])}</td><td class="failed">{_e(record.get("status"))}</td>'
                        f'<td colspan="11" class="failed">{_e(message)}</td></tr>')
            continue
        outputs = record.get("outputs") or {"-": {}}
        for position, (name, metrics) in enumerate(outputs.items()):
            point = (f"<td>{_e(record['name'])}</td><td>ok</td>" if position == 0 else "<td></td><td></td>")
            tail = (f"{_num(record.get('latency_ms'), 4)}{_num(record.get('mxq_size_bytes'), 0)}"
                    f"{_num(record.get('int16_layers'), 0)}{_num(record.get('compile_seconds'), 1)}"
                    f"<td>{'front' if record.get('pareto') else ''}</td>") if position == 0 else "<td></td>" * 5
            rows.append(f"<tr{front}>{point}<td>{_e(name)}</td>{_num(metrics.get('sqnr_db'), 2)}"
                        f"{_num(metrics.get('cosine_mean'), 5)}{_num(metrics.get('top1_agreement'), 3)}"
                        f"{_num(metrics.get('top5_agreement'), 3)}{_num(metrics.get('max_abs_error'), 4)}{tail}</tr>")
    return _section("metrics", "Metrics", f"<table>{head}{''.join(rows)}</table>"
                    "<p class=\"note\">Latency is estimated by the cost model of the virtual NPU (first core mode), "
                    "not measured on hardware.</p>")


def _layers(records: Sequence[Mapping[str, Any]], layers: Mapping[str, Sequence[Mapping[str, Any]]],
            colours: Mapping[str, str]) -> str:
    series = {name: [row for row in rows if row.get("sqnr_db") is not None] for name, rows in layers.items() if rows}
    if not series:
        return _section("layers", "Per-layer SQNR", "<p class=\"note\">No per-layer analysis in this sweep "
                        "(the points were compiled without held-out samples).</p>")
    order = _layer_order(series.values())
    values = [_capped(row["sqnr_db"]) for rows in series.values() for row in rows]
    low, high = _nice_range(min(values), max(values))
    x = _axis(0, max(len(order) - 1, 1), MARGIN, WIDTH - 16)
    y = _axis(low, high, HEIGHT - MARGIN, 16)
    parts = _frame(low, high, y, f"layer in graph order (1 to {len(order)})", "SQNR (dB)")
    for name, rows in series.items():
        points = " ".join(f"{x(order[row['layer']]):.1f},{y(_capped(row['sqnr_db'])):.1f}" for row in rows
                          if row["layer"] in order)
        parts.append(f'<polyline class="series" data-point="{_e(name)}" fill="none" stroke="{colours[name]}" '
                     f'stroke-width="1.5" points="{points}"><title>{_e(name)}</title></polyline>')
    legend = _legend([name for name in series], colours)
    note = (f"<p class=\"note\">SQNR of each quantized tensor against FP32 on the held-out samples; values above "
            f"{SQNR_CAP_DB:.0f} dB (exact matches) are drawn at {SQNR_CAP_DB:.0f} dB.</p>")
    return _section("layers", "Per-layer SQNR", note + _svg("layers-plot", parts) + legend)


def _pareto(sweep: Mapping[str, Any], records: Sequence[Mapping[str, Any]], colours: Mapping[str, str]) -> str:
    placed = [r for r in records if r.get("status") == "ok" and r.get("latency_ms") is not None
              and r.get("worst_sqnr_db") is not None]
    if not placed:
        return _section("pareto", "Pareto chart", "<p class=\"note\">No point has both an accuracy and a latency.</p>")
    latencies = [r["latency_ms"] for r in placed]
    accuracies = [_capped(r["worst_sqnr_db"]) for r in placed]
    x_low, x_high = _nice_range(min(latencies), max(latencies))
    y_low, y_high = _nice_range(min(accuracies), max(accuracies))
    x, y = _axis(x_low, x_high, MARGIN, WIDTH - 16), _axis(y_low, y_high, HEIGHT - MARGIN, 16)
    parts = _frame(y_low, y_high, y, "latency (ms, estimated)", "worst output SQNR (dB)", x_ticks=(x_low, x_high, x))
    front = sorted((r for r in placed if r.get("pareto")), key=lambda r: r["latency_ms"])
    if len(front) > 1:
        line = " ".join(f"{x(r['latency_ms']):.1f},{y(_capped(r['worst_sqnr_db'])):.1f}" for r in front)
        parts.append(f'<polyline class="front-line" fill="none" stroke="#d62728" stroke-dasharray="4 3" points="{line}"/>')
    for record in placed:
        on_front = bool(record.get("pareto"))
        cx, cy = x(record["latency_ms"]), y(_capped(record["worst_sqnr_db"]))
        radius = 6 if on_front else 4
        parts.append(f'<circle class="point{" front" if on_front else ""}" data-point="{_e(record["name"])}" '
                     f'cx="{cx:.1f}" cy="{cy:.1f}" r="{radius}" fill="{colours[record["name"]]}" '
                     f'stroke="{"#d62728" if on_front else "none"}" stroke-width="2"><title>{_e(record["name"])}: '
                     f'{record["worst_sqnr_db"]:.2f} dB, {record["latency_ms"]:.4f} ms</title></circle>'
                     f'<text x="{cx + 8:.1f}" y="{cy - 6:.1f}">{_e(record["name"])}</text>')
    axes = sweep.get("pareto_axes", {})
    note = (f"<p class=\"note\">{len(placed)} points; points on the front ({len(front)}: red ring, dashed line) are "
            f"not beaten on both axes by any other point. {_e(axes.get('latency', ''))}.</p>")
    return _section("pareto", "Pareto chart", note + _svg("pareto-chart", parts))


def _commands(records: Sequence[Mapping[str, Any]], noun: str = "point") -> str:
    rows = "".join(f"<tr><td>{_e(r['name'])}</td><td><code>{_e(r.get('command') or '-')}</code></td></tr>"
                   for r in records)
    return _section("commands", f"Reproduce a {noun}", f"<p class=\"note\">Each command rebuilds the {noun}'s "
                    f"MXQ byte for byte (at its recorded path).</p><table><tr><th>{noun}</th><th>command</th></tr>"
                    f"{rows}</table>")


# -- SVG helpers -----------------------------------------------------------------------------------


def _axis(low: float, high: float, start: float, stop: float):
    span = (high - low) or 1.0
    return lambda value: start + (value - low) / span * (stop - start)


def _nice_range(low: float, high: float) -> tuple[float, float]:
    if high - low < 1e-9:
        pad = abs(high) * 0.1 or 1.0
        return low - pad, high + pad
    pad = (high - low) * 0.08
    return low - pad, high + pad


def _frame(low: float, high: float, y, x_label: str, y_label: str, x_ticks=None) -> list[str]:
    bottom, right = HEIGHT - MARGIN, WIDTH - 16
    parts = [f'<rect x="{MARGIN}" y="16" width="{right - MARGIN}" height="{bottom - 16}" fill="#fafafa" stroke="#999"/>']
    for step in range(5):
        value = low + (high - low) * step / 4
        parts.append(f'<line x1="{MARGIN}" x2="{right}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#e4e4e4"/>'
                     f'<text x="{MARGIN - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.1f}</text>')
    if x_ticks is not None:
        x_low, x_high, x = x_ticks
        for step in range(5):
            value = x_low + (x_high - x_low) * step / 4
            parts.append(f'<text x="{x(value):.1f}" y="{bottom + 16}" text-anchor="middle">{value:.4g}</text>')
    parts.append(f'<text x="{(MARGIN + right) / 2:.0f}" y="{HEIGHT - 14}" text-anchor="middle">{_e(x_label)}</text>'
                 f'<text transform="translate(14 {(16 + bottom) / 2:.0f}) rotate(-90)" text-anchor="middle">'
                 f'{_e(y_label)}</text>')
    return parts


def _svg(key: str, parts: list[str]) -> str:
    return (f'<svg id="{key}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img">{"".join(parts)}</svg>')


def _legend(names: Sequence[str], colours: Mapping[str, str]) -> str:
    items = "".join(f'<span style="margin-right:14px"><span style="display:inline-block;width:14px;height:3px;'
                    f'background:{colours[name]};vertical-align:middle"></span> {_e(name)}</span>' for name in names)
    return f'<p class="legend">{items}</p>'


def _layer_order(series) -> dict[str, int]:
    order: dict[str, int] = {}
    for rows in series:
        for row in rows:
            order.setdefault(row["layer"], len(order))
    return order


def _capped(value: float) -> float:
    return max(min(float(value), SQNR_CAP_DB), -SQNR_CAP_DB)


def _num(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return '<td class="num">-</td>'
    return f'<td class="num">{value:.{digits}f}</td>' if digits else f'<td class="num">{int(value)}</td>'


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)
