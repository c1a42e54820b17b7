// Command kubelet-dial talks to a DRA kubelet plugin the way kubelet v1.37.2 does, so that
// transport-level incompatibilities a non-Go client would hide show up in a test:
//
//   - Registration socket: the plugin watcher dials with grpc.DialContext and the bare socket
//     path as the target (passthrough resolver), so the HTTP/2 :authority is the
//     percent-encoded socket path (pkg/kubelet/pluginmanager/operationexecutor, func dial).
//   - DRA socket: the DRA plugin manager uses grpc.NewClient("unix:"+endpoint)
//     (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go). The kubelet also installs a unary
//     interceptor and a stats handler there; both only feed kubelet metrics and connection
//     bookkeeping and are left out here.
//   - Service versions: the kubelet takes the first entry of the plugin's supported versions that
//     it knows (v1.DRAPlugin, v1beta1.DRAPlugin), and for health the newest service the plugin
//     lists (v1.DRAResourceHealth before v1alpha1.DRAResourceHealth).
//
// Each step prints one JSON line {"step", "ok", "detail" | "error"} to stdout; the exit status is
// 1 when any step failed, 2 on a usage error.
//
// Usage:
//
//	kubelet-dial --registration-socket PATH [--dra-socket PATH]
//	    [--claim-uid UID --claim-namespace NS --claim-name NAME] [--health] [--timeout 10s]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Timeouts of kubelet v1.37.2's plugin watcher (operation_generator.go): dialing, GetInfo and
// NotifyRegistrationStatus each have their own deadline.
const (
	getInfoTimeout = time.Second
	notifyTimeout  = 5 * time.Second
)

// Services the kubelet's DRA manager knows, most recent first (dra_plugin.go).
var (
	draServices    = []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService}
	healthServices = []string{drahealthv1.DRAResourceHealthService, drahealthv1alpha1.DRAResourceHealthService}
)

type result struct {
	Step   string `json:"step"`
	OK     bool   `json:"ok"`
	Detail any    `json:"detail,omitempty"`
	Error  string `json:"error,omitempty"`
	// Code is the gRPC status code of a failed call ("" when the failure was not a gRPC error).
	Code string `json:"code,omitempty"`
}

var (
	out    io.Writer = os.Stdout
	failed bool
)

func emit(r result) {
	if !r.OK {
		failed = true
	}
	line, err := json.Marshal(r)
	if err != nil {
		line = fmt.Appendf(nil, `{"step":%q,"ok":false,"error":%q}`, r.Step, "encode result: "+err.Error())
		failed = true
	}
	fmt.Fprintln(out, string(line))
}

func fail(step string, err error, detail any) {
	r := result{Step: step, Detail: detail, Error: err.Error()}
	var grpcErr interface{ GRPCStatus() *status.Status }
	if errors.As(err, &grpcErr) {
		// err's text already carries the call and the full status ("rpc error: code = ... desc = ...").
		r.Code = grpcErr.GRPCStatus().Code().String()
	}
	emit(r)
}

// callError wraps a gRPC error with the name of the call, keeping the status reachable.
type callError struct {
	call string
	err  error
}

