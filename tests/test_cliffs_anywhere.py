"""Latency cliffs wherever they sit on the job's curve (issue #45): at the largest
message size, in the middle, at the smallest, each judged against a reference
it cannot pull (the line through the other sizes, the time per byte of smaller
sizes); and clean curves, with noise and with a legitimate protocol switch,
that flag nothing.  Traces from tests/analysis_fixtures.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from analysis_fixtures import alpha_beta_ns, sweep, training

from profiler.analysis.findings import Context, advise_frame, cliffs

# a small model's gradients, fusion off: 40 B .. 51,200 B (38,400 B is 0.75x the largest)
SIZES = [40, 128, 512, 1600, 4096, 6400, 12800, 25600, 38400, 51200]
ALPHA_US, BW_GBPS = 2.0, 2.0  # 51,200 B: 27.6 us clean, bandwidth-bound at the top
SLOW = 8.0
#: the run's small calls scattered by the moment they ran, as a real job's are
#: (the top three on the curve): a fit through every size is loose, and the
#: largest size, 8x slow, widens its noise scale and pulls it
SCATTER = [2.3, 0.4, 1.3, 0.9, 1.3, 1.35, 1.0, 1.0, 1.0, 1.0]


def _clean_ns(size: int) -> float:
    return float(alpha_beta_ns(size, ALPHA_US, BW_GBPS))


def _job(cliff: int, steps: int = 160, scatter: list[float] | None = None) -> pd.DataFrame:
    """One call of each size a step and rank (`steps` calls a rank), `cliff`
    SLOW times its clean time."""
    k = scatter or [1.0] * len(SIZES)
    durs = [int(round(_clean_ns(s) * f * (SLOW if s == cliff else 1.0)))
            for s, f in zip(SIZES, k)]
    return training(steps=steps, sizes=SIZES, call_ns=durs, step_ns=4_000_000, sync=True,
                    control_per_step=0)


def _cliffs(df: pd.DataFrame, replay: pd.DataFrame | None = None):  # type: ignore[no-untyped-def]
    rep = Context(df=replay, meta={}) if replay is not None else None
    a = advise_frame(df, {}, only=["latency_cliffs"], replay=rep)
    return [f for f in a.findings if f.key == "latency_cliffs"]


def _flagged_confirmed_and_priced(cliff: int, scatter: list[float] | None = None) -> None:
    """Flagged in the run, confirmed by a replay with the cliff, priced at its
    excess (significant where that clears the noise floor), dismissed by a
    replay without it."""
    df = _job(cliff, scatter=scatter)
    (f,) = _cliffs(df)
    assert cliff in f.numbers["sizes"] and not f.significant
    if scatter is None:
        assert f.numbers["sizes"] == [cliff]
    # the replay measures the suspect bracketed on both sides
    sizes = f.numbers["replay_sizes"]
    assert cliff in sizes and min(sizes) < cliff < max(sizes)
    replay = sweep(sizes, alpha_us=ALPHA_US, bw_gbps=BW_GBPS, iters=9, spikes={cliff: SLOW})
    (g,) = _cliffs(df, replay)
    assert g.numbers["confirmed"] == [cliff]
    # one call a step and rank, each (SLOW - 1) clean times above the curve
    expected_ms = (SLOW - 1.0) * _clean_ns(cliff) / 1e6
    assert g.cost_ms == pytest.approx(expected_ms, rel=0.02)
    assert g.significant == (expected_ms > 0.1)  # the floor: 0.05 ms, 1% of the step
    # the same sizes replayed without the cliff: not claimed
    (h,) = _cliffs(df, sweep(sizes, alpha_us=ALPHA_US, bw_gbps=BW_GBPS, iters=9))
    assert h.numbers["confirmed"] == [] and not h.significant and h.cost_ms is None


def test_a_cliff_at_the_largest_size_is_flagged_confirmed_and_priced() -> None:
    # the job: 160 calls at the largest size, 8x slow; the run's other
    # sizes scattered, so only 40 B sat above a fit that included the cliff
    _flagged_confirmed_and_priced(SIZES[-1], scatter=SCATTER)
    # and on a clean curve, priced on the line through the next sizes down
    _flagged_confirmed_and_priced(SIZES[-1])


def test_a_cliff_at_a_middle_size_is_flagged_confirmed_and_priced() -> None:
    _flagged_confirmed_and_priced(SIZES[5])


def test_a_cliff_at_the_smallest_size_is_flagged_confirmed_and_priced() -> None:
    _flagged_confirmed_and_priced(SIZES[0])


def test_a_cliff_at_the_largest_bandwidth_bound_size_is_flagged() -> None:
    # a wide sweep whose top sizes are bandwidth-bound: the largest, 8x slow,
    # pulls a fit that includes it; the line through the others and the time
    # per byte of the smaller sizes do not move
    sizes = [1 << k for k in range(3, 25)]
    df = sweep(sizes, noise=0.05, iters=21, seed=4, spikes={sizes[-1]: SLOW})
    (f,) = _cliffs(df)
    assert f.numbers["sizes"] == [sizes[-1]]
    assert max(f.numbers["ratios"]) == pytest.approx(SLOW, rel=0.15)


def test_the_top_two_sizes_on_a_slow_algorithm_are_both_flagged() -> None:
    sizes = [1 << k for k in range(3, 25)]
    df = sweep(sizes, noise=0.05, iters=21, seed=2, spikes={s: SLOW for s in sizes[-2:]})
    (f,) = _cliffs(df)
    assert sorted(f.numbers["sizes"]) == sizes[-2:]


# nulls: sizes from latency-bound (flat) to bandwidth-bound, powers of two, in
# between, and a gradient-like odd few
NULL_SIZES = sorted({1 << k for k in range(2, 27)} | {3 << k for k in range(2, 25)}
                    | {40, 1600, 6400, 12800, 25600, 38400, 51200, 100_000, 2_359_296})


@pytest.mark.parametrize("seed", range(20))
def test_a_clean_noisy_curve_flags_nothing(seed: int) -> None:
    df = sweep(NULL_SIZES, alpha_us=3.0, bw_gbps=8.0, iters=20, noise=0.08, seed=seed)
    assert _cliffs(df) == []


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("at", [4096, 1 << 20, 24 << 20])
def test_a_protocol_switch_slower_per_byte_flags_nothing(seed: int, at: int) -> None:
    # above `at`, every size 1.4x slower than the curve below: a switch, not a cliff
    a, bw = 3.0, 8.0
    df = sweep(NULL_SIZES, alpha_us=a, bw_gbps=bw, iters=20, noise=0.08, seed=seed,
               regions=[(at, a * 1.4, bw / 1.4)])
    assert _cliffs(df) == []


@pytest.mark.parametrize("seed", range(5))
def test_eager_to_rendezvous_knee_flags_nothing(seed: int) -> None:
    # a higher latency and a faster link above 64 KiB (test_analysis_model's knee)
    df = sweep(NULL_SIZES, alpha_us=2.0, bw_gbps=5.0, iters=20, noise=0.08, seed=seed,
               regions=[(1 << 16, 20.0, 9.0)])
    assert _cliffs(df) == []


def test_a_clean_job_flags_nothing() -> None:
    assert _cliffs(_job(cliff=-1, steps=40)) == []


def test_the_scattered_job_without_the_cliff_flags_only_its_small_outlier() -> None:
    # 40 B, 2.3x: slower than larger sizes (the replay dismisses it); nothing at the top
    (f,) = _cliffs(_job(cliff=-1, steps=40, scatter=SCATTER))
    assert max(f.numbers["sizes"]) < SIZES[-3]


def test_replay_sizes_bracket_the_largest_size_from_above() -> None:
    an = pd.DataFrame({"bytes": SIZES})
    out = cliffs.replay_sizes(an, an.loc[an["bytes"] == SIZES[-1]])
    above = [s for s in out if s > SIZES[-1]]
    assert SIZES[-1] in out and SIZES[-2] in out
    assert 1.4 * SIZES[-1] <= min(above) <= 1.6 * SIZES[-1] and max(above) >= 2 * SIZES[-1]
    assert all(s % 4 == 0 for s in out)
    # and the smallest from below
    out = cliffs.replay_sizes(an, an.loc[an["bytes"] == SIZES[0]])
    assert min(out) < SIZES[0] < max(out)


def test_the_run_reference_of_the_largest_size_is_on_the_curve() -> None:
    # priced against the line through the next sizes down, not the flat time
    # of its smaller neighbour
    st = pd.DataFrame({"bytes": SIZES, "median_us": [_clean_ns(s) / 1e3 for s in SIZES]})
    ref = cliffs.reference_us(st, SIZES[-1], {SIZES[-1]})
    assert ref == pytest.approx(_clean_ns(SIZES[-1]) / 1e3, rel=0.03)
    assert np.isfinite(ref)


# a fused job: one buffer a step, 2,658,304 B (the heads model's gradients,
# benchmarks/scenarios/job.py), and nothing beside it on the run's curve
FUSED = 2_658_304
#: the bench of the same fabric: the job's size and the powers of two around it
BENCH_SIZES = sorted({FUSED} | {1 << k for k in range(10, 23)})


def _fused_job(slow: float, steps: int = 40) -> pd.DataFrame:
    return training(steps=steps, sizes=[FUSED], call_ns=[int(_clean_ns(FUSED) * slow)],
                    step_ns=40_000_000, sync=True, control_per_step=0)


def _with_bench(df: pd.DataFrame, bench: pd.DataFrame, replay: pd.DataFrame | None = None
                ) -> list:  # type: ignore[type-arg]
    rep = Context(df=replay, meta={}) if replay is not None else None
    a = advise_frame(df, {}, only=["latency_cliffs"], bench=Context(df=bench, meta={}),
                     replay=rep)
    return [f for f in a.findings if f.key == "latency_cliffs"]


def test_a_fused_buffer_alone_on_a_cliff_is_judged_against_the_bench() -> None:
    """One size a step has no curve of its own: without a bench nothing can
    be judged, and nothing is said.  Against the bench's curve it is
    flagged; a replay with the cliff confirms it and prices every call above
    the bench's curve there (the details say so); a replay without it
    dismisses it."""
    df = _fused_job(SLOW)
    bench = sweep(BENCH_SIZES, alpha_us=ALPHA_US, bw_gbps=BW_GBPS, iters=9)
    assert _cliffs(df) == []
    (f,) = _with_bench(df, bench)
    assert f.numbers["sizes"] == [FUSED] and not f.significant
    assert f.numbers["ratios"] == [pytest.approx(SLOW, rel=0.05)]
    sizes = f.numbers["replay_sizes"]
    assert min(sizes) < FUSED < max(sizes)
    replay = sweep(sizes, alpha_us=ALPHA_US, bw_gbps=BW_GBPS, iters=9, spikes={FUSED: SLOW})
    (g,) = _with_bench(df, bench, replay)
    assert g.numbers["confirmed"] == [FUSED] and g.significant
    line = cliffs.reference_us(cliffs._per_size(sweep(BENCH_SIZES, alpha_us=ALPHA_US,
                                                      bw_gbps=BW_GBPS, iters=9)
                                                .pipe(_stats)), FUSED, {FUSED})
    assert g.cost_ms == pytest.approx((SLOW * _clean_ns(FUSED) / 1e3 - line) / 1e3, rel=0.02)
    assert any("bench's curve" in d for d in g.details), g.details
    (h,) = _with_bench(df, bench, sweep(sizes, alpha_us=ALPHA_US, bw_gbps=BW_GBPS, iters=9))
    assert h.numbers["confirmed"] == [] and not h.significant


@pytest.mark.parametrize("slow", [1.0, 1.3])
def test_a_fused_buffer_near_the_bench_flags_nothing(slow: float) -> None:
    """The fused buffer at the bench's speed, or 1.3x slower (a run beside
    compute is slower than a bench alone): below MIN_RATIO, nothing."""
    bench = sweep(BENCH_SIZES, alpha_us=ALPHA_US, bw_gbps=BW_GBPS, iters=9)
    assert _with_bench(_fused_job(slow), bench) == []


def _stats(df: pd.DataFrame) -> pd.DataFrame:
    from profiler.analysis.model import latency_by_size

    return latency_by_size(df)


def test_a_confirmed_cliffs_calls_are_not_inefficiency_too() -> None:
    """One wait, one cause: the fused buffer 8x above the bench is slow by its
    size (latency_cliffs, confirmed); the efficiency finding against the same
    bench leaves those calls out, and says so.  Dismissed by the replay, the
    same calls are the efficiency finding's."""
    df = _fused_job(SLOW)
    bench = sweep(BENCH_SIZES, alpha_us=ALPHA_US, bw_gbps=BW_GBPS, iters=9)
    sizes = _with_bench(df, bench)[0].numbers["replay_sizes"]

    def advice(replay: pd.DataFrame) -> dict:  # type: ignore[type-arg]
        a = advise_frame(df, {}, only=["latency_cliffs", "efficiency"],
                         bench=Context(df=bench, meta={}), replay=Context(df=replay, meta={}))
        return {f.key: f for f in a.findings}

    slow = advice(sweep(sizes, alpha_us=ALPHA_US, bw_gbps=BW_GBPS, iters=9,
                        spikes={FUSED: SLOW}))
    assert slow["latency_cliffs"].significant
    eff = slow.get("efficiency")
    assert eff is None or (eff.numbers["left_out_bytes"] == [FUSED] and not eff.significant)
    clean = advice(sweep(sizes, alpha_us=ALPHA_US, bw_gbps=BW_GBPS, iters=9))
    assert not clean["latency_cliffs"].significant
    assert clean["efficiency"].significant and "left_out_bytes" not in clean["efficiency"].numbers
