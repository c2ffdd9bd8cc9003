"""Loading a scenario: the YAML tree into a :class:`~.model.Scenario`, validated in full.

The driver never meets a malformed value halfway through a run: every problem
is a :class:`~.model.ScenarioError` at start-up naming the file and the key
path. The keys each part takes, and how each is read, come from the spec
classes (:func:`~.model.key`); what is left here is what spans keys: defaults
derived from other keys, generated identities and uniqueness (the node's pods
and containers in :mod:`.node`). The symbols faults may name are the fake
driver's own (``FakeNvml.device_symbols()`` and its MIG and system symbols).
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from otel_gpu import nvml_abi as abi
from otel_gpu._files import FileError, parse_yaml, read_text
from otel_gpu.sim.scenario._checks import field_id, show, uuid5
from otel_gpu.sim.scenario.model import (
    FABRIC_HEALTH_SUMMARIES,
    FABRIC_STATES,
    MAX_GPUS,
    MAX_MIG_DEVICES,
    MAX_SLOW_SECONDS,
    NVLINK_COUNTERS,
    NVLINK_FIELDS,
    Fabric,
    Gpm,
    GpuSpec,
    MigSpec,
    NvLinks,
    NvLinkSpec,
    Scenario,
    ScenarioError,
    ShapeSpec,
    Slow,
    Value,
    Xid,
    yaml_keys,
)
from otel_gpu.sim.scenario.node import NodeChecks

PROFILES_DIR = Path(__file__).parent.with_name("profiles")
_ONLY_SINGLE = ("uuid", "pci_bus_id", "serial", "minor_number")
"""A GPU's keys that each GPU of a ``count`` entry would need its own of."""


