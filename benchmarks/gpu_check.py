"""The GPU check of issue 5: NCCL interposition with device timing on a real GPU.

Run by benchmarks/gpu_check.sh (which builds the library and lays out the
package); by hand:

    python benchmarks/gpu_check.py --out OUT --lib path/to/libhvprof.so [--dry-run]

For each backend (cupy's NCCL with one rank, torch.distributed NCCL with one
process; --dry-run: the project's NCCL/CUDA stand-ins on the CPU) it runs a
worker process under LD_PRELOAD of the library with HOROVOD_PROFILE=1 and no
MPI.  The worker sweeps NCCL calls over message sizes, timing each call with
its own CUDA events on the call's stream.  Then `profiler merge` builds the
trace, and the check compares, exactly, the recorded calls and bytes with what
the worker issued, and the recorded device durations with the worker's own
event timings (per size, medians; pass within --tolerance where the call takes
at least --min-us, below which event resolution dominates).  Three more
worker runs measure the host time per NCCL call without the profiler, with
host records only (HOROVOD_PROFILE_NCCL_DEVICE=0) and with device timing.

NCCL's profiler-plugin path (issue 16), for torch.distributed (and the
stand-in in --dry-run), --paths: "wrappers" (LD_PRELOAD, NCCL_PROFILER_PLUGIN=
none: the symbol wrappers alone), "plugin" (no LD_PRELOAD: NCCL loads the
library through NCCL_PROFILER_PLUGIN, as a statically linked NCCL would; the
wrappers see nothing), "both" (each call must be recorded once): exact counts
and bytes each, device times against the workload's CUDA events where the
negotiated interface gives kernel timers (v4 on; older: reported, not judged),
the metadata's seen_by / recorded_by / interface version, the host time per
call with and without the plugin.  On a GPU (torch, --pair, the default) the
three paths run as two processes sharing GPU 0 (pair_env: NCCL reports a
one-rank communicator's calls to no plugin), and so does the host cost per
call; --no-pair runs them at one rank, as the stand-in does.

Writes to OUT: summary.txt, summary.json, <backend>-trace.json, topology.json.
Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STANDIN = ROOT / "tests" / "standin"
sys.path.insert(0, str(HERE))  # the workers, beside this script (also under python -P)

from gpu_check_workers import BACKENDS, _free_port, worker  # noqa: E402

GPU_SIZES = [8 * 4**k for k in range(14)] + [1 << 30, 1 << 31]  # 8 B .. 512 MiB, 1, 2 GiB
# Device-time agreement is judged for calls at least this long (us): the
# workload's own events add a constant (two event records on the same stream
# for cupy; torch's stream hops to and from its NCCL stream) that 5% covers
# only above these durations.  Every size is reported regardless.
MIN_US = {"cupy": 100.0, "torch": 300.0, "standin": 20.0}
DRY_SIZES = [8 * 4**k for k in range(11)]                     # 8 B .. 8 MiB
# Backends whose NCCL is checked through the profiler-plugin paths too (issue 16)
PLUGIN_BACKENDS = ("torch", "standin")
PLUGIN_MAX_BYTES = 512 << 20  # the plugin paths' sweeps stop here (time)
PAIR_MAX_BYTES = 64 << 20     # the two-process sweep stops here


# ---------------------------------------------------------------------------
# The orchestrator
# ---------------------------------------------------------------------------
class Report:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.checks: list[dict[str, Any]] = []

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        self.say(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}")


def build_standins(work: Path) -> Path:
    d = work / "standin-build"
    d.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "gcc")
    for src, name, extra in (("cudart_standin.c", "libcudart.so.12", []),
                             ("nccl_standin.c", "libnccl.so.2",
                              ["-DSTANDIN_PROFILER_V=7", "-ldl"])):
        subprocess.run([cc, "-O1", "-fPIC", "-shared", "-pthread", f"-Wl,-soname,{name}",
                        str(STANDIN / src), "-o", str(d / name), *extra], check=True)
    return d


def worker_env(work: Path, lib: Path | None, tag: str, path: str) -> dict[str, str]:
    """The environment of a worker: path "wrappers" (LD_PRELOAD, NCCL's plugin
    loading off), "plugin" (NCCL loads the library as its profiler plugin, no
    LD_PRELOAD: the wrappers see nothing, as with a static NCCL), "both"."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HOROVOD_PROFILE") and k != "NCCL_PROFILER_PLUGIN"}
    env.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PYTHONUNBUFFERED": "1"})
    env.pop("LD_PRELOAD", None)
    if lib is not None:
        env.update({"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(work / f"{tag}-profile")})
        if path in ("wrappers", "both"):
            env["LD_PRELOAD"] = str(lib)
        env["NCCL_PROFILER_PLUGIN"] = str(lib) if path in ("plugin", "both") else "none"
        if path == "plugin":  # the Python activation loads the library globally: no wrappers
            env["HOROVOD_PROFILE_NCCL_WRAPPERS"] = "0"
    return env


def run_worker(rep: Report, backend: str, mode: str, work: Path, lib: Path | None,
               args: argparse.Namespace, extra_env: dict[str, str], tag: str,
               path: str = "wrappers", sizes: list[int] | None = None) -> dict[str, Any]:
    result = work / f"{tag}.json"
    env = worker_env(work, lib, tag, path)
    env.update(extra_env)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", backend, "--mode", mode,
           "--sizes", ",".join(map(str, sizes or args.sizes)), "--iters", str(args.iters),
           "--warmup", str(args.warmup), "--calls", str(args.calls), "--rounds",
           str(args.rounds), "--result", str(result)]
    t = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        rep.say(f"worker {tag} failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                f"\n{proc.stderr[-3000:]}")
        raise RuntimeError(f"worker {tag} failed")
    res: dict[str, Any] = json.loads(result.read_text())
    res["wall_s"] = time.time() - t
    res["stderr"] = proc.stderr[-2000:]
    return res


def host_calls_with_device(df: Any) -> tuple[Any, Any]:
    """The host nccl rows and, per row, the device duration (us) of the call or
    of its group (NaN when it has none)."""
    import numpy as np

    nccl = df[df["backend"].astype(str) == "nccl"].sort_values("t_start_ns", kind="stable")
    host = nccl[~nccl["device"].astype(bool)].copy()
    dev = nccl[nccl["device"].astype(bool)]
    dmap = {(int(c), int(s), str(o)): float(d) / 1e3 for c, s, o, d in zip(
        dev["comm"], dev["seq"], dev["op"].astype(str), dev["dur_ns"])}
    out = []
    for c, s, o, g in zip(host["comm"], host["seq"], host["op"].astype(str), host["group"]):
        if int(g):
            gk = [k for k in dmap if k[2] == "nccl_group" and k[1] == int(g)]
            out.append(dmap[gk[0]] if gk else np.nan)
        else:
            out.append(dmap.get((int(c), int(s), o), np.nan))
    host["device_us"] = out
    return host, dev


def check_sweep(rep: Report, backend: str, res: dict[str, Any], work: Path, tag: str,
                args: argparse.Namespace, out_dir: Path, path: str = "wrappers",
                ranks: int = 1) -> dict[str, Any]:
    import numpy as np

    from profiler.analysis import load
    from profiler.formats import raw as rawfmt

    name = backend if path == "wrappers" else f"{backend}+{path}"
    if ranks > 1:
        name = f"{name}@{ranks}"

    prof = work / f"{tag}-profile"
    m = subprocess.run([sys.executable, "-m", "profiler.cli", "merge", str(prof)],
                       capture_output=True, text=True, timeout=300)
    rep.check(f"{name}: profiler merge", m.returncode == 0,
              (m.stderr or m.stdout).strip().splitlines()[-1] if (m.stderr or m.stdout) else "")
    trace = prof / "trace.json"
    if trace.is_file():
        # letters, digits, '.', '_' and '-' only: what a device call brings back
        safe = name.replace("+", "-").replace("@", "-x")
        shutil.copy(trace, out_dir / f"{safe}-trace.json")
    df = load(prof)
    sides = [rawfmt.read_sidecar(prof / "raw" / f"rank-{r:05d}.hvprof") for r in range(ranks)]
    st = res.get("profiler") or {}
    summary: dict[str, Any] = {"backend": backend, "path": path, "ranks": ranks,
                               "versions": res.get("versions"), "profiler": st,
                               "nccl_sidecars": sides, "sizes": []}
    # which path saw and recorded NCCL, as the metadata says
    plug = [(sd or {}).get("plugin") or {} for sd in sides]
    seen = [list((sd or {}).get("seen_by") or []) for sd in sides]
    by = [(sd or {}).get("recorded_by") for sd in sides]
    want = {"wrappers": (["wrappers"], "wrappers"), "plugin": (["plugin"], "plugin"),
            "both": (["wrappers", "plugin"], "wrappers")}[path]
    rep.check(f"{name}: metadata says which path saw NCCL",
              all(x == want[0] for x in seen) and all(b == want[1] for b in by),
              f"seen_by {seen}, recorded_by {by}, interface "
              f"{[q.get('interface_version') for q in plug]}, device time from "
              f"{[q.get('device_time') for q in plug]}")
    # the plugin path alone has device time only from NCCL's kernel-channel
    # timers (interface v4 on): judged where they came
    judge_device = path != "plugin" or all(int(q.get("device_records") or 0) > 0 for q in plug)
    if path == "plugin" and not judge_device and not args.dry_run:
        rep.check(f"{name}: kernel-channel timers gave device times", False,
                  f"interface {[q.get('interface_version') for q in plug]}, device records "
                  f"{[q.get('device_records') for q in plug]} (none: NCCL sent no KernelCh "
                  "event with timers, or the interface predates v4)")
    if path != "wrappers":
        rep.say(f"  plugin: events {[q.get('events') for q in plug]}, children "
                f"{[q.get('child_events') for q in plug]}, network aggregates "
                f"{[q.get('net_records') for q in plug]}, kernel-timer device records "
                f"{[q.get('device_records') for q in plug]}, silent in a wrapper "
                f"{[q.get('silent_in_wrapper') for q in plug]}")
    per_rank = []
    for r in range(ranks):
        h, _ = host_calls_with_device(df[df["rank"] == r])
        per_rank.append(h)
    host = per_rank[0]
    # every issued call recorded exactly once, with its bytes
    opname = {"allreduce": "nccl_allreduce", "allgather": "nccl_allgather"}
    ok_counts = True
    rows = []
    for s in res["sweep"]:
        op = opname[s["op"]]
        got = host[(host["op"].astype(str) == op) & (host["bytes"] == s["bytes"])]
        # torch may issue extra calls (none expected for these ops): count per (op, bytes)
        n_ok = len(got) == s["calls"]
        ok_counts &= n_ok
        app = np.asarray(s["app_us"][s["warmup"]:])
        prof_us = got["device_us"].to_numpy()[s["warmup"]:] if n_ok else np.array([np.nan])
        host_us = got["dur_ns"].to_numpy()[s["warmup"]:] / 1e3 if n_ok else np.array([np.nan])
        app_med = float(np.median(app))
        prof_med = float(np.nanmedian(prof_us)) if np.isfinite(prof_us).any() else float("nan")
        rel = prof_med / app_med - 1 if app_med > 0 else float("nan")
        rows.append({"op": s["op"], "bytes": s["bytes"], "calls_issued": s["calls"],
                     "calls_recorded": int(len(got)), "app_median_us": app_med,
                     "device_median_us": prof_med, "rel_diff": rel,
                     "gap_us": app_med - prof_med,
                     "host_enqueue_median_us": float(np.nanmedian(host_us)),
                     "device_missing": int(np.isnan(prof_us).sum())})
    summary["sizes"] = rows
    issued = sum(s["calls"] for s in res["sweep"])
    expect_bytes = sum(s["calls"] * s["bytes"] for s in res["sweep"])
    sweep_ops = {opname[s["op"]] for s in res["sweep"]}
    rec = host[host["op"].astype(str).isin(sweep_ops)]
    rep.check(f"{name}: calls recorded", ok_counts and len(rec) == issued,
              f"{len(rec)} host records for {issued} calls issued "
              f"({len(res['sweep'])} (op, size) points)")
    rep.check(f"{name}: bytes", int(rec["bytes"].sum()) == expect_bytes,
              f"{int(rec['bytes'].sum())} recorded, {expect_bytes} issued")
    for r in range(1, ranks):  # the other ranks: the same calls and bytes
        rr = per_rank[r][per_rank[r]["op"].astype(str).isin(sweep_ops)]
        rep.check(f"{name}: rank {r} calls and bytes", len(rr) == issued
                  and int(rr["bytes"].sum()) == expect_bytes,
                  f"{len(rr)} host records, {int(rr['bytes'].sum())} bytes")
    missing = int(np.isnan(rec["device_us"].to_numpy()).sum()) if len(rec) else -1
    min_us = args.min_us if args.min_us is not None else MIN_US.get(backend, 20.0)
    judged = [r for r in rows if r["app_median_us"] >= min_us]
    worst = max((abs(r["rel_diff"]) for r in judged), default=float("nan"))
    ok = bool(judged) and all(abs(r["rel_diff"]) <= args.tolerance for r in judged)
    if judge_device:
        rep.check(f"{name}: device time for every call", missing == 0,
                  f"{missing} calls without a device interval; misses {st.get('miss')}, "
                  f"unfinished {res.get('unfinished')}")
        rep.check(f"{name}: device time vs the workload's CUDA events", ok,
                  f"{len(judged)} sizes >= {min_us:g} us judged, worst |diff| "
                  f"{100 * worst:.2f}% (tolerance {100 * args.tolerance:g}%)")
    else:
        rep.say(f"  [SKIP] {name}: device time: no kernel-channel timer came ({missing} "
                "calls without one; the stand-in raises none without STANDIN_NCCL_PROXY=1): "
                "not judged")
    rep.check(f"{name}: no CUDA error left to the application", res.get("last_error") == 0,
              f"cudaGetLastError = {res.get('last_error')}")
    if "standin_syncs" in res:
        rep.check(f"{name}: no synchronization by the profiler",
                  res["standin_syncs"] == res["app_syncs"],
                  f"{res['standin_syncs']} synchronizations, all {res['app_syncs']} the "
                  "application's own")
    rep.say(f"  {'op':9} {'bytes':>11} {'calls':>6} {'app us':>10} {'device us':>10} "
            f"{'diff':>7} {'gap us':>7} {'enqueue us':>10}")
    for r in rows:
        rep.say(f"  {r['op']:9} {r['bytes']:>11} {r['calls_recorded']:>6} "
                f"{r['app_median_us']:>10.2f} {r['device_median_us']:>10.2f} "
                f"{100 * r['rel_diff']:>6.2f}% {r['gap_us']:>7.2f} "
                f"{r['host_enqueue_median_us']:>10.2f}")
    if st:
        rep.say(f"  anchor error <= {st.get('anchor_err_ns_max', 0) / 1e3:.2f} us, "
                f"{st.get('anchors')} anchors, collected {st.get('collected')}, "
                f"helper thread {st.get('helper_thread')}, runtime {st.get('cuda_runtime')}")
    return summary


#: The host-cost configurations: key -> (profiled, NCCL path, extra environment).
OVERHEAD_CONFIGS: dict[str, tuple[bool, str, dict[str, str]]] = {
    "none": (False, "wrappers", {}),
    "host": (True, "wrappers", {"HOROVOD_PROFILE_NCCL_DEVICE": "0"}),
    "device": (True, "wrappers", {}),
    # NCCL's plugin path alone (no LD_PRELOAD): with its proxy / kernel
    # events, and with calls only
    "plugin": (True, "plugin", {}),
    "plugin_calls_only": (True, "plugin", {"HOROVOD_PROFILE_NCCL_PROXY": "0"}),
}


def overhead(rep: Report, backend: str, work: Path, lib: Path, args: argparse.Namespace,
             ranks: int = 1) -> dict[str, Any] | None:
    """The host time per NCCL call of 8 bytes in each OVERHEAD_CONFIGS
    configuration, at one rank or (ranks=2) two processes on GPU 0 (rank 0's
    rounds); the plugin configurations only where the plugin sees calls (a
    plugin backend, and not a one-rank communicator on a GPU).  None when a
    pair did not run."""
    keys = ["none", "host", "device"]
    if backend in PLUGIN_BACKENDS and "plugin" in args.paths and (
            ranks > 1 or args.dry_run or not args.pair):
        keys += ["plugin", "plugin_calls_only"]
    runs: dict[str, list[float]] = {}
    for key in keys:
        profiled, path, extra = OVERHEAD_CONFIGS[key]
        lb = lib if profiled else None
        if ranks > 1:
            got = run_pair(rep, backend, work, lb, args, [8], f"{backend}-ovh2-{key}",
                           path=path, mode="overhead", extra_env=extra)
            if got is None:
                return None
            runs[key] = got[0]["host_us_per_call"]
        else:
            runs[key] = run_worker(rep, backend, "overhead", work, lb, args, extra,
                                   f"{backend}-ovh-{key}", path=path)["host_us_per_call"]
    med = {k: statistics.median(v) for k, v in runs.items()}
    n = med["none"]
    at = f", {ranks} ranks, rank 0" if ranks > 1 else ""
    rep.say(f"  host time per NCCL call ({args.calls} x {args.rounds} calls of 8 bytes{at}, "
            f"median of rounds): no profiler {n:.2f} us, host records "
            f"{med['host']:.2f} us (+{med['host'] - n:.2f}), with device timing "
            f"{med['device']:.2f} us (+{med['device'] - n:.2f})")
    if "plugin" in med:
        rep.say(f"  plugin path alone: {med['plugin']:.2f} us (+{med['plugin'] - n:.2f}) with "
                f"proxy/kernel events, {med['plugin_calls_only']:.2f} us "
                f"(+{med['plugin_calls_only'] - n:.2f}) calls only")
    out = {"us_per_call": med, "rounds": runs,
           "added_host_only_us": med["host"] - n, "added_with_device_us": med["device"] - n}
    if "plugin" in med:
        out["added_plugin_us"] = med["plugin"] - n
        out["added_plugin_calls_only_us"] = med["plugin_calls_only"] - n
    return out


def pair_env(work: Path, lib: Path | None, tag: str, path: str, rank: int,
             port: str) -> dict[str, str]:
    """A worker's environment as rank `rank` of 2 sharing GPU 0.  NCCL refuses
    two ranks on one GPU of one host ("Duplicate GPU detected"): a host id of
    its own per process (NCCL_HOSTID) makes them two hosts to NCCL, joined by
    its socket transport over loopback, so that a one-GPU machine runs real
    two-rank communicators (a one-rank one reports nothing to the plugin)."""
    env = worker_env(work, lib, tag, path)
    env.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                "GPU_CHECK_PORT": port, "NCCL_HOSTID": f"gpu-check-host-{rank}",
                "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "WARN"})
    return env


def run_pair(rep: Report, backend: str, work: Path, lib: Path | None,
             args: argparse.Namespace, sizes: list[int], tag: str, path: str = "plugin",
             mode: str = "sweep", extra_env: dict[str, str] | None = None,
             ) -> list[dict[str, Any]] | None:
    """Two worker processes sharing GPU 0 (world 2) on `path`; None, said
    with both processes' output, where they did not run."""
    port = str(_free_port())
    procs = []
    for r in (0, 1):
        env = pair_env(work, lib, tag, path, r, port)
        env.update(extra_env or {})
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", backend, "--mode",
               mode, "--sizes", ",".join(map(str, sizes)), "--iters", str(args.iters),
               "--warmup", str(args.warmup), "--calls", str(args.calls), "--rounds",
               str(args.rounds), "--result", str(work / f"{tag}-{r}.json")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    deadline = time.monotonic() + args.pair_timeout  # one limit for the pair
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outs.append((p.returncode, out or ""))
    if any(rc != 0 for rc, _ in outs):
        rep.say(f"  [SKIP] {tag}: two processes on one GPU did not run:")
        for r, (rc, o) in enumerate(outs):
            rep.say(f"    rank {r} (status {rc}): ...{o.strip()[-1200:]}")
        return None
    return [json.loads((work / f"{tag}-{r}.json").read_text()) for r in (0, 1)]


def available(name: str) -> str | None:
    """None when the backend can run here, else why not."""
    probe = {"cupy": "import cupy, cupy.cuda.nccl as n; assert n.available; "
                     "assert cupy.cuda.runtime.getDeviceCount() > 0",
             "torch": "import torch, torch.distributed as d; assert torch.cuda.is_available(); "
                      "assert d.is_nccl_available()"}[name]
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       timeout=300)
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1]


