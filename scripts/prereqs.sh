#!/usr/bin/env bash
# The system prerequisites of `make demo` and `make test`, checked in their first seconds so that a
# fresh machine fails (or is fixed) before a 20-minute build, not in the middle of it.
#
#   scripts/prereqs.sh demo|test   check; as root with apt-get, install what is missing; otherwise
#                                  print the exact command to run and exit 1
#   scripts/prereqs.sh --list      print the prerequisites and exit
#
# What each one is for:
#   go >= 1.26            the control plane, kubelet, containerd, runc and tools/* are built from Go modules
#   python3 (>= 3.11), venv  the project's own .venv
#   gcc, pkg-config, libseccomp-dev  runc with seccomp (cgo): the bundle's pods ask for RuntimeDefault
#   debootstrap           the draguard and pause images are Debian root filesystems built here
#   iptables, iproute2, util-linux  the real node's network (kube-proxy, ip, nsenter, unshare)
#   root                  the real node (mounts, network namespaces, containerd) and the image build
#   not a chroot          `kubectl exec` into the node's containers needs the machine's own root
#   disk                  ~7 GiB under ~/.cache/draguard (binaries, images) and the Go build cache
set -uo pipefail

MODE="${1:-test}"
MIN_GO_MINOR=26
MIN_PY_MINOR=11
MIN_DISK_GIB=7
DEBS=(gcc pkg-config libseccomp-dev debootstrap iptables iproute2 util-linux)

say() { printf '[prereqs] %s\n' "$*"; }

if [[ "$MODE" == "--list" ]]; then
    sed -n '/^# What each one is for:/,/^set /p' "$0" | sed '1d;$d' | sed 's/^#//'
    exit 0
fi
case "$MODE" in demo|test) ;; *) say "usage: scripts/prereqs.sh demo|test|--list"; exit 2 ;; esac

problems=()   # what cannot be installed from here, each with the exact fix
missing=()    # Debian packages to install

# Go: Debian's golang-go is older than the control plane needs, so it is never installed from apt.
if ! command -v go >/dev/null 2>&1; then
    problems+=("go is not on PATH: install Go >= 1.$MIN_GO_MINOR from https://go.dev/dl (tar -C /usr/local -xzf go*.tar.gz; export PATH=/usr/local/go/bin:\$PATH)")
else
    gover="$(go env GOVERSION 2>/dev/null)"   # go1.26.8
    minor="$(sed -n 's/^go1\.\([0-9]*\).*/\1/p' <<<"$gover")"
    if [[ -z "$minor" || "$minor" -lt "$MIN_GO_MINOR" ]]; then
        problems+=("go is $gover; the Kubernetes v1.37 build needs Go >= 1.$MIN_GO_MINOR (https://go.dev/dl)")
    fi
fi

if ! command -v python3 >/dev/null 2>&1; then
    missing+=(python3)
elif ! python3 -c "import sys; sys.exit(sys.version_info < (3, $MIN_PY_MINOR))"; then
    problems+=("python3 is $(python3 -V 2>&1); draguard needs Python >= 3.$MIN_PY_MINOR")
fi
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)

if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${DEBS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
else
    # Not Debian: check the commands and the library instead of the package names.
    for c in gcc pkg-config debootstrap iptables ip nsenter unshare; do
        command -v "$c" >/dev/null 2>&1 || problems+=("$c is missing: install it with your package manager")
    done
    pkg-config --exists libseccomp 2>/dev/null || problems+=("libseccomp's headers are missing (libseccomp-dev or libseccomp-devel)")
fi

if [[ "$(id -u)" -ne 0 ]]; then
    problems+=("make $MODE runs a real node (mounts, network namespaces, containerd) and builds images with debootstrap: run it as root (sudo make $MODE)")
fi

# A plain chroot runs the node but breaks `kubectl exec`: exec enters the container's mount namespace,
# and setns(2) puts the process at that namespace's root, which under a chroot is the outer machine's /
# (the exec'd shell sees the host's /dev and no service-account volume). nsenter into our own mount
# namespace shows the same: a root other than ours.
if [[ "$(id -u)" -eq 0 ]] && command -v nsenter >/dev/null 2>&1; then
    ours="$(stat -Lc %d:%i / 2>/dev/null)"
    ns_root="$(nsenter --mount=/proc/self/ns/mnt stat -Lc %d:%i / 2>/dev/null)" || ns_root="$ours"
    if [[ -n "$ours" && "$ours" != "$ns_root" ]]; then
        problems+=("this is a chroot, where a container's \`kubectl exec\` would land in the outer machine's root: run in a container, a VM, or a mount namespace that pivot_root made (scripts/fresh-machine.sh shows how: unshare --mount --pid, then pivot_root into the root)")
    fi
fi

cache="$HOME/.cache/draguard"
k8s_cache="${DRAGUARD_K8S_CACHE:-$cache/k8s}"
mkdir -p "$cache" 2>/dev/null
have_built=0
[[ -d "$k8s_cache" && -n "$(ls -A "$k8s_cache" 2>/dev/null)" ]] && have_built=1
if ((have_built == 0)); then
    free_kib="$(df -Pk "$cache" 2>/dev/null | awk 'NR==2 {print $4}')"
    if [[ -n "$free_kib" && "$free_kib" -lt $((MIN_DISK_GIB * 1024 * 1024)) ]]; then
        problems+=("$cache has $((free_kib / 1024 / 1024)) GiB free; the first build needs about $MIN_DISK_GIB GiB (point HOME, or DRAGUARD_K8S_CACHE for the Kubernetes binaries, at a larger disk)")
    fi
fi

if ((${#missing[@]})); then
    cmd="apt-get update && apt-get install -y ${missing[*]}"
    if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing: ${missing[*]}"
        if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; }; then
            problems+=("installing ${missing[*]} failed (apt-get's error above); fix it, then run: $cmd")
        fi
    else
        problems+=("missing packages; run as root: $cmd")
    fi
fi

if ((${#problems[@]})); then
    say "make $MODE cannot run on this machine yet:"
    for p in "${problems[@]}"; do printf '  - %s\n' "$p"; done
    exit 1
fi
if ((have_built == 0)); then
    say "all present; the first run builds Kubernetes v1.37.2, the node and the images (10-40 minutes on 2 cores, once)"
fi
exit 0
