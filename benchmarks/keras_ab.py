"""Images/sec of a Keras CNN at 2 ranks, profiled / unprofiled inside one run
(issue 27's cost figure; benchmarks/, not a test).

A Keras ``model.fit`` job (a small CNN on synthetic 32x32 images) runs under
``HOROVOD_PROFILE=1``; a callback of this benchmark splits the training into
chunks of --chunk batches and switches the profiler's per-call work (the MPI
wrappers and TensorFlow's tensor records in Horovod's kernels:
``ab_driver.Switch("mpi")``) off and on between chunks, in pairs whose order is drawn at random, as
``ab_driver.py`` does for PyTorch.  The figure is the geometric mean of the
pairs' ratios (profiled / unprofiled images/sec, all ranks) with a 95% block
bootstrap interval, beside an A/A control run (nothing switched) and the
CPU share the trace itself states (``self_cost``: records x calibrated cost,
the helper thread, the Python hooks: here the Keras step callback, and the
kernel hooks' own time).

What stays on in both arms: the step callback, the helper thread, the
watchdog.  Their cost is in the trace's share, measured directly.

    .venv/bin/python benchmarks/keras_ab.py [--runs 2] [--chunks 40] [--chunk 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1",
           "OMPI_MCA_hwloc_base_binding_policy": "none", "OMPI_MCA_btl_tcp_if_include": "lo",
           "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def job(args: argparse.Namespace) -> int:
    """The job (one rank): fit with the switching callback; rank 0 prints AB."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, str(HERE))
    from ab_driver import Switch, arms_for

    hvd.init()
    tf.keras.utils.set_random_seed(3)
    keras = tf.keras
    model = keras.Sequential([
        keras.layers.Conv2D(16, 3, activation="relu", input_shape=(32, 32, 3)),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    n_batches = (args.chunks + 1) * args.chunk  # the first chunk warms up, untimed
    rng = np.random.default_rng(hvd.rank())
    x = rng.standard_normal((n_batches * args.batch, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, n_batches * args.batch)
    switch = Switch("mpi")
    arms = arms_for(args.chunks, args.seed)
    times: list[float] = []
    cpu: list[int] = []

    class Chunks(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):  # type: ignore[no-untyped-def]
            if batch % args.chunk:
                return
            now, thr = time.perf_counter(), time.thread_time_ns()
            i = batch // args.chunk  # chunk i begins; chunk 0 is the warm-up
            if i >= 2:
                times.append(now - self.t0)
                cpu.append(thr - self.c0)
            if i >= 1 and i - 1 < len(arms) and args.arms == "ab":
                switch.set(arms[i - 1])
            self.t0, self.c0 = time.perf_counter(), time.thread_time_ns()

        def on_train_end(self, logs=None):  # type: ignore[no-untyped-def]
            times.append(time.perf_counter() - self.t0)
            cpu.append(time.thread_time_ns() - self.c0)
            switch.set("on")

    model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Chunks()])
    import horovod.tensorflow as hvd_tf

    every = hvd_tf.allgather_object({"times": times, "cpu": cpu})
    if hvd.rank() == 0:
        rate = [args.chunk * args.batch * len(every) / max(r["times"][i] for r in every)
                for i in range(len(times))]
        print("AB " + json.dumps({"arms": arms, "images_per_sec": rate,
                                  "thread_ns": [r["cpu"] for r in every]}), flush=True)
    return 0


def run(args: argparse.Namespace, arms: str, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="keras-ab-") as tmp:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_PROFILE")},
               **MPI_ENV, "HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": f"{tmp}/prof"}
        cmd = ["mpirun", "-n", str(args.np), sys.executable, __file__, "--job",
               "--arms", arms, "--seed", str(seed), "--chunks", str(args.chunks),
               "--chunk", str(args.chunk), "--batch", str(args.batch)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        line = next((x for x in p.stdout.splitlines() if x.startswith("AB ")), None)
        if p.returncode or line is None:
            raise SystemExit(f"keras_ab: the job failed ({p.returncode}):\n{p.stderr[-3000:]}")
        doc: dict[str, Any] = json.loads(line[3:])
        meta = json.loads(Path(f"{tmp}/prof/trace.json").read_bytes())["horovod_profiler"]
        doc["self_cost"] = meta.get("self_cost") or {}
        return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--arms", choices=("ab", "aa"), default="ab")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=2, help="A/B runs (one A/A control besides)")
    p.add_argument("--chunks", type=int, default=40, help="timed chunks per run (even)")
    p.add_argument("--chunk", type=int, default=5, help="batches per chunk")
    p.add_argument("--batch", type=int, default=32, help="images per batch per rank")
    p.add_argument("--np", type=int, default=2)
    args = p.parse_args(argv)
    if args.job:
        return job(args)
    if args.chunks % 2:
        raise SystemExit("keras_ab: --chunks must be even (chunks come in pairs)")
    sys.path.insert(0, str(HERE))
    from images_per_sec import geomean_interval, pair_ratios

    runs: list[list[float]] = []
    control: list[float] = []
    cpu: list[float] = []
    step: list[float] = []
    t0 = time.monotonic()
    for r in range(args.runs + 1):
        arms = "aa" if r == args.runs else "ab"
        print(f"keras_ab: run {r + 1}/{args.runs + 1} ({arms}), "
              f"{time.monotonic() - t0:.0f} s so far", file=sys.stderr, flush=True)
        doc = run(args, arms, seed=r)
        pairs = pair_ratios(doc["arms"], doc["images_per_sec"])
        if arms == "ab":
            runs.append(pairs)
        else:
            control = pairs
        sc = doc["self_cost"]
        if sc.get("cpu_share_max") is not None:
            cpu.append(float(sc["cpu_share_max"]))
        if sc.get("step_share_max") is not None:
            step.append(float(sc["step_share_max"]))
    g, lo, hi = geomean_interval(runs)
    cg, clo, chi = geomean_interval([control])

    def pct(xs: list[float]) -> str:
        return ", ".join(f"{100 * x:.2f}%" for x in xs) or "-"

    print(f"Keras CNN, {args.np} ranks, {args.runs} A/B runs x {args.chunks // 2} pairs of "
          f"{args.chunk} batches of {args.batch} images per rank\n"
          f"  profiled/unprofiled images/sec {g:.3f} [{lo:.3f}, {hi:.3f}] (95%)\n"
          f"  A/A control                    {cg:.3f} [{clo:.3f}, {chi:.3f}]\n"
          f"  CPU share the traces state     {pct(cpu)} (worst rank), of step time {pct(step)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
