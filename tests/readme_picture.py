"""The README's picture: the report's breakdown chart ("Where a step goes, per
rank") of a real Horovod training run, drawn by a real browser.

The run (tests/data/readme/resnet8: the main job's first configuration, 2
ranks, 20 steady steps; its raw files left out, trace.json's events cut to a
window) was made with

    HOROVOD_PROFILE=1 HOROVOD_PROFILE_DIR=resnet8 mpirun -n 2 python -m \
        profiler.workloads.train_bench --model resnet8 --batch-size 32 --image-size 32 \
        --num-warmup-batches 5 --num-batches-per-iter 5 --num-iters 4
    profiler merge resnet8 --events 300 && rm -r resnet8/raw

tests/test_report_browser.py draws it (the chart the report makes, from the
same figure function over the same breakdown, rendered by plotly.js in
headless chromium) into docs/img/breakdown.png on every run of the test
command, and writes beside it the digest of the figure it drew;
tests/test_docs.py, which needs no browser, checks that the committed picture
is a PNG of that size and that its digest is the chart's as the code draws it
now: a change to the chart or its data shows until the picture is redrawn."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "readme" / "resnet8" / "trace.json"
PICTURE = ROOT / "docs" / "img" / "breakdown.png"
SIDECAR = ROOT / "docs" / "img" / "breakdown.json"
#: the picture's size in pixels (the browser's window; the figure fills it)
SIZE = (1000, 340)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's header."""
    import struct

    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path}: not a PNG"
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)


def figure() -> Any:
    """The chart as the report makes it for TRACE (analysis.report's overview:
    figures.breakdown_by_rank over the findings context's breakdown)."""
    from profiler.analysis import figures as F
    from profiler.analysis.findings.base import Context
    from profiler.analysis.load import load, trace_meta
    from profiler.analysis.report import REPORT_COLUMNS

    df = load(str(TRACE), columns=REPORT_COLUMNS)
    ctx = Context(df=df, meta=trace_meta(str(TRACE)), path="resnet8/trace.json")
    return F.breakdown_by_rank(ctx.breakdown)


def digest(fig: Any) -> str:
    """What the chart says: its traces' data and its layout, as plotly's JSON."""
    spec = json.loads(fig.to_json())
    spec.get("layout", {}).pop("template", None)  # the theme: plotly's, not ours
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def page(fig: Any) -> str:
    """A page holding the chart alone at SIZE, plotly.js inline (no network)."""
    import plotly.io as pio

    sized = fig.__class__(fig)  # a copy: the digest is of the report's figure
    sized.update_layout(width=SIZE[0], height=SIZE[1],
                        margin={"l": 70, "r": 20, "t": 80, "b": 50})
    div = pio.to_html(sized, full_html=False, include_plotlyjs=True,
                      config={"displayModeBar": False, "staticPlot": True})
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><style>body{margin:0;"
            "background:#fff}</style></head><body>" + div + "</body></html>")
