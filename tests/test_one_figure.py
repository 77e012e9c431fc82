"""One step time and one images/sec for a job, whichever door asks: advise's
header, the breakdown's total, compare, summarize, the report, the watcher's
snapshot of the raw files and trace.json's metadata (profiler.formats.steps).

The job is skewed so that the doors could differ: its steps have different
lengths (one in four is three times longer, so mean and median step time
differ by a third), and the ranks run at different rates (rank 1's steps are
1 ms longer and start 2 ms later; rank 2 carries fewer images a step)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rawgen

MS = 1_000_000
STEPS = 13  # step 0 the warm-up (0 images): 12 steady steps
IMAGES = (16, 16, 8)  # a step's images on each rank


def _lengths_ms() -> list[int]:
    return [60 if s % 4 == 1 else 20 for s in range(STEPS)]


def skewed_rank(rank: int, world: int = 3) -> rawgen.RawWriter:
    """Steps on the main thread: tensors handed over, then synchronize to 2 ms
    before the step's end; one gradient allreduce on Horovod's thread."""
    w = rawgen.RawWriter(rank=rank, world_size=world, hostname="testhost")
    w.add_comm(0x5EED, world, rank, "MPI_COMM_WORLD")
    main = w.add_track(1000 + rank, is_main=True)
    other = w.add_track(2000 + rank, name="worker")
    lengths = np.array(_lengths_ms(), dtype=np.uint64) * MS + rank * MS  # rank 1 slower
    starts = np.concatenate([[0], np.cumsum(lengths[:-1] + 5 * MS)]).astype(np.uint64)
    b = starts + 10 * MS + 2 * rank * MS
    e = b + lengths
    count = np.full(STEPS, IMAGES[rank], dtype=np.uint64)
    count[0] = 0  # the warm-up, marked with 0 images
    one = np.ones(STEPS, dtype=np.uint64)
    seq = np.arange(STEPS)
    rows = [("step", b, e, count), ("tensor", b + lengths * 4 // 10, b + lengths // 2, one),
            ("sync", b + lengths * 55 // 100, e - 2 * MS, one)]
    recs = np.concatenate([rawgen.records(STEPS, t_start=t0, t_end=t1, seq=seq, count=c,
                                          op=rawgen.op(name)) for name, t0, t1, c in rows])
    w.add(main, recs[np.argsort(recs["t_start"], kind="stable")])
    w.add(other, rawgen.records(STEPS, t_start=b + lengths * 7 // 10,
                                t_end=b + lengths * 85 // 100, bytes=4 << 20, count=1 << 20,
                                seq=seq, op=rawgen.op("allreduce"),
                                dtype=rawgen.dtype("MPI_FLOAT"), redop=rawgen.redop("sum"),
                                dtype_size=4))
    return w


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("skewed")
    (d / "raw").mkdir()
    for r in range(3):
        skewed_rank(r).write(d / "raw" / f"rank-{r:05d}.hvprof")
    return d


def _expected() -> tuple[float, float]:
    """The figures by hand: the ranks' own steady step times averaged, and a
    steady step's images over it."""
    steady = np.array(_lengths_ms()[1:], dtype=float)
    own = np.concatenate([steady + r for r in range(3)])  # ms, every rank's steps
    step_ms = float(own.mean())
    return step_ms, sum(IMAGES) / (step_ms / 1e3)


