"""Merge a profile directory into trace.json (+ the parquet dataset it names).

Used by `profiler merge DIR` (after the fact, e.g. for a crashed job) and by
rank 0 at exit (profiler.collect.activate).  Steps:

1. every raw file lacking an up-to-date parquet is converted;
2. the world size comes from the raw headers (or the rank metadata); ranks
   with no file are *missing*; ranks whose raw header is neither FINALIZED nor
   CLOSED (killed mid-run) are *partial*: their records up to the kill are kept;
3. trace.json is written from the per-rank parquet files and metadata.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiler.errors import EmptyProfileError, ProfilerError
from profiler.formats import cpu as cpu_format
from profiler.formats import record as F
from profiler.formats import steps as step_figures
from profiler.formats.fabric import job_doc as job_interconnect
from profiler.layout import check_profile_dir, format_ranges, rank_files
from profiler.postjob.epochs import block as elastic_epochs

NO_FILE_GRACE_S = 5.0


@dataclass
class MergeResult:
    trace: Path
    ranks: list[int]
    world_size: int
    calls: int
    missing_ranks: list[int]
    partial_ranks: list[int]
    converted: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    mode: str = "full"
    unsampled: int = 0
    dropped: int = 0
    dropped_ranks: list[int] = field(default_factory=list)
    gathered: dict[str, Any] | None = None  # profiler.postjob.gather.job_block

    def summary_line(self) -> str:
        """`<dir>/trace.json (N ranks, M calls[; missing ranks: ...][; partial ranks: ...])`."""
        extra = ""
        if self.mode != "full":
            extra += f"; {self.mode} mode: calls aggregated"
        if self.unsampled:
            extra += f"; {self.unsampled} calls not sampled"
        if self.dropped:
            extra += (f"; {self.dropped} records dropped (disk full or write error) on "
                      f"rank(s) {format_ranges(self.dropped_ranks)}")
        if self.gathered:
            g = self.gathered
            over = "MPI" if g["over"] == "mpi" else "TCP"
            extra += (f"; rank(s) {format_ranges(g['ranks'])} gathered from "
                      f"{len(g['hosts'])} other host(s) over {over}")
        if self.missing_ranks:
            extra += f"; missing ranks: {format_ranges(self.missing_ranks)}"
        if self.partial_ranks:
            extra += f"; partial ranks (killed): {format_ranges(self.partial_ranks)}"
        return f"{self.trace} ({len(self.ranks)} ranks, {self.calls} calls{extra})"


def convert_pending(profile_dir: Path, *, ranks: Iterable[int] | None = None
                    ) -> tuple[list[int], list[str]]:
    """Convert raw files lacking an up-to-date parquet. Returns (converted, problems)."""
    from profiler.postjob.convert import convert_raw, is_up_to_date

    raws = rank_files(profile_dir, "raw", "hvprof")
    wanted = set(raws) if ranks is None else set(ranks) & set(raws)
    converted: list[int] = []
    problems: list[str] = []
    for r in sorted(wanted):
        if is_up_to_date(raws[r], profile_dir):
            continue
        try:
            c = convert_raw(raws[r], profile_dir)
        except ProfilerError as exc:
            problems.append(f"rank {r}: {exc.line()}")
            continue
        converted.append(r)
        problems.extend(f"rank {r}: {p}" for p in c.problems)
    return converted, problems


def merge(profile_dir: str | os.PathLike[str], *, out: str | os.PathLike[str] | None = None,
          world_size: int | None = None,
          limit: int | None = None) -> MergeResult:
    """Convert what needs converting, then write trace.json.  See module doc."""
    from profiler.formats.dataset import read_meta
    from profiler.formats.raw import read_header
    from profiler.formats.tracejson import now_iso
    from profiler.postjob.window import write_trace

    d = check_profile_dir(profile_dir)
    converted, problems = convert_pending(d)

    raws = rank_files(d, "raw", "hvprof")
    metas = rank_files(d, "ranks", "json", problems)
    parquets = rank_files(d, "ranks", "parquet", problems)
    present = sorted(r for r in metas if r in parquets)
    if not present:
        if raws:
            raise EmptyProfileError(d, "no raw file could be read: " + "; ".join(problems[:3]))
        raise EmptyProfileError(d, "empty profile directory: no raw or parquet files")

    rank_meta: list[dict[str, Any]] = []
    for r in present:
        try:
            rank_meta.append(read_meta(metas[r]))
        except ProfilerError as exc:
            problems.append(f"rank {r}: {exc.line()}")
    rank_meta.sort(key=lambda m: int(m["rank"]))
    present = [int(m["rank"]) for m in rank_meta]
    if not present:
        raise EmptyProfileError(d, "no rank metadata could be read: " + "; ".join(problems[:3]))

    world = world_size or 0
    partial: list[int] = []
    for m in rank_meta:
        h = m["header"]
        world = max(world, int(h.get("world_size", 0)))
        r = int(m["rank"])
        state = int(h.get("state", 0))
        if r in raws:  # the raw header is the authority on how the rank ended
            try:
                state = int(read_header(raws[r])["state"])
            except ProfilerError:
                pass
        if not state & (F.STATE_FINALIZED | F.STATE_CLOSED):
            partial.append(r)
    world = max(world, max(present) + 1)
    missing = [r for r in range(world) if r not in present]

    # paths, not frames: write_trace reads only the ranks its event selection shows
    frames = [parquets[r] for r in present]
    calls = sum(int(m.get("calls", 0)) for m in rank_meta)
    unsampled = sum(int(m.get("unsampled_calls", 0)) for m in rank_meta)
    dropped_by = {int(m["rank"]): int(m["header"].get("dropped_records", 0) or 0)
                  for m in rank_meta}
    trace_path = Path(out) if out is not None else d / "trace.json"
    meta = job_metadata(d, trace_path, rank_meta, world, missing, partial, calls)
    meta["created"] = now_iso()
    meta["problems"] = problems
    from profiler.postjob.selfcost import job_summary

    meta["self_cost"] = job_summary(rank_meta)
    # Horovod's timeline joined with rank 0's records: lineage.parquet, and
    # meta["lineage"] says what was written or why not (never raises).
    from profiler.postjob.lineage import build as build_lineage

    try:
        build_lineage(d, metadata=meta)
    except Exception as exc:  # lineage is an extra: never the reason a merge fails
        meta["lineage"] = {"status": "absent",
                           "reason": "cannot build: " + " ".join(str(exc).split())[:200]}
    # Horovod's timeline as a coarse NCCL source when no path recorded NCCL
    # (rank 0's dataset gains rows with source "timeline"; never raises).
    from profiler.postjob import timeline_nccl

    try:
        meta["nccl_timeline"] = timeline_nccl.add(d, rank_meta, parquets.get(0))
    except Exception as exc:  # an extra, as the lineage
        meta["nccl_timeline"] = {"status": "absent",
                                 "reason": "cannot add: " + " ".join(str(exc).split())[:200]}
    if meta["nccl_timeline"].get("status") == "added":
        import pyarrow.parquet as pq

        m0 = next(m for m in rank_meta if int(m["rank"]) == 0)
        m0["rows"] = int(pq.ParquetFile(parquets[0]).metadata.num_rows)  # the event budget
    meta.update(elastic_epochs(d, parquets))  # elastic Horovod's membership epochs
    from profiler.postjob.gather import job_block

    meta["gathered"] = job_block(d, present)  # ranks whose files came from other hosts
    write_trace(trace_path, meta, frames, rank_meta, limit=limit)
    return MergeResult(trace=trace_path, ranks=present, world_size=world, calls=calls,
                       missing_ranks=missing, partial_ranks=partial, converted=converted,
                       problems=problems, mode=meta["mode"], unsampled=unsampled,
                       dropped=sum(dropped_by.values()),
                       dropped_ranks=sorted(r for r, n in dropped_by.items() if n),
                       gathered=meta["gathered"])


def job_metadata(d: Path, trace_path: Path, rank_meta: list[dict[str, Any]], world: int,
                 missing: list[int], partial: list[int], calls: int) -> dict[str, Any]:
    from profiler._version import __version__
    from profiler.formats.tracejson import TRACE_FORMAT_VERSION
    from profiler.layout import agg_parquet_path, parquet_path

    first = rank_meta[0]
    r0 = next((m for m in rank_meta if int(m["rank"]) == 0), first)
    hosts = sorted({str(m.get("host", "")) for m in rank_meta})
    env = r0.get("env")
    if env is None:
        env = next((m["env"] for m in rank_meta if m.get("env") is not None), {})
    argv = r0.get("argv") or next((m["argv"] for m in rank_meta if m.get("argv")), None)
    base = trace_path.resolve().parent
    files = [os.path.relpath(parquet_path(d, int(m["rank"])).resolve(), base)
             for m in rank_meta]
    aggregates = [os.path.relpath(agg_parquet_path(d, int(m["rank"])).resolve(), base)
                  for m in rank_meta if m.get("aggregates")]
    modes = sorted({str(m.get("mode", "full")) for m in rank_meta})
    ranks = []
    for m in rank_meta:
        h = m["header"]
        ranks.append({
            "rank": int(m["rank"]),
            "host": m.get("host", ""),
            "pid": h.get("pid"),
            "clock": h.get("clock"),
            "ticks_per_ns": h.get("ticks_per_ns"),
            "offset_ns": h.get("offset_ns"),
            "offset_err_ns": h.get("offset_err_ns"),
            "offset_method": h.get("offset_method"),
            "offset_end_ns": h.get("offset_end_ns") if h.get("offset_end_at_ns") else None,
            "offset_end_err_ns": (h.get("offset_end_err_ns") if h.get("offset_end_at_ns")
                                  else None),
            "clock_drift_ppm": _drift(h),
            "calls": m.get("calls", 0),
            "mode": m.get("mode", "full"),
            "aggregated_calls": m.get("aggregated_calls", 0),
            "unsampled_calls": m.get("unsampled_calls", 0),
            "dropped": h.get("dropped_records", 0),
            "state": h.get("state_names", []),
            "thread_level": h.get("thread_level"),
            "local_rank": h.get("local_rank"),
            "problems": m.get("problems", []),
            "nccl": m.get("nccl"),
            "gpus": m.get("gpus"),
            "interconnect": m.get("interconnect"),
            "cpu": cpu_format.trace_block(m.get("cpu")),
        })
    return {
        "format_version": TRACE_FORMAT_VERSION,
        "profiler_version": __version__,
        "command": argv,
        "executable": r0.get("executable"),
        "job_id": f"{int(r0['header'].get('job_id', 0)):#x}",
        "hosts": hosts,
        "world_size": world,
        "ranks": ranks,
        "missing_ranks": missing,
        "partial_ranks": partial,
        "mpi_version": r0["header"].get("mpi_version", ""),
        "clock": {"job_t0_ns": r0["header"].get("job_t0_ns"),
                  "cal0_realtime_ns": r0["header"].get("cal0_realtime_ns"),
                  "axis": "ns since rank 0's MPI_Init return"},
        "env": env,
        "interconnect": job_interconnect(ranks, env),
        # per host, the job's CPUs and who else used them (the noisy neighbour)
        "cpu_hosts": cpu_format.host_view(
            [{"rank": int(m["rank"]), "host": m.get("host", ""), "pid": m["header"].get("pid"),
              "cpu": m.get("cpu")} for m in rank_meta]),
        "mode": modes[0] if len(modes) == 1 else "mixed",
        **_throughput(rank_meta),
        "dataset": {"format": "parquet", "files": files, "calls": calls,
                    "rows": sum(int(m.get("rows", m.get("calls", 0))) for m in rank_meta),
                    "aggregates": aggregates},
    }


def _drift(header: dict[str, Any]) -> float | None:
    from profiler.formats.clock import clock_drift_ppm

    try:
        ppm = clock_drift_ppm(header)
    except (KeyError, TypeError, ValueError):
        return None
    return None if ppm is None else round(ppm, 3)


def _throughput(rank_meta: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's batch size (per rank), step time and images/sec over every
    rank's steady steps (profiler.formats.steps: the one definition, which the
    analysis and the watcher give too), with the integers they come from
    (step_totals); absent when the job marked no steps.  steps_marked_by: what
    marked the steps (profiler.collect.facts)."""
    steps = [m.get("steps") or {} for m in rank_meta]
    marked = sorted({str(m["steps_marked_by"]) for m in rank_meta if m.get("steps_marked_by")})
    per_rank = [_rank_step_totals(s) for s in steps]
    job = step_figures.job_totals(per_rank)
    if job.images <= 0 or job.rank_ns <= 0:
        return {"steps_marked_by": marked} if marked else {}
    batches = sorted({int(s["batch_size"]) for s in steps if s.get("batch_size")})
    return {**({"steps_marked_by": marked} if marked else {}),
            "batch_size": batches[0] if len(batches) == 1 else batches,
            "step_ms": step_figures.step_ms(job),
            "images_per_sec": step_figures.images_per_s(job),
            "step_totals": job.to_dict(),
            "images_per_sec_per_rank": {str(m["rank"]): s.get("images_per_sec")
                                        for m, s in zip(rank_meta, steps)}}


