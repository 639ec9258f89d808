"""The suite's time budget, stated once. Every wait in a test (a subprocess, a rank, a condition polled for, and
pytest-timeout's limit per test) is a guard against a hang, never the thing measured; ZEROTRAIN_TEST_TIME_SCALE
multiplies them all. 1 (the default) is sized for 2 idle cores with a 2x margin; a loaded or slower machine
states its slowdown (`ZEROTRAIN_TEST_TIME_SCALE=3 make test`) instead of failing."""

from __future__ import annotations

import os

ENV = "ZEROTRAIN_TEST_TIME_SCALE"


def _scale() -> float:
    text = os.environ.get(ENV, "1")
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise SystemExit(f"{ENV}={text!r}: not a positive number; set it to the machine's slowdown, e.g. 2")
    return value


SCALE = _scale()


def budget(seconds: float) -> float:
    """A wait of `seconds` on an idle machine, scaled by the stated slowdown."""
    return seconds * SCALE
