package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// target is one plugin under load: its DRA client, its claims (one device each) and its pid.
type target struct {
	spec    pluginSpec
	reg     registered
	pool    string
	devices []string // the first --devices of its pool, sorted
	client  drapbv1.DRAPluginClient
	claims  []claimRef
	// apiPID is the kube-apiserver's pid (0: not measured): phases run one plugin at a time, so
	// the server's CPU during a phase is the cost that plugin's calls put on it.
	apiPID int
}

// phase is what one plugin did at one concurrency in one round.
type phase struct {
	Prepare, Unprepare []time.Duration
	Pairs              int
	Wall, CPU, APICPU  time.Duration
}

// callTimeout bounds one call; the kubelet's own default is 45 s, far beyond what either plugin
// needs here, so a call that long is a failure of the run, not a figure.
const callTimeout = 20 * time.Second

// settle is how long after a phase the CPU counter is read again, so that work a plugin finishes
// in the background (ours writes status.devices after each call) is charged to the phase.
const settle = 300 * time.Millisecond

// runPhase has `concurrency` workers, each owning one claim as a pod's kubelet sync would, prepare
// and unprepare their claim in a loop until `dur` has passed.
func runPhase(ctx context.Context, t *target, concurrency int, dur time.Duration) (phase, error) {
	var p phase
	before, err := readProc(t.spec.PID)
	if err != nil {
		return p, fmt.Errorf("%s: %w", t.spec.Name, err)
	}
	apiBefore := apiCPU(t.apiPID)
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(dur)
	for w := range concurrency {
		wg.Go(func() {
			claim := t.claims[w]
			var prep, unprep []time.Duration
			for time.Now().Before(deadline) && ctx.Err() == nil {
				dp, err := call(ctx, t.client, claim, true)
				if err == nil {
					var du time.Duration
					du, err = call(ctx, t.client, claim, false)
					prep, unprep = append(prep, dp), append(unprep, du)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("%s, claim %s/%s: %w", t.spec.Name, claim.Namespace, claim.Name, err)
					}
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			p.Prepare, p.Unprepare = append(p.Prepare, prep...), append(p.Unprepare, unprep...)
			mu.Unlock()
		})
	}
	wg.Wait()
	p.Wall = time.Since(start)
	p.Pairs = len(p.Prepare)
	if firstErr != nil {
		return p, firstErr
	}
	time.Sleep(settle)
	after, err := readProc(t.spec.PID)
	if err != nil {
		return p, fmt.Errorf("%s: %w", t.spec.Name, err)
	}
	p.CPU = after.CPU - before.CPU
	p.APICPU = apiCPU(t.apiPID) - apiBefore
	return p, nil
}

// apiCPU is the API server's CPU time so far, 0 when it is not measured or cannot be read.
func apiCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	s, err := readProc(pid)
	if err != nil {
		return 0
	}
	return s.CPU
}

// call sends one claim's NodePrepareResources (prepare) or NodeUnprepareResources and checks the
// answer as the kubelet does: a result for this claim and no error in it.
func call(ctx context.Context, client drapbv1.DRAPluginClient, c claimRef, prepare bool) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	claims := []*drapbv1.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: c.UID}}
	start := time.Now()
	var claimErr string
	var found bool
	if prepare {
		resp, err := client.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: claims})
		if err != nil {
			return 0, fmt.Errorf("NodePrepareResources: %w", err)
		}
		var r *drapbv1.NodePrepareResourceResponse
		r, found = resp.GetClaims()[c.UID]
		if found && r.GetError() == "" && len(r.GetDevices()) == 0 {
			claimErr = "no devices prepared"
		} else {
			claimErr = r.GetError()
		}
	} else {
		resp, err := client.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: claims})
		if err != nil {
			return 0, fmt.Errorf("NodeUnprepareResources: %w", err)
		}
		var r *drapbv1.NodeUnprepareResourceResponse
		r, found = resp.GetClaims()[c.UID]
		claimErr = r.GetError()
	}
	d := time.Since(start)
	switch {
	case !found:
		return d, fmt.Errorf("no result for claim %s", c.UID)
	case claimErr != "":
		return d, fmt.Errorf("claim error: %s", claimErr)
	}
	return d, nil
}
