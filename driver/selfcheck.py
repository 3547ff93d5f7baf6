"""`draguard driver self-check`: the whole node path once, without a cluster (scripts/gpu-check.sh).

NVML inventory, the driver root's files, then the kubelet's side of the plugin: registration over its
socket, NodePrepareResources for claims built here (allocated as the scheduler writes them), the
specs on disk, NodeUnprepareResources, the specs gone. One mode per run, chosen by the flags
`driver run` takes:

- exclusive (no flag): one device, its CDI spec printed and prepared/unprepared once;
- `--share-by-capacity`: two shares of one GPU (two claims, two shareIDs, two memory sizes), each its
  own CDI device with its own `DRAGUARD_GPU_MEMORY_LIMIT`; unpreparing one leaves the other as it was;
- `--dynamic-mig`: one partition of a GPU in MIG mode (the smallest free placement), whose MIG instance
  NVML must list after prepare and no longer list after unprepare.

A node that cannot run a mode (no GPU in MIG mode, no GPU that can be shared) is reported as skipped,
with what to change, and exits 0; any failed step exits 1. Prints what it finds, one line per step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from .cdi import KIND, CdiDevice, CdiWriter, spec_path
from .checkpoint import Checkpoint
from .devices import DriverDevice, build_devices
from .nvml import GpuInfo, MigInfo, NodeGpus, Nvml, NvmlCallError
from .plugin import DRA_SERVICES, PluginServer
from .proto import dra_v1_pb2, pluginregistration_pb2
from .registration import REGISTRATION_SERVICE
from .sharing import CapacitySharing
from .state import DeviceState

NODE = "self-check"
NAMESPACE = "default"
UID = "6f1e4a52-0c1d-4b7e-9d0a-5e7c2b9a1f00"
# The share and dynamic-MIG claims; shareIDs as the scheduler writes them (UIDs).
SHARE_CLAIMS = (
    ("gpu-check-share-1", "6f1e4a52-0c1d-4b7e-9d0a-5e7c2b9a1f01", "a3c54e1d-7f2b-4c69-8e0d-2b1f9c7a5d01"),
    ("gpu-check-share-2", "6f1e4a52-0c1d-4b7e-9d0a-5e7c2b9a1f02", "a3c54e1d-7f2b-4c69-8e0d-2b1f9c7a5d02"),
)
MIG_CLAIM = ("gpu-check-mig", "6f1e4a52-0c1d-4b7e-9d0a-5e7c2b9a1f03")
MODES = {"exclusive": "exclusive", "share": "share by capacity", "dynamic-mig": "dynamic MIG"}


class Claims:
    """Plays the API server for the claims the check builds: allocated ResourceClaims by name."""

    def __init__(self) -> None:
        self.objs: dict[str, dict[str, Any]] = {}

    def add(self, name: str, uid: str, results: list[dict[str, Any]]) -> Any:
        self.objs[name] = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }  # fmt: skip
        return dra_v1_pb2.Claim(namespace=NAMESPACE, name=name, uid=uid)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objs.get(name) if namespace == NAMESPACE else None


@dataclass
class Verdict:
    ok: bool = True
    skipped: str = ""  # why the mode could not run on this node (not a failure)


def _say(step: str, ok: bool, detail: str = "") -> bool:
    print(f"[{'ok' if ok else 'FAIL'}] {step}{': ' + detail if detail else ''}", flush=True)
    return ok


def _skip(step: str, why: str) -> Verdict:
    print(f"[skip] {step}: {why}", flush=True)
    return Verdict(ok=True, skipped=why)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):g}Gi" if n % (1 << 20) == 0 else f"{n} bytes"


class CallFailed(RuntimeError):
    """A call on the plugin's sockets failed outright (no answer, not a per-claim error)."""

    def __init__(self, method: str, detail: str) -> None:
        self.method = method
        super().__init__(detail)


async def _call(ch: Any, service: str, method: str, req: Any, resp_type: Any) -> Any:
    """One unary call, as the kubelet makes it (no generated stubs)."""
    fn = ch.unary_unary(f"/{service}/{method}", request_serializer=type(req).SerializeToString,
                        response_deserializer=resp_type.FromString)  # fmt: skip
    try:
        return await fn(req, timeout=60)
    except grpc.aio.AioRpcError as exc:
        raise CallFailed(method, f"{exc.code().name}: {exc.details()}") from None


