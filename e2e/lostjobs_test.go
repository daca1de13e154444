package e2e

import (
	"fmt"
	"testing"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// TestServerKeepsItsOwnLiveJobs creates clusters one after another on a
// server whose scanner passes every 2ms: no live job may be failed by its
// own server. The scanner fails this server's own IN_PROGRESS jobs that its
// runner does not run (their end could not be recorded); a job whose claim
// has committed but which has not reached the runner yet must not be taken
// for one. A 2ms scan interval makes that window likely to be seen.
func TestServerKeepsItsOwnLiveJobs(t *testing.T) {
	t.Parallel()
	s := startServer(t, newDatabase(t), "e2e-lost", "--scan-interval", "2ms", "--reconcile-interval", "1h")
	const n = 20
	failed := 0
	for i := range n {
		ctx, cancel := rpcCtx()
		op, err := s.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: spec(fmt.Sprintf("lost-%d", i))})
		cancel()
		done := s.waitOp(t, started(t, "create", op, err))
		if e := done.GetError(); e != nil {
			failed++
			if failed == 1 {
				t.Errorf("create %s on a live, healthy server failed: %s", done.GetName(), e.GetMessage())
			}
		}
	}
	if failed > 0 {
		t.Errorf("BUG (non-test code): %d of %d creates were failed by their own live server: its scanner took a job that had just been claimed, and not yet handed to the runner, for a job the runner had lost (scanner/decide.go decideLost)", failed, n)
	}
}
