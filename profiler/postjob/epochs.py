"""The membership epochs of an elastic Horovod job, from its processes' epochs
sidecars (profiler.formats.epochs), for trace.json.

In an elastic job a raw file is a process (hooks/gloo.c claims it a number of
its own), which may hold several ranks in turn.  An epoch is one membership:
the processes whose hvd.init returned together with the same world size (an
init is collective: they return within moments of each other, each with a
distinct rank).  It runs from the last of those inits' return to the first
hvd.shutdown among its members (the reset), the last epoch to its members'
last step.  A reset goes from one epoch to the next:

* kind: "failed" (a member ended without closing its file and without a
  shutdown: killed), "removed" (a member called shutdown and never came back:
  Horovod ends a removed worker), "added" (a process new to the job);
* failure_ns: the first sign of it, the earliest shutdown of the old epoch
  (the moment Horovod noticed), or a killed member's last record if earlier;
* first_step_ns: the end of the first step completed in the new epoch;
  cost_ns = first_step_ns - failure_ns: the training time the reset
  took (reinit_ns: failure to the new epoch's start, hvd.init's part of it).

Steps count in the epoch they lie in wholly: the step that spans a reset (the
step hook's interval from the last step before it to the first after it)
belongs to none.  A finding never compares across epochs as though they were
one job: the trace's window (its "window" block, which every analysis reads)
holds the one epoch with the most steps (the last of equals), and the
`elastic` finding says so (profiler.analysis.findings.elastic).

Never raises: a problem becomes the block's "problems".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from profiler.formats import epochs as E
from profiler.formats import steps as ST

__all__ = ["block", "epochs_of"]


def _job_ns(mono_ns: int, header: dict[str, Any]) -> int:
    import numpy as np

    from profiler.formats.clock import offset_ns_at

    off = np.asarray(offset_ns_at(np.asarray([mono_ns], dtype=np.int64), header)).ravel()[0]
    return int(mono_ns - int(off) - int(header.get("job_t0_ns", 0) or 0))


def _steps(parquet: Path | None) -> Any:
    """(t_start_ns, t_end_ns, count) of the file's step rows, sorted."""
    import pandas as pd

    if parquet is None or not parquet.is_file():
        return pd.DataFrame({"t_start_ns": [], "t_end_ns": [], "count": []})
    df = pd.read_parquet(parquet, columns=["op", "t_start_ns", "t_end_ns", "count"])
    st = df.loc[df["op"].astype(str) == "step", ["t_start_ns", "t_end_ns", "count"]]
    return st.sort_values("t_start_ns").reset_index(drop=True)


def _last_ns(parquet: Path | None) -> int | None:
    import pyarrow.parquet as pq

    if parquet is None or not parquet.is_file():
        return None
    col = pq.read_table(parquet, columns=["t_end_ns"]).column("t_end_ns")
    return int(col.to_numpy().max()) if len(col) else None


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _inside(s: Any, epoch: dict[str, Any]) -> Any:
    """The steps wholly inside the epoch."""
    return s[(s["t_start_ns"] >= int(epoch["start_ns"])) & (s["t_end_ns"] <= int(epoch["end_ns"]))]


