"""At a rank's exit (or in `profiler merge`): raw/rank-R.hvprof ->
ranks/rank-R.parquet + ranks/rank-R.json (parquet first, then the json, each by
an atomic rename: a json file means the rank's dataset is complete)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow.parquet as pq

from profiler._version import __version__
from profiler.formats import cpu as cpu_format
from profiler.formats import fabric
from profiler.formats import facts as facts_file
from profiler.formats import record as F
from profiler.formats import steps as step_figures
from profiler.formats.dataset import frame_to_table, read_meta, write_parquet
from profiler.formats.raw import (
    RawFile,
    read_agg,
    read_header,
    read_raw,
    read_sidecar,
    read_tensor_names,
    writer_state,
)
from profiler.formats.rows import agg_to_frame, comm_table, raw_to_frame, track_table
from profiler.layout import agg_parquet_path, agg_path_for, meta_path, parquet_path
from profiler.postjob.classify import classify


def comm_total_ns(df: pd.DataFrame) -> int:
    """This rank's time in communication calls (host rows; no set-up calls, no
    application rows).  The rank that arrives last waits least: trace.json's
    event window uses this to show likely stragglers without reading records."""
    if not len(df) or "op" not in df.columns:
        return 0
    mask = (df["backend"] != "app").to_numpy(dtype=bool) & ~df["op"].isin(
        sorted(F.LIFECYCLE_OPS)).to_numpy(dtype=bool)
    if "device" in df.columns:
        mask = mask & ~df["device"].to_numpy(dtype=bool)
    return int(df["dur_ns"].to_numpy()[mask].sum())


def step_totals(df: pd.DataFrame) -> dict[str, Any]:
    """This rank's steps (op "step" rows; count = images): how many, how many
    carried images (warm-up steps carry 0), images, seconds, the batch size
    (the most common images per step), and, over its steady steps
    (profiler.formats.steps: what the job's step time and images/sec come
    from), steady_steps, steady_images, steady_ns and its own images/sec."""
    if not len(df) or "op" not in df.columns:
        return {"steps": 0}
    st = df.loc[(df["op"] == "step").to_numpy(dtype=bool)]
    timed = st.loc[st["count"].to_numpy() > 0]
    out: dict[str, Any] = {"steps": int(len(st)), "timed_steps": int(len(timed))}
    if len(timed):
        images = int(timed["count"].sum())
        seconds = float(timed["dur_ns"].sum()) / 1e9
        out.update(images=images, seconds=seconds,
                   batch_size=int(timed["count"].mode().iloc[0]))
    if len(st):
        # numbered as the analysis numbers them (throughput.steps)
        if "step" in st.columns and (st["step"].to_numpy() >= 0).all():
            num = st["step"].to_numpy(dtype=np.int64)
        elif "seq" in st.columns:
            num = st["seq"].to_numpy(dtype=np.int64)
        else:
            num = np.arange(len(st), dtype=np.int64)
        t = step_figures.rank_totals(num,
                                     st["t_start_ns"].to_numpy(dtype=np.int64),
                                     st["t_end_ns"].to_numpy(dtype=np.int64),
                                     st["count"].to_numpy(dtype=np.int64))
        ips = step_figures.images_per_s(t)
        out.update(steady_steps=t.rank_steps, steady_images=t.images, steady_ns=t.rank_ns,
                   images_per_sec=ips if ips == ips and t.images > 0 else None)
    return out


def cpu_doc(raw: RawFile, df: pd.DataFrame, tracks: Sequence[Mapping[str, Any]],
            facts: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The rank's ``cpu`` block (profiler.formats.cpu): the library's sidecar,
    plus, from the rank's own facts at its exit, torch's intra-op threads and
    OMP_NUM_THREADS."""
    rows = int((df["op"] == "cpu").sum()) if len(df) and "op" in df.columns else 0
    doc = cpu_format.rank_doc(raw.path, raw.header, tracks, rows=rows)
    if doc is not None and facts is not None and facts.get("own"):
        doc["torch_threads"] = facts.get("torch_threads")
        doc["omp_num_threads"] = facts.get("omp_num_threads")
    return doc


