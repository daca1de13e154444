package repository_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// adoptable lists the ids AdoptableJobs returns at now (peer timeout 6s, at
// most 3 attempts).
func adoptable(t *testing.T, s *repository.Store, now time.Time) []string {
	t.Helper()
	jobs, err := s.AdoptableJobs(ctxT(t), repository.AdoptableQuery{Cutoff: now.Add(-6 * time.Second), Now: now, MaxAttempts: 3, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, j := range jobs {
		ids = append(ids, j.ID)
	}
	return ids
}

// Which jobs may be adopted: those of an earlier incarnation, of a dead
// server and handed-off ones, with attempts and time left; never a live
// server's, never one that acts on no cluster.
func TestAdoptableJobs(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			now := noon
			s := openAt(t, b, &now)
			ctx := ctxT(t)
			oldSelf, _ := s.RegisterServer(ctx, "me")
			_, restarted := claimOn(t, s, "a", oldSelf)
			self, _ := s.RegisterServer(ctx, "me")
			_, mine := claimOn(t, s, "b", self)
			peer, _ := s.RegisterServer(ctx, "peer")
			_, peerJob := claimOn(t, s, "c", peer)
			_, handed := claimOn(t, s, "d", peer)
			dead, _ := s.RegisterServer(ctx, "dead")
			_, deadJob := claimOn(t, s, "e", dead)
			now = now.Add(10 * time.Second)
			for _, srv := range []repository.Server{self, peer} {
				if _, err := s.Heartbeat(ctx, srv); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.HandOffJob(ctx, repository.HandOff{Job: handed, Server: "peer", Message: "stopping"}); err != nil {
				t.Fatal(err)
			}
			got := adoptable(t, s, now)
			want := []string{restarted.ID, handed.ID, deadJob.ID}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("adoptable = %v; want the earlier incarnation's, the handed-off and the dead server's %v (not %s, %s)", got, want, mine.ID, peerJob.ID)
			}
			// Past its deadline, or out of attempts, a job is not adoptable.
			late, err := s.AdoptableJobs(ctx, repository.AdoptableQuery{Cutoff: now.Add(-6 * time.Second), Now: time.Now().Add(2 * time.Hour), MaxAttempts: 3, Limit: 100})
			if err != nil || len(late) != 0 {
				t.Errorf("adoptable past every deadline = %v, %v; want none", late, err)
			}
			jobs, err := s.AdoptableJobs(ctx, repository.AdoptableQuery{Cutoff: now.Add(-6 * time.Second), Now: now, MaxAttempts: 1, Limit: 100})
			if err != nil || len(jobs) != 0 {
				t.Errorf("adoptable with 1 attempt allowed = %v, %v; want none", jobs, err)
			}
		})
	}
}

// A server is alive to itself: with a cutoff later than its own last
// heartbeat (a pass that began as its lease was about to lapse), it neither
// lists, adopts nor fails the jobs of its own incarnation, while a peer's
// job with as old a heartbeat is a dead server's.
func TestAServerIsNeverDeadToItself(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			now := noon
			s := openAt(t, b, &now)
			ctx := ctxT(t)
			self, _ := s.RegisterServer(ctx, "me")
			_, mine := claimOn(t, s, "a", self)
			peer, _ := s.RegisterServer(ctx, "peer")
			_, peerJob := claimOn(t, s, "b", peer)
			cutoff := now.Add(time.Second) // later than both heartbeats
			jobs, err := s.AdoptableJobs(ctx, repository.AdoptableQuery{Cutoff: cutoff, Now: now, MaxAttempts: 3, Limit: 100, Self: self})
			var ids []string
			for _, j := range jobs {
				ids = append(ids, j.ID)
			}
			if err != nil || !slices.Equal(ids, []string{peerJob.ID}) {
				t.Errorf("adoptable to %s = %v, %v; want only the peer's job %s (not its own %s)", self.ID, ids, err, peerJob.ID, mine.ID)
			}
			if _, err := s.AdoptJob(ctx, repository.Adoption{Job: mine, Server: self, Cutoff: cutoff}); !errors.Is(err, repository.ErrConflict) {
				t.Errorf("adoption of its own job: %v; want ErrConflict", err)
			}
			if _, stopped, err := s.FailJobsOfDeadServers(ctx, self, cutoff, nil, errJSON("server restarted"), errJSON("owner server stopped")); err != nil || stopped != 1 {
				t.Errorf("FailJobsOfDeadServers = %d stopped, %v; want the peer's job only", stopped, err)
			}
			if j, _ := s.GetJob(ctx, mine.ID); j.Status != repository.JobInProgress || j.Attempt != mine.Attempt || j.ServerID != self.ID {
				t.Errorf("own job: %s at attempt %d on %s; want IN_PROGRESS at attempt %d on %s", j.Status, j.Attempt, j.ServerID, mine.Attempt, self.ID)
			}
			if j, _ := s.GetJob(ctx, peerJob.ID); j.Status != repository.JobFailed {
				t.Errorf("peer's job: %s; want FAILED", j.Status)
			}
		})
	}
}

