"""The interconnect used between hosts, asked of the MPI library (MPI_T, hooks/mpit.c)
and seen in the ranks' TCP connections, as trace metadata and one summarize line:
on simulated hosts (2 hosts: tcp over the veth links between them; 1 host: shared
memory), and the per-pair derivation on synthetic documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, profiler_cli, requires_mpi
from simcluster_fixture import ClusterFactory, sim_cluster  # noqa: F401 (fixture)

from profiler.analysis.interconnect import interconnect_line, interconnect_pairs
from profiler.formats.fabric import job_doc

JOB = Path(__file__).with_name("cluster_job.py")


def _doc(ip: str, conns: list[tuple[str, int, str, int]], btl: tuple[str, ...] = (
        "self", "tcp", "vader")) -> dict[str, Any]:
    return {"library": "Open MPI v4.1.4",
            "mpit": {"status": "ok", "pvars": 18, "selected": {"btl": ",".join(btl)},
                     "open_components": [*(f"btl/{b}" for b in btl), "pml/ob1", "mtl/ofi"],
                     "tcp_interfaces": ["eth0"]},
            "addresses": [{"interface": "lo", "ip": "127.0.0.1"},
                          {"interface": "eth0", "ip": ip}],
            "tcp_connections": [{"local": a, "local_port": ap, "remote": b, "remote_port": bp,
                                 "interface": "eth0" if a != "127.0.0.1" else "lo"}
                                for a, ap, b, bp in conns],
            "interface_kinds": {"eth0": "veth", "lo": "loopback"}}


def test_pairs_from_synthetic_documents() -> None:
    """One connection seen from both ends counts once; the loopback connection to
    the launcher is not a peer; same-host pairs follow the open shm BTL; MTLs
    under ob1 are not listed; no document at all: the launcher's setting."""
    ranks = [
        {"rank": 0, "host": "a", "interconnect": _doc("10.0.0.1", [
            ("10.0.0.1", 5000, "10.0.0.2", 6000), ("127.0.0.1", 1, "127.0.0.1", 2)])},
        {"rank": 1, "host": "a", "interconnect": _doc("10.0.0.1", [])},
        {"rank": 2, "host": "b", "interconnect": _doc("10.0.0.2", [
            ("10.0.0.2", 6000, "10.0.0.1", 5000)])},
    ]
    doc = job_doc(ranks)
    assert doc["source"] == "MPI_T" and doc["btl"] == ["self", "tcp", "vader"]
    assert doc["pml"] == ["ob1"] and doc["mtl"] == []
    pairs = {tuple(p["hosts"]): p for p in doc["pairs"]}
    assert set(pairs) == {("a", "a"), ("a", "b")}  # b has one rank: no pair within it
    assert pairs[("a", "b")]["transport"] == "tcp"
    assert pairs[("a", "b")]["how"] == "observed"
    assert pairs[("a", "b")]["connections"] == 1
    assert pairs[("a", "b")]["interfaces"] == ["eth0 (veth)"]
    assert pairs[("a", "a")]["transport"] == "sm/vader"
    assert pairs[("a", "a")]["how"] == "inferred"
    line = interconnect_line({"interconnect": doc})
    assert line is not None
    assert line.startswith("interconnect (MPI_T): a<->b tcp via eth0 (veth), 1 connection seen")
    assert "within a sm/vader (inferred)" in line
    # tcp only (btl tcp,self): within a host tcp is inferred, between hosts with
    # no connection seen also inferred
    ranks2 = [{"rank": r, "host": h, "interconnect": _doc(ip, [], btl=("self", "tcp"))}
              for r, (h, ip) in enumerate([("a", "10.0.0.1"), ("a", "10.0.0.1"),
                                           ("b", "10.0.0.2")])]
    pairs2 = {tuple(p["hosts"]): p for p in job_doc(ranks2)["pairs"]}
    assert pairs2[("a", "a")]["transport"] == "tcp"
    assert pairs2[("a", "b")]["how"] == "inferred"
    # MPICH: no components in MPI_T; the device from the version text
    mpich = {"library": "MPICH Version:\t4.0.2", "device": "ch4:ucx",
             "mpit": {"status": "ok", "pvars": 0, "open_components": [],
                      "selected": {"MPIR_CVAR_CH4_NETMOD": ""}},
             "addresses": [], "tcp_connections": []}
    pairs3 = {tuple(p["hosts"]): p for p in job_doc(
        [{"rank": r, "host": h, "interconnect": mpich} for r, h in enumerate("aab")])["pairs"]}
    assert pairs3[("a", "b")]["transport"] == "ch4 netmod ucx"
    assert pairs3[("a", "a")]["transport"] == "sm/posix"
    none = job_doc([{"rank": 0, "host": "a", "interconnect": None}],
                   env={"OMPI_MCA_btl": "tcp,self"})
    assert none["source"] == "launcher" and none["pairs"] == []
    assert interconnect_line({"interconnect": none, "env": {"OMPI_MCA_btl": "tcp,self"}}) == (
        "interconnect (launcher setting, not asked of MPI): tcp")
    assert interconnect_pairs({}) == []


