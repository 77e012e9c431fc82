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

A noisy neighbour (finding ``noisy_neighbour``) is a process outside the job
busy on the job's CPUs.  The merge's per-host view (trace.json's
``cpu_hosts``, profiler.formats.cpu.host_view) gives each CPU's busy share of
the run and the job's own share; the rest is foreign.  The wait it explains
is the part of the ranks' compute-thread run-queue wait (outside
synchronize, per step: main_split) that a conservative rule gives the
foreign processes (neighbour_wait): the wait is split in proportion to who
else ran on the CPUs over the run (the foreign processes' CPU time against
the job's other threads'), and never exceeds the foreign CPU time in the
step's interval.  A rank's CPUs (its affinity) are named when both hold:
processes outside the job took NEIGHBOUR_SHARE of their time, and the ranks'
compute threads, or their Horovod background threads, waited
NEIGHBOUR_WAIT_SHARE of their time because of them (a neighbour that only
takes the time the job leaves idle costs it nothing; one that holds up
Horovod's thread costs the step its negotiation and transfer, as
cpu_contention counts either thread).
The finding names the CPUs, the ranks on them and the busiest foreign
processes there; that wait is left out of cpu_contention, which keeps what
the job's own threads cause: one wait, one cause each.  Its cost is a
counterfactual: each step with the ranks' arrivals moved earlier by that
wait, its last arrival recomputed (breakdown.shifted_gain).  A neighbour on
one rank's core costs the step that rank's lead, not its wait averaged over
the ranks; the late-rank claim on that rank keeps only what the wait leaves
(findings._late_beyond_its_neighbour).

CPU limits in the operating system's terms (the ranks' ``cpu.cgroup``
blocks, hooks/cpu_cgroup.c): ``cpu_quota`` names the ranks a cgroup CPU quota
throttles, with the quota, the periods throttled and the time throttled per
step (cpu.stat at the read steps), and explains the compute thread's wait
beyond the unthrottled ranks' (what it would wait without the quota), at most
the time throttled; ``cpuset`` names the ranks whose cpuset holds fewer CPUs
than their busy threads.  Both are priced like the neighbour (the arrivals
moved earlier; quota: the throttled Horovod thread's share of the phase
after them), and both waits are left out of cpu_contention: it keeps what
the job's own threads cause on CPUs they may all use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profiler.layout import format_ranges
from profiler.units import fmt_ms, fmt_share

from .. import remedies
from .base import MIN_STEPS, Context, Finding, bootstrap_mean

#: A thread waiting for a core less than this share of its time is not contended
#: (a thread alone on its core waits well under 1%; wake-ups cost a little).
UNCONTENDED_SHARE = 0.05
#: A thread on a CPU at least this share of the run counts as busy.
BUSY_SHARE = 0.10

NULL = (f"an uncontended thread: run-queue waits under {UNCONTENDED_SHARE:.0%} of its time "
        "(a thread alone on its core waits well under 1%)")
#: A rank's CPUs shared with processes outside the job at least this share of
#: the run have a noisy neighbour (a free CPU: the host's daemons take ~1%).
NEIGHBOUR_SHARE = 0.10
#: ... and the ranks' compute threads there waited this share of their time
#: for a core because of those processes: twice an uncontended thread's
#: ceiling, since wake-up preemption by other processes alone costs a few
#: percent.
NEIGHBOUR_WAIT_SHARE = 2 * UNCONTENDED_SHARE
#: A foreign process is named when it took at least this share of a CPU.
NAMED_SHARE = 0.02
NEIGHBOUR_NULL = (f"CPUs free of other processes: processes outside the job take under "
                  f"{NEIGHBOUR_SHARE:.0%} of the time of each rank's CPUs, or its compute "
                  f"and Horovod threads wait under {NEIGHBOUR_WAIT_SHARE:.0%} of their time "
                  "because of them")


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


@dataclass
class Neighbour:
    """Processes outside the job busy on some ranks' CPUs (shares of the run
    window, averaged over the CPUs; procs: the foreign processes there,
    busiest first, as in cpu_hosts)."""

    host: str
    cpus: list[int]
    ranks: list[int]
    busy_share: float
    job_share: float
    foreign_share: float
    steal_share: float
    window_ns: float
    procs: list[dict[str, Any]] = field(default_factory=list)
    #: the ranks' compute-thread wait these processes explain, as a share of
    #: the threads' time (the most of the ranks; neighbour_wait)
    wait_share: float = float("nan")
    #: the same for the ranks' Horovod background threads (the steps' mean of
    #: the most of the ranks), and that share per step (_explained_share)
    horovod_share: float = float("nan")
    horovod_by_step: pd.Series = field(default_factory=lambda: pd.Series(dtype=np.float64))

    def where(self) -> str:
        """"CPU 1, where rank 1 runs," (host named with several)."""
        c, r = format_ranges(self.cpus), format_ranges(self.ranks)
        return (f"CPU{'s' if len(self.cpus) > 1 else ''} {c}, where rank"
                f"{'s' if len(self.ranks) > 1 else ''} {r} run{'' if len(self.ranks) > 1 else 's'}")

    def named(self, n: int = 3) -> str:
        """"pid 4242 (stress) 48%, ..." or "" (none took NAMED_SHARE)."""
        return ", ".join(f"pid {p['pid']} ({p['name']}) {fmt_share(p['share'])}"
                         for p in self.procs[:n] if p["share"] >= NAMED_SHARE)