class Kubelet:
    """The kubelet's calls on the plugin's DRA socket (v1)."""

    def __init__(self, ch: Any) -> None:
        self.ch = ch
        self.pb, self.svc = dra_v1_pb2, DRA_SERVICES["v1"]

    async def prepare(self, claim: Any) -> tuple[Any, float]:
        """The claim's result in NodePrepareResources' answer, and the call's milliseconds."""
        t = time.perf_counter()
        req = self.pb.NodePrepareResourcesRequest(claims=[claim])
        resp = await _call(
            self.ch, self.svc, "NodePrepareResources", req, self.pb.NodePrepareResourcesResponse
        )
        return resp.claims[claim.uid], 1000 * (time.perf_counter() - t)

    async def unprepare(self, claim: Any) -> str:
        """'' when NodeUnprepareResources succeeded, else the plugin's error."""
        req = self.pb.NodeUnprepareResourcesRequest(claims=[claim])
        un = await _call(
            self.ch, self.svc, "NodeUnprepareResources", req, self.pb.NodeUnprepareResourcesResponse
        )
        return str(un.claims[claim.uid].error)


async def _with_plugin(server: PluginServer, body: Callable[[Kubelet], Awaitable[bool]]) -> bool:
    """Start the plugin, register as the kubelet does, run `body` on the DRA socket, stop the plugin."""
    await server.start()
    try:
        reg_pb = pluginregistration_pb2
        async with grpc.aio.insecure_channel(f"unix://{server.paths.registration}") as ch:
            info = await _call(ch, REGISTRATION_SERVICE, "GetInfo", reg_pb.InfoRequest(), reg_pb.PluginInfo)
            status = reg_pb.RegistrationStatus(plugin_registered=True)
            done = reg_pb.RegistrationStatusResponse
            await _call(ch, REGISTRATION_SERVICE, "NotifyRegistrationStatus", status, done)
        ok = _say("registration", info.name == server.driver_name,
                  f"{info.name} at {info.endpoint}, versions {list(info.supported_versions)}")  # fmt: skip
        async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as ch:
            return await body(Kubelet(ch)) and ok
    except CallFailed as exc:  # the step that got no answer, and gRPC's reason
        return _say(exc.method, False, str(exc))
    finally:
        await server.stop(0)


def _cdicheck(args: argparse.Namespace, base: Path, specs: Sequence[dict[str, Any]]) -> bool:
    """Validate specs with the CDI library itself (tools/cdicheck), resolving every device in them."""
    check = base / "check"
    shutil.rmtree(check, ignore_errors=True)
    check.mkdir()
    ids = []
    for i, spec in enumerate(specs):
        (check / f"spec-{i}.json").write_text(json.dumps(spec))
        ids += [f"{spec['kind']}={d['name']}" for d in spec["devices"]]
    p = subprocess.run([args.cdicheck, "--spec-dir", str(check), *ids],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    what = "spec loads, devices resolve and apply" if p.returncode == 0 else p.stdout + p.stderr
    return _say("CDI library (tags.cncf.io/container-device-interface)", p.returncode == 0, what)


def _read_spec(path: Path) -> dict[str, Any] | None:
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) else None


def _device_env(spec: dict[str, Any] | None, name: str) -> list[str] | None:
    """The env of the spec's device `name`; None when the spec has no such device."""
    for d in (spec or {}).get("devices", []):
        if d.get("name") == name:
            return list(d.get("containerEdits", {}).get("env", []))
    return None


