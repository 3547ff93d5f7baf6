"""The ValidatingAdmissionPolicy that keeps the driver's service account to its own node's ResourceSlices.

The policy's CEL (matchConditions, variables, validations, messageExpressions) is compiled with
cel_expr_python and evaluated the way the API server does it: matchConditions first (all must hold
for the policy to apply), then the variables in order, then every validation. Request shapes follow
admission.k8s.io/v1 AdmissionRequest as JSON: `userInfo.extra` and `subResource` are omitted when
empty, and `object` is null for DELETE, `oldObject` null for CREATE.
"""

from __future__ import annotations

from typing import Any

import pytest
from kbundle import KUSTOMIZE as REPO_KUSTOMIZE
from kbundle import OVERLAYS, build, find, one

cel = pytest.importorskip("cel_expr_python.cel")

D = cel.Type.DYN
ENV = cel.NewEnv(variables={"object": D, "oldObject": D, "request": D, "variables": D})
POLICY = "draguard-driver-node-slices"
DRIVER_USER = "system:serviceaccount:draguard-driver:draguard-driver"
NODE_KEY = "authentication.kubernetes.io/node-name"


def _policy() -> dict[str, Any]:
    return one(build("base"), "ValidatingAdmissionPolicy", POLICY)


def _value(expr: str, data: dict[str, Any]) -> Any:
    v = ENV.compile(expr).eval(data=data)
    return v.value()


def admit(
    operation: str,
    *,
    user: str = DRIVER_USER,
    node: str | None = "node-a",
    extra: dict[str, list[str]] | None = None,
    new: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
    resource: tuple[str, str] = ("resource.k8s.io", "resourceslices"),
    sub: str = "",
) -> tuple[bool, str]:
    """(allowed, message) for one request, evaluated as the API server evaluates the policy."""
    spec = _policy()["spec"]
    user_info: dict[str, Any] = {"username": user, "uid": "u-1", "groups": ["system:serviceaccounts"]}
    if extra is not None:
        user_info["extra"] = extra
    elif node is not None:
        user_info["extra"] = {NODE_KEY: [node], "authentication.kubernetes.io/pod-name": ["drv-x"]}
    request: dict[str, Any] = {
        "operation": operation,
        "userInfo": user_info,
        "resource": {"group": resource[0], "version": "v1", "resource": resource[1]},
    }
    if sub:
        request["subResource"] = sub
    data: dict[str, Any] = {"object": new, "oldObject": old, "request": request, "variables": {}}
    for cond in spec.get("matchConditions", []):
        got = _value(cond["expression"], data)
        assert isinstance(got, bool), (cond, got)
        if not got:
            return True, "policy does not apply"
    variables: dict[str, Any] = {}
    for var in spec.get("variables", []):
        variables[var["name"]] = _value(var["expression"], {**data, "variables": variables})
    data["variables"] = variables
    for v in spec["validations"]:
        ok = _value(v["expression"], data)
        assert isinstance(ok, bool), (v["expression"], ok)
        if not ok:
            msg = _value(v["messageExpression"], data) if "messageExpression" in v else v["message"]
            assert isinstance(msg, str) and msg, v
            return False, msg
    return True, ""


def slice_for(node: str | None, name: str = "s") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "pool": {"name": node or "all", "generation": 1, "resourceSliceCount": 1},
    }
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_bundle_has_the_policy_and_its_binding_in_every_overlay() -> None:
    for overlay in ("base", *OVERLAYS):
        objs = build(overlay)
        pol = one(objs, "ValidatingAdmissionPolicy", POLICY)
        assert pol["apiVersion"] == "admissionregistration.k8s.io/v1"
        (binding,) = [
            b for b in find(objs, "ValidatingAdmissionPolicyBinding") if b["spec"]["policyName"] == POLICY
        ]
        assert binding["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert pol["spec"].get("failurePolicy", "Fail") == "Fail"


def test_every_expression_compiles() -> None:
    spec = _policy()["spec"]
    exprs = [c["expression"] for c in spec["matchConditions"]]
    exprs += [v["expression"] for v in spec["variables"]]
    exprs += [v["expression"] for v in spec["validations"]]
    exprs += [v["messageExpression"] for v in spec["validations"] if "messageExpression" in v]
    for e in exprs:
        ENV.compile(e)  # raises on a syntax or type error


def test_driver_may_write_its_own_nodes_slices() -> None:
    own = slice_for("node-a")
    assert admit("CREATE", new=own) == (True, "")
    assert admit("UPDATE", new=own, old=own) == (True, "")
    assert admit("DELETE", old=own) == (True, "")


def node_event(node: str, kind: str = "Node") -> dict[str, Any]:
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "reason": "ConflictingGPUDriver",
            "regarding": {"apiVersion": "v1", "kind": kind, "name": node}}  # fmt: skip