def neighbours(meta: dict[str, Any]) -> list[Neighbour]:
    """The ranks' CPU sets (their affinities) where processes outside the job
    took NEIGHBOUR_SHARE of the time or more (trace.json's cpu_hosts), by the
    CPUs' busy time less the job's, and no more than the foreign processes
    seen there used: the candidates, before their wait is weighed
    (neighbour_wait)."""
    out: list[Neighbour] = []
    hosts = meta.get("cpu_hosts")
    for h in hosts if isinstance(hosts, list) else []:
        if not isinstance(h, dict) or h.get("reason") or not h.get("cpus"):
            continue
        per = {int(c["cpu"]): c for c in h["cpus"] if isinstance(c, dict)}
        groups: dict[tuple[int, ...], list[int]] = {}
        for r in h.get("ranks") or []:
            cpus = tuple(c for c in r.get("cpus") or [] if c in per)
            if not cpus:  # no affinity: the CPUs its threads ran on
                cpus = tuple(sorted(c for c, v in per.items() if r["rank"] in v["ranks"]))
            if cpus:
                groups.setdefault(cpus, []).append(int(r["rank"]))
        for cpus, ranks in sorted(groups.items()):
            def mean(k: str, cs: tuple[int, ...] = cpus,
                     per: dict[int, Any] = per) -> float:
                return float(np.mean([float(per[c][k]) for c in cs]))
            # the claim names processes: what named ones used there bounds it
            # (the busy time no process accounts for -- the kernel's, a thread
            # counted on the CPU it ran last -- is no neighbour)
            procs = [p for p in h.get("foreign") or [] if p.get("cpu") in cpus]
            named = sum(float(p.get("share") or 0.0) for p in procs) / len(cpus)
            foreign = min(mean("foreign_share"), named)
            if foreign < NEIGHBOUR_SHARE:
                continue
            out.append(Neighbour(
                host=str(h.get("host", "")), cpus=list(cpus), ranks=sorted(ranks),
                busy_share=mean("busy_share"), job_share=mean("job_share"),
                foreign_share=foreign, steal_share=mean("steal_share"),
                window_ns=float(h.get("window_ns") or 0), procs=procs))
    return out


def rank_neighbour(ctx: Context, rank: int) -> Neighbour | None:
    """The noisy neighbour claimed on the rank's CPUs, if any."""
    return next((n for n in neighbour_wait(ctx)[1] if rank in n.ranks), None)


def _main_run_wait_ns(meta: dict[str, Any], rank: int) -> tuple[float, float]:
    """The rank's main thread's CPU time and run-queue wait over the run (its
    sidecar figures)."""
    for r in meta.get("ranks") or []:
        if isinstance(r, dict) and r.get("rank") == rank and isinstance(r.get("cpu"), dict):
            for t in r["cpu"].get("threads") or []:
                if t.get("kind") == "main" and isinstance(t.get("end"), dict):
                    start = t.get("start") if isinstance(t.get("start"), dict) else {}
                    return (max(float(t["end"]["cpu_ns"]) - float(start.get("cpu_ns", 0)), 0.0),
                            max(float(t["end"]["wait_ns"]) - float(start.get("wait_ns", 0)),
                                0.0))
    return 0.0, 0.0


def neighbour_wait(ctx: Context) -> tuple[pd.DataFrame, list[Neighbour]]:
    """Per steady step (rows) and rank (columns, every rank with CPU rows): the
    compute thread's run-queue wait outside synchronize (main_split's "wait")
    that the noisy neighbours explain, ms.  The rule, for a rank on CPUs S:

        wait x F / (F + J),  at most  the step's interval x F's share of S x |S|

    F: the foreign CPU time on S over the run, J: the job's own on S less this
    thread's (its other threads, the other ranks there): the wait is shared
    out in proportion to who else ran, and the foreign processes cannot have
    taken more than their CPU time in the step.  Also the neighbours
    claimed (neighbours() whose ranks' wait so explained is
    NEIGHBOUR_WAIT_SHARE of their compute threads' time outside synchronize
    in those steps, without CPU rows of their whole run from the sidecar's
    figures; or of their Horovod threads' time in those steps), each with
    its wait_share and horovod_share.  The table holds their ranks (0 for
    the others); empty without CPU rows or claimed neighbours."""
    found = neighbours(ctx.meta)
    if not found:
        return pd.DataFrame(), []
    split = main_split(ctx)
    wait = split["wait"]
    if ctx.n_steps and not wait.empty:
        wait = wait.loc[wait.index.isin(ctx.steady["step"])]
    interval = (split["run"] + split["wait"] + split["blocked"]).reindex_like(wait)
    out = pd.DataFrame(0.0, index=wait.index, columns=wait.columns)
    claimed = []
    for n in found:
        span = n.window_ns * len(n.cpus)
        shares = []
        for r in n.ranks:
            run_ns, wait_ns = _main_run_wait_ns(ctx.meta, r)
            f = _theirs(n, run_ns / max(span, 1.0))
            if r in wait.columns and len(wait) >= MIN_STEPS:
                cap = interval[r] * n.foreign_share * len(n.cpus)
                out[r] = np.minimum(wait[r] * f, cap)
                shares.append(float(out[r].sum()) / max(float(interval[r].sum()), 1e-9))
            elif run_ns + wait_ns > 0:
                shares.append(wait_ns * f / (run_ns + wait_ns))
        n.wait_share = max(shares) if shares else float("nan")
        n.horovod_by_step = _explained_share(ctx, n, "horovod")
        bg = n.horovod_by_step.loc[n.horovod_by_step.index.isin(wait.index)]
        n.horovod_share = float(bg.mean()) if len(bg) >= MIN_STEPS else float("nan")
        if n.wait_share >= NEIGHBOUR_WAIT_SHARE or n.horovod_share >= NEIGHBOUR_WAIT_SHARE:
            claimed.append(n)
        else:
            out[[r for r in n.ranks if r in out.columns]] = 0.0
    if not claimed:
        return pd.DataFrame(), []
    return out, claimed


