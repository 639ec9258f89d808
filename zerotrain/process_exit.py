"""Ending a process whose work is done without the interpreter's teardown.

With torch (and dynamo, transformers) imported, Python's finalization took 1.3 s on this machine after every file was
written: each pod's launcher paid it before its pod could end (and a gang restart begin), each `zerotrain run` before
the shell got its prompt back. Exit handlers still run (the rank server stops, logging flushes), and the standard
streams are flushed; only the module teardown and the last garbage collection are skipped.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Run the exit handlers, flush stdout and stderr, and end the process with `code`."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # A reader gone (`| head`), a stream closed: nothing left to say there.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code & 0xFF)


def exit_after(code: int) -> NoReturn:
    """`exit_now` where torch was imported (its teardown is the slow one), else the plain `sys.exit`."""
    if "torch" in sys.modules:
        exit_now(code)
    sys.exit(code)
