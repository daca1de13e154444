package repository_test

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// noon is when the clocked tests begin.
var noon = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// openAt opens a store on b whose clock reads *now, so that a test moves
// time by setting it.
func openAt(t *testing.T, b repotest.Backend, now *time.Time) *repository.Store {
	t.Helper()
	return repotest.Open(t, b, repository.WithClock(func() time.Time { return *now }))
}

func errJSON(reason string) string { return `{"code":14,"message":"` + reason + `"}` }

// claimOn claims a RUNNING cluster for a scale run by server srv.
func claimOn(t *testing.T, s *repository.Store, name string, srv repository.Server) (repository.Cluster, repository.Job) {
	t.Helper()
	c := running(t, s, name)
	c, j, err := s.Claim(ctxT(t), repository.Transition{ClusterID: c.ID, Expect: c.Expect(), Event: lifecycle.ScaleUpRequested},
		repository.NewJob{Kind: "scale", Params: `{"workers":2}`, ServerID: srv.ID, ServerIncarnation: srv.Incarnation, Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return c, j
}

func TestFailJobsOfDeadServers(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			now := noon
			s := openAt(t, b, &now)
			ctx := ctxT(t)
			oldSelf, _ := s.RegisterServer(ctx, "me")
			_, restartedJob := claimOn(t, s, "a", oldSelf)
			self, _ := s.RegisterServer(ctx, "me") // this process, a new incarnation
			_, mine := claimOn(t, s, "b", self)
			peer, _ := s.RegisterServer(ctx, "peer")
			_, peerJob := claimOn(t, s, "c", peer)
			dead, _ := s.RegisterServer(ctx, "dead")
			_, deadJob := claimOn(t, s, "d", dead)
			_, deadJob2 := claimOn(t, s, "e", dead)

			// 10 s later: everyone but "dead" heartbeats.
			now = now.Add(10 * time.Second)
			for _, srv := range []repository.Server{self, peer} {
				if _, err := s.Heartbeat(ctx, srv); err != nil {
					t.Fatal(err)
				}
			}
			restarted, stopped, err := s.FailJobsOfDeadServers(ctx, self, now.Add(-6*time.Second), nil, errJSON("server restarted"), errJSON("owner server stopped"))
			if err != nil || restarted != 1 || stopped != 2 {
				t.Fatalf("FailJobsOfDeadServers = %d restarted, %d stopped, %v; want 1, 2", restarted, stopped, err)
			}
			want := map[string]repository.JobStatus{restartedJob.ID: repository.JobFailed, mine.ID: repository.JobInProgress,
				peerJob.ID: repository.JobInProgress, deadJob.ID: repository.JobFailed, deadJob2.ID: repository.JobFailed}
			for id, st := range want {
				j, _ := s.GetJob(ctx, id)
				if j.Status != st {
					t.Errorf("job %s (server %s) = %s; want %s", id, j.ServerID, j.Status, st)
				}
			}
			if j, _ := s.GetJob(ctx, restartedJob.ID); j.Error != errJSON("server restarted") {
				t.Errorf("restarted job error = %s", j.Error)
			}
			if j, _ := s.GetJob(ctx, deadJob.ID); j.Error != errJSON("owner server stopped") {
				t.Errorf("dead server's job error = %s", j.Error)
			}
			// Each failed job's end is in the change feed, once; the running
			// jobs' are not.
			ends := map[string]int{}
			for _, c := range readAll(t, s, repository.ChangeQuery{}) {
				if c.Kind == repository.ChangeJobEnded {
					ends[c.Operation]++
				}
			}
			for id, st := range want {
				if n := ends[id]; (st == repository.JobFailed) != (n == 1) || n > 1 {
					t.Errorf("job %s (%s): %d ends in the feed", id, st, n)
				}
			}
			// Running it again changes nothing: the CAS is on IN_PROGRESS.
			if r, st, _ := s.FailJobsOfDeadServers(ctx, self, now.Add(-6*time.Second), nil, errJSON("server restarted"), errJSON("owner server stopped")); r+st != 0 {
				t.Errorf("second pass failed %d more jobs", r+st)
			}
		})
	}
}

