"""Asynchronous checkpoints (`checkpoint.async`): the step loop is blocked only while a snapshot is taken.

A save here is the synchronous one (`checkpoint.save`) cut in three:

1. `start`, in the step loop: the fresh directory (the one small collective every save makes), and a snapshot of
   this rank's tensors into host buffers kept from save to save (pinned on CUDA, copied without blocking the host;
   the writer waits for the copies). The step loop goes on.
2. A background thread writes the rank file, fsyncs it and its directory, and hashes it.
3. The commit: every step's control all-reduce counts the ranks whose write has finished (`written`); the step at
   which all have, `commit` gathers the digests (the all-gather a synchronous save makes too) and rank 0 renames
   the marker into place. No collective is added to agree on it.

At most one save is in flight: a save due while the last is still being written first waits for it (`finish`, which
agrees with one small all-reduce instead of waiting for a step). SIGTERM, Ctrl-C and the end of training `finish`
the one in flight, then save the last step synchronously. A rank killed during a background write leaves a
directory without its marker, which `checkpoint.committed` ignores: the previous checkpoint stays the newest.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zerotrain.errors import ConfigError
from zerotrain.runtime.checkpoints import checkpoint

if TYPE_CHECKING:
    from zerotrain.runtime.zero.engine_state import Checkpointable


def check_directory_fsync(root: Path) -> None:
    """Refuse asynchronous checkpoints where the directory cannot be fsynced: the marker's rename would not be
    durable, so a crash could leave a committed checkpoint whose files the filesystem never kept."""
    root.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise ConfigError(
            f"spec.checkpoint.async: true, but {root} is on a filesystem that cannot fsync a directory ({e}); put "
            "spec.checkpoint.path on one that can, or set checkpoint.async: false"
        ) from e


@dataclass
class InFlight:
    """One save whose rank file is being written in the background."""

    target: Path
    position: dict[str, int]
    thread: threading.Thread
    started: float = field(default_factory=time.perf_counter)
    """When the save began (its duration to the commit is what the metrics report)."""
    digest: bytes = b""
    error: BaseException | None = None
    origin: dict[str, Any] = field(default_factory=dict)
    """Where the model's weights first came from, for the marker (`checkpoint.save`)."""

    @property
    def step(self) -> int:
        """The step the snapshot was taken after."""
        return self.position["step"]


@dataclass
class AsyncSaver:
    """One rank's asynchronous saves: the reused host buffers and the save in flight."""

    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    inflight: InFlight | None = None

    def start(self, engine: Checkpointable, root: Path, origin: dict[str, Any] | None = None) -> Path:
        """Snapshot this rank's state and start writing it; a collective on every rank (the directory's token).
        A save still in flight is finished first."""
        self.finish(engine)
        state = engine.state_dict()
        target, position = checkpoint.begin(engine, state, root)
        tensors, record = checkpoint.rank_contents(state, origin)
        rank = state.layout.rank
        host, copied = self._snapshot(tensors)
        job = InFlight(target, position, threading.Thread(), origin=origin or {})

        def write() -> None:
            try:
                if copied is not None:
                    copied.synchronize()  # the device-to-host copies were queued, not waited for
                job.digest = checkpoint.write_rank(target, rank, host, record)
            except BaseException as e:
                job.error = e

        job.thread = threading.Thread(target=write, name=f"zerotrain-checkpoint-{job.step}", daemon=True)
        job.thread.start()
        self.inflight = job
        return target

    def _snapshot(self, tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.cuda.Event | None]:
        """Copies of `tensors` in host buffers reused from the last save (allocated, pinned on CUDA, on first use)."""
        cuda = any(t.is_cuda for t in tensors.values())
        host = {}
        for name, t in tensors.items():
            buf = self.buffers.get(name)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
                self.buffers[name] = buf
            buf.copy_(t.detach(), non_blocking=t.is_cuda)
            host[name] = buf
        if not cuda:
            return host, None
        event = torch.cuda.Event()
        event.record()
        return host, event

    def written(self) -> bool:
        """This rank's write in flight is on disk (what it tells the next step's control all-reduce); raises the
        writer's error, naming the checkpoint, when it failed."""
        job = self.inflight
        if job is None or job.thread.is_alive():
            return False
        if job.error is not None:
            raise RuntimeError(f"checkpoint {job.target}: writing this rank's file failed: {job.error}") from job.error
        return True

    def commit_if_agreed(self, engine: Checkpointable, written: int) -> InFlight | None:
        """Commit the save in flight when every rank said its write finished (`written` from the step's control
        all-reduce); the save committed, else None."""
        job = self.inflight
        if job is None or written < engine.layout.world_size:
            return None
        checkpoint.commit(engine, job.target, job.position, job.digest, job.origin)
        self.inflight = None
        return job

    def finish(self, engine: Checkpointable) -> InFlight | None:
        """Wait for this rank's write in flight and commit it with every rank (one small all-reduce agrees that all
        ranks have one); the save committed, if any. A collective on every rank."""
        job = self.inflight
        if job is None:
            return None  # saves start and commit at the same steps on every rank: none is in flight anywhere
        job.thread.join()
        ready = torch.tensor([1.0 if self.written() else 0.0], device=engine.device)
        engine.comm.all_reduce(ready, "<checkpoint>")
        return self.commit_if_agreed(engine, round(ready.item()))
