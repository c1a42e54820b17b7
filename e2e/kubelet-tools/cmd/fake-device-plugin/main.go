// Command fake-device-plugin is a device plugin for end-to-end tests with the stock kubelet, in the
// classic device plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) that the GPU
// Operator's NVIDIA device plugin uses: it advertises N healthy fake devices GPU-fake-0 … of one
// extended resource (nvidia.com/gpu), answers Allocate with NVIDIA_VISIBLE_DEVICES, and appends
// each allocated container request as one JSON line to the --record file.
//
// It serves the DevicePlugin service on a Unix socket in --socket-dir and registers it with the
// kubelet's device manager on --kubelet-socket. The kubelet forgets device plugins when it
// restarts, and on start deletes every socket in its device-plugins directory, ours included, so
// the plugin checks both sockets every --poll-interval: when its own socket is gone or replaced it
// serves on a new one, and when the kubelet socket is a different file than the one it registered
// with (or it has not registered yet), it registers again.
//
// Usage:
//
//	fake-device-plugin --kubelet-socket PATH --socket-dir DIR --resource nvidia.com/gpu --devices N [--record FILE]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// maxSocketPath is the longest path a Unix socket address holds (sun_path is 108 bytes on Linux,
// including the terminating NUL).
const maxSocketPath = 107

// registerTimeout bounds one Register call. The kubelet answers it only after it has dialed the
// plugin (with a 10 s deadline of its own) and called GetDevicePluginOptions.
const registerTimeout = 20 * time.Second

type config struct {
	kubeletSocket string
	socketDir     string
	resource      string
	devices       int
	recordPath    string
	poll          time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.kubeletSocket, "kubelet-socket", "", "the kubelet's device plugin registration socket (required), e.g. /var/lib/kubelet/device-plugins/kubelet.sock")
	flag.StringVar(&cfg.socketDir, "socket-dir", "", "directory to create the plugin socket in (required); the kubelet looks for it in the directory of --kubelet-socket")
	flag.StringVar(&cfg.resource, "resource", "nvidia.com/gpu", "extended resource name to advertise")
	flag.IntVar(&cfg.devices, "devices", 0, "number of healthy fake devices to advertise (required, >= 1)")
	flag.StringVar(&cfg.recordPath, "record", "", "append one JSON line per allocated container request to this file")
	flag.DurationVar(&cfg.poll, "poll-interval", time.Second, "how often to check the plugin and kubelet sockets (re-serve / re-register)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(),
			"usage: %s --kubelet-socket PATH --socket-dir DIR --resource NAME --devices N [--record FILE] [--poll-interval 1s]\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("fake-device-plugin: ")
	if cfg.kubeletSocket == "" || cfg.socketDir == "" || cfg.devices < 1 || cfg.poll <= 0 || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		log.Printf("error: %v", err)
		os.Exit(1)
	}
}

// socketName derives the plugin's socket file name from the resource name, as the NVIDIA device
// plugin names its socket: nvidia.com/gpu -> nvidia-gpu.sock.
func socketName(resource string) (string, error) {
	domain, name, ok := strings.Cut(resource, "/")
	if !ok || domain == "" || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("resource %q is not an extended resource name (domain/name)", resource)
	}
	label, _, _ := strings.Cut(domain, ".")
	clean := func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '-'
	}
	return strings.Map(clean, label+"-"+name) + ".sock", nil
}

func checkSocketPath(path string) error {
	if len(path) > maxSocketPath {
		return fmt.Errorf("socket path %s is %d bytes, more than the %d a Unix socket address holds", path, len(path), maxSocketPath)
	}
	return nil
}

