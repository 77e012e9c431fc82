"""Elastic Horovod under the profiler: `horovodrun --gloo --min-np 1 --max-np 2
--host-discovery-script S` on localhost, the script reading a file the job
rewrites, so that the membership changes at known steps.

(a) 2 -> 1 -> 2 workers: exactly three membership epochs (world sizes 2, 1,
2), the ranks and processes of each, the removed worker's file kept and
marked "removed", a third file for the worker added (no file overwritten);
every step each process printed is in its epoch (a step record closes at
each optimizer step after the first of an epoch); the analysis window holds
the longest epoch alone; `profiler advise` says what the resets cost.
(b) A worker SIGKILLed mid-run: its file is in the trace, marked "killed",
and every step it printed before the kill is in the trace
(HOROVOD_PROFILE_FLUSH_MS short: the raw file is flushed that often).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import PYTHON, base_env, profiler_cli, requires_mpi

from profiler.formats.steps import WARMUP_STEPS

pytestmark = [requires_mpi, pytest.mark.mpi, pytest.mark.horovod]

HOROVODRUN = os.path.join(os.path.dirname(PYTHON), "horovodrun")

# The job: a tiny model; rank 0 rewrites the hosts file at known steps (SCALE)
# or rank 1 kills itself (KILL).  Each step prints pid, rank, size, step.
JOB = r"""
import os, signal, sys, time
import torch
import horovod.torch as hvd

hvd.init()
MODE, HOSTS = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
x = torch.randn(4, 8)


def write_hosts(text):
    with open(HOSTS + ".tmp", "w") as f:
        f.write(text)
    os.replace(HOSTS + ".tmp", HOSTS)


@hvd.elastic.run
def train(state):
    while True:
        if hvd.size() == 1 and state.phase == 0:
            state.phase, state.mark = 1, state.step
        if hvd.size() == 2 and state.phase == 1:
            state.phase, state.mark = 2, state.step
        if state.phase == 2 or (MODE == "kill" and state.phase == 1):
            if state.step >= state.mark + 4:
                return
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        print(f"STEP pid={os.getpid()} rank={hvd.rank()} size={hvd.size()} step={state.step}",
              flush=True)
        state.step += 1
        if MODE == "kill" and hvd.rank() == 1 and state.step == 4:
            time.sleep(0.3)  # > HOROVOD_PROFILE_FLUSH_MS: its steps reach the file
            os.kill(os.getpid(), signal.SIGKILL)
        if MODE == "scale" and hvd.rank() == 0 and state.phase == 0 and state.step == 4:
            write_hosts("localhost:1\n")
        if MODE == "scale" and hvd.rank() == 0 and state.phase == 1 and \
                state.step == state.mark + 3:
            write_hosts("localhost:2\n")
        time.sleep(0.05)
        state.commit()