// An adoption is one compare-and-set on the job: it moves the job to the
// adopter and bumps the attempt; the cluster keeps its state and its
// operation and records OPERATION_ADOPTED; the old owner's progress, end,
// transitions and fenced calls are refused from then on.
func TestAdoptJobFencesTheOldOwner(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			now := noon
			s := openAt(t, b, &now)
			ctx := ctxT(t)
			dead, _ := s.RegisterServer(ctx, "dead")
			c, j := claimOn(t, s, "a", dead)
			if _, err := s.RecordProgress(ctx, j.ID, repository.Progress{Step: "join_node", StepsDone: 4, StepsTotal: 9, Attempt: 1}); err != nil {
				t.Fatal(err)
			}
			now = now.Add(10 * time.Second)
			live, _ := s.RegisterServer(ctx, "live")
			a := repository.Adoption{Job: j, Server: live, Cutoff: now.Add(-6 * time.Second), Message: "adopted from dead"}
			got, err := s.AdoptJob(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			if got.Attempt != 2 || got.ServerID != "live" || got.ServerIncarnation != live.Incarnation || got.Status != repository.JobInProgress ||
				got.Step != "join_node" || got.StepsDone != 4 || got.ID != j.ID {
				t.Errorf("adopted job = %+v; want the same job at attempt 2 on live, its progress kept", got)
			}
			after, _ := s.GetCluster(ctx, c.ID)
			if after.State != c.State || after.CurrentOperation != j.ID || after.Version != c.Version+1 {
				t.Errorf("cluster after adoption = %v; want %s held by %s at v%d", after.Expect(), c.State, j.ID, c.Version+1)
			}
			evs, _ := s.ListEvents(ctx, c.ID, 0, 100)
			last := evs[len(evs)-1]
			if last.Name != repository.OperationAdopted || last.Operation != j.ID || last.Server != "live" || last.From != c.State || last.To != c.State || last.Message != "adopted from dead" {
				t.Errorf("last history entry = %+v; want OPERATION_ADOPTED of %s by live, no state change", last, j.ID)
			}
			// Adopting again from the same read misses.
			if _, err := s.AdoptJob(ctx, a); !errors.Is(err, repository.ErrConflict) {
				t.Errorf("second adoption from the same read: %v; want ErrConflict", err)
			}
			// The old owner (attempt 1) is refused everywhere.
			var jc *repository.JobConflictError
			if _, err := s.RecordProgress(ctx, j.ID, repository.Progress{Step: "detach_iso", Attempt: 1}); !errors.As(err, &jc) || jc.Status != repository.JobInProgress || jc.Attempt != 2 {
				t.Errorf("old owner's progress: %v; want a JobConflictError naming attempt 2", err)
			}
			if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobFailed, Attempt: 1,
				Release: &repository.Transition{ClusterID: c.ID, Expect: after.Expect(), Event: lifecycle.OperationFailed}}); !errors.As(err, &jc) {
				t.Errorf("old owner's end: %v; want a JobConflictError", err)
			}
			// Also when its end leaves the cluster alone (no guard): the
			// job's own write carries the attempt.
			if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobFailed, Attempt: 1}); !errors.As(err, &jc) || jc.Attempt != 2 {
				t.Errorf("old owner's end without a release: %v; want a JobConflictError naming attempt 2", err)
			}
			// Its moves expect the cluster as it last wrote it, which the
			// adoption's history entry moved on.
			if _, err := s.Transition(ctx, repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.OperationFailed, Operation: j.ID}); !errors.Is(err, repository.ErrConflict) {
				t.Errorf("old owner's transition: %v; want ErrConflict", err)
			}
			err = s.Guarded(ctx, repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: 1, Step: "join_node"}, func(*repository.Store) error {
				t.Error("the old owner's fenced write ran")
				return nil
			})
			var fenced *repository.FencedError
			if !errors.As(err, &fenced) {
				t.Errorf("old owner's fenced call: %v; want a FencedError", err)
			}
			ran := false
			if err := s.Guarded(ctx, repository.Fence{ClusterID: c.ID, JobID: j.ID, Attempt: 2, Step: "join_node"}, func(*repository.Store) error { ran = true; return nil }); err != nil || !ran {
				t.Errorf("adopter's fenced call: ran %t, %v; want it let through", ran, err)
			}
			now2, _ := s.GetCluster(ctx, c.ID)
			if now2.Expect() != after.Expect() {
				t.Errorf("cluster after the old owner's refused writes = %v; want unchanged %v", now2.Expect(), after.Expect())
			}
			// The adopter's writes go through.
			if _, err := s.RecordProgress(ctx, j.ID, repository.Progress{Step: "join_node", StepsDone: 4, Attempt: 2}); err != nil {
				t.Errorf("adopter's progress: %v", err)
			}
			if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobSucceeded, Attempt: 2,
				Release: &repository.Transition{ClusterID: c.ID, Expect: after.Expect(), Event: lifecycle.OperationSucceeded}}); err != nil {
				t.Errorf("adopter's end: %v", err)
			}
		})
	}
}

