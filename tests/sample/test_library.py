"""The NVML wrapper: error codes become outcomes, never exceptions."""

from __future__ import annotations

import ctypes.util

import pynvml
import pytest

from otel_gpu.sample.library import Nvml, NvmlUnavailable, Outcome, classify, error_name


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (pynvml.NVML_SUCCESS, Outcome.OK),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, Outcome.UNSUPPORTED),
        (pynvml.NVML_ERROR_NO_PERMISSION, Outcome.UNSUPPORTED),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, Outcome.UNSUPPORTED),
        (pynvml.NVML_ERROR_GPU_IS_LOST, Outcome.DEVICE_FAILED),
        (pynvml.NVML_ERROR_UNKNOWN, Outcome.DEVICE_FAILED),
        (pynvml.NVML_ERROR_RESET_REQUIRED, Outcome.DEVICE_FAILED),
        (pynvml.NVML_ERROR_TIMEOUT, Outcome.TRANSIENT),
        (pynvml.NVML_ERROR_NO_DATA, Outcome.TRANSIENT),
        (12345, Outcome.TRANSIENT),
    ],
)
def test_classify(code, outcome):
    assert classify(code) is outcome


def test_error_name():
    assert error_name(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU_IS_LOST"
    assert error_name(4242) == "code 4242"


@pytest.fixture
def nvml(fake_nvml):
    lib = fake_nvml("""
        devices:
          - name: Tesla T4
            memory: {total: 1000, used: 10}
            unsupported: [nvmlDeviceGetFanSpeed]
            lost_after: 1
    """)
    wrapper = Nvml()
    wrapper.init()
    yield wrapper, lib
    wrapper.shutdown()


def test_call_returns_values_and_outcomes(nvml):
    wrapper, lib = nvml
    assert wrapper.call(pynvml.nvmlDeviceGetCount).value == 1  # sample 1
    handle = wrapper.call(pynvml.nvmlDeviceGetHandleByIndex, 0).value
    assert wrapper.call(pynvml.nvmlDeviceGetMemoryInfo, handle).value.total == 1000
    fan = wrapper.call(pynvml.nvmlDeviceGetFanSpeed, handle)
    assert fan.outcome is Outcome.UNSUPPORTED and fan.code == pynvml.NVML_ERROR_NOT_SUPPORTED
    wrapper.call(pynvml.nvmlDeviceGetCount)  # sample 2: the GPU is lost
    lost = wrapper.call(pynvml.nvmlDeviceGetMemoryInfo, handle)
    assert lost.outcome is Outcome.DEVICE_FAILED and "lost" in lost.message.lower()
    assert wrapper.calls == 6


def test_missing_symbol_is_unsupported(nvml):
    """A symbol the library lacks; the buffer passed, as every binding's signature takes it."""
    wrapper, _ = nvml
    handle = wrapper.call(pynvml.nvmlDeviceGetHandleByIndex, 0).value
    buffer = (ctypes.c_char * 80)()
    res = wrapper.call(pynvml.nvmlDeviceGetGspFirmwareVersion, handle, buffer)
    assert res.outcome is Outcome.UNSUPPORTED
    assert res.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None,
                    reason="an NVIDIA driver is installed here")
def test_no_driver_is_a_clear_error():
    assert pynvml.nvmlLib is None
    with pytest.raises(NvmlUnavailable, match="LIBRARY_NOT_FOUND"):
        Nvml().init()


def test_error_codes_are_looked_up_once_per_module_not_per_error():
    """A MIG node answers dozens of NOT_SUPPORTED per sample: naming and classifying each
    must not scan the module (that scan once cost more than the reads themselves)."""
    import types

    class Module(types.ModuleType):
        scans = 0

        def __dir__(self):
            Module.scans += 1
            return super().__dir__()

    module = Module("fake_nvml")
    module.NVML_SUCCESS = 0
    module.NVML_ERROR_NOT_SUPPORTED = 3
    module.NVML_ERROR_GPU_IS_LOST = 15
    for _ in range(100):
        assert error_name(3, module) == "NOT_SUPPORTED"
        assert classify(3, module) is Outcome.UNSUPPORTED
        assert classify(15, module) is Outcome.DEVICE_FAILED
        assert classify(77, module) is Outcome.TRANSIENT  # no name: neither list
    assert error_name(42, module) == "code 42"
    assert Module.scans == 1
