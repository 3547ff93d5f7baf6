#!/usr/bin/env bash
# The driver's real-NVML path on a machine with an NVIDIA GPU and driver, in one run (< 5 minutes):
# inventory, the CDI spec for the first device against the real driver root (checked by the CDI
# library when tools/cdicheck is built), and one prepare/unprepare through the plugin over its
# unix socket with a claim built by the check. Needs no cluster and changes nothing on the host
# (everything lives in a temporary directory; a TimeSlicing setting is never applied).
#
#   scripts/gpu-check.sh                    real NVML, driver root $DRIVER_ROOT (default /)
#   scripts/gpu-check.sh --sim TOPOLOGY     the same path on a simulated node (a simulated driver root)
#
# Environment: PYTHON (default .venv/bin/python), DRIVER_ROOT, CDICHECK (path of tools/cdicheck's
# binary; found in the build cache when unset), DEVICE (the device to prepare; default the first).
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
inventory="$(timeout 120 "$PY" -m driver.cli driver inventory "${source[@]}" --node-name gpu-check -o yaml)"
printf '%s\n' "$inventory" | head -80

say "self-check: driver root, CDI spec, prepare/unprepare over the plugin socket"
check=(driver self-check "${source[@]}" "${root_args[@]}")
[[ -n "$cdicheck" ]] && check+=(--cdicheck "$cdicheck") || echo "(tools/cdicheck not built: the spec is not checked by the CDI library)"
[[ -n "${DEVICE:-}" ]] && check+=(--device "$DEVICE")
timeout 180 "$PY" -m driver.cli "${check[@]}"
