"""The Prometheus/OpenMetrics exposition of `profiler watch` (prometheus-client).

Metric names follow Prometheus's conventions: a `hvprof_` prefix, the unit
in the name (`_seconds`, `_bytes`), `_total` on counters.  Labels are bounded:

* `rank`: ranks 0 .. max_ranks-1 have their own series; every other rank is
  folded into rank="other" (counters summed, step time and in-flight age the
  maximum, images/sec summed);
* `host`: the first max_hosts host names (in rank order) are kept, the others
  are host="other";
* `op` comes from the format's op table, `kind` from the classification
  (data, control, p2p, app), `size_class` from profiler.formats.buckets.SIZE_CLASSES,
  `part` from the step breakdown's parts: all fixed.

So a job of any size exposes at most (max_ranks + 1) x (max_hosts + 1) label
pairs per op, and the latency histogram has no rank label at all.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from profiler.analysis.facade import Watcher
from profiler.formats import record as F
from profiler.formats.buckets import LATENCY_BOUNDS_S, NB, SIZE_CLASSES

#: Ranks with a series of their own; the others are rank="other".
MAX_RANK_LABELS = 64
#: Host names kept as label values; the others are host="other".
MAX_HOST_LABELS = 64
_KINDS = F.CALL_KINDS  # the watcher's kind indices


class WatchCollector(Collector):
    """Metrics of a Watcher's latest refresh (collected under `lock`)."""

    def __init__(self, watcher: Watcher, lock: threading.Lock, *,
                 max_ranks: int = MAX_RANK_LABELS, max_hosts: int = MAX_HOST_LABELS) -> None:
        self.watcher = watcher
        self.lock = lock
        self.max_ranks = max_ranks
        self.max_hosts = max_hosts

    def _labels(self, snap: dict[str, Any]) -> dict[int, tuple[str, str]]:
        hosts: list[str] = []
        out: dict[int, tuple[str, str]] = {}
        for r in snap["ranks"]:
            host = str(r.get("host", ""))
            if host not in hosts and len(hosts) < self.max_hosts:
                hosts.append(host)
            out[r["rank"]] = (str(r["rank"]) if r["rank"] < self.max_ranks else "other",
                              host if host in hosts else "other")
        return out

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            snap = self.watcher.snapshot()
            per_rank = {r: self.watcher.rank_stats(st) for r, st in self.watcher.ranks.items()}
        labels = self._labels(snap)
        calls = CounterMetricFamily("hvprof_calls", "Calls recorded, by op, kind, rank, host",
                                    labels=["op", "kind", "rank", "host"])
        nbytes = CounterMetricFamily("hvprof_payload_bytes", "Payload bytes of the calls "
                                     "(what this rank sends)",
                                     labels=["op", "kind", "rank", "host"])
        secs = CounterMetricFamily("hvprof_call_seconds", "Time in the calls",
                                   labels=["op", "kind", "rank", "host"])
        sums: dict[tuple[str, str, str, str], list[float]] = {}
        hist: dict[tuple[str, str], list[float]] = {}
        for r, stats in per_rank.items():
            if r not in labels:
                continue
            rl, hl = labels[r]
            for (op, kind, _comm, sc), v in stats.items():
                name = F.op_name(op)
                acc = sums.setdefault((name, _KINDS[kind], rl, hl), [0.0, 0.0, 0.0])
                acc[0] += v[0]
                acc[1] += v[1]
                acc[2] += v[2] / 1e9
                if F.op_backend(op) in ("mpi", "nccl"):
                    hk = (name, SIZE_CLASSES[sc][1])
                    h = hist.setdefault(hk, [0.0] * (NB + 1))
                    for i in range(NB):
                        h[i] += v[4 + i]
                    h[NB] += v[2] / 1e9
        for key, (c, b, s) in sorted(sums.items()):
            calls.add_metric(list(key), c)
            nbytes.add_metric(list(key), b)
            secs.add_metric(list(key), s)
        yield calls
        yield nbytes
        yield secs
        lat = HistogramMetricFamily("hvprof_call_duration_seconds", "Duration of the "
                                    "collectives, all ranks, by op and message size class",
                                    labels=["op", "size_class"])
        for (name, sc_label), h in sorted(hist.items()):
            cum, buckets = 0.0, []
            for i, bound in enumerate(LATENCY_BOUNDS_S):
                cum += h[i]
                buckets.append((repr(bound), cum))
            cum += h[NB - 1]
            buckets.append(("+Inf", cum))
            lat.add_metric([name, sc_label], buckets, h[NB])
        yield lat
        yield from self._rank_metrics(snap, labels)

    def _rank_metrics(self, snap: dict[str, Any],
                      labels: dict[int, tuple[str, str]]) -> Iterator[Metric]:
        lab = ["rank", "host"]
        fams: dict[str, Any] = {
            "steps": CounterMetricFamily("hvprof_steps", "Steps recorded", labels=lab),
            "images": CounterMetricFamily("hvprof_images", "Images in the steps", labels=lab),
            "dropped": CounterMetricFamily("hvprof_dropped_records", "Records the writer "
                                           "lost (disk full, write error, no buffer)",
                                           labels=lab),
            "cost": CounterMetricFamily("hvprof_profiler_cpu_seconds", "The profiler's own "
                                        "CPU time: cost per call x calls + helper thread",
                                        labels=lab),
            "step": GaugeMetricFamily("hvprof_step_duration_seconds", "Mean step time over "
                                      "the recent window", labels=lab),
            "ips": GaugeMetricFamily("hvprof_images_per_second", "Images per second over "
                                     "the recent window", labels=lab),
            "age": GaugeMetricFamily("hvprof_inflight_age_seconds", "Age of the oldest call "
                                     "in flight (0: none)", labels=lab),
            "stopped": GaugeMetricFamily("hvprof_rank_stopped", "1 when the rank is dead or "
                                         "has stopped writing", labels=lab),
            "share": GaugeMetricFamily("hvprof_profiler_cost_ratio", "The profiler's CPU "
                                       "time over the rank's run time", labels=lab),
        }
        folded: dict[tuple[str, str], dict[str, float]] = {}
        for r in snap["ranks"]:
            if "steps" not in r or r["rank"] not in labels:
                continue
            key = labels[r["rank"]]
            d = folded.setdefault(key, {})
            age = max((f["age_s"] for f in r["in_flight"]), default=0.0)
            for name, val, how in (
                    ("steps", r["steps"], "sum"), ("images", r["images"], "sum"),
                    ("dropped", r["dropped_records"], "sum"),
                    ("cost", r["cost"]["cost_s"], "sum"),
                    ("step", r["step_time_recent_s"], "max"),
                    ("ips", r["images_per_sec_recent"], "sum"), ("age", age, "max"),
                    ("stopped", 1.0 if r["stopped"] else 0.0, "max"),
                    ("share", r["cost"]["share"], "max")):
                if val is None:
                    continue
                d[name] = (d.get(name, 0.0) + float(val) if how == "sum"
                           else max(d.get(name, 0.0), float(val)))
        for key, d in sorted(folded.items()):
            for name, val in d.items():
                fams[name].add_metric(list(key), val)
        yield from fams.values()
        job = snap["job"]
        g = GaugeMetricFamily("hvprof_job_images_per_second", "The job's images per second "
                              "(sum over ranks) over the recent window")
        g.add_metric([], float(job["images_per_sec_recent"] or 0.0))
        yield g
        g = GaugeMetricFamily("hvprof_world_size", "Ranks in the job")
        g.add_metric([], float(snap["world_size"]))
        yield g
        g = GaugeMetricFamily("hvprof_stuck_calls", "Calls in flight for longer than "
                              "N times their usual duration")
        g.add_metric([], float(job["stuck_calls"]))
        yield g
        bd = snap.get("breakdown")
        if bd:  # part: fixed (analysis.breakdown.PARTS)
            g = GaugeMetricFamily("hvprof_step_part_seconds", "Where a step goes over the "
                                  "recent window: each part's mean (the parts sum to the "
                                  "step)", labels=["part"])
            for part in bd["parts"]:
                g.add_metric([part["part"]], float(part["ms"]) / 1e3)
            yield g


def make_registry(watcher: Watcher, lock: threading.Lock, *,
                  max_ranks: int = MAX_RANK_LABELS,
                  max_hosts: int = MAX_HOST_LABELS) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(WatchCollector(watcher, lock, max_ranks=max_ranks, max_hosts=max_hosts))
    return reg
