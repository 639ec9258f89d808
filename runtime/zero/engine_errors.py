"""Errors the engine raises: bad setup (a user can fix it) and collectives that did not complete."""

from __future__ import annotations

from typing import Any

from zerotrain.errors import UserError


class ZeroSetupError(UserError, ValueError):
    """Bad input to `ZeroEngine`: raised at construction before any collective runs, or by a load that does not fit,
    before anything changed."""

    def __init__(self, field: str, value: Any, problem: str, fix: str) -> None:
        self.field, self.value, self.problem, self.fix = field, value, problem, fix
        super().__init__(f"{field}: got {value!r}; {problem}; {fix}")


class CollectiveError(RuntimeError):
    """A collective for `unit` failed on `rank`; subclasses say why."""

    def __init__(self, rank: int, unit: str, op: str, message: str) -> None:
        self.rank, self.unit, self.op = rank, unit, op
        super().__init__(message)


class CollectiveTimeoutError(CollectiveError):
    """A collective did not complete within `collectiveTimeoutSeconds` (or its peers disagreed).

    Almost always rank-divergent control flow: one rank skipped (or added) a unit's forward, so the
    ranks no longer issue the same collectives in the same order.
    """

    def __init__(self, rank: int, unit: str, op: str, detail: str) -> None:
        super().__init__(
            rank,
            unit,
            op,
            f"rank {rank}: {op} for unit {unit!r} failed: {detail}. The ranks did not run the same units in the "
            "same order (rank-divergent control flow, e.g. a rank skipped this unit's forward); make every rank "
            "run every unit, or raise zero.collectiveTimeoutSeconds if a peer is merely slow",
        )


class PeerLostError(CollectiveError):
    """A peer rank's process went away mid-collective (it crashed, was killed, or its pod was evicted)."""

    def __init__(self, rank: int, unit: str, op: str, detail: str) -> None:
        super().__init__(
            rank,
            unit,
            op,
            f"rank {rank}: {op} for unit {unit!r} failed because a peer rank is gone ({detail}). This rank is not "
            "the cause: look for the first rank that failed (its own error or exit status); under the operator "
            "the whole gang restarts from the newest checkpoint",
        )


class RankDivergenceError(RuntimeError):
    """The ranks ran different units (or in a different order) between two consistency checks."""

    def __init__(self, rank: int, unit: str, detail: str) -> None:
        self.rank, self.unit = rank, unit
        super().__init__(
            f"rank-divergent control flow: rank {rank}, unit {unit!r}: {detail}. Every rank must run every unit's "
            "forward and backward the same number of times in the same order (ZeRO's collectives are matched by "
            "order); make the control flow identical on all ranks"
        )
