"""The environment every GPU rank gets unless the job sets the variable itself, in one place.

The operator puts these in the pods of jobs with `spec.resources.gpu > 0` (after the rendezvous env, before
`spec.env`, and only those the job's `spec.env` or pod template does not name); the launcher
(`zerotrain.runtime.job.launch`) adds the ones still missing from its own environment to the ranks it starts, so
`python -m zerotrain.runtime` outside the operator gets them too. CPU jobs get none of them.

What each does in torch 2.4–2.13 was checked against torch 2.13's ProcessGroupNCCL, flight-recorder and allocator
headers, the pytorch/pytorch pull requests that changed these defaults, and NCCL's documentation; see
docs/install.md, "GPUs and fast interconnects". Imports nothing heavy (the operator loads it and never imports
torch).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from types import MappingProxyType
from typing import Final

GPU_ENV: Final[Mapping[str, str]] = MappingProxyType(
    {
        # Stage 3 allocates and frees unit-sized gathered parameter buffers and gradient buckets of several sizes
        # every step. With expandable segments the caching allocator maps one segment per stream and grows it,
        # instead of caching blocks cudaMalloc'ed at the size first asked for, whose unused tails strand reserved
        # memory. That fragmentation is reserved memory, which is what the ranks report as in use
        # (zerotrain_device_memory_used_bytes) and what the 92%-of-device alert (ZeroTrainRankMemoryNearLimit)
        # fires on. Newer torch (2.13 among them) also reads PYTORCH_ALLOC_CONF, but the CUDA allocator reads
        # PYTORCH_CUDA_ALLOC_CONF first, so it is left out when a job sets either (ALIASES).
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        # 3 ("SkipCleanUp", torch's own default throughout 2.4–2.13, pytorch/pytorch#110723): when a collective
        # fails or outlasts the group's timeout (spec.zero.collectiveTimeoutSeconds), the watchdog tears the process
        # down without calling ncclCommAbort first. The launcher then stops the pod's other ranks and the operator
        # restarts the gang; ranks in other pods leave the collective when their own watchdog times out or their
        # pod is deleted. 1 ("TearDown") would abort the communicator before the teardown, which can hang
        # (pytorch/pytorch#102599) and kept the flight recorder's dump from being written (pytorch/pytorch#121055);
        # 2 aborts without ending the process; 0 leaves the ranks of a failed collective hanging. Stated rather
        # than left to the default so that a value from a base image's ENV does not apply to training pods.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        # The flight recorder: a ring of each rank's last 2000 collective calls (op, sizes, process group, sequence
        # number, state), dumped per rank when a collective times out or fails, so the dumps say which collective
        # each rank was in. Older releases of 2.4–2.13 (2.4 among them) have it off by default (buffer 0, no dump);
        # newer ones default to these values (pytorch/pytorch#143446), read TORCH_FR_BUFFER_SIZE first and warn
        # once that TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated. The dump is written inside the container, to
        # $TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank> (default /tmp/nccl_trace_rank_<rank>; newer releases
        # ~/.cache/fr_trace/nccl_trace_rank_<rank>).
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        # NCCL prints nothing by default; at WARN it prints an explicit message before any NCCL call returns an
        # error (a network error, a peer gone, a bad configuration), on the rank's stdout: the rank's log.
        "NCCL_DEBUG": "WARN",
    }
)

# Other names torch reads for the same setting: a job that sets one of them keeps its value, so the default is left
# out (PYTORCH_CUDA_ALLOC_CONF would win over PYTORCH_ALLOC_CONF; TORCH_NCCL_ASYNC_ERROR_HANDLING over the older
# NCCL_ASYNC_ERROR_HANDLING).
ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "PYTORCH_CUDA_ALLOC_CONF": ("PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("NCCL_ASYNC_ERROR_HANDLING",),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": ("TORCH_FR_BUFFER_SIZE",),
    }
)


def gpu_env_missing(existing: Container[str]) -> dict[str, str]:
    """The defaults `existing` (an env mapping, or the set of names an env sets) does not set, under any name.

    A variable set to the empty string counts as set: the job chose it.
    """
    return {
        name: value
        for name, value in GPU_ENV.items()
        if name not in existing and not any(alias in existing for alias in ALIASES.get(name, ()))
    }
