"""Containerfile shape: the project wheel and its hashed, locked dependencies installed by image/install.sh,
no build tools left, a numeric non-root user (the pods set runAsUser to the same id)."""

from __future__ import annotations

import re

from kbundle import REPO, build, containers

TEXT = (REPO / "Containerfile").read_text()


def _stages() -> list[list[str]]:
    joined = re.sub(r"\\\n\s*", " ", TEXT)  # fold continuation lines
    stages: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_wheel_and_locked_dependencies_installed_with_hashes_then_pip_removed() -> None:
    (stage,) = _stages()  # one stage: image/install.sh builds the wheel and removes what built it
    run = " ".join(s for s in stage if s.startswith("RUN "))
    steps = re.findall(r"image/install\.sh (\w+)", run)
    assert steps == ["packages", "wheel", "venv", "finish", "sbom"], steps
    assert "image/requirements.lock" in run
    install = (REPO / "image" / "install.sh").read_text()
    assert "--require-hashes" in install
    assert "pip uninstall --quiet --yes pip setuptools wheel" in install


def test_final_image_has_no_build_tools_and_runs_non_root() -> None:
    final = _stages()[-1]
    body = "\n".join(final)
    for tool in ("gcc", "build-essential", "make ", "git "):
        assert tool not in body, f"the image mentions {tool!r}"
    (user,) = [s for s in final if s.startswith("USER ")]
    uid, _, gid = user.split()[1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    assert 'ENTRYPOINT ["draguard"]' in final
    # The pods pin the same numeric user, so runAsNonRoot can be verified by the kubelet.
    users = {
        c.get("securityContext", {}).get("runAsUser")
        or o["spec"]["template"]["spec"]["securityContext"].get("runAsUser")
        for o in build("eks")
        if o["kind"] == "Deployment"
        for c in containers(o)
    }
    assert users == {int(uid)}


def test_everything_copied_exists_in_the_repository() -> None:
    for stage in _stages():
        for line in stage:
            if line.startswith("COPY ") and "--from=" not in line:
                *sources, _dest = line.split()[1:]
                for src in sources:
                    assert (REPO / src).exists(), f"Containerfile copies missing {src}"
