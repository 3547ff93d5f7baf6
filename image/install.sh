#!/bin/sh
# The draguard image's install steps, run inside the image's root filesystem by both front ends
# (the Containerfile's RUN line and `python -m webhook.dev.image build` in a chroot); see recipe.toml.
#   install.sh packages PACKAGE...    install Debian packages (no recommends)
#   install.sh wheel SRC WHEELS       build the project wheel from the source tree SRC into WHEELS, with
#                                     the build backend from SRC/image/build.lock (hashes required)
#   install.sh venv WHEELS LOCK       /opt/draguard: the dependencies from LOCK (hashes required), then
#                                     the wheel without dependencies
#   install.sh finish PACKAGE...      drop pip and the build-only Debian PACKAGEs, caches, docs and
#                                     every setuid/setgid bit
#   install.sh sbom SRC NAME VERSION  CycloneDX SBOM of the result: /usr/share/draguard/sbom.cdx.json
set -eu
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
VENV=/opt/draguard

case "${1:-}" in
packages)
    shift
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "$@" >/dev/null
    ;;
wheel)
    src=$2 out=$3
    # A copy: the source tree may be a read-only mount, and the build writes next to its sources.
    mkdir -p /tmp/wheel-src
    tar -C "$src" --exclude='./.*' --exclude=./build --exclude=./dist -cf - . | tar -C /tmp/wheel-src -xf -
    python3 -m venv /tmp/wheel-build
    /tmp/wheel-build/bin/python -m pip install --quiet --require-hashes --no-deps -r "$src/image/build.lock"
    /tmp/wheel-build/bin/python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$out" \
        /tmp/wheel-src
    rm -rf /tmp/wheel-build /tmp/wheel-src
    ;;
venv)
    wheels=$2 lock=$3
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --require-hashes --no-deps -r "$lock"
    "$VENV/bin/python" -m pip install --quiet --no-deps --no-index "$wheels"/draguard-*.whl
    "$VENV/bin/python" -m pip check
    "$VENV/bin/python" -m pip uninstall --quiet --yes pip setuptools wheel 2>/dev/null || true
    # Compile now: at run time the root filesystem is read-only.
    unset PYTHONDONTWRITEBYTECODE
    "$VENV/bin/python" -m compileall -q "$VENV/lib" >/dev/null
    "$VENV/bin/draguard" --version
    ;;
finish)
    shift
    if [ "$#" -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get purge -y -q --auto-remove "$@" >/dev/null
    fi
    apt-get clean
    # Not /tmp/*: the Containerfile's source tree is mounted there.
    rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /usr/share/man/* /usr/share/info/* \
        /root/.cache /tmp/wheels /var/tmp/*
    # Documentation goes, the licences stay.
    find /usr/share/doc -type f ! -name copyright -delete
    # No setuid/setgid programs (su, mount, passwd...): nothing in the image needs to gain privileges,
    # and a program that cannot is no way up from a compromised process.
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tmp \) -prune \
        -o -type f -perm /6000 -exec chmod ug-s {} +
    ;;
sbom)
    mkdir -p /usr/share/draguard
    python3 "$2/image/sbom.py" / "$3" "$4" >/usr/share/draguard/sbom.cdx.json
    ;;
*)
    echo "usage: install.sh packages PACKAGE... | wheel SRC WHEELS | venv WHEELS LOCK | finish PACKAGE... | sbom SRC NAME VERSION" >&2
    exit 2
    ;;
esac
