"""Fixtures the job tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from zerotrain.pod_contract import PROGRESS_ENV, SUMMARY_ENV


@pytest.fixture
def single_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No process group: the engine runs as one rank; rank 0's files go to tmp_path."""
    for var in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(PROGRESS_ENV, str(tmp_path / "progress.jsonl"))
    monkeypatch.setenv(SUMMARY_ENV, str(tmp_path / "summary.json"))
    yield tmp_path
