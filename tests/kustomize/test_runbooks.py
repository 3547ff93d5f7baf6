"""docs/runbooks.md: every alert links to its own section, and what the sections tell an operator to
look at exists: the series (exported by the webhook, driver or audit, with the labels named), the
`draguard` commands (parsed by the CLI's own parser), and the bundle's objects, labels and
components (in the rendered bundle)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from kbundle import KUSTOMIZE, REPO, build, find, one, pod_spec, pod_template
from kprom import audit_series, exported_series

RUNBOOKS = REPO / "docs" / "runbooks.md"
BASE_URL = "https://github.com/draguard/draguard/blob/main/docs/runbooks.md"


def _text() -> str:
    return RUNBOOKS.read_text()


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def _headings(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)]


def _alerts() -> dict[str, dict[str, object]]:
    rule = one(build("eks", ("monitoring",)), "PrometheusRule", "draguard")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def _shell_lines(text: str) -> Iterator[str]:
    """The command lines of the ```sh blocks."""
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].rstrip(" &")
            if line.strip():
                yield line.strip()


def _argv(line: str) -> list[str]:
    """A command line as words, with each `<placeholder>` filled in."""
    return shlex.split(re.sub(r"<[^>]+>", "x", line))


def _pod_labels(obj: dict[str, object]) -> dict[str, str]:
    """The labels of the pods a workload of the bundle makes."""
    template = pod_template(obj)
    return dict(template["metadata"].get("labels") or {}) if template is not None else {}


def test_every_alert_has_a_runbook_section_and_links_to_it() -> None:
    alerts = _alerts()
    headings = _headings(_text())
    sections = {h for h in headings if re.fullmatch(r"(DRA|Draguard)[A-Za-z]+", h)}
    assert sections == set(alerts), "runbook sections and alerts differ"
    for name, rule in alerts.items():
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert annotations.get("runbook_url") == f"{BASE_URL}#{_slug(name)}", name


def test_links_inside_the_runbooks_resolve() -> None:
    text = _text()
    anchors = {_slug(h) for h in _headings(text)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links
    assert sorted(set(links) - anchors) == []


def test_series_the_runbooks_name_are_exported_with_their_labels() -> None:
    exported = {**exported_series(), **audit_series()}
    text = _text()
    named = set(re.findall(r"\b((?:dra|draguard)_[a-z_]+[a-z])\b", text))
    assert len(named) >= 12, named
    for series in named:
        # A histogram is named by its family; what is stored is _bucket, _sum and _count.
        assert series in exported or f"{series}_bucket" in exported, f"{series} is not exported"
    for series, selector in re.findall(r"\b((?:dra|draguard)_[a-z_]+)\{([^}]*)\}", text):
        for label in re.findall(r"([a-z_]+)=", selector):
            assert label in exported[series], f"{series} has no label {label}"
    # "`label` label of `series`" and "`label` on `series`": the label is the series'.
    label_of = r"`([a-z_]+)`\s+(?:label\s+)?(?:of|on)\s+`((?:dra|draguard)_[a-z_]+)"
    for label, series in re.findall(label_of, text):
        assert label in exported[series], f"{series} has no label {label}"


def test_draguard_commands_in_the_runbooks_parse() -> None:
    from webhook.cli import build_parser

    parser = build_parser()
    commands = []
    for line in _shell_lines(_text()):
        if line.startswith("draguard "):
            commands.append(_argv(line)[1:])
        elif " -- draguard " in line:
            commands.append(_argv(line.split(" -- ", 1)[1])[1:])
    assert len(commands) >= 5, commands
    for argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"`draguard {' '.join(argv)}` does not parse (exit {e.code})")
    # Commands and options named in the prose: `draguard explain`, `--quota-timeout`, ...
    choices = next(a.choices for a in parser._actions if a.choices)
    for name in re.findall(r"`draguard ([a-z-]+)", _text()):
        assert name in choices, f"draguard has no command {name}"
    options = set(_options(parser))
    for flag in re.findall(r"`(--[a-z-]+)`", _text()):
        assert flag in options, f"no draguard command has the option {flag}"


def _options(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Every option string of `parser` and its subcommands, at any depth."""
    for action in parser._actions:
        yield from action.option_strings
        for sub in (action.choices or {}).values() if isinstance(action.choices, dict) else ():
            yield from _options(sub)


_KINDS = {
    "deploy": "Deployment",
    "deployment": "Deployment",
    "cronjob": "CronJob",
    "daemonset": "DaemonSet",
    "ds": "DaemonSet",
}


def test_objects_labels_and_components_the_runbooks_name_are_in_the_bundle() -> None:
    objs = build("eks", ("monitoring",))
    text = _text()
    checked = 0
    for line in _shell_lines(text):
        argv = _argv(line)
        if argv[0] != "kubectl":
            continue
        ns = None
        if "-n" in argv:  # kubectl -n NS verb ...: the checks below read the verb at argv[1]
            at = argv.index("-n")
            ns = argv[at + 1]
            del argv[at : at + 2]
        for word in argv:
            kind_name = re.fullmatch(r"([a-z]+)/([a-z0-9-]+)", word)
            if kind_name and kind_name.group(1) in _KINDS:
                kind, name = _KINDS[kind_name.group(1)], kind_name.group(2)
                found = [o for o in find(objs, kind, name) if o["metadata"].get("namespace") == ns]
                assert found, f"{line}: no {kind} {ns}/{name} in the bundle"
                checked += 1
        if "-l" in argv:
            selector = argv[argv.index("-l") + 1]
            key, value = selector.split("=", 1)
            pods = [
                o
                for o in objs
                if o["metadata"].get("namespace") == ns and _pod_labels(o).get(key) == value
            ]
            assert pods, f"{line}: no pods labelled {selector} in {ns}"
            checked += 1
        if argv[1:3] == ["get", "endpoints"]:
            for name in argv[3:]:
                if not name.startswith("-"):
                    assert [o for o in find(objs, "Service", name) if o["metadata"]["namespace"] == ns], line
                    checked += 1
        if argv[1:3] == ["get", "secret"]:
            volumes = [
                v.get("secret", {}).get("secretName")
                for o in objs
                if o["metadata"].get("namespace") == ns and pod_spec(o) is not None
                for v in pod_spec(o).get("volumes") or []  # type: ignore[union-attr]
            ]
            assert argv[3] in volumes, f"{line}: no pod in {ns} mounts Secret {argv[3]}"
            checked += 1
        if argv[1:3] == ["get", "validatingwebhookconfiguration"]:
            assert find(objs, "ValidatingWebhookConfiguration", argv[3]), line
            checked += 1
    assert checked >= 10, checked
    kinds = r"(ClusterRole|ValidatingAdmissionPolicy|CronJob|Job)"
    for kind, name in re.findall(rf"\b{kinds}\s+`([a-z0-9-]+)`", text):
        assert find(objs, kind, name), f"no {kind} {name} in the bundle"
    for name, kind in re.findall(r"`([a-z0-9-]+)`\s+(ClusterRole|Job|CronJob)\b", text):
        assert find(objs, kind, name), f"no {kind} {name} in the bundle"
    components = re.findall(r"`([a-z0-9-]+)`\s+component", text)
    assert components
    for name in components:
        assert (KUSTOMIZE / "components" / name / "kustomization.yaml").is_file(), f"no component {name}"


def test_runbooks_are_linked_from_the_install_guide() -> None:
    assert "runbooks.md" in (REPO / "docs" / "install.md").read_text()
    assert Path(RUNBOOKS).is_file()
