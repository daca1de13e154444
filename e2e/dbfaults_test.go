package e2e

import (
	"strings"
	"testing"
	"time"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// clusterd started while its database is down waits for it (a log line per
// attempt) and serves once it is up, instead of exiting at once.
func TestStartWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	db := startPrivateMariaDB(t)
	dsn := db.newDatabase("waits")
	db.stop()
	s, err := spawn(t, "e2e-wait", []string{"--database", dsn, "--server-id", "e2e-wait", "--sim-step-delay", "0", "--database-wait", "60s"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.waitLog(t, "database not reachable yet; waiting", startTimeout)
	down := time.Now()
	db.start()
	if err := s.waitServing(t, startTimeout); err != nil {
		t.Fatal(err)
	}
	t.Logf("clusterd serving %s after its database came up", time.Since(down).Round(time.Millisecond))
	if out := readLog(s.logPath); !strings.Contains(out, "attempt=1") || !strings.Contains(out, "database reachable") {
		t.Errorf("the wait is not logged per attempt:\n%s", out)
	}
	s.create(t, "after-wait")
}

// The database restarts while an upgrade is between two nodes: the step
// that was running when it went down fails, and the job's end is retried
// until the database is back, so the job is FAILED (not left IN_PROGRESS),
// and the cluster, whose nodes now run two versions, is ALERT with a reason
// naming them, and stays ALERT. (Before, the end was lost, and the cluster
// was later reported RUNNING on two versions.)
func TestDatabaseRestartDuringUpgrade(t *testing.T) {
	t.Parallel()
	db := startPrivateMariaDB(t)
	dsn := db.newDatabase("restart")
	flags := []string{"--reconcile-interval", "300ms", "--scan-interval", "300ms"}
	s := startServer(t, dsn, "e2e-dbrestart", flags...)
	cluster := s.create(t, "restart").GetName()

	fault := s.hold(t, "upgrade_node", cluster)
	ctx, cancel := rpcCtx()
	resp, err := s.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: cluster, KubernetesVersion: "1.30.5"})
	cancel()
	op := started(t, "upgrade", resp, err)
	first := s.waitHeld(t, "the first upgrade_node", heldStep("upgrade_node", cluster))
	s.release(t, fault)
	s.waitHeld(t, "the second upgrade_node", func(h *clv1.HeldStep) bool {
		return heldStep("upgrade_node", cluster)(h) && h.GetMachine() != first.GetMachine()
	})

	db.stop()
	stopped := time.Now()
	s.release(t, fault) // the step goes on against a database that is down
	s.waitLog(t, "could not record the end of the job; retrying", 30*time.Second)
	db.start()
	t.Logf("database down for %s", time.Since(stopped).Round(time.Millisecond))

	done := s.waitOp(t, op)
	if e := done.GetError(); e == nil {
		t.Fatalf("the upgrade interrupted by the restart succeeded")
	}
	c, _ := s.waitCluster(t, cluster, "released", opTimeout, released)
	if c.GetState() != clv1.Cluster_ALERT {
		t.Errorf("after the restart %s is %s; want ALERT", cluster, c.GetState())
	}
	evs := s.events(t, cluster)
	const skew = "1.30.2 on 2 nodes, 1.30.5 on 1 node"
	named := false
	for _, e := range evs {
		named = named || (e.GetToState() == clv1.Cluster_ALERT && strings.Contains(e.GetMessage(), skew))
	}
	if !named {
		t.Errorf("no history entry takes %s to ALERT naming the versions %q:%s", cluster, skew, describeEvents(evs))
	}
	// Reconciliation passes every 300ms: the cluster stays ALERT although
	// every machine runs and has joined.
	until := time.Now().Add(3 * time.Second)
	for time.Now().Before(until) {
		if c := s.cluster(t, cluster); c.GetState() != clv1.Cluster_ALERT {
			t.Fatalf("%s went %s with its nodes on two versions:%s", cluster, c.GetState(), describeEvents(s.events(t, cluster)))
		}
		time.Sleep(100 * time.Millisecond) // observing, not synchronising
	}
}