def test_every_door_gives_one_step_time_and_one_images_per_sec(job: Path) -> None:
    from profiler.analysis import TraceAnalysis
    from profiler.analysis.compare import compare
    from profiler.analysis.live import Watcher
    from profiler.analysis.load import load, trace_meta
    from profiler.analysis.throughput import steady_steps, step_table, throughput_summary
    from profiler.cli.advise import header_line
    from profiler.postjob.merge import merge
    from profiler.units import fmt_ms

    # the watcher, on the raw files alone (before anything is converted)
    w8 = Watcher(job)
    w8.refresh()
    snap = w8.snapshot()
    w8.close()
    res = merge(job)
    meta = trace_meta(res.trace)
    assert meta is not None
    ta = TraceAnalysis.open(res.trace)
    a = ta.advise()
    h = a.header

    step_ms, ips = _expected()
    walls = steady_steps(step_table(load(res.trace)))["wall_ms"].to_numpy(dtype=float)
    assert len(walls) == STEPS - 1
    assert abs(float(np.median(walls)) - float(np.mean(walls))) > 0.3 * float(np.mean(walls))

    # the step time, to the last digit
    assert h["step_ms"] == pytest.approx(step_ms, rel=1e-12)
    assert meta["step_ms"] == h["step_ms"]
    assert snap["job"]["step_ms"] == h["step_ms"]
    own = {x["rank"]: x["step_time_s"] for x in snap["ranks"]}  # each rank's steady steps
    assert own == pytest.approx({r: (step_ms - 1 + r) / 1e3 for r in range(3)}, rel=1e-12)
    thr = throughput_summary(load(res.trace)).iloc[0]
    assert thr["step_ms_mean"] == h["step_ms"]
    assert thr["step_ms_median"] != thr["step_ms_mean"]  # labelled as the median
    # images/sec, to the last digit
    assert h["images_per_s"] == pytest.approx(ips, rel=1e-12)
    assert meta["images_per_sec"] == h["images_per_s"]
    assert snap["job"]["images_per_sec"] == h["images_per_s"]
    assert thr["images_per_s"] == h["images_per_s"]
    # not the ranks' own rates summed, which is no rate the job ran at
    summed = sum(float(x) for x in meta["images_per_sec_per_rank"].values())
    assert abs(summed - h["images_per_s"]) > 1.0
    # step time x images/sec = the images of a step
    assert h["step_ms"] * h["images_per_s"] / 1e3 == pytest.approx(sum(IMAGES), rel=1e-12)
    # the breakdown's parts sum to the header's step time
    assert len(a.breakdown)
    assert float(a.breakdown["ms"].sum()) == pytest.approx(h["step_ms"], rel=1e-12)
    assert f"{float(a.breakdown['ms'].sum()):.2f}" == f"{h['step_ms']:.2f}"
    line = header_line(a)
    assert f"{h['images_per_s']:.0f} img/s" in line and "window" not in line
    # compare: the same trace twice, the same figures
    both = load(res.trace, res.trace, label=["a", "b"])
    rows = compare(both, baseline="a").set_index("metric")
    for metric, want in (("step_ms", h["step_ms"]), ("images_per_s", h["images_per_s"])):
        assert rows.loc[metric, "value"] == want, metric
        assert rows.loc[metric, "baseline_value"] == want, metric
    # summarize and advise, as printed
    from conftest import profiler_cli

    want = f"{h['steps']} steps, {fmt_ms(h['step_ms'])}/step, {h['images_per_s']:.0f} img/s"
    for cmd in ("summarize", "advise"):
        out = profiler_cli(cmd, str(res.trace))
        assert out.returncode == 0, out.stderr
        assert want in " ".join(out.stdout.split()), (cmd, out.stdout)
    # the report: the findings' header and the steps' table
    from profiler.analysis.report import render_report

    html = render_report(load(res.trace, label=["job"]), metas={"job": meta})
    from profiler.units import fmt_number

    assert fmt_number(h["images_per_s"]) in html
    assert fmt_number(h["step_ms"]) in html


def test_a_window_of_the_job_gives_the_jobs_rate(job: Path) -> None:
    """Where advise analyses a window of a job too large to load (at 1024 ranks,
    18 of them), the window's own rate is its ranks' share: the header gives the
    job's, from trace.json (every rank's steady steps), and says so."""
    from profiler.analysis.findings import advise
    from profiler.analysis.load import trace_meta
    from profiler.cli.advise import header_line
    from profiler.postjob.merge import merge

    res = merge(job)
    meta = trace_meta(res.trace)
    assert meta is not None
    a = advise(res.trace, max_rows=30)  # a bounded window: steps 6-7
    h = a.header
    assert h["window"] and h["images_per_s"] == meta["images_per_sec"]
    assert h["images_per_s_analysed"] != h["images_per_s"]
    assert "(the job's;" in header_line(a)
    # a trace without the job's figure: the window's rate, said to be the window's
    a.header["images_per_s"] = a.header["images_per_s_analysed"]
    assert f"{h['images_per_s_analysed']:.0f} img/s (in the window)" in header_line(a)


def test_one_open_reads_the_profile_once(job: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """advise, summary and report on one TraceAnalysis answer from the rows
    loaded once (TraceAnalysis.rows): the loader runs once, and the answers
    are those of a profile opened afresh for each."""
    import importlib

    from profiler.analysis import TraceAnalysis
    from profiler.analysis.facade import _gather
    from profiler.analysis.findings import advise
    from profiler.analysis.load import trace_meta
    from profiler.postjob.merge import merge

    loader = importlib.import_module("profiler.analysis.load")  # the module, not load()
    trace = merge(job).trace
    # what each answers when it loads the profile itself
    want_header = advise(trace).header
    want_summary = _gather(str(trace), trace_meta(trace), ["op", "bucket"], None).table(
        ["op", "bucket"], None)
    calls: list[tuple[str, ...]] = []
    real = loader.load

    def counted(*paths: object, **kw: object) -> object:
        calls.append(tuple(str(p) for p in paths))
        return real(*paths, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(loader, "load", counted)
    ta = TraceAnalysis.open(trace, engine="pandas")
    a = ta.advise()
    table = ta.summary()
    out = ta.report(tmp_path / "report.html", progress=False)
    assert calls == [(str(trace),)]
    assert a.header == want_header
    assert table.equals(want_summary)
    assert out.is_file() and "Steps and throughput" in out.read_text()


def test_a_synthetic_job_states_its_steps(job: Path, tmp_path: Path) -> None:
    """`profiler synth` writes each rank's steps block as a conversion does, so
    its trace.json gives the job's step time and images/sec, and they are the
    analysis's to the last digit."""
    from profiler.analysis.findings import advise
    from profiler.analysis.load import trace_meta
    from profiler.postjob.merge import merge
    from profiler.synth import SynthConfig, synthesize

    res = synthesize(merge(job).trace, tmp_path / "big", SynthConfig(ranks=8, stragglers=1))
    meta = trace_meta(res.trace)
    assert meta is not None and meta["step_totals"]["rank_steps"] == 8 * (STEPS - 1)
    h = advise(res.trace).header
    assert (meta["step_ms"], meta["images_per_sec"]) == (h["step_ms"], h["images_per_s"])
