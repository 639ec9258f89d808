"""The rank process's own memory, measured as the plan counts it: a tiny job of each kind run for real.

A rank is an interpreter with torch and the zerotrain runtime imported, a gloo process group (its threads and
buffers), the /metrics server's thread and, for the Hugging Face entry point, transformers (and peft for LoRA).
`own_bytes` reads the larger of the two figures a limit can count: the resident set (a container's memory limit
charges resident pages) and the private writable address space (`zerotrain run`'s RLIMIT_DATA, which also counts
thread stacks as they are mapped, touched or not).

    python -m zerotrain.runtime.job.process_memory            # each kind, two ranks, as JSON

runs `zerotrain run` on a tiny job of each kind (tensors of a few MB) and prints each rank's `process_bytes`
from the run's summary (each rank's peak, read as it exits). That is how `zerotrain.plan.process_baseline`'s figures
were measured; tests/runtime/job/test_process_memory.py measures them
again and fails when they drift by more than the stated tolerance.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from zerotrain.plan.process_baseline import ProcessKind

STATUS = Path("/proc/self/status")


def own_bytes(status: Path = STATUS) -> int:
    """This process's memory as a limit counts it, at its most so far: max(VmHWM, VmRSS, VmData), in bytes (0 where
    /proc is absent)."""
    fields = status_bytes(status)
    return max((fields[k] for k in ("VmRSS", "VmHWM", "VmData") if k in fields), default=0)


def status_bytes(status: Path = STATUS) -> dict[str, int]:
    """The kB fields of a /proc status file, in bytes ({} where it cannot be read)."""
    try:
        text = status.read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        words = value.split()
        if len(words) == 2 and words[1] == "kB" and words[0].isdigit():
            out[key] = int(words[0]) * 1024
    return out


TINY_GPT = {"seq_len": 16, "batch_size": 4, "d_model": 16, "n_layers": 2, "n_heads": 2, "max_bytes": 20_000}
TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 32,
}


def tiny_job(kind: ProcessKind, where: Path, world: int) -> Path:
    """A job whose tensors are a few hundred kB, of the entry point `kind` stands for, written under `where`."""
    spec: dict[str, object] = {
        "entrypoint": "zerotrain.runtime.examples.gpt:build",
        "entrypointArgs": TINY_GPT,
        "nprocPerNode": world,
        "zero": {"stage": 3},
        "training": {"steps": 4, "optimizer": {"name": "adamw", "lr": 0.001}},
    }
    if kind is not ProcessKind.TORCH:
        tokens = where / "train.bin"
        tokens.write_bytes(b"".join(i.to_bytes(2, "little") for i in range(64)) * 20)  # uint16 token ids
        args = {"config": TINY_LLAMA, "train": str(tokens), "seq_len": 16, "batch_size": 4}
        spec |= {"entrypoint": "zerotrain.runtime.models.huggingface:build", "entrypointArgs": args}
    if kind is ProcessKind.PEFT:
        spec["model"] = {"lora": {"rank": 2, "alpha": 4, "targetModules": ["q_proj", "v_proj"]}}
    path = where / "job.json"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "zerotrain.dev/v1alpha1",
                "kind": "ZeroTrainingJob",
                "metadata": {"name": "baseline"},
                "spec": spec,
            }
        )
    )
    return path


def measure(kind: ProcessKind, world: int = 2, timeout_s: float = 300.0) -> list[int]:
    """Each rank's process at its most (`own_bytes`) over a real `zerotrain run` of a tiny job of `kind`: the
    imports, the process group, the /metrics server, the kernels' and autograd's own memory, and a few hundred kB
    of tensors."""
    with tempfile.TemporaryDirectory(prefix="zerotrain-baseline-") as tmp:
        where = Path(tmp)
        summary = where / "summary.json"
        command = [sys.executable, "-P", "-m", "zerotrain.cli", "run", str(tiny_job(kind, where, world))]
        command += ["--metrics-port", "0", "--summary-file", str(summary), "--log-dir", str(where / "logs")]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=where)
        if done.returncode != 0 or not summary.exists():
            raise RuntimeError(f"the {kind.value} run exited {done.returncode}: {done.stderr[-2000:]}")
        return [int(r["process_bytes"]) for r in json.loads(summary.read_text())["ranks"]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotrain.runtime.job.process_memory", description=__doc__)
    parser.add_argument("--kind", choices=[k.value for k in ProcessKind], default=None, help="one kind (default all)")
    parser.add_argument("--world", type=int, default=2, help="ranks started together")
    args = parser.parse_args(argv)
    kinds = [ProcessKind(args.kind)] if args.kind else list(ProcessKind)
    print(json.dumps({k.value: measure(k, args.world) for k in kinds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
