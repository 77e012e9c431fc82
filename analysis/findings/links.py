"""A slow host or link among several, named from the job's own evidence, with no
bench to compare against.

The evidence is what each rank's kernel measured on the job's own TCP
connections (hooks/mpit.c; profiler.formats.fabric.peer_edges): for each
direction between two hosts, the delivery-rate samples taken while new data
was acknowledged and the application was not what limited the connection (the
rate the path delivered under load), and the throughput of the read
intervals that carried bulk data.  On a star of links (hosts on one switch),
a host's own link carries every connection to and from it: when every
direction that touches one host (or every one it sends on, or receives on) is
slower than every direction that does not touch it, by RATIO in the medians
and with no overlap of their middle halves, that host's link is named.
Where all links deliver alike (the null: every link equally limited, or no
limit), no host is.  It takes three hosts: with two, one link is the only
path, and nothing in the job says what it should deliver (a bench of the
fabric does: transfer_bound and efficiency).

Its cost is a counterfactual: each steady step as it would be were the link
as fast as the others.  Per step, the named host's ranks' samplers measured
how long their connections to other hosts carried bulk data (transfers that
run in parallel counted once, in turn added up: fabric.link_active_ms); at
the others' delivery rate the same bytes take (slow / others) of that time,
so the step shortens by that time times (1 - slow / others), at most the
time the step spends after the last rank arrives (transfer and Horovod's
share of synchronize).  The late rank
that a slow link can make of the rank behind it is told apart by its
arrival: a rank late because it left the previous synchronize late (its
transfer ended last) carries the link's time, not its own
(findings._late_beyond_the_link takes that share out of late_ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profiler.formats.fabric import Edge, link_active_ms, nic_bytes, peer_edges
from profiler.layout import format_ranges
from profiler.units import fmt_ms

from .base import MIN_STEPS, Context, Finding, bootstrap_mean

#: The slow directions' fastest median delivery rate is at most this share of
#: the other directions' slowest: a link half as fast as the rest.
RATIO = 2.0
#: Delivery-rate samples a direction needs to be weighed.
MIN_SAMPLES = 8
#: Hosts a comparison needs: with two, nothing in the job says what the one
#: path should deliver.
MIN_HOSTS = 3

NULL = (f"links alike: every direction between hosts delivers within a factor {RATIO:g} of "
        "the others (median delivery rate, tcp_info), or the slower ones share no host")


def _mbit(rate: float | None) -> str:
    """bytes/s as Mbit/s or Gbit/s, for a person."""
    if rate is None or not np.isfinite(rate):
        return "?"
    bits = rate * 8
    return f"{bits / 1e9:.1f} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.0f} Mbit/s"


@dataclass
class SlowLink:
    """A host whose link (both ways, or its sending or receiving side) is
    slower than the others'."""

    host: str
    side: str  # "both", "send", "receive"
    slow: list[Edge]
    others: list[Edge]
    slow_rate: float  # the slow directions' median delivery rate (the fastest of them), B/s
    other_rate: float  # the other directions' (the slowest of them), B/s
    slow_throughput: float  # the slow directions' active-interval throughput, median
    other_throughput: float

    @property
    def ratio(self) -> float:
        return self.slow_rate / self.other_rate if self.other_rate > 0 else float("nan")


def _weighed(edges: list[Edge]) -> list[Edge]:
    return [e for e in edges if e.samples >= MIN_SAMPLES]


def _pooled(edges: list[Edge], q: float, throughput: bool = False) -> float:
    """The q-quantile of the edges' samples pooled."""
    pool = Edge("", "", log2_min=edges[0].log2_min, per_octave=edges[0].per_octave)
    for e in edges:
        for b, n in (e.throughput if throughput else e.rate).items():
            (pool.throughput if throughput else pool.rate)[b] = (
                (pool.throughput if throughput else pool.rate).get(b, 0) + n)
    v = pool.throughput_quantile(q) if throughput else pool.rate_quantile(q)
    return float(v) if v is not None else float("nan")


