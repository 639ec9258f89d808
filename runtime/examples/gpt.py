"""A small byte-level GPT on the Python standard library's own source: `zerotrain.runtime.examples.gpt:build`.

Pre-norm transformer blocks (the ZeRO unit is the `Block` class), learned positions, and an output projection
tied to the input embedding. Text and batching come from `zerotrain.runtime.job.data`, so the global batch of
every step is the same at any world size.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from zerotrain.runtime.job.data import HeldOutBatches, TextBatches, read_text_corpus
from zerotrain.runtime.job.task import ConfigError, TrainingTask

VOCAB = 256  # bytes


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc_in = nn.Linear(d_model, 4 * d_model)
        self.fc_out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_out(F.gelu(self.fc_in(self.norm2(x))))


class GPT(nn.Module):
    """Decoder-only transformer over bytes; `head.weight` is the same Parameter as `embed.weight`."""

    def __init__(self, *, seq_len: int, d_model: int, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.norm_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.embed(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm_f(x))


def next_byte_loss(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting byte i+1 from bytes 0..i (in fp32 whatever the compute dtype)."""
    targets = batch[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def model_inputs(batch: torch.Tensor) -> torch.Tensor:
    """All bytes but the last of each row."""
    return batch[:, :-1]


def build(
    rank: int,
    world_size: int,
    *,
    seq_len: int = 128,
    batch_size: int = 16,
    d_model: int = 128,
    n_layers: int = 4,
    n_heads: int = 4,
    max_bytes: int = 2_000_000,
    text_dir: str | None = None,
    eval_bytes: int = 0,
) -> TrainingTask:
    """The task for one rank.

    `batch_size` is the *global* micro-batch in sequences (all ranks together; a multiple of the world size);
    the data order follows the seed the runtime set (spec.training.seed). `eval_bytes` > 0 holds the text's last
    eval_bytes out of training, as the evaluation data (spec.training.evaluation).
    """
    if d_model % n_heads != 0:
        raise ConfigError(
            f"spec.entrypointArgs.d_model: got {d_model}, not divisible by n_heads={n_heads}; use a multiple of n_heads"
        )
    data = read_text_corpus(Path(text_dir) if text_dir else None, max_bytes=max_bytes)
    held_out = None
    if eval_bytes:
        if not 0 < eval_bytes <= data.numel() // 2:
            raise ConfigError(
                f"spec.entrypointArgs.eval_bytes: got {eval_bytes}, but the text has {data.numel()} bytes; hold out "
                f"between 1 and half of them (e.g. {data.numel() // 10})"
            )
        data, text = data[:-eval_bytes], data[-eval_bytes:]
        held_out = HeldOutBatches(text, seq_len=seq_len, batch_size=batch_size, rank=rank, world_size=world_size)
    batches = TextBatches(
        data, seq_len=seq_len, batch_size=batch_size, rank=rank, world_size=world_size, seed=torch.initial_seed()
    )
    model = GPT(seq_len=seq_len, d_model=d_model, n_layers=n_layers, n_heads=n_heads)
    return TrainingTask(
        model=model,
        loss=next_byte_loss,
        batches=iter(batches),
        inputs=model_inputs,
        tokens_per_batch=(batch_size // world_size) * seq_len,
        samples_per_batch=batch_size // world_size,
        unit_modules=[Block.__name__],
        eval_batches=held_out,
    )
