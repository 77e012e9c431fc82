"""One standalone, offline HTML report from one or more traces.

    from profiler.analysis.report import write_report
    write_report(["fused/trace.json", "unfused/trace.json"], "report.html")

The first screen is the step breakdown per rank (the chart) and the findings'
headlines with their cost (the overview: what `profiler advise` opens with);
the details follow: the findings in full, where each step goes, then the
traces (command, hosts, ranks, transport, environment), summary
tables per collective and size bucket, message sizes (fused vs unfused when
several traces), latency vs size with the fitted model and anomalies, padding
what-if, per-rank imbalance and stragglers, per-step timeline and images/sec,
control vs data share, fusion lineage (tensor names) when the profile has it,
and a comparison when there are several traces.

Offline: plotly.js is inlined once, with the first figure; every other figure
reuses it.  Safety: every string that comes from a trace (tensor, host and
label names, the command line, environment values) is HTML-escaped --
``html.escape`` for text, ``DataFrame.to_html(escape=True)`` for tables, and
escaped text inside figures (see figures.esc); plotly's JSON additionally
encodes ``<``, ``>`` and ``/`` inside the script blocks.  Each figure sits in
``<section class="figure" data-figure="NAME">`` so the report can be read back
(tests/test_report.py decodes the figures' data from the HTML).
"""

from __future__ import annotations

import html
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:  # plotly is imported where a figure is made: advise and summarize never load it
    import plotly.graph_objects as go

from profiler._version import __version__
from profiler.errors import UsageError
from profiler.units import fmt_bytes, fmt_number

from . import figures as F
from ._frame import distinct, isin
from .imbalance import stragglers
from .model import (
    anomalies,
    fit_models,
    latency_by_size,
    models_table,
    padding_summary,
    padding_whatif,
)
from .sizes import size_summary
from .throughput import correlation, step_table, throughput_summary

__all__ = ["render_report", "write_report", "write_profiles"]

