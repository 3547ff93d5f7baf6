#!/usr/bin/env bash
# The PR comment of draguard's GitHub Action: one comment, found by its marker and edited on each push,
# instead of a new comment per run. Needs GH_TOKEN (pull-requests: write), PR, REPO and REPORT.
set -euo pipefail
MARKER="<!-- draguard-review -->"
body="$(printf '%s\n\n' "$MARKER"; cat "$REPORT")"
# GitHub refuses comment bodies over 65,536 characters: keep the head and say where the rest is.
if (( ${#body} > 60000 )); then
    body="${body:0:60000}"$'\n\n'"_The report is longer than a comment holds; the whole report is in the job's SARIF upload and annotations._"
fi
id="$(gh api "repos/$REPO/issues/$PR/comments" --paginate \
      --jq ".[] | select(.body | startswith(\"$MARKER\")) | .id" | head -n 1)"
if [[ -n "$id" ]]; then
    gh api --method PATCH "repos/$REPO/issues/comments/$id" -f body="$body" >/dev/null
else
    gh api --method POST "repos/$REPO/issues/$PR/comments" -f body="$body" >/dev/null
fi
