"""alpha-beta fit, anomalies and padding what-if on traces synthesised from known
parameters (tests/analysis_fixtures.py)."""

from __future__ import annotations

import numpy as np
import pytest
from analysis_fixtures import alpha_beta_ns, sweep

from profiler.analysis.model import (
    anomalies,
    fit_alpha_beta,
    fit_curve,
    latency_by_size,
    padding_summary,
    padding_whatif,
)
from profiler.errors import ProfilerError

POW2 = [2**k for k in range(3, 23)]            # 8 B .. 4 MiB
MID = [3 * 2**k for k in range(2, 21)]          # 12 B .. 3 MiB (between powers of two)
SIZES = sorted(POW2 + MID)


def test_single_region_recovers_alpha_and_bandwidth_exactly() -> None:
    df = sweep(SIZES, alpha_us=2.0, bw_gbps=5.0, iters=5)
    fit = fit_alpha_beta(df)
    assert len(fit) == 1
    row = fit.iloc[0]
    assert row["op"] == "allreduce"
    assert row["alpha_us"] == pytest.approx(2.0, rel=1e-3)
    assert row["bandwidth_gbps"] == pytest.approx(5.0, rel=1e-3)
    assert row["n_sizes"] == len(SIZES)
    assert row["excluded"] == 0


def test_noisy_curve_recovers_parameters_within_tolerance() -> None:
    df = sweep(SIZES, alpha_us=3.0, bw_gbps=8.0, iters=31, noise=0.05, seed=7)
    row = fit_alpha_beta(df).iloc[0]
    assert row["alpha_us"] == pytest.approx(3.0, rel=0.05)
    assert row["bandwidth_gbps"] == pytest.approx(8.0, rel=0.05)


def test_knee_gives_two_regions_with_their_parameters() -> None:
    df = sweep(SIZES, alpha_us=1.0, bw_gbps=2.0, regions=[(65536, 30.0, 10.0)], iters=3)
    fit = fit_alpha_beta(df)
    assert list(fit["region"]) == [0, 1]
    small, large = fit.iloc[0], fit.iloc[1]
    assert small["hi_bytes"] < 65536 <= large["lo_bytes"]
    assert large["lo_bytes"] == 65536
    assert small["alpha_us"] == pytest.approx(1.0, rel=1e-3)
    assert small["bandwidth_gbps"] == pytest.approx(2.0, rel=1e-3)
    assert large["alpha_us"] == pytest.approx(30.0, rel=1e-3)
    assert large["bandwidth_gbps"] == pytest.approx(10.0, rel=1e-3)


def test_fit_curve_predicts_between_regions() -> None:
    x = np.array(SIZES, dtype=float)
    y = np.where(x < 65536, alpha_beta_ns(x, 1.0, 2.0), alpha_beta_ns(x, 30.0, 10.0))
    model = fit_curve(x, y)
    assert len(model.regions) == 2
    assert model.predict_ns([1024.0])[0] == pytest.approx(float(alpha_beta_ns(1024, 1, 2)))
    assert model.predict_ns([1 << 20])[0] == pytest.approx(
        float(alpha_beta_ns(1 << 20, 30, 10)))


def test_injected_spike_is_flagged_and_nothing_else() -> None:
    spike = 3 * 2**10  # 3 KiB, not a power of two
    df = sweep(SIZES, alpha_us=2.0, bw_gbps=5.0, iters=21, noise=0.05, seed=3,
               spikes={spike: 2.5})
    a = anomalies(df)
    flagged = a.loc[a["anomalous"]]
    assert list(flagged["bytes"]) == [spike]
    assert not bool(flagged["is_pow2"].iloc[0])
    assert flagged["ratio"].iloc[0] == pytest.approx(2.5, rel=0.1)
    # the spike does not pull the fit
    fit = fit_alpha_beta(df).iloc[0]
    assert fit["excluded"] == 1
    assert fit["alpha_us"] == pytest.approx(2.0, rel=0.05)


