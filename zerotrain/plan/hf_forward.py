"""Each Hugging Face family's forward, as transformers 5.x runs it, replayed on byte sizes (`hf_ops`), and the
peak one micro-batch adds to a rank (`activation_peak`). Torch-free.

The families follow their modeling code: the Llama family (llama, mistral, qwen2, qwen3's per-head q/k norms) and
mixtral's experts (transformers' grouped-matmul experts: every routed token's copy at once), GPT-2's LayerNorms,
fused QKV, dropouts and its written-out GeLU. The attention is the run's: sdpa's fused kernel (q, k, v, the output,
a log-sum-exp), its math fallback when dropout runs on CPU ranks (the scores in fp32 and their dropout), sdpa with a
mask for packed records or a sliding window (k and v repeated to every head, the mask in the compute dtype), or
eager (contiguous copies of q, k and v, the fp32 softmax and its cast).
"""

from __future__ import annotations

from functools import lru_cache

from zerotrain.architecture import GATED, Activation, Architecture, Family
from zerotrain.plan.autograd_memory import Graph, Peak, Tensor
from zerotrain.plan.hf_ops import FP32, INDEX, Attention, Ops, Run


def attention_kind(a: Architecture, run: Run) -> Attention:
    """How this run's attention executes."""
    if run.eager:
        return Attention.EAGER
    if a.attention_dropout > 0 and not run.cuda:
        return Attention.MATH  # the CPU's fused kernel has no dropout
    return Attention.FUSED


def masked(a: Architecture, run: Run) -> bool:
    """Whether the model builds a mask for sdpa: packed records, or sequences that reach the sliding window."""
    return run.packed or (a.sliding_window is not None and run.seq >= a.sliding_window)


