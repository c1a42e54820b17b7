package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	runtimeName    = "fake-cri"
	runtimeVersion = "0.1.0"
	// The kubelet refuses a runtime whose Version response does not carry this version.
	kubeRuntimeAPIVersion = "0.1.0"
	criAPIVersion         = "v1"
)

type sandbox struct {
	id             string
	config         *runtimeapi.PodSandboxConfig
	runtimeHandler string
	state          runtimeapi.PodSandboxState
	createdAt      int64
	ip             string
}

type container struct {
	id        string
	sandboxID string
	config    *runtimeapi.ContainerConfig
	image     *image
	state     runtimeapi.ContainerState
	createdAt int64
	startedAt int64
	finishAt  int64
	exitCode  int32
	reason    string
	logPath   string
	resources *runtimeapi.ContainerResources
}

// fakeRuntime implements the CRI RuntimeService in memory. Calls that the kubelet does not need
// for running pods (exec, attach, port-forward, checkpoints, events) stay unimplemented; the
// kubelet copes with Unimplemented for the optional ones.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer

	stateDir string
	cdi      *cdiResolver
	rec      *recorder
	images   *imageService

	mu         sync.Mutex
	sandboxes  map[string]*sandbox
	containers map[string]*container
	lastNanos  int64
	nextIP     uint32
	podCIDR    string
}

func newRuntime(stateDir string, cdiDirs []string, rec *recorder) (*fakeRuntime, error) {
	if err := os.MkdirAll(filepath.Join(stateDir, "containers"), 0o755); err != nil {
		return nil, err
	}
	return &fakeRuntime{
		stateDir:   stateDir,
		cdi:        &cdiResolver{dirs: cdiDirs},
		rec:        rec,
		images:     newImageService(stateDir),
		sandboxes:  map[string]*sandbox{},
		containers: map[string]*container{},
		nextIP:     2,
	}, nil
}

// now returns a strictly increasing wall-clock timestamp in nanoseconds: the kubelet orders
// sandboxes and containers by creation time. Caller holds r.mu.
func (r *fakeRuntime) now() int64 {
	n := time.Now().UnixNano()
	if n <= r.lastNanos {
		n = r.lastNanos + 1
	}
	r.lastNanos = n
	return n
}

func newID() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

func notFound(kind, id string) error {
	return status.Errorf(codes.NotFound, "%s %q not found", kind, id)
}

// lookup finds an object by its full ID or by a unique ID prefix, as real runtimes do.
func lookup[T any](m map[string]*T, id string) (*T, bool) {
	if v, ok := m[id]; ok {
		return v, true
	}
	if id == "" {
		return nil, false
	}
	var found *T
	for k, v := range m {
		if strings.HasPrefix(k, id) {
			if found != nil {
				return nil, false
			}
			found = v
		}
	}
	return found, found != nil
}

func matchLabels(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (r *fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{
		Version:           kubeRuntimeAPIVersion,
		RuntimeName:       runtimeName,
		RuntimeVersion:    runtimeVersion,
		RuntimeApiVersion: criAPIVersion,
	}, nil
}

func (r *fakeRuntime) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{
		Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		}},
		RuntimeHandlers: []*runtimeapi.RuntimeHandler{{Name: "", Features: &runtimeapi.RuntimeHandlerFeatures{}}},
		Features:        &runtimeapi.RuntimeFeatures{},
	}, nil
}

func (r *fakeRuntime) RuntimeConfig(context.Context, *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	return &runtimeapi.RuntimeConfigResponse{
		Linux: &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS},
	}, nil
}

func (r *fakeRuntime) UpdateRuntimeConfig(_ context.Context, req *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cidr := req.GetRuntimeConfig().GetNetworkConfig().GetPodCidr(); cidr != "" {
		r.podCIDR = cidr
	}
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}

// --- Sandboxes ---

func hostNetwork(cfg *runtimeapi.PodSandboxConfig) bool {
	return cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE
}

