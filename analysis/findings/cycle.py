"""Waiting for Horovod: the time between the last rank's last tensor and the
moment synchronize returns that is not transfer (the breakdown's ``horovod``
part): Horovod's cycle (its background thread sleeps HOROVOD_CYCLE_TIME between
rounds, then negotiates and fuses), and the completion (copies out of the
fusion buffer, callbacks, and synchronize's polling of its handles, every
millisecond in horovod.torch).

A finding names HOROVOD_CYCLE_TIME only when the job ran with a cycle longer
than Horovod's default: the idle part of the cycle grows with the cycle time,
so the cost is the idle part a default cycle would not have spent
(idle x (1 - default / cycle)).  At the default cycle the part is reported,
and claims nothing: no setting would shorten it."""

from __future__ import annotations

import numpy as np

from profiler.formats.horovod_env import DEFAULT_CYCLE_MS
from profiler.formats.horovod_env import settings as horovod_settings
from profiler.units import fmt_ms

from .base import MIN_STEPS, Context, Finding, bootstrap_mean

NULL = ("Horovod's default cycle (1 ms): the idle part of a cycle shrinks in proportion to "
        "the cycle time; at the default there is no setting to recommend")


def analyze(ctx: Context) -> list[Finding]:
    bd = ctx.breakdown
    if ctx.n_steps < MIN_STEPS or bd.empty or not (bd["source"] == "sync").any():
        return []
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
               "(synchronize polls its handles every millisecond)."]
    longer = cycle > DEFAULT_CYCLE_MS * 1.5
    if longer:
        saved = idle.to_numpy() * (1.0 - DEFAULT_CYCLE_MS / cycle)
        mean, lo, hi = bootstrap_mean(saved)
        significant = ctx.significant(lo)
        details.append(f"a {DEFAULT_CYCLE_MS:g} ms cycle would wait {fmt_ms(idle_m - mean)} "
                       "instead (the idle part scales with the cycle time).")
        return [Finding(
            key="cycle_time",
            headline=(f"HOROVOD_CYCLE_TIME={cycle:g} ms holds every step {fmt_ms(idle_m)} "
                      "after the last gradient is ready"),
            details=details, cost_ms=mean, cost_interval_ms=(lo, hi),
            cost_img_s=ctx.cost_img_s(mean),
            confidence=f"95% interval over {ctx.n_steps} steady steps",
            recommendation=(f"HOROVOD_CYCLE_TIME={DEFAULT_CYCLE_MS:g} (Horovod's default)"
                            if significant else ""),
            check=f"HOROVOD_CYCLE_TIME={DEFAULT_CYCLE_MS:g} ...; then profiler compare "
                  "BEFORE AFTER",
            numbers={"cycle_time_ms": cycle, "idle_ms": idle_m, "negotiation_ms": neg_m,
                     "completion_ms": comp_m, "horovod_ms": hv, "saved_ms": mean},
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
