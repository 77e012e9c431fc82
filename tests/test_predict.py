"""`profiler predict` (analysis.predict): the model's parts on inputs whose
answer is known exactly, the prediction on a constructed Horovod job, an end
to end run on a real 2-host profile, and the CLI's one-line errors.
Validation against jobs the model never saw: benchmarks/predict/."""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import rawgen
from conftest import profiler_cli
from test_breakdown import horovod_job

from profiler.analysis import predict as P
from profiler.errors import ProfilerError, UsageError
from profiler.postjob.merge import merge

DATA = Path(__file__).resolve().parent / "data"
PROFILE = DATA / "predict" / "h2" / "trace.json"   # 2 simulated hosts, benchmarks/predict/job.py
FUSED = DATA / "analysis" / "fused" / "trace.json"  # no synchronize records


# ----------------------------------------------------------------- options


def test_links_parse_and_bad_ones_say_how() -> None:
    assert P.parse_link("10gbit").rate_bits == 1e10
    link = P.parse_link("100gbit,2us")
    assert (link.rate_bits, link.latency_ns) == (1e11, 2000.0)
    assert P.parse_link("50mbit,0.1ms").latency_ns == 100_000.0
    assert P.parse_link("1.5Gbit").rate_bits == 1.5e9
    # 1 Gbit/s of TCP payload: 1448 of every 1538 bytes
    assert P.parse_link("1gbit").ns_per_byte == pytest.approx(8.0 * 1538 / 1448)
    for bad in ("10", "fast", "10gbit,2", "10gbit,2us,3", "0gbit", "10 GB/s", ""):
        with pytest.raises(UsageError, match="--link"):
            P.parse_link(bad)


def test_layouts_parse_and_unknown_ones_are_refused() -> None:
    assert P.parse_layout("allreduce") == P.Layout()
    assert P.parse_layout("ps:4") == P.Layout("ps", 4)
    for bad in ("ps:0", "ps:x", "ring", "ps", "ps:5000", "tree:2"):
        with pytest.raises(UsageError, match="can model allreduce"):
            P.parse_layout(bad)


# ----------------------------------------------------------------- algorithms


def test_open_mpi_picks_by_size_and_ranks_as_its_fixed_rules() -> None:
    a = P.algorithm
    assert a("Open MPI", 4, 2) == "ring"
    assert a("Open MPI", 1024, 2) == "recursive doubling"
    assert a("Open MPI", 100_000, 2) == "segmented ring"
    assert a("Open MPI", 1 << 20, 3) == "Rabenseifner"
    assert a("Open MPI", 8, 6) == "ring"
    assert a("Open MPI", 4096, 6) == "recursive doubling"
    assert a("Open MPI", 8192, 6) == "Rabenseifner"
    assert a("Open MPI", 100, 1024) == "nonoverlapping"
    assert a("Open MPI", 1 << 20, 5000) == "Rabenseifner"
    assert a("Gloo", 1 << 20, 6) == "ring"


def test_costs_count_latency_steps_and_the_busiest_links_bytes() -> None:
    c = P.algorithm_cost
    assert c("ring", 4, 1) == (6.0, 1.5)
    # 6 ranks: 4 do the power-of-two part, 2 hand their data in and get it back
    assert c("Rabenseifner", 6, 1) == (7.0, 3.5)
    assert c("Rabenseifner", 2, 1) == (2.0, 1.0)
    # 8 ranks, 2 per host: the first exchange stays on the host, 2 flows share a link
    assert c("recursive doubling", 8, 2) == (3.0, 4.0)
    # one host: the medium is the memory, per rank
    assert c("recursive doubling", 8, 8) == (3.0, 3.0)
    assert c("ps", 8, 1, servers=2) == (2.0, 8.0)
    assert c("ps", 8, 1, servers=8) == (2.0, 2.0)
    assert c("ring", 1, 1) == (0.0, 0.0)


