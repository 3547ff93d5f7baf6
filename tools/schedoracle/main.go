// Command schedoracle prints what Kubernetes' structured allocator, the code
// kube-scheduler's DynamicResources plugin runs for each node, decides for a set
// of ResourceClaims.
//
// It reads JSON lines on stdin, one scenario each:
//
//	{"id": any, "deviceClasses": [DeviceClass], "resourceSlices": [ResourceSlice],
//	 "claims": [ResourceClaim], "allocatedClaims": [ResourceClaim],
//	 "deviceTaintRules": [DeviceTaintRule],
//	 "node": {"name": "n", "labels": {...}}}
//
// `claims` are allocated together on the node, as the scheduler does for the
// claims of one pod; `allocatedClaims` carry a status.allocation and stand for
// the devices other pods already hold (turned into the allocator's
// AllocatedState the way the scheduler's allocated-device tracker does it).
//
// It writes one JSON line per scenario:
//
//	{"id": any, "allocated": bool, "results": [[{request, driver, pool, device, shareID?, consumedCapacity?}]], "error": "..."}
//
// "allocated" false with no error means the claims do not fit on that node;
// an error means the scheduler would refuse the claims outright (a fatal
// allocation error such as a CEL runtime error).
//
// The allocator runs with the DRA features kube-scheduler v1.37.2 enables by
// default.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/dynamic-resource-allocation/structured"
)

type nodeSpec struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

type scenario struct {
	ID               json.RawMessage                `json:"id"`
	DeviceClasses    []*resourceapi.DeviceClass     `json:"deviceClasses"`
	ResourceSlices   []*resourceapi.ResourceSlice   `json:"resourceSlices"`
	Claims           []*resourceapi.ResourceClaim   `json:"claims"`
	AllocatedClaims  []*resourceapi.ResourceClaim   `json:"allocatedClaims"`
	DeviceTaintRules []*resourceapi.DeviceTaintRule `json:"deviceTaintRules"`
	Node             nodeSpec                       `json:"node"`
}

type pick struct {
	Request          string                                          `json:"request"`
	Driver           string                                          `json:"driver"`
	Pool             string                                          `json:"pool"`
	Device           string                                          `json:"device"`
	Shared           bool                                            `json:"shared,omitempty"`
	AdminAccess      bool                                            `json:"adminAccess,omitempty"`
	ConsumedCapacity map[resourceapi.QualifiedName]resource.Quantity `json:"consumedCapacity,omitempty"`
}

type output struct {
	ID        json.RawMessage `json:"id"`
	Allocated bool            `json:"allocated"`
	Results   [][]pick        `json:"results,omitempty"`
	Error     string          `json:"error,omitempty"`
}

// features are the allocator features kube-scheduler v1.37.2 turns on with its
// default feature gates (pkg/features: GA or beta-on-by-default in 1.37).
var features = structured.Features{
	AdminAccess:             true, // DRAAdminAccess: GA
	ConsumableCapacity:      true, // DRAConsumableCapacity: beta, on
	DeviceBindingAndStatus:  true, // DRADeviceBindingConditions (beta, on) + DRAResourceClaimDeviceStatus (GA)
	DeviceTaints:            true, // DRADeviceTaints: GA
	FractionalCapacityRange: true, // DRAFractionalCapacityRange: beta, on
	PartitionableDevices:    true, // DRAPartitionableDevices: beta, on
	PrioritizedList:         true, // DRAPrioritizedList: GA
	// Off by default in 1.37: DerivedAttributes, CompatibilityGroups,
	// ListTypeAttributes, OptionalNodeOperations.
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// allocatedState mirrors the scheduler's allocated-device tracker: admin-access
// results hold nothing, results with a shareID are shares (with their consumed
// capacity), every other result holds its device exclusively.
func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range claims {
		if c == nil || c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID != nil {
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
				continue
			}
			state.AllocatedDevices.Insert(id)
		}
	}
	return state
}

// defaults applies what the API server's defaulting would to a claim read
// from plain JSON (the allocator expects stored objects).
func defaults(c *resourceapi.ResourceClaim) {
	fix := func(mode *resourceapi.DeviceAllocationMode, count *int64, tols []resourceapi.DeviceToleration) {
		if *mode == "" {
			*mode = resourceapi.DeviceAllocationModeExactCount
		}
		if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
			*count = 1
		}
		for i := range tols {
			if tols[i].Operator == "" {
				tols[i].Operator = resourceapi.DeviceTolerationOpEqual
			}
		}
	}
	for i := range c.Spec.Devices.Requests {
		r := &c.Spec.Devices.Requests[i]
		if r.Exactly != nil {
			fix(&r.Exactly.AllocationMode, &r.Exactly.Count, r.Exactly.Tolerations)
		}
		for j := range r.FirstAvailable {
			sub := &r.FirstAvailable[j]
			fix(&sub.AllocationMode, &sub.Count, sub.Tolerations)
		}
	}
}

