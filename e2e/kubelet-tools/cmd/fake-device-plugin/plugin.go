package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// visibleDevicesEnv is the variable the NVIDIA container toolkit reads to pick the GPUs of a
// container; the GPU Operator's device plugin sets it (in its default "envvar" strategy).
const visibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

// deviceIDs returns the IDs of the n fake devices: GPU-fake-0 … GPU-fake-<n-1>.
func deviceIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("GPU-fake-%d", i)
	}
	return ids
}

// devicePlugin serves the DevicePlugin service for one gRPC server instance. stop is closed when
// that server shuts down, so that open ListAndWatch streams end and a graceful stop does not
// wait on them.
type devicePlugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource string
	ids      []string
	rec      *recorder // nil without --record
	stop     <-chan struct{}
}

func (p *devicePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{PreStartRequired: false, GetPreferredAllocationAvailable: false}, nil
}

// ListAndWatch sends the device list once and then keeps the stream open: the kubelet treats the
// end of the stream as the plugin going away and drops all its devices.
func (p *devicePlugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for _, id := range p.ids {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := stream.Send(resp); err != nil {
		return err
	}
	log.Printf("ListAndWatch: advertised %d healthy %s devices", len(p.ids), p.resource)
	select {
	case <-stream.Context().Done():
	case <-p.stop:
	}
	return nil
}

func (p *devicePlugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *devicePlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Allocate answers each container request with NVIDIA_VISIBLE_DEVICES set to its device IDs.
// Device IDs this plugin never advertised are rejected (the kubelet only allocates advertised
// ones, so that would be a bug worth seeing); nothing is recorded then.
func (p *devicePlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, creq := range req.GetContainerRequests() {
		ids := creq.GetDevicesIds()
		for _, id := range ids {
			if !slices.Contains(p.ids, id) {
				log.Printf("Allocate %q: unknown device %q", ids, id)
				return nil, status.Errorf(codes.InvalidArgument, "unknown %s device %q", p.resource, id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{visibleDevicesEnv: strings.Join(ids, ",")},
		})
	}
	for _, creq := range req.GetContainerRequests() {
		log.Printf("Allocate: %s=%s", visibleDevicesEnv, strings.Join(creq.GetDevicesIds(), ","))
		if p.rec != nil {
			p.rec.Record(p.resource, creq.GetDevicesIds())
		}
	}
	return resp, nil
}

// allocateRecord is one line of the --record file: one container request of an Allocate call.
type allocateRecord struct {
	Time      string   `json:"time"` // RFC 3339 with nanoseconds, UTC
	Resource  string   `json:"resource"`
	DeviceIDs []string `json:"deviceIDs"` // in request order
}

// recorder appends records to a file; each record is written with a single write call, so a
// reader never sees a partial line from a finished call.
type recorder struct {
	mu sync.Mutex
	f  *os.File
}

func openRecorder(path string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open record file: %w", err)
	}
	return &recorder{f: f}, nil
}

func (r *recorder) Close() error { return r.f.Close() }

func (r *recorder) Record(resource string, ids []string) {
	rec := allocateRecord{
		Time:      time.Now().UTC().Format(time.RFC3339Nano),
		Resource:  resource,
		DeviceIDs: append([]string{}, ids...),
	}
	line, err := json.Marshal(rec)
	if err != nil {
		log.Printf("record: %v", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(append(line, '\n')); err != nil {
		log.Printf("record: %v", err)
	}
}
