"""The offline HTML page over a store (`profiler jobs html -o PAGE`): the
report's own page style, tables and figure rendering (analysis.report: its
CSS, tables with a filter, plotly.js inlined once) and its colours for the
parts of a step (analysis.figures).  Every name from a record (job, user,
partition, finding) is escaped: html.escape in text and tables, figures.esc
inside figures."""

from __future__ import annotations

import html
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .query import interconnects, listing, ranking, regressions
from .schema import write_atomic

TOP = 30  # jobs in the ranking figure


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def render(records: Sequence[dict[str, Any]], skipped: Sequence[str] = (),
           title: str = "horovod-profiler: jobs") -> str:
    import pandas as pd
    import plotly.graph_objects as go

    from profiler._version import __version__
    from profiler.analysis import figures as F
    from profiler.analysis import report as R

    fig = R._Figures()
    body: list[str] = []
    ranked = ranking(records)
    top = [r for r in ranked if r["lost_node_hours"] is not None][:TOP]
    lost = go.Figure()
    labels = [F.esc(f"{r['name']} ({r['id']})") for r in top][::-1]
    for part, key in (("wait_ranks", "wait_node_hours"), ("transfer", "comm_node_hours")):
        lost.add_trace(go.Bar(y=labels, x=[r[key] or 0.0 for r in top][::-1], orientation="h",
                              name="waiting for other ranks" if part == "wait_ranks"
                              else "communication (transfer, waiting for Horovod)",
                              marker_color=F.PART_COLORS[part]))
    lost.update_layout(title="Node-hours lost, by job", barmode="stack", template=F.TEMPLATE,
                       xaxis_title="node-hours", height=max(300, 140 + 24 * len(top)))
    body.append("<h2 id=\"ranking\">Node-hours lost to communication and waiting</h2>"
                + fig("ranking", lost)
                + R._table(pd.DataFrame(ranked, columns=[
                    "name", "user", "start", "node_hours", "lost_node_hours", "finding",
                    "remedy", "id"])))
    regs = regressions(records)
    body.append("<h2 id=\"regressions\">Regressions against each job's history</h2>"
                + R._table(pd.DataFrame([{**r, "interval": f"[{r['interval'][0]:.4g}, "
                                          f"{r['interval'][1]:.4g}]",
                                          "changed": "; ".join(r["changed"])} for r in regs],
                                        columns=["name", "metric", "value", "history_mean",
                                                 "interval", "history_runs", "changed", "id"])))
    steps = go.Figure()
    for name in sorted({r["job"]["name"] for r in records}):
        runs = sorted((r for r in records if r["job"]["name"] == name
                       and isinstance(r.get("step_ms"), (int, float))), key=lambda r: r["start"])
        if runs:
            steps.add_trace(go.Scatter(x=[r["start"] for r in runs],
                                       y=[r["step_ms"] for r in runs], mode="lines+markers",
                                       name=F.esc(name)))
    steps.update_layout(title="Step time per job name, over time", template=F.TEMPLATE,
                        yaxis_title="ms per step")
    body.append(fig("history", steps))
    ics = interconnects(records)
    icf = go.Figure()
    for ic in sorted({r["interconnect"] for r in ics}):
        sel = [r for r in ics if r["interconnect"] == ic]
        icf.add_trace(go.Bar(x=[F.esc(r["name"]) for r in sel],
                             y=[r["comm_ms"] for r in sel], name=F.esc(ic)))
    icf.update_layout(title="Communication per step, by interconnect", barmode="group",
                      template=F.TEMPLATE, yaxis_title="ms per step (transfer + Horovod wait)")
    body.append("<h2 id=\"interconnects\">Interconnects</h2>" + fig("interconnects", icf)
                + R._table(pd.DataFrame(ics)))
    body.append("<h2 id=\"jobs\">Jobs</h2>" + R._table(pd.DataFrame(listing(records))))
    if skipped:
        body.append("<h2 id=\"skipped\">Records skipped</h2><ul>"
                    + "".join(f"<li>{_e(s)}</li>" for s in skipped) + "</ul>")
    created = time.strftime("%Y-%m-%d %H:%M:%S")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{R.CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><p class=\"muted\">generated {created} by horovod-profiler "
            f"{_e(__version__)}; {len(records)} job record(s)</p>"
            + "".join(body) + R.TABLE_SCRIPT + "</body></html>\n")


def write_page(records: Sequence[dict[str, Any]], out: str | os.PathLike[str],
               skipped: Sequence[str] = ()) -> Path:
    path = Path(out)
    write_atomic(path, render(records, skipped).encode(), 0o644)
    return path
