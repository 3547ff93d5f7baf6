"""The bundle's DeviceClasses against the GPUs of EKS, GKE and AKS, checked with draguard's own CEL
linter and matcher on the ResourceSlices the bundled driver publishes for those GPUs
(tests/kustomize/cloud_gpus.py), and the shipped tier policy against the same classes.
"""

from __future__ import annotations

import fnmatch
import functools
from fractions import Fraction
from typing import Any

import pytest
import yaml
from cloud_gpus import CLOUDS, Mig, Product, cloud_slices, node_slices
from kbundle import REPO, build, find

from webhook.cel.lint import lint_selector
from webhook.cel.match import match_devices
from webhook.dra.inventory import Inventory
from webhook.dra.objects import claim_spec_of
from webhook.engine.quota import QuotaCalculator, mig_fraction

PRODUCTS = {p.name: p for c in CLOUDS.values() for p, _ in c.values()}


@functools.cache
def _classes() -> dict[str, list[str]]:
    return {
        c["metadata"]["name"]: [s["cel"]["expression"] for s in c["spec"]["selectors"]]
        for c in find(build("base"), "DeviceClass")
    }


def expected_full(product: Product) -> set[str]:
    fam = product.family
    out = {f"gpu.nvidia.com-{fam}"}
    if fam == "a100":
        out.add(f"gpu.nvidia.com-a100-{product.memory_gib}gb")
    return out


def expected_mig(product: Product, mig: Mig) -> set[str]:
    out = {f"gpu.nvidia.com-{product.family}-mig-{mig.class_suffix}"}
    generic = f"mig-{mig.profile.replace('.', '')}.nvidia.com"
    return out | ({generic} if generic in _classes() else set())


def _selecting(devices: list[Any]) -> dict[str, set[str]]:
    """Device name -> names of the classes that select it (draguard's matcher)."""
    out: dict[str, set[str]] = {d.name: set() for d in devices}
    for name, exprs in _classes().items():
        res = match_devices(exprs, devices)
        assert not res.errors, (name, res.errors[0].message)
        for d in res.matched:
            out[d.name].add(name)
    return out


@pytest.mark.parametrize("product", sorted(PRODUCTS), ids=str)
def test_each_board_and_profile_is_selected_by_exactly_its_classes(product: str) -> None:
    p = PRODUCTS[product]
    devices = Inventory.from_objects(node_slices(p, 2, None, "whole")).devices
    assert set(map(frozenset, _selecting(list(devices)).values())) == {frozenset(expected_full(p))}
    for m in p.mig:
        devices = Inventory.from_objects(node_slices(p, 1, m, "carved")).devices
        assert len(devices) == m.count
        picked = _selecting(list(devices))
        assert set(map(frozenset, picked.values())) == {frozenset(expected_mig(p, m))}, m.profile


@functools.cache
def _class_objects() -> tuple[dict[str, Any], ...]:
    return tuple(find(build("base"), "DeviceClass"))


@pytest.mark.parametrize("product", sorted(PRODUCTS), ids=str)
def test_gpu_equivalents_are_the_compute_share_with_or_without_an_inventory(product: str) -> None:
    """Quota charges a MIG class its compute slices over the board's (3g on a 7-slice GPU: 3/7; 1g on
    the 4-slice RTX PRO 6000: 1/4) whether or not the cluster's devices are known, and a whole GPU 1."""
    p = PRODUCTS[product]
    bare = QuotaCalculator(Inventory.from_objects(_class_objects()))
    whole = QuotaCalculator(Inventory.from_objects([*_class_objects(), *node_slices(p, 1, None, "whole")]))
    assert bare.class_fraction(f"gpu.nvidia.com-{p.family}") == 1
    assert whole.class_fraction(f"gpu.nvidia.com-{p.family}") == 1
    for m in p.mig:
        want = Fraction(m.compute_slices, p.mig_slices)
        carved = Inventory.from_objects([*_class_objects(), *node_slices(p, 1, m, "carved")])
        for cls in expected_mig(p, m):
            assert bare.class_fraction(cls) == want, (cls, "no inventory")
            assert QuotaCalculator(carved).class_fraction(cls) == want, (cls, "inventory")


