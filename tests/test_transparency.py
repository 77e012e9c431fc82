"""Profiling never changes what the application computes.

mpi4py collectives over every predefined type class (int8 .. uint64, float32,
float64, complex64, complex128, bool, DOUBLE_INT pairs), every reduction op
that applies (sum, prod, max, min, band, bor, bxor, land, lor, lxor, maxloc,
minloc, a user-defined op), in place and not, derived datatypes (contiguous,
vector, struct) and calls the profiler does not wrap (scan, exscan, scatter,
sendrecv): run at 2 ranks with and without HOROVOD_PROFILE=1, and every output
buffer must be equal bit for bit.  The profiled run also runs under umask 000
with a secret in its environment: no file the profiler creates may be
world-writable, and the secret must appear nowhere in the profile directory.

The Horovod benchmark (python -m profiler.workloads.train_bench) trains a
fixed number of steps at 2 ranks with and without profiling: the final
weights of every rank must be identical bit for bit."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mpirun, requires_mpi

pytestmark = [requires_mpi, pytest.mark.mpi]

SECRET = "hvprof-secret-7c1e9a"

JOB = r'''
import sys
import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
rng = np.random.default_rng(1234 + r)
_hook = sys.excepthook
def _abort(*exc):  # a failing rank must not leave the other one waiting
    _hook(*exc)
    c.Abort(1)
sys.excepthook = _abort
out = {}

INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOATS = ["float32", "float64"]
COMPLEX = ["complex64", "complex128"]
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN,
       "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR,
       "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR}


def data(dt, count=37):
    dt = np.dtype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=count, dtype=dt, endpoint=True)
    if dt.kind == "f":
        x = (rng.standard_normal(count) * 10.0 ** rng.integers(-30, 30, count)).astype(dt)
        special = np.array([np.inf, -np.inf, -0.0, np.nan], dtype=dt)[:count]
        x[:len(special)] = special
        return x
    re = rng.standard_normal(count)
    im = rng.standard_normal(count)
    return (re + 1j * im).astype(dt)


def ops_for(dt):
    k = np.dtype(dt).kind
    if k in "iu":
        return list(OPS)
    if k == "f":
        return ["sum", "prod", "max", "min"]
    return ["sum", "prod"]


for dt in INTS + FLOATS + COMPLEX:
    for name in ops_for(dt):
        op = OPS[name]
        a = data(dt)
        b = np.empty_like(a)
        c.Allreduce(a, b, op=op); out[f"allreduce/{dt}/{name}"] = b
        x = a.copy()
        c.Allreduce(MPI.IN_PLACE, x, op=op); out[f"allreduce-inplace/{dt}/{name}"] = x
        t = np.zeros_like(a)
        c.Reduce(a, t, op=op, root=1); out[f"reduce/{dt}/{name}"] = t
        y = a.copy()
        if r == 0:
            c.Reduce(MPI.IN_PLACE, y, op=op, root=0)
        else:
            c.Reduce(y, None, op=op, root=0)
        out[f"reduce-inplace/{dt}/{name}"] = y
        rs = np.empty(5, dtype=dt)
        c.Reduce_scatter_block(data(dt, 5 * n), rs, op=op); out[f"rsb/{dt}/{name}"] = rs
        rv = np.empty(r + 2, dtype=dt)
        c.Reduce_scatter(data(dt, sum(k + 2 for k in range(n))), rv,
                         recvcounts=[k + 2 for k in range(n)], op=op)
        out[f"rs/{dt}/{name}"] = rv
        s = np.empty_like(a)
        c.Scan(a, s, op=op); out[f"scan/{dt}/{name}"] = s           # not wrapped
    a = data(dt)
    q = np.empty_like(a)
    iq = c.Iallreduce(a, q, op=MPI.SUM); iq.Wait(); out[f"iallreduce/{dt}"] = q
    g = np.empty(len(a) * n, dtype=dt)
    c.Allgather(a, g); out[f"allgather/{dt}"] = g
    counts = [k + 3 for k in range(n)]
    gv = np.empty(sum(counts), dtype=dt)
    c.Allgatherv(a[:r + 3], [gv, counts]); out[f"allgatherv/{dt}"] = gv
    bb = a.copy()
    c.Bcast(bb, root=1); out[f"bcast/{dt}"] = bb
    at = np.empty(4 * n, dtype=dt)
    c.Alltoall(data(dt, 4 * n), at); out[f"alltoall/{dt}"] = at
    av = np.empty(sum(k + 1 for k in range(n)), dtype=dt)
    scounts = [r + 1] * n
    c.Alltoallv([data(dt, (r + 1) * n), scounts], [av, [k + 1 for k in range(n)]])
    out[f"alltoallv/{dt}"] = av
    gg = np.empty(len(a) * n, dtype=dt) if r == 0 else None
    c.Gather(a, gg, root=0)
    if r == 0:
        out[f"gather/{dt}"] = gg
    sc = np.empty(3, dtype=dt)
    c.Scatter(data(dt, 3 * n) if r == 0 else None, sc, root=0); out[f"scatter/{dt}"] = sc
    sr = np.empty_like(a)
    c.Sendrecv(a, dest=(r + 1) % n, recvbuf=sr, source=(r - 1) % n)
    out[f"sendrecv/{dt}"] = sr

# logical ops on C bool
bl = rng.integers(0, 2, 29).astype(np.bool_)
for name in ("land", "lor", "lxor"):
    o = np.empty_like(bl)
    c.Allreduce([bl, MPI.C_BOOL], [o, MPI.C_BOOL], op=OPS[name]); out[f"allreduce/bool/{name}"] = o

# MAXLOC / MINLOC on DOUBLE_INT pairs
pair = np.dtype([("v", "f8"), ("i", "i4")], align=True)
pv = np.zeros(11, dtype=pair)
pv["v"] = rng.integers(0, 4, 11)  # ties: the lower index wins
pv["i"] = r * 100 + np.arange(11)
for name, op in (("maxloc", MPI.MAXLOC), ("minloc", MPI.MINLOC)):
    o = np.zeros_like(pv)
    c.Allreduce([pv, MPI.DOUBLE_INT], [o, MPI.DOUBLE_INT], op=op)
    out[f"allreduce/double_int/{name}"] = o

# derived datatypes
triple = MPI.DOUBLE.Create_contiguous(3).Commit()
d3 = data("float64", 24)


def add_f8(inbuf, inout, datatype):
    y = np.frombuffer(inout, dtype=np.float64)
    y += np.frombuffer(inbuf, dtype=np.float64)


def max_f8(inbuf, inout, datatype):
    y = np.frombuffer(inout, dtype=np.float64)
    np.maximum(y, np.frombuffer(inbuf, dtype=np.float64), out=y)


op_add, op_max = MPI.Op.Create(add_f8, commute=True), MPI.Op.Create(max_f8, commute=True)
o3 = np.empty_like(d3)
c.Allreduce([d3, 8, triple], [o3, 8, triple], op=op_add); out["derived/contiguous/add"] = o3
x3 = d3.copy()
c.Allreduce(MPI.IN_PLACE, [x3, 8, triple], op=op_max); out["derived/contiguous/max-inplace"] = x3
op_add.Free(); op_max.Free()
vec = MPI.INT.Create_vector(4, 2, 3).Commit()             # 4 blocks of 2, stride 3
dv = np.arange(12, dtype=np.int32) * (r + 7) if r == 0 else np.full(12, -1, dtype=np.int32)
c.Bcast([dv, 1, vec], root=0); out["derived/vector/bcast"] = dv
gvv = np.full(12 * n, -5, dtype=np.int32)
vec48 = vec.Create_resized(0, 48).Commit()
c.Allgather([np.arange(12, dtype=np.int32) + 100 * r, 1, vec], [gvv, 1, vec48])  # 1 per rank
out["derived/vector/allgather"] = gvv
rec = np.dtype([("a", "i4"), ("b", "f8"), ("c", "i2")], align=True)
st0 = MPI.Datatype.Create_struct([1, 1, 1], [rec.fields[f][1] for f in "abc"],
                                 [MPI.INT, MPI.DOUBLE, MPI.SHORT])
st = st0.Create_resized(0, rec.itemsize).Commit()
sd = np.zeros(6, dtype=rec)
sd["a"] = np.arange(6) + r; sd["b"] = rng.standard_normal(6); sd["c"] = -r


def add_struct(inbuf, inout, datatype):
    x = np.frombuffer(inbuf, dtype=rec)
    y = np.frombuffer(inout, dtype=rec)
    y["a"] += x["a"]; y["b"] += x["b"]; y["c"] = np.maximum(x["c"], y["c"])


user = MPI.Op.Create(add_struct, commute=True)
so = np.zeros_like(sd)
c.Allreduce([sd, st], [so, st], op=user); out["derived/struct/user-op"] = so
sg = np.zeros(6 * n, dtype=rec)
c.Allgather([sd, st], [sg, st]); out["derived/struct/allgather"] = sg
user.Free(); st.Free(); st0.Free(); vec48.Free(); vec.Free(); triple.Free()
c.Barrier()
np.savez(sys.argv[1] + f"/rank-{r}.npz", **{k.replace("/", "__"): v for k, v in out.items()})
'''


def outputs(d: Path, rank: int) -> dict[str, bytes]:
    with np.load(d / f"rank-{rank}.npz") as z:
        return {k: z[k].tobytes() + str(z[k].dtype).encode() for k in z.files}


@pytest.fixture(scope="module")
def collectives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("transparency")
    script = d / "job.py"
    script.write_text(JOB)
    runs: dict[str, Path] = {}
    for name, env in (("plain", {}),
                      ("profiled", {"HOROVOD_PROFILE": "1",
                                    "HOROVOD_PROFILE_DIR": str(d / "prof"),
                                    "SECRET_TOKEN": SECRET, "HOROVOD_SECRET_TOKEN_NOT": "ok",
                                    "API_KEY": SECRET})):
        out = d / name
        out.mkdir()
        old = os.umask(0)  # the profiler must set its own modes
        try:
            mpirun(2, [sys.executable, str(script), str(out)], env=env, cwd=d, timeout=200)
        finally:
            os.umask(old)
        runs[name] = out
    runs["prof"] = d / "prof"
    return runs


def test_collective_outputs_bit_identical(collectives: dict[str, Path]) -> None:
    for r in (0, 1):
        plain = outputs(collectives["plain"], r)
        prof = outputs(collectives["profiled"], r)
        assert len(plain) > 250  # every case ran (dtypes x ops x variants)
        assert plain.keys() == prof.keys()
        diff = [k for k in plain if plain[k] != prof[k]]
        assert diff == [], diff[:10]


def test_profiled_run_recorded_the_calls(collectives: dict[str, Path]) -> None:
    import pandas as pd

    df = pd.read_parquet(collectives["prof"] / "ranks" / "rank-00000.parquet")
    counts = df["op"].astype(str).value_counts()
    n_int_ops, n_float_ops, n_complex_ops = 10, 4, 2
    per_op = 8 * n_int_ops + 2 * n_float_ops + 2 * n_complex_ops  # (dtype, op) pairs
    # allreduce: 2 per pair, + 3 bool + 2 pairs + 2 contiguous + 2 struct
    assert counts["allreduce"] == 2 * per_op + 3 + 2 + 2 + 1
    assert counts["reduce"] == 2 * per_op
    assert counts["reduce_scatter_block"] == counts["reduce_scatter"] == per_op
    assert "scan" not in counts  # not wrapped: passed straight through
    assert (df["rc"] == 0).all()
    derived = df[df["dtype"].astype(str) == "derived"]
    assert len(derived) >= 6


def test_no_secret_and_no_world_writable_file(collectives: dict[str, Path]) -> None:
    prof = collectives["prof"]
    paths = [prof, *prof.rglob("*")]
    assert len(paths) >= 8
    for p in paths:
        mode = os.stat(p).st_mode
        assert not mode & stat.S_IWOTH, f"{p} is world-writable ({oct(mode)})"
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p
    import orjson

    meta = orjson.loads((prof / "trace.json").read_bytes())["horovod_profiler"]
    env = meta["env"]
    assert "SECRET_TOKEN" not in env and "API_KEY" not in env
    assert env.get("HOROVOD_SECRET_TOKEN_NOT") == "ok"  # the whitelisted prefix is kept
    assert all(k.startswith(("HOROVOD_", "NCCL_", "OMPI_MCA_", "MPICH_", "UCX_"))
               for k in env)


# ---------------------------------------------------------------------------
# Horovod: the bundled benchmark, final weights
# ---------------------------------------------------------------------------
BENCH = ["-m", "profiler.workloads.train_bench", "--model", "cnn", "--batch-size", "8",
         "--image-size", "32", "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
         "--num-iters", "2", "--quiet"]


@pytest.mark.full  # test_horovod_e2e::test_profiling_does_not_change_training covers the path
@pytest.mark.horovod
def test_horovod_benchmark_final_weights_identical(tmp_path: Path) -> None:
    pytest.importorskip("horovod.torch")
    torch = pytest.importorskip("torch")
    weights = {}
    for name, env in (("plain", {}),
                      ("profiled", {"HOROVOD_PROFILE": "1",
                                    "HOROVOD_PROFILE_DIR": str(tmp_path / "prof")})):
        path = tmp_path / f"{name}-{{rank}}.pt"
        mpirun(2, [sys.executable, *BENCH, "--save-weights", str(path)], env=env,
               cwd=tmp_path, timeout=240)
        weights[name] = [torch.load(str(path).format(rank=r)) for r in (0, 1)]
    assert (tmp_path / "prof" / "trace.json").is_file()
    for r in (0, 1):
        a, b = weights["plain"][r], weights["profiled"][r]
        assert list(a) == list(b) and len(a) >= 4
        for k in a:
            assert a[k].dtype == b[k].dtype
            assert a[k].numpy().tobytes() == b[k].numpy().tobytes(), (r, k)
    # the ranks agree with each other too (DistributedOptimizer keeps them in sync)
    for k in weights["profiled"][0]:
        assert torch.equal(weights["profiled"][0][k], weights["profiled"][1][k])
