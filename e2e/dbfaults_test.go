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
// that was running when it went down meets the outage, the job waits for
// the database and, once it answers, hands itself off and is adopted by the
// same server, which runs it on from that step. The upgrade succeeds: every
// node on the new version, the cluster RUNNING, its history saying where the
// upgrade went on from. (Before, the step's failure failed the operation
// and left the cluster ALERT on two versions, and before that the end was
// lost and the cluster reported RUNNING on two versions.)
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
	s.waitLog(t, "could not hand the job off; retrying", 30*time.Second)
	db.start()
	t.Logf("database down for %s", time.Since(stopped).Round(time.Millisecond))
	ctx, cancel = rpcCtx()
	_, err = s.sim.ClearFaults(ctx, &clv1.ClearFaultsRequest{})
	cancel()
	if err != nil {
		t.Fatalf("ClearFaults: %v", err)
	}

	done := s.waitOp(t, op)
	if e := done.GetError(); e != nil {
		t.Fatalf("the upgrade interrupted by the restart failed: code %d: %s", e.GetCode(), e.GetMessage())
	}
	c, _ := s.waitCluster(t, cluster, "released", opTimeout, released)
	for _, m := range s.healthy(t, c) {
		if v := m.GetKubernetesVersion(); v != "1.30.5" {
			t.Errorf("%s of %s runs %s after the upgrade; want 1.30.5", m.GetName(), cluster, v)
		}
	}
	evs := s.events(t, cluster)
	resumed := false
	for _, e := range evs {
		resumed = resumed || (e.GetOperation() == done.GetName() && strings.Contains(e.GetMessage(), "adopted by server e2e-dbrestart") &&
			strings.Contains(e.GetMessage(), "goes on from step upgrade_node"))
	}
	if !resumed {
		t.Errorf("no history entry of %s says the upgrade went on from upgrade_node on the same server:%s", cluster, describeEvents(evs))
	}
}
