package scanner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// fakeStore is the little of a repository the loops' tests need: a fixed
// set of clusters, no jobs, and a count of the reconciliation reads. It
// stands for plain reads only: the CAS the Recoverer's calls make is the
// repository's, and is tested there.
type fakeStore struct {
	Store
	mu       sync.Mutex
	clusters map[string]repository.Cluster
	orphans  []repository.Cluster
	sweeps   int // UnheldClusters calls
	changes  int // ChangedUnheldClusters calls
	// orphanReads lists the orphan reads: "whole" (Orphans) or "since" (OrphansSince).
	orphanReads []string
}

func (s *fakeStore) InProgressOwners(context.Context) (repository.Owners, error) {
	return repository.Owners{}, nil
}

func (s *fakeStore) FailJobsOfDeadServers(context.Context, repository.Server, time.Time, *repository.Offer, string, string) (int64, int64, error) {
	return 0, 0, nil
}

func (s *fakeStore) Orphans(context.Context, int) ([]repository.Cluster, map[string]repository.Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.orphanReads = append(s.orphanReads, "whole")
	return s.orphans, nil, nil
}

// OrphansSince returns every orphan, as if each held one's job had just
// ended: the fake keeps no jobs.
func (s *fakeStore) OrphansSince(context.Context, time.Time, int) ([]repository.Cluster, map[string]repository.Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.orphanReads = append(s.orphanReads, "since")
	return s.orphans, nil, nil
}

func (s *fakeStore) InProgressJobsWithoutResource(context.Context) ([]repository.Job, error) {
	return nil, nil
}

func (s *fakeStore) GetCluster(_ context.Context, id string) (repository.Cluster, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clusters[id]
	if !ok {
		return c, fmt.Errorf("cluster %s: %w", id, repository.ErrNotFound)
	}
	return c, nil
}

// resting lists the clusters reconciliation may read, in id order.
func (s *fakeStore) resting() []repository.Cluster {
	var out []repository.Cluster
	for _, c := range s.clusters {
		if reconcilable(c) {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b repository.Cluster) int { return cmpString(a.ID, b.ID) })
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (s *fakeStore) UnheldClusters(context.Context, []lifecycle.State, string, int) ([]repository.Cluster, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweeps++
	return s.resting(), nil
}

// ChangedUnheldClusters says nothing changed: the machines of a driver
// that are not rows of clusterd's database change unseen.
func (s *fakeStore) ChangedUnheldClusters(context.Context, []lifecycle.State, time.Time, int) ([]repository.Cluster, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changes++
	return nil, nil
}

func (s *fakeStore) PurgeJobs(context.Context, time.Time, int) (int64, error) { return 0, nil }

// reads returns the counts of sweep and change reads so far.
func (s *fakeStore) reads() (sweeps, changes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sweeps, s.changes
}

// fakeMachines is infrastructure whose machines a test sets.
type fakeMachines struct {
	mu sync.Mutex
	ms []infra.Machine
}

func (f *fakeMachines) Machines(_ context.Context, clusterIDs ...string) ([]infra.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []infra.Machine
	for _, m := range f.ms {
		if slices.Contains(clusterIDs, m.ClusterID) {
			out = append(out, m)
		}
	}
	return out, nil
}

func (f *fakeMachines) set(ms ...infra.Machine) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ms = ms
}

// recorder is a Recoverer that records each call as "Method cluster".
// afterOrphan, when set, runs at the end of RecoverOrphan: a recovery job
// that ends before RecoverOrphan's caller goes on.
type recorder struct {
	mu          sync.Mutex
	calls       []string
	afterOrphan func(repository.Cluster)
	// orphanErr is what RecoverOrphan returns.
	orphanErr error
}

func (r *recorder) record(method string, c repository.Cluster) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, method+" "+c.ID)
	return nil
}

// took returns the calls since the last took.
func (r *recorder) took() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

