"""`draguard preflight`: before installing, check that NVIDIA's device plugin and DRA driver do not
serve the GPUs draguard's driver would serve (webhook/dra/coexist.py decides; this reads files)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from ..core.findings import Severity
from ..dra import yamlload
from ..dra.coexist import preflight

EXIT_OK, EXIT_CONFLICT, EXIT_USAGE = 0, 1, 2
GATHER = "kubectl get nodes,daemonsets,resourceslices,deviceclasses -A -o yaml"


def _read(path: str) -> list[Any]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return list(yamlload.load_all(text))


def cmd_preflight(args: argparse.Namespace) -> int:
    objects: list[Any] = []
    for path in args.paths:
        where = "stdin" if path == "-" else path
        try:
            objects += _read(path)
        except OSError as e:
            print(f"draguard preflight: {where}: cannot read ({e.strerror or e})", file=sys.stderr)
            return EXIT_USAGE
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            mark = getattr(e, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            print(
                f"draguard preflight: {where}{line}: not YAML or JSON ({getattr(e, 'problem', None) or e}); "
                f"write it with `{GATHER}`",
                file=sys.stderr,
            )
            return EXIT_USAGE
    kinds = {o.get("kind") for o in objects if isinstance(o, dict)}
    findings = preflight(objects)
    errors = [f for f in findings if f.severity is Severity.ERROR]
    if args.format == "json":
        print(json.dumps({"findings": [f.to_json() for f in findings], "conflicts": len(errors)}, indent=2))
    else:
        for f in findings:
            print(f"{f.severity.value}: {f.rule} {f.object}: {f.message}")
            print(f"  fix: {f.fix}")
        if not kinds - {None}:
            print(f"nothing to check: no objects read; gather them with `{GATHER}`")
        elif not findings:
            print("no NVIDIA device plugin or DRA driver found next to draguard's driver")
        else:
            print(f"{len(errors)} conflict(s), {len(findings) - len(errors)} warning(s)")
    return EXIT_CONFLICT if errors else EXIT_OK


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "preflight",
        help="before installing: find NVIDIA's device plugin or DRA driver serving the same GPUs",
        description="Check cluster objects for NVIDIA's device plugin and NVIDIA's DRA driver, which must\n"
        "not serve the GPUs draguard's driver serves.\n\n"
        f"    {GATHER} > cluster.yaml\n"
        "    draguard preflight cluster.yaml\n\n"
        "Exit status: 0 no conflict (warnings may be printed), 1 a node's GPUs are served by one of\n"
        "them now, 2 unreadable input.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="FILE", help="kubectl get -o yaml/json output, or - for stdin")
    p.add_argument("--format", "-f", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_preflight)
