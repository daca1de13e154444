package repository_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// The contract suite: every test runs against every backend (SQLite and real
// MariaDB, and a MariaDB Galera cluster when make test could start one),
// never against a mock, because compare-and-set is exactly the behaviour a
// mock would fake.
func forEachBackend(t *testing.T, fn func(t *testing.T, s *repository.Store)) {
	t.Helper()
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			fn(t, repotest.Open(t, b))
		})
	}
}

// backends are SQLite, MariaDB and, when make test started one, Galera.
func backends(t *testing.T) []repotest.Backend {
	t.Helper()
	bs := repotest.Backends(t)
	if g, ok := repotest.Galera(t); ok {
		bs = append(bs, g)
	}
	return bs
}

var spec = repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 2, ServiceOffering: "medium"}

// ctxT is a test's context: its deadline catches a hung test, and is no
// speed goal (the 200-round claim race took 87 s of an earlier 2 minutes
// beside another make test).
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// create inserts a cluster held by its create job.
func create(t *testing.T, s *repository.Store, name string) (repository.Cluster, repository.Job) {
	t.Helper()
	c, j, err := s.CreateCluster(ctxT(t), repository.NewCluster{Account: "acme", DisplayName: name, Spec: spec},
		repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("CreateCluster(%s): %v", name, err)
	}
	return c, j
}

// running creates a cluster and runs its create job to RUNNING, released.
func running(t *testing.T, s *repository.Store, name string) repository.Cluster {
	t.Helper()
	ctx := ctxT(t)
	c, j := create(t, s, name)
	finishRunning(t, s, c, j)
	c, err := s.GetCluster(ctx, c.ID)
	if err != nil || c.State != lifecycle.Running || c.CurrentOperation != "" {
		t.Fatalf("after create: %+v, %v; want RUNNING, released", c, err)
	}
	return c
}

func TestCreateClusterIsHeldByItsJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		c, j := create(t, s, "web")
		if c.State != lifecycle.Created || c.Version != 1 || c.CurrentOperation != j.ID {
			t.Errorf("new cluster = %s v%d op %q; want CREATED v1 held by %s", c.State, c.Version, c.CurrentOperation, j.ID)
		}
		if j.ResourceID != c.ID || j.Status != repository.JobInProgress || j.ServerID != "s1" {
			t.Errorf("create job = %+v; want IN_PROGRESS on %s by s1", j, c.ID)
		}
		got, err := s.GetCluster(ctxT(t), c.ID)
		if err != nil || got.DisplayName != "web" || got.Spec != spec || got.Account != "acme" {
			t.Errorf("GetCluster = %+v, %v", got, err)
		}
		evs, err := s.ListEvents(ctxT(t), c.ID, 0, 10)
		if err != nil || len(evs) != 1 || evs[0].Name != repository.ClusterCreated || evs[0].To != lifecycle.Created {
			t.Errorf("history = %+v, %v; want one CLUSTER_CREATED entry", evs, err)
		}
	})
}

func TestCASHitAndMiss(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c := running(t, s, "web")
		stale := c.Expect()
		moved, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: stale, Event: lifecycle.StopRequested, Operation: "op-1"})
		if err != nil {
			t.Fatalf("hit: %v", err)
		}
		if moved.State != lifecycle.Stopping || moved.Version != stale.Version+1 || moved.CurrentOperation != "op-1" {
			t.Errorf("hit wrote %s v%d op %q; want STOPPING v%d op-1", moved.State, moved.Version, moved.CurrentOperation, stale.Version+1)
		}
		_, err = s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: stale, Event: lifecycle.StopRequested, Operation: "op-2"})
		var conflict *repository.ConflictError
		if !errors.As(err, &conflict) || !errors.Is(err, repository.ErrConflict) {
			t.Fatalf("miss: err = %v; want *ConflictError", err)
		}
		if conflict.Want != stale || conflict.Got != moved.Expect() {
			t.Errorf("conflict = want %v got %v; want want %v got %v", conflict.Want, conflict.Got, stale, moved.Expect())
		}
		after, _ := s.GetCluster(ctx, c.ID)
		if after.Expect() != moved.Expect() {
			t.Errorf("a missed CAS wrote: cluster is %v, was %v", after.Expect(), moved.Expect())
		}
	})
}