func (r *recorder) RecoverOrphan(_ context.Context, c repository.Cluster, _ repository.Job, _ string) error {
	err := r.record("RecoverOrphan", c)
	if r.afterOrphan != nil {
		r.afterOrphan(c)
	}
	if err == nil {
		r.mu.Lock()
		err = r.orphanErr
		r.mu.Unlock()
	}
	return err
}
func (r *recorder) RetryDestroy(_ context.Context, c repository.Cluster, _ string) error {
	return r.record("RetryDestroy", c)
}
func (r *recorder) MarkFaulty(_ context.Context, c repository.Cluster, _ string) error {
	return r.record("MarkFaulty", c)
}
func (r *recorder) RecoverAlert(_ context.Context, c repository.Cluster) error {
	return r.record("RecoverAlert", c)
}
func (r *recorder) StopAlert(_ context.Context, c repository.Cluster) error {
	return r.record("StopAlert", c)
}

// clock is a time a test moves by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// loopRig is a Scanner on the fakes, with ten minutes between
// reconciliations.
type loopRig struct {
	s     *Scanner
	store *fakeStore
	infra *fakeMachines
	rec   *recorder
	clock *clock
}

func newLoopRig(clusters ...repository.Cluster) *loopRig {
	r := &loopRig{store: &fakeStore{clusters: map[string]repository.Cluster{}}, infra: &fakeMachines{}, rec: &recorder{},
		clock: &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}
	for _, c := range clusters {
		r.store.clusters[c.ID] = c
	}
	r.s = New(Config{Store: r.store, Recoverer: r.rec, Infra: r.infra, Self: repository.Server{ID: "self"},
		ReconcileInterval: 10 * time.Minute, Clock: r.clock.now, Logger: slog.New(slog.DiscardHandler)})
	return r
}

// pass runs a pass and fails the test on any error it met.
func (r *loopRig) pass(t *testing.T) Report {
	t.Helper()
	rep := r.s.Pass(context.Background())
	if len(rep.Errors) > 0 || rep.Skipped != "" {
		t.Fatalf("pass: errors %v, skipped %q; want neither", rep.Errors, rep.Skipped)
	}
	return rep
}

func running(id string) repository.Cluster {
	return repository.Cluster{ID: id, State: lifecycle.Running, Spec: repository.Spec{KubernetesVersion: "1.30.2"}}
}

func machine(cluster string, p infra.Power) infra.Machine {
	return infra.Machine{ID: cluster + "-m1", ClusterID: cluster, Power: p, Joined: true, KubernetesVersion: "1.30.2"}
}

// A machine that stops between reconciliations is found at the next pass
// once its cluster is observed, not a reconcile interval later; gone
// clusters and clusters an operation holds are left alone.
func TestObserveReconcilesAtTheNextPass(t *testing.T) {
	held := running("held")
	held.CurrentOperation = "j"
	r := newLoopRig(running("a"), running("b"), held)
	r.infra.set(machine("a", infra.PowerRunning), machine("b", infra.PowerRunning), machine("held", infra.PowerRunning))
	r.pass(t) // the first reconciliation: all fine
	if calls := r.rec.took(); len(calls) != 0 {
		t.Fatalf("first pass, every machine running: %v; want no call", calls)
	}

	r.infra.set(machine("a", infra.PowerStopped), machine("b", infra.PowerStopped), machine("held", infra.PowerStopped))
	r.clock.add(time.Second)
	r.pass(t)
	if calls := r.rec.took(); len(calls) != 0 {
		t.Fatalf("a pass before reconciliation is due, nothing observed: %v; want no call", calls)
	}
	r.s.Observe("a", "gone", "held")
	r.clock.add(time.Second)
	if rep := r.pass(t); rep.Reconciled != 1 {
		t.Errorf("the pass after Observe reconciled %d clusters; want 1", rep.Reconciled)
	}
	if calls, want := r.rec.took(), []string{"MarkFaulty a"}; !slices.Equal(calls, want) {
		t.Errorf("the pass after Observe(a, gone, held): %v; want %v (b not observed, held held by an operation)", calls, want)
	}
	r.clock.add(time.Second)
	r.pass(t)
	if calls := r.rec.took(); len(calls) != 0 {
		t.Errorf("the pass after that: %v; want no call (an observation is used once)", calls)
	}
}

