"""Pods that run: the real node's kubelet, containerd, CNI bridge and kube-proxy, with simulated GPUs.

What a container of a claim sees is read from inside it (kubectl exec), and compared with what the
scheduler allocated and the driver published. Network checks stay on this machine: the Service range
is routed nowhere but to kube-proxy's rules, so an address without endpoints must fail right here.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable

from tests.e2e.helpers import (
    Kubectl,
    cdi_specs_for,
    claim_uid,
    exec_in,
    published_devices,
    running_pod,
    start_claim_pod,
    wait_for,
)
from webhook.dev import network, scenarios
from webhook.dev.cluster import LocalCluster


def test_node_is_ready_with_gpu_labels_and_no_taint(kubectl: Kubectl, real_node: str) -> None:
    node = kubectl.get("node", real_node)
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True"
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("node.kubernetes.io/")]
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["draguard.io/gpu-product"] == "a100"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    [internal] = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    assert not internal.startswith("127.")


def test_migrated_legacy_pod_runs_and_sees_exactly_its_gpus(
    cluster: LocalCluster,
    kubectl: Kubectl,
    namespace: Callable[..., str],
    real_node: str,
    workload_image: str,
) -> None:
    ns = namespace("run-legacy", scenarios.MIGRATE_LABELS)
    pod_yaml = scenarios.legacy_pod(ns, image=workload_image, node=real_node, command=scenarios.SHOW_GPUS)

    def rewritten_in_dry_run() -> bool:
        out = kubectl.run("apply", "--dry-run=server", "-o", "json", "-f", "-", input=pod_yaml)
        return out.returncode == 0 and '"resourceClaimTemplateName"' in out.stdout

    wait_for(rewritten_in_dry_run, "the webhook to see the new namespace's migrate label", timeout=20)
    applied = kubectl.apply(pod_yaml)
    assert applied.returncode == 0, applied.stderr
    pod = running_pod(kubectl, ns, "gpu-training-legacy")
    assert pod["spec"]["nodeName"] == real_node
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    results = kubectl.get("resourceclaim", claim_name, ns)["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2
    published = published_devices(kubectl, real_node)
    uuids = {published[r["device"]]["attributes"]["uuid"]["string"] for r in results}
    minors = {int(r["device"].removeprefix("gpu-")) for r in results}

    env = exec_in(kubectl, ns, "gpu-training-legacy", "printenv NVIDIA_VISIBLE_DEVICES")
    assert set(env.strip().split(",")) == uuids
    devs = exec_in(kubectl, ns, "gpu-training-legacy", "ls -1 /dev").split()
    gpu_nodes = {d for d in devs if d.removeprefix("nvidia").isdigit()}
    assert gpu_nodes == {f"nvidia{m}" for m in minors}, devs
    kinds = exec_in(
        kubectl, ns, "gpu-training-legacy", "for d in /dev/nvidia*; do stat -c '%n %F %t:%T' $d; done"
    )
    for line in kinds.strip().splitlines():
        assert "character special file" in line, kinds

    # Whatever else the driver's CDI spec for this claim mounts is there, with the host's content.
    [spec_file] = cdi_specs_for(cluster, claim_uid(kubectl, ns, claim_name))
    spec = json.loads(spec_file.read_text())
    mounts = [m for d in spec["devices"] for m in d["containerEdits"].get("mounts") or []]
    mounts += spec.get("containerEdits", {}).get("mounts") or []
    for m in mounts:
        out = exec_in(kubectl, ns, "gpu-training-legacy", f"test -e {m['containerPath']} && echo present")
        assert out.strip() == "present", m

    logs = kubectl.ok("logs", "-n", ns, "gpu-training-legacy")
    assert f"NVIDIA_VISIBLE_DEVICES={env.strip()}" in logs


def test_deleting_the_pod_unprepares_its_devices(
    cluster: LocalCluster,
    kubectl: Kubectl,
    namespace: Callable[..., str],
    real_node: str,
    workload_image: str,
) -> None:
    ns = namespace("run-delete")
    start_claim_pod(kubectl, ns, "a100-pod", scenarios.A100, 1, workload_image, real_node)
    uid = claim_uid(kubectl, ns, "a100-pod-gpu")
    assert cdi_specs_for(cluster, uid)
    kubectl.ok("delete", "pod", "-n", ns, "a100-pod", "--wait=true", "--timeout=60s")
    wait_for(lambda: not cdi_specs_for(cluster, uid), "the claim's CDI spec removed")


def test_pods_reach_the_api_server_through_the_kubernetes_service(
    kubectl: Kubectl, namespace: Callable[..., str], real_node: str, workload_image: str
) -> None:
    ns = namespace("run-incluster")
    applied = kubectl.apply(scenarios.shell_pod(ns, "client", workload_image, real_node))
    assert applied.returncode == 0, applied.stderr
    running_pod(kubectl, ns, "client")
    # In-cluster config as every client library reads it: the Service's env vars, token and CA.
    script = (
        "import json, os, ssl, urllib.request\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount'\n"
        "env = os.environ\n"
        "url = f\"https://{env['KUBERNETES_SERVICE_HOST']}:{env['KUBERNETES_SERVICE_PORT']}\"\n"
        "ns = open(sa + '/namespace').read()\n"
        "req = urllib.request.Request(f'{url}/api/v1/namespaces/{ns}/pods',\n"
        "    headers={'Authorization': 'Bearer ' + open(sa + '/token').read()})\n"
        "ctx = ssl.create_default_context(cafile=sa + '/ca.crt')\n"
        "try:\n"
        "    urllib.request.urlopen(req, context=ctx, timeout=10)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print('HTTP', e.code)\n"
    )
    out = kubectl.ok("exec", "-n", ns, "client", "--", "python3", "-c", script)
    # The default ServiceAccount may not list pods: the API server answered, authenticated, and said no.
    assert out.strip() == "HTTP 403", out


def test_cluster_ip_without_endpoints_fails_locally(
    cluster: LocalCluster,
    kubectl: Kubectl,
    namespace: Callable[..., str],
    real_node: str,
    workload_image: str,
) -> None:
    ns = namespace("run-noendpoints")
    svc = f"""\
