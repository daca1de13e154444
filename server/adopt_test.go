package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/longrunning/autogen/longrunningpb"

	clv1 "github.com/clusterd/clusterd/gen/clusterlifecycle/v1"
	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/infra/sim"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// Adoption (SPEC §5 step 4) through real servers sharing a database.

// peerServer runs a server with id on dsn whose peer timeout is a minute:
// anything adopted in these tests is adopted without waiting for it.
func peerServer(t *testing.T, dsn, id string, scan time.Duration, mutate ...func(*Config)) *rig {
	t.Helper()
	h := startOn(t, dsn, append([]func(*Config){func(c *Config) {
		c.ServerID, c.PeerTimeout, c.ScanInterval, c.ReconcileInterval = id, time.Minute, scan, time.Hour
	}}, mutate...)...)
	t.Cleanup(h.srv.sim.ClearFaults)
	return &rig{harness: h, t: t, ctx: tctx(t)}
}

// entry finds op's history entry named name, failing the test without one.
func entry(t *testing.T, hist []repository.Event, op, name string) repository.Event {
	t.Helper()
	for _, e := range hist {
		if e.Operation == op && e.Name == name {
			return e
		}
	}
	t.Fatalf("no %s entry of %s in the history:\n%s", name, op, describeHistory(hist))
	return repository.Event{}
}

func describeHistory(hist []repository.Event) string {
	var b strings.Builder
	for _, e := range hist {
		b.WriteString("  " + e.From.String() + " -" + e.Name + "-> " + e.To.String() + " op=" + e.Operation + " server=" + e.Server + ": " + e.Message + "\n")
	}
	return b.String()
}

// checkFencedAfterAdoption checks the simulator's log of the cluster: no
// call of the job's attempt below attempt went through once the history
// had the adoption (adopted, the OPERATION_ADOPTED entry), and every call
// after it is the adopter's.
func checkFencedAfterAdoption(t *testing.T, r *rig, cluster, op string, adopted repository.Event, attempt int32) {
	t.Helper()
	calls, err := sim.Calls(r.ctx, r.seed, clusterUUID(cluster))
	if err != nil {
		t.Fatal(err)
	}
	after := 0
	for _, c := range calls {
		if c.Fence.JobID != op || c.Refused {
			continue
		}
		switch {
		case c.LastEventID >= adopted.ID && c.Fence.Attempt != attempt:
			t.Errorf("call %d (%s, attempt %d, server %s) went through after the adoption (history entry %d)", c.ID, c.Fence.Step, c.Fence.Attempt, c.Server, adopted.ID)
		case c.LastEventID >= adopted.ID:
			after++
			if c.Server != adopted.Server {
				t.Errorf("call %d of attempt %d made by server %s; want the adopter %s", c.ID, attempt, c.Server, adopted.Server)
			}
		case c.Fence.Attempt == attempt:
			t.Errorf("call %d of attempt %d logged before the adoption", c.ID, attempt)
		}
	}
	if after == 0 {
		t.Errorf("no call of the adopter in the log of %s", cluster)
	}
}