def _theirs(n: Neighbour, own_share: float) -> float:
    """Of a thread's wait for a core on the neighbour's CPUs, the part the
    neighbour explains: F / (F + J), F its share of the CPUs' time, J the
    job's own less this thread's (`own_share`, of the same time): a wait
    shared out in proportion to who else ran."""
    return float(min(n.foreign_share / max(n.busy_share - own_share, n.foreign_share, 1e-12),
                     1.0))


def _neighbour_gain(ctx: Context, wait: pd.DataFrame, n: Neighbour
                    ) -> tuple[np.ndarray, float] | None:
    """Per steady step, how much sooner it would end without the neighbour
    (_shifted_cost with its Horovod threads' share), and the second phase's
    mean."""
    return _shifted_cost(ctx, wait, n.horovod_by_step)


def _shifted_cost(ctx: Context, wait: pd.DataFrame, bg_share: pd.Series
                  ) -> tuple[np.ndarray, float] | None:
    """Per steady step, how much sooner it would end without a cause that
    held some ranks' threads off a CPU, in two phases, and the second's mean:

    * before the last arrival: the compute threads' wait it explains (`wait`:
      rows step, columns rank, ms; breakdown.shifted_gain: the ranks'
      arrivals moved earlier by it);
    * after it, Horovod's negotiation and transfer (the breakdown's
      "horovod" and "transfer" parts, the ranks' mean): every rank's
      background thread takes part, so the step waits for the one the
      cause slows most; that phase shortens by `bg_share` (per step: the
      largest share of its time such a thread lost to the cause).

    None where fewer than MIN_STEPS steps have every rank's arrival."""
    from ..breakdown import shifted_gain

    bd = ctx.breakdown
    if bd.empty:
        return None
    gain = shifted_gain(bd, wait)
    gain = gain.loc[gain.index.isin(wait.index)]
    if len(gain) < MIN_STEPS:
        return None
    post = bd.groupby("step")[["horovod_ms", "transfer_ms"]].mean().sum(axis=1)
    after = (post.reindex(gain.index).fillna(0.0)
             * bg_share.reindex(gain.index).fillna(0.0)).to_numpy()
    return gain.to_numpy() + after, float(after.mean())


def _explained_share(ctx: Context, n: Neighbour, kind: str) -> pd.Series:
    """Per step, of the neighbour's ranks' `kind` threads (from their "cpu"
    rows), the largest share of the step's interval the thread waited for a
    core because of the neighbour (its wait x _theirs).  Empty without such
    rows."""
    rows = cpu_rows(ctx.df)
    rows = rows.loc[(rows["kind"] == kind) & rows["rank"].isin(n.ranks)]
    if rows.empty:
        return pd.Series(dtype=np.float64)
    t = rows.groupby(["step", "rank"])[["run_ns", "wait_ns", "interval_ns"]].sum()
    totals = t.groupby("rank")[["run_ns", "interval_ns"]].sum()
    f = {int(r): _theirs(n, float(v["run_ns"]) / max(float(v["interval_ns"]), 1.0) / len(n.cpus))
         for r, v in totals.iterrows()}
    share = (t["wait_ns"] * np.array([f[int(r)] for r in t.index.get_level_values("rank")])
             / t["interval_ns"].clip(lower=1.0)).clip(0.0, 1.0)
    return share.groupby("step").max()


