"""Plotly figures, one function per figure; each takes a trace frame (several traces
with a ``label`` column where it compares them) and returns a ``go.Figure``.

Every string that comes from a trace (labels, op names, tensor or host names) is
HTML-escaped before it reaches a figure: plotly.js renders a subset of HTML in
text, so a name like ``<b>`` or ``<script>`` must arrive as text, not markup.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:  # plotly is imported where a figure is made: advise and summarize never load it
    import plotly.graph_objects as go

from profiler.units import fmt_bytes

from ._frame import distinct, isin, keys_of, label_keys
from .imbalance import rank_times, stragglers
from .model import AlphaBetaModel, anomalies, fit_models, latency_by_size, predict
from .sizes import size_distribution
from .throughput import step_table

__all__ = [
    "size_histogram", "calls_per_size", "latency_vs_size", "rank_imbalance",
    "step_timeline", "control_vs_data", "bench_overlay", "esc", "breakdown_by_rank",
    "breakdown_over_steps",
]

#: one colour per part of the step breakdown (analysis.breakdown.PARTS)
PART_COLORS = {"compute": "#9aa5b1", "wait_ranks": "#e45756", "horovod": "#f2a541",
               "transfer": "#4c78a8", "profiler": "#b279a2", "unexplained": "#d0d0d0"}

TEMPLATE = "plotly_white"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


def esc(text: object) -> str:
    """A trace string made safe for plotly text (and HTML)."""
    return html.escape(str(text), quote=True)


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _labels(df: pd.DataFrame) -> list[str]:
    return distinct(df["label"]) if "label" in df.columns else [""]


def _sub(df: pd.DataFrame, label: str) -> pd.DataFrame:
    return df.loc[isin(df["label"], [label])] if "label" in df.columns else df


def _empty(title: str, note: str) -> go.Figure:
    import plotly.graph_objects as go
    fig = go.Figure()
    fig.update_layout(title=title, template=TEMPLATE, height=300,
                      annotations=[{"text": esc(note), "showarrow": False, "x": 0.5, "y": 0.5,
                                    "xref": "paper", "yref": "paper"}])
    return fig


def _log_size_axis(fig: go.Figure, **kw: object) -> None:
    ticks = [2 ** k for k in range(0, 41, 2)]
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[fmt_bytes(t) for t in ticks],
                     title_text="message size", **kw)


def size_histogram(df: pd.DataFrame, *, value: str = "calls", bucket: str = "pow2",
                   kinds: str | Sequence[str] | None = ("data",),
                   ops: str | Sequence[str] | None = None) -> go.Figure:
    """Calls (or bytes) per power-of-two size bucket, one bar series per label
    (fused vs unfused): the central figure of Awan et al., "Communication
    Profiling and Characterization of Deep Learning Workloads on Clusters with
    High-Performance Interconnects"."""
    import plotly.graph_objects as go
    if value not in ("calls", "bytes"):
        from profiler.errors import UsageError

        raise UsageError(None, f"value must be 'calls' or 'bytes', got {value!r}")
    d = size_distribution(df, bucket=bucket, kinds=kinds, ops=ops)  # type: ignore[arg-type]
    title = f"Message sizes: {value} per size bucket (one rank)"
    if d.empty:
        return _empty(title, "no data calls")
    fig = go.Figure()
    order = sorted(d["size"].unique())
    xlabels = {s: lb for s, lb in zip(d["size"], d["size_label"])}
    for i, lb in enumerate(_labels(d)):
        part = _sub(d, lb).set_index("size").reindex(order)
        fig.add_trace(go.Bar(
            x=[xlabels[s] for s in order], y=part[value].fillna(0).to_numpy(),
            name=esc(lb) or value, marker_color=_color(i),
            customdata=np.stack([part["calls"].fillna(0), part["bytes"].fillna(0)], axis=1),
            hovertemplate="%{x}<br>calls %{customdata[0]:,}<br>bytes %{customdata[1]:,}"
                          "<extra>" + (esc(lb) or "") + "</extra>"))
    fig.update_layout(title=title, barmode="group", template=TEMPLATE,
                      xaxis_title="size bucket", yaxis_title=value,
                      yaxis_type="log" if value == "bytes" else "linear",
                      legend_title_text="trace")
    return fig


