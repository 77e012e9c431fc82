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


def _assert_breakdown(prof: Path, n_steps: int) -> None:
    """Every rank: one sync row per step (the kernels' window: from the last
    tensor handed to Horovod to the last handed back), inside its step, the
    step breakdown built from them, and advise opening with it."""
    import pandas as pd

    from profiler.analysis.breakdown import rank_breakdown

    rows = pd.concat([pd.read_parquet(p) for p in sorted((prof / "ranks").glob("*.parquet"))])
    for rank, df in rows.groupby("rank"):
        st = df[df["op"] == "step"].sort_values("t_start_ns")
        sy = df[df["op"] == "sync"].sort_values("t_start_ns")
        assert len(st) == len(sy) == n_steps, (rank, len(st), len(sy))
        assert (sy["t_start_ns"].to_numpy() >= st["t_start_ns"].to_numpy()).all()
        assert (sy["t_end_ns"].to_numpy() <= st["t_end_ns"].to_numpy()).all()
        assert (sy["t_end_ns"].to_numpy() >= sy["t_start_ns"].to_numpy()).all()
    bd = rank_breakdown(rows)
    assert len(bd) == n_steps * rows["rank"].nunique() and set(bd["source"]) == {"sync"}, bd
    rc, out, err = C._cli(["advise", str(prof)])
    assert rc == 0 and "\nWhere a step goes (mean of ranks" in out, (out[-3000:], err[-2000:])


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
    # images/sec over the steady steps: the first WARMUP_STEPS left out
    from profiler.formats.steps import WARMUP_STEPS

    rate_own = sum(images[WARMUP_STEPS:]) / sum(own[WARMUP_STEPS:])
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
    # the step's wait for Horovod (the kernels' window): one sync row a step,
    # inside it, and advise opens with the breakdown, as for PyTorch
    _assert_breakdown(prof, len(st))

    # the kernels' tensor records: the lineage from them agrees with Horovod's
    # timeline (the oracle) call by call, nothing unmatched, nothing wrong.
    # Most operations are certain (the broadcasts' by their root's buffer);
    # some are ambiguous when equal-sized tensor sets fit one call at the same
    # moment, which is timing (4 and 8 of 129 in full-suite runs): those must
    # name their candidates, and the oracle's set must be among them.  Three
    # quarters certain is far from what timing gives and fails an inference
    # that stopped resolving by buffer or order.
    lin = C.lineage(prof)
    cert = lin["certainty"]
    assert lin["status"] == "ok" and "unmatched" not in cert, lin
    assert cert.get("certain", 0) >= 0.75 * sum(cert.values()), lin
    grads = [n for n in lin["names"] if "HorovodAllreduce" in n]
    assert len(grads) == len(res["params"]), lin["names"]
    a = lin["agreement"]
    assert a["calls"] > 0 and a["equal"] + a["ambiguous_ok"] == a["calls"], a
    assert a["wrong"] == a["missing"] == 0, a
    import pandas as pd

    rows = pd.read_parquet(prof / "lineage.parquet")
    unsure = rows[rows["certainty"] == "ambiguous"]
    assert all(len(c.split(";")) >= 2 for c in unsure["candidates"]), unsure
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


@pytest.mark.full  # the 2-rank fit runs the same step marks, one batch an execution
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


@pytest.mark.parametrize("mode", ["function", pytest.param("eager", marks=pytest.mark.full)])
@tf_job
def test_custom_loop_steps_from_the_gradient_tape(mode: str, tmp_path: Path) -> None:
    """DistributedGradientTape.  In a tf.function, as Horovod's synthetic
    benchmark runs it: the batch in the step function's closure, not an
    argument, and a Python argument (first_batch, True once) that makes two
    traces of one function.  Every call of the function that traced the
    tape's gradient is a step: 9 calls, exactly 9 steps on every rank, each
    of the batch inferred from the traced graph.  Eager: every gradient call
    is a boundary (N calls make N - 1 steps: the first opens the first), its
    images HOROVOD_PROFILE_BATCH_SIZE.  Each step has the model's gradient
    bytes and its wait for Horovod (a sync row), so advise opens with the
    breakdown."""
    args = ["--steps", "10", "--eager"] if mode == "eager" else ["--steps", "9", "--closure"]
    # in a tf.function, Horovod's timeline on: the oracle for the lineage
    env = ({"HOROVOD_PROFILE_BATCH_SIZE": "16"} if mode == "eager"
           else {"HOROVOD_PROFILE_TIMELINE": "1"})
    res, prof = _run("tf_loop_job.py", tmp_path / "on", args, env=env)
    n_steps = res["steps"] - (1 if mode == "eager" else 0)
    assert res["batch"] == 16 and n_steps == 9
    for rank in (0, 1):
        st = _steps(prof, rank)
        assert st["seq"].tolist() == list(range(n_steps)), st
        assert st["count"].tolist() == [res["batch"]] * n_steps
    _assert_breakdown(prof, n_steps)
    meta = _meta(prof)
    want = (tf_hooks.FUNCTION_MARK if mode == "function" else tf_hooks.EAGER_MARK)
    assert meta["steps_marked_by"] == [want]  # images known: no NO_IMAGES after it
    assert meta["batch_size"] == res["batch"] and meta["images_per_sec"] > 0, meta
    by = C.per_step(prof)
    ar = by[by["op"] == "allreduce"].groupby("step")["bytes"].sum()  # rank 0
    assert set(ar.tolist()) == {_grad_bytes(res)}, (ar.tolist(), _grad_bytes(res))
    if mode == "function":  # every step's gradients (eager: the last call's are in none)
        assert ar.index.tolist() == list(range(n_steps)), ar
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