// A graceful stop hands the running scale off at its held step, and a peer
// adopts it at its next scan: the operation keeps its name and ends
// SUCCEEDED (followed through the peer), the cluster reaches the size asked
// for, and the history shows both servers. The peer timeout is an hour, so
// an adoption within the test's deadlines shows that a hand-off waits for no
// timeout, however busy the machine.
func TestGracefulStopHandsOffToAPeer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		dsn := b.NewDSN(t)
		noTimeout := func(c *Config) { c.PeerTimeout = time.Hour }
		a := peerServer(t, dsn, "a", time.Hour, noTimeout)
		peer := peerServer(t, dsn, "b", 50*time.Millisecond, noTimeout)
		c := a.create("handoff", 2)
		f := a.hold(infra.StepJoinNode, c.GetName())
		op := a.accepted(a.scaleTo(c.GetName(), 3))
		a.heldBy(f)
		if err := a.stop(); err != nil {
			t.Fatalf("graceful stop: %v", err)
		}

		done := peer.succeeded(op)
		md := opMetadata(t, done)
		if md.GetAttempt() != 2 || md.GetServer() != "b" || md.GetVerb() != "scale" {
			t.Errorf("operation metadata = attempt %d on %q (%s); want attempt 2 on b, scale", md.GetAttempt(), md.GetServer(), md.GetVerb())
		}
		got := peer.cluster(c.GetName())
		if got.GetState() != clv1.Cluster_RUNNING || got.GetCurrentOperation() != "" || got.GetWorkerNodeCount() != 3 || len(got.GetNodes()) != 4 {
			t.Errorf("cluster after the adopted scale: %s held by %q, %d workers, %d nodes; want RUNNING, unheld, 3 workers, 4 nodes",
				got.GetState(), got.GetCurrentOperation(), got.GetWorkerNodeCount(), len(got.GetNodes()))
		}
		for _, n := range got.GetNodes() {
			if !n.GetJoined() || n.GetPower() != clv1.Node_RUNNING {
				t.Errorf("node %s: joined %t, %s; want joined and running", n.GetName(), n.GetJoined(), n.GetPower())
			}
		}
		id := operationUUID(op.GetName())
		hist := peer.history(c.GetName())
		handed := entry(t, hist, id, repository.OperationHandedOff)
		adopted := entry(t, hist, id, repository.OperationAdopted)
		if handed.Server != "a" || !strings.Contains(handed.Message, infra.StepJoinNode) || handed.From != lifecycle.Scaling || handed.To != lifecycle.Scaling {
			t.Errorf("hand-off entry %+v; want by a, at join_node, SCALING kept", handed)
		}
		if adopted.Server != "b" || !strings.Contains(adopted.Message, "from server a") || adopted.ID < handed.ID || adopted.To != lifecycle.Scaling {
			t.Errorf("adoption entry %+v; want by b, naming a, after the hand-off, SCALING kept", adopted)
		}
		t.Logf("hand-off to adoption: %s", adopted.Time.Sub(handed.Time).Round(time.Millisecond))
		for _, e := range hist {
			if e.Name == repository.RecoveryStarted || e.Name == repository.Repair {
				t.Errorf("a handed-off operation was recovered, not adopted: %+v", e)
			}
		}
		checkFencedAfterAdoption(t, peer, c.GetName(), id, adopted, 2)
	})
}

// With no peer, a server restarted under the same id adopts at start the
// job it handed off when it stopped, and runs it to its end.
func TestRestartAdoptsItsOwnJobAtStart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		dsn := b.NewDSN(t)
		first := peerServer(t, dsn, "solo", time.Hour)
		c := first.create("solo", 2)
		f := first.hold(infra.StepPowerOff, c.GetName())
		op := first.accepted(first.stopCluster(c.GetName()))
		first.heldBy(f)
		if err := first.stop(); err != nil {
			t.Fatalf("graceful stop: %v", err)
		}
		if j, _ := first.seed.GetJob(first.ctx, operationUUID(op.GetName())); j.Status != repository.JobInProgress || !j.HandedOff {
			t.Fatalf("job after the stop: %s, handed off %t; want IN_PROGRESS and handed off", j.Status, j.HandedOff)
		}
		again := peerServer(t, dsn, "solo", time.Hour) // passes once, at start
		done := again.succeeded(op)
		if md := opMetadata(t, done); md.GetAttempt() != 2 || md.GetServer() != "solo" {
			t.Errorf("metadata: attempt %d on %q; want attempt 2 on solo", md.GetAttempt(), md.GetServer())
		}
		got := again.cluster(c.GetName())
		if got.GetState() != clv1.Cluster_STOPPED || got.GetCurrentOperation() != "" {
			t.Errorf("cluster after the adopted stop: %s held by %q; want STOPPED", got.GetState(), got.GetCurrentOperation())
		}
		for _, n := range got.GetNodes() {
			if n.GetPower() != clv1.Node_STOPPED {
				t.Errorf("node %s is %s after the stop", n.GetName(), n.GetPower())
			}
		}
		adopted := entry(t, again.history(c.GetName()), operationUUID(op.GetName()), repository.OperationAdopted)
		checkFencedAfterAdoption(t, again, c.GetName(), operationUUID(op.GetName()), adopted, 2)
	})
}

