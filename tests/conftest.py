"""Shared test helpers: real mpirun (Open MPI), the editable install, the venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def _use_the_installed_package() -> None:
    """The package is installed editable (scripts/dev-install.sh): the checkout's
    profiler/ is what every test and every rank imports, `python -m pytest` and
    the pytest script alike.  Its compiled parts are rebuilt here when their
    sources changed since the last build (scripts/src_hash.py)."""
    venv_python = ROOT / ".venv" / "bin" / "python"
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve() or not venv_python.exists():
        return  # not the project's environment: nothing of ours to refresh
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from src_hash import STAMP, src_hash
    finally:
        sys.path.pop(0)
    stamp = ROOT / STAMP
    if stamp.is_file() and stamp.read_text().strip() == src_hash(ROOT):
        return
    print("conftest: the compiled parts are older than their sources: "
          "scripts/dev-install.sh", file=sys.stderr)
    subprocess.run(["bash", str(ROOT / "scripts" / "dev-install.sh")], check=True)


_use_the_installed_package()

# Open MPI settings for tests in one place: root allowed (CI runs as root),
# oversubscription (2 ranks on a 2-core machine, more when needed), no
# hwloc binding, loopback only.
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
}


def mpirun_available() -> bool:
    return shutil.which("mpirun") is not None


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_PROFILE")}
    env.update(MPI_ENV)
    env.update(extra)
    return env


def mpirun(
    np: int,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 240,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run `mpirun -n np argv...` with the test MPI settings; env vars are passed to ranks."""
    full_env = base_env(**(env or {}))
    cmd = ["mpirun", "-n", str(np), *argv]
    proc = subprocess.run(
        cmd, env=full_env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"mpirun failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def profiler_cli(*args: str, cwd: Path | None = None, timeout: float = 120,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the `profiler` CLI as a subprocess of this interpreter (the installed
    package: never from the checkout's root, where `python -m` would pick up
    the source tree, which has no profiler.analysis)."""
    return subprocess.run(
        [PYTHON, "-P", "-m", "profiler.cli", *args], capture_output=True, text=True,
        cwd=cwd, timeout=timeout, env=base_env(**(env or {})),
    )


requires_mpi = pytest.mark.skipif(not mpirun_available(), reason="mpirun not installed")


def hooks_cflags() -> list[str]:
    """The C flags setup.py compiles hooks/*.c with (its CFLAGS list, read from the
    file without running it), so that libraries the tests build are as strict."""
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "CFLAGS" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no CFLAGS list")


def build_hooks(cc: str, extra: list[str], lib: Path) -> None:
    """hooks/*.c into lib with `cc`, setup.py's flags and `extra`: one compiler
    per source, as many at once as there are cores, then one link; a failure
    is an AssertionError with the compiler's message."""
    from concurrent.futures import ThreadPoolExecutor

    hooks = ROOT / "hooks"
    flags = [f for f in hooks_cflags() if f != "-shared"] + extra
    objs = lib.parent / f"{lib.name}.{os.getpid()}.o"
    objs.mkdir(parents=True, exist_ok=True)

    def run(cmd: list[str]) -> None:
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stderr}"

    def compile_one(src: Path) -> Path:
        obj = objs / f"{src.stem}.o"
        run([cc, *flags, "-I", str(hooks), "-c", str(src), "-o", str(obj)])
        return obj

    try:
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            built = list(pool.map(compile_one, sorted(hooks.glob("*.c"))))
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        run([cc, *flags, "-shared", *map(str, built), "-o", str(tmp), "-ldl"])
        tmp.replace(lib)
    finally:
        shutil.rmtree(objs, ignore_errors=True)


def mpich_library(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The profiler library built with MPICH's compiler wrapper and setup.py's
    flags, once per session (10 to 30 s on 2 cores), for every test module
    that runs MPICH jobs; the interpreter recorded beside it, as setup.py does."""
    lib = tmp_path_factory.getbasetemp() / "mpich-lib" / "libhvprof.so"
    if not lib.is_file():
        lib.parent.mkdir(exist_ok=True)
        (lib.parent / "libhvprof.python").write_text(sys.executable + "\n")
        build_hooks("mpicc.mpich", [], lib)
    return str(lib)


#: The full tier: tests of benchmark scripts and tests another test covers
#: on the same path, run with HVPROF_FULL=1 (README, "Two commands"), so that the
#: default run keeps within 25 minutes on 2 cores.
FULL = os.environ.get("HVPROF_FULL") == "1"


#: The quick tier (`bash scripts/test.sh --quick`, HVPROF_QUICK=1): the tests
#: that start no process.  A test that starts one (mpirun, the CLI, a compiler,
#: Chromium, a namespace, a forked worker) is skipped at that moment, so the
#: tier is defined by what a test does, with no list to keep up to date.
QUICK = os.environ.get("HVPROF_QUICK") == "1"
_QUICK_SKIP = "quick tier: starts a process (the default tier runs it)"


def _no_process(*args: object, **kwargs: object) -> None:
    pytest.skip(_QUICK_SKIP)


if QUICK:
    import multiprocessing.util

    subprocess.Popen.__init__ = _no_process  # type: ignore[assignment]
    os.fork = _no_process  # type: ignore[assignment]
    multiprocessing.util.spawnv_passfds = _no_process  # type: ignore[assignment]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if QUICK:
        away = pytest.mark.skip(reason=_QUICK_SKIP)
        for item in items:
            if item.get_closest_marker("processes") is not None:
                item.add_marker(away)
    if FULL:
        return
    skip = pytest.mark.skip(reason="full tier: HVPROF_FULL=1 bash scripts/test.sh")
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)


_SESSION_START = 0.0


def pytest_sessionstart(session: pytest.Session) -> None:
    global _SESSION_START
    import time
    _SESSION_START = time.time()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Open MPI's session folders (TMPDIR/ompi.HOST.UID/pid.N) of the jobs the
    tests killed (a hang, a timeout): mpirun removes its own only when it
    ends normally.  Only those made during this run whose mpirun is gone."""
    import tempfile
    for top in Path(tempfile.gettempdir()).glob("ompi.*"):
        for d in top.glob("pid.*"):
            try:
                pid = int(d.name[4:])
                if d.stat().st_mtime < _SESSION_START - 1:
                    continue
                os.kill(pid, 0)
            except ProcessLookupError:
                shutil.rmtree(d, ignore_errors=True)
            except (ValueError, OSError):
                continue