def slow_link(edges: list[Edge]) -> SlowLink | None:
    """The host whose link the evidence names (module doc), or None.  Where
    several qualify: a host's whole link before one side of it, then the
    widest gap."""
    weighed = _weighed(edges)
    hosts = sorted({e.src for e in weighed} | {e.dst for e in weighed})
    if len(hosts) < MIN_HOSTS:
        return None
    found: list[SlowLink] = []
    for h in hosts:
        others = [e for e in weighed if h not in (e.src, e.dst)]
        for side in ("both", "send", "receive") if others else ():
            slow = [e for e in weighed if (e.src == h and side in ("both", "send"))
                    or (e.dst == h and side in ("both", "receive"))]
            if not slow:
                continue
            fastest_slow = max(float(e.rate_quantile(0.5) or 0.0) for e in slow)
            slowest_other = min(float(e.rate_quantile(0.5) or 0.0) for e in others)
            top_slow = max(float(e.rate_quantile(0.75) or 0.0) for e in slow)
            low_other = min(float(e.rate_quantile(0.25) or 0.0) for e in others)
            if fastest_slow * RATIO <= slowest_other and top_slow < low_other:
                found.append(SlowLink(h, side, slow, others, fastest_slow, slowest_other,
                                      _pooled(slow, 0.5, True), _pooled(others, 0.5, True)))
    if not found:
        return None
    return min(found, key=lambda c: (c.side != "both", c.ratio))


def _hub(weighed: list[Edge]) -> str | None:
    """The one host every weighed direction touches (a star of traffic), or None."""
    if not weighed:
        return None
    common = set.intersection(*({e.src, e.dst} for e in weighed))
    return min(common) if len(common) == 1 else None


def _ranks_on(ctx: Context, host: str) -> list[int]:
    return sorted(int(r["rank"]) for r in ctx.meta.get("ranks") or []
                  if isinstance(r, dict) and str(r.get("host", "")) == host
                  and isinstance(r.get("rank"), int))


def _active(ctx: Context, ranks: list[int]) -> pd.Series:
    """Per steady step, the longest time one of these ranks' connections to
    other hosts carried bulk data (ms)."""
    per: dict[int, dict[int, float]] = {}
    for r in ctx.meta.get("ranks") or []:
        if isinstance(r, dict) and r.get("rank") in ranks:
            per[int(r["rank"])] = link_active_ms(r.get("interconnect"))
    if not per:
        return pd.Series(dtype=np.float64)
    t = pd.DataFrame(per)
    steady = ctx.steady["step"].to_numpy() if ctx.n_steps else np.array([], dtype=np.int64)
    t = t.loc[t.index.isin(steady)]
    return t.max(axis=1).dropna()


def _after_arrival_ms(ctx: Context) -> pd.Series:
    """Per steady step, the time the step spends after the last rank arrives
    (transfer and Horovod's share of synchronize, the ranks' mean): what a
    faster link can shorten."""
    bd = ctx.breakdown
    if bd.empty:
        return pd.Series(dtype=np.float64)
    return bd.groupby("step")[["transfer_ms", "horovod_ms"]].mean().sum(axis=1)


def _nic_line(ctx: Context, host: str) -> str:
    """The host's NIC counters over the run, from its first rank's sidecar."""
    for r in ctx.meta.get("ranks") or []:
        if isinstance(r, dict) and str(r.get("host", "")) == host:
            nics = nic_bytes(r.get("interconnect"))
            busy = {k: v for k, v in nics.items() if v["rx"] + v["tx"] > 0}
            if not busy:
                return ""
            name, v = max(busy.items(), key=lambda kv: kv[1]["rx"] + kv[1]["tx"])
            speed = (f", stated speed {v['speed_mbps']} Mbit/s" if v["speed_mbps"] > 0 else "")
            return (f"{host}'s {name} carried {v['tx'] / 1e6:.0f} MB out and "
                    f"{v['rx'] / 1e6:.0f} MB in over the run (its counters: every process "
                    f"on the host){speed}.")
    return ""