def calls_per_size(df: pd.DataFrame, *, kinds: str | Sequence[str] | None = ("data",),
                   ops: str | Sequence[str] | None = None) -> go.Figure:
    """Calls per exact message size (one rank), powers of two in one marker style and
    other sizes in another, on a log size axis."""
    import plotly.graph_objects as go
    d = size_distribution(df, bucket="exact", kinds=kinds, ops=ops)
    title = "Calls per message size (exact sizes)"
    if d.empty:
        return _empty(title, "no data calls")
    fig = go.Figure()
    for i, lb in enumerate(_labels(d)):
        part = _sub(d, lb)
        for pow2, symbol, suffix in ((True, "circle", "power of two"),
                                     (False, "diamond-open", "other sizes")):
            p = part.loc[part["is_pow2"] == pow2]
            if p.empty:
                continue
            name = f"{esc(lb)} ({suffix})" if lb else suffix
            fig.add_trace(go.Scatter(
                x=p["size"].clip(lower=1), y=p["calls"], mode="markers", name=name,
                marker={"symbol": symbol, "size": 9, "color": _color(i)},
                hovertemplate="%{x:,} B<br>%{y:,} calls<extra>" + esc(lb) + "</extra>"))
    _log_size_axis(fig)
    fig.update_layout(title=title, template=TEMPLATE, yaxis_title="calls", yaxis_type="log")
    return fig


#: Operations drawn as panels of the latency figure (the most time first);
#: the others are named in the title, and are in the report's tables.
MAX_PANELS = 4


def _time_ticks(lo_us: float, hi_us: float) -> tuple[list[float], list[str]]:
    """Log-axis ticks in human units (1 us, 10 us, 100 us, 1 ms, ...)."""
    from profiler.units import fmt_us

    lo = 10 ** np.floor(np.log10(max(lo_us, 1e-3)))
    vals = []
    v = float(lo)
    while v <= max(hi_us, lo) * 10:
        vals.append(v)
        v *= 10
    return vals, [fmt_us(x) for x in vals]


