# The otel-gpu container image.
#
#   docker build -t otel-gpu:0.1.0 .
#   docker build --build-arg BASE=python:3.11-slim-bookworm -t otel-gpu:0.1.0 .
#
# BASE is any image with python3 (3.10 or newer) and its venv module; both stages use
# it, so the virtual environment built in the first runs unchanged in the second.
# Without network access in the build, put every wheel in one directory inside the
# context (pip wheel . -w dist/wheels) and pass --build-arg WHEELS=dist/wheels.
ARG BASE=python:3.12-slim-bookworm

FROM ${BASE} AS build
ARG WHEELS=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . /src
RUN python3 -m venv /opt/otel-gpu \
 && if [ -n "$WHEELS" ]; then \
        /opt/otel-gpu/bin/pip install --no-index --find-links "/src/$WHEELS" otel-gpu; \
    else \
        /opt/otel-gpu/bin/pip install /src; \
    fi \
 && /opt/otel-gpu/bin/otel-gpu --version \
 && /opt/otel-gpu/bin/pip uninstall -y -q pip

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
