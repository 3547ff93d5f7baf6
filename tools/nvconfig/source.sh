#!/usr/bin/env bash
# Puts NVIDIA's DRA driver source (the API types and feature gates nvconfig imports) at
# tools/nvconfig/nvidia-src, a link into the tools cache. The Go module proxy does not serve the
# module, so it comes from git: $DRAGUARD_NVIDIA_SRC (a clone or bare git directory holding the
# commit) when set, else a shallow fetch of the commit from GitHub.
set -euo pipefail
REPO="https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu"
# Newer than the newest tag (v0.4.1): MpsConfig.multiUser, which webhook/dra/drivers/nvidia.py follows.
COMMIT="95932046683719c43b6a0dd9613c2e5aad5d6703"
PATHS=(go.mod api/nvidia.com/resource/v1beta1 pkg/featuregates)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DEST="${DRAGUARD_TOOLS_CACHE:-$HOME/.cache/draguard/tools}/src/dra-driver-nvidia-gpu-$COMMIT"
if [[ ! -f "$DEST/go.mod" ]]; then
    mkdir -p "${DEST%/*}"
    tmp="$(mktemp -d "${DEST%/*}/.tmp.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    if [[ -n "${DRAGUARD_NVIDIA_SRC:-}" ]]; then
        git -C "$DRAGUARD_NVIDIA_SRC" archive "$COMMIT" "${PATHS[@]}" | tar -x -C "$tmp"
    else
        git -C "$tmp" init -q
        git -C "$tmp" fetch -q --depth 1 "$REPO" "$COMMIT" ||
            { echo "source.sh: cannot fetch $REPO at $COMMIT (set DRAGUARD_NVIDIA_SRC to a clone)" >&2; exit 1; }
        git -C "$tmp" archive FETCH_HEAD "${PATHS[@]}" | tar -x -C "$tmp"
        rm -rf "$tmp/.git"
    fi
    mv -T "$tmp" "$DEST" 2>/dev/null || [[ -f "$DEST/go.mod" ]]  # a parallel run may have won
fi
ln -sfn "$DEST" "$HERE/nvidia-src"
