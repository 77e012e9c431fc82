"""Real Horovod under real mpirun with the profiler on: init, the bundled
benchmark, step detection (optimizer hook and explicit calls), images/sec.

Expectations come from the benchmark's own RESULT line and from the
contracts in docs/ARCHITECTURE.md (row schema of ranks/rank-R.parquet,
trace.json).  Step records: op "step", backend "app", count = images,
seq = step number; the first optimizer step opens the step timeline, so a run
of W warm-up + T timed optimizer steps records W - 1 steps with 0 images and
T steps with batch-size images, on every rank.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import PYTHON, base_env, mpirun, profiler_cli, requires_mpi

pytestmark = [requires_mpi, pytest.mark.mpi, pytest.mark.horovod]

# Small enough for 2 ranks on 2 shared cores (a few seconds per run), long
# enough per step (~10-20 ms) for a stable images/sec.
BENCH = [
    "--model", "resnet8", "--batch-size", "16", "--image-size", "32",
    "--num-warmup-batches", "3", "--num-batches-per-iter", "4", "--num-iters", "5",
]
WARMUP, PER_ITER, ITERS, BATCH = 3, 4, 5, 16
TIMED = PER_ITER * ITERS


def result_of(stdout: str) -> dict[str, Any]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, f"expected one RESULT line, got {len(lines)}:\n{stdout[-3000:]}"
    data: dict[str, Any] = json.loads(lines[0][len("RESULT "):])
    return data


def rows_of(profile: Path) -> pd.DataFrame:
    files = sorted((profile / "ranks").glob("rank-*.parquet"))
    assert files, f"no ranks/rank-*.parquet in {profile}: {sorted(profile.rglob('*'))}"
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def steps_of(profile: Path) -> pd.DataFrame:
    df = rows_of(profile)
    st = df[df["op"].astype(str) == "step"].copy()
    assert (st["backend"].astype(str) == "app").all()
    return st.sort_values(["rank", "seq"]).reset_index(drop=True)


def run_bench(tmp: Path, np_: int, *extra: str, profile: bool = True,
              env: dict[str, str] | None = None) -> tuple[dict[str, Any], Path]:
    prof = tmp / "profile"
    e = dict(env or {})
    if profile:
        e.update(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof))
    proc = mpirun(np_, [PYTHON, "-m", "profiler.workloads.train_bench", *BENCH, *extra],
                  env=e, cwd=tmp, timeout=240)
    return result_of(proc.stdout), prof


@pytest.fixture(scope="module")
def hooked(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The benchmark at np=2, profiled, steps found by the DistributedOptimizer hook."""
    return run_bench(tmp_path_factory.mktemp("hooked"), 2)


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The same run with the benchmark calling profiler.step() itself."""
    return run_bench(tmp_path_factory.mktemp("explicit"), 2, "--step-marking", "explicit")


@pytest.mark.parametrize("np_", [1, 2])
def test_horovod_init_and_allreduce_under_profiler(tmp_path: Path, np_: int) -> None:
    script = (
        "import torch, horovod.torch as hvd\n"
        "hvd.init()\n"
        "x = hvd.allreduce(torch.ones(5), name='x', op=hvd.Sum)\n"
        "assert x.tolist() == [float(hvd.size())] * 5, x\n"
        # one write per line: under PYTHONUNBUFFERED print() writes each
        # argument separately and the two ranks' words interleave
        "import os\n"
        "os.write(1, f'RANK {hvd.rank()} {hvd.size()} {hvd.mpi_enabled()}\\n'.encode())\n"
    )
    prof = tmp_path / "p"
    proc = mpirun(np_, [PYTHON, "-c", script], cwd=tmp_path,
                  env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)})
    got = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("RANK "))
    assert got == [f"RANK {r} {np_} True" for r in range(np_)]
    assert (prof / "trace.json").is_file()
    df = rows_of(prof)
    assert sorted(df["rank"].unique().tolist()) == list(range(np_))
    # The one named allreduce of 5 float32 (20 bytes) is seen on every rank
    # (Horovod's own control allreduces are MPI_LONG_LONG_INT / MPI_BAND|BOR).
    data = df[(df["op"].astype(str) == "allreduce") & (df["bytes"] == 20)
              & (df["dtype"].astype(str) == "MPI_FLOAT")]
    assert data.groupby("rank").size().to_dict() == {r: 1 for r in range(np_)}


def test_benchmark_unprofiled_np1_runs_and_reports(tmp_path: Path) -> None:
    res, prof = run_bench(tmp_path, 1, profile=False)
    assert res["ranks"] == 1 and res["horovod"] is True
    assert res["timed_steps"] == TIMED and res["optimizer_steps"] == WARMUP + TIMED
    assert len(res["per_iteration"]) == ITERS and res["images_per_sec"] > 0
    assert res["profiler_mode"] == "off" and res["profiler_steps"] == 0
    assert not prof.exists()


def _check_steps(st: pd.DataFrame, ranks: int) -> None:
    for r in range(ranks):
        mine = st[st["rank"] == r]
        assert len(mine) == WARMUP - 1 + TIMED, f"rank {r}: {len(mine)} step records"
        assert mine["seq"].tolist() == list(range(WARMUP - 1 + TIMED)), f"rank {r}"
        images = mine["count"].tolist()
        assert images == [0] * (WARMUP - 1) + [BATCH] * TIMED
        assert (mine["dur_ns"] > 0).all()
        # Steps tile the timeline: each begins where the previous ended.
        starts = mine["t_start_ns"].to_numpy()[1:]
        ends = mine["t_end_ns"].to_numpy()[:-1]
        assert (starts == ends).all()


def test_hook_records_one_step_per_optimizer_step_np2(hooked: tuple[dict[str, Any], Path]) -> None:
    res, prof = hooked
    assert res["step_marking"] == "hook" and res["profiler_mode"] == "hook"
    assert res["profiler_steps"] == WARMUP - 1 + TIMED
    _check_steps(steps_of(prof), 2)


def test_explicit_calls_record_the_same_steps_as_the_hook(
    hooked: tuple[dict[str, Any], Path], explicit: tuple[dict[str, Any], Path]
) -> None:
    res, prof = explicit
    assert res["step_marking"] == "explicit" and res["profiler_mode"] == "explicit"
    a, b = steps_of(hooked[1]), steps_of(prof)
    _check_steps(b, 2)
    cols = ["rank", "seq", "count"]
    assert a[cols].values.tolist() == b[cols].values.tolist()


def _trace_rate(st: pd.DataFrame, rank: int) -> float:
    mine = st[(st["rank"] == rank) & (st["count"] > 0)]
    return float(mine["count"].sum() / (mine["dur_ns"].sum() / 1e9))


def _printed_rate(res: dict[str, Any], rank: int) -> float:
    """The rank's images/sec over its timed iterations, time-weighted."""
    iters = res["per_rank"][rank]["iterations"]
    images = res["batch_size"] * res["num_batches_per_iter"]
    return float(len(iters) * images / sum(images / v for v in iters))


