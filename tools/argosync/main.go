// argosync applies a set of manifests to a cluster the way Argo CD syncs an Application: with
// gitops-engine, the library Argo CD's application controller runs. Sync waves, hooks, kind ordering,
// the dry-run of every task before the first apply, client-side apply (or Replace=true) and the wait
// for each wave to be healthy before the next are gitops-engine's own.
//
//	argosync --kubeconfig FILE --manifests FILE [--replace] [--timeout 120s] [--app NAME]
//
// It prints one JSON document: the operation's phase and message, the result of every task, and
// the gitops-engine health of every managed object after the sync. Exit status: 0 when the sync
// succeeded, 1 when it failed, 2 when it did not finish within --timeout, 3 on bad usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/argoproj/argo-cd/gitops-engine/pkg/cache"
	"github.com/argoproj/argo-cd/gitops-engine/pkg/health"
	"github.com/argoproj/argo-cd/gitops-engine/pkg/sync"
	"github.com/argoproj/argo-cd/gitops-engine/pkg/sync/common"
	"github.com/argoproj/argo-cd/gitops-engine/pkg/utils/kube"
	"github.com/argoproj/argo-cd/gitops-engine/pkg/utils/tracing"
)

// Argo CD's default resource tracking (annotation): <app>:<group>/<kind>:<namespace>/<name>.
const trackingAnnotation = "argocd.argoproj.io/tracking-id"

type taskResult struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	HookType  string `json:"hookType,omitempty"`
	HookPhase string `json:"hookPhase,omitempty"`
	SyncPhase string `json:"syncPhase,omitempty"`
	Order     int    `json:"order"`
	Message   string `json:"message,omitempty"`
}

type objHealth struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Health    string `json:"health"`
	Message   string `json:"message,omitempty"`
}

type report struct {
	Phase   string       `json:"phase"`
	Message string       `json:"message"`
	Results []taskResult `json:"results"`
	Health  []objHealth  `json:"health"`
}

func trackingID(app string, u *unstructured.Unstructured) string {
	gvk := u.GroupVersionKind()
	return fmt.Sprintf("%s:%s/%s:%s/%s", app, gvk.Group, gvk.Kind, u.GetNamespace(), u.GetName())
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster to sync to")
	manifests := flag.String("manifests", "", "YAML file with the desired objects (e.g. kustomize build output)")
	replace := flag.Bool("replace", false, "sync option Replace=true (kubectl replace/create instead of apply)")
	timeout := flag.Duration("timeout", 120*time.Second, "give up when the sync has not finished by then")
	app := flag.String("app", "draguard", "application name used for resource tracking")
	namespace := flag.String("namespace", "draguard-system", "the application's destination namespace")
	verbosity := flag.Int("v", 0, "gitops-engine log verbosity (logs go to stderr)")
	flag.Parse()
	if *kubeconfig == "" || *manifests == "" {
		fmt.Fprintln(os.Stderr, "argosync: --kubeconfig and --manifests are required")
		os.Exit(3)
	}
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(*verbosity), textlogger.Output(os.Stderr)))
	klog.SetLogger(log)
	code, err := run(log, *kubeconfig, *manifests, *app, *namespace, *replace, *timeout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "argosync: %v\n", err)
	}
	os.Exit(code)
}

