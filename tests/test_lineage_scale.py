"""The fusion lineage scales with the ambiguity (issue 25).

A 2-rank Horovod job training six nn.Linear(96, 96) (12 gradient tensors,
six of each shape) made the inference overflow (`1.0 / res.assignments`:
int too large to convert to float) and the merge write no lineage, because
every tensor an ambiguous call held stayed a candidate for every later call.
Here:

* the counts stay exact integers and are stated in log space, whatever the
  number of equal-sized tensors; the search is bounded and says when it
  stopped (ways_bound);
* a stand-in for Horovod's loop (tests/lineage_sim.py) with the ground
  truth: a 12-layer BERT-style encoder (201 tensors, most of a few shapes)
  for 100 steps inferred in bounded time, never naming a call the truth
  contradicts (ambiguous with the truth among the candidates is allowed),
  also when the cycles split the step at every boundary between tensors of
  one size;
* the issue's job under real Horovod, its timeline as the oracle: the
  lineage is written, every tensor certain or ambiguous, none contradicted,
  and `profiler tensors` and `tensors --whatif` exit 0;
* a failure in the inference costs neither the trace nor the lineage's
  rows: one line on stderr, every tensor listed as not inferred.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import lineage_sim as S
import numpy as np
import pandas as pd
import pytest
from conftest import mpirun, profiler_cli, requires_mpi

from profiler.postjob import fusion, fusion_subsets

try:
    import horovod.torch  # noqa: F401
    HAVE_HOROVOD = True
except Exception:  # pragma: no cover
    HAVE_HOROVOD = False

requires_horovod = pytest.mark.skipif(not HAVE_HOROVOD, reason="Horovod not installed")

#: the issue's bound for a 12-layer transformer's 100 steps; the suite
#: allows for a loaded machine (docs/validation.md has the figures measured)
BOUND_S = 10.0


def _check(job: S.SimJob, threshold: int) -> tuple[pd.DataFrame, dict[str, Any],
                                                   dict[str, Any], float]:
    t0 = time.monotonic()
    table, info = fusion.infer(job.frames, job.names, threshold=threshold, world_size=2)
    took = time.monotonic() - t0
    agree = fusion.compare(table, S.truth_table(job))
    assert agree["wrong"] == 0, agree["examples"][:2]
    assert agree["extra"] == 0
    assert set(table["certainty"]) <= {"certain", "ambiguous", "unmatched"}
    # what is stated certain is so; ambiguous rows give a count, never a float overflow
    amb = table[table["certainty"] == "ambiguous"]
    assert np.isfinite(amb["ways_log10"]).all() and (amb["ways_log10"] > 0).all()
    assert (table.loc[table["certainty"] == "certain", "confidence"] == 1.0).all()
    return table, info, agree, took


# ---------------------------------------------------------------------------
# counts
# ---------------------------------------------------------------------------

def test_counts_are_exact_and_stated_in_log_space() -> None:
    # 600 tensors of one size, half of them in a call: C(600, 300) ~ 1.35e179
    res = fusion.solve_subset([384], [600], 300 * 384)
    assert res.assignments == math.comb(600, 300) and not res.exhausted
    assert res.log10 == pytest.approx(179.13, abs=0.01)
    # many sizes, many solutions: the search stops at its budget and says so
    res = fusion.solve_subset(list(range(100, 140)), [6] * 40, 14_000, budget=500)
    assert res.exhausted and math.isfinite(res.log10)
    res = fusion.solve_subset(list(range(100, 140)), [6] * 40, 14_000)
    assert res.exhausted and res.assignments > 10 ** 6 and math.isfinite(res.log10)
    # the groups some fitting vector takes cover every solution, not the first 64
    res = fusion.solve_subset([64, 32, 16, 8], [8, 8, 8, 8], 256)
    assert len(res.vectors) == fusion_subsets.MAX_SOLUTIONS and res.used == {0, 1, 2, 3}


def test_equal_tensors_in_one_call_never_overflow() -> None:
    """The shape of the crash: many equal-sized tensors pending, a call of
    half of them.  Stated ambiguous, with the count's logarithm."""
    n = 600
    subs = [(f"allreduce.t{i}", 10 + i, 384, 0x1000 + i) for i in range(n)]
    frame, names = _frame(subs, [(10_000, 300 * 384, 0xF00)])
    table, info = fusion.infer({0: frame}, {0: names}, threshold=1 << 30, world_size=1)
    carried = table[table["matched"]]
    assert len(carried) == 300 and (carried["certainty"] == "ambiguous").all()
    assert carried["ways_log10"].iloc[0] == pytest.approx(179.13, abs=0.01)
    assert info["ambiguous"] == 1


