"""Build horovod-profiler: the C interposition library, the Python package, the
`profiler` console script and the start-up hook (horovod_profiler.pth)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
HOOKS = HERE / "hooks"
LIB_NAME = "libhvprof.so"
# Next to the library: the interpreter that builds trace.json when a program
# without Python (C, Fortran, under LD_PRELOAD) exits (hooks/exitmerge.c).
PYTHON_NAME = "libhvprof.python"
PTH_NAME = "horovod_profiler.pth"


# Strict: every warning of -Wall -Wextra is an error, none exempted.  The tests
# build the library with these same flags (tests/conftest.py reads them here).
# -fno-plt: calls into libmpi (PMPI_*) go through the GOT entry resolved at
# load, not through a PLT stub (one indirect jump less per wrapped call).
CFLAGS = [
    "-std=gnu11", "-O2", "-g", "-fPIC", "-shared", "-pthread",
    "-fvisibility=hidden", "-fno-plt", "-Wall", "-Wextra", "-Werror",
]


def find_mpicc() -> list[str]:
    """The MPI compiler wrapper: $MPICC, else mpicc on PATH."""
    cc = os.environ.get("MPICC") or shutil.which("mpicc")
    if not cc:
        raise SystemExit(
            "horovod-profiler: no MPI compiler wrapper found; set MPICC or install "
            "Open MPI (apt-get install libopenmpi-dev openmpi-bin)"
        )
    return shlex.split(cc)


def build_library(out_dir: Path) -> Path:
    """Compile hooks/*.c into one shared library with strict flags.

    HVPROF_NO_MPI=1 builds without MPI (a GPU machine with NCCL only): the
    MPI wrappers (and the MPI_T query) are left out and the plain C compiler ($CC, else cc) is used.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / LIB_NAME
    no_mpi = os.environ.get("HVPROF_NO_MPI", "") not in ("", "0")
    # mpi*.c: the PMPI wrappers (mpi_wrappers.c and mpi_fortran.c generated from
    # hooks/mpi_protos.py by scripts/gen_mpi_wrappers.py, committed); mpit.c: the
    # MPI_T interconnect query
    sources = sorted(str(p) for p in HOOKS.glob("*.c")
                     if not (no_mpi and p.name.startswith("mpi")))
    compiler = shlex.split(os.environ.get("CC") or "cc") if no_mpi else find_mpicc()
    cflags = CFLAGS
    extra = shlex.split(os.environ.get("HVPROF_CFLAGS", ""))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    cmd = [*compiler, *cflags, *extra, "-I", str(HOOKS), *sources,
           "-o", str(tmp), "-ldl", "-Wl,--no-undefined"]
    print("building", LIB_NAME, ":", " ".join(cmd))
    subprocess.run(cmd, check=True)
    return replace(tmp, target)


def replace(tmp: Path, target: Path) -> Path:
    """Move a built file onto its name atomically: a process that has the old
    library mapped (a job running from the editable checkout) keeps it intact;
    writing over it in place would change its code under it."""
    os.replace(tmp, target)
    return target


def record_python(lib_dir: Path, python: str | None = None) -> Path:
    """Write the interpreter's path (default: the one building, which pip runs
    with the target environment's Python) into libhvprof.python beside the
    library, for its exit merge."""
    import sys

    target = lib_dir / PYTHON_NAME
    target.write_text((python or sys.executable) + "\n")
    return target


def build_fastrec(out_dir: Path) -> Path:
    """profiler/_fastrec (profiler/_ext/fastrec*.c: the module, its Hook and
    StepHook, fastrec.h between them): a CPython extension the
    Python hooks call instead of ctypes (3.8 us -> ~0.1 us per tensor record).
    Plain cc, the same strict flags; not linked to libhvprof.so (dlsym)."""
    import sysconfig

    target = out_dir / ("_fastrec" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    cc = shlex.split(os.environ.get("CC") or "cc")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    sources = sorted(str(p) for p in (HERE / "profiler" / "_ext").glob("fastrec*.c"))
    cmd = [*cc, *CFLAGS, "-I", sysconfig_include(), *sources, "-o", str(tmp), "-ldl"]
    print("building _fastrec :", " ".join(cmd))
    subprocess.run(cmd, check=True)
    return replace(tmp, target)


def tensorflow_headers() -> tuple[Path, str] | None:
    """(TensorFlow's include directory, its version) when the building
    environment has TensorFlow, without importing it (seconds)."""
    import importlib.metadata as md
    import importlib.util

    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    include = Path(list(spec.submodule_search_locations)[0]) / "include"
    dists = md.packages_distributions().get("tensorflow") or []
    if not include.is_dir() or not dists:
        return None
    return include, md.version(dists[0])


TF_KERNELS_NAME = "libhvprof_tf.so"


def build_tf_kernels(out_dir: Path) -> Path | None:
    """hooks/tf/kernels.cc against the installed TensorFlow's headers
    (profiler.collect.tf_kernels); None without TensorFlow.  The headers are
    system headers (their own warnings are not ours); no TensorFlow library is
    linked: what the code calls of it, it looks up at run time.  Cached by
    source, flags and version (~/.cache/horovod-profiler/tf-kernels): the
    compile takes ~10 s, and the package is reinstalled often."""
    found = tensorflow_headers()
    if found is None:
        print("not building", TF_KERNELS_NAME, ": no TensorFlow in this environment")
        return None
    include, tf_version = found
    source = HOOKS / "tf" / "kernels.cc"
    cxx = shlex.split(os.environ.get("CXX") or "c++")
    cmd = [*cxx, "-std=c++17", "-O2", "-g", "-DNDEBUG", "-fPIC", "-shared", "-pthread",
           "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-Wall", "-Wextra", "-Werror",
           "-D_GLIBCXX_USE_CXX11_ABI=1", "-DEIGEN_MAX_ALIGN_BYTES=64",
           f'-DHVPROF_TF_VERSION="{tf_version}"', "-isystem", str(include), str(source),
           "-ldl", "-Wl,--no-undefined"]
    return cached_build(TF_KERNELS_NAME, f"for TensorFlow {tf_version}", source, cmd, out_dir,
                        "tf-kernels", "TensorFlow's tensors will not be recorded")


def build_cache(name: str) -> Path:
    """~/.cache/horovod-profiler/`name` (or under $XDG_CACHE_HOME)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "horovod-profiler" / name


def cached_build(name: str, what: str, source: Path, cmd: list[str], out_dir: Path,
                 cache_name: str, without: str) -> Path | None:
    """Compile `source` with `cmd` (+ -o) into out_dir/name, through a cache
    keyed by source and command (~/.cache/horovod-profiler/
    cache_name): these compiles take 10-20 s, and the package is reinstalled
    often.  Optional: a failed compile is a warning saying what the profiler
    then goes `without`, and None."""
    import hashlib

    key = hashlib.sha256(source.read_bytes() + " ".join(cmd[1:]).encode()).hexdigest()[:20]
    cache = build_cache(cache_name) / f"{key}.so"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / name
    if not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        print("building", name, what, ":", " ".join(cmd))
        try:
            subprocess.run([*cmd, "-o", str(tmp)], check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"warning: {name} not built ({exc}): {without}")
            tmp.unlink(missing_ok=True)
            return None
        os.replace(tmp, cache)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.copy(cache, tmp)
    return replace(tmp, target)


TORCH_FIELDS_NAME = "libhvprof_torch.so"


def torch_headers() -> tuple[Path, Path, str] | None:
    """(PyTorch's include directory, its lib directory, its version) when the
    building environment has PyTorch, without importing it."""
    import importlib.metadata as md
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    if not (root / "include" / "torch").is_dir() or not (root / "lib").is_dir():
        return None
    try:
        return root / "include", root / "lib", md.version("torch")
    except md.PackageNotFoundError:
        return None


def build_torch_fields(out_dir: Path) -> Path | None:
    """profiler/_ext/torch_fields.cc against the installed PyTorch's headers
    (the C tensor hook's field reads, profiler.collect.tensors); None without
    PyTorch.  Linked to c10 only, which PyTorch loads first."""
    found = torch_headers()
    if found is None:
        print("not building", TORCH_FIELDS_NAME, ": no PyTorch in this environment")
        return None
    include, lib, version = found
    source = HERE / "profiler" / "_ext" / "torch_fields.cc"
    cxx = shlex.split(os.environ.get("CXX") or "c++")

    def command(abi: str) -> list[str]:
        # no -g: PyTorch's headers would make it 5 MB
        return [*cxx, "-std=c++17", "-O2", "-DNDEBUG", "-fPIC", "-shared", "-pthread",
                "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-Wall", "-Wextra",
                "-Werror", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                f'-DHVPROF_TORCH_VERSION="{version}"', "-isystem", str(include),
                "-isystem", str(include / "torch" / "csrc" / "api" / "include"),
                "-isystem", sysconfig_include(), str(source), f"-L{lib}", "-lc10",
                f"-Wl,-rpath,{lib}"]

    return cached_build(TORCH_FIELDS_NAME, f"for PyTorch {version}", source,
                        command(torch_abi(version, include)), out_dir, "torch-fields",
                        "the C tensor hook reads tensors through Python")


def torch_abi(version: str, include: Path) -> str:
    """PyTorch's _GLIBCXX_USE_CXX11_ABI (fixed by its build): asked of PyTorch
    itself once per version and location (an import: seconds), then cached."""
    import hashlib

    cache = build_cache("torch-fields") / (hashlib.sha256(
        f"{version} {include}".encode()).hexdigest()[:20] + ".abi")
    if cache.is_file():
        return cache.read_text().strip()
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(int("
                              "torch.compiled_with_cxx11_abi()))"], check=True,
                             capture_output=True, text=True, timeout=300).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "1"  # every PyTorch wheel since 2.7; not cached
    flag = "1" if out.endswith("1") else "0"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(flag + "\n")
    return flag


def sysconfig_include() -> str:
    import sysconfig

    return str(sysconfig.get_paths()["include"])


class BuildPy(build_py):
    """The compiled parts go beside the Python: into the wheel's tree, or, for an
    editable install (`pip install -e .`, what scripts/setup.sh does), into the
    checkout itself, which then is the installed package (its _lib/ and
    _fastrec*.so are ignored by git).  An editable wheel carries no file of
    ours at the root of site-packages: scripts/setup.sh copies the start-up
    hook there."""

    def run(self) -> None:
        super().run()
        editable = bool(getattr(self, "editable_mode", False))
        root = HERE if editable else Path(self.build_lib)
        pkg = root / "profiler"
        build_library(pkg / "_lib")
        record_python(pkg / "_lib")
        build_fastrec(pkg)
        build_tf_kernels(pkg / "_lib")
        build_torch_fields(pkg / "_lib")
        if not editable:  # the start-up hook lands at the root of site-packages
            shutil.copy(HERE / "profiler" / PTH_NAME, root / PTH_NAME)


def version() -> str:
    ns: dict[str, str] = {}
    exec((HERE / "profiler" / "_version.py").read_text(), ns)
    return ns["__version__"]


setup(
    name="horovod-profiler",
    version=version(),
    description="Communication profiler for Horovod (MPI and NCCL) jobs",
    python_requires=">=3.9",
    packages=[
        "profiler", "profiler.cli", "profiler.analysis", "profiler.analysis.findings",
        "profiler.formats", "profiler.collect", "profiler.postjob",
        "profiler.bench", "profiler.workloads", "profiler.site",
    ],
    # profiler/analysis is a link to the top-level analysis/ (the user's layout):
    # `profiler.analysis` resolves the same in the checkout and in a wheel.
    package_data={"profiler": ["_lib/*.so", "_lib/*.python", "_fastrec*.so", "py.typed"],
                  "profiler.analysis": ["*.js"], "profiler.site": ["templates/*"]},
    include_package_data=False,
    install_requires=[
        "numpy", "pandas>=2", "pyarrow>=14", "orjson", "plotly>=5", "rich", "duckdb",
        "prometheus-client==0.26.0", "scipy>=1.15",
    ],
    extras_require={
        "mpi": ["mpi4py"],
        "gpu": ["cupy-cuda12x", "nvidia-ml-py"],
        "scale": ["dask[dataframe]", "distributed"],
        "test": ["pytest", "pytest-timeout", "nbclient", "nbformat", "ipykernel",
                 "nbmake", "ruff", "mypy", "hypothesis"],
    },
    entry_points={"console_scripts": ["profiler=profiler.cli:main"]},
    cmdclass={"build_py": BuildPy},
    zip_safe=False,
)
