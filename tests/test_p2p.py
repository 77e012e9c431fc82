"""MPI point-to-point calls recorded like the collectives (tests/c/p2p.c under
Open MPI and MPICH at np=2 and np=4): exact records per (op, peer, tag, bytes)
including MPI_ANY_SOURCE / MPI_ANY_TAG (the actual source and tag), MPI_PROC_NULL,
MPI_STATUS(ES)_IGNORE, Waitall, Testsome, Waitany, Testall, Probe, Iprobe and a
request never completed; the collectives' sequence numbers untouched; every
send matched with exactly one receive across ranks (profiler.analysis.p2p).
Then mpi4py's Comm.Send/Recv through the start-up hook, and a rank blocked in
MPI_Recv as `profiler hang` shows it."""

from __future__ import annotations

import collections
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import mpich_library, requires_mpi
from test_capture_c import C_DIR, MPI_IMPLS, impl_available, launch

from profiler.formats import record as F
from profiler.formats.raw import read_raw

pytestmark = [requires_mpi, pytest.mark.mpi]

NULL, ANY_TAG = F.PEER_PROC_NULL, F.TAG_ANY
FROM_STATUS, NONBLOCKING, NO_COMPLETION = (F.FLAG_FROM_STATUS, F.FLAG_NONBLOCKING,
                                           F.FLAG_NO_COMPLETION)


def expected_p2p(n: int, size: int, rank: int) -> collections.Counter[tuple[str, int, int, int]]:
    """(op, peer, tag, bytes) -> records, for tests/c/p2p.c run with N iterations
    (its steps 1 to 12, then the cancelled receive)."""
    right, left = (rank + 1) % size, (rank - 1) % size
    per_iter = [
        ("send", right, 1, 400), ("recv", left, 1, 400),                    # 1 (posted 800)
        ("send", right, 7 + rank, 80), ("recv", left, 7 + left, 80),        # 2 ANY_*
        ("send", NULL, 3, 0), ("recv", NULL, ANY_TAG, 0),                   # 3 PROC_NULL
        *[("irecv", left, 20 + k, 32 << k) for k in range(3)],              # 4 Waitall
        *[("isend", right, 20 + k, 32 << k) for k in range(3)],
        ("irecv", left, 30, 64), ("irecv", left, 31, 64),                   # 5 Testsome
        ("isend", right, 30, 64), ("isend", right, 31, 64),
        ("sendrecv", right, 40, 16), ("sendrecv_recv", left, 40, 16),       # 6
        ("send", right, 50, 12), ("probe", left, 50, 12), ("recv", left, 50, 12),  # 7
        ("isend", right, 60, 6), ("iprobe", left, 60, 6), ("recv", left, 60, 6),   # 8
        ("irecv", left, 70, 8), ("isend", right, 70, 8),                    # 9 Test
        ("irecv", left, 80, 8), ("irecv", left, 81, 8),                     # 10 Waitany
        ("isend", right, 80, 8), ("isend", right, 81, 8),
        *[("irecv", left, 90, 4)] * 50, *[("isend", right, 90, 4)] * 50,  # 11 Waitall(100)
        ("send", right, 100, 12), ("recv", left, 100, 12),                  # 12 Ssend
        ("irecv", left, 101, 8), ("sendrecv", left, 102, 0),                # Rsend
        ("sendrecv_recv", right, 102, 0), ("send", right, 101, 8),
        ("send", right, 103, 16), ("recv", left, 103, 16),                  # Bsend
        ("irecv", left, 104, 8), ("isend", right, 104, 8),                  # Issend
    ]
    c: collections.Counter[tuple[str, int, int, int]] = collections.Counter()
    for key in per_iter:
        c[key] += n
    c[("irecv", left, 99, 16)] += 1  # cancelled and freed: posted values
    return c


def p2p_records(records: np.ndarray) -> np.ndarray:
    names = np.array([F.op_name(int(o)) for o in records["op"]])
    return records[np.isin(names, sorted(F.P2P_OPS))]


def p2p_counter(rec: np.ndarray) -> collections.Counter[tuple[str, int, int, int]]:
    tags = rec["seq"].view(np.int32)
    return collections.Counter(
        (F.op_name(int(o)), int(p), int(t), int(b))
        for o, p, t, b in zip(rec["op"], rec["root"], tags, rec["bytes"]))


