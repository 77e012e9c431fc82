"""Which calls a bounded view of a large job shows: the event window.

Above HOROVOD_PROFILE_TRACE_EVENTS calls, trace.json holds a window (the first
HOROVOD_PROFILE_TRACE_RANKS ranks plus the likely stragglers, over up to
HOROVOD_PROFILE_TRACE_STEPS middle steps), and a reader asked for a bounded
frame of a large dataset (analysis.load's max_rows) takes the same window.
One policy, defined here, used by the trace writer and by the readers."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from profiler._env import read
from profiler.formats.events import (
    Selection,
    Source,
    events_only,
    read_source,
    source_rank,
    source_rows,
)
from profiler.layout import format_ranges

TRACE_EXTRA_RANKS = 2


def max_events() -> int:
    """At most this many call events in trace.json (HOROVOD_PROFILE_TRACE_EVENTS)."""
    return int(read("HOROVOD_PROFILE_TRACE_EVENTS"))


def trace_ranks() -> int:
    """How many leading ranks a windowed trace.json shows (HOROVOD_PROFILE_TRACE_RANKS)."""
    return int(read("HOROVOD_PROFILE_TRACE_RANKS"))


def trace_steps() -> int:
    """At most this many steps in a windowed trace.json (HOROVOD_PROFILE_TRACE_STEPS)."""
    return int(read("HOROVOD_PROFILE_TRACE_STEPS"))


def select_window(t_start: np.ndarray, limit: int) -> tuple[np.ndarray, str]:
    """Indices of the rows to include and a description of the selection."""
    n = len(t_start)
    if n <= limit:
        return np.arange(n), "all"
    if limit <= 0:
        return np.zeros(0, dtype=np.int64), ("none (the event limit is 0; the dataset holds "
                                             f"all {n} calls)")
    order = np.argsort(t_start, kind="stable")
    lo = max(0, (n - limit) // 2)
    idx = np.sort(order[lo:lo + limit])
    a, b = int(t_start[order[lo]]), int(t_start[order[lo + limit - 1]])
    desc = (f"window: the {limit} calls starting in [{a / 1e3:.3f}, {b / 1e3:.3f}] us, "
            f"the middle of the job ({n} calls in all; the dataset holds every one; "
            "HOROVOD_PROFILE_TRACE_EVENTS sets the limit)")
    return idx, desc


def pick_ranks(ranks: Sequence[int], comm_ns: Sequence[int | None], first: int,
               extra: int = TRACE_EXTRA_RANKS, prefer: Sequence[int] | None = None
               ) -> tuple[list[int], list[int]]:
    """Positions of the ranks a windowed trace shows: the `first` lowest ranks, then
    the `prefer`red ranks (the stragglers a pass over every rank found) when given,
    else up to `extra` ranks with the least communication time (likely stragglers)
    when every rank's time is known.  Returns (positions, positions of the extras)."""
    order = sorted(range(len(ranks)), key=lambda i: ranks[i])
    chosen = order[:first]
    extras: list[int] = []
    if prefer:
        where = {r: i for i, r in enumerate(ranks)}
        taken = set(chosen)
        extras = [where[r] for r in dict.fromkeys(prefer) if r in where and where[r] not in taken]
    elif len(order) > first and extra > 0 and all(c is not None for c in comm_ns):
        rest = sorted(order[first:], key=lambda i: (int(comm_ns[i] or 0), ranks[i]))
        extras = rest[:extra]
    return sorted(chosen + extras, key=lambda i: ranks[i]), extras


def _step_window(t: np.ndarray, step: np.ndarray, limit: int, max_steps: int
                 ) -> tuple[int, int, tuple[int, int]] | None:
    """[lo, hi) in ns covering at most `max_steps` consecutive steps around the middle
    step that fit in `limit` rows (t: start times of the candidate rows, any order),
    or None when there are no steps or one step alone is too big."""
    has = step >= 0
    if not has.any():
        return None
    s_vals, s_first = _first_start_per_step(step[has], t[has])
    ts = np.sort(t)
    t_max = int(ts[-1]) + 1

    def window(a: int, b: int) -> tuple[int, int]:
        lo = int(s_first[a])
        hi = int(s_first[b + 1]) if b + 1 < len(s_vals) else t_max
        return lo, max(hi, lo)

    def count(a: int, b: int) -> int:
        lo, hi = window(a, b)
        return int(np.searchsorted(ts, hi, "left") - np.searchsorted(ts, lo, "left"))

    mid = len(s_vals) // 2
    a = b = mid
    if count(a, b) > limit:
        return None
    grew = True
    while grew and b - a + 1 < max_steps:
        grew = False
        if b + 1 < len(s_vals) and count(a, b + 1) <= limit:
            b += 1
            grew = True
        if b - a + 1 < max_steps and a > 0 and count(a - 1, b) <= limit:
            a -= 1
            grew = True
    lo, hi = window(a, b)
    return lo, hi, (int(s_vals[a]), int(s_vals[b]))


