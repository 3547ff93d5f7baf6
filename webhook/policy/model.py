"""Policy documents (`policy.draguard.io/v1alpha1`) as plain, immutable data.

Parsing and validation live in `load.py`; this module only holds the shapes and the small,
pure questions rules ask of them (which class is this workload, which mode for this namespace).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from ..core.findings import Finding, Mode
from ..core.frozen import one_call_init
from ..dra.workloads import CRD_POD_TEMPLATES, CrdTable, TemplatePath

if TYPE_CHECKING:
    from .tier_index import TierIndex

API_VERSION = "policy.draguard.io/v1alpha1"
KINDS: tuple[str, ...] = (
    "GpuTierPolicy",
    "GpuQuotaPolicy",
    "CelLintPolicy",
    "MigrationPolicy",
    "WorkloadKindPolicy",
    "PolicyException",
)

MIGRATION_MODE_LABEL = "draguard.io/migration-mode"
TEAM_LABEL = "draguard.io/team"
WORKLOAD_CLASS_LABEL = "draguard.io/workload-class"


@functools.lru_cache(maxsize=4096)
def _glob_re(pattern: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(pattern))


def glob_match(pattern: str, value: str) -> bool:
    """Shell-style match (`*`, `?`, `[..]`), case-sensitive."""
    if pattern == value:
        return True
    return _glob_re(pattern).match(value) is not None


def any_glob(patterns: Iterable[str], value: str) -> bool:
    return any(glob_match(p, value) for p in patterns)


@dataclass(frozen=True, slots=True)
class GlobSet:
    """`any_glob(patterns, value)` for a fixed list of patterns, as one set lookup and one regex."""

    literal: frozenset[str]
    regex: re.Pattern[str] | None

    @staticmethod
    def of(patterns: Iterable[str]) -> GlobSet:
        pats = tuple(dict.fromkeys(patterns))
        # A pattern equal to the value matches it even when its `[..]` would not (glob_match).
        wild = [p for p in pats if any(ch in p for ch in "*?[")]
        regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in wild)) if wild else None
        return GlobSet(frozenset(pats), regex)

    def __call__(self, value: str) -> bool:
        if value in self.literal:
            return True
        return self.regex is not None and self.regex.match(value) is not None


@dataclass(frozen=True, slots=True)
class PhraseSet:
    """`any(has_phrase(ph, text) for ph in phrases)` with the phrases split into words once."""

    single: frozenset[str]
    multi: tuple[tuple[str, ...], ...]

    @staticmethod
    def of(phrases: Iterable[str]) -> PhraseSet:
        words = [w for w in (words_of(ph) for ph in phrases) if w]
        return PhraseSet(
            frozenset(w[0] for w in words if len(w) == 1),
            tuple(dict.fromkeys(w for w in words if len(w) > 1)),
        )

    def __bool__(self) -> bool:
        return bool(self.single or self.multi)

    def __call__(self, text: str) -> bool:
        have = words_of(text)
        if self.single and not self.single.isdisjoint(have):
            return True
        for want in self.multi:
            first, n = want[0], len(want)
            if first not in have:  # most phrases: their first word is absent (one C scan)
                continue
            i = have.index(first)
            while True:
                if have[i : i + n] == want:
                    return True
                try:
                    i = have.index(first, i + 1)
                except ValueError:
                    break
        return False


@dataclass(frozen=True, slots=True)
class NamespaceScope:
    """Which namespaces a policy applies to: `namespaces` (globs, empty = all) minus `exclude`."""

    namespaces: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    match_labels: Mapping[str, str] = field(default_factory=dict)
    _exclude: GlobSet = field(init=False, repr=False, compare=False)
    _include: GlobSet = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_exclude", GlobSet.of(self.exclude))
        object.__setattr__(self, "_include", GlobSet.of(self.namespaces))

    def applies(self, namespace: str, labels: Mapping[str, str] | None = None) -> bool:
        if self._exclude(namespace):
            return False
        if self.namespaces and not self._include(namespace):
            return False
        if self.match_labels:
            # Unknown labels (offline review without namespace facts) cannot rule a namespace in.
            if labels is None:
                return False
            return all(labels.get(k) == v for k, v in self.match_labels.items())
        return True


# -- GpuTierPolicy -----------------------------------------------------------------------------


_WORD = re.compile(r"[a-z0-9]+")
# A name glued to its version (`vllm0.8.4`, `verl0.4` in image tags such as
# `verlai/verl:app-verl0.4-vllm0.8.5-mcore0.12.1`) is also a word of its own: `vllm`, `verl`.
_VERSIONED = re.compile(r"([a-z]+)[0-9]+\.[0-9]")


def _split_words(text: str) -> tuple[str, ...]:
    low = text.lower()
    out: list[str] = []
    for m in _WORD.finditer(low):
        w = m.group()
        if w[-1].isdigit() and not w[0].isdigit():
            v = _VERSIONED.match(low, m.start())
            if v is not None and v.end(1) < m.end():
                out.append(v.group(1))
        out.append(w)
    return tuple(out)


_cached_words = functools.lru_cache(maxsize=4096)(_split_words)


def words_of(text: str) -> tuple[str, ...]:
    """Lower-case alphanumeric runs: `allminilm-embedder` -> (allminilm, embedder)."""
    # Image names and label values repeat across requests; tenant-written text longer than any real
    # one is split each time rather than kept.
    return _cached_words(text) if len(text) <= 256 else _split_words(text)


def has_phrase(phrase: str, text: str) -> bool:
    """True when the words of `phrase` occur consecutively, as whole words, in `text`.

    `llm` matches `chat-llm` and `llm-inference` but not `allminilm-embedder`; `llama.cpp` matches
    `ghcr.io/ggml-org/llama.cpp:server` but not `llama-cpp-python`'s `llamacpp`.
    """
    want = words_of(phrase)
    if not want:
        return False
    have = words_of(text)
    n = len(want)
    return any(have[i : i + n] == want for i in range(len(have) - n + 1))


def module_matches(pattern: str, module: str) -> bool:
    """A Python module pattern: `vllm` matches `vllm` and `vllm.entrypoints.openai.api_server`."""
    if any(ch in pattern for ch in "*?["):
        return glob_match(pattern, module)
    return module == pattern or module.startswith(pattern + ".")


def _image_name(image: str) -> str:
    # A digest is hex: it carries no words worth matching, and could only produce false hits.
    return image.split("@", 1)[0]


@dataclass(frozen=True, slots=True)
class WorkloadMatch:
    """How a workload is recognised.

    Metadata (what the workload says about itself): `labels` / `annotations` (any listed pair present,
    value glob) and `labelWords` (label key -> phrases that must occur as whole words in its value).
    Evidence (what it runs): `images` (globs) and `imageWords` (whole-word phrases) over every
    container image; `commands` (globs over each command/args word or its basename); `modules`
    (Python modules run with `python -m`, matched by dotted prefix). A class matches when any of its
    non-empty matchers matches.
    """

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    images: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    label_words: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    image_words: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    # The matchers above in the form the request path asks them (built once, with the policy).
    image_globs: GlobSet = field(init=False, repr=False, compare=False)
    image_phrases: PhraseSet = field(init=False, repr=False, compare=False)
    command_globs: GlobSet = field(init=False, repr=False, compare=False)
    label_phrases: Mapping[str, PhraseSet] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_globs", GlobSet.of(self.images))
        object.__setattr__(self, "image_phrases", PhraseSet.of(self.image_words))
        object.__setattr__(self, "command_globs", GlobSet.of(self.commands))
        object.__setattr__(self, "label_phrases", {k: PhraseSet.of(v) for k, v in self.label_words.items()})


@dataclass(frozen=True, slots=True)
class TierClass:
    name: str
    match: WorkloadMatch
    device_classes: tuple[str, ...]  # allowed DeviceClass names (globs)
    # Classes a workload whose images/commands say it is this class may declare itself (by label or
    # annotation) instead. Empty: metadata can narrow what the evidence allows, never widen it.
    relabel_to: tuple[str, ...] = ()
    _allowed: GlobSet = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_allowed", GlobSet.of(self.device_classes))

    def allows(self, device_class: str) -> bool:
        return self._allowed(device_class)


@one_call_init
@dataclass(frozen=True, slots=True)
class Classification:
    tier: TierClass
    reason: str  # e.g. 'label app=llm-inference', 'image "vllm/vllm-openai:v0.6"', 'command "torchrun"'


@one_call_init
@dataclass(frozen=True, slots=True)
class WorkloadFacts:
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    images: tuple[str, ...]
    command_tokens: tuple[str, ...]
    modules: tuple[str, ...] = ()  # Python modules run with `python -m`


@dataclass(frozen=True, slots=True)
class GpuTierPolicy:
    name: str
    classes: tuple[TierClass, ...]
    mode: Mode = Mode.ENFORCE
    scope: NamespaceScope = field(default_factory=NamespaceScope)
    source: str | None = None
    line: int | None = None

    def declared(self, facts: WorkloadFacts) -> Classification | None:
        """The class the workload's metadata claims: labels first, then annotations."""
        if not facts.labels and not facts.annotations:  # nothing to match (a bare Pod)
            return None
        for c in self.classes:
            for k, v in c.match.labels.items():
                if k in facts.labels and glob_match(v, facts.labels[k]):
                    return Classification(c, f"label {k}={facts.labels[k]}")
            for k, phrases in c.match.label_phrases.items():
                value = facts.labels.get(k)
                if value is not None and phrases(value):
                    return Classification(c, f"label {k}={value}")
        for c in self.classes:
            for k, v in c.match.annotations.items():
                if k in facts.annotations and glob_match(v, facts.annotations[k]):
                    return Classification(c, f"annotation {k}={facts.annotations[k]}")
        return None

    def detected(self, facts: WorkloadFacts) -> Classification | None:
        """The class what the workload runs says: images first, then commands and `python -m` modules."""
        for c in self.classes:
            m = c.match
            if not m.images and not m.image_phrases:
                continue
            for img in facts.images:
                if m.image_globs(img) or m.image_phrases(_image_name(img)):
                    return Classification(c, f'image "{img}"')
        for c in self.classes:
            m = c.match
            if m.commands:
                for tok in facts.command_tokens:
                    if m.command_globs(tok) or m.command_globs(tok.rsplit("/", 1)[-1]):
                        return Classification(c, f'command "{tok}"')
            for mod in facts.modules:
                if any(module_matches(p, mod) for p in c.match.modules):
                    return Classification(c, f'command "python -m {mod}"')
        return None

    def classifications(self, facts: WorkloadFacts) -> tuple[Classification, ...]:
        """Every class whose DeviceClasses the workload must keep to, the one it is known by first.

        Metadata decides when the evidence is silent, agrees, or names the declared class in its
        `relabelTo`. Otherwise both apply: a label can make a workload stricter, not looser.
        """
        declared = self.declared(facts)
        detected = self.detected(facts)
        if detected is None:
            return (declared,) if declared is not None else ()
        if declared is None or declared.tier.name == detected.tier.name:
            return (declared or detected,)
        if declared.tier.name in detected.tier.relabel_to:
            return (declared,)
        return (declared, detected)

    def classify(self, facts: WorkloadFacts) -> Classification | None:
        """The class the workload is known by (see `classifications` for all that apply)."""
        found = self.classifications(facts)
        return found[0] if found else None