def test_a_link_prices_calls_and_a_measured_curve_is_carried_to_more_ranks() -> None:
    link = P.Curve("Open MPI", alpha_ns=1000.0, beta_ns_per_byte=1.0)
    ns, algs = link.allreduce([1 << 20], 4, 1)
    assert algs[0] == "Rabenseifner" and ns[0] == pytest.approx(4 * 1000 + 1.5 * (1 << 20))
    # measured at 2 ranks: 2 alpha + S beta at 1 MiB (Rabenseifner there too)
    measured = P.Curve("Open MPI", alpha_ns=1000.0, measured=lambda s: 2000.0 + 1.0 * s,
                       ranks=2, per_host=1)
    assert measured.allreduce([1 << 20], 4, 1)[0][0] == pytest.approx(ns[0])
    assert measured.allreduce([1 << 20], 2, 1)[0][0] == pytest.approx(2000.0 + (1 << 20))
    ps, what = link.allreduce([1 << 20], 8, 1, P.Layout("ps", 2))
    assert what[0] == "push+pull" and ps[0] == pytest.approx(2000 + 8.0 * (1 << 20))


def test_algorithms_split_their_bytes_into_exchanges_and_one_way_parts() -> None:
    parts = P.algorithm_parts
    # 3 ranks: one pairwise exchange (halves each way, then back), the extra
    # rank's data in and the result out (one way each)
    assert parts("Rabenseifner", 3, 1) == (5.0, 1.0, 2.0)
    assert parts("ring", 4, 1) == (6.0, 1.5, 0.0)
    assert parts("recursive doubling", 6, 1) == (4.0, 2.0, 2.0)
    assert parts("ps", 8, 1, servers=2) == (2.0, 0.0, 8.0)
    for alg in ("ring", "segmented ring", "recursive doubling", "Rabenseifner", "basic linear",
                "nonoverlapping", "tree"):
        for p in (1, 2, 3, 6, 8, 12):
            steps, both, one = parts(alg, p, 2 if p > 6 else 1)
            assert P.algorithm_cost(alg, p, 2 if p > 6 else 1) == (steps, both + one)
    with pytest.raises(ValueError, match="unknown algorithm"):
        parts("butterfly", 4, 1)


def test_a_bench_prices_one_way_parts_by_its_broadcasts() -> None:
    s = 1 << 20
    # exchanges at 2 ns a byte, one way at 1 (a link whose two directions slow each other)
    c = P.Curve("Open MPI", alpha_ns=1000.0, measured=lambda x: 2000.0 + 2.0 * x, ranks=2,
                per_host=1, oneway=lambda x: 500.0 + 1.0 * x, oneway_alpha_ns=500.0)
    ns, algs = c.allreduce([s], 3, 1)
    assert algs[0] == "Rabenseifner" and ns[0] == pytest.approx(5 * 1000 + 2.0 * s + 2 * s)
    assert c.allreduce([s], 2, 1)[0][0] == pytest.approx(2000.0 + 2.0 * s)
    # a bench trace: 2 ranks on 2 hosts, allreduce and broadcast sweeps; a
    # broadcast's root returns at once (its data buffered), its receiver later
    rows = []
    seq = 0
    for op, fixed, per_byte in (("allreduce", 20_000, 2.0), ("bcast", 10_000, 1.0)):
        for size in (8, 1024, 65536, 1 << 20, 1 << 21):
            for _ in range(4):
                seq += 1
                for rank in (0, 1):
                    took = 1000 if (op == "bcast" and rank == 0) else fixed + per_byte * size
                    rows.append({"rank": rank, "op": op, "bytes": size, "comm": 1, "seq": seq,
                                 "dur_ns": took, "t_start_ns": 10**9 * seq,
                                 "t_end_ns": 10**9 * seq + took})
    fab = P.fabric_curve(pd.DataFrame(rows), {"hosts": ["h0", "h1"]})
    both, one = fab.unit(np.array([float(1 << 21)]))
    assert both[0] == pytest.approx(2.0 * (1 << 21), rel=0.02)
    assert one[0] == pytest.approx(1.0 * (1 << 21), rel=0.02)
    assert "broadcast curve" in fab.source


