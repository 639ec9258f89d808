"""Full fine-tuning against LoRA, zerotrain beside FSDP2 + peft and DeepSpeed ZeRO-3 + peft, in one run.

Every system trains the same Hugging Face Llama (random weights from one seed; hidden 256, 4 layers, vocabulary
4,096 by default) on the same global batches of random tokens with torch AdamW, two gloo ranks, one thread each:

- zerotrain at stages 2 and 3, full fine-tuning and LoRA (rank 8 on q, k, v, o, gate, up, down; the adapters added
  by `zerotrain.runtime.models.lora`, so by peft);
- FSDP2 (`fully_shard` on every decoder layer and the root), full and with the same adapters (peft);
- DeepSpeed ZeRO-3, full and with the same adapters, where DeepSpeed imports (`make bench` installs it).

Per system: tokens/s (the median over repetitions of the median step, with the range) and the model-state bytes
per rank counted from the tensors it holds (parameters, gradients, optimizer state: each storage once). Systems run
one after another, in reverse order every other repetition; throughput here spreads ±15% run to run, so figures
whose ranges overlap are equal. Every system's first loss must agree with zerotrain's (same model, same batch).

    python bench/runtime/bench_lora.py                 # 5 repetitions
    python bench/runtime/bench_lora.py --reps 1 --steps 6 --systems zero3-lora,fsdp2-lora
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# compare_systems (bench/compare) and this script's own folder, also for spawned ranks.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from compare_systems import DeepSpeedSystem, System, ZeroSystem

from zerotrain.lora_config import LoraSpec
from zerotrain.runtime.job.launch import free_port

SYSTEMS = ["zero2-full", "zero2-lora", "zero3-full", "zero3-lora", "fsdp2-full", "fsdp2-lora", "ds3-full", "ds3-lora"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LR = 1e-3
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "lora.json"  # bench/results, git-ignored


@dataclass(frozen=True)
class Run:
    system: str
    world: int
    hidden: int
    layers: int
    vocab: int
    seq_len: int
    batch: int
    steps: int
    warmup: int
    rank: int
    port: int
    out_dir: str


def llama(run: Run) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=run.vocab,
        hidden_size=run.hidden,
        intermediate_size=run.hidden * 8 // 3 // 16 * 16,
        num_hidden_layers=run.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=run.seq_len,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if run.system.endswith("-lora"):
        from zerotrain.runtime.models.lora import apply

        apply(model, LoraSpec(rank=run.rank, alpha=2 * run.rank, target_modules=TARGETS))
    return model


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.0)  # as DeepSpeed's config below


def build(run: Run, model: torch.nn.Module) -> System:
    trainable = [p for p in model.parameters() if p.requires_grad]
    if run.system.startswith("zero"):
        from zerotrain.runtime import ZeroConfig, ZeroEngine

        config = ZeroConfig(stage=int(run.system[4]), unit_modules=["LlamaDecoderLayer"], no_weight_decay=[])
        return ZeroSystem(ZeroEngine(model, config, optimizer=adamw))
    if run.system.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:  # type: ignore[union-attr]
            fully_shard(layer)
        fully_shard(model)  # new (DTensor) parameters: the optimizer takes these
        return System(model, adamw([p for p in model.parameters() if p.requires_grad]))
    import deepspeed

    ds_config = {
        "train_micro_batch_size_per_gpu": run.batch // run.world,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": 3},
    }
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=trainable, config=ds_config)
    return DeepSpeedSystem(engine, opt)


def init(run: Run, rank: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(run.port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(run.world),
        DS_ACCELERATOR="cpu",
    )
    if run.system.startswith("ds"):
        import deepspeed

        deepspeed.utils.logger.setLevel("WARNING")
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo", rank=rank, world_size=run.world)


def rank_main(rank: int, run: Run) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    init(run, rank)
    model = llama(run)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    system = build(run, model)
    rows = run.batch // run.world
    gen = torch.Generator().manual_seed(1)
    losses, seconds = [], []
    for step in range(run.steps):
        whole = torch.randint(0, run.vocab, (run.batch, run.seq_len + 1), generator=gen)
        tokens = whole[rank * rows : (rank + 1) * rows]
        dist.barrier()
        t0 = time.perf_counter()
        logits: torch.Tensor = system.forward(tokens[:, :-1]).logits  # type: ignore[attr-defined]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, run.vocab).float(), tokens[:, 1:].reshape(-1))
        system.backward(loss)
        system.step()
        if step >= run.warmup:
            seconds.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    result = {"losses": losses, "step_seconds": seconds, "memory": system.memory(), "trained": trained}
    Path(run.out_dir, f"{rank}.json").write_text(json.dumps(result))
    del system, model
    gc.collect()
    dist.destroy_process_group()


def launch(run: Run) -> list[dict[str, Any]]:
    mp.spawn(rank_main, args=(run,), nprocs=run.world, join=True)
    return [json.loads(Path(run.out_dir, f"{r}.json").read_text()) for r in range(run.world)]


def available(systems: list[str]) -> tuple[list[str], dict[str, str]]:
    try:
        import deepspeed  # noqa: F401
    except Exception as e:  # DeepSpeed's import can fail in many ways without its ops
        skipped = {s: f"DeepSpeed does not import here ({type(e).__name__})" for s in systems if s.startswith("ds")}
        return [s for s in systems if s not in skipped], skipped
    return systems, {}


def summarize(results: dict[str, list[list[dict[str, Any]]]], tokens_per_step: int) -> dict[str, dict[str, Any]]:
    out = {}
    for system, reps in results.items():
        rates = [tokens_per_step / statistics.median(r[0]["step_seconds"]) for r in reps]
        states = [sum(r[0]["memory"].values()) for r in reps]
        out[system] = {
            "tokens_per_s": statistics.median(rates),
            "tokens_per_s_range": [min(rates), max(rates)],
            "model_state_bytes": max(states),
            "memory": reps[-1][0]["memory"],
            "trained": reps[-1][0]["trained"],
            "first_loss": reps[-1][0]["losses"][0],
        }
    return out


def agreement(results: dict[str, list[list[dict[str, Any]]]], limit: float = 0.05) -> dict[str, float]:
    """Each system's largest loss difference from zerotrain stage 3's of its kind (full fine-tuning, LoRA) over the
    steps. The systems train one model on one batch, so the first losses agree exactly; later steps round apart
    where a reduction sums in another order and Adam's eps divides a near-zero gradient (DeepSpeed's full
    fine-tuning: 1e-6 at step 2, a few 1e-3 by step 10), but a system that did not train what the others did lands
    far off: beyond `limit` the run fails."""
    losses = {s: reps[0][0]["losses"] for s, reps in results.items()}
    out = {}
    for system, mine in losses.items():
        kind = system.rsplit("-", 1)[1]
        reference = losses.get(f"zero3-{kind}", mine)
        out[system] = max(abs(a - b) for a, b in zip(mine, reference, strict=True))
        if mine[0] != reference[0] or out[system] > limit:
            raise AssertionError(f"{system}'s losses leave zero3-{kind}'s by {out[system]:.2e}: {losses}")
    return out


def print_table(summary: dict[str, dict[str, Any]], reference: str) -> None:
    ref = summary[reference]
    head = f"{'system':12} {'tokens/s (range)':>26} {'vs ' + reference:>16} {'model states/rank':>18}"
    print(f"{head} {'vs ' + reference:>16} {'max |Δ loss|':>13}")
    for system, s in summary.items():
        lo, hi = s["tokens_per_s_range"]
        rlo, rhi = ref["tokens_per_s_range"]
        same = "equal" if lo <= rhi and rlo <= hi else f"{s['tokens_per_s'] / ref['tokens_per_s']:.2f}×"
        states = s["model_state_bytes"] / 1e6
        print(
            f"{system:12} {s['tokens_per_s']:10,.0f} ({lo:,.0f}-{hi:,.0f}) {same:>16} {states:15.2f} MB "
            f"{s['model_state_bytes'] / ref['model_state_bytes']:>15.2f}× {s.get('max_loss_difference', 0):13.1e}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    systems, skipped = available([s for s in args.systems.split(",") if s])
    for system, why in skipped.items():
        print(f"{system}: skipped ({why})")
    results: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in systems}
    for rep in range(args.reps):
        for system in systems if rep % 2 == 0 else list(reversed(systems)):
            with tempfile.TemporaryDirectory() as out:
                run = Run(
                    system, 2, args.hidden, args.layers, args.vocab, args.seq_len, args.batch, args.steps,
                    args.warmup, args.rank, free_port(), out,
                )  # fmt: skip
                results[system].append(launch(run))
    summary = summarize(results, args.batch * args.seq_len)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary, "skipped": skipped}
    args.out.write_text(json.dumps({**record, "raw": results}, indent=1) + "\n")  # kept, whatever the check says
    for system, worst in agreement(results).items():
        summary[system]["max_loss_difference"] = worst
    print_table(summary, "zero3-lora" if "zero3-lora" in summary else next(iter(summary)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
