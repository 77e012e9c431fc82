"""CPU contention, measured directly: the job's threads waiting on a run queue
for a core (Linux schedstat, read by the library at the boundaries of the steps
it samples, every step of the first 64 and then one in HOROVOD_PROFILE_CPU, for
each thread that recorded: the "cpu" rows, and for every thread of the process
at start and exit: the ranks' ``cpu`` metadata).  Every figure here is over the
steps read.

The per-step rows carry, for the main (compute) thread and Horovod's background
thread, the nanoseconds on a CPU (``bytes``) and waiting for one (``count``)
in the step.  A thread that waits for a core is not computing and not
communicating: the main thread's wait sits inside the step's compute part, the
background thread's wait delays Horovod's cycle and its transfers, and both
make the ranks' arrival times vary (the waiting between ranks).

Horovod 0.28's synchronize stays runnable while it waits for its handles
(its wait loop yields the CPU instead of sleeping), so the main thread's
run-queue time inside synchronize (the "sync" row's count) is not
contention: it is taken out.  The finding's figure is what it explains: the
main thread's run-queue wait per step outside synchronize (part
``compute``), averaged over ranks.  It is claimed when the compute
or the background thread waits for a core a share of its time that an
uncontended thread does not (UNCONTENDED_SHARE), and the figure clears the
noise floor.  It says how many busy threads share how many cores.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiler.units import fmt_ms, fmt_share

from .base import MIN_STEPS, Context, Finding, bootstrap_mean

#: A thread waiting for a core less than this share of its time is not contended
#: (a thread alone on its core waits well under 1%; wake-ups cost a little).
UNCONTENDED_SHARE = 0.05
#: A thread on a CPU at least this share of the run counts as busy.
BUSY_SHARE = 0.10

NULL = (f"an uncontended thread: run-queue waits under {UNCONTENDED_SHARE:.0%} of its time "
        "(a thread alone on its core waits well under 1%)")


def cpu_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The per-step schedstat rows: rank, step, kind (thread_kind), tid, run_ns,
    wait_ns, interval_ns."""
    cols = ["rank", "step", "kind", "tid", "run_ns", "wait_ns", "interval_ns"]
    if "op" not in df.columns:
        return pd.DataFrame({c: [] for c in cols})
    c = df.loc[(df["op"].astype(str) == "cpu").to_numpy()]
    if c.empty:
        return pd.DataFrame({c: [] for c in cols})
    return pd.DataFrame({
        "rank": c["rank"].to_numpy(dtype=np.int64),
        "step": c["seq"].to_numpy(dtype=np.int64),
        "kind": (c["thread_kind"].astype(str).to_numpy() if "thread_kind" in c.columns
                 else np.full(len(c), "other")),
        "tid": c["tid"].to_numpy(dtype=np.int64) if "tid" in c.columns else -1,
        "run_ns": c["bytes"].to_numpy(dtype=np.float64),
        "wait_ns": c["count"].to_numpy(dtype=np.float64),
        "interval_ns": (c["t_end_ns"] - c["t_start_ns"]).to_numpy(dtype=np.float64),
    })


def main_split(ctx: Context) -> dict[str, pd.DataFrame]:
    """The main thread's time outside synchronize, per step (rows) and rank
    (columns), ms, in three parts: "run" (on a CPU), "wait" (on a run queue)
    and "blocked" (neither: I/O, a lock, a sleep).  The main thread's "cpu"
    rows less the same steps' sync figures (_sync_cpu): only the steps whose
    CPU figures were read (HOROVOD_PROFILE_CPU samples them: a sync row
    elsewhere carries none).  Empty tables without "cpu" rows."""
    parts = ("run", "wait", "blocked")
    rows = cpu_rows(ctx.df)
    rows = rows.loc[rows["kind"] == "main"]
    if rows.empty:
        return {p: pd.DataFrame() for p in parts}
    t = rows.groupby(["step", "rank"])[["run_ns", "wait_ns", "interval_ns"]].sum()
    sync = _sync_cpu(ctx)
    if len(sync):
        t = t.join(sync, how="left").fillna(0.0)
        t["run_ns"] -= t["sync_run_ns"]
        t["wait_ns"] -= t["sync_wait_ns"]
        t["interval_ns"] -= t["sync_ns"]
    t["blocked_ns"] = (t["interval_ns"] - t["run_ns"] - t["wait_ns"]).clip(lower=0.0)
    return {p: (t[f"{p}_ns"] / 1e6).unstack("rank").dropna() for p in parts}


