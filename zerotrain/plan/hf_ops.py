"""The operations the Hugging Face families are made of, as autograd records them (`autograd_memory`): what each
saves for backward, which inputs get gradients, what its backward allocates besides them. Torch-free.

Written against transformers 5.x and torch 2.x as they run on the device: tests/core/test_hf_activations.py checks
the families built from these against the tensors torch really allocates (`zerotrain plan -f JOB --measure-real`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from zerotrain.plan.autograd_memory import Graph, Tensor

FP32 = 4
INDEX = 8
"""Bytes of an int64: token ids, labels, positions, routing indices."""


class Attention(str, Enum):
    """How a layer's attention runs, which decides what it keeps for backward."""

    FUSED = "fused"
    """`scaled_dot_product_attention` in a flash or memory-efficient kernel: q, k, v, the output and one fp32
    log-sum-exp per head and token."""
    MATH = "math"
    """sdpa's math fallback (dropout on CPU ranks, whose fused kernel has none): the scores and their dropout, in
    fp32."""
    EAGER = "eager"
    """`attn_implementation: eager`: contiguous copies of q, k and v, the fp32 softmax and its cast."""


@dataclass(frozen=True)
class Adapters:
    """What LoRA does to a model: which linear layers get adapters (by their name in the family), their rank,
    whether their input is dropped, and which modules outside the blocks train in full."""

    rank: int
    targets: frozenset[str]
    """targetModules as peft matches them: a layer's name or the end of its dotted path (`all-linear`: every one)."""
    dropout: bool
    saved_modules: frozenset[str] = frozenset()

    def adapts(self, name: str) -> bool:
        """Whether the layer `name` (its path inside a block, e.g. `attn.c_proj`) gets an adapter."""
        if name == "lm_head":
            return "lm_head" in self.targets
        return "all-linear" in self.targets or any(name == t or name.endswith(f".{t}") for t in self.targets)


@dataclass(frozen=True)
class Run:
    """One rank's micro-batch and how the model runs it."""

    rows: int
    """Sequences in the micro-batch (this rank's share of entrypointArgs.batch_size)."""
    seq: int
    compute: int
    """Bytes of the compute dtype (2 or 4)."""
    eager: bool = False
    """attn_implementation: eager instead of sdpa."""
    cuda: bool = False
    """GPU ranks: dropout keeps a 1-byte mask and sdpa's fused kernels run dropout themselves (on CPU ranks the mask
    has the compute dtype and dropout sends sdpa to its math kernel)."""
    records: bool = False
    """Instruction records: the batch holds input ids, labels and per-row positions (else a window of tokens)."""
    packed: bool = False
    """Records packed into rows: their positions restart, so the model builds a mask for sdpa."""
    adapters: Adapters | None = None

    @property
    def tokens(self) -> int:
        return self.rows * self.seq


