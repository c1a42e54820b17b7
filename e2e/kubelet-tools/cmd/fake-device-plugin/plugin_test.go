package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// dialPlugin dials a device plugin socket as kubelet v1.37.2's device manager does
// (pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go): grpc.DialContext with the bare path as
// target, authority "localhost", a Unix context dialer, blocking until connected.
func dialPlugin(ctx context.Context, socket string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	//nolint:staticcheck // DialContext and WithBlock are what the kubelet uses.
	return grpc.DialContext(ctx, socket,
		grpc.WithAuthority("localhost"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
}

// registration is what the fake kubelet saw in one successful Register call.
type registration struct {
	req  *pluginapi.RegisterRequest
	opts *pluginapi.DevicePluginOptions // from GetDevicePluginOptions on the dialed-back plugin
}

// fakeKubelet serves Registration on a socket. Like the kubelet, Register dials the plugin at
// dir(socket)/endpoint and calls GetDevicePluginOptions before answering; it fails while
// failNext > 0.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	socket   string
	srv      *grpc.Server
	regs     chan registration
	failNext atomic.Int32
}

func startFakeKubelet(t *testing.T, socket string) *fakeKubelet {
	t.Helper()
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{socket: socket, srv: grpc.NewServer(), regs: make(chan registration, 10)}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(lis) }()
	t.Cleanup(k.srv.Stop)
	return k
}

func (k *fakeKubelet) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if k.failNext.Add(-1) >= 0 {
		return nil, status.Error(codes.Unavailable, "injected failure")
	}
	conn, err := dialPlugin(ctx, filepath.Join(filepath.Dir(k.socket), req.Endpoint))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	opts, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return nil, err
	}
	k.regs <- registration{req: req, opts: opts}
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) waitRegistration(t *testing.T) registration {
	t.Helper()
	select {
	case r := <-k.regs:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no registration within 10s")
		return registration{}
	}
}

func (k *fakeKubelet) noRegistration(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case r := <-k.regs:
		t.Fatalf("unexpected registration %v", r.req)
	case <-time.After(d):
	}
}

// startPlugin runs the plugin in the background; the returned function stops it and returns
// run's error.
func startPlugin(t *testing.T, cfg config) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, cfg) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Second):
			return errors.New("plugin did not stop within 10s")
		}
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func readRecords(t *testing.T, path string) []allocateRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []allocateRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r allocateRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad record %q: %v", sc.Text(), err)
		}
		if _, err := time.Parse(time.RFC3339Nano, r.Time); err != nil {
			t.Fatalf("bad time in record %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestSocketName(t *testing.T) {
	for resource, want := range map[string]string{
		"nvidia.com/gpu":          "nvidia-gpu.sock",
		"nvidia.com/mig-1g.10gb":  "nvidia-mig-1g.10gb.sock",
		"example.org/a b":         "example-a-b.sock",
		"vendor/thing":            "vendor-thing.sock",
		"gpu":                     "",
		"nvidia.com/":             "",
		"nvidia.com/gpu/extra":    "",
		"/gpu":                    "",
		"nvidia.example.com/fpga": "nvidia-fpga.sock",
	} {
		got, err := socketName(resource)
		if want == "" {
			if err == nil {
				t.Errorf("socketName(%q) = %q, want an error", resource, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("socketName(%q) = %q, %v; want %q", resource, got, err, want)
		}
	}
}

func TestRegisterListAndWatchAllocate(t *testing.T) {
	dir := t.TempDir()
	kubelet := startFakeKubelet(t, filepath.Join(dir, "kubelet.sock"))
	record := filepath.Join(dir, "allocations.jsonl")
	stop := startPlugin(t, config{
		kubeletSocket: kubelet.socket, socketDir: dir, resource: "nvidia.com/gpu", devices: 3,
		recordPath: record, poll: 50 * time.Millisecond,
	})

	reg := kubelet.waitRegistration(t)
	if reg.req.Version != "v1beta1" || reg.req.Endpoint != "nvidia-gpu.sock" || reg.req.ResourceName != "nvidia.com/gpu" {
		t.Fatalf("register request %v", reg.req)
	}
	if reg.req.Options.GetPreStartRequired() || reg.req.Options.GetGetPreferredAllocationAvailable() {
		t.Errorf("register options %v, want none", reg.req.Options)
	}
	if reg.opts.PreStartRequired || reg.opts.GetPreferredAllocationAvailable {
		t.Errorf("GetDevicePluginOptions %v, want none", reg.opts)
	}
	kubelet.noRegistration(t, 300*time.Millisecond) // registered once, not on every poll

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	socket := filepath.Join(dir, "nvidia-gpu.sock")
	conn, err := dialPlugin(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)

	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range resp.Devices {
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s health %q", d.ID, d.Health)
		}
		ids = append(ids, d.ID)
	}
	if want := []string{"GPU-fake-0", "GPU-fake-1", "GPU-fake-2"}; !slices.Equal(ids, want) {
		t.Fatalf("devices %q, want %q", ids, want)
	}
	// The stream stays open with no further messages.
	next := make(chan error, 1)
	go func() {
		_, err := stream.Recv()
		next <- err
	}()
	select {
	case err := <-next:
		t.Fatalf("ListAndWatch stream: second Recv returned %v, want it to block", err)
	case <-time.After(300 * time.Millisecond):
	}

	alloc, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-fake-1"}},
		{DevicesIds: []string{"GPU-fake-2", "GPU-fake-0"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(alloc.ContainerResponses) != 2 {
		t.Fatalf("Allocate: %d container responses, want 2", len(alloc.ContainerResponses))
	}
	for i, want := range []string{"GPU-fake-1", "GPU-fake-2,GPU-fake-0"} {
		cr := alloc.ContainerResponses[i]
		if len(cr.Envs) != 1 || cr.Envs["NVIDIA_VISIBLE_DEVICES"] != want {
			t.Errorf("container %d: envs %v, want NVIDIA_VISIBLE_DEVICES=%s", i, cr.Envs, want)
		}
		if len(cr.Mounts)+len(cr.Devices)+len(cr.CdiDevices)+len(cr.Annotations) != 0 {
			t.Errorf("container %d: unexpected response %v", i, cr)
		}
	}
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"GPU-fake-0"}}, {DevicesIds: []string{"GPU-fake-3"}},
	}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Allocate of an unknown device: %v, want InvalidArgument", err)
	}
	recs := readRecords(t, record)
	if len(recs) != 2 || !slices.Equal(recs[0].DeviceIDs, []string{"GPU-fake-1"}) ||
		!slices.Equal(recs[1].DeviceIDs, []string{"GPU-fake-2", "GPU-fake-0"}) ||
		recs[0].Resource != "nvidia.com/gpu" || recs[1].Resource != "nvidia.com/gpu" {
		t.Errorf("records %+v", recs)
	}

	if r, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: ids, AllocationSize: 1}},
	}); err != nil || len(r.ContainerResponses) != 0 {
		t.Errorf("GetPreferredAllocation: %v, %v", r, err)
	}
	if _, err := client.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"GPU-fake-0"}}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}

	// Shutting down ends the ListAndWatch stream and removes the socket.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-next:
		if err == nil {
			t.Error("ListAndWatch stream: got a second message")
		} else if !errors.Is(err, io.EOF) && status.Code(err) != codes.Unavailable {
			t.Logf("ListAndWatch stream ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("ListAndWatch stream still open after shutdown")
	}
	if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after shutdown: %v", err)
	}
}

