// Command fake-cri is a container runtime for end-to-end tests with the stock kubelet: it serves
// the CRI v1 RuntimeService and ImageService on a Unix socket, keeps sandboxes and containers in
// memory (containers "run" until they are stopped, nothing is executed), accepts any image
// reference without pulling, and checks at CreateContainer that every CDI device the kubelet
// passes resolves to a device in a CDI spec file on disk, as containerd with CDI enabled does.
// Every CreateContainer call is appended as one JSON line to the --record file.
//
// Usage:
//
//	fake-cri --listen /path/cri.sock --state-dir DIR [--cdi-dir DIR]... [--record FILE] [--verbose]
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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }

func (s *stringList) Set(v string) error {
	if v == "" {
		return errors.New("empty value")
	}
	*s = append(*s, v)
	return nil
}

func main() {
	var (
		listen   = flag.String("listen", "", "Unix socket path to serve the CRI on (required)")
		stateDir = flag.String("state-dir", "", "directory for container log files (required; created if missing)")
		record   = flag.String("record", "", "append one JSON line per CreateContainer call to this file")
		verbose  = flag.Bool("verbose", false, "log every CRI call, not only the ones that change state")
		cdiDirs  stringList
	)
	flag.Var(&cdiDirs, "cdi-dir", "directory with CDI spec files (*.json, *.yaml); repeatable, later directories take precedence")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(),
			"usage: %s --listen SOCKET --state-dir DIR [--cdi-dir DIR]... [--record FILE] [--verbose]\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("fake-cri: ")
	if *listen == "" || *stateDir == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*listen, *stateDir, *record, cdiDirs, *verbose); err != nil {
		log.Printf("error: %v", err)
		os.Exit(1)
	}
}

func run(socket, stateDir, recordPath string, cdiDirs []string, verbose bool) error {
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	for i, d := range cdiDirs {
		if cdiDirs[i], err = filepath.Abs(d); err != nil {
			return err
		}
	}
	var rec *recorder
	if recordPath != "" {
		if rec, err = openRecorder(recordPath); err != nil {
			return err
		}
		defer rec.Close()
	}
	rt, err := newRuntime(stateDir, cdiDirs, rec)
	if err != nil {
		return err
	}

	lis, err := listenUnix(socket)
	if err != nil {
		return err
	}
	defer os.Remove(socket)

	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(logUnary(verbose)),
		grpc.ChainStreamInterceptor(logStream(verbose)),
	)
	runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	runtimeapi.RegisterImageServiceServer(srv, rt.images)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	log.Printf("serving CRI v1 on %s (state dir %s, CDI dirs %q, record %q)", socket, stateDir, cdiDirs, recordPath)

	select {
	case sig := <-sigs:
		log.Printf("%v: shutting down", sig)
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	}
	// Finish in-flight calls, but do not wait on clients that keep streams open.
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		srv.Stop()
	}
	return nil
}

// listenUnix listens on socket, replacing a stale socket file left by an earlier run.
func listenUnix(socket string) (net.Listener, error) {
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
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", socket, err)
	}
	return lis, nil
}

// mutating lists the calls that are always logged; the rest (polled every second by the
// kubelet's PLEG and stats loops) only with --verbose.
var mutating = map[string]bool{
	"RunPodSandbox": true, "StopPodSandbox": true, "RemovePodSandbox": true,
	"CreateContainer": true, "StartContainer": true, "StopContainer": true, "RemoveContainer": true,
	"PullImage": true, "RemoveImage": true, "UpdateRuntimeConfig": true, "UpdateContainerResources": true,
}

func shortMethod(full string) string { return full[strings.LastIndex(full, "/")+1:] }

func logUnary(verbose bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m := shortMethod(info.FullMethod)
		switch {
		case err != nil && (verbose || mutating[m] || status.Code(err) != codes.NotFound):
			log.Printf("%s %s -> error %v (%v)", m, brief(req), err, time.Since(start).Round(time.Microsecond))
		case err == nil && (verbose || mutating[m]):
			log.Printf("%s %s -> %s (%v)", m, brief(req), brief(resp), time.Since(start).Round(time.Microsecond))
		}
		return resp, err
	}
}

func logStream(verbose bool) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		err := handler(srv, ss)
		if err != nil || verbose {
			log.Printf("%s (stream) -> %v", shortMethod(info.FullMethod), err)
		}
		return err
	}
}

// brief renders a request or response on one line, cut to a readable length.
func brief(m any) string {
	s := fmt.Sprintf("%v", m)
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return "{" + s + "}"
}