def pair_paths(rep: Report, b: str, work: Path, lib: Path, args: argparse.Namespace,
               out_dir: Path, results: dict[str, Any]) -> None:
    """Each NCCL path (wrappers, plugin, both) with two processes on GPU 0,
    then the host cost per call at world 2."""
    sizes = [x for x in args.sizes if x <= PAIR_MAX_BYTES]
    for path in args.paths:
        tag = f"{b}-pair-{path}-sweep"
        rep.say(f"\n== {b}+{path}@2 (2 processes on GPU 0, NCCL's socket transport)")
        try:
            got = run_pair(rep, b, work, lib, args, sizes, tag, path=path)
            if got is None:
                rep.check(f"{b}+{path}@2: ran", False, "the two processes did not run")
                continue
            rep.say(f"  versions {got[0].get('versions')}")
            summ = check_sweep(rep, b, got[0], work, tag, args, out_dir, path=path, ranks=2)
            summ["profile_dir"] = str(work / f"{tag}-profile")
            results["backends"][f"{b}+{path}@2"] = summ
        except Exception as exc:
            rep.check(f"{b}+{path}@2: ran", False, f"{type(exc).__name__}: {exc}")
    rep.say(f"\n== {b}: host cost per call at 2 ranks")
    try:
        ovh = overhead(rep, b, work, lib, args, ranks=2)
        if ovh is not None:
            results["backends"].setdefault(f"{b}+wrappers@2", {})["overhead"] = ovh
    except Exception as exc:
        rep.check(f"{b}: overhead at 2 ranks", False, f"{type(exc).__name__}: {exc}")


