package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc/codes"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// A scanner that passes (and reconciles) every 200ms.
var busyScanner = []string{"--scan-interval", "200ms", "--reconcile-interval", "200ms"}

// TestStartFromAlertNotTakenPartway starts an ALERT cluster (one machine
// powered off out of band) while the scanner passes every 200ms, holds the
// start at power_on for many passes, and checks SPEC §3.8: nothing takes the
// cluster partway; the states seen are ALERT, STARTING, RUNNING only, and the
// history after ALERT is the start and its success.
func TestStartFromAlertNotTakenPartway(t *testing.T) {
	t.Parallel()
	s := startServer(t, newDatabase(t), "e2e-scan", busyScanner...)
	cluster := s.create(t, "alert").GetName()
	var worker string
	for _, m := range s.machines(t, cluster) {
		if m.GetRole() == clv1.Node_WORKER {
			worker = m.GetName()
		}
	}
	s.setPower(t, worker, clv1.Node_STOPPED)
	s.waitCluster(t, cluster, "ALERT (reconciliation of the machine powered off)", opTimeout,
		func(c *clv1.Cluster) bool { return c.GetState() == clv1.Cluster_ALERT })
	before := len(s.events(t, cluster))

	var seen []clv1.Cluster_State
	sample := func() *clv1.Cluster {
		c := s.cluster(t, cluster)
		if n := len(seen); n == 0 || seen[n-1] != c.GetState() {
			seen = append(seen, c.GetState())
		}
		return c
	}
	sample()
	fault := s.hold(t, "power_on", cluster)
	ctx, cancel := rpcCtx()
	resp, err := s.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: cluster})
	cancel()
	op := started(t, "start from ALERT", resp, err)
	held := s.waitHeld(t, "power_on", heldStep("power_on", cluster))
	// Sample while held for ten scanner passes.
	for until := held.GetHoldTime().AsTime().Add(2 * time.Second); time.Now().Before(until); {
		sample()
		time.Sleep(pollEvery)
	}
	s.release(t, fault)
	for deadline := time.Now().Add(opTimeout); ; time.Sleep(pollEvery) {
		if c := sample(); released(c) || time.Now().After(deadline) {
			break
		}
	}
	// And a few passes after.
	for until := time.Now().Add(600 * time.Millisecond); time.Now().Before(until); {
		sample()
		time.Sleep(pollEvery)
	}
	want := []clv1.Cluster_State{clv1.Cluster_ALERT, clv1.Cluster_STARTING, clv1.Cluster_RUNNING}
	if !equalStates(seen, want) {
		t.Errorf("states seen while starting from ALERT with the scanner at 200ms: %v, want %v", seen, want)
	}
	done := s.waitOp(t, op)
	if e := done.GetError(); e != nil {
		t.Errorf("start from ALERT failed: %s", e.GetMessage())
	}
	evs := s.events(t, cluster)[before:]
	if len(evs) != 2 ||
		evs[0].GetEvent() != "START_REQUESTED" || evs[0].GetToState() != clv1.Cluster_STARTING || evs[0].GetOperation() != op ||
		evs[1].GetEvent() != "OPERATION_SUCCEEDED" || evs[1].GetToState() != clv1.Cluster_RUNNING || evs[1].GetOperation() != op {
		t.Errorf("history after ALERT, want only the start %s and its success:%s", op, describeEvents(evs))
	}
	s.healthy(t, s.cluster(t, cluster))
}