// patchedSlices returns the slices as the scheduler sees them: with the taints
// of DeviceTaintRules added by the same ResourceSlice tracker kube-scheduler
// runs (here over an in-memory client holding just these objects).
func patchedSlices(ctx context.Context, slices []*resourceapi.ResourceSlice, rules []*resourceapi.DeviceTaintRule) ([]*resourceapi.ResourceSlice, error) {
	if len(rules) == 0 {
		return slices, nil
	}
	objs := make([]runtime.Object, 0, len(slices)+len(rules))
	for _, s := range slices {
		objs = append(objs, s)
	}
	for _, r := range rules {
		objs = append(objs, r)
	}
	// The plain object tracker, as kube-scheduler's own tests feed the slice tracker.
	client := fake.NewSimpleClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	ctx, cancel := context.WithCancel(ctx)
	t, err := tracker.StartTracker(ctx, tracker.Options{
		EnableDeviceTaintRules:   true,
		EnableConsumableCapacity: true,
		SliceInformer:            factory.Resource().V1().ResourceSlices(),
		TaintInformer:            factory.Resource().V1().DeviceTaintRules(),
		KubeClient:               client,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("starting the ResourceSlice tracker: %w", err)
	}
	factory.Start(ctx.Done())
	// The informers end with the context: cancel first, then wait for them.
	defer func() {
		cancel()
		t.Stop()
		factory.Shutdown()
	}()
	select {
	case <-t.HasSyncedChecker().Done():
	case <-ctx.Done():
		return nil, errors.New("the ResourceSlice tracker did not sync")
	}
	return t.ListPatchedResourceSlices()
}

func run(s *scenario) output {
	out := output{ID: s.ID}
	classes := classLister{}
	for _, c := range s.DeviceClasses {
		classes[c.Name] = c
	}
	// The scheduler refuses a claim naming a class that does not exist before
	// it allocates; so does this.
	for _, c := range s.Claims {
		for _, r := range c.Spec.Devices.Requests {
			names := []string{}
			if r.Exactly != nil {
				names = append(names, r.Exactly.DeviceClassName)
			}
			for _, sub := range r.FirstAvailable {
				names = append(names, sub.DeviceClassName)
			}
			for _, n := range names {
				if _, ok := classes[n]; !ok {
					out.Error = fmt.Sprintf("request %s: DeviceClass %s does not exist", r.Name, n)
					return out
				}
			}
		}
	}
	for _, c := range s.Claims {
		defaults(c)
	}
	for i, c := range s.Claims {
		if c.UID == "" {
			c.UID = types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i))
		}
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.Node.Name, Labels: s.Node.Labels}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	slices, err := patchedSlices(ctx, s.ResourceSlices, s.DeviceTaintRules)
	if err != nil {
		out.Error = "bad input: " + err.Error()
		return out
	}
	alloc, err := structured.NewAllocator(ctx, features, allocatedState(s.AllocatedClaims), classes,
		slices, dracel.NewCache(100, dracel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		out.Error = err.Error()
		return out
	}
	results, err := alloc.Allocate(ctx, node, s.Claims)
	if err != nil {
		if errors.Is(err, structured.ErrFailedAllocationOnNode) {
			// Only this node fails (e.g. a pool is incomplete): not allocatable here.
			return out
		}
		out.Error = err.Error()
		return out
	}
	if results == nil {
		return out
	}
	out.Allocated = true
	for _, res := range results {
		var picks []pick
		for _, r := range res.Devices.Results {
			p := pick{Request: r.Request, Driver: r.Driver, Pool: r.Pool, Device: r.Device,
				Shared: r.ShareID != nil, AdminAccess: r.AdminAccess != nil && *r.AdminAccess}
			if len(r.ConsumedCapacity) > 0 {
				p.ConsumedCapacity = r.ConsumedCapacity
			}
			picks = append(picks, p)
		}
		out.Results = append(out.Results, picks)
	}
	return out
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 64<<20)
	enc := json.NewEncoder(os.Stdout)
	for in.Scan() {
		line := in.Bytes()
		if len(line) == 0 {
			continue
		}
		var s scenario
		var out output
		if err := json.Unmarshal(line, &s); err != nil {
			out = output{Error: "bad input: " + err.Error()}
		} else {
			out = run(&s)
		}
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "reading stdin:", err)
		os.Exit(1)
	}
}