# --- exclusive ---------------------------------------------------------------------------------------
def _exclusive(args: argparse.Namespace, base: Path, make: Callable[..., tuple[DeviceState, PluginServer]],
               devices: Sequence[DriverDevice]) -> Verdict:  # fmt: skip
    device = args.device or devices[0].name
    if device not in {d.name for d in devices}:
        have = ", ".join(d.name for d in devices)
        return Verdict(_say("device", False, f"--device {device} is not a device of this node ({have})"))
    claims = Claims()
    claim = claims.add("gpu-check", UID, [{"request": "gpu", "driver": args.driver_name, "pool": NODE,
                                           "device": device}])  # fmt: skip
    state, server = make(claims)
    spec_file = spec_path(state.cdi.root, UID)
    ok = True
    # The spec as prepare writes it, printed for the record before the plugin round trip.
    spec = json.loads(state.cdi.render(UID, [CdiDevice(state.devices[device], ("gpu",))]))
    print(json.dumps(spec, indent=2))
    if args.cdicheck:
        ok &= _cdicheck(args, base, [spec])

    async def body(k: Kubelet) -> bool:
        res, ms = await k.prepare(claim)
        ids = [i for d in res.devices for i in d.cdi_device_ids]
        ok = _say("NodePrepareResources", not res.error and bool(ids), res.error or f"{ids} in {ms:.0f} ms")
        ok &= _say("CDI spec written", spec_file.exists(), str(spec_file))
        err = await k.unprepare(claim)
        ok &= _say("NodeUnprepareResources", not err, err)
        return _say("CDI spec removed", not spec_file.exists()) and ok

    ok &= asyncio.run(_with_plugin(server, body))
    return Verdict(ok)


# --- share by capacity -------------------------------------------------------------------------------
def _share_target(args: argparse.Namespace, node: NodeGpus, devices: Sequence[DriverDevice],
                  policy: CapacitySharing) -> DriverDevice | Verdict:  # fmt: skip
    shared = [d for d in devices if d.shared is not None]
    if args.device:
        hit = next((d for d in devices if d.name == args.device), None)
        if hit is None or hit.shared is None:
            have = ", ".join(d.name for d in shared) or "none"
            what = f"--device {args.device} is not a GPU shared by capacity (shared here: {have})"
            return Verdict(_say("shared GPU", False, what))
        return hit
    if shared:
        return shared[0]
    if policy.models is not None and not any(g.name in policy.models for g in node.gpus):
        have = ", ".join(sorted({g.name for g in node.gpus}))
        return Verdict(_say("shared GPU", False, f"--share-by-capacity names no GPU of this node "
                            f"({', '.join(sorted(policy.models))}); its GPUs are: {have}"))  # fmt: skip
    why = []
    for g in node.gpus:
        if g.mig_enabled:
            why.append(f"GPU {g.index} ({g.name}) is in MIG mode (never shared by capacity)")
        elif not policy.eligible(g.memory_bytes):
            why.append(f"GPU {g.index} ({g.name}): NVML reports no memory size (or less than one share step)")
    return _skip("share by capacity", "no GPU of this node can be shared: " + "; ".join(why))


