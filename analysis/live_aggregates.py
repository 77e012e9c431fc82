"""The watcher's aggregates (analysis.live): their layout and the fold of
calls into them.  Per rank, one aggregate per (op, kind, communicator, size
class): calls, bytes, ns, max ns, and a fixed latency histogram; what
analysis.live folds records into and analysis.live_snapshot reads."""

from __future__ import annotations

import math

import numpy as np

from profiler.formats import record as F
from profiler.formats.buckets import LATENCY_BOUNDS_S, NB, SIZE_CLASSES

__all__ = ["SIZE_CLASSES", "LATENCY_BOUNDS_S", "NB", "size_class_index"]

_BOUNDS_NS = np.array([b * 1e9 for b in LATENCY_BOUNDS_S])
_SIZE_UPPER = np.array([u if math.isfinite(u) else np.inf for u, _ in SIZE_CLASSES])
_KINDS = F.CALL_KINDS
# value columns of an aggregate: calls, bytes, ns, max ns, then NB histogram buckets
_CALLS, _BYTES, _NS, _MAX = 0, 1, 2, 3
_NV = 4 + NB


def size_class_index(nbytes: np.ndarray) -> np.ndarray:
    """Index into SIZE_CLASSES of each message size."""
    return np.searchsorted(_SIZE_UPPER, np.asarray(nbytes, dtype=np.float64), side="left")


def _add(stats: dict[tuple[int, int, int, int], np.ndarray], op: np.ndarray, kind: np.ndarray,
         comm: np.ndarray, sc: np.ndarray, nbytes: np.ndarray, dur: np.ndarray,
         bucket: np.ndarray) -> None:
    """Fold calls into the (op, kind, comm, size class) aggregates."""
    key = (op << 32) | (kind << 28) | (comm << 4) | sc
    uniq, inv = np.unique(key, return_inverse=True)
    n = len(uniq)
    calls = np.bincount(inv, minlength=n)
    b = np.bincount(inv, weights=nbytes, minlength=n)
    ns = np.bincount(inv, weights=dur, minlength=n)
    mx = np.zeros(n)
    np.maximum.at(mx, inv, dur)
    hist = np.bincount(inv * NB + bucket, minlength=n * NB).reshape(n, NB)
    for i, k in enumerate(uniq.tolist()):
        t = (k >> 32, (k >> 28) & 0xF, (k >> 4) & 0xFFFFFF, k & 0xF)
        v = stats.get(t)
        if v is None:
            v = stats[t] = np.zeros(_NV)
        v[_CALLS] += calls[i]
        v[_BYTES] += b[i]
        v[_NS] += ns[i]
        v[_MAX] = max(v[_MAX], mx[i])
        v[4:] += hist[i]
