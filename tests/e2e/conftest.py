"""One real local cluster per test session: control plane, one real node (kubelet, containerd,
kube-proxy, CNI bridge, simulated GPUs) and simulated kubelet-less nodes for the scheduler's choices.

Binaries come from scripts/build-k8s.sh and scripts/build-node.sh, images from webhook.dev.image.
Without them the e2e tests skip with a one-line reason, except under CI=true where a missing
prerequisite is a failure. Without root or the node's parts (outside CI) the cluster starts without
the real node and the tests that need running pods skip. When a test fails, the tail of every
component's log is attached to its report.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import Kubectl
from webhook.dev.cluster import ClusterError, LocalCluster, find_bin_dir, wait_until
from webhook.dev.node import NodeImages, RealNode, real_node_prerequisites

E2E_DIR = Path(__file__).parent
_CLUSTER: list[LocalCluster] = []
_NO_REAL_NODE: list[str] = []
_IMAGES: list[NodeImages] = []
_PREREQ: list[NodeImages | ClusterError] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        # test_harness.py and test_node_parts.py check the harness without binaries and run everywhere.
        if E2E_DIR in path.parents and path.name not in ("test_harness.py", "test_node_parts.py"):
            item.add_marker(pytest.mark.e2e)


def _node_images() -> NodeImages | ClusterError:
    """The real node's images (built once per session if their recipe or sources changed)."""
    if not _PREREQ:
        try:
            _PREREQ.append(real_node_prerequisites(lambda m: print(f"e2e: {m}", file=sys.stderr, flush=True)))
        except ClusterError as exc:
            _PREREQ.append(exc)
    return _PREREQ[0]


def pytest_collection_finish(session: pytest.Session) -> None:
    # Outside any test's time limit: building the draguard image takes minutes on a fresh machine.
    if any("cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        _node_images()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.failed and _CLUSTER and E2E_DIR in Path(str(item.fspath)).parents:
        rep.sections.append(("local cluster component logs", _CLUSTER[0].all_logs(lines=40)))


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"e2e: {reason}", pytrace=False)
    pytest.skip(f"e2e: {reason}")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The session's cluster: simulated GPU nodes, drivers and the webhook when their modules exist."""
    try:
        bin_dir = find_bin_dir()
    except ClusterError as exc:
        _unavailable(str(exc).splitlines()[0])
        raise  # unreachable: skip/fail raise
    lines: list[str] = []
    images = _node_images()
    if isinstance(images, ClusterError):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"e2e: the real node cannot start: {images}", pytrace=False)
        _NO_REAL_NODE.append(str(images).splitlines()[0])
        images = None
    c = LocalCluster(tmp_path_factory.mktemp("dev"), bin_dir, progress=lines.append, tie_to_parent=True)
    try:
        if images is None:
            c.up()
        else:
            c.up(
                real_node=RealNode(),
                images=images.archives,
                sandbox_image=images.sandbox,
                workload_image=images.workload,
            )
            _IMAGES.append(images)
    except ClusterError as exc:
        pytest.fail(f"local cluster did not start: {exc}\n" + "\n".join(lines), pytrace=False)
    _CLUSTER.append(c)
    try:
        yield c
    finally:
        _CLUSTER.clear()
        c.down()


@pytest.fixture(scope="session")
def kubectl(cluster: LocalCluster) -> Kubectl:
    return Kubectl(cluster)


@pytest.fixture(scope="session")
def real_node(cluster: LocalCluster) -> str:
    """The name of the session cluster's node with a kubelet (skips without one, outside CI)."""
    if cluster.real_node is None:
        _unavailable(f"no real node: {_NO_REAL_NODE[0] if _NO_REAL_NODE else 'not started'}")
    assert cluster.real_node is not None
    return cluster.real_node


@pytest.fixture(scope="session")
def workload_image(real_node: str) -> str:
    """An image imported into the real node's containerd that has a shell and Python."""
    return _IMAGES[0].workload


@pytest.fixture(scope="session")
def node_archives(real_node: str) -> list[Path]:
    """The image archives imported into the real node's containerd (for a node added later)."""
    return list(_IMAGES[0].archives)


@pytest.fixture(scope="module")
def device_plugin_node(cluster: LocalCluster, node_archives: list[Path]) -> Iterator[str]:
    """A second real node whose GPUs come from the simulated NVIDIA device plugin (`nvidia.com/gpu`,
    4 A100s) and where draguard's DRA driver does not run; tainted `realnodes.DEVICE_PLUGIN_TAINT`.
    Started for the module that asks for it (a second kubelet and containerd are heavy) and removed
    after it."""
    name = "gpu-legacy-0"
    try:
        added = cluster.add_node(name, images=node_archives)
    except ClusterError as exc:
        pytest.fail(f"the device-plugin node did not start: {exc}", pytrace=False)
    print(f"e2e: node {name} added in {added.took:.1f}s", file=sys.stderr)
    try:
        yield name
    finally:
        t0 = time.monotonic()
        cluster.remove_node(name)
        print(f"e2e: node {name} removed in {time.monotonic() - t0:.1f}s", file=sys.stderr)


@pytest.fixture(scope="module")
def h100_real_node(cluster: LocalCluster, real_node: str) -> Iterator[str]:
    """The real node with 8 simulated H100s (its driver restarted on h100-8x-nvlink) for the module;
    its own A100s are published again afterwards, so later tests see the node as it was."""
    kube = cluster.kube()
    slices = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D{real_node}"

    def products() -> set[str]:
        items = kube.get(slices).get("items") or []
        return {
            str(d.get("attributes", {}).get("productName", {}).get("string", ""))
            for s in items
            for d in s["spec"].get("devices") or []
        }

    def restart(topology: str | None, product: str) -> None:
        cluster.stop(f"driver-{real_node}")
        cluster.start_real_node_driver(topology=topology)
        wait_until(lambda: {p.split(" ")[1] for p in products() if " " in p} == {product}, 60,
                   f"{real_node}'s ResourceSlices to list only {product} GPUs")  # fmt: skip

    restart("h100-8x-nvlink.yaml", "H100")
    try:
        yield real_node
    finally:
        restart(None, "A100")


@pytest.fixture
def namespace(cluster: LocalCluster, kubectl: Kubectl) -> Iterator[Callable[..., str]]:
    """Factory: a fresh namespace with the given labels, deleted (without waiting) after the test."""
    made: list[str] = []

    def make(prefix: str = "e2e", labels: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        cluster.kube().create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}},
        )
        made.append(name)
        cluster.wait_default_sa(name)
        return name

    yield make
    for name in made:
        # Pods on simulated nodes have no kubelet to confirm shutdown, so pods are force-deleted;
        # their claims are then released and the GPUs are free for the next test (the real node's
        # kubelet still stops its containers and unprepares their devices).
        kubectl.run("delete", "pods", "--all", "-n", name, "--force", "--grace-period=0")
        kubectl.run("delete", "namespace", name, "--wait=false")
