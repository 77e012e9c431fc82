"""scripts/setup.sh is idempotent and cheap once everything is present; the
pieces it promises (Open MPI, venv, requirements, cached Horovod wheel, the
package) are really there.  The heavy path (a fresh venv, the Horovod build)
is exercised by running the script on a fresh machine, not here."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

SETUP = ROOT / "scripts" / "setup.sh"
Run = tuple[subprocess.CompletedProcess[str], float]
REQS = ROOT / "requirements-dev.txt"


def _have_tf() -> bool:
    try:
        md.version("tensorflow-cpu")
        return True
    except md.PackageNotFoundError:
        return False


#: the venv has TensorFlow (the test command installs it): set-up then says so,
#: and the Horovod wheel's key names its version
HAVE_TF = _have_tf()


def run_setup(**env: str) -> Run:
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True,
                          timeout=900, env={**os.environ, **env})
    return proc, time.monotonic() - t0


@pytest.fixture(scope="module")
def second_run() -> Run:
    """Run set-up once (it may have work to do if the checkout changed since
    the last install), then again: the second run must find everything.  In a
    shared working tree another developer may change sources between the two
    runs (step 5 then reinstalls, rightly), so a run that did work is followed
    by at most two more; a script that is not idempotent never settles."""
    first, _ = run_setup()
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for _attempt in range(3):
        proc, elapsed = run_setup()
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        if "installing" not in proc.stdout:
            break
    return proc, elapsed


def test_second_run_does_nothing_heavy(second_run: Run) -> None:
    proc, elapsed = second_run
    out = proc.stdout
    steps = re.findall(r"^setup: \[(\d)/5\]", out, flags=re.M)
    assert steps == ["1", "2", "3", "4", "5"]
    present = re.findall(r"^setup:   present: ", out, flags=re.M)
    # one per step, the cached real NCCL library (unless it is skipped), and with
    # TensorFlow the Keras-backend patch of Horovod's callbacks
    nccl = os.environ.get("HVPROF_NO_REAL_NCCL") != "1"
    assert len(present) == 5 + nccl + HAVE_TF, out
    assert ("present: Horovod's Keras callbacks take tf.keras's backend" in out) == HAVE_TF, out
    # the lock step names the lock it checked: TensorFlow's when the venv has it
    assert ("every pin of requirements-tf.lock is installed" in out) == HAVE_TF, out
    assert ("every pin of requirements-dev.lock is installed" in out) != HAVE_TF, out
    assert ("libnccl.so.2" in out) == nccl, out
    for heavy in ("installing", "building", "apt-get", "creating"):
        assert heavy not in out, f"second run did {heavy!r}:\n{out}"
    assert elapsed < 30, f"second run took {elapsed:.1f} s"


def test_horovod_wheel_is_cached_under_its_key(second_run: Run) -> None:
    cache = Path(os.environ.get("HVPROF_WHEEL_CACHE",
                                Path.home() / ".cache" / "horovod-profiler" / "wheels"))
    abi = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    key = f"horovod-{md.version('horovod')}-gloo-{abi}-torch-{md.version('torch')}"
    if HAVE_TF:  # and TensorFlow's version: its extension links against TF's C++ ABI
        key += f"-tf-{md.version('tensorflow-cpu')}"
    wheels = list((cache / key).glob(f"horovod-{md.version('horovod')}-{abi}-*.whl"))
    assert len(wheels) == 1, f"no cached wheel under {cache / key}"
    assert (ROOT / ".venv" / ".hvprof-horovod").read_text().strip() == key
    assert f"horovod {md.version('horovod')} installed from cache key {key}" in second_run[0].stdout


def test_requirements_pin_what_the_build_needs() -> None:
    reqs = {ln.split("#")[0].strip() for ln in REQS.read_text().splitlines()}
    for needed in ("torch==2.13.0", "cmake<4", "mpi4py", "pytest-timeout", "hypothesis",
                   "dask[dataframe]>=2026.8.0", "distributed>=2026.8.0", "nvidia-ml-py",
                   "orjson", "pyarrow>=14"):
        assert needed in reqs, needed
    assert md.version("torch").startswith("2.13.0")
    assert int(md.version("cmake").split(".")[0]) < 4


#: each lock and the requirements files it is compiled from (scripts/lock.sh)
LOCKS = {"requirements-dev.lock": ["requirements-dev.txt"],
         "requirements-tf.lock": ["requirements-dev.txt", "requirements-tf.txt"]}


def _pins(lock: Path) -> dict[str, str]:
    """{canonical name: version} of a lock, each pin with at least one hash."""
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    name = None
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if m:
            assert name is None, f"{lock.name}: {name} has no --hash"
            name = canonicalize_name(m.group(1))
            pins[name] = m.group(2)
        elif name and line.strip().startswith("--hash=sha256:"):
            name = None
    assert name is None, f"{lock.name}: {name} has no --hash"
    return pins


def _requirements(files: list[str]) -> list[Any]:
    from packaging.requirements import Requirement

    return [Requirement(ln.split("#", 1)[0].strip()) for f in files
            for ln in (ROOT / f).read_text().splitlines() if ln.split("#", 1)[0].strip()]


def test_each_lock_satisfies_its_requirements() -> None:
    from packaging.utils import canonicalize_name

    for lock, files in LOCKS.items():
        pins = _pins(ROOT / lock)
        assert len(pins) > 50, lock
        for req in _requirements(files):
            name = canonicalize_name(req.name)
            assert name in pins, f"{lock} lacks {req.name} ({' '.join(files)} asks for it)"
            assert req.specifier.contains(pins[name], prereleases=True), \
                f"{lock}: {name}=={pins[name]} does not satisfy {req}"


def test_the_two_locks_agree() -> None:
    """Adding TensorFlow to a venv changes nothing that was there."""
    dev, tf = _pins(ROOT / "requirements-dev.lock"), _pins(ROOT / "requirements-tf.lock")
    assert {n: v for n, v in dev.items() if tf.get(n) != v} == {}
    assert {"tensorflow-cpu", "tf-keras"} <= set(tf) - set(dev)


def test_the_venv_is_the_lock() -> None:
    """What set-up installed is what the lock says (a hand-installed upgrade
    shows here, and set-up would put the pinned version back)."""
    from packaging.utils import canonicalize_name

    pins = _pins(ROOT / ("requirements-tf.lock" if HAVE_TF else "requirements-dev.lock"))
    have = {canonicalize_name(d.metadata["Name"]): d.version for d in md.distributions()}
    assert {n: (v, have.get(n)) for n, v in pins.items() if have.get(n) != v} == {}


def test_installed_pieces_work(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c",
         "import horovod.torch as hvd, profiler, profiler.collect.native as L; "
         "assert hvd.mpi_built() and hvd.gloo_built(); L.library_path(); "
         "print(profiler.__version__)"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == md.version("horovod-profiler")


def test_the_checkout_is_the_installed_package(tmp_path: Path) -> None:
    """Editable: from any folder, `profiler` is the checkout's, `profiler.analysis`
    its analysis/, and the start-up hook is in site-packages."""
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sysconfig, profiler, profiler.analysis as a; "
         "print(profiler.__file__); print(a.__file__); "
         "print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pkg, analysis, site = proc.stdout.split()
    assert Path(pkg) == ROOT / "profiler" / "__init__.py"
    assert Path(analysis).resolve() == ROOT / "analysis" / "__init__.py"
    assert (Path(site) / "horovod_profiler.pth").read_text() == \
        (ROOT / "profiler" / "horovod_profiler.pth").read_text()


def test_cxx17_patch_changes_exactly_that_statement(tmp_path: Path) -> None:
    cm = tmp_path / "CMakeLists.txt"
    before = ("cmake_minimum_required(VERSION 3.13)\n"
              "  set(CMAKE_CXX_STANDARD 14)\n"
              "set(CMAKE_CXX_STANDARD_REQUIRED ON)\n")
    cm.write_text(before)
    proc = subprocess.run(["bash", str(SETUP), "--patch-cxx17", str(cm)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert cm.read_text() == before.replace("STANDARD 14)", "STANDARD 17)")


def test_cxx17_patch_fails_loudly_when_the_pattern_is_missing(tmp_path: Path) -> None:
    cm = tmp_path / "CMakeLists.txt"
    cm.write_text("set(CMAKE_CXX_STANDARD 17)\n")
    proc = subprocess.run(["bash", str(SETUP), "--patch-cxx17", str(cm)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "pattern 'set(CMAKE_CXX_STANDARD 14)' not found" in proc.stderr
    assert proc.stderr.startswith("setup: error: ")


XLA_LINE = 'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")\n'


def test_no_xla_patch_drops_exactly_that_source(tmp_path: Path) -> None:
    cm = tmp_path / "CMakeLists.txt"
    keep = 'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/mpi_ops.cc")\n'
    cm.write_text(keep + XLA_LINE + "set_output_dir()\n")
    proc = subprocess.run(["bash", str(SETUP), "--patch-no-xla", str(cm)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert cm.read_text() == keep + "set_output_dir()\n"
    # a second time the line is gone: the patch says so rather than pass silently
    again = subprocess.run(["bash", str(SETUP), "--patch-no-xla", str(cm)],
                           capture_output=True, text=True, timeout=30)
    assert again.returncode != 0
    assert again.stderr.startswith("setup: error: ") and "xla_mpi_ops.cc not listed" in again.stderr


def test_scripts_are_valid_bash() -> None:
    for script in ("setup.sh", "test.sh", "main-job.sh", "lock.sh", "dev-install.sh"):
        proc = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, (script, proc.stderr)
    proc = subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
