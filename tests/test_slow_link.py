"""One slow host among several, named from the job's own evidence (hooks/mpit.c:
tcp_info of the job's connections, sampled; profiler.formats.fabric.peer_edges;
analysis.findings.links): the rule on synthetic documents (3 and 4 hosts, the
slow one at different places, one side only, links alike, two hosts), and real
jobs on simulated hosts (profiler.bench.simcluster, a tbf rate on one host's
link): the host is named with its link's measured rate and priced; with every
link equally limited, no host is named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON

from profiler.formats.fabric import link_active_ms, nic_bytes, peer_edges

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "benchmarks" / "scenarios" / "job.py"

#: delivery-rate bins of the sampler's histograms (4 a octave from 1 KiB/s):
#: 300 Mbit/s = 37.5 MB/s is bin 4 x log2(37.5e6 / 1024) ~ 60; 3 GB/s ~ 86
SLOW_BIN, FAST_BIN = 60, 86


def _conn(src_ip: str, dst_ip: str, bin_: int, n: int = 40) -> dict[str, Any]:
    return {"local": src_ip, "local_port": 1024, "remote": dst_ip, "remote_port": 40000,
            "interface": "eth0",
            "tcp_info": {"bytes_acked": 50_000_000, "busy_us": 2_000_000, "total_retrans": 1,
                         "rtt_us": 900},
            "sampled": {"rate_hist": [[bin_ - 1, n // 4], [bin_, n // 2], [bin_ + 1, n // 4]],
                        "out_hist": [[bin_, 10]], "in_hist": []}}


def _ranks(hosts: int, slow: dict[int, str], pairs: list[tuple[int, int]]
           ) -> list[dict[str, Any]]:
    """One rank per host h<i> at 10.0.0.<i>; a connection each way for each pair;
    slow: host -> "both" | "send" | "receive"."""
    ip = [f"10.0.0.{i + 1}" for i in range(hosts)]
    docs: list[dict[str, Any]] = [
        {"rank": i, "host": f"h{i}",
         "interconnect": {"addresses": [{"interface": "eth0", "ip": ip[i]}],
                          "tcp_connections": [],
                          "net_sampler": {"bin_log2_min": 10, "bins_per_octave": 4}}}
        for i in range(hosts)]
    for a, b in pairs:
        for s, d in ((a, b), (b, a)):
            is_slow = (slow.get(s) in ("both", "send")) or (slow.get(d) in ("both", "receive"))
            docs[s]["interconnect"]["tcp_connections"].append(
                _conn(ip[s], ip[d], SLOW_BIN if is_slow else FAST_BIN))
    return docs


RING3 = [(0, 1), (1, 2), (2, 0)]
ALL4 = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


@pytest.mark.parametrize("hosts,slow,pairs,expect", [
    (3, {1: "both"}, RING3, ("h1", "both")),
    (3, {0: "both"}, RING3, ("h0", "both")),
    (4, {3: "both"}, ALL4, ("h3", "both")),
    (4, {2: "send"}, ALL4, ("h2", "send")),
    (4, {1: "receive"}, ALL4, ("h1", "receive")),
    (3, {0: "both", 1: "both", 2: "both"}, RING3, None),  # every link alike: none
    (4, {}, ALL4, None),
    (3, {1: "both", 2: "both"}, RING3, None),  # two slow hosts: h1<->h2 is no other
])
def test_the_rule_on_synthetic_documents(hosts: int, slow: dict[int, str],
                                         pairs: list[tuple[int, int]],
                                         expect: tuple[str, str] | None) -> None:
    from profiler.analysis.findings.links import slow_link

    edges = peer_edges(_ranks(hosts, slow, pairs))
    assert len(edges) == 2 * len(pairs)
    found = slow_link(edges)
    if expect is None:
        assert found is None, (found.host, found.side) if found else None
        return
    assert found is not None and (found.host, found.side) == expect
    assert found.ratio < 0.05  # 37.5 MB/s against ~3 GB/s
    assert 30e6 < found.slow_rate < 45e6


def test_two_hosts_and_thin_evidence_name_nothing() -> None:
    """Two hosts: one path, nothing to compare with.  Fewer than MIN_SAMPLES
    samples on the others: not weighed.  A peer address no rank owns: no
    edge."""
    from profiler.analysis.findings.links import MIN_SAMPLES, slow_link

    assert slow_link(peer_edges(_ranks(2, {1: "both"}, [(0, 1)]))) is None
    thin = _ranks(3, {1: "both"}, RING3)
    for c in thin[0]["interconnect"]["tcp_connections"] + thin[2]["interconnect"][
            "tcp_connections"]:
        if c["remote"] != "10.0.0.2":  # the h0<->h2 directions
            c["sampled"]["rate_hist"] = [[FAST_BIN, MIN_SAMPLES - 1]]
    assert slow_link(peer_edges(thin)) is None
    stray = _ranks(3, {}, RING3)
    stray[0]["interconnect"]["tcp_connections"].append(_conn("10.0.0.1", "192.0.2.9", 60))
    assert len(peer_edges(stray)) == 6
    assert peer_edges([{"rank": 0, "host": "a", "interconnect": {"tcp_connections": 3}}]) == []


def test_a_star_of_traffic_compares_no_links() -> None:
    """Every direction through one host (Open MPI's allreduce at 3 ranks on
    small messages goes through rank 0): slow or not, nothing to compare its
    link with, and the same evidence as every link alike; the hub is known,
    no host is named.  A ring has no hub."""
    from profiler.analysis.findings.links import _hub, _weighed, slow_link

    star = peer_edges(_ranks(3, {0: "both"}, [(0, 1), (0, 2)]))
    assert slow_link(star) is None and _hub(_weighed(star)) == "h0"
    alike = peer_edges(_ranks(3, {0: "both", 1: "both", 2: "both"}, [(0, 1), (0, 2)]))
    assert slow_link(alike) is None and _hub(_weighed(alike)) == "h0"
    assert _hub(_weighed(peer_edges(_ranks(3, {0: "both"}, RING3)))) is None


def test_step_marks_and_nic_counters() -> None:
    """The sampler's running totals at step records -> ms per step (a gap
    spread evenly); the NICs' counters between open and MPI_Finalize."""
    doc = {"net_sampler": {"steps": [[0, 1, 0, 0], [1, 2, 5_000_000, 9], [2, 3, 12_000_000, 9],
                                     [6, 4, 20_000_000, 9], ["x", 1, 2, 3]]},
           "nics": {"start": [{"name": "eth0", "rx_bytes": 10, "tx_bytes": 20,
                               "speed_mbps": 10000}],
                    "end": [{"name": "eth0", "rx_bytes": 110, "tx_bytes": 2020,
                             "speed_mbps": 10000},
                            {"name": "ib0/1", "rx_bytes": 5, "tx_bytes": 5, "speed_mbps": -1}]}}
    assert link_active_ms(doc) == {1: 5.0, 2: 7.0, 3: 2.0, 4: 2.0, 5: 2.0, 6: 2.0}
    assert link_active_ms({}) == {} and link_active_ms(None) == {}
    assert nic_bytes(doc) == {"eth0": {"rx": 100, "tx": 2000, "speed_mbps": 10000}}


