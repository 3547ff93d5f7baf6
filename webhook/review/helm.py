"""Helm charts as review inputs: rendered with `helm template`, each object pointing at its template.

A directory with a Chart.yaml is a chart; its templates are Go templates, not YAML, so they are
never parsed as manifests. `helm template` (the `helm` on PATH, or $DRAGUARD_HELM) renders it with
the chart's default values (plus `values.yaml` overrides the chart itself carries); each rendered
document carries a `# Source: <chart>/templates/<file>` comment, which becomes the finding's file.
Lines are those of the rendered document, counted from the template's first line.

A chart from an untrusted branch reaches nothing outside the reviewed tree: Helm's loader follows
symbolic links (so `.Files.Get` could read any file on the runner), so a chart holding a link that
leaves the tree, or a special file, is refused before helm runs. `helm template` of a local
directory fetches no dependency (missing ones are an error) and talks to no cluster; it runs in a
network namespace of its own where `unshare` allows, else with dead proxies and no kubeconfig
(the same sandbox as kustomize's).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from ..core.source import SourceObject
from .inputs import InputError, Inputs, Tree, check_tree, display_path, objects_of, parse_text
from .kustomize import isolated, isolated_env

CHART_FILE = "Chart.yaml"
RENDER_TIMEOUT_S = 120
_SOURCE = re.compile(r"^# Source: (\S+)\s*$", re.M)
_RELEASE_BAD = re.compile(r"[^a-z0-9-]+")


def is_chart_dir(path: Path) -> bool:
    return (path / CHART_FILE).is_file()


def helm_command() -> str | None:
    return os.environ.get("DRAGUARD_HELM") or shutil.which("helm")


def render(directory: Path, namespace: str = "default", *, tree: Tree | None = None) -> Inputs:
    """Render one chart into review inputs; `InputError` says what to do when that is impossible.
    Nothing outside `tree` (default: the working directory) is read."""
    shown = display_path(directory)
    check_tree(directory, tree or Tree.of(Path.cwd()))
    helm = helm_command()
    if helm is None:
        raise InputError(
            shown,
            "is a Helm chart (Chart.yaml); install helm to review it, or render it yourself: "
            f"helm template {directory.name} {shown} | draguard review -",
        )
    release = _RELEASE_BAD.sub("-", directory.resolve().name.lower()).strip("-")[:53] or "release"
    try:
        proc = subprocess.run(
            isolated([helm, "template", release, str(directory), "--namespace", namespace]),
            capture_output=True, text=True, timeout=RENDER_TIMEOUT_S, check=False, env=isolated_env(),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise InputError(shown, f"helm template did not finish in {RENDER_TIMEOUT_S}s") from None
    except OSError as exc:
        raise InputError(shown, f"cannot run {helm}: {exc}") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        why = next((ln.removeprefix("Error:").strip() for ln in lines if ln.startswith("Error:")), None)
        raise InputError(shown, f"helm template failed: {why or (lines[-1] if lines else 'no output')}")
    out = Inputs()
    # Documents are "---\n# Source: chart/templates/x.yaml\n<object>"; the chart's name is the
    # first path element (the directory's name may differ).
    chunks = re.split(r"^---\s*$", proc.stdout, flags=re.M)
    for chunk in chunks:
        m = _SOURCE.search(chunk)
        if m is None or not chunk.strip():
            continue
        rel = m.group(1).split("/", 1)[1] if "/" in m.group(1) else m.group(1)
        file = display_path(directory / rel)
        body = chunk[m.end():].lstrip("\n")
        objs, skipped = objects_of(parse_text(body, file), file)
        out.extend(Inputs([SourceObject(o.obj, file=o.file, line=o.line, doc_index=o.doc_index, lines=o.lines)
                           for o in objs], skipped, [file] if file not in out.files else []))  # fmt: skip
    if not out.objects and not out.skipped:
        out.files.append(shown)
    return out
