"""CycloneDX 1.5 JSON SBOM of an image root filesystem: its Debian packages and its venv's Python packages.

Run by image/install.sh's `sbom` step with the image's own python3 (standard library only), in the
Containerfile and the local builder alike:  python3 sbom.py ROOT NAME VERSION > sbom.cdx.json
"""

from __future__ import annotations

import email.parser
import json
import re
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

VENV = "opt/draguard"


def _os_release(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (root / "etc/os-release").read_text().splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k] = v.strip().strip('"')
    return out


def debian_packages(root: Path) -> list[dict[str, str]]:
    """Installed packages from dpkg's status file: name, version, architecture."""
    pkgs = []
    for block in (root / "var/lib/dpkg/status").read_text().split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", block, re.M))
        if fields.get("Status") == "install ok installed":
            pkgs.append(
                {"name": fields["Package"], "version": fields["Version"], "arch": fields["Architecture"]}
            )
    return sorted(pkgs, key=lambda p: p["name"])


def python_packages(root: Path) -> list[dict[str, str]]:
    """Distributions installed in the image's venv, from their METADATA."""
    pkgs = []
    for meta in sorted((root / VENV).glob("lib/python3*/site-packages/*.dist-info/METADATA")):
        msg = email.parser.Parser().parsestr(meta.read_text(errors="replace"), headersonly=True)
        name, version = msg.get("Name"), msg.get("Version")
        if name and version:
            pkgs.append({"name": name, "version": version, "license": msg.get("License-Expression") or ""})
    return pkgs


def _pypi_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sbom(root: Path, name: str, version: str) -> dict[str, object]:
    osr = _os_release(root)
    distro = f"{osr.get('ID', 'debian')}-{osr.get('VERSION_ID', '')}"
    components: list[dict[str, object]] = [
        {
            "type": "operating-system",
            "bom-ref": "os",
            "name": osr.get("ID", "debian"),
            "version": (root / "etc/debian_version").read_text().strip(),
        }
    ]
    for p in debian_packages(root):
        purl = f"pkg:deb/debian/{quote(p['name'])}@{quote(p['version'])}?arch={p['arch']}&distro={distro}"
        components.append(
            {"type": "library", "bom-ref": purl, "name": p["name"], "version": p["version"], "purl": purl}
        )
    python = python_packages(root)
    # The image is versioned as the draguard it installs: a release build stamps the wheel's version
    # from its git tag, so the SBOM follows the wheel rather than the tag written in the recipe.
    version = next((p["version"] for p in python if _pypi_name(p["name"]) == "draguard"), version)
    for p in python:
        purl = f"pkg:pypi/{_pypi_name(p['name'])}@{quote(p['version'])}"
        comp: dict[str, object] = {
            "type": "library",
            "bom-ref": purl,
            "name": p["name"],
            "version": p["version"],
            "purl": purl,
        }
        if p["license"]:
            comp["licenses"] = [{"expression": p["license"]}]
        components.append(comp)
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "component": {"type": "container", "bom-ref": "image", "name": name, "version": version},
        },
        "components": components,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: sbom.py ROOT NAME VERSION", file=sys.stderr)
        return 2
    json.dump(sbom(Path(argv[0]), argv[1], argv[2]), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
