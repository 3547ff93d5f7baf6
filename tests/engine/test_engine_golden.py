"""The engine's verdicts on a fixed corpus are those recorded in fixtures/golden-verdicts.json.

The golden file was written by `tests/engine/golden_corpus.py --write` before the request path's
optimisations; a speed-up must leave every response, finding, patch and generated object as it was.
A deliberate change of verdict regenerates the file (and the diff shows what changed).
"""

from __future__ import annotations

import json
from typing import Any

from golden_corpus import GOLDEN, judge_admission, judge_suites, render


def _first_difference(want: dict[str, Any], got: dict[str, Any]) -> str:
    for key in sorted(set(want) | set(got)):
        if want.get(key) != got.get(key):
            return (
                f"{key}:\n  recorded: {json.dumps(want.get(key), sort_keys=True)[:3000]}\n"
                f"  now:      {json.dumps(got.get(key), sort_keys=True)[:3000]}"
            )
    return ""


def _golden() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def test_admission_verdicts_match_the_recorded_ones() -> None:
    want = _golden()["admission"]
    got = json.loads(render(judge_admission()))
    assert len(want) > 400  # the corpus is the one recorded, not an empty one
    diff = _first_difference(want, got)
    assert not diff, diff


def test_suite_findings_match_the_recorded_ones() -> None:
    want = _golden()["suites"]
    got = json.loads(render(judge_suites()))
    assert len(want) >= 40
    diff = _first_difference(want, got)
    assert not diff, diff
