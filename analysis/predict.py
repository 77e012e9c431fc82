"""A profiled job at another scale, fabric or setting: `profiler predict`.

From one profile (its rows, metadata and fusion lineage), the step time the
same job would take with more or fewer hosts and ranks, another link, another
fusion threshold or cycle time, another batch, its ranks on fewer cores, or
parameter servers instead of allreduce, with a 95% interval, its breakdown
and every assumption made.

The model is the profile's own, anchored on what it measured: each step's
measured parts (analysis.breakdown: compute, waiting for other ranks, waiting
for Horovod, transfer) plus what changes.

* **Compute** is as profiled (each rank keeps its own cores), scaled with the
  batch; the tensors' ready times within the backward pass scale with it.
* **The last arrival.**  Each rank's arrival at synchronize, as a deviation
  from the step's mean arrival, scaled by sqrt(n / (n - 1)) to stand for one
  rank's own (the deviation from a mean of n understates it), pooled over
  ranks and steps.  At P ranks the step waits for the slowest of P such
  offsets: their expected maximum under resampling of the pool
  (:func:`expected_max`; above the pool's size an exponential tail fitted to
  its top fifth, up to REACH times the pool).  The change is E[max of P] -
  E[max of the profiled n], added to the measured wait.
* **Horovod's cycle and fusion**, replayed on the profiled tensors' ready
  times (the lineage's, relative to each step's last arrival) with
  analysis.fusion_whatif.simulate's packing, cycle by cycle: a cycle starts
  every cycle time plus the profile's own overshoot; its tensors go out
  after the negotiation (the control allreduce at P ranks), one call after
  another; a cycle whose calls outlast it delays the next, which then starts
  at once on every rank.  After an idle cycle each rank sleeps on its own
  clock, so a tensor makes the job's cycle only when it was ready at its
  last rank's own start, up to the spread of the ranks' phases earlier
  (uniform phases: the latest of P less the last rank's own).  The replay
  runs at the profile's settings and at the target's, each step at
  PHASES cycle phases; the change of the tail after the last arrival, and
  of its transfer part, is added to the measured parts.
* **Transfers**: the time of one allreduce of S bytes at P ranks (K per
  host) is the algorithm the library picks at that size and rank count
  (Open MPI 4.1's fixed decision rules, coll_tuned_decision_fixed.c; Gloo's
  ring; NCCL the cheaper of ring and tree), priced by its latency steps and
  the bytes its busiest host link carries, split into exchanges (both
  directions at once) and one-way parts (:func:`algorithm_parts`), from a
  curve: the profile's own calls (their transfer times, converted from the
  profiled rank count to P through the two algorithms' costs), a `profiler
  bench` trace of the target fabric (converted the same way; its broadcast
  sweep, where it has one, prices the one-way parts), or a link
  RATE[,LATENCY] (TCP's payload share of an Ethernet frame taken off the
  rate).  A measured curve's bytes are its per-size medians, its latency
  its smallest sizes' lower quartile (a busy machine holds small calls up
  now and then: the profile's measured parts keep that).  ``ps:S``: push
  then pull through S parameter servers on hosts of their own, each
  holding 1/S of every buffer, as the MXNet proposal laid them out.
* **Ranks sharing cores** (`--cores N`, the cores the whole job's ranks
  share; default: each rank keeps the cores it had): with R ranks to a core
  at the target and R0 in the profile (the profile's cores: its ranks'
  CPUs per kernel, so simulated hosts on one machine count once), the main
  thread's time on a CPU outside synchronize takes R / R0 times as long; a
  call's bytes take the longer of the link's time and the cores' (the
  profile's own transfers' time per byte, R / R0 times); and every latency
  step of a collective, and every PARTNER_BYTES its busiest link carries,
  waits for a partner whose core is busy with another rank
  (:func:`sched_delay_ms`).

The interval (:func:`_interval`): log-normal around the prediction, its
width the bootstrap's over the profile's steps (the measured parts, the
replay's change and the arrival pool resampled together), two runs' noise
(RUN_SD: the profile's run and the predicted one) and the model's error for
the distance from the profiled step (MODEL_SD), both measured on the
development set of benchmarks/predict/ (docs/guide/predict.md, with the
held-out validation).

Where the profile cannot carry a prediction (under MIN_STEPS steady steps, a
rank count beyond the arrival pool's reach, another fusion threshold without
a lineage, a network from a one-host profile with no link given) the
Prediction says so in `refused` and carries no number.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from profiler.errors import ProfilerError, UsageError
from profiler.formats.horovod_env import settings as horovod_settings
from profiler.units import fmt_bytes, fmt_ms

from .fusion_whatif import fusion_threshold_bytes, simulate

__all__ = ["Link", "Layout", "Curve", "Target", "Profile", "Prediction", "parse_link",
           "parse_layout", "algorithm", "algorithm_cost", "algorithm_parts", "sched_delay_ms",
           "Shared", "expected_max", "arrival_offsets",
           "profile_of", "fabric_curve", "predict", "scaling", "knob_gain", "MIN_STEPS",
           "REACH", "PARTS"]

#: steady steps a prediction needs
MIN_STEPS = 5
#: the slowest of up to REACH x (offsets measured) ranks is extrapolated
REACH = 20
#: cycle phases each step is replayed at
PHASES = 8
#: the interval (_interval), in log units of the step: RUN_SD, the
#: deviation of one run's mean step from run to run of the same job on the
#: machine (the profile is one run, the job predicted another), measured on
#: the development set of benchmarks/predict (two runs of each
#: configuration, on this project's shared 2-core machine:
#: docs/guide/predict.md); MODEL_SD, the model's own error per unit of log
#: change from the profiled step (the further it goes, the more it can err):
#: on the development set its errors were within what the runs' noise alone
#: gives, so this is a floor kept for predictions far beyond it, not a fit
RUN_SD = 0.15
MODEL_SD = 0.05
#: the interval's coverage: 95%
Z95 = 1.96
#: TCP's payload in an Ethernet frame at MTU 1500: 1448 bytes of every 1538
#: on the wire (1500 + header, preamble, frame check and gap; timestamps on)
TCP_PAYLOAD = 1448 / 1538
#: a network link's latency per message when neither the option nor the
#: profile (one host) gives one: TCP over Ethernet
DEFAULT_LATENCY_NS = 25_000.0
#: the parts a prediction is broken into (analysis.breakdown's, the profiler
#: and unexplained parts counted with compute)
PARTS = ("compute", "wait_ranks", "horovod", "transfer")
N_BOOT = 400
SEED = 7
#: a measured curve's latency: the lower quartile of its calls of SMALL_BYTES
#: or less (_fit_sizes)
LOW_QUANTILE = 0.25
SMALL_BYTES = 4096
#: ranks sharing cores (sched_delay_ms): the slice of the thread a woken
#: rank waits behind (Linux's base slice, 0.75 ms, scaled as the kernel
#: scales it for 2 CPUs), and the bytes a rank moves between two such waits
#: (Open MPI's TCP fragment and Linux's default receive buffer, 128 KiB:
#: then the sender stops until its partner, waiting for a core, drains it).
#: Both chosen on the development set of benchmarks/predict among values
#: near these
SCHED_SLICE_MS = 1.5
PARTNER_BYTES = 128 * 1024


# --------------------------------------------------------------------------- options

_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)bit(?:/s)?$", re.IGNORECASE)
_TIME = re.compile(r"^(\d+(?:\.\d+)?)\s*(ns|us|ms|s)$", re.IGNORECASE)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_SECONDS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


@dataclass(frozen=True)
class Link:
    """A network link between hosts: its nominal rate (bits/s) and latency per
    message (ns; None: the profile's own)."""

    rate_bits: float
    latency_ns: float | None = None
    text: str = ""

    @property
    def ns_per_byte(self) -> float:
        """Time per payload byte: the rate less TCP's framing (TCP_PAYLOAD)."""
        return 8e9 / (self.rate_bits * TCP_PAYLOAD)

    def describe(self) -> str:
        r = self.rate_bits
        rate = (f"{r / 1e9:g} Gbit/s" if r >= 1e9 else f"{r / 1e6:g} Mbit/s" if r >= 1e6
                else f"{r / 1e3:g} kbit/s")
        return rate


def parse_link(text: str) -> Link:
    """RATE[,LATENCY]: 10gbit, 100gbit,2us, 50mbit,0.1ms."""
    parts = [p.strip() for p in str(text).split(",")]
    m = _RATE.match(parts[0]) if parts and len(parts) <= 2 else None
    lat = None
    if m is not None and len(parts) == 2:
        t = _TIME.match(parts[1])
        lat = float(t.group(1)) * _SECONDS[t.group(2).lower()] if t else None
        if t is None:
            m = None
    if m is None:
        raise UsageError(None, f"--link {text!r}: give RATE[,LATENCY], e.g. 10gbit, 100gbit,2us "
                               "or 50mbit,0.1ms")
    rate = float(m.group(1)) * _SCALE[m.group(2).lower()]
    if rate <= 0:
        raise UsageError(None, f"--link {text!r}: the rate must be above 0")
    return Link(rate, lat, str(text))


@dataclass(frozen=True)
class Layout:
    """How gradients are reduced: Horovod's allreduce, or push and pull
    through `servers` parameter servers (the MXNet proposal's layout)."""

    kind: str = "allreduce"
    servers: int = 0

    def describe(self) -> str:
        return ("allreduce" if self.kind == "allreduce" else
                f"{self.servers} parameter server{'s' if self.servers != 1 else ''}")


def parse_layout(text: str) -> Layout:
    """allreduce, or ps:S (S parameter servers, 1 <= S <= 4096)."""
    t = str(text).strip().lower()
    if t == "allreduce":
        return Layout()
    m = re.fullmatch(r"ps:(\d+)", t)
    if m is None or not 1 <= int(m.group(1)) <= 4096:
        raise UsageError(None, f"--layout {text!r}: can model allreduce (Horovod's) or ps:S "
                               "(S parameter servers on hosts of their own, 1 <= S <= 4096)")
    return Layout("ps", int(m.group(1)))


# --------------------------------------------------------------------------- algorithms

#: Open MPI 4.1's allreduce for commutative operations (Horovod's sums), in
#: ompi/mca/coll/tuned/coll_tuned_decision_fixed.c: per communicator size
#: (below), message sizes (below) and the algorithm
_OMPI: list[tuple[float, list[tuple[float, str]]]] = [
    (4, [(8, "ring"), (4096, "recursive doubling"), (8192, "ring"),
         (16384, "recursive doubling"), (65536, "ring"), (262144, "segmented ring"),
         (math.inf, "Rabenseifner")]),
    (8, [(16, "ring"), (8192, "recursive doubling"), (math.inf, "Rabenseifner")]),
    (16, [(8192, "recursive doubling"), (math.inf, "Rabenseifner")]),
    (32, [(64, "segmented ring"), (4096, "recursive doubling"), (math.inf, "Rabenseifner")]),
    (64, [(128, "segmented ring"), (math.inf, "Rabenseifner")]),
    (128, [(262144, "recursive doubling"), (math.inf, "Rabenseifner")]),
    (256, [(131072, "nonoverlapping"), (262144, "recursive doubling"),
           (math.inf, "Rabenseifner")]),
    (512, [(4096, "nonoverlapping"), (math.inf, "Rabenseifner")]),
    (2048, [(2048, "nonoverlapping"), (16384, "recursive doubling"),
            (math.inf, "Rabenseifner")]),
    (4096, [(2048, "nonoverlapping"), (4096, "segmented ring"), (16384, "recursive doubling"),
            (math.inf, "Rabenseifner")]),
    (math.inf, [(2048, "nonoverlapping"), (16384, "segmented ring"),
                (32768, "recursive doubling"), (math.inf, "Rabenseifner")]),
]
LIBRARIES = {"mpi": "Open MPI", "gloo": "Gloo", "nccl": "NCCL"}


def algorithm(library: str, nbytes: float, ranks: int) -> str:
    """The allreduce algorithm `library` ("Open MPI", "Gloo", "NCCL") picks for
    `nbytes` at `ranks` ranks; NCCL's depends on the link (its tuner weighs
    ring against tree): "ring|tree" here, settled by the cost."""
    if library == "Gloo":
        return "ring"
    if library == "NCCL":
        return "ring|tree"
    for below, rules in _OMPI:
        if ranks < below:
            return next(alg for limit, alg in rules if nbytes < limit)
    return "Rabenseifner"  # pragma: no cover - the last row is unbounded


def algorithm_parts(alg: str, ranks: int, per_host: int, servers: int = 0
                    ) -> tuple[float, float, float]:
    """(latency steps, exchange bytes, one-way bytes) of one allreduce of S
    bytes: it takes steps x alpha + (exchange x beta_both + one_way x beta_one)
    x S.  The bytes factors count what the busiest host link carries, in
    sequence: "exchange" while both directions of the link carry data at once
    (a ring's steps, recursive doubling's and Rabenseifner's pairwise
    exchanges), "one-way" while one does (the extra ranks handing their data
    in and getting the result back, a reduce then a broadcast, parameter
    servers' push then pull).  Ranks fill hosts in order, `per_host` each;
    ranks of one host exchange through memory at no cost beside the link; on
    one host the medium is the memory, per rank.  p2 is the largest power of
    two <= ranks (recursive doubling, Rabenseifner: the extra ranks first
    hand their data to a partner and get the result back)."""
    p = int(ranks)
    if p <= 1:
        return 0.0, 0.0, 0.0
    hosts = max(1, -(-p // max(1, per_host)))
    k = max(1, per_host) if hosts > 1 else 1
    p2 = 1 << (p.bit_length() - 1)
    extra = 2.0 if p > p2 else 0.0
    lg = math.log2(p2)
    kp = min(1 << (k.bit_length() - 1), p2)
    if alg in ("ring", "segmented ring"):
        return 2.0 * (p - 1), 2.0 * (p - 1) / p, 0.0
    if alg == "recursive doubling":
        inter = max(lg - math.log2(kp), 0.0)
        return lg + extra, kp * inter, extra
    if alg == "Rabenseifner":
        return 2.0 * lg + (3.0 if extra else 0.0), 2.0 * kp * (1.0 - kp / p2), extra
    if alg == "basic linear":
        return 2.0 * (p - 1), 0.0, 2.0 * (p - k)
    if alg == "nonoverlapping":
        lvl = math.ceil(math.log2(p))
        return 2.0 * lvl, 0.0, 2.0 * (math.ceil(math.log2(hosts)) if hosts > 1 else lvl)
    if alg == "tree":  # NCCL's: reduce up and broadcast down, pipelined (both ways at once)
        return 2.0 * ((math.ceil(math.log2(hosts)) if hosts > 1 else 0) + k - 1 or 1), 2.0, 0.0
    if alg == "ps":
        return 2.0, 0.0, 2.0 * max(p / max(servers, 1), k)
    raise ValueError(f"unknown algorithm {alg!r}")


def algorithm_cost(alg: str, ranks: int, per_host: int, servers: int = 0
                   ) -> tuple[float, float]:
    """(latency steps, bytes factor) of one allreduce of S bytes: it takes
    steps x alpha + factor x S x beta on a link whose rate is the same
    either way (algorithm_parts, its two bytes factors summed).  The one
    definition of the algorithms' costs: `profiler bench --pattern ps`'s
    link-bound column reads it too."""
    steps, both, one = algorithm_parts(alg, ranks, per_host, servers)
    return steps, both + one


# --------------------------------------------------------------------------- curves


@dataclass(frozen=True)
class Curve:
    """The time of one allreduce of S bytes between the ranks: either a link
    (alpha, beta) priced by the algorithms' costs, or a measured curve
    (`measured(S) -> ns` at `ranks` ranks, `per_host` per host) converted to
    other rank counts through them.

    A measured curve's bytes are an allreduce's, both directions of a link
    carrying data at once; `oneway` (a 2-rank MPI_Bcast curve: one message of
    S bytes) prices the algorithms' one-way parts where a bench measured it
    (else they cost what an exchange does).  A link's rate is the same
    either way unless `beta_oneway` says otherwise.

    The ranks' cores (`--cores`): `cpu` is the time the ranks' cores need
    per unit of bytes factor (S -> ns, the profile's own calls'), times
    `cpu_scale` (ranks to a core at the target over the profile's).  A
    call's bytes take the longer of the link's time and the ends' (TCP's
    copies overlap the wire): the cores' time plus a wait of `delay_ns` for
    a partner sharing its core every PARTNER_BYTES; every latency step waits
    `delay_ns` too (sched_delay_ms)."""

    library: str
    alpha_ns: float
    beta_ns_per_byte: float = 0.0
    measured: Callable[[np.ndarray], np.ndarray] | None = None
    ranks: int = 0
    per_host: int = 1
    source: str = ""
    #: the measured curve's per-byte part divided by this (a faster link)
    speedup: float = 1.0
    beta_oneway: float | None = None
    oneway: Callable[[np.ndarray], np.ndarray] | None = None
    oneway_alpha_ns: float = 0.0
    cpu: Callable[[np.ndarray], np.ndarray] | None = None
    cpu_scale: float = 1.0
    delay_ns: float = 0.0
    #: the measured curve's own latency per step (None: alpha_ns), taken off
    #: it to leave its bytes' time
    measured_alpha_ns: float | None = None
    #: the measured sizes' lower quartiles (S -> ns), for the cores' time
    quick: Callable[[np.ndarray], np.ndarray] | None = None

    def _per_unit(self, base: np.ndarray, s: np.ndarray, alpha: float) -> np.ndarray:
        """A measured curve's times at sizes S less its latency steps, over
        its algorithm's bytes factor (at the curve's own rank count)."""
        out = np.zeros(s.shape)
        algs = self._algs(s, self.ranks)
        for a0 in np.unique(algs):
            m = algs == a0
            st0, f0 = algorithm_cost(str(a0), self.ranks, self.per_host)
            out[m] = np.maximum(base[m] - st0 * alpha, 0.0) / max(f0, 1e-12)
        return out / self.speedup

    def unit(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(exchange, one-way): the time of one unit of bytes factor at each
        size S, less the latency (ns)."""
        if self.measured is None:
            both = s * self.beta_ns_per_byte
            one = s * (self.beta_ns_per_byte if self.beta_oneway is None else self.beta_oneway)
            return both, one
        a = self.alpha_ns if self.measured_alpha_ns is None else self.measured_alpha_ns
        both = self._per_unit(np.asarray(self.measured(s), dtype=float), s, a)
        if self.oneway is None:
            return both, both
        one = np.maximum(np.asarray(self.oneway(s), dtype=float) - self.oneway_alpha_ns, 0.0)
        return both, one / self.speedup

    def cpu_unit(self, s: np.ndarray) -> np.ndarray:
        """The cores' time per unit of bytes factor, when this is the
        profile's own curve (its link faster than its cores): its sizes'
        lower quartiles (`quick`) where it has them (the cores' time, not a
        busy moment's hold-ups, which the waits for a partner stand for),
        else its exchanges' time."""
        v = np.atleast_1d(np.asarray(s, dtype=float))
        if self.measured is None or self.quick is None:
            return self.unit(v)[0]
        return self._per_unit(np.asarray(self.quick(v), dtype=float), v, self.alpha_ns)

    def _one(self, alg: str, s: np.ndarray, p: int, k: int, servers: int) -> np.ndarray:
        steps, both, one = algorithm_parts(alg, p, k, servers)
        ub, uo = self.unit(s)
        wire = both * ub + one * uo
        if self.cpu is not None:  # the ends: the cores' time and the waits for a partner
            ends = (both + one) * (self.cpu_scale * np.asarray(self.cpu(s), dtype=float)
                                   + s / PARTNER_BYTES * self.delay_ns)
            wire = np.maximum(wire, ends)
        return np.maximum(steps * (self.alpha_ns + self.delay_ns) + wire, 0.0)

    def _algs(self, s: np.ndarray, p: int) -> np.ndarray:
        return np.array([algorithm(self.library, float(x), p) for x in s], dtype=object)

    def allreduce(self, nbytes: Any, ranks: int, per_host: int, layout: Layout = Layout()
                  ) -> tuple[np.ndarray, np.ndarray]:
        """(ns, algorithm name) per size, at `ranks` ranks, `per_host` per host."""
        s = np.atleast_1d(np.asarray(nbytes, dtype=float))
        if layout.kind == "ps":
            return (self._one("ps", s, ranks, per_host, layout.servers),
                    np.full(s.shape, "push+pull", dtype=object))
        algs = self._algs(s, ranks)
        out = np.zeros(s.shape)
        for a in np.unique(algs):
            m = algs == a
            if a == "ring|tree":
                ring = self._one("ring", s[m], ranks, per_host, 0)
                tree = self._one("tree", s[m], ranks, per_host, 0)
                out[m] = np.minimum(ring, tree)
                algs[np.flatnonzero(m)] = np.where(tree < ring, "tree", "ring")
            else:
                out[m] = self._one(str(a), s[m], ranks, per_host, 0)
        return out, algs

    def describe(self) -> str:
        return self.source


def _measured_curve(fit: Fit, library: str, ranks: int, per_host: int, source: str) -> Curve:
    """A measured curve (fit: its per-size medians and lower quartiles): its
    latency per step the small calls' lower quartile over the algorithm's
    latency steps at the smallest size (a busy machine's hold-ups of small
    calls left out: the profile's measured parts keep them, --cores adds
    them for ranks sharing cores); its bytes' time the medians' above their
    own smallest size (a link's typical rate, not its best moments)."""
    s0 = np.array([max(fit.smallest, 1.0)])
    steps, _ = algorithm_cost(algorithm(library, float(s0[0]), ranks) if library != "NCCL"
                              else "ring", ranks, per_host)
    n = max(steps, 1.0)
    return Curve(library, min(fit.low_ns, float(fit.median(s0)[0])) / n, measured=fit.median,
                 ranks=ranks, per_host=per_host, source=source,
                 measured_alpha_ns=float(fit.median(s0)[0]) / n, quick=fit.quartile)


@dataclass(frozen=True)
class Fit:
    """Calls' times per size: their medians (S -> ns, interpolated between
    the sizes measured), the lower quartile of the small sizes' (the
    latency) and the sizes' lower quartiles."""

    median: Callable[[np.ndarray], np.ndarray]
    low_ns: float
    smallest: float
    sizes: int
    #: the sizes' lower quartiles, interpolated the same way (None: unknown)
    quartile: Callable[[np.ndarray], np.ndarray] | None = None


def _interpolated(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """S -> ns through the points (x sizes ascending, y their times made
    non-decreasing): linear between neighbouring sizes (a latency and a cost
    per byte between them), the smallest size's time below it, and beyond
    the largest the last two sizes' cost per byte."""
    y = np.maximum.accumulate(y)
    slope = (y[-1] - y[-2]) / (x[-1] - x[-2]) if x.size > 1 else 0.0

    def fn(s: np.ndarray) -> np.ndarray:
        v = np.asarray(s, dtype=float)
        out = np.interp(v, x, y)
        return np.where(v > x[-1], y[-1] + max(slope, 0.0) * (v - x[-1]), out)
    return fn


def _fit_sizes(calls: pd.DataFrame, min_calls: int = 1, min_sizes: int = 2) -> Fit | None:
    """Fit (columns bytes, ns and, for the latency, low_ns, else ns: one row
    a call) over the sizes made `min_calls` times or more and at least a
    quarter as often as the most frequent size (a job's rare sizes come from
    its stretched steps: their times say more about that moment than about
    their size); None under `min_sizes` such sizes.  The latency: the lower
    quartile (LOW_QUANTILE) of the calls of SMALL_BYTES or less (else of
    the smallest size), pooled."""
    if "low_ns" not in calls.columns:
        calls = calls.assign(low_ns=calls["ns"])
    calls = calls.loc[(calls["bytes"] > 0) & (calls["ns"] > 0)]
    g = calls.groupby("bytes")
    n = g.size()
    keep = (n >= min_calls) & (n >= n.max() / 4.0)
    med = g["ns"].median()[keep].sort_index()
    if len(med) < max(min_sizes, 2):
        return None
    x = med.index.to_numpy(dtype=float)
    small = calls["bytes"].isin(med.index) & (calls["bytes"] <= max(SMALL_BYTES, x[0]))
    low = float(calls.loc[small, "low_ns"].quantile(LOW_QUANTILE))
    quart = g["ns"].quantile(LOW_QUANTILE)[keep].sort_index()
    return Fit(_interpolated(x, med.to_numpy(dtype=float)), max(low, 0.0), float(x[0]),
               len(med), _interpolated(x, quart.to_numpy(dtype=float)))


def _own_fit(calls: pd.DataFrame) -> Fit | None:
    """The profile's own curve: its data allreduces' transfers (from the last
    rank's arrival), over the sizes made MIN_SIZE_CALLS times or more, when
    there are MIN_OWN_SIZES such sizes (else None: fusion_whatif's
    latency_model and its other sources)."""
    from .fusion_whatif import MIN_OWN_SIZES, MIN_SIZE_CALLS

    if calls.empty:
        return None
    op = calls["op"].astype(str).to_numpy()
    data = (calls["kind"].astype(str) == "data").to_numpy(dtype=bool)
    ar = calls.loc[data & (op == "allreduce")]
    return _fit_sizes(pd.DataFrame({"bytes": ar["bytes"].to_numpy(dtype=float),
                                    "ns": ar["transfer_ns"].to_numpy(dtype=float)}),
                      MIN_SIZE_CALLS, MIN_OWN_SIZES)


def _bench_fit(bench: pd.DataFrame, op: str) -> Fit | None:
    """A bench's curve of `op`: each call's time as its slowest rank saw it
    (a broadcast's root returns once its data is buffered; its receiver's
    time is the wire's), and for the latency from the last rank's arrival
    to the last return (back-to-back calls drift apart: a small call's
    early rank waits for its partner, not the wire), fitted per size
    (_fit_sizes); None under 2 sizes made by 2 ranks or more."""
    rows = bench.loc[(bench["op"].astype(str) == op).to_numpy(dtype=bool)]
    if rows.empty or rows["rank"].nunique() < 2 or "seq" not in rows.columns:
        return None
    keys = [c for c in ("comm", "seq") if c in rows.columns]
    if not {"t_start_ns", "t_end_ns"} <= set(rows.columns):
        rows = rows.assign(t_start_ns=0, t_end_ns=rows["dur_ns"])
    calls = rows.groupby(keys, observed=True).agg(
        bytes=("bytes", "first"), ranks=("rank", "nunique"), ns=("dur_ns", "max"),
        t0=("t_start_ns", "max"), t1=("t_end_ns", "max"))
    calls = calls.loc[calls["ranks"] >= 2]
    return _fit_sizes(pd.DataFrame({"bytes": calls["bytes"], "ns": calls["ns"],
                                    "low_ns": calls["t1"] - calls["t0"]}))


def fabric_curve(bench: pd.DataFrame, meta: Mapping[str, Any] | None, library: str = "Open MPI"
                 ) -> Curve:
    """The curve of a `profiler bench` trace of the target fabric: its
    allreduce sweep (_bench_fit) at the bench's rank count and ranks per
    host; with a broadcast sweep at 2 ranks (`--collectives
    allreduce,bcast`), that sweep prices the one-way parts (one message of S
    bytes: on a link whose two directions slow each other, cheaper per byte
    than an exchange)."""
    fit = _bench_fit(bench, "allreduce")
    if fit is None:
        raise UsageError(None, "--fabric: the bench trace has fewer than 2 allreduce sizes "
                               "made by 2 ranks or more")
    ranks = int(pd.unique(bench["rank"]).size)
    hosts = _hosts(meta or {}, ranks)
    per_host = max(1, ranks // max(hosts, 1))
    curve = _measured_curve(fit, library, ranks, per_host,
                            f"the bench's allreduce curve ({fit.sizes} sizes, {ranks} ranks on "
                            f"{hosts} host{'s' if hosts != 1 else ''})")
    one = _bench_fit(bench, "bcast") if ranks == 2 and hosts == 2 else None
    if one is None:
        return curve
    s0 = np.array([max(one.smallest, 1.0)])
    return replace(curve, oneway=one.median, oneway_alpha_ns=float(one.median(s0)[0]),
                   source=curve.source[:-1] + f"; its broadcast curve, {one.sizes} sizes, for "
                                              "one-way transfers)")


def _hosts(meta: Mapping[str, Any], ranks: int) -> int:
    hs = meta.get("hosts")
    if isinstance(hs, list) and hs:
        return len(hs)
    names = {str(r.get("host", "")) for r in meta.get("ranks") or [] if isinstance(r, dict)}
    names.discard("")
    return len(names) or 1


# --------------------------------------------------------------------------- arrivals


def arrival_offsets(bd: pd.DataFrame, steps: Sequence[int] | None = None
                    ) -> list[np.ndarray]:
    """Per step with every rank's arrival (analysis.breakdown's arrival_ns):
    each rank's offset from the step's mean arrival in ms, scaled by
    sqrt(n / (n - 1)) to stand for one rank's own variation.  With `steps`:
    one entry per step given, empty where a rank's arrival is missing."""
    r = bd.loc[bd["arrival_ns"] >= 0, ["step", "rank", "arrival_ns"]]
    n = int(bd["rank"].nunique()) if len(bd) else 0
    by: dict[int, np.ndarray] = {}
    for s, g in r.groupby("step", sort=True):
        if len(g) < max(n, 2):
            continue
        a = g["arrival_ns"].to_numpy(dtype=np.float64)
        by[int(s)] = (a - a.mean()) / 1e6 * math.sqrt(len(a) / (len(a) - 1))
    if steps is None:
        return list(by.values())
    return [by.get(int(s), np.zeros(0)) for s in steps]


def expected_max(x: np.ndarray, p: int) -> float:
    """E[max of p draws] from the values x: exact under resampling for p <=
    len(x); beyond, the empirical body with an exponential tail fitted to the
    top fifth (peaks over the 80th percentile), integrated over the maximum's
    distribution.  NaN for an empty x."""
    v = np.asarray(x, dtype=np.float64)
    m = v.size
    if m == 0:
        return float("nan")
    if p <= 1:
        return float(v.mean())
    v = np.sort(v)
    if p <= m:
        # only the top values weigh: (j/m)^p under 1e-12 below them
        k = min(m, max(8, int(m * (1.0 - math.exp(-28.0 / p))) + 2))
        j = np.arange(m - k + 1, m + 1, dtype=np.float64)
        w = (j / m) ** p - ((j - 1) / m) ** p
        return float(np.dot(w, v[m - k:]))
    q0 = 0.8
    u0 = float(np.quantile(v, q0))
    top = v[v > u0]
    beta = float(np.mean(top - u0)) if top.size else 0.0
    # the maximum's quantiles: F_max(y) = F(y)^p on a grid in t = -ln(1 - F)
    t = np.linspace(0.0, math.log(p) + 12.0, 4000)
    f = -np.expm1(-t)
    body = np.quantile(v, np.minimum(f, q0))
    tail = u0 + beta * np.log((1.0 - q0) / np.maximum(1.0 - f, 1e-300))
    y = np.where(f <= q0, body, tail)
    with np.errstate(divide="ignore"):
        fmax = np.exp(p * np.log1p(-np.exp(-t)))
    mid = 0.5 * (y[1:] + y[:-1])
    return float(np.dot(mid, np.diff(fmax)) + y[0] * fmax[0])


def _reach(m: int) -> int:
    """The most ranks whose slowest `m` offsets can tell: m when too few for a
    tail (under 25), else REACH x m."""
    return m if m < 25 else REACH * m


def _lags(p: int, n: int = PHASES, seed: int = SEED) -> np.ndarray:
    """`n` stratified draws (in cycles) of how much earlier than the job's
    cycle start the last rank's own start comes: the latest of p uniform
    phases less one of them taken at random."""
    if p <= 1:
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    u = rng.random((4096, p))
    lag = u.max(axis=1) - u[:, 0]
    return np.quantile(lag, (np.arange(n) + 0.5) / n)


# --------------------------------------------------------------------------- the profile


@dataclass
class StepTensors:
    """One step's tensors: ready time on the last rank (ms after the step's
    last arrival; negative: before), bytes, dtype."""

    ready_ms: np.ndarray
    nbytes: np.ndarray
    dtype: list[str]


@dataclass
class Profile:
    """What a prediction reads from one profile (profile_of)."""

    ranks: int
    hosts: int
    per_host: int
    library: str
    steps: np.ndarray
    parts: pd.DataFrame             # per step: wall, compute, wait_ranks, horovod, transfer (ms)
    offsets: list[np.ndarray]       # per step (aligned with `steps`), arrival offsets
    tensors: list[StepTensors]      # per step, aligned with `steps`
    batch: float                    # images per rank and step
    step_ms: float                  # the run's step time (the one definition)
    images_per_s: float
    cycle_ms: float
    overshoot_ms: float
    threshold: int
    local_size: int | None
    control_bytes: float
    curve: Curve | None
    lineage: bool
    #: the cores the profile's ranks shared (None: unknown): per kernel (its
    #: boot id: simulated hosts on one machine share one), its ranks' CPUs
    cores: int | None = None
    #: per step and rank, ms: the main thread on a CPU outside synchronize
    #: (the schedstat rows; NaN without them)
    main_cpu_ms: float = float("nan")
    refused: str = ""
    notes: list[str] = field(default_factory=list)
    _base: dict[Any, Any] = field(default_factory=dict, repr=False)


class _Steps:
    """The steady steps and their breakdown, as the findings' Context
    (analysis.findings.base) reads them from the same functions; the
    findings hand their own Context in instead (profile_of's `ctx`), and
    this module imports nothing of theirs (they import it)."""

    def __init__(self, df: pd.DataFrame, meta: Mapping[str, Any]) -> None:
        from .breakdown import rank_breakdown
        from .throughput import (
            rank_steps,
            run_images_per_s,
            run_step_ms,
            steady_steps,
            step_table,
        )

        self.df = df
        self.step_table = (step_table(df, ranked=rank_steps(df)) if "op" in df.columns
                           else pd.DataFrame())
        self.steady = steady_steps(self.step_table) if len(self.step_table) else self.step_table
        self.ranks = sorted(int(r) for r in pd.unique(df["rank"])) if len(df) else []
        self.is_window = bool(df.attrs.get("selection"))
        bd = rank_breakdown(df, meta) if len(self.steady) else rank_breakdown(df.iloc[0:0])
        self.breakdown = bd.loc[bd["step"].isin(self.steady["step"])].reset_index(drop=True) \
            if len(self.steady) else bd
        own_ms = run_step_ms(self.steady) if len(self.steady) else float("nan")
        own_ips = run_images_per_s(self.steady)
        # a window of the job: the whole job's figures are trace.json's
        ms, ips = meta.get("step_ms"), meta.get("images_per_sec")
        whole = self.is_window and isinstance(ms, (int, float)) and isinstance(ips, (int, float))
        self.job_step_ms = float(ms) if whole else own_ms  # type: ignore[arg-type]
        self.job_images_per_s = float(ips) if whole else own_ips  # type: ignore[arg-type]


def _library(df: pd.DataFrame, meta: Mapping[str, Any]) -> tuple[str, str]:
    """(library, note): the collective library of the Horovod data calls."""
    be = df["backend"].astype(str) if "backend" in df.columns else pd.Series(["mpi"])
    kinds = set(be.unique()) - {"app"}
    if "nccl" in kinds:
        return "NCCL", ""
    if "gloo" in kinds:
        return "Gloo", ""
    mpi = str(meta.get("mpi_version", ""))
    if mpi and "Open MPI" not in mpi:
        return "Open MPI", (f"the MPI library is not Open MPI ({mpi[:40]}): Open MPI 4.1's "
                            "decision rules assumed")
    return "Open MPI", ""


def profile_of(df: pd.DataFrame, meta: Mapping[str, Any] | None,
               lineage: pd.DataFrame | None = None, *, path: str = "",
               arrivals: pd.DataFrame | None = None, ctx: Any = None) -> Profile:
    """Read a prediction's inputs from a profile's rows (every column
    COLUMNS names), its metadata and its fusion lineage (None: the
    data calls stand for the tensors; fusion cannot change then).
    `arrivals`: every rank's application rows (step, sync, tensor) when `df`
    is a window of a large job: the arrival pool then comes from every rank.
    A profile without steps is bad input (ProfilerError); one that cannot
    carry a prediction comes back with `refused` set.  `ctx`: the findings'
    Context of the same rows, whose tables are then reused."""
    from profiler.postjob.classify import is_horovod_row

    from .breakdown import rank_breakdown
    from .fusion_whatif import LATENCY_OPS, latency_model, ranks_per_host, transfer_times

    meta = dict(meta or {})
    if ctx is None:
        ctx = _Steps(df, meta)
    if ctx.step_table.empty:
        raise ProfilerError(path or None, "no steps in this profile: a prediction needs the "
                                          "job's steps (hvd.DistributedOptimizer, or "
                                          "profiler.step() in the training loop)")
    world = meta.get("world_size")
    ranks = int(world) if isinstance(world, int) and world > 0 else len(ctx.ranks)
    hosts = _hosts(meta, ranks)
    per_host = max(1, -(-ranks // hosts))
    library, note = _library(df, meta)
    env = meta.get("env") or {}
    hs = horovod_settings(env)
    host_names = [r.get("host", "") for r in meta.get("ranks") or [] if isinstance(r, dict)]
    prof = Profile(ranks=ranks, hosts=hosts, per_host=per_host, library=library,
                   steps=np.zeros(0, dtype=np.int64), parts=pd.DataFrame(), offsets=[],
                   tensors=[], batch=float("nan"), step_ms=ctx.job_step_ms,
                   images_per_s=ctx.job_images_per_s, cycle_ms=hs.cycle_time_ms,
                   overshoot_ms=0.0, threshold=hs.fusion_threshold,
                   local_size=ranks_per_host(host_names) if host_names else None,
                   control_bytes=8.0, curve=None, lineage=lineage is not None,
                   notes=[note] if note else [])
    bd = ctx.breakdown
    if bd.empty or not (bd["source"] == "sync").any():
        prof.refused = ("the profile has no Horovod synchronize in its steps (no tensor and "
                        "sync records): its steps cannot be split into compute, waits and "
                        "transfers")
        return prof
    bd = bd.loc[bd["source"] == "sync"]
    n_seen = int(bd["rank"].nunique())
    full = bd.groupby("step")["rank"].transform("size") >= n_seen
    bd = bd.loc[full]
    cols = {"wall": "wall_ms", "wait_ranks": "wait_ranks_ms", "horovod": "horovod_ms",
            "transfer": "transfer_ms", "completion": "completion_ms"}
    per = bd.groupby("step").agg(**{k: (v, "mean") for k, v in cols.items()})
    rest = bd["compute_ms"] + bd["profiler_ms"] + bd["unexplained_ms"]
    per["compute"] = rest.groupby(bd["step"]).mean()
    last = bd.groupby("step")["arrival_ns"].max()
    st = ctx.steady.set_index("step")
    images = (st["images"] / st["ranks"].clip(lower=1)) if "images" in st.columns else None
    prof.steps = per.index.to_numpy(dtype=np.int64)
    prof.parts = per.reset_index()
    if images is not None and len(images):
        prof.batch = float(images.reindex(prof.steps).mean())
    arr_bd = bd if arrivals is None else rank_breakdown(arrivals, meta)
    if arrivals is not None:
        arr_bd = arr_bd.loc[arr_bd["step"].isin(prof.steps)]
    prof.offsets = arrival_offsets(arr_bd, prof.steps.tolist())

    # Horovod's thread: its cycles, its control calls, its data calls' curve
    ops = df["op"].astype(str).to_numpy()
    hvd = df.loc[is_horovod_row(df) & np.isin(ops, LATENCY_OPS)]
    ar = hvd.loc[(hvd["op"].astype(str) == "allreduce").to_numpy(dtype=bool)]
    kind = ar["kind"].astype(str).to_numpy() if "kind" in ar.columns else np.full(len(ar), "data")
    ctl = ar.loc[kind == "control"]
    if len(ctl):
        prof.control_bytes = float(np.median(ctl["bytes"].to_numpy(dtype=float)))
        r0 = ctl.loc[ctl["rank"] == ctl["rank"].min()]
        gaps = np.diff(np.sort(r0["t_start_ns"].to_numpy(dtype=np.float64))) / 1e6
        idle = gaps[gaps < 3.0 * max(prof.cycle_ms, 0.1)]
        if idle.size:
            prof.overshoot_ms = max(0.0, float(np.median(idle)) - prof.cycle_ms)
    if ranks > 1 and len(ar) and "comm" in hvd.columns and hvd["rank"].nunique() > 1:
        if ctx.is_window:  # a window of the job's ranks: its calls matched over those
            hvd = hvd.assign(comm_size=int(hvd["rank"].nunique()))
        try:
            calls = transfer_times(hvd, ops=LATENCY_OPS)
            lat = latency_model(calls)
        except (KeyError, ValueError):
            calls, lat = None, None
        own = _own_fit(calls) if calls is not None else None
        if own is not None:
            prof.curve = _measured_curve(
                own, library, ranks, per_host,
                f"the profile's own transfers: its data allreduces, {own.sizes} sizes")
        elif lat is not None:
            regions = getattr(lat.model, "regions", ())
            smallest = float(regions[0].lo_bytes) if regions else 8.0
            prof.curve = _measured_curve(
                Fit(lat.predict_ns, float(lat.predict_ns(np.array([smallest]))[0]), smallest,
                    lat.sizes), library, ranks, per_host,
                f"the profile's own transfers: {lat.describe()}")
            if lat.wide:
                prof.notes.append("the profile's own transfer curve is wide ("
                                  + lat.describe() + "): its transfers price the target "
                                  "roughly")

    # the tensors of each step, from the lineage (else the data calls)
    win = ctx.steady.set_index("step")[["t_start_ns", "t_end_ns"]].reindex(prof.steps)
    prof.tensors = _step_tensors(prof.steps, last, lineage, ar, kind, win)
    prof.cores = _job_cores(meta)
    prof.main_cpu_ms = _main_cpu_ms(df, prof.steps)
    if lineage is None:
        prof.notes.append("no fusion lineage: the recorded data calls stand for the tensors")
    return prof


def _job_cores(meta: Mapping[str, Any]) -> int | None:
    """The cores the profile's ranks shared: per kernel (the rank's boot id,
    else its host name), the union of its ranks' CPUs (affinity, else the
    host's CPU count), summed; None without the ranks' CPU blocks."""
    from profiler.formats.cpu import boot_id

    groups: dict[str, set[int]] = {}
    for r in meta.get("ranks") or []:
        if not isinstance(r, dict) or not isinstance(r.get("cpu"), dict):
            continue
        cpu = r["cpu"]
        key = boot_id(r) or f"host:{r.get('host', '')}"
        aff = cpu.get("affinity")
        if isinstance(aff, list) and aff:
            groups.setdefault(key, set()).update(int(c) for c in aff if isinstance(c, int))
        elif isinstance(cpu.get("host_cpus"), int) and cpu["host_cpus"] > 0:
            groups.setdefault(key, set()).update(range(int(cpu["host_cpus"])))
    n = sum(len(v) for v in groups.values())
    return n or None


def _main_cpu_ms(df: pd.DataFrame, steps: np.ndarray) -> float:
    """Per step and rank, ms: the main thread's time on a CPU outside
    synchronize (its schedstat rows less the sync rows' figures), over the
    steps read; NaN without such rows.  Its time waiting for a CPU is left
    out: on a shared machine that is mostly other processes' doing."""
    if "op" not in df.columns or "thread_kind" not in df.columns:
        return float("nan")
    op = df["op"].astype(str).to_numpy()
    c = df.loc[(op == "cpu") & (df["thread_kind"].astype(str) == "main").to_numpy()]
    c = c.loc[c["seq"].isin(steps)]
    if c.empty:
        return float("nan")
    busy = c["bytes"].astype(float).groupby([c["rank"].to_numpy(), c["seq"].to_numpy()]).sum()
    sy = df.loc[op == "sync"]
    if len(sy):
        sb = sy["bytes"].astype(float).groupby(
            [sy["rank"].to_numpy(), sy["seq"].to_numpy()]).sum()
        busy = busy - sb.reindex(busy.index).fillna(0.0)
    return float(np.maximum(busy.to_numpy(), 0.0).mean() / 1e6)


def _step_tensors(steps: np.ndarray, last: pd.Series, lineage: pd.DataFrame | None,
                  ar: pd.DataFrame, kind: np.ndarray, win: pd.DataFrame) -> list[StepTensors]:
    """Per step: the tensors' ready times on the last rank relative to the
    step's last arrival (the lineage's ready_ns), or, with no lineage, the
    data calls (each the earliest start over the ranks, in the step's window
    `win`: t_start_ns, t_end_ns by step)."""
    if lineage is not None and len(lineage) and "ready_ns" in lineage.columns:
        lin = lineage.loc[(lineage["op"].astype(str) == "ALLREDUCE")
                          & lineage["matched"].astype(bool) & lineage["step"].isin(steps)]
        lin = lin.loc[np.isfinite(lin["ready_ns"].to_numpy(dtype=float))]
        t = pd.DataFrame({"step": lin["step"].to_numpy(dtype=np.int64),
                          "ready": lin["ready_ns"].to_numpy(dtype=float),
                          "bytes": lin["tensor_bytes"].to_numpy(dtype=float),
                          "dtype": lin["dtype"].astype(str).to_numpy()})
    else:
        d = ar.loc[kind == "data"]
        if d.empty or "seq" not in d.columns or win.empty:
            return [StepTensors(np.zeros(0), np.zeros(0), []) for _ in steps]
        g = d.groupby(["comm", "seq"], observed=True)
        t = pd.DataFrame({"ready": g["t_start_ns"].min().astype(float),
                          "bytes": g["bytes"].first().astype(float),
                          "dtype": (g["dtype"].first().astype(str) if "dtype" in d.columns
                                    else "float32")}).reset_index(drop=True)
        lo = win["t_start_ns"].to_numpy(dtype=float)
        hi = win["t_end_ns"].to_numpy(dtype=float)
        order = np.argsort(lo)
        i = np.searchsorted(lo[order], t["ready"].to_numpy(), side="right") - 1
        ok = i >= 0
        i = np.where(ok, order[np.maximum(i, 0)], 0)
        ok &= t["ready"].to_numpy() < hi[i]
        t = t.loc[ok].assign(step=win.index.to_numpy()[i[ok]])
    out = []
    by = {int(s): g for s, g in t.groupby("step")}
    for s in steps:
        g = by.get(int(s))
        a = float(last.get(s, np.nan))
        if g is None or not np.isfinite(a):
            out.append(StepTensors(np.zeros(0), np.zeros(0), []))
            continue
        g = g.sort_values("ready", kind="stable")
        out.append(StepTensors((g["ready"].to_numpy() - a) / 1e6, g["bytes"].to_numpy(),
                               g["dtype"].astype(str).tolist()))
    return out


# --------------------------------------------------------------------------- the target


@dataclass(frozen=True)
class Target:
    """What to predict (None: as profiled)."""

    hosts: int | None = None
    ranks_per_host: int | None = None
    link: Link | None = None
    fabric: Curve | None = None
    fusion_threshold: int | None = None
    cycle_ms: float | None = None
    batch_size: int | None = None
    layout: Layout = Layout()
    #: the profile's own link that many times faster (a remedy's what-if)
    link_speedup: float = 1.0
    #: the cores the whole job's ranks share (None: each rank keeps the cores
    #: it had in the profile)
    cores: int | None = None


@dataclass
class Prediction:
    """A predicted step (or, with `refused`, why there is none)."""

    ranks: int
    hosts: int
    per_host: int
    step_ms: float = float("nan")
    interval: tuple[float, float] = (float("nan"), float("nan"))
    images_per_s: float = float("nan")
    images_interval: tuple[float, float] = (float("nan"), float("nan"))
    breakdown: dict[str, float] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    algorithms: list[dict[str, Any]] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    refused: str = ""

    def to_dict(self) -> dict[str, Any]:
        ok = not self.refused
        return {
            "ranks": self.ranks, "hosts": self.hosts, "ranks_per_host": self.per_host,
            "step_ms": self.step_ms if ok else None,
            "interval": list(self.interval) if ok else None,
            "images_per_s": self.images_per_s if ok and math.isfinite(self.images_per_s)
            else None,
            "images_per_s_interval": list(self.images_interval) if ok else None,
            "breakdown": self.breakdown if ok else None,
            "algorithms": self.algorithms, "assumptions": self.assumptions,
            "measured": self.measured, "no_prediction": self.refused or None,
        }


def _refuse(prof: Profile, p: int, hosts: int, k: int, why: str) -> Prediction:
    return Prediction(p, hosts, k, refused=why, measured=_measured(prof))


def _measured(prof: Profile) -> dict[str, Any]:
    out: dict[str, Any] = {"ranks": prof.ranks, "hosts": prof.hosts,
                           "step_ms": prof.step_ms, "images_per_s": prof.images_per_s,
                           "steps": int(len(prof.steps))}
    if len(prof.parts):
        out["breakdown"] = {p: float(prof.parts[p].mean()) for p in PARTS}
    return out


def _curve_for(prof: Profile, t: Target, hosts: int) -> tuple[Curve | None, str]:
    """The target's curve and what it is, in words ('' and None: none can be had)."""
    if t.fabric is not None:
        c = t.fabric
        return replace(c, library=prof.library), "transfers: " + c.describe()
    if t.link is not None:
        alpha = t.link.latency_ns
        said = "given"
        if alpha is None:
            if prof.curve is not None and prof.hosts > 1:
                alpha, said = prof.curve.alpha_ns, "the profile's own, per message"
            else:
                alpha, said = DEFAULT_LATENCY_NS, "assumed for TCP over Ethernet"
        return (Curve(prof.library, float(alpha), t.link.ns_per_byte,
                      source=f"the link {t.link.text}"),
                f"the link: {t.link.describe()} nominal, {t.link.rate_bits * TCP_PAYLOAD / 1e9:.3g}"
                f" Gbit/s of TCP payload (1448 bytes of every 1538 on Ethernet), "
                f"{alpha / 1e3:.3g} us per message ({said})")
    if prof.curve is None:
        return None, ""
    if hosts > 1 and prof.hosts == 1:
        return None, ""
    c = replace(prof.curve, speedup=t.link_speedup) if t.link_speedup != 1.0 else prof.curve
    said = f"transfers: {c.describe()}, at {prof.ranks} ranks"
    if t.link_speedup != 1.0:
        said += f", its per-byte cost / {t.link_speedup:g} (a faster link)"
    return c, said


def _tail(tensors: StepTensors, scale: float, cycle_ms: float, overshoot_ms: float,
          threshold: int, call: Callable[[np.ndarray], np.ndarray], neg_ms: float,
          lags: np.ndarray, sizes: list[np.ndarray] | None = None) -> tuple[float, float]:
    """(tail, its transfer part) in ms after the step's last arrival, averaged
    over len(lags) cycle phases: Horovod's cycles replayed on the tensors
    (module docstring); `call(bytes) -> ns` prices a call; `sizes` collects
    the calls' sizes (one phase's)."""
    r = tensors.ready_ms * scale
    if r.size == 0:
        return 0.0, 0.0
    period = max(cycle_ms + overshoot_ms, 1e-3)
    order = np.argsort(r, kind="stable")
    r, nb = r[order], tensors.nbytes[order]
    dt = [tensors.dtype[i] for i in order]
    tails, xfers = [], []
    for j, lag_c in enumerate(lags):
        lag = lag_c * cycle_ms
        grid = r[0] + (j + 0.5) / len(lags) * period  # the first cycle at or after r[0]
        s = grid
        sent = 0
        idle = True
        end = xfer = 0.0
        while sent < r.size:
            cutoff = s - (lag if idle else 0.0)
            hi = int(np.searchsorted(r, cutoff, side="right"))
            if hi <= sent:  # nothing ready: sleep on to the cycle that will hold the next
                need = r[sent] + lag
                s += period * max(1.0, math.ceil((need - s) / period - 1e-12))
                idle = True
                continue
            pr = r[sent:hi]
            got: list[np.ndarray] = []

            def priced(x: np.ndarray, got: list[np.ndarray] = got) -> np.ndarray:
                got.append(np.asarray(x, dtype=float))
                return call(x)

            _, ns = simulate(pr, nb[sent:hi], dt[sent:hi], np.array([s]), priced,
                             threshold=threshold, cycle=np.zeros(hi - sent, dtype=np.int64))
            if sizes is not None and j == 0 and got:
                sizes.append(got[0])
            start = s + neg_ms
            end = start + ns / 1e6
            xfer += max(0.0, end - max(0.0, start))
            sent = hi
            busy = end > s + period
            s = end if busy else s + period
            idle = not busy
        tails.append(end)
        xfers.append(xfer)
    return float(np.mean(tails)), float(np.mean(xfers))


def _replay(prof: Profile, scale: float, cycle_ms: float, threshold: int, curve: Curve,
            p: int, k: int, layout: Layout, sizes: list[np.ndarray] | None = None,
            phases: int = PHASES) -> np.ndarray:
    """Per step: (tail, transfer) ms after the last arrival at this setting."""
    th = fusion_threshold_bytes(threshold, prof.local_size if p == prof.ranks else k)
    neg = float(curve.allreduce([prof.control_bytes], p, k)[0][0]) / 1e6 if p > 1 else 0.0
    lags = _lags(p, phases)

    memo: dict[float, float] = {}

    def call(x: np.ndarray) -> np.ndarray:  # the same sizes come back every step
        xs = np.asarray(x, dtype=float).tolist()
        new = sorted({v for v in xs if v not in memo})
        if new:
            ns = curve.allreduce(new, p, k, layout)[0] if p > 1 else np.zeros(len(new))
            memo.update(zip(new, np.asarray(ns, dtype=float).tolist()))
        return np.array([memo[v] for v in xs])

    out = np.zeros((len(prof.steps), 2))
    for i, st in enumerate(prof.tensors):
        out[i] = _tail(st, scale, cycle_ms, prof.overshoot_ms, th, call, neg, lags,
                       sizes if i == 0 else None)
    return out


def _algorithms(curve: Curve, sizes: np.ndarray, p: int, k: int, layout: Layout,
                n_steps: int = 1) -> list[dict[str, Any]]:
    """The algorithm per size range of the predicted calls (one step's)."""
    if sizes.size == 0 or p <= 1:
        return []
    _, algs = curve.allreduce(sizes, p, k, layout)
    rows = []
    for a in sorted(set(algs.tolist()), key=lambda a: float(sizes[algs == a].min())):
        m = algs == a
        rows.append({"library": "parameter server" if layout.kind == "ps" else curve.library,
                     "algorithm": str(a), "min_bytes": int(sizes[m].min()),
                     "max_bytes": int(sizes[m].max()), "calls_per_step": int(m.sum())})
    return rows


def predict(prof: Profile, target: Target = Target(), *, n_boot: int = N_BOOT,
            seed: int = SEED, phases: int = PHASES) -> Prediction:
    """The predicted step of `prof`'s job at `target` (module docstring)."""
    hosts = int(target.hosts or prof.hosts)
    k = int(target.ranks_per_host or prof.per_host)
    p = hosts * k
    if hosts < 1 or k < 1:
        raise UsageError(None, "hosts and ranks per host must be >= 1")
    if prof.refused:
        return _refuse(prof, p, hosts, k, prof.refused)
    n = len(prof.steps)
    if n < MIN_STEPS:
        return _refuse(prof, p, hosts, k, f"{n} steady step{'s' if n != 1 else ''} with every "
                                          f"rank's arrival: a prediction needs {MIN_STEPS}")
    pool = np.concatenate(prof.offsets) if prof.offsets else np.zeros(0)
    if prof.ranks > 1 and p > _reach(pool.size):
        return _refuse(prof, p, hosts, k,
                       f"the slowest of {p} ranks lies beyond what {pool.size} measured "
                       f"arrivals tell (up to {_reach(pool.size)} ranks); profile more steps "
                       "or ranks")
    th = prof.threshold if target.fusion_threshold is None else int(target.fusion_threshold)
    if th != prof.threshold and not prof.lineage:
        return _refuse(prof, p, hosts, k, "another fusion threshold needs the fusion lineage "
                                          "(lineage.parquet beside the trace)")
    curve, said = _curve_for(prof, target, hosts)
    if curve is None:
        why = ("the profile ran on one host: its transfers say nothing of a network between "
               "hosts; give --link RATE or --fabric BENCH" if prof.hosts == 1 and hosts > 1
               else "the profile has no data calls to price transfers with; give --link or "
                    "--fabric")
        return _refuse(prof, p, hosts, k, why)
    shared = _shared_cores(prof, target, p)
    if shared is not None:
        curve = replace(curve, delay_ns=shared.delay_ns,
                        cpu=prof.curve.cpu_unit if prof.curve is not None else None,
                        cpu_scale=shared.scale)
    base_curve = prof.curve or curve
    cyc = prof.cycle_ms if target.cycle_ms is None else float(target.cycle_ms)
    batch = prof.batch if target.batch_size is None else float(target.batch_size)
    scale = batch / prof.batch if np.isfinite(prof.batch) and prof.batch > 0 else 1.0

    base = prof._base.get(phases) if prof.curve is not None else None
    if base is None:  # the replay at the profile's own settings, kept for its curve
        base = _replay(prof, 1.0, prof.cycle_ms, prof.threshold, base_curve, prof.ranks,
                       prof.per_host, Layout(), phases=phases)
        if prof.curve is not None:
            prof._base[phases] = base
    sizes: list[np.ndarray] = []
    new = _replay(prof, scale, cyc, th, curve, p, k, target.layout, sizes, phases)
    d_tail = new[:, 0] - base[:, 0]
    d_xfer = new[:, 1] - base[:, 1]
    parts = prof.parts
    compute = parts["compute"].to_numpy() * scale
    if shared is not None:
        compute = compute + shared.compute_ms * scale
    wait = parts["wait_ranks"].to_numpy()
    xfer = np.maximum(parts["transfer"].to_numpy() + d_xfer, 0.0)
    hv = np.maximum(parts["horovod"].to_numpy() + (d_tail - d_xfer), 0.0)
    per_step = compute + wait + xfer + hv

    def d_max(offs: list[np.ndarray]) -> float:
        x = np.concatenate(offs) if offs else np.zeros(0)
        if prof.ranks <= 1 or not x.size or p == prof.ranks:
            return 0.0
        return expected_max(x, p) - expected_max(x, prof.ranks)

    dm = d_max(prof.offsets)
    point = float(per_step.mean()) + dm
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    for b in range(n_boot):
        idx = rng.integers(0, n, n)
        boots[b] = per_step[idx].mean() + d_max([prof.offsets[i] for i in idx])
    lo, hi = _interval(point, boots, float(prof.parts["wall"].mean()))
    bd = {"compute": float(compute.mean()), "wait_ranks": float(wait.mean() + dm),
          "horovod": float(hv.mean()), "transfer": float(xfer.mean())}
    ips = p * batch / point * 1e3 if np.isfinite(batch) and batch > 0 else float("nan")
    pred = Prediction(
        ranks=p, hosts=hosts, per_host=k, step_ms=point, interval=(float(lo), float(hi)),
        images_per_s=ips,
        images_interval=((p * batch / hi * 1e3, p * batch / lo * 1e3) if np.isfinite(ips)
                         else (float("nan"), float("nan"))),
        breakdown=bd, measured=_measured(prof),
        algorithms=_algorithms(curve, np.concatenate(sizes) if sizes else np.zeros(0), p, k,
                               target.layout))
    pred.assumptions = _assumptions(prof, target, p, hosts, k, cyc, th, scale, said, pool.size,
                                    shared)
    return pred


def _interval(point: float, boots: np.ndarray, profiled: float) -> tuple[float, float]:
    """The 95% interval of a run's mean step: log-normal around the point,
    its deviation the bootstrap's over the profile's steps, two runs' noise
    (RUN_SD: the profile's run and the predicted one) and the model's error
    for the distance from the profiled step (MODEL_SD)."""
    b = np.asarray(boots, dtype=float)
    b = b[np.isfinite(b) & (b > 0)]
    sd_boot = float(np.std(np.log(b / point))) if b.size > 1 and point > 0 else 0.0
    dist = abs(math.log(point / profiled)) if point > 0 and profiled > 0 else 0.0
    sd = math.sqrt(sd_boot ** 2 + 2.0 * RUN_SD ** 2 + (MODEL_SD * dist) ** 2)
    return point * math.exp(-Z95 * sd), point * math.exp(Z95 * sd)


@dataclass(frozen=True)
class Shared:
    """The target's ranks on fewer cores than the profile's had (`--cores`)."""

    cores: int
    profiled_cores: int
    #: ranks to a core at the target over the profile's (each at least 1)
    scale: float
    #: added to every latency step of a collective (ns)
    delay_ns: float
    #: added to each step's compute (ms)
    compute_ms: float
    said: str


def sched_delay_ms(ranks: int, cores: float) -> float:
    """The wait for a partner at each latency step of a collective when
    `ranks` ranks share `cores` cores: while a collective runs every rank's
    threads want a CPU (Open MPI and Horovod poll), so the rank a message
    just reached finds its core busy with another rank's thread as often as
    there are more ranks than cores (min(1, (ranks - cores) / cores)), and
    then waits for the rest of that thread's slice: half of SCHED_SLICE_MS."""
    return SCHED_SLICE_MS / 2.0 * min(1.0, max(0.0, ranks - cores) / cores)


def _shared_cores(prof: Profile, t: Target, p: int) -> Shared | None:
    """With `--cores`: what P ranks on that many cores change against the
    profile's ranks on theirs (None: each rank keeps its cores)."""
    if t.cores is None:
        return None
    c0 = prof.cores or prof.ranks
    o0 = max(1.0, prof.ranks / c0)
    o = max(1.0, p / t.cores)
    delay = (sched_delay_ms(p, t.cores) - sched_delay_ms(prof.ranks, c0)) * 1e6
    cpu = prof.main_cpu_ms if math.isfinite(prof.main_cpu_ms) else 0.0
    add = (o / o0 - 1.0) * cpu
    said = (f"the {p} ranks share {t.cores} core{'s' if t.cores != 1 else ''} "
            f"({o:.3g} rank{'s' if o != 1 else ''} to a core where the profile's {prof.ranks} "
            f"had {c0}{'' if prof.cores else ' (assumed: one each)'}, {o0:.3g} to a core): "
            f"the main thread's time on a CPU outside synchronize "
            f"({cpu:.3g} ms a step) {o / o0:.3g} times as long; a transfer's bytes take the "
            "longer of the link's time and the cores' (the profile's own transfers' time per "
            f"byte, {o / o0:.3g} times); each latency step of a collective "
            f"{delay / 1e6:+.3g} ms for a partner sharing a core (half a {SCHED_SLICE_MS:g} ms "
            "scheduler slice per rank queued ahead)")
    if prof.curve is None:
        said += "; the profile has no transfers of its own: the cores' time per byte unknown"
    if not math.isfinite(prof.main_cpu_ms):
        said += "; the profile has no CPU rows: compute as profiled"
    return Shared(t.cores, c0, o / o0, delay, add, said)


def _assumptions(prof: Profile, t: Target, p: int, hosts: int, k: int, cyc: float, th: int,
                 scale: float, said: str, pool: int, shared: Shared | None = None
                 ) -> list[str]:
    out = [f"profiled: {prof.ranks} rank{'s' if prof.ranks != 1 else ''} on {prof.hosts} "
           f"host{'s' if prof.hosts != 1 else ''}, {len(prof.steps)} steady steps; predicted: "
           f"{p} on {hosts} ({k} per host, ranks fill hosts in order)",
           (shared.said if shared is not None else
            "each rank keeps its own cores: communication does not slow the compute, and "
            "compute per step is as profiled")
           + (f"; compute scaled with the batch ({scale:.3g}x)" if scale != 1.0 else ""),
           f"ranks arrive independently, each offset like the {pool} measured arrivals "
           "(deviations from the step's mean); the step waits for the slowest of "
           f"{p}" + (" (an exponential tail beyond the measured ones)" if p > pool else ""),
           said,
           f"collectives: {_library_rule(prof.library, t.layout)}",
           f"Horovod's cycle ({cyc:g} ms + the profile's {prof.overshoot_ms * 1e3:.0f} us "
           f"overshoot) and fusion ({fmt_bytes(th) if th else 'off'}) replayed on the profiled "
           "tensors' ready times; a busy cycle delays the next; idle ranks' cycle phases "
           "uniform",
           "what the replay does not hold (completion, waits inside the negotiation, the first "
           "call after a cycle's sleep) stays as measured"]
    if k > 1 and hosts > 1:
        out.append("ranks of one host exchange through memory at no cost beside the link")
    if t.layout.kind == "ps":
        out.append(f"{t.layout.servers} parameter server(s) on hosts of their own, each "
                   "holding 1/S of every buffer: push then pull, as in the MXNet proposal")
    out.extend(prof.notes)
    return out


def _library_rule(library: str, layout: Layout) -> str:
    if layout.kind == "ps":
        return "push+pull through the servers (no allreduce)"
    return {"Open MPI": "Open MPI 4.1's fixed decision rules for allreduce "
                        "(coll_tuned_decision_fixed.c) at each size and rank count",
            "Gloo": "Gloo's ring allreduce at every size",
            "NCCL": "NCCL's ring or tree, whichever this model prices lower"}[library]


# --------------------------------------------------------------------------- uses


def scaling(prof: Profile, ranks: Sequence[int], links: Mapping[str, Link | None],
            *, n_boot: int = 60, phases: int = 2) -> pd.DataFrame:
    """Predicted images/sec against ranks, per fabric (label -> a Link, or
    None: the profile's own), ranks filling hosts of the profile's ranks per
    host (one host when the profile ran on one).  Columns: fabric, ranks,
    hosts, images_per_s, lo, hi, step_ms, refused."""
    rows = []
    for label, link in links.items():
        for r in ranks:
            if link is None and prof.hosts == 1:
                hosts, k = 1, int(r)
            else:
                k = min(prof.per_host, int(r))
                hosts = max(1, int(r) // k)
            pr = predict(prof, Target(hosts=hosts, ranks_per_host=k, link=link), n_boot=n_boot,
                         phases=phases)
            rows.append({"fabric": label, "ranks": hosts * k, "hosts": hosts,
                         "images_per_s": pr.images_per_s, "lo": pr.images_interval[0],
                         "hi": pr.images_interval[1], "step_ms": pr.step_ms,
                         "refused": pr.refused})
    return pd.DataFrame(rows, columns=["fabric", "ranks", "hosts", "images_per_s", "lo", "hi",
                                       "step_ms", "refused"])


def knob_gain(prof: Profile, target: Target) -> tuple[float, float, float] | None:
    """What a remedy that changes a knob buys per step: (ms saved, lo, hi)
    from the prediction at `target` against the profile's measured step
    (None when the profile cannot carry it)."""
    pr = predict(prof, target, n_boot=200)
    if pr.refused or not np.isfinite(pr.step_ms):
        return None
    base = float(prof.parts["wall"].mean())
    lo, hi = pr.interval
    return base - pr.step_ms, base - hi, base - lo


def describe(pr: Prediction) -> str:
    """One line: the predicted step and rate, or why there is none."""
    if pr.refused:
        return f"no prediction: {pr.refused}"
    lo, hi = pr.interval
    return (f"{fmt_ms(pr.step_ms)} per step [{fmt_ms(lo)}, {fmt_ms(hi)}] at {pr.ranks} ranks")


#: the columns a prediction reads
COLUMNS = ["rank", "backend", "op", "t_start_ns", "t_end_ns", "dur_ns", "bytes", "count",
           "dtype", "comm", "comm_size", "seq", "kind", "step", "device", "thread_kind",
           "track"]
MAX_ROWS = 2_000_000
APP_COLUMNS = ["rank", "backend", "op", "t_start_ns", "t_end_ns", "seq", "step", "count"]


def open_profile(path: str, *, lineage: pd.DataFrame | None = None,
                 max_rows: int = MAX_ROWS, first_ranks: int = 16) -> Profile:
    """Open a trace for predictions: its metadata, the rows the findings read
    and `lineage` (the caller's: find_lineage).  A dataset of more than
    `max_rows` rows is read as its first `first_ranks` ranks (every step),
    with every rank's step, sync and tensor rows for the arrival pool."""
    from profiler.formats.filters import RowFilter
    from profiler.formats.trace_dataset import read_files
    from profiler.layout import resolve_trace

    from .load import load, trace_meta

    meta = trace_meta(path) or {}
    ds = meta.get("dataset") or {}
    files = ds.get("files") or []
    columns = COLUMNS
    arrivals = None
    if int(ds.get("rows") or 0) > max_rows and files and not meta.get("window"):
        base = resolve_trace(path).parent
        paths = [base / f for f in files]
        n = int(meta.get("world_size") or len(paths))
        df = read_files(paths, RowFilter.of(ranks=range(min(first_ranks, n))), columns)
        df.attrs["selection"] = {"": {"description": f"ranks 0-{min(first_ranks, n) - 1} of "
                                                     f"{n}, every step"}}
        arrivals = read_files(paths, RowFilter.of(ops=["step", "sync", "tensor", "join"]),
                              APP_COLUMNS)
    else:
        df = load(path, columns=columns)
    return profile_of(df, meta, lineage, path=str(path), arrivals=arrivals)


def find_lineage(path: str) -> pd.DataFrame | None:
    """The fusion lineage beside a trace (lineage.parquet), else one the
    post-job stage builds from the profile's ranks' datasets (nothing
    written), else None."""
    from pathlib import Path

    from profiler.formats import lineage as LF

    try:
        return LF.load(path)
    except ProfilerError:
        pass
    p = Path(path)
    d = p if p.is_dir() else p.parent
    if not (d / "ranks").is_dir():
        return None
    try:
        from profiler.postjob.lineage import build_lineage

        out = build_lineage(d, write=False)
    except (ProfilerError, OSError, ValueError, KeyError):
        return None
    return out.table if out is not None else None


#: the report's "what if": the profiled fabric and these two, at these ranks
REPORT_LINKS = {"10 GbE": "10gbit", "100 Gb/s, 2 us": "100gbit,2us"}
REPORT_RANKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def scaling_figure(table: pd.DataFrame, measured: tuple[int, float]) -> Any:
    """Predicted images/sec against ranks, one line per fabric with its 95%
    band, and the measured point."""
    import plotly.graph_objects as go

    from . import figures as F

    fig = go.Figure()
    for name, g in table.loc[table["refused"] == ""].groupby("fabric", sort=False):
        x = g["ranks"].to_numpy()
        fig.add_trace(go.Scatter(x=np.r_[x, x[::-1]], y=np.r_[g["hi"], g["lo"][::-1]],
                                 fill="toself", line={"width": 0}, opacity=0.2,
                                 hoverinfo="skip", showlegend=False, name=F.esc(str(name))))
        fig.add_trace(go.Scatter(x=x, y=g["images_per_s"], mode="lines+markers",
                                 name=F.esc(str(name))))
    fig.add_trace(go.Scatter(x=[measured[0]], y=[measured[1]], mode="markers",
                             marker={"size": 12, "symbol": "x", "color": "black"},
                             name="measured"))
    fig.update_layout(xaxis={"type": "log", "title": "ranks"},
                      yaxis={"type": "log", "title": "images/sec (predicted)"},
                      title="What if: images/sec against ranks", height=420)
    return fig


def report_section(paths: Mapping[str, str | None], fig: Callable[[str, Any], str],
                   table: Callable[[pd.DataFrame], str], *,
                   frames: Mapping[str, pd.DataFrame] | None = None,
                   metas: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The report's "what if" section: per trace, predicted images/sec
    against ranks on the profiled fabric and REPORT_LINKS, with the
    measured point (`fig(name, figure)` and `table(frame)` render).
    `frames`: a trace's rows already loaded whole (every column COLUMNS
    names), with its metadata in `metas`: read instead of its files."""
    import html

    out = []
    for label, path in paths.items():
        if not path:
            continue
        head = f"<h3>{html.escape(str(label))}</h3>" if len(paths) > 1 else ""
        try:
            frame = (frames or {}).get(label)
            prof = (profile_of(frame, (metas or {}).get(label), find_lineage(path), path=path)
                    if frame is not None else open_profile(path, lineage=find_lineage(path)))
        except ProfilerError as exc:
            out.append(head + f'<p class="muted">no prediction: {html.escape(exc.message)}</p>')
            continue
        if prof.refused:
            out.append(head + f'<p class="muted">no prediction: {html.escape(prof.refused)}</p>')
            continue
        links: dict[str, Link | None] = {"profiled fabric": None}
        links.update({k: parse_link(v) for k, v in REPORT_LINKS.items()})
        ranks = sorted({*REPORT_RANKS, prof.ranks})
        t = scaling(prof, ranks, links)
        ok = t.loc[t["refused"] == ""]
        key = re.sub(r"[^A-Za-z0-9_-]+", "-", str(label)) or "trace"
        shown = ok.assign(images_per_s=ok["images_per_s"].round(1), lo=ok["lo"].round(1),
                          hi=ok["hi"].round(1), step_ms=ok["step_ms"].round(2))[
            ["fabric", "ranks", "hosts", "step_ms", "images_per_s", "lo", "hi"]]
        refused = t.loc[t["refused"] != ""]
        note = ""
        if len(refused):
            first = refused.iloc[0]
            note = (f'<p class="muted">no prediction from {int(first["ranks"])} ranks on: '
                    f'{html.escape(str(first["refused"]))}</p>')
        one = predict(prof, Target(hosts=prof.hosts), n_boot=60, phases=2)
        out.append(
            head + "<p>The profiled job predicted at other rank counts (ranks fill hosts of "
            f"{prof.per_host} as profiled) on its own fabric and two others "
            "(profiler.analysis.predict; the same model as <code>profiler predict</code>), "
            "with the 95% interval and the measured point.</p>"
            + fig(f"whatif-{key}", scaling_figure(t, (prof.ranks, prof.images_per_s)))
            + table(shown) + note
            + "<details><summary>assumptions</summary><ul>"
            + "".join(f"<li>{html.escape(a)}</li>" for a in one.assumptions)
            + "</ul></details>")
    return "".join(out) or '<p class="muted">no profile to predict from</p>'


def remedy_line(ctx: Any, target: Target, what: str,
                lineage: pd.DataFrame | None = None) -> tuple[str, dict[str, float]] | None:
    """For a finding whose remedy changes a knob: one detail line with the
    step this model predicts at `target` (`what`: the change in words) and
    the numbers behind it; None when the profile cannot carry it."""
    try:
        prof = profile_of(ctx.df, ctx.meta, lineage, path=ctx.path, ctx=ctx)
    except (ProfilerError, KeyError, ValueError):
        return None
    got = knob_gain(prof, target)
    if got is None:
        return None
    saved, lo, hi = got
    step = float(prof.parts["wall"].mean()) - saved
    verb = "saves" if saved >= 0 else "costs"
    return (f"predicted (profiler predict): with {what} a step takes {fmt_ms(step)}, which "
            f"{verb} {fmt_ms(abs(saved))} per step (95% interval of the saving "
            f"{fmt_ms(lo)} to {fmt_ms(hi)}).",
            {"predicted_step_ms": step, "predicted_saving_ms": saved,
             "predicted_saving_lo_ms": lo, "predicted_saving_hi_ms": hi})
