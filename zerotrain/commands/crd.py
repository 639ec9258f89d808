"""`zerotrain crd`: write the ZeroTrainingJob CustomResourceDefinition generated from the spec models."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zerotrain.crd import CRD_FILENAME, render_crd_yaml


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("crd", help="generate the CRD YAML", description=__doc__)
    p.add_argument(
        "-o",
        "--output",
        default=f"crds/{CRD_FILENAME}",
        help=f"file to write, or - for stdout (default: crds/{CRD_FILENAME} under the current directory)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = render_crd_yaml()
    if args.output == "-":
        sys.stdout.write(text)
    else:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out.resolve()}")
    return 0
