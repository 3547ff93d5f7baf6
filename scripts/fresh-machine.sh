#!/usr/bin/env bash
# The README's two set-up commands on a fresh machine of the project's kind, as a newcomer runs them.
#
#   sudo scripts/fresh-machine.sh [--only demo|test|prereqs] [--ref REF] [--root DIR] [--keep]
#
# The machine: a Debian bookworm root filesystem made here with debootstrap, holding only what such a
# machine comes with: Python 3.11 with venv, git, make, and Go (this machine's Go tree, as the machine
# image installs it under /usr/local/go), plus this machine's registry settings (apt sources, pip's
# configuration and environment, the CA certificates they need). No cache of this machine is used: no
# ~/.cache/draguard, no Go module or build cache, no virtual environment. Into it goes a `git clone` of
# this repository at REF (default HEAD), and in it, as root, run:
#
#   make demo && make demo-down     (README: the main job on the embedded default)
#   make test                       (README: the whole test suite)
#
# `--only prereqs` makes the machine and runs only the prerequisite check both commands start with (a few
# minutes: it shows the machine can be made and reaches its registries). Each command's output goes to
# DIR/fresh-logs/<command>.log and the end of it to the terminal; the exit status is the first failing
# command's. The new machine has its own mount and PID namespaces (see `enter` below) but shares this
# machine's kernel, network and loopback:
# run it while nothing else starts clusters here. About 75 minutes on 2 cores (measured: demo 17, test
# 56), ~12 GiB of disk under DIR
# (default /var/tmp/draguard-fresh), removed afterwards unless --keep.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOT=/var/tmp/draguard-fresh
REF=HEAD
ONLY=""
KEEP=0
while [[ $# -gt 0 ]]; do
    case "$1" in
    --only) ONLY="$2"; shift 2 ;;
    --ref) REF="$2"; shift 2 ;;
    --root) ROOT="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh-machine: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$ONLY" in ""|demo|test|prereqs) ;; *) echo "fresh-machine: --only demo|test|prereqs" >&2; exit 2 ;; esac

say() { printf '[fresh-machine %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { say "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, namespaces, and the real node inside): sudo $0"
command -v debootstrap >/dev/null || die "needs debootstrap: apt-get install -y debootstrap"
command -v go >/dev/null || die "needs this machine's Go to copy into the new machine (go on PATH)"
[[ ! -e "$ROOT" ]] || die "$ROOT exists: remove it or pass --root DIR"
rev="$(git -C "$REPO" rev-parse --verify "$REF^{commit}")" || die "$REF: not a commit of $REPO"

# The Debian mirror apt uses here (the first deb or URIs line), as the image build picks it.
mirror="$(grep -rhoE '^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)https?://[^[:space:]]+' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
    | grep -v security | head -1 | grep -oE 'https?://[^[:space:]]+')" || true
mirror="${DRAGUARD_DEBIAN_MIRROR:-${mirror:-http://deb.debian.org/debian}}"