state = hvd.elastic.TorchState(model, opt, step=0, phase=0, mark=0)
train(state)
print(f"DONE pid={os.getpid()} rank={hvd.rank()}", flush=True)
"""


def elastic_run(tmp: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp / "job.py").write_text(JOB)
    hosts = tmp / "hosts"
    # kill: two hosts of one slot (both this machine): Horovod blacklists the
    # host of a failed worker, and the survivor's must stay
    hosts.write_text("localhost:2\n" if mode == "scale" else "localhost:1\n127.0.0.1:1\n")
    script = tmp / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    prof = tmp / "profile"
    env = base_env(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(prof),
                   HOROVOD_PROFILE_FLUSH_MS="20", HOROVOD_PROFILE_BATCH_SIZE="4",
                   PATH=os.path.dirname(PYTHON) + os.pathsep + os.environ.get("PATH", ""))
    # --network-interfaces: without it, elastic mode waits for two hosts to
    # compare their interfaces (horovod.runner.gloo_run._get_min_start_hosts)
    cmd = [HOROVODRUN, "--gloo", "-np", "2", "--min-np", "1", "--max-np", "2",
           "--network-interfaces", "lo", "--host-discovery-script", str(script),
           PYTHON, str(tmp / "job.py"), mode, str(hosts)]
    run = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=240)
    return run, prof


STEP = re.compile(r"STEP pid=(\d+) rank=(\d+) size=(\d+) step=(\d+)")


def printed(stdout: str) -> pd.DataFrame:
    rows = [tuple(int(x) for x in m.groups()) for m in STEP.finditer(stdout)]
    return pd.DataFrame(rows, columns=["pid", "rank", "size", "step"])


def merged(prof: Path) -> dict[str, object]:
    """The trace that file 0's process builds at exit (it waits for every
    process's file, a worker added later's too); its merge child may end after
    horovodrun returns."""
    trace = prof / "trace.json"
    deadline = time.monotonic() + 120
    while not trace.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert trace.is_file(), sorted(p.name for p in prof.iterdir())
    meta: dict[str, object] = json.loads(trace.read_text())["horovod_profiler"]
    return meta


def epoch_steps(stdout: str) -> list[dict[tuple[int, int], int]]:
    """Per epoch (a run of lines with one world size, in order), the steps
    each (pid, rank) printed."""
    p = printed(stdout)
    out: list[dict[tuple[int, int], int]] = []
    size = None
    for row in p.itertuples():
        if row.size != size:
            out.append({})
            size = row.size
        key = (int(row.pid), int(row.rank))
        out[-1][key] = out[-1].get(key, 0) + 1
    return out


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                                 dict[str, object]]:
    run, prof = elastic_run(tmp_path_factory.mktemp("scale"), "scale")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return run, merged(prof)


@pytest.mark.slow
def test_scaling_2_1_2_gives_three_epochs_and_keeps_every_file(
        scaled: tuple[subprocess.CompletedProcess[str], dict[str, object]]) -> None:
    run, meta = scaled
    el = meta["elastic"]
    assert isinstance(el, dict)
    epochs = el["epochs"]
    assert [e["world_size"] for e in epochs] == [2, 1, 2]
    # files: 0 and 1 started, 1 removed; 2 the worker added (1 not overwritten)
    procs = {p["file"]: p for p in el["processes"]}
    assert sorted(procs) == [0, 1, 2]
    assert [procs[f]["ended"] for f in (0, 1, 2)] == ["exited", "removed", "exited"]
    assert [procs[f]["inits"] for f in (0, 1, 2)] == [3, 1, 1]
    assert [[(m["file"], m["rank"]) for m in e["members"]] for e in epochs] == \
        [[(0, 0), (1, 1)], [(0, 0)], [(0, 0), (2, 1)]]
    # every printed step is in its epoch: the first of each epoch only opens
    # a step (the one spanning the reset, or the new process's first)
    want = epoch_steps(run.stdout)
    assert len(want) == 3
    for e, w in zip(epochs, want):
        got = {(m["pid"], m["rank"]): m["steps"] for m in e["members"]}
        assert got == {k: n - 1 for k, n in w.items()}, (e, w)
        assert all(m["images"] == 4 * m["steps"] for m in e["members"])
    assert [(r["kind"], r["gone"], r["came"]) for r in el["resets"]] == \
        [("removed", [1], []), ("added", [], [2])]
    assert all(r["cost_ns"] >= r["reinit_ns"] > 0 for r in el["resets"])
    # the analysis reads one epoch: the one with the most steps
    best = max(epochs, key=lambda e: (e["steps"], e["index"]))
    assert el["analysed"] == best["index"]
    window = meta["window"]
    assert isinstance(window, dict)
    assert window["ranks"] == sorted(m["file"] for m in best["members"])
    assert window["t_start_ns"][0] == best["start_ns"]


@pytest.mark.slow
def test_advise_says_what_the_resets_cost(
        scaled: tuple[subprocess.CompletedProcess[str], dict[str, object]]) -> None:
    run, meta = scaled
    el = meta["elastic"]
    assert isinstance(el, dict)
    best = el["epochs"][el["analysed"]]
    prof = Path(run.args[-1]).parent / "profile"
    adv = profiler_cli("advise", str(prof / "trace.json"))
    assert adv.returncode == 0, adv.stderr
    assert "Elastic job: 3 membership epochs, 2 resets costing" in adv.stdout, adv.stdout
    assert "reset 0 -> 1 (removed" in adv.stdout and "reset 1 -> 2 (added" in adv.stdout
    assert f"every other figure here is epoch {el['analysed']}'s alone" in adv.stdout
    # the breakdown is the analysed epoch's: its steps but the warm-up, and no
    # step across a reset (that one lasts seconds: a worker starting)
    head = " ".join(adv.stdout.split("\n\n")[0].split())
    assert f"{best['steps'] - WARMUP_STEPS} steps," in head, head
    ms = float(re.search(r"steps, ([0-9.]+) ms/step", head).group(1))  # type: ignore[union-attr]
    assert ms < 1000 and all(m["step_ms"] < 1000 for m in best["members"]), head


@pytest.mark.slow
def test_a_worker_killed_mid_run_keeps_every_step_it_printed(tmp_path: Path) -> None:
    run, prof = elastic_run(tmp_path, "kill")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    meta = merged(prof)
    el = meta["elastic"]
    assert isinstance(el, dict)
    assert [e["world_size"] for e in el["epochs"]] == [2, 1]
    procs = {p["file"]: p["ended"] for p in el["processes"]}
    assert procs == {0: "exited", 1: "killed"}
    assert meta["partial_ranks"] == [1]
    assert [(r["kind"], r["gone"]) for r in el["resets"]] == [("failed", [1])]
    want = epoch_steps(run.stdout)
    killed = [k for k in want[0] if k[1] == 1]
    assert len(killed) == 1 and want[0][killed[0]] == 4  # it printed steps 0..3
    for e, w in zip(el["epochs"], want):
        got = {(m["pid"], m["rank"]): m["steps"] for m in e["members"]}
        assert got == {k: n - 1 for k, n in w.items()}, (e, w)
    # in the dataset too, with the step numbers it wrote
    rows = pd.read_parquet(prof / "ranks" / "rank-00001.parquet")
    steps = rows[rows["op"].astype(str) == "step"]
    assert steps["seq"].tolist() == [0, 1, 2]


def test_epochs_group_inits_by_return_size_and_rank() -> None:
    """The grouping the merge uses: inits in order of return, a group takes
    inits of its world size, distinct ranks and files, until it is full."""
    from profiler.postjob.epochs import epochs_of

    def ev(f: int, r: int, s: int, t: int) -> dict[str, int]:
        return {"file": f, "rank": r, "size": s, "t1_ns": t}

    inits = [ev(1, 1, 2, 11), ev(0, 0, 2, 10),   # epoch 0: two workers
             ev(0, 0, 1, 50),                     # epoch 1: one left
             ev(0, 0, 1, 70),                     # epoch 2: a reset at the same size
             ev(2, 1, 2, 90), ev(0, 0, 2, 91)]    # epoch 3: one added
    got = [[(e["file"], e["rank"]) for e in g] for g in epochs_of(inits)]
    assert got == [[(0, 0), (1, 1)], [(0, 0)], [(0, 0)], [(2, 1), (0, 0)]]


def test_sidecar_keeps_whole_lines_and_skips_a_cut_one(tmp_path: Path) -> None:
    from profiler.formats import epochs

    raw = tmp_path / "rank-00003.hvprof"
    assert epochs.sidecar_of(raw).name == "rank-00003.epochs.jsonl"
    epochs.append(raw, {"event": "init", "t0_ns": 1, "t1_ns": 2, "rank": 0, "size": 1})
    epochs.append(raw, {"event": "shutdown", "t_ns": 3})
    with open(epochs.sidecar_of(raw), "a") as f:
        f.write('{"event": "init", "t0_')  # a write cut short by a kill
    assert [e["event"] for e in epochs.read(epochs.sidecar_of(raw))] == ["init", "shutdown"]
    assert epochs.read(tmp_path / "absent.jsonl") == []
