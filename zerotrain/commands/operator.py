"""`zerotrain operator`: run the ZeroTrainingJob operator (kopf) against the current cluster."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("operator", help="run the ZeroTrainingJob operator", description=__doc__)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="namespace to watch (repeatable); default: env ZEROTRAIN_NAMESPACES, empty = cluster-wide",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else ~/.kube/config)")
    p.add_argument("--health-port", type=int, help="liveness endpoint port (/healthz; default 8080)")
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (default 9090; 0 disables)")
    p.add_argument("--gpu-memory", help="default memory of one GPU for the memory plan, e.g. 80Gi")


def run(args: argparse.Namespace) -> int:
    # Imported here so `zerotrain --help` and the other commands don't pay for kopf.
    from zerotrain.operator.app import main as operate
    from zerotrain.operator.settings import OperatorSettings

    settings = OperatorSettings.from_env(
        namespaces=args.namespaces,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        gpu_memory=args.gpu_memory,
    )
    return operate(settings, kubeconfig=args.kubeconfig)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m zerotrain.operator` (errors print like the CLI's)."""
    from zerotrain.cli import main as cli_main

    return cli_main(["operator", *(argv if argv is not None else __import__("sys").argv[1:])])