// The status message is written by the compare-and-set that moves the
// cluster: set by the move into ALERT (the history message), kept while an
// operation runs on the ALERT cluster, cleared by RUNNING; what a write
// returns is what a read gets.
func TestStatusMessageFollowsTheState(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c := running(t, s, "web")
		if c.Status != (repository.Status{}) {
			t.Fatalf("a RUNNING cluster's status = %+v; want none", c.Status)
		}
		const why = "1 of 3 machines are not in the power state RUNNING wants"
		write := func(what string, tr repository.Transition) repository.Cluster {
			t.Helper()
			tr.ClusterID = c.ID
			got, err := s.Transition(ctx, tr)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			read, err := s.GetCluster(ctx, c.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Message != read.Status.Message || (got.Status.Time == nil) != (read.Status.Time == nil) ||
				(got.Status.Time != nil && !got.Status.Time.Equal(*read.Status.Time)) {
				t.Errorf("%s: the write returned status %+v, a read gets %+v", what, got.Status, read.Status)
			}
			c = read
			return read
		}
		alert := write("faults detected", repository.Transition{Expect: c.Expect(), Event: lifecycle.FaultsDetected, Message: why})
		if alert.State != lifecycle.Alert || alert.Status.Message != why || alert.Status.Time == nil {
			t.Fatalf("after FAULTS_DETECTED: %s, status %+v; want ALERT, status %q with a time", alert.State, alert.Status, why)
		}
		since := *alert.Status.Time
		starting := write("start from ALERT", repository.Transition{Expect: c.Expect(), Event: lifecycle.StartRequested, Operation: "op-1", Message: "start"})
		if starting.Status.Message != why || !starting.Status.Time.Equal(since) {
			t.Errorf("STARTING from ALERT: status %+v; want %q since %v kept", starting.Status, why, since)
		}
		failed := write("start failed", repository.Transition{Expect: c.Expect(), Event: lifecycle.OperationFailed, Message: "start failed: machine m1 did not boot"})
		if failed.State != lifecycle.Alert || failed.Status.Message != "start failed: machine m1 did not boot" {
			t.Errorf("after the start failed: %s, status %+v; want ALERT with the failure's message", failed.State, failed.Status)
		}
		long := strings.Repeat("é", 2000)
		write("released in place", repository.Transition{Expect: c.Expect(), Message: long})
		if c.Status.Message != "start failed: machine m1 did not boot" {
			t.Errorf("a write that stays ALERT replaced the status with %q", c.Status.Message)
		}
		write("recovery", repository.Transition{Expect: c.Expect(), Event: lifecycle.RecoveryRequested, Operation: "op-2"})
		ok := write("recovered", repository.Transition{Expect: c.Expect(), Event: lifecycle.OperationSucceeded})
		if ok.State != lifecycle.Running || ok.Status != (repository.Status{}) {
			t.Errorf("RUNNING again: status %+v; want none", ok.Status)
		}
		again := write("faults with a long message", repository.Transition{Expect: c.Expect(), Event: lifecycle.FaultsDetected, Message: long})
		if n := utf8.RuneCountInString(again.Status.Message); n != 1024 || !strings.HasSuffix(again.Status.Message, "…") {
			t.Errorf("a 2000-character message is kept as %d characters; want 1024, ending …", n)
		}
	})
}

func TestCASNeedsTheHolder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c, j := create(t, s, "web")
		wrong := c.Expect()
		wrong.Operation = "someone-else"
		_, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: wrong, Event: lifecycle.StartRequested, Operation: j.ID})
		if !errors.Is(err, repository.ErrConflict) {
			t.Errorf("CAS naming the wrong holder: err = %v; want ErrConflict", err)
		}
	})
}