func (e *callError) Error() string { return e.call + ": " + e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

func wrap(call string, err error) error {
	if err == nil {
		return nil
	}
	return &callError{call: call, err: err}
}

func main() {
	var (
		regSocket = flag.String("registration-socket", "", "plugin registration socket, as found in the kubelet's plugins_registry (required)")
		draSocket = flag.String("dra-socket", "", "DRA service socket (default: the endpoint GetInfo returns)")
		claimUID  = flag.String("claim-uid", "", "prepare and unprepare this ResourceClaim UID")
		claimNS   = flag.String("claim-namespace", "", "namespace of the claim (with --claim-uid)")
		claimName = flag.String("claim-name", "", "name of the claim (with --claim-uid)")
		health    = flag.Bool("health", false, "open NodeWatchResources and wait for the first message")
		timeout   = flag.Duration("timeout", 10*time.Second, "dial timeout and deadline of each DRA call")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s --registration-socket PATH [--dra-socket PATH] "+
			"[--claim-uid UID --claim-namespace NS --claim-name NAME] [--health] [--timeout 10s]\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if *regSocket == "" || flag.NArg() != 0 || *timeout <= 0 ||
		(*claimUID != "" && (*claimNS == "" || *claimName == "")) {
		flag.Usage()
		os.Exit(2)
	}

	ctx := context.Background()
	info, ok := register(ctx, *regSocket, *timeout)
	if ok && (*claimUID != "" || *health) {
		endpoint := info.Endpoint
		if *draSocket != "" {
			endpoint = *draSocket
		}
		dra(ctx, endpoint, info, *claimUID, *claimNS, *claimName, *health, *timeout)
	}
	if failed {
		os.Exit(1)
	}
}

type pluginInfo struct {
	Type                string   `json:"type"`
	Name                string   `json:"name"`
	Endpoint            string   `json:"endpoint"`
	SupportedVersions   []string `json:"supported_versions"`
	ChosenService       string   `json:"chosen_service"`
	ChosenHealthService string   `json:"chosen_health_service"`
}

// dialRegistration is the kubelet's plugin watcher dial, option for option.
func dialRegistration(ctx context.Context, socket string, timeout time.Duration) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	//nolint:staticcheck // DialContext and WithBlock are what the kubelet uses; that is the point.
	return grpc.DialContext(ctx, socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
}

// register performs the plugin watcher's registration: GetInfo, validation as the DRA handler
// does it, NotifyRegistrationStatus.
func register(ctx context.Context, socket string, timeout time.Duration) (*pluginInfo, bool) {
	const step = "registration"
	if _, err := os.Stat(socket); err != nil {
		fail(step, fmt.Errorf("registration socket: %w", err), nil)
		return nil, false
	}
	conn, err := dialRegistration(ctx, socket, timeout)
	if err != nil {
		// A blocking dial only says that time ran out; a plain connect tells why.
		if c, cerr := net.DialTimeout("unix", socket, time.Second); cerr != nil {
			err = fmt.Errorf("%w (plain connect: %v)", err, cerr)
		} else {
			c.Close()
		}
		fail(step, fmt.Errorf("failed to dial socket %s, err: %w", socket, err), nil)
		return nil, false
	}
	defer conn.Close()
	client := registerapi.NewRegistrationClient(conn)

	infoCtx, cancel := context.WithTimeout(ctx, getInfoTimeout)
	resp, err := client.GetInfo(infoCtx, &registerapi.InfoRequest{})
	cancel()
	if err != nil {
		fail(step, wrap("GetInfo", err), nil)
		return nil, false
	}
	info := &pluginInfo{
		Type:              resp.GetType(),
		Name:              resp.GetName(),
		Endpoint:          resp.GetEndpoint(),
		SupportedVersions: resp.GetSupportedVersions(),
	}
	if info.Endpoint == "" {
		info.Endpoint = socket
	}
	for _, v := range info.SupportedVersions {
		if slices.Contains(draServices, v) {
			info.ChosenService = v
			break
		}
	}
	for _, s := range healthServices {
		if slices.Contains(info.SupportedVersions, s) {
			info.ChosenHealthService = s
			break
		}
	}

	var invalid error
	switch {
	case info.Type != registerapi.DRAPlugin:
		invalid = fmt.Errorf("no handler registered for plugin type: %s at socket %s", info.Type, socket)
	case len(info.SupportedVersions) == 0:
		invalid = errors.New("plugin validation failed: empty list of supported gRPC services (aka supported versions)")
	case info.ChosenService == "":
		invalid = fmt.Errorf("plugin validation failed: none of services supported by the plugin (%q) are supported by the kubelet (%q)",
			info.SupportedVersions, draServices)
	}

	notifyCtx, cancel := context.WithTimeout(ctx, notifyTimeout)
	defer cancel()
	if invalid != nil {
		// The kubelet tells the plugin why it was refused.
		_, nerr := client.NotifyRegistrationStatus(notifyCtx, &registerapi.RegistrationStatus{
			PluginRegistered: false, Error: "RegisterPlugin error -- " + invalid.Error(),
		})
		if nerr != nil {
			invalid = fmt.Errorf("%v; NotifyRegistrationStatus(false): %v", invalid, nerr)
		}
		fail(step, invalid, info)
		return nil, false
	}
	if _, err := client.NotifyRegistrationStatus(notifyCtx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		fail(step, wrap("NotifyRegistrationStatus", err), info)
		return nil, false
	}
	emit(result{Step: step, OK: true, Detail: info})
	return info, true
}

type deviceOut struct {
	Requests     []string `json:"requests,omitempty"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdi_device_ids"`
	ShareID      string   `json:"share_id,omitempty"`
}

type healthOut struct {
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	Health  string `json:"health"`
	Message string `json:"message,omitempty"`
}

// draClient is the DRA plugin client for the negotiated service version, like the kubelet's
// DRAPlugin wrapper.
func draClient(conn *grpc.ClientConn, service string) drapbv1.DRAPluginClient {
	if service == drapbv1beta1.DRAPluginService {
		return drapbv1beta1.V1Beta1ClientWrapper{DRAPluginClient: drapbv1beta1.NewDRAPluginClient(conn)}
	}
	return drapbv1.NewDRAPluginClient(conn)
}

func dra(ctx context.Context, endpoint string, info *pluginInfo, uid, ns, name string, health bool, timeout time.Duration) {
	// The kubelet's DRA plugin manager: one lazily connecting client per registered plugin.
	conn, err := grpc.NewClient("unix:"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail("connect", fmt.Errorf("create gRPC connection to DRA driver %s plugin at endpoint %s: %w", info.Name, endpoint, err), nil)
		return
	}
	defer conn.Close()
	conn.Connect()
	client := draClient(conn, info.ChosenService)

	if uid != "" {
		claims := []*drapbv1.Claim{{Namespace: ns, Uid: uid, Name: name}}
		prepare(ctx, client, claims, info.ChosenService, timeout)
		// The kubelet unprepares a claim it tried to prepare, whether or not that worked.
		unprepare(ctx, client, claims, info.ChosenService, timeout)
	}
	if health {
		watchHealth(ctx, conn, info.ChosenHealthService, timeout)
	}
}

func prepare(ctx context.Context, client drapbv1.DRAPluginClient, claims []*drapbv1.Claim, service string, timeout time.Duration) {
	const step = "prepare"
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := client.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: claims})
	if err != nil {
		fail(step, wrap("NodePrepareResources ("+service+")", err), nil)
		return
	}
	uid := claims[0].GetUid()
	for got := range resp.GetClaims() {
		if got != uid {
			fail(step, fmt.Errorf("NodePrepareResources returned result for unknown claim UID %s", got), nil)
			return
		}
	}
	res, ok := resp.GetClaims()[uid]
	if !ok {
		fail(step, fmt.Errorf("NodePrepareResources left out claim %s", uid), nil)
		return
	}
	devices := []deviceOut{}
	for _, d := range res.GetDevices() {
		devices = append(devices, deviceOut{
			Requests:     d.GetRequestNames(),
			Pool:         d.GetPoolName(),
			Device:       d.GetDeviceName(),
			CDIDeviceIDs: d.GetCdiDeviceIds(),
			ShareID:      d.GetShareId(),
		})
	}
	detail := map[string]any{"claim_uid": uid, "service": service, "devices": devices}
	if res.GetError() != "" {
		fail(step, fmt.Errorf("NodePrepareResources failed for ResourceClaim %s: %s", claims[0].GetName(), res.GetError()), detail)
		return
	}
	emit(result{Step: step, OK: true, Detail: detail})
}

