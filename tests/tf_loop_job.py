"""A TensorFlow custom training loop under Horovod, as its users write it:
``hvd.DistributedGradientTape`` in a ``tf.function`` (or eager, --eager), and
nothing of the profiler in it.  It measures its own steps and writes them,
with its losses and its parameters, to --out (rank 0).

With --closure, as Horovod's tensorflow2_synthetic_benchmark.py: the batch is
made once and read by the step function from its closure (not an argument),
and the step takes one Python argument, first_batch, True in the first call
(which broadcasts the variables inside the function): the two values are two
traces of one tf.function.

    mpirun -np 2 python tests/tf_loop_job.py --out result.json [--eager] [--extra N] [--closure]
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--eager", action="store_true")
    p.add_argument("--extra", type=int, default=0,
                   help="steps rank 1 runs beyond the others, then every rank calls hvd.join()")
    p.add_argument("--closure", action="store_true",
                   help="the batch in the step function's closure, first_batch its argument")
    a = p.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(2)  # the same losses run to run: a check of transparency
    tf.config.experimental.enable_op_determinism()
    keras = tf.keras
    model = keras.Sequential([
        keras.layers.Dense(64, activation="relu", input_shape=(32,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    opt = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step_fn = train_step if a.eager else tf.function(train_step)
    rng = np.random.default_rng(200 + hvd.rank())
    losses, spans = [], []
    mine = a.steps + (a.extra if hvd.rank() == 1 else 0)
    if a.closure:
        x = tf.constant(rng.standard_normal((a.batch, 32)).astype("float32"))
        y = tf.constant(rng.integers(0, 10, a.batch))

        @tf.function
        def closure_step(first_batch: bool) -> tf.Tensor:
            loss = train_step(x, y)
            if first_batch:  # Python: a trace of its own
                hvd.broadcast_variables(model.variables, root_rank=0)
                hvd.broadcast_variables(opt.variables(), root_rank=0)
            return loss

        for i in range(mine):
            t0 = time.perf_counter()
            losses.append(float(closure_step(i == 0)))
            spans.append((t0, time.perf_counter()))
    for i in range(0 if a.closure else mine):
        x = tf.constant(rng.standard_normal((a.batch, 32)).astype("float32"))
        y = tf.constant(rng.integers(0, 10, a.batch))
        t0 = time.perf_counter()
        loss = step_fn(x, y)
        if i == 0:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        losses.append(float(loss))
        spans.append((t0, time.perf_counter()))
    last = int(hvd.join()) if a.extra else None  # eager: the last rank to join
    if hvd.rank() == 0:
        params = [(v.name, int(np.prod(v.shape)), v.dtype.size) for v in model.trainable_variables]
        with open(a.out, "w") as f:
            json.dump({"size": hvd.size(), "losses": losses, "spans": spans, "params": params,
                       "batch": a.batch, "steps": a.steps, "eager": a.eager,
                       "extra": a.extra, "last_rank": last}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
