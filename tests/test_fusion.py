"""Fusion lineage from the profiler's own records (profiler.postjob.fusion),
checked against Horovod's timeline as the oracle, call by call.

End to end with real Horovod 0.28.1 at np=2: tests/hvd_model_job.py (6
tensors of distinct sizes, and MODEL=repeated: four layers of one shape,
where bytes alone cannot say which equal-sized tensors rode together) and the
bundled benchmark's resnet8, with fusion at Horovod's default threshold, at a
threshold that splits the model into several fused calls, and off.  Every
fused call's tensor set must equal the timeline's, or the call must be
marked ambiguous with the timeline's set among its candidates: no call
silently wrong.  Plus the subset search and the inference on synthetic
records, where the answers are known exactly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import mpirun, profiler_cli, requires_mpi

from profiler.formats import record as F
from profiler.postjob import fusion
from profiler.postjob import lineage as L

JOB = Path(__file__).parent / "hvd_model_job.py"

try:
    import horovod.torch  # noqa: F401
    HAVE_HOROVOD = True
except Exception:  # pragma: no cover
    HAVE_HOROVOD = False

requires_horovod = pytest.mark.skipif(not HAVE_HOROVOD, reason="Horovod not installed")


# ---------------------------------------------------------------------------
# the subset search
# ---------------------------------------------------------------------------

def test_subset_search_counts_every_fitting_set() -> None:
    # two 4 KiB weights and two 128 B biases; a call of 4 KiB + 128 B: any
    # weight with any bias, 2 x 2 = 4 sets, one count vector
    res = fusion.solve_subset([4096, 128], [2, 2], 4096 + 128)
    assert res.vectors == [(1, 1)] and res.assignments == 4 and not res.exhausted
    # everything, nothing, too much
    assert fusion.solve_subset([4096, 128], [2, 2], 8448).vectors == [(2, 2)]
    assert fusion.solve_subset([4096, 128], [2, 2], 8448).assignments == 1
    assert fusion.solve_subset([4096, 128], [2, 2], 0).vectors == [(0, 0)]
    assert fusion.solve_subset([4096, 128], [2, 2], 9000).assignments == 0
    assert fusion.solve_subset([4096, 128], [2, 2], 100).assignments == 0
    # two different count vectors reach the same bytes: 2 x 64 == 1 x 128
    res = fusion.solve_subset([128, 64], [1, 2], 128)
    assert sorted(res.vectors) == [(0, 2), (1, 0)] and res.assignments == 2
    # the complement side (most bytes taken): 3 of 4 equal tensors
    res = fusion.solve_subset([10, 7], [4, 1], 37)
    assert res.vectors == [(3, 1)] and res.assignments == 4


# ---------------------------------------------------------------------------
# inference on synthetic records (one rank)
# ---------------------------------------------------------------------------

def _frame(subs: list[tuple[str, int, int, int]], calls: list[tuple[int, int, int]]
           ) -> tuple[pd.DataFrame, list[str]]:
    """Rows of rank 0: tensor records (name, t, bytes, buf) and allreduces on
    Horovod's thread (t, bytes, buf)."""
    names = list(dict.fromkeys(s[0] for s in subs))
    rows = []
    for name, t, b, buf in subs:
        rows.append({"op": "tensor", "backend": "app", "kind": "app", "t_start_ns": t,
                     "t_end_ns": t + 1, "dur_ns": 1, "bytes": b, "dtype": "ncclFloat32",
                     "buf": buf, "root": -1, "seq": names.index(name), "comm": 0,
                     "thread_kind": "main", "track": 0, "step": 0})
    for i, (t, b, buf) in enumerate(calls):
        rows.append({"op": "allreduce", "backend": "mpi", "kind": "data", "t_start_ns": t,
                     "t_end_ns": t + 10, "dur_ns": 10, "bytes": b, "dtype": "MPI_FLOAT",
                     "buf": buf, "root": -1, "seq": i, "comm": 7, "thread_kind": "horovod",
                     "track": 1, "step": 0})
    return pd.DataFrame(rows), names


