package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// plugin is a minimal Go DRA plugin that remembers the :authority of every call.
type plugin struct {
	registerapi.UnimplementedRegistrationServer
	drapbv1.UnimplementedDRAPluginServer
	drahealthv1.UnimplementedDRAResourceHealthServer

	endpoint   string
	versions   []string
	prepareErr error
	claimErr   string

	mu          sync.Mutex
	authorities map[string]string // method -> :authority
	notified    *registerapi.RegistrationStatus
}

func (p *plugin) seen(ctx context.Context, method string) {
	md, _ := metadata.FromIncomingContext(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if a := md.Get(":authority"); len(a) > 0 {
		p.authorities[method] = a[0]
	}
}

func (p *plugin) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	p.seen(ctx, "GetInfo")
	return &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: "gpu.nvidia.com", Endpoint: p.endpoint, SupportedVersions: p.versions}, nil
}

func (p *plugin) NotifyRegistrationStatus(ctx context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	p.seen(ctx, "NotifyRegistrationStatus")
	p.mu.Lock()
	p.notified = s
	p.mu.Unlock()
	return &registerapi.RegistrationStatusResponse{}, nil
}

func (p *plugin) NodePrepareResources(ctx context.Context, req *drapbv1.NodePrepareResourcesRequest) (*drapbv1.NodePrepareResourcesResponse, error) {
	p.seen(ctx, "NodePrepareResources")
	if p.prepareErr != nil {
		return nil, p.prepareErr
	}
	resp := &drapbv1.NodePrepareResourcesResponse{Claims: map[string]*drapbv1.NodePrepareResourceResponse{}}
	for _, c := range req.Claims {
		resp.Claims[c.Uid] = &drapbv1.NodePrepareResourceResponse{Error: p.claimErr, Devices: []*drapbv1.Device{{
			PoolName: "node-a", DeviceName: "gpu-0", CdiDeviceIds: []string{"k8s.gpu.nvidia.com/claim=" + c.Uid + "-gpu-0"},
		}}}
	}
	return resp, nil
}

func (p *plugin) NodeUnprepareResources(ctx context.Context, req *drapbv1.NodeUnprepareResourcesRequest) (*drapbv1.NodeUnprepareResourcesResponse, error) {
	p.seen(ctx, "NodeUnprepareResources")
	resp := &drapbv1.NodeUnprepareResourcesResponse{Claims: map[string]*drapbv1.NodeUnprepareResourceResponse{}}
	for _, c := range req.Claims {
		resp.Claims[c.Uid] = &drapbv1.NodeUnprepareResourceResponse{}
	}
	return resp, nil
}

func (p *plugin) NodeWatchResources(_ *drahealthv1.NodeWatchResourcesRequest, s grpc.ServerStreamingServer[drahealthv1.NodeWatchResourcesResponse]) error {
	p.seen(s.Context(), "NodeWatchResources")
	if err := s.Send(&drahealthv1.NodeWatchResourcesResponse{Devices: []*drahealthv1.DeviceHealth{{
		Device: &drahealthv1.DeviceIdentifier{PoolName: "node-a", DeviceName: "gpu-0"}, Health: drahealthv1.HealthStatus_HEALTHY,
	}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func serve(t *testing.T, p *plugin) (regSock string) {
	t.Helper()
	dir := t.TempDir()
	regSock = filepath.Join(dir, "gpu.nvidia.com-reg.sock")
	p.endpoint = filepath.Join(dir, "dra.sock")
	p.authorities = map[string]string{}
	for _, s := range []struct {
		path     string
		register func(*grpc.Server)
	}{
		{regSock, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, p) }},
		{p.endpoint, func(s *grpc.Server) {
			drapbv1.RegisterDRAPluginServer(s, p)
			drahealthv1.RegisterDRAResourceHealthServer(s, p)
		}},
	} {
		lis, err := net.Listen("unix", s.path)
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		s.register(srv)
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
	}
	return regSock
}

func runSteps(t *testing.T, regSock, claimUID string, health bool) []result {
	t.Helper()
	var buf bytes.Buffer
	out, failed = &buf, false
	t.Cleanup(func() { out = nil })
	info, ok := register(context.Background(), regSock, 5*time.Second)
	if ok {
		dra(context.Background(), info.Endpoint, info, claimUID, "default", "claim", health, 5*time.Second)
	}
	var res []result
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("bad output line %q: %v", line, err)
		}
		res = append(res, r)
	}
	return res
}

