package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type testEnv struct {
	dir    string
	cdiDir string
	record string
	rt     runtimeapi.RuntimeServiceClient
	img    runtimeapi.ImageServiceClient
}

func start(t *testing.T) *testEnv {
	t.Helper()
	dir := t.TempDir()
	env := &testEnv{dir: dir, cdiDir: filepath.Join(dir, "cdi"), record: filepath.Join(dir, "record.jsonl")}
	if err := os.Mkdir(env.cdiDir, 0o755); err != nil {
		t.Fatal(err)
	}
	rec, err := openRecorder(env.record)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := newRuntime(filepath.Join(dir, "state"), []string{env.cdiDir}, rec)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "cri.sock")
	lis, err := listenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	runtimeapi.RegisterImageServiceServer(srv, rt.images)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		rec.Close()
	})
	env.rt = runtimeapi.NewRuntimeServiceClient(conn)
	env.img = runtimeapi.NewImageServiceClient(conn)
	return env
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func sandboxConfig(uid string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod-" + uid, Namespace: "ns", Uid: uid},
		Labels:   map[string]string{"io.kubernetes.pod.uid": uid},
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD},
		}},
	}
}

func containerConfig(name, image string, cdi ...string) *runtimeapi.ContainerConfig {
	c := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: image},
		Envs:     []*runtimeapi.KeyValue{{Key: "A", Value: []byte("1")}},
		Mounts:   []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: "/tmp"}},
		Labels:   map[string]string{"io.kubernetes.container.name": name},
	}
	for _, d := range cdi {
		c.CDIDevices = append(c.CDIDevices, &runtimeapi.CDIDevice{Name: d})
	}
	return c
}