apiVersion: v1
kind: Service
metadata:
  name: nothing-behind
  namespace: {ns}
spec:
  selector: {{app: does-not-exist}}
  ports:
  - port: 80
"""
    assert kubectl.apply(svc).returncode == 0
    assert kubectl.apply(scenarios.shell_pod(ns, "client", workload_image, real_node)).returncode == 0
    running_pod(kubectl, ns, "client")
    ip = kubectl.get("service", "nothing-behind", ns)["spec"]["clusterIP"]
    net = cluster.net
    assert net is not None
    unused = net.service_cidr.rsplit(".", 1)[0] + ".254"
    probe = (
        "import socket, sys, time\n"
        "for addr in sys.argv[1:]:\n"
        "    t = time.monotonic(); s = socket.socket(); s.settimeout(5)\n"
        "    try:\n"
        "        s.connect((addr, 80)); print(addr, 'connected')\n"
        "    except OSError as e:\n"
        "        print(addr, type(e).__name__, round(time.monotonic() - t, 2))\n"
    )

    out = kubectl.ok("exec", "-n", ns, "client", "--", "python3", "-c", probe, ip, unused)
    lines = dict((ln.split(" ", 1)[0], ln) for ln in out.strip().splitlines())
    # The Service's address (no endpoints, so kube-proxy translates nothing) and an unallocated one
    # in the Service range both fail at once in the node's namespace: nothing was sent anywhere.
    for addr in (ip, unused):
        assert "connected" not in lines[addr] and "timeout" not in lines[addr], out
        assert lines[addr].split()[1] in ("OSError", "ConnectionRefusedError"), out
        assert float(lines[addr].rsplit(" ", 1)[1]) < 2.0, out
    # And nothing else can leave: the node's namespace has no default route.
    routes = network.ns_run(net, "ip", "-4", "route", "show")
    assert "default" not in routes, routes

    # From the host (where the API server runs) the Service range is unreachable too.
    t = time.monotonic()
    with socket.socket() as s:
        s.settimeout(5)
        err = s.connect_ex((ip, 80))
    assert err != 0 and time.monotonic() - t < 2.0


def test_dev_status_shows_each_node_component(cluster: LocalCluster, real_node: str) -> None:
    st = subprocess.run(
        cluster.draguard_argv("dev", "status", "--state-dir", str(cluster.paths.root), "-o", "json"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    for name in ("etcd", "kube-apiserver", "containerd", "kubelet", "kube-proxy", f"driver-{real_node}"):
        assert status["components"][name]["alive"], name
    assert status["real_node"]["name"] == real_node
    assert status["real_node"]["netns_present"]


def test_service_with_endpoints_reaches_its_pod(
    kubectl: Kubectl, namespace: Callable[..., str], real_node: str, workload_image: str
) -> None:
    ns = namespace("run-service")
    server = scenarios.shell_pod(ns, "web", workload_image, real_node).replace(
        "exec sleep 3600", "cd /tmp && echo served-by-web > index.html && exec python3 -m http.server 8080"
    )
    server = server.replace("  name: web\n", "  name: web\n  labels: {app: web}\n", 1)
    svc = f"""\
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: {ns}
spec:
  selector: {{app: web}}
  ports:
  - port: 80
    targetPort: 8080
"""
    assert kubectl.apply(server + "---\n" + svc).returncode == 0
    assert kubectl.apply(scenarios.shell_pod(ns, "client", workload_image, real_node)).returncode == 0
    running_pod(kubectl, ns, "web")
    running_pod(kubectl, ns, "client")
    ip = kubectl.get("service", "web", ns)["spec"]["clusterIP"]
    get = f"import urllib.request as u; print(u.urlopen('http://{ip}/index.html', timeout=5).read().decode())"

    def served() -> str | None:
        proc = kubectl.run("exec", "-n", ns, "client", "--", "python3", "-c", get)
        # kube-proxy writes the Service's rules once the web pod's endpoint is ready.
        return proc.stdout if proc.returncode == 0 else None

    assert (
        wait_for(served, "the Service to reach its pod through kube-proxy", timeout=30).strip()
        == "served-by-web"
    )
