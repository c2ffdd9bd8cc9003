"""Container attribution outside Kubernetes: which Docker, Podman, containerd or CRI-O
container runs each GPU process, named by the runtime's API.

- :mod:`otel_gpu.attribute.container.cgroup` reads the container id from a
  process's cgroup path (each runtime's formats, cgroup v1 and v2).
- :mod:`otel_gpu.attribute.container.runtime` asks a Docker-compatible API socket
  (Docker, Podman) for the containers' names and images, on a background thread.
- :mod:`otel_gpu.attribute.container.enrich` joins both to each snapshot's devices.
"""