def _frame(subs: list[tuple[str, int, int, int]], calls: list[tuple[int, int, int]]
           ) -> tuple[pd.DataFrame, list[str]]:
    names = list(dict.fromkeys(s[0] for s in subs))
    rows = [{"op": "tensor", "backend": "app", "kind": "app", "t_start_ns": t, "t_end_ns": t + 1,
             "dur_ns": 1, "bytes": b, "dtype": "ncclFloat32", "buf": buf, "root": -1,
             "seq": names.index(name), "comm": 0, "thread_kind": "main", "track": 0, "step": 0,
             "rc": 0, "redop": "avg"} for name, t, b, buf in subs]
    rows += [{"op": "allreduce", "backend": "mpi", "kind": "data", "t_start_ns": t,
              "t_end_ns": t + 10, "dur_ns": 10, "bytes": b, "dtype": "MPI_FLOAT", "buf": buf,
              "root": -1, "seq": i, "comm": 7, "thread_kind": "horovod", "track": 1, "step": 0,
              "rc": 0, "redop": "sum"} for i, (t, b, buf) in enumerate(calls)]
    return pd.DataFrame(rows), names


# ---------------------------------------------------------------------------
# a stand-in for Horovod's loop, with the truth
# ---------------------------------------------------------------------------

def test_issue_mlp_for_100_steps_is_certain() -> None:
    """The issue's model (six 96-wide layers), 100 steps at the default
    threshold: each cycle carried what was queued before it began; the
    cycles and the expiry of names make every call certain."""
    sizes = [(f"body.{2 * i}.{k}", 36864 if k == "weight" else 384)
             for i in range(6) for k in ("weight", "bias")]
    job = S.simulate(sizes, steps=100, gap_ns=3_000, backward_ns=600_000)
    table, info, agree, took = _check(job, 128 << 20)
    assert agree["equal"] >= 0.9 * agree["calls"], agree
    assert (table["certainty"] != "unmatched").all()
    assert took < BOUND_S


def test_12_layer_transformer_100_steps_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    """201 tensors (108 of 256 bytes, 48 of 16 KiB...), 100 steps, each
    backward pass over three cycles of 1 ms, 3 us between a cycle's pop and
    its first call: inferred within the bound, none contradicted, every
    tensor placed (certain, or ambiguous at a cycle boundary)."""
    job = S.simulate(S.bert_sizes(12), steps=100, gap_ns=3_000)
    table, info, agree, took = _check(job, 128 << 20)
    assert (table["certainty"] != "unmatched").all()
    assert agree["equal"] > 0.4 * agree["calls"], agree
    with capsys.disabled():
        print(f"\n  12-layer encoder, 100 steps, {len(table)} tensor operations, "
              f"{agree['calls']} calls: {took:.2f} s; {agree['equal']} certain, "
              f"{agree['ambiguous_ok']} ambiguous ({agree['ambiguous_shown_right']} shown "
              f"right)")
    assert took < BOUND_S


@pytest.mark.parametrize("case", ["threshold-4096", "wide-gap"])
def test_adversarial_ambiguity_stays_bounded_and_never_wrong(case: str) -> None:
    """Worse than any real run: a 20 us window between pop and call where
    tensors of one size arrive every 10 us (every cycle boundary ambiguous),
    or eight equal tensors at one instant and a threshold that splits a step
    into ~80 calls."""
    if case == "threshold-4096":
        job, th = S.simulate(S.bert_sizes(12), steps=10, threshold=4096, gap_ns=20_000), 4096
    else:
        job, th = S.simulate(S.bert_sizes(12), steps=30, threshold=20000, burst=8,
                             gap_ns=200_000), 20000
    table, info, agree, took = _check(job, th)
    assert took < BOUND_S
    assert (table["certainty"] == "unmatched").mean() < 0.05


