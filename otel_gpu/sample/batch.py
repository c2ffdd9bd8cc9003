"""One device's batched field-value read: its fallbacks, and the NVLink link states in it.

Every value NVML gives as a field id is read in one ``nvmlDeviceGetFieldValues``
call per device. A field with a call of its own (its ``fallback``) leaves the batch
on a device whose driver does not answer it, decided on the first answer; a driver
refusing the whole call is asked once more without those. Where the driver answers
the NVLink link states in the batch as the call per link does (compared once), they
come in the same call too. Run on the device's worker thread; what it learns about
the driver is kept in the device's :class:`~otel_gpu.sample.device.LinkState`.
"""

from __future__ import annotations

import ctypes
import logging
import math
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu.sample.device import Tracked
from otel_gpu.sample.library import Nvml, Outcome, Result, classify, error_name
from otel_gpu.sample.outcomes import Outcomes
from otel_gpu.sample.readers import LINK_COUNT, NVLINK_STATES
from otel_gpu.sample.sources import (
    ALL_LINKS,
    NVLINK_ACTIVE,
    NVLINK_LINKS,
    NVLINK_STATE,
    NvLink,
    Source,
)
from otel_gpu.sample.workers import DeviceWorker

log = logging.getLogger(__name__)

_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_VALUE_TYPES: tuple[Any, ...] = (ctypes.c_double, ctypes.c_uint, ctypes.c_ulong,
                                 ctypes.c_ulonglong, ctypes.c_longlong, ctypes.c_int,
                                 ctypes.c_ushort)
"""``nvmlValue_t``'s members' C types as nvml.h declares them, by value type: nvidia-ml-py
before 13.x has no ``usVal`` in its union, so a member is read from the union's bytes."""
_NOT_AVAILABLE = (None, 0xFFFFFFFF, 2**64 - 1, 2**64 - 1, 2**63 - 1, 2**31 - 1, 0xFFFF)
"""Per value type: all ones in its width (signed: saturated), NVML's "not available"."""


def _field_value(entry: Any) -> float | None:
    """The entry's value; NaN for "not available", so the source's bound omits it (and says
    so) like any other value that cannot be a reading."""
    kind = int(entry.valueType)
    if 0 <= kind < len(_VALUE_MEMBERS):
        raw = getattr(entry.value, _VALUE_MEMBERS[kind], None)
        if raw is None:  # a member the binding's union lacks: its bytes, as C reads them
            raw = _VALUE_TYPES[kind].from_buffer_copy(entry.value).value
        return math.nan if raw == _NOT_AVAILABLE[kind] else float(raw)
    return None


Answers = list[tuple[int, "float | None"]]
"""Each entry's (return code, value), in order; the value None where the code is not
success or the value type is unknown."""


def by_attribute(entries: Any, success: int) -> Answers:
    """Each entry read through pynvml's structure, one attribute at a time."""
    out: Answers = []
    for entry in entries:
        code = int(entry.nvmlReturn)
        out.append((code, _field_value(entry) if code == success else None))
    return out


def memory_reader(m: Any) -> Callable[[Any, int], Answers] | None:
    """A reader of a pynvml field-value array's entries from its memory, in one pass.

    pynvml's structures answer every attribute through Python (``__getattribute__``),
    four of them per entry: about 200 calls a sample for an H100's 49 entries. The
    array's bytes are unpacked with the layout ctypes itself gives the structure (the
    offsets and sizes of its members, checked here) and each value as nvml.h's member
    type (the binding's, where its union has the member, checked to be the same size),
    so the answer is the one the attributes give. None where the layout is not one this
    can read; anything that is not such an array is read by attribute
    (:func:`by_attribute`).
    """
    entry: Any = getattr(m, "c_nvmlFieldValue_t", None)
    union: Any = getattr(m, "c_nvmlValue_t", None)
    try:
        kind, code, value = entry.valueType, entry.nvmlReturn, entry.value
        members = dict(union._fields_)
        decoders = [struct.Struct("@" + c_type._type_) for c_type in _VALUE_TYPES]
        size = ctypes.sizeof(entry)
        layout = struct.Struct(f"={kind.offset}xII{value.offset - code.offset - 4}x"
                               f"{value.size}s{size - value.offset - value.size}x")
    except (AttributeError, KeyError, TypeError, ValueError, struct.error):
        return None
    if (kind.size, code.size, code.offset) != (4, 4, kind.offset + 4) \
            or layout.size != size or any(
                d.size > value.size or (name in members
                                        and d.size != ctypes.sizeof(members[name]))
                for d, name in zip(decoders, _VALUE_MEMBERS, strict=True)):
        return None
    readers = [(d.unpack_from, sentinel) for d, sentinel in zip(decoders, _NOT_AVAILABLE,
                                                                 strict=True)]
    known = len(readers)

    def read(entries: Any, success: int) -> Answers:
        if not isinstance(entries, ctypes.Array) or entries._type_ is not entry:
            return by_attribute(entries, success)
        out: Answers = []
        for kind_of, code_of, raw in layout.iter_unpack(bytes(entries)):
            if code_of != success or kind_of >= known:
                out.append((code_of, None))
                continue
            unpack, sentinel = readers[kind_of]
            number = unpack(raw)[0]
            out.append((code_of, math.nan if number == sentinel else float(number)))
        return out

    return read


