package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// pluginSpec is one plugin under test, from `name=ours,registrar=DIR,node=N,pid=P`.
type pluginSpec struct {
	Name      string
	Registrar string // the kubelet's plugins_registry the plugin was given
	Node      string
	PID       int
}

func parsePluginSpec(s string) (pluginSpec, error) {
	var p pluginSpec
	for kv := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return p, fmt.Errorf("plugin %q: %q is not key=value", s, kv)
		}
		switch k {
		case "name":
			p.Name = v
		case "registrar":
			p.Registrar = v
		case "node":
			p.Node = v
		case "pid":
			pid, err := strconv.Atoi(v)
			if err != nil || pid <= 0 {
				return p, fmt.Errorf("plugin %q: bad pid %q", s, v)
			}
			p.PID = pid
		default:
			return p, fmt.Errorf("plugin %q: unknown key %q", s, k)
		}
	}
	if p.Name == "" || p.Registrar == "" || p.Node == "" || p.PID == 0 {
		return p, fmt.Errorf("plugin %q: name, registrar, node and pid are required", s)
	}
	return p, nil
}

// registered is what the plugin watcher learnt from a plugin: its driver and DRA endpoint.
type registered struct {
	Driver   string
	Endpoint string
	Service  string
}

// register finds the plugin's registration socket in its registrar directory and registers it as
// kubelet v1.37.2's plugin watcher does (see kubelet-dial: same dial options, GetInfo,
// NotifyRegistrationStatus), retrying until the socket appears or ctx ends.
func register(ctx context.Context, dir string) (registered, error) {
	for {
		socks, _ := filepath.Glob(filepath.Join(dir, "*.sock"))
		if len(socks) > 0 {
			r, err := registerAt(ctx, socks[0])
			if err == nil {
				return r, nil
			}
			if ctx.Err() != nil {
				return r, err
			}
		}
		select {
		case <-ctx.Done():
			return registered{}, fmt.Errorf("no registration socket in %s: %w", dir, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func registerAt(ctx context.Context, socket string) (registered, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	//nolint:staticcheck // DialContext and WithBlock are what the kubelet's plugin watcher uses.
	conn, err := grpc.DialContext(dctx, socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
	if err != nil {
		return registered{}, fmt.Errorf("dial %s: %w", socket, err)
	}
	defer conn.Close()
	client := registerapi.NewRegistrationClient(conn)
	info, err := client.GetInfo(dctx, &registerapi.InfoRequest{})
	if err != nil {
		return registered{}, fmt.Errorf("GetInfo on %s: %w", socket, err)
	}
	r := registered{Driver: info.GetName(), Endpoint: info.GetEndpoint()}
	if r.Endpoint == "" {
		r.Endpoint = socket
	}
	// The kubelet takes the first service of the plugin's list that it knows.
	for _, v := range info.GetSupportedVersions() {
		if v == drapbv1.DRAPluginService || v == drapbv1beta1.DRAPluginService {
			r.Service = v
			break
		}
	}
	if r.Service == "" {
		return r, fmt.Errorf("%s: no DRA service the kubelet knows in %q", socket, info.GetSupportedVersions())
	}
	if _, err := client.NotifyRegistrationStatus(dctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		return r, fmt.Errorf("NotifyRegistrationStatus on %s: %w", socket, err)
	}
	return r, nil
}

// draConn is the kubelet's DRA plugin manager's connection: grpc.NewClient("unix:"+endpoint),
// one per plugin, shared by all calls.
func draConn(r registered) (drapbv1.DRAPluginClient, *grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix:"+r.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	conn.Connect()
	if r.Service == drapbv1beta1.DRAPluginService {
		return drapbv1beta1.V1Beta1ClientWrapper{DRAPluginClient: drapbv1beta1.NewDRAPluginClient(conn)}, conn, nil
	}
	return drapbv1.NewDRAPluginClient(conn), conn, nil
}

// procStat is a process's CPU time (user + system) and its resident set: now and at its peak.
type procStat struct {
	CPU     time.Duration
	RSSKiB  int64
	PeakKiB int64
}

// clockTick is USER_HZ, 100 on every Linux architecture Go runs on.
const clockTick = 100

func readProc(pid int) (procStat, error) {
	var s procStat
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	cpu, err := parseStatCPU(string(raw))
	if err != nil {
		return s, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	s.CPU = cpu
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	s.RSSKiB, s.PeakKiB = parseStatusKiB(string(status), "VmRSS:"), parseStatusKiB(string(status), "VmHWM:")
	return s, nil
}

// parseStatCPU reads utime + stime (fields 14 and 15) after the parenthesised command name,
// which may itself hold spaces and parentheses.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("only %d fields", len(f)+2)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTick, nil
}

func parseStatusKiB(status, key string) int64 {
	for line := range strings.SplitSeq(status, "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// waitDevices polls the API until node's pool of driver lists at least want devices.
func waitDevices(ctx context.Context, api *apiClient, node, driver string, want int) (string, []string, error) {
	var lastErr error
	for {
		pool, names, err := api.devices(ctx, node, driver)
		if err == nil && len(names) >= want {
			slices.Sort(names)
			return pool, names, nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return "", nil, fmt.Errorf("%s on %s: %d devices published, want %d (last error: %v)", driver, node, len(names), want, lastErr)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