# -- GpuQuotaPolicy ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuotaBudget:
    """One budget. `scope` "namespace": `name` is a namespace glob (each matching namespace gets
    its own budget); scope "team": `name` is a team label value (`*` = each team), summed over
    every namespace carrying that team label."""

    scope: str  # "namespace" | "team" | "default" (namespaces no other budget of the policy covers)
    name: str
    device_classes: Mapping[str, int] = field(default_factory=dict)
    gpu_equivalents: float | None = None
    claims: int | None = None


@dataclass(frozen=True, slots=True)
class GpuQuotaPolicy:
    name: str
    budgets: tuple[QuotaBudget, ...]
    mode: Mode = Mode.ENFORCE
    team_label: str = TEAM_LABEL
    source: str | None = None
    line: int | None = None


# -- CelLintPolicy -----------------------------------------------------------------------------

CEL_CHECKS: tuple[str, ...] = (
    "cel/syntax",
    "cel/type",
    "cel/unknown-attribute",
    "cel/no-match",
    "cel/limits",
    "cel/driver-guard",
    "cel/unsupported",
    "cel/version",
)


@dataclass(frozen=True, slots=True)
class CelCheckSetting:
    enabled: bool = True
    mode: Mode | None = None  # None: the policy's mode
    severity: str | None = None  # "error" | "warning" | "info"; None: the check's own


