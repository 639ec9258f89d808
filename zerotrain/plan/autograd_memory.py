"""A micro-batch's activation memory from a model's forward written as autograd would record it: torch-free.

A family's forward (`zerotrain.plan.hf_forward`) is replayed here on symbolic tensors that have only a byte size:
each operation says what autograd saves for its backward, which inputs get gradients and what its backward allocates
besides them (a weight's gradient, a decomposed kernel's temporaries). `Graph.peak()` then walks the backward as
torch's engine does on one device (nodes in reverse order of creation), keeping the live bytes:

- every storage some node saved, until the last node that saved it has run;
- each tensor's pending gradient, from the node that produces it until the node that consumes it (a second gradient
  for the same tensor is added out of place, so both exist for a moment);
- a node's own allocations while it runs;
- a checkpointed unit's saved storages from the moment backward reaches it (the recompute) until they are released.

The peak of that walk, with what the forward kept outside the nodes (the batch, the token ids), is what one
micro-batch adds to a rank's memory: `zerotrain plan -f JOB --measure-real` measures the same figure on real tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class Storage:
    """Memory one or more tensors view."""

    nbytes: int


@dataclass(eq=False)
class Tensor:
    """A tensor of the replayed forward: its bytes, its storage (shared with the tensors it is a view of) and whether
    autograd tracks it."""

    nbytes: int
    storage: Storage
    requires_grad: bool
    uses: int = 0
    """A parameter used `uses` times (tied weights): its gradients wait in one buffer until every use has given
    one, are summed out of place, and go to the runtime (0: an activation)."""
    base: Tensor | None = None
    """The tensor this one is a view (a slice) of: its gradient goes into a zeroed gradient of the base's size."""


@dataclass(eq=False)
class Node:
    """One autograd node: consumes its output's gradient, produces its inputs' (those that require one)."""

    output: Tensor
    grads: tuple[Tensor, ...]
    """Inputs that receive a gradient."""
    saved: tuple[Storage, ...]
    scratch: int
    """Bytes its backward holds besides the gradients it produces (a weight's gradient, temporaries)."""
    passes_grad: bool
    """The input gradients are the output's own tensor (add, a view): nothing is allocated."""
    unit: int | None
    """The checkpointed unit the node belongs to (its saved storages exist only from the unit's recompute on)."""
    region: str
    """Where in the model the node is (the graph's `region` when it was recorded): the peak is kept per region."""


@dataclass
class Peak:
    """Where a micro-batch's memory peaks, and the bytes kept at the end of its forward."""

    bytes: int
    """Peak bytes over the backward (everything the forward kept, plus what backward holds at its worst moment)."""
    forward_kept: int
    """Bytes alive when the forward (and the loss) has ended: saved storages and what the caller keeps."""
    at_node: int
    """Index of the node whose backward sets the peak (its order of creation), for tests and debugging."""
    by_region: dict[str, int]
    """The peak while each region's nodes run their backward (a checkpointed unit's recompute is its region's)."""