func (r *fakeRuntime) RunPodSandbox(_ context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	cfg := req.GetConfig()
	md := cfg.GetMetadata()
	if md.GetName() == "" || md.GetNamespace() == "" || md.GetUid() == "" {
		return nil, status.Error(codes.InvalidArgument, "sandbox config metadata must have name, namespace and uid")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.sandboxes {
		m := s.config.GetMetadata()
		if m.GetName() == md.GetName() && m.GetNamespace() == md.GetNamespace() && m.GetUid() == md.GetUid() && m.GetAttempt() == md.GetAttempt() {
			return nil, status.Errorf(codes.AlreadyExists, "sandbox name %s_%s_%s_%d is reserved for %s",
				md.GetName(), md.GetNamespace(), md.GetUid(), md.GetAttempt(), s.id)
		}
	}
	s := &sandbox{
		id:             newID(),
		config:         cfg,
		runtimeHandler: req.GetRuntimeHandler(),
		state:          runtimeapi.PodSandboxState_SANDBOX_READY,
		createdAt:      r.now(),
	}
	if !hostNetwork(cfg) {
		// Pod IPs from 10.88.0.0/16, never reused within one run.
		for r.nextIP&0xff == 0 || r.nextIP&0xff == 0xff {
			r.nextIP++
		}
		s.ip = fmt.Sprintf("10.88.%d.%d", (r.nextIP>>8)&0xff, r.nextIP&0xff)
		r.nextIP++
	}
	r.sandboxes[s.id] = s
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: s.id}, nil
}

// stopContainerLocked marks a container exited. Caller holds r.mu.
func (r *fakeRuntime) stopContainerLocked(c *container, reason string) {
	switch c.state {
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		c.state = runtimeapi.ContainerState_CONTAINER_EXITED
		c.finishAt = r.now()
		c.exitCode = 0
		c.reason = reason
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		// Never started: exited without having run (as containerd reports it).
		c.state = runtimeapi.ContainerState_CONTAINER_EXITED
		c.finishAt = r.now()
		c.exitCode = 0
		c.reason = reason
	}
}

func (r *fakeRuntime) StopPodSandbox(_ context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := lookup(r.sandboxes, req.GetPodSandboxId())
	if !ok {
		// Idempotent: a sandbox that is gone is stopped.
		return &runtimeapi.StopPodSandboxResponse{}, nil
	}
	for _, c := range r.containers {
		if c.sandboxID == s.id {
			r.stopContainerLocked(c, "Completed")
		}
	}
	s.state = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (r *fakeRuntime) RemovePodSandbox(_ context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := lookup(r.sandboxes, req.GetPodSandboxId())
	if !ok {
		return &runtimeapi.RemovePodSandboxResponse{}, nil
	}
	for id, c := range r.containers {
		if c.sandboxID == s.id {
			r.removeContainerLocked(id)
		}
	}
	delete(r.sandboxes, s.id)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (r *fakeRuntime) sandboxStatusLocked(s *sandbox) *runtimeapi.PodSandboxStatus {
	return &runtimeapi.PodSandboxStatus{
		Id:        s.id,
		Metadata:  s.config.GetMetadata(),
		State:     s.state,
		CreatedAt: s.createdAt,
		Network:   &runtimeapi.PodSandboxNetworkStatus{Ip: s.ip},
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{
			// The kubelet recreates a sandbox whose network namespace mode differs from the pod's.
			Options: s.config.GetLinux().GetSecurityContext().GetNamespaceOptions(),
		}},
		Labels:         s.config.GetLabels(),
		Annotations:    s.config.GetAnnotations(),
		RuntimeHandler: s.runtimeHandler,
	}
}

func (r *fakeRuntime) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := lookup(r.sandboxes, req.GetPodSandboxId())
	if !ok {
		return nil, notFound("sandbox", req.GetPodSandboxId())
	}
	resp := &runtimeapi.PodSandboxStatusResponse{Status: r.sandboxStatusLocked(s), Timestamp: time.Now().UnixNano()}
	for _, c := range r.sortedContainersLocked() {
		if c.sandboxID == s.id {
			resp.ContainersStatuses = append(resp.ContainersStatuses, r.containerStatusLocked(c))
		}
	}
	return resp, nil
}

