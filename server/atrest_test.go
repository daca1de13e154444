package server

import (
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// At rest, the record matches the machines (issue 17 §3, SPEC §5.2): an
// operation that ends RUNNING leaves every machine running, joined and at
// the recorded version, or ends ALERT naming what is not, and
// reconciliation compares each machine with the record, not only with the
// others. The tests make every reconciliation pass themselves, so nothing
// races them.

// atRestRig is a rig whose scanner passes only when the test says, and
// reconciles at every pass; mutate changes its configuration further.
func atRestRig(t *testing.T, b repotest.Backend, mutate ...func(*Config)) (*rig, func()) {
	r := newRig(t, b, append([]func(*Config){func(c *Config) { c.ReconcileInterval = time.Nanosecond }}, mutate...)...)
	pass := func() {
		t.Helper()
		if rep := r.srv.scanner.Pass(r.ctx); len(rep.Errors) > 0 || rep.Skipped != "" {
			t.Fatalf("scanner pass: %v %s", rep.Errors, rep.Skipped)
		}
	}
	return r, pass
}

// cancel asks for op's cancellation.
func (r *rig) cancel(op *longrunningpb.Operation) {
	r.t.Helper()
	if _, err := r.clients.ops.CancelOperation(r.ctx, &longrunningpb.CancelOperationRequest{Name: op.GetName()}); err != nil {
		r.t.Fatal(err)
	}
}

// lastEntry is the last entry of a cluster's history.
func (r *rig) lastEntry(name string) repository.Event {
	r.t.Helper()
	hist := r.history(name)
	return hist[len(hist)-1]
}

// machinesMatch fails the test unless every node of c runs, has joined and
// runs c's recorded version.
func machinesMatch(t *testing.T, c *clv1.Cluster) {
	t.Helper()
	for _, n := range c.GetNodes() {
		if n.GetPower() != clv1.Node_RUNNING || !n.GetJoined() || n.GetKubernetesVersion() != c.GetKubernetesVersion() {
			t.Errorf("%s (%s at %s): node %s power %s joined %t version %s", c.GetName(), c.GetState(), c.GetKubernetesVersion(),
				n.GetName(), n.GetPower(), n.GetJoined(), n.GetKubernetesVersion())
		}
	}
}

// A cancelled upgrade that had already upgraded every node ends ALERT with
// the record still at the old version. Before, reconciliation found "all
// running and joined" and set RUNNING at 1.30.2 over nodes on 1.30.5. SPEC
// §5.2 says such a cluster stays ALERT until an upgrade makes the nodes
// equal to the record (the record is not rewritten to what the nodes run:
// only an upgrade, which checks the step between versions, records a
// version); a start cannot end RUNNING on them either, and the upgrade,
// allowed from ALERT for this, records 1.30.5 and ends RUNNING.
func TestAtRest_CancelledUpgradeAfterEveryNodeStaysAlert(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r, pass := atRestRig(t, b)
		name := r.create("cancelled-upgrade", 1).GetName()
		offRecord := "nodes run 1.30.5 on 2 nodes, not the recorded 1.30.2"

		// Both nodes are upgraded; the cancel ends the first ISO's detach,
		// held, so the upgrade stops before its end records 1.30.5.
		f := r.hold(infra.StepDetachISO, name)
		op := r.accepted(r.upgrade(name, "1.30.5"))
		r.heldBy(f)
		r.cancel(op)
		r.failed(op)
		c := r.cluster(name)
		if c.GetState() != clv1.Cluster_ALERT || c.GetKubernetesVersion() != "1.30.2" {
			t.Fatalf("after the cancelled upgrade %s is %s at %s; want ALERT at 1.30.2", name, c.GetState(), c.GetKubernetesVersion())
		}
		for _, n := range c.GetNodes() {
			if n.GetKubernetesVersion() != "1.30.5" || n.GetPower() != clv1.Node_RUNNING || !n.GetJoined() {
				t.Fatalf("node %s: %s, %s, joined %t; want every node running, joined, on 1.30.5", n.GetName(), n.GetKubernetesVersion(), n.GetPower(), n.GetJoined())
			}
		}
		if end := r.lastEntry(name); end.Name != lifecycle.OperationFailed.String() || !strings.Contains(end.Message, offRecord) {
			t.Errorf("the cancelled upgrade's end: %s %q; want OPERATION_FAILED naming %q", end.Name, end.Message, offRecord)
		}

		// Every machine runs and has joined, all on one version: the
		// record's is not theirs, so reconciliation leaves it in ALERT.
		pass()
		if c := r.cluster(name); c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" {
			t.Fatalf("after reconciliation %s is %s held by %q; want ALERT, left alone", name, c.GetState(), c.GetCurrentOperation())
		}

		// A start brings everything up, but cannot end RUNNING on nodes the
		// record does not describe: it ends ALERT, saying so.
		r.succeeded(r.accepted(r.startCluster(name)))
		c = r.cluster(name)
		end := r.lastEntry(name)
		if c.GetState() != clv1.Cluster_ALERT || end.Name != lifecycle.FaultsDetected.String() || !strings.Contains(end.Message, offRecord) {
			t.Errorf("after a start %s is %s, last entry %s %q; want ALERT by FAULTS_DETECTED naming %q", name, c.GetState(), end.Name, end.Message, offRecord)
		}

		// The upgrade, from ALERT, records the nodes' version: RUNNING for good.
		r.succeeded(r.accepted(r.upgrade(name, "1.30.5")))
		pass()
		c = r.cluster(name)
		if c.GetState() != clv1.Cluster_RUNNING || c.GetKubernetesVersion() != "1.30.5" {
			t.Errorf("after the upgrade from ALERT %s is %s at %s; want RUNNING at 1.30.5", name, c.GetState(), c.GetKubernetesVersion())
		}
		machinesMatch(t, c)
	})
}

