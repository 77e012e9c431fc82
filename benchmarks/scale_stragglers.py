"""Late ranks at scale: `profiler synth` stragglers against what `profiler advise` names.

A real 2-rank Horovod job (tests/hvd_model_job.py under mpirun, synchronize and
tensor marks, HOROVOD_PROFILE_CPU=0) is the template, unless --template names
one.  For each size (--ranks, default 512 and 1024) the generator writes a job
with K stragglers (2 at 512, 3 at 1024, --stragglers) and a null twin with none,
both with about --steps steps; then `profiler advise DIR --format json` runs in
a fresh process, as a user runs it, and the script prints:

* the ranks named in significant late-rank findings against the injected set;
* each one's cost against the truth synth recorded (trace.json
  "synthetic.injected": the straggler's delays per step of the run), and the
  whole-job pass's figure beside it;
* the wall time and peak RSS of advise (and of synth), over --repeat runs
  (median and range; the machine may be shared: the load average is printed).

Exit status 1 when a named set differs from the injected one, a cost is off by
more than 25%, or a null names a rank.  Not a test: run it alone.

    .venv/bin/python benchmarks/scale_stragglers.py [--ranks 512,1024] [--steps 150]
        [--repeat 3] [--template DIR] [--max-rows N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_hwloc_base_binding_policy": "none",
    "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo",
}


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[str, float, float]:
    """Run a child: (stdout, wall s, its peak RSS in GB)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=tempfile.gettempdir())
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(cmd[:6])} failed:\n{err.read().decode()[-3000:]}")
        return out.read().decode(errors="replace"), wall, ru.ru_maxrss / 1024 / 1024


def template(d: Path) -> Path:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(MPI_ENV)
    env.update({"HOROVOD_PROFILE": "1", "HOROVOD_PROFILE_DIR": str(d),
                "HOROVOD_PROFILE_CPU": "0", "STEPS": "12"})
    run(["mpirun", "-n", "2", PY, str(ROOT / "tests" / "hvd_model_job.py")], env)
    return d / "trace.json"


def synth(src: Path, d: Path, ranks: int, stragglers: int, calls: int, seed: int,
          delay_us: float, share: float) -> float:
    _, wall, _ = run([PY, "-P", "-m", "profiler.cli", "synth", str(src), "-o", str(d),
                      "--ranks", str(ranks), "--calls-per-rank", str(calls), "--stragglers",
                      str(stragglers), "--straggler-delay-us", str(delay_us),
                      "--straggler-share", str(share), "--seed", str(seed), "--force", "-q"])
    return wall


def advise(d: Path, max_rows: int | None) -> tuple[dict, float, float]:
    cmd = [PY, "-P", "-m", "profiler.cli", "advise", str(d), "--format", "json"]
    if max_rows:
        cmd = [PY, "-P", "-c", "import json, sys; from profiler.analysis.findings import "
               "advise; print(json.dumps(advise(sys.argv[1], max_rows=int(sys.argv[2]))"
               ".to_dict(), default=str))", str(d), str(max_rows)]
    out, wall, rss = run(cmd)
    return json.loads(out), wall, rss


def judge(doc: dict, injected: dict, label: str) -> bool:
    late = [f for f in doc["findings"] if f["key"] == "late_ranks" and f["significant"]]
    named = sorted(int(f["numbers"]["rank"]) for f in late)
    want = sorted(int(r) for r in injected["by_straggler"])
    ok = named == want
    print(f"  {label}: {doc.get('ranks_analysed')} of {doc.get('ranks')} ranks analysed, "
          f"{doc.get('steps')} steps; named {named or 'none'}, injected {want or 'none'}"
          f" -> {'same' if ok else 'DIFFERENT'}")
    for f in late:
        r = str(f["numbers"]["rank"])
        truth = injected["by_straggler"].get(r, {}).get("delay_ns_per_step")
        whole = (f["numbers"].get("whole_job") or {}).get("gain_ms_per_step")
        if truth is None:
            print(f"    rank {r}: cost {f['cost_ms'] * 1e3:.1f} us/step, not injected")
            continue
        err = f["cost_ms"] / (truth / 1e6) - 1
        ok &= abs(err) <= 0.25
        lo, hi = f["cost_interval_ms"]
        print(f"    rank {r}: cost {f['cost_ms'] * 1e3:.1f} us/step [{lo * 1e3:.1f}, "
              f"{hi * 1e3:.1f}], truth {truth / 1e3:.1f} ({err:+.1%})"
              + (f"; whole-job pass {whole * 1e3:.1f}" if whole else ""))
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="512,1024")
    ap.add_argument("--stragglers", default="", help="per size, e.g. 2,3 (default 2 at "
                    "512 and fewer, 3 above)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--delay-us", type=float, default=None,
                    help="median straggler delay (default: a fifth of the template's "
                         "median step, which the template's machine sets)")
    ap.add_argument("--share", type=float, default=0.9)
    ap.add_argument("--max-rows", type=int, default=None,
                    help="advise's window (default: advise's own)")
    ap.add_argument("--template", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep the datasets here")
    args = ap.parse_args()
    from profiler.analysis import load_meta
    from profiler.synth import calls_for_steps, median_step_ns, read_template

    base = args.keep or Path(tempfile.mkdtemp(prefix="hvprof-stragglers-"))
    base.mkdir(parents=True, exist_ok=True)
    src = args.template or template(base / "template")
    tmpl = read_template(src)
    calls = calls_for_steps(tmpl, args.steps)
    if args.delay_us is None:
        args.delay_us = round(median_step_ns(tmpl) / 5 / 1e3, 1)
    sizes = [int(x) for x in args.ranks.split(",")]
    ks = ([int(x) for x in args.stragglers.split(",")] if args.stragglers
          else [2 if n <= 512 else 3 for n in sizes])
    print(f"template {src}; {calls} calls per rank (about {args.steps} steps); delay "
          f"{args.delay_us} us at {args.share:.0%} of the steps' collectives (template step "
          f"{median_step_ns(tmpl) / 1e6:.2f} ms); load avg {os.getloadavg()[0]:.1f}",
          flush=True)
    good = True
    try:
        for n, k in zip(sizes, ks):
            for kk, label in ((k, f"{n} ranks, {k} stragglers"), (0, f"{n} ranks, null")):
                d = base / f"r{n}-k{kk}"
                s_wall = synth(src, d, n, kk, calls, args.seed, args.delay_us, args.share)
                injected = load_meta(d)["synthetic"]["injected"]
                walls, rss = [], []
                doc: dict = {}
                for _ in range(args.repeat):
                    doc, w, r = advise(d, args.max_rows)
                    walls.append(w)
                    rss.append(r)
                print(f"{label}: synth {s_wall:.1f} s; advise median {statistics.median(walls):.1f}"
                      f" s (min {min(walls):.1f}, max {max(walls):.1f}, {len(walls)} runs), "
                      f"peak RSS {max(rss):.2f} GB; load avg {os.getloadavg()[0]:.1f}",
                      flush=True)
                good &= judge(doc, injected, label)
                if not args.keep:
                    shutil.rmtree(d, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print("all as injected" if good else "SOME FIGURES OFF")
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
