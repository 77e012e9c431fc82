"""The profiler's own cost in one line, from the trace metadata's ``self_cost``
(written at merge by profiler.collect.selfcost): what `profiler summarize`
and the report say about what profiling this run cost."""

from __future__ import annotations

from typing import Any

from profiler.units import fmt_ns, fmt_number, fmt_share

__all__ = ["cost_line"]


def cost_line(meta: dict[str, Any] | None) -> str | None:
    """``profiler cost: 0.3% of CPU time, 0.2% of step time (worst rank): 31 ns per
    record x 12,345 records, helper thread 2.10 ms CPU, Python hooks 1.20 ms``;
    None when the trace carries no cost figures."""
    sc = (meta or {}).get("self_cost")
    if not isinstance(sc, dict) or not sc.get("ranks"):
        return None
    ranks = [r for r in sc["ranks"] if isinstance(r, dict)]
    share = sc.get("cpu_share_max")
    step = sc.get("step_share_max")
    head = []
    if share is not None:
        head.append(f"{fmt_share(share)} of CPU time")
    if step is not None:
        head.append(f"{fmt_share(step)} of step time")
    records = sum(int(r.get("records") or 0) for r in ranks)
    parts = []
    per = sc.get("call_cost_ns")
    if per is not None:
        parts.append(f"{fmt_number(round(per, 1))} ns per record (calibrated at start-up) x "
                     f"{records:,} records")
    else:
        parts.append(f"{records:,} records (per-record cost not calibrated by "
                     "this library)")
    helper = [r["helper_cpu_ns"] for r in ranks if r.get("helper_cpu_ns") is not None]
    if helper:
        parts.append(f"helper thread {fmt_ns(max(helper))} CPU")
    python = [r["python_hook_ns"] for r in ranks if r.get("python_hook_ns") is not None]
    if python and max(python) > 0:
        parts.append(f"Python hooks {fmt_ns(max(python))}")
    kernel = [r["kernel_hook_ns"] for r in ranks if r.get("kernel_hook_ns")]
    if kernel:
        parts.append(f"TensorFlow kernel hooks {fmt_ns(max(kernel))}")
    text = "profiler cost"
    if head:
        text += ": " + ", ".join(head) + (" (worst rank)" if len(ranks) > 1 else "")
    return text + ("; " if head else ": ") + ", ".join(parts)
