#!/usr/bin/env bash
# The driver's real-NVML path on a machine with an NVIDIA GPU and driver, in one run (< 5 minutes):
# inventory, then `draguard driver self-check` in each way the driver serves a GPU, each under its own
# timeout: exclusive (the CDI spec of the first device against the real driver root, checked by the
# CDI library when tools/cdicheck is built, and one prepare/unprepare through the plugin over its unix
# socket), shared by capacity (two shares of one GPU, each with its own CDI device and memory limit;
# one unprepared while the other stays), and dynamic MIG (a partition's MIG instance made by prepare
# and destroyed by unprepare through NVML). A mode the machine cannot run (no GPU in MIG mode, say) is
# reported as skipped with what to change. Needs no cluster and changes nothing on the host it does
# not undo (everything lives in a temporary directory; a TimeSlicing setting is never applied; the
# MIG instance the check makes is destroyed again, MIG mode is never switched).
#
#   scripts/gpu-check.sh                    real NVML, driver root $DRIVER_ROOT (default /)
#   scripts/gpu-check.sh --sim TOPOLOGY     the same path on a simulated node (a simulated driver root)
#
# Environment: PYTHON (default .venv/bin/python), DRIVER_ROOT, CDICHECK (path of tools/cdicheck's
# binary; found in the build cache when unset), DEVICE (the device the exclusive check prepares;
# default the first). Exit status 0 when no check failed (skipped ones included), 1 otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
say() { printf '\n== %s\n' "$*"; }
die() { printf 'gpu-check: %s\n' "$*" >&2; exit 1; }

[[ -x "$PY" ]] || die "no Python at $PY: run 'make venv' first (or set PYTHON)"
cd "$ROOT"
source=(--real)
root_args=(--driver-root "${DRIVER_ROOT:-/}")
tmp=""
if [[ "${1:-}" == "--sim" ]]; then
    [[ -n "${2:-}" ]] || die "--sim needs a topology (e.g. h100-8x-nvlink)"
    tmp="$(mktemp -d /tmp/dg-gpucheck-root-XXXXXX)"
    trap 'rm -rf "$tmp"' EXIT
    "$PY" -m driver.cli driver sim-root "$tmp" --sim "$2" >/dev/null
    source=(--sim "$2")
    root_args=(--driver-root "$tmp")
fi

cdicheck="${CDICHECK:-}"
if [[ -z "$cdicheck" && -f tools/cdicheck/go.mod ]]; then
    candidate="$(bash scripts/build-tools.sh --path cdicheck)"
    [[ -x "$candidate" ]] && cdicheck="$candidate"
fi

say "host"
uname -r
if [[ -e /proc/driver/nvidia/version ]]; then head -1 /proc/driver/nvidia/version; else echo "no /proc/driver/nvidia/version"; fi
ls -l /dev/nvidia* 2>/dev/null | head -20 || echo "no /dev/nvidia*"

say "inventory (ResourceSlices this node would publish)"
inventory="$(timeout 60 "$PY" -m driver.cli driver inventory "${source[@]}" --node-name gpu-check -o yaml)"
printf '%s\n' "$inventory" | head -80

check=(driver self-check "${source[@]}" "${root_args[@]}")
[[ -n "$cdicheck" ]] && check+=(--cdicheck "$cdicheck") || echo "(tools/cdicheck not built: the specs are not checked by the CDI library)"

# One self-check under a timeout; its verdict (OK, SKIPPED, FAILED, TIMED OUT) goes to `verdicts`.
verdicts=()
failed=0
run_check() {
    local name="$1" limit="$2"; shift 2
    local out rc=0 verdict
    out="$(mktemp /tmp/dg-gpucheck-out-XXXXXX)"
    # SIGINT first: the check then still unprepares and destroys a MIG instance it made.
    timeout -s INT -k 15 "$limit" "$PY" -m driver.cli "${check[@]}" "$@" | tee "$out" || rc=$?
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        verdict="TIMED OUT after ${limit}s"
    elif [[ $rc -ne 0 ]]; then
        verdict="FAILED"
    elif grep -q '^GPU CHECK: SKIPPED' "$out"; then
        verdict="SKIPPED"
    else
        verdict="OK"
    fi
    rm -f "$out"
    [[ $verdict == OK || $verdict == SKIPPED ]] || failed=1
    verdicts+=("$name: $verdict")
}

say "self-check, exclusive: driver root, CDI spec, prepare/unprepare over the plugin socket"
exclusive=()
[[ -n "${DEVICE:-}" ]] && exclusive+=(--device "$DEVICE")
run_check exclusive 75 "${exclusive[@]}"

say "self-check, shared by capacity: two shares of one GPU, one unprepared beside the other"
run_check share 60 --share-by-capacity all

say "self-check, dynamic MIG: a partition's MIG instance made at prepare, destroyed at unprepare"
run_check dynamic-mig 75 --dynamic-mig

say "summary"
printf '%s\n' "${verdicts[@]}"
exit "$failed"