def _share(args: argparse.Namespace, base: Path, make: Callable[..., tuple[DeviceState, PluginServer]],
           node: NodeGpus, devices: Sequence[DriverDevice], policy: CapacitySharing) -> Verdict:  # fmt: skip
    dev = _share_target(args, node, devices, policy)
    if isinstance(dev, Verdict):
        return dev
    assert dev.shared is not None
    top = dev.shared.default_share(dev.capacity["memory"])
    step = dev.shared.step
    # Two different sizes, so that a limit written to the wrong share shows; one step each on a GPU
    # too small for three.
    sizes = (2 * step, step) if 3 * step <= top else (step, step)
    claims = Claims()
    shares = []
    for (name, uid, share_id), memory in zip(SHARE_CLAIMS, sizes, strict=True):
        result = {"request": "gpu", "driver": args.driver_name, "pool": NODE, "device": dev.name,
                  "shareID": share_id, "consumedCapacity": {"memory": str(memory)}}  # fmt: skip
        shares.append((claims.add(name, uid, [result]), share_id, memory))
    state, server = make(claims)
    print(f"    {dev.name} ({dev.attributes['productName'][1]}, {_gib(dev.capacity['memory'])}): "
          f"shares of {' and '.join(_gib(m) for _c, _s, m in shares)}, step {_gib(step)}")  # fmt: skip
    cdi_root = state.cdi.root

    async def body(k: Kubelet) -> bool:
        ok = True
        prepared: list[Any] = []
        try:
            for n, (claim, share_id, _memory) in enumerate(shares, 1):
                res, ms = await k.prepare(claim)
                want = f"{KIND}={claim.uid}-{dev.name}-{share_id}"
                ids = [i for d in res.devices for i in d.cdi_device_ids]
                got_share = [d.share_id for d in res.devices]
                good = not res.error and ids == [want] and got_share == [share_id]
                if not res.error:
                    prepared.append(claim)
                detail = res.error or (
                    f"{ids}, shareID {got_share} in {ms:.0f} ms"
                    if good
                    else f"expected [{want}] with shareID {share_id}, got {ids} {got_share}"
                )
                ok &= _say(f"NodePrepareResources share {n}", good, detail)
            for n, (claim, share_id, memory) in enumerate(shares, 1):
                path = spec_path(cdi_root, claim.uid)
                env = _device_env(_read_spec(path), f"{claim.uid}-{dev.name}-{share_id}")
                limit = f"DRAGUARD_GPU_MEMORY_LIMIT={memory}"
                good = env is not None and limit in env
                detail = (
                    f"{path.name}: {limit} ({_gib(memory)})"
                    if good
                    else f"{path}: no device {claim.uid}-{dev.name}-{share_id} with {limit} (env {env})"
                )
                ok &= _say(f"CDI device of share {n}", good, detail)
            if args.cdicheck:
                specs = [s for c, _i, _m in shares if (s := _read_spec(spec_path(cdi_root, c.uid)))]
                ok &= _cdicheck(args, base, specs)
            (first, _s1, _m1), (second, share2, _m2) = shares
            kept = spec_path(cdi_root, second.uid)
            before = kept.read_bytes() if kept.exists() else b""
            err = await k.unprepare(first)
            if not err and first in prepared:
                prepared.remove(first)
            ok &= _say("NodeUnprepareResources share 1", not err, err)
            ok &= _say("CDI spec of share 1 removed", not spec_path(cdi_root, first.uid).exists())
            entry = state.checkpoint.load().get(second.uid)
            held = [p.share_id for p in entry.devices] if entry is not None else []
            untouched = bool(before) and kept.exists() and kept.read_bytes() == before and held == [share2]
            seen = "unchanged" if kept.exists() and kept.read_bytes() == before else "changed or gone"
            ok &= _say("share 2 untouched", untouched,
                       f"CDI spec {seen}, checkpoint holds shares {held}")  # fmt: skip
            err = await k.unprepare(second)
            if not err and second in prepared:
                prepared.remove(second)
            ok &= _say("NodeUnprepareResources share 2", not err, err)
            ok &= _say("CDI spec of share 2 removed", not kept.exists())
            left = sorted(p.name for p in cdi_root.glob("*.json")) if cdi_root.exists() else []
            ok &= _say("nothing left prepared", not left and not state.checkpoint.load(),
                       f"CDI specs left: {left}" if left else "")  # fmt: skip
        finally:
            for claim in prepared:  # a failed step above: leave nothing prepared behind
                await k.unprepare(claim)
        return ok

    return Verdict(asyncio.run(_with_plugin(server, body)))


# --- dynamic MIG -------------------------------------------------------------------------------------
_SMI_MIG = re.compile(r"^\s*(\d+)\s*,\s*([^,]+?)\s*,\s*([^,]+?)\s*$")


