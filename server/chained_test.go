package server

import (
	"strings"
	"testing"
	"time"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// A scale that a lost server interrupts after its new worker joined leaves
// a joined machine beyond the spec's count; recovery keeps it and records
// the counts it kept (SPEC §5.3). With --on-owner-loss=fail the recovery
// job can itself be lost (its server killed) or fail (a repair step
// failed): the recovery that takes over, and the failed recovery's own
// repair on its way out, must still record the counts. Before, both
// repaired as for a "recover" job and kept the old spec: ALERT with 2
// workers against a spec of 1, which reconciliation (or a start) then took
// to RUNNING (the chaos soak's "4 workers against a spec of 3").
func TestRecovery_ARecoveryLostOrFailedStillRecordsTheNodesKept(t *testing.T) {
	cases := []struct {
		name string
		// lost: the first recovery, held at its detach_iso repair, is
		// failed as a lost server's liveness pass would fail it, and a
		// second recovery takes over; otherwise that repair step fails.
		lost bool
	}{
		{name: "recovery lost", lost: true},
		{name: "recovery failed", lost: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b repotest.Backend) {
				r, pass := atRestRig(t, b, failOnOwnerLoss)
				r.firstPassDone()
				name := r.create("chained", 1).GetName()

				// The scale's new worker has joined; the scale waits to
				// detach its ISO when its server is lost: its job is failed
				// as a live peer's liveness pass fails a dead server's.
				scaleHold := r.hold(infra.StepDetachISO, name)
				op := r.accepted(r.scaleTo(name, 2))
				r.heldBy(scaleHold)
				r.failJob(operationUUID(op.GetName()), "owner lost")

				if tc.lost {
					// The first recovery is lost at its detach_iso repair.
					recHold := r.hold(infra.StepDetachISO, name)
					pass()
					r.heldBy(recHold)
					first := r.cluster(name).GetCurrentOperation()
					if first == "" || first == op.GetName() {
						t.Fatalf("after the pass %s is held by %q; want a recovery job", name, first)
					}
					r.failJob(operationUUID(first), "owner lost")
					pass()
					r.recovered(name)
					r.let(recHold)
				} else {
					// The first recovery's detach_iso repair fails.
					r.fail(infra.StepDetachISO, name)
					pass()
					r.recovered(name)
				}
				r.let(scaleHold)

				c := r.cluster(name)
				if workers := countWorkers(c); c.GetWorkerNodeCount() != workers || workers != 2 {
					t.Errorf("after recovery %s (%s) records %d workers and has %d; want 2 and 2", name, c.GetState(), c.GetWorkerNodeCount(), workers)
				}
				recorded := false
				for _, e := range r.history(name) {
					recorded = recorded || (e.Name == repository.Repair && strings.HasPrefix(e.Message, "spec: "))
				}
				if !recorded {
					for _, e := range r.history(name) {
						t.Logf("%s %s %s %q", e.Name, e.To, e.Operation, e.Message)
					}
					for _, j := range r.jobs(name) {
						t.Logf("job %s %s %s %s", j.ID, j.Kind, j.Status, j.Params)
					}
					t.Errorf("history of %s has no REPAIR recording the spec", name)
				}

				// Every machine runs and has joined: reconciliation brings
				// it back, on a record that matches the machines.
				pass()
				r.waitState(t, name, clv1.Cluster_RUNNING)
				c = r.cluster(name)
				if workers := countWorkers(c); c.GetState() != clv1.Cluster_RUNNING || c.GetWorkerNodeCount() != workers {
					t.Errorf("at rest %s is %s recording %d workers with %d; want RUNNING with the count it records", name, c.GetState(), c.GetWorkerNodeCount(), workers)
				}
				machinesMatch(t, c)
			})
		})
	}
}

// firstPassDone waits (bounded) for the pass the server's scanner makes at
// start, which a loaded machine may delay into the test's own steps.
func (r *rig) firstPassDone() {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for r.srv.scanner.Metrics().Passes == 0 {
		if time.Now().After(deadline) {
			r.t.Fatal("the scanner's first pass did not run within 30s")
		}
		time.Sleep(10 * time.Millisecond) // sampling a counter, not synchronising
	}
}

// recovered waits (bounded) until recovery has ended the interrupted
// operation on cluster name: held by nothing, ALERT (or RUNNING, should a
// reconciliation have brought it back since).
func (r *rig) recovered(name string) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c := r.cluster(name)
		if c.GetCurrentOperation() == "" && (c.GetState() == clv1.Cluster_ALERT || c.GetState() == clv1.Cluster_RUNNING) {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s is %s held by %q 30s on; want recovery ended", name, c.GetState(), c.GetCurrentOperation())
		}
		time.Sleep(10 * time.Millisecond) // sampling a state, not synchronising
	}
}

// failJob fails a running job as a live server's liveness pass fails the
// jobs of a dead one, leaving its cluster held for orphan recovery.
func (r *rig) failJob(jobID, why string) {
	r.t.Helper()
	if _, err := r.seed.FinishJob(r.ctx, repository.Finish{JobID: jobID, Status: repository.JobFailed, Error: why}); err != nil {
		r.t.Fatalf("fail job %s: %v", jobID, err)
	}
}

// countWorkers counts c's worker nodes.
func countWorkers(c *clv1.Cluster) int32 {
	n := int32(0)
	for _, node := range c.GetNodes() {
		if node.GetRole() == clv1.Node_WORKER {
			n++
		}
	}
	return n
}