def analyze_neighbour(ctx: Context) -> list[Finding]:
    """noisy_neighbour: one finding per CPU set with a noisy neighbour (module doc)."""
    att, found = neighbour_wait(ctx)
    out = []
    for n in found:
        named = n.named()
        top = next((p for p in n.procs if p["share"] >= NAMED_SHARE), None)
        where = n.where() + (f" on {n.host}" if len({x.host for x in found}) > 1 else "")
        verb = "were" if len(n.cpus) > 1 else "was"
        headline = (f"{where}, {verb} busy {fmt_share(n.foreign_share)} of the time with "
                    "processes outside the job" + (f" ({named})" if named else ""))
        details = [
            f"over the run ({n.window_ns / 1e9:.1f} s), "
            f"{'these CPUs were' if len(n.cpus) > 1 else 'the CPU was'} busy "
            f"{fmt_share(n.busy_share)}: {fmt_share(n.job_share)} the job's own threads and "
            f"processes, {fmt_share(n.foreign_share)} other processes"
            + (f"; the busiest of those: {named} of a CPU (last seen on the job's CPUs)."
               if named else "; no single process stands out (short-lived processes, "
               "or ones the scan could not read).")]
        pl = len(n.ranks) > 1
        details.append(f"the compute thread{'s' if pl else ''} there waited "
                       f"{fmt_share(n.wait_share)} of {'their' if pl else 'its'} time for a "
                       "core because of them"
                       + (f", Horovod's background thread{'s' if pl else ''} "
                          f"{fmt_share(n.horovod_share)} of {'theirs' if pl else 'its'}"
                          if np.isfinite(n.horovod_share) else "") + ".")
        if n.steal_share >= 0.05:
            details.append(f"the hypervisor also took {fmt_share(n.steal_share)} (steal time), "
                           "which no process of this host explains.")
        ranks = [r for r in n.ranks if not att.empty and r in att.columns]
        cost = lo = hi = None
        if ranks and len(att) >= MIN_STEPS:
            own = float(np.nanmean(att[ranks].to_numpy()))
            waited = (f"rank{'s' if len(ranks) > 1 else ''} {format_ranges(ranks)}'s compute "
                      f"thread waited {fmt_ms(own)} per step for a core because of them "
                      "(outside synchronize; its wait shared out by who else ran on the CPU, "
                      "at most their CPU time in the step)")
            got = _neighbour_gain(ctx, att[ranks], n)
            if got is not None:
                gain, after = got
                cost, lo, hi = bootstrap_mean(gain)
                details.append(
                    f"{waited}: without that wait, and without what they cost Horovod's "
                    f"background thread{'s' if len(ranks) > 1 else ''} there after the last "
                    f"rank arrives ({fmt_ms(after)} of its negotiation and transfer), each "
                    f"step would end {fmt_ms(cost)} sooner (arrivals moved earlier, each "
                    "step's last arrival recomputed), the cost above"
                    + (f"; the other ranks wait for {'it' if len(ranks) == 1 else 'them'} "
                       "meanwhile (late_ranks)." if len(ranks) < att.shape[1] else "."))
            else:  # no arrivals to move: their part, averaged over the ranks
                per_step = att[ranks].sum(axis=1) / att.shape[1]
                cost, lo, hi = bootstrap_mean(per_step.to_numpy())
                details.append(f"{waited}: {fmt_ms(cost)} per step averaged over the ranks, "
                               "the cost above (no arrivals to price the step by).")
        significant = cost is not None and lo is not None and ctx.significant(lo)
        rank_txt = format_ranges(n.ranks)
        rec = ""
        if significant:
            rec = ((f"move pid {top['pid']} ({top['name']}) off CPU {format_ranges(n.cpus)} "
                    f"(taskset -a -p -c FREE_CPUS {top['pid']}, or stop it), or move rank"
                    if top else f"find what else runs on CPU {format_ranges(n.cpus)} "
                    "(top, ps -eo pid,psr,pcpu,comm), or move rank")
                   + f"{'s' if len(n.ranks) > 1 else ''} {rank_txt} to free cores (mpirun "
                   "--cpu-set FREE_CPUS --bind-to core); keep other busy processes off the "
                   "job's cores")
        out.append(Finding(
            key="noisy_neighbour", headline=headline, details=details, cost_ms=cost,
            cost_interval_ms=(lo, hi) if cost is not None and lo is not None and hi is not None
            else None,
            cost_img_s=ctx.cost_img_s(cost) if cost is not None else None,
            cost_label="explains",
            confidence=(f"95% interval over {len(att)} steady steps read (schedstat "
                        "run-queue delay; /proc/stat and /proc/<pid>/stat over the run)"
                        if cost is not None else
                        "no per-step CPU rows: the share is measured, its cost in the step is not"),
            recommendation=rec,
            check="profiler compare BEFORE AFTER (this finding's share; late_ranks)",
            numbers={"host": n.host, "cpus": n.cpus, "ranks": n.ranks,
                     "busy_share": n.busy_share, "job_share": n.job_share,
                     "foreign_share": n.foreign_share, "steal_share": n.steal_share,
                     "window_s": n.window_ns / 1e9, "wait_share": n.wait_share,
                     "horovod_share": n.horovod_share,
                     "processes": [{k: p.get(k) for k in ("pid", "name", "cpu", "share")}
                                   for p in n.procs[:5]]},
            significant=significant, part="compute" if cost is not None else "",
            null=NEIGHBOUR_NULL,
            not_claimed="" if cost is not None else "no CPU rows over enough steps to price it",
        ))
    return out


def analyze(ctx: Context) -> list[Finding]:
    fw = remedies.framework(ctx.meta)
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
    # the wait a noisy neighbour, a CPU quota or a narrow cpuset explains is
    # its finding's, not the job's own threads' crowding
    left_out: dict[str, float] = {}
    for name, (att, _) in (("noisy_neighbour", neighbour_wait(ctx)),
                           ("cpu_quota", quota_wait(ctx)), ("cpuset", cpuset_wait(ctx))):
        if att.empty:
            continue
        a = att.stack().rename_axis(["step", "rank"]).reindex(m.index).fillna(0.0) * 1e6
        left_out[name] = float(a.groupby("step").mean().mean()) / 1e6
        m["wait_ns"] = (m["wait_ns"] - a).clip(lower=0.0)
    foreign_ms = left_out.get("noisy_neighbour", 0.0)
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
                           + (f"; {remedies.threads_detail(fw, info['torch_threads'])}"
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
                      f"outside {remedies.sync_name(fw)} ({fmt_share(main_run_share)} of that "
                      "time)"
                   + (f"; {bg_txt}" if bg_txt else "") + ".")
    if foreign_ms > 0:
        details.append(f"{fmt_ms(foreign_ms)} per step more of the compute threads' wait is "
                       "processes outside the job on their CPUs (noisy_neighbour), left out "
                       "here.")
    for name, what in (("cpu_quota", "their cgroup's CPU quota throttling them"),
                       ("cpuset", "their cgroup's cpuset, narrower than their threads")):
        if left_out.get(name, 0.0) > 0:
            details.append(f"{fmt_ms(left_out[name])} per step more of the compute threads' "
                           f"wait is {what} ({name}), left out here.")
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
                        f"({remedies.threads_remedy(fw)}) leaving one for Horovod's "
                        "thread, fewer ranks per host, or mpirun --bind-to core --map-by "
                        "socket:PE=N; and no other busy processes on the job's cores"
                        if significant else ""),
        check="profiler compare BEFORE AFTER (the breakdown's parts and this finding's share)",
        numbers={"main_wait_ms_per_step": mean, "main_wait_share": main_share,
                 "main_run_share": main_run_share, "horovod_wait_share": bg_share,
                 **info},
        significant=significant, part="compute", null=NULL,
    )]


