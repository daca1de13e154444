package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
)

// Adoption (SPEC §5 step 4, --on-owner-loss=resume, the default): an
// operation whose server is killed or stopped is adopted by a live server
// and runs on to its end.

// adoptLiveness are short liveness settings, so that a peer adopts a dead
// server's operations about 2s after its death.
var adoptLiveness = []string{"--peer-timeout", "2s", "--heartbeat-interval", "250ms", "--scan-interval", "250ms", "--reconcile-interval", "1h"}

// adoptedWant checks, per crash case, what the operation asked for once it
// has been adopted and run to its end: the state, the size, the machines,
// nothing left over.
var adoptedWant = map[string]func(t *testing.T, s *server, env *crashEnv){
	"create@join_node":           wantCreated,
	"create@provision_machine#2": wantCreated,
	"start@power_on": func(t *testing.T, s *server, env *crashEnv) {
		wantRunning(t, s, env, 2, "1.30.2")
	},
	"stop@power_off": func(t *testing.T, s *server, env *crashEnv) {
		c := s.cluster(t, env.cluster)
		if c.GetState() != clv1.Cluster_STOPPED || c.GetCurrentOperation() != "" {
			t.Errorf("%s is %s held by %q; want STOPPED", c.GetName(), c.GetState(), c.GetCurrentOperation())
		}
		for _, m := range s.converged(t, c) {
			if m.GetPower() != clv1.Node_STOPPED {
				t.Errorf("%s of STOPPED %s is %s", m.GetName(), c.GetName(), m.GetPower())
			}
		}
	},
	"scale-up@join_node":           func(t *testing.T, s *server, env *crashEnv) { wantRunning(t, s, env, 3, "1.30.2") },
	"scale-up@configure_network":   func(t *testing.T, s *server, env *crashEnv) { wantRunning(t, s, env, 3, "1.30.2") },
	"scale-down@drain_node":        func(t *testing.T, s *server, env *crashEnv) { wantRunning(t, s, env, 1, "1.30.2") },
	"scale-down@configure_network": func(t *testing.T, s *server, env *crashEnv) { wantRunning(t, s, env, 1, "1.30.2") },
	"upgrade@upgrade_node#2":       func(t *testing.T, s *server, env *crashEnv) { wantRunning(t, s, env, 2, "1.30.5") },
	"upgrade@drain_node#2":         func(t *testing.T, s *server, env *crashEnv) { wantRunning(t, s, env, 2, "1.30.5") },
	"add-nodes@validate_node#2":    wantAdded,
	"add-nodes@join_node":          wantAdded,
	"remove-nodes@drain_node": func(t *testing.T, s *server, env *crashEnv) {
		wantRunning(t, s, env, 1, "1.30.2")
		if m := s.machine(t, env.victim); m.GetCluster() != "" || m.GetRole() != clv1.Node_EXTERNAL {
			t.Errorf("removed node %s is in %q as %s; want a free EXTERNAL machine", env.victim, m.GetCluster(), m.GetRole())
		}
	},
	"delete@destroy_machine": func(t *testing.T, s *server, env *crashEnv) {
		if c := s.cluster(t, env.cluster); c.GetState() != clv1.Cluster_DESTROYED {
			t.Errorf("%s is %s; want DESTROYED", env.cluster, c.GetState())
		}
		if ms := s.machines(t, env.cluster); len(ms) != 0 {
			t.Errorf("DESTROYED %s still has machines: %v", env.cluster, ms)
		}
		if rs := s.rules(t, env.cluster); len(rs) != 0 {
			t.Errorf("DESTROYED %s still has network rules: %v", env.cluster, rs)
		}
	},
}

// wantRunning: RUNNING, unheld, with the workers and version asked for,
// every machine running, joined, at that version, nothing left over.
func wantRunning(t *testing.T, s *server, env *crashEnv, workers int32, version string) {
	t.Helper()
	c := s.cluster(t, env.cluster)
	if c.GetWorkerNodeCount() != workers || c.GetKubernetesVersion() != version {
		t.Errorf("%s has %d workers at %s; want %d at %s", c.GetName(), c.GetWorkerNodeCount(), c.GetKubernetesVersion(), workers, version)
	}
	for _, m := range s.healthy(t, c) {
		if m.GetKubernetesVersion() != version {
			t.Errorf("%s of %s runs %s; want %s", m.GetName(), c.GetName(), m.GetKubernetesVersion(), version)
		}
	}
}

