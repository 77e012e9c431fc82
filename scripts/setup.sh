#!/usr/bin/env bash
# Set up horovod-profiler for development, tests and the main job.
#
# Idempotent and safe to run twice (or concurrently: a lock serializes runs).
# Every step first checks whether its result is already present and says so;
# a second run on a set-up machine does nothing heavy and takes seconds.
#
#   1. Open MPI (Debian packages openmpi-bin, libopenmpi-dev) when mpicc or
#      mpirun is missing.
#   2. A Python virtual environment at .venv in the checkout.
#   3. The Python dependencies, at the exact versions and hashes of
#      requirements-dev.lock (requirements-tf.lock with TensorFlow), which
#      scripts/lock.sh compiles from requirements-dev.txt (and -tf.txt):
#      torch 2.13.0+cpu, cmake<4, the analysis stack, test tools.
#   4. Horovod, built from its source package into a wheel cache outside the
#      checkout (once: it takes minutes), then installed from that cache.
#      With TensorFlow too when HVPROF_WITH_TENSORFLOW=1 (requirements-tf.lock;
#      the test command sets it) or when the venv already has TensorFlow.
#   5. horovod-profiler itself (compiles hooks/*.c through setup.py).
#   +  NCCL's own libnccl.so.2 (nvidia-nccl-cu12, a 350 MB wheel: about 6 s
#      to download here), cached outside the checkout once, for the check
#      that the profiler exports every ncclProfiler_vN that NCCL looks for
#      (tests/test_nccl_plugin.py).  HVPROF_NO_REAL_NCCL=1 skips it (the
#      check is then skipped); a failed download only says so.
#
# Environment knobs:
#   HVPROF_HOROVOD_VERSION  Horovod release to build (default 0.28.1)
#   HVPROF_WHEEL_CACHE      wheel cache (default ~/.cache/horovod-profiler/wheels)
#   HVPROF_PYTHON           interpreter for a new venv (default python3.11, python3)
#   HVPROF_BUILD_JOBS       parallel compile jobs for the Horovod build (default 2)
#   HVPROF_NO_UV            1: install the lock with pip instead of uv
#   HVPROF_WITH_TENSORFLOW  1: install TensorFlow (requirements-tf.lock) and build
#                           Horovod's TensorFlow/Keras support (about 3 more minutes once)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

HOROVOD_VERSION=${HVPROF_HOROVOD_VERSION:-0.28.1}
CACHE_ROOT=${HOME}/.cache/horovod-profiler
WHEEL_CACHE=${HVPROF_WHEEL_CACHE:-$CACHE_ROOT/wheels}
VENV=$ROOT/.venv
PY=$VENV/bin/python
T0=$(date +%s)

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# Horovod 0.28.1 forces C++14 for its torch extension; torch >= 2.1 headers
# need C++17 (fixed upstream after the release).  Change that one statement,
# and fail loudly when it is not there (another Horovod: review the fix).
patch_cxx17() {
    local cm=$1
    [ -f "$cm" ] || die "$cm: no such file"
    grep -Eq '^[[:space:]]*set\(CMAKE_CXX_STANDARD 14\)' "$cm" \
        || die "$cm: pattern 'set(CMAKE_CXX_STANDARD 14)' not found: the C++17 fix needs review for Horovod $HOROVOD_VERSION"
    sed -i -E 's/^([[:space:]]*)set\(CMAKE_CXX_STANDARD 14\)/\1set(CMAKE_CXX_STANDARD 17)/' "$cm"
    if grep -Eq 'set\(CMAKE_CXX_STANDARD 14\)' "$cm" || ! grep -Eq 'set\(CMAKE_CXX_STANDARD 17\)' "$cm"; then
        die "$cm: the C++17 patch did not apply"
    fi
}

# Horovod 0.28.1 compiles xla_mpi_ops.cc into its TensorFlow extension; all
# of it but its includes is GPU-only (HAVE_GPU), and TensorFlow >= 2.16 wheels
# lack headers those includes need (highwayhash).  A CPU build drops the file
# from the sources, and fails loudly when the line is not there.
patch_no_xla() {
    local cm=$1
    [ -f "$cm" ] || die "$cm: no such file"
    grep -q 'horovod/tensorflow/xla_mpi_ops.cc' "$cm" \
        || die "$cm: xla_mpi_ops.cc not listed: the CPU-build patch needs review for Horovod $HOROVOD_VERSION"
    sed -i '/horovod\/tensorflow\/xla_mpi_ops.cc/d' "$cm"
    ! grep -q 'xla_mpi_ops.cc' "$cm" || die "$cm: the xla_mpi_ops.cc patch did not apply"
}

