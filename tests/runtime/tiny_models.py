"""Tiny models and the single-process reference trainer the runtime tests compare against."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """A pre-norm MLP residual block (the partition unit in tests)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d + 1)
        self.down = nn.Linear(2 * d + 1, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    """Embedding, blocks, final norm and an output projection (tied to the embedding if `tied`)."""

    def __init__(
        self, vocab: int = 13, d: int = 10, blocks: int = 3, tied: bool = False, skip: int = -1, cut: int = -1
    ) -> None:
        super().__init__()
        # Divergence tests: `skip` leaves a block out of forward; `cut` detaches the activations after a
        # block, so backward never reaches it or anything before it.
        self.skip, self.cut = skip, cut
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(blocks))
        self.norm_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for i, b in enumerate(self.blocks):
            if i != self.skip:
                x = b(x)
            if i == self.cut:
                x = x.detach()
        return self.head(self.norm_f(x))


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))


def make_model(seed: int = 0, **kw: Any) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(**kw)


def batches(steps: int, world_size: int, micro: int = 1, per_rank: int = 2, seq: int = 7, vocab: int = 13):
    """[step][micro][rank] token batches, identical in every process (fixed seed)."""
    g = torch.Generator().manual_seed(1234)
    return [
        [[torch.randint(0, vocab, (per_rank, seq), generator=g) for _ in range(world_size)] for _ in range(micro)]
        for _ in range(steps)
    ]


def reference_train(
    model: nn.Module,
    data: list,
    make_opt: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
    no_decay: Callable[[str], bool],
    clip: float | None,
) -> tuple[dict[str, torch.Tensor], list[float], list[float]]:
    """Single-process training on the concatenated global batch: params, losses and grad norms per step."""
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not no_decay(n)]
    nodecay = [p for n, p in model.named_parameters() if p.requires_grad and no_decay(n)]
    opt = make_opt([{"params": decay}, {"params": nodecay, "weight_decay": 0.0}])
    losses, norms = [], []
    for step in data:
        opt.zero_grad()
        total = 0.0
        for micro in step:
            tokens = torch.cat(micro)
            loss = lm_loss(model(tokens), tokens) / len(step)
            loss.backward()
            total += loss.item()
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip is not None else float("inf"))
        norms.append(float(norm))
        losses.append(total)
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}, losses, norms


class ConvBlock(nn.Module):
    """A residual conv block with BatchNorm: running statistics and a counter as persistent buffers."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.bn(self.conv(x)))


class ConvNet(nn.Module):
    """A small conv net whose BatchNorms keep buffers, plus one non-persistent buffer (left out of state_dict)."""

    def __init__(self, c: int = 4, blocks: int = 2, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.bn0 = nn.BatchNorm2d(c)
        self.blocks = nn.ModuleList(ConvBlock(c) for _ in range(blocks))
        self.head = nn.Linear(c, classes)
        self.register_buffer("scale", torch.tensor(0.5), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn0(self.stem(x)))
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean((2, 3)) * self.scale)


def image_batches(steps: int, world_size: int, per_rank: int = 3, classes: int = 5) -> list[list[tuple[Any, Any]]]:
    """[step][rank] (images, labels), identical in every process."""
    g = torch.Generator().manual_seed(99)
    return [
        [
            (torch.randn(per_rank, 3, 6, 6, generator=g), torch.randint(0, classes, (per_rank,), generator=g))
            for _ in range(world_size)
        ]
        for _ in range(steps)
    ]


TINY_DECODER: dict[str, int] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
"""The sizes of the tiny Hugging Face decoders (Llama, Mixtral) the runtime tests build."""


def llama_config(tie: bool = False) -> Any:
    """A tiny Llama's config (`tie`: the output projection tied to the embedding)."""
    from transformers import LlamaConfig

    return LlamaConfig(**TINY_DECODER, tie_word_embeddings=tie)
