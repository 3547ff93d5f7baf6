"""tools/celoracle's create-time verdicts are the real kube-apiserver's.

The differential CEL test trusts the oracle; here a sample of its corpus goes to the session's
kube-apiserver as server-side dry-run DeviceClass creates, and every "rejected by validation"
verdict must be the oracle's. A webhook denial (403) is not a validation verdict and is skipped.
"""

from __future__ import annotations

import json
import re
import subprocess

from tests.cel.corpus import cases
from tests.e2e.helpers import Kubectl
from tests.gotool import go_tool

_INVALID = re.compile(r'DeviceClass\.resource\.k8s\.io "(oracle-\d+)" is invalid')


def _sample() -> list[str]:
    corpus = cases()
    # Every family, the short selectors first so that one request stays small.
    picked = [c.selector for i, c in enumerate(corpus) if i % 5 == 0 or c.family in ("literals", "long-deep")]
    return picked[:400]


def _oracle_rejected(selectors: list[str]) -> list[bool]:
    lines = [json.dumps({"id": i, "selector": s}) for i, s in enumerate(selectors)]
    res = subprocess.run([str(go_tool("celoracle"))], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, timeout=300, check=True)
    rows = sorted((json.loads(line) for line in res.stdout.splitlines()), key=lambda r: r["id"])
    return [bool(r["create"]["rejected"]) for r in rows]


def test_oracle_create_verdicts_match_the_api_server(kubectl: Kubectl) -> None:
    selectors = _sample()
    expected = _oracle_rejected(selectors)
    items = [{
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": f"oracle-{i}"},
        "spec": {"selectors": [{"cel": {"expression": s}}]},
    } for i, s in enumerate(selectors)]
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    proc = kubectl.run("create", "--dry-run=server", "-o", "name", "-f", "-", input=manifest)
    invalid = {int(name.split("-")[1]) for name in _INVALID.findall(proc.stderr)}
    created = {int(line.rsplit("-", 1)[1]) for line in proc.stdout.split() if "/oracle-" in line}
    denied = len(selectors) - len(invalid) - len(created)
    print(f"\n{len(selectors)} selectors: {len(created)} accepted, {len(invalid)} invalid, "
          f"{denied} denied by a webhook")
    assert len(created) + len(invalid) >= len(selectors) * 0.9, (denied, proc.stderr[-3000:])
    mismatches = [
        (i, selectors[i][:120], expected[i])
        for i in range(len(selectors))
        if (i in invalid and not expected[i]) or (i in created and expected[i])
    ]
    assert not mismatches, mismatches[:20]
    # The sample holds both verdicts, so agreement is not trivially "everything passes".
    assert invalid and created
