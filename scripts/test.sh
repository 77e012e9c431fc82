#!/usr/bin/env bash
# The one test command: set up (idempotent, seconds when everything is present),
# then the whole test suite under the installed package.
#
#   bash scripts/test.sh                 # full run
#   bash scripts/test.sh -k horovod      # extra arguments go to pytest
#   bash scripts/test.sh --quick         # the quick tier: checks, then the tests that
#                                        # start no process (tests/conftest.py, QUICK)
#
# Exit status: pytest's (0 all passed, 1 failures, 5 no tests collected, ...).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

if [ "${1:-}" = "--quick" ]; then
    shift
    export HVPROF_QUICK=1
fi

# TensorFlow too: the tests profile TensorFlow and Keras jobs (tests/test_tensorflow.py).
HVPROF_WITH_TENSORFLOW=${HVPROF_WITH_TENSORFLOW:-1} bash scripts/setup.sh \
    || { echo "test: error: set-up failed" >&2; exit 1; }

# Hygiene first (seconds with warm caches): lint, types and the architecture
# contracts (pyproject.toml).  mypy and lint-imports read the installed package,
# where analysis/ is profiler.analysis; they run from a scratch folder so that
# the checkout's profiler/ (which lacks analysis/) is not imported instead.
echo "test: checks: ruff, mypy, import contracts ($(date -u +%H:%M:%SZ))"
"$ROOT/.venv/bin/ruff" check --quiet profiler analysis tests benchmarks notebooks docs scripts setup.py \
    || { echo "test: error: ruff found problems (above)" >&2; exit 1; }
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
( cd "$SCRATCH" && "$ROOT/.venv/bin/mypy" --config-file "$ROOT/pyproject.toml" \
      --cache-dir "$ROOT/.mypy_cache" -p profiler ) \
    || { echo "test: error: mypy found problems (above)" >&2; exit 1; }
( cd "$SCRATCH" && "$ROOT/.venv/bin/lint-imports" --no-cache "$ROOT/pyproject.toml" >"$SCRATCH/contracts.txt" 2>&1 ) \
    || { cat "$SCRATCH/contracts.txt"; echo "test: error: an import contract is broken (above)" >&2; exit 1; }
grep -E "KEPT|BROKEN" "$SCRATCH/contracts.txt" | sed 's/^/test:   /'
# The documentation site, strict: a broken link or anchor fails the run.  The
# commands page is generated from the installed parsers (docs/hooks.py).
echo "test: docs: mkdocs build --strict ($(date -u +%H:%M:%SZ))"
NO_MKDOCS_2_WARNING=1 "$ROOT/.venv/bin/mkdocs" build --strict --quiet -f "$ROOT/mkdocs.yml" \
    -d "$SCRATCH/site" >"$SCRATCH/mkdocs.txt" 2>&1 \
    || { cat "$SCRATCH/mkdocs.txt"; echo "test: error: the documentation does not build (above)" >&2; exit 1; }

echo "test: running pytest over tests/${HVPROF_QUICK:+ (quick tier)} ($(date -u +%H:%M:%SZ))"
# -q: one character per test; -ra: reasons for every non-pass at the end;
# per-test timeout from pyproject.toml (pytest-timeout), overridable here.
# The pytest script, not `python -m pytest`: that would put the checkout on
# sys.path and import its profiler/ instead of the installed package.
"$ROOT/.venv/bin/pytest" -q -ra tests/ "$@"
rc=$?
case $rc in
    0) echo "test: all tests passed" ;;
    5) echo "test: error: pytest collected no tests (exit 5)" >&2 ;;
    *) echo "test: pytest exited with status $rc" >&2 ;;
esac
exit $rc
