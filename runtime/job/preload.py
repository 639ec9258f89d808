"""What the ranks' fork server imports before it forks any rank (`rank_fork`), named by the launcher in
RANK_PRELOAD_ENV: torch, zerotrain's rank process, the entry point's module and libraries. The server names itself
for `ps`, so that no tool looking for the ranks' command line (`zerotrain.runtime.job.rank`) mistakes it for one.

When its launcher lets it go, the server ends at once: an interpreter holding torch, dynamo and transformers took
4 s to tear itself down, and the launcher waits for it before it exits. It holds nothing to flush (each rank is a
process of its own, ended with os._exit as every fork of it is), so its last exit handler, run first, is os._exit."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys

import setproctitle

from zerotrain.pod_contract import RANK_PRELOAD_ENV

setproctitle.setproctitle(f"zerotrain rank server (forks the ranks of launcher {os.getppid()})")
for name in filter(None, os.environ.get(RANK_PRELOAD_ENV, "").split(",")):
    # As the stdlib's own preload: a module missing here is the rank's to import, and to say what is missing.
    with contextlib.suppress(ImportError):
        importlib.import_module(name)

sys.stdout.flush()
atexit.register(os._exit, 0)  # registered last, run first: none of the imported libraries' teardown