@dataclass(frozen=True, slots=True)
class CelLintPolicy:
    name: str
    mode: Mode = Mode.WARN
    checks: Mapping[str, CelCheckSetting] = field(default_factory=dict)
    scope: NamespaceScope = field(default_factory=NamespaceScope)
    source: str | None = None
    line: int | None = None

    def setting(self, check: str) -> CelCheckSetting | None:
        """The effective setting of one check; None when the check is switched off."""
        s = self.checks.get(check, CelCheckSetting())
        if not s.enabled:
            return None
        return CelCheckSetting(True, s.mode or self.mode, s.severity)


# -- MigrationPolicy ---------------------------------------------------------------------------


class MigrationMode(StrEnum):
    OBSERVE = "observe"
    WARN = "warn"
    MIGRATE = "migrate"
    ENFORCE = "enforce"

    @property
    def finding_mode(self) -> Mode:
        """observe -> audit, warn and migrate -> warn (migrate adds a patch), enforce -> deny."""
        return {
            MigrationMode.OBSERVE: Mode.AUDIT,
            MigrationMode.WARN: Mode.WARN,
            MigrationMode.MIGRATE: Mode.WARN,
            MigrationMode.ENFORCE: Mode.ENFORCE,
        }[self]


class MigrationStrategy(StrEnum):
    CLAIM_TEMPLATE = "claim-template"
    EXTENDED_RESOURCE = "extended-resource"