// A cluster ALERT with one machine on and the others off (as a start
// cancelled after powering on one machine leaves it; here a stopped
// cluster's control node powered on out of band, which reconciliation takes
// to ALERT). Before, a RemoveNodes from there succeeded and set RUNNING
// with a machine still off (and a scale and an upgrade then went on on it).
// Now the remove ends ALERT naming the machine that is off, as does a scale
// from ALERT that leaves it off; the start that powers it on ends RUNNING.
func TestAtRest_RemoveNodesFromAlertWithAMachineOffEndsAlert(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r, pass := atRestRig(t, b)
		name := r.stopped("remove-from-alert", 2).GetName()

		for _, n := range r.cluster(name).GetNodes() {
			if n.GetRole() != clv1.Node_CONTROL {
				continue
			}
			if _, err := r.clients.sim.SetMachinePower(r.ctx, &clv1.SetMachinePowerRequest{Name: n.GetName(), Power: clv1.Node_RUNNING}); err != nil {
				t.Fatal(err)
			}
		}
		pass()
		c := r.cluster(name)
		var on []string
		var off []*clv1.Node
		for _, n := range c.GetNodes() {
			if n.GetPower() == clv1.Node_RUNNING {
				on = append(on, n.GetName())
			} else {
				off = append(off, n)
			}
		}
		if c.GetState() != clv1.Cluster_ALERT || len(on) != 1 || len(off) != 2 {
			t.Fatalf("after the cancelled start %s is %s with %v on; want ALERT with one machine on", name, c.GetState(), on)
		}
		var victim, leftOff string
		for _, n := range off {
			if n.GetRole() == clv1.Node_WORKER && victim == "" {
				victim = n.GetName()
			} else {
				leftOff = n.GetName()
			}
		}

		op := r.succeeded(r.accepted(r.clients.clusters.RemoveNodes(r.ctx, &clv1.RemoveNodesRequest{Name: name, Nodes: []string{victim}})))
		c = r.cluster(name)
		end := r.lastEntry(name)
		leftID := strings.TrimPrefix(leftOff, "machines/")
		if c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" || end.Name != lifecycle.FaultsDetected.String() ||
			end.Operation != operationUUID(op.GetName()) || !strings.Contains(end.Message, "machine "+leftID+" is STOPPED") {
			t.Fatalf("after remove nodes from ALERT %s is %s held by %q, last entry %s by %s %q; want ALERT, unheld, by the remove's FAULTS_DETECTED naming machine %s STOPPED",
				name, c.GetState(), c.GetCurrentOperation(), end.Name, end.Operation, end.Message, leftID)
		}
		if c.GetWorkerNodeCount() != 1 || len(c.GetNodes()) != 2 {
			t.Errorf("after remove nodes %s records %d workers over %d nodes; want 1 worker, 2 nodes (the remove did its work)", name, c.GetWorkerNodeCount(), len(c.GetNodes()))
		}
		pass()
		if c := r.cluster(name); c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" {
			t.Errorf("after reconciliation %s is %s held by %q; want ALERT, left alone", name, c.GetState(), c.GetCurrentOperation())
		}

		// A scale from ALERT adds a worker, but the machine it did not
		// touch is still off: ALERT again.
		r.succeeded(r.accepted(r.scaleTo(name, 2)))
		if c := r.cluster(name); c.GetState() != clv1.Cluster_ALERT || c.GetWorkerNodeCount() != 2 {
			t.Errorf("after a scale from ALERT %s is %s with %d workers; want ALERT with 2", name, c.GetState(), c.GetWorkerNodeCount())
		}

		r.succeeded(r.accepted(r.startCluster(name)))
		pass()
		c = r.cluster(name)
		if c.GetState() != clv1.Cluster_RUNNING {
			t.Errorf("after the start %s is %s; want RUNNING", name, c.GetState())
		}
		machinesMatch(t, c)
	})
}

