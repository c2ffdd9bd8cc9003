#!/usr/bin/env bash
# Refreshes deploy/image/requirements.lock, the exact set the container image installs:
# every runtime dependency of otel-gpu (pyproject.toml's `dependencies`, not its extras),
# direct and transitive, pinned with == and the sha256 of every wheel and sdist PyPI holds
# for that version, so one file serves each Python from 3.11 on and each platform
# (linux x86_64 and aarch64 among them). Resolved by uv (`uv pip compile --universal`),
# installed into a throwaway virtual environment: pip's own `pip lock` (experimental)
# locks for the running interpreter and platform alone, and the pip of older bases
# cannot read its pylock.toml.
#
# Usage: scripts/lock-image.sh            refresh the lock to what PyPI has now
#        scripts/lock-image.sh --check    exit 1 if a refresh would change it
# Environment:
#   PYTHON      the interpreter that makes the throwaway environment (default: python3)
#   UV_VERSION  the uv release that resolves (default below)
#   UV_INDEX_URL  another index than PyPI (default: PyPI, whichever pip.conf says)
# After a refresh: commit the lock; scripts/test-image.sh builds the image from it.
set -euo pipefail
cd "$(dirname "$0")/.."

LOCK=deploy/image/requirements.lock
UV_VERSION=${UV_VERSION:-0.13.9}
CHECK=0
case ${1:-} in
  "") ;;
  --check) CHECK=1 ;;
  *) echo "usage: scripts/lock-image.sh [--check]" >&2; exit 2 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"${PYTHON:-python3}" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "uv==$UV_VERSION"

{
  cat <<HEADER
# The container image's Python packages: otel-gpu's runtime dependencies (pyproject.toml's
# \`dependencies\`), direct and transitive, each pinned with the hashes of all its files.
# The Dockerfile installs exactly these (pip --require-hashes --no-deps), then otel-gpu
# itself from the source tree; tests/deploy/test_image_lock.py holds this file to
# pyproject.toml and the image test to what the image holds.
#
# Made by scripts/lock-image.sh with uv $UV_VERSION:
#   uv pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes
# Refresh it the same way (scripts/lock-image.sh) whenever pyproject.toml's dependencies
# change, or to take newer releases; commit it with the change.
HEADER
  # pip.conf's indexes and find-links are this machine's; the lock names PyPI's files.
  "$work/venv/bin/uv" pip compile pyproject.toml --universal --python-version 3.11 \
      --generate-hashes --no-header --no-config \
      --index-url "${UV_INDEX_URL:-https://pypi.org/simple}"
} > "$work/requirements.lock"

if [ "$CHECK" = 1 ]; then
  if ! diff -u "$LOCK" "$work/requirements.lock"; then
    echo "lock-image: $LOCK is not what scripts/lock-image.sh makes now" >&2
    exit 1
  fi
  exit 0
fi
mv "$work/requirements.lock" "$LOCK"
echo "wrote $LOCK ($(grep -c '^[A-Za-z0-9]' "$LOCK") packages)" >&2