@pytest.fixture(scope="module", params=["openmpi", "mpich"])
def impl(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """p2p.c and a profiler library built with one MPI (test_capture_c's impl, for
    this one program)."""
    name = request.param
    if name == "openmpi" and shutil.which("mpicc.openmpi") is None:
        MPI_IMPLS["openmpi"] = ("mpicc", "mpirun", "-x")
    elif not impl_available(name):
        pytest.skip(f"{name} is not installed")
    cc, run, xflag = MPI_IMPLS[name]
    out = tmp_path_factory.mktemp(f"p2p-{name}")
    exe = out / "p2p"
    subprocess.run([cc, "-O1", "-Wall", "-Wextra", "-Werror", str(C_DIR / "p2p.c"), "-o",
                    str(exe)], check=True)
    if name == "openmpi":
        from profiler.collect import native

        lib = native.library_path()
    else:
        lib = mpich_library(tmp_path_factory)
    return {"name": name, "bins": {"p2p": exe}, "lib": lib, "run": run, "xflag": xflag}


def check_raw_p2p(prof: Path, n: int, size: int) -> None:
    """Every rank's raw records of p2p.c: exact (op, peer, tag, bytes), flags, and
    the collectives' sequence numbers unchanged."""
    for rank in range(size):
        raw = read_raw(prof / "raw" / f"rank-{rank:05d}.hvprof")
        assert raw.problems == [] and raw.header["dropped_records"] == 0
        rec = p2p_records(raw.records)
        assert p2p_counter(rec) == expected_p2p(n, size, rank)
        names = np.array([F.op_name(int(o)) for o in rec["op"]])
        fl = rec["flags"].astype(int)
        tags = rec["seq"].view(np.int32)
        never = tags == 99
        assert np.all((fl[never] & NO_COMPLETION) != 0) and np.all((fl[never] & FROM_STATUS) == 0)
        rest = ~never
        recv_side = np.isin(names, sorted(F.P2P_RECV_OPS | {"probe", "iprobe"}))
        # every receive and probe read its status (the caller's or, for
        # MPI_STATUS(ES)_IGNORE, the profiler's own); no send did
        assert np.all((fl[recv_side & rest] & FROM_STATUS) != 0)
        assert np.all((fl[~recv_side] & FROM_STATUS) == 0)
        nb = np.isin(names, ["isend", "irecv"])
        assert np.all((fl[nb] & NONBLOCKING) != 0) and np.all((fl[~nb] & NONBLOCKING) == 0)
        assert np.all((fl[rest] & (NO_COMPLETION | F.FLAG_ERROR)) == 0)
        assert np.all(rec["t_end"][rest] >= rec["t_start"][rest])
        assert np.all(rec["count"][names == "recv"] * rec["dtype_size"][names == "recv"]
                      == rec["bytes"][names == "recv"])
        # the calls around (init, barrier, allreduce, finalize) keep seq 0..3:
        # no point-to-point call took a sequence number
        coll = raw.records[~np.isin(np.array([F.op_name(int(o)) for o in raw.records["op"]]),
                                    sorted(F.P2P_OPS))]
        assert [F.op_name(int(o)) for o in coll["op"]] == ["init", "barrier", "allreduce",
                                                           "finalize"]
        assert coll["seq"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("np_", [2, 4])
def test_p2p_exact_records_and_matching(impl: dict, np_: int, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    n = 3
    prof = tmp_path / "prof"
    proc = launch(impl, np_, "p2p", [str(n)], prof, tmp_path)
    assert "RESULT OK" in proc.stdout, proc.stdout + proc.stderr  # results unchanged
    check_raw_p2p(prof, n, np_)

    from profiler.analysis import TraceAnalysis, p2p_summary
    from profiler.postjob.merge import merge

    merge(prof)
    ta = TraceAnalysis.open(prof / "trace.json", engine="pandas")
    pairs = ta.p2p()
    ok = pairs.loc[pairs["matched"]]
    # 68 messages per rank per iteration, each matched exactly once
    assert len(ok) == 68 * n * np_
    assert not ok.duplicated(["comm", "sender", "receiver", "tag", "n"]).any()
    leftward = ok["tag"] == 102  # step 12's 0-byte Sendrecv goes to the left
    assert (ok.loc[~leftward, "receiver"] == (ok.loc[~leftward, "sender"] + 1) % np_).all()
    assert (ok.loc[leftward, "receiver"] == (ok.loc[leftward, "sender"] - 1) % np_).all()
    assert (ok["bytes"] == ok["recv_bytes"]).all()
    assert (ok["transfer_ns"] >= 0).all()
    tags = collections.Counter(ok["tag"].tolist())
    assert tags[1] == tags[40] == tags[81] == n * np_ and tags[90] == 50 * n * np_
    assert all(tags[t] == n * np_ for t in range(100, 105))  # Ssend .. Issend
    lone = pairs.loc[~pairs["matched"]]
    assert lone["recv_op"].tolist() == ["irecv"] * np_ and (lone["tag"] == 99).all()
    assert (lone["send_op"] == "").all()
    s = p2p_summary(pairs)
    assert s["matched"] == 68 * n * np_ and s["unmatched_recvs"] == np_
    assert s["unmatched_sends"] == 0
    # the frame: kind p2p, no sequence number, the tag in its own column
    from profiler.analysis import load

    df = load(prof / "trace.json")
    p2p = df.loc[(df["kind"] == "p2p").to_numpy()]
    assert len(p2p) == sum(expected_p2p(n, np_, 0).values()) * np_
    assert set(p2p["op"].astype(str)) == set(F.P2P_OPS)
    assert (p2p["seq"] == -1).all()
    assert (df.loc[(df["kind"] != "p2p").to_numpy(), "tag"] == -1).all()
    assert sorted(set(p2p["tag"].tolist())) == sorted(
        {t for (_, _, t, _) in expected_p2p(n, np_, 0)} | {7 + r for r in range(np_)})
    # `profiler check` and summarize (in this process): the collectives are
    # consistent across ranks, point-to-point gets its own lines
    from profiler.cli import main

    capsys.readouterr()
    assert main(["check", str(prof / "trace.json")]) == 0
    out = capsys.readouterr().out
    assert "consistent" in out, out
    assert main(["summarize", str(prof / "trace.json")]) == 0
    out = capsys.readouterr().out
    assert f"{68 * n * np_} messages matched" in out, out
    assert f"unmatched: {np_} receive(s)" in out, out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("point-to-point: "))
    assert all(len(line) <= 80 for line in lines[at:at + 3]), lines[at:at + 3]


def test_mpi4py_recv_recorded_and_blocked_recv_in_hang(tmp_path: Path) -> None:
    """mpi4py's Comm.Send/Recv (through the start-up hook) are MPI_Send/MPI_Recv
    records, MPI_ANY_SOURCE/MPI_ANY_TAG resolved; then rank 1 waits in MPI_Recv
    for a message rank 0 never sends: `profiler hang` names the call, its peer
    and tag, as in flight (not as a collective)."""
    pytest.importorskip("mpi4py")
    from test_hang import hang_cli, run_until_killed

    prof, out = run_until_killed(tmp_path, """
        comm.Barrier()
        if r == 0:
            for i in range(5):
                comm.Send(buf, dest=1, tag=i)
        else:
            st = MPI.Status()
            for i in range(5):
                comm.Recv(out, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
                assert st.Get_tag() == i
            comm.Recv(out, source=0, tag=5)  # never sent
        time.sleep(600)
    """, after_s=8.0, env={"HOROVOD_PROFILE_HANG_S": "2"})
    # the watchdog's line names the call, not "a collective"
    assert "rank 1: MPI_RECV (point-to-point) has been in flight for" in out, out
    want = {0: ("send", 1), 1: ("recv", 0)}
    for rank in range(2):
        rec = p2p_records(read_raw(prof / "raw" / f"rank-{rank:05d}.hvprof").records)
        op, peer = want[rank]
        assert p2p_counter(rec) == collections.Counter(
            {(op, peer, i, 32): 1 for i in range(5)}), out
    rc, text, doc = hang_cli(prof)
    assert rc == 1, text
    ranks = {r["rank"]: r for r in doc["ranks"]}
    (f,) = ranks[1]["in_flight"]
    assert f["op"] == "recv" and f["peer"] == 0 and f["tag"] == 5 and f["seq"] is None
    assert ranks[0]["in_flight"] == []
    assert "rank 1 BLOCKED in point-to-point recv from rank 0 tag 5" in text, text
    assert doc["comms"] == []  # the collectives agree: nothing to match there


def test_p2p_summary_mode(impl: dict, tmp_path: Path) -> None:
    """HOROVOD_PROFILE=summary: the same calls folded into the aggregates, per
    op (and bytes), kind p2p; the collectives' counts beside them unchanged."""
    from profiler.analysis import load_aggregates
    from profiler.postjob.merge import merge

    n, np_ = 3, 2
    prof = tmp_path / "prof"
    proc = launch(impl, np_, "p2p", [str(n)], prof, tmp_path,
                  extra_env={"HOROVOD_PROFILE": "summary"})
    assert "RESULT OK" in proc.stdout
    merge(prof)
    agg = load_aggregates(prof / "trace.json")
    for rank in range(np_):
        mine = agg.loc[(agg["rank"] == rank).to_numpy()]
        got: collections.Counter[tuple[str, int]] = collections.Counter()
        for op, b, c in zip(mine["op"].astype(str), mine["bytes"], mine["calls"]):
            got[(op, int(b))] += int(c)
        want: collections.Counter[tuple[str, int]] = collections.Counter()
        for (op, _, _, b), c in expected_p2p(n, np_, rank).items():
            want[(op, b)] += c
        assert {k: v for k, v in got.items() if k[0] in F.P2P_OPS} == dict(want)
        assert got[("barrier", 0)] == 1 and got[("allreduce", 4)] == 1
        p2p = mine["op"].astype(str).isin(sorted(F.P2P_OPS)).to_numpy()
        assert set(mine.loc[p2p, "kind"].astype(str)) == {"p2p"}
