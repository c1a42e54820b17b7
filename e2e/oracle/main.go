// Command oracle is the differential reference for the Rust simulator: it runs the upstream
// Kubernetes DRA CEL environment and structured allocator (k8s.io/dynamic-resource-allocation
// v0.37.2, the scheduler's feature set) on cases read as JSON from stdin and prints the answers as
// JSON, in the same shape the Rust side produces.
//
// Modes: default (cases on stdin -> answers on stdout); "bench-cel" and "bench-alloc" print timings.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type Node struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

type EvalCase struct {
	Expression string     `json:"expression"`
	Device     cel.Device `json:"device"`
}

type Case struct {
	Classes   []*resourceapi.DeviceClass   `json:"classes"`
	Slices    []*resourceapi.ResourceSlice `json:"slices"`
	Claims    []*resourceapi.ResourceClaim `json:"claims"`
	Allocated []*resourceapi.ResourceClaim `json:"allocated"`
	Node      *Node                        `json:"node"`
	Evals     []EvalCase                   `json:"evals"`
	// CostRuns, when set, replaces costRuns for this case's evaluations (the CEL-only cases do
	// not compare costs and run once).
	CostRuns int `json:"cost_runs"`
}

type EvalAnswer struct {
	Result  string `json:"result"`
	Message string `json:"message,omitempty"`
	// Cost is cel-go's actual runtime cost of the evaluation, when it reports one (not for
	// compile errors, nor for attributes that fail conversion before evaluation starts). Go
	// iterates maps in a random order, so a comprehension that stops early over a map can cost
	// differently from one run to the next: CostMax is the highest of costRuns runs, Cost the
	// lowest.
	Cost    *uint64 `json:"cost,omitempty"`
	CostMax *uint64 `json:"cost_max,omitempty"`
}

// costRuns is how often an evaluation runs for its cost range. With at most six keys per map, a
// key comes first in a run with a chance of about 1/6: 64 runs would miss it with a chance of
// 1e-5, about 1e-3 over the differential's 91 varying evaluations (a flaky mismatch in one test
// run of a thousand); 128 runs bring that under 1e-8.
const costRuns = 128

type Answer struct {
	Status  string                         `json:"status,omitempty"`
	Error   string                         `json:"error,omitempty"`
	Results []resourceapi.AllocationResult `json:"results,omitempty"`
	Evals   []EvalAnswer                   `json:"evals,omitempty"`
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, errors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}, name)
}

var features = structured.Features{
	AdminAccess:             true,
	PrioritizedList:         true,
	PartitionableDevices:    true,
	DeviceTaints:            true,
	DeviceBindingAndStatus:  true,
	ConsumableCapacity:      true,
	FractionalCapacityRange: true,
}

var celCache = cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true})

func defaults(claims []*resourceapi.ResourceClaim) {
	for _, c := range claims {
		for i := range c.Spec.Devices.Requests {
			r := &c.Spec.Devices.Requests[i]
			if r.Exactly != nil {
				if r.Exactly.AllocationMode == "" {
					r.Exactly.AllocationMode = resourceapi.DeviceAllocationModeExactCount
				}
				if r.Exactly.AllocationMode == resourceapi.DeviceAllocationModeExactCount && r.Exactly.Count == 0 {
					r.Exactly.Count = 1
				}
			}
			for j := range r.FirstAvailable {
				s := &r.FirstAvailable[j]
				if s.AllocationMode == "" {
					s.AllocationMode = resourceapi.DeviceAllocationModeExactCount
				}
				if s.AllocationMode == resourceapi.DeviceAllocationModeExactCount && s.Count == 0 {
					s.Count = 1
				}
			}
		}
	}
}

func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	st := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID != nil {
				st.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				st.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			} else {
				st.AllocatedDevices.Insert(id)
			}
		}
	}
	return st
}

func allocate(ctx context.Context, c *Case) Answer {
	lister := classLister{}
	for _, cl := range c.Classes {
		lister[cl.Name] = cl
	}
	defaults(c.Claims)
	a, err := structured.NewAllocator(ctx, features, allocatedState(c.Allocated), lister, c.Slices, celCache)
	if err != nil {
		return Answer{Status: "error", Error: err.Error()}
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.Node.Name, Labels: c.Node.Labels}}
	res, err := a.Allocate(ctx, node, c.Claims)
	if err != nil {
		return Answer{Status: "error", Error: err.Error()}
	}
	if res == nil {
		return Answer{Status: "unsatisfiable"}
	}
	for i := range res {
		for j := range res[i].Devices.Results {
			if res[i].Devices.Results[j].ShareID != nil {
				s := "share"
				res[i].Devices.Results[j].ShareID = (*types.UID)(&s)
			}
		}
	}
	return Answer{Status: "ok", Results: res}
}

// compileOne compiles through the cache. cel-go's planner panics on some constant map literals
// (keys Go cannot hash: bytes, semver); the API server would answer such a request with an
// internal error, so the expression can never be stored: reported as a compile error.
func compileOne(expr string) (r cel.CompilationResult, panicked error) {
	defer func() {
		if p := recover(); p != nil {
			panicked = fmt.Errorf("panic: %v", p)
		}
	}()
	return celCache.GetOrCompile(expr), nil
}

