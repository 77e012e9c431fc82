"""Can an in-run twin price a busy neighbour?  For a busy-neighbour seed of
randomized.py, unprofiled runs, alternating, each round:

* cont: the loops running throughout (what a profiled run meets);
* none: no loops (the counterfactual);
* then, for each way of switching the loops between steps (job.py
  --toggle-how), one --alternate run: its steps with the loops (on) and the
  mean of their neighbours without (off).

An in-run twin is sound when its "on" steps take what cont's steps take and
its "off" steps what none's take.  Measured 2026-12-06 (docs/validation.md):
stopped loops leave "off" near none, but their "on" steps take 0.3-7.1 ms
more than cont's on every seed tried; loops at SCHED_IDLE leave "on" near cont, but
"off" far above none (the job's yielding threads hand them the CPU).  So
randomized.py prices busy neighbours by twins (cont against none).

    python benchmarks/scenarios/toggle_check.py --seeds 333,44 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import randomized  # noqa: E402  (this folder)

suite = randomized.suite
HOWS = ("stop", "idle", "stopidle")


def check(seed: int, rounds: int, work: Path, hows: Sequence[str] = HOWS) -> dict[str, object]:
    """One seed's rounds: cont and none step means, and per toggle the (on,
    off) means of its alternate runs (ms, the ranks' mean)."""
    d = randomized.draw(seed)
    if d.cause != "busy":
        raise SystemExit(f"toggle_check: seed {seed} draws {d.cause}, not busy")
    sc = d.scenario
    res: dict[str, list] = {"cont": [], "none": [], **{h: [] for h in hows}}
    t0 = time.monotonic()
    for i in range(rounds):
        print(f"  seed {seed} round {i + 1}/{rounds} ({time.monotonic() - t0:.0f} s)",
              file=sys.stderr, flush=True)
        m = suite.run_job(sc, work / f"{seed}-cont{i}", profile=False)
        res["cont"].append(suite._mean(m["ranks"], "step_ms"))
        m = suite.run_job(sc, work / f"{seed}-none{i}", profile=False, twin=True)
        res["none"].append(suite._mean(m["ranks"], "step_ms"))
        for how in hows:
            suite.TOGGLE_HOW = how
            m = suite.run_job(sc, work / f"{seed}-{how}{i}", profile=False, alternate=i % 2)
            pairs = suite.alternate_pairs(m, i % 2)
            res[how].append((float(np.mean([p[0] for p in pairs])),
                             float(np.mean([p[1] for p in pairs]))))
    suite.TOGGLE_HOW = "stop"
    return {"seed": seed, "params": d.params, **res}


def table(rows: Sequence[dict[str, object]], hows: Sequence[str] = HOWS) -> str:
    out = ["| seed | ranks, loops, where | cont | none | cont - none | "
           + " | ".join(f"{h}: on / off (on - off)" for h in hows) + " |",
           "|---|---|---|---|---|" + "---|" * len(hows)]
    for r in rows:
        p = r["params"]
        assert isinstance(p, dict)
        c, n = np.mean(r["cont"]), np.mean(r["none"])
        cells = []
        for h in hows:
            a = np.array(r[h])
            cells.append(f"{a[:, 0].mean():.1f} / {a[:, 1].mean():.1f} "
                         f"({(a[:, 0] - a[:, 1]).mean():.1f})")
        out.append(f"| {r['seed']} | {p['np']}, {p['busy']}, {p['busy_where']} | {c:.1f} | "
                   f"{n:.1f} | {c - n:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", required=True, help="busy seeds, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--how", default=",".join(HOWS), help="toggles to try (job.py --toggle-how)")
    p.add_argument("--work", type=Path, default=Path("/tmp/hvprof-toggle-check"))
    a = p.parse_args(argv)
    hows = [h for h in a.how.split(",") if h]
    if not set(hows) <= set(HOWS):
        p.error(f"--how: choose from {', '.join(HOWS)}")
    a.work.mkdir(parents=True, exist_ok=True)
    rows = [check(int(s), a.rounds, a.work, hows) for s in a.seeds.split(",")]
    print(table(rows, hows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
