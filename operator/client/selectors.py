"""The labels by which the client finds a job's objects: the one thing the room that talks to the API server must
know of the children the operator builds (`operator.children.naming` names the rest, and imports these)."""

from __future__ import annotations

from zerotrain.spec import GROUP

LABEL_JOB = f"{GROUP}/job"
"""Every child carries the job's name under this label (the Service selects pods by it)."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "zerotrain-operator"
"""The operator's name: its children's managed-by label, its field manager and its user agent."""
CHILD_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_JOB}"
"""Every child of any job: what the operator's watches and the namespace relist select (filtered by the server)."""
