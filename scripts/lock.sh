#!/usr/bin/env bash
# Refresh the locks that scripts/setup.sh installs from:
#
#   requirements-tf.lock   requirements-dev.txt + requirements-tf.txt (the test command's set)
#   requirements-dev.lock  requirements-dev.txt alone, at the versions of the first
#                          (so that adding TensorFlow to a venv changes nothing else)
#
# Exact versions with every file's sha256 (pip installs them with --require-hashes).
# pip-compile runs from a venv of its own (pinned pip-tools), with this machine's
# pip configuration: torch comes from the CPU build on disk (+cpu).  Takes a few
# minutes; run it after editing a requirements file and commit the locks with it.
# tests/test_setup.py checks that the locks satisfy the requirements files.
#
#   bash scripts/lock.sh              # recompile both, keeping pins the inputs allow
#   bash scripts/lock.sh --upgrade    # take the newest versions the inputs allow
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PIP_TOOLS_VERSION=7.6.2
TOOLS=${HOME}/.cache/horovod-profiler/pip-tools-$PIP_TOOLS_VERSION
if [ ! -x "$TOOLS/bin/pip-compile" ]; then
    echo "lock: creating $TOOLS (pip-tools $PIP_TOOLS_VERSION)"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q "pip-tools==$PIP_TOOLS_VERSION" 2> >(grep -v "is ignored" >&2)
fi
compile() {
    local out=$1; shift
    echo "lock: compiling $out from $* ($(date -u +%H:%M:%SZ))"
    CUSTOM_COMPILE_COMMAND="bash scripts/lock.sh" "$TOOLS/bin/pip-compile" -q --generate-hashes --allow-unsafe --strip-extras \
        --no-emit-index-url --no-emit-find-links --annotation-style=line \
        -o "$out" "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
compile requirements-tf.lock "$@" requirements-dev.txt requirements-tf.txt
compile requirements-dev.lock "$@" --constraint requirements-tf.lock requirements-dev.txt
echo "lock: done; commit requirements-dev.lock and requirements-tf.lock"
