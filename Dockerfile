# The otel-gpu container image.
#
#   docker build -t otel-gpu:0.1.0 .
#   docker build --build-arg BASE=python:3.11-slim-bookworm -t otel-gpu:0.1.0 .
#
# BASE is any image with python3 (3.11 or newer) and its venv module; every stage uses
# it, so the wheels and the virtual environment suit the Python that runs them.
#
# The dependencies are the ones deploy/image/requirements.lock pins, each file checked
# against its hashes, so a tag built again later holds the same code; refresh the lock
# with scripts/lock-image.sh. otel-gpu itself is built from this tree.
#
# Offline: the `wheels` stage holds the wheels of otel-gpu and its dependencies, fetched
# by BASE's own pip for BASE's Python and platform. Export them where PyPI is reachable
# (BuildKit, or buildah/podman), then build without network from them, with the same BASE:
#   docker build --target wheels --output type=local,dest=dist/wheels .
#   docker build --build-arg WHEELS=dist/wheels -t otel-gpu:0.1.0 .
ARG BASE=python:3.12-slim-bookworm

FROM ${BASE} AS build
ARG WHEELS=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . /src
# /wheels: the ones given in WHEELS (a directory inside the context), else fetched and
# built here; the virtual environment is installed from them alone either way, the
# dependencies only as the lock's files (wheels alone: the final image has no compiler),
# so exported wheels that are not the lock's fail here. pip check: the lock satisfies
# what otel-gpu requires. Nothing but the lock and otel-gpu stays (a venv of Python 3.11
# also brings setuptools).
RUN python3 -m venv /opt/otel-gpu \
 && if [ -n "$WHEELS" ]; then \
        mkdir /wheels && cp "/src/$WHEELS"/*.whl /wheels/; \
    else \
        /opt/otel-gpu/bin/pip wheel -q -w /wheels --require-hashes --no-deps \
            --only-binary :all: -r /src/deploy/image/requirements.lock \
     && /opt/otel-gpu/bin/pip wheel -q -w /wheels --no-deps /src; \
    fi \
 && /opt/otel-gpu/bin/pip install -q --no-index --find-links /wheels --require-hashes \
        --no-deps --only-binary :all: -r /src/deploy/image/requirements.lock \
 && /opt/otel-gpu/bin/pip install -q --no-index --find-links /wheels --no-deps otel-gpu \
 && /opt/otel-gpu/bin/pip check \
 && /opt/otel-gpu/bin/otel-gpu --version \
 && /opt/otel-gpu/bin/pip uninstall -y -q setuptools pip

FROM scratch AS wheels
COPY --from=build /wheels /

FROM ${BASE}
LABEL org.opencontainers.image.title="otel-gpu" \
      org.opencontainers.image.description="OpenTelemetry-native NVIDIA GPU metrics collector" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/otel-gpu /opt/otel-gpu
ENV PATH=/opt/otel-gpu/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Reading GPUs needs no root: the NVIDIA device nodes are usually mode 0666. The
# kubelet's pod-resources socket is root's only (srwxr-xr-x), so with pod attribution
# on, run this image as user 0 (runAsUser: 0), still without any capability.
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["/opt/otel-gpu/bin/otel-gpu"]