@dataclass(frozen=True, slots=True)
class ResourceMapping:
    """A legacy extended resource (+ optional pod nodeSelector) and the DeviceClass that replaces it."""

    resource: str
    device_class: str
    node_selector: Mapping[str, str] = field(default_factory=dict)
    selectors: tuple[str, ...] = ()  # extra CEL selectors for the generated request
    # glob_match(self.resource, ...)'s regex, compiled once: asked per mapping per legacy pod.
    _match: Callable[[str], re.Match[str] | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_match", _glob_re(self.resource).match)

    def matches(self, resource: str, node_selector: Mapping[str, str]) -> bool:
        if resource != self.resource and self._match(resource) is None:  # glob_match
            return False
        # A loop, not all() over a generator: asked per mapping per legacy pod.
        for k, v in self.node_selector.items():  # noqa: SIM110
            if node_selector.get(k) != v:
                return False
        return True


@dataclass(frozen=True, slots=True)
class MigrationPolicy:
    name: str
    mappings: tuple[ResourceMapping, ...]
    default_mode: MigrationMode = MigrationMode.WARN
    namespaces: Mapping[str, MigrationMode] = field(default_factory=dict)  # namespace glob -> mode
    label_modes: Mapping[str, MigrationMode] = field(default_factory=dict)  # "key=value" -> mode
    strategy: MigrationStrategy = MigrationStrategy.CLAIM_TEMPLATE
    claim_api_version: str = "resource.k8s.io/v1"
    scope: NamespaceScope = field(default_factory=NamespaceScope)
    source: str | None = None
    line: int | None = None
    # Mappings by their literal resource name, each list in policy order (glob resources: `_globbed`).
    _literal: Mapping[str, tuple[ResourceMapping, ...]] = field(init=False, repr=False, compare=False)
    _globbed: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        literal: dict[str, list[ResourceMapping]] = {}
        for m in self.mappings:
            literal.setdefault(m.resource, []).append(m)
        object.__setattr__(self, "_literal", {k: tuple(v) for k, v in literal.items()})
        object.__setattr__(self, "_globbed", any(ch in m.resource for m in self.mappings for ch in "*?["))

    def mode_for(self, namespace: str, labels: Mapping[str, str] | None = None) -> MigrationMode:
        """Namespace label `draguard.io/migration-mode` wins, then labelled modes, then namespace
        globs (first listed), then the default."""
        labels = labels or {}
        override = labels.get(MIGRATION_MODE_LABEL)
        if override is not None and override in MigrationMode._value2member_map_:
            return MigrationMode(override)
        for sel, mode in self.label_modes.items():
            k, _, v = sel.partition("=")
            if labels.get(k) == v:
                return mode
        for pattern, mode in self.namespaces.items():
            if glob_match(pattern, namespace):
                return mode
        return self.default_mode

    def mapping_for(self, resource: str, node_selector: Mapping[str, str]) -> ResourceMapping | None:
        """The most specific mapping (most nodeSelector keys) for a resource; None if unmapped."""
        best: ResourceMapping | None = None
        # Without glob resources only the mappings named after the resource can match.
        candidates = self.mappings if self._globbed else self._literal.get(resource, ())
        for m in candidates:
            if m.matches(resource, node_selector) and (
                best is None or len(m.node_selector) > len(best.node_selector)
            ):
                best = m
        return best

    def legacy_resources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.resource for m in self.mappings))


# -- PolicyException ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectSelector:
    kind: str = "*"
    name: str = "*"
    namespace: str = "*"