@pytest.mark.parametrize("which", ["hooked", "explicit"])
def test_images_per_sec_in_trace_agrees_with_benchmark(
    which: str, request: pytest.FixtureRequest
) -> None:
    res, prof = request.getfixturevalue(which)
    st = steps_of(prof)
    total = 0.0
    for r in range(res["ranks"]):
        trace_rate = _trace_rate(st, r)
        total += trace_rate
        # Same intervals up to the loop's own bookkeeping between iterations.
        assert trace_rate == pytest.approx(_printed_rate(res, r), rel=0.03)
    printed, ci = res["images_per_sec"], res["images_per_sec_ci95"] or 0.0
    assert abs(total - printed) <= max(ci, 0.05 * printed), (total, printed, ci)
    # The analysis API (public: profiler.load + throughput summary) agrees too.
    import profiler
    from profiler.analysis.throughput import throughput_summary

    summary = throughput_summary(profiler.load(prof / "trace.json"))
    assert int(summary["steps"].iloc[0]) == TIMED
    api_rate = float(summary["images_per_s"].iloc[0])
    assert abs(api_rate - printed) <= max(ci, 0.05 * printed), (api_rate, printed, ci)
    meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
    # the trace's metadata carries the run's batch size and images/sec
    assert meta["batch_size"] == BATCH
    assert meta["images_per_sec"] == pytest.approx(total, rel=0.05)
    # one definition (profiler.formats.steps): the metadata's is the API's, exactly
    assert meta["images_per_sec"] == api_rate


