"""A rank process's own memory: read as the larger of what a container limit and RLIMIT_DATA count, and measured
again against the figures the plan adds to every rank (`zerotrain.plan.process_baseline`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerotrain.plan.process_baseline import BASELINE_BYTES, DRIFT, ProcessKind
from zerotrain.runtime.job.process_memory import measure, own_bytes


def test_own_bytes_is_the_larger_of_the_resident_set_and_the_data_segment(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t  1000 kB\nVmData:\t  3000 kB\nThreads:\t4\n")
    assert own_bytes(status) == 3000 * 1024
    status.write_text("VmRSS:\t  5000 kB\nVmData:\t  3000 kB\n")
    assert own_bytes(status) == 5000 * 1024
    assert own_bytes(tmp_path / "absent") == 0


@pytest.mark.slow
def test_the_stated_baseline_is_what_a_rank_holds_besides_its_tensors() -> None:
    # The torch and transformers+peft kinds are measured again by tests/integration/test_run_smallest_memory.py's runs.
    pytest.importorskip("transformers")
    kind = ProcessKind.TRANSFORMERS
    measured = measure(kind)
    stated = BASELINE_BYTES[kind]
    for got in measured:
        assert abs(got - stated) <= DRIFT * stated, (
            f"{kind.value}: a rank of a tiny job peaks at {got / 1e6:.0f} MB, not the {stated / 1e6:.0f} MB "
            "zerotrain.plan.process_baseline states; measure again (python -m zerotrain.runtime.job.process_memory) "
            "and update BASELINE_BYTES and docs/memory.md"
        )