def cpu_waits(ctx: Context) -> pd.DataFrame:
    """Per step (rows) and rank (columns): the main thread's run-queue delay in
    that step outside synchronize, ms (main_split's "wait")."""
    return main_split(ctx)["wait"]


def _sync_cpu(ctx: Context) -> pd.DataFrame:
    """Per (step, rank): the main thread's time in synchronize, and its time on
    a CPU and on a run queue there (the "sync" rows' duration, bytes, count)."""
    df = ctx.df
    if "op" not in df.columns:
        return pd.DataFrame()
    s = df.loc[(df["op"].astype(str) == "sync").to_numpy()]
    if s.empty:
        return pd.DataFrame()
    out = pd.DataFrame({"step": s["seq"].to_numpy(dtype=np.int64),
                        "rank": s["rank"].to_numpy(dtype=np.int64),
                        "sync_run_ns": s["bytes"].to_numpy(dtype=np.float64),
                        "sync_wait_ns": s["count"].to_numpy(dtype=np.float64),
                        "sync_ns": (s["t_end_ns"] - s["t_start_ns"]).to_numpy(
                            dtype=np.float64)})
    return out.groupby(["step", "rank"]).sum()


def _threads(meta: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every rank's threads at exit (run, wait and kind), and the host figures:
    CPUs per host, ranks per host, the cores the job's ranks may use on a host
    (the union of their affinities: two ranks bound to a core each have two),
    torch threads."""
    threads: list[dict[str, Any]] = []
    hosts: dict[str, int] = {}
    cores: list[int] = []
    allowed: dict[str, set[int]] = {}
    torch_threads: list[int] = []
    for r in meta.get("ranks") or []:
        if not isinstance(r, dict):
            continue
        hosts[str(r.get("host", ""))] = hosts.get(str(r.get("host", "")), 0) + 1
        cpu = r.get("cpu")
        if not isinstance(cpu, dict):
            continue
        if isinstance(cpu.get("host_cpus"), int):
            cores.append(int(cpu["host_cpus"]))
        if isinstance(cpu.get("affinity"), list):
            allowed.setdefault(str(r.get("host", "")), set()).update(
                c for c in cpu["affinity"] if isinstance(c, int))
        if isinstance(cpu.get("torch_threads"), int):
            torch_threads.append(int(cpu["torch_threads"]))
        for t in cpu.get("threads") or []:
            if not isinstance(t, dict):
                continue
            end, start = t.get("end") or {}, t.get("start") or {}
            if not isinstance(end, dict) or "cpu_ns" not in end:
                continue
            run = float(end.get("cpu_ns") or 0) - float((start or {}).get("cpu_ns") or 0)
            wait = float(end.get("wait_ns") or 0) - float((start or {}).get("wait_ns") or 0)
            threads.append({"rank": r.get("rank"), "kind": str(t.get("kind") or "other"),
                            "run_ns": max(run, 0.0), "wait_ns": max(wait, 0.0)})
    loads = [float(r["cpu"]["loadavg_end"][0]) for r in meta.get("ranks") or []
             if isinstance(r, dict) and isinstance(r.get("cpu"), dict)
             and isinstance(r["cpu"].get("loadavg_end"), list) and r["cpu"]["loadavg_end"]]
    info = {"ranks_per_host": max(hosts.values()) if hosts else 0,
            "host_cpus": min(cores) if cores else 0,
            "job_cores": min(len(c) for c in allowed.values()) if allowed else 0,
            "torch_threads": max(torch_threads) if torch_threads else 0,
            "loadavg": max(loads) if loads else float("nan")}
    return threads, info


def analyze(ctx: Context) -> list[Finding]:
    rows = cpu_rows(ctx.df)
    if rows.empty or ctx.n_steps < MIN_STEPS:
        return []
    rows = rows.loc[rows["step"].isin(ctx.steady["step"])]
    main = rows.loc[rows["kind"] == "main"]
    bg = rows.loc[rows["kind"] == "horovod"]
    if main["step"].nunique() < MIN_STEPS:  # too few steps read for an interval
        return []
    m = main.groupby(["step", "rank"])[["wait_ns", "run_ns", "interval_ns"]].sum()
    sync = _sync_cpu(ctx)
    if len(sync):
        m = m.join(sync, how="left").fillna(0.0)
        m["wait_ns"] = (m["wait_ns"] - m["sync_wait_ns"]).clip(lower=0.0)
        m["interval_ns"] = (m["interval_ns"] - m["sync_ns"]).clip(lower=0.0)
    per_step = m["wait_ns"].groupby("step").mean() / 1e6
    mean, lo, hi = bootstrap_mean(per_step.to_numpy())
    main_share = float(m["wait_ns"].sum() / max(m["interval_ns"].sum(), 1.0))

    def run_share(t: pd.DataFrame) -> float:
        tot = float(t["run_ns"].sum() + t["wait_ns"].sum())
        return float(t["wait_ns"].sum()) / tot if tot > 0 else float("nan")

    main_run_share = main_share  # outside synchronize: its time is compute or waiting
    bg_share = run_share(bg) if len(bg) else float("nan")
    threads, info = _threads(ctx.meta)
    wall_ns = float(ctx.steady["wall_ms"].sum()) * 1e6
    details = []
    span = (float(rows.groupby("rank")["interval_ns"].sum().max()) if len(rows) else wall_ns)
    if threads and span > 0:
        t = pd.DataFrame(threads)
        # busy: on a CPU a tenth of the time per rank (exit totals over the run)
        life = t.groupby("rank")["run_ns"].transform("max").clip(lower=1.0)
        busy = t.loc[t["run_ns"] >= BUSY_SHARE * life]
        per_rank = busy.groupby("rank").size()
        n_busy = int(per_rank.max()) if len(per_rank) else 0
        host_busy = n_busy * max(info["ranks_per_host"], 1)
        cores = info["job_cores"] or info["host_cpus"]
        if cores:
            details.append(f"{host_busy} busy threads on {cores} cores per host "
                           f"({info['ranks_per_host']} ranks x {n_busy} threads each"
                           + (f"; torch uses {info['torch_threads']} intra-op threads"
                              if info["torch_threads"] else "") + ").")
            load = info["loadavg"]
            if np.isfinite(load) and load > host_busy + 0.5:
                details.append(f"other processes share the host: its load average was "
                               f"{load:.1f} at the end, more than the job's {host_busy} busy "
                               "threads.")
        others = t.loc[~t["kind"].isin(["main", "horovod"])]
        if len(others) and float(others["run_ns"].sum() + others["wait_ns"].sum()) > 0:
            o = float(others["wait_ns"].sum()) / float(others["run_ns"].sum()
                                                       + others["wait_ns"].sum())
            details.append(f"the job's other threads (intra-op workers, the profiler's) "
                           f"waited {fmt_share(o)} of their run time.")
    bg_txt = (f"Horovod's background thread waited for a core {fmt_share(bg_share)} of its "
              "run time" if np.isfinite(bg_share) else "")
    details.insert(0, f"the compute (main) thread waited on a run queue {fmt_ms(mean)} per step "
                      f"outside synchronize ({fmt_share(main_run_share)} of that time)"
                   + (f"; {bg_txt}" if bg_txt else "") + ".")
    contended = (main_run_share >= UNCONTENDED_SHARE
                 or (np.isfinite(bg_share) and bg_share >= 2 * UNCONTENDED_SHARE))
    significant = contended and ctx.significant(lo)
    if contended:
        details.append("waiting for a core makes each rank's step time vary on its own, and "
                       "the ranks wait for each other and for Horovod's cycle as a result.")
    headline = ("The threads of this job wait for a CPU" if contended else
                "The job's threads seldom wait for a CPU")
    return [Finding(
        key="cpu_contention",
        headline=headline + (f": {fmt_share(main_run_share)} of the compute thread's time"
                             if contended else ""),
        details=details, cost_ms=mean, cost_interval_ms=(lo, hi),
        cost_img_s=ctx.cost_img_s(mean), cost_label="explains",
        confidence=(f"95% interval over {len(per_step)} of {ctx.n_steps} steady steps (those "
                    "read: HOROVOD_PROFILE_CPU; schedstat run-queue delay)"
                    if len(per_step) < ctx.n_steps else
                    f"95% interval over {ctx.n_steps} steady steps (schedstat run-queue delay)"),
        recommendation=("give each rank's threads their own cores: fewer intra-op threads "
                        "(torch.set_num_threads, OMP_NUM_THREADS) leaving one for Horovod's "
                        "thread, fewer ranks per host, or mpirun --bind-to core --map-by "
                        "socket:PE=N; and no other busy processes on the job's cores"
                        if significant else ""),
        check="profiler compare BEFORE AFTER (the breakdown's parts and this finding's share)",
        numbers={"main_wait_ms_per_step": mean, "main_wait_share": main_share,
                 "main_run_share": main_run_share, "horovod_wait_share": bg_share,
                 **info},
        significant=significant, part="compute", null=NULL,
    )]
