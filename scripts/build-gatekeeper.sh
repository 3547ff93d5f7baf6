#!/usr/bin/env bash
# Build Gatekeeper's manager (admission webhook, audit, controllers: one binary) from its Go module,
# for bench/peer.py --webhook only: nothing in the test suite needs it. Built in place from the module
# source, as scripts/build-peer.sh builds Kyverno, so that deploy/gatekeeper.yaml (its CRDs and webhook
# configurations, which the bench applies) comes from the same version as the binary.
#   ${DRAGUARD_PEER_CACHE:-$HOME/.cache/draguard/peer}/gatekeeper-<version>/bin/manager
#
#   scripts/build-gatekeeper.sh           build (a no-op when the binary is there)
#   scripts/build-gatekeeper.sh --path    print where the binary is (built or not)
set -euo pipefail
VERSION="${DRAGUARD_GATEKEEPER_VERSION:-v3.23.1}"
MODULE="github.com/open-policy-agent/gatekeeper/v3"
CACHE="${DRAGUARD_PEER_CACHE:-$HOME/.cache/draguard/peer}/gatekeeper-$VERSION"
JOBS="${DRAGUARD_BUILD_JOBS:-2}"
say() { printf '[build-gatekeeper %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[build-gatekeeper] ERROR: %s\n' "$*" >&2; exit 1; }
out="$CACHE/bin/manager"
if [[ "${1:-}" == "--path" ]]; then echo "$out"; exit 0; fi
[[ $# -eq 0 ]] || die "unknown argument '$1' (none, or --path)"
command -v go >/dev/null 2>&1 || die "go not found on PATH"
src="$CACHE/src"
if [[ ! -f "$src/go.mod" ]]; then
    say "downloading $MODULE@$VERSION"
    dir="$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
    [[ -n "$dir" && -f "$dir/go.mod" ]] || die "go mod download gave no source directory"
    mkdir -p "$CACHE"; rm -rf "$src.tmp"; cp -r "$dir" "$src.tmp"; chmod -R u+w "$src.tmp"; mv "$src.tmp" "$src"
fi
if [[ -x "$out" ]]; then say "up to date: $out"; exit 0; fi
say "building $MODULE (main package, -p $JOBS)"; t0=$SECONDS; mkdir -p "$CACHE/bin"
(cd "$src" && CGO_ENABLED=0 nice -n 10 go build -p "$JOBS" -trimpath -ldflags '-s -w' -o "$out.tmp.$$" .) ||
    { rm -f "$out.tmp.$$"; die "go build $MODULE failed (exact error above)"; }
mv -f "$out.tmp.$$" "$out"; say "done: manager in $((SECONDS - t0)) s"
