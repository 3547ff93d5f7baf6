#!/usr/bin/env bash
# Regenerate the image's hashed locks from the pins in constraints.txt:
#   image/requirements.lock  the runtime dependencies of pyproject.toml with the webhook and driver
#                            extras, every file's sha256
#   image/build.lock         the build backend pyproject.toml's [build-system] pins
# image/install.sh installs both with `pip install --require-hashes`, in the Containerfile and in
# the local builder alike.  Run after changing a dependency or a pin (it queries the package index;
# a few minutes).  tests/dev/test_image_recipe.py fails when a lock and constraints.txt disagree.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PIP_TOOLS=pip-tools==7.6.2
say() { printf '[lock-image %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
say "installing $PIP_TOOLS in a throwaway venv"
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q "$PIP_TOOLS"
backend="$(sed -n 's/^requires = \["\(setuptools==[^"]*\)"\]$/\1/p' "$ROOT/pyproject.toml")"
[[ -n "$backend" ]] || { echo "pyproject.toml: [build-system] requires must pin one setuptools==X" >&2; exit 1; }
cd "$ROOT"
common=(--quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --no-emit-trusted-host
        --no-emit-find-links)
say "image/build.lock ($backend)"
echo "$backend" | "$tmp/venv/bin/pip-compile" "${common[@]}" -o image/build.lock -
say "image/requirements.lock (runtime dependencies, pins from constraints.txt)"
# The image runs the webhook and the driver: their extras, on top of what the offline commands need.
PIP_FIND_LINKS= "$tmp/venv/bin/pip-compile" "${common[@]}" --extra webhook --extra driver -c constraints.txt \
    -o image/requirements.lock pyproject.toml
say "done"
