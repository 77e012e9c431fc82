"""Per-step table, exposed communication and correlation on synthesised training
traces whose step structure is known."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from analysis_fixtures import frame, training

from profiler.analysis.throughput import (
    correlation,
    rank_steps,
    step_table,
    steps,
    throughput_summary,
)


def test_step_rows_and_per_rank_metrics() -> None:
    df = training(steps=3, ranks=2, step_ns=10_000_000, images=32, sizes=(4096, 1 << 20),
                  call_ns=(200_000, 1_000_000), tail_ns=500_000, control_per_step=5)
    st = steps(df)
    assert len(st) == 6 and list(st["images"].unique()) == [32]
    rs = rank_steps(df)
    r0 = rs.loc[rs["rank"] == 0].set_index("step")
    assert list(r0["wall_ms"]) == [10.0, 10.0, 10.0]
    assert list(r0["images_per_s"]) == [3200.0] * 3
    assert list(r0["data_calls"]) == [2, 2, 2]
    assert list(r0["control_calls"]) == [5, 5, 5]
    assert r0.loc[1, "data_ms"] == pytest.approx(1.2)
    assert r0.loc[1, "control_ms"] == pytest.approx(0.025)
    assert r0.loc[1, "comm_union_ms"] == pytest.approx(1.2)
    assert r0.loc[1, "exposed_ms"] == pytest.approx(1.2)  # one burst
    assert r0.loc[1, "bytes"] == 4096 + (1 << 20)


def test_exposed_is_the_final_burst_after_an_idle_gap() -> None:
    # one step [0, 10 ms): data calls at 1-2 ms (trickle), gap, 7-8 and 8-9.5 ms (burst)
    rows = {
        "t_start_ns": [0, 1_000_000, 7_000_000, 8_000_000, 8_500_000],
        "t_end_ns": [10_000_000, 2_000_000, 8_000_000, 9_500_000, 8_600_000],
        "rank": [0] * 5, "op": ["step", "allreduce", "allreduce", "allreduce", "allreduce"],
        "bytes": [0, 64, 64, 64, 8], "count": [16, 16, 16, 16, 2], "seq": [0, 0, 1, 2, 3],
        "kind": ["app", "data", "data", "data", "control"], "step": [0, 0, 0, 0, 0],
        "comm_size": 1,
    }
    rs = rank_steps(frame(rows)).iloc[0]
    assert rs["comm_union_ms"] == pytest.approx(1.0 + 2.5)
    assert rs["exposed_ms"] == pytest.approx(2.5)
    assert rs["control_ms"] == pytest.approx(0.1)
    # with a gap threshold above 5 ms the whole step's traffic is one burst
    assert rank_steps(frame(rows), gap_ns=6_000_000).iloc[0]["exposed_ms"] == pytest.approx(3.5)


def test_job_table_summary_and_correlation() -> None:
    n = 12
    extra = [i * 100_000 for i in range(n)]  # comm grows by 0.1 ms per step
    df = training(steps=n, ranks=2, step_jitter_ns=extra, extra_comm_ns=extra)
    t = step_table(df)
    assert len(t) == n and (t["ranks"] == 2).all()
    assert list(t["images"]) == [64] * n
    assert t["wall_ms"].iloc[3] == pytest.approx(10.3)
    s = throughput_summary(table=t).iloc[0]
    assert s["steps"] == n - 1  # warm-up step left out
    # over the time the steady steps' windows cover (each step here runs into
    # the next by its jitter: the union, not the sum of their lengths)
    steady = t.iloc[1:]
    span_ns = steady["t_end_ns"].max() - steady["t_start_ns"].min()
    assert s["images_per_s"] == pytest.approx(64 * (n - 1) / span_ns * 1e9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = correlation(table=t).iloc[0]
    assert c["pearson"] == pytest.approx(1.0) and c["spearman"] == pytest.approx(1.0)
    assert c["slope"] == pytest.approx(1.0)
    assert c["note"] == ""


def test_images_per_sec_leaves_the_ranks_skew_out() -> None:
    """Two ranks train in 10 ms steps, rank 1's boundaries 1 ms after rank
    0's: each job step's window (earliest start to latest end) is 11 ms and
    overlaps the next by 1 ms.  The step time is the ranks' own, 10 ms, not
    the window's 11 ms (read until 12-05), and the rate is a step's images
    over it (profiler.formats.steps): 64 / 10 ms = 6,400 img/s exactly, so
    step time x rate is the images of a step.  Until 12-06 the rate was the
    images over the time the windows cover (101 ms for steps 1-10: 6,337),
    and summing the windows' lengths (110 ms) read 9% low.  Time between
    steps (an evaluation) stays out."""
    from profiler.analysis.findings.base import Context
    from profiler.analysis.throughput import run_images_per_s

    def job(gap_after: int | None) -> dict[str, list]:
        rows: dict[str, list] = {k: [] for k in ("t_start_ns", "t_end_ns", "rank", "op",
                                                  "bytes", "count", "seq", "kind", "step",
                                                  "comm_size")}
        pause = 0
        for s in range(11):
            for r in (0, 1):
                t0 = s * 10_000_000 + r * 1_000_000 + pause
                for k, v in (("t_start_ns", t0), ("t_end_ns", t0 + 10_000_000), ("rank", r),
                             ("op", "step"), ("bytes", 0), ("count", 32), ("seq", s),
                             ("kind", "app"), ("step", s), ("comm_size", 2)):
                    rows[k].append(v)
            if s == gap_after:
                pause = 50_000_000  # an evaluation between steps s and s + 1
        return rows

    for gap_after in (None, 5):
        rows = job(gap_after)
        t = step_table(frame(rows))
        assert list(t["t_end_ns"] - t["t_start_ns"]) == [11_000_000] * 11  # the windows
        assert list(t["wall_ms"]) == [10.0] * 11
        assert list(t["images_per_s"]) == [6400.0] * 11
        s = throughput_summary(table=t).iloc[0]
        assert s["steps"] == 10
        assert s["step_ms_median"] == s["step_ms_mean"] == 10.0
        assert s["images_per_s"] == 6400.0
        assert run_images_per_s(t.iloc[1:]) == s["images_per_s"]
        ctx = Context(df=frame(rows), meta={})  # the findings' header: the same figure
        assert ctx.images_per_s == 6400.0
        assert ctx.step_ms == 10.0


def test_few_steps_give_a_caveat() -> None:
    df = training(steps=4)
    with pytest.warns(UserWarning, match="not meaningful"):
        c = correlation(df)
    assert c["steps"].iloc[0] == 3
    assert "only 3 step" in c["note"].iloc[0]


def test_trace_without_steps_gives_empty_tables() -> None:
    from analysis_fixtures import sweep

    df = sweep([8, 16], iters=2)
    assert rank_steps(df).empty
    assert step_table(df).empty
    assert np.isnan(throughput_summary(df)["images_per_s"]).all() or throughput_summary(
        df).empty
