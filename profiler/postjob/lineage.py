"""Fusion lineage: which tensors rode in which collective.

`build(profile_dir)` writes ``<dir>/lineage.parquet``: one row per tensor
operation (one tensor through one Horovod response), with the collective call
that carried it.  It comes from the profiler's own records
(profiler.postjob.fusion: tensors handed to Horovod, and the calls' bytes and
buffers), on by default and at no measurable cost; when the job also wrote
Horovod's timeline (HOROVOD_PROFILE_TIMELINE=1, or the user's own
HOROVOD_TIMELINE), the timeline is joined with rank 0's records as below,
adds the per-tensor negotiation and wait-for-data phases only it has, and
the two answers are compared call by call.  From the table:

* each data call (rank 0's record, identified on every rank by (comm, seq))
  gets the tensors it carried, their count, their total bytes and the fill
  ratio against HOROVOD_FUSION_THRESHOLD (`calls()`);
* each tensor gets its negotiation time and wait-for-data time;
* per-rank readiness gives the rank that made the others wait (`stragglers()`).

Alignment method (the timeline and the records use different time bases):

1. Coarse offset from wall-clock anchors.  Horovod writes
   ``start_time_since_epoch_in_micros`` (CLOCK_REALTIME at timeline ts 0, from
   steady_clock = CLOCK_MONOTONIC) in the timeline header; rank 0's raw header
   holds a (CLOCK_REALTIME, CLOCK_MONOTONIC) pair taken at start-up
   (cal0_realtime_ns, cal0_mono_ns) and the job's time zero (job_t0_ns).  So
   job_ns = epoch_us*1000 + ts_us*1000 - cal0_realtime_ns + cal0_mono_ns
   - offset_ns - job_t0_ns, which agrees with the records to a few microseconds.
2. Without anchors (or when they disagree with the records), order: for each
   collective family (MPI_ALLREDUCE <-> allreduce, MPI_BCAST <-> bcast, ...),
   the timeline's operation instances and rank 0's data records on Horovod's
   thread are both in call order; the sequence shift k (instance i <-> record
   i + k) that maximises agreeing byte counts, then minimises the spread of
   time differences, is taken, searched near k = 0 (timeline from the start,
   maybe cut at the end) and near k = records - instances (timeline started
   late), and the offset is the median time difference of the agreeing pairs.
3. With that offset, instances and records are matched in order: each
   instance takes, among the records after the previous match whose start
   lies within `tolerance_ns` of the instance's predicted start and whose
   bytes agree (allreduce/broadcast: record bytes = sum of the tensors'
   bytes) when both are known, the nearest one.

The reason lineage is absent (no timeline, unreadable timeline, no rank-0
dataset) is returned by `build_lineage` and recorded in the metadata dict
passed to `build` (``metadata["lineage"]``).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from profiler.errors import NotFoundError, PathLike, ProfilerError
from profiler.formats import timeline as T
from profiler.formats.lineage import LINEAGE_COLUMNS, fusion_threshold
from profiler.layout import LINEAGE_FILE, TIMELINE_FILE
from profiler.postjob.classify import classify, is_horovod_row

__all__ = [
    "LineageOutcome",
    "build",
    "build_lineage",
    "find_timeline",
    "join",
]

DEFAULT_TOLERANCE_NS = 2_000_000
SHIFT_WINDOW = 64

#: Timeline collective activity -> record ops that can carry it.
ACTIVITY_OPS: dict[str, tuple[str, ...]] = {
    "MPI_ALLREDUCE": ("allreduce",),
    "MPI_BCAST": ("bcast",),
    "MPI_ALLGATHER": ("allgatherv", "allgather"),
    "MPI_CROSS_ALLGATHER": ("allgatherv",),
    "MPI_ALLTOALL": ("alltoallv", "alltoall"),
    "MPI_REDUCESCATTER": ("reduce_scatter", "reduce_scatter_block"),
    "NCCL_ALLREDUCE": ("nccl_allreduce",),
    "NCCL_BCAST": ("nccl_broadcast", "nccl_bcast"),
    "NCCL_ALLGATHER": ("nccl_allgather",),
    "NCCL_REDUCESCATTER": ("nccl_reducescatter",),
    "NCCL_REDUCE": ("nccl_reduce",),
}
#: Families whose record bytes equal the sum of the tensors' bytes.
BYTES_COMPARABLE = frozenset({"MPI_ALLREDUCE", "MPI_BCAST", "NCCL_ALLREDUCE", "NCCL_BCAST"})
#: Horovod responses that are never fused (no fill ratio).
UNFUSED_OPS = frozenset({"BROADCAST", "ALLTOALL", "BARRIER", "JOIN"})


@dataclass
class LineageOutcome:
    """What `build_lineage` did: the file written (or None) and why."""

    path: Path | None
    reason: str
    table: pd.DataFrame | None = None
    info: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # failures worth a line on stderr

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": "ok" if self.path is not None else "absent",
                               "reason": self.reason}
        if self.path is not None:
            out["file"] = self.path.name
        out.update(self.info)
        return out


# --------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        obj = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise NotFoundError(path, "no such file") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise NotFoundError(path, f"cannot read rank metadata: {exc}") from None
    if not isinstance(obj, dict):
        raise NotFoundError(path, "rank metadata is not a JSON object")
    return obj


def find_timeline(profile_dir: Path, env: Mapping[str, Any] | None) -> Path | None:
    """<dir>/timeline.json, else the user's HOROVOD_TIMELINE if it is a file."""
    own = profile_dir / TIMELINE_FILE
    if own.is_file():
        return own
    user = (env or {}).get("HOROVOD_TIMELINE")
    if isinstance(user, str) and user and user != "DYNAMIC":
        p = Path(user)
        for cand in ([p] if p.is_absolute() else [profile_dir.parent / p, profile_dir / p]):
            if cand.is_file():
                return cand
    return None


