"""A late rank's cost against its twin, on frames whose truth is exact: the
Horovod-like trace of tests/test_breakdown.py (horovod_job), every rank's
arrival jittered (uniform or exponential), one rank later by a drawn amount;
its twin is the same draw without that amount, and the truth is the twin's
difference in mean step time.  Seeds 1000 and up were never used while the
counterfactual was written (the tests use 100-105).

    python benchmarks/late_counterfactual.py [--seeds 1000:1030]

Prints each seed's draw, the truth and three figures: the counterfactual
(late_ranks' cost), the others' waiting averaged over the ranks (its old
headline) and the rank's whole lead per step (its old second figure), then
how many of each lie within 25% of the truth.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_breakdown import horovod_job  # noqa: E402

from profiler.analysis.findings import advise_frame  # noqa: E402


def step_mean(df) -> float:  # type: ignore[no-untyped-def]
    st = df.loc[df["op"] == "step"]
    return float(((st["t_end_ns"] - st["t_start_ns"]) / 1e6).groupby(st["step"]).mean().mean())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1000:1030", help="FIRST:STOP")
    a = p.parse_args()
    first, stop = (int(x) for x in a.seeds.split(":"))
    rows = []
    print("seed ranks shape jitter_ms late_rank late_ms truth counterfactual others_wait "
          "whole_lead named")
    for seed in range(first, stop):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(2, 5))
        late_ms = float(rng.uniform(5, 40))
        jitter = float(rng.choice([10, 20, 40, 60]))
        shape = str(rng.choice(["uniform", "exponential"]))
        r = int(rng.integers(0, n))
        base = (rng.uniform(0, jitter, size=(60, n)) if shape == "uniform"
                else rng.exponential(jitter / 2, size=(60, n))) + 20
        late = base.copy()
        late[:, r] += late_ms
        df, meta = horovod_job(late.tolist())
        truth = step_mean(df) - step_mean(horovod_job(base.tolist())[0])
        f = next((f for f in advise_frame(df, meta).findings if f.key == "late_ranks"), None)
        named = f is not None and f.significant and f.numbers["rank"] == r
        figs = ((f.cost_ms, f.numbers["others_wait_ms_per_step"],
                 f.numbers["whole_lead_ms_per_step"]) if f is not None else (None,) * 3)
        rows.append((truth, figs, named))
        print(seed, n, shape, f"{jitter:g}", r, f"{late_ms:.1f}", f"{truth:.2f}",
              *("-" if v is None else f"{v:.2f}" for v in figs), named)
    hits = [(t, figs) for t, figs, named in rows if named]
    print(f"\nnamed: {len(hits)} of {len(rows)} (the rest: effects within the jitter)")
    for i, name in enumerate(("counterfactual (the cost)", "others' waiting (old headline)",
                              "whole lead (old second figure)")):
        within = sum(abs(figs[i] - t) <= 0.25 * t for t, figs in hits)
        err = float(np.median([abs(figs[i] - t) / t for t, figs in hits])) if hits else float("nan")
        print(f"{name}: within 25% of the twin in {within}/{len(hits)}, median error {err:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