# ---------------------------------------------------------------------------
# the issue's job under real Horovod, the timeline as the oracle
# ---------------------------------------------------------------------------

MLP_JOB = """
import os
import horovod.torch as hvd
import torch
hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
net = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(96, 96),
                                                          torch.nn.ReLU())])
opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01),
                               named_parameters=net.named_parameters())
hvd.broadcast_parameters(net.state_dict(), root_rank=0)
x, y = torch.randn(64, 96), torch.randn(64, 96)
for _ in range(int(os.environ.get("STEPS", "30"))):
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).backward()
    opt.step()
hvd.shutdown()
"""


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    if not HAVE_HOROVOD:
        pytest.skip("Horovod not installed")
    tmp = tmp_path_factory.mktemp("mlp6")
    (tmp / "job.py").write_text(MLP_JOB)
    prof = tmp / "prof"
    p = mpirun(2, [sys.executable, str(tmp / "job.py")], cwd=tmp, timeout=240,
               env={"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(prof),
                    "HOROVOD_PROFILE_TIMELINE": "1", "STEPS": "30"})
    return prof, p.stderr


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
def test_issue_mlp_lineage_written_and_agrees_with_the_timeline(
        mlp_run: tuple[Path, str]) -> None:
    prof, stderr = mlp_run
    assert "Traceback" not in stderr and "lineage" not in stderr, stderr[-2000:]
    meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]["lineage"]
    assert meta["status"] == "ok" and (prof / "lineage.parquet").is_file(), meta
    assert meta["source"] == "records+timeline"
    agree = meta["agreement"]
    assert agree["wrong"] == 0 and agree["missing"] == 0, agree
    assert agree["equal"] + agree["ambiguous_ok"] == agree["calls"] > 0
    lin = pd.read_parquet(prof / "lineage.parquet")
    ar = lin[lin["op"] == "ALLREDUCE"]
    assert len(ar) == 30 * 12 and set(ar["certainty"]) <= {"certain", "ambiguous"}
    # How many rows are certain depends on how Horovod's cycles split a step's
    # equal-sized tensors over calls (timing); a disambiguation that stopped
    # working leaves nearly every one of them ambiguous, far below this bar
    assert (ar["certainty"] == "certain").mean() > 0.5, ar["certainty"].value_counts()
    for args in (["tensors", str(prof)], ["tensors", str(prof), "--whatif"],
                 ["tensors", str(prof), "--format", "json"]):
        p = profiler_cli(*args)
        assert p.returncode == 0 and "Traceback" not in p.stderr, (args, p.stderr)
    rows = json.loads(profiler_cli("tensors", str(prof), "--format", "json").stdout)
    ar_rows = [r for r in rows if r["op"] == "ALLREDUCE"]
    assert len(ar_rows) == 12 and all(r["calls"] == 30 and r["unmatched"] == 0
                                      for r in ar_rows)


@pytest.mark.mpi
@pytest.mark.horovod
@requires_mpi
@requires_horovod
def test_a_failing_inference_is_one_line_and_costs_nothing_else(
        mlp_run: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from profiler.postjob.merge import merge

    prof, _ = mlp_run
    copy = tmp_path / "prof"
    shutil.copytree(prof / "ranks", copy / "ranks")

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(fusion, "infer", boom)
    result = merge(copy)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "lineage" in x]
    assert len(lines) == 1 and "OverflowError" in lines[0] and "Traceback" not in err, err
    assert result.trace.is_file()  # the trace is written all the same
    meta = json.loads(result.trace.read_bytes())["horovod_profiler"]["lineage"]
    assert meta["status"] == "ok" and "OverflowError" in " ".join(meta["problems"])
    lin = pd.read_parquet(copy / "lineage.parquet")
    # every tensor rank 0 handed to Horovod, each said not inferred (the
    # timeline's rows joined would say more; this copy has none)
    assert len(lin) == 12 + 30 * 12 and (lin["certainty"] == "not inferred").all()
    p = profiler_cli("tensors", str(copy))
    assert p.returncode == 0 and "not inferred" in p.stdout, p.stdout + p.stderr
