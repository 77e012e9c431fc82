"""TensorFlow and Keras jobs under Horovod, profiled with no change to their code
(issue 27): steps, images and gradient bytes per step, from the hooks of
profiler.collect.tf_hooks, checked against what the jobs measure themselves
and against their models' own parameter lists.

The jobs (profiler.workloads.keras_cnn, tests/tf_loop_job.py) run on tf_keras
(TF_USE_LEGACY_KERAS=1: Horovod 0.28.1 supports Keras 2 only).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, mpirun, requires_mpi

from profiler.collect import tf_hooks

sys.path.insert(0, str(ROOT / "benchmarks"))
import corpus as C  # noqa: E402

try:  # TensorFlow, and Horovod built with it (scripts/setup.sh, HVPROF_WITH_TENSORFLOW=1)
    import importlib.util

    HAVE_TF = (importlib.util.find_spec("tensorflow") is not None
               and importlib.util.find_spec("horovod.tensorflow") is not None)
except Exception:  # pragma: no cover
    HAVE_TF = False

needs_tf = pytest.mark.skipif(
    not HAVE_TF, reason="TensorFlow or Horovod's TensorFlow support not installed "
    "(HVPROF_WITH_TENSORFLOW=1 bash scripts/setup.sh)")


def tf_job(test: Any) -> Any:
    """The marks of a test that runs a TensorFlow job under mpirun."""
    for mark in (needs_tf, requires_mpi, pytest.mark.timeout(600), pytest.mark.horovod,
                 pytest.mark.mpi):
        test = mark(test)
    return test


JOB_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def _run(job: str, tmp: Path, args: list[str], *, np: int = 2, profile: bool = True,
         env: dict[str, str] | None = None) -> tuple[dict[str, Any], Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    prof = tmp / "prof"
    out = tmp / "result.json"
    e = {**JOB_ENV, **(env or {})}
    if profile:
        e.update(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof))
    argv = (["-m", f"profiler.workloads.{job}"] if job == "keras_cnn"
            else [str(ROOT / "tests" / job)])
    p = mpirun(np, [sys.executable, *argv, "--out", str(out), *args], env=e, cwd=tmp,
               timeout=300)
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    if profile:
        assert (prof / "trace.json").is_file(), p.stderr[-3000:]
    return json.loads(out.read_text()), prof


def _meta(prof: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
    return doc


def _steps(prof: Path, rank: int = 0) -> Any:
    import pandas as pd

    df = pd.read_parquet(prof / "ranks" / f"rank-{rank:05d}.parquet")
    return df[df["op"] == "step"].sort_values("seq")


def _tensor_rows(prof: Path, rank: int = 0) -> Any:
    """The rank's tensor records (the kernel hooks' APP_TENSOR rows) with
    their names and the step each fell in."""
    import pandas as pd

    from profiler.formats.raw import read_tensor_names

    df = pd.read_parquet(prof / "ranks" / f"rank-{rank:05d}.parquet")
    names = read_tensor_names(prof / "raw" / f"rank-{rank:05d}.hvprof")
    t = df[df["op"] == "tensor"].copy()
    t["name"] = [names[i] for i in t["seq"].astype(int)]
    return t


def _grad_bytes(res: dict[str, Any]) -> int:
    return sum(n * size for _, n, size in res["params"])


def test_kernel_hooks_refuse_another_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel hooks read Horovod's kernels through the inline accessors of
    the headers they were built with: built for another TensorFlow, they stay
    off, and the reason names both versions; without the library, the reason
    says it was not built."""
    from profiler.collect import tf_kernels

    class Lib:
        armed: list[int] = []

        def hvprof_tf_built_for(self) -> bytes:
            return b"2.0.0"

        def hvprof_tf_arm(self, on: int) -> int:
            self.armed.append(on)
            return 0

    fake_tf = type(sys)("tensorflow")
    fake_tf.__version__ = "2.21.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorflow", fake_tf)
    monkeypatch.setattr(tf_kernels, "_lib", Lib())
    why = tf_kernels._arm()
    assert why is not None and "built for TensorFlow 2.0.0" in why and "2.21.0" in why
    assert Lib.armed == []
    fake_tf.__version__ = "2.0.0"  # type: ignore[attr-defined]
    assert tf_kernels._arm() is None and Lib.armed == [1]
    monkeypatch.setattr(tf_kernels, "_lib", None)
    monkeypatch.setattr(tf_kernels, "library_path", lambda: "/nonexistent/libhvprof_tf.so")
    assert "not built" in (tf_kernels._arm() or "")