mounted=()
cleanup() {
    local rc=$?
    # Whatever still runs with its root in the new machine (a failed run's cluster) is stopped first.
    for p in /proc/[0-9]*; do
        [[ "$(readlink "$p/root" 2>/dev/null)" == "$ROOT" ]] && kill -9 "${p#/proc/}" 2>/dev/null
    done
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -R -l "${mounted[$i]}" 2>/dev/null || true
    done
    # Mounts the real node made inside (overlays, its network namespace files) go with a lazy unmount.
    { grep -o " $ROOT/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    if [[ $KEEP -eq 0 && -d "$ROOT" ]]; then
        say "removing $ROOT (--keep keeps it)"
        rm -rf --one-file-system "$ROOT" 2>/dev/null || say "could not remove all of $ROOT"
    fi
    exit "$rc"
}
trap cleanup EXIT

say "debootstrap bookworm from $mirror into $ROOT"
mkdir -p "$ROOT"
debootstrap --variant=minbase --include=python3,python3-venv,git,make,ca-certificates,procps \
    bookworm "$ROOT" "$mirror" > "$ROOT.debootstrap.log" 2>&1 \
    || { tail -20 "$ROOT.debootstrap.log" >&2; die "debootstrap failed (log: $ROOT.debootstrap.log)"; }
rm -f "$ROOT.debootstrap.log"
# The machine's apt sources, as this machine has them, so prereqs.sh installs from the same mirror.
cp -a /etc/apt/sources.list.d/*.sources "$ROOT/etc/apt/sources.list.d/" 2>/dev/null || true
[[ -f /etc/apt/sources.list ]] && cp /etc/apt/sources.list "$ROOT/etc/apt/sources.list"
# Registry settings: CA certificates, pip's configuration, local wheel links the pip environment names.
cp -a /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
cp -a /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/" 2>/dev/null || true
[[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$ROOT/etc/pip.conf"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
cp /etc/hosts "$ROOT/etc/hosts"
if [[ -n "${PIP_FIND_LINKS:-}" && -d "$PIP_FIND_LINKS" ]]; then
    mkdir -p "$ROOT$PIP_FIND_LINKS" && cp -a "$PIP_FIND_LINKS/." "$ROOT$PIP_FIND_LINKS/"
fi
say "Go from $(go env GOROOT) ($(go env GOVERSION)) into /usr/local/go"
mkdir -p "$ROOT/usr/local/go" && cp -a "$(go env GOROOT)/." "$ROOT/usr/local/go/"

say "git clone $REPO at ${rev:0:12}"
git clone -q --no-local "$REPO" "$ROOT/root/draguard"
git -C "$ROOT/root/draguard" checkout -q "$rev"

for m in proc sys dev run tmp; do mkdir -p "$ROOT/$m"; done
# pivot_root needs the new root to be a mount point, as a machine's / is; a bind mount of the directory
# onto itself makes it one.
mount --bind "$ROOT" "$ROOT" && mount --make-private "$ROOT" && mounted+=("$ROOT")
mount --rbind /sys "$ROOT/sys" && mount --make-rslave "$ROOT/sys" && mounted+=("$ROOT/sys")
mount --rbind /dev "$ROOT/dev" && mount --make-rslave "$ROOT/dev" && mounted+=("$ROOT/dev")
mount -t tmpfs -o mode=755 tmpfs "$ROOT/run" && mounted+=("$ROOT/run")
mkdir -p "$ROOT/run/netns"

# Only the environment a login on such a machine has, plus the registry settings pip and Go read.
envs=(HOME=/root LANG=C.UTF-8 TERM=dumb USER=root LOGNAME=root
      PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
for v in $(compgen -e); do
    case "$v" in PIP_*|GOPROXY|GOSUMDB|GONOSUMDB|GOPRIVATE|GOFLAGS|http_proxy|https_proxy|no_proxy|HTTP_PROXY|HTTPS_PROXY|NO_PROXY)
        envs+=("$v=${!v}") ;;
    esac
done
logs="$ROOT/fresh-logs"
mkdir -p "$logs"

# Into the new machine as a container runtime enters one, not with chroot: a mount namespace of its own
# whose root is the new machine (pivot_root, the outer root unmounted), and a PID namespace whose end
# takes every process the command left. Under a plain chroot the mount namespace's root stays this
# machine's /, and setns(2) puts whatever enters it there: `kubectl exec` into the real node's pods
# would run in this machine's root, not the container's (scripts/prereqs.sh refuses a chroot for that).
enter='cd "$0" && mkdir -p .outer && pivot_root . .outer && cd / && mount -t proc proc /proc'
enter+=' && umount -l /.outer && rmdir /.outer && exec /usr/bin/env -i "$@"'

run() {  # run NAME COMMAND...: one README command in the new machine
    local name=$1; shift
    local t0=$SECONDS
    say "$name: $*"
    if unshare --mount --pid --kill-child --propagation private -- /bin/bash -c "$enter" "$ROOT" \
        "${envs[@]}" /bin/bash -c "cd /root/draguard && $*" > "$logs/$name.log" 2>&1; then
        say "$name passed in $(( (SECONDS - t0) / 60 )) min (log: $logs/$name.log)"
    else
        local rc=$?
        tail -40 "$logs/$name.log" >&2
        say "$name FAILED with exit $rc after $(( (SECONDS - t0) / 60 )) min (log: $logs/$name.log)"
        if [[ $KEEP -eq 0 ]] && cp "$logs/$name.log" "/var/tmp/draguard-fresh-$name.log"; then
            say "log kept at /var/tmp/draguard-fresh-$name.log"
        fi
        exit "$rc"
    fi
}

if [[ "$ONLY" == "prereqs" ]]; then
    run prereqs bash scripts/prereqs.sh test
    say "the new machine passed the prerequisite check"
    exit 0
fi
[[ "$ONLY" == "test" ]] || { run demo make demo; run demo-down make demo-down; }
[[ "$ONLY" == "demo" ]] || run test make test
[[ $KEEP -eq 1 ]] || { mkdir -p /var/tmp/draguard-fresh-logs && cp "$logs"/*.log /var/tmp/draguard-fresh-logs/; }
say "the README's commands passed on a fresh machine"
