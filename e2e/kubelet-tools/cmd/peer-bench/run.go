package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"
)

func run(ctx context.Context, o options) error {
	api, err := newAPIClient(o.kubeconfig)
	if err != nil {
		return err
	}
	if err := api.ensureNamespace(ctx, o.namespace); err != nil {
		return err
	}
	setupCtx, cancel := context.WithTimeout(ctx, o.setupTimeout)
	defer cancel()
	targets := make([]*target, len(o.plugins))
	for i, p := range o.plugins {
		reg, pool, devices, err := setUp(setupCtx, api, p, o.devices)
		if err != nil {
			return err
		}
		targets[i] = &target{spec: p, apiPID: o.apiPID, reg: reg, pool: pool, devices: devices[:o.devices]}
	}
	largestLabel := o.largestLabel
	for _, p := range o.idle {
		_, _, names, err := setUp(setupCtx, api, p, 1)
		if err != nil {
			return err
		}
		largestLabel = fmt.Sprintf("%s, %d devices", o.largestLabel, len(names))
	}
	idle, largest, err := idleRSS(ctx, o)
	if err != nil {
		return err
	}
	for _, t := range targets {
		if err := prepareTarget(ctx, api, o, t, o.levels[len(o.levels)-1]); err != nil {
			return err
		}
	}
	levels, err := drive(ctx, o, targets)
	if err != nil {
		return err
	}
	rep := report{Levels: o.levels, Rounds: o.rounds, LargestKiB: largest, LargestLabel: largestLabel, Label: o.label}
	return finish(o, rep, levels, idle)
}

// idleRSS waits until the plugins have been idle for a while (all published, nothing called),
// reads their RSS, then stops the idle-only plugin so that it leaves the CPU to the load.
func idleRSS(ctx context.Context, o options) (idle []int64, largest int64, err error) {
	fmt.Printf("idle for %s before reading RSS\n", o.idleSettle)
	select {
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	case <-time.After(o.idleSettle):
	}
	for _, p := range append(slices.Clone(o.plugins), o.idle...) {
		s, err := readProc(p.PID)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", p.Name, err)
		}
		idle = append(idle, s.RSSKiB)
	}
	for i, p := range o.idle {
		largest = idle[len(o.plugins)+i]
		if err := syscall.Kill(p.PID, syscall.SIGTERM); err != nil {
			fmt.Fprintf(os.Stderr, "stopping %s (pid %d): %v\n", p.Name, p.PID, err)
		}
	}
	return idle[:len(o.plugins)], largest, nil
}

// finish reads the peak RSS of both plugins and prints the summary and the peer rows.
func finish(o options, rep report, levels []map[int]*level, idle []int64) error {
	oi, ti := 0, 1
	if o.plugins[1].Name == o.ours {
		oi, ti = 1, 0
	}
	rep.Ours, rep.Theirs = levels[oi], levels[ti]
	for i, m := range []*memory{&rep.OursMem, &rep.TheirsMem} {
		idx := []int{oi, ti}[i]
		s, err := readProc(o.plugins[idx].PID)
		if err != nil {
			return fmt.Errorf("%s: %w", o.plugins[idx].Name, err)
		}
		m.IdleKiB, m.PeakKiB = idle[idx], s.PeakKiB
	}
	rep.summary(os.Stdout, o.plugins[oi].Name, o.plugins[ti].Name)
	fmt.Printf("RSS idle %.1f vs %.1f MiB, peak %.1f vs %.1f MiB", mib(rep.OursMem.IdleKiB), mib(rep.TheirsMem.IdleKiB),
		mib(rep.OursMem.PeakKiB), mib(rep.TheirsMem.PeakKiB))
	if rep.LargestKiB > 0 {
		fmt.Printf(", ours (%s) idle %.1f MiB", rep.LargestLabel, mib(rep.LargestKiB))
	}
	fmt.Println()
	rep.write(os.Stdout)
	return nil
}

// setUp registers p as the kubelet would and waits until its node's pool has want devices.
func setUp(ctx context.Context, api *apiClient, p pluginSpec, want int) (registered, string, []string, error) {
	reg, err := register(ctx, p.Registrar)
	if err != nil {
		return reg, "", nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	pool, names, err := waitDevices(ctx, api, p.Node, reg.Driver, want)
	if err != nil {
		return reg, "", nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	fmt.Printf("%s: driver %s on node %s (%s), %d devices in pool %s, pid %d\n",
		p.Name, reg.Driver, p.Node, reg.Service, len(names), pool, p.PID)
	return reg, pool, names, nil
}

// prepareTarget creates n claims for t, one device each (round robin over devices), connects to
// its DRA socket and prepares and unprepares every claim once, so that first-call costs (claim
// cache, CDI directory, connection) stay out of the figures.
func prepareTarget(ctx context.Context, api *apiClient, o options, t *target, n int) error {
	for i := range n {
		c, err := api.createAllocatedClaim(ctx, o.namespace, fmt.Sprintf("%s-%02d", t.spec.Name, i),
			t.reg.Driver, t.reg.Driver, t.pool, t.devices[i%len(t.devices)])
		if err != nil {
			return fmt.Errorf("%s: %w", t.spec.Name, err)
		}
		t.claims = append(t.claims, c)
	}
	client, _, err := draConn(t.reg)
	if err != nil {
		return fmt.Errorf("%s: %w", t.spec.Name, err)
	}
	t.client = client
	for _, c := range t.claims {
		for _, prep := range []bool{true, false} {
			if _, err := call(ctx, client, c, prep); err != nil {
				return fmt.Errorf("%s, warm-up of %s: %w", t.spec.Name, c.Name, err)
			}
		}
	}
	return nil
}

// drive runs every round over every concurrency, both plugins one after the other; which goes
// first alternates, so neither always inherits the other's page cache or background work.
func drive(ctx context.Context, o options, targets []*target) ([]map[int]*level, error) {
	levels := make([]map[int]*level, len(targets))
	for i := range targets {
		levels[i] = map[int]*level{}
		for _, c := range o.levels {
			levels[i][c] = &level{}
		}
	}
	for r := range o.rounds {
		for li, c := range o.levels {
			order := []int{0, 1}
			if (r+li)%2 == 1 {
				order = []int{1, 0}
			}
			line := fmt.Sprintf("round %d/%d, %d concurrent:", r+1, o.rounds, c)
			for _, i := range order {
				p, err := runPhase(ctx, targets[i], c, o.phase)
				if err != nil {
					return nil, err
				}
				levels[i][c].add(p)
				line += fmt.Sprintf("  %s %d pairs, p99 %.2f/%.2f ms, CPU %s", targets[i].spec.Name, p.Pairs,
					ms(percentile(p.Prepare, 99)), ms(percentile(p.Unprepare, 99)), p.CPU.Round(10*time.Millisecond))
			}
			fmt.Println(line)
		}
	}
	return levels, nil
}
