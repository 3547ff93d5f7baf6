"""The tier index leaves out only policies that cannot classify a workload, and keeps their order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.policy.load import parse_policy_text
from webhook.policy.model import GpuTierPolicy, TierClass, WorkloadFacts, WorkloadMatch
from webhook.policy.tier_index import TierIndex

# A small alphabet so that generated patterns and values meet often.
WORDS = ("vllm", "llm", "tier-1", "tier-17", "model", "server", "torchrun", "a.b", "ex", "serve")
_text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(lambda ws: "/".join(ws))
_glob = st.one_of(
    _text,
    _text.map(lambda t: f"*{t}*"),
    _text.map(lambda t: f"{t}*"),
    _text.map(lambda t: f"*{t}"),
    _text.map(lambda t: t.replace("e", "?", 1)),
    st.just("*"),
    _text.map(lambda t: f"[tv]{t}*"),
)
_keys = st.sampled_from(("app", "team", "draguard.io/workload-class"))
_module = st.lists(st.sampled_from(("vllm", "entrypoints", "a", "b", "torch")), min_size=1, max_size=3).map(
    ".".join
)


@st.composite
def tier_class(draw: st.DrawFn, name: str) -> TierClass:
    match = WorkloadMatch(
        labels=draw(st.dictionaries(_keys, _glob, max_size=1)),
        annotations=draw(st.dictionaries(_keys, _glob, max_size=1)),
        images=tuple(draw(st.lists(_glob, max_size=2))),
        commands=tuple(draw(st.lists(_glob, max_size=2))),
        label_words=draw(st.dictionaries(_keys, st.tuples(_text), max_size=1)),
        image_words=tuple(draw(st.lists(_text, max_size=2))),
        modules=tuple(draw(st.lists(st.one_of(_module, _module.map(lambda m: m + "*")), max_size=2))),
    )
    return TierClass(name, match, ("gpu.nvidia.com-a100",))


@st.composite
def policies(draw: st.DrawFn) -> tuple[GpuTierPolicy, ...]:
    n = draw(st.integers(1, 12))
    return tuple(
        GpuTierPolicy(f"p{i}", tuple(draw(tier_class(f"c{i}-{j}")) for j in range(draw(st.integers(1, 2)))))
        for i in range(n)
    )


facts_st = st.builds(
    WorkloadFacts,
    labels=st.dictionaries(_keys, _text, max_size=2),
    annotations=st.dictionaries(_keys, _text, max_size=2),
    images=st.lists(st.one_of(_text, _text.map(lambda t: f"ghcr.io/{t}:v1@sha256:vllm")), max_size=3).map(
        tuple
    ),
    command_tokens=st.lists(st.one_of(_text, _text.map(lambda t: f"/usr/bin/{t}")), max_size=3).map(tuple),
    modules=st.lists(_module, max_size=2).map(tuple),
)


@settings(max_examples=400, deadline=None)
@given(policies(), facts_st)
def test_every_policy_that_classifies_is_a_candidate_in_order(
    pols: tuple[GpuTierPolicy, ...], facts: WorkloadFacts
) -> None:
    found = TierIndex.of(pols, small=0).candidates(facts)
    classifying = [p for p in pols if p.classifications(facts)]
    assert set(map(id, classifying)) <= set(map(id, found))
    # Policy-set order: the first policy to classify is still the first asked.
    order = [pols.index(p) for p in found]
    assert order == sorted(order)


GENERATED = """---
apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata: {{name: generated-{i}}}
spec:
  classes:
  - name: tier-{i}
    match:
      labels: {{draguard.io/workload-class: tier-{i}}}
      images: ["*example.com/tier-{i}/*", "*model-{i}-server*"]
    deviceClasses: [gpu.nvidia.com-a100]
"""


def _facts(image: str, labels: dict[str, str] | None = None) -> WorkloadFacts:
    return WorkloadFacts(labels or {}, {}, (image,), (), ())


def test_a_thousand_distinct_policies_leave_one_candidate() -> None:
    pset = parse_policy_text("".join(GENERATED.format(i=i) for i in range(1000)))
    # tier-1 must not drag in tier-10..tier-199 (their globs share every gram but the rarest).
    got = pset.tier_candidates(_facts("registry.example.com/tier-1/llm:v2"))
    assert [p.name for p in got] == ["generated-1"]
    assert [p.name for p in got if p.classifications(_facts("registry.example.com/tier-1/llm:v2"))] == [
        "generated-1"
    ]
    assert [p.name for p in pset.tier_candidates(_facts("ghcr.io/acme/model-417-server:1"))] == [
        "generated-417"
    ]
    assert pset.tier_candidates(_facts("busybox")) == []
    # A label key every policy matches on makes every policy a candidate; only one classifies.
    labelled = _facts("busybox", {"draguard.io/workload-class": "tier-5"})
    assert len(pset.tier_candidates(labelled)) == 1000
    assert [p.name for p in pset.tier_candidates(labelled) if p.classifications(labelled)] == ["generated-5"]


def test_set_patterns_and_short_globs_are_asked_for_every_workload() -> None:
    text = GENERATED.format(i=0).replace(
        '"*example.com/tier-0/*", "*model-0-server*"', '"[vt]llm*"'
    ) + GENERATED.format(i=1).replace('"*example.com/tier-1/*", "*model-1-server*"', '"*ab*"')
    pset = parse_policy_text(text)
    assert pset.tier_index.small  # two policies: each is asked
    ix = TierIndex.of(pset.tier, small=0)
    assert [p.name for p in ix.candidates(_facts("busybox"))] == ["generated-0", "generated-1"]
    assert [p.name for p in ix.candidates(_facts("tllm")) if p.classifications(_facts("tllm"))] == [
        "generated-0"
    ]