// Reconciliation compares each machine of a RUNNING cluster with the
// record: a node that left Kubernetes, or nodes that all run a version the
// record does not (changed behind clusterd's back), take it to ALERT naming
// them, although every machine is powered on.
func TestAtRest_ReconciliationComparesEachMachineWithTheRecord(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r, pass := atRestRig(t, b)
		for _, tc := range []struct {
			name   string
			change repository.MachineChanges
			want   func(id string) string
		}{
			{"unjoined", repository.MachineChanges{Joined: new(false)}, func(id string) string { return "machine " + id + " has not joined" }},
			{"other-version", repository.MachineChanges{KubernetesVersion: new("1.30.5")}, func(string) string {
				return "nodes run 1.30.5 on 2 nodes, not the recorded 1.30.2"
			}},
		} {
			name := r.create(tc.name, 1).GetName()
			c := r.cluster(name)
			var first string
			for _, n := range c.GetNodes() {
				id := strings.TrimPrefix(n.GetName(), "machines/")
				first = id
				if _, err := r.seed.UpdateMachine(r.ctx, id, repository.MachineCondition{}, tc.change); err != nil {
					t.Fatal(err)
				}
				if tc.change.Joined != nil {
					break // one node is enough
				}
			}
			pass()
			c = r.cluster(name)
			end := r.lastEntry(name)
			if want := tc.want(first); c.GetState() != clv1.Cluster_ALERT || end.Name != lifecycle.FaultsDetected.String() || !strings.Contains(end.Message, want) {
				t.Errorf("%s: after reconciliation %s is %s, last entry %s %q; want ALERT by FAULTS_DETECTED naming %q", tc.name, name, c.GetState(), end.Name, end.Message, want)
			}
			pass()
			if c := r.cluster(name); c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" {
				t.Errorf("%s: a second pass took %s to %s held by %q; want ALERT, left alone", tc.name, name, c.GetState(), c.GetCurrentOperation())
			}
		}
	})
}

// A stop from ALERT after an upgrade cancelled after every node powers the
// machines off, but cannot file the cluster STOPPED at 1.30.2 over nodes on
// 1.30.5 (the chaos soak's "STOPPED on mixed versions" after a failed
// upgrade): it ends ALERT naming the versions, and reconciliation leaves
// it there rather than stopping it (its machines are all off). The
// upgrade from ALERT records 1.30.5; then the machines, all off and at the
// record's version, are stopped by reconciliation, and a start ends
// RUNNING.
func TestAtRest_StopOnNodesOffTheRecordEndsAlert(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r, pass := atRestRig(t, b)
		name := r.create("stopped-off-record", 1).GetName()
		offRecord := "nodes run 1.30.5 on 2 nodes, not the recorded 1.30.2"

		f := r.hold(infra.StepDetachISO, name)
		op := r.accepted(r.upgrade(name, "1.30.5"))
		r.heldBy(f)
		r.cancel(op) // ends the held detach at once
		r.failed(op)
		if c := r.cluster(name); c.GetState() != clv1.Cluster_ALERT || c.GetKubernetesVersion() != "1.30.2" {
			t.Fatalf("after the cancelled upgrade %s is %s at %s; want ALERT at 1.30.2", name, c.GetState(), c.GetKubernetesVersion())
		}

		r.succeeded(r.accepted(r.stopCluster(name)))
		c := r.cluster(name)
		end := r.lastEntry(name)
		if c.GetState() != clv1.Cluster_ALERT || end.Name != lifecycle.FaultsDetected.String() || !strings.Contains(end.Message, offRecord) {
			t.Fatalf("after a stop %s is %s, last entry %s %q; want ALERT by FAULTS_DETECTED naming %q", name, c.GetState(), end.Name, end.Message, offRecord)
		}
		for _, n := range c.GetNodes() {
			if n.GetPower() != clv1.Node_STOPPED {
				t.Errorf("after the stop node %s is %s; want STOPPED", n.GetName(), n.GetPower())
			}
		}

		pass()
		if c := r.cluster(name); c.GetState() != clv1.Cluster_ALERT || c.GetCurrentOperation() != "" {
			t.Fatalf("after reconciliation %s is %s held by %q; want ALERT, left alone", name, c.GetState(), c.GetCurrentOperation())
		}

		// The upgrade records the nodes' version; its machines are off, so
		// it ends ALERT, and reconciliation stops it for good.
		r.succeeded(r.accepted(r.upgrade(name, "1.30.5")))
		pass()
		r.waitState(t, name, clv1.Cluster_STOPPED)
		if c := r.cluster(name); c.GetKubernetesVersion() != "1.30.5" {
			t.Errorf("STOPPED %s records %s; want 1.30.5", name, c.GetKubernetesVersion())
		}
		r.succeeded(r.accepted(r.startCluster(name)))
		c = r.cluster(name)
		if c.GetState() != clv1.Cluster_RUNNING || c.GetKubernetesVersion() != "1.30.5" {
			t.Errorf("after a start %s is %s at %s; want RUNNING at 1.30.5", name, c.GetState(), c.GetKubernetesVersion())
		}
		machinesMatch(t, c)
	})
}
