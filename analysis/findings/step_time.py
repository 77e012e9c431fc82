"""Whether communication limits the job at all: the step breakdown's parts that
communication can shorten (waiting for other ranks, waiting for Horovod,
transfer) against the rest of the step.

``transfer_bound``: the transfer part (data calls after the last rank's
arrival) is at least COMM_SHARE of the step (lower end of its interval): the
job waits for the network, whatever the reason (bytes, message count, a slow
link).  Its cost is the transfer part.

Transfers may wait for cores rather than the link: when Horovod's background
thread waited for a core, per step, at least half the transfer part (its
"cpu" rows), the finding is not claimed.  The run cannot tell which: a
thread polling inside a call stays runnable throughout, so on a full machine
it waits for a core for a like share of a transfer held by a slow link
(0.6 of it in the slow-link scenario) as of one held by the cores (0.7 when
Horovod's synchronize and MPI's polling crowd 2 cores); a bench of the
fabric (`profiler bench`, then `advise --bench`) tells the link's speed.
With one (a bench of the same hosts, ranks and transport), the run's data
calls after each step's last arrival are priced at the bench's curve: when the
fabric alone needs at least LINK_SHARE of the transfer part for them, the
link holds the step whatever the cores did, and the finding is claimed; when
it needs less, the transfers wait for something the fabric does not explain,
and with the thread's waits for a core it stays unclaimed.

When the compute part is at least COMPUTE_SHARE of the step (the lower end of
its 95% interval), the finding says so: communication is not what limits this
job, and the step's time is in compute, data loading and everything else
outside Horovod.  Its figure is what that part explains, not something to
save; it recommends looking at the compute side.  The claim is false when the
communication parts reach 1 - COMPUTE_SHARE, and then it is not made."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.units import fmt_bytes, fmt_ms, fmt_share

from .. import remedies
from .base import MIN_STEPS, Context, Finding, bootstrap_mean

#: A transfer part from this share of the step holds the step.
COMM_SHARE = 0.10
#: With a bench: the fabric's own time for the run's calls, from this share of
#: the transfer part, makes the link what holds it.
LINK_SHARE = 0.5
#: A compute part from this share of the step: communication is not the limit.
COMPUTE_SHARE = 0.80
COMM_PARTS = ("wait_ranks", "horovod", "transfer")

NULL = (f"communication limits the job: compute under {COMPUTE_SHARE:.0%} of the step "
        "(lower end of its 95% interval)")


TRANSFER_NULL = (f"transfers the step can ignore: the transfer part under {COMM_SHARE:.0%} of "
                 "the step (lower end of its 95% interval)")


#: how much faster a link the transfer_bound remedy is priced at
LINK_SPEEDUP = 10.0


def _faster_link(ctx: Context) -> tuple[str, dict[str, float]] | None:
    """The step analysis.predict gives this job on a link LINK_SPEEDUP times
    faster (its own transfers' per-byte cost divided by that), as a detail."""
    from ..predict import Target, remedy_line

    return remedy_line(ctx, Target(link_speedup=LINK_SPEEDUP),
                       f"a link {LINK_SPEEDUP:g} times faster")


def _fabric_ms(ctx: Context, bench: Context | None) -> tuple[float, float]:
    """With a bench of this fabric: the bench's time for the run's data calls
    that start after each step's last arrival (their sizes at its fitted
    curve), ms per steady step, and the share of those calls' transfer the
    bench covers (its sizes within reach); nan, nan without one."""
    from .efficiency import _per_step, bench_reference, mismatch, transfers

    if bench is None or mismatch(ctx, bench):
        return float("nan"), float("nan")
    t = transfers(ctx.matched)
    if t.empty:
        return float("nan"), float("nan")
    ref = bench_reference(t, bench.df)
    ok = np.isfinite(ref)
    if not ok.any():
        return float("nan"), 0.0
    start = t["start_ns"].to_numpy(dtype=np.int64)
    took = t["transfer_ns"].to_numpy(dtype=np.float64)
    fabric = _per_step(ctx, start[ok], ref[ok])
    covered = float(_per_step(ctx, start[ok], took[ok]).sum())
    total = float(_per_step(ctx, start, took).sum())
    return float(fabric.mean()), (covered / total if total > 0 else float("nan"))


def _transfer_bound(ctx: Context, per: pd.DataFrame,
                    bench: Context | None = None) -> list[Finding]:
    wall = per["wall_ms"].to_numpy()
    tr = per["transfer_ms"].to_numpy()
    share = tr / np.where(wall > 0, wall, np.nan)
    _, s_lo, _ = bootstrap_mean(share)
    if not np.isfinite(s_lo) or s_lo < COMM_SHARE:
        return []
    mean, lo, hi = bootstrap_mean(tr)
    waited, waited_ms = _horovod_thread_wait(ctx)
    s = ctx.steady
    nbytes = float(s["bytes"].mean()) if "bytes" in s.columns else 0.0
    data_ms = float(s["data_ms"].mean()) if "data_ms" in s.columns else 0.0
    calls = float(s["data_calls"].mean()) if "data_calls" in s.columns else 0.0
    rate = nbytes / (data_ms * 1e6) if data_ms > 0 else float("nan")  # GB/s
    details = [f"after the last rank's last gradient, the step waits {fmt_ms(mean)} for data "
               f"calls ({fmt_share(mean / float(wall.mean()))} of the step)."]
    if nbytes > 0 and np.isfinite(rate):
        details.append(f"each rank moves {fmt_bytes(int(nbytes))} per step in {calls:.1f} data "
                       f"calls, at {rate:.3g} GB/s over the time in them.")
    fabric_ms, covered = _fabric_ms(ctx, bench)
    link = bool(np.isfinite(fabric_ms) and fabric_ms >= LINK_SHARE * mean)
    if np.isfinite(fabric_ms):
        details.append(f"the bench of this fabric carries the same calls in {fmt_ms(fabric_ms)} "
                       f"per step ({fmt_share(fabric_ms / mean)} of the transfer part; it "
                       f"covers {fmt_share(covered)} of it): "
                       + ("the link holds the step." if link else
                          "the fabric explains little of it."))
    not_claimed = ""
    if link:
        if np.isfinite(waited_ms):
            details.append(f"Horovod's background thread waited for a core {fmt_ms(waited_ms)} "
                           "per step, which the bench shows is not what the transfers wait for.")
    elif np.isfinite(waited_ms) and waited_ms >= 0.5 * mean:
        not_claimed = (f"Horovod's background thread waited for a core {fmt_ms(waited_ms)} per "
                       f"step ({fmt_share(waited)} of its run time): the transfers may wait for "
                       "cores (see the CPU contention finding) as well as for the link, and "
                       "this run cannot tell which; a bench of the fabric (profiler bench, "
                       "then advise --bench) gives the link's speed")
        details.append(not_claimed + ".")
    elif np.isfinite(waited_ms):
        details.append(f"Horovod's background thread waited for a core {fmt_ms(waited_ms)} per "
                       "step: contention explains little of it.")
    numbers = {"transfer_ms": mean, "bytes_per_step": nbytes, "data_calls": calls,
               "algbw_gbps": rate, "fabric_ms": fabric_ms}
    faster = _faster_link(ctx)
    if faster is not None:
        details.append(faster[0])
        numbers.update(faster[1])
    return [Finding(
        key="transfer_bound",
        headline=f"Transfers hold every step {fmt_ms(mean)} after the last gradient is ready",
        details=details, cost_ms=mean, cost_interval_ms=(lo, hi),
        cost_img_s=ctx.cost_img_s(mean),
        confidence=f"95% interval over {ctx.n_steps} steady steps",
        recommendation=("fewer bytes (hvd.Compression.fp16), fewer and larger messages (see "
                        "the fusion finding), or a faster link between the ranks' hosts "
                        "(profiler bench on this fabric tells what it delivers)"),
        check="profiler bench -o BENCH --np N (on the job's hosts); profiler advise TRACE "
              "--bench BENCH/trace.json",
        numbers=numbers,
        significant=ctx.significant(lo) and not not_claimed, part="transfer",
        null=TRANSFER_NULL, not_claimed=not_claimed)]


def _horovod_thread_wait(ctx: Context) -> tuple[float, float]:
    """Horovod's background thread over the steady steps: the share of its run
    time it waited for a core, and that wait in ms per step (mean over ranks);
    nan without "cpu" rows."""
    from .contention import cpu_rows

    rows = cpu_rows(ctx.df)
    bg = rows.loc[(rows["kind"] == "horovod") & rows["step"].isin(ctx.steady["step"])]
    tot = float(bg["run_ns"].sum() + bg["wait_ns"].sum()) if len(bg) else 0.0
    if tot <= 0:
        return float("nan"), float("nan")
    per_step = float(bg.groupby(["step", "rank"])["wait_ns"].sum().mean()) / 1e6
    return float(bg["wait_ns"].sum()) / tot, per_step


def analyze(ctx: Context, bench: Context | None = None) -> list[Finding]:
    """`bench`: a bench trace of the same fabric, which tells a link that holds
    the transfers from cores that do (_fabric_ms)."""
    bd = ctx.breakdown
    if ctx.n_steps < MIN_STEPS or bd.empty or (bd["source"] == "none").all():
        return []
    per = bd.groupby("step")[["wall_ms", "compute_ms", *[f"{p}_ms" for p in COMM_PARTS]]].mean()
    bound = _transfer_bound(ctx, per, bench)
    if bound:
        return bound
    comm = per[[f"{p}_ms" for p in COMM_PARTS]].sum(axis=1).to_numpy()
    wall = per["wall_ms"].to_numpy()
    share = comm / np.where(wall > 0, wall, np.nan)
    s_mean, _, s_hi = bootstrap_mean(share)
    _, c_lo, _ = bootstrap_mean(per["compute_ms"].to_numpy() / np.where(wall > 0, wall, np.nan))
    if not np.isfinite(c_lo) or c_lo < COMPUTE_SHARE:
        return []
    mean, lo, hi = bootstrap_mean(per["compute_ms"].to_numpy())
    c_mean = float(comm.mean())
    return [Finding(
        key="compute_bound",
        headline=(f"Communication is not what limits this job: {fmt_share(mean / wall.mean())} "
                  "of the step is outside Horovod"),
        details=[f"waiting for other ranks, for Horovod and transfers take {fmt_ms(c_mean)} "
                 f"per step together ({fmt_share(s_mean)}; at most {fmt_share(s_hi)} at 95%).",
                 "the step's time is in data loading, forward, backward and the optimizer: "
                 "faster communication would not buy much."],
        cost_ms=mean, cost_interval_ms=(lo, hi), cost_label="explains",
        confidence=f"95% interval over {ctx.n_steps} steady steps",
        recommendation=remedies.profile_compute_remedy(remedies.framework(ctx.meta)),
        check="",
        numbers={"compute_ms": mean, "comm_ms": c_mean, "comm_share": s_mean,
                 "comm_share_hi": s_hi},
        significant=True, part="compute", null=NULL,
    )]