def attend(ops: Ops, a: Architecture, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Attention over q (heads) and k, v (kv heads), in the layout the output projection reads."""
    g, run, w = ops.g, ops.run, ops.w
    t, hd, heads = run.tokens, a.head_width, a.heads
    full = t * heads * hd
    scores = run.rows * heads * run.seq * run.seq
    kind = attention_kind(a, run)
    if kind is Attention.FUSED:
        if masked(a, run):
            # A mask turns off sdpa's grouped-query path: k and v are repeated to every head; the mask is made in the
            # compute dtype, by every layer.
            if a.key_value_heads != heads:
                k, v = ops.copy(k, full * w), ops.copy(v, full * w)
            mask = g.leaf(run.rows * run.seq * run.seq * w)
            saved: tuple[Tensor, ...] = (q, k, v, mask)
        else:
            saved = (q, k, v)
        lse = g.leaf(run.rows * heads * run.seq * FP32)
        return g.node(full * w, grads=(q, k, v), saved=(*saved, lse), saves_output=True, scratch=2 * full * FP32)
    if kind is Attention.MATH:
        # The math kernel upcasts to fp32 on CPU: contiguous fp32 copies of q, kᵀ and v, the scores, their dropout.
        # In fp32 with one row, the batched matmuls take q and k as scaled (a copy each) and v as it is.
        if w == FP32 and run.rows == 1:
            qs, ks, vs = ops.copy(q, full * FP32), ops.copy(k, full * FP32), v
        else:
            qs, ks, vs = ops.copy(q, full * FP32), ops.copy(k, full * FP32), ops.copy(v, full * FP32)
        raw = ops.mul(qs, ks, scores * FP32)
        probs = g.node(scores * FP32, grads=(raw,), saves_output=True)
        dropped = ops.dropout(probs, scores, scores * FP32)
        out = ops.mul(dropped, vs, full * FP32)
        return ops.copy(ops.cast(out, full, w, FP32), full * w)
    # eager: repeat_kv (or a contiguous copy) of k and v, a contiguous copy of q for the batched matmul.
    qs, ks = ops.copy(q, full * w), ops.copy(k, full * w)
    raw = ops.mul(qs, ks, scores * w)
    probs = ops.cast(g.node(scores * FP32, grads=(raw,), saves_output=True), scores, w, FP32)
    if a.attention_dropout > 0:
        probs = ops.dropout(probs, scores)
    out = ops.mul(probs, ops.copy(v, full * w), full * w)
    return ops.copy(out, full * w)  # transpose(1, 2).contiguous()


def rope(ops: Ops, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x·cos + rotate_half(x)·sin: keeps cos and sin only; rotate_half's backward comes back at x's size."""
    a = ops.g.node(x.nbytes, grads=(x,), saved=(cos,))
    b = ops.g.node(x.nbytes, grads=(x,), saved=(sin,), scratch=x.nbytes)
    return ops.add(a, b)


def activate(ops: Ops, x: Tensor, elements: int, activation: Activation) -> Tensor:
    """The MLP's activation: a fused kernel keeps its input; GPT-2's gelu_new, written out, keeps 0.5·x, the tanh
    and 1 + tanh besides (and its backward three temporaries of x's size)."""
    g, n = ops.g, elements * ops.w
    if activation is not Activation.GELU_NEW:
        return g.node(n, grads=(x,), saved=(x,))
    half = g.node(n, grads=(x,))
    cubed = g.node(n, grads=(x,), saved=(x,), scratch=2 * n)
    inner = ops.add(x, g.node(n, grads=(cubed,)))
    tanh = g.node(n, grads=(g.node(n, grads=(inner,)),), saves_output=True, scratch=n)
    return ops.mul(half, g.node(n, grads=(tanh,), passes_grad=True), n)


def gated_block(ops: Ops, a: Architecture, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """A Llama-family decoder layer: RMSNorm, attention with rotary positions, RMSNorm, a gated MLP (or experts)."""
    run, w = ops.run, ops.w
    t, h, hd, trains = run.tokens, a.hidden, a.head_width, ops.blocks_train
    normed = ops.rms_norm(x, t, h, trains)
    q = ops.linear(normed, h, a.heads * hd, "self_attn.q_proj")
    k = ops.linear(normed, h, a.key_value_heads * hd, "self_attn.k_proj")
    v = ops.linear(normed, h, a.key_value_heads * hd, "self_attn.v_proj")
    if a.family is Family.QWEN3:
        q = ops.rms_norm(q, t * a.heads, hd, trains)
        k = ops.rms_norm(k, t * a.key_value_heads, hd, trains)
    out = attend(ops, a, rope(ops, q, cos, sin), rope(ops, k, cos, sin), v)
    x = ops.add(x, ops.linear(out, a.heads * hd, h, "self_attn.o_proj"))
    normed = ops.rms_norm(x, t, h, trains)
    if a.experts is not None:
        return ops.add(x, experts(ops, a, normed))
    gate = activate(ops, ops.linear(normed, h, a.intermediate, "mlp.gate_proj"), t * a.intermediate, a.activation)
    inner = ops.mul(gate, ops.linear(normed, h, a.intermediate, "mlp.up_proj"), t * a.intermediate * w)
    return ops.add(x, ops.linear(inner, a.intermediate, h, "mlp.down_proj"))


def experts(ops: Ops, a: Architecture, x: Tensor) -> Tensor:
    """Mixtral's router and experts as transformers' grouped-matmul experts run them: every token's k copies sorted
    by expert (S = tokens × k rows), one grouped matmul per projection over all the experts' weights, the routing
    weights in fp32."""
    g, run, w = ops.g, ops.run, ops.w
    t, h, inner, e, k = run.tokens, a.hidden, a.intermediate, a.experts or 1, a.routed
    s, trains = t * k, ops.blocks_train
    logits = ops.linear(x, h, e, "mlp.gate", trains)
    probs = g.node(t * e * FP32, grads=(ops.cast(logits, t * e, FP32, w),), saves_output=True)
    # topk keeps its indices; the in-place renormalisation keeps the sum and a copy of the values.
    chosen = g.node(t * k * FP32, grads=(probs,), saved=(g.leaf(t * k * INDEX),))
    weights = g.node(t * k * FP32, grads=(chosen,), saved=(g.leaf(t * FP32), g.leaf(t * k * FP32)))
    # The gathers keep their indices: each copy's token, the sort's permutation, the inverse permutation.
    rows = g.node(s * h * w, grads=(x,), saved=(g.leaf(s * INDEX),))
    routed = g.node(s * FP32, grads=(weights,), saved=(g.leaf(s * INDEX),))
    offsets = g.leaf(e * 4)
    up = grouped(ops, rows, h, 2 * inner, e, offsets)
    half = s * inner * w
    gated = ops.mul(activate(ops, g.view(up, half), s * inner, a.activation), g.view(up, half), half)
    # Its backward makes the weights' gradient at full size before summing it, and the rows' in fp32 before the
    # cast back to the compute dtype.
    full = s * h * FP32
    weighted = ops.mul(grouped(ops, gated, inner, h, e, offsets), routed, full, scratch=full * (1 + (w != FP32)))
    restored = g.node(s * h * FP32, grads=(weighted,), saved=(g.leaf(s * INDEX),))
    summed = g.node(t * h * FP32, grads=(restored,), passes_grad=True)
    return ops.cast(summed, t * h, w, FP32)


def grouped(ops: Ops, x: Tensor, n_in: int, n_out: int, experts: int, offsets: Tensor) -> Tensor:
    """One grouped matmul over every expert's weight: keeps its input (for the weights' gradient, allocated for
    all the experts at once) and the groups' offsets."""
    trains = ops.blocks_train
    rows = x.nbytes // (n_in * ops.w)
    return ops.g.node(
        rows * n_out * ops.w,
        grads=(x,),
        saved=(x, offsets) if trains else (offsets,),
        scratch=experts * n_in * n_out * ops.w if trains else 0,
        trainable=trains,
    )


def gpt2_block(ops: Ops, a: Architecture, x: Tensor) -> Tensor:
    """GPT-2's block: LayerNorm, fused QKV (q, k and v are views of one output), attention, projection and its
    dropout; LayerNorm, the MLP and its dropout; residuals around both."""
    g, run, w = ops.g, ops.run, ops.w
    t, h, trains = run.tokens, a.hidden, ops.blocks_train
    qkv = ops.linear(ops.layer_norm(x, h, trains), h, 3 * h, "attn.c_attn")
    q, k, v = (g.view(qkv, t * h * w) for _ in range(3))
    out = ops.linear(attend(ops, a, q, k, v), h, h, "attn.c_proj")
    x = ops.add(residual_dropout(ops, a, out, t * h), x)
    hidden = ops.linear(ops.layer_norm(x, h, trains), h, a.intermediate, "mlp.c_fc")
    hidden = ops.linear(activate(ops, hidden, t * a.intermediate, a.activation), a.intermediate, h, "mlp.c_proj")
    return ops.add(residual_dropout(ops, a, hidden, t * h), x)


def residual_dropout(ops: Ops, a: Architecture, x: Tensor, elements: int) -> Tensor:
    return ops.dropout(x, elements) if a.residual_dropout > 0 else x


def forward(a: Architecture, run: Run, checkpointing: bool) -> tuple[Graph, Tensor]:
    """The whole forward and loss of one micro-batch; the graph and its loss."""
    g = Graph()
    ops = Ops(g, run)
    t, h = run.tokens, a.hidden
    ids = _batch(g, run)
    gpt2 = a.family is Family.GPT2
    embedding = "wte" if gpt2 else "embed_tokens"
    trains = ops.trains(embedding)
    # A tied head's gradient waits for the embedding's, at the end of backward, to be summed with it.
    tied = g.parameter(a.vocabulary * h * run.compute, uses=2) if a.tied_embeddings and trains else None
    x = ops.embedding(ids, t, a.vocabulary, h, trains, tied)
    cos = sin = x
    if gpt2:
        positions = g.keep(g.leaf(run.seq * INDEX))
        x = ops.add(x, ops.embedding(positions, run.seq, a.positions, h, ops.trains("wpe")))
        if a.embedding_dropout > 0:
            x = ops.dropout(x, t * h)
    else:  # cos and sin for one row of positions (one per row when records give them)
        size = (run.rows if run.records else 1) * run.seq * a.head_width * run.compute
        cos, sin = g.leaf(size), g.leaf(size)
    # What every layer is also called with, which a checkpoint keeps: the mask (a float one for eager, a boolean
    # one for sdpa with a mask), and the positions the rotary layers take.
    extra = []
    if run.eager or masked(a, run):
        extra.append(g.leaf(run.rows * run.seq * run.seq * (run.compute if run.eager else 1)))
    if not gpt2 and not run.records:
        extra.append(g.leaf(run.seq * INDEX))
    g.region = "block"
    for _ in range(a.layers):
        if checkpointing:
            g.begin_unit((x, *extra) if gpt2 else (x, cos, sin, *extra))
        x = gpt2_block(ops, a, x) if gpt2 else gated_block(ops, a, x, cos, sin)
        if checkpointing:
            g.end_unit()
    g.region = "ends"
    normed = ops.layer_norm(x, h, ops.trains("ln_f")) if gpt2 else ops.rms_norm(x, t, h, ops.trains("norm"))
    head = embedding if a.tied_embeddings else "lm_head"
    return g, ops.loss(normed, h, a.vocabulary, ops.trains(head), tied)


def _batch(g: Graph, run: Run) -> Tensor:
    """What the training loop holds through backward; the model's input ids."""
    t = run.tokens
    if run.records:  # input_ids (the model's), labels, position_ids
        g.keep(g.leaf(t * INDEX))
        g.keep(g.leaf(t * INDEX))
        return g.keep(g.leaf(t * INDEX))
    g.keep(g.leaf(run.rows * (run.seq + 1) * INDEX))  # the window of seq + 1 tokens
    return g.keep(g.leaf(t * INDEX))  # its first seq tokens, clamped: the input ids


def micro_batch_peak(a: Architecture, run: Run, checkpointing: bool) -> Peak:
    """The backward's peak for one micro-batch (cached: admission asks for the same run at every candidate size)."""
    return _peak(a.model_dump_json(), run, checkpointing)


@lru_cache(maxsize=256)
def _peak(architecture: str, run: Run, checkpointing: bool) -> Peak:
    g, loss = forward(Architecture.model_validate_json(architecture), run, checkpointing)
    return g.peak(loss)


def supported(a: Architecture) -> bool:
    """Whether the replay covers this architecture (every family here, the gated ones with their own MLPs)."""
    return a.family is Family.GPT2 or a.family in GATED