func equalStates(a, b []clv1.Cluster_State) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestAlertStopRacesUserStart races the scanner's reconciliation of an ALERT
// cluster whose machines are all stopped (ALERT -> STOPPING -> STOPPED) with
// a user's start issued as soon as the cluster is ALERT, many times, with the
// scanner reconciling every 100ms. Either the start wins (the scanner's stop,
// listed before, misses its compare-and-set) and the cluster ends RUNNING,
// or the scanner's stop claimed first and the start is refused with ABORTED
// (OPERATION_IN_PROGRESS naming the scanner's stop, or
// CONCURRENT_MODIFICATION); then the stop completes and a start after it
// ends RUNNING. No operation is ever interrupted.
//
// The scanner's stop cannot be held to make the second outcome certain: with
// every machine already stopped it runs no step (see the report).
func TestAlertStopRacesUserStart(t *testing.T) {
	t.Parallel()
	s := startServer(t, newDatabase(t), "e2e-race", "--scan-interval", "100ms", "--reconcile-interval", "100ms")
	cluster := s.create(t, "race").GetName()
	const rounds = 12
	var userWon, scannerWon int
	failedStarts := map[string]bool{}
	for round := range rounds {
		s.stop(t, cluster)
		// A start that fails at its first power_on leaves the cluster ALERT
		// with every machine stopped.
		s.inject(t, &clv1.Fault{Step: "power_on", Mode: clv1.Fault_FAIL, Cluster: cluster, Count: 1})
		ctx, cancel := rpcCtx()
		resp, err := s.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: cluster})
		cancel()
		failing := started(t, "start to fail", resp, err)
		failedStarts[failing] = true
		if done := s.waitOp(t, failing); done.GetError() == nil || !strings.Contains(done.GetError().GetMessage(), "injected") {
			t.Fatalf("round %d: the start with a FAIL fault on power_on ended with %v, want the injected failure%s", round, done.GetError(), lostJobHint(done.GetError().GetMessage()))
		}

		ctx, cancel = rpcCtx()
		resp, err = s.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: cluster})
		cancel()
		if err == nil {
			userWon++
			s.succeed(t, "user's start racing the scanner's stop", resp, nil)
		} else {
			scannerWon++
			code, info := refusal(err)
			if code != codes.Aborted || (info.GetReason() != "OPERATION_IN_PROGRESS" && info.GetReason() != "CONCURRENT_MODIFICATION") {
				t.Fatalf("round %d: user's start racing the scanner's stop refused with %v %s (%v), want ABORTED OPERATION_IN_PROGRESS or CONCURRENT_MODIFICATION", round, code, info.GetReason(), err)
			}
			if info.GetReason() == "OPERATION_IN_PROGRESS" {
				holder := info.GetMetadata()["operation"]
				ctx, cancel := rpcCtx()
				got, gerr := s.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: holder})
				cancel()
				if gerr != nil || metadata(t, got).GetVerb() != "stop" {
					t.Fatalf("round %d: start refused naming %q (%v), want the scanner's stop: %v", round, holder, err, gerr)
				}
			}
			s.waitCluster(t, cluster, "STOPPED by the scanner", opTimeout, func(c *clv1.Cluster) bool {
				return c.GetState() == clv1.Cluster_STOPPED && c.GetCurrentOperation() == ""
			})
			s.start(t, cluster)
		}
		s.healthy(t, s.cluster(t, cluster))
	}
	t.Logf("user's start won %d of %d races, the scanner's stop %d", userWon, rounds, scannerWon)

	// No operation was interrupted: every operation on the cluster succeeded
	// except the starts failed on purpose.
	ctx, cancel := rpcCtx()
	defer cancel()
	list, err := s.ops.ListOperations(ctx, &longrunningpb.ListOperationsRequest{Filter: `cluster = "` + cluster + `"`, PageSize: 1000})
	if err != nil {
		t.Fatalf("ListOperations: %v", err)
	}
	for _, op := range list.GetOperations() {
		if !op.GetDone() {
			t.Errorf("operation %s (%s) still running at the end", op.GetName(), metadata(t, op).GetVerb())
		} else if op.GetError() != nil && !failedStarts[op.GetName()] {
			t.Errorf("operation %s (%s) failed: %s%s", op.GetName(), metadata(t, op).GetVerb(), op.GetError().GetMessage(), lostJobHint(op.GetError().GetMessage()))
		}
	}
}