def test_images_of_an_epoch_in_batches() -> None:
    # 200 samples in batches of 32: six full batches and one of 8
    assert [tf_hooks.images_of(b, b, 32, 200) for b in range(7)] == [32] * 6 + [8]
    # steps_per_execution=3: batches 0-2, 3-5, then 6 alone
    assert [tf_hooks.images_of(f, min(f + 2, 6), 32, 200) for f in (0, 3, 6)] == [96, 96, 8]
    assert tf_hooks.images_of(0, 1, 32, None) == 64  # a dataset: no remainder known
    assert tf_hooks.images_of(0, 0, 0, 200) == 0  # batch size unknown: no images


@tf_job
def test_keras_fit_gives_steps_images_and_gradient_bytes(tmp_path: Path) -> None:
    """model.fit, 2 ranks, fusion on: one step per batch, its images (the last
    batch of an epoch holds the remainder), every step's gradient bytes equal
    to the model's parameter bytes, step times equal to the job's own, the
    same losses as without the profiler, and with Horovod's timeline on
    (HOROVOD_PROFILE_TIMELINE=1) a lineage of every gradient, all certain."""
    res, prof = _run("keras_cnn", tmp_path / "on", ["--epochs", "2"],
                     env={"HOROVOD_PROFILE_TIMELINE": "1"})
    plain, _ = _run("keras_cnn", tmp_path / "off", ["--epochs", "2"], profile=False)
    assert res["losses"] == plain["losses"]

    per_epoch = math.ceil(res["samples"] / res["batch"])
    st = _steps(prof)
    assert len(st) == len(res["spans"]) == 2 * per_epoch
    images = st["count"].tolist()
    last = res["samples"] - (per_epoch - 1) * res["batch"]
    assert images == ([res["batch"]] * (per_epoch - 1) + [last]) * 2
    meta = _meta(prof)
    assert meta["steps_marked_by"] == [tf_hooks.KERAS_MARK]
    # the callback's own time is in the trace's self-cost: two calls a step
    cost = json.loads((prof / "ranks" / "rank-00000.json").read_bytes())["self_cost"]
    assert cost["python_hook_calls"] == 2 * len(st) and cost["python_hook_ns"] > 0, cost
    assert meta["batch_size"] == res["batch"]
    # the job's own clock around each run of the training function: our
    # callback runs after the job's, on both sides, so the two differ by
    # callbacks' time only
    own = [b - a for a, b, _, _ in res["spans"]]
    ours = (st["dur_ns"] / 1e9).tolist()
    assert abs(sum(ours) - sum(own)) <= 0.05 * sum(own), (sum(ours), sum(own))
    rate_own = 2 * res["samples"] / sum(own)
    assert abs(meta["images_per_sec_per_rank"]["0"] - rate_own) <= 0.05 * rate_own

    by = C.per_step(prof)
    ar = by[by["op"] == "allreduce"].groupby("step")["bytes"].sum()
    assert sorted(ar.index) == list(range(len(st))), ar
    assert set(ar.tolist()) == {_grad_bytes(res)}, (ar.tolist(), _grad_bytes(res))

    for argv in (["summarize", str(prof)], ["advise", str(prof)], ["check", str(prof)],
                 ["tensors", str(prof)], ["tensors", str(prof), "--whatif"],
                 ["report", str(prof), "-o", str(tmp_path / "report.html")]):
        rc, out, err = C._cli(argv)
        assert rc == 0 and "Traceback" not in err, (argv, rc, err[-2000:])
    rc, out, _ = C._cli(["summarize", str(prof)])
    assert f"steps marked by: {tf_hooks.KERAS_MARK}" in out, out[-2000:]

    # the kernels' tensor records: the lineage from them alone agrees with
    # Horovod's timeline (the oracle) call by call, every tensor certain
    # (the broadcasts' by their root's buffer)
    lin = C.lineage(prof)
    assert lin["status"] == "ok" and set(lin["certainty"]) == {"certain"}, lin
    grads = [n for n in lin["names"] if "HorovodAllreduce" in n]
    assert len(grads) == len(res["params"]), lin["names"]
    a = lin["agreement"]
    assert a["calls"] > 0 and a["equal"] == a["calls"], a
    assert a["wrong"] == a["missing"] == 0, a
    # every step hands Horovod each gradient once, with the parameter's bytes
    t = _tensor_rows(prof)
    grad_rows = t[t["name"].str.contains("HorovodAllreduce")]
    per_step = grad_rows.groupby("step")["bytes"].agg(["size", "sum"])
    assert set(per_step["size"]) == {len(res["params"])}, per_step
    assert set(per_step["sum"]) == {_grad_bytes(res)}, per_step
    assert sorted(n * size for _, n, size in res["params"]) == \
        sorted(grad_rows.drop_duplicates("name")["bytes"].tolist())
    # their own time is in the self-cost
    assert cost["kernel_hook_records"] == len(t) and cost["kernel_hook_ns"] > 0, cost


