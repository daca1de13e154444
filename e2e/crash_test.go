package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// crashEnv is what a crash case prepared and learned.
type crashEnv struct {
	cluster  string   // clusters/{uuid}
	external []string // free machines an AddNodes takes
	victim   string   // the node a RemoveNodes removes
	dsn      string   // the database, for what the API does not show
}

// crashCase kills the server while an operation is held at step.
type crashCase struct {
	name string
	step string
	// second: let the first matching step go and kill at the next one (on
	// another machine).
	second bool
	// prepare makes the cluster the operation acts on (nil: the operation
	// creates it).
	prepare func(t *testing.T, s *server, env *crashEnv)
	begin   func(ctx context.Context, s *server, env *crashEnv) (*longrunningpb.Operation, error)
	// during is the state the operation holds the cluster in when killed,
	// after the state recovery leaves it in (SPEC §5.1).
	during, after clv1.Cluster_State
	// repairs counts the REPAIR history entries recovery must record, by a
	// word their message contains (SPEC §5.3).
	repairs map[string]int
	// missing is how many workers the interrupted operation had not
	// provisioned yet, or had destroyed already: an ALERT cluster may lack
	// them until the next start provisions them.
	missing int32
	// restart is extra flags for the restarted server.
	restart []string
	// bug, when set, says what non-test code gets wrong here (see the
	// report); the case fails until it is fixed.
	bug string
	// next is the operation that must succeed after recovery, with its checks.
	next func(t *testing.T, s *server, env *crashEnv, c *clv1.Cluster)
}

