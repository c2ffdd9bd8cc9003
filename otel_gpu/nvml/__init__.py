"""NVML access: the wrapper, the sampler and the fake driver used for simulation."""
