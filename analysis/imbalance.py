"""Per-rank communication time, cross-rank matching of collective calls, stragglers.

Matching.  A collective call is the same call on every member rank when it has
the same communicator id and the same per-communicator sequence number
(``(comm, seq)``, docs/ARCHITECTURE.md section 3).  For each matched call:

* arrival spread = latest t_start - earliest t_start over the ranks that have it;
* the straggler is the rank that arrived last (ties: no straggler when the
  spread is <= ``min_spread_ns``; pass the clock-offset error bound there to
  ignore differences the clocks cannot resolve);
* wait = sum over ranks of (latest t_start - this rank's t_start): the time the
  others spent inside the collective waiting for the last arrival (a lower
  bound on the imbalance cost: a blocking collective cannot complete before
  every rank has entered it).

Only rows with seq >= 0 on communicators of more than one rank are matched;
NCCL device-time rows are left out (their host twins are matched).  A call is
``complete`` when every member rank (comm_size) has a row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ._frame import call_mask, calls, isin, keys_of, label_keys, require, take

__all__ = ["match_calls", "rank_times", "stragglers"]


def _matchable(df: pd.DataFrame, kinds: str | Sequence[str] | None,
               ops: str | Sequence[str] | None) -> pd.DataFrame:
    require(df, ["rank", "comm", "seq", "comm_size", "t_start_ns", "t_end_ns"], "matching")
    mask = (call_mask(df, kinds=kinds, ops=ops) & (df["seq"].to_numpy() >= 0)
            & (df["comm_size"].to_numpy() > 1))
    return take(df, mask, [*label_keys(df), "rank", "comm", "seq", "comm_size", "t_start_ns",
                           "t_end_ns", "op", "kind", "bytes"])


def _group_order(lab: np.ndarray, comm: np.ndarray, seq: np.ndarray,
                 t0: np.ndarray) -> np.ndarray:
    """The order that sorts rows by (label, comm, seq, t_start): the first three
    folded into one integer (communicators numbered in value order by hashing,
    not sorting) so that the sort makes two passes, not four."""
    if not len(seq):
        return np.zeros(0, np.int64)
    codes, uniq = pd.factorize(comm)
    rank_of = np.empty(len(uniq), np.int64)
    rank_of[np.argsort(np.asarray(uniq), kind="stable")] = np.arange(len(uniq))
    c = rank_of[codes]
    span = int(seq.max()) + 1
    n_comm = len(uniq)
    if (int(lab.min()) < 0 or int(seq.min()) < 0
            or (int(lab.max()) + 1) * n_comm * span >= 1 << 62):  # would overflow: four passes
        return np.lexsort((t0, seq, comm, lab))
    key = (lab * n_comm + c) * span + seq
    return np.lexsort((t0, key))


class _Matched:
    """Rows of matchable calls sorted by (label, comm, seq, t_start), with group
    boundaries: the numpy core shared by match_calls and rank_times."""

    def __init__(self, sel: pd.DataFrame) -> None:
        n = len(sel)
        self.lab = (keys_of(sel["label"]).codes.astype(np.int64) if "label" in sel.columns
                    else np.zeros(n, np.int64))
        comm = sel["comm"].to_numpy().astype(np.uint64)
        seq = sel["seq"].to_numpy(dtype=np.int64)
        t0 = sel["t_start_ns"].to_numpy(dtype=np.int64)
        order = _group_order(self.lab, comm, seq, t0)
        self.order = order
        self.comm, self.seq, self.t0 = comm[order], seq[order], t0[order]
        self.lab = self.lab[order]
        self.t1 = sel["t_end_ns"].to_numpy(dtype=np.int64)[order]
        self.rank = sel["rank"].to_numpy(dtype=np.int64)[order]
        flags = np.ones(n, dtype=bool)
        if n:
            flags[1:] = ((self.lab[1:] != self.lab[:-1]) | (self.comm[1:] != self.comm[:-1])
                         | (self.seq[1:] != self.seq[:-1]))
        self.starts = np.flatnonzero(flags)
        self.ends = np.r_[self.starts[1:], n] if n else self.starts
        self.group = np.cumsum(flags) - 1  # group index of every sorted row

    def last_start(self) -> np.ndarray:
        return self.t0[self.ends - 1] if len(self.starts) else np.zeros(0, np.int64)


def match_calls(
    df: pd.DataFrame,
    *,
    kinds: str | Sequence[str] | None = None,
    ops: str | Sequence[str] | None = None,
    min_spread_ns: int = 0,
) -> pd.DataFrame:
    """One row per matched collective call.

    Columns: [label], comm, seq, op, kind (when present), bytes (max over ranks),
    n_ranks, comm_size, complete, first_start_ns, last_start_ns, spread_ns,
    last_rank (-1 when spread <= min_spread_ns), wait_ns, end_spread_ns,
    duration_ns (last end - first start), lead_ns (the last arrival's lead over the
    one before it: how much sooner the call could start without its last rank)."""
    sel = _matchable(df, kinds, ops)
    keys = [*label_keys(sel), "comm", "seq"]
    extra = ["kind"] if "kind" in sel.columns else []
    cols = [*keys, "op", *extra, "bytes", "n_ranks", "comm_size", "complete",
            "first_start_ns", "last_start_ns", "spread_ns", "last_rank", "wait_ns",
            "end_spread_ns", "duration_ns", "lead_ns"]
    if sel.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    m = _Matched(sel)
    st, en = m.starts, m.ends
    first_rows = m.order[st]
    out = pd.DataFrame({"comm": m.comm[st], "seq": m.seq[st]})
    def first_of(col: str) -> np.ndarray:  # categoricals taken by code, not per row
        return np.asarray(pd.Series(sel[col].array).take(first_rows)).astype(str)

    if "label" in keys:
        out.insert(0, "label", first_of("label"))
    out["op"] = first_of("op")
    for k in extra:
        out[k] = first_of(k)
    nbytes = sel["bytes"].to_numpy(dtype=np.int64)[m.order]
    csize = sel["comm_size"].to_numpy(dtype=np.int64)[m.order]
    out["bytes"] = np.maximum.reduceat(nbytes, st)
    out["n_ranks"] = (en - st).astype(np.int64)
    out["comm_size"] = np.maximum.reduceat(csize, st)
    out["complete"] = out["n_ranks"] >= out["comm_size"]
    out["first_start_ns"] = m.t0[st]
    out["last_start_ns"] = m.last_start()
    out["spread_ns"] = out["last_start_ns"] - out["first_start_ns"]
    out["last_rank"] = np.where(out["spread_ns"] > min_spread_ns, m.rank[en - 1], -1)
    out["wait_ns"] = out["n_ranks"] * out["last_start_ns"] - np.add.reduceat(m.t0, st)
    out["end_spread_ns"] = np.maximum.reduceat(m.t1, st) - np.minimum.reduceat(m.t1, st)
    out["duration_ns"] = np.maximum.reduceat(m.t1, st) - out["first_start_ns"]
    two = (en - st) >= 2
    out["lead_ns"] = np.where(two, m.t0[en - 1] - m.t0[np.maximum(en - 2, st)], 0)
    return out[cols]


def rank_times(
    df: pd.DataFrame,
    *,
    kinds: str | Sequence[str] | None = None,
    ops: str | Sequence[str] | None = None,
) -> pd.DataFrame:
    """Per rank: calls, communication time (total and by kind), bytes, the span from
    the rank's first to last call, the communication share of that span, and the time
    the rank spent waiting for later arrivals in matched calls.

    Columns: [label], rank, calls, comm_s, data_s, control_s, bytes, span_s,
    comm_share, waited_s, waited_share (waited / comm)."""
    sel = calls(df, kinds=kinds, ops=ops)
    keys = label_keys(sel)
    cols = [*keys, "rank", "calls", "comm_s", "data_s", "control_s", "bytes", "span_s",
            "comm_share", "waited_s", "waited_share"]
    if sel.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    is_data = isin(sel["kind"], ["data"]) if "kind" in sel.columns else np.ones(len(sel), bool)
    is_ctrl = (isin(sel["kind"], ["control"]) if "kind" in sel.columns
               else np.zeros(len(sel), bool))
    dur = sel["dur_ns"].to_numpy(dtype=np.float64) / 1e9
    work = pd.DataFrame({
        **{k: keys_of(sel[k]) for k in keys},
        "rank": sel["rank"].to_numpy(dtype=np.int64),
        "dur": dur,
        "data": np.where(is_data, dur, 0.0),
        "control": np.where(is_ctrl, dur, 0.0),
        "bytes": np.where(~is_ctrl, sel["bytes"].to_numpy(dtype=np.int64), 0),
        "t0": sel["t_start_ns"].to_numpy(dtype=np.int64),
        "t1": sel["t_end_ns"].to_numpy(dtype=np.int64),
    })
    out = work.groupby([*keys, "rank"], sort=True, observed=True).agg(
        calls=("dur", "size"), comm_s=("dur", "sum"), data_s=("data", "sum"),
        control_s=("control", "sum"), bytes=("bytes", "sum"), t0=("t0", "min"),
        t1=("t1", "max")).reset_index()
    for k in keys:
        out[k] = out[k].astype(str)
    out["calls"] = out["calls"].astype(np.int64)
    out["span_s"] = (out["t1"] - out["t0"]) / 1e9
    out["comm_share"] = np.where(out["span_s"] > 0, out["comm_s"] / out["span_s"].where(
        out["span_s"] > 0, 1.0), 0.0)
    # waiting: latest arrival of the matched call minus this rank's arrival
    mt = _matchable(df, kinds, ops)
    waited = pd.Series(0.0, index=pd.MultiIndex.from_frame(out[[*keys, "rank"]])
                       if keys else out["rank"])
    if not mt.empty:
        m = _Matched(mt)
        wait = (m.last_start()[m.group] - m.t0) / 1e9
        w = pd.DataFrame({"rank": m.rank, "wait": wait})
        if keys:
            w.insert(0, "label", np.asarray(keys_of(mt["label"]).astype(str))[m.order])
        waited = w.groupby([*keys, "rank"])["wait"].sum()
    idx = pd.MultiIndex.from_frame(out[[*keys, "rank"]]) if keys else out["rank"]
    out["waited_s"] = waited.reindex(idx).fillna(0.0).to_numpy()
    out["waited_share"] = np.where(out["comm_s"] > 0, out["waited_s"] / out["comm_s"].where(
        out["comm_s"] > 0, 1.0), 0.0)
    return out[cols]


def stragglers(
    df: pd.DataFrame | None = None,
    *,
    matched: pd.DataFrame | None = None,
    kinds: str | Sequence[str] | None = None,
    ops: str | Sequence[str] | None = None,
    min_spread_ns: int = 0,
) -> pd.DataFrame:
    """Ranking of ranks by how often they arrived last and how much waiting that
    caused (from :func:`match_calls`; pass ``matched`` to reuse one).

    Columns: [label], rank, last_count, last_share (of matched calls with a
    straggler), caused_wait_s, mean_lateness_us (mean spread when last), gain_s (the
    sum of its leads when last: how much sooner those calls could start without its
    lateness, the counterfactual of a late rank's cost), rank_order (1 = worst
    straggler).  Every rank seen in the matched calls is listed."""
    if matched is None:
        if df is None:
            from profiler.errors import UsageError

            raise UsageError(None, "stragglers: pass a trace frame or matched calls")
        matched = match_calls(df, kinds=kinds, ops=ops, min_spread_ns=min_spread_ns)
    keys = label_keys(matched)
    cols = [*keys, "rank", "last_count", "last_share", "caused_wait_s", "mean_lateness_us",
            "gain_s", "rank_order"]
    if matched.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    m = matched.copy()
    if keys:
        m["label"] = m["label"].astype(str)
    has = m.loc[m["last_rank"] >= 0]
    per = has.groupby([*keys, "last_rank"]).agg(
        last_count=("seq", "size"), caused_wait_s=("wait_ns", "sum"),
        mean_lateness_us=("spread_ns", "mean"), gain_s=("lead_ns", "sum")).reset_index(
        ).rename(columns={"last_rank": "rank"})
    per["caused_wait_s"] = per["caused_wait_s"] / 1e9
    per["gain_s"] = per["gain_s"] / 1e9
    per["mean_lateness_us"] = per["mean_lateness_us"] / 1e3
    # every rank that took part, also those never last
    if df is not None:
        ranks_src = calls(df, kinds=kinds, ops=ops)
        all_ranks = pd.DataFrame({**{k: keys_of(ranks_src[k]) for k in keys},
                                  "rank": ranks_src["rank"].to_numpy(dtype=np.int64)})
        all_ranks = all_ranks.groupby([*keys, "rank"], observed=True).size().reset_index()
        all_ranks = all_ranks[[*keys, "rank"]]
        for k in keys:
            all_ranks[k] = all_ranks[k].astype(str)
    else:
        all_ranks = per[[*keys, "rank"]].drop_duplicates()
    out = all_ranks.merge(per, on=[*keys, "rank"], how="left")
    out["last_count"] = out["last_count"].fillna(0).astype(np.int64)
    out["caused_wait_s"] = out["caused_wait_s"].fillna(0.0)
    out["mean_lateness_us"] = out["mean_lateness_us"].fillna(0.0)
    out["gain_s"] = out["gain_s"].fillna(0.0)
    totals = (has.groupby(keys).size() if keys else pd.Series({(): len(has)}))
    if keys:
        out["last_share"] = out["last_count"] / out["label"].map(totals).clip(lower=1)
    else:
        out["last_share"] = out["last_count"] / max(len(has), 1)
    out = out.sort_values([*keys, "caused_wait_s", "last_count", "rank"],
                          ascending=[*([True] * len(keys)), False, False, True])
    out["rank_order"] = (out.groupby(keys).cumcount() + 1 if keys
                         else np.arange(1, len(out) + 1))
    return out[cols].reset_index(drop=True)


#: At most this many stragglers join a bounded window beside its first ranks, and
#: at least this many when any rank was ever last.
MAX_WINDOW_STRAGGLERS = 8
MIN_WINDOW_STRAGGLERS = 2


def window_stragglers(ranking: pd.DataFrame, *, share_of_top: float = 0.25,
                      apart: float = 10.0,
                      least: int = MIN_WINDOW_STRAGGLERS, cap: int = MAX_WINDOW_STRAGGLERS
                      ) -> list[int]:
    """The ranks of a straggler ranking (stragglers / engine.stragglers_dataset) that a
    bounded window must hold beside its first ranks, worst first: the `least` ranks
    whose lateness costs most (gain_s), then every rank that stands out, costing at
    least `share_of_top` of the worst's and `apart` times the median rank that was
    ever last, at most `cap`.  A choice of what to look at, not a finding: the
    findings test the window's ranks against chance, so under symmetric jitter the
    extras are two ranks like the others and nothing is claimed of them."""
    if ranking.empty:
        return []
    r = ranking.loc[ranking["gain_s"] > 0].sort_values(
        ["gain_s", "last_count", "rank"], ascending=[False, False, True])
    if r.empty:
        return []
    top = float(r["gain_s"].iloc[0])
    floor = max(share_of_top * top, apart * float(r["gain_s"].median()))
    keep = [(i < least or float(g) >= floor) for i, g in enumerate(r["gain_s"])]
    return [int(x) for x, k in zip(r["rank"], keep) if k][:cap]
