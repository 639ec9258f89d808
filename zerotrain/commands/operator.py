"""`zerotrain operator`: run the ZeroTrainingJob operator (kopf) against the current cluster."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from zerotrain.errors import UserError

# The same switch as `zerotrain run --debug`.
from zerotrain.pod_contract import DEBUG_ENV


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
    p.add_argument(
        "--kubeconfig",
        help="kubeconfig file, the only place tried (default: in-cluster service account, else $KUBECONFIG, else "
        "~/.kube/config)",
    )
    p.add_argument("--health-port", type=int, help="liveness endpoint port (/healthz; default 8080)")
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (default 9090; 0 disables)")
    p.add_argument("--gpu-memory", help="default memory of one GPU for the memory plan, e.g. 80Gi")
    p.add_argument(
        "--debug",
        action="store_true",
        help=f"when no kubeconfig loads, also print the traceback of the client's own error (also {DEBUG_ENV}=1)",
    )


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
    try:
        return operate(settings, kubeconfig=args.kubeconfig)
    except UserError as e:
        # The CLI prints the one line; the traceback (with the client's own exception as its cause) is for bug reports.
        if args.debug or os.environ.get(DEBUG_ENV) == "1":
            traceback.print_exception(e, file=sys.stderr)
        raise