// With adoption, a pass fails only the jobs of dead servers that adoption
// will not take: out of attempts or time, or offered and not adopted; a job
// that may still be adopted is left for the next offer, whether its owner
// died or restarted after this pass made its offer, or it was created since.
func TestFailJobsOfDeadServersAfterAnOffer(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			now := noon
			s := openAt(t, b, &now)
			ctx := ctxT(t)
			self, _ := s.RegisterServer(ctx, "me")
			dead, _ := s.RegisterServer(ctx, "dead")
			_, adoptable := claimOn(t, s, "a", dead)
			_, notAdopted := claimOn(t, s, "b", dead)
			began := now.Add(time.Second)
			now = began.Add(time.Second)
			_, later := claimOn(t, s, "c", dead) // created after the offer
			now = now.Add(10 * time.Second)
			if _, err := s.Heartbeat(ctx, self); err != nil {
				t.Fatal(err)
			}
			cutoff := now.Add(-6 * time.Second)
			status := func(j repository.Job) repository.JobStatus {
				got, err := s.GetJob(ctx, j.ID)
				if err != nil {
					t.Fatal(err)
				}
				return got.Status
			}
			offer := &repository.Offer{Before: began, Now: now, MaxAttempts: 3, NotAdopted: []string{notAdopted.ID}}
			if _, stopped, err := s.FailJobsOfDeadServers(ctx, self, cutoff, offer, "", errJSON("owner server stopped")); err != nil || stopped != 1 {
				t.Fatalf("failed %d, %v; want only the job offered and not adopted", stopped, err)
			}
			if status(notAdopted) != repository.JobFailed || status(adoptable) != repository.JobInProgress || status(later) != repository.JobInProgress {
				t.Errorf("after the offer: %s %s %s; want FAILED, and the adoptable and the later job IN_PROGRESS",
					status(notAdopted), status(adoptable), status(later))
			}
			// Out of time (its deadline passed) or out of attempts, a job
			// is no longer adoptable, and fails; the later one still waits.
			offer = &repository.Offer{Before: began, Now: time.Now().Add(2 * time.Hour), MaxAttempts: 3}
			if _, stopped, err := s.FailJobsOfDeadServers(ctx, self, cutoff, offer, "", errJSON("owner server stopped")); err != nil || stopped != 1 || status(adoptable) != repository.JobFailed {
				t.Errorf("past the deadline: failed %d, %v, job %s; want it failed", stopped, err, status(adoptable))
			}
			offer = &repository.Offer{Before: now, Now: now, MaxAttempts: 1}
			if _, stopped, err := s.FailJobsOfDeadServers(ctx, self, cutoff, offer, "", errJSON("owner server stopped")); err != nil || stopped != 1 || status(later) != repository.JobFailed {
				t.Errorf("out of attempts: failed %d, %v, job %s; want it failed", stopped, err, status(later))
			}
		})
	}
}

