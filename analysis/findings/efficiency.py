"""Interconnect efficiency: how fast the application's transfers run against
what the fabric delivers.

A collective's transfer is the part after its last rank arrived (the waiting
before it is the late-rank finding's): last end minus last start of the
matched call (Context.matched).  Its reference, per call:

* with a bench trace of the same fabric (`profiler advise TRACE --bench
  BENCH`, from `profiler bench` on the same hosts and ranks): the bench's
  fitted latency curve (analysis.model) at the call's size;
* without one: this run's own fastest transfers of that operation and size
  (the 10th percentile, sizes with at least MIN_CALLS calls).

The headline's share compares median transfers per size with their
references, weighted by calls.  Bus bandwidth (nccl-tests' definition,
analysis.metrics.bus_factor) is shown for the sizes that carry the most
transfer time.  The cost is the
transfer time above the reference per step, capped by the step breakdown's
``transfer`` part (transfer the step waits for; time that overlaps compute
costs nothing), with a 95% interval over the steady steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiler.units import fmt_bytes, fmt_ms, fmt_share

from .base import MIN_STEPS, Context, Finding, bootstrap_mean

#: Calls of one operation and size needed for the run's own reference.
MIN_CALLS = 8
#: The percentile of a size's transfers taken as what the fabric can do.
REFERENCE_PERCENTILE = 10
#: A bench covers a size it measured, or one within this factor of its range.
BENCH_REACH = 2.0
#: Sizes listed in the finding.
SHOWN = 3


def transfers(m: pd.DataFrame) -> pd.DataFrame:
    """One row per complete matched collective (analysis.imbalance.match_calls
    rows; barriers left out): op, bytes, comm_size, start (of the last
    arrival) and transfer_ns (last end minus last start)."""
    cols = ["op", "bytes", "comm_size", "start_ns", "transfer_ns"]
    if m.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    m = m.loc[m["complete"].astype(bool) & (m["op"].astype(str) != "barrier")]
    out = pd.DataFrame({
        "op": m["op"].astype(str).to_numpy(),
        "bytes": m["bytes"].to_numpy(dtype=np.int64),
        "comm_size": m["comm_size"].to_numpy(dtype=np.int64),
        "start_ns": m["last_start_ns"].to_numpy(dtype=np.int64),
        "transfer_ns": (m["duration_ns"] - m["spread_ns"]).to_numpy(dtype=np.float64),
    })
    return out.loc[(out["bytes"] > 0) & (out["transfer_ns"] > 0)].reset_index(drop=True)


def own_reference(t: pd.DataFrame) -> np.ndarray:
    """Per transfer: the REFERENCE_PERCENTILE of its (op, bytes) group's
    transfers, NaN where the group has fewer than MIN_CALLS."""
    g = t.groupby(["op", "bytes"], sort=False)["transfer_ns"]
    ref = g.transform(lambda s: np.percentile(s, REFERENCE_PERCENTILE)
                      if len(s) >= MIN_CALLS else np.nan)
    return ref.to_numpy(dtype=np.float64)


def bench_reference(t: pd.DataFrame, bench: pd.DataFrame) -> np.ndarray:
    """Per transfer: the bench's fitted latency of its operation at its size
    (NaN for an operation the bench did not measure or a size outside its
    reach)."""
    from ..model import fit_models, latency_by_size

    stats = latency_by_size(bench, by=["op"])
    ref = np.full(len(t), np.nan)
    if stats.empty:
        return ref
    models = fit_models(bench, by=["op"], stats=stats)
    for op, idx in t.groupby("op", sort=False).indices.items():
        model = models.get((str(op),))
        sizes = stats.loc[stats["op"] == str(op), "bytes"]
        if model is None or sizes.empty:
            continue
        lo, hi = float(sizes.min()) / BENCH_REACH, float(sizes.max()) * BENCH_REACH
        b = t["bytes"].to_numpy(dtype=np.float64)[idx]
        inside = (b >= lo) & (b <= hi)
        ref[idx[inside]] = model.predict_ns(b[inside])
    return ref


def mismatch(ctx: Context, bench: Context) -> str:
    """Why the bench does not describe this run's fabric ('' when it does)."""
    from ..interconnect import interconnect

    why = []
    if len(bench.ranks) != len(ctx.ranks):
        why.append(f"{len(bench.ranks)} ranks against {len(ctx.ranks)}")
    if bench.hosts and ctx.hosts and len(bench.hosts) != len(ctx.hosts):
        why.append(f"{len(bench.hosts)} hosts against {len(ctx.hosts)}")
    a, b = interconnect(ctx.meta), interconnect(bench.meta)
    if a and b and a != b:
        why.append(f"interconnect {b} against {a}")
    return ", ".join(why)


def _per_step(ctx: Context, start_ns: np.ndarray, excess_ns: np.ndarray) -> np.ndarray:
    """Excess ms per steady step, capped by that step's transfer part (the
    breakdown's, averaged over ranks; the step's exposed communication where
    the trace has no breakdown)."""
    s = ctx.steady.sort_values("t_start_ns")
    t0 = s["t_start_ns"].to_numpy(dtype=np.int64)
    t1 = s["t_end_ns"].to_numpy(dtype=np.int64)
    k = np.searchsorted(t0, start_ns, side="right") - 1
    ok = (k >= 0) & (start_ns < t1[np.clip(k, 0, None)])
    bd = ctx.breakdown
    if len(bd) and (bd["source"] != "none").any():
        # only transfers that start after the step's last arrival hold the step
        arr = bd.loc[bd["arrival_ns"] >= 0].groupby("step")["arrival_ns"].max()
        a = arr.reindex(s["step"]).to_numpy(dtype=np.float64)
        ok &= start_ns >= np.nan_to_num(a[np.clip(k, 0, None)], nan=np.inf)
    per = np.bincount(k[ok], weights=excess_ns[ok], minlength=len(s)) / 1e6
    if len(bd) and (bd["source"] != "none").any():
        cap = bd.groupby("step")["transfer_ms"].mean().reindex(s["step"]).fillna(0.0)
        per = np.minimum(per, cap.to_numpy(dtype=np.float64))
    elif "exposed_ms" in s.columns:
        per = np.minimum(per, s["exposed_ms"].to_numpy(dtype=np.float64))
    return per


