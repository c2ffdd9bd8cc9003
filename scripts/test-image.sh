#!/usr/bin/env bash
# Builds the container image with the README's commands (the offline recipe: the
# wheels stage exported, then the build from those wheels), both from
# deploy/image/requirements.lock, checks that the image holds exactly the lock's
# versions, and runs it (tests/image/):
# installs Debian's buildah and mmdebstrap with apt-get when missing, then runs
# pytest -m image. Needs root (buildah with the vfs driver and chroot isolation),
# Debian's package mirror, PyPI, and the virtual environment scripts/test.sh makes. Usage:
# scripts/test-image.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v buildah >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
  echo "installing Debian's buildah and mmdebstrap for the image test" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends buildah mmdebstrap >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
  .venv/bin/python -m pip install -q -e '.[test]'
fi
exec .venv/bin/python -m pytest -m image -p no:cacheprovider tests/image "$@"