def test_legacy_mig_resources_are_charged_by_the_board_their_mapped_class_names() -> None:
    """`nvidia.com/mig-<profile>` is charged through the class the MigrationPolicy maps it to: the
    RTX PRO 6000's 2g.48gb is half a board, the H100 NVL's 1g.24gb a seventh; a name that merely
    contains "a30" is no A30."""
    assert mig_fraction("2g.48gb", "gpu.nvidia.com-rtxpro6000-mig-2g48gb") == Fraction(1, 2)
    assert mig_fraction("1g.24gb", "NVIDIA RTX PRO 6000 Blackwell Server Edition") == Fraction(1, 4)
    assert mig_fraction("1g.24gb", "gpu.nvidia.com-h100-mig-1g24gb") == Fraction(1, 7)
    assert mig_fraction("2g.12gb", "NVIDIA A30") == Fraction(1, 2)
    assert mig_fraction("3g.20gb", "data300-mig-3g20gb") == Fraction(3, 7)


def _mig_claim(profiles: list[str], op: str = "==") -> Any:
    """A claim in the form of NVIDIA's MIG examples: class mig.nvidia.com, the profile in the request."""
    expr = " || ".join(f"device.attributes['gpu.nvidia.com'].profile {op} '{p}'" for p in profiles)
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mig", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": "mig.nvidia.com", "count": 2, "selectors": [{"cel": {"expression": expr}}],
        }}]}},
    }  # fmt: skip
    found = claim_spec_of(claim)
    assert found is not None
    return found[0]


def test_a_mig_profile_selected_in_the_claim_is_charged_as_that_slice_without_an_inventory() -> None:
    mig_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "mig.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                      "device.attributes['gpu.nvidia.com'].type == 'mig'"}}]},
    }  # fmt: skip
    for objs in ([], [mig_class]):  # the class unknown to review, or known with no device
        calc = QuotaCalculator(Inventory.from_objects(objs))
        assert calc.claim_gpu_equivalents(_mig_claim(["1g.10gb"])) == Fraction(2, 7)
        assert calc.claim_gpu_equivalents(_mig_claim(["1g.10gb", "3g.40gb"])) == Fraction(6, 7)
        # A profile the request excludes says nothing of what it gets: a whole GPU each, as before.
        assert calc.claim_gpu_equivalents(_mig_claim(["1g.10gb"], "!=")) == 2
    # Known devices decide: a carved H100 node's 1g.10gb slices.
    carved = node_slices(PRODUCTS["NVIDIA H100 80GB HBM3"], 1, PRODUCTS["NVIDIA H100 80GB HBM3"].mig[0], "n")
    calc = QuotaCalculator(Inventory.from_objects([mig_class, *carved]))
    assert calc.claim_gpu_equivalents(_mig_claim(["1g.10gb"])) == Fraction(2, 7)


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_linter_finds_every_class_meant_for_the_cloud_on_its_gpus(cloud: str) -> None:
    devices = list(Inventory.from_objects(cloud_slices(cloud)).devices)
    meant: set[str] = set()
    for product, _n in CLOUDS[cloud].values():
        meant |= expected_full(product)
        for m in product.mig:
            meant |= expected_mig(product, m)
    for name, exprs in _classes().items():
        issues = [i for e in exprs for i in lint_selector(e, devices=devices, driver="gpu.nvidia.com")]
        if name in meant:
            assert issues == [], (cloud, name, [(i.check, i.message) for i in issues])
        else:
            # A class for GPUs this cloud does not sell: the linter says so, and says nothing else.
            assert {i.check for i in issues} == {"cel/no-match"}, (cloud, name, issues)