// TestRecoveringInterrupted lets the scanner's reconciliation start bringing
// an ALERT cluster back (RECOVERING), holds that recovery at its repair
// (detach_iso of an ISO a failed upgrade left), checks that a user's start
// is refused naming the scanner's recovery, kills the server, and restarts
// it (with --on-owner-loss=fail): the interrupted recovery is itself recovered (RECOVERING -> ALERT, ISOs
// detached), and reconciliation then brings the cluster back to RUNNING.
func TestRecoveringInterrupted(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	const id = "e2e-recovering"
	flags := append(slices.Clone(busyScanner), failOnOwnerLoss...)
	s := startServer(t, dsn, id, flags...)
	cluster := s.create(t, "recovering").GetName()
	// The upgrade attaches the target's ISO to every node, then fails at
	// its first drain; the repair on its way out fails at its first detach
	// (faults fire oldest first): ALERT, every machine running and joined,
	// ISOs left for the scanner's recovery, which the HOLD then catches.
	s.inject(t, &clv1.Fault{Step: "drain_node", Mode: clv1.Fault_FAIL, Cluster: cluster, Count: 1})
	s.inject(t, &clv1.Fault{Step: "detach_iso", Mode: clv1.Fault_FAIL, Cluster: cluster, Count: 1})
	s.hold(t, "detach_iso", cluster)
	ctx, cancel := rpcCtx()
	resp, err := s.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: cluster, KubernetesVersion: "1.30.5"})
	cancel()
	upgrade := s.waitOp(t, started(t, "upgrade", resp, err))
	if upgrade.GetError() == nil {
		t.Fatalf("upgrade with a FAIL fault on drain_node succeeded")
	}

	held := s.waitHeld(t, "the scanner's recovery at detach_iso", heldStep("detach_iso", cluster))
	recovery := held.GetOperation()
	c := s.cluster(t, cluster)
	if c.GetState() != clv1.Cluster_RECOVERING || c.GetCurrentOperation() != recovery {
		t.Fatalf("while the scanner's recovery is held, %s is %s held by %q, want RECOVERING held by %s", cluster, c.GetState(), c.GetCurrentOperation(), recovery)
	}
	ctx, cancel = rpcCtx()
	_, err = s.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: cluster})
	cancel()
	if code, info := refusal(err); code != codes.Aborted || info.GetReason() != "OPERATION_IN_PROGRESS" || !strings.Contains(err.Error(), recovery) {
		t.Errorf("start during the scanner's recovery: %v (%s: %v), want ABORTED OPERATION_IN_PROGRESS naming %s", code, info.GetReason(), err, recovery)
	}

	s.kill9()
	s = startServer(t, dsn, id, flags...)
	c, took := s.waitRecovered(t, cluster, s.started, opTimeout)
	recordRecovery(t, "restart recovering@detach_iso (scanner's RECOVERING held)", took)
	if c.GetState() != clv1.Cluster_ALERT && c.GetState() != clv1.Cluster_RUNNING {
		t.Errorf("after restart %s is %s, want ALERT (then RUNNING by reconciliation)", cluster, c.GetState())
	}
	ctx, cancel = rpcCtx()
	got, err := s.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: recovery})
	cancel()
	if err != nil {
		t.Fatalf("GetOperation %s: %v", recovery, err)
	}
	operationError(t, got, "server restarted", "SERVER_STOPPED")
	checkRecoveryHistory(t, s, cluster, recovery, clv1.Cluster_ALERT, map[string]int{"detach_iso": 3})
	c, _ = s.waitCluster(t, cluster, "RUNNING again (reconciliation of an ALERT cluster whose machines all run)", opTimeout,
		func(c *clv1.Cluster) bool {
			return c.GetState() == clv1.Cluster_RUNNING && c.GetCurrentOperation() == ""
		})
	s.healthy(t, c)
	// The interrupted upgrade can be run again.
	ctx, cancel = rpcCtx()
	defer cancel()
	resp, err = s.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: cluster, KubernetesVersion: "1.30.5"})
	s.succeed(t, "upgrade again", resp, err)
	for _, m := range s.healthy(t, s.cluster(t, cluster)) {
		if m.GetKubernetesVersion() != "1.30.5" {
			t.Errorf("after the upgrade %s is at %s, want 1.30.5", m.GetName(), m.GetKubernetesVersion())
		}
	}
}