def _sets(table: pd.DataFrame) -> dict[int, set[str]]:
    m = table[table["matched"]]
    return {int(s): set(g["tensor"]) for s, g in m.groupby("call_seq")}


def test_inference_marks_ambiguity_and_resolves_it_by_buffer_and_elimination() -> None:
    # w1, w2 of 4096 B and b1, b2 of 128 B pending; call 0 fuses one weight and
    # one bias (fusion buffer 0xF00); call 1 works in w2's memory (a single
    # tensor); call 2 fuses the remaining two.
    frame, names = _frame(
        [("allreduce.w1", 10, 4096, 0x11), ("allreduce.b1", 11, 128, 0x12),
         ("allreduce.w2", 12, 4096, 0x13), ("allreduce.b2", 13, 128, 0x14)],
        [(100, 4096 + 128, 0xF00), (200, 4096, 0x13), (300, 128, 0x14)])
    table, info = fusion.infer({0: frame}, {0: names}, threshold=1 << 20, world_size=1)
    got = _sets(table)
    # call 0: taken w1 + b1 first (earliest), then w2 is named by buffer in
    # call 1, b2 by buffer in call 2: call 0's alternatives are all carried
    # elsewhere for certain, so it is resolved by elimination
    assert got == {0: {"allreduce.w1", "allreduce.b1"}, 1: {"allreduce.w2"},
                   2: {"allreduce.b2"}}
    assert (table["confidence"] == 1.0).all()
    assert info["by_buffer"] == 2 and info["by_elimination"] == 1 and info["ambiguous"] == 0
    by = table.set_index("tensor")["method"].to_dict()
    assert by["allreduce.w1"] == "elimination" and by["allreduce.w2"] == "buffer"


def test_inference_takes_back_a_tensor_named_by_its_buffer() -> None:
    # call 0 guesses w1 (earliest) but call 1 works in w1's memory: call 0
    # must take w2 instead
    frame, names = _frame(
        [("allreduce.w1", 10, 4096, 0x11), ("allreduce.w2", 12, 4096, 0x13),
         ("allreduce.b1", 13, 128, 0x14)],
        [(100, 4096 + 128, 0xF00), (200, 4096, 0x11)])
    table, _ = fusion.infer({0: frame}, {0: names}, threshold=1 << 20, world_size=1)
    assert _sets(table) == {0: {"allreduce.w2", "allreduce.b1"}, 1: {"allreduce.w1"}}


def test_inference_on_nccl_calls_by_bytes() -> None:
    """A GPU job's data calls are NCCL's, with no receive buffer on record:
    tensors are matched by bytes and order, a unique split for certain, equal
    sizes marked with their confidence -- the later of two equal calls too:
    it is left one tensor only because the earlier one guessed."""
    frame, names = _frame(
        [("allreduce.w", 10, 4096, 0x11), ("allreduce.b", 11, 128, 0x12),
         ("allreduce.x", 150, 64, 0x13), ("allreduce.y", 151, 64, 0x14)],
        [(100, 4096 + 128, 0), (200, 64, 0), (300, 64, 0)])
    calls = frame["op"] == "allreduce"
    frame.loc[calls, "op"] = "nccl_allreduce"
    frame.loc[calls, "backend"] = "nccl"
    frame.loc[calls, "dtype"] = "ncclFloat32"
    table, info = fusion.infer({0: frame}, {0: names}, threshold=1 << 20, world_size=1)
    got = _sets(table)
    assert got[0] == {"allreduce.w", "allreduce.b"}
    assert {len(got[1]), len(got[2])} == {1} and got[1] | got[2] == {"allreduce.x",
                                                                     "allreduce.y"}
    conf = table.set_index("tensor")["confidence"].to_dict()
    assert conf == {"allreduce.w": 1.0, "allreduce.b": 1.0, "allreduce.x": 0.5,
                    "allreduce.y": 0.5}
    assert info["by_buffer"] == 0 and info["unexplained"] == 0 and info["ambiguous"] == 2
    cands = table.set_index("tensor")["candidates"].to_dict()
    assert set(cands["allreduce.y"].split(";")) == {"allreduce.x", "allreduce.y"}