def test_the_trace_states_what_profiling_cost(hooked: tuple[dict[str, Any], Path]) -> None:
    """trace.json's self_cost per rank: the records counted exactly (the
    rank's parquet rows), every Python hook invocation counted (one per
    tensor handed to Horovod, two per optimizer step: its step and
    synchronize), the calibrated cost
    per record, the helper thread's CPU time, and shares that add up; the
    same figures in summarize's "profiler cost" line."""
    from profiler.units import fmt_share

    res, prof = hooked
    sc = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]["self_cost"]
    rows = rows_of(prof)
    assert [r["rank"] for r in sc["ranks"]] == [0, 1]
    for r in sc["ranks"]:
        mine = rows[rows["rank"] == r["rank"]]
        # the per-step CPU samples are priced by the library's own count of
        # their reads (cpu_read_ns), the other rows at the per-record cost
        cpu_rows = int((mine["op"].astype(str) == "cpu").sum())
        assert cpu_rows > 0 and r["cpu_rows"] == cpu_rows and 0 < r["cpu_read_ns"]
        assert r["records"] == len(mine) - cpu_rows
        tensors = int((mine["op"].astype(str) == "tensor").sum())
        assert tensors > 0
        # optimizer.step calls synchronize once: the two hooks each step
        assert r["python_hook_calls"] == tensors + 2 * res["optimizer_steps"], r
        assert 0 < r["call_cost_ns"] < 10_000 and 0 < r["helper_cpu_ns"]
        assert 0 < r["python_hook_ns"] < r["process_cpu_ns"]
        assert r["record_ns"] == pytest.approx(r["call_cost_ns"] * r["records"])
        total = r["record_ns"] + r["helper_cpu_ns"] + r["python_hook_ns"] + r["cpu_read_ns"]
        assert r["total_ns"] == pytest.approx(total)
        assert r["cpu_share"] == pytest.approx(total / r["process_cpu_ns"])
        assert 0 < r["cpu_share"] < 0.5 and 0 < r["step_share"] < 0.5
    assert sc["cpu_share_max"] == max(r["cpu_share"] for r in sc["ranks"])
    out = profiler_cli("summarize", str(prof / "trace.json"))
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("profiler cost")]
    assert len(line) == 1, out.stdout
    assert f"{fmt_share(sc['cpu_share_max'])} of CPU time" in line[0], line[0]
    assert f"{sum(r['records'] for r in sc['ranks']):,} records" in line[0], line[0]


def test_benchmark_profiled_np1_records_steps(tmp_path: Path) -> None:
    res, prof = run_bench(tmp_path, 1)
    assert res["ranks"] == 1 and res["profiler_steps"] == WARMUP - 1 + TIMED
    st = steps_of(prof)
    _check_steps(st, 1)
    assert _trace_rate(st, 0) == pytest.approx(_printed_rate(res, 0), rel=0.03)


def test_profiling_does_not_change_training(tmp_path: Path) -> None:
    """Same final weights with and without the profiler (np=2, deterministic CPU)."""
    import torch

    args = ["--model", "cnn", "--num-iters", "2", "--num-batches-per-iter", "2",
            "--num-warmup-batches", "1"]
    weights = {}
    for name, profile in (("plain", False), ("profiled", True)):
        d = tmp_path / name
        d.mkdir()
        path = d / "w.pt"
        env = {"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(d / "p")} if profile else {}
        mpirun(2, [PYTHON, "-m", "profiler.workloads.train_bench", *args,
                   "--save-weights", str(path), "--quiet"], env=env, cwd=d)
        weights[name] = torch.load(path)
    assert weights["plain"].keys() == weights["profiled"].keys()
    for k, v in weights["plain"].items():
        assert torch.equal(v, weights["profiled"][k]), k


def test_import_hook_wraps_distributed_optimizer_without_importing_horovod(
    tmp_path: Path,
) -> None:
    """install() imports neither torch nor horovod; importing horovod.torch later
    wraps the DistributedOptimizer template classes (checked in a fresh process)."""
    script = (
        "import sys\n"
        "from profiler.collect import horovod_hooks as hooks\n"
        "hooks.install()\n"
        "assert 'torch' not in sys.modules and 'horovod' not in sys.modules\n"
        "import horovod.torch as hvd\n"
        "import horovod.torch.optimizer as o\n"
        "for c in (o._DistributedOptimizer, o._DistributedAdasumOptimizer):\n"
        "    assert getattr(c.step, '__hvprof_wrapped__', None) is not None, c\n"
        "hooks.uninstall()\n"
        "assert getattr(o._DistributedOptimizer.step, '__hvprof_wrapped__', None) is None\n"
        "print('OK')\n"
    )
    env = base_env()
    env.pop("HOROVOD_PROFILE", None)
    proc = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "OK"


def test_hook_finds_steps_of_any_distributed_optimizer_loop(tmp_path: Path) -> None:
    """A user loop with no profiler code: 6 optimizer steps -> 5 step records
    of HOROVOD_PROFILE_BATCH_SIZE images on every rank; a second optimizer
    object (built after the first) is hooked too."""
    script = (
        "import torch, horovod.torch as hvd\n"
        "hvd.init()\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Linear(4, 2)\n"
        "opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),\n"
        "                               named_parameters=m.named_parameters())\n"
        "x = torch.randn(8, 4)\n"
        "for i in range(6):\n"
        "    if i == 3:  # a new model and optimizer class mid-run\n"
        "        m = torch.nn.Linear(4, 2)\n"
        "        opt = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters()),\n"
        "            named_parameters=[('b.' + n, p) for n, p in m.named_parameters()])\n"
        "    opt.zero_grad()\n"
        "    m(x).sum().backward()\n"
        "    opt.step()\n"
    )
    prof = tmp_path / "p"
    mpirun(2, [PYTHON, "-c", script], cwd=tmp_path,
           env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                "HOROVOD_PROFILE_BATCH_SIZE": "8"})
    st = steps_of(prof)
    for r in range(2):
        mine = st[st["rank"] == r]
        assert mine["seq"].tolist() == [0, 1, 2, 3, 4], f"rank {r}: {mine.to_dict('list')}"
        assert mine["count"].tolist() == [8] * 5


