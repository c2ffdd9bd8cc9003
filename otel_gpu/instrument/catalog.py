"""The metric catalog: the one table every output of the metrics is built from.

Each :class:`~otel_gpu.instrument.schema.Metric` row says what the metric is
called, which OpenTelemetry instrument carries it, its unit, where NVML
provides the value and how the raw NVML value is converted. Instrument
registration, ``otel-gpu metrics`` and ``docs/metrics.md`` are all generated
from :data:`CATALOG`, so a metric cannot be added in one place and forgotten
in another. This module is the table and nothing else: the row schema is in
:mod:`~otel_gpu.instrument.schema`, the attribute names in
:mod:`~otel_gpu.instrument.attributes`, the rows that are not one reading in
:mod:`~otel_gpu.instrument.observe`.

Names follow the OpenTelemetry hardware semantic conventions (``hw.*``)
where one exists. Values with no convention live in the documented vendor
namespace ``nvidia.gpu.*``; the collector's own health is ``otel_gpu.*``.
"""

from __future__ import annotations

from collections.abc import Iterable

from otel_gpu.instrument import build, gputime, observe
from otel_gpu.instrument.attributes import (
    ENERGY_RULE,
    HW_ID,
    HW_STATE,
    K8S_RESOURCE,
    OMITTED_BECAUSE,
    PROCESS_OWNER,
    READER,
    REPLICA,
    UNATTRIBUTED,
    USAGE_ATTRIBUTES,
)
from otel_gpu.instrument.schema import (
    KB_PER_S,
    KIB,
    MHZ,
    MIB,
    MILLI,
    NANO,
    PERCENT,
    Kind,
    Metric,
    Point,
)
from otel_gpu.instrument.schema import all_sources as _all_sources
from otel_gpu.sample.sources import (
    CLOCK_GRAPHICS,
    CLOCK_MAX_GRAPHICS,
    CLOCK_MAX_MEM,
    CLOCK_MAX_SM,
    CLOCK_MAX_VIDEO,
    CLOCK_MEM,
    CLOCK_REASONS,
    CLOCK_SM,
    CLOCK_VIDEO,
    ECC_CORRECTED,
    ECC_CORRECTED_AGGREGATE,
    ECC_UNCORRECTED,
    ECC_UNCORRECTED_AGGREGATE,
    ENERGY,
    FABRIC_FAILED,
    FABRIC_HEALTH_FLAGS,
    FABRIC_STATE_FLAGS,
    FAN,
    GPM_DRAM,
    GPM_FP16,
    GPM_FP32,
    GPM_FP64,
    GPM_GRAPHICS,
    GPM_INTEGER,
    GPM_NVDEC,
    GPM_NVJPG,
    GPM_NVLINK_RX,
    GPM_NVLINK_TX,
    GPM_NVOFA,
    GPM_PCIE_RX,
    GPM_PCIE_TX,
    GPM_SM_ACTIVE,
    GPM_SM_OCCUPANCY,
    GPM_TENSOR,
    GPM_TENSOR_DFMA,
    GPM_TENSOR_DMMA,
    GPM_TENSOR_HMMA,
    GPM_TENSOR_IMMA,
    MEM_FREE,
    MEM_RESERVED,
    MEM_TOTAL,
    MEM_USED,
    NVLINK_ERRORS,
    NVLINK_LINKS,
    NVLINK_RX,
    NVLINK_TX,
    PCIE_GEN,
    PCIE_GEN_MAX,
    PCIE_REPLAY,
    PCIE_RX,
    PCIE_THROUGHPUT_RX,
    PCIE_THROUGHPUT_TX,
    PCIE_TX,
    PCIE_WIDTH,
    PCIE_WIDTH_MAX,
    POWER,
    POWER_LIMIT,
    POWER_LIMIT_DEFAULT,
    POWER_LIMIT_ENFORCED,
    POWER_LIMIT_MAX,
    POWER_LIMIT_MIN,
    PROCESSES,
    PSTATE,
    REMAP_COR,
    REMAP_FAILURE,
    REMAP_PENDING,
    REMAP_UNC,
    RETIRED_DBE,
    RETIRED_PENDING,
    RETIRED_SBE,
    ROW_REMAP_BANKS,
    TEMP_GPU,
    TEMP_MEM,
    THROTTLE_REASONS,
    UTIL_DEC,
    UTIL_ENC,
    UTIL_GPU,
    UTIL_MEM,
    VIOLATIONS,
    Source,
)
from otel_gpu.workload import POD_ATTRIBUTES