# Gloo (third_party/gloo) compiles as C++14 in Horovod 0.28.1, while the torch
# extension, once C++17, defines Gloo's `static constexpr` members inline in its
# own objects: the link then fails with "multiple definition of
# gloo::rendezvous::Store::kDefaultTimeout".  Compile Gloo as C++17 too, as
# Horovod already does for its TensorFlow copy (compatible17_gloo), and fail
# loudly when the flag is not there.
patch_gloo_cxx17() {
    local cm=$1
    [ -f "$cm" ] || die "$cm: no such file"
    grep -q -- '-std=c++11' "$cm" \
        || die "$cm: '-std=c++11' not found: the Gloo C++17 patch needs review for Horovod $HOROVOD_VERSION"
    sed -i 's/-std=c++11/-std=c++17/g' "$cm"
    sed -i '1i set(CMAKE_CXX_STANDARD 17)' "$cm"
    ! grep -q -- '-std=c++11' "$cm" && head -n 1 "$cm" | grep -q 'CMAKE_CXX_STANDARD 17' \
        || die "$cm: the Gloo C++17 patch did not apply"
}

# Horovod 0.28.1's horovod/tensorflow/keras/{__init__,callbacks}.py take their
# Keras backend from `keras` for TensorFlow >= 2.6, and `keras` here is Keras 3
# (TensorFlow >= 2.16 installs it), whose backend lacks what Horovod calls:
# its callbacks die at their first epoch ("module 'keras.backend' has no
# attribute 'constant'").  Everything else there uses tf.keras (tf_keras under
# TF_USE_LEGACY_KERAS=1, the Keras 2 that Horovod 0.28 supports), so take the
# backend from it too.  Applied to the installed Python files (no rebuild; the
# wheel cache key is unchanged), idempotent, and fails loudly when the line is
# not there (another Horovod: review the fix).
KERAS_FIX='K = keras.backend  # hvprof: the backend of tf.keras, not of Keras 3'
patch_keras_backend() {
    local py=$1
    [ -f "$py" ] || die "$py: no such file"
    grep -qF "$KERAS_FIX" "$py" && return 0
    grep -Eq '^from tensorflow import keras$' "$py" \
        || die "$py: 'from tensorflow import keras' not found: the Keras backend patch needs review for Horovod $HOROVOD_VERSION"
    grep -Eq '^[[:space:]]+from keras import backend as K$' "$py" \
        || die "$py: 'from keras import backend as K' not found: the Keras backend patch needs review for Horovod $HOROVOD_VERSION"
    sed -i -E "s/^([[:space:]]+)from keras import backend as K\$/\1$KERAS_FIX/" "$py"
    ! grep -Eq '^[[:space:]]+from keras import backend' "$py" && grep -qF "$KERAS_FIX" "$py" \
        || die "$py: the Keras backend patch did not apply"
}

# `setup.sh --patch-cxx17 FILE` / `--patch-no-xla FILE` / `--patch-gloo-cxx17
# FILE` / `--patch-keras-backend FILE`: apply only that fix (used by the tests).
if [ "${1:-}" = "--patch-cxx17" ] || [ "${1:-}" = "--patch-no-xla" ] \
        || [ "${1:-}" = "--patch-gloo-cxx17" ] || [ "${1:-}" = "--patch-keras-backend" ]; then
    [ $# -eq 2 ] || die "usage: setup.sh $1 FILE"
    case $1 in
        --patch-cxx17) patch_cxx17 "$2" ;;
        --patch-no-xla) patch_no_xla "$2" ;;
        --patch-keras-backend) patch_keras_backend "$2" ;;
        *) patch_gloo_cxx17 "$2" ;;
    esac
    say "patched $2"
    exit 0
fi

# One set-up at a time on this machine (the wheel cache and apt are shared).
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/setup.lock"
if ! flock -n 9; then
    say "another set-up is running; waiting for it"
    flock 9
fi

