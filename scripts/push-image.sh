#!/usr/bin/env bash
# Builds the otel-gpu image from this tree's Dockerfile and pushes it to your
# registry, for the Helm chart and the kustomize base (neither names a published image).
#
# Usage: scripts/push-image.sh REGISTRY/NAME[:TAG]
#   e.g. scripts/push-image.sh registry.example.com/otel-gpu:0.1.0
# TAG defaults to the chart's appVersion, the tag the chart pulls when image.tag is unset.
# Log in to the registry first (docker login / podman login / buildah login).
#
# Environment:
#   CONTAINER_TOOL  docker, podman or buildah (default: the first one found, in that order)
#   BASE            the Dockerfile's BASE build argument (default: the Dockerfile's)
#   PLATFORM        e.g. linux/amd64 or linux/arm64 (default: the builder's own)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "push-image: $*" >&2; exit 2; }

[ $# -eq 1 ] || die "usage: scripts/push-image.sh REGISTRY/NAME[:TAG], e.g. registry.example.com/otel-gpu:0.1.0"
REF=$1
case $REF in
  *@*) die "$REF: give a tag, not a digest (REGISTRY/NAME:TAG)" ;;
  *[[:space:]]*|"") die "'$REF' is not an image reference (REGISTRY/NAME:TAG)" ;;
esac
NAME=${REF%:*}
TAG=${REF##*:}
if [ "$NAME" = "$REF" ] || [[ $TAG == */* ]]; then  # no tag (a colon, if any, is a port)
  NAME=$REF
  TAG=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' deploy/helm/otel-gpu/Chart.yaml)
fi
HOST=${NAME%%/*}
if [ "$HOST" = "$NAME" ] || { [[ $HOST != *.* ]] && [[ $HOST != *:* ]] && [ "$HOST" != localhost ]; }; then
  die "$REF: name the registry, e.g. registry.example.com/otel-gpu:$TAG (Docker Hub: docker.io/USER/otel-gpu)"
fi
[[ $TAG =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "$REF: '$TAG' is not a valid tag"
IMAGE=$NAME:$TAG

TOOL=${CONTAINER_TOOL:-}
if [ -z "$TOOL" ]; then
  for candidate in docker podman buildah; do
    if command -v "$candidate" >/dev/null 2>&1; then TOOL=$candidate; break; fi
  done
fi
[ -n "$TOOL" ] || die "none of docker, podman or buildah is installed"
command -v "$TOOL" >/dev/null 2>&1 || die "CONTAINER_TOOL=$TOOL: not found"

BUILD_ARGS=()
[ -z "${BASE:-}" ] || BUILD_ARGS+=(--build-arg "BASE=$BASE")
[ -z "${PLATFORM:-}" ] || BUILD_ARGS+=(--platform "$PLATFORM")

case $(basename "$TOOL") in
  docker|podman|buildah) ;;
  *) die "CONTAINER_TOOL=$TOOL: expected docker, podman or buildah" ;;
esac
# ${A[@]+...}: an empty array under set -u on bash 3.2 (macOS)
"$TOOL" build ${BUILD_ARGS[@]+"${BUILD_ARGS[@]}"} -t "$IMAGE" -f Dockerfile .
if [ "$(basename "$TOOL")" = buildah ]; then
  "$TOOL" push "$IMAGE" "docker://$IMAGE"
else
  "$TOOL" push "$IMAGE"
fi

cat <<DONE
pushed $IMAGE; install with
  helm install otel-gpu deploy/helm/otel-gpu -n monitoring --create-namespace --set image.repository=$NAME --set image.tag=$TAG
or set it in your kustomize overlay:
  images: [{name: your-registry.invalid/otel-gpu, newName: $NAME, newTag: "$TAG"}]
DONE
