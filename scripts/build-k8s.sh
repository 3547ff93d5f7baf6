#!/usr/bin/env bash
# Build the local Kubernetes control plane used by `draguard dev up`, the
# demo and the e2e tests: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl and etcd, compiled from their published Go modules
# (pinned in scripts/k8s-build/go.mod).  No container runtime is needed.
#
#   scripts/build-k8s.sh                 build (or reuse) the pinned release
#   scripts/build-k8s.sh --print-bin-dir print the bin dir and exit
#   scripts/build-k8s.sh --pin v1.37.2   re-pin go.mod to another release, then build
#
# Binaries land in ${DRAGUARD_K8S_CACHE:-$HOME/.cache/draguard/k8s}/<version>/bin/
# (outside the work tree).  Re-running is cheap: if every binary exists and
# answers --version, nothing is rebuilt.  Point the tests at the result with
#   export DRAGUARD_K8S_BIN=$(scripts/build-k8s.sh --print-bin-dir)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOD_DIR="$HERE/k8s-build"
CACHE_ROOT="${DRAGUARD_K8S_CACHE:-$HOME/.cache/draguard/k8s}"
# 2 parallel compile jobs: the reference machine has 2 cores, and more jobs
# only raise peak memory (the apiserver link alone needs ~2 GiB).
JOBS="${DRAGUARD_BUILD_JOBS:-2}"

say() { printf '[build-k8s %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[build-k8s] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "go not found on PATH; install Go >= 1.26 (https://go.dev/dl) and retry"

pin_version() {
    # Rewrite go.mod so k8s.io/kubernetes@$1 builds outside its own repo:
    # its go.mod points every k8s.io staging module at ./staging/..., which
    # does not exist in the module zip, so each one is replaced by the
    # published v0.<minor>.<patch> tag of the same release.
    local kver="$1" staging kgomod etcd_ver
    [[ "$kver" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "--pin wants a release like v1.37.2, got '$kver'"
    staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
    say "pinning k8s.io/kubernetes $kver (staging modules $staging)"
    kgomod="$(cd "$MOD_DIR" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$kver" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    [[ -f "$kgomod" ]] || die "could not download k8s.io/kubernetes@$kver from $(go env GOPROXY)"
    # etcd: the server release matching the etcd client Kubernetes pins.
    etcd_ver="$(sed -n 's/^[[:space:]]*go.etcd.io\/etcd\/client\/v3 \(v[^ ]*\).*/\1/p' "$kgomod" | head -1)"
    [[ -n "$etcd_ver" ]] || die "no go.etcd.io/etcd/client/v3 requirement in $kgomod"
    {
        echo "module draguard.io/k8s-build"
        echo
        echo "go $(sed -n 's/^go \(.*\)/\1/p' "$kgomod")"
        echo
        echo "require ("
        echo "	go.etcd.io/etcd/server/v3 $etcd_ver"
        echo "	k8s.io/kubernetes $kver"
        echo ")"
        echo
        echo "replace ("
        grep -E '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging/' "$kgomod" |
            awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
        echo ")"
    } >"$MOD_DIR/go.mod"
    rm -f "$MOD_DIR/go.sum"
    say "go mod tidy (downloads a few hundred modules on first run)"
    (cd "$MOD_DIR" && go mod tidy) || die "go mod tidy failed for k8s.io/kubernetes $kver (see the error above)"
}

PRINT_BIN=0
case "${1:-}" in
    --pin) [[ $# -ge 2 ]] || die "--pin needs a version"; pin_version "$2" ;;
    --print-bin-dir) PRINT_BIN=1 ;;
    "") ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
esac

[[ -f "$MOD_DIR/go.mod" ]] || die "$MOD_DIR/go.mod missing; run: $0 --pin v1.37.2"
KVER="$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[^ ]*\).*/\1/p' "$MOD_DIR/go.mod" | head -1)"
EVER="$(sed -n 's/^[[:space:]]*go.etcd.io\/etcd\/server\/v3 \(v[^ ]*\).*/\1/p' "$MOD_DIR/go.mod" | head -1)"
[[ -n "$KVER" && -n "$EVER" ]] || die "cannot read pinned versions from $MOD_DIR/go.mod"
BIN="$CACHE_ROOT/$KVER/bin"
if [[ $PRINT_BIN == 1 ]]; then echo "$BIN"; exit 0; fi

version_ok() {
    local name="$1" exe="$BIN/$1"
    [[ -x "$exe" ]] || return 1
    case "$name" in
        kubectl) "$exe" version --client >/dev/null 2>&1 ;;
        *) "$exe" --version >/dev/null 2>&1 ;;
    esac
}

NAMES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)
missing=()
for n in "${NAMES[@]}"; do version_ok "$n" || missing+=("$n"); done
if [[ ${#missing[@]} -eq 0 ]]; then
    say "up to date: Kubernetes $KVER, etcd $EVER in $BIN"
    exit 0
fi

mkdir -p "$BIN"
say "building ${missing[*]} (Kubernetes $KVER, etcd $EVER) into $BIN with -p $JOBS"
IFS=. read -r _ KMINOR KPATCH <<<"${KVER#v}"
BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
# Stamp the release into the version packages the way the upstream build does;
# without it the binaries report v0.0.0-master and kubectl warns about skew.
XV=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    XV+=" -X $pkg.gitVersion=$KVER -X $pkg.gitMajor=1 -X $pkg.gitMinor=$KMINOR"
    XV+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$BUILD_DATE"
done
LDFLAGS="-s -w$XV"

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
total_start=$SECONDS
for n in "${missing[@]}"; do
    case "$n" in
        etcd) pkg="go.etcd.io/etcd/server/v3" ;;
        *) pkg="k8s.io/kubernetes/cmd/$n" ;;
    esac
    say "step: $n ($pkg)"
    t0=$SECONDS
    if ! (cd "$MOD_DIR" && go build -p "$JOBS" -trimpath -ldflags "$LDFLAGS" -o "$BIN/$n.tmp" "$pkg"); then
        rm -f "$BIN/$n.tmp"
        die "go build $pkg failed (exact error above)"
    fi
    mv "$BIN/$n.tmp" "$BIN/$n"
    version_ok "$n" || die "$BIN/$n was built but does not answer --version"
    say "done: $n in $((SECONDS - t0)) s ($(du -h "$BIN/$n" | cut -f1))"
done
say "all binaries ready in $BIN after $((SECONDS - total_start)) s ($(du -sh "$BIN" | cut -f1))"
# Capture before printing: `etcd --version | head -1` would die of SIGPIPE under pipefail.
kver_out="$("$BIN/kube-apiserver" --version)"
ever_out="$("$BIN/etcd" --version)"
echo "$kver_out"
echo "${ever_out%%$'\n'*}"
