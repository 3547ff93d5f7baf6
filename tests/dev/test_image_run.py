"""The built images run under the node's own containerd and runc, as the bundle runs them.

A throwaway containerd (its own root, state, socket and config under a temp dir, config version 4,
restrict_oom_score_adj) imports both OCI archives with `ctr images import`; the draguard image then
runs as UID 65532 with a read-only root filesystem and RuntimeDefault seccomp, through ctr and
through the CRI (crictl, the kubelet's API) in a pod whose sandbox is the pause image.
Needs root, the node binaries (scripts/build-node.sh) and the images (python -m webhook.dev.image build).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from webhook.dev import image

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@dataclass
class Containerd:
    bin_dir: Path
    sock: Path
    dir: Path
    proc: subprocess.Popen[bytes]

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "ctr"), "--address", str(self.sock), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def crictl(self, *args: str, timeout: float = 60) -> str:
        res = subprocess.run(
            [
                str(self.bin_dir / "crictl"),
                "--runtime-endpoint",
                f"unix://{self.sock}",
                "--timeout=30s",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert res.returncode == 0, f"crictl {' '.join(args)}: {res.stderr}"
        return res.stdout.strip()


def _wait(cond: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(cond) and cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _pids_using(marker: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if marker.encode() in (p / "cmdline").read_bytes():
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


def _unmount_below(root: Path) -> None:
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(root) + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)


@pytest.fixture(scope="module")
def images() -> tuple[image.BuiltImage, image.BuiltImage]:
    if os.geteuid() != 0:
        _unavailable("building and running images needs root")
    try:
        return image.ensure_image(), image.ensure_pause_image()
    except image.ImageError as exc:
        _unavailable(str(exc))
        raise


@pytest.fixture(scope="module")
def containerd(
    tmp_path_factory: pytest.TempPathFactory, images: tuple[image.BuiltImage, image.BuiltImage]
) -> Iterator[Containerd]:
    try:
        bin_dir = image.find_node_bin_dir()
    except image.ImageError as exc:
        _unavailable(str(exc))
        raise
    d = tmp_path_factory.mktemp("containerd")
    sock = d / "containerd.sock"
    (d / "cni-conf").mkdir()
    config = d / "config.toml"
    config.write_text(f"""version = 4
root = "{d}/root"
state = "{d}/state"
# Version 4 ignores the old top-level [grpc]/[ttrpc] tables: the default socket would be used.
[plugins."io.containerd.server.v1.grpc"]
  address = "{sock}"
[plugins."io.containerd.server.v1.ttrpc"]
  address = "{sock}.ttrpc"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{images[1].name}"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{bin_dir.parent / "cni"}"]
    conf_dir = "{d}/cni-conf"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    BinaryName = "{bin_dir / "runc"}"
    SystemdCgroup = false
