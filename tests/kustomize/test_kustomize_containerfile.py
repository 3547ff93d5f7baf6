"""Containerfile shape: multi-stage, the project wheel installed in the build stage, a final stage
without build tools that runs as a numeric non-root user (the pods set runAsUser to the same id)."""

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


def test_multi_stage_with_wheel_built_and_installed_in_the_build_stage() -> None:
    stages = _stages()
    assert len(stages) == 2
    build_stage, final = stages
    assert re.match(r"FROM \S+ AS build$", build_stage[0])
    run = " ".join(s for s in build_stage if s.startswith("RUN "))
    assert "pip wheel --no-deps --wheel-dir /wheels ." in run
    assert re.search(r"pip install --constraint constraints.txt /wheels/draguard-\*\.whl", run)
    assert "draguard --version" in run  # the installed console script must start
    assert "COPY --from=build /opt/draguard /opt/draguard" in final


def test_final_stage_has_no_build_tools_and_runs_non_root() -> None:
    final = _stages()[-1]
    body = "\n".join(final)
    for tool in ("gcc", "build-essential", "apt-get install", "make ", "git ", "pip install"):
        assert tool not in body, f"final stage mentions {tool!r}"
    assert "pip uninstall --yes pip setuptools wheel" in body
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
