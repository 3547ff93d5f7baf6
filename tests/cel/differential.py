"""Run the differential corpus through Kubernetes' CEL (tools/celoracle) and through draguard.

Outcomes, as a user sees them: "rejected" (the API server refuses the object), "selects" (the
scheduler may allocate the device), "no" (no match, or the evaluation fails). draguard may also
answer "unsupported" (it cannot tell) or "undecided" (its runtime gave up); both count as
disagreements.

    .venv/bin/python -m tests.cel.differential     # print the disagreements
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.cel.corpus import DEVICES, Case, cases, oracle_device
from webhook.cel.env import CelEvalError, compile_or_issue
from webhook.cel.issues import CelIssue

REJECTING = frozenset({"cel/syntax", "cel/type", "cel/limits"})


@dataclass(frozen=True, slots=True)
class Pair:
    case: Case
    device: int
    kubernetes: str
    draguard: str
    k8s_detail: str
    dg_detail: str

    @property
    def agrees(self) -> bool:
        return self.kubernetes == self.draguard


def oracle(binary: Path, corpus: list[Case]) -> list[list[dict[str, object]]]:
    """Kubernetes' verdicts, [case][device]."""
    lines = []
    devices = [oracle_device(d) for d in DEVICES]
    for i, case in enumerate(corpus):
        for j, device in enumerate(devices):
            lines.append(json.dumps({"id": [i, j], "selector": case.selector, "driver": DEVICES[j].driver,
                                     "device": device}))
    res = subprocess.run([str(binary)], input="\n".join(lines) + "\n", capture_output=True, text=True,
                         timeout=600, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"celoracle failed ({res.returncode}): {res.stderr[-2000:]}")
    out: list[list[dict[str, object]]] = [[{} for _ in devices] for _ in corpus]
    for line in res.stdout.splitlines():
        row = json.loads(line)
        i, j = row["id"]
        out[i][j] = row
    return out


def k8s_outcome(row: dict[str, object]) -> tuple[str, str]:
    create = row["create"]
    assert isinstance(create, dict)
    if create["rejected"]:
        return "rejected", "; ".join(create.get("class") or create.get("claim") or [])
    ev = row.get("eval")
    if ev == "match":
        return "selects", ""
    return "no", str(row.get("error", ""))


def draguard_outcome(selector: str, device: int) -> tuple[str, str]:
    compiled = compile_or_issue(selector)
    if isinstance(compiled, CelIssue):
        if compiled.check in REJECTING:
            return "rejected", f"{compiled.check}: {compiled.message}"
        return "unsupported", f"{compiled.check}: {compiled.message}"
    try:
        selected = compiled.evaluate(DEVICES[device])
    except CelEvalError as exc:
        return ("undecided" if exc.limit else "no"), exc.message
    return ("selects" if selected else "no"), ""


def compare(binary: Path, corpus: list[Case] | None = None) -> list[Pair]:
    corpus = corpus if corpus is not None else cases()
    verdicts = oracle(binary, corpus)
    pairs: list[Pair] = []
    for i, case in enumerate(corpus):
        for j in range(len(DEVICES)):
            k, kd = k8s_outcome(verdicts[i][j])
            d, dd = draguard_outcome(case.selector, j)
            pairs.append(Pair(case, j, k, d, kd, dd))
    return pairs


def main() -> int:
    sys.setrecursionlimit(10000)
    binary = Path(subprocess.run(["bash", "scripts/build-tools.sh", "--path", "celoracle"], check=True,
                                 capture_output=True, text=True).stdout.strip())
    pairs = compare(binary)
    bad = [p for p in pairs if not p.agrees]
    by_family = Counter(p.case.family for p in bad)
    kinds = Counter((p.kubernetes, p.draguard) for p in bad)
    for p in bad:
        sel = p.case.selector if len(p.case.selector) < 160 else p.case.selector[:157] + "..."
        print(f"[{p.case.family}] dev={DEVICES[p.device].name} k8s={p.kubernetes} dg={p.draguard} :: {sel}")
        print(f"    k8s: {p.k8s_detail[:300]}")
        print(f"    dg:  {p.dg_detail[:300]}")
    print(f"pairs {len(pairs)}, agree {len(pairs) - len(bad)} ({100 * (1 - len(bad) / len(pairs)):.2f} %)")
    print("by family:", dict(by_family))
    print("by (k8s, draguard):", dict(kinds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