def _op_panels(st: pd.DataFrame, title: str) -> tuple[go.Figure, dict[str, tuple[int, int]],
                                                         list[str]]:
    """One panel per operation (the MAX_PANELS with the most time): the
    figure, each shown op's (row, col), and the ops left out."""
    from plotly.subplots import make_subplots
    total = (st["calls"] * st["median_us"]).groupby(st["op"].astype(str)).sum()
    ops = [str(o) for o in total.sort_values(ascending=False).index]
    shown, rest = ops[:MAX_PANELS], ops[MAX_PANELS:]
    cols = 1 if len(shown) == 1 else 2
    rows = (len(shown) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[esc(o) for o in shown],
                        shared_xaxes=False, horizontal_spacing=0.08,
                        vertical_spacing=0.14 if rows > 1 else 0.1)
    pos = {o: (i // cols + 1, i % cols + 1) for i, o in enumerate(shown)}
    if rest:
        title += f"; {len(rest)} more op(s) in the tables: " + esc(", ".join(rest))
    fig.update_layout(title=title, template=TEMPLATE, height=max(380, 330 * rows),
                      legend={"orientation": "h", "y": -0.12})
    return fig, pos, rest


def _finish_panels(fig: go.Figure, st: pd.DataFrame) -> None:
    _log_size_axis(fig)
    vals, text = _time_ticks(float(st["p5_us"].min()), float(st["p95_us"].max()))
    fig.update_yaxes(type="log", tickvals=vals, ticktext=text, title_text="latency")


def latency_vs_size(df: pd.DataFrame, *, kinds: str | Sequence[str] | None = ("data",),
                    ops: str | Sequence[str] | None = None,
                    models: dict[tuple[str, ...], AlphaBetaModel] | None = None,
                    mark_anomalies: bool = True, stats: pd.DataFrame | None = None
                    ) -> go.Figure:
    """Median latency per exact size with a p5-p95 band, the fitted piecewise
    alpha-beta model (dashed) and anomalous sizes marked: one panel per
    operation (the MAX_PANELS that take the most time; the title names the
    others), one colour per label.  ``stats``/``models``: latency_by_size /
    fit_models results to reuse."""
    import plotly.graph_objects as go
    st = stats if stats is not None else latency_by_size(df, kinds=kinds, ops=ops)
    title = "Latency vs message size (median, p5-p95 band, alpha-beta fit)"
    if st.empty:
        return _empty(title, "no timed calls")
    keys = [*label_keys(st), "op"]
    if models is None:
        models = fit_models(df, kinds=kinds, ops=ops, stats=st)
    an = (anomalies(df, kinds=kinds, ops=ops, models=models, stats=st) if mark_anomalies
          else None)
    fig, pos, _ = _op_panels(st, title)
    labels = _labels(st)
    seen: set[str] = set()
    for key, part in st.groupby(keys, sort=True):
        k = tuple(str(v) for v in (key if isinstance(key, tuple) else (key,)))
        op, label = k[-1], (k[0] if len(k) > 1 else "")
        if op not in pos:
            continue
        row, col = pos[op]
        c = _color(labels.index(label) if label in labels else 0)
        name = esc(label) if label else "median"
        first = name not in seen
        seen.add(name)
        at = {"row": row, "col": col}
        x = part["bytes"].clip(lower=1).to_numpy()
        fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]),
                                 y=np.concatenate([part["p95_us"], part["p5_us"][::-1]]),
                                 fill="toself", fillcolor=_rgba(c, 0.15), mode="lines",
                                 line={"width": 0}, hoverinfo="skip", name=f"{name} p5-p95",
                                 legendgroup=name, showlegend=False), **at)
        fig.add_trace(go.Scatter(
            x=x, y=part["median_us"], mode="lines+markers", name=name,
            legendgroup=name, showlegend=first, line={"color": c}, marker={"size": 5},
            customdata=np.stack([part["calls"], part["p5_us"], part["p95_us"]], axis=1),
            hovertemplate=f"{esc(op)} " + "%{x:,} B<br>median %{y:.2f} us<br>p5 "
                          "%{customdata[1]:.2f} / p95 %{customdata[2]:.2f} us<br>"
                          "%{customdata[0]} calls<extra></extra>"), **at)
        m = models.get(k)
        if m is not None:
            grid = np.unique(np.geomspace(max(x.min(), 1), x.max(), 200))
            fig.add_trace(go.Scatter(x=grid, y=predict(m, grid), mode="lines",
                                     name=f"{name} fit", legendgroup=name, showlegend=False,
                                     line={"color": c, "dash": "dash", "width": 1.5},
                                     hovertemplate="fit %{y:.2f} us<extra></extra>"), **at)
        if an is not None:
            mask = np.ones(len(an), dtype=bool)
            for colname, v in zip(keys, k):
                mask &= an[colname].astype(str).to_numpy() == v
            flagged = an.loc[mask & an["anomalous"].to_numpy(dtype=bool)]
            if len(flagged):
                fig.add_trace(go.Scatter(
                    x=flagged["bytes"].clip(lower=1), y=flagged["median_us"], mode="markers",
                    name="above the fit", legendgroup="anomalies",
                    showlegend="anomalies" not in seen,
                    marker={"symbol": "x", "size": 12, "color": "#d62728"},
                    customdata=np.stack([flagged["ratio"], flagged["is_pow2"]], axis=1),
                    hovertemplate="%{x:,} B: %{customdata[0]:.2f}x the fit<br>power of two: "
                                  "%{customdata[1]}<extra>anomaly</extra>"), **at)
                seen.add("anomalies")
    _finish_panels(fig, st)
    return fig


def rank_imbalance(df: pd.DataFrame, *, times: pd.DataFrame | None = None,
                   ranking: pd.DataFrame | None = None) -> go.Figure:
    """Per rank: data and control communication time (stacked) and the time the
    rank waited in matched calls for later arrivals; the worst straggler is named
    in the title.  ``times``/``ranking``: rank_times / stragglers results to reuse."""
    import plotly.graph_objects as go
    rt = times if times is not None else rank_times(df)
    title = "Per-rank communication time"
    if rt.empty:
        return _empty(title, "no communication calls")
    fig = go.Figure()
    labels = _labels(rt)
    multi = len(labels) > 1 or labels != [""]
    for i, lb in enumerate(labels):
        part = _sub(rt, lb)
        x = [f"{esc(lb)} r{r}" if multi else f"rank {r}" for r in part["rank"]]
        fig.add_trace(go.Bar(x=x, y=part["data_s"] * 1e3, name="data", marker_color=_color(0),
                             legendgroup="data", showlegend=i == 0))
        fig.add_trace(go.Bar(x=x, y=part["control_s"] * 1e3, name="control",
                             marker_color=_color(1), legendgroup="control", showlegend=i == 0))
        fig.add_trace(go.Scatter(x=x, y=part["waited_s"] * 1e3, mode="markers",
                                 name="waited for later ranks", legendgroup="wait",
                                 marker={"symbol": "line-ew-open", "size": 28,
                                         "color": "#000", "line": {"width": 3}},
                                 showlegend=i == 0))
    st = ranking if ranking is not None else stragglers(df)
    if len(st) and int(st["last_count"].max()) > 0:
        top = st.loc[st["rank_order"] == 1].iloc[0]
        where = f" ({esc(top['label'])})" if "label" in st.columns else ""
        title += (f" - most often last: rank {int(top['rank'])}{where}, "
                  f"{top['last_share']:.0%} of calls")
    fig.update_layout(title=title, barmode="stack", template=TEMPLATE,
                      yaxis_title="time (ms)")
    return fig