// InProgressOwners lists each owner of jobs in progress once, in order,
// with its server's row when there is one, and says when a job is handed
// off; an owner whose jobs all ended is no longer listed.
func TestInProgressOwners(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			now := noon
			s := openAt(t, b, &now)
			ctx := ctxT(t)
			oldSelf, _ := s.RegisterServer(ctx, "me")
			claimOn(t, s, "a", oldSelf)
			self, _ := s.RegisterServer(ctx, "me")
			claimOn(t, s, "b", self)
			claimOn(t, s, "c", self)
			peer, _ := s.RegisterServer(ctx, "peer")
			_, peerJob := claimOn(t, s, "d", peer)
			ghost := repository.Server{ID: "ghost", Incarnation: "ghost-1"} // never registered
			claimOn(t, s, "e", ghost)

			got, err := s.InProgressOwners(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mine := []repository.JobOwner{{ServerID: "me", Incarnation: oldSelf.Incarnation}, {ServerID: "me", Incarnation: self.Incarnation}}
			slices.SortFunc(mine, func(a, b repository.JobOwner) int { return strings.Compare(a.Incarnation, b.Incarnation) })
			want := append([]repository.JobOwner{{ServerID: "ghost", Incarnation: "ghost-1"}}, mine...)
			want = append(want, repository.JobOwner{ServerID: "peer", Incarnation: peer.Incarnation})
			if !slices.Equal(got.Jobs, want) || got.More || got.HandedOff {
				t.Fatalf("owners = %+v; want %+v, none handed off", got, want)
			}
			if len(got.Servers) != 2 || got.Servers["me"].Incarnation != self.Incarnation || got.Servers["peer"].Incarnation != peer.Incarnation {
				t.Errorf("servers = %+v; want the rows of me (incarnation %s) and peer, none of ghost", got.Servers, self.Incarnation)
			}

			if _, err := s.HandOffJob(ctx, repository.HandOff{Job: peerJob, Server: peer.ID}); err != nil {
				t.Fatal(err)
			}
			if got, err = s.InProgressOwners(ctx); err != nil || !got.HandedOff {
				t.Fatalf("after a hand-off: %+v, %v; want it seen", got, err)
			}
			// The peer's and the earlier incarnation's jobs end.
			now = now.Add(10 * time.Second)
			if _, err := s.Heartbeat(ctx, self); err != nil {
				t.Fatal(err)
			}
			if r, st, err := s.FailJobsOfDeadServers(ctx, self, now.Add(-5*time.Second), nil, "", ""); err != nil || r != 1 || st != 2 {
				t.Fatalf("FailJobsOfDeadServers = %d, %d, %v; want the earlier incarnation's job, the peer's and the ghost's", r, st, err)
			}
			got, err = s.InProgressOwners(ctx)
			want = []repository.JobOwner{{ServerID: "me", Incarnation: self.Incarnation}}
			if err != nil || !slices.Equal(got.Jobs, want) || got.HandedOff {
				t.Fatalf("after they ended: %+v, %v; want only %+v", got, err, want)
			}
		})
	}
}

func TestOwnJobsAndFailJobUnchanged(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			now := noon
			s := openAt(t, b, &now)
			ctx := ctxT(t)
			other, _ := s.RegisterServer(ctx, "other")
			claimOn(t, s, "theirs", other)
			self, _ := s.RegisterServer(ctx, "me")
			_, a := claimOn(t, s, "a", self)
			_, b := claimOn(t, s, "b", self)
			own, err := s.OwnJobsInProgress(ctx, self)
			if err != nil || len(own) != 2 || own[0].ID != a.ID || own[1].ID != b.ID {
				t.Fatalf("OwnJobsInProgress = %v, %v; want jobs %s and %s", own, err, a.ID, b.ID)
			}
			seen := own[1].UpdateTime
			now = now.Add(time.Second)
			if _, err := s.RecordProgress(ctx, b.ID, repository.Progress{Step: "power_on"}); err != nil {
				t.Fatal(err)
			}
			// b wrote since it was seen: it is alive, leave it.
			if err := s.FailJobUnchanged(ctx, b.ID, seen, errJSON("lost")); !errors.Is(err, repository.ErrConflict) {
				t.Errorf("failing a job that moved on: %v; want ErrConflict", err)
			}
			if err := s.FailJobUnchanged(ctx, a.ID, own[0].UpdateTime, errJSON("lost")); err != nil {
				t.Errorf("failing an unchanged job: %v", err)
			}
			for id, want := range map[string]repository.JobStatus{a.ID: repository.JobFailed, b.ID: repository.JobInProgress} {
				if j, _ := s.GetJob(ctx, id); j.Status != want {
					t.Errorf("job %s = %s; want %s", id, j.Status, want)
				}
			}
		})
	}
}

