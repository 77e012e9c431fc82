"""The second_cycles finding against the job's own step clock (benchmarks/,
not a test: real jobs, a minute or two).

    python benchmarks/second_cycles.py                     # the default cases
    python benchmarks/second_cycles.py mlp6:1 mlp6:2 lstm:1 --steps 3000

Each case WORKLOAD:CYCLE_MS runs `python -m profiler.workloads.corpus
WORKLOAD` profiled at 2 ranks, each bound to a core, with
HOROVOD_CYCLE_TIME=CYCLE_MS, then `profiler advise --format json` on its
trace.  One line a case: the job's own share of slow steps (the corpus
loop's clock: steps at least 1.5 times its 10th percentile step, its RESULT
line's slow_share), and what second_cycles says (claimed or not, the share
of steps a whole cycle above the fast ones, the steps in its test's two
windows, p, what it explains).  Where a waited step is 1.5 times a fast one
the two shares measure the same steps; a 2 ms cycle keeps mlp6 away from
the cycle's edge (the cause absent).  Figures: docs/validation.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

DEFAULT = ["mlp6:1", "mlp6:2", "fp16:1", "accum:1", "lstm:1", "lstm:2"]
STEPS = {"lstm": 600, "accum": 1500}


def run_case(case: str, steps: int | None, work: Path) -> dict[str, Any]:
    workload, _, cycle = case.partition(":")
    n = steps or STEPS.get(workload, 3000)
    out = work / f"{workload}-{cycle or 'default'}"
    env = {**os.environ, "HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(out)}
    env.pop("OMPI_MCA_hwloc_base_binding_policy", None)
    if cycle:
        env["HOROVOD_CYCLE_TIME"] = cycle
    p = subprocess.run(["mpirun", "-n", "2", "--bind-to", "core", sys.executable, "-m",
                        "profiler.workloads.corpus", workload, "--steps", str(n)],
                       env=env, capture_output=True, text=True, timeout=600)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"second_cycles: {case} failed ({p.returncode}): {p.stderr[-1000:]}")
    own = json.loads(line[len("RESULT "):])["timing"].get("slow_share")
    a = subprocess.run([sys.executable, "-m", "profiler.cli", "advise",
                        str(out / "trace.json"), "--format", "json"],
                       capture_output=True, text=True, timeout=600)
    if a.returncode != 0:
        raise SystemExit(f"second_cycles: advise on {case} failed: {a.stderr.strip()}")
    found = [f for f in json.loads(a.stdout)["findings"] if f["key"] == "second_cycles"]
    shutil.rmtree(out, ignore_errors=True)
    return {"case": case, "steps": n, "own_slow_share": own,
            "finding": found[0] if found else None}


def describe(r: dict[str, Any]) -> str:
    own = r["own_slow_share"]
    head = f"{r['case']:10} {r['steps']:5d} steps  job's own slow steps " + (
        f"{own:6.1%}" if own is not None else "     -")
    f = r["finding"]
    if f is None:
        return head + "  second_cycles: none"
    nb = f["numbers"]
    state = ("claimed" if f["significant"] else "not claimed" if f["not_claimed"]
             else "below the noise floor")
    share = f" {nb['share']:.1%}" if "share" in nb else ""
    explains = f", explains {f['cost_ms'] * 1e3:.0f} us a step" if f["cost_ms"] else ""
    return (head + f"  second_cycles: {state}{share}; {nb['peak']} steps a cycle above, "
            f"{nb['trough']} half a cycle (p = {nb['p_value']:.2g}){explains}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", default=DEFAULT, help="WORKLOAD:CYCLE_MS")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="second-cycles-") as tmp:
        for case in args.cases:
            r = run_case(case, args.steps, Path(tmp))
            print(describe(r), flush=True)
            rows.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
