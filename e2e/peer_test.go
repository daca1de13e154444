package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/lease"
	"github.com/clusterd/clusterd/scanner"
)

// Liveness flags for two-server tests that should not take long.
var shortLiveness = []string{"--peer-timeout", "3s", "--scan-interval", "500ms", "--heartbeat-interval", "300ms"}

// scaleUpHeld creates a cluster through s and starts a scale up that is held
// at join_node (a new worker provisioned, given rules and an ISO, not
// joined); it returns the cluster and the operation.
func scaleUpHeld(t *testing.T, s *server) (cluster, op string) {
	t.Helper()
	cluster = s.create(t, "peer").GetName()
	s.hold(t, "join_node", cluster)
	ctx, cancel := rpcCtx()
	defer cancel()
	resp, err := scaleTo(3)(ctx, s, &crashEnv{cluster: cluster})
	op = started(t, "scale up", resp, err)
	s.waitHeld(t, "join_node", heldStep("join_node", cluster))
	return cluster, op
}

// TestPeerRecoversDeadServer runs two servers on one database (with
// --on-owner-loss=fail), kills one with SIGKILL while its scale up is held,
// and checks that the other fails
// the dead server's job ("owner server stopped") and recovers its cluster
// no sooner than the peer timeout allows, with the leftovers repaired. How
// long after the peer timeout it took (about one scan interval) is logged,
// not asserted: a wall-clock goal fails whenever the machine is busy.
func TestPeerRecoversDeadServer(t *testing.T) {
	cases := []struct {
		name       string
		flags      []string
		peer, scan time.Duration
	}{
		{"short", shortLiveness, 3 * time.Second, 500 * time.Millisecond},
		// The binary's liveness defaults.
		{"default", nil, lease.DefaultPeerTimeout, scanner.DefaultScanInterval},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dsn := newDatabase(t)
			flags := slices.Concat([]string{"--reconcile-interval", "1h"}, tc.flags, failOnOwnerLoss)
			a := startServer(t, dsn, "e2e-a", flags...)
			b := startServer(t, dsn, "e2e-b", flags...)
			cluster, op := scaleUpHeld(t, a)

			killed := time.Now()
			a.kill9()
			var lastBeat time.Time
			if err := openSQL(t, dsn).QueryRow("SELECT heartbeat_time FROM servers WHERE id = 'e2e-a'").Scan(&lastBeat); err != nil {
				t.Fatalf("read the killed server's last heartbeat: %v", err)
			}
			c, took := b.waitRecovered(t, cluster, killed, tc.peer+tc.scan+opTimeout)
			recordRecovery(t, fmt.Sprintf("peer %s (peer timeout %s, scan %s) scale-up@join_node", tc.name, tc.peer, tc.scan), took)

			// Recovering before A's last heartbeat is a peer timeout old
			// would mean failing the job of a server that may be alive.
			if dead := lastBeat.Add(tc.peer); killed.Add(took).Before(dead) {
				t.Errorf("peer recovered the dead server's cluster %.2fs after the kill, %s before its last heartbeat (%s) was a peer timeout (%s) old",
					took.Seconds(), dead.Sub(killed.Add(took)).Round(time.Millisecond), lastBeat.Format("15:04:05.000"), tc.peer)
			}
			if c.GetState() != clv1.Cluster_ALERT {
				t.Errorf("after the peer's recovery %s is %s, want ALERT", cluster, c.GetState())
			}
			ctx, cancel := rpcCtx()
			interrupted, err := b.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: op})
			cancel()
			if err != nil {
				t.Fatalf("GetOperation %s: %v", op, err)
			}
			operationError(t, interrupted, "owner server stopped", "OWNER_SERVER_STOPPED")
			checkRecoveryHistory(t, b, cluster, op, clv1.Cluster_ALERT, map[string]int{"destroy_machine": 1})
			for _, e := range b.events(t, cluster) {
				if e.GetEvent() == "RECOVERY_STARTED" && e.GetServer() != "e2e-b" {
					t.Errorf("recovery recorded by server %q, want the live peer e2e-b", e.GetServer())
				}
			}
			b.converged(t, c)
			if !t.Failed() {
				startAgain(t, b, &crashEnv{cluster: cluster}, c)
			}
		})
	}
}