func unprepare(ctx context.Context, client drapbv1.DRAPluginClient, claims []*drapbv1.Claim, service string, timeout time.Duration) {
	const step = "unprepare"
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := client.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: claims})
	if err != nil {
		fail(step, wrap("NodeUnprepareResources ("+service+")", err), nil)
		return
	}
	uid := claims[0].GetUid()
	for got := range resp.GetClaims() {
		if got != uid {
			fail(step, fmt.Errorf("NodeUnprepareResources returned result for unknown claim UID %s", got), nil)
			return
		}
	}
	res, ok := resp.GetClaims()[uid]
	if !ok {
		fail(step, fmt.Errorf("NodeUnprepareResources skipped %d ResourceClaims", 1), nil)
		return
	}
	detail := map[string]any{"claim_uid": uid, "service": service}
	if res.GetError() != "" {
		fail(step, fmt.Errorf("NodeUnprepareResources failed for ResourceClaim %s: %s", claims[0].GetName(), res.GetError()), detail)
		return
	}
	emit(result{Step: step, OK: true, Detail: detail})
}

func watchHealth(ctx context.Context, conn *grpc.ClientConn, service string, timeout time.Duration) {
	const step = "health"
	var stream drahealthv1.DRAResourceHealth_NodeWatchResourcesClient
	var err error
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch service {
	case drahealthv1.DRAResourceHealthService:
		stream, err = drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	case drahealthv1alpha1.DRAResourceHealthService:
		stream, err = drahealthv1.V1Alpha1ClientWrapper{Client: drahealthv1alpha1.NewDRAResourceHealthClient(conn)}.
			NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	default:
		fail(step, fmt.Errorf("the plugin advertises none of the health services the kubelet knows (%q); the kubelet would not watch health", healthServices), nil)
		return
	}
	if err != nil {
		fail(step, wrap("NodeWatchResources ("+service+")", err), nil)
		return
	}
	msg, err := stream.Recv()
	if err != nil {
		fail(step, wrap("NodeWatchResources ("+service+") first message", err), nil)
		return
	}
	devices := []healthOut{}
	for _, d := range msg.GetDevices() {
		devices = append(devices, healthOut{
			Pool:    d.GetDevice().GetPoolName(),
			Device:  d.GetDevice().GetDeviceName(),
			Health:  d.GetHealth().String(),
			Message: d.GetMessage(),
		})
	}
	emit(result{Step: step, OK: true, Detail: map[string]any{"service": service, "count": len(devices), "devices": devices}})
}