func readRecords(t *testing.T, path string) []createRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []createRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r createRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad record %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestPodLifecycle(t *testing.T) {
	env := start(t)
	c := ctx(t)

	v, err := env.rt.Version(c, &runtimeapi.VersionRequest{})
	if err != nil || v.Version != "0.1.0" || v.RuntimeApiVersion != "v1" {
		t.Fatalf("Version: %v %v", v, err)
	}
	st, err := env.rt.Status(c, &runtimeapi.StatusRequest{})
	if err != nil || len(st.Status.Conditions) != 2 || !st.Status.Conditions[0].Status || !st.Status.Conditions[1].Status {
		t.Fatalf("Status: %v %v", st, err)
	}
	if _, err := env.img.ImageFsInfo(c, &runtimeapi.ImageFsInfoRequest{}); err != nil {
		t.Fatal(err)
	}

	// Image: missing until pulled, then reported with a non-zero size under every name.
	is, err := env.img.ImageStatus(c, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "busybox"}})
	if err != nil || is.Image != nil {
		t.Fatalf("ImageStatus before pull: %v %v", is, err)
	}
	pull, err := env.img.PullImage(c, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "busybox"}})
	if err != nil || !strings.HasPrefix(pull.ImageRef, "sha256:") {
		t.Fatalf("PullImage: %v %v", pull, err)
	}
	for _, ref := range []string{"busybox", "busybox:latest", "docker.io/library/busybox:latest", pull.ImageRef} {
		is, err := env.img.ImageStatus(c, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		if err != nil || is.Image == nil || is.Image.Id != pull.ImageRef || is.Image.Size == 0 {
			t.Fatalf("ImageStatus(%s): %v %v", ref, is, err)
		}
	}

	sb, err := env.rt.RunPodSandbox(c, &runtimeapi.RunPodSandboxRequest{Config: sandboxConfig("uid-1")})
	if err != nil {
		t.Fatal(err)
	}
	ss, err := env.rt.PodSandboxStatus(c, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.PodSandboxId})
	if err != nil || ss.Status.State != runtimeapi.PodSandboxState_SANDBOX_READY || ss.Status.Network.GetIp() == "" ||
		ss.Status.GetLinux().GetNamespaces().GetOptions().GetNetwork() != runtimeapi.NamespaceMode_POD {
		t.Fatalf("PodSandboxStatus: %v %v", ss, err)
	}

	// A CDI device that is in a spec resolves.
	spec := `{"cdiVersion":"0.6.0","kind":"k8s.gpu.nvidia.com/claim","devices":[{"name":"uid-1-gpu-0","containerEdits":{}}]}`
	if err := os.WriteFile(filepath.Join(env.cdiDir, "claim.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	cc, err := env.rt.CreateContainer(c, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  sb.PodSandboxId,
		Config:        containerConfig("main", pull.ImageRef, "k8s.gpu.nvidia.com/claim=uid-1-gpu-0"),
		SandboxConfig: sandboxConfig("uid-1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.rt.StartContainer(c, &runtimeapi.StartContainerRequest{ContainerId: cc.ContainerId}); err != nil {
		t.Fatal(err)
	}
	cs, err := env.rt.ContainerStatus(c, &runtimeapi.ContainerStatusRequest{ContainerId: cc.ContainerId})
	if err != nil {
		t.Fatal(err)
	}
	s := cs.Status
	if s.State != runtimeapi.ContainerState_CONTAINER_RUNNING || s.StartedAt == 0 || s.ImageRef == "" || s.Image.GetImage() == "" {
		t.Fatalf("ContainerStatus: %v", s)
	}
	if !filepath.IsAbs(s.LogPath) || !strings.HasPrefix(s.LogPath, env.dir) {
		t.Fatalf("log path %q not absolute inside the state dir", s.LogPath)
	}
	if _, err := os.Stat(s.LogPath); err != nil {
		t.Fatal(err)
	}

	// Listing by the kubelet's label filters.
	lc, err := env.rt.ListContainers(c, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{"io.kubernetes.container.name": "main"},
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	if err != nil || len(lc.Containers) != 1 || lc.Containers[0].Id != cc.ContainerId {
		t.Fatalf("ListContainers: %v %v", lc, err)
	}
	ls, err := env.rt.ListPodSandbox(c, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": "other"},
	}})
	if err != nil || len(ls.Items) != 0 {
		t.Fatalf("ListPodSandbox(other): %v %v", ls, err)
	}

	// Teardown as the kubelet does it.
	if _, err := env.rt.StopContainer(c, &runtimeapi.StopContainerRequest{ContainerId: cc.ContainerId, Timeout: 30}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.rt.StopPodSandbox(c, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	cs, err = env.rt.ContainerStatus(c, &runtimeapi.ContainerStatusRequest{ContainerId: cc.ContainerId})
	if err != nil || cs.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED || cs.Status.FinishedAt == 0 {
		t.Fatalf("ContainerStatus after stop: %v %v", cs, err)
	}
	if _, err := env.rt.RemoveContainer(c, &runtimeapi.RemoveContainerRequest{ContainerId: cc.ContainerId}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.rt.RemovePodSandbox(c, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.rt.RemovePodSandbox(c, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		t.Fatalf("RemovePodSandbox is not idempotent: %v", err)
	}
	_, err = env.rt.ContainerStatus(c, &runtimeapi.ContainerStatusRequest{ContainerId: cc.ContainerId})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("ContainerStatus of removed container: %v", err)
	}
	if _, err := os.Stat(s.LogPath); !os.IsNotExist(err) {
		t.Fatalf("log file left behind: %v", err)
	}

	recs := readRecords(t, env.record)
	if len(recs) != 1 {
		t.Fatalf("records: %+v", recs)
	}
	r := recs[0]
	if r.PodUID != "uid-1" || r.PodName != "pod-uid-1" || r.PodNamespace != "ns" || r.Container != "main" ||
		r.Error != "" || r.ContainerID != cc.ContainerId || len(r.CDIDevices) != 1 || r.Envs["A"] != "1" ||
		len(r.Mounts) != 1 || r.Mounts[0] != "/data" {
		t.Fatalf("record: %+v", r)
	}
}

func TestUnresolvableCDIDevice(t *testing.T) {
	env := start(t)
	c := ctx(t)
	sb, err := env.rt.RunPodSandbox(c, &runtimeapi.RunPodSandboxRequest{Config: sandboxConfig("uid-2")})
	if err != nil {
		t.Fatal(err)
	}
	// Two specs in one directory defining the same device conflict; a YAML spec works too.
	yamlSpec := "cdiVersion: 0.6.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: dup\n- name: ok\n"
	if err := os.WriteFile(filepath.Join(env.cdiDir, "a.yaml"), []byte(yamlSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(env.cdiDir, "b.json"),
		[]byte(`{"kind":"k8s.gpu.nvidia.com/claim","devices":[{"name":"dup"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := "k8s.gpu.nvidia.com/claim=uid-2-gpu-0"
	for _, tc := range []struct {
		dev     string
		wantErr string
	}{
		{"k8s.gpu.nvidia.com/claim=ok", ""},
		{missing, "unresolvable CDI devices " + missing},
		{"k8s.gpu.nvidia.com/claim=dup", "conflicting definitions"},
		{"not-qualified", "not a fully qualified CDI device name"},
	} {
		_, err := env.rt.CreateContainer(c, &runtimeapi.CreateContainerRequest{
			PodSandboxId:  sb.PodSandboxId,
			Config:        containerConfig("c-"+strings.NewReplacer("/", "-", "=", "-", ".", "-").Replace(tc.dev), "busybox", tc.dev),
			SandboxConfig: sandboxConfig("uid-2"),
		})
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.dev, err)
			}
			continue
		}
		if status.Code(err) != codes.Unknown || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: got %v, want Unknown containing %q", tc.dev, err, tc.wantErr)
		}
	}
	recs := readRecords(t, env.record)
	if len(recs) != 4 || recs[0].Error != "" || !strings.Contains(recs[1].Error, missing) || recs[1].ContainerID != "" {
		t.Fatalf("records: %+v", recs)
	}
}

func TestNormalizeRef(t *testing.T) {
	for in, want := range map[string]string{
		"busybox":                         "docker.io/library/busybox:latest",
		"busybox:1.36":                    "docker.io/library/busybox:1.36",
		"user/app":                        "docker.io/user/app:latest",
		"registry.k8s.io/pause:3.10":      "registry.k8s.io/pause:3.10",
		"localhost:5000/app":              "localhost:5000/app:latest",
		"quay.io/a/b@sha256:0123":         "quay.io/a/b@sha256:0123",
		"sha256:abcdef":                   "sha256:abcdef",
		"docker.io/library/busybox:1.36":  "docker.io/library/busybox:1.36",
		"registry.example.com:443/x/y/z":  "registry.example.com:443/x/y/z:latest",
		"registry.example.com:443/x/y:v2": "registry.example.com:443/x/y:v2",
	} {
		if got := normalizeRef(in); got != want {
			t.Errorf("normalizeRef(%q) = %q, want %q", in, got, want)
		}
	}
}
