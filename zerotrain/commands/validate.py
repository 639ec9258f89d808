"""`zerotrain validate JOB.yaml`: check a manifest the way the operator will, without a cluster."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.text import Text

from zerotrain.manifest import load_job


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a ZeroTrainingJob manifest", description=__doc__)
    p.add_argument("manifest", help="path of the ZeroTrainingJob YAML")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    job = load_job(args.manifest)
    name = job.metadata.get("name", "(unnamed)")
    spec = job.spec
    Console().print(
        Text(
            f"{args.manifest}: ZeroTrainingJob {name} is valid: stage {spec.zero.stage.value}, "
            f"{spec.replicas} pod(s) × {spec.nproc_per_node} rank(s) = {spec.world_size} ranks"
        ),
        soft_wrap=True,
    )
    return 0
