"""A Keras job that uses Horovod's own Keras API, as its users write it:
Horovod's callbacks (broadcast, metric averaging, learning-rate warm-up), a
model saved and read back with ``hvd.load_model``, and elastic Keras state
committed and restored; nothing of the profiler in it.  Rank 0 writes what
it saw (losses, averaged metrics, learning rates, the state's round trip) to
--out, for a comparison of runs with and without the profiler.

    mpirun -np 2 python tests/tf_keras_hvd_job.py --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2 (tf_keras): Horovod 0.28's Keras
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=96, help="per rank")
    p.add_argument("--batch", type=int, default=16)
    a = p.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(3)  # the same results run to run: a check of transparency
    tf.config.experimental.enable_op_determinism()
    keras = tf.keras
    model = keras.Sequential([
        keras.layers.Dense(32, activation="relu", input_shape=(20,)),
        keras.layers.Dense(10),
    ])
    lr = 0.01 * hvd.size()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(lr))  # as in Horovod's examples
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(300 + hvd.rank())
    x = rng.standard_normal((a.samples, 20)).astype("float32")
    y = rng.integers(0, 10, a.samples)
    steps_per_epoch = a.samples // a.batch
    rates: list[float] = []

    class Rate(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            rates.append(float(keras.backend.get_value(self.model.optimizer.lr)))

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1,
                                                 steps_per_epoch=steps_per_epoch),
        Rate(),
    ]
    hist = model.fit(x, y, batch_size=a.batch, epochs=a.epochs, verbose=0, shuffle=False,
                     callbacks=callbacks)

    # hvd.load_model: the model and its optimizer back, the optimizer Horovod's
    path = os.path.join(tempfile.gettempdir(), f"hvprof-keras-{os.getppid()}-{hvd.rank()}.h5")
    model.save(path)
    loaded = hvd.load_model(path)
    os.unlink(path)
    same = all(np.array_equal(u, v) for u, v in zip(model.get_weights(), loaded.get_weights()))
    more = loaded.fit(x, y, batch_size=a.batch, epochs=1, verbose=0, shuffle=False,
                      callbacks=[hvd.callbacks.MetricAverageCallback()])

    # elastic Keras state: commit, change the weights, restore
    state = hvd.elastic.KerasState(loaded, batch=0, epoch=a.epochs)
    state.commit()
    before = [w.copy() for w in loaded.get_weights()]
    loaded.set_weights([w + 1.0 for w in before])
    state.epoch = 99
    state.restore()
    restored = (all(np.array_equal(u, v) for u, v in zip(before, loaded.get_weights()))
                and state.epoch == a.epochs)

    if hvd.rank() == 0:
        with open(a.out, "w") as f:
            json.dump({"size": hvd.size(), "losses": [float(v) for v in hist.history["loss"]],
                       "accuracy": [float(v) for v in hist.history["accuracy"]],
                       "rates": rates, "loaded_same": bool(same),
                       # Horovod's optimizer class wraps the saved one
                       "loaded_distributed": hasattr(loaded.optimizer, "_allreduce_grads"),
                       "loaded_losses": [float(v) for v in more.history["loss"]],
                       "state_restored": bool(restored), "batch": a.batch,
                       "samples": a.samples, "epochs": a.epochs,
                       "steps_per_epoch": steps_per_epoch}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