MAX_TABLE_ROWS = 80
# what the sections read (loading only these keeps a 10M-call report in memory)
REPORT_COLUMNS = ["rank", "backend", "op", "t_start_ns", "t_end_ns", "dur_ns", "bytes",
                  "count", "dtype", "comm", "comm_size", "seq", "kind", "device", "step",
                  "thread_kind", "tensors", "n_tensors", "fill_ratio", "track"]
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;
max-width:1200px;padding:1em 2em;color:#222}
h1{font-size:1.6em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table.data{border-collapse:collapse;font-size:.85em;margin:.5em 0}
table.data th,table.data td{border:1px solid #ddd;padding:2px 8px;text-align:right}
table.data th{background:#f4f4f4} table.data td:first-child{text-align:left}
.note{color:#8a6d3b;background:#fcf8e3;padding:.4em .8em;border-radius:4px}
.muted{color:#777;font-size:.85em} code{background:#f4f4f4;padding:0 .3em}
nav a{margin-right:1em} details{margin:.5em 0}
details.long summary{cursor:pointer;color:#336} input.filter{margin:.3em 0;width:20em}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


#: Tables longer than this show their first rows and fold the whole, with a
#: filter box; a folded table holds at most MAX_FOLDED_ROWS rows.
FOLD_ROWS = 15
MAX_FOLDED_ROWS = 5000
# Filters the rows of folded tables as the reader types; "#filter=TEXT" in
# the address fills every filter box (a link that opens the report filtered).
TABLE_SCRIPT = """<script>
(function(){
 function apply(box){var q=box.value.toLowerCase(),n=0;
  var rows=box.parentNode.querySelectorAll('table.data tbody tr');
  rows.forEach(function(r){var ok=!q||r.textContent.toLowerCase().indexOf(q)>=0;
   r.style.display=ok?'':'none';if(ok)n++;});
  var c=box.parentNode.querySelector('.count');if(c)c.textContent=n+' of '+rows.length+' rows';}
 var boxes=document.querySelectorAll('input.filter');
 var m=/[#&]filter=([^&]*)/.exec(location.hash);
 boxes.forEach(function(b){b.addEventListener('input',function(){apply(b);});
  if(m){b.value=decodeURIComponent(m[1]);b.parentNode.parentNode.open=true;apply(b);}});
})();
</script>"""


def _table(df: pd.DataFrame, *, max_rows: int = MAX_TABLE_ROWS) -> str:
    """A table: the first min(FOLD_ROWS, max_rows) rows in view; when there are
    more, every row (up to MAX_FOLDED_ROWS, beyond which the page says how to
    get the rest) in a folded block with a filter box.  Never silently cut."""
    if df is None or df.empty:
        return '<p class="muted">(nothing to show)</p>'

    def html_of(part: pd.DataFrame) -> str:
        return part.to_html(index=False, escape=True, classes="data", border=0,
                            float_format=fmt_number, na_rep="-")

    visible = min(FOLD_ROWS, max_rows)
    if len(df) <= visible:
        return html_of(df)
    every = df.head(MAX_FOLDED_ROWS)
    rest = len(df) - len(every)
    note = (f'<p class="muted">{rest} more row(s) beyond {MAX_FOLDED_ROWS}: the CLI '
            "(<code>profiler summarize --format csv</code>, <code>profiler tensors "
            "--format csv</code>) gives every row</p>" if rest > 0 else "")
    return (f'{html_of(df.head(visible))}<details class="long"><summary>all {len(df)} rows, '
            'with a filter</summary><div class="folded"><input class="filter" '
            'type="search" placeholder="filter rows (any text)"> '
            f'<span class="count muted"></span>{html_of(every)}{note}</div></details>')


class _Figures:
    """Renders figures; plotly.js goes inline with the first one only."""

    def __init__(self) -> None:
        self.first = True
        self.names: list[str] = []

    def __call__(self, name: str, fig: go.Figure) -> str:
        import plotly.io as pio
        div = pio.to_html(fig, full_html=False, include_plotlyjs=self.first,
                          div_id=f"fig-{name}", config={"displaylogo": False})
        self.first = False
        self.names.append(name)
        return f'<section class="figure" data-figure="{_e(name)}">{div}</section>'


def _trace_table(metas: Mapping[str, Mapping[str, Any]], df: pd.DataFrame) -> str:
    from profiler.analysis.interconnect import interconnect

    rows = []
    for label, m in metas.items():
        sub = df.loc[isin(df["label"], [label])] if "label" in df.columns else df
        cmd = m.get("command")
        cmd_s = " ".join(map(str, cmd)) if isinstance(cmd, (list, tuple)) else (cmd or "")
        hosts = m.get("hosts") or sorted({str(r.get("host", "")) for r in
                                          (m.get("ranks") or {}).values()}
                                         if isinstance(m.get("ranks"), dict) else [])
        rows.append({
            "trace": label, "command": cmd_s,
            "hosts": ", ".join(map(str, hosts)) if isinstance(hosts, (list, tuple))
            else str(hosts),
            "ranks": m.get("world_size", sub["rank"].nunique() if len(sub) else 0),
            "calls": len(sub), "interconnect": interconnect(m) or "-",
            "missing ranks": ", ".join(map(str, m.get("missing_ranks") or [])) or "-",
            "MPI": str(m.get("mpi_version", ""))[:60],
            "created": m.get("created", ""),
        })
    out = _table(pd.DataFrame(rows))
    for label, m in metas.items():
        env = m.get("env") or {}
        if env:
            items = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>"
                            for k, v in sorted(env.items()))
            out += (f"<details><summary>environment of {_e(label)} ({len(env)} variables)"
                    f"</summary><table class=\"data\">{items}</table></details>")
    return out


def _summary(df: pd.DataFrame) -> pd.DataFrame:
    from .summary import summarize

    by = ["op", "bucket", "kind"] if "kind" in df.columns else ["op", "bucket"]
    t = summarize(df, by=by)
    if "total_bytes" in t.columns:
        t["total_bytes"] = [fmt_bytes(v) for v in t["total_bytes"]]
    return t


# which section holds the figure and table behind each kind of finding
_EVIDENCE = {"compute_bound": ("breakdown", "Where a step goes"),
             "transfer_bound": ("breakdown", "Where a step goes"),
             "rank_waiting": ("breakdown", "Where a step goes"),
             "cycle_time": ("breakdown", "Where a step goes"),
             "horovod_wait": ("breakdown", "Where a step goes"),
             "second_cycles": ("steps", "Steps and throughput"),
             "cpu_contention": ("breakdown", "Where a step goes"),
             "noisy_neighbour": ("breakdown", "Where a step goes"),
             "late_ranks": ("imbalance", "Per-rank imbalance"),
             "control_plane": ("kinds", "Control vs data"),
             "latency_cliffs": ("latency", "Latency vs size")}


def _anchor(lb: object) -> str:
    """A label as an id fragment."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(lb)) or "trace"


def _cost(f: Any) -> str:
    """A finding's cost as the report writes it ("" when it has none)."""
    from profiler.units import fmt_ms

    if f.cost_ms is None:
        return ""
    cost = (f" <span class=\"muted\">[{_e(f.cost_label)} "
            f"{_e(fmt_ms(f.cost_ms))}/step")
    if f.cost_interval_ms:
        lo, hi = f.cost_interval_ms
        cost += f", 95% interval {_e(fmt_ms(lo))} to {_e(fmt_ms(hi))}"
    return cost + "]</span>"


def _overview_section(labels: Sequence[str], multi: bool, advices: Mapping[str, Any],
                      charts: Mapping[str, str]) -> str:
    """The first screen: each trace's step breakdown per rank (the chart), the
    line that sets the causes against the step, and the findings' headlines
    with their cost, each linked to its details under Findings."""
    out = []
    for lb in labels:
        advice = advices[lb]
        head = f"<h3>{_e(str(lb))}</h3>" if multi else ""
        line = advice.reconciliation()
        items = [f'<li><a href="#finding-{_anchor(lb)}-{i}"><b>{_e(f.headline)}</b></a>'
                 f"{_cost(f)}</li>" for i, f in enumerate(advice.significant, 1)]
        if not items:
            items = ["<li>no significant finding: nothing measured here costs more than "
                     "the run-to-run noise</li>"]
        rest = len(advice.minor) + len(advice.limits)
        more = (f'<p class="muted">{rest} more below the noise floor or beyond what this '
                'trace can support: <a href="#findings">Findings</a></p>' if rest else "")
        out.append(head + charts.get(lb, "")
                   + (f'<p class="reconcile">{_e(line)}</p>' if line else "")
                   + '<ol class="headlines">' + "".join(items) + "</ol>" + more)
    return "".join(out)


def _findings_section(df: pd.DataFrame, labels: Sequence[str],
                      metas: Mapping[str, Mapping[str, Any]], multi: bool,
                      advices: Mapping[str, Any] | None = None) -> str:
    """The findings of each trace (analysis.findings, as `profiler advise` ranks
    them), each linked to the section that supports it; `advices`: each
    label's, when already made (the overview's)."""
    from .findings import advise_frame

    out = []
    for lb in labels:
        sub = df.loc[isin(df["label"], [lb])] if multi else df
        advice = (advices or {}).get(lb) or advise_frame(sub, dict(metas.get(lb) or {}),
                                                         path=str(lb))
        items = []
        for n, f in enumerate(advice.significant + advice.minor, 1):
            cost = _cost(f)
            link = ""
            if f.key in _EVIDENCE:
                anchor, name = _EVIDENCE[f.key]
                link = f' <a href="#{anchor}">({_e(name)})</a>'
            body = "".join(f"<br>{_e(d)}" for d in f.details)
            if f.null:
                body += f"<br><i>tested against:</i> {_e(f.null)}"
            if f.not_claimed:
                body += f"<br><b>not claimed:</b> {_e(f.not_claimed)}"
            if f.recommendation:
                body += f"<br><b>try:</b> {_e(f.recommendation)}"
            cls = "" if f.significant else ' class="muted"'
            items.append(f'<li id="finding-{_anchor(lb)}-{n}"{cls}><b>{_e(f.headline)}</b>'
                         f"{cost}{link}{body}</li>")
        if not advice.significant:
            items.insert(0, "<li>no significant finding: nothing measured here costs more "
                            "than the run-to-run noise</li>")
        limits = "".join(f"<li>{_e(f.headline)}</li>" for f in advice.limits)
        head = f"<h3>{_e(str(lb))}</h3>" if multi else ""
        line = advice.reconciliation()
        if line:
            head += (f'<p class="reconcile">{_e(line)} '
                     '<a href="#breakdown">(Where a step goes)</a></p>')
        out.append(head + "<ol>" + "".join(items) + "</ol>"
                   + (f"<p>Cannot conclude:</p><ul>{limits}</ul>" if limits else ""))
    return "".join(out)


def _hang_section(paths: Mapping[str, str | None]) -> str:
    """What `profiler hang` says, for a trace whose profile directory still
    holds its raw files and shows something stuck (a collective in flight, a
    dead rank, a tensor one rank never submitted) or a hang snapshot; "" when
    none does."""
    from profiler.errors import ProfilerError

    from .hang import diagnose, render

    out = []
    for lb, path in paths.items():
        if not path:
            continue
        d = Path(path)
        d = d if d.is_dir() else d.parent
        if not (d / "raw").is_dir():
            continue
        try:
            dg = diagnose(d)
        except ProfilerError:
            continue
        if not dg.stuck and not dg.snapshot:
            continue
        head = f"<h3>{_e(str(lb))}</h3>" if len(paths) > 1 else ""
        out.append(head + "<pre>" + _e("\n".join(render(dg))) + "</pre>")
    return "".join(out)


def _lineage_section(paths: Mapping[str, str | None]) -> str:
    """Tensors and fused calls from lineage.parquet next to each trace, if any."""
    from profiler.errors import ProfilerError

    parts = []
    for label, path in paths.items():
        if not path:
            continue
        try:
            from profiler.formats import lineage as LF

            from . import lineage as L

            lin = LF.load(path)
        except (ProfilerError, ImportError):
            continue
        calls = L.calls(lin)
        if lin.empty:
            continue
        tensors = (lin.groupby("tensor", sort=False)
                   .agg(ops=("tensor", "size"), bytes=("tensor_bytes", "sum"))
                   .reset_index().sort_values("bytes", ascending=False))
        fused = calls.assign(tensors=[", ".join(map(str, t)) for t in calls["tensors"]])
        fused = fused.sort_values("n_tensors", ascending=False)[
            ["call_op", "call_bytes", "n_tensors", "fill_ratio", "tensors"]]
        parts.append(f"<h3>{_e(label) or 'trace'}</h3>"
                     f"<p>{len(tensors)} tensor(s), {len(calls)} data call(s) with lineage; "
                     f"mean {calls['n_tensors'].mean():.2f} tensor(s) per call.</p>"
                     + _table(tensors, max_rows=30) + _table(fused, max_rows=30))
    return "".join(parts)


def _tensor_column_section(df: pd.DataFrame) -> str:
    """Fused calls from the frame's own ``tensors`` column (names joined by ";")."""
    from ._frame import calls, lowest_rank_view

    c = lowest_rank_view(calls(df))
    c = c.loc[c["tensors"].notna() & (c["tensors"].astype(str) != "")]
    if c.empty:
        return ""
    cols = [x for x in ("label", "op", "bytes", "n_tensors", "fill_ratio", "tensors")
            if x in c.columns]
    t = c[cols].copy()
    t["tensors"] = t["tensors"].astype(str).str.replace(";", ", ", regex=False)
    if "n_tensors" in t.columns:
        t = t.sort_values("n_tensors", ascending=False, kind="stable")
    names = pd.Series([n for v in c["tensors"].astype(str) for n in v.split(";") if n])
    per = names.value_counts().rename_axis("tensor").reset_index(name="calls")
    return (f"<p>{len(per)} tensor(s) in {len(c)} data call(s) (lowest rank).</p>"
            + _table(per, max_rows=30) + _table(t, max_rows=30))


def render_report(
    df: pd.DataFrame,
    *,
    metas: Mapping[str, Mapping[str, Any]] | None = None,
    paths: Mapping[str, str | None] | None = None,
    title: str | None = None,
    progress: bool = True,
    exact: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The report as one HTML string, from a loaded frame (labels for several traces)
    and the traces' metadata blocks (label -> metadata; "" for a single trace).

    exact: for traces too large to load whole (label -> {"selection": what the
    frame holds, "summary": the summary table over every call, "stragglers":
    the ranking over every matched call}): the tables come from there, the
    figures from the window in `df`, and the report says so."""
    if not isinstance(df, pd.DataFrame):
        raise UsageError(None, "render_report needs a DataFrame")
    metas = dict(metas or {})
    exact = dict(exact or {})
    labels = distinct(df["label"]) if "label" in df.columns else [""]
    for lb in labels:
        metas.setdefault(lb, {})
    fig = _Figures()
    sections: list[tuple[str, str, Callable[[], str]]] = []
    multi = "label" in df.columns

    advices: dict[str, Any] = {}  # label -> advise's Advice, made once
    contexts: dict[str, Any] = {}  # label -> findings Context (its step breakdown)

    def sub_of(lb: str) -> pd.DataFrame:
        return df.loc[isin(df["label"], [lb])] if multi else df

    def context_of(lb: str) -> Any:
        from .findings.base import Context

        if lb not in contexts:
            sub = sub_of(lb)
            contexts[lb] = Context(df=sub.drop(columns=["label"]) if "label" in sub.columns
                                   else sub, meta=dict(metas.get(lb) or {}), path=str(lb))
        return contexts[lb]

    def breakdown_of(lb: str) -> pd.DataFrame:
        from .breakdown import rank_breakdown

        ctx = context_of(lb)
        return ctx.breakdown if ctx.n_steps else rank_breakdown(sub_of(lb).iloc[0:0])

    def no_breakdown(bd: pd.DataFrame) -> bool:
        return bool(bd.empty or (bd["source"] == "none").all())

    def sec_overview() -> str:
        from .findings import advise_frame

        charts = {}
        for lb in labels:
            advices[lb] = advise_frame(sub_of(lb), dict(metas.get(lb) or {}), path=str(lb))
            bd = breakdown_of(lb)
            charts[lb] = ('<p class="muted">no step breakdown: it needs steps and Horovod\'s '
                          "synchronize (hvd.DistributedOptimizer) or blocking collectives on "
                          "the thread that marks steps</p>" if no_breakdown(bd)
                          else fig(f"breakdown-ranks-{_anchor(lb)}", F.breakdown_by_rank(bd)))
        return _overview_section(labels, multi, advices, charts)

    def sec_traces() -> str:
        return _trace_table(metas, df)

    def sec_findings() -> str:
        return _findings_section(df, labels, metas, multi, advices)

    def sec_summary() -> str:
        out = ""
        parts = []
        for lb in labels:
            ex = exact.get(lb) or {}
            if ex.get("selection"):
                out += (f'<p class="muted">{html.escape(str(lb) or "trace")}: figures show a '
                        f'window ({html.escape(str(ex["selection"]))}); the tables count '
                        "every call of the dataset</p>")
            if ex.get("summary") is not None:
                t = ex["summary"].copy()
                if "total_bytes" in t.columns:
                    t["total_bytes"] = [fmt_bytes(v) for v in t["total_bytes"]]
            else:
                t = _summary(df.loc[isin(df["label"], [lb])] if multi else df)
            if multi:
                t.insert(0, "trace", lb)
            parts.append(t)
        table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        return out + _table(table, max_rows=200)

    def sec_sizes() -> str:
        out = _table(size_summary(df))
        out += fig("size-histogram", F.size_histogram(df))
        out += fig("size-bytes", F.size_histogram(df, value="bytes"))
        out += fig("calls-per-size", F.calls_per_size(df))
        return out

    def sec_latency() -> str:
        st = latency_by_size(df)
        if st.empty:
            return '<p class="muted">no timed data calls</p>'
        models = fit_models(df, stats=st)
        an = anomalies(df, models=models, stats=st)
        out = fig("latency-vs-size", F.latency_vs_size(df, models=models, stats=st))
        names = [c for c in ("label", "op") if c in st.columns]
        out += "<h3>Alpha-beta fit</h3>" + _table(models_table(models, names))
        flagged = an.loc[an["anomalous"].astype(bool)]
        out += (f"<h3>Anomalous sizes</h3><p>{len(flagged)} of {len(an)} measured sizes sit "
                f"far above the fit ({int((~flagged['is_pow2'].astype(bool)).sum())} of "
                "them not powers of two).</p>" + _table(flagged))
        w = padding_whatif(df, models=models, stats=st)
        out += ("<h3>Padding what-if</h3><p>Estimated time saved if every message were "
                "padded to the next power of two (measured medians where the padded size "
                "occurs, the fit elsewhere).</p>" + _table(padding_summary(w)))
        return out

    def sec_imbalance() -> str:
        given = [ex["stragglers"] for ex in exact.values() if ex.get("stragglers") is not None]
        ranking = given[0] if len(given) == 1 and not multi else stragglers(df)
        out = fig("rank-imbalance", F.rank_imbalance(df, ranking=ranking))
        return out + "<h3>Stragglers (arrived last in matched calls)</h3>" + _table(ranking)

    def sec_breakdown() -> str:
        out = []
        for lb in labels:
            bd = breakdown_of(lb)
            head = f"<h3>{_e(str(lb))}</h3>" if multi else ""
            if no_breakdown(bd):
                out.append(head + '<p class="muted">no step breakdown (see the first '
                                  "section)</p>")
                continue
            out.append(head + "<p>The parts of a rank's step sum to its step time "
                       "(analysis.breakdown): compute and the rest, waiting for other "
                       "ranks, waiting for Horovod, transfer, the profiler, unexplained; "
                       'per rank in the <a href="#overview">first section</a>, over the '
                       "steps here.</p>"
                       + fig(f"breakdown-steps-{_anchor(lb)}", F.breakdown_over_steps(bd))
                       + _table(context_of(lb).parts))
        return "".join(out)

    def sec_steps() -> str:
        t = step_table(df)
        if t.empty:
            return ('<p class="muted">no step records: mark steps with profiler.step() or '
                    "use hvd.DistributedOptimizer</p>")
        out = fig("step-timeline", F.step_timeline(df, table=t))
        out += _table(throughput_summary(table=t))
        c = correlation(table=t, warn=False)
        out += "<h3>Communication time vs step time</h3>" + _table(c.drop(columns=["note"]))
        for note in c["note"]:
            if note:
                out += f'<p class="note">{_e(note)}</p>'
        return out

    def sec_kinds() -> str:
        return fig("control-vs-data", F.control_vs_data(df))

    def sec_lineage() -> str:
        out = _lineage_section(paths or {})
        if not out and "tensors" in df.columns:
            out = _tensor_column_section(df)
        return out or '<p class="muted">no fusion lineage</p>'

    def sec_whatif() -> str:
        from .predict import report_section

        # one profile loaded whole: the prediction reads these rows, not the files again
        whole = {} if df.attrs.get("selection") or "label" in df.columns else {"": df}
        return report_section(paths or {}, fig, _table, frames=whole, metas=metas)

    def sec_compare() -> str:
        from profiler.formats.horovod_env import settings as horovod_settings

        from .compare import compare

        cycles = {lb: horovod_settings(dict(metas.get(lb) or {}).get("env") or {}).cycle_time_ms
                  for lb in labels}
        t = compare(df, cycles=cycles)
        t["bucket"] = [f"\u2264 {fmt_bytes(int(b))}" if b else "" for b in t["bucket"]]
        return _table(t, max_rows=200)

    def sec_hang() -> str:
        return _hang_section(paths or {})

    hang_text = sec_hang()
    sections = [("hang", "The job hangs", lambda: hang_text)] if hang_text else []
    sections += [
        ("overview", "Where a step goes, and what to change", sec_overview),
        ("findings", "Findings", sec_findings),
        ("breakdown", "Where a step goes", sec_breakdown),
        ("traces", "Traces", sec_traces),
        ("summary", "Summary per collective and size", sec_summary),
        ("sizes", "Message sizes", sec_sizes),
        ("latency", "Latency vs size", sec_latency),
        ("imbalance", "Per-rank imbalance", sec_imbalance),
        ("steps", "Steps and throughput", sec_steps),
        ("kinds", "Control vs data", sec_kinds),
        ("lineage", "Fusion lineage", sec_lineage),
        ("whatif", "What if: other rank counts and fabrics", sec_whatif),
    ]
    if multi and len(labels) > 1:
        sections.append(("compare", "Comparison", sec_compare))
    body: list[str] = []
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("report: {task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True,
                  disable=not progress) as bar:
        task = bar.add_task("", total=len(sections))
        for anchor, heading, make in sections:
            bar.update(task, description=heading)
            body.append(f'<h2 id="{anchor}">{_e(heading)}</h2>{make()}')
            bar.advance(task)
    heading = title or ("horovod-profiler report: " + ", ".join(x for x in labels if x)
                        if multi else "horovod-profiler report")
    nav = "".join(f'<a href="#{a}">{_e(h)}</a>' for a, h, _ in sections)
    created = time.strftime("%Y-%m-%d %H:%M:%S")
    from .selfcost import cost_line

    costs = "".join(
        f'<p class="muted" id="self-cost">{_e((str(lb) + ": ") if lb else "")}'
        f'{_e(line)}</p>'
        for lb in labels if (line := cost_line(dict(metas.get(lb) or {}))))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(heading)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_e(heading)}</h1><p class=\"muted\">generated {created} by horovod-profiler "
            f"{_e(__version__)}; {len(df):,} rows</p>{costs}<nav>{nav}</nav>"
            + "".join(body) + TABLE_SCRIPT + "</body></html>\n")


def write_report(
    traces: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    progress: bool = True,
    max_rows: int | None = 5_000_000,
) -> Path:
    """Load the traces, render the report and write it to `out` (atomically):
    write_profiles, each trace's metadata read here (the CLI goes through
    facade.TraceAnalysis.report, which has it already)."""
    from .load import trace_meta

    if not traces:
        raise UsageError(None, "report needs at least one trace")
    return write_profiles([(os.fspath(t), trace_meta(t), None) for t in traces], out,
                          labels=labels, title=title, progress=progress, max_rows=max_rows)


def write_profiles(
    profiles: Sequence[tuple[str, Mapping[str, Any] | None, Any]],
    out: str | os.PathLike[str],
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    progress: bool = True,
    max_rows: int | None = 5_000_000,
    frame: pd.DataFrame | None = None,
) -> Path:
    """The report of profiles already opened: (path, trace metadata or None for
    a parquet or raw file, engine.Dataset or None) each; `frame`: one profile's
    rows already loaded whole (facade.TraceAnalysis.rows), read no more.

    A trace with more than `max_rows` calls is not loaded whole: its figures
    come from a bounded window (first ranks, likely stragglers, middle steps)
    and its summary table and straggler ranking are computed over every call
    by the dataset engine (analysis.engine)."""
    from .load import load

    if not profiles:
        raise UsageError(None, "report needs at least one trace")
    df = frame if frame is not None and len(profiles) == 1 and not labels else load(
        *(path for path, _, _ in profiles), label=list(labels) if labels else None,
        columns=REPORT_COLUMNS, max_rows=max_rows)
    if "label" in df.columns:
        names = [str(x) for x in df["label"].cat.categories] if isinstance(
            df["label"].dtype, pd.CategoricalDtype) else distinct(df["label"])
    else:
        names = [""]
    metas = {name: dict(meta or {}) for name, (_, meta, _) in zip(names, profiles)}
    paths: dict[str, str | None] = {name: path for name, (path, _, _) in zip(names, profiles)}
    exact: dict[str, dict[str, Any]] = {}
    selections = df.attrs.get("selection") or {}
    for name, (path, _, dataset) in zip(names, profiles):
        sel = selections.get(name) if isinstance(selections, Mapping) else None
        if not sel:
            continue
        # too large to load whole: exact tables from the dataset, queried in place
        from .engine import open_dataset, stragglers_dataset, summarize_dataset

        ds = dataset if dataset is not None else open_dataset(path)
        assert ds is not None, "load selects a window only of a dataset"  # else a bug
        exact[name] = {"selection": sel.get("description", sel) if isinstance(sel, Mapping)
                       else sel,
                       "summary": summarize_dataset(ds, ["op", "bucket", "kind"]),
                       "stragglers": stragglers_dataset(ds)}
    text = render_report(df, metas=metas, paths=paths, title=title, progress=progress,
                         exact=exact)
    dest = Path(out)
    if dest.is_dir():
        raise UsageError(dest, "is a directory; give the report's file name")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(dest)
    return dest

