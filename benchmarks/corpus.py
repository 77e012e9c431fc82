"""Profile the corpus of real models and Horovod features end to end (issue 25).

    python benchmarks/corpus.py                       # every workload, np=2
    python benchmarks/corpus.py bert resnet50 --steps 3
    python benchmarks/corpus.py --json out.json

For each workload of profiler.workloads.corpus, three runs under mpirun:
profiled at Horovod's defaults with Horovod's timeline beside it (the
oracle of the fusion lineage), profiled with fusion off
(HOROVOD_FUSION_THRESHOLD=0, its twin for `profiler compare`), and not
profiled.  Then, per workload:

* the data calls and bytes per step of each Horovod operation on rank 0
  (Horovod's thread, steps 0 and on: step -1 also holds the start-up
  broadcasts), against what the model's own parameter list says
  (``expected`` in the workload's RESULT line): bytes exact in both runs,
  calls exact with fusion off;
* the lineage: every tensor certain or ambiguous (none unmatched), and no
  call the timeline contradicts (fusion.compare: wrong == 0);
* every command (summarize, advise, check, tensors, tensors --whatif,
  report, compare fused unfused) exits 0 with no traceback;
* the losses rank 0 saw, step by step: equal in the three runs.

`check(...)` returns the findings as a dict (tests/test_corpus.py asserts on
it); `main` prints one table line per workload and what failed.  Horovod's
own settings for the runs: HOROVOD_CYCLE_TIME as Horovod's default unless
given.  Run from anywhere: the installed package is used.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: Open MPI settings for runs on one machine (as tests/conftest.py)
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
}

#: workload -> extra arguments and environment (the corpus' defaults are small)
RUNS: dict[str, tuple[list[str], dict[str, str]]] = {
    "mlp6": ([], {}),
    "resnet50": (["--steps", "3", "--batch-size", "2", "--image-size", "32"], {}),
    "bert": (["--layers", "12"], {}),
    "lstm": ([], {}),
    "lstm-sad": ([], {}),
    "lstm-sparse": ([], {}),
    "fp16": ([], {}),
    "accum": ([], {}),
    "ops": ([], {}),
    "procset": ([], {}),
    "join": ([], {}),
    "adasum": ([], {}),
}

#: RESULT's expected key -> the record ops that carry it
RECORD_OPS = {
    "allreduce": ("allreduce",),
    "grouped_allreduce": ("allreduce",),
    "allgather": ("allgatherv",),
    "alltoall": ("alltoallv",),
    "reducescatter": ("reduce_scatter",),
}

COMMANDS = ("summarize", "advise", "check", "tensors", "tensors --whatif", "report", "compare")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HOROVOD_PROFILE") and k != "HOROVOD_FUSION_THRESHOLD"}
    env.update(MPI_ENV)
    env.update(extra)
    return env


def run_once(workload: str, args: list[str], out: Path | None, *, np: int = 2,
             env: dict[str, str] | None = None, timeout: float = 900) -> dict[str, Any]:
    """One mpirun of the workload; profiled into `out` unless None.  Returns
    the RESULT line's dict plus wall seconds and the job's stderr."""
    extra = dict(env or {})
    if out is not None:
        extra.update(HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(out))
    cmd = ["mpirun", "-n", str(np), sys.executable, "-m", "profiler.workloads.corpus",
           workload, *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=_env(**extra), capture_output=True, text=True,
                       timeout=timeout, cwd=str(out.parent) if out is not None else None)
    wall = time.monotonic() - t0
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n"
                           f"{p.stderr[-3000:]}")
    if out is not None and not (out / "trace.json").is_file():
        raise RuntimeError(f"{' '.join(cmd)}: no trace.json in {out}:\n{p.stderr[-3000:]}")
    res = json.loads(line[len("RESULT "):])
    res["wall_s"] = round(wall, 1)
    res["stderr"] = p.stderr
    return res


def per_step(prof: Path) -> Any:
    """Rank 0's data calls of Horovod's thread: calls and bytes per (step, op,
    comm_size), steps 0 and on."""
    import pandas as pd

    from profiler.postjob.classify import classify, is_horovod_row

    df = pd.read_parquet(prof / "ranks" / "rank-00000.parquet")
    kind = df["kind"].astype(str) if "kind" in df.columns else classify(df).astype(str)
    data = df[(kind == "data").to_numpy() & is_horovod_row(df)]
    data = data[data["step"] >= 0]
    return data.groupby(["step", "op", "comm_size"]).agg(
        calls=("bytes", "size"), bytes=("bytes", "sum")).reset_index()


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """A profiler command in this process: (status, stdout, stderr); an
    exception that escapes main is a traceback, reported as status -1."""
    from profiler.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = int(exc.code or 0)
        except BaseException:  # noqa: BLE001 - the traceback is the finding
            traceback.print_exc(file=err)
            rc = -1
    return rc, out.getvalue(), err.getvalue()


def commands(fused: Path, unfused: Path, scratch: Path) -> dict[str, dict[str, Any]]:
    """Every command on the fused run (compare: against the unfused)."""
    out: dict[str, dict[str, Any]] = {}
    for name in COMMANDS:
        argv = {"summarize": ["summarize", str(fused)], "advise": ["advise", str(fused)],
                "check": ["check", str(fused)], "tensors": ["tensors", str(fused)],
                "tensors --whatif": ["tensors", str(fused), "--whatif"],
                "report": ["report", str(fused), "-o", str(scratch / "report.html")],
                "compare": ["compare", str(fused / "trace.json"), str(unfused / "trace.json"),
                            "--labels", "fused,unfused"]}[name]
        t0 = time.monotonic()
        rc, so, se = _cli(argv)
        out[name] = {"rc": rc, "traceback": "Traceback" in se, "seconds":
                     round(time.monotonic() - t0, 2), "stderr": se[-2000:],
                     "stdout_head": so[:400]}
    return out


def _expected_rows(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    exp = dict(res["expected"])
    if res["workload"] == "adasum":  # the data go point to point; the dots by allreduce
        n = exp["allreduce"]["tensors"]
        exp = {"adasum_dots": {"tensors": n, "bytes": 24 * n}}
    return exp


def figures(prof: Path, res: dict[str, Any], fused: bool) -> dict[str, Any]:
    """Per expected operation: the steps checked and where they differ."""
    steps = per_step(prof)
    out: dict[str, Any] = {}
    world = res["size"]
    for key, want in _expected_rows(res).items():
        if key in ("join",):
            continue
        ops = RECORD_OPS.get(key, ("allreduce",))
        size = 1 if key == "single_set_allreduce" else world
        sel = steps[steps["op"].isin(ops) & (steps["comm_size"] == size)]
        by = sel.groupby("step")[["calls", "bytes"]].sum()
        n_steps = res["optimizer_steps"] - 1  # step -1 holds the first one
        if res["workload"] == "join":  # rank 0's own steps only
            n_steps = res["optimizer_steps"] - 1
        rows = []
        for step in range(n_steps):
            calls = int(by["calls"].get(step, 0))
            nbytes = int(by["bytes"].get(step, 0))
            if "bytes_by_step" in want:
                exp_b = want["bytes_by_step"][step + 1]
            else:
                exp_b = want["bytes"]
            n = want["tensors"]
            ok_calls = calls == n if not fused else 1 <= calls <= n
            rows.append({"step": step, "calls": calls, "bytes": nbytes, "expected_bytes": exp_b,
                         "ok": nbytes == exp_b and ok_calls})
        out[key] = {"tensors": want["tensors"], "steps": rows,
                    "calls_per_step": (sum(r["calls"] for r in rows) / len(rows)
                                       if rows else float("nan")),
                    "ok": all(r["ok"] for r in rows) and bool(rows)}
    return out


def lineage(prof: Path) -> dict[str, Any]:
    """The lineage written at exit: certainty per tensor operation, the
    timeline's agreement, the inference's time."""
    import pandas as pd

    meta = json.loads((prof / "trace.json").read_bytes())["horovod_profiler"]["lineage"]
    out: dict[str, Any] = {"status": meta.get("status"), "reason": meta.get("reason"),
                           "problems": meta.get("problems")}
    if (prof / "lineage.parquet").is_file():
        lin = pd.read_parquet(prof / "lineage.parquet")
        out["certainty"] = {str(k): int(v) for k, v in lin["certainty"].value_counts().items()}
        out["tensors"] = int(lin["tensor"].nunique())
        out["names"] = sorted(lin["tensor"].astype(str).unique())
    rec = meta.get("records") or {}
    out["seconds"] = rec.get("seconds")
    agree = meta.get("agreement")
    if agree:
        out["agreement"] = {k: agree.get(k) for k in ("calls", "equal", "ambiguous_ok", "wrong",
                                                      "missing", "ambiguous_shown_right")}
    return out


def check(workload: str, work: Path, *, args: list[str] | None = None, np: int = 2,
          timeline: bool = True, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The three runs of one workload in `work` and everything checked on them."""
    base_args, base_env = RUNS.get(workload, ([], {}))
    a = list(base_args) + list(args or [])
    e = {**base_env, **(env or {})}
    work.mkdir(parents=True, exist_ok=True)
    fused, unfused = work / "fused", work / "unfused"
    t0 = time.monotonic()
    r_f = run_once(workload, a, fused, np=np,
                   env={**e, **({"HOROVOD_PROFILE_TIMELINE": "1"} if timeline else {})})
    r_u = run_once(workload, a, unfused, np=np, env={**e, "HOROVOD_FUSION_THRESHOLD": "0"})
    r_n = run_once(workload, a, None, np=np, env=e)
    report: dict[str, Any] = {
        "workload": workload, "size": r_f["size"], "tensors": len(r_f["params"]),
        "parameters": r_f["parameters"], "params": r_f["params"], "expected": r_f["expected"],
        "runs_s": [r_f["wall_s"], r_u["wall_s"], r_n["wall_s"]],
        "losses": {"fused": r_f["losses"], "unfused": r_u["losses"],
                   "unprofiled": r_n["losses"]},
        "losses_equal": r_f["losses"] == r_u["losses"] == r_n["losses"],
        "job_stderr_traceback": any("Traceback" in r["stderr"] for r in (r_f, r_u, r_n)),
        "lineage_warnings": [x for r in (r_f, r_u) for x in r["stderr"].splitlines()
                             if "lineage" in x],
    }
    report["fused"] = figures(fused, r_f, True)
    report["unfused"] = figures(unfused, r_u, False)
    report["lineage"] = {"fused": lineage(fused), "unfused": lineage(unfused)}
    report["commands"] = commands(fused, unfused, work)
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["ok"] = problems(report) == []
    return report


