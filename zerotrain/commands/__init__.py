"""Subcommands of the `zerotrain` command, one module each.

Each module exposes `register(subparsers)`, which adds its parser and sets `func` to a handler that
takes the parsed arguments and returns an exit status.
"""
