"""Horovod's timeline as a third, coarse source of NCCL calls.

When neither the symbol wrappers (shared NCCL) nor NCCL's profiler-plugin
path (NCCL >= 2.23) recorded an NCCL call, but Horovod wrote a timeline
(HOROVOD_PROFILE_TIMELINE=1, or the user's own HOROVOD_TIMELINE), each NCCL
activity of a Horovod operation in it (NCCL_ALLREDUCE, NCCL_BCAST, ...; one
fused response = one call, profiler.formats.timeline.fused_ops) becomes one
coarse NCCL row of rank 0 (Horovod's timeline is rank 0's view), with
source = "timeline": the activity span on the job axis (placed through the
timeline's wall-clock anchor), the bytes of the tensors it carried, the
communicator unknown (comm 0, name "timeline"), no datatype, no device time.

Never counted twice: nothing is added when any rank recorded an NCCL call
(its metadata's NCCL counters, or NCCL rows in rank 0's dataset other than
timeline rows), and a second merge replaces the rows the first one added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler.errors import ProfilerError
from profiler.formats import timeline as T
from profiler.formats.dataset import frame_to_table, read_dataset, write_parquet

SOURCE = "timeline"

#: Horovod's NCCL activity names (horovod/common/ops/nccl_operations.cc) ->
#: this profiler's op names.
ACTIVITY_OPS = {
    "NCCL_ALLREDUCE": "nccl_allreduce",
    "NCCL_REDUCESCATTER": "nccl_reducescatter",
    "NCCL_ALLGATHER": "nccl_allgather",
    "NCCL_BCAST": "nccl_broadcast",
    "NCCL_BROADCAST": "nccl_broadcast",
    "NCCL_REDUCE": "nccl_reduce",
}


def _recorded_nccl(rank_meta: Sequence[Mapping[str, Any]]) -> int:
    n = 0
    for m in rank_meta:
        st = m.get("nccl")
        if isinstance(st, Mapping):
            calls = st.get("calls")
            if isinstance(calls, Mapping):
                n += sum(int(v) for v in calls.values() if isinstance(v, int))
    return n


def coarse_rows(tl: T.Timeline, base_ns: float, world: int) -> tuple[pd.DataFrame, int]:
    """The timeline's NCCL activities as rows of rank 0 (the row schema's
    columns plus source); and the number of NCCL activities with no op here."""
    ops = T.fused_ops(tl)
    act = ops["comm_activity"].astype(str) if len(ops) else pd.Series([], dtype=str)
    is_nccl = act.str.startswith("NCCL_").to_numpy(dtype=bool) if len(ops) else np.zeros(0, bool)
    sel = ops.loc[is_nccl]
    names = sel["comm_activity"].astype(str).map(ACTIVITY_OPS)
    unknown = int(names.isna().sum())
    sel = sel.loc[names.notna().to_numpy()]
    names = names.dropna()
    sel = sel.loc[np.isfinite(sel["t_end_us"].to_numpy(dtype=np.float64))]
    names = names.loc[sel.index]
    n = len(sel)
    t0 = np.rint(base_ns + sel["t_start_us"].to_numpy(dtype=np.float64) * 1e3).astype(np.int64)
    t1 = np.rint(base_ns + sel["t_end_us"].to_numpy(dtype=np.float64) * 1e3).astype(np.int64)
    nbytes = sel["tensor_bytes"].to_numpy(dtype=np.float64)
    df = pd.DataFrame({
        "rank": np.zeros(n, np.int32),
        "backend": pd.Categorical(["nccl"] * n),
        "op": pd.Categorical(names.to_list()),
        "t_start_ns": t0,
        "t_end_ns": t1,
        "dur_ns": t1 - t0,
        "bytes": np.where(np.isfinite(nbytes), nbytes, 0).astype(np.int64),
        "count": np.zeros(n, np.int64),
        "dtype": pd.Categorical(["unknown"] * n),
        "dtype_size": np.zeros(n, np.int32),
        "redop": pd.Categorical(["none"] * n),
        "flags": np.zeros(n, np.int32),
        "in_place": np.zeros(n, bool),
        "device": np.zeros(n, bool),
        "rc": np.zeros(n, np.int16),
        "comm": np.zeros(n, np.uint64),
        "comm_size": np.full(n, world, np.int32),
        "comm_rank": np.zeros(n, np.int32),
        "comm_name": pd.Categorical([SOURCE] * n),
        "root": np.full(n, -1, np.int32),
        "seq": np.arange(n, dtype=np.int64),
        "tag": np.full(n, -1, np.int32),
        "track": np.full(n, -1, np.int32),
        "tid": np.full(n, -1, np.int32),
        "thread_kind": pd.Categorical(["other"] * n),
        "thread_name": pd.Categorical([""] * n),
        "group": np.zeros(n, np.int32),
        "buf": np.zeros(n, np.int64),
        "kind": pd.Categorical(["data"] * n),
        "step": np.full(n, -1, np.int32),
        "source": pd.Categorical([SOURCE] * n),
    })
    return df, unknown


def add(profile_dir: Path, rank_meta: Sequence[Mapping[str, Any]],
        rank0_parquet: Path | None) -> dict[str, Any]:
    """Add the timeline's coarse NCCL rows to rank 0's dataset file when no
    path recorded NCCL; returns what was done (trace metadata "nccl_timeline")."""
    from profiler.postjob.lineage import _anchor_base_ns, find_timeline

    m0 = next((m for m in rank_meta if int(m.get("rank", -1)) == 0), None)
    if m0 is None or rank0_parquet is None or not rank0_parquet.is_file():
        return {"status": "absent", "reason": "no rank-0 dataset"}
    env = m0.get("env") if isinstance(m0.get("env"), Mapping) else None
    tl_path = find_timeline(profile_dir, env)
    if tl_path is None:
        return {"status": "absent", "reason": "no Horovod timeline"}
    recorded = _recorded_nccl(rank_meta)
    if recorded:  # the counters say so: rank 0's rows are not read
        return {"status": "absent", "reason": f"NCCL recorded by the profiler ({recorded} "
                                              "call(s)): the timeline is not counted again"}
    cols = read_dataset([rank0_parquet], columns=["backend", "source"])
    own = (cols["source"].astype(str) == SOURCE).to_numpy() if "source" in cols.columns \
        else np.zeros(len(cols), bool)
    in_data = int(((cols["backend"].astype(str) == "nccl").to_numpy() & ~own).sum())
    if in_data:
        return {"status": "absent", "reason": f"NCCL recorded by the profiler ({in_data} "
                                              "call(s)): the timeline is not counted again"}
    try:
        tl = T.parse(tl_path)
    except ProfilerError as exc:
        return {"status": "absent", "reason": f"Horovod timeline unusable: {exc.line()}"}
    base = _anchor_base_ns(tl, m0.get("header") or {})
    if base is None:
        return {"status": "absent", "reason": "the timeline has no wall-clock anchor"}
    world = int((m0.get("header") or {}).get("world_size", 0) or 0) or -1
    rows, unknown = coarse_rows(tl, base, world)
    if not len(rows) and not own.any():
        return {"status": "absent", "reason": "no NCCL activity in the Horovod timeline",
                "unknown_activities": unknown}
    df0 = read_dataset([rank0_parquet])
    keep = df0.loc[~own]
    if "source" not in keep.columns:
        keep = keep.assign(source=pd.Categorical(["records"] * len(keep)))
    out = pd.concat([keep, rows], ignore_index=True)
    for c in out.columns:  # a column only the records have (net_*): its zero, not NaN
        if c not in rows.columns and keep[c].dtype.kind in "iub":
            out[c] = out[c].fillna(0).astype(keep[c].dtype)
    for c in ("backend", "op", "dtype", "redop", "comm_name", "thread_kind", "thread_name",
              "kind", "source"):
        if c in out.columns:
            out[c] = out[c].astype(str).astype("category")
    out = out.sort_values("t_start_ns", kind="stable").reset_index(drop=True)
    tmp = rank0_parquet.with_name(f".{rank0_parquet.name}.timeline.tmp")
    write_parquet(frame_to_table(out), tmp)
    tmp.replace(rank0_parquet)
    return {"status": "added", "seen_by": SOURCE, "rows": int(len(rows)),
            "unknown_activities": unknown, "timeline_file": str(tl_path),
            "note": "coarse: Horovod's activity spans on rank 0, no communicator, no "
                    "datatype, no device time"}