def test_a_call_left_one_choice_by_a_guess_is_not_certain() -> None:
    """Fused calls of equal tensors (MPI, fusion buffer): the second call's
    tensors are the only pending ones only because the first call guessed;
    both are ambiguous, none resolved by elimination."""
    frame, names = _frame(
        [(f"allreduce.t{i}", 10 + i, 64, 0x10 + i) for i in range(4)],
        [(100, 128, 0xF00), (200, 128, 0xF00)])
    table, info = fusion.infer({0: frame}, {0: names}, threshold=1 << 20, world_size=1)
    assert info["ambiguous"] == 2 and info["by_elimination"] == 0
    assert (table.loc[table["matched"], "confidence"] < 1).all()


def test_inference_says_when_it_cannot_tell() -> None:
    frame, names = _frame(
        [("allreduce.a", 10, 64, 0x11), ("allreduce.b", 11, 64, 0x12),
         ("allreduce.c", 12, 64, 0x13)],
        [(100, 128, 0xF00)])
    table, info = fusion.infer({0: frame}, {0: names}, threshold=1 << 20, world_size=1)
    carried = table[table["matched"]]
    assert len(carried) == 2 and info["ambiguous"] == 1
    assert np.allclose(carried["confidence"], 1 / 3)  # 3 ways to pick 2 of 3
    assert set(carried["candidates"].iloc[0].split(";")) == {"allreduce.a", "allreduce.b",
                                                             "allreduce.c"}
    # a tensor enqueued after the call started is not a candidate; bytes that
    # no subset explains leave the call unmatched, counted
    frame, names = _frame([("allreduce.a", 10, 64, 0x11), ("allreduce.late", 150, 64, 0x12)],
                          [(100, 128, 0xF00)])
    table, info = fusion.infer({0: frame}, {0: names}, threshold=1 << 20, world_size=1)
    assert not table["matched"].any() and info["unexplained"] == 1


def test_evidence_keeps_what_inference_reads() -> None:
    # Horovod's thread known only by its signature (a bit-vector allreduce,
    # thread_kind "other"), plus a rank-0 main-thread allreduce that is not
    # Horovod's: the reduced frame drops the control and foreign rows, keeps
    # the tensor records and Horovod's data calls, and infers the same table
    frame, names = _frame(
        [("allreduce.w1", 10, 4096, 0x11), ("allreduce.b1", 11, 128, 0x12),
         ("allreduce.w2", 12, 4096, 0x13)],
        [(100, 4096 + 128, 0xF00), (200, 4096, 0x13)])
    frame["thread_kind"] = np.where(frame["op"] == "tensor", "main", "other")
    frame["redop"] = "sum"
    extra = pd.DataFrame([
        {**frame.iloc[-1].to_dict(), "t_start_ns": 50, "bytes": 8, "redop": "bor",
         "kind": "control", "buf": 0, "seq": 9},
        {**frame.iloc[-1].to_dict(), "t_start_ns": 60, "bytes": 4096, "track": 0,
         "thread_kind": "main", "buf": 0x13, "seq": 0, "comm": 3}])
    full = pd.concat([frame, extra], ignore_index=True)
    ev = fusion.evidence(full)
    assert set(ev.columns) <= set(fusion.EVIDENCE_COLUMNS)
    assert (ev["op"] == "tensor").sum() == 3
    calls = ev[ev["op"] != "tensor"]
    assert calls["t_start_ns"].tolist() == [100, 200]
    assert (calls["thread_kind"] == "horovod").all()
    a, _ = fusion.infer({0: full}, {0: names}, threshold=1 << 20, world_size=1)
    b, _ = fusion.infer({0: ev}, {0: names}, threshold=1 << 20, world_size=1)
    assert _sets(a) == _sets(b) == {0: {"allreduce.w1", "allreduce.b1"},
                                    1: {"allreduce.w2"}}