@dataclass(frozen=True)
class Symbols:
    """The C symbols a scenario's faults may name, per level: the driver's that plays it."""

    device: frozenset[str]
    mig: frozenset[str]
    system: frozenset[str]
    any: frozenset[str] = frozenset()
    """Every symbol the driver answers: what an answer shape may name."""


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_scenario(spec: str, *, device_symbols: Collection[str] | None = None) -> Scenario:
    """Load a built-in profile by name, or a scenario file by path, validating all of it.

    ``device_symbols`` are the C symbols a device's ``unsupported`` /
    ``no_permission`` / ``errors`` / ``slow`` may name: those of the driver that
    will play the scenario (default: the built-in ``FakeNvml``'s;
    ``MyFake.device_symbols()`` for a subclass).
    """
    # The driver stands on the model, so it is imported here, not at the top.
    from otel_gpu.sim.driver import FakeNvml

    symbols = Symbols(
        device=frozenset(FakeNvml.device_symbols() if device_symbols is None
                         else device_symbols),
        mig=FakeNvml.mig_symbols(),
        system=FakeNvml.system_symbols(),
        any=FakeNvml.c_symbols() | frozenset(() if device_symbols is None else device_symbols),
    )
    spec = str(spec)
    if spec in builtin_profiles():
        path, label = PROFILES_DIR / f"{spec}.yaml", f"{spec}.yaml"
    else:
        path, label = Path(spec), spec
        if not _exists(path):
            raise ScenarioError(
                f"scenario {spec!r}: no such file or built-in profile "
                f"(built-in profiles: {', '.join(builtin_profiles())})"
            )
    # Bounded, regular files only, UTF-8, and YAML without aliases, duplicate keys or
    # deep nesting: a scenario is outside input like any other file.
    try:
        raw = parse_yaml(read_text(str(path), "scenario"), f"scenario {label}: invalid YAML")
    except FileError as exc:
        raise ScenarioError(str(exc)) from None
    scenario = _Parser(label, path.stem, symbols).scenario(raw)
    return replace(scenario, source=spec)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _gpm_metric_id(key: Any) -> int | None:
    """A GPM metric's id from its scenario spelling, or None when it names no metric."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key if 0 < key < abi.NVML_GPM_METRIC_MAX else None
    if not isinstance(key, str) or key == "MAX":
        return None
    value = getattr(abi, "NVML_GPM_METRIC_" + key, None)
    return value if isinstance(value, int) else None


def _make_uuid(prefix: str, *parts: Any) -> str:
    return prefix + str(uuid5("/".join(map(str, parts))))


class _Parser(NodeChecks):
    """Turns the YAML tree into a :class:`Scenario`, failing on the first problem."""

    def __init__(self, label: str, default_name: str, symbols: Symbols) -> None:
        super().__init__(label)
        self.default_name = default_name
        self.symbols = symbols

    # the parser methods the spec fields name that are not basic checks

    def device_function(self, path: str, raw: Any) -> str:
        if raw not in self.symbols.device:
            self.fail(path, f"unknown NVML device function {show(raw)}")
        return raw

    def any_function(self, path: str, raw: Any) -> str:
        if raw not in self.symbols.any:
            self.fail(path, f"unknown NVML function {show(raw)}")
        return raw

    def shape(self, path: str, raw: Any) -> str:
        from otel_gpu.sim.driver.shapes import ShapeError, parse_shape

        try:
            parse_shape(self.string(path, raw))
        except ShapeError as exc:
            self.fail(path, str(exc))
        return raw

    def shapes(self, path: str, raw: Any) -> tuple[ShapeSpec, ...]:
        return tuple(
            ShapeSpec(**self.read(ShapeSpec, f"{path}[{i}]",
                                  self.keys(ShapeSpec, f"{path}[{i}]", item)))
            for i, item in enumerate(self.sequence(path, raw)))

    def seconds(self, path: str, raw: Any) -> float:
        return float(self.number(path, raw, maximum=MAX_SLOW_SECONDS))

    def slow(self, path: str, raw: Any) -> tuple[Slow, ...]:
        return tuple(Slow(**self.read(Slow, f"{path}[{i}]", self.keys(Slow, f"{path}[{i}]", item)))
                     for i, item in enumerate(self.sequence(path, raw)))

    def xid(self, path: str, raw: Any) -> tuple[Xid, ...]:
        out = [Xid(**self.read(Xid, f"{path}[{i}]", self.keys(Xid, f"{path}[{i}]", item)))
               for i, item in enumerate(self.sequence(path, raw))]
        return tuple(sorted(out, key=lambda x: x.sample))

    def busy(self, path: str, raw: Any) -> tuple[int, int | None] | None:
        if isinstance(raw, dict):
            self.mapping(path, raw, ("from_sample", "until_sample"))
            until = raw.get("until_sample")
            return (self.integer(f"{path}.from_sample", raw.get("from_sample", 0)),
                    None if until is None else self.integer(f"{path}.until_sample", until))
        return (0, None) if self.boolean(path, raw) else None

    def gpm(self, path: str, raw: Any, mig: bool = False) -> Gpm:
        if not isinstance(raw, dict):
            self.fail(path, f"expected a mapping of GPM metric name to value, got {show(raw)}")
        flags = tuple(k for k in yaml_keys(Gpm) if not (mig and k == "unsupported"))
        metrics: dict[int, Value] = {}
        for key, value in raw.items():
            p = f"{path}.{key}"
            if key in flags:
                continue
            metric = _gpm_metric_id(key)
            if metric is None:
                self.fail(p, "unknown key (expected a pynvml NVML_GPM_METRIC_<NAME> without the "
                             f"prefix, an id, or one of: {', '.join(flags)})")
            if metric in metrics:
                self.fail(p, f"GPM metric {metric} is listed twice")
            metrics[metric] = self.value(p, value)
        gpm = Gpm(metrics=MappingProxyType(metrics), **self.read(Gpm, path, raw))
        if gpm.unsupported and metrics:
            self.fail(path, "metric values with unsupported: true are never read (the "
                            "support query says no): drop them, or unsupported")
        return gpm

    def nvlink(self, path: str, raw: Any) -> NvLinks:
        self.keys(NvLinks, path, raw)
        items = self.sequence(f"{path}.links", raw["links"])
        if len(items) > abi.NVML_NVLINK_MAX_LINKS:
            self.fail(f"{path}.links", f"at most {abi.NVML_NVLINK_MAX_LINKS} links")
        links = []
        for i, item in enumerate(items):
            p = f"{path}.links[{i}]"
            self.keys(NvLinkSpec, p, item)
            state = item.get("state", "active")
            if state not in ("active", "inactive"):
                self.fail(f"{p}.state", f"expected active or inactive, got {show(state)}")
            links.append(NvLinkSpec(
                active=state == "active",
                counters=MappingProxyType({k: self.value(f"{p}.{k}", item[k])
                                           for k in NVLINK_COUNTERS if k in item}),
                **self.read(NvLinkSpec, p, item),
            ))
        return NvLinks(links=tuple(links), **self.read(NvLinks, path, raw))

    def fabric(self, path: str, raw: Any) -> Fabric:
        self.keys(Fabric, path, raw)
        named: dict[str, Any] = {}
        if "state" in raw:
            named["state"] = FABRIC_STATES[self.choice(f"{path}.state", raw["state"],
                                                       tuple(FABRIC_STATES))]
        if "health_summary" in raw:
            named["health_summary"] = FABRIC_HEALTH_SUMMARIES[self.choice(
                f"{path}.health_summary", raw["health_summary"], tuple(FABRIC_HEALTH_SUMMARIES))]
        if "status" in raw:
            status = raw["status"]
            code = abi.NVML_SUCCESS if status == "SUCCESS" else getattr(
                abi, f"NVML_ERROR_{status}", None) if isinstance(status, str) else None
            if not isinstance(code, int):
                self.fail(f"{path}.status", f"expected SUCCESS or an NVML_ERROR_ name without "
                                            f"the prefix (e.g. TIMEOUT), got {show(status)}")
            named["status"] = code
        if "cluster_uuid" in raw:
            text = self.string(f"{path}.cluster_uuid", raw["cluster_uuid"])
            try:
                named["cluster_uuid"] = uuidlib.UUID(text).bytes
            except ValueError:
                self.fail(f"{path}.cluster_uuid", f"expected a UUID, got {show(text)}")
        return Fabric(**named, **self.read(Fabric, path, raw))

    # the tree

    def scenario(self, raw: Any) -> Scenario:
        top = self.keys(Scenario, "", raw)
        name = self.string("name", top["name"]) if "name" in top else self.default_name
        driver = self.string("driver_version", top.get("driver_version", "550.90.07"),
                             " (quote it in YAML)")
        nvml = self.string("nvml_version", top.get("nvml_version", f"12.{driver}"),
                           " (quote it in YAML)")
        faults = self.faults("", {"errors": top.get("errors", {})},
                             self.symbols.system, allow_fields=False)
        entries = self.sequence("devices", top["devices"])
        pending: list[tuple[str, GpuSpec, dict]] = []
        index = 0
        for i, entry in enumerate(entries):
            for gpu, explicit in self.gpu_entry(f"devices[{i}]", entry, index):
                pending.append((f"devices[{i}]", gpu, explicit))
                index += 1
        devices = tuple(self.identify(name, path, gpu, explicit) for path, gpu, explicit in pending)
        node = self.node("node", top["node"], name, devices) if "node" in top else None
        shapes = self.shapes("shapes", top["shapes"]) if "shapes" in top else ()
        return Scenario(name=name, driver_version=driver, devices=devices, nvml_version=nvml,
                        faults=faults, node=node, shapes=shapes)

    def gpu_entry(self, path: str, raw: Any, first_index: int) -> Iterator[tuple[GpuSpec, dict]]:
        self.keys(GpuSpec, path, raw, extra=("count",))
        count = self.integer(f"{path}.count", raw.get("count", 1), minimum=1)
        if first_index + count > MAX_GPUS:
            self.fail(f"{path}.count" if "count" in raw else path,
                      f"at most {MAX_GPUS} GPUs in a scenario ({first_index} before this entry, "
                      f"{count} in it)")
        if count > 1:
            for key in _ONLY_SINGLE:
                if key in raw:
                    self.fail(f"{path}.{key}", "not allowed with count > 1 (each GPU needs "
                                               "its own: write separate entries)")
        name = self.string(f"{path}.name", raw["name"])
        explicit: dict[str, Any] = {}
        if "uuid" in raw:
            explicit["uuid"] = self.uuid(f"{path}.uuid", raw["uuid"], "GPU-")
        if "pci_bus_id" in raw:
            explicit["pci_bus_id"] = self.bus_id(f"{path}.pci_bus_id", raw["pci_bus_id"])
        if "serial" in raw:
            serial = raw["serial"]
            if isinstance(serial, int) and not isinstance(serial, bool) and serial >= 0:
                serial = str(serial)
            explicit["serial"] = self.string(f"{path}.serial", serial)
        if "minor_number" in raw:
            explicit["minor_number"] = self.integer(f"{path}.minor_number", raw["minor_number"])
        mig_capable = raw.get("mig_capable")
        if mig_capable is not None:
            self.boolean(f"{path}.mig_capable", mig_capable)
        mig_raw = self.sequence(f"{path}.mig", raw.get("mig", []))
        if mig_raw and mig_capable is False:
            self.fail(f"{path}.mig", "MIG instances on a GPU with mig_capable: false")
        if len(mig_raw) > MAX_MIG_DEVICES:
            self.fail(f"{path}.mig", f"at most {MAX_MIG_DEVICES} MIG instances per GPU")
        if count > 1:
            for j, item in enumerate(mig_raw):
                if isinstance(item, dict) and "uuid" in item:
                    self.fail(f"{path}.mig[{j}].uuid", "not allowed with count > 1")
        if "nvlink" in raw:
            fields = raw.get("fields")
            for key in fields if isinstance(fields, dict) else ():
                if field_id(key) in NVLINK_FIELDS:
                    self.fail(f"{path}.fields.{key}",
                              "an NVLink field is given per link, in nvlink.links")
        processes = self.processes(f"{path}.processes", raw.get("processes", []), count)
        base = GpuSpec(
            index=0, position=0, name=name, uuid="", pci_bus_id="", minor_number=0, serial="",
            faults=self.faults(path, raw, self.symbols.device, allow_fields=True),
            mig_capable=bool(mig_capable) or bool(mig_raw),
            **self.read(GpuSpec, path, raw),
        )
        for k in range(count):
            gpu = replace(
                base,
                index=first_index + k,
                position=k,
                processes=tuple(p for p, pos in processes if pos is None or k in pos),
            )
            yield gpu, {**explicit, "mig": mig_raw}

    def identify(self, scenario: str, path: str, gpu: GpuSpec, explicit: dict) -> GpuSpec:
        """Give a GPU its identity, generating what the entry left out, and its MIG instances."""
        index = gpu.index
        uuid = explicit.get("uuid") or self.claim_uuid(
            f"{path} (generated for GPU {index})", _make_uuid("GPU-", scenario, index))
        bus = explicit.get("pci_bus_id") or self.free_bus_id(f"{path} (generated)")
        mig = tuple(
            self.mig(f"{path}.mig[{j}]", item, j, scenario, gpu)
            for j, item in enumerate(explicit["mig"])
        )
        seen: dict[tuple[int, int], int] = {}
        for m in mig:
            ids = (m.gpu_instance_id, m.compute_instance_id)
            if ids in seen:
                self.fail(f"{path}.mig[{m.slot}]", f"duplicate (gpu_instance_id, "
                                                    f"compute_instance_id) {ids} "
                                                    f"(also {path}.mig[{seen[ids]}])")
            seen[ids] = m.slot
        return replace(
            gpu,
            uuid=uuid,
            pci_bus_id=bus,
            minor_number=explicit.get("minor_number", index),
            serial=explicit.get("serial", str(1650000000000 + index)),
            mig=mig,
        )

    def mig(self, path: str, raw: Any, slot: int, scenario: str, gpu: GpuSpec) -> MigSpec:
        self.keys(MigSpec, path, raw)
        profile = self.string(f"{path}.profile", raw["profile"])
        if "uuid" in raw:
            uuid = self.uuid(f"{path}.uuid", raw["uuid"], "MIG-")
        else:
            uuid = self.claim_uuid(f"{path} (generated)",
                                   _make_uuid("MIG-", scenario, gpu.index, slot))
        if "gpm" in raw and (gpu.gpm is None or gpu.gpm.unsupported):
            self.fail(f"{path}.gpm", "GPM values of a MIG instance are never read when its GPU "
                                     "has no GPM (give the GPU gpm, or drop these)")
        return MigSpec(
            slot=slot,
            profile=profile,
            name=f"{gpu.name} MIG {profile}",
            uuid=uuid,
            processes=tuple(p for p, _ in self.processes(f"{path}.processes",
                                                          raw.get("processes", []), 0,
                                                          utilization=False)),
            faults=self.faults(path, raw, self.symbols.mig, allow_fields=False),
            **self.read(MigSpec, path, raw),
        )
