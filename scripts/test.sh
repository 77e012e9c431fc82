#!/usr/bin/env bash
# The one test command: set up (idempotent, seconds when everything is present),
# then the whole test suite on the checkout (installed editable).
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

# Hygiene first (seconds with warm caches): the environment is consistent (pip
# check), lint, types and the architecture contracts (pyproject.toml).  The
# install is editable, so each runs on the checkout as it is.
echo "test: checks: pip check, ruff, mypy, import contracts ($(date -u +%H:%M:%SZ))"
"$ROOT/.venv/bin/python" -m pip check \
    || { echo "test: error: pip check found broken requirements (above)" >&2; exit 1; }
"$ROOT/.venv/bin/ruff" check --quiet profiler analysis tests benchmarks notebooks docs scripts setup.py \
    || { echo "test: error: ruff found problems (above)" >&2; exit 1; }
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
# mypy's cache outside the checkout, one per checkout path (mypy drops an
# entry whose path differs), so a fresh clone at the same path starts warm:
# an entry is reused only where its file's hash still matches
MYPY_CACHE=${HVPROF_MYPY_CACHE:-${HOME}/.cache/horovod-profiler/mypy/$(printf %s "$ROOT" | md5sum | cut -c1-12)}
"$ROOT/.venv/bin/mypy" --cache-dir "$MYPY_CACHE" -p profiler \
    || { echo "test: error: mypy found problems (above)" >&2; exit 1; }
"$ROOT/.venv/bin/lint-imports" --no-cache >"$SCRATCH/contracts.txt" 2>&1 \
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
"$ROOT/.venv/bin/python" -m pytest -q -ra tests/ "$@"
rc=$?
case $rc in
    0) echo "test: all tests passed" ;;
    5) echo "test: error: pytest collected no tests (exit 5)" >&2 ;;
    *) echo "test: pytest exited with status $rc" >&2 ;;
esac
exit $rc