def _mig_modes(smi: Path | None) -> dict[int, tuple[str, str]]:
    """GPU index → (current, pending) MIG mode as nvidia-smi reports it; {} when it cannot tell.

    NVML's own view (driver/nvml.py) only says whether MIG mode is on; nvidia-smi also tells a GPU
    without MIG (`[N/A]`) from one with MIG mode off, and shows a mode change waiting for a reset.
    """
    if smi is None:
        return {}
    try:
        p = subprocess.run([str(smi), "--query-gpu=index,mig.mode.current,mig.mode.pending",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=60,
                           check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_mig_modes(p.stdout) if p.returncode == 0 else {}


def parse_mig_modes(text: str) -> dict[int, tuple[str, str]]:
    """`nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader` read."""
    out = {}
    for line in text.splitlines():
        m = _SMI_MIG.match(line)
        if m:
            out[int(m.group(1))] = (m.group(2), m.group(3))
    return out


def _mig_state(gpu: GpuInfo, mode: tuple[str, str] | None) -> str:
    """What keeps a GPU from offering partitions: no-profiles, unsupported, pending, off or unknown."""
    if gpu.mig_enabled:
        return "no-profiles"
    if mode is None:
        return "unknown"
    current, pending = (v.strip().lower() for v in mode)
    if current.startswith("[n/a") or current in ("n/a", "not supported"):
        return "unsupported"
    return "pending" if pending == "enabled" else "off"


def mig_off_reason(gpus: Sequence[GpuInfo], modes: dict[int, tuple[str, str]]) -> str:
    """Why no GPU offers partitions, GPUs in the same state together, and what to run about it."""
    groups: dict[str, list[GpuInfo]] = {}
    for g in gpus:
        groups.setdefault(_mig_state(g, modes.get(g.index)), []).append(g)
    out = []
    for state, gs in groups.items():
        n = gs[0].index
        names = ", ".join(dict.fromkeys(g.name for g in gs))
        where = f"GPU {', '.join(str(g.index) for g in gs)} ({names})"
        reset = f"the GPU is reset with nothing running on it (`nvidia-smi -i {n} -r`) or after a reboot"
        turn_on = (f"turn it on with `nvidia-smi -i {n} -mig 1` (as root, for each GPU: it takes effect once "
                   f"{reset}), then run this check again")  # fmt: skip
        out.append({
            "no-profiles": f"{where}: in MIG mode, but NVML lists no GPU instance profiles",
            "unsupported": f"{where}: no MIG support",
            "pending": f"{where}: MIG mode is enabled but pending until {reset}",
            "off": f"{where}: MIG mode is off, {turn_on}",
            "unknown": f"{where}: not in MIG mode (MIG mode is off, or the GPU has no MIG), on a MIG-capable "
                       f"GPU {turn_on}",
        }[state])  # fmt: skip
    return "; ".join(out)


def _instance_at(node: NodeGpus, gpu_uuid: str, profile_id: int, start: int) -> MigInfo | None:
    gpu = next((g for g in node.gpus if g.uuid == gpu_uuid), None)
    for m in gpu.migs if gpu is not None else ():
        if (m.gi_profile_id, m.placement_start) == (profile_id, start):
            return m
    return None


def _mig_target(args: argparse.Namespace, node: NodeGpus, devices: Sequence[DriverDevice],
                smi: Path | None) -> DriverDevice | Verdict:  # fmt: skip
    parts = [d for d in devices if d.type == "mig" and d.mig_profile_id is not None and d.parent_uuid]
    if not parts:
        why = mig_off_reason(node.gpus, _mig_modes(smi))
        return _skip("dynamic MIG", f"no GPU of this node offers MIG partitions: {why}")
    taken: dict[str, set[int]] = {}
    for g in node.gpus:
        for m in g.migs:
            span = range(m.placement_start, m.placement_start + m.placement_size)
            taken.setdefault(g.uuid, set()).update(span)
    if args.device:
        hit = next((d for d in parts if d.name == args.device), None)
        if hit is None:
            what = f"--device {args.device} is not a MIG partition of this node (e.g. {parts[0].name})"
            return Verdict(_say("MIG partition", False, what))
        return hit
    free = [d for d in parts if not d.memory_slices & taken.get(d.parent_uuid or "", set())]
    if not free:
        held = ", ".join(f"{m.profile} ({m.uuid})" for g in node.gpus for m in g.migs)
        return _skip("dynamic MIG", f"every placement is taken by MIG instances made outside the driver: "
                     f"{held}; destroy them (`nvidia-smi mig -dci`, then `nvidia-smi mig -dgi`) to run "
                     "this check")  # fmt: skip

    def size(d: DriverDevice) -> tuple[int, int, int, int, int, str]:
        # The smallest profile (fewest slices, least memory, no extra media engines), first GPU first.
        engines = sum(v for k, v in d.capacity.items() if k not in ("memory", "multiprocessors"))
        return (len(d.memory_slices), d.capacity.get("memory", 0), engines, d.minor, d.mig_start or 0, d.name)

    return min(free, key=size)


def _dynamic_mig(args: argparse.Namespace, base: Path, make: Callable[..., tuple[DeviceState, PluginServer]],
                 nvml: Nvml, node: NodeGpus, devices: Sequence[DriverDevice],
                 smi: Path | None) -> Verdict:  # fmt: skip
    dev = _mig_target(args, node, devices, smi)
    if isinstance(dev, Verdict):
        return dev
    assert dev.parent_uuid is not None and dev.mig_profile_id is not None and dev.mig_start is not None
    gpu_uuid, profile_id, start = dev.parent_uuid, dev.mig_profile_id, dev.mig_start
    gpu = next(g for g in node.gpus if g.uuid == gpu_uuid)
    profile = dev.attributes["profile"][1]
    print(f"    {dev.name}: {profile} at memory slice {start} of GPU {gpu.index} ({gpu.name}, {gpu_uuid})")
    name, uid = MIG_CLAIM
    claims = Claims()
    claim = claims.add(name, uid, [{"request": "gpu", "driver": args.driver_name, "pool": NODE,
                                    "device": dev.name}])  # fmt: skip
    state, server = make(claims)
    spec_file = spec_path(state.cdi.root, uid)

    def listed() -> MigInfo | str | None:
        """The instance at the partition's placement as NVML lists it now; a string: NVML's error."""
        try:
            return _instance_at(nvml.enumerate(), gpu_uuid, profile_id, start)
        except NvmlCallError as exc:
            return str(exc)

    async def body(k: Kubelet) -> bool:
        res, ms = await k.prepare(claim)
        ids = [i for d in res.devices for i in d.cdi_device_ids]
        ok = _say("NodePrepareResources", not res.error and bool(ids), res.error or f"{ids} in {ms:.0f} ms")
        made = listed()
        if isinstance(made, MigInfo):
            what = (f"{made.profile} at memory slice {made.placement_start}: {made.uuid} "
                    f"(GPU instance {made.gi_id}, compute instance {made.ci_id})")  # fmt: skip
        else:
            what = made or f"NVML lists no instance of profile {profile} at memory slice {start}"
        ok &= _say("MIG instance created", isinstance(made, MigInfo), what)
        env = _device_env(_read_spec(spec_file), f"{uid}-{dev.name}") or []
        visible = f"NVIDIA_VISIBLE_DEVICES={made.uuid}" if isinstance(made, MigInfo) else None
        named = visible is not None and visible in env
        what = f"{spec_file.name}: {visible}" if named else f"{spec_file}: env {env}"
        ok &= _say("CDI spec names the MIG instance", named, what)
        if args.cdicheck and spec_file.exists():
            spec = _read_spec(spec_file)
            ok &= _cdicheck(args, base, [spec] if spec else [])
        err = await k.unprepare(claim)
        ok &= _say("NodeUnprepareResources", not err, err)
        gone = listed()
        ok &= _say("MIG instance destroyed", gone is None,
                   gone if isinstance(gone, str) else
                   f"NVML still lists {gone.uuid}" if gone is not None else "")  # fmt: skip
        return _say("CDI spec removed", not spec_file.exists()) and ok

    ok = False
    try:
        ok = asyncio.run(_with_plugin(server, body))
    finally:
        # Whatever failed above, never leave an instance behind on the GPU.
        if isinstance(listed(), MigInfo):
            nvml.destroy_mig_at(gpu_uuid, profile_id, start)
            _say("cleanup", False, f"destroyed the instance the check left at memory slice {start}")
            ok = False
    return Verdict(ok)


# --- the command -------------------------------------------------------------------------------------
def _print_devices(devices: Sequence[DriverDevice]) -> None:
    parts: dict[str, list[DriverDevice]] = {}
    for d in devices:
        if d.type == "mig" and d.mig_profile_id is not None:  # partitions: one line per GPU
            parts.setdefault(d.parent_uuid or "", []).append(d)
            continue
        shared = "  shared by capacity" if d.shared is not None else ""
        print(f"    {d.name:<34} {d.type:<4} {d.uuid}  {d.attributes['productName'][1]}{shared}")
    for parent, ds in parts.items():
        profiles = ", ".join(dict.fromkeys(str(d.attributes["profile"][1]) for d in ds))
        print(f"    + {len(ds)} MIG partitions of {parent}: {profiles}")


def run(args: argparse.Namespace) -> int:
    from .cli import _open, host_layout, sharing

    mode = "dynamic-mig" if args.dynamic_mig else "share" if args.share_by_capacity else "exclusive"
    print(f"mode: {MODES[mode]}", flush=True)
    policy = sharing(args)
    ok = True
    nvml = _open(args)
    t = time.perf_counter()
    node = nvml.enumerate()
    devices = build_devices(node, args.driver_name, policy, args.dynamic_mig)
    # A node with nothing to share or partition is a skip of that mode (below), not a failed inventory.
    all_mig = bool(node.gpus) and all(g.mig_enabled for g in node.gpus)
    found = bool(devices) or (bool(node.gpus) and (mode != "exclusive" or all_mig))
    ok &= _say("NVML inventory", found,
               f"driver {node.driver_version}, CUDA {node.cuda_driver_version}, {len(node.gpus)} GPU(s), "
               f"{len(node.failed)} unreadable, {len(devices)} device(s) "
               f"in {1000 * (time.perf_counter() - t):.0f} ms"
               + ("" if not node.simulated else f" (SIMULATED from {node.source})"))  # fmt: skip
    _print_devices(devices)
    for f in node.failed:
        print(f"    GPU index {f.index} left out: {f.error}")
    if not devices and mode == "exclusive":
        if not found:
            return 1
        # MIG mode on and no instance made: the driver publishes such a GPU only through its instances.
        gpus = ", ".join(str(g.index) for g in node.gpus)
        _skip("exclusive", f"nothing to prepare: GPU {gpus} in MIG mode with no MIG instance (a GPU in "
              "MIG mode is published only through its instances; make one with `nvidia-smi mig -cgi PROFILE "
              "-C`, profiles: `nvidia-smi mig -lgip`; or check this node with --dynamic-mig)")  # fmt: skip
        print("GPU CHECK: SKIPPED", flush=True)
        return 0
    layout = host_layout(args, node.driver_version)
    files = layout.files
    assert files is not None
    ok &= _say("driver root", bool(files.libraries),
               f"{layout.driver.describe() if layout.driver else '/'}: {len(files.libraries)} libraries, "
               f"{len(files.binaries)} binaries, "
               f"{len(files.firmware)} firmware files, {len(files.sockets)} sockets, "
               f"hook {files.hook or 'none (mounts under /usr/local/nvidia)'}")  # fmt: skip
    smi = next((b for b in files.binaries if b.name == "nvidia-smi"), None)
    if smi is not None:
        p = subprocess.run([str(smi), "-L"], capture_output=True, text=True, timeout=60, check=False)
        ok &= _say("nvidia-smi -L from the driver root", p.returncode == 0, (p.stdout or p.stderr).strip())
    # The default temporary directory (TMPDIR), short enough for the plugin's unix sockets.
    base = Path(tempfile.mkdtemp(prefix="dg-gpucheck-"))

    def make(claims: Claims) -> tuple[DeviceState, PluginServer]:
        state = DeviceState(driver_name=args.driver_name, node_name=NODE, devices=devices,
                            checkpoint=Checkpoint(base / "plugins"), cdi=CdiWriter(base / "cdi", layout),
                            claims=claims, nvml=nvml)  # fmt: skip
        server = PluginServer(state, driver_name=args.driver_name, plugin_dir=base / "plugins",
                              registry_dir=base / "registry")  # fmt: skip
        return state, server

    try:
        if mode == "share":
            assert policy is not None
            verdict = _share(args, base, make, node, devices, policy)
        elif mode == "dynamic-mig":
            verdict = _dynamic_mig(args, base, make, nvml, node, devices, smi)
        else:
            verdict = _exclusive(args, base, make, devices)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ok &= verdict.ok
    if ok and verdict.skipped:
        print("GPU CHECK: SKIPPED", flush=True)
        return 0
    print("GPU CHECK:", "OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1