# ---------------------------------------------------------------------------
# CPU limits in the operating system's terms: a cgroup's CPU quota, a cpuset
# ---------------------------------------------------------------------------

QUOTA_NULL = ("a rank without a CPU quota, or one its cgroup never throttled in the steps "
              f"(cpu.stat nr_throttled 0), or throttled under {UNCONTENDED_SHARE:.0%} of "
              "its compute thread's time")
CPUSET_NULL = ("a cpuset with at least as many CPUs as the rank's busy threads, or the "
               f"host's every CPU; or threads waiting under {UNCONTENDED_SHARE:.0%} of their "
               "time")


@dataclass
class Quota:
    """Ranks of one host under one cgroup CPU quota (the tightest level above
    them: cpu.cfs_quota_us / cpu.max), and how it throttled them."""

    host: str
    limit_path: str
    ranks: list[int]
    quota_us: int
    period_us: int
    #: per steady step (rows) and rank (columns): ms the cgroup was throttled
    #: in the step (cpu.stat's throttled time; on cgroup v1 summed over the
    #: CPUs it was throttled on), and the periods throttled / elapsed
    throttled: pd.DataFrame = field(default_factory=pd.DataFrame)
    periods: float = float("nan")
    periods_throttled: float = float("nan")
    #: the compute threads' share of their time outside synchronize that the
    #: throttling explains (the most of the ranks), the Horovod threads' too
    wait_share: float = float("nan")
    horovod_share: float = float("nan")
    horovod_by_step: pd.Series = field(default_factory=lambda: pd.Series(dtype=np.float64))

    @property
    def cpus(self) -> float:
        return self.quota_us / self.period_us


def _cg(r: dict[str, Any]) -> dict[str, Any] | None:
    cpu = r.get("cpu")
    cg = cpu.get("cgroup") if isinstance(cpu, dict) else None
    return cg if isinstance(cg, dict) else None


def cgroup_steps(cg: dict[str, Any]) -> pd.DataFrame:
    """Per step (index: the step records' numbers), the cgroup's counters over
    that step from its marks (the running totals at the read steps' ends,
    less the one before; a gap spread evenly over the steps it covers):
    throttled_ms, nr_throttled, nr_periods."""
    rows: dict[int, tuple[float, float, float]] = {}
    prev = None
    for m in cg.get("steps") or []:
        seq, periods, thr, ns = int(m[0]), float(m[2]), float(m[3]), float(m[4])
        if prev is not None and seq > prev[0]:
            gap = seq - prev[0]
            for k in range(prev[0] + 1, seq + 1):
                rows[k] = ((ns - prev[3]) / 1e6 / gap, (thr - prev[2]) / gap,
                           (periods - prev[1]) / gap)
        prev = (seq, periods, thr, ns)
    return pd.DataFrame.from_dict(rows, orient="index",
                                  columns=["throttled_ms", "nr_throttled", "nr_periods"])


def quotas(ctx: Context) -> list[Quota]:
    """The ranks under a CPU quota (trace.json's ranks[].cpu.cgroup), one Quota
    per (host, limiting cgroup), with its throttling per steady step."""
    groups: dict[tuple[str, str], Quota] = {}
    steady = set(int(s) for s in ctx.steady["step"]) if ctx.n_steps else set()
    for r in ctx.meta.get("ranks") or []:
        if not isinstance(r, dict) or not isinstance(r.get("rank"), int):
            continue
        cg = _cg(r)
        if not cg or not cg.get("quota_us") or not cg.get("period_us"):
            continue
        key = (str(r.get("host", "")), str(cg.get("limit_path") or cg.get("path") or ""))
        q = groups.setdefault(key, Quota(key[0], key[1], [], int(cg["quota_us"]),
                                         int(cg["period_us"])))
        q.ranks.append(int(r["rank"]))
        t = cgroup_steps(cg)
        t = t.loc[t.index.isin(steady)] if steady else t
        if len(t):
            q.throttled[int(r["rank"])] = t["throttled_ms"]
            q.periods = float(t["nr_periods"].sum())
            q.periods_throttled = float(t["nr_throttled"].sum())
    for q in groups.values():
        q.ranks.sort()
    return list(groups.values())