var crashCases = []crashCase{
	{
		name: "create@join_node", step: "join_node",
		begin: func(ctx context.Context, s *server, _ *crashEnv) (*longrunningpb.Operation, error) {
			return s.clusters.CreateCluster(ctx, &clv1.CreateClusterRequest{Cluster: spec("crash")})
		},
		// The create job's first step took CREATED to STARTING.
		during: clv1.Cluster_STARTING, after: clv1.Cluster_ALERT,
		// Every machine had the version's ISO attached before the joins.
		repairs: map[string]int{"detach_iso": 3},
		next: func(t *testing.T, s *server, env *crashEnv, _ *clv1.Cluster) {
			s.startFromAlert(t, env.cluster)
			c := s.cluster(t, env.cluster)
			s.healthy(t, c)
			if c.GetEndpoint() == "" {
				t.Errorf("started %s has no endpoint: the interrupted create's end (kubeconfig, provider) never ran", c.GetName())
			}
		},
	},
	{
		name: "start@power_on", step: "power_on",
		prepare: func(t *testing.T, s *server, env *crashEnv) {
			env.cluster = s.create(t, "crash").GetName()
			s.stop(t, env.cluster)
		},
		begin: func(ctx context.Context, s *server, env *crashEnv) (*longrunningpb.Operation, error) {
			return s.clusters.StartCluster(ctx, &clv1.StartClusterRequest{Name: env.cluster})
		},
		during: clv1.Cluster_STARTING, after: clv1.Cluster_ALERT,
		next: startAgain,
	},
	{
		name: "stop@power_off", step: "power_off",
		prepare: running,
		begin: func(ctx context.Context, s *server, env *crashEnv) (*longrunningpb.Operation, error) {
			return s.clusters.StopCluster(ctx, &clv1.StopClusterRequest{Name: env.cluster})
		},
		during: clv1.Cluster_STOPPING, after: clv1.Cluster_ALERT,
		next: startAgain,
	},
	{
		name: "scale-up@join_node", step: "join_node",
		prepare: running,
		begin:   scaleTo(3),
		during:  clv1.Cluster_SCALING, after: clv1.Cluster_ALERT,
		// The new worker was provisioned, given rules and an ISO, never joined.
		repairs: map[string]int{"destroy_machine": 1},
		next:    startAgain,
	},
	{
		name: "scale-up@configure_network", step: "configure_network",
		prepare: running,
		begin:   scaleTo(3),
		during:  clv1.Cluster_SCALING, after: clv1.Cluster_ALERT,
		repairs: map[string]int{"destroy_machine": 1},
		next:    startAgain,
	},
	{
		name: "scale-down@drain_node", step: "drain_node",
		prepare: running,
		begin:   scaleTo(1),
		during:  clv1.Cluster_SCALING, after: clv1.Cluster_ALERT,
		next: startAgain,
	},
	{
		name: "upgrade@upgrade_node#2", step: "upgrade_node", second: true,
		prepare: running,
		begin: func(ctx context.Context, s *server, env *crashEnv) (*longrunningpb.Operation, error) {
			return s.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: env.cluster, KubernetesVersion: "1.30.5"})
		},
		during: clv1.Cluster_UPGRADING, after: clv1.Cluster_ALERT,
		// The upgrade attached the target's ISO to every node first.
		repairs: map[string]int{"detach_iso": 3, "uncordon_node": 1},
		next: func(t *testing.T, s *server, env *crashEnv, c *clv1.Cluster) {
			upgraded := 0
			for _, m := range s.machines(t, env.cluster) {
				if m.GetKubernetesVersion() == "1.30.5" {
					upgraded++
				}
			}
			if upgraded != 1 {
				t.Errorf("after the kill at the second node's upgrade_node, %d nodes are at 1.30.5, want 1", upgraded)
			}
			// The upgrade runs again from ALERT: a start could not end
			// RUNNING on nodes that disagree (issue 17 §3).
			ctx, cancel := rpcCtx()
			defer cancel()
			op, err := s.clusters.UpgradeCluster(ctx, &clv1.UpgradeClusterRequest{Name: env.cluster, KubernetesVersion: "1.30.5"})
			done := s.succeed(t, "upgrade again", op, err)
			c = s.cluster(t, env.cluster)
			if c.GetKubernetesVersion() != "1.30.5" {
				t.Errorf("after the upgrade ran again, %s is at %s, want 1.30.5", c.GetName(), c.GetKubernetesVersion())
			}
			for _, m := range s.healthy(t, c) {
				if m.GetKubernetesVersion() != "1.30.5" {
					t.Errorf("after the upgrade ran again, %s is at %s, want 1.30.5", m.GetName(), m.GetKubernetesVersion())
				}
			}
			// Attach, drain, upgrade, detach for each of the two nodes left;
			// the node upgraded before the kill is skipped.
			if total := metadata(t, done).GetStepsTotal(); total >= 12 {
				t.Errorf("the upgrade run again planned %d steps, as if no node had been upgraded before the kill (want < 12)", total)
			}
		},
	},
	{
		name: "add-nodes@validate_node#2", step: "validate_node", second: true,
		prepare: func(t *testing.T, s *server, env *crashEnv) {
			running(t, s, env)
			for range 2 {
				ctx, cancel := rpcCtx()
				m, err := s.sim.CreateMachine(ctx, &clv1.CreateMachineRequest{Role: clv1.Node_EXTERNAL})
				cancel()
				if err != nil {
					t.Fatalf("CreateMachine: %v", err)
				}
				env.external = append(env.external, m.GetName())
			}
		},
		begin: func(ctx context.Context, s *server, env *crashEnv) (*longrunningpb.Operation, error) {
			return s.clusters.AddNodes(ctx, &clv1.AddNodesRequest{Name: env.cluster, Machines: env.external})
		},
		during: clv1.Cluster_IMPORTING, after: clv1.Cluster_RUNNING,
		// The first machine was adopted (validate_node) but never joined:
		// it goes back to the free pool.
		repairs: map[string]int{"delete_node": 1},
		next: func(t *testing.T, s *server, env *crashEnv, _ *clv1.Cluster) {
			for _, name := range env.external {
				m := s.machine(t, name)
				if m.GetCluster() != "" || m.GetRole() != clv1.Node_EXTERNAL || m.GetJoined() {
					t.Errorf("after recovery %s is in %q as %s (joined %t), want a free EXTERNAL machine again", name, m.GetCluster(), m.GetRole(), m.GetJoined())
				}
			}
			ctx, cancel := rpcCtx()
			defer cancel()
			op, err := s.clusters.AddNodes(ctx, &clv1.AddNodesRequest{Name: env.cluster, Machines: env.external})
			s.succeed(t, "add the nodes again", op, err)
			c := s.cluster(t, env.cluster)
			if c.GetWorkerNodeCount() != 4 {
				t.Errorf("after adding 2 nodes to 2 workers, %s has %d workers, want 4", c.GetName(), c.GetWorkerNodeCount())
			}
			s.healthy(t, c)
		},
	},
	{
		name: "remove-nodes@drain_node", step: "drain_node",
		prepare: func(t *testing.T, s *server, env *crashEnv) {
			running(t, s, env)
			for _, m := range s.machines(t, env.cluster) {
				if m.GetRole() == clv1.Node_WORKER {
					env.victim = m.GetName()
				}
			}
		},
		begin: func(ctx context.Context, s *server, env *crashEnv) (*longrunningpb.Operation, error) {
			return s.clusters.RemoveNodes(ctx, &clv1.RemoveNodesRequest{Name: env.cluster, Nodes: []string{env.victim}})
		},
		during: clv1.Cluster_REMOVING_NODES, after: clv1.Cluster_RUNNING,
		next: func(t *testing.T, s *server, env *crashEnv, _ *clv1.Cluster) {
			ctx, cancel := rpcCtx()
			defer cancel()
			op, err := s.clusters.RemoveNodes(ctx, &clv1.RemoveNodesRequest{Name: env.cluster, Nodes: []string{env.victim}})
			s.succeed(t, "remove the node again", op, err)
			c := s.cluster(t, env.cluster)
			if c.GetWorkerNodeCount() != 1 {
				t.Errorf("after removing 1 of 2 workers, %s has %d workers, want 1", c.GetName(), c.GetWorkerNodeCount())
			}
			s.healthy(t, c)
			if m := s.machine(t, env.victim); m.GetCluster() != "" || m.GetRole() != clv1.Node_EXTERNAL {
				t.Errorf("removed node %s is in %q as %s, want a free EXTERNAL machine", env.victim, m.GetCluster(), m.GetRole())
			}
		},
	},
	{
		name: "delete@destroy_machine", step: "destroy_machine",
		prepare: running,
		begin: func(ctx context.Context, s *server, env *crashEnv) (*longrunningpb.Operation, error) {
			return s.clusters.DeleteCluster(ctx, &clv1.DeleteClusterRequest{Name: env.cluster})
		},
		// A destroy is retried, not failed: recovery destroys again.
		during: clv1.Cluster_DESTROYING, after: clv1.Cluster_DESTROYED,
		next: func(t *testing.T, s *server, env *crashEnv, _ *clv1.Cluster) {
			if ms := s.machines(t, env.cluster); len(ms) != 0 {
				t.Errorf("DESTROYED %s still has machines: %v", env.cluster, ms)
			}
			if rs := s.rules(t, env.cluster); len(rs) != 0 {
				t.Errorf("DESTROYED %s still has network rules: %v", env.cluster, rs)
			}
		},
	},
}

