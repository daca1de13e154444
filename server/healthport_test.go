package server

import (
	"crypto/x509/pkix"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
)

// TestHealthPort: with TLS and identities on the API port, --health-addr
// answers a plaintext gRPC health check with no credentials, as
// Kubernetes' gRPC probes send it, for readiness ("") and liveness; it
// serves nothing else (not even Watch); without the flag there is no such
// port; and the shutdown's NOT_SERVING shows there.
func TestHealthPort(t *testing.T) {
	b := repotest.Backends(t)[0]
	if h := start(t, b); h.srv.HealthAddr() != "" {
		t.Errorf("health port %q without --health-addr; want none", h.srv.HealthAddr())
	}

	p := newPKI(t)
	certFile, keyFile, _ := p.issue(t, "server", pkix.Name{CommonName: "clusterd"}, true)
	h := start(t, b, withTokens(t), func(c *Config) {
		c.TLSCert, c.TLSKey, c.TLSClientCA = certFile, keyFile, filepath.Join(p.dir, "ca.pem")
		c.HealthAddr = "127.0.0.1:0"
	})
	conn, err := grpc.NewClient(h.srv.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := tctx(t)
	health := healthpb.NewHealthClient(conn)
	for _, service := range []string{"", LivenessService, clv1.ClusterLifecycle_ServiceDesc.ServiceName} {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("plaintext health check of %q on the health port: %v, %v; want SERVING", service, resp.GetStatus(), err)
		}
	}
	if w, err := health.Watch(ctx, &healthpb.HealthCheckRequest{}); err == nil {
		if _, err = w.Recv(); status.Code(err) != codes.Unimplemented {
			t.Errorf("Watch on the health port: %v; want UNIMPLEMENTED (Check only: a watch holds a stream per caller)", err)
		}
	}
	_, err = clv1.NewClusterLifecycleClient(conn).ListClusters(ctx, &clv1.ListClustersRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("ListClusters on the health port: %v; want UNIMPLEMENTED (the port serves health only)", err)
	}
	// The API port still wants TLS: a plaintext call there fails.
	api, err := grpc.NewClient(h.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	if _, err := healthpb.NewHealthClient(api).Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext health check on the TLS API port: %v; want UNAVAILABLE", err)
	}

	h.srv.health.Shutdown()
	resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: LivenessService})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("liveness on the health port after the shutdown began: %v, %v; want NOT_SERVING", resp.GetStatus(), err)
	}
}
