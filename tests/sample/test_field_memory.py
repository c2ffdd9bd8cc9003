"""The batched field values read from the array's memory give what pynvml's attributes give.

Every entry shape a driver can leave is generated (any value type, known or not, any
return code, any bits in the value, NVML's "not available" values included) and read
both ways.
"""

from __future__ import annotations

import ctypes
import math
import struct
import types
from typing import Any

import pynvml
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.sample.batch import by_attribute, memory_reader

SUCCESS = pynvml.NVML_SUCCESS
_WIDTH = {0: 8, 1: 4, 2: 8, 3: 8, 4: 8, 5: 4, 6: 2}
"""Bytes of each value type's member (``dVal``, ``uiVal``, ``ulVal``, ...)."""


def _entries(rows: list[tuple[int, int, int, bytes]]) -> Any:
    array = (pynvml.c_nvmlFieldValue_t * len(rows))()
    for entry, (field, kind, code, raw) in zip(array, rows, strict=True):
        entry.fieldId = field
        entry.valueType = kind
        entry.nvmlReturn = code
        ctypes.memmove(ctypes.addressof(entry.value), raw, len(raw))
    return array


def _same(got: list, want: list) -> bool:
    return len(got) == len(want) and all(
        g[0] == w[0] and (g[1] == w[1] or (g[1] != g[1] and w[1] != w[1]))
        for g, w in zip(got, want, strict=True))


def _sentinel(kind: int) -> bytes:
    """All ones in the member's width; signed members saturated (NVML's "not available")."""
    if kind == 4:
        return struct.pack("=q", 2**63 - 1)
    if kind == 5:
        return struct.pack("=i", 2**31 - 1)
    return b"\xff" * _WIDTH.get(kind, 8)


_row = st.tuples(
    st.integers(0, 2**32 - 1),
    st.one_of(st.integers(0, 8), st.integers(0, 2**32 - 1)),
    st.one_of(st.just(SUCCESS), st.sampled_from([pynvml.NVML_ERROR_NOT_SUPPORTED,
                                                  pynvml.NVML_ERROR_GPU_IS_LOST,
                                                  pynvml.NVML_ERROR_UNKNOWN]),
              st.integers(0, 2**32 - 1)),
    st.binary(min_size=8, max_size=8),
).flatmap(lambda r: st.sampled_from([r, (*r[:3], _sentinel(r[1]).ljust(8, b"\0"))]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_row, max_size=60))
def test_memory_and_attributes_agree_on_every_entry(rows) -> None:
    read = memory_reader(pynvml)
    assert read is not None  # this pynvml's layout is the one it reads
    array = _entries(rows)
    want = by_attribute(array, SUCCESS)
    got = read(array, SUCCESS)
    assert _same(got, want), (got, want)


def test_not_available_is_nan_and_an_unknown_type_no_value() -> None:
    read = memory_reader(pynvml)
    assert read is not None
    array = _entries([(1, 1, SUCCESS, b"\xff" * 4 + b"\0" * 4),  # uint all ones
                      (2, 1, SUCCESS, struct.pack("=I", 42) + b"\0" * 4),
                      (3, 7, SUCCESS, b"\0" * 8),  # a type this pynvml does not know
                      (4, 0, pynvml.NVML_ERROR_NOT_SUPPORTED, struct.pack("=d", 1.5))])
    got = read(array, SUCCESS)
    assert math.isnan(got[0][1]) and got[1:] == [(SUCCESS, 42.0), (SUCCESS, None),
                                                 (pynvml.NVML_ERROR_NOT_SUPPORTED, None)]


def test_what_is_not_such_an_array_is_read_by_attribute() -> None:
    read = memory_reader(pynvml)
    assert read is not None
    entry = types.SimpleNamespace(nvmlReturn=SUCCESS, valueType=3,
                                  value=types.SimpleNamespace(ullVal=7))
    assert read([entry], SUCCESS) == [(SUCCESS, 7.0)]


def test_a_layout_it_does_not_know_is_read_by_attribute() -> None:
    class WideType(ctypes.Structure):  # valueType 8 bytes wide: not NVML's layout
        _fields_ = [("fieldId", ctypes.c_uint32), ("scopeId", ctypes.c_uint32),
                    ("timestamp", ctypes.c_int64), ("latencyUsec", ctypes.c_int64),
                    ("valueType", ctypes.c_uint64), ("nvmlReturn", ctypes.c_uint32),
                    ("value", pynvml.c_nvmlValue_t)]

    odd = types.SimpleNamespace(c_nvmlFieldValue_t=WideType,
                                c_nvmlValue_t=pynvml.c_nvmlValue_t)
    assert memory_reader(odd) is None
    assert memory_reader(types.SimpleNamespace()) is None


def test_an_unsigned_short_reads_the_same_with_every_binding() -> None:
    """nvidia-ml-py before 13.x has no ``usVal`` in its union: both ways read the bytes."""
    array = _entries([(1, 6, SUCCESS, struct.pack("=H", 0x1234) + b"\xee" * 6),
                      (2, 6, SUCCESS, b"\xff\xff" + b"\0" * 6)])  # all ones: not available
    read = memory_reader(pynvml)
    assert read is not None  # the fast path holds with this binding's union too
    for got in (read(array, SUCCESS), by_attribute(array, SUCCESS)):
        assert got[0] == (SUCCESS, float(0x1234)) and math.isnan(got[1][1]), got