def analyze(ctx: Context) -> list[Finding]:
    edges = peer_edges([r for r in ctx.meta.get("ranks") or [] if isinstance(r, dict)])
    weighed = _weighed(edges)
    hosts = sorted({e.src for e in weighed} | {e.dst for e in weighed})
    if len(hosts) < MIN_HOSTS:
        return []
    found = slow_link(edges)
    rates = ", ".join(f"{e.src}->{e.dst} {_mbit(e.rate_quantile(0.5))}" for e in weighed)
    hub = _hub(weighed)
    if found is None and hub is not None:
        # a star of traffic (Open MPI's allreduce at 3 ranks goes through rank 0):
        # no direction avoids the hub, so nothing in the job says what its link
        # should deliver; slow or not, links alike or not, the evidence is the same
        return [Finding(
            key="slow_link",
            headline=(f"Links not compared: every direction that carried bulk data touches "
                      f"{hub}"),
            details=[f"median delivery rate per direction (tcp_info, {MIN_SAMPLES}+ samples "
                     f"each): {rates}.",
                     f"the job's collectives sent every transfer between hosts to or from "
                     f"{hub}: no direction avoids it to compare its link with.  A bench of "
                     "the fabric (profiler bench), or a run with more hosts or ranks, "
                     "can tell."],
            significant=False, null=NULL, part="transfer",
            numbers={"hosts": hosts, "hub": hub, "edges": _edge_numbers(weighed)},
            not_claimed=f"whether {hub}'s link is slower than the others: the job holds no "
                        "direction without it")]
    if found is None:
        return [Finding(
            key="slow_link",
            headline=f"No host's link is slower than the others' ({len(hosts)} hosts)",
            details=[f"median delivery rate per direction (tcp_info, {MIN_SAMPLES}+ samples "
                     f"each): {rates}."],
            significant=False, null=NULL, part="transfer",
            numbers={"hosts": hosts, "edges": _edge_numbers(weighed)},
            not_claimed=f"no host's directions are {RATIO:g}x slower than all the others'")]
    side = {"both": "link", "send": "link (sending)", "receive": "link (receiving)"}[found.side]
    ranks = _ranks_on(ctx, found.host)
    verb = {"both": "touches", "send": "leaves", "receive": "reaches"}[found.side]
    details = [
        f"every direction that {verb} {found.host} delivered at most {_mbit(found.slow_rate)} "
        "(median delivery rate, "
        f"tcp_info), the others at least {_mbit(found.other_rate)} "
        f"({found.ratio:.0%} of theirs): {rates}.",
        f"while carrying bulk data, its directions moved {_mbit(found.slow_throughput)} "
        f"(median of the sampled intervals), the others {_mbit(found.other_throughput)}.",
    ]
    nic = _nic_line(ctx, found.host)
    if nic:
        details.append(nic)
    retrans = sum(e.retrans for e in found.slow)
    if retrans:
        details.append(f"{retrans} segments were retransmitted on its directions "
                       f"({sum(e.retrans for e in found.others)} on the others).")
    cost = lo = hi = None
    active = _active(ctx, ranks)
    ratio = float(min(max(found.ratio, 0.0), 1.0))
    after = _after_arrival_ms(ctx)
    gain = None
    if len(active) >= MIN_STEPS:
        per = active * (1.0 - ratio)
        if len(after):
            per = np.minimum(per, after.reindex(per.index).fillna(np.inf))
        gain = np.asarray(per, dtype=np.float64)
        cost, lo, hi = bootstrap_mean(gain)
        details.append(
            f"rank{'s' if len(ranks) > 1 else ''} {format_ranges(ranks)} on {found.host}: "
            f"its connections to other hosts carried bulk data {fmt_ms(float(active.mean()))} "
            f"per step; at the others' delivery rate the same bytes would take {ratio:.0%} of "
            f"that time, and each step would end {fmt_ms(cost)} sooner, the cost above.")
    significant = cost is not None and lo is not None and ctx.significant(lo)
    return [Finding(
        key="slow_link",
        headline=(f"{found.host}'s {side} is slow: {_mbit(found.slow_rate)} against "
                  f"{_mbit(found.other_rate)} between the other hosts"),
        details=details, cost_ms=cost,
        cost_interval_ms=(lo, hi) if cost is not None and lo is not None and hi is not None
        else None,
        cost_img_s=ctx.cost_img_s(cost) if cost is not None else None,
        confidence=(f"95% interval over {len(active)} steady steps (the ranks' samplers of "
                    "tcp_info)" if cost is not None else
                    "no per-step link time (no sampler marks): named, not priced"),
        recommendation=(f"check {found.host}'s link: its NIC and cable, the port's speed and "
                        "duplex (ethtool), errors and drops (ip -s link), a rate limit or a "
                        f"busy process on it (tc -s qdisc); or run without {found.host}"
                        if significant else ""),
        check=f"profiler advise on a run with {found.host} fixed or left out; compare the steps",
        numbers={"host": found.host, "side": found.side, "ranks": ranks,
                 "slow_rate": found.slow_rate, "other_rate": found.other_rate,
                 "rate_ratio": found.ratio, "slow_throughput": found.slow_throughput,
                 "other_throughput": found.other_throughput,
                 "active_ms": float(active.mean()) if len(active) else None,
                 "edges": _edge_numbers(weighed)},
        significant=significant, part="transfer", null=NULL,
        not_claimed="" if cost is not None else "no per-step link time to price it",
    )]


def _edge_numbers(edges: list[Edge]) -> list[dict[str, Any]]:
    return [{"src": e.src, "dst": e.dst, "ranks": e.ranks, "bytes": e.bytes,
             "samples": e.samples, "rate_median": e.rate_quantile(0.5),
             "rate_q25": e.rate_quantile(0.25), "rate_q75": e.rate_quantile(0.75),
             "throughput_median": e.throughput_quantile(0.5), "retrans": e.retrans}
            for e in edges]