func TestWriteOfIdenticalValues(t *testing.T) {
	// A write that changes nothing but the version must still count as a hit:
	// on MySQL that needs clientFoundRows=true as soon as any column keeps its
	// value, and the version bump makes every hit visible.
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c := running(t, s, "web")
		same := c.Spec
		got, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Changes: repository.Changes{Spec: &same}})
		if err != nil {
			t.Fatalf("identical write: %v", err)
		}
		if got.State != c.State || got.Spec != c.Spec || got.Version != c.Version+1 {
			t.Errorf("identical write = %s v%d %+v; want %s v%d", got.State, got.Version, got.Spec, c.State, c.Version+1)
		}
	})
}

func TestIdenticalHeartbeatIsNotSuperseded(t *testing.T) {
	// With a frozen clock the heartbeat writes the value already stored. MySQL
	// without clientFoundRows reports 0 rows for that, which would look like
	// another process took the server id.
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			frozen := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
			s := repotest.Open(t, b, repository.WithClock(func() time.Time { return frozen }))
			srv, err := s.RegisterServer(ctxT(t), "s1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Heartbeat(ctxT(t), srv); err != nil {
				t.Errorf("heartbeat writing identical values: %v", err)
			}
			again, err := s.RegisterServer(ctxT(t), "s1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Heartbeat(ctxT(t), srv); !errors.Is(err, repository.ErrConflict) {
				t.Errorf("heartbeat of a superseded incarnation: err = %v; want ErrConflict", err)
			}
			if _, err := s.Heartbeat(ctxT(t), again); err != nil {
				t.Errorf("heartbeat of the new incarnation: %v", err)
			}
		})
	}
}

func TestVersionIncrementsAndClosesABA(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c := running(t, s, "web")
		old := c.Expect()
		// RUNNING -> SCALING -> RUNNING: the state is back where it was.
		c, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.ScaleUpRequested, Operation: "scale"})
		if err != nil {
			t.Fatal(err)
		}
		c, err = s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.OperationSucceeded})
		if err != nil {
			t.Fatal(err)
		}
		if c.State != old.State || c.Version != old.Version+2 {
			t.Fatalf("after two writes: %s v%d; want %s v%d", c.State, c.Version, old.State, old.Version+2)
		}
		_, err = s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: old, Event: lifecycle.StopRequested, Operation: "stop"})
		if !errors.Is(err, repository.ErrConflict) {
			t.Errorf("write on a state that left and came back: err = %v; want ErrConflict", err)
		}
	})
}

func TestRefusedTransitionWritesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c := running(t, s, "web")
		_, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StartRequested, Operation: "x"})
		if !errors.Is(err, lifecycle.ErrTransitionNotAllowed) {
			t.Fatalf("RUNNING + START_REQUESTED: err = %v; want ErrTransitionNotAllowed", err)
		}
		after, _ := s.GetCluster(ctx, c.ID)
		if after.Expect() != c.Expect() {
			t.Errorf("refused transition wrote: %v -> %v", c.Expect(), after.Expect())
		}
	})
}

func TestNotFound(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		if _, err := s.GetCluster(ctx, "nope"); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("GetCluster: %v; want ErrNotFound", err)
		}
		if _, err := s.GetJob(ctx, "nope"); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("GetJob: %v; want ErrNotFound", err)
		}
		_, err := s.Transition(ctx, repository.Transition{ClusterID: "nope", Expect: repository.Expect{State: lifecycle.Running, Version: 1}, Event: lifecycle.StopRequested})
		if !errors.Is(err, repository.ErrNotFound) || errors.Is(err, repository.ErrConflict) {
			t.Errorf("Transition: %v; want ErrNotFound only", err)
		}
		_, _, err = s.Claim(ctx, repository.Transition{ClusterID: "nope", Expect: repository.Expect{State: lifecycle.Running, Version: 1}, Event: lifecycle.StopRequested},
			repository.NewJob{Kind: "stop", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("Claim: %v; want ErrNotFound", err)
		}
	})
}