def problems(report: dict[str, Any]) -> list[str]:
    """What failed in one workload's report, in words ([] when nothing)."""
    out = []
    for run in ("fused", "unfused"):
        for key, fig in report[run].items():
            if not fig["ok"]:
                out.append(f"{run} {key}: " + "; ".join(
                    f"step {r['step']} {r['calls']} calls {r['bytes']} B (want "
                    f"{r['expected_bytes']} B)" for r in fig["steps"] if not r["ok"])[:300])
        lin = report["lineage"][run]
        bad = {k: v for k, v in (lin.get("certainty") or {}).items()
               if k not in ("certain", "ambiguous")}
        if lin.get("status") != "ok" or bad:
            out.append(f"{run} lineage: {lin.get('status')} {bad} {lin.get('reason')}")
        if (lin.get("agreement") or {}).get("wrong"):
            out.append(f"{run} lineage contradicts the timeline: {lin['agreement']}")
    for name, c in report["commands"].items():
        if c["rc"] != 0 or c["traceback"]:
            out.append(f"{name}: exit {c['rc']}: {c['stderr'][-300:]}")
    if not report["losses_equal"]:
        out.append(f"losses differ: {report['losses']}")
    if report["job_stderr_traceback"]:
        out.append("a traceback in a job's stderr")
    return out