def quota_wait(ctx: Context) -> tuple[pd.DataFrame, list[Quota]]:
    """Per steady step (rows) and rank (columns, every rank with CPU rows): the
    compute thread's run-queue wait outside synchronize that its cgroup's
    throttling explains, ms: its wait beyond the unthrottled ranks' in the
    same step (what it would wait without the quota: on a host whose CPUs
    are all busy, lifting the quota gives it only what the others get), at
    most what the cgroup was throttled in the step (a throttled thread waits
    on the run queue, and schedstat counts it as waiting for a CPU); and the
    quotas claimed: throttled in MIN_STEPS steady steps or more, and
    explaining UNCONTENDED_SHARE of their compute threads' time (or twice
    that of their Horovod threads')."""
    found = [q for q in quotas(ctx) if not q.throttled.empty]
    if not found:
        return pd.DataFrame(), []
    split = main_split(ctx)
    wait = split["wait"]
    if ctx.n_steps and not wait.empty:
        wait = wait.loc[wait.index.isin(ctx.steady["step"])]
    if wait.empty:
        return pd.DataFrame(), []
    interval = (split["run"] + split["wait"] + split["blocked"]).reindex_like(wait)
    out = pd.DataFrame(0.0, index=wait.index, columns=wait.columns)
    # what a rank waits without a quota: the unthrottled ranks' wait in the
    # same step (on a busy host, lifting the quota gives the rank only the
    # CPU time the others get; none unthrottled: nothing to take off)
    limited = {r for q in found for r in q.ranks}
    free = [r for r in wait.columns if r not in limited]
    ref = wait[free].mean(axis=1) if free else pd.Series(0.0, index=wait.index)
    claimed = []
    for q in found:
        thr = q.throttled.reindex(wait.index).fillna(0.0)
        shares = []
        for r in q.ranks:
            if r not in wait.columns or r not in thr.columns:
                continue
            # the share of its wait beyond the others', over the steps (not
            # step by step: clipping each step's difference at 0 keeps the
            # noise's positive half)
            k = float(np.clip((wait[r] - ref).sum() / max(float(wait[r].sum()), 1e-9), 0.0, 1.0))
            out[r] = np.minimum(wait[r] * k, thr[r])
            shares.append(float(out[r].sum()) / max(float(interval[r].sum()), 1e-9))
        q.wait_share = max(shares) if shares else float("nan")
        q.horovod_by_step = _throttled_share(ctx, q, "horovod", free)
        bg = q.horovod_by_step.loc[q.horovod_by_step.index.isin(wait.index)]
        q.horovod_share = float(bg.mean()) if len(bg) >= MIN_STEPS else float("nan")
        steps_throttled = int((thr[[r for r in q.ranks if r in thr.columns]].max(axis=1)
                               > 0).sum()) if len(thr) else 0
        if steps_throttled >= MIN_STEPS and (
                q.wait_share >= UNCONTENDED_SHARE or q.horovod_share >= 2 * UNCONTENDED_SHARE):
            claimed.append(q)
        else:
            out[[r for r in q.ranks if r in out.columns]] = 0.0
    if not claimed:
        return pd.DataFrame(), []
    return out, claimed


def _throttled_share(ctx: Context, q: Quota, kind: str, free: list[int]) -> pd.Series:
    """Per step, of the quota's ranks' `kind` threads (their "cpu" rows), the
    largest share of the step's interval the thread waited for a core beyond
    what the same threads of the unthrottled ranks (`free`) waited, at most
    the time its cgroup was throttled."""
    rows = cpu_rows(ctx.df)
    rows = rows.loc[rows["kind"] == kind]
    mine = rows.loc[rows["rank"].isin(q.ranks)]
    if mine.empty:
        return pd.Series(dtype=np.float64)
    t = mine.groupby(["step", "rank"])[["wait_ns", "interval_ns"]].sum()
    others = rows.loc[rows["rank"].isin(free)].groupby(["step", "rank"])[
        ["wait_ns", "interval_ns"]].sum()
    ref = ((others["wait_ns"] / others["interval_ns"].clip(lower=1.0)).groupby("step").mean()
           if len(others) else pd.Series(dtype=np.float64))
    thr = q.throttled.stack().rename_axis(["step", "rank"]) * 1e6
    t["thr_ns"] = thr.reindex(t.index).fillna(0.0)
    steps = t.index.get_level_values("step")
    t["ref_ns"] = ref.reindex(steps).fillna(0.0).to_numpy() * t["interval_ns"].to_numpy()
    # each rank's share of its wait beyond the others', over the steps (as quota_wait)
    sums = t.groupby("rank")[["wait_ns", "ref_ns"]].sum()
    k = ((sums["wait_ns"] - sums["ref_ns"]) / sums["wait_ns"].clip(lower=1e-9)).clip(0.0, 1.0)
    kk = k.reindex(t.index.get_level_values("rank")).to_numpy()
    share = (np.minimum(t["wait_ns"] * kk, t["thr_ns"])
             / t["interval_ns"].clip(lower=1.0)).clip(0.0, 1.0)
    return share.groupby("step").max()


