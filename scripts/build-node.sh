#!/usr/bin/env bash
# Build what a real node of the local cluster runs: kubelet and kube-proxy (from the
# k8s.io/kubernetes release pinned in scripts/k8s-build/go.mod), containerd v2 with ctr and
# containerd-shim-runc-v2, runc with seccomp, the CNI plugins bridge, host-local, loopback and
# portmap, and crictl.  Everything comes from the Go module proxy (versions in
# scripts/node-build/versions); no container runtime or registry is needed.
#
#   scripts/build-node.sh                  build (or reuse) every component
#   scripts/build-node.sh GROUP...         only these: kubelet kube-proxy containerd runc cni crictl
#   scripts/build-node.sh --print-dir      print the cache directory (bin/ and cni/ below it) and exit
#
# Binaries land in ${DRAGUARD_NODE_CACHE:-$HOME/.cache/draguard/node}/<k8s version>-<key>/bin/,
# the CNI plugins in .../cni/; <key> hashes the pinned versions, so changing one builds a new
# directory.  A component whose binaries exist and answer --version is not rebuilt.
# runc needs cgo and libseccomp: Debian gcc, pkg-config and libseccomp-dev.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_MOD="$HERE/k8s-build"
VERSIONS="$HERE/node-build/versions"
CACHE_ROOT="${DRAGUARD_NODE_CACHE:-$HOME/.cache/draguard/node}"
# 2 compile jobs: the reference machine has 2 cores.
JOBS="${DRAGUARD_BUILD_JOBS:-2}"

say() { printf '[build-node %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[build-node] ERROR: %s\n' "$*" >&2; exit 1; }

[[ -f "$VERSIONS" ]] || die "$VERSIONS missing"
[[ -f "$K8S_MOD/go.mod" ]] || die "$K8S_MOD/go.mod missing; run: scripts/build-k8s.sh --pin v1.37.2"
KVER="$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[^ ]*\).*/\1/p' "$K8S_MOD/go.mod" | head -1)"
[[ -n "$KVER" ]] || die "cannot read the pinned k8s.io/kubernetes version from $K8S_MOD/go.mod"
# Only NAME=VALUE lines count, sorted, plus the Kubernetes release: webhook/dev/image.py's
# find_node_dir() computes the same key.
KEY="$({ grep -E '^[A-Z_]+=' "$VERSIONS" | LC_ALL=C sort; echo "KUBERNETES_VERSION=$KVER"; } | sha256sum | cut -c1-12)"
DIR="$CACHE_ROOT/$KVER-$KEY"
BIN="$DIR/bin"
CNI="$DIR/cni"

GROUPS_ALL=(kubelet kube-proxy containerd runc cni crictl)
groups=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --print-dir) echo "$DIR"; exit 0 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        kubelet|kube-proxy|containerd|runc|cni|crictl) groups+=("$1") ;;
        *) die "unknown argument '$1' (try --help)" ;;
    esac
    shift
done
[[ ${#groups[@]} -gt 0 ]] || groups=("${GROUPS_ALL[@]}")

# shellcheck source=node-build/versions
source "$VERSIONS"
for v in RUNC_VERSION CONTAINERD_VERSION CNI_PLUGINS_VERSION CRICTL_VERSION; do
    [[ -n "${!v:-}" ]] || die "$VERSIONS: $v is not set"
done

CNI_PLUGINS=(bridge host-local loopback portmap)

binaries_of() {
    case "$1" in
        containerd) echo "$BIN/containerd $BIN/ctr $BIN/containerd-shim-runc-v2" ;;
        cni) for p in "${CNI_PLUGINS[@]}"; do printf '%s ' "$CNI/$p"; done ;;
        *) echo "$BIN/$1" ;;
    esac
}

# Does this binary run and report its version?
answers() {
    local exe="$1"
    [[ -x "$exe" ]] || return 1
    case "$(basename "$exe")" in
        containerd-shim-runc-v2) "$exe" -v >/dev/null 2>&1 ;;
        bridge|host-local|loopback|portmap) CNI_COMMAND=VERSION "$exe" </dev/null 2>/dev/null | grep -q cniVersion ;;
        *) "$exe" --version >/dev/null 2>&1 ;;
    esac
}

present() {
    local b
    for b in $(binaries_of "$1"); do answers "$b" || return 1; done
}

