package main

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clusterd/clusterd/server"
)

// TestHealthCommand runs `clusterd health` against a health service whose
// readiness is NOT_SERVING and whose liveness is SERVING, as a server's are
// during a database outage, through the flag and through its environment
// twin.
func TestHealthCommand(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus(server.LivenessService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	noEnv := func(string) string { return "" }
	env := func(k string) string {
		if k == "CLUSTERD_GRPC_ADDR" {
			return "0.0.0.0:" + port // a wildcard listen address is asked on loopback
		}
		return ""
	}
	for _, tc := range []struct {
		name    string
		args    []string
		getenv  func(string) string
		wantErr string
	}{
		{"ready, flag", []string{"--grpc-addr", lis.Addr().String()}, noEnv, "NOT_SERVING"},
		{"ready, environment", nil, env, "NOT_SERVING"},
		{"alive, flag", []string{"--grpc-addr", lis.Addr().String(), "--service", "liveness"}, noEnv, ""},
		{"alive, environment", []string{"--service", "liveness"}, env, ""},
		{"unknown service", []string{"--service", "nope"}, env, "NotFound"},
		{"no port", []string{"--grpc-addr", "127.0.0.1"}, noEnv, "missing port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := healthCheck(tc.args, tc.getenv, &out, &errOut)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("clusterd health %v: %v; want SERVING", tc.args, err)
			case tc.wantErr == "" && strings.TrimSpace(out.String()) != "SERVING":
				t.Fatalf("clusterd health %v printed %q; want SERVING", tc.args, out.String())
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("clusterd health %v: %v; want an error with %q", tc.args, err, tc.wantErr)
			}
		})
	}
}

func TestProbeAddr(t *testing.T) {
	for in, want := range map[string]string{
		":9090":          "127.0.0.1:9090",
		"0.0.0.0:9090":   "127.0.0.1:9090",
		"[::]:9090":      "127.0.0.1:9090",
		"10.0.0.5:9090":  "10.0.0.5:9090",
		"localhost:9090": "localhost:9090",
	} {
		if got, err := probeAddr(in); err != nil || got != want {
			t.Errorf("probeAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"127.0.0.1:0", "127.0.0.1", "127.0.0.1:"} {
		if got, err := probeAddr(in); err == nil {
			t.Errorf("probeAddr(%q) = %q; want an error", in, got)
		}
	}
}