def analyze_quota(ctx: Context) -> list[Finding]:
    """cpu_quota: one finding per cgroup CPU quota that throttles ranks (module
    doc of this section: quota_wait)."""
    att, found = quota_wait(ctx)
    out = []
    for q in found:
        ranks = [r for r in q.ranks if r in att.columns]
        rank_txt = format_ranges(q.ranks)
        pl = len(q.ranks) > 1
        thr = q.throttled.reindex(att.index).fillna(0.0)
        thr_ms = float(thr.max(axis=1).mean()) if len(thr) else 0.0
        where = f"{q.limit_path or '/'}" + (f" on {q.host}" if q.host else "")
        headline = (f"Rank{'s' if pl else ''} {rank_txt} {'are' if pl else 'is'} throttled by "
                    f"{'their' if pl else 'its'} cgroup's CPU quota, {q.cpus:.2g} CPU "
                    f"({q.quota_us / 1e3:g} ms every {q.period_us / 1e3:g} ms, {where}): "
                    f"{fmt_ms(thr_ms)} throttled per step")
        details = []
        if np.isfinite(q.periods) and q.periods > 0:
            details.append(f"in the steady steps read, the cgroup was throttled in "
                           f"{q.periods_throttled:.0f} of {q.periods:.0f} quota periods "
                           f"({q.periods_throttled / q.periods:.0%}), {fmt_ms(thr_ms)} per "
                           "step (cpu.stat's throttled time"
                           + ("; cgroup v1 sums it over the CPUs throttled)." if _version(
                               ctx, q) == 1 else ")."))
        details.append(
            f"while throttled, the rank's threads are runnable but get no CPU: the compute "
            f"thread{'s' if pl else ''} waited {fmt_share(q.wait_share)} of "
            f"{'their' if pl else 'its'} time outside synchronize because of it"
            + (f", Horovod's background thread{'s' if pl else ''} "
               f"{fmt_share(q.horovod_share)}" if np.isfinite(q.horovod_share) else "")
            + "; this is a limit the rank's own cgroup sets, not other processes on its "
              "CPUs, so it is left out of cpu_contention.")
        cost = lo = hi = None
        if ranks and len(att) >= MIN_STEPS:
            got = _shifted_cost(ctx, att[ranks], q.horovod_by_step)
            if got is not None:
                gain, after = got
                cost, lo, hi = bootstrap_mean(gain)
                details.append(
                    f"without the throttling (the wait of the compute thread{'s' if pl else ''} it "
                    f"explains taken out, the ranks' arrivals moved earlier, and "
                    f"{fmt_ms(after)} of Horovod's negotiation and transfer after the last "
                    f"arrival), each step would end {fmt_ms(cost)} sooner, the cost above.")
        significant = cost is not None and lo is not None and ctx.significant(lo)
        out.append(Finding(
            key="cpu_quota", headline=headline, details=details, cost_ms=cost,
            cost_interval_ms=(lo, hi) if cost is not None and lo is not None
            and hi is not None else None,
            cost_img_s=ctx.cost_img_s(cost) if cost is not None else None,
            confidence=(f"95% interval over {len(att)} steady steps read (cgroup cpu.stat, "
                        "schedstat)" if cost is not None else ""),
            recommendation=(
                f"raise or remove the CPU limit of {q.limit_path or 'the cgroup'} (Kubernetes: "
                "the container's resources.limits.cpu; Slurm: --cpus-per-task with its "
                "cgroup; systemd: CPUQuota=) to at least the rank's busy threads, or run "
                "fewer threads per rank (torch.set_num_threads) so the quota suffices"
                if significant else ""),
            check="cat <cgroup>/cpu.stat before and after (nr_throttled); profiler compare",
            numbers={"host": q.host, "cgroup": q.limit_path, "ranks": q.ranks,
                     "quota_us": q.quota_us, "period_us": q.period_us, "quota_cpus": q.cpus,
                     "throttled_ms_per_step": thr_ms, "periods": q.periods,
                     "periods_throttled": q.periods_throttled, "wait_share": q.wait_share,
                     "horovod_share": q.horovod_share},
            significant=significant, part="compute" if cost is not None else "",
            null=QUOTA_NULL,
            not_claimed="" if cost is not None else "no CPU rows over enough steps to price it"))
    return out


def _version(ctx: Context, q: Quota) -> int:
    for r in ctx.meta.get("ranks") or []:
        if isinstance(r, dict) and r.get("rank") in q.ranks:
            cg = _cg(r)
            if cg:
                return int(cg.get("version") or 0)
    return 0


@dataclass
class Cpuset:
    """A rank whose cpuset holds fewer CPUs than it runs busy threads, and
    fewer than its host has."""

    rank: int
    host: str
    cpus: list[int]
    cpuset: str
    path: str
    busy: int
    host_cpus: int


def narrow_cpusets(meta: dict[str, Any]) -> list[Cpuset]:
    """The ranks whose cgroup cpuset is narrower than their busy threads
    (BUSY_SHARE of the run on a CPU, the sidecar's start and end figures)
    and than their host's CPUs."""
    out = []
    for r in meta.get("ranks") or []:
        if not isinstance(r, dict) or not isinstance(r.get("rank"), int):
            continue
        cg, cpu = _cg(r), r.get("cpu")
        cpus = (cg or {}).get("cpuset_cpus")
        if not cg or not isinstance(cpus, list) or not cpus or not isinstance(cpu, dict):
            continue
        hc = cpu.get("host_cpus")
        host_cpus = int(hc) if isinstance(hc, int) else 0
        runs = []
        for t in cpu.get("threads") or []:
            end, start = t.get("end"), t.get("start")
            if isinstance(end, dict) and "cpu_ns" in end:
                runs.append(max(float(end["cpu_ns"]) - float((start or {}).get("cpu_ns", 0)
                                                             if isinstance(start, dict)
                                                             else 0.0), 0.0))
        life = max(runs, default=0.0)
        busy = sum(1 for x in runs if life > 0 and x >= BUSY_SHARE * life)
        if len(cpus) < busy and (not host_cpus or len(cpus) < host_cpus):
            out.append(Cpuset(int(r["rank"]), str(r.get("host", "")), cpus,
                              str(cg.get("cpuset") or ""),
                              str(cg.get("cpuset_path") or cg.get("path") or ""), busy,
                              host_cpus))
    return out


