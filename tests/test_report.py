"""`profiler report`: a standalone HTML file from a real trace, read back -- the
figures' data are in it, plotly.js is embedded once, and strings from the trace
(command line, tensor names) arrive escaped."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from analysis_fixtures import concat, training
from conftest import PYTHON, mpirun, profiler_cli, requires_mpi

from profiler.analysis import load
from profiler.analysis.model import latency_by_size
from profiler.analysis.report import render_report
from profiler.analysis.sizes import size_distribution

EVIL = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"

JOB = '''
# The profiler's exit handler imports pandas, which needs concurrent.futures.thread;
# importing that after interpreter shutdown began fails, so load it up front (see the
# report of issue 4: the activation should do this itself).
import concurrent.futures.thread
import sys
import numpy as np
from mpi4py import MPI
import profiler

comm = MPI.COMM_WORLD
profiler.step()  # opens the first step
for step in range(6):
    for n in (2, 3, 256, 384, 4096):
        a = np.ones(n, np.float32)
        b = np.empty_like(a)
        comm.Allreduce(a, b)
    profiler.step(images=8)
'''


def arr(value: Any) -> np.ndarray:
    """A plotly data array: a list, or plotly's typed-array encoding {dtype, bdata}."""
    if isinstance(value, dict) and "bdata" in value:
        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if shape:
            a = a.reshape([int(x) for x in str(shape).split(",")])
        return a
    return np.asarray(value)


def figures(text: str) -> dict[str, list[dict[str, Any]]]:
    """Figure name -> plotly data (list of traces), decoded from the report."""
    out: dict[str, list[dict[str, Any]]] = {}
    dec = json.JSONDecoder()
    for m in re.finditer(r'<section class="figure" data-figure="([^"]+)">', text):
        name = m.group(1)
        i = text.index("Plotly.newPlot(", m.end())
        j = text.index(f'"fig-{name}"', i) + len(f'"fig-{name}"')
        j = text.index("[", j)
        data, _ = dec.raw_decode(text, j)
        out[name] = data
    return out


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("report")
    job = d / "job.py"
    job.write_text(JOB)
    prof = d / "prof"
    mpirun(2, [PYTHON, str(job), EVIL], env={"HOROVOD_PROFILE": "1",
                                              "HOROVOD_PROFILE_DIR": str(prof)}, cwd=d)
    if not (prof / "trace.json").is_file():
        assert profiler_cli("merge", str(prof), cwd=d).returncode == 0
    return prof / "trace.json"