@requires_mpi
@pytest.mark.mpi
def test_tcp_between_hosts_shared_memory_within(sim_cluster: ClusterFactory,  # noqa: F811
                                                tmp_path: Path) -> None:
    """2 simulated hosts x 2 ranks with every BTL allowed (tcp,vader,self): MPI_T
    says ob1 with tcp, vader and self open; TCP connections between the hosts'
    veth addresses are seen; within each host shared memory (vader, inferred).
    Then one host with 2 ranks: shared memory, no pair between hosts."""
    c = sim_cluster(hosts=2, slots=2)
    runs = {"two-hosts": 4, "one-host": 2}
    metas: dict[str, dict[str, Any]] = {}
    for name, np_ in runs.items():
        prof = tmp_path / name
        p = c.mpirun(np_, [PYTHON, str(JOB), "5"], btl="tcp,vader,self", cwd=tmp_path,
                     env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                          "HOROVOD_PROFILE_MERGE_TIMEOUT": "20"}, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        metas[name] = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
        assert sorted((prof / "raw").glob("*.mpit.json")), "no MPI_T document written"

    two = metas["two-hosts"]["interconnect"]
    assert two["source"] == "MPI_T" and two["ranks_reporting"] == 4
    assert two["pml"] == ["ob1"] and {"tcp", "vader", "self"} <= set(two["btl"])
    assert two["selected"]["btl"] == "tcp,vader,self"
    pairs = {tuple(p["hosts"]): p for p in two["pairs"]}
    h0, h1 = (h.name for h in c.hosts)
    cross = pairs[(h0, h1)]
    assert cross["transport"] == "tcp" and cross["how"] == "observed"
    assert cross["connections"] >= 1
    assert cross["interfaces"] == ["eth0 (veth)"]
    assert pairs[(h0, h0)]["transport"] == "sm/vader"
    assert pairs[(h1, h1)]["transport"] == "sm/vader"
    rank0 = metas["two-hosts"]["ranks"][0]["interconnect"]
    assert rank0["interface_kinds"]["eth0"] == "veth"
    assert "eth0" in rank0["mpit"]["tcp_interfaces"]

    one = metas["one-host"]["interconnect"]
    assert [p["hosts"] for p in one["pairs"]] == [[h0, h0]]
    assert one["pairs"][0]["transport"] == "sm/vader"

    out = profiler_cli("summarize", str(tmp_path / "two-hosts" / "trace.json"),
                       cwd=tmp_path).stdout
    flat = " ".join(out.split())
    assert f"interconnect (MPI_T): {h0}<->{h1} tcp via eth0 (veth)," in flat, out
    assert "within each host sm/vader (inferred)" in flat
    out1 = " ".join(profiler_cli("summarize", str(tmp_path / "one-host" / "trace.json"),
                                 cwd=tmp_path).stdout.split())
    assert f"interconnect (MPI_T): within {h0} sm/vader (inferred)" in out1


def test_step_comm_predicts_from_the_fit_and_the_replay() -> None:
    """The application's data calls per step (lowest rank, inside its steps, the
    first step left out) times each fabric's alpha-beta fit, and times the
    replay's median latency per size: exact on noise-free curves."""
    from analysis_fixtures import alpha_beta_ns, concat, sweep, training

    from profiler.analysis.interconnect import step_comm, step_traffic

    app = training(steps=6, sizes=(4096, 1 << 20))
    traffic = step_traffic(app)
    assert traffic[["bytes", "calls_per_step"]].values.tolist() == [[4096, 1.0],
                                                                     [1 << 20, 1.0]]
    sizes = [1 << k for k in range(3, 23)]
    fabrics = {"fast": (2.0, 5.0), "slow": (30.0, 0.125)}
    bench = concat(*[sweep(sizes, alpha_us=a, bw_gbps=bw, label=lb, iters=3)
                     for lb, (a, bw) in fabrics.items()])
    out = step_comm(app, bench, replay=bench).set_index("label")
    for lb, (a, bw) in fabrics.items():
        want = float(alpha_beta_ns(4096, a, bw) + alpha_beta_ns(1 << 20, a, bw)) / 1e6
        assert out.loc[lb, "predicted_ms_per_step"] == pytest.approx(want, rel=0.01)
        assert out.loc[lb, "replayed_ms_per_step"] == pytest.approx(want, rel=0.001)
        assert out.loc[lb, "bytes_per_step"] == 4096 + (1 << 20)


def test_fabric_catalogue_and_bad_combinations(tmp_path: Path) -> None:
    """Every fabric says what it emulates and how; --fabric with a conflicting
    --transport is refused in one line."""
    from profiler.analysis.interconnect import FABRICS, fabric_of

    assert set(FABRICS) == {"shm", "tcp", "tcp-10gbit", "tcp-1gbit"}
    for f in FABRICS.values():
        assert f.label and (f.hosts == 1 or "netem is unavailable" in f.label)
    assert FABRICS["tcp-1gbit"].rate == "1gbit" and "emulates 1 GbE" in FABRICS[
        "tcp-1gbit"].label
    assert fabric_of({"env": {"HOROVOD_BENCH_FABRIC": "tcp-10gbit"}}) is FABRICS["tcp-10gbit"]
    assert fabric_of({}) is None
    p = profiler_cli("bench", "-o", str(tmp_path / "o"), "--fabric", "tcp",
                     "--transport", "shm", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.strip().startswith("profiler: error: --fabric tcp")