func run(log logr.Logger, kubeconfig, manifests, app, namespace string, replace bool, timeout time.Duration) (int, error) {
	data, err := os.ReadFile(manifests)
	if err != nil {
		return 3, err
	}
	target, err := kube.SplitYAML(data)
	if err != nil {
		return 3, fmt.Errorf("%s: %w", manifests, err)
	}
	for _, u := range target {
		ann := u.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[trackingAnnotation] = trackingID(app, u)
		u.SetAnnotations(ann)
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return 3, err
	}
	clusterCache := cache.NewClusterCache(config,
		cache.SetLogr(log),
		cache.SetPopulateResourceInfoHandler(func(un *unstructured.Unstructured, _ bool) (any, bool) {
			id := un.GetAnnotations()[trackingAnnotation]
			return id, id != ""
		}),
	)
	if err := clusterCache.EnsureSynced(); err != nil {
		return 1, fmt.Errorf("cluster cache: %w", err)
	}
	defer clusterCache.Invalidate()
	isManaged := func(r *cache.Resource) bool {
		id, _ := r.Info.(string)
		return id != "" && r.Resource != nil && id == trackingID(app, r.Resource)
	}
	kubectl := &kube.KubectlCmd{Log: log, Tracer: tracing.NopTracer{}}
	revision := fmt.Sprintf("rev-%d", time.Now().UnixNano())
	deadline := time.Now().Add(timeout)

	// Argo CD's application controller runs an operation as a sequence of sync-context passes, each
	// built from a fresh reconciliation of Git against the cluster cache and resumed from the state the
	// previous pass left (controller/sync.go): a wave waits until its objects are healthy in the cache.
	var (
		phase     common.OperationPhase
		message   string
		results   []common.ResourceSyncResult
		startedAt = metav1.Now()
		syncErr   error
	)
	for {
		live, err := clusterCache.GetManagedLiveObjs(target, isManaged)
		if err != nil {
			return 1, err
		}
		recon := sync.Reconcile(target, live, namespace, clusterCache)
		opts := []sync.SyncOpt{sync.WithReplace(replace), sync.WithLogr(log), sync.WithManifestValidation(true)}
		if phase != "" {
			opts = append(opts, sync.WithInitialState(phase, message, results, startedAt))
		}
		syncCtx, cleanup, err := sync.NewSyncContext(revision, recon, config, config, kubectl, namespace, opts...)
		if err != nil {
			return 1, fmt.Errorf("sync context: %w", err)
		}
		syncCtx.Sync()
		phase, message, results = syncCtx.GetState()
		cleanup()
		if phase.Completed() {
			if phase != common.OperationSucceeded {
				syncErr = fmt.Errorf("sync %s: %s", phase, message)
			}
			break
		}
		if time.Now().After(deadline) {
			syncErr = context.DeadlineExceeded
			break
		}
		time.Sleep(time.Second)
	}

	rep := report{Phase: string(phase), Message: message, Results: []taskResult{}, Health: []objHealth{}}
	code := 0
	switch {
	case errors.Is(syncErr, context.DeadlineExceeded):
		rep.Phase, rep.Message, code = "Running", fmt.Sprintf("not finished after %s: %s", timeout, message), 2
	case syncErr != nil:
		code = 1
	}
	for _, r := range results {
		rep.Results = append(rep.Results, taskResult{
			Kind: r.ResourceKey.Kind, Namespace: r.ResourceKey.Namespace, Name: r.ResourceKey.Name,
			Status: string(r.Status), HookType: string(r.HookType), HookPhase: string(r.HookPhase),
			SyncPhase: string(r.SyncPhase), Order: r.Order, Message: r.Message,
		})
		if code == 0 && (r.Status == "SyncFailed" || r.HookPhase == "Failed" || r.HookPhase == "Error") {
			rep.Phase, rep.Message, code = "Failed", fmt.Sprintf("%s %s: %s", r.ResourceKey.Kind, r.ResourceKey.Name, r.Message), 1
		}
	}
	// The cache follows the cluster through watches: give it a moment to see the last wave's objects.
	var live map[kube.ResourceKey]*unstructured.Unstructured
	for wait := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if live, err = clusterCache.GetManagedLiveObjs(target, isManaged); err != nil {
			return 1, err
		}
		missing := 0
		for _, u := range target {
			if live[kube.GetResourceKey(u)] == nil {
				missing++
			}
		}
		if missing == 0 || syncErr != nil || time.Now().After(wait) {
			break
		}
	}
	for _, u := range target {
		key := kube.GetResourceKey(u)
		obj := live[key]
		h := objHealth{Kind: key.Kind, Namespace: key.Namespace, Name: key.Name, Health: "Missing"}
		if obj != nil {
			st, err := health.GetResourceHealth(obj, nil)
			switch {
			case err != nil:
				h.Health, h.Message = "Unknown", err.Error()
			case st == nil:
				h.Health = "Healthy" // kinds without a health check (ConfigMaps, RBAC, ...) count as healthy
			default:
				h.Health, h.Message = string(st.Status), st.Message
			}
		}
		rep.Health = append(rep.Health, h)
	}
	sort.Slice(rep.Health, func(i, j int) bool {
		a, b := rep.Health[i], rep.Health[j]
		return a.Kind+"/"+a.Namespace+"/"+a.Name < b.Kind+"/"+b.Namespace+"/"+b.Name
	})
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return 1, err
	}
	return code, nil
}