def step_timeline(df: pd.DataFrame, *, table: pd.DataFrame | None = None) -> go.Figure:
    """Per step: step time, communication and exposed communication (ms, left axis)
    and images/sec (right axis), per label.  ``table``: a step_table to reuse."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    t = table if table is not None else step_table(df)
    title = "Per-step time, communication and images/sec"
    if t.empty:
        return _empty(title, "no step records (profiler.step / DistributedOptimizer hook)")
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    unknown: list[str] = []
    for i, lb in enumerate(_labels(t)):
        part = _sub(t, lb)
        name = esc(lb)
        pre = f"{name} " if name else ""
        c = _color(i)
        fig.add_trace(go.Bar(x=part["step"], y=part["wall_ms"], name=f"{pre}step time",
                             marker_color=_rgba(c, 0.35), legendgroup=name), secondary_y=False)
        fig.add_trace(go.Scatter(x=part["step"], y=part["comm_ms"], mode="lines",
                                 name=f"{pre}communication", line={"color": c},
                                 legendgroup=name), secondary_y=False)
        fig.add_trace(go.Scatter(x=part["step"], y=part["exposed_ms"], mode="lines",
                                 name=f"{pre}exposed comm.", line={"color": c, "dash": "dot"},
                                 legendgroup=name), secondary_y=False)
        ips = pd.to_numeric(part["images_per_s"], errors="coerce")
        if not (ips > 0).any():  # no image counts: no rate to draw, and not a rate of 0
            unknown.append(name or "the trace")
            continue
        fig.add_trace(go.Scatter(x=part["step"], y=ips.where(ips > 0), mode="lines+markers",
                                 name=f"{pre}images/sec", line={"color": c, "width": 3},
                                 legendgroup=name), secondary_y=True)
    if unknown:
        title += (f" (images/sec unknown for {', '.join(unknown)}: its steps carry no image "
                  "count; HOROVOD_PROFILE_BATCH_SIZE=N gives it)")
    fig.update_layout(title=title, template=TEMPLATE, barmode="group", xaxis_title="step")
    fig.update_yaxes(title_text="ms (mean over ranks)", secondary_y=False)
    fig.update_yaxes(title_text="images/sec", secondary_y=True, rangemode="tozero")
    return fig


def breakdown_by_rank(bd: pd.DataFrame, *, title: str = "Where a step goes, per rank"
                      ) -> go.Figure:
    """One stacked horizontal bar per rank: the mean ms per step of each part of
    the step breakdown (analysis.breakdown.rank_breakdown rows)."""
    import plotly.graph_objects as go

    from .breakdown import LABELS, PARTS

    if bd.empty or (bd["source"] == "none").all():
        return _empty(title, "no step breakdown (steps with Horovod's synchronize or "
                             "blocking collectives)")
    per = bd.groupby("rank")[[f"{p}_ms" for p in PARTS]].mean().sort_index(ascending=False)
    fig = go.Figure()
    ranks = [f"rank {int(r)}" for r in per.index]
    for p in PARTS:
        fig.add_trace(go.Bar(y=ranks, x=per[f"{p}_ms"], name=LABELS[p], orientation="h",
                             marker_color=PART_COLORS[p],
                             hovertemplate="%{y}: %{x:.3f} ms/step<extra>" + LABELS[p]
                             + "</extra>"))
    fig.update_layout(title=title, barmode="stack", template=TEMPLATE,
                      xaxis_title="ms per step (mean over the steady steps)",
                      height=max(300, 160 + 28 * len(ranks)),
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0})
    return fig


def breakdown_over_steps(bd: pd.DataFrame, *, title: str = "Where each step goes"
                         ) -> go.Figure:
    """Per step, the parts of the breakdown (mean over ranks), stacked: the steps
    over time."""
    import plotly.graph_objects as go

    from .breakdown import LABELS, PARTS

    if bd.empty or (bd["source"] == "none").all():
        return _empty(title, "no step breakdown")
    per = bd.groupby("step")[[f"{p}_ms" for p in PARTS]].mean()
    fig = go.Figure()
    for p in PARTS:
        fig.add_trace(go.Bar(x=per.index, y=per[f"{p}_ms"], name=LABELS[p],
                             marker_color=PART_COLORS[p]))
    fig.update_layout(title=title, barmode="stack", template=TEMPLATE, xaxis_title="step",
                      yaxis_title="ms (mean over ranks)", bargap=0.05)
    return fig


def control_vs_data(df: pd.DataFrame) -> go.Figure:
    """Share of calls and of communication time by kind (data, control), per label."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from ._frame import calls

    c = calls(df, kinds=None)
    title = "Control vs data: share of calls and of time"
    if c.empty:
        return _empty(title, "no communication calls")
    work = pd.DataFrame({
        "label": keys_of(c["label"]) if "label" in c.columns else pd.Categorical([""] * len(c)),
        "kind": keys_of(c["kind"]) if "kind" in c.columns else pd.Categorical(["data"] * len(c)),
        "dur": c["dur_ns"].to_numpy(dtype=float)})
    agg = work.groupby(["label", "kind"], observed=True).agg(calls=("dur", "size"),
                                                             time=("dur", "sum"))
    agg = agg.reset_index()
    agg["label"] = agg["label"].astype(str)
    agg["kind"] = agg["kind"].astype(str)
    tot = agg.groupby("label")[["calls", "time"]].transform("sum")
    agg["calls_share"] = agg["calls"] / tot["calls"]
    agg["time_share"] = agg["time"] / tot["time"].where(tot["time"] > 0, 1)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("calls", "time"))
    for i, kd in enumerate(sorted(agg["kind"].unique())):
        part = agg.loc[agg["kind"] == kd]
        x = [esc(v) or "trace" for v in part["label"]]
        for col, share in ((1, "calls_share"), (2, "time_share")):
            fig.add_trace(go.Bar(x=x, y=part[share], name=esc(kd), marker_color=_color(i),
                                 legendgroup=kd, showlegend=col == 1,
                                 hovertemplate="%{y:.1%}<extra>" + esc(kd) + "</extra>"),
                          row=1, col=col)
    fig.update_layout(title=title, barmode="stack", template=TEMPLATE)
    fig.update_yaxes(tickformat=".0%", range=[0, 1])
    return fig