func wantCreated(t *testing.T, s *server, env *crashEnv) {
	t.Helper()
	wantRunning(t, s, env, 2, "1.30.2")
	if c := s.cluster(t, env.cluster); c.GetEndpoint() == "" || c.GetControlNodeCount() != 1 {
		t.Errorf("created %s: endpoint %q, %d control nodes; want an endpoint and 1", c.GetName(), c.GetEndpoint(), c.GetControlNodeCount())
	}
}

func wantAdded(t *testing.T, s *server, env *crashEnv) {
	t.Helper()
	wantRunning(t, s, env, 4, "1.30.2")
	for _, name := range env.external {
		if m := s.machine(t, name); m.GetCluster() != env.cluster || !m.GetJoined() {
			t.Errorf("added %s is in %q (joined %t); want a joined node of %s", name, m.GetCluster(), m.GetJoined(), env.cluster)
		}
	}
}

// eventID is the number at the end of a history entry's name.
func eventID(t *testing.T, e *clv1.ClusterEvent) int64 {
	t.Helper()
	_, n, _ := strings.Cut(e.GetName(), "/events/")
	id, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		t.Fatalf("history entry name %q: %v", e.GetName(), err)
	}
	return id
}

// adoption finds op's OPERATION_ADOPTED entry (the last one), and checks
// that the history shows no recovery of it.
func adoption(t *testing.T, s *server, cluster, op string) *clv1.ClusterEvent {
	t.Helper()
	evs := s.events(t, cluster)
	var adopted *clv1.ClusterEvent
	for _, e := range evs {
		switch {
		case e.GetEvent() == "OPERATION_ADOPTED" && e.GetOperation() == op:
			adopted = e
		case e.GetEvent() == "RECOVERY_STARTED" || e.GetEvent() == "REPAIR":
			t.Errorf("the adopted operation was recovered or repaired, not run on: %s", describeEvents([]*clv1.ClusterEvent{e}))
		}
	}
	if adopted == nil {
		t.Fatalf("no OPERATION_ADOPTED of %s in the history of %s:%s", op, cluster, describeEvents(evs))
	}
	return adopted
}

// checkFencing reads the simulator's log of the cluster: no call of the
// operation's attempts before the adopter's was accepted once the history
// had the adoption, and every call of the adopter's attempt was its own. It
// returns how many calls the adopter made (none when the step it resumed
// at had left nothing to do, e.g. network rules already converged) and how
// many of the dead attempt's were refused.
func checkFencing(t *testing.T, dsn, cluster, op string, adopted *clv1.ClusterEvent, attempt int32) (after, oldRefused int) {
	t.Helper()
	rows, err := openSQL(t, dsn).Query("SELECT id, step, attempt, server, refused, last_event_id FROM sim_calls WHERE cluster_id = ? AND job_id = ? ORDER BY id",
		strings.TrimPrefix(cluster, "clusters/"), strings.TrimPrefix(op, "operations/"))
	if err != nil {
		t.Fatalf("read the fencing log: %v", err)
	}
	defer rows.Close()
	adoptedID := eventID(t, adopted)
	for rows.Next() {
		var (
			id, last    int64
			step, srv   string
			callAttempt int32
			refused     bool
		)
		if err := rows.Scan(&id, &step, &callAttempt, &srv, &refused, &last); err != nil {
			t.Fatal(err)
		}
		switch {
		case refused && callAttempt < attempt:
			oldRefused++
		case refused:
		case callAttempt < attempt && last >= adoptedID:
			t.Errorf("fencing log: call %d (%s) of attempt %d by %s accepted after the adoption (history entry %d)", id, step, callAttempt, srv, adoptedID)
		case callAttempt == attempt:
			after++
			if srv != adopted.GetServer() {
				t.Errorf("fencing log: call %d (%s) of attempt %d made by %s; want the adopter %s", id, step, attempt, srv, adopted.GetServer())
			}
		}
	}
	return after, oldRefused
}