""")
    log = (d / "containerd.log").open("wb")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    proc = subprocess.Popen(
        [str(bin_dir / "containerd"), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    c = Containerd(bin_dir, sock, d, proc)
    try:
        _wait(lambda: c.ctr("version", timeout=10).returncode == 0 or proc.poll() is not None, "containerd")
        assert proc.poll() is None, (d / "containerd.log").read_text()[-3000:]
        yield c
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # Shims outlive containerd; each carries our socket path on its command line.
        for pid in _pids_using(str(sock)):
            os.kill(pid, signal.SIGKILL)
        _unmount_below(d)
        log.close()


def test_ctr_imports_both_archives_under_the_bundles_names(
    containerd: Containerd, images: tuple[image.BuiltImage, image.BuiltImage]
) -> None:
    for img in images:
        res = containerd.ctr("images", "import", str(img.path), timeout=300)
        assert res.returncode == 0, res.stderr
    listed = containerd.ctr("images", "ls").stdout
    for img in images:
        line = next((ln for ln in listed.splitlines() if ln.startswith(img.name + " ")), None)
        assert line is not None, listed
        assert img.digest in line, line
    assert images[0].name == "ghcr.io/draguard/draguard:0.1.0"


def test_ctr_runs_the_image_as_65532_read_only_with_seccomp(containerd: Containerd) -> None:
    name = "ghcr.io/draguard/draguard:0.1.0"
    res = containerd.ctr(
        "run",
        "--rm",
        "--net-host",
        "--read-only",
        "--seccomp",
        "--user",
        "65532:65532",
        name,
        "draguard-help",
    )
    assert res.returncode == 0, res.stderr
    assert "usage: draguard" in res.stdout and "driver" in res.stdout
    probe = (
        "import os, json\n"
        "try:\n    open('/probe', 'w'); ro = False\nexcept OSError as e:\n    ro = e.errno\n"
        "seccomp = [l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')][0]\n"
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'ro': ro, 'seccomp': seccomp}))\n"
    )
    res = containerd.ctr(
        "run",
        "--rm",
        "--net-host",
        "--read-only",
        "--seccomp",
        "--user",
        "65532:65532",
        name,
        "draguard-probe",
        "python3",
        "-c",
        probe,
    )
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout)
    assert seen == {"uid": 65532, "gid": 65532, "ro": 30, "seccomp": "2"}  # EROFS; seccomp filter mode


def test_cri_runs_the_image_in_a_pause_sandbox(containerd: Containerd, tmp_path: Path) -> None:
    """The kubelet's path: a sandbox from the pause image, a container with the bundle's securityContext."""
    pod = tmp_path / "pod.json"
    pod.write_text(
        json.dumps(
            {
                "metadata": {
                    "name": "image-check",
                    "namespace": "default",
                    "uid": "image-check-1",
                    "attempt": 0,
                },
                "log_directory": str(tmp_path / "logs"),
                "linux": {"security_context": {"namespace_options": {"network": 2}}},
            }
        )
    )
    ctr_cfg = tmp_path / "ctr.json"
    ctr_cfg.write_text(
        json.dumps(
            {
                "metadata": {"name": "draguard"},
                "image": {"image": "ghcr.io/draguard/draguard:0.1.0"},
                "args": ["--version"],
                "log_path": "draguard.log",
                "linux": {
                    "security_context": {
                        "run_as_user": {"value": 65532},
                        "run_as_group": {"value": 65532},
                        "readonly_rootfs": True,
                        "no_new_privs": True,
                        "seccomp": {"profile_type": 0},  # RuntimeDefault
                    }
                },
            }
        )
    )
    pod_id = containerd.crictl("runp", str(pod))
    try:
        sandbox = json.loads(containerd.crictl("inspectp", pod_id))
        assert sandbox["status"]["state"] == "SANDBOX_READY"
        assert sandbox["info"]["image"] == "localhost/draguard/pause:1"
        cid = containerd.crictl("create", pod_id, str(ctr_cfg), str(pod))
        containerd.crictl("start", cid)

        def exited() -> bool:
            state = json.loads(containerd.crictl("inspect", cid))["status"]["state"]
            return bool(state == "CONTAINER_EXITED")

        _wait(exited, "the draguard container to exit")
        status = json.loads(containerd.crictl("inspect", cid))["status"]
        assert status["exitCode"] == 0, status
        assert "draguard 0.1.0" in containerd.crictl("logs", cid)
        info = json.loads(containerd.crictl("inspect", cid))["info"]["runtimeSpec"]
        assert info["process"]["user"]["uid"] == 65532 and info["root"]["readonly"] is True
        assert info["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ERRNO"
    finally:
        containerd.crictl("stopp", pod_id)
        containerd.crictl("rmp", pod_id)


def test_image_holds_exactly_the_recipes_packages_and_the_lock(
    images: tuple[image.BuiltImage, image.BuiltImage],
) -> None:
    """From its SBOM: runtime Debian packages in, build-only ones purged, the venv = the lock + draguard."""
    spec = image.load_recipe().draguard
    bom = json.loads(images[0].sbom.read_text())
    assert bom["metadata"]["component"]["name"] == spec.repository
    debs = {c["name"] for c in bom["components"] if c.get("purl", "").startswith("pkg:deb/")}
    assert set(spec.packages) <= debs
    assert not set(spec.build_packages) & debs, set(spec.build_packages) & debs
    assert not {"python3-pip-whl", "python3-setuptools-whl", "python3.11-venv"} & debs
    pypi = {
        c["purl"].split("/")[1].split("@")[0]: c["version"]
        for c in bom["components"]
        if c.get("purl", "").startswith("pkg:pypi/")
    }
    locked = {}
    for m in re.finditer(
        r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", (image.REPO_ROOT / image.LOCK).read_text(), re.M
    ):
        locked[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    assert pypi == {**locked, "draguard": spec.tag}


def test_image_has_no_setuid_or_setgid_files(images: tuple[image.BuiltImage, image.BuiltImage]) -> None:
    """Debian's su, mount, passwd... lose their bits: nothing in a draguard pod may gain privileges."""
    with tarfile.open(images[0].path) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(
            outer.extractfile("blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1])  # type: ignore[arg-type]
        )
        layer = outer.extractfile("blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1])
        assert layer is not None
        with gzip.open(layer) as gz, tarfile.open(fileobj=gz, mode="r|") as lt:
            members = {m.name: m.mode for m in lt if m.isfile()}
    privileged = sorted(name for name, mode in members.items() if mode & 0o6000)
    assert privileged == [], privileged
    # The programs are still there (the check saw them), only without the bits.
    assert members["usr/bin/su"] & 0o777 == 0o755 and members["usr/bin/mount"] & 0o777 == 0o755