@tf_job
def test_keras_steps_per_execution_counts_its_batches(tmp_path: Path) -> None:
    """steps_per_execution=3, fusion off: one step per execution (3 batches,
    the epoch's last holds one), 3 x 8 gradient calls and 3 x the parameter
    bytes per full step."""
    res, prof = _run("keras_cnn", tmp_path, ["--epochs", "2", "--steps-per-execution", "3"],
                     env={"HOROVOD_FUSION_THRESHOLD": "0"})
    st = _steps(prof)
    # 7 batches an epoch: executions of 3, 3 and 1 batches
    assert st["count"].tolist() == [96, 96, 8] * 2
    assert len(st) == len(res["spans"]) == 6
    by = C.per_step(prof)
    ar = by[by["op"] == "allreduce"].groupby("step")[["calls", "bytes"]].sum()
    tensors = len(res["params"])
    assert ar["calls"].tolist() == [3 * tensors, 3 * tensors, tensors] * 2
    assert ar["bytes"].tolist() == [3 * _grad_bytes(res), 3 * _grad_bytes(res),
                                    _grad_bytes(res)] * 2
    # no timeline: the lineage from the kernels' records, fusion off: each
    # gradient rode alone, in every execution's 3 (or 1) batches
    for argv in (["tensors", str(prof)], ["tensors", str(prof), "--whatif"]):
        rc, _, err = C._cli(argv)
        assert rc == 0 and "Traceback" not in err, (argv, err[-2000:])
    lin = C.lineage(prof)
    assert lin["status"] == "ok" and "unmatched" not in lin["certainty"], lin
    t = _tensor_rows(prof)
    grads = t[t["name"].str.contains("HorovodAllreduce")]
    assert grads.groupby("step").size().tolist() == [3 * tensors, 3 * tensors, tensors] * 2


