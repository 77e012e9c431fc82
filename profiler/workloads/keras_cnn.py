"""A Keras ``model.fit`` job under Horovod, as its users write it: nothing of the
profiler in it (the project's own TensorFlow workload: tests, notebook 03).
It measures its own steps (a callback of its own around every run of the
training function) and writes them, with its losses and its parameter list,
to --out (rank 0), for a comparison with the trace.

Horovod 0.28.1 supports Keras 2 only; with TensorFlow >= 2.16 that is tf_keras,
chosen by TF_USE_LEGACY_KERAS=1 before TensorFlow is imported, as Horovod's
users on those versions do.

    mpirun -np 2 python -m profiler.workloads.keras_cnn --out result.json [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=200, help="per rank")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps-per-execution", type=int, default=1)
    a = p.parse_args(argv)

    # before TensorFlow is imported: Keras 2 (tf_keras), and no start-up chatter
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    hvd.init()
    tf.keras.utils.set_random_seed(1)  # the same losses run to run: a check of transparency
    tf.config.experimental.enable_op_determinism()
    keras = tf.keras
    model = keras.Sequential([
        keras.layers.Conv2D(8, 3, activation="relu", input_shape=(16, 16, 3)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10),
    ])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
    model.compile(optimizer=opt, steps_per_execution=a.steps_per_execution,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(100 + hvd.rank())
    x = rng.standard_normal((a.samples, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 10, a.samples)

    spans: list[tuple[float, float, int, int]] = []

    class Meter(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.t0, self.b0 = time.perf_counter(), batch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            spans.append((self.t0, time.perf_counter(), self.b0, batch))

    hist = model.fit(x, y, batch_size=a.batch, epochs=a.epochs, verbose=0, shuffle=False,
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Meter()])
    if hvd.rank() == 0:
        params = [(v.name, int(np.prod(v.shape)), v.dtype.size) for v in model.trainable_variables]
        with open(a.out, "w") as f:
            json.dump({"size": hvd.size(), "losses": [float(v) for v in hist.history["loss"]],
                       "spans": spans, "params": params, "batch": a.batch,
                       "samples": a.samples, "epochs": a.epochs,
                       "steps_per_execution": a.steps_per_execution}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
