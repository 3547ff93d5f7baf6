"""A fixed corpus of objects and the verdicts the engine gives them, for the golden-verdict test.

The corpus: the seed fixtures, the workload-kind fixtures, the examples, the policy suites' inputs,
the demo scenarios' manifests, the rejected claim shapes, and objects drawn by a seeded generator
(pods, workloads, claims, templates and DeviceClasses in many shapes). Each object goes through
`admission.review` for both endpoints under two snapshots (shipped policies; a larger policy set
with namespace labels, usage, exceptions and only v1 served), and each policy suite case through
`evaluate`. Everything a user sees is recorded: responses (patches included), verdicts, findings
with their patches and generated objects.

    .venv/bin/python tests/engine/golden_corpus.py --write   # regenerate the golden file
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import inspect
import json
import random
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from webhook.core.findings import Finding  # noqa: E402
from webhook.dra.inventory import Inventory  # noqa: E402
from webhook.engine.context import QuotaUsage  # noqa: E402
from webhook.policy.load import load_policies, parse_policy_text  # noqa: E402
from webhook.server import admission  # noqa: E402

GOLDEN = Path(__file__).parent / "fixtures" / "golden-verdicts.json"
TODAY = dt.date(2026, 12, 1)
SEED = ROOT / "tests" / "fixtures" / "seed"


def _docs(path: Path) -> list[dict[str, Any]]:
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d.get("kind")]
    except yaml.YAMLError:
        return []


def _file_objects() -> Iterator[tuple[str, dict[str, Any]]]:
    globs = [
        ("tests/fixtures", "**/*.yaml"),
        ("examples", "**/*.yaml"),
        ("policies/tests", "**/*.yaml"),
    ]
    for base, pattern in globs:
        for path in sorted((ROOT / base).glob(pattern)):
            if path.name in ("suite.yaml", "cluster-inventory.yaml", "kustomization.yaml"):
                continue
            for i, d in enumerate(_docs(path)):
                if str(d.get("apiVersion", "")).startswith("policy.draguard.io"):
                    continue
                yield f"{path.relative_to(ROOT)}#{i}", d
    for path in sorted((ROOT / "policies" / "tests").glob("*/suite.yaml")):
        data = yaml.safe_load(path.read_text())
        for case in data.get("cases") or []:
            text = case.get("input")
            if isinstance(text, str):
                try:
                    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind")]
                except yaml.YAMLError:
                    continue
                for i, d in enumerate(docs):
                    yield f"{path.relative_to(ROOT)}[{case['name']}]#{i}", d
    shapes = json.loads((ROOT / "tests" / "engine" / "fixtures" / "claim-shapes.json").read_text())
    for i, shape in enumerate(shapes if isinstance(shapes, list) else shapes.get("shapes", [])):
        obj = shape.get("object") if isinstance(shape, Mapping) and "object" in shape else shape
        if isinstance(obj, dict) and obj.get("kind"):
            yield f"claim-shapes#{i}", obj


def _scenario_objects() -> Iterator[tuple[str, dict[str, Any]]]:
    from webhook.dev import scenarios

    for name, fn in sorted(vars(scenarios).items()):
        if name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != scenarios.__name__:
            continue
        params = list(inspect.signature(fn).parameters.values())
        if not params or params[0].name != "ns" or any(p.default is p.empty for p in params[1:]):
            continue
        try:
            text = fn("demo")
        except Exception:  # a helper that is not a manifest builder
            continue
        if not isinstance(text, str):
            continue
        try:
            docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind")]
        except yaml.YAMLError:
            continue
        for i, d in enumerate(docs):
            yield f"scenarios.{name}#{i}", d


# -- seeded generator ----------------------------------------------------------------------------

IMAGES = [
    "vllm/vllm-openai:v0.6.0",
    "nvcr.io/nim/meta/llama3-8b-instruct:1.0",
    "nvcr.io/nvidia/pytorch:24.01-py3",
    "quay.io/jupyter/pytorch-notebook:latest",
    "nvcr.io/nvidia/tritonserver:24.01-trtllm-python-py3",
    "ghcr.io/huggingface/text-generation-inference:2.0",
    "busybox:1.36",
    "example.com/team/app:1",
    "lmsysorg/sglang:latest",
    "nvcr.io/nvidia/nemo:24.01",
]
COMMANDS = [
    None,
    ["vllm", "serve", "meta-llama/Llama-3-8B"],
    ["torchrun", "--nproc_per_node=8", "train.py"],
    ["python3", "-m", "vllm.entrypoints.openai.api_server"],
    ["python", "-m", "torch.distributed.run", "x.py"],
    ["sleep", "infinity"],
    ["tritonserver", "--model-repository=/m"],
    ["bash", "-c", "deepspeed train.py"],
]
CLASSES = [
    "gpu.nvidia.com-a100",
    "gpu.nvidia.com-h100",
    "gpu.nvidia.com-a100-mig-3g20gb",
    "gpu.nvidia.com",
    "mig-1g10gb.nvidia.com",
    "no-such-class",
]
TEMPLATES = ["one-a100", "one-h100", "one-mig", "one-mig-1g10gb", "missing-template"]
NAMESPACES = ["ml", "ml-workloads", "team-a", "team-b", "default", "research", "kube-system", "prod"]
LEGACY = ["nvidia.com/gpu", "nvidia.com/mig-3g.20gb", "nvidia.com/mig-1g.5gb", "cpu", "nvidia.com/gpu.shared"]
SELECTORS = [
    "device.driver == 'gpu.nvidia.com'",
    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'",
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
    "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A100')",
    "device.attributes['gpu.nvidia.com'].architecture == 'Hopper' &&",
    "device.attributes['gpu.nvidia.com'].index < 4",
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
]


def _container(r: random.Random, i: int, claim_names: list[str]) -> dict[str, Any]:
    c: dict[str, Any] = {"name": r.choice(["main", "worker", "c", f"c{i}"]), "image": r.choice(IMAGES)}
    cmd = r.choice(COMMANDS)
    if cmd:
        c["command"] = cmd[:1]
        if len(cmd) > 1:
            c["args"] = cmd[1:]
    res: dict[str, Any] = {}
    if r.random() < 0.45:
        res["limits"] = {r.choice(LEGACY): r.choice([1, 2, "1", 8, 0])}
        if r.random() < 0.3:
            res["requests"] = dict(res["limits"])
    if claim_names and r.random() < 0.8:
        res["claims"] = [{"name": n} for n in r.sample(claim_names, r.randint(1, len(claim_names)))]
    if res:
        c["resources"] = res
    return c


def _pod_spec(r: random.Random) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    claims: list[dict[str, Any]] = []
    for j in range(r.choice([0, 0, 1, 1, 2])):
        pick = r.random()
        if pick < 0.6:
            claims.append({"name": f"gpu{j}", "resourceClaimTemplateName": r.choice(TEMPLATES)})
        else:
            claims.append({"name": f"gpu{j}", "resourceClaimName": f"claim-{r.randint(0, 3)}"})
    names = [c["name"] for c in claims]
    if r.random() < 0.1 and names:
        names.append("undeclared")
    spec["containers"] = [_container(r, i, names) for i in range(r.choice([1, 1, 2, 3]))]
    if r.random() < 0.15:
        spec["initContainers"] = [_container(r, 9, names)]
    if claims:
        spec["resourceClaims"] = claims
    if r.random() < 0.3:
        spec["nodeSelector"] = r.choice(
            [{"gpu-type": "h100"}, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, {"zone": "a"}]
        )
    return spec


def _labels(r: random.Random) -> dict[str, str]:
    out: dict[str, str] = {}
    if r.random() < 0.25:
        out["draguard.io/workload-class"] = r.choice(["llm", "training", "inference", "dev", "bogus"])
    if r.random() < 0.25:
        out["app"] = r.choice(["chat-llm", "web", "allminilm-embedder", "llm"])
    if r.random() < 0.3:
        out["draguard.io/migrate"] = "true"
    return out


def _workload(r: random.Random, n: int) -> dict[str, Any]:
    ns = r.choice(NAMESPACES)
    kind = r.choice(["Pod", "Pod", "Deployment", "Job", "StatefulSet", "CronJob", "DaemonSet", "PyTorchJob"])
    meta: dict[str, Any] = {"name": f"gen-{n}", "namespace": ns}
    labels = _labels(r)
    if labels:
        meta["labels"] = labels
    spec = _pod_spec(r)
    tmeta: dict[str, Any] = {"labels": _labels(r) or {"app": f"gen-{n}"}}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if kind == "PyTorchJob":
        return {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": meta,
            "spec": {
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": {"metadata": tmeta, "spec": spec}},
                    "Worker": {"replicas": r.randint(1, 4), "template": {"metadata": tmeta, "spec": spec}},
                }
            },
        }
    template = {"metadata": tmeta, "spec": spec}
    if kind == "CronJob":
        return {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": meta,
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}},
        }
    api = "batch/v1" if kind == "Job" else "apps/v1"
    body: dict[str, Any] = {"template": template}
    if kind in ("Deployment", "StatefulSet"):
        body["replicas"] = r.choice([1, 2, 4, 16])
    if kind == "Job":
        body["parallelism"] = r.choice([1, 3])
    return {"apiVersion": api, "kind": kind, "metadata": meta, "spec": body}


def _requests(r: random.Random, version: str) -> list[dict[str, Any]]:
    out = []
    for j in range(r.choice([1, 1, 2])):
        req: dict[str, Any] = {"name": f"r{j}" if r.random() < 0.95 else "Bad_Name"}
        inner: dict[str, Any] = {"deviceClassName": r.choice(CLASSES)}
        mode = r.random()
        if mode < 0.15:
            inner["allocationMode"] = "All"
        elif mode < 0.8:
            inner["count"] = r.choice([1, 2, 4, 9, -1])
        if r.random() < 0.4:
            inner["selectors"] = [{"cel": {"expression": r.choice(SELECTORS)}}]
        if r.random() < 0.1:
            inner["adminAccess"] = True
        if version == "v1beta1":
            req.update(inner)
        elif r.random() < 0.15:
            req["firstAvailable"] = [
                {"name": "a", **inner},
                {"name": "b", "deviceClassName": r.choice(CLASSES)},
            ]
        else:
            req["exactly"] = inner
        out.append(req)
    return out


def _claim(r: random.Random, n: int) -> dict[str, Any]:
    version = r.choice(["v1", "v1", "v1beta2", "v1beta1"])
    devices: dict[str, Any] = {"requests": _requests(r, version)}
    if r.random() < 0.2:
        devices["constraints"] = [
            {
                "requests": [q["name"] for q in devices["requests"]]
                + ([] if r.random() < 0.7 else ["ghost"]),
                "matchAttribute": "gpu.nvidia.com/nvlinkDomain",
            }
        ]
    if r.random() < 0.15:
        devices["config"] = [
            {
                "opaque": {
                    "driver": "gpu.nvidia.com",
                    "parameters": r.choice(
                        [
                            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"},
                            {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "Bogus"},
                            {"sharing": {"strategy": "TimeSlicing"}},
                        ]
                    ),
                }
            }
        ]
    ns = r.choice(NAMESPACES)
    meta = {"name": f"gen-claim-{n}", "namespace": ns}
    if r.random() < 0.5:
        return {
            "apiVersion": f"resource.k8s.io/{version}",
            "kind": "ResourceClaim",
            "metadata": meta,
            "spec": {"devices": devices},
        }
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaimTemplate",
        "metadata": meta,
        "spec": {"spec": {"devices": devices}},
    }


def _device_class(r: random.Random, n: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": r.choice(SELECTORS)}}]}
    if r.random() < 0.2:
        spec["extendedResourceName"] = r.choice(["nvidia.com/gpu", "example.com/gpu"])
    return {
        "apiVersion": r.choice(["resource.k8s.io/v1", "resource.k8s.io/v1beta1"]),
        "kind": "DeviceClass",
        "metadata": {"name": f"gen-class-{n}"},
        "spec": spec,
    }


def generated_objects(count: int = 320, seed: int = 20261201) -> Iterator[tuple[str, dict[str, Any]]]:
    r = random.Random(seed)
    for n in range(count):
        pick = r.random()
        if pick < 0.6:
            obj = _workload(r, n)
        elif pick < 0.92:
            obj = _claim(r, n)
        else:
            obj = _device_class(r, n)
        yield f"generated#{n}", obj


def corpus() -> list[tuple[str, dict[str, Any]]]:
    return [*_file_objects(), *_scenario_objects(), *generated_objects()]


# -- snapshots -------------------------------------------------------------------------------------


def _inventory() -> Inventory:
    docs = _docs(SEED / "cluster-inventory.yaml") + _docs(
        ROOT / "tests" / "rules" / "fixtures" / "inventory.yaml"
    )
    return Inventory.from_objects(docs)


EXTRA_POLICIES = "\n---\n".join(
    [
        (ROOT / "policies" / "tests" / "exceptions" / "policies.yaml").read_text(),
        *(
            f"""apiVersion: policy.draguard.io/v1alpha1