# go install MODULE/PKG@VERSION builds with the module's own go.mod and go.sum (checked
# against the checksum database), so these builds need no module file of ours.
go_install() {
    local dest="$1" cgo="$2" tags="$3" ldflags="$4"; shift 4
    local tmp
    tmp="$(mktemp -d "$DIR/.build.XXXXXX")"
    if ! GOBIN="$tmp" CGO_ENABLED="$cgo" GOFLAGS="-buildvcs=false" \
        go install -p "$JOBS" -trimpath -tags "$tags" -ldflags "$ldflags" "$@"; then
        rm -rf "$tmp"
        die "go install $* failed (exact error above)"
    fi
    mv "$tmp"/* "$dest"/
    rmdir "$tmp"
}

build_kube() {
    local name="$1" pkg="k8s.io/kubernetes/cmd/$1" kminor kpatch xv="" p
    IFS=. read -r _ kminor kpatch <<<"${KVER#v}"
    # Stamp the release the way the upstream build does (otherwise v0.0.0-master).
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        xv+=" -X $p.gitVersion=$KVER -X $p.gitMajor=1 -X $p.gitMinor=$kminor"
        xv+=" -X $p.gitTreeState=clean -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    (cd "$K8S_MOD" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" \
        go build -p "$JOBS" -trimpath -ldflags "-s -w$xv" -o "$BIN/$name.tmp" "$pkg") ||
        { rm -f "$BIN/$name.tmp"; die "go build $pkg failed (exact error above)"; }
    mv "$BIN/$name.tmp" "$BIN/$name"
}

build_group() {
    local pkg
    case "$1" in
        kubelet|kube-proxy) build_kube "$1" ;;
        containerd)
            pkg=github.com/containerd/containerd/v2
            local lf="-s -w -X $pkg/version.Version=$CONTAINERD_VERSION -X $pkg/version.Package=$pkg"
            # btrfs and devmapper snapshotters need C headers and are not used (overlayfs is).
            go_install "$BIN" 0 "no_btrfs no_devmapper urfave_cli_no_docs" "$lf" \
                "$pkg/cmd/containerd@$CONTAINERD_VERSION" "$pkg/cmd/ctr@$CONTAINERD_VERSION"
            go_install "$BIN" 0 "no_btrfs no_devmapper urfave_cli_no_docs no_grpc" "$lf" \
                "$pkg/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
            ;;
        runc)
            # cgo + libseccomp: the bundle's pods ask for seccompProfile RuntimeDefault, and a
            # runc without seccomp refuses them.
            pkg-config --exists libseccomp 2>/dev/null ||
                die "runc needs libseccomp: apt-get install -y libseccomp-dev pkg-config gcc"
            command -v gcc >/dev/null 2>&1 || die "runc needs a C compiler: apt-get install -y gcc"
            go_install "$BIN" 1 "seccomp urfave_cli_no_docs" "-s -w -X main.gitCommit=$RUNC_VERSION" \
                "github.com/opencontainers/runc@$RUNC_VERSION"
            ;;
        cni)
            pkg=github.com/containernetworking/plugins
            go_install "$CNI" 0 "" "-s -w -X $pkg/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
                "$pkg/plugins/main/bridge@$CNI_PLUGINS_VERSION" "$pkg/plugins/main/loopback@$CNI_PLUGINS_VERSION" \
                "$pkg/plugins/ipam/host-local@$CNI_PLUGINS_VERSION" "$pkg/plugins/meta/portmap@$CNI_PLUGINS_VERSION"
            ;;
        crictl)
            go_install "$BIN" 0 "" "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
                "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
            ;;
    esac
}

todo=()
for g in "${groups[@]}"; do present "$g" || todo+=("$g"); done
if [[ ${#todo[@]} -eq 0 ]]; then
    say "up to date: ${groups[*]} in $DIR"
    exit 0
fi
command -v go >/dev/null 2>&1 || die "go not found on PATH; install Go >= 1.26 (https://go.dev/dl) and retry"
mkdir -p "$BIN" "$CNI"
say "building ${todo[*]} into $DIR with -p $JOBS (kubernetes $KVER, containerd $CONTAINERD_VERSION, runc $RUNC_VERSION, CNI plugins $CNI_PLUGINS_VERSION, crictl $CRICTL_VERSION)"
total=$SECONDS
for g in "${todo[@]}"; do
    say "step: $g"
    t0=$SECONDS
    build_group "$g"
    for b in $(binaries_of "$g"); do
        answers "$b" || die "$b was built but does not answer --version"
    done
    say "done: $g in $((SECONDS - t0)) s"
done
{
    echo "# built by scripts/build-node.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    grep -E '^[A-Z_]+=' "$VERSIONS"
    echo "KUBERNETES_VERSION=$KVER"
} >"$DIR/versions"
say "node binaries ready in $DIR after $((SECONDS - total)) s ($(du -sh "$DIR" | cut -f1))"
