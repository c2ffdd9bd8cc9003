"""The deployment tests' fixtures: the stacks a real Prometheus scrapes (helpers.py: the rest)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def node_stack(tmp_path_factory):
    """otel-gpu on a reshaped h100x8 with a fake kubelet, scraped by a real Prometheus."""
    from tests.deploy.stack import Stack
    from tests.support.prometheus_server import skip_unless_available

    binary = skip_unless_available()
    stack = Stack(tmp_path_factory.mktemp("node-stack"), binary)
    try:
        yield stack.start()
    finally:
        stack.close()


@pytest.fixture(scope="session")
def docker_stack(tmp_path_factory):
    """otel-gpu on a Docker host (a fake runtime API, no kubelet), scraped by a real Prometheus."""
    from tests.deploy.docker_stack import DockerStack
    from tests.support.prometheus_server import skip_unless_available

    binary = skip_unless_available()
    stack = DockerStack(tmp_path_factory.mktemp("docker-stack"), binary)
    try:
        yield stack.start()
    finally:
        stack.close()