# pip, minus the machine-config noise about missing local index directories.
pip_q() {
    "$PY" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# The lock's pins installed by uv (a pinned release, put in the venv by pip):
# the same hashes and no resolution, but about 50 s on a new venv where pip
# takes about two.  uv does not read pip's configuration, so pip's indexes
# and find-links (files, environment) are passed on, and every index is
# searched as pip does (the hashes pin the artifacts).  pip's constraints
# are not: uv's hash mode wants them pinned too, and exact pins need none.
# Files are copied, not linked, so a venv never shares an inode with uv's
# cache, and bytecode is compiled as pip would.  Fails (status 1) on any
# error, and the caller falls back to pip.
UV_VERSION=0.13.8
lock_install_uv() {
    [ "${HVPROF_NO_UV:-0}" = 1 ] && return 1
    if [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("uv"))' 2>/dev/null)" != "$UV_VERSION" ]; then
        pip_q install -q "uv==$UV_VERSION" >/dev/null 2>&1 || return 1
    fi
    [ -x "$VENV/bin/uv" ] || return 1
    local -a flags
    mapfile -t flags < <("$PY" - <<'PYEOF'
import subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                     capture_output=True, text=True).stdout
opt = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
       "find-links": "--find-links"}
seen = set()
for line in out.splitlines():
    key, _, val = line.partition("=")
    name = key.rpartition(".")[2]
    if name in opt:
        for v in val.strip().strip("'\"").split():
            if (name, v) not in seen:
                seen.add((name, v))
                print(opt[name]); print(v)
PYEOF
)
    "$VENV/bin/uv" pip install -q --python "$PY" --require-hashes --no-deps \
        --index-strategy unsafe-best-match --link-mode copy --compile-bytecode \
        "${flags[@]}" -r "$LOCK"
}

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else die "need root to run: $*"
    fi
}

apt_install() {
    say "  apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    say "  apt-get install $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

# --------------------------------------------------------------------------
say "[1/5] Open MPI (mpicc, mpirun)"
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    say "  present: $(mpirun --version 2>/dev/null | head -n 1)"
else
    say "  missing: installing Debian's Open MPI"
    apt_install openmpi-bin libopenmpi-dev
    command -v mpicc >/dev/null 2>&1 || die "mpicc still missing after apt-get install"
    command -v mpirun >/dev/null 2>&1 || die "mpirun still missing after apt-get install"
    say "  installed: $(mpirun --version 2>/dev/null | head -n 1)"
fi

# The capture tests also run against a second MPI, Debian's MPICH, installed
# side by side (mpicc.mpich, mpirun.mpich).  Open MPI stays the default.
if command -v mpicc.mpich >/dev/null 2>&1 && command -v mpirun.mpich >/dev/null 2>&1; then
    say "  MPICH present (second MPI for the capture tests): $(mpichversion 2>/dev/null | head -n 1 | tr -s ' \t' ' ')"
elif [ "${HVPROF_NO_MPICH:-0}" = 1 ]; then
    say "  MPICH skipped (HVPROF_NO_MPICH=1): its capture tests will be skipped"
else
    say "  MPICH missing: installing Debian's mpich beside Open MPI (second MPI for the capture tests)"
    apt_install mpich libmpich-dev
    if ! mpirun --version 2>/dev/null | grep -q "Open MPI" && [ -x /usr/bin/mpirun.openmpi ]; then
        say "  keeping Open MPI the default mpicc/mpirun"
        as_root update-alternatives --set mpi /usr/bin/mpicc.openmpi >/dev/null
        as_root update-alternatives --set mpirun /usr/bin/mpirun.openmpi >/dev/null
    fi
fi

# A real browser for the HTML report's test (tests/test_report_browser.py):
# Debian's chromium, run headless.  HVPROF_NO_CHROMIUM=1 skips it (the test
# is then skipped, saying so).
if command -v chromium >/dev/null 2>&1; then
    say "  chromium present (the report's browser test)"
elif [ "${HVPROF_NO_CHROMIUM:-0}" = 1 ]; then
    say "  chromium skipped (HVPROF_NO_CHROMIUM=1): the report's browser test will be skipped"
else
    say "  chromium missing: installing Debian's chromium (the report's browser test)"
    apt_install chromium
fi

# A real Prometheus server for the exporter's test (tests/test_watch_jobs.py):
# Debian's prometheus, started by the test on a loopback port with its data in
# a temporary folder.  HVPROF_NO_PROMETHEUS=1 skips it (the test is then
# skipped, saying so).
if command -v prometheus >/dev/null 2>&1; then
    say "  prometheus present (the exporter's scrape test)"
elif [ "${HVPROF_NO_PROMETHEUS:-0}" = 1 ]; then
    say "  prometheus skipped (HVPROF_NO_PROMETHEUS=1): the exporter's scrape test will be skipped"
else
    say "  prometheus missing: installing Debian's prometheus (the exporter's scrape test)"
    apt_install prometheus
fi

# --------------------------------------------------------------------------
say "[2/5] Python virtual environment ($VENV)"
if [ -x "$PY" ] && "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
    say "  present: $("$PY" --version 2>&1)"
else
    [ -e "$VENV" ] && die "$VENV exists but its python does not run; remove it and rerun"
    BASE=${HVPROF_PYTHON:-}
    if [ -z "$BASE" ]; then
        for cand in python3.11 python3; do
            if command -v "$cand" >/dev/null 2>&1; then BASE=$cand; break; fi
        done
    fi
    [ -n "$BASE" ] || die "no python3 found; install python3 (>= 3.9) with venv support"
    say "  creating with $BASE ($("$BASE" --version 2>&1))"
    if ! "$BASE" -m venv "$VENV"; then
        rm -rf "$VENV"
        say "  venv module unusable: installing python3-venv"
        apt_install python3-venv
        "$BASE" -m venv "$VENV" || die "could not create $VENV"
    fi
    pip_q install -q --upgrade pip
fi

# --------------------------------------------------------------------------
# The exact versions of a lock (scripts/lock.sh compiles them from the
# requirements files): requirements-tf.lock when TensorFlow is wanted (the
# test command) or already in the venv, else requirements-dev.lock.
WITH_TF=${HVPROF_WITH_TENSORFLOW:-0}
if "$PY" -c 'import importlib.metadata as m; m.version("tensorflow-cpu")' 2>/dev/null; then
    WITH_TF=1  # once installed, Horovod keeps its TensorFlow support
fi
LOCK=$ROOT/requirements-dev.lock
[ "$WITH_TF" = 1 ] && LOCK=$ROOT/requirements-tf.lock
[ -f "$LOCK" ] || die "$LOCK: no such file (bash scripts/lock.sh makes it)"
say "[3/5] Python dependencies ($(basename "$LOCK"))"
# Is every pin of the lock installed at exactly its version?  (~0.2 s)
missing=$("$PY" - "$LOCK" <<'PYEOF' 2>/dev/null || echo "(check failed)"
import importlib.metadata as md
import re
import sys
bad = []
for line in open(sys.argv[1]):
    m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\;]+)", line)
    if not m:
        continue
    name, want = m.groups()
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        bad.append(name); continue
    if have != want:
        bad.append(f"{name}:{have}->{want}")