def alternate_overhead(rep: Report, b: str, work: Path, lib: Path, args: argparse.Namespace,
                       results: dict[str, Any]) -> None:
    """The host time per call at 2 ranks without the profiler and with its
    device timing, in `args.alternate` alternating pairs of runs (ABBA...):
    one pair of runs each cannot tell the profiler's cost from a transport
    whose per-call time varies from one process pair to the next."""
    got: dict[str, list[float]] = {"none": [], "device": []}
    order = [k for i in range(args.alternate)
             for k in (("none", "device") if i % 2 == 0 else ("device", "none"))]
    for i, key in enumerate(order):
        r = run_pair(rep, b, work, lib if key == "device" else None, args, [8],
                     f"{b}-alt{i}-{key}", path="wrappers", mode="overhead")
        if r is None:
            rep.check(f"{b}: alternating overhead", False, f"run {i} ({key}) did not run")
            return
        m = [statistics.median(x["host_us_per_call"]) for x in r]
        got[key].append(m[0])
        rep.say(f"  run {i:2d} {key:6}: {m[0]:9.2f} us per call (rank 1 {m[1]:9.2f})")
    for key, v in got.items():
        rep.say(f"  {key:6}: median {statistics.median(v):9.2f} us, runs "
                + ", ".join(f"{x:.2f}" for x in v))
    results["alternate"] = got


