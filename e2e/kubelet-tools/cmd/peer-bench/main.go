// Command peer-bench measures two DRA kubelet plugins side by side, each on its own node of one
// real control plane, through the gRPC client the kubelet uses (registration as the plugin
// watcher does it, then grpc.NewClient("unix:"+endpoint) per plugin, as kubelet-dial).
//
// For each plugin it waits for its ResourceSlices, reads its RSS at idle, creates one
// ResourceClaim per concurrent caller through the API (one device each, allocated through the
// status subresource), then, for every round and concurrency, lets that many callers prepare and
// unprepare their claim in a loop for a fixed time. The plugin measured first alternates between
// rounds and concurrencies. CPU time comes from /proc/<pid>/stat (utime + stime), memory from
// /proc/<pid>/status (VmRSS, VmHWM). Output: a human table, then `peer|figure|ours|theirs|ratio|goal`
// lines for tools/perf-table.py.
//
// Usage:
//
//	peer-bench --kubeconfig PATH --plugin name=ours,registrar=DIR,node=N,pid=P
//	    --plugin name=theirs,registrar=DIR,node=N,pid=P [--idle-plugin name=..,...]
//	    [--concurrency 1,16,64] [--rounds 3] [--phase 8s] [--idle-settle 20s] [--apiserver-pid P]
//	    [--label TEXT]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	kubeconfig   string
	namespace    string
	plugins      []pluginSpec
	idle         []pluginSpec
	ours         string
	largestLabel string
	label        string
	devices      int
	levels       []int
	rounds       int
	phase        time.Duration
	idleSettle   time.Duration
	setupTimeout time.Duration
	apiPID       int
}

type specList struct{ specs *[]pluginSpec }

func (s specList) String() string { return "" }
func (s specList) Set(v string) error {
	p, err := parsePluginSpec(v)
	if err == nil {
		*s.specs = append(*s.specs, p)
	}
	return err
}

func parseLevels(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad concurrency %q", f)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("concurrencies must rise: %q", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("peer-bench", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig with server, certificate-authority and token (required)")
	fs.StringVar(&o.namespace, "namespace", "peer-bench", "namespace of the claims (created, labelled for admin access)")
	fs.Var(specList{&o.plugins}, "plugin", "plugin under load: name=N,registrar=DIR,node=NODE,pid=PID (exactly two)")
	fs.Var(specList{&o.idle}, "idle-plugin", "plugin measured at idle only, then sent SIGTERM (at most one, ours)")
	fs.StringVar(&o.ours, "ours", "ours", "name of our plugin among --plugin; the other is theirs")
	fs.StringVar(&o.largestLabel, "idle-label", "largest profile", "what the --idle-plugin runs, for the figure's name")
	fs.StringVar(&o.label, "label", "", "what sets this pairing apart (e.g. how each is configured), appended to every figure's name")
	fs.IntVar(&o.devices, "devices", 8, "devices each plugin under load publishes")
	levels := fs.String("concurrency", "1,16,64", "concurrent callers per phase, rising")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds over every concurrency")
	fs.DurationVar(&o.phase, "phase", 8*time.Second, "how long each plugin is driven per round and concurrency")
	fs.DurationVar(&o.idleSettle, "idle-settle", 20*time.Second, "wait after every plugin published before reading idle RSS")
	fs.IntVar(&o.apiPID, "apiserver-pid", 0, "kube-apiserver pid: its CPU per pair is reported too (0: not measured)")
	fs.DurationVar(&o.setupTimeout, "setup-timeout", 3*time.Minute, "deadline for registration and publishing")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.levels, err = parseLevels(*levels); err != nil {
		return o, err
	}
	switch {
	case o.kubeconfig == "" || fs.NArg() != 0:
		return o, fmt.Errorf("--kubeconfig is required and no arguments are taken")
	case len(o.plugins) != 2 || (o.plugins[0].Name != o.ours && o.plugins[1].Name != o.ours):
		return o, fmt.Errorf("two --plugin, one of them named %q", o.ours)
	case len(o.idle) > 1 || o.rounds < 1 || o.phase <= 0 || o.devices < 1:
		return o, fmt.Errorf("at most one --idle-plugin, --rounds ≥ 1, --phase > 0, --devices ≥ 1")
	}
	return o, nil
}

func main() {
	o, err := parseOptions(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer-bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "peer-bench:", err)
		os.Exit(1)
	}
}
