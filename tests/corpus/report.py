"""Where draguard stands on the corpus today: `python -m tests.corpus.report` (from the repository root).

Prints the agreement figure, the enforce-level disagreements (false denials and missed denials) and
every file whose verdicts differ from expected.yaml, with the cause known_gaps.yaml gives (or "NEW"
for a disagreement it does not list, and "FIXED" for a listed file that now agrees). docs/corpus.md
quotes these figures; refresh known_gaps.yaml from this output when the engine changes.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

from tests.corpus.test_corpus import CORPUS, EXPECTED, GAPS, differences, loaded_once, observe


def main() -> int:
    agree = 0
    false_denials: list[str] = []
    missed_denials: list[str] = []
    causes: Counter[str] = Counter()
    per_project: dict[str, list[int]] = {}
    lines: list[str] = []
    with loaded_once(), tempfile.TemporaryDirectory() as tmp:
        for i, rel in enumerate(CORPUS):
            work = Path(tmp) / str(i)
            work.mkdir()
            seen = observe(rel, work)
            diff = differences(rel, seen)
            want = EXPECTED[rel]["verdict"]
            if seen.verdict == "deny" and want != "deny":
                false_denials.append(rel)
            if want == "deny" and seen.verdict != "deny":
                missed_denials.append(rel)
            gap = GAPS.get(rel)
            tally = per_project.setdefault(rel.split("/", 1)[0], [0, 0])
            tally[1] += 1
            tally[0] += not diff
            if not diff:
                agree += 1
                if gap:
                    lines.append(f"FIXED {rel} (known_gaps.yaml: {gap['cause']})")
                continue
            cause = str(gap["cause"]) if gap else "NEW"
            causes[cause] += 1
            lines.append(f"{cause:<28} {rel}: " + "; ".join(diff))
    total = len(CORPUS)
    print(f"agreement: {agree}/{total} files ({100 * agree / total:.1f} %)")
    for title, files in (("false denials", false_denials), ("missed denials", missed_denials)):
        print(f"enforce-level {title}: {len(files)}" + "".join(f"\n  {r}" for r in files))
    print("by project: " + ", ".join(f"{p} {a}/{n}" for p, (a, n) in sorted(per_project.items())))
    print("disagreements by cause: " + ", ".join(f"{c} {n}" for c, n in causes.most_common()))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
