"""What a pod's launcher writes on its own pod when a rendezvous round of its ranks ended and it stays for the next
(spec.failurePolicy.restartStrategy InPlace), and what the operator reads back: the account a terminated
container's record would carry (exit code, termination message, finish time), since the container did not end.

Torch-free: the operator (`operator.controller.observe`) and the runtime (`runtime.job.pod_rounds`) share it. The
annotation names and the protocol are in `zerotrain.pod_contract`.
"""

from __future__ import annotations

import json
from datetime import datetime

from pydantic import ValidationError

from zerotrain._model import SpecModel


class RoundEnd(SpecModel):
    """One round's end, as the pod's annotation carries it (JSON, camelCase)."""

    round: int
    """The round (the gang number) whose ranks all stopped."""
    exit_code: int
    """What the launcher would have exited with had it not stayed: the round's first failure's status."""
    message: str = ""
    """The termination message it would have written (`<outcome>: <detail> (exit status N)`)."""
    finished_at: datetime
    """When the round's ranks had all stopped."""

    def annotation(self) -> str:
        return self.model_dump_json(by_alias=True)

    def termination(self) -> dict[str, object]:
        """The round's end as a container's `state.terminated` record, for `observe` to read like one."""
        stamp = self.finished_at.isoformat().replace("+00:00", "Z")
        return {"exitCode": self.exit_code, "message": self.message, "finishedAt": stamp}


def parse_round_end(value: str | None) -> RoundEnd | None:
    """The annotation's record; None when absent or not one (written by something else: ignored, not trusted)."""
    if not value:
        return None
    try:
        return RoundEnd.model_validate(json.loads(value))
    except (ValueError, ValidationError):
        return None


def parse_round(value: str | None) -> int | None:
    """The round annotation's number; None when absent, `ROUND_EXIT` or not a number."""
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