def test_hook_unused_when_profiling_off(tmp_path: Path) -> None:
    """Without HOROVOD_PROFILE nothing is installed and horovod.torch is untouched."""
    script = (
        "import sys, horovod.torch.optimizer as o\n"
        "assert getattr(o._DistributedOptimizer.step, '__hvprof_wrapped__', None) is None\n"
        "assert 'profiler.collect.activate' not in sys.modules\n"
        "print('OK')\n"
    )
    env = base_env()
    env.pop("HOROVOD_PROFILE", None)
    proc = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_mpi4py_workload_marks_steps_by_hand(tmp_path: Path) -> None:
    """profiler.step() in a non-Horovod loop: repeat - 1 steps, images as given,
    and the collectives of the manifest between them."""
    prof = tmp_path / "p"
    proc = mpirun(2, [PYTHON, "-m", "profiler.workloads.mpi4py_collectives",
                      "--sizes", "8,4K", "--repeat", "4", "--ops", "allreduce,bcast,barrier",
                      "--mark-steps", "--images-per-step", "7"],
                  env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)}, cwd=tmp_path)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("MANIFEST "))
    manifest = json.loads(line[len("MANIFEST "):])
    assert manifest["calls"] == {"allreduce": 8, "bcast": 8, "barrier": 4}
    st = steps_of(prof)
    for r in range(2):
        mine = st[st["rank"] == r]
        assert mine["seq"].tolist() == [0, 1, 2]
        assert mine["count"].tolist() == [7, 7, 7]


def test_step_context_and_step_in_one_process(tmp_path: Path) -> None:
    """step_context records its body; a following step() closes from its end."""
    script = (
        "from mpi4py import MPI\n"
        "import time, profiler\n"
        "with profiler.step_context(images=3):\n"
        "    time.sleep(0.02)\n"
        "time.sleep(0.01)\n"
        "profiler.step(images=5)\n"
        "profiler.step(images=0)\n"
        "from profiler.collect import steps\n"
        "print('MODE', steps.mode(), steps.steps_recorded())\n"
    )
    prof = tmp_path / "p"
    proc = mpirun(1, [PYTHON, "-c", script], cwd=tmp_path,
                  env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)})
    assert "MODE explicit 3" in proc.stdout
    st = steps_of(prof)
    assert st["seq"].tolist() == [0, 1, 2]
    assert st["count"].tolist() == [3, 5, 0]
    d = st["dur_ns"].tolist()
    assert d[0] >= 20_000_000 and d[1] >= 10_000_000
    assert st["t_start_ns"].iloc[1] == st["t_end_ns"].iloc[0]


def test_steps_are_free_when_profiling_off(tmp_path: Path) -> None:
    """Without the library every call returns at once (well under a microsecond)."""
    script = (
        "import time, profiler\n"
        "from profiler.collect import steps\n"
        "n = 200000\n"
        "t = time.perf_counter()\n"
        "for _ in range(n):\n"
        "    steps.step(images=32)\n"
        "dt = (time.perf_counter() - t) / n\n"
        "with profiler.step_context(images=1):\n"
        "    pass\n"
        "steps.hook_step()\n"
        "print('MODE', steps.mode(), steps.steps_recorded(), dt)\n"
    )
    env = base_env()
    env.pop("HOROVOD_PROFILE", None)
    proc = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, mode, n, dt = proc.stdout.split()
    assert (mode, n) == ("off", "0")
    assert float(dt) < 1e-6


def test_bad_images_is_a_typed_error() -> None:
    from profiler.collect import steps
    from profiler.errors import ProfilerError

    with pytest.raises(ProfilerError):
        steps.set_batch_size(-1)
    with pytest.raises(ProfilerError):
        steps.set_batch_size("many")  # type: ignore[arg-type]
    steps.set_batch_size(None)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, *sys.argv[1:]]))