// TestPeerLeavesLiveLongOperation holds a step on server A for more than
// three peer timeouts while server B scans every 300ms: a live server's
// operation, however long, is never failed by its peer; released, it
// completes.
func TestPeerLeavesLiveLongOperation(t *testing.T) {
	t.Parallel()
	const peer = 2 * time.Second
	dsn := newDatabase(t)
	flags := []string{"--peer-timeout", peer.String(), "--heartbeat-interval", "250ms", "--scan-interval", "300ms", "--reconcile-interval", "300ms"}
	a := startServer(t, dsn, "e2e-a", flags...)
	b := startServer(t, dsn, "e2e-b", flags...)
	cluster := a.create(t, "long").GetName()
	fault := a.hold(t, "join_node", cluster)
	ctx, cancel := rpcCtx()
	resp, err := scaleTo(3)(ctx, a, &crashEnv{cluster: cluster})
	cancel()
	op := started(t, "scale up", resp, err)
	held := a.waitHeld(t, "join_node", heldStep("join_node", cluster))

	// Watch through B until the step has been held for 3.5 peer timeouts.
	until := held.GetHoldTime().AsTime().Add(peer*3 + peer/2)
	polls := 0
	for time.Now().Before(until) {
		ctx, cancel := rpcCtx()
		got, err := b.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: op})
		cancel()
		if err != nil {
			t.Fatalf("GetOperation %s through B: %v", op, err)
		}
		if got.GetDone() {
			t.Fatalf("live server A's operation %s, held for %s, ended (seen through B): %v",
				op, time.Since(held.GetHoldTime().AsTime()).Round(time.Millisecond), got.GetError())
		}
		if c := b.cluster(t, cluster); c.GetState() != clv1.Cluster_SCALING || c.GetCurrentOperation() != op {
			t.Fatalf("while A's scale is held, B shows %s %s held by %q, want SCALING held by %s", cluster, c.GetState(), c.GetCurrentOperation(), op)
		}
		polls++
		time.Sleep(100 * time.Millisecond)
	}
	a.release(t, fault)
	// The fault holds every join_node of the cluster: release each in turn.
	done := waitReleasing(t, a, fault, op)
	if e := done.GetError(); e != nil {
		t.Fatalf("A's scale, released after %d observations through B, failed: %s", polls, e.GetMessage())
	}
	c := b.cluster(t, cluster)
	if c.GetWorkerNodeCount() != 3 {
		t.Errorf("after the scale %s has %d workers, want 3", cluster, c.GetWorkerNodeCount())
	}
	b.healthy(t, c)
	for _, e := range b.events(t, cluster) {
		if e.GetEvent() == "RECOVERY_STARTED" || e.GetEvent() == "REPAIR" {
			t.Errorf("a live server's operation was recovered by its peer:%s", describeEvents([]*clv1.ClusterEvent{e}))
		}
	}
}

// waitReleasing waits for an operation, releasing fault's held steps as they come.
func waitReleasing(t *testing.T, s *server, fault, op string) *longrunningpb.Operation {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for {
		ctx, cancel := rpcCtx()
		got, err := s.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: op})
		cancel()
		if err != nil {
			t.Fatalf("GetOperation %s: %v", op, err)
		}
		if got.GetDone() {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s not done within %s", op, opTimeout)
		}
		s.release(t, fault)
		time.Sleep(pollEvery)
	}
}

// TestPeerRecoveryInterrupted kills A mid-scale, lets B's orphan recovery
// start and holds it at its repair (destroy_machine of the unjoined worker),
// kills B too, and restarts B: the recovery interrupted by the kill is
// itself recovered, and the leftovers are still repaired.
func TestPeerRecoveryInterrupted(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	flags := slices.Concat([]string{"--reconcile-interval", "1h"}, shortLiveness, failOnOwnerLoss)
	a := startServer(t, dsn, "e2e-a", flags...)
	b := startServer(t, dsn, "e2e-b", flags...)
	cluster, op := scaleUpHeld(t, a)
	b.hold(t, "destroy_machine", cluster)
	a.kill9()

	repair := b.waitHeld(t, "B's repair of A's orphan", heldStep("destroy_machine", cluster))
	recovery := repair.GetOperation()
	if c := b.cluster(t, cluster); c.GetState() != clv1.Cluster_SCALING || c.GetCurrentOperation() != recovery {
		t.Fatalf("while B's recovery is held, %s is %s held by %q, want SCALING held by the recovery %s", cluster, c.GetState(), c.GetCurrentOperation(), recovery)
	}
	b.kill9()
	b = startServer(t, dsn, "e2e-b", flags...)
	c, took := b.waitRecovered(t, cluster, b.started, opTimeout)
	recordRecovery(t, "restart of the peer whose orphan recovery was held (destroy_machine)", took)
	if c.GetState() != clv1.Cluster_ALERT {
		t.Errorf("after restart %s is %s, want ALERT", cluster, c.GetState())
	}
	for name, want := range map[string][2]string{op: {"owner server stopped", "OWNER_SERVER_STOPPED"}, recovery: {"server restarted", "SERVER_STOPPED"}} {
		ctx, cancel := rpcCtx()
		got, err := b.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: name})
		cancel()
		if err != nil {
			t.Fatalf("GetOperation %s: %v", name, err)
		}
		operationError(t, got, want[0], want[1])
	}
	// The second recovery names the first, which named the scale.
	checkRecoveryHistory(t, b, cluster, recovery, clv1.Cluster_ALERT, map[string]int{"destroy_machine": 1})
	evs := b.events(t, cluster)
	if !strings.Contains(describeEvents(evs), "RECOVERY_STARTED") {
		t.Errorf("no RECOVERY_STARTED in history:%s", describeEvents(evs))
	}
	b.converged(t, c)
	if !t.Failed() {
		startAgain(t, b, &crashEnv{cluster: cluster}, c)
	}
}