def _first_start_per_step(step: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct steps (sorted) and the earliest start of each, made non-decreasing."""
    vals, inv = np.unique(step, return_inverse=True)
    first = np.full(len(vals), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, inv, t.astype(np.int64))
    return vals, np.maximum.accumulate(first)


def select_events(sources: Sequence[Source], rank_meta: Sequence[Mapping[str, Any]],
                  limit: int, *, first_ranks: int | None = None,
                  max_steps: int | None = None, events: bool = False,
                  prefer_ranks: Sequence[int] | None = None) -> Selection:
    """The event selection of trace.json (module doc).  first_ranks and max_steps
    override HOROVOD_PROFILE_TRACE_RANKS and HOROVOD_PROFILE_TRACE_STEPS.
    events: count and select only the rows that can be events (trace.json:
    NOT_EVENT_OPS left out; its rows are then read with read_events); without,
    every row (a bounded DataFrame of the dataset, analysis.load).  prefer_ranks:
    the ranks to show beside the first ones (pick_ranks)."""
    first = trace_ranks() if first_ranks is None else max(1, first_ranks)
    steps_cap = trace_steps() if max_steps is None else max(1, max_steps)
    metas: list[Mapping[str, Any] | None] = (
        list(rank_meta) if len(rank_meta) == len(sources) else [None] * len(sources))
    ranks = [source_rank(s, m, i) for i, (s, m) in enumerate(zip(sources, metas))]
    rows = [source_rows(s, m, events) for s, m in zip(sources, metas)]
    total = sum(rows)
    everything = list(range(len(sources)))
    if total <= limit:
        return Selection(everything, {i: None for i in everything}, total, total, "all")
    if limit <= 0:
        return Selection([], {}, 0, total, "none (the event limit is 0; the dataset holds "
                                           f"all {total} calls)")
    comm_ns = [((m or {}).get("totals") or {}).get("comm_ns") for m in metas]
    picked, extras = pick_ranks(ranks, comm_ns, first, prefer=prefer_ranks)
    picked = [i for i in picked if rows[i] > 0]
    cols = ["t_start_ns", "step", *(["op"] if events else [])]
    parts = [read_source(sources[i], cols) for i in picked]
    if events:
        parts = [events_only(p) for p in parts]
    t = (np.concatenate([p["t_start_ns"].to_numpy(dtype=np.int64) for p in parts])
         if parts else np.zeros(0, np.int64))
    st = (np.concatenate([p["step"].to_numpy(dtype=np.int64) if "step" in p.columns
                          else np.full(len(p), -1, np.int64) for p in parts])
          if parts else np.zeros(0, np.int64))
    bounds = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    shown = [ranks[i] for i in picked]
    sub = len(picked) < len(sources)
    where = ""
    if sub:
        where = f" on ranks {format_ranges(shown)} (the first {min(first, len(ranks))}"
        if extras:
            why = ("the ranks the others wait for most, over every call of the job"
                   if prefer_ranks else "least communication time, likely stragglers")
            where += f" of {len(ranks)}; {format_ranges([ranks[i] for i in extras])}: {why})"
        else:
            where += f" of {len(ranks)})"
    tail = (f"; {total} calls in all, the dataset holds every one; `profiler export` writes "
            "other windows; HOROVOD_PROFILE_TRACE_EVENTS, _RANKS and _STEPS set "
            "the bounds")
    sw = _step_window(t, st, limit, steps_cap) if len(t) else None
    if sw is not None:
        lo, hi, steps = sw
        idx = np.flatnonzero((t >= lo) & (t < hi))
        desc = (f"window: the {len(idx)} calls of steps {steps[0]}-{steps[1]} (the middle of "
                f"the job, starting in [{lo / 1e3:.3f}, {hi / 1e3:.3f}) us){where}{tail}")
        t_win = (lo, hi)
    else:
        idx, desc0 = select_window(t, limit)
        steps = None
        if desc0 == "all":
            desc = f"window: all {len(idx)} calls{where}{tail}"
        else:
            desc = desc0.split(" (", 1)[0] + where + tail
        t_win = ((int(t[idx].min()), int(t[idx].max()) + 1) if len(idx) else (0, 0))
    # per rank: read only the rows starting in the span of its selected rows
    # (pushed down), then keep the selected ones among them
    per: dict[int, np.ndarray | None] = {}
    reads: dict[int, tuple[int, int]] = {}
    for k, i in enumerate(picked):
        lo_b, hi_b = bounds[k], bounds[k + 1]
        local = np.sort(idx[(idx >= lo_b) & (idx < hi_b)] - lo_b)
        if not len(local):
            continue
        tl = t[lo_b:hi_b]
        span = (int(tl[local].min()), int(tl[local].max()) + 1)
        inside = np.flatnonzero((tl >= span[0]) & (tl < span[1]))
        reads[i] = span
        per[i] = None if len(inside) == len(local) else np.searchsorted(inside, local)
    return Selection(picked=[i for i in picked if i in per], rows=per, included=len(idx),
                     total=total, description=desc, ranks=shown, steps=steps,
                     t_window_ns=t_win, reads=reads)


def write_trace(path: str | os.PathLike[str], meta: dict[str, Any],
                frames: Sequence[Source], rank_meta: Sequence[Mapping[str, Any]],
                *, limit: int | None = None, description: str | None = None
                ) -> dict[str, Any]:
    """trace.json with the events this policy selects (select_events, at most
    `limit`, else HOROVOD_PROFILE_TRACE_EVENTS); returns the metadata block
    written (profiler.formats.tracejson.write_trace)."""
    from profiler.formats import tracejson

    sel = select_events(frames, rank_meta, max_events() if limit is None else limit,
                        events=True)
    return tracejson.write_trace(path, meta, frames, rank_meta, sel, description=description)