// TestReregister follows a kubelet restart: the kubelet socket appears only after the plugin
// started, a Register call fails and is retried, then the kubelet goes away and a new one deletes
// the sockets of the directory (the plugin's too) and creates its socket again.
func TestReregister(t *testing.T) {
	dir := t.TempDir()
	kubeletSocket := filepath.Join(dir, "kubelet.sock")
	socket := filepath.Join(dir, "nvidia-gpu.sock")
	startPlugin(t, config{
		kubeletSocket: kubeletSocket, socketDir: dir, resource: "nvidia.com/gpu", devices: 1, poll: 50 * time.Millisecond,
	})
	time.Sleep(200 * time.Millisecond) // polls without a kubelet socket

	kubelet := startFakeKubelet(t, kubeletSocket)
	kubelet.failNext.Store(1)
	if r := kubelet.waitRegistration(t); r.req.Endpoint != "nvidia-gpu.sock" {
		t.Fatalf("register request %v", r.req)
	}
	if n := kubelet.failNext.Load(); n >= 0 {
		t.Fatalf("failNext = %d: the failing Register call was not made", n)
	}
	kubelet.noRegistration(t, 300*time.Millisecond)
	first, err := statID(socket)
	if err != nil {
		t.Fatal(err)
	}

	// Kubelet restart: the old one exits, the new one cleans the directory and listens again.
	kubelet.srv.Stop()
	for _, p := range []string{kubeletSocket, socket} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	kubelet = startFakeKubelet(t, kubeletSocket)
	if r := kubelet.waitRegistration(t); r.req.ResourceName != "nvidia.com/gpu" {
		t.Fatalf("register request %v", r.req)
	}
	// The fake reports a registration before its answer reaches the plugin; give the answer time
	// to arrive (a lost answer would show up here as a second registration).
	kubelet.noRegistration(t, 300*time.Millisecond)
	second, err := statID(socket)
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Error("plugin socket was not re-created")
	}

	// Only the kubelet socket re-created (the plugin socket left alone): registers again on the
	// same plugin socket.
	kubelet.srv.Stop()
	_ = os.Remove(kubeletSocket)
	kubelet = startFakeKubelet(t, kubeletSocket)
	kubelet.waitRegistration(t)
	if id, err := statID(socket); err != nil || id != second {
		t.Errorf("plugin socket changed: %v, %v", id, err)
	}
	kubelet.noRegistration(t, 300*time.Millisecond)
}