// A job whose owner is alive again (it heartbeat after the adopter read it
// as dead) is not adopted: the liveness is checked again in the write.
func TestAdoptJobLeavesALiveOwner(t *testing.T) {
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			now := noon
			s := openAt(t, b, &now)
			ctx := ctxT(t)
			owner, _ := s.RegisterServer(ctx, "owner")
			c, j := claimOn(t, s, "a", owner)
			now = now.Add(10 * time.Second)
			if _, err := s.Heartbeat(ctx, owner); err != nil {
				t.Fatal(err)
			}
			live, _ := s.RegisterServer(ctx, "live")
			if _, err := s.AdoptJob(ctx, repository.Adoption{Job: j, Server: live, Cutoff: now.Add(-6 * time.Second)}); !errors.Is(err, repository.ErrConflict) {
				t.Errorf("adopting a live server's job: %v; want ErrConflict", err)
			}
			if got, _ := s.GetCluster(ctx, c.ID); got.Expect() != c.Expect() {
				t.Errorf("cluster after a missed adoption = %v; want unchanged %v (no history entry either)", got.Expect(), c.Expect())
			}
			if got, _ := s.GetJob(ctx, j.ID); got.Attempt != 1 || got.ServerID != "owner" {
				t.Errorf("job after a missed adoption: attempt %d on %s; want 1 on owner", got.Attempt, got.ServerID)
			}
		})
	}
}