@pytest.mark.full
@tf_job
def test_kernel_hooks_off_keep_steps_and_say_why_there_is_no_lineage(tmp_path: Path) -> None:
    """HOROVOD_PROFILE_TF_KERNELS=0 (the kernel hooks not loaded), in a
    tf.function: the losses of an unprofiled run, the steps and images all
    the same, no tensor records nor sync rows, and the lineage's reason says
    why."""
    args = ["--steps", "9", "--closure"]
    plain, _ = _run("tf_loop_job.py", tmp_path / "off", args, profile=False)
    res0, prof0 = _run("tf_loop_job.py", tmp_path / "kernels-off", args,
                       env={"HOROVOD_PROFILE_TF_KERNELS": "0"})
    assert res0["losses"] == plain["losses"]
    assert _steps(prof0)["count"].tolist() == [res0["batch"]] * 9
    assert len(_tensor_rows(prof0)) == 0
    lin0 = _meta(prof0)["lineage"]
    assert lin0["status"] != "ok" and "HOROVOD_PROFILE_TF_KERNELS=0" in lin0["reason"], lin0


GRAPH_BATCH = """
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
from profiler.collect.tf_hooks import graph_batch

w = tf.Variable(tf.ones([6, 4]))
infer = tf.autograph.experimental.do_not_convert(graph_batch)

def loss_of(x, y):
    logits = tf.matmul(x, w)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

def traced(f, *args):
    seen = {}

    @tf.function
    def g(*a):
        loss = f(*a)
        seen["batch"] = infer(loss)
        return loss

    g(*args)
    return seen["batch"]

x = tf.constant(np.ones((16, 6), "float32"))
y = tf.constant(np.zeros(16, "int64"))
ds = tf.data.Dataset.from_tensor_slices((np.ones((40, 6), "float32"), np.zeros(40, "int64")))
fixed, ragged = iter(ds.batch(8, drop_remainder=True)), iter(ds.batch(8))
z = tf.constant(np.ones((7, 6), "float32"))
print(json.dumps({
    "closure": traced(lambda: loss_of(x, y)),
    "argument": traced(loss_of, x[:5], y[:5]),
    "numpy": traced(lambda: loss_of(np.ones((12, 6), "float32"), np.zeros(12, "int64"))),
    "dataset": traced(lambda: loss_of(*next(fixed))),
    "dataset_unknown": traced(lambda: loss_of(*next(ragged))),
    "disagree": traced(lambda: loss_of(x, y) + loss_of(z, y[:7])),
}))
"""