func running(t *testing.T, s *server, env *crashEnv) {
	env.cluster = s.create(t, "crash").GetName()
}

func scaleTo(workers int32) func(ctx context.Context, s *server, env *crashEnv) (*longrunningpb.Operation, error) {
	return func(ctx context.Context, s *server, env *crashEnv) (*longrunningpb.Operation, error) {
		return s.clusters.ScaleCluster(ctx, &clv1.ScaleClusterRequest{Name: env.cluster, WorkerNodeCount: &workers})
	}
}

// startAgain is the next operation of a cluster that recovery left in ALERT.
func startAgain(t *testing.T, s *server, env *crashEnv, _ *clv1.Cluster) {
	t.Helper()
	s.startFromAlert(t, env.cluster)
	c := s.cluster(t, env.cluster)
	// The spec may differ from before the interrupted operation (recovery
	// records the nodes a scale really left); what matters is that the
	// machines and the spec agree and every node is healthy.
	if w := c.GetWorkerNodeCount(); w < 1 || w > 4 {
		t.Errorf("%s has %d workers after the interrupted operation, want 1 to 4", c.GetName(), w)
	}
	s.healthy(t, c)
}

// TestKillMidOperation kills clusterd (run with --on-owner-loss=fail) with
// SIGKILL while each kind of operation is held at its key step, starts it
// again on the same database with the same server id, and checks SPEC §5.1
// as without adoption: the cluster leaves its
// operation state (§5.1) with no current operation, the interrupted job is
// failed with "server restarted", the leftovers are repaired and recorded
// (§5.3), and the next operation succeeds. It measures restart-to-recovery
// twice: with the restarted server's simulated steps instant, and with the
// binary's default of 100ms per simulated step. The figures are logged and printed at the end of
// the run, not asserted: a wall-clock goal fails whenever the machine is
// busy. The reconcile interval
// is 1h in both, so reconciliation (which would bring an ALERT cluster whose
// machines all run back by itself) cannot race the next operation; it plays
// no part in orphan recovery.
func TestKillMidOperation(t *testing.T) {
	modes := []struct {
		name    string
		restart []string
	}{
		{"fast", []string{"--sim-step-delay", "0"}},
		{"default", []string{"--sim-step-delay", "100ms"}},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range append(crashCases, moreCrashCases...) {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					d := killMidOperation(t, tc, mode.restart)
					recordRecovery(t, mode.name+" restart "+tc.name, d)
				})
			}
		})
	}
}

