"""What this trace cannot support: each a `Finding` of kind "limit", so that no
confident finding is drawn from data that cannot carry it."""

from __future__ import annotations

import numpy as np

from .. import remedies
from .base import MIN_STEPS, Context, Finding


def _limit(key: str, headline: str, detail: str = "", check: str = "") -> Finding:
    return Finding(key=key, headline=headline, details=[detail] if detail else [],
                   check=check, kind="limit")


def analyze(ctx: Context) -> list[Finding]:
    meta, df = ctx.meta, ctx.df
    out: list[Finding] = []
    dropped = sum(int(r.get("dropped") or 0) for r in meta.get("ranks") or []
                  if isinstance(r, dict))
    if dropped:
        out.append(_limit("dropped", f"{dropped} calls were not recorded (the raw file could "
                          "not grow)", "counts and per-step figures miss them."))
    if meta.get("missing_ranks"):
        out.append(_limit("missing_ranks", f"ranks {meta['missing_ranks']} left no data",
                          "cross-rank findings cover the ranks present only."))
    if ctx.n_steps < MIN_STEPS:
        out.append(_limit("no_steps", "no steady training steps recorded: no per-step cost",
                          remedies.mark_steps_remedy(remedies.framework(meta)),
                          "HOROVOD_PROFILE_BATCH_SIZE=N for images/sec"))
    elif not (np.isfinite(ctx.job_images_per_s) and ctx.job_images_per_s > 0):
        out.append(_limit("no_images", "images/sec unknown: the steps carry no image count",
                          remedies.images_remedy(remedies.framework(meta)),
                          "HOROVOD_PROFILE_BATCH_SIZE=N (images per rank per step)"))
    if (meta.get("dataset") or {}).get("aggregates"):
        out.append(_limit("summary_mode", "summary mode: no per-call records",
                          "late ranks, steps and message-size cliffs need HOROVOD_PROFILE=1."))
    if (meta.get("lineage") or {}).get("status") not in (None, "ok", "written"):
        reason = (meta.get("lineage") or {}).get("reason", "")
        out.append(_limit("no_lineage", "no fusion lineage: which tensors rode in which "
                          "fused call is unknown", str(reason)))
    try:
        from ..gpu import gpu_warnings

        for w in gpu_warnings(meta, None):
            out.append(_limit("nccl", w))
    except Exception:  # metadata from another tool: say nothing rather than fail
        pass
    ev = meta.get("events") or {}
    window = next(iter((df.attrs.get("selection") or {}).values()), None)
    if window:  # the bounded window load() read (analysis.load.window_for)
        out.append(_limit("window", f"analysed a window of {int(window['rows']):,} of "
                          f"{int(window['rows_total']):,} records ({len(window['ranks'])} "
                          "ranks, the middle steps)",
                          "figures are from that window; profiler summarize counts every call."))
    elif ev.get("selection", "all") != "all" and len(df) < int(ev.get("total") or 0):
        out.append(_limit("window", f"analysed a window of {len(df):,} of "
                          f"{int(ev.get('total') or 0):,} calls",
                          "figures are from that window; profiler summarize counts every call."))
    return out
