"""The tensor hooks in C (profiler._fastrec.Hook) and in Python
(profiler.collect.tensors._wrap) write the same records.

One profiled rank (mpirun -n 1, mpi4py) wraps a stand-in for each of
Horovod's entry points (tensors.ENTRY_POINTS) both ways and calls the two
hooks with the same arguments, one after the other: positional and keyword
arguments, named and unnamed tensors, grouped tensors with and without
outputs, dtypes of 1, 2 and 8 bytes, reduction ops, roots and process sets
(Horovod's ProcessSet, None, ones whose id is missing or no integer).  Each
pair of calls must leave the same APP_TENSOR records (every field but the
times) and return the entry point's handle; an error of the entry point
reaches the caller unchanged from both; a recording that fails (an argument
that is no tensor) costs a warning, once, and never the call.  The C hook
measures its own work in C (selfcost's rule, on every call or on one in 64)
within what the calls took."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import mpirun, requires_mpi

from profiler.formats.raw import read_raw, read_tensor_names

pytestmark = [requires_mpi, pytest.mark.mpi]

JOB = r'''
import json, sys
import torch
from mpi4py import MPI
from profiler.collect import tensors

out = sys.argv[1]
fast = tensors.fast_module()
assert fast is not None, "profiler._fastrec is not available"

class ProcessSet:  # horovod.common.process_sets.ProcessSet: its id attribute
    def __init__(self, i):
        self.process_set_id = i

class NoId:
    pass

current = [0]

def stand_in(*args, **kwargs):
    return 1000 + current[0]  # a handle; the same for both hooks of a pair

def hooks(fname, orig=stand_in):
    c = tensors._wrap(fname, orig)
    saved, tensors._fast = tensors._fast, False
    try:
        py = tensors._wrap(fname, orig)
    finally:
        tensors._fast = saved
    assert type(c).__name__ == "Hook" and type(py).__name__ == "function", (c, py)
    return c, py

def tensor(dtype, n):
    return (torch.arange(n) % 3).to(dtype)

DTYPES = [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bfloat16,
          torch.float64]
calls = []
k = 0
for fname, (prefix, grouped, out_i, root_i, op_i, name_i, ps_i) in tensors.ENTRY_POINTS.items():
    c_hook, py_hook = hooks(fname)
    width = 1 + max(p for p in (out_i, root_i, op_i, name_i, ps_i) if p is not None)
    for variant in range(7):
        dt = DTYPES[variant % len(DTYPES)]
        n = 3 + variant
        if grouped:
            ts = [tensor(dt, n), tensor(torch.float32, 1), tensor(torch.int64, 2 * n)]
            outs = [t.clone() for t in ts] if variant % 2 == 0 else None
        else:
            ts = tensor(dt, n) if variant != 5 else torch.tensor(2.5)
            outs = ts.clone() if variant % 2 == 0 else None
        name = None if variant == 2 else f"layer{variant}.weight"
        op = [1, 4, 0, None, 5, 2, 99][variant]
        ps = [ProcessSet(0), None, ProcessSet(3), NoId(), ProcessSet("x"), ProcessSet(1),
              ProcessSet(0)][variant]
        values = {out_i: outs, root_i: variant % 2, op_i: op, name_i: name, ps_i: ps}
        if variant in (3, 4):  # the tensors positional, the rest by keyword
            args = [ts]
            kwargs = {"name": name, "process_set": ps}
            if out_i is not None:
                kwargs["outputs" if grouped else "output"] = outs
            if root_i is not None:
                kwargs["root_rank"] = variant % 2
            if op_i is not None:
                kwargs["op"] = op
            if variant == 4:  # keywords that are not interned (built at run time)
                kwargs = {"".join(list(key)): v for key, v in kwargs.items()}
        elif variant == 6:  # everything by keyword
            args = []
            kwargs = {"tensors" if grouped else "tensor": ts, "name": name}
            if op_i is not None:
                kwargs["op"] = op  # 99: an op Horovod does not have
        else:
            args = [ts] + [values.get(i) for i in range(1, width)]
            kwargs = {}
        for hook in (c_hook, py_hook):
            current[0] = k
            assert hook(*args, **kwargs) == 1000 + k
        calls.append({"fname": fname, "records": len(ts) if grouped else 1, "k": k,
                      "unnamed": name is None})
        k += 1

# the same name object call after call, as the DistributedOptimizer passes
# it each step: the C hook's remembered base, id and op must give what the
# Python hook works out each time (other ops, dtypes, roots and sets; the
# output the tensor itself, as allreduce_ and broadcast_ pass it, or none)
for fname, (prefix, grouped, out_i, root_i, op_i, name_i, ps_i) in tensors.ENTRY_POINTS.items():
    if grouped:
        continue
    c_hook, py_hook = hooks(fname)
    width = 1 + max(p for p in (out_i, root_i, op_i, name_i, ps_i) if p is not None)
    same = "".join(["same.", fname])  # one object, built at run time
    for i, (dt, op) in enumerate([(torch.float32, 1), (torch.float16, 0),
                                  (torch.float32, 1), (torch.int64, 4)]):
        ts = tensor(dt, 4 + i)
        values = {out_i: ts if i % 2 == 0 else None, root_i: i % 2, op_i: op,
                  name_i: same, ps_i: ProcessSet(i)}
        args = [ts] + [values.get(j) for j in range(1, width)]
        for hook in (c_hook, py_hook):
            current[0] = k
            assert hook(*args) == 1000 + k
        calls.append({"fname": fname, "records": 1, "k": k})
        k += 1

# more names than the C hook remembers (profiler/_ext/fastrec_hook.c NAME_SLOTS),
# each twice: names that share a slot take it from each other
c_hook, py_hook = hooks("_allreduce_async")
many = ["".join(["many.", str(i)]) for i in range(600)]
for name in many + many:
    for hook in (c_hook, py_hook):
        current[0] = k
        assert hook(tensor(torch.float32, 2), None, name, 1, 1.0, 1.0, None) == 1000 + k
    calls.append({"fname": "_allreduce_async", "records": 1, "k": k})
    k += 1

# a tensor subclass may answer otherwise: the C hook asks it through Python
# (its field reader takes only torch.Tensor and Parameter), as the Python hook does
class Odd(torch.Tensor):
    def numel(self):
        return 5

odd_t = torch.zeros(3).as_subclass(Odd)
for hook in hooks("_allreduce_async"):
    current[0] = k
    assert hook(odd_t, odd_t, "subclass", 1, 1.0, 1.0, None) == 1000 + k
calls.append({"fname": "_allreduce_async", "records": 1, "k": k})
k += 1

# an error of the entry point reaches the caller unchanged, from both hooks
def broken(*args, **kwargs):
    raise ValueError("boom")

errors = []
for hook in hooks("_allreduce_async", broken):
    try:
        hook(tensor(torch.float32, 4), None, "x", 1, 1.0, 1.0, None)
    except ValueError as exc:
        errors.append(str(exc))

# a recording that fails: a warning (once, for both), the handle all the same
failed = []
for hook in hooks("_allreduce_async"):
    current[0] = 77
    failed.append(hook(object(), None, "bad", 1, 1.0, 1.0, None))

# the C hook's own work, measured in C (fastrec's meter): every call, then
# one in 64 standing for 64; the loop's CPU time bounds what it may claim
import time
from profiler.collect import selfcost
c_hook, _ = hooks("_allreduce_async")
t = tensor(torch.float32, 8)
cost = {}
for mode, (first, every, n) in {"every": (1 << 62, 64, 2000), "sampled": (0, 64, 64 * 60)}.items():
    fast.sampling(first, every)
    w0, c0 = fast.work_ns(), time.thread_time_ns()
    for _ in range(n):
        c_hook(t, None, "cost", 1, 1.0, 1.0, None)
    c1, w1 = time.thread_time_ns(), fast.work_ns()
    cost[mode] = {"n": n, "cpu": c1 - c0, "work": [b - a for a, b in zip(w0, w1)]}
fast.sampling(selfcost.MEASURE_FIRST, selfcost.SAMPLE_EVERY)

# names as JSON lines written by the library (hooks/names.c): escapes,
# non-ASCII, a name past 4096 bytes cut at a character's start; one id each
odd = ['q"uote', "back\\slash", "new\nline", "tab\t\x01", "caf\u00e9", "\U0001F600",
       "\u00e9" * 2100]
odd_ids = [tensors._name_id(n) for n in odd]
assert [tensors._name_id(n) for n in odd] == odd_ids

with open(out, "w") as f:
    json.dump({"calls": calls, "errors": errors, "failed": failed,
               "recorded": tensors.tensors_recorded(), "odd": odd, "odd_ids": odd_ids,
               "fields": tensors.fields_reason(), "cost": cost}, f)
'''

FIELDS = ("bytes", "count", "dtype", "dtype_size", "redop", "root", "rc", "aux", "flags")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, str]:
    d = tmp_path_factory.mktemp("hooks")
    (d / "job.py").write_text(JOB)
    prof = d / "prof"
    p = mpirun(1, [sys.executable, str(d / "job.py"), str(d / "out.json")], cwd=d,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                    "HOROVOD_PROFILE_MERGE": "0"})
    return json.loads((d / "out.json").read_text()), prof, p.stderr


def test_both_hooks_write_the_same_records(job: tuple[dict, Path, str]) -> None:
    out, prof, _ = job
    raw = read_raw(prof / "raw" / "rank-00000.hvprof")
    names = read_tensor_names(prof / "raw" / "rank-00000.hvprof")
    rec = raw.records[raw.records["op"] == 35]  # APP_TENSOR
    expected = sum(2 * c["records"] for c in out["calls"])
    measured = sum(c["n"] for c in out["cost"].values())  # after the pairs, all one name
    assert len(rec) == expected + measured == out["recorded"]
    assert len(set(rec["seq"][expected:])) == 1
    # the C hook read the tensors through PyTorch's field reader (setup.py builds it)
    assert out["fields"] is None, out["fields"]
    assert raw.header["dropped_records"] == 0
    i = 0
    for c in out["calls"]:
        n = c["records"]
        mine, theirs = rec[i:i + n], rec[i + n:i + 2 * n]
        i += 2 * n
        for f in FIELDS:
            assert np.array_equal(mine[f], theirs[f]), (c, f, mine[f], theirs[f])
        got = [names[s] for s in mine["seq"]]
        assert got == [names[s] for s in theirs["seq"]], c
        prefix = {"_allreduce_async": "allreduce", "_broadcast_async": "broadcast"}.get(
            c["fname"])
        if prefix and c.get("unnamed"):  # Horovod's noname.<handle>
            assert got == [f"{prefix}.noname.{1000 + c['k']}"], got
        assert (mine["t_end"] >= mine["t_start"]).all()
        assert (mine["bytes"] == mine["count"] * mine["dtype_size"]).all()


def test_c_hook_measures_its_own_work(job: tuple[dict, Path, str]) -> None:
    """The C hook's work, measured on every call and on one in 64 (standing
    for 64), is the same work: the two estimates a call agree within a factor
    of 4.  Neither claims more than the calls took (their thread CPU time), no
    step hook ran, and the clock reads are counted apart, one set per measured
    call."""
    cost = job[0]["cost"]
    every, sampled = cost["every"], cost["sampled"]
    for c in (every, sampled):
        tensor_ns, step_ns, paid_ns = c["work"]
        assert step_ns == 0, c
        assert 0 < tensor_ns + paid_ns < c["cpu"], c
    per_every = every["work"][0] / every["n"]
    per_sampled = sampled["work"][0] / sampled["n"]
    assert per_every / 4 < per_sampled < per_every * 4, (per_every, per_sampled)
    # 60 measured calls pay for their reads, 2000 for theirs
    assert sampled["work"][2] < every["work"][2] / 10, (sampled, every)


def test_values_as_horovod_passes_them(job: tuple[dict, Path, str]) -> None:
    out, prof, _ = job
    raw = read_raw(prof / "raw" / "rank-00000.hvprof")
    names = read_tensor_names(prof / "raw" / "rank-00000.hvprof")
    rec = raw.records[raw.records["op"] == 35]
    by_name = {names[s]: r for s, r in zip(rec["seq"], rec)}
    # variant 0 of _allreduce_async: float32 x 3, Sum (1 -> sum), process set 0
    r = by_name["allreduce.layer0.weight"]
    assert (int(r["count"]), int(r["dtype_size"]), int(r["dtype"]), int(r["redop"]),
            int(r["root"]), int(r["rc"])) == (3, 4, 71, 1, -1, 0)
    assert int(r["aux"]) != 0  # the output's address, folded
    # variant 1: float16 x 4, Max, no process set, no output
    r = by_name["allreduce.layer1.weight"]
    assert (int(r["count"]), int(r["dtype_size"]), int(r["dtype"]), int(r["redop"]),
            int(r["rc"]), int(r["aux"])) == (4, 2, 70, 4, 0, 0)
    # variant 5: a 0-d tensor, an op Horovod does not know (2: Adasum -> user), set 1
    r = by_name["allreduce.layer5.weight"]
    assert (int(r["count"]), int(r["redop"]), int(r["rc"])) == (1, 255, 1)
    # a tensor subclass's own numel, in both hooks
    assert int(by_name["allreduce.subclass"]["count"]) == 5
    # broadcast's root, by position (variant 1) and by keyword (variant 3)
    assert int(by_name["broadcast.layer1.weight"]["root"]) == 1
    assert int(by_name["broadcast.layer3.weight"]["root"]) == 1
    assert int(by_name["broadcast.layer0.weight"]["root"]) == 0
    # an op number that is no ReduceOp (by keyword): "user"
    assert int(by_name["allreduce.layer6.weight"]["redop"]) == 255
    # a grouped call: one record per tensor, <base>_<i>of<n>
    assert {"grouped_allreduce.layer0.weight_1of3", "grouped_allreduce.layer0.weight_2of3",
            "grouped_allreduce.layer0.weight_3of3"} <= set(by_name)
    # the same name object four times: one name, one id, each call's own values
    same = rec[[names[s] == "allreduce.same._allreduce_async" for s in rec["seq"]]]
    assert len(set(same["seq"])) == 1 and len(same) == 8
    assert [int(r) for r in same["redop"][::2]] == [1, 15, 1, 4]
    assert [int(r) for r in same["rc"][::2]] == [0, 1, 2, 3]
    assert [int(c) for c in same["count"][::2]] == [4, 5, 6, 7]
    assert [int(a) != 0 for a in same["aux"][::2]] == [True, False, True, False]
    # a process set id that is no integer, or none at all: 0
    assert int(by_name["allreduce.layer4.weight"]["rc"]) == 0
    assert int(by_name["allreduce.layer3.weight"]["rc"]) == 0


def test_errors_pass_and_failures_warn_once(job: tuple[dict, Path, str]) -> None:
    out, _, stderr = job
    assert out["errors"] == ["boom", "boom"]
    assert out["failed"] == [1077, 1077]
    warnings = [x for x in stderr.splitlines() if "tensor record failed" in x]
    assert len(warnings) == 1, stderr
    assert "_allreduce_async" in warnings[0]


def test_names_file_holds_any_name_once(job: tuple[dict, Path, str]) -> None:
    """The library's names file (hooks/names.c): line i is id i's name as a
    JSON string, whatever its characters; a name past 4096 bytes is cut at
    a character's start, and the lines after it still read."""
    doc, prof, _ = job
    names = read_tensor_names(prof / "raw" / "rank-00000.hvprof")
    ids = doc["odd_ids"]
    assert ids == list(range(ids[0], ids[0] + len(ids))) and ids[-1] == len(names) - 1
    got = [names[i] for i in ids]
    assert got[:-1] == doc["odd"][:-1]
    assert got[-1] == "\u00e9" * 2048  # 4096 bytes: 2048 two-byte characters
    assert len(set(names)) == len(names)
