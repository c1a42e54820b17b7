package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func TestParsePluginSpec(t *testing.T) {
	p, err := parsePluginSpec("name=ours,registrar=/r,node=n1,pid=42")
	if err != nil || p != (pluginSpec{Name: "ours", Registrar: "/r", Node: "n1", PID: 42}) {
		t.Fatalf("got %+v, %v", p, err)
	}
	for _, bad := range []string{"name=ours", "name=a,registrar=/r,node=n,pid=x", "name=a,registrar=/r,node=n,pid=1,color=red", "name"} {
		if _, err := parsePluginSpec(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseOptions(t *testing.T) {
	base := []string{"--kubeconfig", "k", "--plugin", "name=ours,registrar=/a,node=a,pid=1",
		"--plugin", "name=theirs,registrar=/b,node=b,pid=2"}
	o, err := parseOptions(base)
	if err != nil || len(o.levels) != 3 || o.levels[2] != 64 {
		t.Fatalf("got %+v, %v", o, err)
	}
	if _, err := parseOptions(append(base, "--concurrency", "16,1")); err == nil {
		t.Error("falling concurrencies accepted")
	}
	if _, err := parseOptions(base[:4]); err == nil {
		t.Error("one plugin accepted")
	}
}

func TestParseStatCPU(t *testing.T) {
	// Field 14 utime = 250 ticks, field 15 stime = 150 ticks; the name holds ") (" and spaces.
	stat := "1234 (dra plugin) (x)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 3 0 5 1000 200"
	d, err := parseStatCPU(stat)
	if err != nil || d != 4*time.Second {
		t.Fatalf("got %v, %v", d, err)
	}
	if _, err := parseStatCPU("1 (x) S 1"); err == nil {
		t.Error("short stat accepted")
	}
	status := "Name:\tx\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n"
	if r, p := parseStatusKiB(status, "VmRSS:"), parseStatusKiB(status, "VmHWM:"); r != 10240 || p != 20480 {
		t.Fatalf("rss %d peak %d", r, p)
	}
	self, err := readProc(os.Getpid())
	if err != nil || self.RSSKiB <= 0 || self.PeakKiB < self.RSSKiB {
		t.Fatalf("own /proc: %+v, %v", self, err)
	}
}

func TestPercentileAndVerdicts(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p50, p99 := percentile(d, 50), percentile(d, 99); p50 != 50*time.Millisecond || p99 != 99*time.Millisecond {
		t.Fatalf("p50 %v p99 %v", p50, p99)
	}
	if percentile(nil, 99) != 0 {
		t.Fatal("empty percentile")
	}
	for _, c := range []struct {
		g            goal
		ours, theirs float64
		want         string
	}{
		{cpuGoal, 900, 300, "≥ 3×: met"},
		{cpuGoal, 300, 200, "≥ 3×: MISSED, 2.00× short" + missedSee},
		{rssGoal, 10, 42, "≤ 1/3: met"},
		{rssGoal, 20, 42, "≤ 1/3: MISSED by 6.0 MiB (needs ≤ 14.0)" + missedSee},
		{latencyGoal, 7.5, 1, "≤ 5 ms (ours): MISSED by 2.50 ms" + missedSee},
		{noGoal, 1, 2, "—"},
	} {
		if got := c.g.verdict(c.ours, c.theirs, "MiB"); got != c.want {
			t.Errorf("%s %v/%v: got %q, want %q", c.g.text, c.ours, c.theirs, got, c.want)
		}
	}
}

// fakePlugin is a DRA plugin that answers every claim at once and counts calls.
type fakePlugin struct {
	registerapi.UnimplementedRegistrationServer
	drapbv1.UnimplementedDRAPluginServer
	endpoint string
	calls    atomic.Int64
}

func (f *fakePlugin) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: "gpu.example.com", Endpoint: f.endpoint,
		SupportedVersions: []string{drapbv1.DRAPluginService}}, nil
}

func (f *fakePlugin) NotifyRegistrationStatus(context.Context, *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	return &registerapi.RegistrationStatusResponse{}, nil
}

func (f *fakePlugin) NodePrepareResources(_ context.Context, r *drapbv1.NodePrepareResourcesRequest) (*drapbv1.NodePrepareResourcesResponse, error) {
	f.calls.Add(1)
	out := &drapbv1.NodePrepareResourcesResponse{Claims: map[string]*drapbv1.NodePrepareResourceResponse{}}
	for _, c := range r.GetClaims() {
		out.Claims[c.GetUid()] = &drapbv1.NodePrepareResourceResponse{Devices: []*drapbv1.Device{{PoolName: "n", DeviceName: "gpu-0"}}}
	}
	return out, nil
}

func (f *fakePlugin) NodeUnprepareResources(_ context.Context, r *drapbv1.NodeUnprepareResourcesRequest) (*drapbv1.NodeUnprepareResourcesResponse, error) {
	f.calls.Add(1)
	out := &drapbv1.NodeUnprepareResourcesResponse{Claims: map[string]*drapbv1.NodeUnprepareResourceResponse{}}
	for _, c := range r.GetClaims() {
		out.Claims[c.GetUid()] = &drapbv1.NodeUnprepareResourceResponse{}
	}
	return out, nil
}

func serve(t *testing.T, path string, register func(*grpc.Server)) {
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
}

// TestPhaseAgainstGoPlugin registers a plugin as the kubelet would and drives a short phase.
func TestPhaseAgainstGoPlugin(t *testing.T) {
	dir := t.TempDir()
	f := &fakePlugin{endpoint: filepath.Join(dir, "dra.sock")}
	serve(t, f.endpoint, func(s *grpc.Server) { drapbv1.RegisterDRAPluginServer(s, f) })
	reg := filepath.Join(dir, "registry")
	if err := os.Mkdir(reg, 0o755); err != nil {
		t.Fatal(err)
	}
	serve(t, filepath.Join(reg, "gpu.example.com-reg.sock"), func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, f) })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := register(ctx, reg)
	if err != nil || r.Driver != "gpu.example.com" || r.Service != drapbv1.DRAPluginService {
		t.Fatalf("register: %+v, %v", r, err)
	}
	client, conn, err := draConn(r)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tg := &target{spec: pluginSpec{Name: "fake", PID: os.Getpid()}, client: client}
	for i := range 4 {
		tg.claims = append(tg.claims, claimRef{Namespace: "ns", Name: "c", UID: strings.Repeat("u", i+1)})
	}
	p, err := runPhase(ctx, tg, 4, 200*time.Millisecond)
	if err != nil || p.Pairs == 0 || len(p.Unprepare) != p.Pairs || f.calls.Load() != int64(2*p.Pairs) {
		t.Fatalf("phase: %d pairs, %d calls, %v", p.Pairs, f.calls.Load(), err)
	}

	var l level
	l.add(p)
	rep := report{Levels: []int{4}, Rounds: 1, Ours: map[int]*level{4: &l}, Theirs: map[int]*level{4: &l},
		OursMem: memory{IdleKiB: 1024, PeakKiB: 2048}, TheirsMem: memory{IdleKiB: 4096, PeakKiB: 8192}}
	var out bytes.Buffer
	rep.write(&out)
	for _, want := range []string{"peer|prepare p99, 4 concurrent|", "peer|RSS at idle, 8 devices|1.0 MiB|4.0 MiB|0.25×|≤ 1/3: met"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	for line := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		if n := strings.Count(line, "|"); n != 5 {
			t.Errorf("%d fields in %q", n, line)
		}
	}
}

func TestLabelNamesEveryPairedFigure(t *testing.T) {
	l := level{Pairs: 10, Wall: time.Second, CPU: time.Second}
	rep := report{Levels: []int{1}, Rounds: 1, Ours: map[int]*level{1: &l}, Theirs: map[int]*level{1: &l},
		LargestKiB: 1024, LargestLabel: "big", Label: "both write status"}
	var out bytes.Buffer
	rep.write(&out)
	for line := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		figure := strings.Split(line, "|")[1]
		if strings.HasSuffix(figure, ", both write status") == strings.Contains(figure, "big") {
			t.Errorf("figure %q: the label belongs on every paired figure and not on the largest profile's", figure)
		}
	}
}
