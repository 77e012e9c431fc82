"""Questions across job records (`profiler jobs`): plain functions, records in,
rows (dicts) out, the same for every store.

* listing: one row per job;
* ranking: node-hours lost to communication (transfer + waiting for
  Horovod) and to waiting for other ranks, each job with the finding that
  explains most of it;
* regressions: each job name's latest run against its own history (at least
  MIN_HISTORY earlier runs): step time and each part of the breakdown, above
  the history's 95% prediction interval and by more than MIN_CHANGE of the
  history's mean, naming what changed (versions, settings, interconnect,
  ranks);
* interconnects: the same job name's communication per step on each
  interconnect, across jobs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from .record import COMM_PARTS, WAIT_PARTS
from .schema import lost_node_hours

MIN_HISTORY = 3
#: a change smaller than this share of the history's mean is not reported,
#: however steady the history (a 0.5% change in a dead-steady history is real
#: but nobody's problem)
MIN_CHANGE = 0.05
PARTS = ("compute", "wait_ranks", "horovod", "transfer", "profiler", "unexplained")


def _part_ms(rec: dict[str, Any], part: str) -> float | None:
    for p in rec.get("breakdown") or []:
        if p.get("part") == part:
            v = p.get("ms")
            return float(v) if isinstance(v, (int, float)) else None
    return None


def _comm_ms(rec: dict[str, Any]) -> float | None:
    vals = [_part_ms(rec, p) for p in COMM_PARTS]
    return sum(v for v in vals if v is not None) if any(v is not None for v in vals) else None


def listing(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in sorted(records, key=lambda r: (r["start"], r["job"]["id"])):
        j, v = r["job"], r["versions"]
        rows.append({"id": j["id"], "start": r["start"], "user": j["user"], "name": j["name"],
                     "partition": j.get("partition", ""), "framework": v.get("framework", ""),
                     "hosts": len(r["hosts"]), "ranks": r["ranks"], "steps": r["steps"],
                     "step_ms": r.get("step_ms"), "images_per_s": r.get("images_per_s"),
                     "interconnect": ",".join(r["interconnect"].get("transports") or []),
                     "node_hours": r.get("node_hours")})
    return rows


def _explaining(rec: dict[str, Any], parts: Sequence[str]) -> dict[str, Any] | None:
    """The finding that explains the largest of `parts` in this job's step: of
    the findings drawn from that part, the significant one first, then the
    costliest; the next largest part when none is drawn from it."""
    order = sorted(parts, key=lambda p: -(_part_ms(rec, p) or 0.0))
    for part in order:
        cands = [f for f in rec["findings"] if f.get("kind") == "finding"
                 and f.get("part") == part and isinstance(f.get("cost_ms"), (int, float))]
        if cands:
            return max(cands, key=lambda f: (bool(f.get("significant")), float(f["cost_ms"])))
    return None


def ranking(records: Iterable[dict[str, Any]], top: int | None = None) -> list[dict[str, Any]]:
    """Jobs by node-hours lost to communication and waiting, most first; a job
    without a breakdown (no steps) comes last, with its lost time unknown."""
    rows = []
    for r in records:
        comm, wait = r.get("node_hours_comm"), r.get("node_hours_wait")
        lost = lost_node_hours(r)
        f = _explaining(r, (*COMM_PARTS, *WAIT_PARTS))
        rows.append({"id": r["job"]["id"], "user": r["job"]["user"], "name": r["job"]["name"],
                     "start": r["start"], "node_hours": r.get("node_hours"),
                     "lost_node_hours": lost, "comm_node_hours": comm, "wait_node_hours": wait,
                     "finding": f["headline"] if f else "", "finding_key": f["key"] if f else "",
                     "remedy": f.get("remedy", "") if f else ""})
    rows.sort(key=lambda x: (x["lost_node_hours"] is None, -(x["lost_node_hours"] or 0.0),
                             x["id"]))
    return rows[:top] if top else rows


def _flat(d: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {f"{prefix}{k}": v for k, v in d.items()}


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two records: versions, settings, interconnect, ranks, hosts."""
    out = []
    a = {**_flat(before["versions"], ""), **_flat(before["settings"], ""),
         "interconnect": ",".join(before["interconnect"].get("transports") or []),
         "ranks": before["ranks"], "hosts": len(before["hosts"])}
    b = {**_flat(after["versions"], ""), **_flat(after["settings"], ""),
         "interconnect": ",".join(after["interconnect"].get("transports") or []),
         "ranks": after["ranks"], "hosts": len(after["hosts"])}
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            out.append(f"{k}: {a.get(k, '(unset)')} -> {b.get(k, '(unset)')}")
    return out


def _interval(history: Sequence[float]) -> tuple[float, float, float]:
    """The history's mean and its 95% prediction interval for one more run
    (Student's t: mean +- t * sd * sqrt(1 + 1/n))."""
    from scipy import stats

    n = len(history)
    m = sum(history) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in history) / (n - 1)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.975, n - 1)) * sd * math.sqrt(1 + 1 / n) if n > 1 else 0.0
    return m, m - half, m + half


REGRESSION_KEYS = ("name", "script")


def regressions(records: Iterable[dict[str, Any]], by: str = "name") -> list[dict[str, Any]]:
    """Each job name's (or script's, `by`) latest run against its earlier ones
    (module doc); a record without that key is left out."""
    if by not in REGRESSION_KEYS:
        raise ValueError(f"regressions by {by!r}: one of {', '.join(REGRESSION_KEYS)}")
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        key = r["job"].get(by)
        if key:
            by_name[str(key)].append(r)
    rows = []
    for name, runs in sorted(by_name.items()):
        runs.sort(key=lambda r: (r["start"], r["job"]["id"]))
        latest, history = runs[-1], runs[:-1]
        if len(history) < MIN_HISTORY:
            continue
        metrics: list[tuple[str, Any]] = [("step_ms", lambda r: r.get("step_ms"))]
        metrics += [(f"{p}_ms", lambda r, p=p: _part_ms(r, p)) for p in PARTS]
        for metric, get in metrics:
            now = get(latest)
            past = [float(v) for v in (get(r) for r in history) if isinstance(v, (int, float))]
            if not isinstance(now, (int, float)) or len(past) < MIN_HISTORY:
                continue
            mean, lo, hi = _interval(past)
            if now > hi and now - mean > MIN_CHANGE * abs(mean) and now - mean > 0:
                rows.append({by: name, "metric": metric, "id": latest["job"]["id"],
                             "start": latest["start"], "value": now, "history_mean": mean,
                             "interval": [lo, hi], "history_runs": len(past),
                             "change": (now - mean) / mean if mean else None,
                             "changed": changes(history[-1], latest)})
    return rows


def interconnects(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per job name and interconnect: runs, mean communication ms per step
    (transfer + waiting for Horovod) and its share of the step."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        ic = ",".join(r["interconnect"].get("transports") or []) or "unknown"
        groups[(r["job"]["name"], ic)].append(r)
    rows = []
    for (name, ic), runs in sorted(groups.items()):
        comm = [c for c in (_comm_ms(r) for r in runs) if c is not None]
        steps = [float(r["step_ms"]) for r in runs if isinstance(r.get("step_ms"), (int, float))]
        mc = sum(comm) / len(comm) if comm else None
        ms = sum(steps) / len(steps) if steps else None
        rows.append({"name": name, "interconnect": ic, "runs": len(runs),
                     "ranks": sorted({int(r["ranks"]) for r in runs}),
                     "comm_ms": mc, "step_ms": ms,
                     "comm_share": mc / ms if mc is not None and ms else None})
    return rows
