#!/usr/bin/env bash
# Fetches promtool and the Prometheus server for the tests from Debian's prometheus
# package and prints the directory holding them. Only the two binaries: the package is
# downloaded and unpacked into a cache (dpkg-deb -x), never installed, so no maintainer
# script runs: no service is enabled or started, no user is created, nothing outside
# the cache is written (apt-get update aside, when the package lists are missing).
# Usage: scripts/get-prometheus.sh [CACHE_DIR]
#   (default: $PROMETHEUS_CACHE_DIR, else $XDG_CACHE_HOME/otel-gpu/prometheus)
set -euo pipefail
CACHE=${1:-${PROMETHEUS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-gpu/prometheus}}
BIN="$CACHE/bin"

if [ -x "$BIN/promtool" ] && [ -x "$BIN/prometheus" ] && "$BIN/promtool" --version >/dev/null 2>&1; then
  echo "$BIN"
  exit 0
fi
for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null 2>&1 || { echo "get-prometheus: $tool not found (Debian or Ubuntu needed)" >&2; exit 1; }
done
SUDO=""
APT=(apt-get -qq)
if [ "$(id -u)" -eq 0 ]; then
  APT+=(-o APT::Sandbox::User=root)  # root downloads into the work directory itself
else
  SUDO="sudo"
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if ! (cd "$WORK" && "${APT[@]}" download prometheus >/dev/null 2>&1); then
  echo "get-prometheus: updating the package lists (apt-get update)" >&2
  $SUDO apt-get update -qq
  (cd "$WORK" && "${APT[@]}" download prometheus >/dev/null)
fi
dpkg-deb -x "$WORK"/prometheus_*.deb "$WORK/root"
mkdir -p "$BIN"
for binary in promtool prometheus; do
  install -m 0755 "$WORK/root/usr/bin/$binary" "$BIN/$binary.tmp"
  mv -f "$BIN/$binary.tmp" "$BIN/$binary"
done
"$BIN/promtool" --version 2>&1 | head -n1 >&2
echo "$BIN"