func TestClaimRace(t *testing.T) {
	// 32 goroutines claim the same cluster from the same read; exactly one
	// wins, every loser gets ErrConflict, and exactly one job exists.
	const racers, rounds = 32, 200
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		var lost, deadlockLosses atomic.Int64
		for round := range rounds {
			c := running(t, s, fmt.Sprintf("race-%d", round))
			var wins atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			errs := make(chan error, racers)
			for i := range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					ev := []lifecycle.Event{lifecycle.StopRequested, lifecycle.ScaleUpRequested, lifecycle.UpgradeRequested, lifecycle.DestroyRequested}[i%4]
					_, _, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: ev},
						repository.NewJob{Kind: ev.String(), ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
					switch {
					case err == nil:
						wins.Add(1)
					case errors.Is(err, repository.ErrConflict):
						lost.Add(1)
						var ce *repository.ConflictError
						if errors.As(err, &ce) && ce.Got == (repository.Expect{}) {
							deadlockLosses.Add(1)
						}
					default:
						errs <- err
					}
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("round %d: a claim failed with something other than a lost race: %v", round, err)
			}
			if wins.Load() != 1 {
				t.Fatalf("round %d: %d winners; want exactly 1", round, wins.Load())
			}
			jobs, err := s.ListJobs(ctx, repository.JobQuery{Where: inProgressOf(c.ID), Limit: 100})
			if err != nil || len(jobs) != 1 {
				t.Fatalf("round %d: %d jobs in progress, %v; want exactly 1", round, len(jobs), err)
			}
			got, _ := s.GetCluster(ctx, c.ID)
			if got.CurrentOperation != jobs[0].ID || got.Version != c.Version+1 {
				t.Fatalf("round %d: cluster %v; want held by %s at v%d", round, got.Expect(), jobs[0].ID, c.Version+1)
			}
		}
		t.Logf("%s: %d rounds x %d racers: %d lost races (%d of them deadlocks or lock timeouts)", t.Name(), rounds, racers, lost.Load(), deadlockLosses.Load())
	})
}

// inProgressOf matches the running jobs of one cluster.
func inProgressOf(clusterID string) repository.Filter {
	return repository.And(repository.Compare(repository.JobCluster, repository.Eq, clusterID),
		repository.Compare(repository.JobDone, repository.Eq, false))
}

func TestClaimFailingMidwayWritesNothing(t *testing.T) {
	// The job insert fails (its request id is taken) after the cluster row was
	// updated inside the transaction: neither the state nor a job may remain.
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c := running(t, s, "web")
		other := running(t, s, "other")
		_, first, err := s.Claim(ctx, repository.Transition{ClusterID: other.ID, Expect: other.Expect(), Event: lifecycle.StopRequested},
			repository.NewJob{Kind: "stop", ServerID: "s1", RequestID: "req-1", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StopRequested},
			repository.NewJob{Kind: "stop", ServerID: "s1", RequestID: "req-1", Deadline: time.Now().Add(time.Hour)})
		if !errors.Is(err, repository.ErrAlreadyExists) {
			t.Fatalf("claim with a taken request id: err = %v; want ErrAlreadyExists", err)
		}
		after, _ := s.GetCluster(ctx, c.ID)
		if after.Expect() != c.Expect() {
			t.Errorf("failed claim moved the cluster: %v -> %v", c.Expect(), after.Expect())
		}
		jobs, _ := s.ListJobs(ctx, repository.JobQuery{Where: inProgressOf(c.ID), Limit: 10})
		if len(jobs) != 0 {
			t.Errorf("failed claim left %d jobs in progress", len(jobs))
		}
		evs, _ := s.ListEvents(ctx, c.ID, 0, 100)
		if last := evs[len(evs)-1]; last.Name == lifecycle.StopRequested.String() {
			t.Errorf("failed claim left a history entry: %+v", last)
		}
		byReq, err := s.GetJobByRequestID(ctx, "acme", "req-1")
		if err != nil || byReq.ID != first.ID {
			t.Errorf("GetJobByRequestID = %v, %v; want %s", byReq.ID, err, first.ID)
		}
	})
}

