"""Project-wide test setup."""

from __future__ import annotations

import os

# The repository root holds a folder named `operator` (installed as zerotrain.operator). `python -m ...` started
# from the root would put it on sys.path ahead of the standard library's `operator` and break start-up;
# safe-path mode (Python >= 3.11) keeps the working directory off sys.path for every child process.
os.environ["PYTHONSAFEPATH"] = "1"
