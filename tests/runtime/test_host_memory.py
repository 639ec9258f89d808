"""Host memory follows the tensors held: what a partitioned construction frees goes back to the system."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zerotrain.runtime.job.host_memory import (
    GLIBC_MMAP_THRESHOLD_MAX,
    MAPPED_UNIT_MIN,
    START_UP_MMAP_THRESHOLD,
    _glibc,
    training_threshold,
)

BUILD = """
import sys, torch
from torch import nn
from zerotrain.runtime.construction.placeholders import to_meta
from zerotrain.runtime.job.host_memory import returned_while_starting

def rss():
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS"))) * 1024

def build():  # what a partitioned construction does: whole weights built, then handed over; small tensors kept
    kept = []
    for _ in range(10):  # a transformer block's four weights of unequal sizes
        for fan_in, fan_out in ((768, 2304), (768, 768), (768, 3072), (3072, 768)):
            m = nn.Linear(fan_in, fan_out)
            to_meta(m.weight)
            kept.append((m, torch.zeros(3000)))
    return kept

before = rss()
if sys.argv[1] == "returned":
    with returned_while_starting():
        kept = build()
else:
    kept = build()
print(rss() - before)
"""


def _grown(mode: str) -> int:
    out = subprocess.run([sys.executable, "-P", "-c", BUILD, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(_glibc() is None, reason="the heap's behaviour measured here is glibc's")
def test_weights_freed_while_starting_go_back_to_the_system() -> None:
    weights = 10 * 12 * 768 * 768 * 4  # 283 MB of weights built and freed; 0.5 MB of small tensors kept
    assert _grown("heap") > weights // 2  # glibc's own threshold: the freed weights stay in the heap
    assert _grown("returned") < weights // 10


def test_training_maps_gathered_units_only_where_a_memory_limit_applies() -> None:
    units = [28 << 20, 30 << 20]
    assert training_threshold(units, limited=True) == START_UP_MMAP_THRESHOLD
    assert training_threshold(units, limited=False) == GLIBC_MMAP_THRESHOLD_MAX  # throughput first without a limit
    assert training_threshold([], limited=True) == GLIBC_MMAP_THRESHOLD_MAX  # no stage-3 gathers on the host
    assert training_threshold([MAPPED_UNIT_MIN - 1], limited=True) == GLIBC_MMAP_THRESHOLD_MAX  # the README's demo
