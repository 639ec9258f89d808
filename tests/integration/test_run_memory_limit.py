"""`zerotrain run` limits each rank's memory to its share of spec.resources.memory, as a container limit would, and
a rank that runs out says where and with what instead of dying with 137: a real allocation failure, not a mock."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zerotrain.cli import main
from zerotrain.pod_contract import RANK_MEMORY_LIMIT_ENV
from zerotrain.runtime.job.out_of_memory import apply_memory_limit, at_limit, is_allocation_failure, tried_bytes

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def manifest(tmp_path: Path, memory: str, batch_size: int) -> Path:
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["resources"]["memory"] = memory
    doc["spec"]["entrypointArgs"]["batch_size"] = batch_size
    # No shape: its activations would be planned against the limit and the run refused before any rank allocates.
    del doc["spec"]["model"]["shape"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
def test_a_rank_out_of_its_memory_names_rank_phase_unit_and_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1,024 sequences of 128 bytes per rank: the first block's activations cannot fit 700 MiB with torch loaded.
    path = manifest(tmp_path, "700Mi", 2048)
    assert main(["run", str(path), "--steps", "2", "--no-metrics"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "rank-failed:" in out and "out of memory: rank " in out, out
    assert "during forward in unit blocks.0; it asked for " in out and "it held parameters " in out
    assert "raise zero.stage (or use stage: auto)" in out and "status 137" not in out


@pytest.mark.slow
def test_the_same_job_within_its_memory_trains(tmp_path: Path) -> None:
    assert main(["run", str(manifest(tmp_path, "2Gi", 16)), "--steps", "2", "--no-metrics"]) == 0


def test_the_limit_is_the_data_segment_of_the_rank_process() -> None:
    code = (
        "import os, resource\n"
        "from zerotrain.runtime.job.out_of_memory import apply_memory_limit\n"
        f"apply_memory_limit({{'{RANK_MEMORY_LIMIT_ENV}': str(1 << 30)}})\n"
        "import torch\n"
        "try:\n"
        "    torch.empty(2_000_000_000, dtype=torch.uint8)\n"
        "except RuntimeError as e:\n"
        "    print('refused', e)\n"
        "print(resource.getrlimit(resource.RLIMIT_DATA)[0])\n"
    )
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True).stdout
    assert "refused" in out and out.strip().endswith(str(1 << 30)), out
    assert apply_memory_limit({}) is None and resource.getrlimit(resource.RLIMIT_DATA)[0] != 1 << 30


def test_allocator_messages_are_read_for_the_bytes_asked() -> None:
    cpu = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 67108864 bytes. Error 12")
    assert is_allocation_failure(cpu) and tried_bytes(cpu) == 67108864
    cuda = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)")
    assert tried_bytes(cuda) == 2 * 2**30 and not is_allocation_failure(RuntimeError("shape mismatch"))
    # The other layers a process out of memory fails in: a thread's stack, C++'s new, the kernel's mmap.
    for other in (
        RuntimeError("can't start new thread"),
        RuntimeError("std::bad_alloc"),
        OSError(errno.ENOMEM, "Cannot allocate memory"),
    ):
        assert is_allocation_failure(other), other
    assert not is_allocation_failure(OSError(errno.ENOENT, "No such file or directory"))


def test_a_failure_at_the_limit_counts_as_out_of_memory(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmData:\t  204800 kB\nVmRSS:\t  100000 kB\n")
    assert at_limit(204800 * 1024, status) and at_limit(204800 * 1024 + (8 << 20), status)
    assert not at_limit(2 * 204800 * 1024, status) and not at_limit(None, status)


@pytest.mark.slow
def test_a_rank_whose_process_cannot_start_in_its_limit_says_so_without_a_traceback(tmp_path: Path) -> None:
    # The pod's launcher, which the operator's admission guards (`zerotrain run` refuses such a limit before any
    # rank starts): 200 MB cannot hold the interpreter, torch and gloo, which fail in whatever layer meets it first.
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"] |= {"replicas": 1, "nprocPerNode": 2}
    doc["spec"]["training"]["steps"] = 2
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, RANK_MEMORY_LIMIT_ENV: str(200_000_000), "PYTHONSAFEPATH": "1"}
    cmd = [sys.executable, "-P", "-m", "zerotrain.runtime", "--config", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert "rank-failed: rank " in said and "out of memory: rank " in said, said
    assert "at its limit of 200.0 MB" in said and "host memory line of `zerotrain plan -f JOB`" in said
    assert "Traceback" not in said, said


@pytest.mark.slow
def test_a_rank_out_of_memory_while_building_the_model_says_so_and_what_helps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A 201M-parameter GPT: each rank's slice of its fp32 parameters alone is 400 MB, its engine as much again.
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["resources"]["memory"] = "600Mi"
    doc["spec"]["entrypointArgs"] |= {"d_model": 1024, "n_layers": 16, "n_heads": 8}
    doc["spec"].pop("model")  # no Ψ to plan with: nothing refuses it before the ranks start
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--steps", "2", "--no-metrics"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "out of memory: rank " in out and "during constructing (building the model)" in out, out
    assert "it held its slice of every parameter and one unit whole" in out
    assert "zerotrain plan -f JOB" in out and "raise zero.stage" not in out and "more ranks" not in out