func TestJobsBelongToTheirClustersAccount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		spec := repository.Spec{KubernetesVersion: "1.30.2", ControlNodeCount: 1, WorkerNodeCount: 1, ServiceOffering: "medium"}
		a, ja, err := s.CreateCluster(ctx, repository.NewCluster{Account: "team-a", DisplayName: "web", Spec: spec},
			repository.NewJob{Kind: "create", ServerID: "s1", RequestID: "req-1", RequestHash: "h-a", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		// Request ids are keys per account: another account may use the same one.
		b, jb, err := s.CreateCluster(ctx, repository.NewCluster{Account: "team-b", DisplayName: "web", Spec: spec},
			repository.NewJob{Kind: "create", ServerID: "s1", RequestID: "req-1", RequestHash: "h-b", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatalf("second account reusing a request id: %v", err)
		}
		if ja.Account != "team-a" || jb.Account != "team-b" {
			t.Errorf("create jobs' accounts = %q, %q; want team-a, team-b", ja.Account, jb.Account)
		}
		for _, tc := range []struct{ account, want, hash string }{{"team-a", ja.ID, "h-a"}, {"team-b", jb.ID, "h-b"}} {
			j, err := s.GetJobByRequestID(ctx, tc.account, "req-1")
			if err != nil || j.ID != tc.want || j.RequestHash != tc.hash {
				t.Errorf("GetJobByRequestID(%s) = %s %q, %v; want %s %q", tc.account, j.ID, j.RequestHash, err, tc.want, tc.hash)
			}
		}
		if _, err := s.GetJobByRequestID(ctx, "team-c", "req-1"); !errors.Is(err, repository.ErrNotFound) {
			t.Errorf("GetJobByRequestID of an account that never used the id: %v; want ErrNotFound", err)
		}
		// A claim's job takes the account of the cluster it claims.
		finishRunning(t, s, a, ja)
		a, _ = s.GetCluster(ctx, a.ID)
		_, stop, err := s.Claim(ctx, repository.Transition{ClusterID: a.ID, Expect: a.Expect(), Event: lifecycle.StopRequested},
			repository.NewJob{Kind: "stop", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if stop.Account != "team-a" {
			t.Errorf("claim job account = %q; want team-a", stop.Account)
		}
		jobs, err := s.ListJobs(ctx, repository.JobQuery{Account: "team-a", Limit: 10})
		if err != nil || len(jobs) != 2 || jobs[0].ID != ja.ID || jobs[1].ID != stop.ID {
			t.Errorf("ListJobs(team-a) = %d jobs, %v; want the create and the stop", len(jobs), err)
		}
		if jobs, _ := s.ListJobs(ctx, repository.JobQuery{Account: "team-b", Limit: 10}); len(jobs) != 1 || jobs[0].ID != jb.ID {
			t.Errorf("ListJobs(team-b) = %v; want only %s", jobs, jb.ID)
		}
		cs, err := s.ListClusters(ctx, repository.ClusterQuery{Account: "team-b", Limit: 10})
		if err != nil || len(cs) != 1 || cs[0].ID != b.ID {
			t.Errorf("ListClusters(team-b) = %v, %v; want only %s", cs, err, b.ID)
		}
	})
}

// finishRunning ends a create job with the cluster RUNNING.
func finishRunning(t *testing.T, s *repository.Store, c repository.Cluster, j repository.Job) {
	t.Helper()
	ctx := ctxT(t)
	c, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StartRequested, Operation: j.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobSucceeded,
		Release: &repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.OperationSucceeded}}); err != nil {
		t.Fatal(err)
	}
}

func TestInPlaceClaimKeepsStateButHolds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c, j := create(t, s, "web")
		// The create job fails before the cluster is up: ERROR.
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobFailed,
			Release: &repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.CreateFailed}}); err != nil {
			t.Fatal(err)
		}
		c, _ = s.GetCluster(ctx, c.ID)
		held, job, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.StartRequested},
			repository.NewJob{Kind: "start", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatalf("start of an ERROR cluster: %v", err)
		}
		if held.State != lifecycle.Error || held.CurrentOperation != job.ID {
			t.Errorf("in-place claim = %s op %q; want ERROR held by %s", held.State, held.CurrentOperation, job.ID)
		}
		// It ends without a state change: released, still ERROR.
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: job.ID, Status: repository.JobFailed,
			Release: &repository.Transition{ClusterID: c.ID, Expect: held.Expect()}}); err != nil {
			t.Fatal(err)
		}
		after, _ := s.GetCluster(ctx, c.ID)
		if after.State != lifecycle.Error || after.CurrentOperation != "" {
			t.Errorf("after in-place end: %v; want ERROR released", after.Expect())
		}
	})
}

func TestFinishJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		t.Run("releases the cluster it holds", func(t *testing.T) {
			c := running(t, s, "a")
			held, job, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.ScaleUpRequested},
				repository.NewJob{Kind: "scale", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			done, err := s.FinishJob(ctx, repository.Finish{JobID: job.ID, Status: repository.JobFailed, Error: `{"code":13}`,
				Release: &repository.Transition{ClusterID: c.ID, Expect: held.Expect(), Event: lifecycle.OperationFailed}})
			if err != nil {
				t.Fatal(err)
			}
			if done.Status != repository.JobFailed || done.EndTime == nil || done.Error != `{"code":13}` {
				t.Errorf("finished job = %+v", done)
			}
			after, _ := s.GetCluster(ctx, c.ID)
			if after.State != lifecycle.Alert || after.CurrentOperation != "" {
				t.Errorf("cluster = %v; want ALERT released", after.Expect())
			}
			if _, err := s.FinishJob(ctx, repository.Finish{JobID: job.ID, Status: repository.JobSucceeded}); !errors.Is(err, repository.ErrConflict) {
				t.Errorf("finishing twice: err = %v; want ErrConflict", err)
			}
		})
		t.Run("leaves alone a cluster taken since", func(t *testing.T) {
			c := running(t, s, "b")
			held, job, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.ScaleUpRequested},
				repository.NewJob{Kind: "scale", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			// Recovery ends the scale and a stop takes the cluster.
			alert, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: held.Expect(), Event: lifecycle.OperationFailed})
			if err != nil {
				t.Fatal(err)
			}
			stopping, _, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: alert.Expect(), Event: lifecycle.StopRequested},
				repository.NewJob{Kind: "stop", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			done, err := s.FinishJob(ctx, repository.Finish{JobID: job.ID, Status: repository.JobFailed,
				Release: &repository.Transition{ClusterID: c.ID, Expect: held.Expect(), Event: lifecycle.OperationFailed}})
			if !errors.Is(err, repository.ErrNotHeld) {
				t.Fatalf("late failure: err = %v; want ErrNotHeld", err)
			}
			if done.Status != repository.JobFailed {
				t.Errorf("late failure did not end its job: %s", done.Status)
			}
			after, _ := s.GetCluster(ctx, c.ID)
			if after.Expect() != stopping.Expect() {
				t.Errorf("late failure moved the cluster: %v; want %v", after.Expect(), stopping.Expect())
			}
		})
	})
}

func TestRecordProgressAndCancel(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		_, j := create(t, s, "web")
		got, err := s.RecordProgress(ctx, j.ID, repository.Progress{Step: "power_on", StepsDone: 2, StepsTotal: 5})
		if err != nil || got.Step != "power_on" || got.StepsDone != 2 || got.StepsTotal != 5 || got.CancelRequested {
			t.Fatalf("RecordProgress = %+v, %v", got, err)
		}
		if got, err = s.RequestCancel(ctx, j.ID); err != nil || !got.CancelRequested {
			t.Fatalf("RequestCancel = %+v, %v", got, err)
		}
		if got, err = s.RecordProgress(ctx, j.ID, repository.Progress{Step: "join_node", StepsDone: 3, StepsTotal: 5}); err != nil || !got.CancelRequested {
			t.Errorf("progress after cancel = %+v, %v; want CancelRequested", got, err)
		}
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobCancelled}); err != nil {
			t.Fatal(err)
		}
		_, err = s.RecordProgress(ctx, j.ID, repository.Progress{Step: "late"})
		var jc *repository.JobConflictError
		if !errors.As(err, &jc) || jc.Status != repository.JobCancelled {
			t.Errorf("progress of an ended job: err = %v; want JobConflictError(CANCELLED)", err)
		}
	})
}