def orchestrate(args: argparse.Namespace) -> int:
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve() if args.work else out_dir.parent / "gpu-check-work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    lib = Path(args.lib).resolve()
    rep = Report()
    t0 = time.time()
    from profiler.analysis import gpu
    from profiler.collect import nvml

    topo = nvml.topology()
    (out_dir / "topology.json").write_text(json.dumps(topo, indent=1))
    rep.say(f"GPU check ({'dry run: stand-ins on the CPU' if args.dry_run else 'real GPU'}), "
            f"library {lib}")
    for line in gpu.topology_lines(topo, socket.gethostname()) or ["no GPU visible to NVML"]:
        rep.say(line)
    if args.dry_run:
        os.environ["GPU_CHECK_STANDIN_DIR"] = str(build_standins(work))
        backends = ["standin"]
    else:
        backends = []
        for b in args.backends.split(","):
            why = available(b)
            if why:
                rep.check(f"{b}: available", False, why)
            else:
                backends.append(b)
    results: dict[str, Any] = {"dry_run": args.dry_run, "sizes": args.sizes,
                               "iters": args.iters, "warmup": args.warmup, "backends": {},
                               "topology": topo}
    if args.alternate:
        alternate_overhead(rep, backends[0] if backends else "standin", work, lib, args,
                           results)
        backends = []
    for b in backends:
        rep.say(f"\n== {b}")
        try:
            res = run_worker(rep, b, "sweep", work, lib, args, {}, f"{b}-sweep")
            rep.say(f"  worker: {res['wall_s']:.1f} s, versions {res.get('versions')}")
            summ = check_sweep(rep, b, res, work, f"{b}-sweep", args, out_dir)
            summ["overhead"] = overhead(rep, b, work, lib, args)
            summ["profile_dir"] = str(work / f"{b}-sweep-profile")
            results["backends"][b] = summ
        except Exception as exc:  # report and go on with the next backend
            rep.check(f"{b}: ran", False, f"{type(exc).__name__}: {exc}")
        if b not in PLUGIN_BACKENDS:
            continue
        if args.pair and b == "torch":
            # NCCL runs a one-rank communicator's collectives as a local copy
            # and reports them to no plugin: every path at world 2 instead
            pair_paths(rep, b, work, lib, args, out_dir, results)
            continue
        small = [x for x in args.sizes if x <= PLUGIN_MAX_BYTES]
        for path in [x for x in args.paths if x != "wrappers"]:
            name, tag = f"{b}+{path}", f"{b}-{path}-sweep"
            rep.say(f"\n== {name}")
            try:
                res = run_worker(rep, b, "sweep", work, lib, args, {}, tag, path=path,
                                 sizes=small)
                rep.say(f"  worker: {res['wall_s']:.1f} s, versions {res.get('versions')}")
                summ = check_sweep(rep, b, res, work, tag, args, out_dir, path=path)
                summ["profile_dir"] = str(work / f"{tag}-profile")
                results["backends"][name] = summ
            except Exception as exc:
                rep.check(f"{name}: ran", False, f"{type(exc).__name__}: {exc}")
    ok = all(c["ok"] for c in rep.checks) and (
        bool(rep.checks) and bool(results["backends"]) or "alternate" in results)
    rep.say(f"\n{'ALL CHECKS PASSED' if ok else 'SOME CHECKS FAILED'} "
            f"({sum(c['ok'] for c in rep.checks)}/{len(rep.checks)}) in {time.time() - t0:.0f} s")
    for b, summ in results["backends"].items():
        if args.dry_run and "+" in b:
            continue  # the stand-in's plugin paths: their checks are enough (time)
        prof = Path(summ["profile_dir"])
        if (prof / "trace.json").is_file():
            s = subprocess.run([sys.executable, "-m", "profiler.cli", "summarize", str(prof)],
                               capture_output=True, text=True, timeout=300)
            rep.say(f"\n$ profiler summarize {b}-sweep-profile\n{s.stdout}{s.stderr}")
    results["checks"] = rep.checks
    results["ok"] = ok
    (out_dir / "summary.json").write_text(json.dumps(_finite(results), indent=1, default=str))
    (out_dir / "summary.txt").write_text("\n".join(rep.lines) + "\n")
    return 0 if ok else 1


