"""HPC job attribution: which scheduler job uses which GPU or MIG instance, off Kubernetes.

- :mod:`otel_gpu.attribute.hpc.mapping` watches dcgm-exporter's job mapping directory (files
  the scheduler's prolog and epilog write, one per GPU or MIG instance).
- :mod:`otel_gpu.attribute.hpc.slurm` reads Slurm's job id from each GPU process's cgroup,
  so no prolog is needed.
- :mod:`otel_gpu.attribute.hpc.enrich` merges both into each snapshot's ``jobs``.
"""
