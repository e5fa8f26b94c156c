"""HTML sweep report: `qbcompiler sweep --report` writes one self-contained file with every section filled."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from compiler_core.errors import ArgumentError
from compiler_core.sweep.report import SECTIONS, render_report, write_report

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "resources" / "samples" / "fashion_cnn"
GRID = {"baseConfig": str(SAMPLE / "compile_config.yaml"), "axes": {"calibrationMode": [0, 1, 2]}}


def sweep_with_report(folder: Path, monkeypatch) -> tuple[dict, Path]:
    """A 3-point sweep of the bundled sample through the CLI with ``--report``; its payload and the HTML path."""
    from compiler_core.cli import run

    monkeypatch.setenv("QBCOMPILER_JSONL", "1")
    monkeypatch.setenv("QBCOMPILER_CACHE_DIR", str(folder / "cache"))
    grid = folder / "grid.json"
    grid.write_text(json.dumps(GRID))
    report = folder / "report.html"
    code = run(["sweep", "--model", str(SAMPLE / "model.onnx"), "--grid", str(grid), "--output-dir",
                str(folder / "out"), "--calib-data-path", str(SAMPLE / "calib"), "--executor", "inprocess",
                "--report", str(report)])
    assert code == 0
    return json.loads((folder / "out" / "sweep.json").read_text()), report


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids, self.tags, self.external = [], [], []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append(tag)
        if "id" in attributes:
            self.ids.append(attributes["id"])
        for key in ("src", "href"):
            if attributes.get(key):
                self.external.append(attributes[key])


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        yield sweep_with_report(tmp_path_factory.mktemp("report"), monkeypatch)
    finally:
        monkeypatch.undo()


def test_the_report_is_self_contained_and_has_every_section(swept, capsys):
    sweep, report = swept
    text = report.read_text()
    parser = _Collector()
    parser.feed(text)
    assert [i for i in parser.ids if i in SECTIONS] == list(SECTIONS)
    assert "script" not in parser.tags and parser.external == []  # nothing loaded from anywhere
    # settings diff: the swept key, highlighted, for the points that differ from the base (mode 1)
    assert text.count('<td class="diff">') == 2 and "calibration.mode" in text
    # metrics: every point's worst SQNR as printed in sweep.json
    for record in sweep["records"]:
        assert f"{record['worst_sqnr_db']:.2f}" in text and record["command"].split()[0] in text


def test_the_plots_hold_one_line_per_point_and_one_marker_per_point(swept):
    sweep, report = swept
    text = report.read_text()
    layers_svg = re.search(r'<svg id="layers-plot".*?</svg>', text, re.S).group(0)
    assert layers_svg.count('class="series"') == 3
    analysis = json.loads(Path(sweep["records"][0]["mxq"]).with_suffix(".analysis.json").read_text())
    first_line = re.search(r'class="series" data-point="point-00"[^>]*points="([^"]+)"', layers_svg).group(1)
    assert len(first_line.split()) == len([row for row in analysis["layers"] if row["sqnr_db"] is not None])
    pareto_svg = re.search(r'<svg id="pareto-chart".*?</svg>', text, re.S).group(0)
    assert pareto_svg.count("<circle") == 3
    assert pareto_svg.count('class="point front"') == len(sweep["pareto_front"]) >= 1


def test_render_report_escapes_text_and_says_when_there_is_no_layer_analysis():
    record = {"index": 0, "name": "<b>p</b>", "status": "failed", "error": {"message": "broke & <stopped>"},
              "settings": {}, "command": "qbcompiler compile"}
    text = render_report({"format": "qbcompiler-sweep", "records": [record], "mblt": "m.mblt"})
    assert "<b>p</b>" not in text and "&lt;b&gt;p&lt;/b&gt;" in text and "broke &amp; &lt;stopped&gt;" in text
    assert "No per-layer analysis" in text and "No point has both" in text


def test_write_report_rejects_a_file_that_is_not_a_sweep_result(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"records": []}))
    with pytest.raises(ArgumentError, match="Not a sweep result"):
        write_report(other, tmp_path / "r.html")
    with pytest.raises(ArgumentError, match="Cannot read"):
        write_report(tmp_path / "missing.json", tmp_path / "r.html")