func evalOne(ctx context.Context, e EvalCase, runs int) EvalAnswer {
	r, panicked := compileOne(e.Expression)
	if panicked != nil {
		return EvalAnswer{Result: "compile_error", Message: panicked.Error()}
	}
	if r.Error != nil {
		return EvalAnswer{Result: "compile_error", Message: r.Error.Error()}
	}
	m, details, err := r.DeviceMatches(ctx, e.Device)
	var cost, costMax *uint64
	if details != nil {
		cost = details.ActualCost()
	}
	if cost != nil {
		lo, hi := *cost, *cost
		for i := 1; i < runs; i++ {
			_, d, _ := r.DeviceMatches(ctx, e.Device)
			c := *d.ActualCost()
			lo, hi = min(lo, c), max(hi, c)
		}
		cost, costMax = &lo, &hi
	}
	if err != nil {
		return EvalAnswer{Result: "error", Message: err.Error(), Cost: cost, CostMax: costMax}
	}
	return EvalAnswer{Result: fmt.Sprint(m), Cost: cost, CostMax: costMax}
}

func main() {
	ctx := context.Background()
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	var cases []Case
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		fmt.Fprintln(os.Stderr, "oracle: decoding cases:", err)
		os.Exit(2)
	}
	switch mode {
	case "bench-cel":
		benchCEL(ctx, cases)
		return
	case "bench-alloc":
		benchAlloc(ctx, cases)
		return
	}
	answers := make([]Answer, len(cases))
	for i := range cases {
		c := &cases[i]
		var a Answer
		if c.Node != nil {
			a = allocate(ctx, c)
		}
		runs := costRuns
		if c.CostRuns > 0 {
			runs = c.CostRuns
		}
		for _, e := range c.Evals {
			a.Evals = append(a.Evals, evalOne(ctx, e, runs))
		}
		answers[i] = a
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(answers); err != nil {
		fmt.Fprintln(os.Stderr, "oracle:", err)
		os.Exit(2)
	}
}

// benchCEL evaluates every (expression, device) pair of the first case repeatedly for ~2s and
// prints evaluations per second.
func benchCEL(ctx context.Context, cases []Case) {
	evals := cases[0].Evals
	for _, e := range evals {
		celCache.GetOrCompile(e.Expression)
	}
	n := 0
	start := time.Now()
	for time.Since(start) < 2*time.Second {
		for _, e := range evals {
			r := celCache.GetOrCompile(e.Expression)
			_, _, _ = r.DeviceMatches(ctx, e.Device)
			n++
		}
	}
	el := time.Since(start)
	fmt.Printf("{\"evals\": %d, \"seconds\": %f, \"per_sec\": %f}\n", n, el.Seconds(), float64(n)/el.Seconds())
}

// benchAlloc runs the scheduler Filter for one pod over every node named in the slices of the
// first case (a fresh allocator per pod, like one scheduling cycle), repeated for ~3s.
func benchAlloc(ctx context.Context, cases []Case) {
	c := &cases[0]
	defaults(c.Claims)
	lister := classLister{}
	for _, cl := range c.Classes {
		lister[cl.Name] = cl
	}
	names := sets.New[string]()
	for _, s := range c.Slices {
		if s.Spec.NodeName != nil {
			names.Insert(*s.Spec.NodeName)
		}
	}
	nodes := sets.List(names)
	pod := func() int {
		a, err := structured.NewAllocator(ctx, features, allocatedState(c.Allocated), lister, c.Slices, celCache)
		if err != nil {
			panic(err)
		}
		fits := 0
		for _, n := range nodes {
			node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
			res, err := a.Allocate(ctx, node, c.Claims)
			if err != nil && !strings.Contains(err.Error(), "invalid resource pools") {
				panic(err)
			}
			if res != nil {
				fits++
			}
		}
		return fits
	}
	// The first pod reads every object for the first time since decoding; it is timed on its own
	// and left out of the steady figure, as on the Rust side. At least three pods after it: the
	// garbage collector marks the whole decoded heap about once per pod, and a single pod took
	// anywhere from 3 to 8 s depending on whether a cycle fell inside it.
	start := time.Now()
	pod()
	first := time.Since(start)
	// BENCH_PODS (sim-bench --pods) asks for more pods, so that collections of the whole heap
	// count in the average at the rate they really happen.
	minPods := 3
	if v, err := strconv.Atoi(os.Getenv("BENCH_PODS")); err == nil && v > 0 {
		minPods = v
	}
	iters, fits := 0, 0
	start = time.Now()
	for iters < minPods || time.Since(start) < 3*time.Second {
		fits = pod()
		iters++
	}
	el := time.Since(start)
	fmt.Printf("{\"pods\": %d, \"nodes\": %d, \"fits\": %d, \"seconds_per_pod\": %f, \"first_pod_seconds\": %f}\n", iters, len(nodes), fits, el.Seconds()/float64(iters), first.Seconds())
}