def test_ranks_sharing_cores_wait_for_partners_and_share_the_cpu_per_byte() -> None:
    half = P.SCHED_SLICE_MS / 2
    assert P.sched_delay_ms(2, 2) == 0.0 and P.sched_delay_ms(1, 4) == 0.0
    assert P.sched_delay_ms(3, 2) == pytest.approx(half / 2)  # a core busy half the time
    assert P.sched_delay_ms(4, 2) == pytest.approx(half) == P.sched_delay_ms(6, 2)
    s = 1 << 20
    link = P.Curve("Open MPI", alpha_ns=1000.0, beta_ns_per_byte=1.0)
    # 6 ranks, Rabenseifner: 7 steps, 3.5 S on the busiest link.  The ends:
    # the cores need 0.5 ns a byte, 3 times as long when 3 ranks share each,
    # and a wait for a partner every PARTNER_BYTES; they take longer than
    # the link here; every latency step waits once more
    packed = replace(link, cpu=lambda x: 0.5 * x, cpu_scale=3.0, delay_ns=750_000.0)
    ends = 3.5 * (1.5 * s + s / P.PARTNER_BYTES * 750_000)
    assert ends > 3.5 * s
    assert packed.allreduce([s], 6, 1)[0][0] == pytest.approx(7 * 751_000 + ends)
    # where the link is slower than the ends, the link's time
    fast_ends = replace(packed, cpu_scale=1.0, delay_ns=0.0)
    assert fast_ends.allreduce([s], 6, 1)[0][0] == pytest.approx(
        link.allreduce([s], 6, 1)[0][0]) == pytest.approx(7 * 1000 + 3.5 * s)


# ----------------------------------------------------------------- arrivals


def test_expected_max_is_exact_under_resampling_and_extrapolates_a_tail() -> None:
    assert P.expected_max(np.array([0.0, 1.0]), 2) == pytest.approx(0.75)
    assert P.expected_max(np.array([1.0, 2.0, 3.0]), 3) == pytest.approx(72 / 27)
    assert P.expected_max(np.array([1.0, 2.0, 3.0]), 1) == pytest.approx(2.0)
    # exponential offsets (quantiles of Exp(1)): E[max of p] is the p-th harmonic number
    x = -np.log1p(-(np.arange(2000) + 0.5) / 2000)
    h = float(np.sum(1.0 / np.arange(1, 20001)))
    assert P.expected_max(x, 20000) == pytest.approx(h, rel=0.03)
    assert math.isnan(P.expected_max(np.zeros(0), 3))


def test_arrival_offsets_are_deviations_from_the_mean_scaled_to_one_rank() -> None:
    bd = pd.DataFrame({"step": [0, 0, 1, 1, 2], "rank": [0, 1, 0, 1, 0],
                       "arrival_ns": [0, 10_000_000, 5_000_000, 5_000_000, 7]})
    offs = P.arrival_offsets(bd)
    assert len(offs) == 2  # step 2 lacks rank 1
    assert offs[0] == pytest.approx([-5 * math.sqrt(2), 5 * math.sqrt(2)])
    assert offs[1] == pytest.approx([0.0, 0.0])
    aligned = P.arrival_offsets(bd, [0, 1, 2, 3])
    assert [a.size for a in aligned] == [2, 2, 0, 0]


# ----------------------------------------------------------------- the replay


def _tensors(ready: list[float], nbytes: list[float]) -> P.StepTensors:
    return P.StepTensors(np.array(ready), np.array(nbytes), ["float32"] * len(ready))


def test_the_replay_runs_cycles_on_ready_times_and_a_busy_cycle_delays_the_next() -> None:
    def call(x: np.ndarray) -> np.ndarray:  # 1 ms per 1000 bytes
        return np.asarray(x, dtype=float) * 1e3

    # cycle 1 ms, one phase: cycles at -9.5, -8.5, ...; the first tensor goes
    # alone (1 ms), the second waits for the cycle at 0.5 and takes 2 ms
    t, x = P._tail(_tensors([-10.0, 0.0], [1000, 2000]), 1.0, 1.0, 0.0, 1 << 30, call, 0.0,
                   np.array([0.0]))
    assert (t, x) == pytest.approx((2.5, 2.0))
    # both ready before the first cycle: one fused call of 3000 bytes (3 ms),
    # over before the last arrival at 0
    t, x = P._tail(_tensors([-10.0, -9.8], [1000, 2000]), 1.0, 1.0, 0.0, 1 << 30, call, 0.0,
                   np.array([0.0]))
    assert (t, x) == pytest.approx((-6.5, 0.0))
    # fusion off: two calls, back to back; a long first one (5 ms) holds the
    # cycle, and the next starts at its end, not at the next 1 ms mark
    t, x = P._tail(_tensors([-10.0, -6.0], [5000, 2000]), 1.0, 1.0, 0.0, 0, call, 0.5,
                   np.array([0.0]))
    assert (t, x) == pytest.approx((-1.5, 0.0))  # -9.5 + 0.5 + 5 = -4, then -4 + 0.5 + 2
    # a batch twice as large spreads the ready times twice as wide
    t, _ = P._tail(_tensors([-1.0, 0.0], [1000, 1000]), 2.0, 1.0, 0.0, 0, call, 0.0,
                   np.array([0.0]))
    assert t == pytest.approx(1.5)  # cycles at -1.5 (nothing), -0.5 (the first), 0.5


