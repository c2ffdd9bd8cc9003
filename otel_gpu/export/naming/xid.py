"""XID error codes: a short phrase for each common one.

The NVIDIA driver reports a GPU fault as an XID event carrying a number. The
phrases below say in a few words what the common numbers mean, for labels
and log lines (dcgm-exporter's ``err_msg`` label, and any output that wants
to name an XID). The numbers are NVIDIA's; the wording is this project's.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

NO_ERROR = "no error"
UNKNOWN = "unknown XID code"

MESSAGES: Mapping[int, str] = MappingProxyType({
    0: NO_ERROR,
    8: "GPU stopped responding to the driver",
    13: "exception in a graphics or compute engine",
    31: "invalid GPU memory access (page fault)",
    32: "corrupted command stream from the host",
    38: "driver firmware error",
    43: "channel stopped after an application fault",
    45: "channel cleaned up after earlier errors",
    48: "uncorrectable (double-bit) ECC error",
    54: "auxiliary power cable not connected",
    56: "display engine error",
    57: "error setting up the video memory interface",
    58: "video memory interface unstable",
    61: "internal microcontroller warning",
    62: "internal microcontroller halted",
    63: "memory page retired or row remapped",
    64: "page retirement or row remap could not be recorded",
    68: "video decoder (NVDEC) exception",
    69: "invalid command for a graphics engine class",
    74: "NVLink error",
    79: "GPU no longer reachable on the PCIe bus",
    92: "high rate of corrected ECC errors",
    94: "uncorrectable ECC error contained to one application",
    95: "uncorrectable ECC error not contained; reset needed",
    109: "context switch timed out",
    119: "call to the GPU System Processor (GSP) timed out",
    120: "GPU System Processor (GSP) error",
    121: "chip-to-chip (C2C) link error",
    140: "unrecovered ECC error",
    143: "GPU failed to initialise",
    154: "recovery action for the GPU changed",
})
"""XID code -> a short phrase, for the codes a data-centre GPU commonly reports."""


def message(code: int) -> str:
    """The phrase for ``code``, or :data:`UNKNOWN` for a code not in :data:`MESSAGES`."""
    return MESSAGES.get(code, UNKNOWN)