def _finite(x: Any) -> Any:
    """NaN / inf as null: summary.json stays strict JSON (a size without a
    device time has NaN medians)."""
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    ap.add_argument("--work", default=None, help="scratch directory (default: beside --out)")
    ap.add_argument("--lib", default=os.environ.get("HVPROF_LIB", ""))
    ap.add_argument("--dry-run", action="store_true", help="stand-ins on the CPU, no GPU")
    ap.add_argument("--backends", default="cupy,torch")
    ap.add_argument("--sizes", default=None, help="comma-separated bytes")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000, help="calls per overhead round")
    ap.add_argument("--rounds", type=int, default=7, help="overhead rounds")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--min-us", type=float, default=None,
                    help="judge device-time agreement for calls at least this long "
                         "(default per backend: cupy 100, torch 300)")
    ap.add_argument("--timeout", type=float, default=240.0, help="per worker, seconds")
    ap.add_argument("--paths", default="wrappers,plugin,both",
                    help="NCCL paths checked for torch (and the stand-in): wrappers, plugin, both")
    ap.add_argument("--pair-timeout", type=float, default=90.0,
                    help="the two-process check's limit, seconds (NCCL may refuse or stall)")
    ap.add_argument("--no-pair", dest="pair", action="store_false",
                    help="the NCCL paths at one rank instead of two processes on GPU 0")
    ap.add_argument("--alternate", type=int, default=0, metavar="K",
                    help="only the host cost per call at 2 ranks, without the profiler and "
                         "with device timing, in K alternating pairs of runs")
    ap.add_argument("--worker", choices=sorted(BACKENDS), help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("sweep", "overhead"), default="sweep",
                    help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    args.paths = [x for x in args.paths.split(",") if x]
    if args.sizes is None:
        args.sizes = DRY_SIZES if args.dry_run else GPU_SIZES
    elif isinstance(args.sizes, str):
        args.sizes = [int(s) for s in args.sizes.split(",")]
    if not args.lib:
        ap.error("--lib (or HVPROF_LIB) is required")
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