// A recovery of an orphaned operation that ends (ALERT, its machines all
// running) before the same pass reconciles is not recovered again by that
// pass: the ALERT stays until the next due reconciliation (or the next pass
// for an observed cluster), not one pass.
func TestPassReconcilesNoClusterItRecovered(t *testing.T) {
	orphan := running("o")
	orphan.State, orphan.CurrentOperation = lifecycle.Scaling, "dead"
	r := newLoopRig(orphan)
	r.store.orphans = []repository.Cluster{orphan}
	r.infra.set(machine("o", infra.PowerRunning))
	r.rec.afterOrphan = func(c repository.Cluster) {
		r.store.mu.Lock()
		defer r.store.mu.Unlock()
		c.State, c.CurrentOperation = lifecycle.Alert, ""
		r.store.clusters[c.ID] = c
		r.store.orphans = nil
	}
	r.s.Observe("o")
	r.pass(t) // the first pass reconciles, as a due one
	if calls, want := r.rec.took(), []string{"RecoverOrphan o"}; !slices.Equal(calls, want) {
		t.Fatalf("the pass that recovered o: %v; want %v", calls, want)
	}
	r.clock.add(time.Second)
	r.pass(t)
	if calls, want := r.rec.took(), []string{"RecoverAlert o"}; !slices.Equal(calls, want) {
		t.Errorf("the next pass, o observed before: %v; want %v", calls, want)
	}
	r.clock.add(time.Second)
	r.pass(t)
	if calls := r.rec.took(); len(calls) != 0 {
		t.Errorf("the pass after that, before reconciliation is due: %v; want no call", calls)
	}
}

// More clusters observed at once than Observe keeps: the ones it keeps are
// reconciled at the next pass, and every resting cluster at the next due
// reconciliation, by a sweep rather than by the changes since the last.
func TestObserveOverflowSweeps(t *testing.T) {
	var clusters []repository.Cluster
	var ms []infra.Machine
	var ids []string
	for i := range observeLimit + 1 {
		c := running(fmt.Sprintf("c%03d", i))
		clusters, ids = append(clusters, c), append(ids, c.ID)
		ms = append(ms, machine(c.ID, infra.PowerRunning))
	}
	r := newLoopRig(clusters...)
	r.infra.set(ms...)
	r.pass(t) // the first reconciliation sweeps
	r.clock.add(10 * time.Minute)
	r.pass(t) // a due reconciliation between sweeps reads the changes
	if sweeps, changes := r.store.reads(); sweeps != 1 || changes != 1 {
		t.Fatalf("after two due reconciliations: %d sweep and %d change reads; want 1 and 1", sweeps, changes)
	}
	for i := range ms {
		ms[i].Power = infra.PowerStopped
	}
	r.infra.set(ms...)
	r.s.Observe(ids...)
	r.clock.add(time.Second)
	if rep := r.pass(t); rep.Reconciled != observeLimit {
		t.Errorf("the pass after observing %d clusters reconciled %d; want %d", len(ids), rep.Reconciled, observeLimit)
	}
	r.rec.took()
	r.clock.add(10 * time.Minute)
	rep := r.pass(t)
	if sweeps, _ := r.store.reads(); sweeps != 2 {
		t.Errorf("the next due reconciliation made %d sweep reads in all; want 2 (a new sweep)", sweeps)
	}
	if rep.Reconciled != len(ids) {
		t.Errorf("the sweep reconciled %d clusters; want all %d", rep.Reconciled, len(ids))
	}
}

