"""Which GpuTierPolicies could classify a workload, found without asking every policy.

Built once per policy set. It is a prefilter only: a policy it leaves out cannot classify the
workload (every matcher of every class is indexed by something the workload must carry for that
matcher to match), and the policies it returns are asked the usual way (`classifications`), so
verdicts and their reasons are the policy's own.

- label, labelWords and annotation matchers: by key;
- imageWords: by the phrase's first word;
- image and command globs: by their rarest literal 4-gram (a glob matches only values that
  contain every literal run of it); globs with no 4 literal characters in a row, or with a
  `[...]` set, are asked for every workload;
- modules: by the exact module (and every dotted prefix of the workload's module); globs as above.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .model import GpuTierPolicy, WorkloadFacts, words_of

GRAM = 4
# Up to this many policies, asking each costs less than looking the workload up in the index.
SMALL = 8
_WILD = "*?"


def _literal_runs(pattern: str) -> list[str] | None:
    """The literal runs of a glob; None when it has a `[...]` set (left to be asked always)."""
    if "[" in pattern or "]" in pattern:
        return None
    runs: list[str] = []
    cur: list[str] = []
    for ch in pattern:
        if ch in _WILD:
            if cur:
                runs.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        runs.append("".join(cur))
    return runs


def _grams(text: str) -> Iterator[str]:
    for i in range(len(text) - GRAM + 1):
        yield text[i : i + GRAM]


@dataclass(slots=True)
class _GlobIndex:
    """Policy positions by glob, looked up with the values a workload carries."""

    by_gram: dict[str, set[int]] = field(default_factory=dict)
    always: set[int] = field(default_factory=set)
    _pending: list[tuple[str, int]] = field(default_factory=list)

    def add(self, pattern: str, pos: int) -> None:
        self._pending.append((pattern, pos))

    def build(self) -> None:
        runs_of = {p: _literal_runs(p) for p, _ in self._pending}
        counts: Counter[str] = Counter()
        for runs in runs_of.values():
            for g in {g for r in runs or () for g in _grams(r)}:
                counts[g] += 1
        for pattern, pos in self._pending:
            grams = [g for r in runs_of[pattern] or () for g in _grams(r)]
            if not grams:
                self.always.add(pos)
                continue
            rarest = min(grams, key=lambda g: (counts[g], g))
            self.by_gram.setdefault(rarest, set()).add(pos)
        self._pending.clear()

    def candidates(self, values: Iterable[str], out: set[int]) -> None:
        if not self.by_gram:
            return
        for v in values:
            for g in _grams(v):
                hit = self.by_gram.get(g)
                if hit:
                    out |= hit


@dataclass(slots=True)
class TierIndex:
    """Positions in `policies` of the GpuTierPolicies that could classify a workload."""

    policies: tuple[GpuTierPolicy, ...]
    by_label: dict[str, set[int]] = field(default_factory=dict)
    by_annotation: dict[str, set[int]] = field(default_factory=dict)
    by_image_word: dict[str, set[int]] = field(default_factory=dict)
    by_module: dict[str, set[int]] = field(default_factory=dict)
    images: _GlobIndex = field(default_factory=_GlobIndex)
    commands: _GlobIndex = field(default_factory=_GlobIndex)
    modules: _GlobIndex = field(default_factory=_GlobIndex)
    always: set[int] = field(default_factory=set)
    small: bool = False

    @staticmethod
    def of(policies: tuple[GpuTierPolicy, ...], small: int = SMALL) -> TierIndex:
        ix = TierIndex(policies)
        if len(policies) <= small:
            ix.small = True
            return ix
        for pos, pol in enumerate(policies):
            for c in pol.classes:
                m = c.match
                for k in (*m.labels, *m.label_words):
                    ix.by_label.setdefault(k, set()).add(pos)
                for k in m.annotations:
                    ix.by_annotation.setdefault(k, set()).add(pos)
                for phrase in m.image_words:
                    words = words_of(phrase)
                    if words:  # a phrase without words matches nothing
                        ix.by_image_word.setdefault(words[0], set()).add(pos)
                for p in m.images:
                    ix.images.add(p, pos)
                for p in m.commands:
                    ix.commands.add(p, pos)
                for p in m.modules:
                    if any(ch in p for ch in "*?["):
                        ix.modules.add(p, pos)
                    else:
                        ix.by_module.setdefault(p, set()).add(pos)
        for g in (ix.images, ix.commands, ix.modules):
            g.build()
            ix.always |= g.always
        return ix

    def candidates(self, facts: WorkloadFacts) -> list[GpuTierPolicy]:
        """The policies that could classify `facts`, in policy-set order (a superset, never fewer)."""
        if self.small:
            return list(self.policies)
        found = set(self.always)
        for k in facts.labels:
            hit = self.by_label.get(k)
            if hit:
                found |= hit
        for k in facts.annotations:
            hit = self.by_annotation.get(k)
            if hit:
                found |= hit
        if self.by_image_word:
            for img in facts.images:
                for w in words_of(img.split("@", 1)[0]):
                    hit = self.by_image_word.get(w)
                    if hit:
                        found |= hit
        self.images.candidates(facts.images, found)
        if facts.command_tokens:
            # A token's basename is part of it: its grams are among the token's.
            self.commands.candidates(facts.command_tokens, found)
        if facts.modules:
            if self.by_module:
                for mod in facts.modules:
                    parts = mod.split(".")
                    for i in range(1, len(parts) + 1):
                        hit = self.by_module.get(".".join(parts[:i]))
                        if hit:
                            found |= hit
            self.modules.candidates(facts.modules, found)
        return [self.policies[i] for i in sorted(found)]
