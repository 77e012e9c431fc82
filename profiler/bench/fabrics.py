"""Traces for the interconnect comparison on emulated fabrics (notebook 01).

    python -m profiler.bench.fabrics OUT [--quick] [--fabrics shm,tcp,tcp-10gbit,tcp-1gbit]
    bash scripts/fabrics.sh OUT [--quick]            # the same

For each fabric of profiler.analysis.interconnect.FABRICS (shared memory on one
host; TCP over veth between 2 simulated hosts, unlimited, tbf 10 Gbit/s, tbf
1 Gbit/s) it runs, with 2 ranks:

- OUT/<fabric>/bench: `profiler bench --fabric <fabric>`, an MPI_Allreduce sweep
  (latency and bandwidth vs size, recorded as a trace);
- OUT/<fabric>/replay: `profiler bench --fabric <fabric> --sizes-from
  OUT/app/trace.json`, the application's data calls replayed exactly;

after profiling the application once (OUT/app: the bundled training benchmark,
profiler.workloads.train_bench, on 2 local ranks).  Then it prints, per fabric,
the fitted latency and bandwidth (profiler.analysis.model, the largest sizes'
region) and the application's communication per step predicted from the fit
and from the replay (profiler.analysis.interconnect.step_comm), and writes
OUT/fabrics.json (the same figures and the command).  Needs root (namespaces).

Full run: sizes 8 B..4 MiB (powers of two and one size between), 20 calls per
size, resnet8, one job at a time; about 5 minutes on 2 cores.  --quick (the
notebook's CI path): powers of two 8 B..64 KiB, 5 calls per size, the small
cnn model, the fabrics' jobs run concurrently (--jobs, default 4 with --quick):
its figures exercise the pipeline and are not for reading.  On simulated
hosts the ranks yield the CPU when idle (profiler.bench.run_bench_on_hosts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FULL: dict[str, Any] = {"sizes": "8:4M", "between": "1", "iters": "20", "warmup": "5",
        "app": ["--model", "resnet8", "--batch-size", "32", "--image-size", "32",
                "--num-warmup-batches", "3", "--num-batches-per-iter", "5",
                "--num-iters", "4"]}
QUICK: dict[str, Any] = {"sizes": "8:64K", "between": "0", "iters": "5", "warmup": "2",
         "app": ["--model", "cnn", "--batch-size", "16", "--num-warmup-batches", "1",
                 "--num-batches-per-iter", "2", "--num-iters", "3"]}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    for k in [k for k in env if k.startswith("HOROVOD_PROFILE")]:
        del env[k]
    return env


def _run(argv: Sequence[str], **extra: str) -> str:
    p = subprocess.run(list(argv), env={**_env(), **extra}, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"fabrics: {' '.join(argv[:8])} ... failed ({p.returncode}):\n"
                         f"{p.stdout[-1500:]}\n{p.stderr[-3000:]}")
    return p.stdout


def _cli(*args: str) -> str:
    return _run([sys.executable, "-P", "-m", "profiler.cli", *args])


def generate(out: Path, fabrics: Sequence[str], *, quick: bool, np: int = 2,
             app: Path | None = None, jobs: int | None = None,
             log: Any = sys.stderr) -> dict[str, Any]:
    """Profile the application (unless given) and run every fabric's sweep and
    replay into out (`jobs` fabrics at a time; default 4 with quick, else 1);
    returns the figures (also written to out/fabrics.json).  Traces already in
    out are kept."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from profiler.analysis.interconnect import FABRICS

    bad = [f for f in fabrics if f not in FABRICS]
    if bad:
        raise SystemExit(f"fabrics: unknown fabric {bad[0]!r} (choose from "
                         f"{', '.join(FABRICS)})")
    cfg = QUICK if quick else FULL
    width = jobs or (4 if quick else 1)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    load0 = [round(x, 2) for x in os.getloadavg()]

    def profile_app() -> Path:
        app_dir = out / "app"
        if not (app_dir / "trace.json").is_file():
            print(f"fabrics: profiling the application into {app_dir}", file=log, flush=True)
            _run(["mpirun", "-n", str(np), sys.executable, "-P", "-m",
                  "profiler.workloads.train_bench", *cfg["app"], "--quiet"],
                 HOROVOD_PROFILE="1", HOROVOD_PROFILE_DIR=str(app_dir.resolve()))
        return app_dir / "trace.json"

    def one(name: str, app_trace: Future[Path]) -> None:
        for kind in ("bench", "replay"):
            d = out / name / kind
            if (d / "trace.json").is_file():
                continue
            common = ["-o", str(d), "--np", str(np), "--fabric", name, "--timeout", "900"]
            if kind == "bench":
                print(f"fabrics: {name} bench ({FABRICS[name].label})", file=log, flush=True)
                _cli("bench", *common, "--collectives", "allreduce", "--sizes", cfg["sizes"],
                     "--between", cfg["between"], "--iters", cfg["iters"],
                     "--warmup", cfg["warmup"])
            else:
                src = app_trace.result()
                print(f"fabrics: {name} replay of {src}", file=log, flush=True)
                _cli("bench", *common, "--sizes-from", str(src), "--warmup", "1")

    with ThreadPoolExecutor(max_workers=width + 1) as pool:
        if app is None:
            app_f: Future[Path] = pool.submit(profile_app)
        else:
            app_f = Future()
            app_f.set_result(app)
        if width == 1:
            app_f.result()  # one job at a time: the application first, alone
        runner = ThreadPoolExecutor(max_workers=width)
        try:
            for f in [runner.submit(one, name, app_f) for name in fabrics]:
                f.result()
        finally:
            runner.shutdown(wait=True)
        app = app_f.result()
    doc = figures(out, fabrics, app)
    doc["load_average_at_start"] = load0  # 1, 5, 15 min: how busy the machine was
    doc["command"] = ("python -m profiler.bench.fabrics " + str(out)
                      + (" --quick" if quick else "") + " --fabrics " + ",".join(fabrics))
    doc["seconds"] = round(time.monotonic() - t0, 1)
    doc["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    (out / "fabrics.json").write_text(json.dumps(doc, indent=1))
    return doc


def figures(out: Path, fabrics: Sequence[str], app: Path) -> dict[str, Any]:
    """Per fabric: the fitted latency (the smallest sizes' region's alpha) and
    bandwidth (1/beta of the largest sizes' region that has one: a flat region,
    beta 0, has none) of MPI_Allreduce, and the application's communication per
    step predicted from the fit and replayed."""
    from profiler.analysis import load
    from profiler.analysis.interconnect import FABRICS, step_comm
    from profiler.analysis.model import fit_alpha_beta

    bench = load(*[out / f / "bench" / "trace.json" for f in fabrics], label=list(fabrics))
    replay = load(*[out / f / "replay" / "trace.json" for f in fabrics], label=list(fabrics))
    app_df = load(app)
    fit = fit_alpha_beta(bench)
    per_step = step_comm(app_df, bench, replay=replay).groupby("label", sort=False)[
        ["calls_per_step", "bytes_per_step", "predicted_ms_per_step",
         "replayed_ms_per_step"]].sum()
    rows = []
    for f in fabrics:
        regions = fit.loc[(fit["label"] == f) & (fit["op"] == "allreduce")].sort_values("region")
        rows.append({
            "fabric": f, "label": FABRICS[f].label,
            "latency_us": float(regions["alpha_us"].iloc[0]),
            "bandwidth_gbps": float(regions["bandwidth_gbps"].dropna().iloc[-1])
            if regions["bandwidth_gbps"].notna().any() else float("nan"),
            "regions": int(len(regions)),
            "calls_per_step": float(per_step.loc[f, "calls_per_step"]),
            "bytes_per_step": float(per_step.loc[f, "bytes_per_step"]),
            "predicted_ms_per_step": float(per_step.loc[f, "predicted_ms_per_step"]),
            "replayed_ms_per_step": float(per_step.loc[f, "replayed_ms_per_step"]),
        })
    return {"fabrics": rows, "app": str(app)}


def table(doc: dict[str, Any]) -> str:
    lines = [f"{'fabric':12}{'latency':>10}{'bandwidth':>11}{'comm/step':>11}"
             f"{'replayed':>10}",
             f"{'':12}{'(us)':>10}{'(GB/s)':>11}{'fit (ms)':>11}{'(ms)':>10}"]
    for r in doc["fabrics"]:
        lines.append(f"{r['fabric']:12}{r['latency_us']:>10.1f}{r['bandwidth_gbps']:>11.3f}"
                     f"{r['predicted_ms_per_step']:>11.2f}{r['replayed_ms_per_step']:>10.2f}")
    r0 = doc["fabrics"][0] if doc["fabrics"] else None
    if r0:
        lines.append(f"application: {r0['calls_per_step']:.0f} data calls, "
                     f"{r0['bytes_per_step'] / 2**20:.2f} MiB per step ({doc['app']})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m profiler.bench.fabrics",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="directory for the traces (OUT/<fabric>/bench, replay)")
    ap.add_argument("--quick", action="store_true", help="few sizes and calls (CI)")
    ap.add_argument("--fabrics", default="shm,tcp,tcp-10gbit,tcp-1gbit")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=None,
                    help="fabrics measured at once (default 4 with --quick, else 1)")
    ap.add_argument("--app", default=None, help="an application trace instead of profiling "
                                                "the bundled benchmark")
    a = ap.parse_args(argv)
    fabrics = [f.strip() for f in a.fabrics.split(",") if f.strip()]
    doc = generate(Path(a.out), fabrics, quick=a.quick, np=a.np,
                   app=Path(a.app) if a.app else None, jobs=a.jobs)
    print(table(doc))
    print(f"fabrics: {Path(a.out) / 'fabrics.json'} ({doc['seconds']:.0f} s; load average "
          f"{doc['load_average_at_start'][0]} at the start, "
          f"{doc['load_average_at_end'][0]} at the end)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
