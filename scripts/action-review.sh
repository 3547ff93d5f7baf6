#!/usr/bin/env bash
# The review step of draguard's GitHub Action (action.yml): one run of `draguard review` writes the
# annotations, the SARIF file and the Markdown comment; the exit code decides the job afterwards.
#
# Safe on pull requests from forks: the policies (and the inventory) are read from the base branch by
# default, so a pull request cannot add a PolicyException or loosen a policy to pass its own check.
#
# Environment (set by action.yml from its inputs):
#   DRAGUARD_PATHS        files/directories to review, space-separated (default: .)
#   DRAGUARD_POLICIES     the policy directory, relative to the repository (default: policies)
#   DRAGUARD_INVENTORY    an inventory file, relative to the repository (optional)
#   DRAGUARD_TRUSTED_FROM base | head: where policies and inventory are read from (default: base)
#   DRAGUARD_BASE_REF     the target branch (github.base_ref); empty outside pull requests
#   DRAGUARD_FAIL_ON      error | warning | info | never (default: error)
#   DRAGUARD_OUT          where the reports go (default: $RUNNER_TEMP or a temporary directory)
#   GITHUB_OUTPUT         outputs: exit-code, sarif, markdown
set -uo pipefail

paths="${DRAGUARD_PATHS:-.}"
policies="${DRAGUARD_POLICIES:-policies}"
inventory="${DRAGUARD_INVENTORY:-}"
trusted="${DRAGUARD_TRUSTED_FROM:-base}"
base="${DRAGUARD_BASE_REF:-}"
fail_on="${DRAGUARD_FAIL_ON:-error}"
out="${DRAGUARD_OUT:-${RUNNER_TEMP:-$(mktemp -d)}}"
output="${GITHUB_OUTPUT:-/dev/null}"

die() { echo "::error title=draguard::$*"; echo "exit-code=2" >> "$output"; exit 2; }

case "$trusted" in base|head) ;; *) die "trusted-from must be base or head, not '$trusted'" ;; esac
case "$fail_on" in error|warning|info|never) ;; *) die "fail-on must be error, warning, info or never, not '$fail_on'" ;; esac
mkdir -p "$out" || die "cannot create the report directory $out"

base_rev=""
if [[ -n "$base" ]]; then
    base_rev="origin/$base"
    git rev-parse --verify --quiet "$base_rev^{commit}" >/dev/null ||
        die "the base branch $base_rev is not in this checkout: check out with fetch-depth: 0"
fi

if [[ "$trusted" == base && -n "$base_rev" ]]; then
    # The base branch's files, extracted with git (no checkout of the pull request's tree is trusted).
    trusted_dir="$out/trusted-base"
    rm -rf "$trusted_dir" && mkdir -p "$trusted_dir"
    git archive --format=tar "$base_rev" -- "$policies" 2>/dev/null | tar -x -C "$trusted_dir" ||
        die "$policies does not exist on $base_rev; add the policies there first, or set trusted-from: head"
    policies="$trusted_dir/$policies"
    if [[ -n "$inventory" ]]; then
        git archive --format=tar "$base_rev" -- "$inventory" 2>/dev/null | tar -x -C "$trusted_dir" ||
            die "$inventory does not exist on $base_rev; add it there first, or set trusted-from: head"
        inventory="$trusted_dir/$inventory"
    fi
fi

read -r -a path_args <<<"$paths"
args=(review "${path_args[@]}" --policies "$policies" --fail-on "$fail_on"
      --format github --format "sarif=$out/draguard.sarif" --format "markdown=$out/draguard.md")
[[ -n "$inventory" ]] && args+=(--inventory "$inventory")
[[ -n "$base_rev" ]] && args+=(--base "$base_rev")

draguard "${args[@]}"
rc=$?
{
    echo "exit-code=$rc"
    echo "sarif=$out/draguard.sarif"
    echo "markdown=$out/draguard.md"
} >> "$output"
# 1 (findings at the fail-on level) is decided by the action's last step, after every report is
# posted; 2 (unreadable input, a broken kustomization, a bad policy) fails here.
[[ $rc -le 1 ]] || exit "$rc"
exit 0