@pytest.mark.parametrize("mode", ["function", "eager"])
@tf_job
def test_custom_loop_steps_from_the_gradient_tape(mode: str, tmp_path: Path) -> None:
    """DistributedGradientTape: in a tf.function, every call of the function
    that traced the tape's gradient is a step, its images the batch dimension
    of its first argument; eager, every gradient call is a boundary, its
    images HOROVOD_PROFILE_BATCH_SIZE.  N calls make N - 1 steps (the first
    call opens the first), each with the model's gradient bytes."""
    args = ["--steps", "10"] + (["--eager"] if mode == "eager" else [])
    # in a tf.function, Horovod's timeline on: the oracle for the lineage
    env = ({"HOROVOD_PROFILE_BATCH_SIZE": "16"} if mode == "eager"
           else {"HOROVOD_PROFILE_TIMELINE": "1"})
    res, prof = _run("tf_loop_job.py", tmp_path / "on", args, env=env)
    st = _steps(prof)
    assert len(st) == res["steps"] - 1
    assert set(st["count"].tolist()) == {res["batch"]}
    meta = _meta(prof)
    want = (tf_hooks.FUNCTION_MARK if mode == "function" else tf_hooks.EAGER_MARK)
    assert meta["steps_marked_by"] == [want]
    by = C.per_step(prof)
    ar = by[by["op"] == "allreduce"].groupby("step")["bytes"].sum()
    assert set(ar.tolist()) == {_grad_bytes(res)}, (ar.tolist(), _grad_bytes(res))
    assert len(ar) >= res["steps"] - 2
    # the tensors, recorded in Horovod's kernels in both modes: each gradient
    # once a call, the model's bytes, and a lineage of every one
    t = _tensor_rows(prof)
    grads = t[t["name"].str.contains("HorovodAllreduce")]
    assert grads["name"].nunique() == len(res["params"])
    assert len(grads) == res["steps"] * len(res["params"])
    assert int(grads["bytes"].sum()) == res["steps"] * _grad_bytes(res)
    lin = C.lineage(prof)
    assert lin["status"] == "ok" and "unmatched" not in lin["certainty"], lin
    assert set(grads["name"]) <= set(lin["names"])
    if mode == "function":
        a = lin["agreement"]  # the records' lineage against the timeline's, call by call
        assert a["calls"] > 0 and a["wrong"] == a["missing"] == 0, a
        assert a["equal"] + a["ambiguous_ok"] == a["calls"], a
        plain, _ = _run("tf_loop_job.py", tmp_path / "off", args, profile=False)
        assert res["losses"] == plain["losses"]
        # the kernel hooks off (not loaded): the same losses, steps all the
        # same, no tensor records, and the lineage's reason says why
        res0, prof0 = _run("tf_loop_job.py", tmp_path / "kernels-off", args,
                           env={"HOROVOD_PROFILE_TF_KERNELS": "0"})
        assert res0["losses"] == plain["losses"]
        assert len(_steps(prof0)) == res["steps"] - 1
        assert len(_tensor_rows(prof0)) == 0
        lin0 = _meta(prof0)["lineage"]
        assert lin0["status"] != "ok" and "HOROVOD_PROFILE_TF_KERNELS=0" in lin0["reason"], lin0


@tf_job
def test_keras_fit_on_one_rank(tmp_path: Path) -> None:
    res, prof = _run("keras_cnn", tmp_path, ["--epochs", "1"], np=1)
    st = _steps(prof)
    assert len(st) == len(res["spans"]) == 7
    assert int(st["count"].sum()) == res["samples"]
    assert os.path.exists(prof / "trace.json")
    # one rank: Horovod's optimizer skips the allreduce (its tf.cond on
    # size() > 1), so no gradient reaches its kernels, and none is recorded
    t = _tensor_rows(prof)
    assert not t["name"].str.contains("HorovodAllreduce").any(), t["name"].tolist()


