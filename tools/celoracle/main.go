// Command celoracle prints Kubernetes' own verdict on DRA CEL device selectors.
//
// It reads JSON lines {"id", "selector", "device"} on stdin and writes one JSON
// line per input on stdout:
//
//	create: what the API server's resource validation says when a DeviceClass
//	        and a ResourceClaim carrying the selector are created (rejected,
//	        with the field errors, including the estimated-cost limit);
//	eval:   what the scheduler's CEL cache and DeviceMatches say for the device
//	        ("match", "nomatch" or "error" with the runtime error), computed
//	        only when the selector is accepted at create time.
//
// It is built from the same pinned Kubernetes modules as the control plane,
// with the default feature gates of that release.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/cel/environment"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/kubernetes/pkg/apis/resource"
	"k8s.io/kubernetes/pkg/apis/resource/validation"
	"k8s.io/kubernetes/pkg/features"
)

type input struct {
	ID       json.RawMessage    `json:"id"`
	Selector string             `json:"selector"`
	Device   *resourcev1.Device `json:"device"`
	Driver   string             `json:"driver"`
}

type createVerdict struct {
	Rejected bool     `json:"rejected"`
	Class    []string `json:"class,omitempty"`
	Claim    []string `json:"claim,omitempty"`
	Cost     *uint64  `json:"cost,omitempty"`
}

type output struct {
	ID     json.RawMessage `json:"id"`
	Create createVerdict   `json:"create"`
	Eval   string          `json:"eval,omitempty"`
	Error  string          `json:"error,omitempty"`
}

func messages(errs field.ErrorList) []string {
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

func validateCreate(expr string) createVerdict {
	sel := []resource.DeviceSelector{{CEL: &resource.CELDeviceSelector{Expression: expr}}}
	class := &resource.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "oracle"},
		Spec:       resource.DeviceClassSpec{Selectors: sel},
	}
	claim := &resource.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "oracle", Namespace: "default"},
		Spec: resource.ResourceClaimSpec{Devices: resource.DeviceClaim{Requests: []resource.DeviceRequest{{
			Name: "req",
			Exactly: &resource.ExactDeviceRequest{
				DeviceClassName: "oracle",
				Selectors:       sel,
				AllocationMode:  resource.DeviceAllocationModeExactCount,
				Count:           1,
			},
		}}}},
	}
	v := createVerdict{
		Class: messages(validation.ValidateDeviceClass(class)),
		Claim: messages(validation.ValidateResourceClaim(claim)),
	}
	v.Rejected = len(v.Class) > 0 || len(v.Claim) > 0
	return v
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-bench" {
		bench()
		return
	}
	gates := dracel.Features{
		EnableConsumableCapacity: utilfeature.DefaultFeatureGate.Enabled(features.DRAConsumableCapacity),
		EnableListTypeAttributes: utilfeature.DefaultFeatureGate.Enabled(features.DRAListTypeAttributes),
	}
	cache := dracel.NewCache(64, gates)
	// The estimated cost, as the API server computes it, for the report only.
	compiler := dracel.GetCompiler(gates)
	newExpressions := environment.NewExpressions
	verdicts := map[string]createVerdict{}

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 16<<20)
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	enc := json.NewEncoder(w)
	ctx := context.Background()
	for in.Scan() {
		var req input
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintf(os.Stderr, "celoracle: bad input line: %v\n", err)
			os.Exit(2)
		}
		out := output{ID: req.ID}
		v, ok := verdicts[req.Selector]
		if !ok {
			v = validateCreate(req.Selector)
			if len(req.Selector) <= resource.CELSelectorExpressionMaxLength {
				if r := compiler.CompileCELExpression(req.Selector, dracel.Options{EnvType: &newExpressions}); r.Error == nil {
					cost := r.MaxCost
					v.Cost = &cost
				}
			}
			verdicts[req.Selector] = v
		}
		out.Create = v
		if !v.Rejected && req.Device != nil {
			expr := cache.GetOrCompile(req.Selector)
			if expr.Error != nil {
				out.Eval = "error"
				out.Error = "compile: " + expr.Error.Error()
			} else {
				d := dracel.Device{
					Driver:     req.Driver,
					Attributes: req.Device.Attributes,
					Capacity:   req.Device.Capacity,
				}
				if gates.EnableConsumableCapacity {
					d.AllowMultipleAllocations = req.Device.AllowMultipleAllocations
				}
				matches, _, err := expr.DeviceMatches(ctx, d)
				switch {
				case err != nil:
					out.Eval = "error"
					out.Error = dracel.EnhanceRuntimeError(err).Error()
				case matches:
					out.Eval = "match"
				default:
					out.Eval = "nomatch"
				}
			}
		}
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(os.Stderr, "celoracle: write: %v\n", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "celoracle: read: %v\n", err)
		os.Exit(2)
	}
}

// bench times Kubernetes' CEL on the same inputs: per selector, the API server's compile (with
// cost estimation, as create-time validation does) and DeviceMatches per device. One JSON line
// per input: {"id", "compile_us", "eval_us"}.
func bench() {
	gates := dracel.Features{
		EnableConsumableCapacity: utilfeature.DefaultFeatureGate.Enabled(features.DRAConsumableCapacity),
		EnableListTypeAttributes: utilfeature.DefaultFeatureGate.Enabled(features.DRAListTypeAttributes),
	}
	compiler := dracel.GetCompiler(gates)
	newExpressions := environment.NewExpressions
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 16<<20)
	enc := json.NewEncoder(os.Stdout)
	ctx := context.Background()
	for in.Scan() {
		var req input
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintf(os.Stderr, "celoracle: bad input line: %v\n", err)
			os.Exit(2)
		}
		const compiles = 200
		start := time.Now()
		var expr dracel.CompilationResult
		for i := 0; i < compiles; i++ {
			expr = compiler.CompileCELExpression(req.Selector, dracel.Options{EnvType: &newExpressions})
		}
		compileUS := float64(time.Since(start).Microseconds()) / compiles
		evalUS := -1.0
		if expr.Error == nil && req.Device != nil {
			d := dracel.Device{Driver: req.Driver, Attributes: req.Device.Attributes, Capacity: req.Device.Capacity}
			const evals = 20000
			start = time.Now()
			for i := 0; i < evals; i++ {
				_, _, _ = expr.DeviceMatches(ctx, d)
			}
			evalUS = float64(time.Since(start).Nanoseconds()) / evals / 1000
		}
		_ = enc.Encode(map[string]any{"id": req.ID, "compile_us": compileUS, "eval_us": evalUS})
	}
}