def _rank_step_totals(s: dict[str, Any]) -> step_figures.StepTotals:
    """A rank's steady totals from its metadata's steps block (a block written
    before they were kept: its steps with images)."""
    if "steady_ns" in s:
        n = int(s.get("steady_steps") or 0)
        return step_figures.StepTotals(images=int(s.get("steady_images") or 0),
                                       rank_ns=int(s["steady_ns"] or 0), rank_steps=n, steps=n)
    n = int(s.get("timed_steps") or 0)
    return step_figures.StepTotals(images=int(s.get("images") or 0),
                                   rank_ns=int(round(float(s.get("seconds") or 0.0) * 1e9)),
                                   rank_steps=n, steps=n)


def wait_and_merge(profile_dir: str | os.PathLike[str], *, world_size: int, own_rank: int,
                   timeout: float, poll: float = 0.05,
                   sleep: Callable[[float], None] = time.sleep,
                   receiver: Any = None) -> MergeResult:
    """Rank 0 at exit: wait (bounded) for the other ranks' datasets, then merge.
    A raw file is converted here when its rank will not: it died, or it is
    closed and its header says its rank converts nothing itself (no Python:
    it is complete, converted at once, wherever its process ran), or its
    process ended without leaving its dataset (its own conversion failed).

    It polls the directory (every `poll` s): ranks on other hosts write through
    a shared file system (NFS, Lustre, GPFS), whose changes from another client
    inotify does not report, and MPI is finalized by then, so no message can
    say that a rank is done.  With a `receiver` (profiler.postjob.gather, a
    job without MPI), a rank that has not offered its files yet, or is still
    sending them, is waited for too."""
    from profiler.formats.epochs import sidecar_of
    from profiler.formats.raw import _pid_alive, read_header, writer_state
    from profiler.postjob.convert import is_up_to_date

    d = Path(profile_dir)
    start = time.monotonic()
    deadline = start + max(0.0, timeout)
    # Every rank creates its raw file at MPI_Init, long before anyone exits: a
    # rank whose file is still absent after a short grace is not on this
    # (shared) file system, or never started; waiting longer would not help.
    grace = min(max(0.0, timeout), NO_FILE_GRACE_S)
    pending = set(range(world_size)) - {own_rank}
    done: set[int] = {own_rank}
    while True:
        raws = rank_files(d, "raw", "hvprof")
        # an elastic job's files are per process, numbered past the world size
        # for a worker added later: each one with its epochs sidecar is waited for
        pending |= {n for n, p in raws.items() if sidecar_of(p).is_file()} - done
        if not pending:
            break
        for r in sorted(pending):
            state = receiver.state(r) if receiver is not None else "visible"
            if r not in raws or state == "receiving":
                if state not in (None, "receiving") and time.monotonic() - start >= grace:
                    pending.discard(r)
                continue
            try:
                header = read_header(raws[r])
            except ProfilerError:
                continue
            st = writer_state(header)
            if st == "closed" and is_up_to_date(raws[r], d):
                pending.discard(r)
                done.add(r)
            elif st == "dead" or (st == "closed" and (not header.get("self_converts")
                                                      or _pid_alive(header) is False)):
                # Killed, or exited without leaving its dataset (its own
                # conversion failed: disk full...): it will never convert itself.
                convert_pending(d, ranks=[r])
                pending.discard(r)
                done.add(r)
        if not pending or time.monotonic() >= deadline:
            break
        sleep(poll)
    if pending and time.monotonic() >= deadline:
        print("horovod-profiler: warning: gave up waiting for rank(s) "
              f"{format_ranges(pending)} after {timeout:g} s; merging what is there",
              file=sys.stderr)
    return merge(d, world_size=world_size)