kind: GpuTierPolicy
metadata: {{name: extra-{i}}}
spec:
  mode: {"warn" if i % 2 else "enforce"}
  classes:
  - name: c{i}
    match:
      labels: {{example.com/tier-{i}: "yes"}}
      imageWords: [{"nemo" if i == 3 else f"word{i}"}]
      commands: [{"torchrun" if i == 5 else f"cmd{i}"}]
    deviceClasses: [gpu.nvidia.com-h100]
"""
            for i in range(10)
        ),
        """apiVersion: policy.draguard.io/v1alpha1
kind: GpuQuotaPolicy
metadata: {name: tight}
spec:
  mode: warn
  budgets:
  - namespace: "ml*"
    deviceClasses: {"*": 2}
    gpuEquivalents: 1.5
    claims: 2
""",
    ]
)


def snapshots() -> dict[str, admission.Snapshot]:
    inv = _inventory()
    shipped = load_policies(ROOT / "policies")
    extra = shipped.merged(parse_policy_text(EXTRA_POLICIES, "golden-extra.yaml"))
    return {
        "shipped": admission.Snapshot(policies=shipped, inventory=inv, generation=1),
        "extended": admission.Snapshot(
            policies=extra,
            inventory=inv,
            namespace_labels={
                "ml-workloads": {"draguard.io/team": "red", "draguard.io/migration-mode": "migrate"},
                "team-b": {"draguard.io/migration-mode": "enforce"},
                "default": {"draguard.io/migration-mode": "bogus"},
                "ml": {"draguard.io/team": "red"},
                "team-a": {"draguard.io/migrate": "true"},
                "prod": {"draguard.io/migrate": "true", "draguard.io/team": "blue"},
            },
            usage=QuotaUsage(
                devices={("ml-workloads", "gpu.nvidia.com-h100"): 3, ("team-a", "gpu.nvidia.com-a100"): 7},
                gpu_equivalents={"team:red": 30.5, "team-a": 15.0},
                claims={"default": 31, "ml": 1},
            ),
            served_versions=frozenset({"v1"}),
            generation=2,
        ),
    }


# -- judging ---------------------------------------------------------------------------------------


def _finding(f: Finding) -> dict[str, Any]:
    out = f.to_json()
    if out.get("file"):
        with contextlib.suppress(ValueError):
            out["file"] = str(Path(out["file"]).resolve().relative_to(ROOT))
    for key in ("message", "fix"):
        # Paths in the text are the checkout's; the recorded verdicts must hold in any checkout.
        if isinstance(out.get(key), str):
            out[key] = out[key].replace(f"{ROOT}/", "")
    if f.patch:
        out["patch"] = f.patch
    if f.generated:
        out["generated"] = list(f.generated)
    return out


def _request(n: int, obj: Mapping[str, Any]) -> dict[str, Any]:
    api = str(obj.get("apiVersion") or "")
    group, _, version = api.rpartition("/")
    kind = str(obj.get("kind") or "")
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    ns = "" if kind == "DeviceClass" else str(meta.get("namespace") or "default")
    return {
        "uid": f"golden-{n:05d}",
        "kind": {"group": group, "version": version, "kind": kind},
        "name": str(meta.get("name") or ""),
        "namespace": ns,
        "operation": "UPDATE" if n % 7 == 3 else "CREATE",
        "userInfo": {"username": "golden", "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": obj if n % 7 == 3 else None,
        "dryRun": n % 11 == 5,
    }


def _outcome(out: admission.Outcome) -> dict[str, Any]:
    resp = dict(out.response)
    if "patch" in resp:
        resp["patch"] = json.loads(base64.b64decode(resp["patch"]))
    return {
        "verdict": out.verdict,
        "response": resp,
        "findings": [_finding(f) for f in out.findings],
        "generated": list(out.generated),
        "internal": out.internal_rules,
    }


def judge_admission() -> dict[str, Any]:
    """Every corpus object through both endpoints under every snapshot, with the date fixed."""
    saved = admission._today
    admission._today = lambda: TODAY  # type: ignore[assignment]
    try:
        snaps = snapshots()
        out: dict[str, Any] = {}
        for n, (label, obj) in enumerate(corpus()):
            key = f"{n:04d} {label}"
            entry: dict[str, Any] = {}
            for sname, snap in snaps.items():
                for endpoint in ("validate", "mutate"):
                    req = _request(n, json.loads(json.dumps(obj, default=str)))
                    entry[f"{sname}/{endpoint}"] = _outcome(admission.review(endpoint, req, snap))
            out[key] = entry
        return out
    finally:
        admission._today = saved  # type: ignore[assignment]


def judge_suites() -> dict[str, Any]:
    """Every policy suite case's full findings (not only those its `expect` names)."""
    from webhook.review.suites import run_suites

    out: dict[str, Any] = {}
    for res in run_suites(ROOT / "policies" / "tests").results:
        key = f"{res.case.suite}/{res.case.name}"
        out[key] = [_finding(f) for f in res.findings]
    return out


def judge_all() -> dict[str, Any]:
    return {"admission": judge_admission(), "suites": judge_suites()}


def render(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True, default=str) + "\n"


if __name__ == "__main__":
    if "--write" in sys.argv:
        GOLDEN.write_text(render(judge_all()))
        print(f"wrote {GOLDEN}")
    else:
        print(render(judge_all())[:2000])