// CancelRequested names, of the ids asked about, the running jobs with a
// cancel requested: not a running job without one, not a cancelled job that
// already ended, not an id that names no job.
func TestCancelRequestedAmongRunningJobs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		_, asked := create(t, s, "asked")
		_, quiet := create(t, s, "quiet")
		_, ended := create(t, s, "ended")
		ids := []string{asked.ID, quiet.ID, ended.ID, uuid.NewString()}
		if got, err := s.CancelRequested(ctx, ids); err != nil || len(got) != 0 {
			t.Fatalf("CancelRequested before any cancel = %v, %v; want none", got, err)
		}
		for _, id := range []string{asked.ID, ended.ID} {
			if _, err := s.RequestCancel(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: ended.ID, Status: repository.JobCancelled}); err != nil {
			t.Fatal(err)
		}
		if got, err := s.CancelRequested(ctx, ids); err != nil || !slices.Equal(got, []string{asked.ID}) {
			t.Errorf("CancelRequested = %v, %v; want only %s (running, cancel requested)", got, err, asked.ID)
		}
		if got, err := s.CancelRequested(ctx, nil); err != nil || len(got) != 0 {
			t.Errorf("CancelRequested of no ids = %v, %v; want none", got, err)
		}
	})
}

func TestDisplayNameUniquePerAccount(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		c := running(t, s, "web")
		_, _, err := s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: "web", Spec: spec},
			repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if !errors.Is(err, repository.ErrAlreadyExists) {
			t.Fatalf("same name, same account: err = %v; want ErrAlreadyExists", err)
		}
		if _, _, err := s.CreateCluster(ctx, repository.NewCluster{Account: "other", DisplayName: "web", Spec: spec},
			repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)}); err != nil {
			t.Errorf("same name, other account: %v", err)
		}
		// Destroy it: the name is free again.
		d, _, err := s.Claim(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.DestroyRequested},
			repository.NewJob{Kind: "delete", ServerID: "s1", Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		gone, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: d.Expect(), Event: lifecycle.OperationSucceeded})
		if err != nil || gone.State != lifecycle.Destroyed || gone.DeleteTime == nil {
			t.Fatalf("destroy = %+v, %v", gone, err)
		}
		if _, _, err := s.CreateCluster(ctx, repository.NewCluster{Account: "acme", DisplayName: "web", Spec: spec},
			repository.NewJob{Kind: "create", ServerID: "s1", Deadline: time.Now().Add(time.Hour)}); err != nil {
			t.Errorf("reuse of a destroyed cluster's name: %v", err)
		}
	})
}

func TestListClustersPagesAndFilters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		var ids []string
		for i := range 5 {
			c := running(t, s, fmt.Sprintf("c%d", i))
			ids = append(ids, c.ID)
		}
		held, _ := create(t, s, "creating")
		var got []string
		after := ""
		for {
			page, err := s.ListClusters(ctx, repository.ClusterQuery{Where: repository.Compare(repository.ClusterState, repository.Eq, lifecycle.Running), After: after, Limit: 2})
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			for _, c := range page {
				got = append(got, c.ID)
			}
			after = page[len(page)-1].ID
		}
		if fmt.Sprint(got) != fmt.Sprint(ids) {
			t.Errorf("RUNNING clusters in pages of 2 = %v; want %v (creation order)", got, ids)
		}
		all, _ := s.ListClusters(ctx, repository.ClusterQuery{Limit: 100})
		if len(all) != 6 || all[5].ID != held.ID {
			t.Errorf("all clusters = %d, last %v; want 6, last the CREATED one", len(all), all[len(all)-1].ID)
		}
		byName, _ := s.ListClusters(ctx, repository.ClusterQuery{Where: repository.Compare(repository.ClusterDisplayName, repository.Eq, "c3"), Limit: 100})
		if len(byName) != 1 || byName[0].ID != ids[3] {
			t.Errorf("display_name c3 = %+v", byName)
		}
	})
}

func TestMigrationsAreIdempotent(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dsn := b.NewDSN(t)
			for i := range 2 {
				s, err := repository.Open(ctxT(t), dsn)
				if err != nil {
					t.Fatalf("open #%d: %v", i+1, err)
				}
				repotest.SeedCatalog(t, s)
				_ = s.Close()
			}
		})
	}
}