def rank_metadata(raw: RawFile, df: pd.DataFrame, *,
                  agg: pd.DataFrame | None = None,
                  problems: Sequence[str] = (),
                  facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ranks/rank-R.json document.  facts: what is known of the rank's
    process beyond its files: {"environ", "argv", "executable"} (from /proc,
    profiler.postjob.atexit.process_info) and, when the rank gathered them
    itself at its exit ("own": True, profiler.collect.facts), its self-cost,
    GPUs, live NCCL state, interface kinds and threads.  None: none known.

    calls = per-call rows (application rows excluded) + summary-mode aggregated calls.
    cpu: the rank's CPUs, load and threads (cpu_doc)."""
    st = raw.path.stat()
    ap = agg_path_for(raw.path)
    ast = ap.stat() if ap.is_file() else None
    per_call = int((df["backend"] != "app").sum()) if len(df) else 0
    aggregated = int(agg["calls"].sum()) if agg is not None and len(agg) else 0
    mode = F.MODES.get(int(raw.header.get("mode", 0)), "unknown")
    tracks = track_table(raw)
    f: Mapping[str, Any] = facts or {}
    return {
        "rank": raw.rank,
        "profiler_version": __version__,
        "format_version": F.FORMAT_VERSION,
        "header": raw.header,
        "host": raw.header["hostname"],
        "comms": comm_table(raw),
        "tracks": tracks,
        "calls": per_call + aggregated,
        "steps": step_totals(df),
        "steps_marked_by": f.get("steps_marked_by"),
        "totals": {"comm_ns": comm_total_ns(df)},
        "rows": len(df),
        "mode": mode,
        "aggregated_calls": aggregated,
        "unsampled_calls": int(raw.header.get("unsampled_calls", 0)),
        "aggregates": (agg_parquet_path(".", raw.rank).name if agg is not None else None),
        "problems": [*raw.problems, *problems],
        "tensor_names": read_tensor_names(raw.path),
        "tensors_not_recorded": f.get("tensors_not_recorded"),
        "self_cost": f.get("self_cost"),
        "gpus": list(f.get("gpus") or []),
        "nccl": read_sidecar(raw.path) or f.get("nccl"),
        "interconnect": fabric.rank_doc(raw.path, kinds=f.get("interface_kinds")),
        "cpu": cpu_doc(raw, df, tracks, facts),
        "env": facts_file.env_whitelist(f["environ"]) if "environ" in f else None,
        "argv": list(f["argv"]) if "argv" in f else None,
        "executable": f.get("executable"),
        "parquet": parquet_path(".", raw.rank).name,
        "source": {
            "raw": f"raw/{raw.path.name}",
            "raw_size": st.st_size,
            "raw_mtime_ns": st.st_mtime_ns,
            "state": raw.state,
            "n_chunks": int(raw.header["n_chunks"]),
            "agg_size": ast.st_size if ast else None,
            "agg_mtime_ns": ast.st_mtime_ns if ast else None,
            "converted_by": ("self" if f.get("own") and not f.get("written_before_gather")
                             else f"pid {os.getpid()} on {socket.gethostname()}"),
            "converted_at": time.time(),
        },
    }


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@dataclass
class Converted:
    rank: int
    parquet: Path
    meta: Path
    calls: int
    rows: int
    complete: bool
    problems: list[str]


def convert_raw(path: str | os.PathLike[str], profile_dir: str | os.PathLike[str] | None = None,
                *, facts: Mapping[str, Any] | None = None) -> Converted:
    """raw/rank-R.hvprof -> ranks/rank-R.parquet + ranks/rank-R.json.
    facts: see rank_metadata."""
    raw = read_raw(path)
    if facts is None:  # a rank whose files were gathered: what it wrote before they left
        facts = facts_file.read(path)
    base = Path(profile_dir) if profile_dir is not None else Path(path).resolve().parent.parent
    df = raw_to_frame(raw, classify)
    agg_df, problems = None, []
    if int(raw.header.get("mode", 0)) == F.MODE_SUMMARY:
        ap = agg_path_for(path)
        if ap.is_file():
            agg = read_agg(ap)
            agg_df = agg_to_frame(agg, raw, classify)
            problems = list(agg.problems)
        else:
            problems = ["summary mode, but no aggregate file (killed before its first "
                        "snapshot?)"]
    meta = rank_metadata(raw, df, agg=agg_df, problems=problems, facts=facts)
    pq_out = parquet_path(base, raw.rank)
    js_out = meta_path(base, raw.rank)
    pq_out.parent.mkdir(parents=True, exist_ok=True)
    table = frame_to_table(df)
    if agg_df is not None:
        agg_table = frame_to_table(agg_df)
        _atomic_write(agg_parquet_path(base, raw.rank),
                      lambda p: pq.write_table(agg_table, p, compression="zstd"))
    _atomic_write(pq_out, lambda p: write_parquet(table, p))
    _atomic_write(js_out, lambda p: p.write_bytes(
        orjson.dumps(meta, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)))
    return Converted(rank=raw.rank, parquet=pq_out, meta=js_out, calls=meta["calls"],
                     rows=len(df), complete=raw.complete, problems=meta["problems"])


def is_up_to_date(raw: str | os.PathLike[str],
                  profile_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when the raw file's parquet + json exist and describe its current state."""
    rp = Path(raw)
    base = Path(profile_dir) if profile_dir is not None else rp.resolve().parent.parent
    try:
        header = read_header(rp)
        rank = int(header["rank"])
        if not parquet_path(base, rank).is_file():
            return False
        src = read_meta(meta_path(base, rank)).get("source", {})
        st = rp.stat()
        ap = agg_path_for(rp)
        ast = ap.stat() if ap.is_file() else None
    except Exception:
        return False
    if (src.get("agg_size"), src.get("agg_mtime_ns")) != (
            (ast.st_size, ast.st_mtime_ns) if ast else (None, None)):
        return False
    if writer_state(header) == "running":
        return False  # still being written: any conversion is a snapshot
    return (src.get("raw_size") == st.st_size and src.get("state") == header["state"]
            and src.get("n_chunks") == header["n_chunks"]
            and src.get("raw_mtime_ns") == st.st_mtime_ns)