// A create whose server died before its first step (CREATED, held by a job
// nobody runs) is adopted and creates the cluster, where --on-owner-loss=fail
// turns it to ERROR (TestRecovery_CreatedClusterOfADeadServerGoesToError).
// The ghost server has no row, so its job is adoptable whatever the peer
// timeout; a minute of it keeps a loaded machine's late heartbeats from
// lapsing the lease, which hands the job off and has it run a third attempt.
func TestCreateOfADeadServerIsAdopted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		h := start(t, b, func(c *Config) { c.ScanInterval, c.PeerTimeout = 50*time.Millisecond, time.Minute })
		spec := repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 2, ServiceOffering: "medium"}
		params, _ := json.Marshal(spec)
		c, j, err := h.seed.CreateCluster(tctx(t), repository.NewCluster{Account: "acme", DisplayName: "orphan", Spec: spec},
			repository.NewJob{Kind: "create", ServerID: "ghost", ServerIncarnation: "gone", Params: string(params), Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		r := &rig{harness: h, t: t, ctx: tctx(t)}
		done := r.succeeded(&longrunningpb.Operation{Name: "operations/" + j.ID})
		if md := opMetadata(t, done); md.GetAttempt() != 2 || md.GetServer() != "test-server" {
			t.Errorf("metadata: attempt %d on %q; want attempt 2 on test-server", md.GetAttempt(), md.GetServer())
		}
		got := r.cluster("clusters/" + c.ID)
		if got.GetState() != clv1.Cluster_RUNNING || len(got.GetNodes()) != 3 || got.GetEndpoint() == "" {
			t.Errorf("adopted create left %s with %d nodes, endpoint %q; want RUNNING with 3 nodes and an endpoint", got.GetState(), len(got.GetNodes()), got.GetEndpoint())
		}
		hist := r.history("clusters/" + c.ID)
		var names []string
		for _, e := range hist {
			names = append(names, e.Name)
		}
		if want := []string{repository.ClusterCreated, repository.OperationAdopted, "START_REQUESTED", "OPERATION_SUCCEEDED"}; !slices.Equal(names, want) {
			t.Errorf("history %v; want %v", names, want)
		}
	})
}

// A server never adopts a job its own runner still runs, whatever its
// heartbeat looks like to the pass that offers the job. A pass that began
// as this server's lease was about to lapse judges it by a cutoff later
// than its last heartbeat (and its runner may still be ending an attempt
// it handed off when the pass offers that attempt's job): such an adoption
// used to commit, fail to start the job (already running here), hand it
// off again and so use up an attempt, while the running attempt, fenced,
// stopped. A job handed off with no attempt left was then failed by this
// server's own scanner as one it lost (JOB_LOST). Here the adoption is
// refused as a lost race, nothing is written, and the job runs on.
func TestAJobThisServerRunsIsNotAdoptedByIt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		// A peer timeout of a minute: a loaded machine's late heartbeats do
		// not lapse the lease (its job would be handed off, and with no scan
		// pass nobody would adopt it).
		r := newRig(t, b, func(c *Config) { c.PeerTimeout = time.Minute })
		c := r.create("self", 2)
		f := r.hold(infra.StepPowerOff, c.GetName())
		op := r.accepted(r.stopCluster(c.GetName()))
		r.heldBy(f)
		id := operationUUID(op.GetName())
		j, err := r.seed.GetJob(r.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		// A cutoff a minute ahead: this server's heartbeat is older, as it
		// is to a pass that began just as the lease was about to lapse.
		err = r.srv.clusters.Adopt(r.ctx, j, time.Now().Add(time.Minute), "test: its owner looks dead")
		if !errors.Is(err, repository.ErrConflict) {
			t.Errorf("adopting a job this server runs: %v; want a lost race (ErrConflict)", err)
		}
		if got, err := r.seed.GetJob(r.ctx, id); err != nil || got.Attempt != j.Attempt || got.HandedOff || got.ServerID != j.ServerID {
			t.Fatalf("job after the refused adoption: attempt %d on %q, handed off %t (%v); want attempt %d on %q, not handed off",
				got.Attempt, got.ServerID, got.HandedOff, err, j.Attempt, j.ServerID)
		}
		r.let(f)
		if md := opMetadata(t, r.succeeded(op)); md.GetAttempt() != j.Attempt {
			t.Errorf("operation ended at attempt %d; want the running attempt %d", md.GetAttempt(), j.Attempt)
		}
		for _, e := range r.history(c.GetName()) {
			if e.Name == repository.OperationAdopted || e.Name == repository.OperationHandedOff {
				t.Errorf("history has %s: %s", e.Name, e.Message)
			}
		}
	})
}