func TestOrphanCandidatesAndUnheldClusters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		srv, _ := s.RegisterServer(ctx, "me")
		held, _ := claimOn(t, s, "held", srv)
		idle := running(t, s, "idle")
		creating, _ := create(t, s, "creating")
		got, err := s.OrphanCandidates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, c := range got {
			ids = append(ids, c.ID)
		}
		if !slices.Contains(ids, held.ID) || !slices.Contains(ids, creating.ID) || slices.Contains(ids, idle.ID) {
			t.Errorf("orphan candidates = %v; want the held and the CREATED cluster, not the idle one", ids)
		}
		unheld, err := s.UnheldClusters(ctx, []lifecycle.State{lifecycle.Running, lifecycle.Scaling}, "", 10)
		if err != nil || len(unheld) != 1 || unheld[0].ID != idle.ID {
			t.Errorf("UnheldClusters = %v, %v; want only %s", unheld, err, idle.ID)
		}
		if next, err := s.UnheldClusters(ctx, []lifecycle.State{lifecycle.Running}, idle.ID, 10); err != nil || len(next) != 0 {
			t.Errorf("UnheldClusters after the last one = %v, %v; want none", next, err)
		}
	})
}

func TestPurgeJobsKeepsHeldAndRecent(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			now := noon
			s := openAt(t, b, &now)
			ctx := ctxT(t)
			srv, _ := s.RegisterServer(ctx, "me")
			old := running(t, s, "old") // its create job ended at "now"
			_, heldJob := claimOn(t, s, "held", srv)
			if _, err := s.FinishJob(ctx, repository.Finish{JobID: heldJob.ID, Status: repository.JobFailed}); err != nil {
				t.Fatal(err) // ended, but the cluster still names it (an orphan)
			}
			now = now.Add(8 * 24 * time.Hour)
			recent := running(t, s, "recent")
			n, err := s.PurgeJobs(ctx, now.Add(-7*24*time.Hour), 100)
			if err != nil {
				t.Fatal(err)
			}
			jobs, _ := s.ListJobs(ctx, repository.JobQuery{Limit: 100})
			var left []string
			for _, j := range jobs {
				left = append(left, j.ResourceID+"/"+j.Kind)
			}
			if n != 2 || !slices.Contains(left, heldJob.ResourceID+"/scale") || !slices.Contains(left, recent.ID+"/create") || slices.Contains(left, old.ID+"/create") {
				t.Errorf("purged %d, left %v; want the old create jobs gone, the orphan's job and the recent one kept", n, left)
			}
		})
	}
}

// OrphansSince returns the orphans Orphans returns whose job ended at or
// after its time, and every unheld cluster in an operation state; never a
// cluster whose job is IN_PROGRESS, and not one whose job ended before.
func TestOrphansSince(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		srv, _ := s.RegisterServer(ctx, "me")
		began := time.Now()
		orphan, j := claimOn(t, s, "ended", srv)
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobFailed, Error: errJSON("ended")}); err != nil {
			t.Fatal(err)
		}
		released, rj := claimOn(t, s, "released-mid-operation", srv)
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: rj.ID, Status: repository.JobFailed,
			Release: &repository.Transition{ClusterID: released.ID, Expect: released.Expect()}}); err != nil {
			t.Fatal(err)
		}
		// A job that ended, and whose cluster no longer names it.
		done, dj := claimOn(t, s, "done", srv)
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: dj.ID, Status: repository.JobSucceeded,
			Release: &repository.Transition{ClusterID: done.ID, Expect: done.Expect(), Event: lifecycle.OperationSucceeded}}); err != nil {
			t.Fatal(err)
		}
		claimOn(t, s, "scaling", srv)
		create(t, s, "creating")
		running(t, s, "idle")
		for _, c := range []struct {
			since time.Time
			want  map[string]string // cluster -> the job it names
		}{
			{began.Add(-time.Minute), map[string]string{orphan.ID: j.ID, released.ID: ""}},
			{time.Now().Add(time.Minute), map[string]string{released.ID: ""}},
		} {
			got, jobs, err := s.OrphansSince(ctx, c.since, 100)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]string{}
			for _, g := range got {
				seen[g.ID] = g.CurrentOperation
			}
			if !maps.Equal(seen, c.want) {
				t.Errorf("OrphansSince(%s after the first end): %v; want %v", c.since.Sub(began).Round(time.Second), seen, c.want)
			}
			if op := c.want[orphan.ID]; op != "" && (jobs[op].Status != repository.JobFailed || jobs[op].Kind != "scale" || jobs[op].Params != `{"workers":2}`) {
				t.Errorf("OrphansSince's job %s = %+v; want the failed scale with its parameters", op, jobs[op])
			}
		}
	})
}

