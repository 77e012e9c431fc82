"""Uneven data: ranks waiting in hvd.join for a rank that has more batches.

``hvd.join()`` is Horovod's answer to uneven data: a rank whose batches ran
out calls it and waits there, its Horovod thread adding zeros to the other
ranks' collectives, until every rank has joined; it returns the rank that
joined last.  The profiler records the time in it as one "join" row per rank
(APP_JOIN: t_start/t_end around the call, count = the rank it returned,
seq = the step records written before it; profiler.collect.horovod_hooks).

The last rank's steps after the others joined are its own: no other rank
arrives in them, so the late-rank test and the waiting between ranks leave
them out (analysis.breakdown.last_ranks takes the steps every rank ran), and
their synchronize is split without waiting for other ranks.  The time the
others spend in join is shown here, as such:

* ``uneven_data``: rank R waited W in hvd.join for rank L's E extra steps;
  its cost is the ranks' idle time in join beyond the join's own cost,
  averaged over the ranks and the job's steady steps, like the breakdown
  (ms per step), and its share of the rank's run.

The null is ranks that join together: a wait no longer than the join's own
cost (the time the last rank spends in it, waiting for no one) plus the
spread of the ranks' arrivals at a step they share (the 95th percentile of
the breakdown's waiting for other ranks), or the last rank ran no step more.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiler.units import fmt_ms, fmt_share

from .. import remedies
from .base import MIN_COST_MS, Context, Finding

__all__ = ["analyze", "join_rows", "NULL"]

NULL = ("ranks that join together: a wait in hvd.join no longer than the join's own cost "
        "(the last rank's time in it) plus the spread of the ranks' arrivals at a shared "
        "step (95th percentile), or a last rank with no step more than the others")
#: the share of its run a rank may wait in join before a trace without steps
#: says so (with steps, the arrivals' spread is the bar)
NO_STEPS_SHARE = 0.01


def join_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per hvd.join call, by rank and time: rank, t_start_ns, t_end_ns,
    wait_ms, last_rank (the rank join returned, -1 unknown), steps_before
    (step records written before it)."""
    cols = ["rank", "t_start_ns", "t_end_ns", "wait_ms", "last_rank", "steps_before"]
    if df.empty or "op" not in df.columns:
        return pd.DataFrame({c: [] for c in cols})
    mask = (df["op"].astype(str) == "join").to_numpy(dtype=bool)
    if "backend" in df.columns:
        mask = mask & (df["backend"].astype(str) == "app").to_numpy(dtype=bool)
    j = df.loc[mask]
    if j.empty:
        return pd.DataFrame({c: [] for c in cols})
    j = j.sort_values(["rank", "t_start_ns"], kind="stable")
    t0 = j["t_start_ns"].to_numpy(dtype=np.int64)
    t1 = j["t_end_ns"].to_numpy(dtype=np.int64)
    last = (j["count"].to_numpy(dtype=np.int64) if "count" in j.columns
            else np.full(len(j), -1, np.int64))
    seq = (j["seq"].to_numpy(dtype=np.int64) if "seq" in j.columns
           else np.full(len(j), -1, np.int64))
    return pd.DataFrame({"rank": j["rank"].to_numpy(dtype=np.int64), "t_start_ns": t0,
                         "t_end_ns": t1, "wait_ms": (t1 - t0) / 1e6,
                         "last_rank": np.where(last >= 0, last, -1), "steps_before": seq}
                        ).reset_index(drop=True)[cols]


def _last_rank(j: pd.DataFrame) -> int:
    """The rank that joined last: what join returned (the same on every rank),
    else the rank that entered join last."""
    known = j.loc[j["last_rank"] >= 0, "last_rank"]
    if len(known):
        return int(known.mode().iloc[0])
    return int(j.sort_values("t_start_ns", kind="stable")["rank"].iloc[-1])