@dataclass(frozen=True, slots=True)
class PolicyException:
    """Exempts findings of `rules` (globs, empty = all) on objects in scope until `expires` (inclusive)."""

    name: str
    expires: dt.date
    rules: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()  # globs; empty = any
    objects: tuple[ObjectSelector, ...] = ()  # empty = any object in the namespaces
    reason: str = ""
    source: str | None = None
    line: int | None = None

    def expired(self, today: dt.date) -> bool:
        return today > self.expires

    def covers(self, finding: Finding) -> bool:
        """Scope check only (expiry is the caller's concern)."""
        if self.rules and not any_glob(self.rules, finding.rule):
            return False
        ns = finding.object.namespace or ""
        if self.namespaces and not any_glob(self.namespaces, ns):
            return False
        if self.objects:
            return any(
                glob_match(o.kind, finding.object.kind)
                and glob_match(o.name, finding.object.name)
                and glob_match(o.namespace, ns)
                for o in self.objects
            )
        return True


# -- WorkloadKindPolicy ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    """One workload CRD: where its pod templates live (see webhook/dra/workloads.py TemplatePath)."""

    group: str
    kind: str
    templates: tuple[TemplatePath, ...]
    resource: str | None = None


@dataclass(frozen=True, slots=True)
class WorkloadKindPolicy:
    """Workload CRDs added to the built-in table; an entry for a (group, kind) already there replaces it."""

    name: str
    kinds: tuple[WorkloadKind, ...]
    source: str | None = None
    line: int | None = None


def crd_table_of(policies: Iterable[WorkloadKindPolicy]) -> CrdTable:
    """The built-in workload CRD table extended by `policies` (the same object when there are none)."""
    entries = [k for p in policies for k in p.kinds]
    if not entries:
        return CRD_POD_TEMPLATES
    table = dict(CRD_POD_TEMPLATES)
    table.update({(k.group, k.kind): k.templates for k in entries})
    return table


# -- the set -----------------------------------------------------------------------------------

Policy = (
    GpuTierPolicy | GpuQuotaPolicy | CelLintPolicy | MigrationPolicy | WorkloadKindPolicy | PolicyException
)


@dataclass(frozen=True, slots=True)
class PolicySet:
    tier: tuple[GpuTierPolicy, ...] = ()
    quota: tuple[GpuQuotaPolicy, ...] = ()
    cel_lint: tuple[CelLintPolicy, ...] = ()
    migration: tuple[MigrationPolicy, ...] = ()
    exceptions: tuple[PolicyException, ...] = ()
    workload_kinds: tuple[WorkloadKindPolicy, ...] = ()
    # Built once per set (the request path reads them on every request): the workload CRD table, and
    # the index that spares classifying a workload against every tier policy.
    crd_table: CrdTable = field(default_factory=lambda: CRD_POD_TEMPLATES, compare=False, repr=False)
    tier_index: TierIndex = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from .tier_index import TierIndex

        if self.workload_kinds and self.crd_table is CRD_POD_TEMPLATES:
            object.__setattr__(self, "crd_table", crd_table_of(self.workload_kinds))
        object.__setattr__(self, "tier_index", TierIndex.of(self.tier))

    def tier_candidates(self, facts: WorkloadFacts) -> list[GpuTierPolicy]:
        """The tier policies that could classify `facts`, in order (see tier_index.py)."""
        return self.tier_index.candidates(facts)

    @staticmethod
    def empty() -> PolicySet:
        return PolicySet()

    @staticmethod
    def of(policies: Sequence[Policy]) -> PolicySet:
        return PolicySet(
            tier=tuple(p for p in policies if isinstance(p, GpuTierPolicy)),
            quota=tuple(p for p in policies if isinstance(p, GpuQuotaPolicy)),
            cel_lint=tuple(p for p in policies if isinstance(p, CelLintPolicy)),
            migration=tuple(p for p in policies if isinstance(p, MigrationPolicy)),
            exceptions=tuple(p for p in policies if isinstance(p, PolicyException)),
            workload_kinds=tuple(p for p in policies if isinstance(p, WorkloadKindPolicy)),
        )

    def all(self) -> tuple[Policy, ...]:
        return (
            *self.tier, *self.quota, *self.cel_lint, *self.migration, *self.workload_kinds, *self.exceptions
        )

    def __len__(self) -> int:
        return len(self.all())

    def merged(self, other: PolicySet) -> PolicySet:
        return PolicySet.of([*self.all(), *other.all()])
