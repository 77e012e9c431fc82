"""The job record: one small JSON document per job (docs/guide/site.md).

    python -m profiler.site.record DIR      # at exit (the post-job stage starts it)
    build_record("DIR/trace.json")           # -> dict, validated

Rules:
* Versioned: RECORD_SCHEMA names the kind, SCHEMA_VERSION its version.  A
  reader accepts its own version, reads an older one it knows how to read
  (none yet), and refuses a newer one in one line (`check`).
* Small: kilobytes.  Figures are rounded to 4 significant digits, findings
  keep their headline, cost, interval and remedy (not their details), ops
  (per kind: data, control) their size buckets.
* Figures come from the analysis facade's public methods, never recomputed:
  step time, images/sec, the breakdown and the findings from advise(); the
  histograms from summary(); the interconnect and cost lines from notes().
* Identity from the scheduler's own variables (Slurm, PBS/Torque, LSF,
  Flux), else the host and rank 0's process id.  Settings: only the
  variables in SETTINGS, never the environment at large.
"""

from __future__ import annotations

import os
import pwd
import re
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .schema import (
    RECORD_NAME,
    RECORD_SCHEMA,
    SCHEMA_VERSION,
    RecordError,
    check,
    dumps,
    loads,
    sig4,
    write_atomic,
)

__all__ = ["RECORD_NAME", "RECORD_SCHEMA", "SCHEMA_VERSION", "RecordError", "build_record",
           "check", "dumps", "identity", "loads", "node_hours_lost", "record_job",
           "record_of", "sig4", "write_atomic"]

#: Horovod's (and NCCL's) tuning variables a record keeps, when the job set them;
#: nothing else of the environment (it may hold secrets).
SETTINGS = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY",
            "HOROVOD_AUTOTUNE", "HOROVOD_HIERARCHICAL_ALLREDUCE",
            "HOROVOD_HIERARCHICAL_ALLGATHER", "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS",
            "HOROVOD_GPU_OPERATIONS", "HOROVOD_NUM_NCCL_STREAMS",
            "HOROVOD_MPI_THREADS_DISABLE", "HOROVOD_BATCH_D2D_MEMCOPIES",
            "HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_ELASTIC", "HOROVOD_PROFILE",
            "NCCL_ALGO", "NCCL_PROTO", "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE")

#: (scheduler, id, name, user, partition) variables, first match wins
SCHEDULERS = (
    ("slurm", "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_USER", "SLURM_JOB_PARTITION"),
    ("pbs", "PBS_JOBID", "PBS_JOBNAME", "PBS_O_LOGNAME", "PBS_QUEUE"),
    ("lsf", "LSB_JOBID", "LSB_JOBNAME", "LSFUSERNAME", "LSB_QUEUE"),
    ("flux", "FLUX_JOB_ID", "FLUX_JOB_NAME", "", "FLUX_QUEUE"),
)
#: the breakdown's parts that count as communication, and as waiting for other ranks
COMM_PARTS = ("transfer", "horovod")
WAIT_PARTS = ("wait_ranks",)
MAX_FINDINGS = 12
MAX_TEXT = 300  # characters of a headline or remedy


def _text(s: Any) -> str:
    s = " ".join(str(s or "").split())
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT - 1] + "…"


def _iso(ns: float | None) -> str | None:
    if not ns:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="seconds")


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def identity(environ: Mapping[str, str], meta: Mapping[str, Any]) -> dict[str, Any]:
    """Who and what the job is: the scheduler's variables, else the host and
    rank 0's process; the name falls back to the script's file name."""
    ranks = meta.get("ranks") or [{}]
    r0 = next((r for r in ranks if r.get("rank") == 0), ranks[0])
    command = meta.get("command") or []
    script = ""
    for arg in command:  # the first argument that is a file name (python -m x: the module)
        if arg and not str(arg).startswith("-"):
            script = os.path.basename(str(arg))
            break
    user = _user()
    sched, job_id, name, partition = "none", f"{r0.get('host', '')}-{r0.get('pid', '')}", \
        script, ""
    found = next((s for s in SCHEDULERS if environ.get(s[1])), None)
    if found is not None:
        sched, v_id, v_name, v_user, v_part = found
        job_id = environ[v_id]
        name = environ.get(v_name) or script
        user = (environ.get(v_user) or user) if v_user else user
        partition = environ.get(v_part, "") if v_part else ""
    run = str(meta.get("job_id") or "")  # the profiler's own id of this run (one per mpirun)
    rid = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{sched}-{job_id}-{run}")[:200]
    return {"id": rid, "scheduler": sched, "job_id": _text(job_id), "name": _text(name),
            "user": _text(user), "partition": _text(partition), "script": _text(script),
            "host": str(r0.get("host", "")), "pid": r0.get("pid"), "run": run}


