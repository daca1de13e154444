package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/repository/repotest"
)

// privateGalera is a 3-node Galera cluster of one test's own (scripts/
// galera.sh with its own folder and ports), which it may kill nodes of
// without disturbing the shared one other tests use.
type privateGalera struct {
	env []string
}

func startPrivateGalera(t *testing.T, port int) *privateGalera {
	t.Helper()
	if _, ok := repotest.Galera(t); !ok {
		t.Skip("no Galera (see the banner): the private cluster needs galera-4 as the shared one does")
	}
	dir := fmt.Sprintf("/tmp/clusterd-galera-%s-%d", strings.ToLower(t.Name()), os.Getpid())
	g := &privateGalera{env: append(os.Environ(), "GALERA_DIR="+dir, fmt.Sprintf("GALERA_PORT=%d", port))}
	t.Cleanup(func() { _ = g.run("destroy") })
	if err := g.run("start"); err != nil {
		t.Fatalf("start a private Galera cluster: %v", err)
	}
	return g
}

func (g *privateGalera) run(args ...string) error {
	cmd := exec.Command("bash", append([]string{"../scripts/galera.sh"}, args...)...)
	cmd.Env = g.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("galera.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (g *privateGalera) dsn(t *testing.T, n int) string {
	t.Helper()
	cmd := exec.Command("bash", "../scripts/galera.sh", "dsn", fmt.Sprint(n))
	cmd.Env = g.env
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// TestGaleraNodeOutOfPrimary: when the Galera node under a clusterd server
// loses the primary component (its two peers die), the server reports
// NOT_SERVING and answers UNAVAILABLE (never INTERNAL); when the peers come
// back, it serves again without a restart.
func TestGaleraNodeOutOfPrimary(t *testing.T) {
	t.Parallel()
	g := startPrivateGalera(t, 5306)
	s := startServer(t, g.dsn(t, 3), "e2e-galera-minority", "--peer-timeout", "3s", "--heartbeat-interval", "500ms")
	cluster := s.create(t, "minority").GetName()
	for _, n := range []string{"1", "2"} {
		if err := g.run("kill", n); err != nil {
			t.Fatal(err)
		}
	}
	lost := time.Now()
	health := healthpb.NewHealthClient(s.conn)
	servingIs := func(want healthpb.HealthCheckResponse_ServingStatus) func() bool {
		return func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
			return err == nil && resp.GetStatus() == want
		}
	}
	waitUntil(t, "NOT_SERVING once its node left the primary component", servingIs(healthpb.HealthCheckResponse_NOT_SERVING))
	t.Logf("NOT_SERVING %s after the node lost its peers", time.Since(lost).Round(time.Millisecond))
	// Reads go on until the node itself notices it is alone (its group
	// timeouts); from then on they are refused. Nothing is ever INTERNAL.
	waitUntil(t, "GetCluster UNAVAILABLE once the node is out of the primary component", func() bool {
		ctx, cancel := rpcCtx()
		defer cancel()
		_, err := s.clusters.GetCluster(ctx, &clv1.GetClusterRequest{Name: cluster})
		if code := status.Code(err); code != codes.OK && code != codes.Unavailable {
			t.Fatalf("GetCluster while the node loses its peers: %v; want OK or UNAVAILABLE", err)
		}
		return status.Code(err) == codes.Unavailable
	})
	ctx, cancel := rpcCtx()
	_, err := s.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: cluster})
	cancel()
	if code := status.Code(err); code != codes.Unavailable {
		t.Errorf("StopCluster on a node out of the primary component: %v; want UNAVAILABLE", err)
	}
	// Both peers together: the node regains a primary component once a
	// majority of the last one is back.
	errs := make(chan error, 2)
	for _, n := range []string{"1", "2"} {
		go func() { errs <- g.run("start-node", n) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	back := time.Now()
	waitUntil(t, "SERVING once the primary component is back", servingIs(healthpb.HealthCheckResponse_SERVING))
	t.Logf("SERVING %s after the peers were back", time.Since(back).Round(time.Millisecond))
	var op string
	waitUntil(t, "a stop accepted again", func() bool {
		ctx, cancel := rpcCtx()
		defer cancel()
		resp, err := s.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: cluster})
		if err == nil {
			op = resp.GetName()
		}
		return err == nil
	})
	if done := s.waitOp(t, op); done.GetError() != nil {
		t.Errorf("the stop after the outage failed: %v", done.GetError())
	}
}
