package server

import (
	"strings"
	"testing"
	"time"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository/repotest"
)

// A cluster whose nodes run different Kubernetes versions is not RUNNING
// (SPEC §5.2): the upgrade that failed halfway ends in ALERT saying which
// versions the nodes run, reconciliation leaves it in ALERT although every
// machine runs and has joined, a start cannot end RUNNING on such nodes,
// and only an upgrade that makes the nodes equal (from ALERT: the table
// allows it for this) lets it be RUNNING for good.
// The test makes every reconciliation pass itself, so nothing races it.
func TestHonestState_NodesOnDifferentVersionsAreNotRunning(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b, func(c *Config) { c.ReconcileInterval = time.Nanosecond })
		pass := func() {
			t.Helper()
			if rep := r.srv.scanner.Pass(r.ctx); len(rep.Errors) > 0 || rep.Skipped != "" {
				t.Fatalf("scanner pass: %v %s", rep.Errors, rep.Skipped)
			}
		}
		name := r.create("skew", 2).GetName()
		skew := "1.30.2 on 2 nodes, 1.30.5 on 1 node"

		// The upgrade fails at its second node: the control node is at
		// 1.30.5, the workers at 1.30.2.
		first := r.hold(infra.StepUpgradeNode, name)
		op := r.accepted(r.upgrade(name, "1.30.5"))
		r.heldBy(first)
		if _, err := r.srv.sim.InjectFault(sim.Fault{Step: infra.StepUpgradeNode, Mode: sim.ModeFail, ClusterID: clusterUUID(name), Count: 1}); err != nil {
			t.Fatal(err)
		}
		r.let(first)
		r.failed(op)
		if c := r.cluster(name); c.GetState() != clv1.Cluster_ALERT {
			t.Fatalf("after the failed upgrade %s is %s; want ALERT", name, c.GetState())
		}
		hist := r.history(name)
		if end := hist[len(hist)-1]; end.Name != lifecycle.OperationFailed.String() || !strings.Contains(end.Message, skew) {
			t.Errorf("the failed upgrade's end: %s %q; want OPERATION_FAILED naming %q", end.Name, end.Message, skew)
		}

		// Every machine runs and has joined: before, reconciliation brought
		// the cluster back to RUNNING here.
		pass()
		if c := r.cluster(name); c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" {
			t.Errorf("after reconciliation %s is %s held by %q; want ALERT, left alone", name, c.GetState(), c.GetCurrentOperation())
		}

		// A start brings every machine up but cannot end RUNNING on nodes
		// that disagree: it ends ALERT by FAULTS_DETECTED, naming them.
		r.succeeded(r.accepted(r.startCluster(name)))
		c := r.cluster(name)
		hist = r.history(name)
		if end := hist[len(hist)-1]; c.GetState() != clv1.Cluster_ALERT || end.Name != lifecycle.FaultsDetected.String() || !strings.Contains(end.Message, skew) {
			t.Errorf("after a start on nodes with a skew: %s, last entry %s %q; want ALERT by FAULTS_DETECTED naming %q",
				c.GetState(), end.Name, end.Message, skew)
		}

		// Run the upgrade again (from ALERT): the nodes are equal, and the
		// cluster is RUNNING for good.
		r.succeeded(r.accepted(r.upgrade(name, "1.30.5")))
		pass()
		if c := r.cluster(name); c.GetState() != clv1.Cluster_RUNNING || c.GetKubernetesVersion() != "1.30.5" {
			t.Errorf("after the upgrade ran again %s is %s at %s; want RUNNING at 1.30.5", name, c.GetState(), c.GetKubernetesVersion())
		}
	})
}
