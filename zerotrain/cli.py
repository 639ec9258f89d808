"""The `zerotrain` command."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import nullcontext

from rich.console import Console
from rich.text import Text

from zerotrain import __version__
from zerotrain.commands import checkpoint, crd, data, plan, run, top, validate
from zerotrain.commands import operator as operator_command
from zerotrain.errors import EXIT_BAD_INPUT, UserError
from zerotrain.hf_config import local_files

# Each module adds one subcommand; later subcommands (run, operator, ...) are appended here.
COMMANDS = [plan, validate, crd, operator_command, run, top, checkpoint, data]


class DefaultsFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's help ends with its default, where it has one worth saying and its help does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        quiet = action.default in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings
        return text if quiet else f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """Every zerotrain parser: the descriptions as written, and the options' defaults in --help."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="zerotrain", description="ZeRO training on Kubernetes and locally.")
    parser.add_argument("--version", action="version", version=f"zerotrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in COMMANDS:
        module.register(sub)
    return parser


EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE
"""What a process killed by SIGPIPE exits with: `zerotrain plan ... | head` ends as `cat ... | head` would."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `zerotrain`: what it can do, not an error
        parser.print_help()
        return 0
    try:
        # The operator plans only from what manifests carry; every other command reads the user's own files.
        with nullcontext() if args.func is operator_command.run else local_files():
            return int(args.func(args))
    except UserError as e:
        Console(stderr=True).print(Text.assemble(("error:", "bold red"), f" {e}"), soft_wrap=True)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # The reader went away (`| head`): nothing left to say. Point stdout at /dev/null so the interpreter's own
        # flush at exit does not raise again (Python's documented recipe, signal/SIGPIPE).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


def entry() -> None:
    """The `zerotrain` command: `main`, then the process ends without torch's teardown where a command imported it
    (`process_exit`)."""
    from zerotrain.process_exit import exit_after

    exit_after(main())


if __name__ == "__main__":
    entry()
