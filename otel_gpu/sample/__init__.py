"""Stage 1, sample: the NVML wrapper, the value sources, the sampler.

The simulator that can stand in for the driver lives in :mod:`otel_gpu.sim`.
"""