def _run(cluster: Any, hosts: int, prof: Path, tmp: Path, steps: int = 10) -> dict[str, Any]:
    p = cluster.mpirun(hosts, [PYTHON, str(JOB), "--model", "mid", "--steps", str(steps),
                               "--batch", "64"], per_host=1, cwd=tmp, timeout=300,
                       env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                            "HOROVOD_PROFILE_BATCH_SIZE": "64"})
    assert p.returncode == 0, p.stderr[-3000:]
    from profiler.analysis.findings import advise

    a = advise(prof / "trace.json")
    return {f.key: f for f in a.findings}


def _sidecar(prof: Path, rank: int) -> dict[str, Any]:
    return json.loads((prof / "raw" / f"rank-{rank:05d}.mpit.json").read_text())


def _cluster_or_skip() -> None:
    pytest.importorskip("horovod.torch")
    from simcluster_fixture import cluster_available

    ok, why = cluster_available()
    if not ok:
        pytest.skip(f"simulated cluster unavailable: {why}")


@pytest.mark.mpi
@pytest.mark.horovod
def test_one_slow_host_of_three_is_named(tmp_path: Path) -> None:
    """3 hosts, one rank each, h1's link (the middle one) at 300 Mbit/s: every
    rank's sidecar holds its connections' tcp_info and the sampler's
    figures; slow_link names h1, its link at about 300 Mbit/s against the
    others' Gbit/s, significant and priced."""
    _cluster_or_skip()
    from profiler.bench.simcluster import SimCluster

    with SimCluster(hosts=3, slots=1, host_rates={1: "300mbit"}) as cl:
        found = _run(cl, 3, tmp_path / "prof", tmp_path)
    side = _sidecar(tmp_path / "prof", 1)
    conns = [x for x in side["tcp_connections"] if x["remote"].startswith("10.77.")]
    assert conns and all("bytes_acked" in x["tcp_info"] and "busy_us" in x["tcp_info"]
                         and "delivery_rate" in x["tcp_info"] for x in conns)
    assert side["net_sampler"]["reads"] > 10 and side["net_sampler"]["steps"]
    assert any(x.get("sampled", {}).get("rate_samples", 0) > 0 for x in conns)
    assert {n["name"] for n in side["nics"]["end"]} >= {"eth0"}
    f = found["slow_link"]
    assert f.numbers["host"] == "h1" and f.numbers["side"] == "both", f.headline
    assert f.headline.startswith("h1's link is slow: ")
    assert 150e6 / 8 < f.numbers["slow_rate"] < 450e6 / 8
    assert f.numbers["rate_ratio"] < 0.5
    assert f.significant and f.cost_ms is not None and f.part == "transfer", f.details