@pytest.mark.slow
@needs_tf
def test_graph_batch_infers_the_batch_of_a_traced_step() -> None:
    """The batch a traced loss was computed from: captured tensors, the
    function's arguments, numpy arrays (constants), a dataset's static batch
    (drop_remainder); none (0) when the batch dimension is not static or the
    inputs disagree."""
    import subprocess

    p = subprocess.run([sys.executable, "-c", GRAPH_BATCH], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {
        "closure": 16, "argument": 5, "numpy": 12, "dataset": 8, "dataset_unknown": 0,
        "disagree": 0}


def test_unknown_images_said_once_and_in_the_mark(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A hooked step with no images: one line on stderr (once), saying how
    to give them, and the same words after what marked the steps."""
    monkeypatch.setattr(tf_hooks, "_state", {"marked_by": tf_hooks.FUNCTION_MARK,
                                             "no_images": None})
    assert tf_hooks.marked_by() == tf_hooks.FUNCTION_MARK
    tf_hooks._no_images()
    tf_hooks._no_images()
    err = capsys.readouterr().err
    assert err == f"profiler: {tf_hooks.NO_IMAGES}\n"
    assert "HOROVOD_PROFILE_BATCH_SIZE=" in err
    assert tf_hooks.marked_by() == f"{tf_hooks.FUNCTION_MARK}; {tf_hooks.NO_IMAGES}"


def _horovod_keras_fixed() -> str | None:
    """Why Horovod's Keras callbacks cannot run here (None: they can): the
    installed Horovod takes its Keras backend from Keras 3 until set-up
    patches it (scripts/setup.sh --patch-keras-backend)."""
    import importlib.util

    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return "Horovod not installed"
    cb = Path(list(spec.submodule_search_locations)[0]) / "tensorflow" / "keras" / "callbacks.py"
    if cb.is_file() and "from keras import backend as K" in cb.read_text():
        return ("the installed Horovod's Keras callbacks take Keras 3's backend: rerun "
                "HVPROF_WITH_TENSORFLOW=1 bash scripts/setup.sh (its Keras backend patch)")
    return None


# horovod/tensorflow/keras/callbacks.py of Horovod 0.28.1, its head
HVD_KERAS_HEAD = """import tensorflow as tf
from tensorflow import keras

from horovod.common.util  import is_version_greater_equal_than

if is_version_greater_equal_than(tf.__version__, "2.6.0"):
    from keras import backend as K
else:
    from tensorflow.python.keras import backend as K
"""


def test_setup_patches_horovods_keras_backend(tmp_path: Path) -> None:
    """scripts/setup.sh --patch-keras-backend: Horovod's Keras module takes
    the backend of tf.keras, not of Keras 3; the same file again is left as
    it is; a file without the line stops the set-up with one error line."""
    import subprocess

    setup = ROOT / "scripts" / "setup.sh"
    py = tmp_path / "callbacks.py"
    py.write_text(HVD_KERAS_HEAD)

    def patch() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(setup), "--patch-keras-backend", str(py)],
                              capture_output=True, text=True, timeout=30)

    for _ in range(2):
        p = patch()
        assert p.returncode == 0, p.stderr
        assert py.read_text() == HVD_KERAS_HEAD.replace(
            "    from keras import backend as K",
            "    K = keras.backend  # hvprof: the backend of tf.keras, not of Keras 3")
    py.write_text(HVD_KERAS_HEAD.replace("from keras import backend as K", "import keras"))
    p = patch()
    assert p.returncode != 0 and p.stderr.startswith("setup: error: "), p.stderr
    assert "'from keras import backend as K' not found" in p.stderr and "\n" not in p.stderr[:-1]


@pytest.mark.slow
@tf_job
def test_keras_with_horovods_callbacks_load_model_and_elastic_state(tmp_path: Path) -> None:
    """Horovod's Keras API (broadcast, metric-average and warm-up callbacks,
    hvd.load_model, elastic KerasState's commit and restore) runs under the
    profiler with the same results as without it: the same losses, averaged
    metrics and learning rates; one step per batch of both fits, each with its
    wait for Horovod."""
    why = _horovod_keras_fixed()
    if why:
        pytest.skip(why)
    res, prof = _run("tf_keras_hvd_job.py", tmp_path / "on", [])
    plain, _ = _run("tf_keras_hvd_job.py", tmp_path / "off", [], profile=False)
    assert res == plain
    assert res["loaded_same"] and res["loaded_distributed"] and res["state_restored"], res
    assert res["rates"] == [pytest.approx(0.01 * res["size"])] * res["epochs"]
    n = (res["epochs"] + 1) * res["steps_per_epoch"]  # the fit, then one epoch of the loaded model
    st = _steps(prof)
    assert len(st) == n and set(st["count"]) == {res["batch"]}
    _assert_breakdown(prof, n)


@pytest.mark.full  # the 2-rank fit runs the same path
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
    assert steps == {0: res["steps"], 1: res["steps"] + extra}
    # the step function's first argument is the batch: its images
    assert set(rows.loc[rows["op"] == "step", "count"]) == {res["batch"]}
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


# the hang's path: test_hang's (PyTorch); TensorFlow's tensor names in the
# records: test_custom_loop_steps_from_the_gradient_tape
@pytest.mark.parametrize("skip", [pytest.param(2, marks=pytest.mark.full),
                                  pytest.param(-1, marks=pytest.mark.full)],
                         ids=["rank1-skips", "clean"])
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