def _anchor_base_ns(tl: T.Timeline, header: Mapping[str, Any] | None) -> float | None:
    """job_ns - ts_us*1000 for this timeline, from the wall-clock anchors."""
    if tl.start_epoch_us is None or not header:
        return None
    try:
        rt = int(header["cal0_realtime_ns"])
        mono = int(header["cal0_mono_ns"])
        t0 = int(header["job_t0_ns"])
        off = int(header.get("offset_ns", 0) or 0)
    except (KeyError, TypeError, ValueError):
        return None
    if rt <= 0 or mono <= 0:
        return None
    return float(tl.start_epoch_us) * 1000.0 - rt + mono - off - t0


# --------------------------------------------------------------------------
# alignment
# --------------------------------------------------------------------------

def _bytes_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.isfinite(a) & (a == b)


def _best_shift(a_t: np.ndarray, a_b: np.ndarray, r_t: np.ndarray, r_b: np.ndarray,
                comparable: bool) -> tuple[int, float] | None:
    """Order alignment: (shift k, offset ns) with instance i <-> record i + k."""
    na, nr = len(a_t), len(r_t)
    if na == 0 or nr == 0:
        return None
    cands = set(range(-SHIFT_WINDOW, SHIFT_WINDOW + 1))
    cands |= set(range(nr - na - SHIFT_WINDOW, nr - na + SHIFT_WINDOW + 1))
    best: tuple[int, int, float, int, float] | None = None  # (agree, overlap, -spread, k, off)
    for k in sorted(cands):
        i0, i1 = max(0, -k), min(na, nr - k)
        if i1 - i0 <= 0:
            continue
        ai = np.arange(i0, i1)
        rj = ai + k
        diff = r_t[rj] - a_t[ai]
        if comparable:
            ok = _bytes_equal(a_b[ai], r_b[rj])
            agree = int(ok.sum())
            use = diff[ok] if agree else diff
        else:
            agree = 0
            use = diff
        spread = float(np.percentile(use, 90) - np.percentile(use, 10)) if len(use) > 1 else 0.0
        key = (agree, i1 - i0, -spread, -abs(k), float(np.median(use)))
        if best is None or key[:4] > best[:4]:
            best = key
    if best is None:
        return None
    return -best[3], best[4]