@pytest.mark.full  # the rule at 4 hosts: the synthetic documents; a real job: 3 hosts
@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.horovod
def test_one_slow_host_of_four_is_named(tmp_path: Path) -> None:
    """4 hosts, one rank each, the last one's link at 300 Mbit/s: h3 named."""
    _cluster_or_skip()
    from profiler.bench.simcluster import SimCluster

    with SimCluster(hosts=4, slots=1, host_rates={3: "300mbit"}) as cl:
        found = _run(cl, 4, tmp_path / "prof", tmp_path, steps=8)
    f = found["slow_link"]
    assert f.numbers["host"] == "h3" and f.significant, (f.headline, f.details)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.horovod
def test_links_alike_name_no_host(tmp_path: Path) -> None:
    """3 hosts, every link at 300 Mbit/s: no host is named (an insignificant
    slow_link finding that says the links deliver alike, or that the job's
    traffic went through one host and left its link nothing to compare)."""
    _cluster_or_skip()
    from profiler.bench.simcluster import SimCluster

    with SimCluster(hosts=3, slots=1, rate="300mbit") as cl:
        found = _run(cl, 3, tmp_path / "prof", tmp_path, steps=8)
    f = found.get("slow_link")
    assert f is not None and not f.significant and "host" not in f.numbers, (
        f.headline if f else None)
    # Open MPI's allreduce at 3 ranks may send everything through rank 0: then
    # h0's link has nothing to be compared with (test_a_star_of_traffic_...)
    assert f.headline.startswith(("No host's link is slower than the others'",
                                  "Links not compared: every direction that carried bulk "
                                  "data touches h0")), f.headline