// Destroys that failed and released their clusters are retried destroyLimit
// per pass, each then waiting its backoff; a destroy whose job died holding
// its cluster is taken over at once, outside that budget.
func TestDestroyRetriesAreBudgetedAndBackedOff(t *testing.T) {
	r := newLoopRig()
	for i := range destroyLimit + 2 {
		r.store.orphans = append(r.store.orphans, repository.Cluster{ID: fmt.Sprintf("d%02d", i), State: lifecycle.Destroying})
	}
	r.store.orphans = append(r.store.orphans, repository.Cluster{ID: "held", State: lifecycle.Destroying, CurrentOperation: "gone"})
	count := func() (destroys int, held bool) {
		for _, c := range r.rec.took() {
			switch c {
			case "RetryDestroy held":
				held = true
			default:
				destroys++
			}
		}
		return destroys, held
	}
	for i, want := range []struct {
		after    time.Duration
		destroys int
	}{
		{0, destroyLimit},                // +0: the budget
		{0, 2},                           // +0: the rest
		{time.Second, 0},                 // +1s: all wait 2 s
		{time.Second, destroyLimit},      // +2s: the first ten, then 4 s
		{time.Second, 2},                 // +3s: the other two, then 4 s
		{2 * time.Second, 0},             // +5s
		{time.Second, destroyLimit},      // +6s: the first ten, then 8 s
		{time.Second, 2},                 // +7s: the other two, then 8 s
		{time.Nanosecond, 0},             // +7s
		{10 * time.Minute, destroyLimit}, // past every backoff: the budget
		{0, 2},                           // the rest
	} {
		r.clock.add(want.after)
		r.pass(t)
		destroys, held := count()
		if destroys != want.destroys || !held {
			t.Fatalf("pass %d: retried %d released destroys, the held one %v; want %d, and the held one", i, destroys, held, want.destroys)
		}
	}
}

// Each decision is carried out by its own Recoverer call.
func TestApplyCallsTheRecoverer(t *testing.T) {
	r := newLoopRig()
	c := repository.Cluster{ID: "c"}
	for _, tc := range []struct {
		kind actionKind
		want []string
	}{
		{none, nil},
		{recoverOrphan, []string{"RecoverOrphan c"}},
		{retryDestroy, []string{"RetryDestroy c"}},
		{markFaulty, []string{"MarkFaulty c"}},
		{recoverAlert, []string{"RecoverAlert c"}},
		{stopAlert, []string{"StopAlert c"}},
	} {
		var rep Report
		r.s.apply(context.Background(), &rep, c, action{kind: tc.kind})
		if got := r.rec.took(); !slices.Equal(got, tc.want) || rep.Recovered != len(tc.want) {
			t.Errorf("apply(%s): calls %v, recovered %d; want %v", tc.kind, got, rep.Recovered, tc.want)
		}
	}
}

// Between due passes the orphans are read from where the last read began
// once that pass dealt with all it read; after a pass whose recovery
// failed, the next read is whole, so the orphan is not left until the next
// due pass.
func TestOrphansAreReadWholeAfterAPassThatLeftOne(t *testing.T) {
	r := newLoopRig()
	r.store.orphans = []repository.Cluster{{ID: "o", State: lifecycle.Scaling, CurrentOperation: "ended"}}
	for i, step := range []struct {
		fail error
		want string
	}{
		{nil, "whole"}, // the first pass is due
		{nil, "since"},
		{errors.New("the database went away"), "since"},
		{nil, "whole"},
		{nil, "since"},
	} {
		r.rec.mu.Lock()
		r.rec.orphanErr = step.fail
		r.rec.mu.Unlock()
		r.clock.add(time.Second)
		rep := r.s.Pass(context.Background())
		if failed := len(rep.Errors) > 0; failed != (step.fail != nil) {
			t.Fatalf("pass %d: errors %v; want some only when the recovery fails", i, rep.Errors)
		}
		r.store.mu.Lock()
		got := r.store.orphanReads[len(r.store.orphanReads)-1]
		r.store.mu.Unlock()
		if got != step.want {
			t.Errorf("pass %d read the orphans %s; want %s", i, got, step.want)
		}
	}
}
