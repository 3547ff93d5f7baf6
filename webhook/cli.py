"""The `draguard` command: wiring only; every command lives in the module that owns it."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from . import PREFIX, __version__

# Each module exposes `register(subparsers)`, adding its commands with `set_defaults(func=...)`
# where func(args) -> int is the exit code.
COMMAND_MODULES = (
    "webhook.review.commands",  # review, test, lint-cel, migrate, explain, schema
    "webhook.review.preflight",  # preflight
    "webhook.review.vap",  # vap
    "webhook.review.rules",  # rules, completion
    "webhook.server.commands",  # serve, certs, quota
    "webhook.audit.commands",  # audit run|once
    "webhook.assess.commands",  # assess
    "webhook.dev.commands",  # dev up|down|status, demo
    "driver.cli",  # driver inventory|run
)

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draguard",
        description="GPU admission policies, DRA linting and an NVML-backed DRA driver.",
    )
    parser.add_argument("--version", action="version", version=f"draguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(PREFIX + name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