def bench_overlay(app: pd.DataFrame, bench: pd.DataFrame, *,
                  ops: str | Sequence[str] | None = None) -> go.Figure:
    """The application's data calls (median latency per exact size, marker area by
    number of calls) over the benchmark's latency curve (median, p5-p95 band, fit),
    in the benchmark's panel of each operation.  Both frames may hold several
    labels (e.g. one bench per interconnect)."""
    import plotly.graph_objects as go
    st_bench = latency_by_size(bench, ops=ops)
    fig = latency_vs_size(bench, ops=ops, mark_anomalies=False, stats=st_bench)
    st = latency_by_size(app, ops=ops)
    if st.empty or st_bench.empty:
        fig.update_layout(title="Application calls over the benchmark curve")
        return fig
    _, pos, _ = _op_panels(st_bench, "")
    title = "Application calls over the benchmark curve"
    left = sorted(set(st["op"].astype(str)) - set(pos))
    if left:
        title += "; not benchmarked or not shown: " + esc(", ".join(left))
    fig.update_layout(title=title)
    keys = [*label_keys(st), "op"]
    cmax = float(st["calls"].max())
    for i, (key, part) in enumerate(st.groupby(keys, sort=True)):
        k = tuple(str(v) for v in (key if isinstance(key, tuple) else (key,)))
        if k[-1] not in pos:
            continue
        row, col = pos[k[-1]]
        name = "application " + esc(" / ".join(x for x in k if x))
        fig.add_trace(go.Scatter(
            x=part["bytes"].clip(lower=1), y=part["median_us"], mode="markers", name=name,
            marker={"size": 6 + 24 * np.sqrt(part["calls"] / cmax), "color": _color(i + 5),
                    "line": {"width": 1, "color": "#333"}, "opacity": 0.75},
            customdata=part["calls"],
            hovertemplate="%{x:,} B<br>median %{y:.2f} us<br>%{customdata} calls"
                          "<extra>application</extra>"), row=row, col=col)
    both = pd.concat([st_bench[["p5_us", "p95_us"]],
                      st[["median_us", "median_us"]].set_axis(["p5_us", "p95_us"], axis=1)])
    _finish_panels(fig, both)
    return fig