// The bounds of adoption: a job that has run --max-operation-attempts
// times, or whose deadline has passed, is failed when its server is lost,
// and its cluster is recovered as without adoption (SPEC §5.1); one attempt
// more allowed, the same job is adopted and succeeds.
func TestAdoptionBounds(t *testing.T) {
	cases := []struct {
		name        string
		maxAttempts int
		attempts    int32 // the attempts the job has had when its server is lost
		deadline    time.Duration
		adopted     bool
	}{
		{"out of attempts", 3, 3, time.Hour, false},
		{"one attempt left", 4, 3, time.Hour, true},
		{"past its deadline", 3, 1, -time.Second, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, b repotest.Backend) {
				r := newRig(t, b, func(c *Config) { c.MaxOperationAttempts = tc.maxAttempts })
				c := r.create("bounds", 2)
				seen, err := r.seed.GetCluster(r.ctx, clusterUUID(c.GetName()))
				if err != nil {
					t.Fatal(err)
				}
				_, j, err := r.seed.Claim(r.ctx, repository.Transition{ClusterID: seen.ID, Expect: seen.Expect(), Event: lifecycle.ScaleUpRequested},
					repository.NewJob{Kind: "scale", ServerID: "ghost", ServerIncarnation: "gone", Params: `{"workers":3}`, Deadline: time.Now().Add(tc.deadline)})
				if err != nil {
					t.Fatal(err)
				}
				// Earlier adoptions by servers now gone: attempt tc.attempts,
				// its owner stopped.
				for i := int32(1); i < tc.attempts; i++ {
					prev, err := r.seed.RegisterServer(r.ctx, fmt.Sprintf("gone-%d", i))
					if err != nil {
						t.Fatal(err)
					}
					if j, err = r.seed.AdoptJob(r.ctx, repository.Adoption{Job: j, Server: prev, Cutoff: time.Now().Add(time.Minute)}); err != nil {
						t.Fatal(err)
					}
					if err := r.seed.ReleaseServer(r.ctx, prev); err != nil {
						t.Fatal(err)
					}
				}
				rep := r.srv.scanner.Pass(r.ctx)
				op := &longrunningpb.Operation{Name: "operations/" + j.ID}
				if tc.adopted {
					if rep.Adopted != 1 || rep.JobsFailed != 0 {
						t.Errorf("scan pass adopted %d, failed %d; want the job adopted", rep.Adopted, rep.JobsFailed)
					}
					done := r.succeeded(op)
					if md := opMetadata(t, done); md.GetAttempt() != tc.attempts+1 {
						t.Errorf("adopted job ran as attempt %d; want %d", md.GetAttempt(), tc.attempts+1)
					}
					if got := r.cluster(c.GetName()); got.GetState() != clv1.Cluster_RUNNING || got.GetWorkerNodeCount() != 3 {
						t.Errorf("after the adopted scale: %s with %d workers; want RUNNING with 3", got.GetState(), got.GetWorkerNodeCount())
					}
					return
				}
				if rep.Adopted != 0 || rep.JobsFailed != 1 {
					t.Errorf("scan pass adopted %d, failed %d; want the job failed, not adopted", rep.Adopted, rep.JobsFailed)
				}
				st := r.failed(op)
				if !strings.Contains(st.GetMessage(), "owner server stopped") {
					t.Errorf("job failed with %q; want the owner's loss", st.GetMessage())
				}
				// The same pass recovered the orphan, as without adoption:
				// SCALING -> ALERT.
				recoveries := r.jobsOfKind(c.GetName(), "recover")
				if len(recoveries) != 1 {
					t.Fatalf("recovery jobs of %s: %v; want one", c.GetName(), recoveries)
				}
				r.succeeded(&longrunningpb.Operation{Name: "operations/" + recoveries[0].ID})
				if got := r.cluster(c.GetName()); got.GetState() != clv1.Cluster_ALERT || got.GetCurrentOperation() != "" {
					t.Errorf("after recovery the cluster is %s held by %q; want ALERT, unheld", got.GetState(), got.GetCurrentOperation())
				}
				entry(t, r.history(c.GetName()), recoveries[0].ID, repository.RecoveryStarted)
			})
		})
	}
}

