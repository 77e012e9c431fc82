"""Fusion lineage beside Horovod's timeline, when there is one: what only the
timeline has, and the check of the inference against it."""

from __future__ import annotations

from typing import Any

import pandas as pd

# --------------------------------------------------------------------------
# the timeline, when there is one: what only it has, and the check
# --------------------------------------------------------------------------

def with_timeline(rec: pd.DataFrame, tl: pd.DataFrame) -> pd.DataFrame:
    """The records' lineage with the timeline's per-tensor phases (negotiation,
    wait for data, shape), matched by (tensor, occurrence)."""
    if rec.empty or tl.empty:
        return rec
    cols = ["negotiation_ns", "neg_start_ns", "neg_end_ns", "wait_for_data_ns", "shape"]
    t = tl[["tensor", "occurrence", *cols]].drop_duplicates(["tensor", "occurrence"])
    out = rec.drop(columns=cols).merge(t, on=["tensor", "occurrence"], how="left")
    out["shape"] = out["shape"].fillna("").astype(str)
    return out[list(rec.columns)]


def compare(rec: pd.DataFrame, tl: pd.DataFrame) -> dict[str, Any]:
    """Call by call, the records' tensor sets against the timeline's (the
    oracle): calls compared, equal, ambiguous with the truth among the
    candidates (and of those, how many showed the truth as the likeliest
    set), and wrong (with up to 5 examples)."""
    def sets(t: pd.DataFrame) -> dict[tuple[int, int], frozenset[str]]:
        m = t[t["matched"]]
        return {(int(c), int(s)): frozenset(g["tensor"]) for (c, s), g in
                m.groupby(["call_comm", "call_seq"], sort=False)}

    r, o = sets(rec), sets(tl)
    cand: dict[tuple[int, int], set[str]] = {}
    conf: dict[tuple[int, int], float] = {}
    if len(rec):
        m = rec[rec["matched"]]
        for (c, s), g in m.groupby(["call_comm", "call_seq"], sort=False):
            names = set(g["tensor"])
            for x in g["candidates"]:
                if x:
                    names |= set(x.split(";"))
            cand[(int(c), int(s))] = names
            conf[(int(c), int(s))] = float(g["confidence"].min())
    out: dict[str, Any] = {"calls": len(o), "equal": 0, "ambiguous_ok": 0, "wrong": 0,
                           "missing": 0, "ambiguous_shown_right": 0, "examples": []}
    for key, truth in o.items():
        got = r.get(key)
        if got is None:
            out["missing"] += 1
            continue
        if got == truth and conf.get(key, 1.0) >= 1.0:
            out["equal"] += 1
        elif conf.get(key, 1.0) < 1.0 and truth <= cand.get(key, set()):
            out["ambiguous_ok"] += 1
            out["ambiguous_shown_right"] += got == truth
        else:
            out["wrong"] += 1
            if len(out["examples"]) < 5:
                out["examples"].append({"call": list(key), "records": sorted(got),
                                        "timeline": sorted(truth)})
    out["extra"] = len(set(r) - set(o))
    return out