_TO_CONTAINER = "per container (/proc/PID/cgroup; kubelet /var/log/pods, or the runtime's API)"
_SHARE_SOURCE = ("nvmlDeviceGetProcessesUtilizationInfo (else nvmlDeviceGetProcessUtilization) "
                 ".{field} (percent / 100), averaged per process since the previous sample, "
                 "summed " + _TO_CONTAINER)

CATALOG: tuple[Metric, ...] = (
    # OpenTelemetry hardware semantic conventions
    Metric(
        "hw.gpu.utilization", Kind.GAUGE, "1",
        "Fraction of time the GPU's engines were busy over NVML's last sample period.",
        points=(
            Point(UTIL_GPU, {"hw.gpu.task": "general"}, PERCENT),
            Point(UTIL_ENC, {"hw.gpu.task": "encoder"}, PERCENT),
            Point(UTIL_DEC, {"hw.gpu.task": "decoder"}, PERCENT),
        ),
    ),
    Metric(
        "hw.gpu.memory.usage", Kind.UPDOWNCOUNTER, "By",
        "GPU memory (framebuffer) in use.",
        points=(Point(MEM_USED),),
    ),
    Metric(
        "hw.gpu.memory.limit", Kind.UPDOWNCOUNTER, "By",
        "Total GPU memory (framebuffer).",
        points=(Point(MEM_TOTAL),),
    ),
    Metric(
        "hw.gpu.memory.utilization", Kind.GAUGE, "1",
        "Fraction of GPU memory in use (used / total); not memory-controller busy time.",
        points=(Point(MEM_USED, per=MEM_TOTAL),),
    ),
    Metric(
        "hw.gpu.io", Kind.COUNTER, "By",
        "Bytes moved over PCIe by the GPU.",
        points=(
            Point(PCIE_RX, {"network.io.direction": "receive"}),
            Point(PCIE_TX, {"network.io.direction": "transmit"}),
        ),
    ),
    Metric(
        "hw.power", Kind.GAUGE, "W",
        "Power drawn by the GPU board.",
        points=(Point(POWER, conversion=MILLI),),
    ),
    Metric(
        "hw.energy", Kind.COUNTER, "J",
        "Energy consumed by the GPU since the driver was loaded.",
        points=(Point(ENERGY, conversion=MILLI),),
    ),
    Metric(
        "hw.temperature", Kind.GAUGE, "Cel",
        "Temperature of the GPU die and of its memory.",
        points=(
            Point(TEMP_GPU, {"hw.sensor_location": "gpu"}),
            Point(TEMP_MEM, {"hw.sensor_location": "memory"}),
        ),
    ),
    Metric(
        "hw.errors", Kind.COUNTER, "{error}",
        "ECC memory errors since the driver was loaded (volatile counts).",
        points=(
            Point(ECC_CORRECTED, {"error.type": "corrected"}),
            Point(ECC_UNCORRECTED, {"error.type": "uncorrected"}),
        ),
    ),
    Metric(
        "hw.status", Kind.UPDOWNCOUNTER, "1",
        "Device state: one series per hw.state, 1 for the current state and 0 for the others "
        "(a hung device keeps its last state; see otel_gpu.device.sample.age).",
        per_device=observe.status,
        attributes=(HW_STATE,),
        reported_when_failed=True,
        source_doc=(
            "collector: `failed` when NVML reports the device lost or broken; "
            "`predicted_failure` when a row remapping failed; `degraded` when a row "
            "remapping or a page retirement is pending; `ok` otherwise"
        ),
    ),
    # NVIDIA-specific values with no OpenTelemetry convention
    Metric(
        "nvidia.gpu.info", Kind.GAUGE, "1",
        "1 for each GPU and MIG instance, with every device attribute: model, name, vendor, "
        "driver version, serial number, PCI bus id and NUMA node beside hw.id, and the "
        "NVLink fabric's clique and cluster where the GPU is in one. With "
        "device_attributes identity, the other series carry only the device's identity and "
        "its pods: join it on hw.id for the rest.",
        per_device=observe.info,
        attributes=observe.FABRIC_ATTRIBUTES,
        reported_when_failed=True,
        describes_device=True,
        source_doc="collector (device discovery); the NVLink fabric's clique id and "
        "cluster UUID from nvmlDeviceGetGpuFabricInfoV once its registration completed",
    ),
    Metric(
        "nvidia.gpu.clock.frequency", Kind.GAUGE, "Hz",
        "Current clock frequency of each clock domain.",
        points=(
            Point(CLOCK_SM, {"nvidia.gpu.clock.domain": "sm"}, MHZ),
            Point(CLOCK_MEM, {"nvidia.gpu.clock.domain": "memory"}, MHZ),
            Point(CLOCK_GRAPHICS, {"nvidia.gpu.clock.domain": "graphics"}, MHZ),
            Point(CLOCK_VIDEO, {"nvidia.gpu.clock.domain": "video"}, MHZ),
        ),
    ),
    Metric(
        "nvidia.gpu.clock.max_frequency", Kind.GAUGE, "Hz",
        "Highest frequency each clock domain can run at (compare with "
        "nvidia.gpu.clock.frequency).",
        points=(
            Point(CLOCK_MAX_SM, {"nvidia.gpu.clock.domain": "sm"}, MHZ),
            Point(CLOCK_MAX_MEM, {"nvidia.gpu.clock.domain": "memory"}, MHZ),
            Point(CLOCK_MAX_GRAPHICS, {"nvidia.gpu.clock.domain": "graphics"}, MHZ),
            Point(CLOCK_MAX_VIDEO, {"nvidia.gpu.clock.domain": "video"}, MHZ),
        ),
    ),
    Metric(
        "nvidia.gpu.performance_state", Kind.GAUGE, "1",
        "Performance state (P-state), 0 (maximum performance) to 15 (minimum); absent while "
        "NVML reports it unknown.",
        points=(Point(PSTATE),),
    ),
    Metric(
        "nvidia.gpu.power.limit", Kind.GAUGE, "W",
        "Board power limits: the limit set (current), the one the driver enforces after "
        "every limiter (enforced), the default, and the range the limit can be set in "
        "(min, max).",
        points=tuple(
            Point(src, {"nvidia.gpu.power.limit.type": kind}, MILLI)
            for kind, src in (("current", POWER_LIMIT), ("enforced", POWER_LIMIT_ENFORCED),
                              ("default", POWER_LIMIT_DEFAULT), ("min", POWER_LIMIT_MIN),
                              ("max", POWER_LIMIT_MAX))
        ),
    ),
    Metric(
        "nvidia.gpu.memory.free", Kind.UPDOWNCOUNTER, "By",
        "GPU memory (framebuffer) free for allocation.",
        points=(Point(MEM_FREE),),
    ),
    Metric(
        "nvidia.gpu.memory.reserved", Kind.UPDOWNCOUNTER, "By",
        "GPU memory (framebuffer) reserved by the driver and firmware.",
        points=(Point(MEM_RESERVED),),
    ),
    Metric(
        "nvidia.gpu.memory_controller.utilization", Kind.GAUGE, "1",
        "Fraction of time the memory controller was busy reading or writing.",
        points=(Point(UTIL_MEM, conversion=PERCENT),),
    ),
    Metric(
        "nvidia.gpu.pcie.replays", Kind.COUNTER, "{replay}",
        "PCIe link replays (retransmissions); a rising count points at a bad link.",
        points=(Point(PCIE_REPLAY),),
    ),
    Metric(
        "nvidia.gpu.pcie.link.generation", Kind.GAUGE, "1",
        "PCIe generation the link runs at now (it drops while idle on some GPUs).",
        points=(Point(PCIE_GEN),),
    ),
    Metric(
        "nvidia.gpu.pcie.link.max_generation", Kind.GAUGE, "1",
        "Highest PCIe generation the GPU and its slot can run at together.",
        points=(Point(PCIE_GEN_MAX),),
    ),
    Metric(
        "nvidia.gpu.pcie.link.width", Kind.GAUGE, "{lane}",
        "PCIe lanes the link runs with now: below nvidia.gpu.pcie.link.max_width under load "
        "is a degraded link.",
        points=(Point(PCIE_WIDTH),),
    ),
    Metric(
        "nvidia.gpu.pcie.link.max_width", Kind.GAUGE, "{lane}",
        "Most PCIe lanes the GPU and its slot can use together.",
        points=(Point(PCIE_WIDTH_MAX),),
    ),
    Metric(
        "nvidia.gpu.pcie.sampled_throughput", Kind.GAUGE, "By/s",
        "PCIe traffic over the 20 ms NVML samples at each read, only on GPUs without the "
        "PCIe byte counters of hw.gpu.io (elsewhere rate(hw.gpu.io) gives the traffic).",
        points=(
            Point(PCIE_THROUGHPUT_RX, {"network.io.direction": "receive"}, KB_PER_S),
            Point(PCIE_THROUGHPUT_TX, {"network.io.direction": "transmit"}, KB_PER_S),
        ),
    ),
    Metric(
        "nvidia.gpu.nvlink.io", Kind.COUNTER, "By",
        "Data bytes moved over NVLink, all links of the GPU together; absent on a GPU "
        "without an active NVLink link.",
        points=(
            Point(NVLINK_RX, {"network.io.direction": "receive"}, KIB),
            Point(NVLINK_TX, {"network.io.direction": "transmit"}, KIB),
        ),
    ),
    Metric(
        "nvidia.gpu.nvlink.links", Kind.UPDOWNCOUNTER, "{link}",
        "NVLink links up (active); absent on a GPU without an active link, so a GPU whose "
        "links all went down loses the series.",
        points=(Point(NVLINK_LINKS),),
    ),
    Metric(
        "nvidia.gpu.nvlink.errors", Kind.COUNTER, "{error}",
        "NVLink errors over all links of the GPU: flow-control CRC (crc_flit), data CRC "
        "(crc_data), replays and link recoveries; absent without an active link.",
        points=tuple(Point(src, {"error.type": kind}) for kind, src in NVLINK_ERRORS),
    ),
    Metric(
        "nvidia.gpu.fabric.state", Kind.UPDOWNCOUNTER, "1",
        "NVLink fabric registration (GB200, GB300 and other NVLink-domain systems): one "
        "series per nvidia.gpu.fabric.state, 1 for the current one. A GPU not completed "
        "cannot join its NVLink domain. Absent on a GPU in no NVLink domain (the driver "
        "refuses the call, or answers NOT_SUPPORTED).",
        points=tuple(Point(src, {"nvidia.gpu.fabric.state": name})
                     for name, src in FABRIC_STATE_FLAGS),
    ),
    Metric(
        "nvidia.gpu.fabric.registration.failed", Kind.GAUGE, "1",
        "1 when the fabric registration completed with an error (the GPU is not in its "
        "NVLink domain), 0 when it completed without; absent before it completes.",
        points=(Point(FABRIC_FAILED),),
    ),
    Metric(
        "nvidia.gpu.fabric.health", Kind.GAUGE, "1",
        "1 while a condition of the fabric health mask holds, else 0, per "
        "nvidia.gpu.fabric.health.condition: degraded_bandwidth, route_recovery (in "
        "progress), route_unhealthy, access_timeout_recovery (in progress), "
        "incorrect_configuration, partition_unassigned, fabric_manager_disconnected. "
        "Absent where the driver does not report the condition.",
        points=tuple(Point(src, {"nvidia.gpu.fabric.health.condition": name})
                     for name, src in FABRIC_HEALTH_FLAGS),
    ),
    Metric(
        "nvidia.gpu.clock.throttle", Kind.GAUGE, "1",
        "1 while the given reason holds the clocks down, else 0.",
        points=tuple(
            Point(CLOCK_REASONS, {"nvidia.gpu.throttle.reason": name}, bit=bit)
            for name, bit in THROTTLE_REASONS
        ),
    ),
    Metric(
        "nvidia.gpu.clock.throttle_time", Kind.COUNTER, "s",
        "Time the clocks were held below what was asked for, per limiting policy, since the "
        "driver was loaded.",
        points=tuple(
            Point(src, {"nvidia.gpu.throttle.reason": policy}, NANO) for policy, src in VIOLATIONS
        ),
    ),
    Metric(
        "nvidia.gpu.fan.speed", Kind.GAUGE, "1",
        "Fan speed as a fraction of its maximum (absent on passively cooled boards).",
        points=(Point(FAN, conversion=PERCENT),),
    ),
    Metric(
        "nvidia.gpu.memory.remapped_rows", Kind.COUNTER, "{row}",
        "Memory rows remapped after errors.",
        points=(
            Point(REMAP_COR, {"error.type": "corrected"}),
            Point(REMAP_UNC, {"error.type": "uncorrected"}),
        ),
    ),
    Metric(
        "nvidia.gpu.memory.row_remap.pending", Kind.GAUGE, "1",
        "1 when a row remapping waits for a GPU reset.",
        points=(Point(REMAP_PENDING),),
    ),
    Metric(
        "nvidia.gpu.memory.row_remap.failure", Kind.GAUGE, "1",
        "1 when a row remapping failed: the GPU should be replaced.",
        points=(Point(REMAP_FAILURE),),
    ),
    Metric(
        "nvidia.gpu.memory.row_remap.banks", Kind.UPDOWNCOUNTER, "{bank}",
        "Memory banks by how many spare rows they have left for remapping (NVML's row "
        "remapper histogram): a bank at none can remap no more rows.",
        points=tuple(Point(src, {"nvidia.gpu.row_remap.availability": name})
                     for name, src in ROW_REMAP_BANKS),
    ),
    Metric(
        "nvidia.gpu.memory.retired_pages", Kind.COUNTER, "{page}",
        "Memory pages retired after ECC errors (GPUs before Ampere; later ones remap rows "
        "instead).",
        points=(
            Point(RETIRED_SBE, {"nvidia.gpu.page_retirement.cause": "multiple_single_bit_ecc"}),
            Point(RETIRED_DBE, {"nvidia.gpu.page_retirement.cause": "double_bit_ecc"}),
        ),
    ),
    Metric(
        "nvidia.gpu.memory.page_retirement.pending", Kind.GAUGE, "1",
        "1 when a page waits for a GPU reset or reboot to be retired.",
        points=(Point(RETIRED_PENDING),),
    ),
    Metric(
        "nvidia.gpu.ecc.errors", Kind.COUNTER, "{error}",
        "ECC memory errors: since the driver was loaded (volatile, the counts of hw.errors) "
        "and over the GPU's lifetime (aggregate, kept in its infoROM).",
        points=(
            Point(ECC_CORRECTED, {"error.type": "corrected",
                                  "nvidia.gpu.ecc.counter_type": "volatile"}),
            Point(ECC_UNCORRECTED, {"error.type": "uncorrected",
                                    "nvidia.gpu.ecc.counter_type": "volatile"}),
            Point(ECC_CORRECTED_AGGREGATE, {"error.type": "corrected",
                                            "nvidia.gpu.ecc.counter_type": "aggregate"}),
            Point(ECC_UNCORRECTED_AGGREGATE, {"error.type": "uncorrected",
                                              "nvidia.gpu.ecc.counter_type": "aggregate"}),
        ),
    ),
    Metric(
        "nvidia.gpu.xid.errors", Kind.COUNTER, "{error}",
        "XID errors reported by the driver since the collector started, per XID code; the "
        "common codes are there at 0 from discovery on, so the first one is an increase.",
        per_device=observe.xid,
        attributes=("nvidia.gpu.xid",),
        reported_when_failed=True,
        source_doc="nvmlEventSetWait_v2 (XID critical error events), counted per `nvidia.gpu.xid`",
    ),
    Metric(
        "nvidia.gpu.processes", Kind.UPDOWNCOUNTER, "{process}",
        "Compute processes running on the device.",
        points=(Point(PROCESSES),),
    ),
    # Profiling through NVML GPM (Hopper and newer; per GPU and per MIG GPU instance): rates
    # over the interval since the previous sample, so absent from the first sample.
    Metric(
        "nvidia.gpu.graphics.activity", Kind.GAUGE, "1",
        "Fraction of time the graphics or compute engine was busy with any work since the "
        "previous sample (profiling).",
        points=(Point(GPM_GRAPHICS, conversion=PERCENT),),
    ),
    Metric(
        "nvidia.gpu.sm.activity", Kind.GAUGE, "1",
        "Fraction of time at least one warp was resident on an SM, averaged over all SMs, "
        "since the previous sample (profiling).",
        points=(Point(GPM_SM_ACTIVE, conversion=PERCENT),),
    ),
    Metric(
        "nvidia.gpu.sm.occupancy", Kind.GAUGE, "1",
        "Resident warps as a fraction of the SMs' maximum, averaged over all SMs, since the "
        "previous sample (profiling).",
        points=(Point(GPM_SM_OCCUPANCY, conversion=PERCENT),),
    ),
    Metric(
        "nvidia.gpu.tensor.activity", Kind.GAUGE, "1",
        "Fraction of time the tensor cores were busy since the previous sample, with any "
        "instruction or one kind (profiling).",
        points=(
            Point(GPM_TENSOR, {"nvidia.gpu.tensor.type": "any"}, PERCENT),
            Point(GPM_TENSOR_HMMA, {"nvidia.gpu.tensor.type": "hmma"}, PERCENT),
            Point(GPM_TENSOR_IMMA, {"nvidia.gpu.tensor.type": "imma"}, PERCENT),
            Point(GPM_TENSOR_DFMA, {"nvidia.gpu.tensor.type": "dfma"}, PERCENT),
            Point(GPM_TENSOR_DMMA, {"nvidia.gpu.tensor.type": "dmma"}, PERCENT),
        ),
    ),
    Metric(
        "nvidia.gpu.pipe.activity", Kind.GAUGE, "1",
        "Fraction of time the SMs' non-tensor FP64, FP32, FP16 or integer pipe was busy "
        "since the previous sample (profiling).",
        points=(
            Point(GPM_FP64, {"nvidia.gpu.pipe": "fp64"}, PERCENT),
            Point(GPM_FP32, {"nvidia.gpu.pipe": "fp32"}, PERCENT),
            Point(GPM_FP16, {"nvidia.gpu.pipe": "fp16"}, PERCENT),
            Point(GPM_INTEGER, {"nvidia.gpu.pipe": "integer"}, PERCENT),
        ),
    ),
    Metric(
        "nvidia.gpu.dram.activity", Kind.GAUGE, "1",
        "Device memory bandwidth used, as a fraction of the maximum, since the previous "
        "sample (profiling).",
        points=(Point(GPM_DRAM, conversion=PERCENT),),
    ),
    Metric(
        "nvidia.gpu.pcie.throughput", Kind.GAUGE, "By/s",
        "PCIe traffic of the GPU, headers included, since the previous sample (profiling).",
        points=(
            Point(GPM_PCIE_RX, {"network.io.direction": "receive"}, MIB),
            Point(GPM_PCIE_TX, {"network.io.direction": "transmit"}, MIB),
        ),
    ),
    Metric(
        "nvidia.gpu.nvlink.throughput", Kind.GAUGE, "By/s",
        "NVLink traffic of the GPU, all links, since the previous sample (profiling).",
        points=(
            Point(GPM_NVLINK_RX, {"network.io.direction": "receive"}, MIB),
            Point(GPM_NVLINK_TX, {"network.io.direction": "transmit"}, MIB),
        ),
    ),
    Metric(
        "nvidia.gpu.engine.utilization", Kind.GAUGE, "1",
        "Fraction of time the video decoders, JPEG decoders or optical flow accelerators "
        "were busy since the previous sample, averaged over the engines of the kind "
        "(profiling).",
        points=(
            Point(GPM_NVDEC, {"nvidia.gpu.engine": "nvdec"}, PERCENT),
            Point(GPM_NVJPG, {"nvidia.gpu.engine": "nvjpg"}, PERCENT),
            Point(GPM_NVOFA, {"nvidia.gpu.engine": "nvofa"}, PERCENT),
        ),
    ),
    # Kubernetes attribution (present when the kubelet's Pod Resources API answers)
    Metric(
        "nvidia.gpu.k8s.allocation", Kind.GAUGE, "1",
        "1 for each container a device is allocated to (one series per replica on shared "
        "GPUs): join it with device metrics on hw.id to see every pod sharing a GPU.",
        per_node=observe.allocations,
        attributes=(HW_ID, *POD_ATTRIBUTES, K8S_RESOURCE, REPLICA),
        source_doc="kubelet Pod Resources List",
    ),
    Metric(
        "nvidia.gpu.k8s.allocated", Kind.UPDOWNCOUNTER, "{device}",
        "Device ids of a resource allocated to containers on this node.",
        per_node=observe.allocated,
        attributes=(K8S_RESOURCE,),
        source_doc="kubelet Pod Resources List",
    ),
    Metric(
        "nvidia.gpu.k8s.allocatable", Kind.UPDOWNCOUNTER, "{device}",
        "Device ids of a resource the kubelet can allocate on this node.",
        per_node=observe.allocatable,
        attributes=(K8S_RESOURCE,),
        source_doc="kubelet Pod Resources GetAllocatableResources",
    ),
    Metric(
        "nvidia.gpu.numa.alignment", Kind.GAUGE, "1",
        "Fraction of a container's exclusive CPUs on its GPU's NUMA node (1 = aligned).",
        per_node=observe.numa_alignment,
        attributes=(HW_ID, *POD_ATTRIBUTES),
        source_doc="kubelet cpu_ids and topology; sysfs node*/cpulist",
    ),
    *observe.usage_metrics(
        "memory.usage", Kind.UPDOWNCOUNTER, "By",
        "GPU memory held by a container's processes on a device (0 for a container holding "
        "the device with none running).", "used_memory",
        "nvmlDeviceGetComputeRunningProcesses .usedGpuMemory, summed " + _TO_CONTAINER,
    ),
    *observe.usage_metrics(
        "sm.utilization", Kind.GAUGE, "1",
        "Share of the device's SM time a container's processes used since the previous "
        "sample (absent on MIG instances: NVML has no per-process utilization there).",
        "sm", _SHARE_SOURCE.format(field="smUtil"),
    ),
    *observe.usage_metrics(
        "memory_controller.utilization", Kind.GAUGE, "1",
        "Share of the device's memory-controller time a container's processes used since "
        "the previous sample.", "memory", _SHARE_SOURCE.format(field="memUtil"),
    ),
    *observe.usage_metrics(
        "encoder.utilization", Kind.GAUGE, "1",
        "Share of the device's video encoder time a container's processes used since the "
        "previous sample.", "encoder", _SHARE_SOURCE.format(field="encUtil"),
    ),
    *observe.usage_metrics(
        "decoder.utilization", Kind.GAUGE, "1",
        "Share of the device's video decoder time a container's processes used since the "
        "previous sample.", "decoder", _SHARE_SOURCE.format(field="decUtil"),
    ),
    *observe.usage_metrics(
        "processes", Kind.UPDOWNCOUNTER, "{process}",
        "Compute processes of a container on a device.", "processes",
        "nvmlDeviceGetComputeRunningProcesses, counted " + _TO_CONTAINER,
    ),
    Metric(
        "nvidia.gpu.k8s.energy", Kind.COUNTER, "J",
        "Energy a container used on a device since the collector started: the whole "
        "increase of the GPU's energy counter while it holds the device alone, its share "
        "of SM time on a shared GPU (process usage), a MIG instance's part by activity or "
        f"compute slices. The rest, and what came before, is under {PROCESS_OWNER}="
        f"{UNATTRIBUTED}; a GPU's series (its MIG instances' included) add up to hw.energy.",
        per_node=observe.energy,
        attributes=USAGE_ATTRIBUTES,
        source_doc="nvmlDeviceGetFieldValues TOTAL_ENERGY_CONSUMPTION increase (/ 1000), split "
        "per container (exclusive holder, process SM shares, MIG GPM SM_UTIL or slices)",
    ),
    Metric(
        "nvidia.gpu.k8s.energy.rule", Kind.GAUGE, "1",
        "1 for each device, with the rule its energy is split by now: exclusive, "
        "sm_share, unattributed (shared without per-process shares, or free), mig_activity "
        "or mig_slices (a GPU in MIG mode, across its instances).",
        per_node=observe.energy_rules,
        attributes=(HW_ID, ENERGY_RULE),
        source_doc="collector (energy accounting)",
    ),
    # GPU time per workload (instrument/gputime.py): allocated, active, idle; per device
    *gputime.METRICS,
    # The collector's own health
    Metric(
        "otel_gpu.kubelet.requests", Kind.COUNTER, "{request}",
        "Requests to the kubelet Pod Resources API, by RPC and gRPC status.",
        per_node=observe.kubelet_requests,
        attributes=("rpc.method", "rpc.grpc.status_code"),
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.kubelet.mapping.age", Kind.GAUGE, "s",
        "Seconds since the pod mapping in use was read from the kubelet.",
        per_node=observe.mapping_age,
        source_doc="collector clock",
    ),
    Metric(
        "otel_gpu.kubelet.pods", Kind.UPDOWNCOUNTER, "{pod}",
        "Pods holding at least one of this node's GPUs or MIG instances.",
        per_node=observe.attributed_pods,
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.kubelet.devices", Kind.UPDOWNCOUNTER, "{device}",
        "GPUs and MIG instances attributed to at least one pod.",
        per_node=observe.attributed_devices,
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.kubelet.unresolved_ids", Kind.GAUGE, "{id}",
        "Device ids allocated to containers that match no GPU or MIG instance on this node.",
        per_node=observe.unresolved_ids,
        source_doc="kubelet Pod Resources List",
    ),
    Metric(
        "otel_gpu.device.sample.age", Kind.GAUGE, "s",
        "Seconds from a device's last finished read to the end of the latest sample: near 0, "
        "and growing while a driver call on that device hangs (its values are then omitted).",
        per_device=observe.device_age,
        reported_when_failed=True,
        source_doc="collector clock, per device",
    ),
    Metric(
        "otel_gpu.nvml.unsupported", Kind.GAUGE, "{read}",
        "What NVML gives no value for on this device, by otel_gpu.nvml.reason: "
        "`unsupported`, the calls and fields the device or driver refuses (asked no more, "
        "their series absent); `not_available`, the values of the latest sample NVML "
        "answered with its \"not available\" value or one outside physics (omitted).",
        per_device=observe.unsupported,
        attributes=(OMITTED_BECAUSE,),
        source_doc="collector, per device",
    ),
    Metric(
        "otel_gpu.sample.age", Kind.GAUGE, "s",
        "Seconds since the latest sample finished; grows when the driver is stuck.",
        per_node=observe.sample_age,
        source_doc="collector clock",
    ),
    Metric(
        "otel_gpu.sample.duration", Kind.GAUGE, "s",
        "Seconds the latest sample took.",
        per_node=observe.sample_duration,
        source_doc="collector clock",
    ),
    Metric(
        "otel_gpu.samples", Kind.COUNTER, "{sample}",
        "Samples taken since start.",
        per_node=observe.samples,
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.nvml.requests", Kind.COUNTER, "{request}",
        "NVML requests made since start; scrapes never add to it.",
        per_node=observe.nvml_requests,
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.reader.failures", Kind.COUNTER, "{failure}",
        "Reads that raised what no NVML return code explains (a malformed driver answer, "
        "or a bug), by otel_gpu.reader: each cost that reader's values on one device for "
        "one sample, the other values and devices published as usual. Alert on any increase.",
        per_node=observe.reader_failures,
        attributes=(READER,),
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.devices", Kind.UPDOWNCOUNTER, "{device}",
        "GPUs and MIG instances known to the collector, per hw.state.",
        per_node=observe.devices,
        attributes=(HW_STATE,),
        source_doc="collector",
    ),
    Metric(
        "otel_gpu.build.info", Kind.GAUGE, "1",
        "1, with the versions of the collector, Python, the NVML binding (nvidia-ml-py) "
        "and the OpenTelemetry SDK as attributes.",
        per_node=build.build_info,
        attributes=build.BUILD_ATTRIBUTES,
        source_doc="collector (package metadata)",
    ),
)


def all_sources(catalog: Iterable[Metric] = CATALOG) -> tuple[Source, ...]:
    """Every NVML source the catalog needs, in catalog order, once each."""
    return _all_sources(catalog)