# ---------------------------------------------------------------------------
# end to end: real Horovod, the timeline as the oracle
# ---------------------------------------------------------------------------

def _run(tmp: Path, argv: list[str], **env: str) -> Path:
    prof = tmp / "prof"
    mpirun(2, argv, env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof), **env},
           cwd=tmp, timeout=240)
    return prof


def _both(prof: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    rec = L.build_lineage(prof, write=False, sources=("records",))
    tl = L.build_lineage(prof, write=False, sources=("timeline",))
    assert rec.table is not None, rec.reason
    assert tl.table is not None, tl.reason
    return rec.table, tl.table, fusion.compare(rec.table, tl.table)


CASES = {
    # name: (model env, fusion threshold or None for Horovod's default); the
    # other two combinations (distinct sizes unfused, repeated at the default)
    # add nothing these do not cover, and the suite's time is counted
    "distinct-default": ("", None),
    "distinct-split": ("", "600"),
    "repeated-split": ("repeated", "5000"),
    "repeated-off": ("repeated", "0"),
}
#: The default tier runs the two that differ most (distinct at the default,
#: repeated and split); the other two are the full tier's
FULL_CASES = {"distinct-split", "repeated-off"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.full) if c in FULL_CASES else c
                                  for c in CASES])
@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
def test_records_lineage_equals_the_timeline(tmp_path: Path, case: str) -> None:
    model, threshold = CASES[case]
    env = {"HOROVOD_PROFILE_TIMELINE": "1", "HOROVOD_CYCLE_TIME": "20", "STEPS": "4",
           "MODEL": model}
    if threshold is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = threshold
    prof = _run(tmp_path, [sys.executable, str(JOB)], **env)
    rec, tl, agree = _both(prof)
    assert agree["wrong"] == 0, agree["examples"]
    assert agree["missing"] == 0 and agree["extra"] == 0, agree
    assert agree["equal"] + agree["ambiguous_ok"] == agree["calls"] > 0, agree
    # every tensor operation of the timeline is in the records' table, carried
    key = ["tensor", "occurrence"]
    both = tl[tl["matched"]][key].merge(rec[rec["matched"]][key], on=key, how="left",
                                        indicator=True)
    assert (both["_merge"] == "both").all()
    if threshold == "0":  # fusion off: one tensor per call, each named by its buffer
        assert agree["equal"] == agree["calls"]
        ar = rec[rec["op"] == "ALLREDUCE"]
        assert (ar["n_tensors"] == 1).all() and (ar["method"] == "buffer").all()
    # the lineage written at exit is the records' with the timeline's phases
    meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]["lineage"]
    assert meta["source"] == "records+timeline" and meta["agreement"]["wrong"] == 0
    # readiness from both ranks' records, for every tensor operation
    assert (rec.loc[rec["matched"], "ready_ranks"] == 2).all()
    assert (rec.loc[rec["matched"], "queue_ns"] > 0).all()


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
@pytest.mark.full  # test_lineage's fused job checks the same agreement
def test_records_lineage_on_the_bundled_resnet8(tmp_path: Path) -> None:
    prof = _run(tmp_path, [sys.executable, "-m", "profiler.workloads.train_bench",
                           "--model", "resnet8", "--batch-size", "4", "--image-size", "16",
                           "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
                           "--num-iters", "1", "--quiet"],
                HOROVOD_PROFILE_TIMELINE="1", HOROVOD_FUSION_THRESHOLD=str(64 << 10))
    rec, tl, agree = _both(prof)
    assert agree["wrong"] == 0 and agree["missing"] == 0, agree
    assert agree["equal"] + agree["ambiguous_ok"] == agree["calls"] > 0, agree
    assert (rec.loc[rec["op"] == "ALLREDUCE", "n_tensors"] > 1).any()  # split, but fused


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
def test_default_settings_write_no_timeline_and_still_give_lineage(tmp_path: Path) -> None:
    prof = _run(tmp_path, [sys.executable, str(JOB)], STEPS="3", HOROVOD_CYCLE_TIME="20")
    assert not (prof / "timeline.json").exists()
    meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]["lineage"]
    assert meta["status"] == "ok" and meta["source"] == "records", meta
    # 6 broadcasts, then 6 gradients in each of 3 steps
    assert meta["records"]["tensor_records"] == 6 + 3 * 6
    assert meta["records"]["unexplained"] == 0
    p = profiler_cli("tensors", str(prof), "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    ar = [r for r in rows if r["op"] == "ALLREDUCE"]
    assert len(ar) == 6 and all(r["calls"] == 3 and r["calls_matched"] == 3 for r in ar)
    assert all(r["negotiation_mean_us"] is None for r in ar)  # the timeline's only
    table = profiler_cli("tensors", str(prof))
    assert table.returncode == 0 and "queued" in table.stdout and "negotiation" not in \
        table.stdout, table.stdout
    # the names file and the records: every name once, ids as in the records
    names = [json.loads(x) for x in (prof / "raw" / "rank-00000.tensors").read_text()
             .splitlines()]
    assert len(names) == len(set(names)) == 12
    df = pd.read_parquet(prof / "ranks" / "rank-00000.parquet")
    t = df[df["op"] == "tensor"]
    assert sorted({names[i] for i in t["seq"]}) == sorted(names)
    assert (t["bytes"] == t["count"] * 4).all() and (t["dtype"] == "ncclFloat32").all()


MPI_BUF_JOB = """
import numpy as np
from mpi4py import MPI
a = np.ones(16, dtype=np.float32)
b = np.zeros(16, dtype=np.float32)
MPI.COMM_WORLD.Allreduce(a, b)
MPI.COMM_WORLD.Bcast(a, root=0)
print(b.ctypes.data, a.ctypes.data, flush=True)
"""


@pytest.mark.mpi
@requires_mpi
def test_mpi_records_keep_the_receive_buffer(tmp_path: Path) -> None:
    """MPI records' buf is the receive buffer folded as hvprof_fold_ptr folds it
    (the C side) and profiler.formats.record.fold_ptr says (the Python side)."""
    script = tmp_path / "job.py"
    script.write_text(MPI_BUF_JOB)
    prof = tmp_path / "prof"
    p = mpirun(1, [sys.executable, str(script)], cwd=tmp_path,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof)})
    recv, bcast = (int(x) for x in p.stdout.split())
    df = pd.read_parquet(prof / "ranks" / "rank-00000.parquet")
    ar = df[df["op"] == "allreduce"]
    bc = df[df["op"] == "bcast"]
    assert list(ar["buf"]) == [F.fold_ptr(recv)]
    assert list(bc["buf"]) == [F.fold_ptr(bcast)]
    assert F.fold_ptr(0x0000_7F12_3456_7890) == (0x3456_7890 ^ 0x7F12)
    assert (df.loc[df["op"].isin(["init", "finalize"]), "buf"] == 0).all()


def test_inference_stops_at_its_budget_and_says_so() -> None:
    """The inference runs in rank 0's exit: past its time budget the remaining
    calls are counted as not inferred, never searched (a long job's exit is
    not held for minutes), and the lineage's reason says so."""
    subs = [(f"allreduce.t{i % 7}", 10 + 100 * i, 64 + 4 * (i % 7), 0x1000 + i)
            for i in range(200)]
    calls = [(60 + 100 * i, 64 + 4 * (i % 7), 0x1000 + i) for i in range(200)]
    frame, names = _frame(subs, calls)
    table, info = fusion.infer({0: frame}, {0: names}, threshold=1 << 20, world_size=1)
    assert info["by_buffer"] == 200 and info["not_inferred"] == 0
    table, info = fusion.infer({0: frame}, {0: names}, threshold=1 << 20, world_size=1,
                               budget_s=0.0)
    assert info["not_inferred"] == 200 and info["by_buffer"] == 0
    assert not table["matched"].any() and len(table) == 200