# ----------------------------------------------------------------- a constructed job


def _job(steps: int = 12, seed: int = 3) -> tuple[pd.DataFrame, dict[str, object]]:
    rng = np.random.default_rng(seed)
    arr = [[50 + float(rng.exponential(4)), 50 + float(rng.exponential(4))]
           for _ in range(steps)]
    df, meta = horovod_job(arr)
    df["track"] = df["tid"]
    meta["hosts"] = ["h0", "h1"]
    meta["ranks"] = [{"rank": 0, "host": "h0"}, {"rank": 1, "host": "h1"}]
    return df, meta


def test_at_its_own_settings_the_prediction_is_the_measured_step() -> None:
    df, meta = _job()
    prof = P.profile_of(df, meta)
    assert not prof.refused and len(prof.steps) == 11 and prof.batch == 32.0
    pr = P.predict(prof)
    assert pr.step_ms == pytest.approx(prof.parts["wall"].mean(), rel=1e-12)
    lo, hi = pr.interval
    assert lo < pr.step_ms < hi
    assert pr.images_per_s == pytest.approx(2 * 32 / pr.step_ms * 1e3)
    assert sum(pr.breakdown.values()) == pytest.approx(pr.step_ms)
    assert pr.assumptions and all("\n" not in a for a in pr.assumptions)


def test_more_ranks_wait_for_the_slowest_of_more_arrivals() -> None:
    df, meta = _job()
    prof = P.profile_of(df, meta)
    pool = np.concatenate(prof.offsets)
    base = P.predict(prof)
    wider = P.predict(prof, P.Target(hosts=8))
    want = P.expected_max(pool, 8) - P.expected_max(pool, 2)
    assert want > 0
    assert wider.breakdown["wait_ranks"] - base.breakdown["wait_ranks"] == pytest.approx(want)
    assert wider.breakdown["compute"] == base.breakdown["compute"]
    assert wider.step_ms > base.step_ms


def test_a_slower_link_and_a_larger_batch_cost_what_they_should() -> None:
    df, meta = _job()
    prof = P.profile_of(df, meta)
    fast = P.predict(prof, P.Target(link=P.parse_link("100gbit")))
    slow = P.predict(prof, P.Target(link=P.parse_link("1gbit")))
    # one 1 MiB call a step, after the last arrival: 1 Gbit/s adds its time at
    # 2 ranks (8.9 ms) less 100 Gbit/s's
    per_byte = P.parse_link("1gbit").ns_per_byte - P.parse_link("100gbit").ns_per_byte
    assert slow.step_ms - fast.step_ms == pytest.approx((1 << 20) * per_byte / 1e6, rel=0.02)
    big = P.predict(prof, P.Target(batch_size=64))
    assert big.breakdown["compute"] == pytest.approx(2 * P.predict(prof).breakdown["compute"])
    assert big.images_per_s == pytest.approx(2 * 64 / big.step_ms * 1e3)


def test_cores_shared_by_more_ranks_lengthen_the_step_and_say_so() -> None:
    df, meta = _job()
    prof = P.profile_of(df, meta)
    assert prof.cores is None and math.isnan(prof.main_cpu_ms)  # no CPU figures
    own = P.predict(prof)
    # 2 cores for the profile's 2 ranks (one each, assumed): as profiled
    same = P.predict(prof, P.Target(cores=2))
    assert same.step_ms == pytest.approx(own.step_ms)
    one = P.predict(prof, P.Target(cores=1))
    assert one.breakdown["compute"] == pytest.approx(own.breakdown["compute"])
    assert one.breakdown["transfer"] > own.breakdown["transfer"] and one.step_ms > own.step_ms
    said = one.assumptions[1]
    assert said.startswith("the 2 ranks share 1 core (2 ranks to a core where the profile's 2 "
                           "had 2 (assumed: one each)")
    assert "no CPU rows" in said
    assert own.assumptions[1].startswith("each rank keeps its own cores")


