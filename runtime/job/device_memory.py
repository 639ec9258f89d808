"""Device memory as the rank's metrics report it: CUDA caching-allocator counters (read on the host, no device
synchronisation) or, on CPU, the process's resident set against the container's limit."""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DeviceMemory:
    """Memory as the device (CUDA) or the process (CPU) sees it, read without a device synchronisation."""

    device: str
    """`cpu` or `cuda:N`."""
    used_bytes: int
    """CUDA: bytes reserved by the caching allocator (what the device lacks); CPU: resident set size."""
    limit_bytes: int
    """CUDA: the device's total memory; CPU: the container's memory limit, else the host's memory."""
    rss_bytes: int
    """Resident set size of this process."""
    cuda: Mapping[str, int] = field(default_factory=dict)
    """CUDA allocator statistics: allocated, reserved, peak allocated bytes and allocation retries."""


def read_rss_bytes() -> int:
    """This process's resident set size (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def host_memory_limit(cgroup: Path = Path("/sys/fs/cgroup/memory.max")) -> int:
    """The container's memory limit (cgroup v2), else the host's total memory."""
    try:
        raw = cgroup.read_text().strip()
        if raw != "max":
            return int(raw)
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 0


class DeviceProbe:
    """Reads device memory once per step: allocator counters on CUDA (host-side, no sync), RSS on CPU."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self._cuda = getattr(device, "type", "cpu") == "cuda"
        if self._cuda:
            import torch

            self._limit = int(torch.cuda.get_device_properties(device).total_memory)
        else:
            self._limit = host_memory_limit()

    def read(self) -> DeviceMemory:
        rss = read_rss_bytes()
        if not self._cuda:
            return DeviceMemory("cpu", rss, self._limit, rss)
        import torch

        stats = torch.cuda.memory_stats(self.device)
        cuda = {
            "allocated": int(stats.get("allocated_bytes.all.current", 0)),
            "reserved": int(stats.get("reserved_bytes.all.current", 0)),
            "peak_allocated": int(stats.get("allocated_bytes.all.peak", 0)),
            "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        }
        return DeviceMemory(str(self.device), cuda["reserved"], self._limit, rss, cuda)
