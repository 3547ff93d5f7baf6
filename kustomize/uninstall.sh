#!/usr/bin/env bash
# Remove draguard from a cluster in the safe order: webhook configurations first, so that no API
# request waits on (or, failing closed, is refused by) a webhook that is going away.
#
#   kustomize/uninstall.sh OVERLAY_DIR [--force]
#
# Stops with exit status 2, before touching the driver, while ResourceClaims allocated from
# gpu.nvidia.com remain (their pods should end first, so a live plugin unprepares them); --force
# goes on anyway. Uses kubectl's current context (KUBECONFIG / --context are kubectl's).
set -euo pipefail
overlay="${1:-}"
force="${2:-}"
[[ -n "$overlay" && -f "$overlay/kustomization.yaml" ]] ||
    { echo "usage: $0 OVERLAY_DIR [--force]   (e.g. kustomize/overlays/eks)" >&2; exit 64; }
say() { printf '[uninstall] %s\n' "$*"; }
ns=draguard-system

say "1/4 webhook configurations (admission stops calling draguard)"
kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration draguard --ignore-not-found
say "2/4 the webhook, its certificate machinery and the caBundle policy"
kubectl -n "$ns" delete deployment,service,poddisruptionbudget draguard-webhook --ignore-not-found
kubectl -n "$ns" delete job/draguard-certs cronjob/draguard-certs-renew --ignore-not-found
kubectl delete validatingadmissionpolicybinding,validatingadmissionpolicy draguard-webhook-cabundle-only \
    --ignore-not-found

say "3/4 the driver, once no claim allocated from gpu.nvidia.com is left"
held="$(kubectl get resourceclaims -A -o \
    jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {.status.allocation.devices.results[*].driver}{"\n"}{end}' |
    awk '/gpu\.nvidia\.com/ {print $1}')"
if [[ -n "$held" && "$force" != "--force" ]]; then
    say "claims still allocated from gpu.nvidia.com (end their pods first, or pass --force):"
    printf '  %s\n' $held
    exit 2
fi
kubectl -n draguard-driver delete daemonset draguard-driver --ignore-not-found
kubectl delete resourceslices --field-selector spec.driver=gpu.nvidia.com --ignore-not-found

say "4/4 everything else of $overlay (DeviceClasses, policies, RBAC, the namespaces and their Secrets)"
# The PolicyReport CRDs are shared with other tools (Kyverno installs the same two): deleting a CRD
# deletes every report of its kind, so they stay while any report not written by draguard exists.
report_crds='policyreports.wgpolicyk8s.io clusterpolicyreports.wgpolicyk8s.io'
mine='app.kubernetes.io/managed-by=draguard-audit'
others="$( { kubectl get policyreports.wgpolicyk8s.io -A -l "${mine/=/!=}" -o name 2>/dev/null
            kubectl get clusterpolicyreports.wgpolicyk8s.io -l "${mine/=/!=}" -o name 2>/dev/null; } |
          wc -l)"
if (( others > 0 )); then
    say "keeping the CRDs $report_crds: $others reports of other tools use them"
    kubectl delete policyreports.wgpolicyk8s.io -A -l "$mine" --ignore-not-found
    kubectl delete clusterpolicyreports.wgpolicyk8s.io -l "$mine" --ignore-not-found
    # kubectl kustomize separates documents with a line '---'; drop the two CRDs' documents.
    kubectl kustomize "$overlay" | awk -v names="$report_crds" '
        function flush() {
            if (doc != "" && !(doc ~ /\nkind: CustomResourceDefinition\n/ && doc ~ drop)) printf "%s---\n", doc
            doc = ""
        }
        BEGIN { n = split(names, a, " "); drop = "\n  name: ("; for (i = 1; i <= n; i++) drop = drop (i > 1 ? "|" : "") a[i]; drop = drop ")\n" }
        $0 == "---" { flush(); next }
        { doc = doc (doc == "" ? "\n" : "") $0 "\n" }
        END { flush() }' |
        kubectl delete -f - --ignore-not-found --wait=false
else
    kubectl delete -k "$overlay" --ignore-not-found --wait=false
fi
say "done"