def test_the_interval_holds_two_runs_noise_and_grows_with_the_distance() -> None:
    prof = P.profile_of(*_job())
    own = P.predict(prof)
    lo, hi = own.interval
    assert lo * hi == pytest.approx(own.step_ms ** 2)  # log-normal
    assert math.log(hi / own.step_ms) >= P.Z95 * math.sqrt(2) * P.RUN_SD
    far = P.predict(prof, P.Target(link=P.parse_link("100mbit")))
    assert math.log(far.interval[1] / far.step_ms) > math.log(hi / own.step_ms)


def test_what_the_profile_cannot_carry_is_said_not_guessed() -> None:
    df, meta = _job(steps=4)
    few = P.predict(P.profile_of(df, meta))
    assert few.refused.startswith("3 steady steps") and math.isnan(few.step_ms)
    assert few.to_dict()["step_ms"] is None and few.to_dict()["no_prediction"]
    prof = P.profile_of(*_job())
    far = P.predict(prof, P.Target(hosts=1000))
    assert "beyond what 22 measured arrivals tell (up to 22 ranks)" in far.refused
    nolin = P.predict(prof, P.Target(fusion_threshold=0))
    assert "fusion lineage" in nolin.refused
    one = dict(_job()[1], hosts=["h0"], ranks=[{"rank": 0, "host": "h0"},
                                               {"rank": 1, "host": "h0"}])
    net = P.predict(P.profile_of(_job()[0], one), P.Target(hosts=2, ranks_per_host=2))
    assert "one host" in net.refused


def test_a_profile_without_steps_is_bad_input() -> None:
    df, meta = _job()
    with pytest.raises(ProfilerError, match="no steps"):
        P.profile_of(df.loc[df["op"] != "step"], meta)


# ----------------------------------------------------------------- a real profile


def test_a_real_two_host_profile_predicts_within_its_own_interval() -> None:
    from profiler.formats import lineage as LF

    prof = P.open_profile(str(PROFILE), lineage=LF.load(PROFILE))
    assert (prof.ranks, prof.hosts, prof.library, prof.lineage) == (2, 2, "Open MPI", True)
    assert len(prof.steps) >= P.MIN_STEPS and all(len(t.nbytes) == 16 for t in prof.tensors)
    own = P.predict(prof)
    assert own.step_ms == pytest.approx(prof.parts["wall"].mean())
    slow = P.predict(prof, P.Target(hosts=4, link=P.parse_link("100mbit")))
    algs = {a["algorithm"] for a in slow.algorithms}
    assert "Rabenseifner" in algs and slow.step_ms > 2 * own.step_ms
    assert sum(a["calls_per_step"] for a in slow.algorithms) >= 1
    # its 2 simulated hosts share one kernel and its 2 cores; 6 ranks on them
    assert prof.cores == 2 and prof.main_cpu_ms > 0
    wide = P.predict(prof, P.Target(hosts=6))
    packed = P.predict(prof, P.Target(hosts=6, cores=2))
    assert packed.breakdown["compute"] - wide.breakdown["compute"] == pytest.approx(
        2 * prof.main_cpu_ms)
    assert packed.breakdown["transfer"] > wide.breakdown["transfer"]
    assert "the 6 ranks share 2 cores (3 ranks to a core" in packed.assumptions[1]


# ----------------------------------------------------------------- the command