// With --on-owner-loss=fail nothing is adopted: a dead server's job fails
// and its cluster is recovered (the recovery tests above run so).
func TestOnOwnerLossFailAdoptsNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b, failOnOwnerLoss)
		c := r.create("fail", 2)
		seen, err := r.seed.GetCluster(r.ctx, clusterUUID(c.GetName()))
		if err != nil {
			t.Fatal(err)
		}
		_, j, err := r.seed.Claim(r.ctx, repository.Transition{ClusterID: seen.ID, Expect: seen.Expect(), Event: lifecycle.ScaleUpRequested},
			repository.NewJob{Kind: "scale", ServerID: "ghost", ServerIncarnation: "gone", Params: `{"workers":3}`, Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if rep := r.srv.scanner.Pass(context.Background()); rep.Adopted != 0 || rep.JobsFailed != 1 {
			t.Errorf("scan pass adopted %d, failed %d; want 0 and 1", rep.Adopted, rep.JobsFailed)
		}
		if got, _ := r.seed.GetJob(r.ctx, j.ID); got.Status != repository.JobFailed || got.Attempt != 1 {
			t.Errorf("job: %s at attempt %d; want FAILED at attempt 1", got.Status, got.Attempt)
		}
	})
}

// A job this server cannot rebuild (a kind it does not know, as a newer
// server's could be) is not adopted: it is failed as without adoption, and
// does not hold back the failing of the others.
func TestUnresumableJobIsFailed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		r := newRig(t, b)
		c := r.create("unknown", 2)
		seen, err := r.seed.GetCluster(r.ctx, clusterUUID(c.GetName()))
		if err != nil {
			t.Fatal(err)
		}
		_, j, err := r.seed.Claim(r.ctx, repository.Transition{ClusterID: seen.ID, Expect: seen.Expect(), Event: lifecycle.ScaleUpRequested},
			repository.NewJob{Kind: "rebalance", ServerID: "ghost", ServerIncarnation: "gone", Params: `{}`, Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if rep := r.srv.scanner.Pass(r.ctx); rep.Adopted != 0 || rep.JobsFailed != 1 || len(rep.Errors) != 0 {
			t.Errorf("scan pass adopted %d, failed %d, errors %v; want the unknown job failed, no error", rep.Adopted, rep.JobsFailed, rep.Errors)
		}
		if got, _ := r.seed.GetJob(r.ctx, j.ID); got.Status != repository.JobFailed || got.Attempt != 1 {
			t.Errorf("job: %s at attempt %d; want FAILED at attempt 1", got.Status, got.Attempt)
		}
	})
}

// A server judges a peer dead only after its own heartbeats have run
// unbroken for a peer timeout (lease.HeldSince): at its start, as after a
// database outage in which it missed heartbeats, a peer's heartbeat may be
// old only because nobody could write one. Here the peer's heartbeat is
// already a minute old when the server starts: its create is adopted, but
// not before the server has held its lease for the peer timeout.
func TestPeerJudgedDeadOnlyAfterAPeerTimeoutOfItsOwnHeartbeats(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b repotest.Backend) {
		dsn := b.NewDSN(t)
		past := time.Now().Add(-time.Minute)
		then, err := repository.Open(tctx(t), dsn, repository.WithClock(func() time.Time { return past }))
		if err != nil {
			t.Fatal(err)
		}
		defer then.Close()
		repotest.SeedCatalog(t, then)
		peer, err := then.TakeOverServer(tctx(t), "peer", nil, repository.Registrant{Incarnation: repository.NewIncarnation(), Host: "elsewhere", PID: 4242})
		if err != nil {
			t.Fatal(err)
		}
		spec := repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}
		params, _ := json.Marshal(spec)
		c, j, err := then.CreateCluster(tctx(t), repository.NewCluster{Account: "acme", DisplayName: "peer-create", Spec: spec},
			repository.NewJob{Kind: "create", ServerID: peer.ID, ServerIncarnation: peer.Incarnation, Params: string(params), Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}

		const peerTimeout = time.Second
		h := startOn(t, dsn, func(c *Config) {
			c.PeerTimeout, c.HeartbeatInterval, c.ScanInterval = peerTimeout, 100*time.Millisecond, 50*time.Millisecond
		})
		r := &rig{harness: h, t: t, ctx: tctx(t)}
		r.succeeded(&longrunningpb.Operation{Name: "operations/" + j.ID})
		adopted := entry(t, r.history("clusters/"+c.ID), j.ID, repository.OperationAdopted)
		// The lease was acquired at the server row's start; its run of
		// heartbeats can only have begun then or later.
		earliest := h.srv.self.StartTime.Add(peerTimeout - time.Millisecond)
		if adopted.Time.Before(earliest) {
			t.Errorf("adopted %s after the server's start; want no sooner than the peer timeout %s", adopted.Time.Sub(h.srv.self.StartTime), peerTimeout)
		}
	})
}