class Ops:
    """A family's forward, one operation at a time, recorded into `g`."""

    def __init__(self, g: Graph, run: Run) -> None:
        self.g, self.run, self.w = g, run, run.compute

    def trains(self, module: str) -> bool:
        """Whether a module outside the blocks trains: every one without LoRA, modulesToSave's with it."""
        a = self.run.adapters
        return a is None or module in a.saved_modules

    @property
    def blocks_train(self) -> bool:
        """Whether the blocks' own weights train (not under LoRA, whose base is frozen)."""
        return self.run.adapters is None

    def linear(
        self,
        x: Tensor,
        n_in: int,
        n_out: int,
        name: str,
        trainable: bool | None = None,
        rows: int = 0,
        tied: Tensor | None = None,
    ) -> Tensor:
        """x @ W.T (+ b) over `rows` (the tokens by default), LoRA's adapters beside it when `name` is targeted. A
        trained W keeps x for its gradient, which its backward allocates whole (`tied`: W is that parameter, whose
        gradient waits for its other use)."""
        rows, w = rows or self.run.tokens, self.w
        trained = self.blocks_train if trainable is None else trainable
        out = self.g.node(
            rows * n_out * w,
            grads=(x,) if tied is None else (x, tied),
            saved=(x,) if trained else (),
            scratch=n_in * n_out * w if trained and tied is None else 0,
            trainable=trained,
        )
        a = self.run.adapters
        if a is None or not a.adapts(name):
            return out
        source = self.dropout(x, rows * n_in) if a.dropout else x
        inner = self.g.node(
            rows * a.rank * w, grads=(source,), saved=(source,), scratch=n_in * a.rank * w, trainable=True
        )
        lora = self.g.node(rows * n_out * w, grads=(inner,), saved=(inner,), scratch=a.rank * n_out * w, trainable=True)
        return self.add(out, self.g.node(rows * n_out * w, grads=(lora,)))  # scaled by alpha / rank

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return self.g.node(max(a.nbytes, b.nbytes), grads=(a, b), passes_grad=True)

    def mul(self, a: Tensor, b: Tensor, nbytes: int, scratch: int = 0) -> Tensor:
        """a * b: each input's gradient needs the other."""
        saved = ((b,) if a.requires_grad else ()) + ((a,) if b.requires_grad else ())
        return self.g.node(nbytes, grads=(a, b), saved=saved, scratch=scratch)

    def copy(self, x: Tensor, nbytes: int) -> Tensor:
        """A copy autograd passes the gradient through (a cast, a contiguous copy, a gather); its backward allocates
        the input's gradient."""
        return self.g.node(nbytes, grads=(x,))

    def cast(self, x: Tensor, elements: int, to: int, source: int) -> Tensor:
        """x.to(a dtype of `to` bytes) from `source` bytes: no copy when they agree."""
        return x if to == source else self.copy(x, elements * to)

    def dropout(self, x: Tensor, elements: int, nbytes: int = 0) -> Tensor:
        """Training dropout: its output and a mask (1 byte on CUDA; on CPU a tensor of x's dtype)."""
        size = nbytes // elements if nbytes else self.w
        mask = self.g.leaf(elements * (1 if self.run.cuda else size))
        return self.g.node(elements * size, grads=(x,), saved=(mask,))

    def rms_norm(self, x: Tensor, rows: int, width: int, trainable: bool) -> Tensor:
        """transformers' RMSNorm over `width`: x in fp32, x·rsqrt(mean(x²) + eps), cast back, times the weight."""
        g, n, w = self.g, rows * width, self.w
        x32 = self.cast(x, n, FP32, w)
        # pow's backward holds x¹ and 2·x¹ beside the gradient; mean's expands the gradient to x's size.
        squared = g.node(n * FP32, grads=(x32,), saved=(x32,), scratch=2 * n * FP32)
        mean = g.node(rows * FP32, grads=(squared,))
        shifted = g.node(rows * FP32, grads=(mean,), passes_grad=True)
        rstd = g.node(rows * FP32, grads=(shifted,), saves_output=True)
        # rstd's gradient is x·grad at x's size, then summed over the width.
        normed = self.mul(x32, rstd, n * FP32, scratch=n * FP32)
        back = self.cast(normed, n, w, FP32)
        return g.node(
            n * w,
            grads=(back,),
            saved=(back,) if trainable else (),
            scratch=n * w if trainable else 0,
            trainable=trainable,
        )

    def layer_norm(self, x: Tensor, width: int, trainable: bool) -> Tensor:
        """torch's native LayerNorm: keeps its input, mean and rstd (the compute dtype on CPU, fp32 on CUDA)."""
        t = self.run.tokens
        stats = self.g.leaf(t * (FP32 if self.run.cuda else self.w))
        stats2 = self.g.leaf(t * (FP32 if self.run.cuda else self.w))
        return self.g.node(
            t * width * self.w,
            grads=(x,),
            saved=(x, stats, stats2),
            scratch=2 * width * FP32 if trainable else 0,
            trainable=trainable,
        )

    def embedding(
        self, ids: Tensor, rows: int, vocab: int, hidden: int, trainable: bool, tied: Tensor | None = None
    ) -> Tensor:
        """A lookup: saves the ids; its backward allocates the dense vocab × hidden gradient (of `tied`, the weight
        the head shares, when it does)."""
        return self.g.node(
            rows * hidden * self.w,
            grads=() if tied is None else (tied,),
            saved=(ids,) if trainable else (),
            scratch=vocab * hidden * self.w if trainable and tied is None else 0,
            trainable=trainable,
        )

    def loss(self, hidden: Tensor, n_hidden: int, vocab: int, trainable: bool, tied: Tensor | None = None) -> Tensor:
        """The head's logits and the entry point's cross-entropy in fp32: log-softmax saves its output, and its
        backward holds the log-probabilities' gradient beside the logits'."""
        t, g = self.run.tokens, self.g
        logits = self.linear(hidden, n_hidden, vocab, "lm_head", trainable, tied=tied)
        upcast = self.cast(logits, t * vocab, FP32, self.w)
        logprobs = g.node(t * vocab * FP32, grads=(upcast,), saves_output=True)
        # The targets: a token window's are a copy (a strided slice, flattened), records' labels a view.
        targets = g.leaf(0 if self.run.records else t * INDEX)
        total = g.node(FP32, grads=(logprobs,), saved=(targets,))
        return g.node(FP32, grads=(total,))