def test_many_non_pow2_spikes_do_not_hide_each_other() -> None:
    spikes = {s: 2.0 for s in MID[3:15]}  # 12 of 19 in-between sizes
    df = sweep(SIZES, alpha_us=2.0, bw_gbps=5.0, iters=11, noise=0.03, seed=5, spikes=spikes)
    flagged = anomalies(df, only_flagged=True)
    assert sorted(flagged["bytes"]) == sorted(spikes)
    assert not flagged["is_pow2"].any()


def test_clean_curve_flags_nothing() -> None:
    for seed in range(3):
        df = sweep(SIZES, alpha_us=2.0, bw_gbps=5.0, iters=21, noise=0.08, seed=seed,
                   regions=[(1 << 16, 20.0, 9.0)])
        a = anomalies(df)
        assert len(a) == len(SIZES)
        assert not a["anomalous"].any()


def test_latency_by_size_statistics() -> None:
    df = sweep([8, 1024], alpha_us=1.0, bw_gbps=1.0, iters=10, ranks=2)
    st = latency_by_size(df)
    assert list(st["bytes"]) == [8, 1024]
    assert list(st["calls"]) == [20, 20]  # every rank's calls
    assert st["median_us"].iloc[0] == pytest.approx(1.008)
    assert st["median_us"].iloc[1] == pytest.approx(2.024)


def test_padding_whatif_uses_measured_medians_then_the_fit() -> None:
    spike = 3 * 2**10
    sizes = [*POW2, spike, 5000]  # 5000 pads to 8192 (measured); 3 KiB -> 4 KiB
    df = sweep(sizes, alpha_us=2.0, bw_gbps=5.0, iters=4, spikes={spike: 3.0})
    w = padding_whatif(df).set_index("bytes")
    t = w.loc[spike]
    assert t["padded_bytes"] == 4096 and t["padded_source"] == "measured"
    assert t["calls"] == 4  # one rank's calls
    expect = (3.0 * alpha_beta_ns(spike, 2, 5) - alpha_beta_ns(4096, 2, 5)) / 1e3
    assert t["saved_us_per_call"] == pytest.approx(float(expect), abs=1e-3)
    assert t["saved_us"] == pytest.approx(4 * float(expect), abs=4e-3)
    assert w.loc[4096, "padded_source"] == "same" and w.loc[4096, "saved_us"] == 0
    # padding a clean size costs time (negative saving)
    assert w.loc[5000, "saved_us"] < 0
    # multiple of 1000 bytes: 3072 -> 4000, not measured -> from the fit
    m = padding_whatif(df, to=1000).set_index("bytes")
    assert m.loc[spike, "padded_bytes"] == 4000
    assert m.loc[spike, "padded_source"] == "model"
    assert m.loc[spike, "padded_us"] == pytest.approx(
        float(alpha_beta_ns(4000, 2, 5)) / 1e3, rel=1e-3)
    s = padding_summary(w.reset_index()).iloc[0]
    assert s["saved_us_helpful"] == pytest.approx(4 * float(expect), abs=4e-3)
    assert s["saved_us_all"] < s["saved_us_helpful"]


def test_labels_give_one_model_each() -> None:
    from analysis_fixtures import concat

    df = concat(sweep(POW2, alpha_us=1.0, bw_gbps=10.0, iters=3, label="shm"),
                sweep(POW2, alpha_us=20.0, bw_gbps=1.0, iters=3, label="tcp"))
    fit = fit_alpha_beta(df).set_index("label")
    assert fit.loc["shm", "alpha_us"] == pytest.approx(1.0, rel=1e-3)
    assert fit.loc["tcp", "bandwidth_gbps"] == pytest.approx(1.0, rel=1e-3)


def test_bad_input_raises_profiler_error() -> None:
    with pytest.raises(ProfilerError):
        fit_curve([1, 2], [1.0])
    with pytest.raises(ProfilerError):
        padding_whatif(sweep(POW2, iters=1), to="odd")  # type: ignore[arg-type]
    with pytest.raises(ProfilerError):
        latency_by_size(sweep(POW2, iters=1).drop(columns=["dur_ns"]))