func (r *fakeRuntime) listSandboxes(f *runtimeapi.PodSandboxFilter) []*runtimeapi.PodSandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*runtimeapi.PodSandbox
	for _, s := range r.sandboxes {
		if f.GetId() != "" && !strings.HasPrefix(s.id, f.GetId()) {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != s.state {
			continue
		}
		if !matchLabels(s.config.GetLabels(), f.GetLabelSelector()) {
			continue
		}
		out = append(out, &runtimeapi.PodSandbox{
			Id:             s.id,
			Metadata:       s.config.GetMetadata(),
			State:          s.state,
			CreatedAt:      s.createdAt,
			Labels:         s.config.GetLabels(),
			Annotations:    s.config.GetAnnotations(),
			RuntimeHandler: s.runtimeHandler,
		})
	}
	slices.SortFunc(out, func(a, b *runtimeapi.PodSandbox) int { return cmp.Compare(a.CreatedAt, b.CreatedAt) })
	return out
}

func (r *fakeRuntime) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: r.listSandboxes(req.GetFilter())}, nil
}

func (r *fakeRuntime) StreamPodSandboxes(req *runtimeapi.StreamPodSandboxesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxesResponse]) error {
	return stream.Send(&runtimeapi.StreamPodSandboxesResponse{PodSandboxes: r.listSandboxes(req.GetFilter())})
}

func (r *fakeRuntime) UpdatePodSandboxResources(_ context.Context, req *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := lookup(r.sandboxes, req.GetPodSandboxId()); !ok {
		return nil, notFound("sandbox", req.GetPodSandboxId())
	}
	return &runtimeapi.UpdatePodSandboxResourcesResponse{}, nil
}

// --- Containers ---

func (r *fakeRuntime) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	id, err := r.createContainer(req)
	if r.rec != nil {
		r.rec.Record(req, id, err)
	}
	if err != nil {
		return nil, err
	}
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