def test_the_articles_class_names_are_kept() -> None:
    names = set(_classes())
    article = {"gpu.nvidia.com-a100", "gpu.nvidia.com-h100", "gpu.nvidia.com-a100-mig-3g20gb"}
    article |= {f"mig-{p}.nvidia.com" for p in ("1g5gb", "1g10gb", "2g10gb", "3g20gb", "4g40gb", "7g80gb")}
    assert article <= names


def test_migration_mappings_name_the_class_of_the_board_they_stand_for() -> None:
    """Every MIG resource maps to a class that selects that profile on a board that has it; a pod pinned
    by GPU feature discovery's product label (the NVML name, spaces as dashes) maps to that board's
    class; every mapped class is in the bundle."""
    doc = yaml.safe_load((REPO / "policies" / "migration.yaml").read_text())
    mappings = doc["spec"]["mappings"]
    profiles_seen: set[str] = set()
    for mp in mappings:
        cls, res = mp["deviceClass"], mp["resource"]
        assert cls in _classes(), mp
        if res.startswith("nvidia.com/mig-"):
            profile = res.removeprefix("nvidia.com/mig-")
            boards = [(p, m) for p in PRODUCTS.values() for m in p.mig if m.profile == profile]
            assert boards and any(cls in expected_mig(p, m) for p, m in boards), mp
            profiles_seen.add(profile)
        product = (mp.get("nodeSelector") or {}).get("nvidia.com/gpu.product")
        if product:
            boards = [p for p in PRODUCTS.values() if p.name.replace(" ", "-") == product]
            assert boards and all(cls in expected_full(p) for p in boards), mp
    # Every profile of every board the catalogue models has a mapping.
    assert {m.profile for p in PRODUCTS.values() for m in p.mig} <= profiles_seen


def _tier() -> dict[str, list[str]]:
    doc = yaml.safe_load((REPO / "policies" / "tier.yaml").read_text())
    return {c["name"]: c["deviceClasses"] for c in doc["spec"]["classes"]}


def _allowed(patterns: list[str]) -> set[str]:
    return {n for n in _classes() if any(fnmatch.fnmatchcase(n, p) for p in patterns)}


def test_tier_policy_and_classes_agree() -> None:
    tiers = _tier()
    for tier, patterns in tiers.items():
        for pattern in patterns:
            assert _allowed([pattern]), f"tier {tier}: {pattern} names no DeviceClass of the bundle"
    for cloud, instances in CLOUDS.items():
        for itype, (p, _n) in instances.items():
            llm_grade = p.grade == "llm"
            # LLM workloads may use the Hopper and Blackwell datacenter boards (H100, H200, B200,
            # GB200), whole or sliced, and nothing older or inference-grade.
            llm_ok = bool(_allowed(tiers["llm"]) & expected_full(p))
            assert llm_ok == llm_grade, (cloud, itype, "llm")
            for m in p.mig:
                sliced_ok = bool(_allowed(tiers["llm"]) & expected_mig(p, m))
                assert sliced_ok == llm_grade, (cloud, itype, m.profile)
            # Training runs on every whole datacenter training board, not on inference cards.
            training_ok = bool(_allowed(tiers["training"]) & expected_full(p))
            assert training_ok == (p.grade in ("llm", "training")), (cloud, itype, "training")
            # Inference may use every board and slice.
            assert _allowed(tiers["inference"]) >= expected_full(p), (cloud, itype, "inference")
            # Notebooks (dev) share boards through MIG slices of every board; an inference card
            # without MIG (L4, L40S, A10G, T4) is given whole, a big board never.
            for m in p.mig:
                assert _allowed(tiers["dev"]) & expected_mig(p, m), (cloud, itype, m.profile)
            dev_whole = bool(_allowed(tiers["dev"]) & expected_full(p))
            assert dev_whole == (p.grade == "inference" and not p.mig), (cloud, itype, "dev whole GPU")