def _match(a_t: np.ndarray, a_b: np.ndarray, r_t: np.ndarray, r_b: np.ndarray,
           offset: float, tol: float, comparable: bool) -> np.ndarray:
    """Monotone match: out[i] = record index for instance i, or -1."""
    out = np.full(len(a_t), -1, dtype=np.int64)
    j = 0
    nr = len(r_t)
    for i in range(len(a_t)):
        p = a_t[i] + offset
        # first record that could match: r_t >= p - tol, after the previous match
        j = max(j, int(np.searchsorted(r_t, p - tol, side="left")))
        k = j
        best = -1
        while k < nr and r_t[k] <= p + tol:
            if not comparable or not math.isfinite(a_b[i]) or a_b[i] == r_b[k]:
                # the nearest agreeing record in the window
                if best < 0 or abs(r_t[k] - p) < abs(r_t[best] - p):
                    best = k
                elif r_t[k] > p:
                    break
            k += 1
        if best >= 0:
            out[i] = best
            j = best + 1
    return out


def _align_family(
    inst: pd.DataFrame, recs: pd.DataFrame, base: float | None, tol: float, comparable: bool,
) -> tuple[np.ndarray, dict[str, Any]]:
    a_t = inst["t_start_us"].to_numpy(dtype=np.float64) * 1000.0
    a_b = inst["tensor_bytes"].to_numpy(dtype=np.float64)
    r_t = recs["t_start_ns"].to_numpy(dtype=np.float64)
    r_b = recs["bytes"].to_numpy(dtype=np.float64)
    info: dict[str, Any] = {"instances": int(len(inst)), "records": int(len(recs))}
    matched = np.full(len(inst), -1, dtype=np.int64)
    if len(inst) == 0 or len(recs) == 0:
        info.update(method="none", matched=0)
        return matched, info
    method = "none"
    if base is not None:
        matched = _match(a_t, a_b, r_t, r_b, base, tol, comparable)
        method = "wall-clock anchor"
    if (matched >= 0).sum() < min(len(inst), len(recs)) * 0.9:
        shift = _best_shift(a_t, a_b, r_t, r_b, comparable)
        if shift is not None:
            alt = _match(a_t, a_b, r_t, r_b, shift[1], tol, comparable)
            if (alt >= 0).sum() > (matched >= 0).sum():
                matched, method = alt, "call order"
    ok = matched >= 0
    if ok.any():
        resid = r_t[matched[ok]] - a_t[ok]
        offset = float(np.median(resid))
        dev = np.abs(resid - offset)
        info.update(offset_ns=offset, residual_p50_ns=float(np.percentile(dev, 50)),
                    residual_max_ns=float(dev.max()))
    info.update(method=method, matched=int(ok.sum()))
    return matched, info


# --------------------------------------------------------------------------
# the join
# --------------------------------------------------------------------------

def _data_records(df: pd.DataFrame) -> pd.DataFrame:
    """Rank 0's data calls made by Horovod's thread, in start order."""
    if len(df) == 0:
        return df
    kind = df["kind"] if "kind" in df.columns else classify(df)
    mask = (np.asarray(kind.astype(str)) == "data") & is_horovod_row(df)
    out = df.loc[mask].sort_values("t_start_ns", kind="stable")
    return out.reset_index(drop=True)