def cpuset_wait(ctx: Context) -> tuple[pd.DataFrame, list[Cpuset]]:
    """Per steady step and rank: the compute thread's run-queue wait outside
    synchronize of the ranks in a narrow cpuset (narrow_cpusets), less what a
    quota or a noisy neighbour explains (their findings'), ms; and those ranks
    whose threads waited UNCONTENDED_SHARE of their time or more."""
    found = narrow_cpusets(ctx.meta)
    if not found:
        return pd.DataFrame(), []
    split = main_split(ctx)
    wait = split["wait"]
    if ctx.n_steps and not wait.empty:
        wait = wait.loc[wait.index.isin(ctx.steady["step"])]
    if wait.empty:
        return pd.DataFrame(), []
    interval = (split["run"] + split["wait"] + split["blocked"]).reindex_like(wait)
    taken = pd.DataFrame(0.0, index=wait.index, columns=wait.columns)
    for t in (quota_wait(ctx)[0], neighbour_wait(ctx)[0]):
        if not t.empty:
            taken = taken.add(t.reindex_like(taken).fillna(0.0), fill_value=0.0)
    own = (wait - taken).clip(lower=0.0)
    out = pd.DataFrame(0.0, index=wait.index, columns=wait.columns)
    claimed = []
    for c in found:
        if c.rank not in own.columns:
            continue
        share = float(own[c.rank].sum()) / max(float(interval[c.rank].sum()), 1e-9)
        if share >= UNCONTENDED_SHARE:
            out[c.rank] = own[c.rank]
            claimed.append(c)
    if not claimed:
        return pd.DataFrame(), []
    return out, claimed


def analyze_cpuset(ctx: Context) -> list[Finding]:
    """cpuset: the ranks whose cgroup cpuset is narrower than their busy
    threads, their threads' wait for a core priced as the step without it."""
    att, found = cpuset_wait(ctx)
    if not found:
        return []
    ranks = sorted(c.rank for c in found)
    pl = len(ranks) > 1
    c0 = found[0]
    cost = lo = hi = None
    details = [f"rank {c.rank}" + (f" on {c.host}" if c.host else "")
               + f": cgroup {c.path or '/'} allows CPU{'s' if len(c.cpus) > 1 else ''} "
               f"{c.cpuset} ({len(c.cpus)} of the host's {c.host_cpus}); it ran {c.busy} busy "
               "threads (the compute thread, Horovod's background thread, intra-op workers)."
               for c in found]
    own = float(np.nanmean(att[ranks].to_numpy())) if len(att) else 0.0
    details.append(f"the compute thread{'s' if pl else ''} waited {fmt_ms(own)} per step for a "
                   "core outside synchronize: the cpuset's own threads crowding it, not other "
                   "processes (left out of cpu_contention).")
    if len(att) >= MIN_STEPS:
        # what it explains, as cpu_contention counts a wait: per step, averaged
        # over the ranks (the breakdown's compute part is the ranks' mean)
        per_step = att[ranks].sum(axis=1) / att.shape[1]
        cost, lo, hi = bootstrap_mean(per_step.to_numpy())
        details.append(f"averaged over the ranks, that wait is {fmt_ms(cost)} per step of the "
                       "compute part, the figure above (cpu_contention counts the rest).")
    significant = cost is not None and lo is not None and ctx.significant(lo)
    return [Finding(
        key="cpuset",
        headline=(f"Rank{'s' if pl else ''} {format_ranges(ranks)}'s cpuset holds fewer CPUs "
                  f"than {'their' if pl else 'its'} busy threads: {len(c0.cpus)} CPU"
                  f"{'s' if len(c0.cpus) > 1 else ''} ({c0.cpuset}) for {c0.busy} threads"),
        details=details, cost_ms=cost,
        cost_interval_ms=(lo, hi) if cost is not None and lo is not None and hi is not None
        else None,
        cost_img_s=ctx.cost_img_s(cost) if cost is not None else None,
        cost_label="explains",
        confidence=(f"95% interval over {len(att)} steady steps read (cgroup cpuset, "
                    "schedstat)" if cost is not None else ""),
        recommendation=("give the rank's cgroup as many CPUs as it runs busy threads "
                        "(Kubernetes: a CPU request/limit of that many with the static CPU "
                        "manager; Slurm: --cpus-per-task; cpuset.cpus), or run fewer threads "
                        "per rank (torch.set_num_threads, OMP_NUM_THREADS)"
                        if significant else ""),
        check="cat /proc/<pid>/cgroup and the cgroup's cpuset.cpus; profiler compare",
        numbers={"ranks": ranks, "cpusets": {c.rank: c.cpuset for c in found},
                 "busy_threads": {c.rank: c.busy for c in found}},
        significant=significant, part="compute" if cost is not None else "",
        null=CPUSET_NULL)]
