"""Each concept is computed by the module that owns it, and the others call it:
the steady steps and images/sec (profiler.formats.steps), the FASTREC switch
(profiler.collect.tensors), the order of call kinds (profiler.formats.record),
and `profiler watch`'s defaults (profiler.formats.buckets).  Each test fails
when a second definition departs from the first."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.formats import steps as S

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------
# steady steps: the watcher's fold is formats.steps' rule, to the last integer
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("marked", [False, True], ids=["warmup-by-count", "warmup-marked"])
@pytest.mark.parametrize("seed", range(6))
def test_the_fold_of_steps_is_the_rule_on_every_step(seed: int, marked: bool) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    step = rng.permutation(np.arange(n) + int(rng.integers(0, 5)))
    dur = rng.integers(1_000, 9_000_000, n)
    images = np.full(n, 32)
    if marked:
        images[np.argsort(step)[:int(rng.integers(1, n + 1))]] = 0  # a marked warm-up
    fold = S.StepFold()
    for chunk in np.array_split(np.arange(n), int(rng.integers(1, 5))):  # as chunks arrive
        fold.add(step[chunk], dur[chunk], images[chunk])
    expected = S.rank_totals(step, np.zeros(n, np.int64), dur, images)
    assert fold.totals() == expected


def test_the_rule_is_what_the_module_says() -> None:
    # unmarked: the first step by number is the warm-up; marked: the steps with images
    t = S.rank_totals(np.array([3, 1, 2]), np.zeros(3, np.int64), np.array([30, 10, 20]),
                      np.array([8, 8, 8]))
    assert (t.rank_steps, t.rank_ns, t.images) == (2, 50, 16)
    t = S.rank_totals(np.array([1, 2, 3]), np.zeros(3, np.int64), np.array([10, 20, 30]),
                      np.array([0, 8, 8]))
    assert (t.rank_steps, t.rank_ns, t.images) == (2, 50, 16)
    # a window has no warm-up: every step, or those with images
    w = S.window_totals(np.array([10, 20, 30]), np.array([8, 8, 8]))
    assert (w.rank_steps, w.rank_ns, w.images) == (3, 60, 24)
    # and the watcher keeps no rule of its own
    src = (ROOT / "analysis" / "live_snapshot.py").read_text(encoding="utf-8")
    assert "WARMUP_STEPS" not in src and "first_step" not in src


# ---------------------------------------------------------------------------
# images/sec: the bundled benchmark's job figure is the profiler's definition
# ---------------------------------------------------------------------------
def test_the_benchmarks_job_rate_is_the_profilers_definition() -> None:
    from profiler.workloads.train_bench import job_images_per_sec

    # two ranks, 10 steps of 32 images each; rank 1 three times slower
    rate = job_images_per_sec([1.0, 3.0], 32, 10)
    totals = S.StepTotals(images=640, rank_ns=4_000_000_000, rank_steps=20, steps=10)
    assert rate == S.images_per_s(totals) == 320.0
    # not the ranks' own rates summed (320 + 106.7)
    assert rate != pytest.approx(320.0 + 320.0 / 3)
    # main-job.sh prints the trace's figure, not the benchmark's "Total img/sec"
    sh = (ROOT / "scripts" / "main-job.sh").read_text(encoding="utf-8")
    assert "Total img/sec" not in sh and "read_trace_meta" in sh


# ---------------------------------------------------------------------------
# HOROVOD_PROFILE_FASTREC: one reader, profiler.collect.tensors
# ---------------------------------------------------------------------------
def test_fastrec_is_read_in_one_place() -> None:
    readers = []
    sources = sorted((ROOT / "profiler").rglob("*.py")) + sorted((ROOT / "analysis").rglob("*.py"))
    for path in sources:
        if path.name == "_env.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and any(
                    isinstance(a, ast.Constant) and a.value == "HOROVOD_PROFILE_FASTREC"
                    for a in node.args):
                readers.append(path.relative_to(ROOT).as_posix())
    assert readers == ["profiler/collect/tensors.py"], readers


# ---------------------------------------------------------------------------
# the order of call kinds: formats.record.CALL_KINDS, p2p included
# ---------------------------------------------------------------------------
def test_the_engine_orders_kinds_as_the_record_format() -> None:
    from profiler.analysis.engine import Overview, _order_key
    from profiler.formats.record import CALL_KINDS

    kinds = ["zz", "p2p", "app", "control", "data"]
    per = pd.DataFrame({"rank": 0, "kind": kinds, "backend": "mpi", "calls": 1,
                        "total_ns": 1, "t0": 0, "t1": 1})
    assert Overview(per_rank=per).kinds() == [*CALL_KINDS, "zz"]
    s = pd.Series(kinds)
    assert s.iloc[np.argsort(_order_key("kind", s).to_numpy())].tolist() == [*CALL_KINDS, "zz"]
    assert CALL_KINDS == ("data", "control", "app", "p2p")


# ---------------------------------------------------------------------------
# profiler watch's defaults: one home, the command, the watcher and the facade
# ---------------------------------------------------------------------------
def test_watch_defaults_have_one_home() -> None:
    from profiler.analysis.facade import TraceAnalysis
    from profiler.analysis.live import Watcher
    from profiler.cli import build_parser
    from profiler.formats import buckets

    home = {"window_s": buckets.WINDOW_S, "stuck_factor": buckets.STUCK_FACTOR,
            "stale_s": buckets.STALE_S}
    for fn in (Watcher.__init__, TraceAnalysis.watch):
        sig = inspect.signature(fn)
        assert {k: sig.parameters[k].default for k in home} == home, fn
    args = build_parser().parse_args(["watch", "DIR"])
    assert (args.window, args.stuck_factor, args.stale, args.interval) == (
        buckets.WINDOW_S, buckets.STUCK_FACTOR, buckets.STALE_S, buckets.INTERVAL_S)