@requires_mpi
@pytest.mark.mpi
def test_report_from_real_trace_holds_the_figures_data(real_trace: Path,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    p = profiler_cli("report", str(real_trace), "-o", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    # offline: the plotly.js bundle once, no CDN
    assert text.count("plotly.js v") == 1 or text.count("* plotly.js") == 1
    assert re.search(r"<script[^>]*\bsrc=", text) is None  # nothing fetched
    figs = figures(text)
    for name in ("size-histogram", "calls-per-size", "latency-vs-size", "rank-imbalance",
                 "step-timeline", "control-vs-data"):
        assert name in figs, name
    df = load(real_trace)
    # size histogram: calls per power-of-two bucket of one rank
    dist = size_distribution(df)
    bars = figs["size-histogram"][0]
    assert arr(bars["y"]).tolist() == [int(v) for v in dist["calls"]]
    assert [int(c) for c in dist["calls"]] == [6, 6, 6, 6, 6]  # 8, 12, 1024, 1536, 16384 B
    # latency: the median line per size is the measured median
    st = latency_by_size(df)
    med = next(t for t in figs["latency-vs-size"] if t["name"].endswith("median"))
    assert np.allclose(arr(med["y"]), st["median_us"].to_numpy())
    assert arr(med["x"]).tolist() == [int(b) for b in st["bytes"]]
    # steps: 6 steps with 8 images on each of 2 ranks
    step_fig = figs["step-timeline"]
    ips = next(t for t in step_fig if t["name"].endswith("images/sec"))
    assert len(arr(ips["y"])) == 6
    # where a step goes, per rank: an MPI program's blocking allreduces on the
    # thread that marks steps are its waiting and transfer; the parts of each
    # rank's bar sum to its mean steady step
    bars = {t["name"]: arr(t["x"]) for t in figs["breakdown-ranks-trace"]}
    assert set(bars) == {"compute and the rest", "waiting for other ranks",
                         "waiting for Horovod", "transfer", "profiler", "unexplained"}
    steps = df.loc[df["op"] == "step"].sort_values(["rank", "t_start_ns"])
    steady = steps.groupby("rank").apply(lambda g: g.iloc[1:]["dur_ns"].mean() / 1e6)
    total = sum(bars.values())
    assert np.allclose(total[::-1], steady.to_numpy(), rtol=1e-9)  # bars: rank 1 first
    assert (bars["waiting for Horovod"] == 0).all()
    calls = df.loc[(df["op"] == "allreduce") & (df["step"] >= 1)]
    in_calls = calls.groupby("rank")["dur_ns"].sum() / 1e6 / 5
    got = (bars["waiting for other ranks"] + bars["transfer"])[::-1]
    assert np.allclose(got, in_calls.to_numpy(), rtol=1e-6)
    # the command line holds the script tag: only its escaped form is in the file
    assert EVIL not in text
    assert ESCAPED in text


def test_tensor_names_and_labels_are_escaped() -> None:
    a = training(steps=3, label=EVIL)
    b = training(steps=3, label="plain")
    df = concat(a, b)
    df["tensors"] = np.where(df["kind"].astype(str) == "data",
                             f"grad/conv1;{EVIL}", "")
    df["n_tensors"] = np.where(df["kind"].astype(str) == "data", 2, 0)
    text = render_report(df, metas={EVIL: {"command": ["train.py", EVIL],
                                           "hosts": [EVIL], "env": {"HOROVOD_X": EVIL}}},
                         progress=False)
    assert EVIL not in text
    assert "<script>alert" not in text
    assert ESCAPED in text
    assert "grad/conv1, " + ESCAPED in text  # fused call row lists both tensors
    figs = figures(text)
    names = {t.get("name", "") for t in figs["size-histogram"]}
    assert {"plain", ESCAPED} <= names
    # the comparison section exists with two traces
    assert 'id="compare"' in text


def test_report_bad_input_is_one_line(tmp_path: Path) -> None:
    p = profiler_cli("report", str(tmp_path / "missing.json"), "-o", str(tmp_path / "r.html"),
                     cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.startswith("profiler: error: ") and len(p.stderr.strip().splitlines()) == 1
    bogus = tmp_path / "bogus.json"
    bogus.write_text("{}")
    p = profiler_cli("report", str(bogus), "-o", str(tmp_path / "r.txt"), cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_report_of_a_trace_too_large_to_load_whole(tmp_path: Path) -> None:
    """Figures from a bounded window, tables over every call, and the report says so."""
    from profiler.analysis import load, summarize, write_report
    from profiler.analysis.engine import summarize_dataset

    src = Path(__file__).parent / "data" / "analysis" / "fused" / "trace.json"
    big = tmp_path / "big"
    r = profiler_cli("synth", str(src), "-o", str(big), "--ranks", "8", "--calls-per-rank",
                     "3000", "--stragglers", "1", "--seed", "3", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "r.html"
    write_report([big / "trace.json"], out, progress=False, max_rows=4000)
    text = out.read_text()
    assert "figures show a window" in text
    full = summarize_dataset(big / "trace.json", ["op", "bucket", "kind"])
    assert int(full["calls"].sum()) > 4000
    # the report's summary table counts every call, not the window's
    assert f">{int(full['calls'].max())}<" in text
    meta = json.loads((big / "trace.json").read_bytes())["horovod_profiler"]
    assert meta["synthetic"]["stragglers"]
    small = summarize(load(big / "trace.json", max_rows=4000))
    assert int(small["calls"].sum()) < int(full["calls"].sum())


def test_report_opens_with_the_findings() -> None:
    """After the overview (the breakdown chart and the headlines: the browser
    test checks it), the findings of each trace (the same analyzers as
    `profiler advise`), each linked to the section that supports it."""
    import re

    from analysis_fixtures import training

    from profiler.analysis.findings import advise_frame

    df = training(steps=14, late_rank=1, late_ns=2_000_000, step_ns=30_000_000)
    text = render_report(df, progress=False)
    sections = re.findall(r'<h2 id="([a-z]+)">', text)
    assert sections[:3] == ["overview", "findings", "breakdown"]
    body = text.split('<h2 id="findings">', 1)[1].split("<h2 ", 1)[0]
    expected = advise_frame(df, {}).significant
    assert expected and all(f.headline in body for f in expected)
    assert '<a href="#imbalance">' in body
    assert not re.search(r"\d[eE][+-]\d", body)


def test_latency_figure_one_panel_per_operation_the_rest_named() -> None:
    """Six operations: the four with the most time get a panel each (labels as
    colours), the other two are named in the title; the y axis reads in
    human units; a band is a filled area, never a row of dots."""
    import pandas as pd
    from analysis_fixtures import sweep

    from profiler.analysis import figures as F

    sizes = [1 << k for k in range(3, 16)]
    ops = ["allreduce", "allgather", "bcast", "alltoall", "reduce", "gather"]
    # more iterations for the first ops: more time, so they get the panels
    df = pd.concat([sweep(sizes, iters=12 - 2 * i, op=op, seed=i) for i, op in enumerate(ops)],
                   ignore_index=True)
    fig = F.latency_vs_size(df)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ops[:4]
    assert "2 more op(s) in the tables: reduce, gather" in fig.layout.title.text
    axes = {t.xaxis for t in fig.data}
    assert axes == {"x", "x2", "x3", "x4"}
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 4 and all(t.mode == "lines" for t in bands)
    ticks = [str(x) for x in fig.layout.yaxis.ticktext]
    assert all(x.endswith((" us", " ms", " s")) for x in ticks) and "e" not in "".join(ticks)