def join(
    tl: T.Timeline,
    frame: pd.DataFrame,
    *,
    header: Mapping[str, Any] | None = None,
    env: Mapping[str, Any] | None = None,
    tolerance_ns: float = DEFAULT_TOLERANCE_NS,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The lineage table (LINEAGE_COLUMNS) and alignment info for one timeline
    and rank 0's frame (row schema)."""
    ops = T.tensor_ops(tl)
    threshold = fusion_threshold(env)
    base = _anchor_base_ns(tl, header)
    info: dict[str, Any] = {
        "fusion_threshold": threshold,
        "anchor": base is not None,
        "timeline": tl.summary(),
        "families": {},
    }
    if ops.empty:
        return pd.DataFrame({c: [] for c in LINEAGE_COLUMNS}), info
    inst = T.fused_ops(tl, ops)
    recs = _data_records(frame)
    rec_op = np.asarray(recs["op"].astype(str)) if len(recs) else np.zeros(0, dtype=object)

    # instance op_group -> record row
    inst_rec = np.full(len(inst), -1, dtype=np.int64)
    for act, rops in ACTIVITY_OPS.items():
        isel = np.flatnonzero(inst["comm_activity"].to_numpy() == act)
        if len(isel) == 0:
            continue
        rsel = np.flatnonzero(np.isin(rec_op, np.asarray(rops, dtype=object)))
        m, finfo = _align_family(inst.iloc[isel], recs.iloc[rsel], base,
                                 tolerance_ns, act in BYTES_COMPARABLE)
        inst_rec[isel[m >= 0]] = rsel[m[m >= 0]]
        info["families"][act] = finfo
    info["matched_calls"] = int((inst_rec >= 0).sum())
    info["instances"] = int(len(inst))
    info["data_records"] = int(len(recs))

    # Offset for the timeline's own spans: the best family's median, else the anchor.
    offsets = [f["offset_ns"] for f in info["families"].values() if "offset_ns" in f]
    offset = float(np.median(offsets)) if offsets else (base if base is not None else math.nan)
    info["offset_ns"] = offset

    g2row = dict(zip(inst["op_group"].to_numpy().tolist(), inst_rec.tolist()))
    g2bytes = dict(zip(inst["op_group"].to_numpy().tolist(),
                       inst["tensor_bytes"].to_numpy().tolist()))
    rows = np.asarray([g2row.get(g, -1) for g in ops["op_group"].to_numpy().tolist()],
                      dtype=np.int64)
    matched = rows >= 0
    safe = np.where(matched, rows, 0)

    def rec_col(name: str, default: Any, dtype: Any) -> np.ndarray:
        if len(recs) == 0 or name not in recs.columns:
            return np.full(len(ops), default, dtype=dtype)
        vals = recs[name].to_numpy()[safe]
        return np.where(matched, vals, default).astype(dtype)

    call_bytes = rec_col("bytes", -1, np.int64)
    call_tb = np.asarray([g2bytes.get(g, math.nan) for g in ops["op_group"].tolist()],
                         dtype=np.float64)
    comparable = ops["comm_activity"].isin(list(BYTES_COMPARABLE)).to_numpy()
    tensor_bytes = ops["tensor_bytes"].to_numpy(dtype=np.float64).copy()
    # Horovod writes no dtype/shape when it ends a broadcast: a call carrying
    # one tensor of a byte-comparable family gives that tensor's bytes.
    fill_in = matched & comparable & ~np.isfinite(tensor_bytes) & (ops["n_fused"].to_numpy() == 1)
    tensor_bytes[fill_in] = call_bytes[fill_in]
    call_tb[fill_in] = call_bytes[fill_in]
    if threshold:
        fill = call_tb / threshold
    else:  # fusion off (0) or threshold unknown (None)
        fill = np.full(len(ops), math.nan)
    # Broadcasts and alltoalls never go through the fusion buffer.
    fill = np.where(ops["op"].isin(list(UNFUSED_OPS)).to_numpy(), math.nan, fill)
    step = rec_col("step", -1, np.int64) if "step" in recs.columns else np.full(len(ops), -1)
    agree = matched & comparable & np.isfinite(call_tb) & (call_tb == call_bytes) & ~fill_in

    def ns(col: str) -> np.ndarray:
        v = ops[col].to_numpy(dtype=np.float64) * 1000.0 + offset
        return np.where(np.isfinite(v), np.round(v), np.nan)

    out = pd.DataFrame({
        "step": step.astype(np.int32),
        "occurrence": ops["occurrence"].astype(np.int32),
        "tensor": ops["tensor"].astype(str),
        "op": ops["op"].astype(str),
        "comm_activity": ops["comm_activity"].astype(str),
        "fused_id": ops["op_group"].astype(np.int64),
        "n_tensors": ops["n_fused"].astype(np.int32),
        "tensor_bytes": tensor_bytes,
        "call_tensor_bytes": call_tb,
        "fill_ratio": fill,
        "dtype": ops["dtype"].astype(str),
        "shape": ops["shape"].astype(str),
        "t_start_ns": ns("t_start_us"),
        "t_end_ns": ns("t_end_us"),
        "negotiation_ns": ops["negotiation_us"].to_numpy(dtype=np.float64) * 1000.0,
        "neg_start_ns": ns("neg_start_us"),
        "neg_end_ns": ns("neg_end_us"),
        "wait_for_data_ns": ops["wait_for_data_us"].to_numpy(dtype=np.float64) * 1000.0,
        "ready_ranks": ops["ready_ranks"].astype(np.int32),
        "last_ready_rank": ops["last_ready_rank"].astype(np.int32),
        "ready_spread_ns": ops["ready_spread_us"].to_numpy(dtype=np.float64) * 1000.0,
        "matched": matched,
        "call_op": np.where(matched, rec_col("op", "", object), ""),
        "call_comm": rec_col("comm", 0, np.uint64),
        "call_seq": rec_col("seq", -1, np.int64),
        "call_t_start_ns": rec_col("t_start_ns", -1, np.int64),
        "call_t_end_ns": rec_col("t_end_ns", -1, np.int64),
        "call_dur_ns": rec_col("dur_ns", -1, np.int64),
        "call_bytes": call_bytes,
        "bytes_agree": agree,
        "complete": ops["complete"].astype(bool),
        "source": "timeline",
        "confidence": np.where(matched, 1.0, 0.0),
        "candidates": "",
        "method": "timeline",
        "certainty": np.where(matched, "certain", "unmatched"),
        "ways_log10": np.where(matched, 0.0, np.nan),
        "ways_bound": False,
        "enqueue_ns": np.nan,
        "ready_ns": np.nan,
        "queue_ns": np.nan,
    })
    out["call_op"] = out["call_op"].astype(str)
    info["rows"] = int(len(out))
    info["tensors"] = int(out["tensor"].nunique())
    info["bytes_disagree"] = int((matched & comparable & np.isfinite(call_tb) & ~agree).sum())
    return out[LINEAGE_COLUMNS], info


# --------------------------------------------------------------------------
# views on a lineage table
# --------------------------------------------------------------------------


# --------------------------------------------------------------------------
# the profile directory
# --------------------------------------------------------------------------

def _read_rank0(profile_dir: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    pq_path = profile_dir / "ranks" / "rank-00000.parquet"
    js_path = profile_dir / "ranks" / "rank-00000.json"
    if not pq_path.is_file():
        raise NotFoundError(
            pq_path, "no rank-0 dataset (the timeline is joined with rank 0's records)")
    meta = _read_json(js_path) if js_path.is_file() else {}
    try:
        frame = pq.read_table(pq_path).to_pandas()
    except Exception as exc:  # a corrupt file: arrow, pandas metadata, JSON, UTF-8 errors
        msg = " ".join(str(exc).split())[:200]
        raise NotFoundError(pq_path, f"cannot read rank-0 dataset: {msg}") from None
    return frame, meta


def _env_from_other_ranks(profile_dir: Path) -> dict[str, Any] | None:
    """The env whitelist of the first rank whose own process recorded it."""
    ranks = profile_dir / "ranks"
    if not ranks.is_dir():
        return None
    for js in sorted(ranks.glob("rank-*.json"))[:64]:
        try:
            env = _read_json(js).get("env")
        except ProfilerError:
            continue
        if isinstance(env, dict):
            return env
    return None


def _read_evidence(profile_dir: Path, ranks: int) -> tuple[dict[int, pd.DataFrame],
                                                           dict[int, list[str]]]:
    """Ranks 1..ranks-1's rows that the records' lineage uses (fusion.evidence:
    the columns it reads, tensor and data call rows; missing or unreadable
    ranks are skipped) and tensor names.  One rank's columns are in memory at
    a time."""
    from profiler.postjob.fusion import EVIDENCE_COLUMNS, evidence

    frames: dict[int, pd.DataFrame] = {}
    names: dict[int, list[str]] = {}
    for r in range(1, ranks):
        pq_path = profile_dir / "ranks" / f"rank-{r:05d}.parquet"
        js_path = profile_dir / "ranks" / f"rank-{r:05d}.json"
        if not pq_path.is_file() or not js_path.is_file():
            continue
        try:
            meta = _read_json(js_path)
            present = set(pq.read_schema(pq_path).names)
            cols = [c for c in EVIDENCE_COLUMNS if c in present]
            frames[r] = evidence(pq.read_table(pq_path, columns=cols).to_pandas())
        except Exception:  # evidence from another rank is optional
            continue
        names[r] = list(meta.get("tensor_names") or [])
    return frames, names


def build_lineage(
    profile_dir: PathLike,
    *,
    frame: pd.DataFrame | None = None,
    rank_meta: Mapping[str, Any] | None = None,
    tolerance_ns: float = DEFAULT_TOLERANCE_NS,
    write: bool = True,
    sources: tuple[str, ...] = ("records", "timeline"),
) -> LineageOutcome:
    """Write <dir>/lineage.parquet; the outcome says what was written or why not.

    From the profiler's own records (tensor records and data calls of rank 0
    and up to fusion.MAX_RANKS - 1 more ranks: profiler.postjob.fusion) and,
    when the job wrote one, Horovod's timeline: it adds the per-tensor phases
    only it has, and the two are compared call by call (info["agreement"]).
    Without tensor records (a job recorded before they existed, or not from
    horovod.torch) the timeline alone gives the lineage.  `sources` limits
    what is used (tests compare the two).

    Never raises for what the profile directory holds (no timeline, a bad
    timeline, no rank-0 dataset): those give path None and a reason.  With
    write=False nothing is written: the table is in the outcome (path None).
    """
    from profiler.postjob import fusion

    d = Path(os.fspath(profile_dir))
    try:
        if frame is None or rank_meta is None:
            f0, m0 = _read_rank0(d)
            frame = f0 if frame is None else frame
            rank_meta = m0 if rank_meta is None else rank_meta
    except ProfilerError as exc:
        return LineageOutcome(None, exc.line())
    env = rank_meta.get("env")
    if env is None:
        env = _env_from_other_ranks(d)
    header = rank_meta.get("header") or {}
    threshold = fusion_threshold(env)
    info: dict[str, Any] = {"fusion_threshold": threshold}
    reasons: list[str] = []
    problems: list[str] = []  # what went wrong although a lineage may be written

    rec_table: pd.DataFrame | None = None
    names0 = list(rank_meta.get("tensor_names") or [])
    if "records" in sources and names0:
        world = int(header.get("world_size", 0) or 0) or None
        frames, names = _read_evidence(d, min(world or 1, fusion.MAX_RANKS))
        frames[0], names[0] = frame, names0
        try:
            rec_table, rinfo = fusion.infer(frames, names, threshold=threshold,
                                            world_size=world)
        except Exception as exc:  # a bug or a record it cannot read: every tensor still listed
            why = f"the inference failed ({_one_line(exc)})"
            rec_table, rinfo = fusion.bare(frame, names0, why)
        info["records"] = rinfo
        problems.extend(rinfo.get("errors") or [])
        if rinfo.get("not_inferred"):
            problems.append(f"{rinfo['not_inferred']} calls not inferred (the inference's "
                            f"{fusion.TIME_BUDGET_S:g} s budget ran out)")
        if rec_table.empty:
            rec_table = None
            reasons.append(rinfo.get("reason", "no tensor carried by a recorded call"))
    elif "records" in sources:
        not_recorded = rank_meta.get("tensors_not_recorded")
        reasons.append(f"no tensor records ({not_recorded})" if not_recorded else
                       "no tensor records (they come from horovod.torch's entry points "
                       "and Horovod's TensorFlow kernels)")

    tl_table: pd.DataFrame | None = None
    tl_path = find_timeline(d, env) if "timeline" in sources else None
    if tl_path is not None:
        tinfo: dict[str, Any] = {}
        try:
            tl = T.parse(tl_path)
        except ProfilerError as exc:
            reasons.append(f"Horovod timeline unusable: {exc.line()}")
        else:
            try:
                tl_table, tinfo = join(tl, frame, header=header, env=env,
                                       tolerance_ns=tolerance_ns)
            except Exception as exc:  # a timeline this join cannot read
                why = f"Horovod timeline unusable: {_one_line(exc)}"
                reasons.append(why)
                problems.append(why)
                tl_table, tinfo = None, {}
        if tinfo:
            tinfo["timeline_file"] = os.path.relpath(tl_path, d) \
                if tl_path.is_relative_to(d) else str(tl_path)
            info["timeline"] = tinfo
            if tl_table is not None and tl_table.empty:
                tl_table = None
                reasons.append("the Horovod timeline holds no tensor operations")
    elif "timeline" in sources and rec_table is None:
        reasons.append("no Horovod timeline (HOROVOD_PROFILE_TIMELINE=1 writes one)")

    if rec_table is not None and tl_table is not None:
        info["agreement"] = fusion.compare(rec_table, tl_table)
        table = fusion.with_timeline(rec_table, tl_table)
        info["source"] = "records+timeline"
    elif rec_table is not None:
        table, info["source"] = rec_table, "records"
    elif tl_table is not None:
        table, info["source"] = tl_table, "timeline"
    else:
        if names0 and "records" in sources:  # tensors were recorded: absent is a problem
            problems.append("; ".join(reasons) or "no lineage")
        return LineageOutcome(None, "; ".join(reasons) or "no lineage", None, info, problems)
    # the summary counts of the table written, at the top level
    m = table[table["matched"]]
    info["rows"] = int(len(table))
    info["tensors"] = int(table["tensor"].nunique())
    info["matched_calls"] = int(m.groupby(["call_comm", "call_seq"]).ngroups) if len(m) else 0
    amb = m[m["confidence"] < 1.0]
    info["ambiguous_calls"] = int(amb.groupby(["call_comm", "call_seq"]).ngroups) \
        if len(amb) else 0
    reason = (f"{info['rows']} tensor operations, {info['tensors']} tensors, "
              f"{info['matched_calls']} calls, from {info['source']}")
    left = (info.get("records") or {}).get("not_inferred")
    if left:
        reason += (f"; {left} later calls not inferred (the inference's "
                   f"{fusion.TIME_BUDGET_S:g} s budget at merge ran out)")
    cert = table["certainty"].astype(str).value_counts() if "certainty" in table.columns \
        else pd.Series(dtype=int)
    info["certainty"] = {str(k): int(v) for k, v in cert.items()}
    reason += "; " + ", ".join(f"{v} {k}" for k, v in info["certainty"].items())
    if problems:
        info["problems"] = problems
    if not write:
        return LineageOutcome(None, reason, table, info, problems)
    out = d / LINEAGE_FILE
    tmp = d / (LINEAGE_FILE + f".tmp{os.getpid()}")
    try:
        # nthreads=1: pyarrow would use a ThreadPoolExecutor for large frames,
        # which fails when this runs from an atexit handler.
        pq.write_table(pa.Table.from_pandas(table, preserve_index=False, nthreads=1), tmp)
        os.replace(tmp, out)
    except Exception as exc:  # OSError, or arrow refusing a column
        tmp.unlink(missing_ok=True)
        why = f"cannot write {out}: {getattr(exc, 'strerror', None) or _one_line(exc)}"
        return LineageOutcome(None, why, table, info, [*problems, why])
    return LineageOutcome(out, reason, table, info, problems)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ProfilerError):
        return exc.line()
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def build(profile_dir: PathLike, *, metadata: dict[str, Any] | None = None,
          say: Any = None) -> Path | None:
    """Write <dir>/lineage.parquet and return its path, or None when lineage is
    absent.  When `metadata` (the trace metadata dict) is given, the outcome is
    recorded in metadata["lineage"] (status, reason, file, alignment).

    Never raises.  What went wrong (the inference failed or ran out of time,
    tensors were recorded but no lineage could be written) is also said in
    one line on stderr (`say`, default: "horovod-profiler: warning: lineage:
    ..."), never as a traceback: the merge's other outputs do not depend on
    it.  A job without tensor records (not horovod.torch) has no lineage and
    nothing to say."""
    try:
        outcome = build_lineage(profile_dir)
    except Exception as exc:  # never the reason a merge fails
        outcome = LineageOutcome(None, f"cannot build: {_one_line(exc)}", None, {},
                                 [f"cannot build: {_one_line(exc)}"])
    if metadata is not None:
        metadata["lineage"] = outcome.metadata()
    if outcome.problems:
        line = "lineage: " + "; ".join(dict.fromkeys(outcome.problems))
        if outcome.path is not None:
            line += f" (written: {outcome.path.name}, {outcome.reason})"
        _say(line, say)
    return outcome.path


def _say(line: str, say: Any = None) -> None:
    text = " ".join(line.split())
    try:
        if say is not None:
            say(text)
        else:
            sys.stderr.write(f"horovod-profiler: warning: {text}\n")
            sys.stderr.flush()
    except Exception:
        pass


