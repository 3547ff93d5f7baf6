"""Admitted objects are visible to the next admission before the watch reports them.

The overlay itself is checked with a controllable clock; the request path through the real HTTP
handler, with a ClusterCache whose stores are filled directly (the watch threads are not started,
so events arrive exactly when a test delivers them).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp.test_utils import TestClient, TestServer

from tests.server.conftest import SEED, review, write_policies
from tests.server.objects import legacy_pod_spec, workload
from webhook.server.app import ServeOptions, Webhook
from webhook.server.caches import ClusterCache
from webhook.server.metrics import Metrics
from webhook.server.overlay import AdmittedOverlay, scope_of
from webhook.server.usage import CacheView, Rebuilder

ALICE = scope_of(review(None)["request"])  # the identity every review here is sent as
A100 = "gpu.nvidia.com-a100"
H100 = "gpu.nvidia.com-h100"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def template(name: str, cls: str, ns: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid4())},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}}},
    }


def claim(name: str, cls: str, ns: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}},
    }


def llm_deployment(tmpl: str, name: str = "llm") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "team-a", "labels": {"draguard.io/workload-class": "llm"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "draguard.io/workload-class": "llm"}},
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "example.com/llm:1",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": tmpl}],
                },
            },
        },
    }


# --- the overlay on its own ------------------------------------------------------------------------


def test_watch_event_of_the_created_object_supersedes_the_entry() -> None:
    ov = AdmittedOverlay(clock=Clock())
    t = template("t", A100)
    assert ov.record(t, "CREATE")
    assert set(ov.live()["resourceclaimtemplates"]) == {("team-a", "t")}
    # A late DELETED event of an earlier object with the same name does not remove it.
    old = copy.deepcopy(t)
    old["metadata"].update(uid="earlier", resourceVersion="7")
    ov.observe("resourceclaimtemplates", "DELETED", None, old)
    assert len(ov) == 1
    # An event for another resource with the same key does not either.
    ov.observe("resourceclaims", "ADDED", {**t, "kind": "ResourceClaim"}, None)
    assert len(ov) == 1
    stored = copy.deepcopy(t)
    stored["metadata"]["resourceVersion"] = "12"
    ov.observe("resourceclaimtemplates", "ADDED", stored, None)
    assert len(ov) == 0 and ov.superseded == 1 and ov.live() == {}


def test_update_waits_for_a_newer_resource_version() -> None:
    ov = AdmittedOverlay(clock=Clock())
    t = template("t", H100)
    t["metadata"]["resourceVersion"] = "40"  # an UPDATE carries the version it started from
    assert ov.record(t, "UPDATE")
    before = copy.deepcopy(t)
    before["metadata"]["resourceVersion"] = "39"
    ov.observe("resourceclaimtemplates", "MODIFIED", before, None)
    ov.observe("resourceclaimtemplates", "MODIFIED", t, None)  # the version the update replaced
    assert len(ov) == 1
    after = copy.deepcopy(t)
    after["metadata"]["resourceVersion"] = "41"
    ov.observe("resourceclaimtemplates", "MODIFIED", after, None)
    assert len(ov) == 0


def test_entries_expire_and_the_overlay_is_bounded() -> None:
    clock = Clock()
    ov = AdmittedOverlay(ttl=30.0, max_entries=3, clock=clock)
    for i in range(5):
        assert ov.record(template(f"t{i}", A100), "CREATE")
        clock.now += 1
    assert sorted(k[1] for k in ov.live()["resourceclaimtemplates"]) == ["t2", "t3", "t4"]
    assert ov.evicted == 2
    assert ov.next_expiry() == 30.0 - 3  # t2 was recorded 3 s before now
    clock.now += 27.5
    assert sorted(k[1] for k in ov.live()["resourceclaimtemplates"]) == ["t3", "t4"]
    v = ov.version
    clock.now += 10
    assert ov.live() == {} and ov.expired == 3 and ov.version > v and ov.next_expiry() is None


def test_only_named_objects_of_overlay_kinds_are_recorded() -> None:
    ov = AdmittedOverlay()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}}
    assert not ov.record(pod, "CREATE")
    assert not ov.record(template("t", A100), "DELETE")
    unnamed = template("x", A100)
    unnamed["metadata"]["name"] = "gpu-<generated>"
    assert not ov.record(unnamed, "CREATE")
    # The API server never sends Namespaces to draguard: a recorded one could only be forged.
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fresh", "labels": {"a": "b"}}}
    assert not ov.record(ns, "CREATE") and ov.live() == {}


# --- through the HTTP handler ----------------------------------------------------------------------


def _cache_from_seed() -> ClusterCache:
    # No API access at all: the watch threads are never started here.
    cache = ClusterCache(http=None, metrics=Metrics(), dra_version="v1", served=frozenset({"v1"}))  # type: ignore[arg-type]
    inventory = yaml.safe_load((SEED / "cluster-inventory.yaml").read_text())["items"]
    classes = [o for o in yaml.safe_load_all((SEED / "deviceclasses.yaml").read_text()) if o]
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {}}}]
    for name, objs in (("resourceslices", inventory), ("deviceclasses", classes), ("namespaces", namespaces)):
        for i, o in enumerate(objs):
            o.setdefault("metadata", {})["resourceVersion"] = str(i + 1)
            cache.reflectors[name].store[(o["metadata"].get("namespace") or "", o["metadata"]["name"])] = o
    return cache


class Harness:
    """A watch-mode Webhook over a hand-fed ClusterCache, and a client for its endpoints."""

    def __init__(self, policies: Path, clock: Clock) -> None:
        self.wh = Webhook(ServeOptions(policies=str(policies), poll_interval=0.1))
        assert self.wh.load_policies(first=True), self.wh.watcher.last_error
        self.cache = _cache_from_seed()
        self.wh.cache = self.cache
        self.rb = Rebuilder(
            self.cache,
            self.wh.metrics,
            lambda v: None,
            lambda: self.wh.snapshot.policies,
            overlay=AdmittedOverlay(ttl=30.0, clock=clock),
        )
        self.wh.rebuilder = self.rb
        self.rebuild()
        self.client: TestClient[Any, Any] | None = None

    def rebuild(self) -> CacheView:
        """What the rebuild thread does, then the loop-side publish."""
        view = self.rb.build()
        self.wh.publish_view(self.rb.current(view))
        return view

    def watch_delivers(self, resource: str, obj: dict[str, Any]) -> None:
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = "100"
        meta = stored["metadata"]
        self.cache.reflectors[resource].store[(meta.get("namespace") or "", meta["name"])] = stored
        self.cache._on_event(self.cache.resources[resource], "ADDED", stored, None)

    async def validate(
        self,
        obj: dict[str, Any],
        group: str,
        version: str,
        kind: str,
        dry_run: bool = False,
        namespace: str = "team-a",
        user: str = "alice",
    ) -> dict[str, Any]:
        assert self.client is not None
        body = review(
            obj,
            group=group,
            version=version,
            kind=kind,
            namespace=namespace,
            uid=str(uuid.uuid4()),
            dry_run=dry_run,
        )
        body["request"]["userInfo"] = {"username": user}
        r = await self.client.post("/validate", json=body)
        assert r.status == 200
        resp: dict[str, Any] = (await r.json())["response"]
        return resp

    async def deploy(self, tmpl: str) -> dict[str, Any]:
        return await self.validate(llm_deployment(tmpl), "apps", "v1", "Deployment")

    async def dra(self, obj: dict[str, Any], dry_run: bool = False, user: str = "alice") -> dict[str, Any]:
        return await self.validate(obj, "resource.k8s.io", "v1", obj["kind"], dry_run, user=user)


def _harness(tmp_path: Path, clock: Clock, quota: bool = False) -> Harness:
    return Harness(write_policies(tmp_path / "policies", "enforce", quota=quota), clock)


async def _with_client(h: Harness, body: Callable[[], Any]) -> None:
    async with TestClient(TestServer(h.wh.build_app())) as c:
        h.client = c
        await body()


async def test_template_admitted_then_deployment_denied_before_the_watch_has_it(tmp_path: Path) -> None:
    clock = Clock()
    h = _harness(tmp_path, clock)

    async def body() -> None:
        # Without the template the Deployment cannot be judged for its tier.
        assert (await h.deploy("llm-a100"))["allowed"] is True
        t = template("llm-a100", A100)
        # A server dry run persists nothing: it must not count.
        assert (await h.dra(t, dry_run=True))["allowed"] is True
        assert (await h.deploy("llm-a100"))["allowed"] is True
        assert (await h.dra(t))["allowed"] is True
        denied = await h.deploy("llm-a100")
        assert denied["allowed"] is False and "[tier/gpu-tiers]" in denied["status"]["message"]
        assert A100 in denied["status"]["message"]
        # The mutating path's "template already exists" map stays the watch's: an admitted template
        # may yet be rejected, and a migration patch must not point at one that is absent.
        assert ("team-a", "llm-a100") not in h.wh.snapshot.templates
        # The watch catches up: its object takes over, the verdict stays.
        h.watch_delivers("resourceclaimtemplates", t)
        assert len(h.rb.overlay) == 0
        h.rebuild()
        assert ("team-a", "llm-a100") in h.rb.base_view.inventory.templates
        assert (await h.deploy("llm-a100"))["allowed"] is False
        # An H100 template is in tier: the Deployment using it is admitted.
        assert (await h.dra(template("llm-h100", H100)))["allowed"] is True
        assert (await h.deploy("llm-h100"))["allowed"] is True

    await _with_client(h, body)


async def test_entry_the_watch_never_confirms_expires(tmp_path: Path) -> None:
    clock = Clock()
    h = _harness(tmp_path, clock)

    async def body() -> None:
        assert (await h.dra(template("llm-a100", A100)))["allowed"] is True
        assert (await h.deploy("llm-a100"))["allowed"] is False
        # Another admission step rejected the template: no watch event ever comes, and no rebuild
        # runs either; the reader drops the expired entry itself.
        clock.now += 31
        assert (await h.deploy("llm-a100"))["allowed"] is True
        assert len(h.rb.overlay) == 0 and h.rb.overlay.expired == 1

    await _with_client(h, body)


async def test_view_built_before_an_admission_is_laid_over_again(tmp_path: Path) -> None:
    clock = Clock()
    h = _harness(tmp_path, clock)

    async def body() -> None:
        stale = h.rb.build()  # the rebuild thread finished this view ...
        assert (await h.dra(template("llm-a100", A100)))["allowed"] is True
        h.wh.publish_view(h.rb.current(stale))  # ... and it reaches the loop after the admission
        assert (await h.deploy("llm-a100"))["allowed"] is False

    await _with_client(h, body)


async def test_entry_confirmed_before_the_rebuild_stays_visible(tmp_path: Path) -> None:
    clock = Clock()
    h = _harness(tmp_path, clock)

    async def body() -> None:
        a = template("llm-a100", A100)
        assert (await h.dra(a))["allowed"] is True
        # The watch stores and reports the template; the rebuild from the stores has not run yet
        # when the next admitted object is laid over the (older) watched view.
        h.watch_delivers("resourceclaimtemplates", a)
        assert len(h.rb.overlay) == 0
        assert (await h.dra(template("other", H100)))["allowed"] is True
        assert (await h.deploy("llm-a100"))["allowed"] is False
        # Once a view is built from stores that hold it, the confirmation is let go.
        h.rebuild()
        assert h.rb.overlay.snapshot(after=0, scope=ALICE)[1].get("resourceclaimtemplates", {}).keys() == {
            ("team-a", "other")
        }
        assert (await h.deploy("llm-a100"))["allowed"] is False

    await _with_client(h, body)


async def test_admitted_claims_count_toward_quota(tmp_path: Path) -> None:
    clock = Clock()
    h = _harness(tmp_path, clock, quota=True)  # team-a may hold 1 A100

    async def body() -> None:
        memo = h.wh.snapshot.inventory._memo
        first = await h.dra(claim("c1", A100))
        assert first["allowed"] is True
        # The claim is layered in for its sender; devices and classes are unchanged, so the
        # engine's memo is kept. The view everyone else reads does not have it.
        view = h.rb.view_for(ALICE)
        assert view is not None and ("team-a", "c1") in view.inventory.claims
        assert view.inventory._memo is memo
        assert view.usage is not None and view.usage.devices[("team-a", A100)] == 1
        assert ("team-a", "c1") not in h.wh.snapshot.inventory.claims
        second = await h.dra(claim("c2", A100))
        assert second["allowed"] is False and "[quota/budgets]" in second["status"]["message"]
        # The watch delivers c1: its usage is now counted from the cache, not twice.
        h.watch_delivers("resourceclaims", claim("c1", A100))
        h.rebuild()
        assert h.wh.snapshot.usage is not None
        assert h.wh.snapshot.usage.devices[("team-a", A100)] == 1

    await _with_client(h, body)


async def test_admitted_device_class_is_known_to_the_next_claim(tmp_path: Path) -> None:
    clock = Clock()
    h = _harness(tmp_path, clock)

    async def body() -> None:
        cls = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com-any", "uid": str(uuid.uuid4())},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
        }
        assert "gpu.nvidia.com-any" not in h.wh.snapshot.inventory.classes
        assert (await h.validate(cls, "resource.k8s.io", "v1", "DeviceClass"))["allowed"] is True
        view = h.rb.view_for(ALICE)
        assert view is not None and "gpu.nvidia.com-any" in view.inventory.classes
        assert len(view.inventory.devices) == len(h.rb.base_view.inventory.devices)
        assert "gpu.nvidia.com-any" not in h.wh.snapshot.inventory.classes

    await _with_client(h, body)


async def test_denied_objects_are_not_recorded(tmp_path: Path) -> None:
    clock = Clock()
    h = _harness(tmp_path, clock, quota=True)

    async def body() -> None:
        big = claim("big", A100)
        big["spec"]["devices"]["requests"][0]["exactly"]["count"] = 5
        assert (await h.dra(big))["allowed"] is False
        assert len(h.rb.overlay) == 0 and ("team-a", "big") not in h.wh.snapshot.inventory.claims

    await _with_client(h, body)


async def test_a_namespace_review_never_changes_namespace_labels(tmp_path: Path) -> None:
    # The API server never sends Namespaces to draguard's webhooks, so such a review is forged:
    # it must not switch a namespace's migration mode (here: warn -> enforce) for anyone.
    clock = Clock()
    h = _harness(tmp_path, clock)

    async def body() -> None:
        pod = workload("Pod", legacy_pod_spec())
        pod["metadata"]["namespace"] = "fresh"
        before = await h.validate(pod, "", "v1", "Pod", namespace="fresh")
        assert before["allowed"] is True  # the policy's default mode: warn
        ns = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "fresh", "labels": {"draguard.io/migration-mode": "enforce"}},
        }
        assert (await h.validate(ns, "", "v1", "Namespace", namespace=""))["allowed"] is True
        assert "fresh" not in h.wh.snapshot.namespace_labels
        assert len(h.rb.overlay) == 0 and h.rb.view_for(ALICE) is None
        after = await h.validate(pod, "", "v1", "Pod", namespace="fresh")
        assert after["allowed"] is True

    await _with_client(h, body)


# --- forged reviews ---------------------------------------------------------------------------------


async def test_a_forged_claim_does_not_charge_anyone_elses_budget(tmp_path: Path) -> None:
    clock = Clock()
    h = _harness(tmp_path, clock, quota=True)  # team-a may hold 1 A100

    async def body() -> None:
        # Anyone who can reach the port can send this; it names team-a and fills its budget.
        assert (await h.dra(claim("phantom", A100), user="mallory"))["allowed"] is True
        assert len(h.rb.overlay) == 1
        # team-a's real user is unaffected ...
        assert (await h.dra(claim("real", A100)))["allowed"] is True
        # ... while the forger's own next answer reflects what it sent.
        again = await h.dra(claim("second", A100), user="mallory")
        assert again["allowed"] is False and "[quota/budgets]" in again["status"]["message"]

    await _with_client(h, body)


async def test_a_forged_device_class_or_template_is_seen_only_by_its_sender(tmp_path: Path) -> None:
    clock = Clock()
    h = _harness(tmp_path, clock)

    async def body() -> None:
        assert (await h.dra(template("llm-a100", A100), user="mallory"))["allowed"] is True
        # alice's Deployment names a template that does not exist: judged without it, as before.
        assert (await h.deploy("llm-a100"))["allowed"] is True
        cls = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com-h100"},  # replaces a real class, in mallory's view
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
        }
        assert (await h.validate(cls, "resource.k8s.io", "v1", "DeviceClass", user="mallory"))["allowed"]
        assert h.rb.view_for(ALICE) is None
        assert h.wh.snapshot.inventory.classes["gpu.nvidia.com-h100"] is (
            h.rb.base_view.inventory.classes["gpu.nvidia.com-h100"]
        )

    await _with_client(h, body)


def test_entries_keep_only_what_verdicts_read_and_are_bounded_by_bytes() -> None:
    clock = Clock()
    ov = AdmittedOverlay(clock=clock, max_bytes=400_000, max_scope_bytes=200_000)
    fat = template("fat", A100)
    fat["metadata"]["annotations"] = {"note": "x" * 40_000}
    fat["metadata"]["labels"] = {"a": "b"}
    fat["status"] = {"junk": "y" * 40_000}
    assert ov.record(fat, "CREATE", "s1")
    kept = ov.live("s1")["resourceclaimtemplates"][("team-a", "fat")]
    assert set(kept.obj["metadata"]) == {"name", "namespace", "uid"} and "status" not in kept.obj
    assert kept.size < 4_000
    # An object over the per-entry limit is not recorded at all (the watch brings it).
    huge = template("huge", A100)
    huge["spec"]["spec"]["devices"]["requests"][0]["exactly"]["pad"] = "z" * 200_000
    assert not ov.record(huge, "CREATE", "s1") and ov.refused == 1
    # Per identity: its own oldest entries go first; others' stay.
    mid = 40_000
    for i in range(12):
        t = template(f"t{i}", A100)
        t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["pad"] = "z" * mid
        assert ov.record(t, "CREATE", "s2")
    assert ov.bytes <= 400_000
    assert sum(e.size for e in ov.live("s2")["resourceclaimtemplates"].values()) <= 200_000
    assert ("team-a", "fat") in ov.live("s1")["resourceclaimtemplates"]
    assert ov.evicted > 0


async def test_a_forged_namespace_cannot_make_mutate_create_templates(tmp_path: Path) -> None:
    from tests.server.conftest import RecordingCreator

    clock = Clock()
    h = _harness(tmp_path, clock)
    creator = RecordingCreator()
    h.wh.creator = creator

    async def body() -> None:
        ns = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "team-a", "labels": {"draguard.io/migration-mode": "migrate"}},
        }
        assert (await h.validate(ns, "", "v1", "Namespace", namespace=""))["allowed"] is True
        assert h.client is not None
        pod = workload("Pod", legacy_pod_spec())
        r = await h.client.post("/mutate", json=review(pod, uid=str(uuid.uuid4())))
        resp = (await r.json())["response"]
        # team-a is in warn mode as far as the watch knows: no patch, nothing created.
        assert "patch" not in resp and creator.made == []

    await _with_client(h, body)
