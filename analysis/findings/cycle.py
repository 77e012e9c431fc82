"""Waiting for Horovod: the time between the last rank's last tensor and the
moment synchronize returns that is not transfer (the breakdown's ``horovod``
part): Horovod's cycle (its background thread sleeps HOROVOD_CYCLE_TIME between
rounds, then negotiates and fuses), and the completion (copies out of the
fusion buffer, callbacks, and synchronize's polling of its handles, every
millisecond in horovod.torch).

A finding names HOROVOD_CYCLE_TIME only when the job ran with a cycle longer
than Horovod's default.  The wait for the cycle is the idle part (this rank's
thread sleeping out its cycle) and most of the negotiation: each rank's
thread sleeps on its own clock, so the negotiation's control call waits for
the rank whose cycle comes last, up to a cycle more (at 3-4 ranks here,
7-13 ms of a 24-30 ms cycle).  Both grow with the cycle time, so the cost is
what a default cycle would not spend of them: (horovod - completion) x (1 -
default / cycle); the idle part alone missed a third to a half of the twins'
difference on development seeds.  At the default cycle the part is
reported, and claims nothing: no setting would shorten it.

``second_cycles``: the steps take one cycle or more (the test and its null:
analysis/cycles.py).  What it explains is drawn from the wait for Horovod:
for the steps that waited whole cycles, their wait beyond the fast steps'
(their compute is often longer too, where the cycle's work shares the core:
that stays in the compute part).  Such a job answers any change in its
compute by whole cycles: a few microseconds added to the backward pass (the
profiler's own among them) move steps across the edge, and cost
several times their length in rate."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.formats.horovod_env import DEFAULT_CYCLE_MS
from profiler.formats.horovod_env import settings as horovod_settings
from profiler.units import fmt_ms

from .. import remedies
from ..cycles import EDGE_ALPHA, cycle_edge
from .base import MIN_STEPS, Context, Finding, bootstrap_mean

EDGE_NULL = ("one peak of step times: spread evenly over a cycle or falling off above the "
             "fast steps, as many steps half a cycle above them as a whole cycle above "
             f"(binomial, p < {EDGE_ALPHA:g})")

NULL = ("Horovod's default cycle (1 ms): the idle part of a cycle shrinks in proportion to "
        "the cycle time; at the default there is no setting to recommend")


def _second_cycles(ctx: Context, per: pd.DataFrame, cycle: float,
                   env: dict) -> Finding | None:
    """The steps that waited whole cycles more than the fast ones (module
    docstring); None when there are too few steps or no cycle to test."""
    from .contention import UNCONTENDED_SHARE
    from .step_time import _horovod_thread_wait

    per = per.loc[np.isfinite(per["wall_ms"].to_numpy())]
    w = per["wall_ms"].to_numpy()
    edge = cycle_edge(w, cycle)
    if edge is None:
        return None
    fast, trough, peak, p, passed = (edge.fast_ms, edge.trough, edge.peak, edge.p_value,
                                     edge.passed)
    p_text = "p < 0.001" if p < 1e-3 else f"p = {p:.2g}"
    test = (f"{peak} steps a cycle above the fast ones against {trough} half a cycle above "
            f"({p_text}, {len(w)} steps)")
    if not passed:
        if peak < 0.05 * len(w):  # nothing that looks like a second peak: nothing to say
            return None
        return Finding(
            key="second_cycles",
            headline=(f"{peak / len(w):.0%} of the steps take about a cycle more than the "
                      "fast ones"),
            details=[test + "."], cost_ms=None, confidence=f"{len(w)} steady steps",
            null=EDGE_NULL, part="horovod",
            not_claimed=(test + ": as many steps sit on the way to a cycle above the fast "
                         "ones, so the step times are one spread, not steps that missed "
                         "Horovod's cycle"),
            numbers={"cycle_time_ms": cycle, "fast_ms": fast, "trough": trough,
                     "peak": peak, "p_value": p, "steps": len(w)})
    waited = edge.waited
    # what the missed cycles explain, drawn from the wait for Horovod alone: a
    # waited step's wait beyond the fast steps' (its compute, longer too where
    # the cycle's work shares the core, is left to the compute part)
    hv = per["horovod_ms"].to_numpy()
    at_fast = edge.at_fast
    base_hv = float(np.median(hv[at_fast])) if at_fast.any() else 0.0
    extra = np.where(waited, np.maximum(hv - base_hv, 0.0), 0.0)
    share = float(waited.mean())
    mean, lo, hi = bootstrap_mean(extra)
    slow = float(np.median(w[waited])) if waited.any() else float("nan")
    share_bg, _ = _horovod_thread_wait(ctx)
    contended = bool(np.isfinite(share_bg) and share_bg >= UNCONTENDED_SHARE)
    set_ = "HOROVOD_CYCLE_TIME" in env
    details = [
        f"HOROVOD_CYCLE_TIME={cycle:g} ms" + ("" if set_ else " (the default)")
        + ": in those steps the last gradients missed the cycle under way and waited for "
        "the next (or two).",
        test + ".",
        "such a job answers any change in its compute by whole cycles: a few microseconds "
        "added to the backward pass (the profiler's own among them) move steps across the "
        "edge and cost several times their length in rate; compare rates with that in mind.",
    ]
    rec = check = ""
    if contended:
        details.append(f"a shorter cycle would make a missed cycle cheaper, but Horovod's "
                       f"background thread already waits for a core ({share_bg:.0%} of its "
                       "run time): waking it more often would cost the compute more.")
    else:
        rec = (f"HOROVOD_CYCLE_TIME={cycle / 2:g} makes a missed cycle cost half as much; "
               "its background thread then wakes twice as often, which costs where cores "
               "are short")
        check = (f"HOROVOD_CYCLE_TIME={cycle / 2:g} ...; then profiler compare BEFORE AFTER "
                 "(the step times and this finding's share)")
    return Finding(
        key="second_cycles",
        headline=(f"{share:.0%} of the steps wait a whole Horovod cycle more than the fast "
                  f"ones ({fmt_ms(slow)} against {fmt_ms(fast)})"),
        details=details, cost_ms=mean, cost_interval_ms=(lo, hi), cost_label="explains",
        cost_img_s=ctx.cost_img_s(mean),
        confidence=f"95% interval over {len(w)} steady steps",
        recommendation=rec, check=check,
        numbers={"cycle_time_ms": cycle, "fast_ms": fast, "slow_ms": slow,
                 "share": share, "trough": trough, "peak": peak, "p_value": p,
                 "explains_ms": mean, "steps": len(w)},
        significant=ctx.significant(lo), part="horovod", null=EDGE_NULL)


def analyze(ctx: Context) -> list[Finding]:
    bd = ctx.breakdown
    if ctx.n_steps < MIN_STEPS or bd.empty or not (bd["source"] == "sync").any():
        return []
    found = _cycle_wait(ctx, bd)
    env = ctx.meta.get("env") or {}
    per = bd.loc[bd["source"] == "sync"].groupby("step")[["wall_ms", "horovod_ms"]].mean()
    edge = _second_cycles(ctx, per, horovod_settings(env).cycle_time_ms, env)
    return found + ([edge] if edge is not None else [])


def _cycle_wait(ctx: Context, bd: pd.DataFrame) -> list[Finding]:
    per = bd.loc[bd["source"] == "sync"].groupby("step")[
        ["horovod_ms", "negotiation_ms", "completion_ms"]].mean()
    idle = np.maximum(per["horovod_ms"] - per["negotiation_ms"] - per["completion_ms"], 0.0)
    env = ctx.meta.get("env") or {}
    cycle = horovod_settings(env).cycle_time_ms
    hv, _, _ = bootstrap_mean(per["horovod_ms"].to_numpy())
    idle_m = float(idle.mean())
    neg_m = float(per["negotiation_ms"].mean())
    comp_m = float(per["completion_ms"].mean())
    details = [f"after the last rank's last tensor: {fmt_ms(idle_m)} waiting for Horovod's "
               f"next cycle (HOROVOD_CYCLE_TIME={cycle:g} ms"
               + ("" if "HOROVOD_CYCLE_TIME" in env else ", the default") + f"), "
               f"{fmt_ms(neg_m)} negotiating, {fmt_ms(comp_m)} handing the results back "
               + remedies.completion_detail(remedies.framework(ctx.meta)) + "."]
    longer = cycle > DEFAULT_CYCLE_MS * 1.5
    if longer:
        # the cycle's wait: idle, and the negotiation's wait for the other ranks'
        # cycles (module docstring); the completion does not scale with it
        wait = np.maximum(per["horovod_ms"] - per["completion_ms"], 0.0).to_numpy()
        wait_m = float(wait.mean())
        saved = wait * (1.0 - DEFAULT_CYCLE_MS / cycle)
        mean, lo, hi = bootstrap_mean(saved)
        significant = ctx.significant(lo)
        details.append(f"the ranks' threads each sleep out their own cycle, so the "
                       "negotiation waits for the rank whose cycle comes last: both parts "
                       f"scale with the cycle time, and a {DEFAULT_CYCLE_MS:g} ms cycle would "
                       f"wait {fmt_ms(wait_m - mean)} instead of {fmt_ms(wait_m)}.")
        from ..predict import Target, remedy_line
        from .fusion import _lineage

        predicted = remedy_line(ctx, Target(cycle_ms=DEFAULT_CYCLE_MS),
                                f"HOROVOD_CYCLE_TIME={DEFAULT_CYCLE_MS:g}", _lineage(ctx))
        if predicted is not None:
            details.append(predicted[0])
        return [Finding(
            key="cycle_time",
            headline=(f"HOROVOD_CYCLE_TIME={cycle:g} ms holds every step {fmt_ms(wait_m)} "
                      "after the last gradient is ready"),
            details=details, cost_ms=mean, cost_interval_ms=(lo, hi),
            cost_img_s=ctx.cost_img_s(mean),
            confidence=f"95% interval over {ctx.n_steps} steady steps",
            recommendation=(f"HOROVOD_CYCLE_TIME={DEFAULT_CYCLE_MS:g} (Horovod's default)"
                            if significant else ""),
            check=f"HOROVOD_CYCLE_TIME={DEFAULT_CYCLE_MS:g} ...; then profiler compare "
                  "BEFORE AFTER",
            numbers={"cycle_time_ms": cycle, "idle_ms": idle_m, "negotiation_ms": neg_m,
                     "completion_ms": comp_m, "horovod_ms": hv, "cycle_wait_ms": wait_m,
                     "saved_ms": mean, **(predicted[1] if predicted else {})},
            significant=significant, part="horovod", null=NULL)]
    return [Finding(
        key="horovod_wait",
        headline=f"Tensors wait {fmt_ms(hv)} per step for Horovod after the last one is ready",
        details=details, cost_ms=None,
        confidence=f"mean over {ctx.n_steps} steady steps",
        recommendation="", check="",
        numbers={"cycle_time_ms": cycle, "idle_ms": idle_m, "negotiation_ms": neg_m,
                 "completion_ms": comp_m, "horovod_ms": hv},
        significant=False, part="horovod", null=NULL)]