def test_driver_may_create_events_only_about_its_own_node() -> None:
    ev = ("events.k8s.io", "events")
    assert admit("CREATE", resource=ev, new=node_event("node-a")) == (True, "")
    for label, op, new, old in (
        ("another node", "CREATE", node_event("node-b"), None),
        ("not a node", "CREATE", node_event("node-a", kind="Pod"), None),
        ("an update", "UPDATE", node_event("node-a"), node_event("node-a")),
        ("a delete", "DELETE", None, node_event("node-a")),
    ):
        allowed, msg = admit(op, resource=ev, new=new, old=old)
        assert not allowed, label
        assert msg.startswith("the draguard driver may change only ResourceSlices, not events"), msg
    allowed, _msg = admit("CREATE", resource=("", "events"), new=node_event("node-a"))
    assert not allowed  # only the events.k8s.io form, which names the node in `regarding`
    allowed, _msg = admit("CREATE", resource=ev, node=None, extra={}, new=node_event("node-a"))
    assert not allowed  # a token not bound to a node names no node of its own


@pytest.mark.parametrize(
    ("label", "op", "new", "old"),
    [
        ("create for another node", "CREATE", slice_for("node-b"), None),
        ("update another node's slice", "UPDATE", slice_for("node-b"), slice_for("node-b")),
        ("take over another node's slice", "UPDATE", slice_for("node-a"), slice_for("node-b")),
        ("hand its slice to another node", "UPDATE", slice_for("node-b"), slice_for("node-a")),
        ("delete another node's slice", "DELETE", None, slice_for("node-b")),
        ("create a cluster-wide slice", "CREATE", slice_for(None), None),
        ("delete a cluster-wide slice", "DELETE", None, slice_for(None)),
    ],
)
def test_driver_may_not_write_other_slices(
    label: str, op: str, new: dict[str, Any] | None, old: dict[str, Any] | None
) -> None:
    allowed, msg = admit(op, new=new, old=old)
    assert not allowed, label
    assert msg == (
        "the draguard driver on node node-a may change only ResourceSlices whose spec.nodeName is node-a"
    )


@pytest.mark.parametrize(
    "extra",
    [
        None,  # a legacy secret-based token, or `kubectl create token` without a pod: no extra at all
        {"authentication.kubernetes.io/pod-name": ["drv-x"]},  # pod-bound, API server without node info
        {NODE_KEY: []},
        {NODE_KEY: ["node-a", "node-b"]},
    ],
)
def test_token_not_bound_to_one_node_is_refused(extra: dict[str, list[str]] | None) -> None:
    allowed, msg = admit("CREATE", node=None, extra=extra, new=slice_for("node-a"))
    assert not allowed
    assert "bound to a pod on a node" in msg


@pytest.mark.parametrize(
    ("resource", "sub"),
    [
        (("", "secrets"), ""),
        (("", "nodes"), "status"),
        (("resource.k8s.io", "resourceclaims"), "status"),
        (("resource.k8s.io", "resourceslices"), "status"),
        (("", "pods"), "exec"),
    ],
)
def test_driver_may_touch_nothing_else(resource: tuple[str, str], sub: str) -> None:
    allowed, msg = admit("UPDATE", resource=resource, sub=sub, new={"kind": "X"}, old={"kind": "X"})
    assert not allowed
    assert msg.startswith("the draguard driver may change only ResourceSlices, not " + resource[1])


@pytest.mark.parametrize(
    "user",
    [
        "admin",
        "system:serviceaccount:kube-system:other-driver",
        "system:serviceaccount:ml:draguard-driver",
        "system:node:node-a",
    ],
)
def test_other_users_are_not_affected(user: str) -> None:
    assert admit("CREATE", user=user, node=None, new=slice_for("node-b")) == (True, "policy does not apply")
    assert admit("DELETE", user=user, node="node-a", old=slice_for("node-b"))[0]
    assert admit("CREATE", user=user, resource=("", "secrets"), new={"kind": "Secret"})[0]


# --- the same policy enforced by a real kube-apiserver, with real node-bound tokens ------------------

try:  # the module-scoped API server fixture (etcd + kube-apiserver); skips when they are not built
    from test_kustomize_apiserver import Api, api  # noqa: F401
except ImportError:  # pragma: no cover - the bundle tests always ship together
    Api = Any  # type: ignore[misc,assignment]


def _kubectl_as(api_: Any, token: str, *args: str, stdin: str | None = None) -> Any:
    import hashlib

    from kapi import Api, token_kubeconfig

    # Next to the admin's kubeconfig: removed with the API server's directory.
    path = api_.kubeconfig.parent / f"token-{hashlib.sha256(token.encode()).hexdigest()[:16]}.kubeconfig"
    if not path.exists():
        token_kubeconfig(api_, token, path)
    return Api(path).kubectl(*args, stdin=stdin)


