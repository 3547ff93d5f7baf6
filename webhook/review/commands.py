"""Offline commands: review, test, lint-cel, migrate, schema, explain.

Each command reads files, calls the engine the webhook uses, and prints; exit codes are 0 (clean),
1 (enforce-mode findings, failed tests, rewrites pending) and 2 (usage error or unreadable input).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ..cel import versions
from ..core.findings import Mode
from .config import CONFIG_NAME, ConfigError
from .formats import (
    FORMATS,
    RULES_URL,
    ReviewResult,
    neutralise_commands,
    renderers,
    terminal_safe,
)
from .pipeline import DEFAULT_POLICIES, Progress, ReviewError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


def _fail(command: str, message: str) -> int:
    # One line, never a traceback: the first line of the message is what the user needs. It may
    # quote a name from the reviewed tree, so controls are written out and `##[` cannot start a
    # workflow command.
    first = message.strip().splitlines()[0] if message.strip() else "failed"
    print(neutralise_commands(terminal_safe(f"draguard {command}: {first}")), file=sys.stderr)
    return EXIT_USAGE


def _use_color(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return bool(getattr(stream, "isatty", lambda: False)())


def _write(text: str, output: str | None, command: str) -> int | None:
    """Write to --output or stdout; an exit code on failure, None on success.

    A name that is not valid UTF-8 (a lone surrogate from the file system or a `\\ud800` escape in
    a manifest) is written as a backslash escape, never an encoding error; in JSON and SARIF that
    escape is the string's own.
    """
    data = text.encode("utf-8", errors="backslashreplace")
    if output and output != "-":
        try:
            Path(output).write_bytes(data)
        except OSError as exc:
            return _fail(command, f"{output}: cannot write: {exc.strerror or exc}")
        return None
    sys.stdout.write(data.decode("utf-8"))
    sys.stdout.flush()
    return None


FAIL_ON = ("error", "warning", "info", "never")
_FAILING_MODES = {
    "error": frozenset({Mode.ENFORCE}),
    "warning": frozenset({Mode.ENFORCE, Mode.WARN}),
    "info": frozenset({Mode.ENFORCE, Mode.WARN, Mode.AUDIT}),
    "never": frozenset(),
}
_FAILING_CHANGES = {
    "error": ("newly-denied",),
    "warning": ("newly-denied", "new-warning"),
    "info": ("newly-denied", "new-warning", "new-audit"),
    "never": (),
}


def format_spec(value: str) -> tuple[str, str | None]:
    """`--format FMT` or `--format FMT=FILE`."""
    fmt, sep, file = value.partition("=")
    if fmt not in FORMATS:
        raise argparse.ArgumentTypeError(
            f"unknown format {fmt!r}: choose from {', '.join(FORMATS)} (FMT or FMT=FILE)"
        )
    if sep and not file:
        raise argparse.ArgumentTypeError(f"{value!r}: name a file after '=' (FMT=FILE), or drop the '='")
    return fmt, (file or None)


def _outputs(specs: list[tuple[str, str | None]] | None, output: str | None) -> list[tuple[str, str | None]]:
    """Each report to write: (format, file), None for stdout. `--output` is the file of every
    format given without one; at most one report may go to stdout."""
    chosen = specs or [("text", None)]
    resolved = [(fmt, file or output) for fmt, file in chosen]
    to_stdout = [fmt for fmt, file in resolved if not file or file == "-"]
    if len(to_stdout) > 1:
        raise ReviewError(
            f"--format {' and '.join(to_stdout)} would all write to stdout; give every one but one a "
            f"file: --format {to_stdout[-1]}=FILE"
        )
    files = [file for _, file in resolved if file and file != "-"]
    if len(set(files)) < len(files):
        raise ReviewError("two --format options write the same file; give each its own FMT=FILE")
    return resolved


def render(result: ReviewResult, fmt: str, *, color: bool) -> str:
    if fmt == "text":
        from .formats import text

        return text.render(result, color=color)
    return renderers()[fmt](result)


# --------------------------------------------------------------------------- review


def apply_config(args: argparse.Namespace) -> None:
    """Fill every review option the command line left unset from `.draguard.yaml` (see
    webhook/review/config.py), then from the built-in defaults. Raises ConfigError."""
    from .config import ReviewConfig, find_config, load_config

    cfg = ReviewConfig()
    if args.config and not args.no_config:
        explicit = Path(args.config)
        if not explicit.is_file():
            raise ConfigError(f"{args.config}: config file not found (fix: check --config, or drop it to use "
                              f"the {CONFIG_NAME} of this directory or the repository root)")
        cfg = load_config(explicit, args.config)
    elif not args.no_config:
        top = Path(repo_root(args.root))
        found = find_config(Path.cwd(), top)
        if found is not None:
            from .inputs import display_path

            cfg = load_config(found, display_path(found))
    # A policy path someone chose (flag or file) must exist; the default may be absent.
    args.policies_required = args.policies is not None or cfg.get("policies") is not None
    defaults: dict[str, Any] = {
        "policies": DEFAULT_POLICIES, "inventory": None, "cluster_state": None, "namespace": "default",
        "output": None, "fail_on": "error", "allow_empty": False, "kubernetes_version": versions.DEFAULT,
        "driver": None, "rules_url": RULES_URL, "root": None,
    }
    for attr, default in defaults.items():
        if getattr(args, attr, None) is None:
            setattr(args, attr, cfg.get(attr.replace("_", "-"), default))
    if not args.paths:
        args.paths = cfg.get("paths") or ["."]
    if args.format is None and cfg.get("format"):
        args.format = [format_spec(v) for v in cfg.get("format")]
    args.exclude = cfg.get("exclude", [])
    args.config_file = str(cfg.path) if cfg.path is not None else None


def cmd_review(args: argparse.Namespace) -> int:
    try:
        apply_config(args)
    except ConfigError as exc:
        return _fail("review", str(exc))
    paths: list[str] = args.paths
    progress = Progress((args.progress or sys.stderr.isatty()) and not args.no_progress)
    policies_required = args.policies_required
    try:
        version = versions.parse_version(args.kubernetes_version)
        outputs = _outputs(args.format, args.output)
    except (ValueError, ReviewError) as exc:
        return _fail("review", str(exc))
    newer = versions.newer_than_known(args.kubernetes_version)
    if newer:
        print(f"draguard review: warning: {newer}", file=sys.stderr)
    root = repo_root(args.root)
    try:
        if args.base:
            from . import diff

            impact = diff.impact(
                paths,
                base=args.base,
                policies=args.policies,
                inventory=args.inventory,
                namespace=args.namespace,
                progress=progress,
                cluster_state=args.cluster_state,
                kubernetes_version=version,
                driver_schema=args.driver,
                exclude=args.exclude,
            )
            if impact.head is not None:
                impact.head.rules_url = args.rules_url
            for fmt, output in outputs:
                color = fmt == "text" and not output and _use_color(sys.stdout)
                text = diff.render(impact, fmt, color=color, root=root)
                if fmt == "text":
                    # The impact names objects and files of the reviewed tree.
                    text = neutralise_commands(text if color else terminal_safe(text, newlines=True))
                err = _write(text, output, "review")
                if err is not None:
                    return err
            failing = _FAILING_CHANGES[args.fail_on]
            return EXIT_FINDINGS if any(c.change in failing for c in impact.changes) else EXIT_OK
        from .pipeline import review

        t0 = time.monotonic()
        reviewed = review(
            paths,
            policies=args.policies,
            policies_required=policies_required,
            inventory=args.inventory,
            namespace=args.namespace,
            progress=progress,
            cluster_state=args.cluster_state,
            kubernetes_version=version,
            driver_schema=args.driver,
            root=root,
            exclude=args.exclude,
        )
    except ReviewError as exc:
        return _fail("review", str(exc))
    if not reviewed.result.objects and not args.allow_empty:
        # A wrong path, a glob that matched nothing or a build that produced nothing must not
        # pass as "no findings".
        read = len(set(reviewed.result.files))
        return _fail(
            "review",
            f"no Kubernetes objects in {' '.join(paths)} ({read} file{'' if read == 1 else 's'} read, "
            f"{len(reviewed.inputs.skipped)} document(s) without a kind); check the paths, or pass "
            "--allow-empty when an empty input is expected",
        )
    result = reviewed.result
    result.root = root
    result.elapsed = time.monotonic() - t0
    result.rules_url = args.rules_url
    for fmt, output in outputs:
        text = render(result, fmt, color=fmt == "text" and not output and _use_color(sys.stdout))
        err = _write(text, output, "review")
        if err is not None:
            return err
    modes = _FAILING_MODES[args.fail_on]
    return EXIT_FINDINGS if any(f.mode in modes for f in result.report.findings) else EXIT_OK


def repo_root(explicit: str | None) -> str:
    """The directory report paths are relative to: --root, else the git top-level of the working
    directory, else the working directory."""
    if explicit:
        return os.path.abspath(explicit)
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return os.getcwd()
    top = out.stdout.strip()
    return os.path.abspath(top) if out.returncode == 0 and top else os.getcwd()


# --------------------------------------------------------------------------- test


def cmd_test(args: argparse.Namespace) -> int:
    from . import suites

    try:
        outcome = suites.run_suites(Path(args.dir), policies=args.policies, case_filter=args.run)
    except suites.SuiteError as exc:
        return _fail("test", str(exc))
    sys.stdout.write(suites.render_text(outcome, color=_use_color(sys.stdout), verbose=args.verbose))
    if args.junit:
        try:
            Path(args.junit).write_text(suites.render_junit(outcome), encoding="utf-8")
        except OSError as exc:
            return _fail("test", f"{args.junit}: cannot write: {exc.strerror or exc}")
    return EXIT_FINDINGS if outcome.failed else EXIT_OK


# --------------------------------------------------------------------------- lint-cel


def cmd_lint_cel(args: argparse.Namespace) -> int:
    from . import celtools

    try:
        text, code = celtools.lint(args.expression, inventory=args.inventory, driver=args.driver)
    except ReviewError as exc:
        return _fail("lint-cel", str(exc))
    sys.stdout.write(text)
    return code


# --------------------------------------------------------------------------- migrate


def cmd_migrate(args: argparse.Namespace) -> int:
    from . import rewrite

    try:
        outcome = rewrite.migrate_paths(
            args.paths,
            policies=args.policies,
            policies_required=args.policies != DEFAULT_POLICIES,
            strategy=args.strategy,
            write=args.write,
        )
    except (ReviewError, rewrite.RewriteError) as exc:
        return _fail("migrate", str(exc))
    sys.stdout.write(outcome.output)
    for note in outcome.notes:
        print(f"draguard migrate: {note}", file=sys.stderr)
    if args.write:
        return EXIT_OK
    # Like `diff`: 1 when something would change, so CI can require migrated manifests.
    return EXIT_FINDINGS if outcome.changed else EXIT_OK


# --------------------------------------------------------------------------- schema


def cmd_schema(args: argparse.Namespace) -> int:
    from ..policy import schema_text

    try:
        text = schema_text()
    except (FileNotFoundError, OSError) as exc:
        return _fail("schema", f"policy schema not found in the package: {exc}")
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


# --------------------------------------------------------------------------- explain


def cmd_explain(args: argparse.Namespace) -> int:
    from . import celtools

    try:
        text, blocked = celtools.explain_report(
            args.paths, inventory=args.inventory, namespace=args.namespace, fmt=args.format
        )
    except ReviewError as exc:
        return _fail("explain", str(exc))
    sys.stdout.write(text)
    # Exit 1 when a request CANNOT be allocated, so a CI step running explain fails on it.
    return EXIT_FINDINGS if blocked else EXIT_OK


# --------------------------------------------------------------------------- registration


def _add(
    sub: Any, name: str, func: Callable[[argparse.Namespace], int], help_text: str, description: str
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.set_defaults(func=func)
    return p


def register(subparsers: Any) -> None:
    p = _add(
        subparsers,
        "review",
        cmd_review,
        "review manifests against GPU policies offline (files, dirs, kustomizations, stdin)",
        "Review Kubernetes manifests with the webhook's engine, offline.\n\n"
        "PATH is a file, a directory (walked recursively; kustomization directories are built),\n"
        "or - for stdin. Exit status: 0 no enforce-mode findings, 1 enforce-mode findings (the level\n"
        "is --fail-on), 2 usage error, unreadable input, or no Kubernetes object at all (unless\n"
        "--allow-empty). With --base REF, exit 1 only for newly denied objects.\n\n"
        "The tree may come from an untrusted branch: symbolic links out of it and special files are\n"
        "refused, kustomize and helm run without network, and every name is escaped for its format.",
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="files, directories or - (default: .)")
    p.add_argument(
        "--config",
        metavar="FILE",
        help=f"review's defaults (default: {CONFIG_NAME} of the working directory, else of the repository "
        "root); options given here win over it",
    )
    p.add_argument("--no-config", action="store_true", help=f"read no {CONFIG_NAME}")
    p.add_argument(
        "--policies", metavar="DIR", help=f"policy directory or file (default: {DEFAULT_POLICIES})"
    )
    p.add_argument(
        "--inventory", metavar="FILE", help="ResourceSlices and DeviceClasses, as kubectl get -o yaml"
    )
    p.add_argument("--namespace", help="namespace for objects that set none (default: default)")
    p.add_argument(
        "--format",
        "-f",
        action="append",
        type=format_spec,
        metavar="FMT[=FILE]",
        help=f"report format ({', '.join(FORMATS)}; default text), written to FILE when given; repeat "
        "for several reports from one run (at most one without a file goes to stdout)",
    )
    p.add_argument("--output", "-o", metavar="FILE", help="write the report here instead of stdout")
    p.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        help="exit 1 on findings of this level or above: error (enforce mode, the default), warning "
        "(warn mode too), info (audit findings too), never (exit 1 is never used; 2 still is)",
    )
    p.add_argument(
        "--allow-empty",
        action=argparse.BooleanOptionalAction,
        help="exit 0 when the paths hold no Kubernetes object (default: exit 2, as a wrong path does)",
    )
    p.add_argument("--base", metavar="REF", help="git ref to compare with: report only verdicts that changed")
    p.add_argument(
        "--cluster-state",
        metavar="FILE",
        help="namespace labels as admission sees them: `kubectl get namespaces -o yaml` output "
        "(Namespace objects among the inputs override it)",
    )
    p.add_argument(
        "--kubernetes-version",
        metavar="X.Y",
        help=f"the cluster's Kubernetes release ({', '.join(versions.SUPPORTED)}; default "
        f"{versions.DEFAULT}): CEL functions and device fields its API server does not accept yet "
        "are cel/version errors; a newer release is judged by the newest known, with a warning",
    )
    p.add_argument(
        "--driver",
        choices=("draguard", "nvidia"),
        help="the DRA driver serving gpu.nvidia.com in the cluster: its attributes and opaque config "
        "kinds are the ones judged (default: from the inventory and DeviceClasses, else draguard's)",
    )
    p.add_argument(
        "--root",
        metavar="DIR",
        help="repository root (default: git top-level): SARIF, github and junit paths are relative to it, "
        "and no symbolic link is followed out of it",
    )
    p.add_argument(
        "--rules-url",
        metavar="URL",
        help="where docs/rules.md is published, for SARIF help links (URL#<rule anchor>); default: "
        "the project's repository",
    )
    p.add_argument("--progress", action="store_true", help="progress on stderr even when it is not a TTY")
    p.add_argument("--no-progress", action="store_true", help=argparse.SUPPRESS)

    t = _add(
        subparsers,
        "test",
        cmd_test,
        "run policy test suites (suite.yaml files)",
        "Run policy test suites: every suite.yaml under DIR lists cases (inputs and expected findings).",
    )
    t.add_argument("dir", nargs="?", default="policies/tests", metavar="DIR")
    t.add_argument("--policies", default=None, metavar="DIR", help="policies to test (default: the suite's)")
    t.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    t.add_argument("--run", metavar="TEXT", help="only cases whose name contains TEXT")
    t.add_argument("--verbose", "-v", action="store_true", help="show the findings of every case")

    c = _add(
        subparsers,
        "lint-cel",
        cmd_lint_cel,
        "compile and check one DRA device selector",
        "Compile and check one CEL device selector; with --inventory, count matching devices.",
    )
    c.add_argument("expression", metavar="EXPR")
    c.add_argument("--inventory", metavar="FILE")
    c.add_argument("--driver", metavar="NAME", help="driver the selector is meant for (e.g. gpu.nvidia.com)")

    m = _add(
        subparsers,
        "migrate",
        cmd_migrate,
        "rewrite legacy nvidia.com/gpu requests into DRA claims",
        "Rewrite nvidia.com/gpu (and nvidia.com/mig-*) requests into DRA. Prints a unified diff;\n"
        "--write edits the files in place, keeping comments and key order. Exit 1 when a diff\n"
        "is printed (something to migrate), 0 when nothing would change.",
    )
    m.add_argument("paths", nargs="+", metavar="PATH")
    m.add_argument("--write", "-w", action="store_true", help="rewrite files in place")
    m.add_argument("--strategy", choices=("claim-template", "extended-resource"), default=None)
    m.add_argument("--policies", default=DEFAULT_POLICIES, metavar="DIR", help="MigrationPolicy mappings")

    _add(subparsers, "schema", cmd_schema, "print the policy JSON Schema", "Print the policy JSON Schema.")

    e = _add(
        subparsers,
        "explain",
        cmd_explain,
        "show which devices each claim or workload request would get",
        "For each claim or workload request: its DeviceClass, the inventory devices that match,\n"
        "and why none would (class missing, selector, count, constraint).",
    )
    e.add_argument("paths", nargs="+", metavar="PATH")
    e.add_argument("--inventory", metavar="FILE")
    e.add_argument("--namespace", default="default")
    e.add_argument("--format", "-f", choices=("text", "json"), default="text")