// run serves and registers the plugin until ctx ends, then stops serving and removes its socket.
func run(ctx context.Context, cfg config) error {
	var err error
	if cfg.kubeletSocket, err = filepath.Abs(cfg.kubeletSocket); err != nil {
		return err
	}
	if cfg.socketDir, err = filepath.Abs(cfg.socketDir); err != nil {
		return err
	}
	name, err := socketName(cfg.resource)
	if err != nil {
		return err
	}
	socket := filepath.Join(cfg.socketDir, name)
	if err := checkSocketPath(socket); err != nil {
		return err
	}
	if err := checkSocketPath(cfg.kubeletSocket); err != nil {
		return err
	}
	if filepath.Dir(cfg.kubeletSocket) != cfg.socketDir {
		// The kubelet joins the endpoint to the directory of its own socket.
		log.Printf("warning: --socket-dir %s is not the directory of --kubelet-socket %s; the kubelet will not find the plugin there",
			cfg.socketDir, cfg.kubeletSocket)
	}
	var rec *recorder
	if cfg.recordPath != "" {
		if rec, err = openRecorder(cfg.recordPath); err != nil {
			return err
		}
		defer rec.Close()
	}
	ids := deviceIDs(cfg.devices)
	log.Printf("%s: %d devices (%s … %s), socket %s, kubelet socket %s, record %q",
		cfg.resource, len(ids), ids[0], ids[len(ids)-1], socket, cfg.kubeletSocket, cfg.recordPath)

	var (
		srv        *pluginServer
		registered *fileID // the kubelet socket we last registered with; nil: register at the next check
		lastErr    string  // the last registration error logged, so that retries do not flood the log
	)
	defer func() {
		if srv != nil {
			srv.shutdown()
		}
	}()
	tick := time.NewTicker(cfg.poll)
	defer tick.Stop()
	for {
		if srv == nil || !srv.socketIsOurs() {
			if srv != nil {
				log.Printf("socket %s was removed or replaced (kubelet restart?): serving on a new one", socket)
				srv.shutdown()
				srv = nil
			}
			if srv, err = startServer(socket, &devicePlugin{resource: cfg.resource, ids: ids, rec: rec}); err != nil {
				return err
			}
			registered = nil
		}

		kubelet, err := statID(cfg.kubeletSocket)
		switch {
		case err != nil:
			if registered != nil {
				log.Printf("kubelet socket %s is gone; will register again when it is back", cfg.kubeletSocket)
			}
			registered = nil
			if msg := "stat: " + err.Error(); msg != lastErr {
				log.Printf("waiting for the kubelet socket: %v", err)
				lastErr = msg
			}
		case registered == nil || *registered != kubelet:
			if registered != nil {
				log.Printf("kubelet socket %s was re-created (kubelet restart): registering again", cfg.kubeletSocket)
			}
			if err := register(ctx, cfg.kubeletSocket, name, cfg.resource); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if msg := err.Error(); msg != lastErr {
					log.Printf("register (retrying every %v): %v", cfg.poll, err)
					lastErr = msg
				}
				break
			}
			registered, lastErr = &kubelet, ""
			log.Printf("registered %s (endpoint %s) with the kubelet at %s", cfg.resource, name, cfg.kubeletSocket)
		}

		select {
		case <-ctx.Done():
			log.Printf("shutting down")
			return nil
		case <-tick.C:
		}
	}
}

// register calls Registration.Register on the kubelet socket. The kubelet dials the plugin back
// and calls GetDevicePluginOptions before it answers, so the plugin must be serving already.
func register(ctx context.Context, kubeletSocket, endpoint, resource string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	return err
}

// fileID identifies one file: a socket deleted and created again at the same path may get the
// same inode number back, but not also the same change time.
type fileID struct {
	dev, ino uint64
	ctime    int64 // nanoseconds
}

func statID(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fileID{}, fmt.Errorf("%s is not a socket", path)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, fmt.Errorf("stat %s: no inode information", path)
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim.Nano()}, nil
}

// pluginServer is one gRPC server on the plugin socket.
type pluginServer struct {
	path string
	id   fileID // the socket file this server created
	grpc *grpc.Server
	stop chan struct{} // closed on shutdown: ends the ListAndWatch streams
	done chan struct{} // closed when Serve has returned
}

// startServer listens on socket (replacing a stale socket file there) and serves p on it.
func startServer(socket string, p *devicePlugin) (*pluginServer, error) {
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(socket); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", socket)
		}
		if err := os.Remove(socket); err != nil {
			return nil, err
		}
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", socket, err)
	}
	// The kubelet may delete the file and a later server create it again at the same path;
	// closing this listener must not delete that one. shutdown removes the file if it is ours.
	lis.SetUnlinkOnClose(false)
	id, err := statID(socket)
	if err != nil {
		lis.Close()
		return nil, err
	}
	s := &pluginServer{path: socket, id: id, grpc: grpc.NewServer(), stop: make(chan struct{}), done: make(chan struct{})}
	p.stop = s.stop
	pluginapi.RegisterDevicePluginServer(s.grpc, p)
	go func() {
		defer close(s.done)
		if err := s.grpc.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			log.Printf("serve on %s: %v", socket, err)
		}
	}()
	log.Printf("serving DevicePlugin v1beta1 on %s", socket)
	return s, nil
}

// socketIsOurs reports whether the socket file this server created is still in place.
func (s *pluginServer) socketIsOurs() bool {
	id, err := statID(s.path)
	return err == nil && id == s.id
}

// shutdown stops serving (letting unary calls in flight finish, briefly) and removes the socket
// file if it is still the one this server created.
func (s *pluginServer) shutdown() {
	close(s.stop)
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		s.grpc.Stop()
	}
	<-s.done
	if s.socketIsOurs() {
		if err := os.Remove(s.path); err != nil {
			log.Printf("remove %s: %v", s.path, err)
		}
	}
}
