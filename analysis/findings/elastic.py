"""Elastic Horovod: what the resets cost, and which epoch the other findings
describe.

The merge (profiler.postjob.epochs) writes the job's membership epochs under
the trace's ``elastic`` block and, when there is more than one, a window that
holds only the epoch with the most steps: every other finding, the step
breakdown and images/sec are that epoch's, never a mix of world sizes.  This
finding says so, and what each reset cost: the time from its first sign (a
shutdown, or a killed worker's last record) to the first step completed after
it, training time the job lost; it claims no per-step cost (a reset is not
part of any step)."""

from __future__ import annotations

from typing import Any

from profiler.units import fmt_ns

from .base import Context, Finding


def _members(epoch: dict[str, Any]) -> str:
    return ", ".join(f"rank {m['rank']} (pid {m['pid']})" for m in epoch.get("members", []))


def analyze(ctx: Context) -> list[Finding]:
    block = ctx.meta.get("elastic")
    if not isinstance(block, dict) or not block.get("epochs"):
        return []
    epochs: list[dict[str, Any]] = block["epochs"]
    resets: list[dict[str, Any]] = block.get("resets", [])
    ended = {p["file"]: p["ended"] for p in block.get("processes", [])}
    details = []
    for e in epochs:
        secs = (int(e["end_ns"]) - int(e["start_ns"])) / 1e9
        rate = e.get("images_per_sec")
        details.append(f"epoch {e['index']}: world size {e['world_size']}, "
                       f"{fmt_ns(secs * 1e9)}, {e['steps']} steps"
                       + (f", {rate:,.1f} images/sec" if rate else "")
                       + f"; {_members(e)}")
    costs = [int(r["cost_ns"]) for r in resets if r.get("cost_ns") is not None]
    for r in resets:
        gone = ", ".join(f"file {f} ({ended.get(f, '?')})" for f in r.get("gone", []))
        came = ", ".join(f"file {f}" for f in r.get("came", []))
        cost = (f"{fmt_ns(r['cost_ns'])} from its first sign to the first "
                "step after it" if r.get("cost_ns") is not None else "no step after it")
        details.append(f"reset {r['from']} -> {r['to']} ({r['kind']}"
                       + (f": {gone}" if gone else "") + (f"; new: {came}" if came else "")
                       + f"): {cost}, of which re-initialization "
                       f"{fmt_ns(r['reinit_ns'])}")
    analysed = block.get("analysed")
    if analysed is not None:
        e = epochs[int(analysed)]
        details.append(f"every other figure here is epoch {analysed}'s alone (world size "
                       f"{e['world_size']}, {e['steps']} steps, the most of any epoch): the "
                       "trace's window; epochs of other sizes are never mixed into it")
    total = sum(costs) / 1e9
    headline = (f"Elastic job: {len(epochs)} membership epoch{'s' * (len(epochs) != 1)}, "
                f"{len(resets)} reset{'s' * (len(resets) != 1)}"
                + (f" costing {fmt_ns(total * 1e9)} of training" if costs else ""))
    return [Finding(
        key="elastic",
        headline=headline,
        details=details,
        confidence="from each process's hvd.init/hvd.shutdown times and its step records",
        recommendation=("a reset also loses the steps since the last state.commit(): commit "
                        "as often as that loss is worth; an addition's re-initialization is "
                        "mostly the new worker starting (its imports), which hvd.init waits for"
                        if costs else ""),
        check="profiler summarize TRACE (the analysed epoch); trace.json's 'elastic' block",
        numbers={"epochs": len(epochs), "resets": len(resets), "reset_cost_s": total,
                 "analysed": analysed},
        significant=bool(costs),
    )]
