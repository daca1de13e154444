package server

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
	"github.com/clusterd/clusterd/service"
)

// A server whose lease lapsed (a SIGSTOP longer than the peer timeout, then
// SIGCONT) refuses new work with UNAVAILABLE, SERVER_UNAVAILABLE: a refusal,
// logged at WARN like every refusal (README, Logging), never at ERROR
// (issue 17 §3: make chaos found these at ERROR).
func TestRefusalUnavailableLoggedAtWarn(t *testing.T) {
	var logs logBuffer
	// No heartbeat after the first: the lease lapses after the peer timeout.
	h := start(t, repotest.Backends(t)[0], withJSONLog(&logs), func(c *Config) {
		c.HeartbeatInterval, c.PeerTimeout = time.Hour, 200*time.Millisecond
	})
	ctx := tctx(t)
	const id = "refused-no-lease"
	callCtx := metadata.AppendToOutgoingContext(ctx, RequestIDHeader, id)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := h.clients.clusters.CreateCluster(callCtx, &clv1.CreateClusterRequest{Cluster: &clv1.Cluster{
			DisplayName: "no-lease", KubernetesVersion: "1.30.2", WorkerNodeCount: 1, ServiceOffering: "medium",
		}})
		if err == nil {
			// The lease has not lapsed yet: the cluster exists, try again
			// under another name.
			if time.Now().After(deadline) {
				t.Fatal("the server still claims 30s after its lease should have lapsed")
			}
			continue
		}
		code, reason, _ := errorInfo(t, err)
		if code != codes.Unavailable || reason != service.ReasonServerUnavailable {
			// A create under a taken name is refused otherwise: only the
			// first call can succeed, so this is the refusal wanted.
			if code != codes.AlreadyExists {
				t.Fatalf("create without a lease: %v; want UNAVAILABLE SERVER_UNAVAILABLE", err)
			}
			if time.Now().After(deadline) {
				t.Fatal("the server still claims 30s after its lease should have lapsed")
			}
			continue
		}
		break
	}
	var warned bool
	for _, line := range logs.lines(t, id) {
		if line["level"] == "ERROR" {
			t.Errorf("a refusal logged at ERROR: %v", line)
		}
		if line["level"] == "WARN" && line["msg"] == "request refused: unavailable" {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no WARN line with the refusal's cause; lines: %v", logs.lines(t, id))
	}
}