// Handing a job off keeps the cluster held by it; the job can then be
// adopted even though its server is alive, and a handed-off job that
// another server adopted cannot be handed off again by its old owner.
func TestHandOffJob(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		owner, _ := s.RegisterServer(ctx, "owner")
		c, j := claimOn(t, s, "a", owner)
		got, err := s.HandOffJob(ctx, repository.HandOff{Job: j, Server: "owner", Message: "server owner stopping at join_node"})
		if err != nil || !got.HandedOff || got.Status != repository.JobInProgress {
			t.Fatalf("HandOffJob = %+v, %v; want the job IN_PROGRESS and handed off", got, err)
		}
		held, _ := s.GetCluster(ctx, c.ID)
		if held.State != c.State || held.CurrentOperation != j.ID {
			t.Errorf("cluster after hand-off = %v; want still %s held by %s", held.Expect(), c.State, j.ID)
		}
		evs, _ := s.ListEvents(ctx, c.ID, 0, 100)
		if last := evs[len(evs)-1]; last.Name != repository.OperationHandedOff || last.Operation != j.ID || last.Server != "owner" {
			t.Errorf("last history entry = %+v; want OPERATION_HANDED_OFF of %s by owner", last, j.ID)
		}
		peer, _ := s.RegisterServer(ctx, "peer")
		// The owner is alive (a cutoff far in the past): only the hand-off
		// lets the peer adopt.
		adopted, err := s.AdoptJob(ctx, repository.Adoption{Job: got, Server: peer, Cutoff: time.Now().Add(-time.Hour)})
		if err != nil || adopted.Attempt != 2 || adopted.HandedOff || adopted.ServerID != "peer" {
			t.Fatalf("adopting the handed-off job = %+v, %v; want attempt 2 on peer, no longer handed off", adopted, err)
		}
		var jc *repository.JobConflictError
		if _, err := s.HandOffJob(ctx, repository.HandOff{Job: j, Server: "owner"}); !errors.As(err, &jc) {
			t.Errorf("the old owner handing the adopted job off again: %v; want a JobConflictError", err)
		}
		// A job whose cluster it no longer holds cannot be handed off.
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobSucceeded, Attempt: 2,
			Release: &repository.Transition{ClusterID: c.ID, Expect: mustCluster(t, s, c.ID).Expect(), Event: lifecycle.OperationSucceeded}}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.HandOffJob(ctx, repository.HandOff{Job: adopted, Server: "peer"}); !errors.Is(err, repository.ErrNotHeld) {
			t.Errorf("handing off a job that released its cluster: %v; want ErrNotHeld", err)
		}
	})
}

func mustCluster(t *testing.T, s *repository.Store, id string) repository.Cluster {
	t.Helper()
	c, err := s.GetCluster(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// 16 live servers race to adopt the same dead server's jobs from the same
// read: exactly one wins each job, the others lose a compare-and-set (never
// another error), and the job is at attempt 2.
func TestAdoptRace(t *testing.T) {
	const racers, rounds = 16, 40
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		dead, _ := s.RegisterServer(ctx, "dead")
		var adopters []repository.Server
		for i := range racers {
			srv, _ := s.RegisterServer(ctx, fmt.Sprintf("live-%d", i))
			adopters = append(adopters, srv)
		}
		cutoff := time.Now().Add(time.Hour) // everyone's heartbeat is older: the dead server is dead
		var lost atomic.Int64
		for round := range rounds {
			c, j := claimOn(t, s, fmt.Sprintf("race-%d", round), dead)
			var wins atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, err := s.AdoptJob(ctx, repository.Adoption{Job: j, Server: adopters[i], Cutoff: cutoff})
					switch {
					case err == nil:
						wins.Add(1)
					case errors.Is(err, repository.ErrConflict):
						lost.Add(1)
					default:
						t.Errorf("round %d: an adoption failed with something other than a lost race: %v", round, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if wins.Load() != 1 {
				t.Fatalf("round %d: %d adoptions won; want exactly 1", round, wins.Load())
			}
			got, _ := s.GetJob(ctx, j.ID)
			after, _ := s.GetCluster(ctx, c.ID)
			if got.Attempt != 2 || after.Version != c.Version+1 || after.CurrentOperation != j.ID {
				t.Fatalf("round %d: job at attempt %d, cluster %v; want attempt 2, held by %s at v%d", round, got.Attempt, after.Expect(), j.ID, c.Version+1)
			}
		}
		t.Logf("%s: %d rounds x %d adopters: %d lost races", t.Name(), rounds, racers, lost.Load())
	})
}
