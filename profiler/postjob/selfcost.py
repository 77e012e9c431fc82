"""The trace's ``self_cost``: what the profiler cost the run, per rank and for
the job, from what each rank's metadata holds (the library's calibrated cost
per record and helper CPU time in the header; the Python hooks' time, which
profiler.collect.selfcost measures in the rank, in ``self_cost``)."""

from __future__ import annotations

from typing import Any


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _num(v: Any) -> float | None:
    """A positive finite number from rank metadata, else None (absent, 0 =
    not measured, or not a number: metadata edited by hand is not trusted)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if f > 0 and f != float("inf") else None


def job_summary(rank_meta: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace metadata's ``self_cost``: per rank and for the job, what the
    profiler cost this run: records x the calibrated cost per record, the
    helper thread's CPU time, the per-step CPU reads (cpu_read_ns: the
    library's count, their rows included and so left out of `records`), the
    Python hooks' time; as a share of the rank's
    CPU time and of its step time.  Figures the run did not measure (an older
    library, a rank converted after the fact) are None, never guessed."""
    ranks: list[dict[str, Any]] = []
    for m in rank_meta:
        h = _dict(m.get("header"))
        own = _dict(m.get("self_cost"))
        per_call = _num(h.get("call_cost_ns"))
        # the per-step CPU samples (hooks/cpu.c): the library times their
        # reads and records on the stepping thread's CPU clock; those rows
        # are priced there, not at the per-record cost
        samples = _dict(m.get("cpu"))
        cpu_read = _num(samples.get("step_read_cpu_ns"))
        cpu_rows = int(_num(samples.get("rows")) or 0) if cpu_read is not None else 0
        records = max(0, int(_num(m.get("rows")) or 0) + int(_num(m.get("aggregated_calls")) or 0)
                      - cpu_rows)
        record_ns = per_call * records if per_call is not None else None
        helper = _num(h.get("helper_cpu_ns"))
        python = _num(own.get("python_hook_ns"))
        # TensorFlow's kernel hooks: their measured time, less their records'
        # (priced above at the per-record cost)
        kernel = _num(own.get("kernel_hook_ns"))
        if kernel is not None and per_call is not None:
            kernel = max(0.0, kernel - per_call * (_num(own.get("kernel_hook_records")) or 0))
        parts = [v for v in (record_ns, helper, python, kernel, cpu_read) if v is not None]
        total = float(sum(parts)) if parts else None
        cpu = _num(own.get("process_cpu_ns"))
        # each step's share: the cost spread evenly over the process's life
        # (records, hooks and the helper's ticks all run throughout)
        wall = _num(own.get("process_wall_ns"))
        ranks.append({
            "rank": int(m.get("rank", -1)),
            "call_cost_ns": per_call,
            "records": records,
            "record_ns": record_ns,
            "helper_cpu_ns": helper,
            "python_hook_ns": python,
            "python_hook_calls": _num(own.get("python_hook_calls")),
            "kernel_hook_ns": kernel,
            "kernel_hook_records": _num(own.get("kernel_hook_records")),
            "cpu_read_ns": cpu_read,
            "cpu_rows": cpu_rows,
            "total_ns": total,
            "process_cpu_ns": cpu,
            "cpu_share": (total / cpu) if total is not None and cpu else None,
            "step_share": (total / wall) if total is not None and wall else None,
        })
    shares = [r["cpu_share"] for r in ranks if r["cpu_share"] is not None]
    steps_sh = [r["step_share"] for r in ranks if r["step_share"] is not None]
    costs = [r["call_cost_ns"] for r in ranks if r["call_cost_ns"] is not None]
    return {
        "ranks": ranks,
        "call_cost_ns": max(costs) if costs else None,
        "cpu_share_max": max(shares) if shares else None,
        "step_share_max": max(steps_sh) if steps_sh else None,
        "total_ns": sum(r["total_ns"] for r in ranks if r["total_ns"] is not None) or None,
        "method": "records x the per-record cost calibrated at start-up (call_cost_ns), "
                  "+ the helper thread's CPU time (its thread clock), + the per-step reads "
                  "of every thread's CPU figures with their rows (the stepping thread's "
                  "clock), + TensorFlow's kernel hooks' measured time beyond their "
                  "records, + the Python hooks' "
                  "own time (sampled: each sample the smaller of its wall-clock and thread-clock "
                  "intervals, the clock reads priced; an upper bound); shares of "
                  "the rank's CPU time (getrusage at exit) and of its wall time (each step's "
                  "share when the cost spreads evenly over the run)",
    }