// Orphans returns the clusters recovery must take over and no other: those
// that name an operation whose job has ended (whatever its end), and those
// left in an operation state by no operation. A cluster held by a job that
// is IN_PROGRESS is its job's, running or not: liveness fails the jobs of
// dead servers first, so this query never hands a running operation's
// cluster to recovery.
func TestOrphans(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		ctx := ctxT(t)
		srv, _ := s.RegisterServer(ctx, "me")
		ended := map[repository.JobStatus]repository.Job{}
		want := map[string]string{} // cluster -> the job it names, "" for none
		for _, st := range []repository.JobStatus{repository.JobSucceeded, repository.JobFailed, repository.JobCancelled} {
			c, j := claimOn(t, s, "ended-"+string(st), srv)
			// The job ends without letting go of its cluster (its server
			// died between the two writes, or could not make the second).
			if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: st, Error: errJSON("ended " + string(st))}); err != nil {
				t.Fatal(err)
			}
			ended[st], want[c.ID] = j, j.ID
		}
		held, j := claimOn(t, s, "released-mid-operation", srv)
		if _, err := s.FinishJob(ctx, repository.Finish{JobID: j.ID, Status: repository.JobFailed,
			Release: &repository.Transition{ClusterID: held.ID, Expect: held.Expect()}}); err != nil {
			t.Fatal(err)
		}
		want[held.ID] = ""
		busy := map[string]string{}
		live, liveJob := claimOn(t, s, "scaling", srv)
		creating, createJob := create(t, s, "creating")
		busy[live.ID], busy[creating.ID] = liveJob.ID, createJob.ID
		idle := running(t, s, "idle")

		got, jobs, err := s.Orphans(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]string{}
		for _, c := range got {
			seen[c.ID] = c.CurrentOperation
			if op, ok := busy[c.ID]; ok {
				t.Errorf("Orphans returned %s (%s), held by job %s, which is IN_PROGRESS; want it left to its job", c.ID, c.State, op)
			}
			if c.ID == idle.ID {
				t.Errorf("Orphans returned the resting, unheld cluster %s (%s)", c.ID, c.State)
			}
		}
		for id, op := range want {
			if got, ok := seen[id]; !ok || got != op {
				t.Errorf("Orphans: cluster %s naming %q %v; want it returned naming %q", id, got, ok, op)
			}
		}
		if len(got) != len(want) {
			t.Errorf("Orphans returned %d clusters; want %d", len(got), len(want))
		}
		for st, j := range ended {
			if g := jobs[j.ID]; g.Status != st || g.Kind != "scale" || g.Error != errJSON("ended "+string(st)) || g.Params != `{"workers":2}` {
				t.Errorf("Orphans' job %s = %+v; want kind scale, %s, with its error and parameters", j.ID, g, st)
			}
		}
		if len(jobs) != len(ended) {
			t.Errorf("Orphans returned %d jobs; want the %d ended ones the orphans name", len(jobs), len(ended))
		}
	})
}