def _versions(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The framework as the analysis names it (what marked the steps, else the
    ranks' torch threads; "" when unknown); versions of the installed
    distributions of this interpreter (the job's: the exit merge runs the
    interpreter the package was built with); MPI and NCCL from the trace."""
    from importlib.metadata import PackageNotFoundError, version

    def dist(*names: str) -> str:
        for n in names:
            try:
                return version(n)
            except PackageNotFoundError:
                continue
        return ""

    from profiler.analysis import remedies

    framework = remedies.framework(meta)  # the analysis's one definition
    framework = "" if framework == remedies.UNKNOWN else framework
    nccl = sorted({int((r.get("nccl") or {}).get("nccl_version") or 0)
                   for r in meta.get("ranks") or []} - {0})
    return {"framework": framework,
            "torch": dist("torch") if framework != "tensorflow" else "",
            "tensorflow": dist("tensorflow", "tensorflow-cpu") if framework != "pytorch" else "",
            "horovod": dist("horovod"), "python": ".".join(map(str, sys.version_info[:3])),
            "mpi": _text(meta.get("mpi_version") or ""),
            "nccl": ".".join(str(v) for v in (nccl[-1] // 10000, nccl[-1] // 100 % 100,
                                               nccl[-1] % 100)) if nccl else "",
            "profiler": str(meta.get("profiler_version") or "")}


def _ops(summary: Any) -> list[dict[str, Any]]:
    """Per kind (data, control) and operation: calls, bytes, time and its size
    buckets (calls, bytes, latency p50/p95/max), from the facade's summary
    table.  Kept apart because Horovod's negotiation runs on the same
    operations as its data (MPI_Allreduce of the response cache's bits)."""
    out: list[dict[str, Any]] = []
    if summary is None or len(summary) == 0:
        return out
    for (kind, op), g in summary.groupby(["kind", "op"], sort=True, observed=True):
        buckets = [{"bucket": str(b["bucket"]), "calls": int(b["calls"]),
                    "bytes": int(b["total_bytes"]), "p50_us": sig4(b["p50_us"]),
                    "p95_us": sig4(b["p95_us"]), "max_us": sig4(b["max_us"])}
                   for b in g.to_dict(orient="records")]
        out.append({"op": str(op), "kind": str(kind), "calls": int(g["calls"].sum()),
                    "bytes": int(g["total_bytes"].sum()),
                    "time_ms": sig4(float(g["total_us"].sum()) / 1e3), "buckets": buckets})
    return out


def _findings(advice: Any) -> list[dict[str, Any]]:
    out = []
    for f in advice.findings[:MAX_FINDINGS]:
        iv = f.cost_interval_ms
        out.append({"key": f.key, "kind": f.kind, "headline": _text(f.headline),
                    "part": f.part, "cost_ms": sig4(f.cost_ms),
                    "cost_interval_ms": [sig4(iv[0]), sig4(iv[1])] if iv else None,
                    "significant": bool(f.significant), "cost_label": f.cost_label,
                    "remedy": _text(f.recommendation)})
    return out


def _breakdown(advice: Any) -> list[dict[str, Any]]:
    bd = advice.breakdown
    if bd is None or len(bd) == 0:
        return []
    return [{"part": str(r["part"]), "ms": sig4(r["ms"]), "lo_ms": sig4(r["lo_ms"]),
             "hi_ms": sig4(r["hi_ms"]), "share": sig4(r["share"])}
            for r in bd.to_dict(orient="records")]


def node_hours_lost(node_hours: float, breakdown: list[dict[str, Any]]
                    ) -> tuple[float | None, float | None]:
    """Node-hours lost to communication (COMM_PARTS) and to waiting for other
    ranks (WAIT_PARTS): the job's node-hours times those parts' share of the
    step (None without a breakdown)."""
    parts = {p["part"]: p for p in breakdown}

    def lost(names: tuple[str, ...]) -> float | None:
        shares = [parts[n]["share"] for n in names if n in parts and parts[n]["share"] is not None]
        return sig4(node_hours * max(sum(shares), 0.0)) if shares else None

    return lost(COMM_PARTS), lost(WAIT_PARTS)


def build_record(trace: str | os.PathLike[str],
                 environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The record of the job whose trace (or profile directory) is `trace`."""
    from profiler.analysis.facade import TraceAnalysis

    environ = os.environ if environ is None else environ
    ta = TraceAnalysis.open(trace)
    meta: dict[str, Any] = dict(ta.meta or {})
    advice = ta.advise()
    head = advice.header
    env = meta.get("env") or {}
    clock = meta.get("clock") or {}
    start_ns = clock.get("cal0_realtime_ns")
    created = meta.get("created")
    end = (datetime.fromisoformat(created) if created else datetime.now(timezone.utc))
    start = (datetime.fromtimestamp(start_ns / 1e9, tz=timezone.utc) if start_ns else end)
    duration_s = max((end - start).total_seconds(), 0.0)
    hosts = sorted(str(h) for h in meta.get("hosts") or [])
    breakdown = _breakdown(advice)
    node_hours = duration_s / 3600.0 * max(len(hosts), 1)
    comm, wait = node_hours_lost(node_hours, breakdown)
    ic = meta.get("interconnect") or {}
    transports = sorted({str(p.get("transport")) for p in ic.get("pairs") or []
                         if p.get("transport")})
    cost = meta.get("self_cost") or {}
    rec: dict[str, Any] = {
        "schema": RECORD_SCHEMA, "schema_version": SCHEMA_VERSION,
        "job": identity(environ, meta),
        "start": start.isoformat(timespec="seconds"), "end": end.isoformat(timespec="seconds"),
        "duration_s": sig4(duration_s),
        "hosts": hosts, "ranks": int(head.get("ranks") or meta.get("world_size") or 0),
        "mode": str(meta.get("mode") or ""),
        "versions": _versions(meta),
        "settings": {k: _text(env[k]) for k in SETTINGS if k in env},
        "steps": int(head.get("steps") or 0), "step_ms": sig4(head.get("step_ms")),
        "images_per_s": sig4(head.get("images_per_s")),
        "breakdown": breakdown,
        "node_hours": sig4(node_hours),
        "node_hours_comm": comm, "node_hours_wait": wait,
        "findings": _findings(advice),
        "ops": _ops(ta.summary(("kind", "op", "bucket"))),
        "interconnect": {"transports": transports, "line": _text(" ".join(
            n for n in ta.notes() if n.startswith("interconnect")))},
        "self_cost": {"total_ms": sig4((cost.get("total_ns") or 0) / 1e6),
                      "cpu_share_max": sig4(cost.get("cpu_share_max")),
                      "step_share_max": sig4(cost.get("step_share_max"))},
        "dropped": int(sum(int(r.get("dropped") or 0) for r in meta.get("ranks") or [])),
        "trace": os.path.abspath(os.fspath(ta.path)),
    }
    return check(rec)


def record_of(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """A profile directory's record: the one written beside it at exit, else one
    built now from its trace.json (`profiler jobs ingest`)."""
    d = Path(directory)
    rp = d / RECORD_NAME
    return loads(rp.read_bytes(), str(rp)) if rp.exists() else build_record(d / "trace.json")


def say(message: str) -> None:
    from profiler.errors import printable

    sys.stderr.write("horovod-profiler: " + printable(" ".join(message.split())) + "\n")
    sys.stderr.flush()


def record_job(directory: str | os.PathLike[str], store_url: str | None = None,
               environ: Mapping[str, str] | None = None) -> int:
    """Build the record of the profile in `directory`, write it beside the
    profile, then into the store (HOROVOD_PROFILE_STORE) when one is named.
    Every failure is one line; the record beside the profile is what a later
    `profiler jobs ingest DIR` loads.  Returns 0, or 2 when no record could
    be made at all."""
    environ = os.environ if environ is None else environ
    d = Path(directory)
    trace = d / "trace.json"
    beside = d / RECORD_NAME
    try:
        rec = build_record(trace, environ)
        write_atomic(beside, dumps(rec), 0o644)
    except Exception as exc:  # noqa: BLE001 - one line, the job's exit untouched
        say(f"no job record for {d}: {_one_line(exc)}")
        return 2
    url = store_url if store_url is not None else environ.get("HOROVOD_PROFILE_STORE", "")
    if url:
        from .store import open_store

        try:
            open_store(url).put(rec)
        except Exception as exc:  # noqa: BLE001 - any store failure: one line, record kept
            say(f"job record kept at {beside}, not stored: {_one_line(exc)}; load it later "
                f"with: profiler jobs ingest {d}")
    return 0


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        say("usage: python -m profiler.site.record DIR")
        return 2
    return record_job(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
