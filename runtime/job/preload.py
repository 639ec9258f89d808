"""What the ranks' fork server imports before it forks any rank (`rank_fork`), named by the launcher in
RANK_PRELOAD_ENV: torch, zerotrain's rank process, the entry point's module and libraries. The server names itself
for `ps`, so that no tool looking for the ranks' command line (`zerotrain.runtime.job.rank`) mistakes it for one."""

from __future__ import annotations

import contextlib
import importlib
import os

import setproctitle

from zerotrain.pod_contract import RANK_PRELOAD_ENV

setproctitle.setproctitle(f"zerotrain rank server (forks the ranks of launcher {os.getppid()})")
for name in filter(None, os.environ.get(RANK_PRELOAD_ENV, "").split(",")):
    # As the stdlib's own preload: a module missing here is the rank's to import, and to say what is missing.
    with contextlib.suppress(ImportError):
        importlib.import_module(name)