class FieldReads:
    """The batched field reads of the catalog's field sources, one device at a time."""

    def __init__(self, nvml: Nvml, sources: Iterable[Source], outcomes: Outcomes) -> None:
        self._nvml = nvml
        self._m = nvml.module
        sources = tuple(sources)
        self._fields: tuple[Source, ...] = tuple(s for s in sources if s.field_id is not None)
        # The link states are read before the fields: the NVLink fields need the active links.
        self.nvlink = any(s.nvlink is not None or s.reader is NVLINK_STATES for s in sources)
        self._outcomes = outcomes
        self._entries = memory_reader(self._m) or by_attribute

    def read(
        self, t: Tracked, values: dict[str, float], unsupported: list[str],
        worker: DeviceWorker, retry: set[str],
    ) -> str | None:
        """The batched fields; the keys whose call must stand in this time go in ``retry``.

        Where the driver answers the NVLink link states in the batch as the call per link
        does (compared once, on the first read), they come in the same call: the NVLink
        fields are then asked for the links active at the last read, and kept for the
        links active now.
        """
        states = self._states_batched(t)
        if states:
            links = t.links.active_links
        else:
            links, failure = self._read_links(t, values, unsupported, worker)
            if failure is not None:
                return failure
        check = states or self._states_checkable(t)
        wanted = [s for s in self._fields if s.key not in t.reads.unsupported
                  and s.key not in t.links.unbatched
                  and (s.nvlink is None or links)]  # no NVLink series without an active link
        if not (wanted or check) or "fields" in t.reads.unsupported:
            return None
        m = self._m
        while True:
            requests = self._requests(t, wanted, links)
            if check:
                requests += [(NVLINK_STATE, link) for link in range(t.links.link_count)]
            with worker.doing("field values"):
                res = self._nvml.call(m.nvmlDeviceGetFieldValues, t.handle,
                                      [(src.field_id, scope) for src, scope in requests])
            newer = [src.key for src in wanted if src.fallback is not None]
            if res.ok or res.outcome is not Outcome.UNSUPPORTED or not (newer or check):
                break
            # A driver refusing the whole call may not know one of the newer ids: ask once
            # more without the values that have a call of their own, which give them.
            t.links.unbatched.update(newer)
            retry.update(newer)
            log.debug("%s: the batched call was refused (%s); asking again without %s, read "
                      "with their own calls from now on", t.label(), error_name(res.code, m),
                      ", ".join(newer + ([NVLINK_STATE.key] if check else [])))
            if check:
                t.links.states_batched = False
            if states:
                links, failure = self._read_links(t, values, unsupported, worker)
                if failure is not None:
                    return failure
            check = states = False
            wanted = [src for src in wanted if src.fallback is None
                      and (src.nvlink is None or links)]
            if not wanted:
                return None
        if not res.ok:
            if res.outcome is Outcome.TRANSIENT:
                retry.update(s.key for s in wanted if s.fallback is not None)
                if states:  # the states then come from their own calls this time
                    _, failure = self._read_links(t, values, unsupported, worker)
                    if failure is not None:
                        return failure
            return self._outcomes.act(t, "fields", res, unsupported)
        answers: dict[str, dict[int, tuple[int, float | None]]] = {}
        for (src, scope), answer in zip(requests, self._entries(res.value, abi.NVML_SUCCESS),
                                        strict=False):
            answers.setdefault(src.key, {})[scope] = answer
        if check:
            links, failure = self._batched_links(
                t, values, answers.pop(NVLINK_STATE.key, {}), links, states, unsupported, worker)
            if failure is not None:
                return failure
        unbatched: list[str] = []
        for src in wanted:
            if src.nvlink is not None and not links:
                continue  # no link is active now: no NVLink series
            got = answers.get(src.key, {})
            if src.nvlink is NvLink.LINKS:
                code, value = self._link_sum(t, src, got, links)
            else:
                code, value = got.get(0, (abi.NVML_SUCCESS, None))
            if code == abi.NVML_SUCCESS:
                if value is not None:
                    values[src.key] = value
                continue
            outcome = classify(code, m)
            if src.fallback is not None and outcome is not Outcome.DEVICE_FAILED:
                # Its plain call stands in: from now on where the driver lacks the field id,
                # this sample only for another error.
                retry.add(src.key)
                if outcome is Outcome.UNSUPPORTED:
                    t.links.unbatched.add(src.key)
                    unbatched.append(f"{src.key} ({error_name(code, m)})")
                continue
            failure = self._outcomes.act(
                t, src.key, Result(None, outcome, code, error_name(code, m)), unsupported
            )
            if failure is not None:
                return failure
        if unbatched:
            log.debug("%s: the driver does not answer %s in the batched call; read with "
                      "their own calls from now on", t.label(), ", ".join(unbatched))
        return None

    @staticmethod
    def _requests(t: Tracked, wanted: list[Source], links: tuple[int, ...],
                  ) -> list[tuple[Source, int]]:
        """The (field, scope) pairs to ask for ``wanted``."""
        requests: list[tuple[Source, int]] = []
        for src in wanted:
            if src.nvlink is NvLink.LINKS:
                # Until the driver has shown whether it answers the all-links scope, ask
                # for both in the same call.
                total = t.links.link_totals.get(src.key)
                if total is not False:
                    requests.append((src, ALL_LINKS))
                if total is not True:
                    requests.extend((src, link) for link in links)
            else:
                requests.append((src, 0))
        return requests

    def _states_batched(self, t: Tracked) -> bool:
        """Whether this device's link states come in the batch (decided on its first read)."""
        return (self.nvlink and t.links.states_batched is True and NVLINK_STATES.name not in
                t.reads.unsupported and "fields" not in t.reads.unsupported)

    def _states_checkable(self, t: Tracked) -> bool:
        """Whether to ask the batch for the link states too, to compare with the calls."""
        return (self.nvlink and t.links.states_batched is None and t.links.link_count > 0
                and NVLINK_STATES.name not in t.reads.unsupported)

    def _batched_links(
        self, t: Tracked, values: dict[str, float],
        states: Mapping[int, tuple[int, float | None]], links: tuple[int, ...], batched: bool,
        unsupported: list[str], worker: DeviceWorker,
    ) -> tuple[tuple[int, ...], str | None]:
        """The links active now, from the batch's state entries.

        On the first read (``batched`` false) the calls per link have answered too: the
        batch gives the states from then on only if it said the same. A state entry that
        fails makes the calls answer this time, and for good where the driver lacks it.
        """
        m = self._m
        answered = [states.get(link, (abi.NVML_ERROR_NOT_SUPPORTED, None))
                    for link in range(t.links.link_count)]
        failed = [code for code, _ in answered if code != abi.NVML_SUCCESS]
        active = () if failed else tuple(
            link for link, (_, value) in enumerate(answered)
            if value == abi.NVML_NVLINK_STATE_ACTIVE)
        if not batched:
            t.links.states_batched = not failed and active == links
            if not t.links.states_batched:
                log.debug("%s: the batched NVLink states do not match the calls per link "
                          "(%s); asking each link from now on", t.label(),
                          ", ".join(error_name(c, m) for c in failed) or "different states")
            return links, None
        if failed:
            if any(classify(code, m) is Outcome.UNSUPPORTED for code in failed):
                t.links.states_batched = False
            return self._read_links(t, values, unsupported, worker)
        t.links.active_links = active
        if active:
            values[NVLINK_LINKS.key] = len(active)
            values[NVLINK_ACTIVE.key] = sum(1 << link for link in active)
        return active, None

    def _read_links(
        self, t: Tracked, values: dict[str, float], unsupported: list[str],
        worker: DeviceWorker,
    ) -> tuple[tuple[int, ...], str | None]:
        """The device's active NVLink links, one call per link (none: no NVLink values)."""
        if not self.nvlink or NVLINK_STATES.name in t.reads.unsupported:
            return (), None
        with worker.doing(NVLINK_STATES.name):
            res = self._nvml.call(NVLINK_STATES.read, self._m, t.handle)
        if not res.ok:
            return (), self._outcomes.act(t, NVLINK_STATES.name, res, unsupported)
        answer = dict(res.value)
        t.links.link_count = int(answer.pop(LINK_COUNT, 0))
        values.update(answer)
        mask = int(answer.get(NVLINK_ACTIVE.key, 0))
        t.links.active_links = tuple(link for link in range(mask.bit_length()) if mask >> link & 1)
        return t.links.active_links, None

    def _link_sum(
        self, t: Tracked, src: Source, got: Mapping[int, tuple[int, float | None]],
        links: tuple[int, ...],
    ) -> tuple[int, float | None]:
        """A links field's total: the all-links scope's answer, else the active links' sum.

        A sum needs every active link's answer: a partial one would look like a counter
        reset (a link that came up since the request was made is summed from the next
        read on). The first answer decides which of the two is asked for from then on.
        """
        total = got.get(ALL_LINKS)
        if total is not None and total[0] == abi.NVML_SUCCESS:
            t.links.link_totals[src.key] = True
            return total
        per_link = [got[link] for link in links if link in got]
        if not per_link:  # the all-links scope answered before: ask for both again next time
            t.links.link_totals.pop(src.key, None)
            return abi.NVML_SUCCESS, None
        for code, _ in per_link:
            if code != abi.NVML_SUCCESS:
                return code, None
        if total is not None:
            t.links.link_totals[src.key] = False
        if len(per_link) < len(links):
            return abi.NVML_SUCCESS, None
        return abi.NVML_SUCCESS, sum(v for _, v in per_link if v is not None)