def _spread_ms(ctx: Context) -> float:
    """The 95th percentile of the ranks' waits for each other at the steps every
    rank ran (0 without a breakdown)."""
    bd = ctx.breakdown
    if bd.empty:
        return 0.0
    n = bd.groupby("step")["rank"].transform("size")
    w = bd.loc[n >= len(ctx.ranks), "wait_ranks_ms"].to_numpy(dtype=np.float64)
    return float(np.percentile(w, 95)) if w.size else 0.0


def _overlap_ms(steps: pd.DataFrame, t0: int, t1: int) -> tuple[float, int]:
    """The time of `steps` (one rank's) inside [t0, t1], and how many of them
    lie there for at least half their length."""
    if steps.empty:
        return 0.0, 0
    b = steps["t_start_ns"].to_numpy(dtype=np.int64)
    f = steps["t_end_ns"].to_numpy(dtype=np.int64)
    inside = np.maximum(np.minimum(f, t1) - np.maximum(b, t0), 0)
    return float(inside.sum()) / 1e6, int((2 * inside >= f - b).sum())


@dataclass
class _Wait:
    """One rank's wait in hvd.join for the last rank."""

    rank: int
    calls: int  # its hvd.join calls (one per epoch where the job joins per epoch)
    wait_ms: float  # in them all
    extra_steps: int | None  # steps the last rank recorded more (None: no steps)
    covered_ms: float  # the last rank's step time inside this wait
    covered_steps: int
    run_ms: float  # from the rank's first step (first row) to leaving join
    bar_ms: float  # the null's bound on the wait

    @property
    def share_of_run(self) -> float:
        return self.wait_ms / self.run_ms if self.run_ms > 0 else float("nan")

    @property
    def above(self) -> bool:
        return self.wait_ms > self.bar_ms

    @property
    def uneven(self) -> bool:
        return self.above and (self.extra_steps is None or self.extra_steps >= 1)


def _waits(ctx: Context, j: pd.DataFrame, last: int, own: float) -> list[_Wait]:
    """The ranks other than the last, longest wait first; `own`: the join's
    own cost per call."""
    rs = ctx.rank_steps
    counts = rs.groupby("rank")["step"].size() if len(rs) else pd.Series(dtype=np.int64)
    has_steps = last in counts.index
    last_steps = rs.loc[rs["rank"] == last] if has_steps else rs.iloc[0:0]
    spread = _spread_ms(ctx) if has_steps else 0.0
    out = []
    for rank, calls in j.loc[j["rank"] != last].groupby("rank", sort=True):
        rank = int(rank)
        covered, n_cov = 0.0, 0
        for t0, t1 in zip(calls["t_start_ns"].tolist(), calls["t_end_ns"].tolist()):
            c, n = _overlap_ms(last_steps, int(t0), int(t1))
            covered, n_cov = covered + c, n_cov + n
        end = int(calls["t_end_ns"].max())
        if has_steps and rank in counts.index:
            first = int(rs.loc[rs["rank"] == rank, "t_start_ns"].min())
        else:
            t = ctx.df.loc[(ctx.df["rank"] == rank).to_numpy(dtype=bool), "t_start_ns"]
            first = int(t.min()) if len(t) else int(calls["t_start_ns"].min())
        run_ms = (end - first) / 1e6
        bar = len(calls) * own + (len(calls) * max(spread, MIN_COST_MS) if has_steps
                                  else max(NO_STEPS_SHARE * run_ms, MIN_COST_MS))
        extra = int(counts.get(last, 0)) - int(counts.get(rank, 0)) if has_steps else None
        out.append(_Wait(rank, len(calls), float(calls["wait_ms"].sum()), extra, covered,
                         n_cov, run_ms, bar))
    return sorted(out, key=lambda w: -w.wait_ms)


