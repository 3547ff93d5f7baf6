#!/usr/bin/env bash
# Build Kyverno's admission controller (and CLI) from its Go module, for bench/peer.py only:
# nothing in the test suite needs it. The module has `replace` directives, so `go install
# module@version` refuses it; its source is taken from the module cache and built in place.
#   ${DRAGUARD_PEER_CACHE:-$HOME/.cache/draguard/peer}/kyverno-<version>/bin/{kyverno,kubectl-kyverno}
#
#   scripts/build-peer.sh [controller|cli]...   default: controller
#   scripts/build-peer.sh --path controller     print where the binary is (built or not)
set -euo pipefail
VERSION="${DRAGUARD_KYVERNO_VERSION:-v1.19.1}"
CACHE="${DRAGUARD_PEER_CACHE:-$HOME/.cache/draguard/peer}/kyverno-$VERSION"
JOBS="${DRAGUARD_BUILD_JOBS:-2}"
say() { printf '[build-peer %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[build-peer] ERROR: %s\n' "$*" >&2; exit 1; }
pkg_of() {
    case "$1" in
        controller) echo "kyverno ./cmd/kyverno" ;;
        cli) echo "kubectl-kyverno ./cmd/cli/kubectl-kyverno" ;;
        *) die "unknown part '$1' (controller or cli)" ;;
    esac
}
if [[ "${1:-}" == "--path" ]]; then
    read -r bin _ <<<"$(pkg_of "${2:-controller}")"; echo "$CACHE/bin/$bin"; exit 0
fi
parts=("$@"); [[ ${#parts[@]} -eq 0 ]] && parts=(controller)
command -v go >/dev/null 2>&1 || die "go not found on PATH"
src="$CACHE/src"
if [[ ! -f "$src/go.mod" ]]; then
    say "downloading github.com/kyverno/kyverno@$VERSION"
    dir="$(go mod download -json "github.com/kyverno/kyverno@$VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
    [[ -n "$dir" && -f "$dir/go.mod" ]] || die "go mod download gave no source directory"
    mkdir -p "$CACHE"; rm -rf "$src.tmp"; cp -r "$dir" "$src.tmp"; chmod -R u+w "$src.tmp"; mv "$src.tmp" "$src"
fi
for p in "${parts[@]}"; do
    read -r bin pkg <<<"$(pkg_of "$p")"
    out="$CACHE/bin/$bin"
    if [[ -x "$out" ]]; then say "up to date: $out"; continue; fi
    say "building $pkg (-p $JOBS)"; t0=$SECONDS; mkdir -p "$CACHE/bin"
    (cd "$src" && CGO_ENABLED=0 nice -n 10 go build -p "$JOBS" -trimpath -ldflags '-s -w' -o "$out.tmp.$$" "$pkg") ||
        { rm -f "$out.tmp.$$"; die "go build $pkg failed (exact error above)"; }
    mv -f "$out.tmp.$$" "$out"; say "done: $bin in $((SECONDS - t0)) s"
done