def _one_line_error(p: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("profiler: error: "), p.stderr
    assert "Traceback" not in p.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def test_the_command_prints_a_prediction_and_its_json(tmp_path: Path) -> None:
    p = profiler_cli("predict", str(PROFILE), "--hosts", "3", "--link", "1gbit",
                     "--cycle-time", "5", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "predicted at 3 rank(s) on 3 host(s)" in p.stdout
    for part in ("compute and the rest", "waiting for other ranks", "waiting for Horovod",
                 "transfer", "Open MPI: ", "Assumptions:"):
        assert part in p.stdout
    j = profiler_cli("predict", str(PROFILE), "--hosts", "3", "--link", "1gbit",
                     "--cycle-time", "5", "--format", "json", cwd=tmp_path)
    doc = json.loads(j.stdout)
    lo, hi = doc["interval"]
    assert lo < doc["step_ms"] < hi and doc["images_per_s"] > 0
    assert set(doc["breakdown"]) == {"compute", "wait_ranks", "horovod", "transfer"}
    assert all(isinstance(a, str) for a in doc["assumptions"]) and doc["no_prediction"] is None


def test_the_command_says_when_the_profile_cannot_carry_a_prediction(tmp_path: Path) -> None:
    p = profiler_cli("predict", str(FUSED), "--hosts", "4", "--ranks-per-host", "1",
                     cwd=tmp_path)
    assert p.returncode == 1 and "no prediction at 4 ranks" in p.stdout
    assert "synchronize" in p.stdout and p.stderr == ""


def test_a_core_count_below_one_is_bad_input() -> None:
    import argparse

    from profiler.cli import predict as cli

    ap = argparse.ArgumentParser()
    cli.add_parser(ap.add_subparsers())
    args = ap.parse_args(["predict", str(PROFILE), "--cores", "0"])
    with pytest.raises(UsageError, match="--cores must be >= 1, not 0"):
        cli.target_of(args)


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    _one_line_error(profiler_cli("predict", str(PROFILE), "--link", "fast", cwd=tmp_path),
                    "--link 'fast'")
    _one_line_error(profiler_cli("predict", str(PROFILE), "--layout", "tree:3", cwd=tmp_path),
                    "--layout 'tree:3'", "can model")
    _one_line_error(profiler_cli("predict", str(PROFILE), "--hosts", "0", cwd=tmp_path),
                    "--hosts must be >= 1")
    _one_line_error(profiler_cli("predict", str(PROFILE), "--fabric", str(tmp_path),
                                 cwd=tmp_path), "no bench trace")
    d = tmp_path / "nosteps"
    for r in range(2):
        rawgen.simple_rank(r, 2, n=20).write(d / "raw" / f"rank-{r:05d}.hvprof")
    merge(d)
    _one_line_error(profiler_cli("predict", str(d / "trace.json"), cwd=tmp_path), "no steps")
    _one_line_error(profiler_cli("predict", str(tmp_path / "missing.json"), cwd=tmp_path))


# ----------------------------------------------------------------- where people look


def test_the_reports_what_if_shows_three_fabrics_and_the_measured_point() -> None:
    made: dict[str, object] = {}

    def fig(name: str, figure: object) -> str:
        made[name] = figure
        return f"<figure {name}>"

    html = P.report_section({"": str(PROFILE)}, fig, lambda t: f"<table {len(t)} rows>")
    assert list(made) == ["whatif-trace"] and "<figure whatif-trace>" in html
    traces = made["whatif-trace"].data  # type: ignore[attr-defined]
    lines = [t.name for t in traces if t.mode == "lines+markers"]
    assert lines == ["profiled fabric", "10 GbE", "100 Gb/s, 2 us"]
    point = next(t for t in traces if t.name == "measured")
    prof = P.open_profile(str(PROFILE))
    assert list(point.x) == [2] and point.y[0] == pytest.approx(prof.images_per_s)
    assert "assumptions" in html


def test_a_remedy_that_changes_a_knob_says_what_the_model_predicts() -> None:
    from profiler.analysis.findings.base import Context

    df, meta = _job()
    ctx = Context(df=df, meta=meta)
    line, numbers = P.remedy_line(ctx, P.Target(link_speedup=10.0), "a link 10 times faster")
    prof = P.profile_of(df, meta)
    want = P.predict(prof, P.Target(link_speedup=10.0), n_boot=200)
    assert numbers["predicted_step_ms"] == pytest.approx(want.step_ms)
    assert numbers["predicted_saving_ms"] == pytest.approx(prof.parts["wall"].mean()
                                                           - want.step_ms)
    assert numbers["predicted_saving_ms"] > 0 and line.startswith(
        "predicted (profiler predict): with a link 10 times faster a step takes")
    assert P.remedy_line(Context(df=df.loc[df["op"] != "sync"], meta=meta),
                         P.Target(cycle_ms=5.0), "x") is None