def analyze(ctx: Context) -> list[Finding]:
    if len(ctx.ranks) < 2:
        return []
    j = join_rows(ctx.df)
    if j.empty:
        return []
    last = _last_rank(j)
    mine = j.loc[j["rank"] == last, "wait_ms"]
    own = float(mine.mean()) if len(mine) else 0.0  # the join's own cost, per call
    waits = _waits(ctx, j, last, own)
    if not waits:
        return []
    uneven = [w for w in waits if w.uneven]
    n_ranks = len(ctx.ranks)
    idle = sum(max(w.wait_ms - w.calls * own, 0.0) for w in uneven)
    cost = idle / n_ranks / ctx.n_steps if ctx.n_steps and uneven else None
    numbers = {"last_rank": last, "last_rank_join_ms": own,
               "waits": [asdict(w) | {"share_of_run": w.share_of_run, "uneven": w.uneven}
                         for w in waits],
               "waiting_ranks": [w.rank for w in uneven], "idle_ms": idle}
    if not uneven:
        return [_together(waits[0], last, numbers)]
    t = uneven[0]
    extra = t.extra_steps
    steps_text = (f"rank {last}'s {extra} extra step{'s' if extra != 1 else ''}"
                  if extra is not None else f"rank {last}")
    who = (f"rank {t.rank} waited" if len(uneven) == 1 else
           f"{len(uneven)} ranks waited up to")
    headline = (f"Uneven data: {who} {fmt_ms(t.wait_ms)} in hvd.join for {steps_text} "
                f"({fmt_share(t.share_of_run)} of its run)")
    details = []
    if len(uneven) > 1:
        details.append("; ".join(
            f"rank {w.rank} waited {fmt_ms(w.wait_ms)} ({fmt_share(w.share_of_run)} of its run"
            + (f", {w.extra_steps} step(s) fewer than rank {last})" if w.extra_steps is not None
               else ")") for w in sorted(uneven, key=lambda w: w.rank)) + ".")
    if extra is not None:
        calls = f" (in {t.calls} calls)" if t.calls > 1 else ""
        details.append(f"rank {t.rank} entered hvd.join after {extra} step(s) fewer than "
                       f"rank {last}{calls}; rank {last}'s steps while it waited: "
                       f"{fmt_ms(t.covered_ms)} in {t.covered_steps} step(s); the join's own "
                       f"cost, as rank {last} saw it: {fmt_ms(own)} a call.")
        details.append(f"those steps are rank {last}'s alone: the late-rank test and the "
                       "waiting between ranks leave them out.")
    details.append("a rank's run: from its first step (its first record without steps) to "
                   "leaving hvd.join.")
    if cost is not None:
        details.append(f"the time idle in join, averaged over the {n_ranks} ranks and the "
                       f"{ctx.n_steps} steady steps like the breakdown: {fmt_ms(cost)} per step "
                       "(it lies outside the waiting ranks' steps, in no part of the breakdown).")
    return [Finding(
        key="uneven_data", headline=headline, details=details,
        cost_ms=cost,
        cost_img_s=ctx.cost_img_s(cost) if cost is not None else None,
        confidence="measured once per rank",
        recommendation=("balance the data: the same number of batches on every rank "
                        f"({remedies.even_data_remedy(remedies.framework(ctx.meta))}); "
                        "or keep it: hvd.join "
                        f"is doing its job, and {fmt_ms(t.wait_ms)} is its price"),
        check="profiler advise AFTER (this finding gone); profiler compare BEFORE AFTER",
        numbers=numbers, significant=ctx.significant(cost) if cost is not None else True,
        null=NULL,
    )]


def _together(w: _Wait, last: int, numbers: dict[str, Any]) -> Finding:
    """The longest wait, not uneven data: within the null's bound, or after no
    extra step."""
    if not w.above:
        return Finding(
            key="uneven_data",
            headline=(f"Ranks joined together: the longest wait in hvd.join, "
                      f"{fmt_ms(w.wait_ms)} (rank {w.rank}), is within the join's own cost "
                      f"and the ranks' spread at a step ({fmt_ms(w.bar_ms)})"),
            confidence="measured once per rank", numbers=numbers, null=NULL)
    return Finding(
        key="uneven_data",
        headline=f"Rank {w.rank} waited {fmt_ms(w.wait_ms)} in hvd.join for rank {last}",
        confidence="measured once per rank", numbers=numbers, null=NULL,
        not_claimed=(f"rank {last} ran no step more than rank {w.rank}: the wait is its "
                     "work after its last step, not extra batches"))