def line(report: dict[str, Any]) -> str:
    """One line for the table: tensors, calls/step fused/unfused, certainty."""
    def calls(run: str) -> str:
        return "/".join(f"{v['calls_per_step']:.1f}" for v in report[run].values())

    cert = report["lineage"]["fused"].get("certainty") or {}
    other = sum(v for k, v in cert.items() if k not in ("certain", "ambiguous"))
    agree = report["lineage"]["fused"].get("agreement") or {}
    return (f"{report['workload']:12s} tensors {report['tensors']:4d} params "
            f"{report['parameters']:>10,d}  calls/step fused {calls('fused'):>9s} "
            f"unfused {calls('unfused'):>9s}  lineage {cert.get('certain', 0)} certain "
            f"{cert.get('ambiguous', 0)} ambiguous {other} other, "
            f"timeline: {agree.get('equal', '-')} equal {agree.get('ambiguous_ok', '-')} "
            f"ambiguous {agree.get('wrong', '-')} wrong; inferred in "
            f"{report['lineage']['fused'].get('seconds')} s; losses "
            f"{'equal' if report['losses_equal'] else 'DIFFER'}; {report['seconds']} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workloads", nargs="*", help="default: every workload")
    p.add_argument("--work", default="/tmp/hvprof-corpus", help="scratch folder")
    p.add_argument("--json", help="write every report here")
    p.add_argument("--steps", type=int, help="optimizer steps (the workload's default)")
    p.add_argument("--np", type=int, default=2)
    a = p.parse_args(argv)
    names = a.workloads or list(RUNS)
    reports = []
    failed = 0
    for w in names:
        extra = ["--steps", str(a.steps)] if a.steps else []
        try:
            r = check(w, Path(a.work) / w, args=extra, np=a.np)
        except Exception as exc:  # one workload's failure is its line
            print(f"{w:12s} FAILED: {' '.join(str(exc).split())[:400]}", flush=True)
            failed += 1
            continue
        reports.append(r)
        print(line(r), flush=True)
        for why in problems(r):
            print(f"    problem: {why}", flush=True)
            failed += 1
    if a.json:
        Path(a.json).write_text(json.dumps(reports, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