func (r *fakeRuntime) createContainer(req *runtimeapi.CreateContainerRequest) (string, error) {
	cfg := req.GetConfig()
	if cfg.GetMetadata().GetName() == "" {
		return "", status.Error(codes.InvalidArgument, "container config metadata must have a name")
	}
	// Resolve CDI devices first, outside the lock: it reads the spec directories.
	if err := r.cdi.Resolve(cfg.GetCDIDevices()); err != nil {
		return "", status.Errorf(codes.Unknown, "failed to create container %s: %v", cfg.GetMetadata().GetName(), err)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := lookup(r.sandboxes, req.GetPodSandboxId())
	if !ok {
		return "", notFound("sandbox", req.GetPodSandboxId())
	}
	if s.state != runtimeapi.PodSandboxState_SANDBOX_READY {
		return "", status.Errorf(codes.FailedPrecondition, "sandbox %s is not ready", s.id)
	}
	md := cfg.GetMetadata()
	for _, c := range r.containers {
		if c.sandboxID == s.id && c.config.GetMetadata().GetName() == md.GetName() && c.config.GetMetadata().GetAttempt() == md.GetAttempt() {
			return "", status.Errorf(codes.AlreadyExists, "container name %s (attempt %d) in sandbox %s is reserved for %s",
				md.GetName(), md.GetAttempt(), s.id, c.id)
		}
	}
	c := &container{
		id:        newID(),
		sandboxID: s.id,
		config:    cfg,
		image:     r.images.ensure(cfg.GetImage().GetImage()),
		state:     runtimeapi.ContainerState_CONTAINER_CREATED,
		createdAt: r.now(),
	}
	if lr := cfg.GetLinux().GetResources(); lr != nil {
		c.resources = &runtimeapi.ContainerResources{Linux: lr}
	}
	// Always an absolute path of an existing file: the kubelet's log rotation globs "<LogPath>*",
	// which for an empty path would match (and delete) files in its working directory.
	c.logPath = filepath.Join(r.stateDir, "containers", c.id+".log")
	if err := os.WriteFile(c.logPath, nil, 0o644); err != nil {
		return "", status.Errorf(codes.Internal, "create log file: %v", err)
	}
	r.containers[c.id] = c
	return c.id, nil
}

func (r *fakeRuntime) StartContainer(_ context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := lookup(r.containers, req.GetContainerId())
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	if c.state != runtimeapi.ContainerState_CONTAINER_CREATED {
		return nil, status.Errorf(codes.FailedPrecondition, "container %s is in state %v, not CREATED", c.id, c.state)
	}
	c.state = runtimeapi.ContainerState_CONTAINER_RUNNING
	c.startedAt = r.now()
	line := fmt.Sprintf("%s stdout F fake-cri: container %s started (nothing runs)\n",
		time.Unix(0, c.startedAt).UTC().Format(time.RFC3339Nano), c.config.GetMetadata().GetName())
	if f, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		_, _ = f.WriteString(line)
		_ = f.Close()
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

func (r *fakeRuntime) StopContainer(_ context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := lookup(r.containers, req.GetContainerId())
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	r.stopContainerLocked(c, "Completed")
	return &runtimeapi.StopContainerResponse{}, nil
}

// removeContainerLocked forgets a container and deletes its log files. Caller holds r.mu.
func (r *fakeRuntime) removeContainerLocked(id string) {
	c := r.containers[id]
	delete(r.containers, id)
	if c == nil {
		return
	}
	if matches, err := filepath.Glob(c.logPath + "*"); err == nil {
		for _, m := range matches {
			_ = os.Remove(m)
		}
	}
}

func (r *fakeRuntime) RemoveContainer(_ context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := lookup(r.containers, req.GetContainerId()); ok {
		r.removeContainerLocked(c.id)
	}
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (r *fakeRuntime) sortedContainersLocked() []*container {
	out := slices.Collect(maps.Values(r.containers))
	slices.SortFunc(out, func(a, b *container) int { return cmp.Compare(a.createdAt, b.createdAt) })
	return out
}

func (r *fakeRuntime) listContainers(f *runtimeapi.ContainerFilter) []*runtimeapi.Container {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*runtimeapi.Container
	for _, c := range r.sortedContainersLocked() {
		if f.GetId() != "" && !strings.HasPrefix(c.id, f.GetId()) {
			continue
		}
		if f.GetPodSandboxId() != "" && !strings.HasPrefix(c.sandboxID, f.GetPodSandboxId()) {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != c.state {
			continue
		}
		if !matchLabels(c.config.GetLabels(), f.GetLabelSelector()) {
			continue
		}
		out = append(out, &runtimeapi.Container{
			Id:           c.id,
			PodSandboxId: c.sandboxID,
			Metadata:     c.config.GetMetadata(),
			Image:        &runtimeapi.ImageSpec{Image: c.image.name(), UserSpecifiedImage: c.config.GetImage().GetUserSpecifiedImage()},
			ImageRef:     c.image.ref(),
			ImageId:      c.image.id,
			State:        c.state,
			CreatedAt:    c.createdAt,
			Labels:       c.config.GetLabels(),
			Annotations:  c.config.GetAnnotations(),
		})
	}
	return out
}

func (r *fakeRuntime) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: r.listContainers(req.GetFilter())}, nil
}

func (r *fakeRuntime) StreamContainers(req *runtimeapi.StreamContainersRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainersResponse]) error {
	return stream.Send(&runtimeapi.StreamContainersResponse{Containers: r.listContainers(req.GetFilter())})
}

func (r *fakeRuntime) containerStatusLocked(c *container) *runtimeapi.ContainerStatus {
	st := &runtimeapi.ContainerStatus{
		Id:          c.id,
		Metadata:    c.config.GetMetadata(),
		State:       c.state,
		CreatedAt:   c.createdAt,
		StartedAt:   c.startedAt,
		FinishedAt:  c.finishAt,
		ExitCode:    c.exitCode,
		Image:       &runtimeapi.ImageSpec{Image: c.image.name(), UserSpecifiedImage: c.config.GetImage().GetUserSpecifiedImage()},
		ImageRef:    c.image.ref(),
		ImageId:     c.image.id,
		Reason:      c.reason,
		Labels:      c.config.GetLabels(),
		Annotations: c.config.GetAnnotations(),
		Mounts:      c.config.GetMounts(),
		LogPath:     c.logPath,
		Resources:   c.resources,
		User:        &runtimeapi.ContainerUser{Linux: &runtimeapi.LinuxContainerUser{}},
	}
	if sc := c.config.GetLinux().GetSecurityContext(); sc != nil {
		st.User.Linux.Uid = sc.GetRunAsUser().GetValue()
		st.User.Linux.Gid = sc.GetRunAsGroup().GetValue()
		st.User.Linux.SupplementalGroups = sc.GetSupplementalGroups()
	}
	return st
}

func (r *fakeRuntime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := lookup(r.containers, req.GetContainerId())
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	return &runtimeapi.ContainerStatusResponse{Status: r.containerStatusLocked(c)}, nil
}

func (r *fakeRuntime) UpdateContainerResources(_ context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := lookup(r.containers, req.GetContainerId())
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	if req.GetLinux() != nil {
		c.resources = &runtimeapi.ContainerResources{Linux: req.GetLinux()}
	}
	return &runtimeapi.UpdateContainerResourcesResponse{}, nil
}

func (r *fakeRuntime) ReopenContainerLog(_ context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := lookup(r.containers, req.GetContainerId())
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	if c.state != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil, status.Errorf(codes.FailedPrecondition, "container %s is not running", c.id)
	}
	f, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reopen log: %v", err)
	}
	_ = f.Close()
	return &runtimeapi.ReopenContainerLogResponse{}, nil
}

