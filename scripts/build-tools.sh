#!/usr/bin/env bash
# Build the small Go programs under tools/ that tests use as reference behaviour
# (Kubernetes' own validation and CEL code, the CDI library, gitops engines).
# Each tools/<name>/ is its own Go module; its binary lands in
#   ${DRAGUARD_TOOLS_CACHE:-$HOME/.cache/draguard/tools}/<name>-<source hash>/<name>
# so a rebuild happens only when its sources change.
#
#   scripts/build-tools.sh            build every tool that is missing
#   scripts/build-tools.sh NAME...    build these
#   scripts/build-tools.sh --path NAME  print where NAME's binary is (built or not)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DRAGUARD_TOOLS_CACHE:-$HOME/.cache/draguard/tools}"
JOBS="${DRAGUARD_BUILD_JOBS:-2}"
say() { printf '[build-tools %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '[build-tools] ERROR: %s\n' "$*" >&2; exit 1; }

src_hash() {
    (cd "$ROOT/tools/$1" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 |
        sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}
bin_path() { echo "$CACHE/$1-$(src_hash "$1")/$1"; }

if [[ "${1:-}" == "--path" ]]; then
    [[ -n "${2:-}" && -f "$ROOT/tools/$2/go.mod" ]] || die "no tool '${2:-}' under tools/"
    bin_path "$2"; exit 0
fi

names=("$@")
if [[ ${#names[@]} -eq 0 ]]; then
    for d in "$ROOT"/tools/*/; do [[ -f "$d/go.mod" ]] && names+=("$(basename "$d")"); done
fi
[[ ${#names[@]} -eq 0 ]] && { say "no tools to build"; exit 0; }
command -v go >/dev/null 2>&1 || die "go not found on PATH; install Go >= 1.26 and retry"

for n in "${names[@]}"; do
    [[ -f "$ROOT/tools/$n/go.mod" ]] || die "no tool '$n' under tools/"
    out="$(bin_path "$n")"
    if [[ -x "$out" ]]; then say "up to date: $n"; continue; fi
    say "building $n"
    t0=$SECONDS
    # A tool whose module the Go proxy does not serve fetches that source first (see its source.sh).
    if [[ -x "$ROOT/tools/$n/source.sh" ]] && ! "$ROOT/tools/$n/source.sh"; then
        # Building every tool: one whose source cannot be fetched here does not stop the others.
        [[ $# -eq 0 ]] || die "tools/$n/source.sh failed (exact error above)"
        say "skipped $n: tools/$n/source.sh failed (exact error above)"; continue
    fi
    mkdir -p "$(dirname "$out")"
    (cd "$ROOT/tools/$n" && CGO_ENABLED=0 go build -p "$JOBS" -trimpath -mod=readonly -o "$out.tmp.$$" .) ||
        { rm -f "$out.tmp.$$"; die "go build tools/$n failed (exact error above)"; }
    mv -f "$out.tmp.$$" "$out"  # two builds of one tool may race: each writes its own file
    say "done: $n in $((SECONDS - t0)) s"
done
