"""The within-run A/B method of benchmarks/images_per_sec.py --within.

The statistics on synthetic iterations whose truth is known (an effect it
must find, none where there is none, the pairs' order read back right), and
one real run of benchmarks/ab_driver.py: in the unprofiled half of the pairs
the switch leaves no trace, in the profiled half every tensor is recorded."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, mpirun, requires_mpi

BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import ab_driver  # noqa: E402
import images_per_sec  # noqa: E402


def test_pairs_in_random_order() -> None:
    arms = ab_driver.arms_for(400, seed=3)
    pairs = [tuple(arms[k:k + 2]) for k in range(0, 400, 2)]
    assert set(pairs) == {("on", "off"), ("off", "on")}
    firsts = sum(p == ("on", "off") for p in pairs)
    assert 60 < firsts < 140  # both orders, neither pattern fixed
    assert ab_driver.arms_for(400, seed=3) == arms
    assert ab_driver.arms_for(400, seed=4) != arms


def synthetic(effect: float, seed: int, n: int = 400) -> dict:
    """Iterations at 100 images/sec with a slow wander and 10% noise; the
    profiled ones `effect` slower."""
    rng = random.Random(seed)
    arms = ab_driver.arms_for(n, seed)
    level, ips = 100.0, []
    for arm in arms:
        level = 0.9 * level + 0.1 * rng.uniform(80, 120)
        ips.append(level * rng.gauss(1.0, 0.1) * (1 - effect if arm == "on" else 1))
    return {"arms": arms, "images_per_sec": ips}


def test_the_interval_finds_an_effect_and_no_effect() -> None:
    runs = [synthetic(0.03, s) for s in range(3)]
    g, lo, hi = images_per_sec.geomean_interval(
        [images_per_sec.pair_ratios(r["arms"], r["images_per_sec"]) for r in runs])
    assert lo < 0.97 < hi and hi < 1.0, (g, lo, hi)
    null = [synthetic(0.0, s) for s in range(10, 13)]
    g, lo, hi = images_per_sec.geomean_interval(
        [images_per_sec.pair_ratios(r["arms"], r["images_per_sec"]) for r in null])
    assert lo < 1.0 < hi and hi - lo < 0.04, (g, lo, hi)


def test_pair_ratios_read_the_order() -> None:
    assert images_per_sec.pair_ratios(["on", "off", "off", "on"], [90, 100, 50, 40]) == \
        [0.9, 0.8]


@requires_mpi
@pytest.mark.mpi
def test_the_switch_records_only_the_profiled_half(tmp_path: Path) -> None:
    from profiler.formats.raw import read_tensor_names

    prof = tmp_path / "prof"
    warm, iters = 2, 8
    p = mpirun(2, [sys.executable, str(BENCH / "ab_driver.py"), "--seed", "5", "--",
                   "--model", "cnn", "--batch-size", "16", "--image-size", "32",
                   "--num-warmup-batches", str(warm), "--num-batches-per-iter", "1",
                   "--num-iters", str(iters), "--quiet"], cwd=tmp_path, timeout=240,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)})
    ab = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("AB ")][-1][3:])
    arms = ab["arms"]
    assert arms == ab_driver.arms_for(iters, 5) and ab["switched"]
    assert len(ab["images_per_sec"]) == iters and len(ab["cpu"]) == 2
    assert all(len(c["thread_ns"]) == iters and min(c["thread_ns"]) > 0 for c in ab["cpu"])
    for r in (0, 1):
        df = pd.read_parquet(prof / "ranks" / f"rank-{r:05d}.parquet")
        names = read_tensor_names(prof / "raw" / f"rank-{r:05d}.hvprof")
        grads = [names[s] for s in df.loc[df["op"] == "tensor", "seq"]
                 if names[s].startswith("allreduce.")]
        per_step = len(set(grads))  # the model's gradient tensors
        # every warm-up step and every profiled iteration, none of the others
        assert len(grads) == per_step * (warm + arms.count("on")), (len(grads), per_step)
        # one step record per optimizer step after the first (which opens
        # them): timed iteration i is the step that ends at its optimizer step
        steps = df[df["op"] == "step"].sort_values("t_start_ns")
        assert len(steps) == warm + iters - 1
        bg = df[(df["backend"] == "mpi") & (df["thread_kind"] != "main")]["t_start_ns"]
        meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
        to_axis = (int(meta["clock"]["job_t0_ns"])
                   + int(next(m for m in meta["ranks"] if m["rank"] == r)["offset_ns"]))
        switched = ab["cpu"][r]["switched_mono_ns"]
        for i, arm in enumerate(arms):
            row = steps.iloc[warm - 1 + i]
            # Horovod's background thread: its calls in the iteration that
            # start after this rank's switch (20 us for the clocks'
            # calibration) are recorded in the profiled half only.  (From
            # the step's start instead, a rank descheduled before its switch
            # while the other had switched gave the odd call in CI.)
            after = switched[i] - to_axis + 20_000
            assert row["t_start_ns"] < after < row["t_end_ns"], (r, i)
            inside = bg[(bg > after) & (bg < row["t_end_ns"])]
            if arm == "off":
                assert inside.empty, (r, i, len(inside))
            else:
                assert len(inside) > 0, (r, i, row["t_end_ns"] - row["t_start_ns"])