// ExecSync succeeds without output, so exec probes pass.
func (r *fakeRuntime) ExecSync(_ context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := lookup(r.containers, req.GetContainerId())
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	if c.state != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil, status.Errorf(codes.FailedPrecondition, "container %s is not running", c.id)
	}
	return &runtimeapi.ExecSyncResponse{}, nil
}

// --- Stats: nothing runs, so there is nothing to measure. ---

func (r *fakeRuntime) ContainerStats(_ context.Context, req *runtimeapi.ContainerStatsRequest) (*runtimeapi.ContainerStatsResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := lookup(r.containers, req.GetContainerId())
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	return &runtimeapi.ContainerStatsResponse{Stats: &runtimeapi.ContainerStats{Attributes: &runtimeapi.ContainerAttributes{
		Id: c.id, Metadata: c.config.GetMetadata(), Labels: c.config.GetLabels(), Annotations: c.config.GetAnnotations(),
	}}}, nil
}

func (r *fakeRuntime) ListContainerStats(context.Context, *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	return &runtimeapi.ListContainerStatsResponse{}, nil
}

func (r *fakeRuntime) StreamContainerStats(_ *runtimeapi.StreamContainerStatsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamContainerStatsResponse]) error {
	return stream.Send(&runtimeapi.StreamContainerStatsResponse{})
}

func (r *fakeRuntime) PodSandboxStats(_ context.Context, req *runtimeapi.PodSandboxStatsRequest) (*runtimeapi.PodSandboxStatsResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := lookup(r.sandboxes, req.GetPodSandboxId())
	if !ok {
		return nil, notFound("sandbox", req.GetPodSandboxId())
	}
	return &runtimeapi.PodSandboxStatsResponse{Stats: &runtimeapi.PodSandboxStats{Attributes: &runtimeapi.PodSandboxAttributes{
		Id: s.id, Metadata: s.config.GetMetadata(), Labels: s.config.GetLabels(), Annotations: s.config.GetAnnotations(),
	}}}, nil
}

func (r *fakeRuntime) ListPodSandboxStats(context.Context, *runtimeapi.ListPodSandboxStatsRequest) (*runtimeapi.ListPodSandboxStatsResponse, error) {
	return &runtimeapi.ListPodSandboxStatsResponse{}, nil
}

func (r *fakeRuntime) StreamPodSandboxStats(_ *runtimeapi.StreamPodSandboxStatsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxStatsResponse]) error {
	return stream.Send(&runtimeapi.StreamPodSandboxStatsResponse{})
}

func (r *fakeRuntime) ListMetricDescriptors(context.Context, *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	return &runtimeapi.ListMetricDescriptorsResponse{}, nil
}

func (r *fakeRuntime) ListPodSandboxMetrics(context.Context, *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	return &runtimeapi.ListPodSandboxMetricsResponse{}, nil
}

func (r *fakeRuntime) StreamPodSandboxMetrics(_ *runtimeapi.StreamPodSandboxMetricsRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamPodSandboxMetricsResponse]) error {
	return stream.Send(&runtimeapi.StreamPodSandboxMetricsResponse{})
}