// TestKillMidOperationAdopted kills clusterd with SIGKILL while each kind of
// operation is held at each of its key steps (the crash cases), and checks
// that it is adopted and ends SUCCEEDED: by the other of two servers, once
// the dead one's heartbeat is a peer timeout old; or, in the restart mode,
// by the same server restarted at once, with no peer. The cluster ends in
// the state and at the size the request asked for, with nothing left over,
// the operation's metadata shows attempt 2 on the adopter, the history shows
// the adoption and no recovery, and the simulator's fencing log shows no
// call of the dead attempt accepted after the adoption. It measures the
// time from the death (or the restart) to the adoption.
func TestKillMidOperationAdopted(t *testing.T) {
	modes := []struct {
		name    string
		flags   []string
		restart bool
		only    map[string]bool // nil: every crash case
	}{
		{name: "peer", flags: adoptLiveness},
		// The binary's liveness defaults.
		{name: "peer-defaults", flags: []string{"--reconcile-interval", "1h"}, only: map[string]bool{"scale-up@join_node": true}},
		{name: "restart", flags: adoptLiveness, restart: true,
			only: map[string]bool{"create@join_node": true, "scale-down@drain_node": true, "upgrade@upgrade_node#2": true}},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range append(crashCases, moreCrashCases...) {
				if mode.only != nil && !mode.only[tc.name] {
					continue
				}
				want := adoptedWant[tc.name]
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					if want == nil {
						t.Fatalf("no adoptedWant for crash case %s", tc.name)
					}
					took := adoptMidOperation(t, tc, mode.flags, mode.restart, want)
					what := fmt.Sprintf("adoption after SIGKILL, %s (%s)", mode.name, tc.name)
					if mode.restart {
						what = fmt.Sprintf("adoption at restart after SIGKILL (%s)", tc.name)
					}
					recordRecovery(t, what, took)
				})
			}
		})
	}
}

func adoptMidOperation(t *testing.T, tc crashCase, flags []string, restart bool, want func(*testing.T, *server, *crashEnv)) time.Duration {
	dsn := newDatabase(t)
	env := &crashEnv{dsn: dsn}
	a := startServer(t, dsn, "e2e-a", flags...)
	adopter := "e2e-b"
	var b *server
	if restart {
		adopter = "e2e-a"
	} else {
		b = startServer(t, dsn, "e2e-b", flags...)
	}
	if tc.prepare != nil {
		tc.prepare(t, a, env)
	}
	fault := a.hold(t, tc.step, env.cluster)
	ctx, cancel := rpcCtx()
	resp, err := tc.begin(ctx, a, env)
	cancel()
	op := started(t, tc.name, resp, err)
	held := a.waitHeld(t, tc.step, heldStep(tc.step, env.cluster))
	if tc.second {
		a.release(t, fault)
		first := held.GetMachine()
		held = a.waitHeld(t, tc.step+" of a second machine", func(h *clv1.HeldStep) bool {
			return heldStep(tc.step, env.cluster)(h) && h.GetMachine() != first
		})
	}
	env.cluster = held.GetCluster()
	if c := a.cluster(t, env.cluster); c.GetState() != tc.during || c.GetCurrentOperation() != op {
		t.Fatalf("before the kill %s is %s held by %q, want %s held by %s", c.GetName(), c.GetState(), c.GetCurrentOperation(), tc.during, op)
	}

	a.kill9()
	since := time.Now()
	if restart {
		b = startServer(t, dsn, "e2e-a", flags...)
		since = b.started
	}
	done := b.waitOp(t, op)
	if e := done.GetError(); e != nil {
		t.Fatalf("adopted operation %s failed: code %d: %s", op, e.GetCode(), e.GetMessage())
	}
	if md := metadata(t, done); md.GetAttempt() != 2 || md.GetServer() != adopter {
		t.Errorf("operation metadata: attempt %d on %q; want attempt 2 on %s", md.GetAttempt(), md.GetServer(), adopter)
	}
	adopted := adoption(t, b, env.cluster, op)
	if adopted.GetServer() != adopter {
		t.Errorf("adopted by %q; want %s", adopted.GetServer(), adopter)
	}
	calls, refused := checkFencing(t, dsn, env.cluster, op, adopted, 2)
	t.Logf("the adopter made %d infrastructure calls; %d of the killed attempt's were refused", calls, refused)
	want(t, b, env)
	return adopted.GetTime().AsTime().Sub(since)
}