print(" ".join(bad))
PYEOF
)
if [ -z "$missing" ]; then
    say "  present: every pin of $(basename "$LOCK") is installed"
else
    n_missing=$(wc -w <<<"$missing")
    say "  installing $(basename "$LOCK") ($n_missing missing or at another version)"
    if ! lock_install_uv; then
        say "  uv unavailable or failed: installing with pip (minutes on a new venv)"
        pip_q install -q --require-hashes --no-deps -r "$LOCK" \
            || die "pip install -r $(basename "$LOCK") failed (above)"
    fi
fi

# --------------------------------------------------------------------------
FRAMEWORKS=PyTorch
[ "$WITH_TF" = 1 ] && FRAMEWORKS="PyTorch + TensorFlow"
say "[4/5] Horovod $HOROVOD_VERSION (MPI and Gloo, $FRAMEWORKS, wheel cache $WHEEL_CACHE)"
ABI=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
TORCH=$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))')
# Cache key: Horovod version, its controllers (MPI and Gloo), Python ABI, torch
# version (the extension links against torch's C++ ABI, so a wheel is only good
# for the torch it was built on).
KEY="horovod-$HOROVOD_VERSION-gloo-$ABI-torch-$TORCH"
if [ "$WITH_TF" = 1 ]; then
    # and TensorFlow's, whose C++ ABI its extension links against
    KEY="$KEY-tf-$("$PY" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))')"