def _busbw_gbps(op: str, nbytes: float, n: int, ns: float) -> float:
    from ..metrics import bus_factor

    return nbytes * bus_factor(op, n) / ns if ns > 0 else float("nan")


def analyze(ctx: Context, bench: Context | None = None,
            exclude: frozenset[int] = frozenset()) -> list[Finding]:
    """The finding (module doc); `exclude`: message sizes another finding
    explains (a confirmed latency cliff's), left out of the transfers."""
    if ctx.n_steps < MIN_STEPS:
        return []
    if bench is not None:
        why = mismatch(ctx, bench)
        if why:
            return [Finding(key="efficiency_bench", kind="limit",
                            headline="the bench trace is not of this run's fabric",
                            details=[f"{why}: run `profiler bench` with the job's ranks, "
                                     "hosts and transport."])]
    t = transfers(ctx.matched)
    if exclude:
        t = t.loc[~t["bytes"].isin(list(exclude))].reset_index(drop=True)
    if t.empty:
        return []
    source = "bench" if bench is not None else "own"
    ref = bench_reference(t, bench.df) if bench is not None else own_reference(t)
    have = np.isfinite(ref)
    if not have.any():
        return []
    t = t.loc[have].assign(ref_ns=ref[have]).reset_index(drop=True)
    excess = np.maximum(t["transfer_ns"].to_numpy() - t["ref_ns"].to_numpy(), 0.0)
    per_step = _per_step(ctx, t["start_ns"].to_numpy(dtype=np.int64), excess)
    mean, lo, hi = bootstrap_mean(per_step)
    by = t.groupby(["op", "bytes"], sort=False).agg(
        calls=("transfer_ns", "size"), transfer_ns=("transfer_ns", "median"),
        ref_ns=("ref_ns", "median"), total_ns=("transfer_ns", "sum"),
        comm_size=("comm_size", "max")).reset_index()
    # the typical transfer against its reference: medians per size, weighted by
    # calls (a few preempted transfers move the cost, not the headline)
    typical = float((by["calls"] * by["transfer_ns"]).sum())
    eff = float((by["calls"] * by["ref_ns"]).sum()) / typical if typical > 0 else float("nan")
    top = by.sort_values("total_ns", ascending=False).head(SHOWN)
    sizes = []
    rows: list[dict[str, Any]] = []
    for r in top.itertuples(index=False):
        got = _busbw_gbps(str(r.op), float(r.bytes), int(r.comm_size), float(r.transfer_ns))
        best = _busbw_gbps(str(r.op), float(r.bytes), int(r.comm_size), float(r.ref_ns))
        sizes.append(f"{r.op} {fmt_bytes(int(r.bytes))}: {got:.2f} of {best:.2f} GB/s")
        rows.append({"op": str(r.op), "bytes": int(r.bytes), "calls": int(r.calls),
                     "busbw_gbps": got, "reference_busbw_gbps": best})
    against = ("the bench's curve on this fabric" if source == "bench" else
               f"this run's fastest transfers of the same size (p{REFERENCE_PERCENTILE})")
    # the run's own fastest transfers are the best of noisy samples: a typical
    # transfer is always slower than its p10, on a quiet fabric too, so without
    # a bench the finding cannot tell a slow fabric from a noisy moment
    significant = source == "bench" and ctx.significant(lo)
    if source == "bench":
        advice = ("transfers are slower than this fabric allows: the ranks' cores are busy "
                  "with compute (leave one to Horovod's thread), or the job's transport is "
                  "not the bench's (check the interconnect line of profiler summarize)")
    else:
        advice = ("transfers of one size vary: contention for the cores or the link; "
                  "a bench on this fabric tells what it can do")
    return [Finding(
        key="efficiency",
        headline=(f"Typical transfers run at {fmt_share(eff)} of the speed of {against}"),
        details=[f"bus bandwidth at the sizes carrying most time: {'; '.join(sizes)}.",
                 f"transfer time above it: {fmt_ms(mean)}/step where the step waits for it "
                 "(after the last rank arrived; waiting for late ranks is not counted)."],
        cost_ms=mean, cost_interval_ms=(lo, hi), cost_img_s=ctx.cost_img_s(mean),
        confidence=f"95% interval over {ctx.n_steps} steady steps; {len(t)} transfers",
        recommendation=advice if significant else "nothing above the noise floor to change",
        check=("profiler bench --sizes-from TRACE (on the job's hosts), then "
               "profiler advise TRACE --bench BENCH/trace.json"),
        numbers={"source": source, "efficiency": eff, "excess_ms": mean, "sizes": rows,
                 "transfers": int(len(t))},
        significant=significant, part="transfer",
        not_claimed=("" if source == "bench" or not ctx.significant(lo) else
                     "measured against this run's own fastest transfers, which any noise "
                     "makes look fast: profiler bench on this fabric, then advise --bench, "
                     "decides"),
        null=(f"transfers as fast as {against}: the same sizes, every step"),
    )]