def _replace_as(api_: Any, token: str, name: str) -> Any:
    """An update (PUT, as the driver sends it; it has no patch verb) of slice `name`, adding a label."""
    import json

    got = api_.kubectl("get", "resourceslice", name, "-o", "json")
    assert got.returncode == 0, got.stderr
    obj = json.loads(got.stdout)
    obj["metadata"].setdefault("labels", {})["touched"] = "yes"
    return _kubectl_as(api_, token, "replace", "-f", "-", stdin=json.dumps(obj))


def _yaml(obj: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(obj)


def _wait_until_policy_in_force(api_: Any, token: str, timeout: float = 120.0) -> None:
    """A ValidatingAdmissionPolicy applies a while after its creation: dry-run until it refuses."""
    import time

    deadline = time.monotonic() + timeout
    probe = _yaml(slice_for("node-b", "policy-probe"))
    while True:
        res = _kubectl_as(api_, token, "create", "--dry-run=server", "-f", "-", stdin=probe)
        if res.returncode != 0 and "spec.nodeName is node-a" in res.stderr:
            return
        assert time.monotonic() < deadline, f"slice policy not in force after {timeout} s: {res.stderr}"
        time.sleep(0.1)  # poll interval while waiting for the condition, not a guess at its timing


@pytest.mark.e2e
@pytest.mark.slow
def test_api_server_keeps_the_driver_to_its_own_nodes_slices(api: Any) -> None:
    installed = api.apply_kustomization(REPO_KUSTOMIZE / "overlays" / "eks")
    assert installed.returncode == 0, installed.stderr
    for node in ("node-a", "node-b"):
        node_obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
        assert api.kubectl("create", "-f", "-", stdin=_yaml(node_obj)).returncode == 0
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "drv", "namespace": "draguard-driver"},
        "spec": {
            "serviceAccountName": "draguard-driver",
            "automountServiceAccountToken": False,
            "nodeName": "node-a",
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }
    res = api.kubectl("create", "-f", "-", stdin=_yaml(pod))
    assert res.returncode == 0, res.stderr
    # What kubelet mounts into the DaemonSet pod: a token bound to the pod, hence to node-a.
    tok = api.kubectl(
        "-n", "draguard-driver", "create", "token", "draguard-driver", "--bound-object-kind", "Pod",
        "--bound-object-name", "drv",
    )  # fmt: skip
    assert tok.returncode == 0, tok.stderr
    bound = tok.stdout.strip()
    loose = api.kubectl("-n", "draguard-driver", "create", "token", "draguard-driver").stdout.strip()
    assert loose
    _wait_until_policy_in_force(api, bound)

    # The admin (another user) may place a slice anywhere; the policy leaves it alone.
    res = api.kubectl("create", "-f", "-", stdin=_yaml(slice_for("node-b", "by-admin")))
    assert res.returncode == 0, res.stderr

    own = _kubectl_as(api, bound, "create", "-f", "-", stdin=_yaml(slice_for("node-a", "mine")))
    assert own.returncode == 0, own.stderr
    upd = _replace_as(api, bound, "mine")
    assert upd.returncode == 0, upd.stderr

    other = _kubectl_as(api, bound, "create", "-f", "-", stdin=_yaml(slice_for("node-b", "theirs")))
    assert other.returncode != 0
    assert "may change only ResourceSlices whose spec.nodeName is node-a" in other.stderr, other.stderr
    gone = _kubectl_as(api, bound, "delete", "resourceslice", "by-admin")
    assert gone.returncode != 0 and "spec.nodeName is node-a" in gone.stderr, gone.stderr
    touch = _replace_as(api, bound, "by-admin")
    assert touch.returncode != 0 and "spec.nodeName is node-a" in touch.stderr, touch.stderr

    unbound = _kubectl_as(api, loose, "create", "-f", "-", stdin=_yaml(slice_for("node-a", "loose")))
    assert unbound.returncode != 0 and "bound to a pod on a node" in unbound.stderr, unbound.stderr

    mine_gone = _kubectl_as(api, bound, "delete", "resourceslice", "mine")
    assert mine_gone.returncode == 0, mine_gone.stderr
    assert api.kubectl("get", "resourceslice", "by-admin").returncode == 0

    # Events: only about its own node (how the driver reports another GPU driver there).
    def event(node: str, name: str) -> dict[str, Any]:
        return {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": name, "namespace": "default"},
                "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "draguard.io/driver",
                "reportingInstance": "draguard-driver-x", "action": "Refuse",
                "reason": "ConflictingGPUDriver", "type": "Warning",
                "regarding": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip

    own_ev = _kubectl_as(api, bound, "create", "-f", "-", stdin=_yaml(event("node-a", "ev-own")))
    assert own_ev.returncode == 0, own_ev.stderr
    other_ev = _kubectl_as(api, bound, "create", "-f", "-", stdin=_yaml(event("node-b", "ev-other")))
    assert other_ev.returncode != 0 and "may change only ResourceSlices, not events" in other_ev.stderr
