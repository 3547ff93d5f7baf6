// fluxapply applies a set of manifests to a cluster the way Flux's kustomize-controller reconciles a
// Kustomization: with github.com/fluxcd/pkg/ssa, Flux's apply engine. Server-side apply under the
// field manager kustomize-controller, staged (CRDs and Namespaces, then class-type kinds, then the
// rest), every object dry-run before any is applied, the kustomize.toolkit.fluxcd.io/{force,
// reconcile, ssa} annotations honoured, the owner labels set, and kubectl's field managers and
// last-applied annotation cleaned up, as kustomize-controller configures it. With --wait it then
// waits for the set with kstatus, as `spec.wait: true` does.
//
//	fluxapply --kubeconfig FILE --manifests FILE [--wait] [--timeout 120s] [--name draguard]
//
// It prints one JSON document: the change set (object, action) and, with --wait, the wait's error.
// Exit status: 0 applied (and ready with --wait), 1 apply failed, 2 not ready in time, 3 bad usage.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling"
	"github.com/fluxcd/pkg/ssa"
	"github.com/fluxcd/pkg/ssa/utils"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

const group = "kustomize.toolkit.fluxcd.io"

type entry struct {
	Subject string `json:"subject"`
	Action  string `json:"action"`
}

type report struct {
	Applied bool    `json:"applied"`
	Error   string  `json:"error,omitempty"`
	Changes []entry `json:"changes"`
	Waited  bool    `json:"waited"`
	Ready   bool    `json:"ready"`
	WaitErr string  `json:"waitError,omitempty"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster to apply to")
	manifests := flag.String("manifests", "", "YAML file with the desired objects (e.g. kustomize build output)")
	wait := flag.Bool("wait", false, "wait for every applied object to be ready (Kustomization spec.wait)")
	timeout := flag.Duration("timeout", 120*time.Second, "apply and wait timeout (Kustomization spec.timeout)")
	name := flag.String("name", "draguard", "name of the Kustomization (owner labels)")
	namespace := flag.String("namespace", "flux-system", "namespace of the Kustomization (owner labels)")
	flag.Parse()
	if *kubeconfig == "" || *manifests == "" {
		fmt.Fprintln(os.Stderr, "fluxapply: --kubeconfig and --manifests are required")
		os.Exit(3)
	}
	code, err := run(*kubeconfig, *manifests, *name, *namespace, *wait, *timeout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fluxapply: %v\n", err)
	}
	os.Exit(code)
}

func newManager(cfg *rest.Config) (*ssa.ResourceManager, error) {
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	kube, err := client.New(cfg, client.Options{HTTPClient: httpClient, Mapper: mapper})
	if err != nil {
		return nil, err
	}
	poller := polling.NewStatusPoller(kube, mapper, polling.Options{})
	return ssa.NewResourceManager(kube, poller, ssa.Owner{Field: "kustomize-controller", Group: group}), nil
}

func run(kubeconfig, manifests, name, namespace string, wait bool, timeout time.Duration) (int, error) {
	data, err := os.ReadFile(manifests)
	if err != nil {
		return 3, err
	}
	objects, err := utils.ReadObjects(bytes.NewReader(data))
	if err != nil {
		return 3, fmt.Errorf("%s: %w", manifests, err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return 3, err
	}
	man, err := newManager(cfg)
	if err != nil {
		return 1, err
	}
	man.SetOwnerLabels(objects, name, namespace)

	// The options kustomize-controller sets for every reconciliation.
	opts := ssa.DefaultApplyOptions()
	opts.Force = false
	opts.ExclusionSelector = map[string]string{group + "/reconcile": "disabled"}
	opts.IfNotPresentSelector = map[string]string{group + "/ssa": "IfNotPresent"}
	opts.ForceSelector = map[string]string{group + "/force": "enabled"}
	opts.Cleanup = ssa.ApplyCleanupOptions{
		Annotations: []string{corev1.LastAppliedConfigAnnotation},
		FieldManagers: []ssa.FieldManager{
			{Name: "kubectl", OperationType: metav1.ManagedFieldsOperationApply},
			{Name: "kubectl", OperationType: metav1.ManagedFieldsOperationUpdate},
			{Name: "before-first-apply", OperationType: metav1.ManagedFieldsOperationUpdate},
		},
		Exclusions: map[string]string{group + "/ssa": "Ignore"},
	}
	opts.WaitTimeout = timeout

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rep := report{Changes: []entry{}}
	code := 0
	cs, applyErr := man.ApplyAllStaged(ctx, objects, opts)
	if cs != nil {
		for _, e := range cs.Entries {
			rep.Changes = append(rep.Changes, entry{Subject: e.Subject, Action: string(e.Action)})
		}
	}
	if applyErr != nil {
		rep.Error, code = applyErr.Error(), 1
	} else {
		rep.Applied = true
		if wait {
			rep.Waited = true
			werr := man.WaitForSet(cs.ToObjMetadataSet(), ssa.WaitOptions{Interval: 2 * time.Second, Timeout: timeout})
			if werr != nil {
				rep.WaitErr, code = werr.Error(), 2
			} else {
				rep.Ready = true
			}
		}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return 1, err
	}
	return code, nil
}