@dataclass
class Graph:
    """The forward's record. Build it with `leaf`, `node` and `view`; `peak` walks its backward."""

    nodes: list[Node] = field(default_factory=list)
    kept: list[Storage] = field(default_factory=list)
    """Storages alive through backward without a node saving them (the batch the training loop holds)."""
    unit_tail: dict[int, int] = field(default_factory=dict)
    """Per checkpointed unit: bytes its recompute makes beside what it saves (the last output before it stops)."""
    region: str = ""
    """The region the next nodes belong to."""
    unit_inputs: set[Storage] = field(default_factory=set)
    """What the checkpointed units keep through the forward: their inputs."""
    _unit: int | None = None
    _units: int = 0
    _unit_start: int = 0
    _unit_inputs: tuple[Storage, ...] = ()

    def leaf(self, nbytes: int, requires_grad: bool = False) -> Tensor:
        """A tensor made outside autograd (token ids, a mask, an embedding's frozen output)."""
        return Tensor(nbytes, Storage(nbytes), requires_grad)

    def keep(self, t: Tensor) -> Tensor:
        """`t` stays alive through backward (the caller holds it)."""
        self.kept.append(t.storage)
        return t

    def parameter(self, nbytes: int, uses: int) -> Tensor:
        """A trained parameter used `uses` times (a tied embedding and head), whose gradient is a pending gradient
        of its own; parameters used once give theirs as their node's scratch."""
        return Tensor(nbytes, Storage(0), True, uses)

    def view(self, t: Tensor, nbytes: int | None = None) -> Tensor:
        """A view of `t` (same storage); `nbytes` for a slice of it (a split, a chunk)."""
        return Tensor(t.nbytes if nbytes is None else nbytes, t.storage, t.requires_grad, base=t)

    def node(
        self,
        nbytes: int,
        grads: tuple[Tensor, ...] = (),
        saved: tuple[Tensor, ...] = (),
        scratch: int = 0,
        trainable: bool = False,
        passes_grad: bool = False,
        output: Tensor | None = None,
        saves_output: bool = False,
    ) -> Tensor:
        """An operation's output of `nbytes` (or `output`, a view it returns). It records a node only when autograd
        would (an input requires a gradient, or a `trainable` parameter takes part); only then are `saved` (and the
        output itself, `saves_output`) kept and the inputs of `grads` that require one given a gradient."""
        wanted = tuple(t for t in grads if t.requires_grad)
        tracked = bool(wanted) or trainable
        out = output if output is not None else Tensor(nbytes, Storage(nbytes), tracked)
        out.requires_grad = tracked
        if tracked:
            storages = tuple(dict.fromkeys(t.storage for t in (*saved, *((out,) if saves_output else ()))))
            self.nodes.append(Node(out, wanted, storages, scratch, passes_grad, self._unit, self.region))
        return out

    def begin_unit(self, inputs: tuple[Tensor, ...]) -> None:
        """Nodes from here to `end_unit` are one checkpointed unit: only its `inputs` are kept through the forward
        (held by the checkpoint until the unit's backward has run)."""
        self._unit = self._units
        self._units += 1
        self._unit_start = len(self.nodes)
        self._unit_inputs = tuple(t.storage for t in inputs)

    def end_unit(self) -> None:
        """Close the unit. Its recompute stops once the last tensor it saves is made again: that node's output and
        its inputs are alive beside the saved storages then (the unit's `tail`)."""
        assert self._unit is not None
        mine = self.nodes[self._unit_start :]
        if not mine:  # nothing in it needs a gradient (a frozen block)
            self._unit = None
            return
        last = next((n for n in reversed(mine) if n.saved), mine[-1])
        self.unit_tail[self._unit] = last.output.nbytes + sum(
            t.nbytes for t in last.grads if t.storage not in last.saved
        )
        first = mine[0]
        first.saved = tuple(dict.fromkeys((*first.saved, *self._unit_inputs)))
        self.unit_inputs.update(self._unit_inputs)
        self._unit = None

    def peak(self, loss: Tensor) -> Peak:
        """Walk the backward from `loss` and return the peak."""
        holders: dict[Storage, int] = {}
        unit_saved: dict[int, set[Storage]] = {}
        for n in self.nodes:
            for s in n.saved:
                holders[s] = holders.get(s, 0) + 1
            if n.unit is not None:
                unit_saved.setdefault(n.unit, set()).update(n.saved)
        # A checkpointed unit keeps through the forward only what is kept outside it too (its inputs).
        alive = {s for n in self.nodes if n.unit is None for s in n.saved} | set(self.kept) | self.unit_inputs
        walk = _Walk(sum(s.nbytes for s in alive))
        forward_kept = walk.live
        walk.pending[id(loss)] = walk.new(loss.nbytes)
        walk.pending[id(loss)].refs = 1
        recomputed: set[int] = set()
        for index in range(len(self.nodes) - 1, -1, -1):
            n = self.nodes[index]
            if id(n.output) not in walk.pending:
                continue
            walk.region = n.region
            # The recompute runs when backward first needs one of the unit's saved tensors.
            if n.unit is not None and n.unit not in recomputed and n.saved:
                recomputed.add(n.unit)
                fresh = unit_saved[n.unit] - alive
                alive |= fresh
                walk.live += sum(s.nbytes for s in fresh)
                walk.note(index, self.unit_tail[n.unit])
            incoming = walk.pending.pop(id(n.output))
            produced = [incoming if n.passes_grad else walk.new(t.nbytes) for t in n.grads]
            for b in produced:
                b.refs += 1
            walk.note(index, n.scratch)
            walk.release(incoming)
            for t, b in zip(n.grads, produced, strict=True):
                walk.arrive(index, t, b)
            for b in produced:
                walk.release(b)
            for s in n.saved:
                holders[s] -= 1
                if holders[s] == 0 and s in alive and s not in self.kept:
                    alive.discard(s)
                    walk.live -= s.nbytes
        return Peak(walk.best, forward_kept, walk.at, dict(walk.by_region))


@dataclass(eq=False)
class _Buffer:
    """A gradient buffer; `refs`: the pending gradients and nodes holding it."""

    nbytes: int
    refs: int = 0


@dataclass
class _Walk:
    """The backward's live bytes and its peak."""

    live: int
    best: int = 0
    at: int = -1
    pending: dict[int, _Buffer] = field(default_factory=dict)
    arrived: dict[int, int] = field(default_factory=dict)
    region: str = ""
    by_region: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.best = self.live

    def new(self, nbytes: int) -> _Buffer:
        """A buffer allocated now, held by nothing yet."""
        self.live += nbytes
        return _Buffer(nbytes)

    def note(self, index: int, extra: int) -> None:
        now = self.live + extra
        if now > self.by_region.get(self.region, 0):
            self.by_region[self.region] = now
        if now > self.best:
            self.best, self.at = now, index

    def release(self, b: _Buffer) -> None:
        b.refs -= 1
        if b.refs == 0:
            self.live -= b.nbytes

    def arrive(self, index: int, t: Tensor, b: _Buffer) -> None:
        """A gradient for tensor `t`: pending as it is, or added to the one already pending (in place when that one
        is held nowhere else, as torch's input buffer does; else a third buffer holds the sum). A tied parameter's
        are summed out of place once every use has given one, and handed on."""
        if t.base is not None:  # a slice's backward: the base's size, zeroed, the slice's gradient copied in
            whole = self.new(t.base.nbytes)
            self.note(index, 0)
            whole.refs = 1
            b.refs += 1
            self.release(b)
            self.arrive(index, t.base, whole)
            self.release(whole)
            return
        b.refs += 1
        key = id(t)
        earlier = self.pending.get(key)
        if t.uses:
            self.arrived[key] = self.arrived.get(key, 0) + 1
            if earlier is None:
                self.pending[key] = b
            else:
                total = self.new(earlier.nbytes)
                self.note(index, 0)
                self.release(earlier)
                self.release(b)
                self.pending[key] = total
                total.refs = 1
            if self.arrived[key] == t.uses:
                self.release(self.pending.pop(key))
            return
        if earlier is None:
            self.pending[key] = b
            return
        if earlier.refs == 1 and earlier is not b:
            self.release(b)
            return
        total = self.new(earlier.nbytes)
        total.refs = 1
        self.note(index, 0)
        self.release(earlier)
        self.release(b)
        self.pending[key] = total
