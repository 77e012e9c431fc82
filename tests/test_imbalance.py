"""Cross-rank matching by (comm, seq), waiting time and straggler ranking on
synthesised frames with a known late rank."""

from __future__ import annotations

import pytest
from analysis_fixtures import concat, frame, training

from profiler.analysis.imbalance import match_calls, rank_times, stragglers
from profiler.errors import ProfilerError


def _three_rank_call() -> object:
    # one allreduce (seq 0) on 3 ranks arriving at 100, 400, 250; all leave at 900;
    # one bcast (seq 1) arriving together; one call seen by two ranks only (seq 2)
    return frame({
        "t_start_ns": [100, 400, 250, 1000, 1000, 1000, 2000, 2300],
        "t_end_ns": [900, 900, 900, 1100, 1100, 1100, 2500, 2500],
        "rank": [0, 1, 2, 0, 1, 2, 0, 1],
        "op": ["allreduce"] * 3 + ["bcast"] * 3 + ["allreduce"] * 2,
        "bytes": [64] * 3 + [8] * 3 + [16] * 2,
        "seq": [0, 0, 0, 1, 1, 1, 2, 2],
        "comm_size": 3,
    })


def test_match_spread_wait_and_last_rank() -> None:
    m = match_calls(_three_rank_call()).set_index("seq")  # type: ignore[arg-type]
    assert list(m.index) == [0, 1, 2]
    assert m.loc[0, "spread_ns"] == 300
    assert m.loc[0, "last_rank"] == 1
    assert m.loc[0, "wait_ns"] == (400 - 100) + (400 - 250)
    assert m.loc[0, "n_ranks"] == 3 and bool(m.loc[0, "complete"])
    assert m.loc[0, "duration_ns"] == 800
    assert m.loc[1, "last_rank"] == -1 and m.loc[1, "wait_ns"] == 0  # tie: no straggler
    assert not bool(m.loc[2, "complete"]) and m.loc[2, "last_rank"] == 1
    strict = match_calls(_three_rank_call(), min_spread_ns=300).set_index("seq")  # type: ignore[arg-type]
    assert strict.loc[0, "last_rank"] == -1 and strict.loc[2, "last_rank"] == -1


def test_straggler_ranking_from_training_trace() -> None:
    df = training(steps=5, ranks=4, late_rank=2, late_ns=40_000, control_per_step=3)
    m = match_calls(df)
    data = m.loc[m["kind"] == "data"]
    assert len(data) == 5 * 2  # two data allreduces per step
    assert (data["last_rank"] == 2).all()
    assert (data["spread_ns"] == 40_000).all()
    assert (data["wait_ns"] == 3 * 40_000).all()
    s = stragglers(df)
    assert list(s["rank"]) [0] == 2
    top = s.iloc[0]
    assert top["last_count"] == 10 and top["last_share"] == pytest.approx(1.0)
    assert top["caused_wait_s"] == pytest.approx(10 * 3 * 40_000 / 1e9)
    assert top["mean_lateness_us"] == pytest.approx(40.0)
    assert sorted(s["rank"]) == [0, 1, 2, 3]
    assert list(s["rank_order"]) == [1, 2, 3, 4]


def test_rank_times_split_by_kind_and_waiting() -> None:
    df = training(steps=2, ranks=2, late_rank=1, late_ns=10_000, control_per_step=2,
                  call_ns=(1000, 2000), sizes=(4, 8))
    r = rank_times(df).set_index("rank")
    # rank 0 data calls last (d + late); rank 1 d
    assert r.loc[0, "data_s"] == pytest.approx(2 * (1000 + 2000 + 2 * 10_000) / 1e9)
    assert r.loc[1, "data_s"] == pytest.approx(2 * (1000 + 2000) / 1e9)
    assert r.loc[0, "control_s"] == pytest.approx(2 * 2 * 5000 / 1e9)
    assert r.loc[0, "calls"] == 2 * (2 + 2)
    assert r.loc[0, "waited_s"] == pytest.approx(4 * 10_000 / 1e9)
    assert r.loc[1, "waited_s"] == 0
    assert r.loc[0, "bytes"] == 2 * (4 + 8)


def test_labels_are_kept_apart() -> None:
    a = training(steps=2, ranks=2, late_rank=0, late_ns=5000, label="a")
    b = training(steps=2, ranks=2, late_rank=1, late_ns=5000, label="b")
    s = stragglers(concat(a, b))
    top = s.loc[s["rank_order"] == 1].set_index("label")["rank"].to_dict()
    assert top == {"a": 0, "b": 1}


def test_missing_columns_raise() -> None:
    df = training(steps=1).drop(columns=["seq"])
    with pytest.raises(ProfilerError):
        match_calls(df)


def test_group_order_is_the_four_key_sort() -> None:
    """The folded (label, comm, seq) key sorts exactly as the four-key lexsort,
    communicators of any 64-bit value included, and falls back to it where the
    folded key would overflow."""
    import numpy as np

    from profiler.analysis.imbalance import _group_order

    rng = np.random.default_rng(3)
    n = 20_000
    lab = rng.integers(0, 3, n)
    comm = rng.choice(np.array([5, 2**63 + 7, 99, 2**40, 2**64 - 1], dtype=np.uint64), n)
    t0 = rng.integers(0, 10**12, n)
    for seq in (rng.integers(0, 1000, n), rng.integers(0, 2**61, n)):  # the second overflows
        assert (_group_order(lab, comm, seq, t0) == np.lexsort((t0, seq, comm, lab))).all()
