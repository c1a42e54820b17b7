package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// createRecord is one line of the --record file: what the kubelet asked for in one
// CreateContainer call, and how the runtime answered.
type createRecord struct {
	Time         string            `json:"time"` // RFC 3339 with nanoseconds, UTC
	PodUID       string            `json:"podUID"`
	PodName      string            `json:"podName"`
	PodNamespace string            `json:"podNamespace"`
	Container    string            `json:"container"`
	Attempt      uint32            `json:"attempt"`
	SandboxID    string            `json:"sandboxID"`
	ContainerID  string            `json:"containerID"` // "" when the call failed
	CDIDevices   []string          `json:"cdiDevices"`  // fully qualified names, in request order
	Envs         map[string]string `json:"envs"`
	Mounts       []string          `json:"mounts"`  // container paths
	Devices      []string          `json:"devices"` // container paths
	Error        string            `json:"error"`   // "" on success
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

func (r *recorder) Record(req *runtimeapi.CreateContainerRequest, containerID string, callErr error) {
	cfg := req.GetConfig()
	md := req.GetSandboxConfig().GetMetadata()
	rec := createRecord{
		Time:         time.Now().UTC().Format(time.RFC3339Nano),
		PodUID:       md.GetUid(),
		PodName:      md.GetName(),
		PodNamespace: md.GetNamespace(),
		Container:    cfg.GetMetadata().GetName(),
		Attempt:      cfg.GetMetadata().GetAttempt(),
		SandboxID:    req.GetPodSandboxId(),
		ContainerID:  containerID,
		CDIDevices:   []string{},
		Envs:         map[string]string{},
		Mounts:       []string{},
		Devices:      []string{},
	}
	for _, d := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	for _, e := range cfg.GetEnvs() {
		rec.Envs[e.GetKey()] = string(e.GetValue())
	}
	for _, m := range cfg.GetMounts() {
		rec.Mounts = append(rec.Mounts, m.GetContainerPath())
	}
	for _, d := range cfg.GetDevices() {
		rec.Devices = append(rec.Devices, d.GetContainerPath())
	}
	if callErr != nil {
		rec.Error = status.Convert(callErr).Message()
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