@tf_job
def test_uneven_data_with_join_in_a_custom_loop(tmp_path: Path) -> None:
    """Rank 1 runs 6 steps more than rank 0, then both call hvd.join()
    (eagerly): one join row per rank, and advise names the uneven data (rank
    0 waited in join for rank 1's extra steps), as for PyTorch."""
    extra = 6
    res, prof = _run("tf_loop_job.py", tmp_path, ["--steps", "8", "--extra", str(extra)])
    assert res["last_rank"] == 1
    import pandas as pd

    rows = pd.concat([pd.read_parquet(prof / "ranks" / f"rank-{r:05d}.parquet")
                      for r in (0, 1)])
    j = rows[rows["op"] == "join"]
    assert sorted(j["rank"].tolist()) == [0, 1]
    assert set(j["count"].tolist()) == {1}  # what join returned: the last rank
    steps = rows[rows["op"] == "step"].groupby("rank").size().to_dict()
    assert steps == {0: res["steps"] - 1, 1: res["steps"] + extra - 1}
    from profiler.analysis.findings import advise

    (f,) = [f for f in advise(prof / "trace.json").findings if f.key == "uneven_data"]
    assert f.numbers["last_rank"] == 1 and f.numbers["waiting_ranks"] == [0]
    assert f.numbers["waits"][0]["extra_steps"] == extra
    assert f.headline.startswith("Uneven data: rank 0 waited ")


TF_HANG_JOB = """
    import os, tempfile
    # autograph's generated modules, which a killed rank never removes: here
    tempfile.tempdir = os.path.dirname(os.path.abspath(__file__))
    import tensorflow as tf
    import horovod.tensorflow as hvd
    hvd.init()
    x = tf.ones([4])

    @tf.function
    def grad_x(v):
        return hvd.allreduce(v, name="grad_x")

    @tf.function
    def other(v):
        return hvd.allreduce(v, name="other")  # a tensor rank 0 never submits

    for i in range(4):
        if hvd.rank() == 1 and i == SKIP:
            other(tf.ones([8]))
        else:
            grad_x(x)
    print("done", flush=True)
"""


@pytest.mark.parametrize("skip", [2, -1], ids=["rank1-skips", "clean"])
@tf_job
def test_hang_names_the_tensorflow_tensor_one_rank_never_submits(tmp_path: Path,
                                                                  skip: int) -> None:
    """Inside tf.function, rank 1 hands Horovod a different tensor at its
    third call: every MPI call completes, so the kernel hooks' pending
    tensors are what the watchdog sees, and `profiler hang` names the tensor
    rank 1 never submitted, by its Horovod name, from the kernels' records.
    The same job without the skip: no watchdog line, nothing missing."""
    from test_hang import hang_cli, run_until_killed

    def snapshots(prof: Path) -> bool:
        return all((prof / "hang" / f"rank-0000{r}.stacks.txt").is_file() for r in (0, 1))

    env = {**JOB_ENV, "HOROVOD_CYCLE_TIME": "5", "HOROVOD_PROFILE_HANG_S": "2"}
    prof, out = run_until_killed(tmp_path, TF_HANG_JOB.replace("SKIP", str(skip)),
                                 after_s=120.0, env=env, until=snapshots)
    if skip < 0:
        assert out.count("done") == 2 and "waited in Horovod" not in out, out[-3000:]
        rc, text, doc = hang_cli(prof)
        assert rc == 0 and doc["tensors"] == [], text
        return
    assert "done" not in out, out[-3000:]
    # the watchdog fired on a pending TensorFlow tensor, naming it
    assert "grad_x has waited in Horovod for" in out or "other has waited in Horovod for" in out, \
        out[-3000:]
    rc, text, doc = hang_cli(prof)
    assert rc == 1, text
    gaps = {(g["tensor"], g["occurrence"]): g for g in doc["tensors"]}
    assert set(gaps) == {("grad_x", 2), ("other", 0)}, gaps
    g = gaps[("grad_x", 2)]
    assert g["missing"] == [1] and list(g["submitted"]) == ["0"]
    assert gaps[("other", 0)]["missing"] == [0]
    assert "tensor grad_x (submission #2): handed to Horovod by rank 0" in text, text
    assert "NEVER by rank(s) 1" in text
