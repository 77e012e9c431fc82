"""The lineage table's rows from fusion inference's result
(profiler.postjob.fusion), and the table without inference (`bare`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from profiler.formats.lineage import LINEAGE_COLUMNS
from profiler.postjob.fusion_evidence import (
    _DTYPE_SHOWN,
    Family,
    _Call,
    _Evidence,
    _families,
    _tensor_rows,
)


def _bare_rows(fam: Family, subs: pd.DataFrame) -> pd.DataFrame:
    """Every tensor of a family whose inference failed: listed, not inferred."""
    ev = _Evidence(subs, subs.iloc[0:0].assign(op="", comm=0, seq=0, bytes=0),
                   subs[["t_start_ns"]].to_numpy(dtype=np.float64),
                   subs[["t_end_ns"]].to_numpy(dtype=np.float64),
                   subs["bytes"].to_numpy(dtype=np.int64), np.zeros((0, 1)),
                   np.zeros((0, 1)), np.zeros((0, 1)), [], False)
    out = _rows(fam, ev, {}, 0, 0, None, [0])
    out["certainty"] = "not inferred"
    return out


def bare(frame: pd.DataFrame, names: Sequence[str], reason: str) -> tuple[pd.DataFrame,
                                                                         dict[str, Any]]:
    """The lineage when the inference failed as a whole: every tensor rank 0
    handed to Horovod, none matched, each "not inferred"; the reason in the
    info (errors)."""
    info: dict[str, Any] = {"source": "records", "errors": [reason]}
    try:
        subs0 = _tensor_rows(frame, names)
        fams = _families(subs0)
        parts = [_bare_rows(f, subs0.loc[np.asarray([x is f for x in fams], dtype=bool)]
                            .reset_index(drop=True))
                 for f in dict.fromkeys(x for x in fams if x is not None)]
        table = pd.concat(parts, ignore_index=True) if parts else _empty()
    except Exception:  # not even the tensor records: no table
        table = _empty()
    info["tensor_records"] = int(len(table))
    return table[LINEAGE_COLUMNS] if len(table) else _empty(), info



def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in LINEAGE_COLUMNS})


def _rows(fam: Family, ev: _Evidence, result: Mapping[int, _Call], stop: int, id0: int,
          threshold: int | None, ranks: Sequence[int]) -> pd.DataFrame:
    subs, calls, sub_t = ev.subs, ev.calls, ev.sub_t
    n = len(subs)
    call_of = np.full(n, -1, dtype=np.int64)
    for k, c in result.items():
        for s in c.tensors:
            call_of[s] = k
    matched = call_of >= 0
    safe = np.where(matched, call_of, 0)

    def ccol(name: str, default: Any, dtype: Any) -> np.ndarray:
        if len(calls) == 0 or name not in calls.columns:
            return np.full(n, default, dtype=dtype)
        return np.where(matched, calls[name].to_numpy()[safe], default).astype(dtype)

    tb = subs["bytes"].to_numpy(dtype=np.float64)
    names = subs["name"].to_numpy()
    # each call's values once, looked up per tensor through call_of (a fused
    # call carries many tensors); the table's last slot: no call
    keys = np.fromiter(result.keys(), dtype=np.int64, count=len(result))
    inferred = list(result.values())
    size = int(keys.max()) + 1 if len(keys) else 0
    slot = np.where(matched, call_of, size)

    def per_call(values: list[Any], default: Any, dtype: Any) -> np.ndarray:
        table = np.full(size + 1, default, dtype=dtype)
        if len(keys):
            table[keys] = np.asarray(values, dtype=dtype)
        return table[slot]

    n_tensors = per_call([len(c.tensors) for c in inferred], 1, np.int32)
    call_tb = per_call([float(tb[c.tensors].sum()) for c in inferred], math.nan, np.float64)
    call_bytes = ccol("bytes", -1, np.int64)
    if threshold and fam.fused:
        fill = call_tb / threshold
    else:
        fill = np.full(n, math.nan)
    conf = per_call([c.confidence for c in inferred], 0.0, np.float64)
    cands = per_call([";".join(names[c.candidates].tolist()) for c in inferred], "", object)
    method = per_call([c.method for c in inferred], "", object)
    ways = per_call([c.ways_log10 for c in inferred], math.nan, np.float64)
    bound = per_call([bool(c.ways_bound) for c in inferred], False, bool)
    # a tensor left unmatched when the budget stopped the inference could
    # have been carried by a call not inferred
    late = np.zeros(n, dtype=bool)
    if stop < len(calls):
        nxt = subs.groupby("name", sort=False)["t_start_ns"].shift(-1).to_numpy(
            dtype=np.float64)
        t_stop = float(np.nan_to_num(ev.call_t[stop, 0], nan=-np.inf))
        late = ~(np.isfinite(nxt) & (nxt < t_stop))
    certainty = np.where(
        matched, np.where(conf >= 1.0, "certain", "ambiguous"),
        np.where(late, "not inferred", "unmatched")).astype(object)
    enq = subs["t_start_ns"].to_numpy(dtype=np.float64)
    seen = np.isfinite(sub_t)
    n_ready = seen.sum(axis=1).astype(np.int32)
    t_max = np.where(seen.any(axis=1), np.nanmax(np.where(seen, sub_t, -np.inf), axis=1),
                     np.nan)
    t_min = np.where(seen.any(axis=1), np.nanmin(np.where(seen, sub_t, np.inf), axis=1),
                     np.nan)
    last = np.where(seen.any(axis=1),
                    np.asarray(ranks)[np.argmax(np.where(seen, sub_t, -np.inf), axis=1)], -1)
    c_start = ccol("t_start_ns", -1, np.int64)
    c_end = ccol("t_end_ns", -1, np.int64)
    gathered = fam.gathered
    agree = matched & np.isfinite(call_tb) & (call_tb == call_bytes) & (not gathered)
    dtype = [_DTYPE_SHOWN.get(d, d) for d in subs["dtype"].astype(str).tolist()]
    return pd.DataFrame({
        "step": ccol("step", -1, np.int64).astype(np.int32),
        "occurrence": subs["occurrence"].astype(np.int32),
        "tensor": subs["name"].astype(str),
        "op": fam.horovod_op,
        "comm_activity": fam.activity,
        "fused_id": np.where(matched, call_of + id0, -1).astype(np.int64),
        "n_tensors": n_tensors,
        "tensor_bytes": tb,
        "call_tensor_bytes": call_tb,
        "fill_ratio": fill,
        "dtype": dtype,
        "shape": "",
        "t_start_ns": enq,
        "t_end_ns": np.where(matched, c_end, np.nan).astype(np.float64),
        "negotiation_ns": np.nan,
        "neg_start_ns": np.nan,
        "neg_end_ns": np.nan,
        "wait_for_data_ns": np.nan,
        "ready_ranks": n_ready,
        "last_ready_rank": last.astype(np.int32),
        "ready_spread_ns": np.where(n_ready > 1, t_max - t_min, np.nan),
        "matched": matched,
        "call_op": np.where(matched, ccol("op", "", object), ""),
        "call_comm": ccol("comm", 0, np.uint64),
        "call_seq": ccol("seq", -1, np.int64),
        "call_t_start_ns": c_start,
        "call_t_end_ns": c_end,
        "call_dur_ns": ccol("dur_ns", -1, np.int64),
        "call_bytes": call_bytes,
        "bytes_agree": agree,
        "complete": True,
        "source": "records",
        "confidence": conf,
        "candidates": cands,
        "method": method,
        "certainty": certainty,
        "ways_log10": ways,
        "ways_bound": bound,
        "enqueue_ns": enq,
        "ready_ns": t_max,
        "queue_ns": np.where(matched, c_start - enq, np.nan),
    })