// TestSIGTERMHandsOffToAPeer stops one of two servers (the binary's
// heartbeat and scan interval, 1s and 2s) with SIGTERM while its scale is
// held and a client waits on it: the wait is answered at once with the
// operation not done, the process exits 0, and the peer adopts the
// operation at its next scan and runs it to its end; the client, waiting
// again through the peer, sees it succeed. The peer timeout is an hour, so
// an adoption within the test's deadlines shows that a hand-off waits for
// no timeout, however busy the machine.
func TestSIGTERMHandsOffToAPeer(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	flags := []string{"--reconcile-interval", "1h", "--peer-timeout", "1h"}
	a := startServer(t, dsn, "e2e-a", flags...)
	b := startServer(t, dsn, "e2e-b", flags...)
	cluster := a.create(t, "handoff").GetName()
	a.hold(t, "join_node", cluster)
	ctx, cancel := rpcCtx()
	resp, err := scaleTo(3)(ctx, a, &crashEnv{cluster: cluster})
	cancel()
	op := started(t, "scale up", resp, err)
	a.waitHeld(t, "join_node", heldStep("join_node", cluster))

	sent := &sentSignal{ch: make(chan struct{})}
	conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(sent))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	answered := make(chan *longrunningpb.Operation, 1)
	go func() {
		got, err := longrunningpb.NewOperationsClient(conn).WaitOperation(context.Background(), &longrunningpb.WaitOperationRequest{Name: op, Timeout: durationpb.New(time.Minute)})
		if err != nil {
			t.Errorf("WaitOperation open at SIGTERM: %v", err)
		}
		answered <- got
	}()
	select {
	case <-sent.ch:
	case <-time.After(rpcTimeout):
		t.Fatal("WaitOperation was never sent")
	}
	began := time.Now()
	a.terminate(t, 20*time.Second) // requires exit code 0
	exited := time.Since(began)
	if got := <-answered; got.GetDone() {
		t.Errorf("the wait answered at SIGTERM says the operation is done: %v", got.GetResult())
	}

	done := b.waitOp(t, op)
	if e := done.GetError(); e != nil {
		t.Fatalf("handed-off operation failed: %s", e.GetMessage())
	}
	if md := metadata(t, done); md.GetAttempt() != 2 || md.GetServer() != "e2e-b" {
		t.Errorf("metadata: attempt %d on %q; want attempt 2 on e2e-b", md.GetAttempt(), md.GetServer())
	}
	adopted := adoption(t, b, cluster, op)
	var handed *clv1.ClusterEvent
	for _, e := range b.events(t, cluster) {
		if e.GetEvent() == "OPERATION_HANDED_OFF" && e.GetOperation() == op {
			handed = e
		}
	}
	if handed == nil || handed.GetServer() != "e2e-a" || !strings.Contains(handed.GetMessage(), "join_node") {
		t.Errorf("hand-off entry %v; want one by e2e-a at join_node", handed)
	}
	took := adopted.GetTime().AsTime().Sub(began)
	recordRecovery(t, "adoption after SIGTERM hand-off (peer timeout 1h, scan 2s)", took)
	t.Logf("SIGTERM: exit 0 after %s; adopted by the peer %s after the SIGTERM", exited.Round(time.Millisecond), took.Round(time.Millisecond))
	if calls, _ := checkFencing(t, dsn, cluster, op, adopted, 2); calls == 0 {
		t.Errorf("the peer made no infrastructure call for the scale it adopted at join_node")
	}
	wantRunning(t, b, &crashEnv{cluster: cluster}, 3, "1.30.2")
}