fi
KEYDIR=$WHEEL_CACHE/$KEY
STAMP=$VENV/.hvprof-horovod
have_hvd=$("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)

find_wheel() { ls "$KEYDIR"/horovod-"$HOROVOD_VERSION"-"$ABI"-*.whl 2>/dev/null | head -n 1 || true; }

check_import() {
    # Importing the extension resolves its symbols against libmpi and torch:
    # a wheel built for another torch fails here.
    "$PY" -c 'import horovod.torch as hvd; assert hvd.mpi_built(), "Horovod built without MPI"; assert hvd.gloo_built(), "Horovod built without Gloo"'
    if [ "$WITH_TF" = 1 ]; then
        TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c 'import horovod.tensorflow as hvd; assert hvd.mpi_built()' 2>/dev/null \
            || { echo "horovod.tensorflow does not import" >&2; return 1; }
    fi
}

install_wheel() {
    say "  installing $(basename "$1")"
    pip_q install -q --no-deps --force-reinstall "$1"
}

build_wheel() {
    local tmp src cm
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/hvprof-horovod-build.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    say "  building from source (once per cache key; about 4-5 minutes on 2 cores)"
    say "  downloading the source package horovod==$HOROVOD_VERSION"
    pip_q download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$tmp/sdist"
    tar -xzf "$tmp"/sdist/horovod-"$HOROVOD_VERSION".tar.gz -C "$tmp"
    src=$tmp/horovod-$HOROVOD_VERSION
    say "  patching horovod/torch/CMakeLists.txt: CMAKE_CXX_STANDARD 14 -> 17"
    patch_cxx17 "$src/horovod/torch/CMakeLists.txt"
    say "  patching third_party/gloo/CMakeLists.txt: Gloo as C++17, like the torch extension"
    patch_gloo_cxx17 "$src/third_party/gloo/CMakeLists.txt"
    local tf_flag=HOROVOD_WITHOUT_TENSORFLOW=1
    if [ "$WITH_TF" = 1 ]; then
        say "  patching horovod/tensorflow/CMakeLists.txt: no xla_mpi_ops.cc (GPU-only)"
        patch_no_xla "$src/horovod/tensorflow/CMakeLists.txt"
        tf_flag=HOROVOD_WITH_TENSORFLOW=1
    fi
    say "  compiling (HOROVOD_WITH_PYTORCH=1 $tf_flag HOROVOD_WITH_MPI=1, HOROVOD_WITH_GLOO=1, no MXNet; log: $tmp/build.log)"
    if ! (cd "$src" && env PATH="$VENV/bin:$PATH" \
            HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
            "$tf_flag" HOROVOD_WITHOUT_MXNET=1 \
            HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS="-j${HVPROF_BUILD_JOBS:-2}" \
            "$PY" -m pip wheel --no-build-isolation --no-deps -w "$tmp/wheel" . \
            >"$tmp/build.log" 2>&1); then
        tail -n 40 "$tmp/build.log" >&2
        die "Horovod build failed (last lines above)"
    fi
    mkdir -p "$KEYDIR"
    local whl
    whl=$(ls "$tmp"/wheel/horovod-*.whl | head -n 1)
    # Publish atomically: a half-copied wheel is never seen under its name.
    cp "$whl" "$KEYDIR/.partial.$$"
    mv "$KEYDIR/.partial.$$" "$KEYDIR/$(basename "$whl")"
    rm -rf "$tmp"
    trap - EXIT
    say "  cached $KEYDIR/$(basename "$whl")"
}

if [ "$have_hvd" = "$HOROVOD_VERSION" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$KEY" ]; then
    say "  present: horovod $have_hvd installed from cache key $KEY"
else
    WHEEL=$(find_wheel)
    adopted=
    if [ -z "$WHEEL" ]; then
        # A wheel cached flat in $WHEEL_CACHE by an earlier hand build: adopt it
        # under the key if it imports against this venv's torch.
        legacy=$(ls "$WHEEL_CACHE"/horovod-"$HOROVOD_VERSION"-"$ABI"-*.whl 2>/dev/null | head -n 1 || true)
        if [ -n "$legacy" ]; then
            say "  found an unkeyed cached wheel $(basename "$legacy"); checking it against torch $TORCH"
            install_wheel "$legacy"
            if check_import 2>/dev/null; then
                mkdir -p "$KEYDIR"
                cp "$legacy" "$KEYDIR/.partial.$$"
                mv "$KEYDIR/.partial.$$" "$KEYDIR/$(basename "$legacy")"
                say "  adopted into $KEYDIR"
                adopted=1
            else
                say "  it does not import against torch $TORCH; building a fresh one"
            fi
        fi
        WHEEL=$(find_wheel)
    else
        say "  cached wheel found: $WHEEL"
    fi
    [ -n "$WHEEL" ] || { build_wheel; WHEEL=$(find_wheel); }
    [ -n "$WHEEL" ] || die "no Horovod wheel in $KEYDIR after the build"
    [ -n "$adopted" ] || install_wheel "$WHEEL"
    check_import || die "horovod.torch does not import after installing $WHEEL"
    echo "$KEY" >"$STAMP"
    say "  installed: horovod $HOROVOD_VERSION (import horovod.torch works)"
fi
if [ "$WITH_TF" = 1 ]; then
    hvd_keras=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/horovod/tensorflow/keras
    if grep -qF "$KERAS_FIX" "$hvd_keras/__init__.py" && grep -qF "$KERAS_FIX" "$hvd_keras/callbacks.py"; then
        say "  present: Horovod's Keras callbacks take tf.keras's backend"
    else
        say "  patching $hvd_keras/{__init__,callbacks}.py: the backend of tf.keras, not of Keras 3"
        patch_keras_backend "$hvd_keras/__init__.py"
        patch_keras_backend "$hvd_keras/callbacks.py"
    fi
fi

# --------------------------------------------------------------------------
say "[5/5] horovod-profiler (C library + package, editable: the checkout is the package)"
# Up to date when the compiled sources' hash equals the one recorded at the
# last install (scripts/src_hash.py), the package resolves to this checkout,
# its library is there and no one rebuilt it since, and the start-up hook is in
# site-packages.  Python edits need no install: the checkout is imported.
PKG_STAMP=$VENV/.hvprof-package
src_hash=$("$PY" "$ROOT/scripts/src_hash.py" "$ROOT")
lib=$ROOT/profiler/_lib/libhvprof.so
# -I: isolated mode, so the answer is the install's, not the current directory's.
where=$(cd / && "$PY" -I -c 'import importlib.util as u, os; s = u.find_spec("profiler"); print(os.path.dirname(s.origin) if s and s.origin else "")' 2>/dev/null || true)
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -f "$PKG_STAMP" ] && [ "$(cat "$PKG_STAMP")" = "$src_hash" ] && [ -f "$lib" ] \
        && [ ! "$lib" -nt "$PKG_STAMP" ] && [ "$where" = "$ROOT/profiler" ] \
        && cmp -s "$ROOT/profiler/horovod_profiler.pth" "$site/horovod_profiler.pth"; then
    say "  present: the editable install is this checkout, built from its sources"
else
    say "  installing $ROOT, editable (scripts/dev-install.sh: pip install -e ., C built in place)"
    bash "$ROOT/scripts/dev-install.sh" || die "installing the package failed (above)"
    say "  installed: horovod-profiler $("$PY" -c 'import importlib.metadata as m; print(m.version("horovod-profiler"))')"
fi

# --------------------------------------------------------------------------
NCCL_WHEEL_VERSION=2.32.3
NCCL_DIR=$CACHE_ROOT/nccl-$NCCL_WHEEL_VERSION
if [ "${HVPROF_NO_REAL_NCCL:-0}" = 1 ]; then
    say "  real NCCL skipped (HVPROF_NO_REAL_NCCL=1): its symbol check will be skipped"
elif [ -f "$NCCL_DIR/libnccl.so.2" ]; then
    say "  present: NCCL $NCCL_WHEEL_VERSION's libnccl.so.2 in $NCCL_DIR"
else
    t_nccl=$(date +%s)
    tmp_nccl=$(mktemp -d)
    if "$PY" -m pip download -q --no-deps -d "$tmp_nccl" "nvidia-nccl-cu12==$NCCL_WHEEL_VERSION" \
            2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) \
            && "$PY" - "$tmp_nccl" "$NCCL_DIR" <<'PYEOF'
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "nvidia_nccl_cu12-*.whl"))[0]
os.makedirs(sys.argv[2], exist_ok=True)
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith("/libnccl.so.2"))
    tmp = os.path.join(sys.argv[2], ".libnccl.so.2.tmp")
    with z.open(name) as src, open(tmp, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    os.replace(tmp, os.path.join(sys.argv[2], "libnccl.so.2"))  # never seen half-written
PYEOF
    then
        say "  cached NCCL $NCCL_WHEEL_VERSION's libnccl.so.2 in $NCCL_DIR ($(( $(date +%s) - t_nccl )) s)"
    else
        say "  warning: could not fetch nvidia-nccl-cu12 $NCCL_WHEEL_VERSION: the real-NCCL check will be skipped"
    fi
    rm -rf "$tmp_nccl"
fi

say "set-up complete in $(( $(date +%s) - T0 )) s (python: $PY)"
