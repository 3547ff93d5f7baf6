"""The `draguard` command: wiring only; every command lives in the module that owns it."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from . import PREFIX, __version__

# Each module exposes `register(subparsers)`, adding its commands with `set_defaults(func=...)`
# where func(args) -> int is the exit code.
# The module that registers each command: a run of one command imports only its module (the others'
# imports are a quarter of `draguard review`'s start-up); help and completion import them all.
COMMANDS = {
    **dict.fromkeys(
        ("review", "test", "lint-cel", "migrate", "explain", "schema"), "webhook.review.commands"
    ),
    "preflight": "webhook.review.preflight",
    "vap": "webhook.review.vap",
    "rules": "webhook.review.rules",
    "completion": "webhook.review.rules",
    **dict.fromkeys(("serve", "certs", "quota"), "webhook.server.commands"),
    "audit": "webhook.audit.commands",
    "assess": "webhook.assess.commands",
    "dev": "webhook.dev.commands",
    "demo": "webhook.dev.commands",
    "driver": "driver.cli",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))  # in the order `draguard --help` lists them

# `pip install draguard` carries what the offline commands import; the cluster-facing ones need an
# extra. Top-level module -> the extra that installs it.
EXTRAS = {
    "aiohttp": "webhook",
    "kubernetes": "webhook",
    "cryptography": "webhook",
    "prometheus_client": "webhook",
    "orjson": "webhook",
    "grpc": "driver",
    "pynvml": "driver",
}


VERSION = f"draguard {__version__}"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or only `command`'s part of it when that names a known command."""
    parser = argparse.ArgumentParser(
        prog="draguard",
        description="GPU admission policies, DRA linting and an NVML-backed DRA driver.",
    )
    parser.add_argument("--version", action="version", version=VERSION)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    only = COMMANDS.get(command or "")
    for name in (only,) if only in COMMAND_MODULES else COMMAND_MODULES:
        importlib.import_module(PREFIX + name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:  # what CI scripts ask first: no command module to import for it
        print(VERSION)
        return 0
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args))
    except KeyboardInterrupt:
        print("draguard: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"draguard {args.command}: needs the Python package {exc.name!r}, which this installation "
            f"lacks (fix: pip install 'draguard[{extra}]')",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