func killMidOperation(t *testing.T, tc crashCase, restartFlags []string) time.Duration {
	dsn := newDatabase(t)
	const id = "e2e-crash"
	env := &crashEnv{dsn: dsn}
	// A peer timeout of 10 s: the restarted server takes its id over at once
	// (its predecessor's process is gone), and the lease must not be lost to
	// a loaded machine's slow heartbeats while it repairs (a recovery that
	// loses it ends the cluster in ALERT, as it should, which is not what
	// this test is about).
	quiet := append([]string{"--reconcile-interval", "1h", "--peer-timeout", "10s"}, failOnOwnerLoss...)
	s := startServer(t, dsn, id, quiet...)
	if tc.prepare != nil {
		tc.prepare(t, s, env)
	}
	fault := s.hold(t, tc.step, env.cluster)
	ctx, cancel := rpcCtx()
	op, err := tc.begin(ctx, s, env)
	cancel()
	opName := started(t, tc.name, op, err)
	held := s.waitHeld(t, tc.step, heldStep(tc.step, env.cluster))
	if tc.second {
		s.release(t, fault)
		first := held.GetMachine()
		held = s.waitHeld(t, tc.step+" of a second machine", func(h *clv1.HeldStep) bool {
			return heldStep(tc.step, env.cluster)(h) && h.GetMachine() != first
		})
	}
	if held.GetOperation() != opName {
		t.Fatalf("step %s is held for %s, want the operation under test %s", tc.step, held.GetOperation(), opName)
	}
	env.cluster = held.GetCluster()
	if c := s.cluster(t, env.cluster); c.GetState() != tc.during || c.GetCurrentOperation() != opName {
		t.Fatalf("before the kill %s is %s held by %q, want %s held by %s", c.GetName(), c.GetState(), c.GetCurrentOperation(), tc.during, opName)
	}

	s.kill9()
	s = startServer(t, dsn, id, slices.Concat(quiet, restartFlags, tc.restart)...)
	c, took := s.waitRecovered(t, env.cluster, s.started, opTimeout)

	// Reconciliation's first pass may bring an ALERT cluster whose machines
	// all run back to RUNNING at once; the history shows ALERT was reached.
	if c.GetState() != tc.after && (tc.after != clv1.Cluster_ALERT || c.GetState() != clv1.Cluster_RUNNING) {
		t.Errorf("after restart %s is %s, want %s (SPEC §5.1)", c.GetName(), c.GetState(), tc.after)
	}
	ctx, cancel = rpcCtx()
	interrupted, err := s.ops.GetOperation(ctx, &longrunningpb.GetOperationRequest{Name: opName})
	cancel()
	if err != nil {
		t.Fatalf("GetOperation %s: %v", opName, err)
	}
	operationError(t, interrupted, "server restarted", "SERVER_STOPPED")
	checkRecoveryHistory(t, s, env.cluster, opName, tc.after, tc.repairs)
	if c.GetState() != clv1.Cluster_DESTROYED {
		s.convergedMissing(t, c, tc.missing)
	}
	if !t.Failed() {
		tc.next(t, s, env, c)
	}
	if tc.bug != "" && t.Failed() {
		t.Errorf("BUG (non-test code): %s", tc.bug)
	}
	return took
}

// checkRecoveryHistory checks that the history says who took the
// interrupted operation over (RECOVERY_STARTED, or a retried destroy), that
// it moved the cluster to after, which leftovers it repaired, and that the
// recovery job succeeded.
func checkRecoveryHistory(t *testing.T, s *server, cluster, interrupted string, after clv1.Cluster_State, repairs map[string]int) {
	t.Helper()
	evs := s.events(t, cluster)
	var recovery string
	got := map[string]int{}
	total, want := 0, 0
	for _, e := range evs {
		switch {
		case e.GetEvent() == "RECOVERY_STARTED" && strings.Contains(e.GetMessage(), interrupted):
			recovery = e.GetOperation()
		case e.GetEvent() == "DESTROY_REQUESTED" && strings.Contains(e.GetMessage(), "retried"):
			recovery = e.GetOperation()
		case e.GetEvent() == "REPAIR":
			total++
			for word := range repairs {
				if strings.Contains(e.GetMessage(), word) {
					got[word]++
				}
			}
		}
	}
	if recovery == "" {
		t.Errorf("history of %s records no recovery of %s (RECOVERY_STARTED naming it, or a retried destroy):%s", cluster, interrupted, describeEvents(evs))
		return
	}
	ended := false
	for _, e := range evs {
		ended = ended || (e.GetOperation() == recovery && e.GetToState() == after && e.GetFromState() != after)
	}
	if !ended {
		t.Errorf("history of %s: recovery %s never moved it to %s (SPEC §5.1):%s", cluster, recovery, after, describeEvents(evs))
	}
	for word, n := range repairs {
		want += n
		if got[word] != n {
			t.Errorf("history of %s has %d REPAIR entries about %s, want %d:%s", cluster, got[word], word, n, describeEvents(evs))
		}
	}
	if total != want {
		t.Errorf("history of %s has %d REPAIR entries, want %d:%s", cluster, total, want, describeEvents(evs))
	}
	done := s.waitOp(t, recovery)
	if e := done.GetError(); e != nil {
		t.Errorf("recovery %s of %s failed: %s", recovery, cluster, e.GetMessage())
	}
}