def epochs_of(inits: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Init events (each with "file", "rank", "size", "t1_ns") grouped into
    epochs: in order of return, a group takes inits of its size until it holds
    that many (its ranks distinct)."""
    groups: list[list[dict[str, Any]]] = []
    for ev in sorted(inits, key=lambda e: int(e["t1_ns"])):
        g = groups[-1] if groups else None
        if (g is not None and len(g) < int(g[0]["size"]) and int(ev["size"]) == int(g[0]["size"])
                and int(ev["rank"]) not in {int(m["rank"]) for m in g}
                and int(ev["file"]) not in {int(m["file"]) for m in g}):
            g.append(ev)
        else:
            groups.append([ev])
    return groups


def block(d: Path, parquets: dict[int, Path]) -> dict[str, Any]:
    """{"elastic": ..., "window": ...} for trace.json's metadata; {} for a job
    without epochs sidecars (not elastic)."""
    from profiler.layout import rank_files

    raws = rank_files(d, "raw", "hvprof")
    sidecars = {n: E.sidecar_of(p) for n, p in raws.items() if E.sidecar_of(p).is_file()}
    if not sidecars:
        return {}
    try:
        return _build(raws, sidecars, parquets)
    except Exception as exc:  # an extra: never the reason a merge fails
        return {"elastic": {"problems": ["epochs not built: " + " ".join(str(exc).split())[:200]]}}


def _build(raws: dict[int, Path], sidecars: dict[int, Path],
           parquets: dict[int, Path]) -> dict[str, Any]:
    from profiler.errors import ProfilerError
    from profiler.formats import record as F
    from profiler.formats.raw import read_header

    processes: list[dict[str, Any]] = []
    inits: list[dict[str, Any]] = []
    shutdowns: dict[int, list[int]] = {}
    steps: dict[int, Any] = {}
    problems: list[str] = []
    last: dict[int, int | None] = {}
    for n in sorted(sidecars):
        try:
            h = read_header(raws[n])
        except ProfilerError as exc:
            problems.append(f"file {n}: {exc.line()}")
            continue
        events = E.read(sidecars[n])
        closed = bool(int(h.get("state", 0)) & (F.STATE_FINALIZED | F.STATE_CLOSED))
        how = ("exited" if closed else
               "removed" if events and events[-1]["event"] == "shutdown" else "killed")
        processes.append({"file": n, "pid": h.get("pid"), "ended": how,
                          "inits": sum(e["event"] == "init" for e in events)})
        for e in events:
            if e["event"] == "init":
                inits.append({"file": n, "rank": int(e["rank"]), "size": int(e["size"]),
                              "pid": e.get("pid"), "t0_ns": _job_ns(int(e["t0_ns"]), h),
                              "t1_ns": _job_ns(int(e["t1_ns"]), h)})
            else:
                shutdowns.setdefault(n, []).append(_job_ns(int(e["t_ns"]), h))
        steps[n] = _steps(parquets.get(n))
        last[n] = _last_ns(parquets.get(n))
    ended = {p["file"]: p["ended"] for p in processes}

    groups = epochs_of(inits)
    epochs: list[dict[str, Any]] = []
    for i, g in enumerate(groups):
        start = max(int(m["t1_ns"]) for m in g)
        files = [int(m["file"]) for m in g]
        downs = [t for f in files for t in shutdowns.get(f, []) if t > start]
        nxt = min((int(m["t0_ns"]) for m in groups[i + 1]), default=None) if i + 1 < len(
            groups) else None
        if downs:
            end = min(downs)
        else:
            ends = [int(s["t_end_ns"].max()) for f in files if len(s := steps[f])]
            end = max(ends) if ends else max((last[f] or start) for f in files)
            if nxt is not None:
                end = min(end, nxt)
        members: list[dict[str, Any]] = []
        totals: list[ST.StepTotals] = []
        for m in sorted(g, key=lambda m: int(m["rank"])):
            inside = _inside(steps[int(m["file"])], {"start_ns": start, "end_ns": end})
            # the one definition of step time and images/sec (profiler.formats.steps),
            # each epoch's first step its warm-up, as a job's is
            rt = ST.rank_totals(np.arange(len(inside)), inside["t_start_ns"].to_numpy(),
                                inside["t_end_ns"].to_numpy(), inside["count"].to_numpy())
            totals.append(rt)
            members.append({"file": int(m["file"]), "pid": m.get("pid"), "rank": int(m["rank"]),
                            "steps": len(inside), "images": int(inside["count"].sum()),
                            "images_per_sec": _finite(ST.images_per_s(rt)),
                            "step_ms": _finite(ST.step_ms(rt))})
        job = ST.job_totals(totals)
        epochs.append({"index": i, "start_ns": start, "end_ns": int(end),
                       "world_size": int(g[0]["size"]), "members": members,
                       "steps": min((m["steps"] for m in members), default=0),
                       "step_ms": _finite(ST.step_ms(job)),
                       "images_per_sec": _finite(ST.images_per_s(job))})

    resets: list[dict[str, Any]] = []
    for a, b in zip(epochs, epochs[1:]):
        old = {m["file"] for m in a["members"]}
        new = {m["file"] for m in b["members"]}
        gone, came = sorted(old - new), sorted(new - old)
        kinds = sorted({"failed" if ended.get(f) == "killed" else "removed" for f in gone}
                       | ({"added"} if came else set()))
        signs = [t for f in old for t in shutdowns.get(f, []) if a["start_ns"] < t <= b["start_ns"]]
        signs += [int(t) for f in gone if ended.get(f) == "killed" and (t := last[f]) is not None]
        failure = min(signs) if signs else int(a["end_ns"])
        firsts = [int(s.loc[s["t_end_ns"] > b["start_ns"], "t_end_ns"].min())
                  for f in new if len(s := steps[f]) and (s["t_end_ns"] > b["start_ns"]).any()]
        first = min(firsts) if firsts else None
        resets.append({"from": a["index"], "to": b["index"], "kind": "+".join(kinds) or "same",
                       "gone": gone, "came": came, "failure_ns": failure,
                       "reinit_ns": int(b["start_ns"]) - failure,
                       "first_step_ns": first,
                       "cost_ns": None if first is None else first - failure})

    out: dict[str, Any] = {"elastic": {"epochs": epochs, "resets": resets,
                                       "processes": processes, "problems": problems}}
    if len(epochs) > 1:
        best = max(epochs, key=lambda e: (e["steps"], e["index"]))
        out["elastic"]["analysed"] = best["index"]
        # up to the end of its last whole step: the step that spans the
        # next reset starts there (the window keeps rows by their start)
        lasts = [int(inside["t_end_ns"].max()) for m in best["members"]
                 if len(inside := _inside(steps[m["file"]], best))]
        out["window"] = {"source": "elastic",
                         "ranks": sorted(m["file"] for m in best["members"]),
                         "t_start_ns": [int(best["start_ns"]),
                                        min(lasts) if lasts else int(best["end_ns"])]}
    return out