func TestAllStepsAgainstGoPlugin(t *testing.T) {
	p := &plugin{versions: []string{drapbv1.DRAPluginService, drahealthv1.DRAResourceHealthService}}
	reg := serve(t, p)
	res := runSteps(t, reg, "uid-1", true)
	var steps []string
	for _, r := range res {
		steps = append(steps, r.Step)
		if !r.OK {
			t.Errorf("step %s failed: %s", r.Step, r.Error)
		}
	}
	if got := strings.Join(steps, ","); got != "registration,prepare,unprepare,health" || failed {
		t.Fatalf("steps %s, failed=%v", got, failed)
	}
	if p.notified == nil || !p.notified.PluginRegistered {
		t.Fatalf("NotifyRegistrationStatus: %v", p.notified)
	}
	// The registration socket sees the percent-encoded socket path as :authority (the kubelet's
	// passthrough target); the DRA socket sees "localhost" (grpc-go's unix resolver).
	if a, want := p.authorities["GetInfo"], strings.ReplaceAll(reg, "/", "%2F"); a != want {
		t.Errorf("GetInfo :authority = %q, want the percent-encoded socket path %q", a, want)
	}
	if a := p.authorities["NodePrepareResources"]; a != "localhost" {
		t.Errorf("NodePrepareResources :authority = %q", a)
	}
	detail, _ := json.Marshal(res[1].Detail)
	if !strings.Contains(string(detail), "k8s.gpu.nvidia.com/claim=uid-1-gpu-0") {
		t.Errorf("prepare detail: %s", detail)
	}
	detail, _ = json.Marshal(res[3].Detail)
	if !strings.Contains(string(detail), `"count":1`) || !strings.Contains(string(detail), "HEALTHY") {
		t.Errorf("health detail: %s", detail)
	}
}

func TestFailures(t *testing.T) {
	// Missing socket: fails at once, not after the dial timeout.
	start := time.Now()
	res := runSteps(t, filepath.Join(t.TempDir(), "missing.sock"), "", false)
	if len(res) != 1 || res[0].OK || !strings.Contains(res[0].Error, "no such file") || !failed || time.Since(start) > 2*time.Second {
		t.Fatalf("missing socket: %+v", res)
	}

	// gRPC error from prepare: code and message are printed; unprepare still runs.
	p := &plugin{versions: []string{drapbv1.DRAPluginService}, prepareErr: status.Error(codes.Internal, "h2 protocol error: PROTOCOL_ERROR")}
	res = runSteps(t, serve(t, p), "uid-2", false)
	if len(res) != 3 || res[1].OK || res[1].Code != "Internal" || !strings.Contains(res[1].Error, "PROTOCOL_ERROR") || !res[2].OK {
		t.Fatalf("prepare error: %+v", res)
	}

	// Per-claim error, and --health without an advertised health service.
	p = &plugin{versions: []string{drapbv1.DRAPluginService}, claimErr: "no such device"}
	res = runSteps(t, serve(t, p), "uid-3", true)
	if len(res) != 4 || res[1].OK || !strings.Contains(res[1].Error, "no such device") || res[3].OK {
		t.Fatalf("claim error: %+v", res)
	}

	// Unsupported service versions: the kubelet refuses and tells the plugin.
	p = &plugin{versions: []string{"v1alpha3.Node"}}
	res = runSteps(t, serve(t, p), "", false)
	if len(res) != 1 || res[0].OK || p.notified == nil || p.notified.PluginRegistered || p.notified.Error == "" {
		t.Fatalf("bad versions: %+v, notified %v", res, p.notified)
	}
}
