"""The live view's buckets: message-size classes and the latency histogram's
bounds, one layout for the watcher that folds calls into them
(analysis.live_aggregates) and the Prometheus exposition that names them
(`profiler watch --prometheus`); and the live view's defaults, one home for
the watcher (analysis.live.Watcher) and the command's options (cli.watch)."""

from __future__ import annotations

import math

__all__ = ["SIZE_CLASSES", "LATENCY_BOUNDS_S", "NB", "WINDOW_S", "STUCK_FACTOR", "STALE_S",
           "INTERVAL_S"]

#: Message-size classes: (upper bound in bytes, inclusive; label).
SIZE_CLASSES: tuple[tuple[float, str], ...] = (
    (1024, "0-1KiB"), (64 * 1024, "1KiB-64KiB"), (1 << 20, "64KiB-1MiB"),
    (16 << 20, "1MiB-16MiB"), (math.inf, "16MiB+"))
#: Upper bounds (seconds, inclusive) of the latency histogram; one more bucket
#: holds everything above the last.
LATENCY_BOUNDS_S: tuple[float, ...] = (1e-6, 4e-6, 16e-6, 64e-6, 256e-6, 1e-3, 4e-3, 16e-3,
                                       64e-3, 0.256, 1.0, 4.0, 16.0)
#: Buckets of the latency histogram.
NB = len(LATENCY_BOUNDS_S) + 1

#: The recent window for rates and the step breakdown, in seconds.
WINDOW_S = 10.0
#: A call in flight this many times its op's mean duration (and at least
#: analysis.live_snapshot.STUCK_MIN_S) is stuck.
STUCK_FACTOR = 10.0
#: A rank whose heartbeat has not moved for this many seconds has stopped writing.
STALE_S = 5.0
#: Seconds between two refreshes of `profiler watch`.
INTERVAL_S = 1.0
