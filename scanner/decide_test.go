package scanner

import (
	"slices"
	"testing"
	"time"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// same reports whether two decisions ask for the same thing.
func same(got, want action) bool {
	return got.kind == want.kind && got.reason == want.reason && got.orphan.ID == want.orphan.ID && got.backoff == want.backoff
}

func TestDecideOrphan(t *testing.T) {
	unheld := func(s lifecycle.State) repository.Cluster { return repository.Cluster{ID: "c", State: s} }
	held := func(s lifecycle.State) repository.Cluster {
		return repository.Cluster{ID: "c", State: s, CurrentOperation: "j"}
	}
	job := func(status repository.JobStatus, errJSON string) map[string]repository.Job {
		return map[string]repository.Job{"j": {ID: "j", Status: status, Error: errJSON}}
	}
	cases := []struct {
		name       string
		c          repository.Cluster
		jobs       map[string]repository.Job
		legacyHeld bool
		want       action
	}{
		{"its job runs", held(lifecycle.Scaling), job(repository.JobInProgress, ""), false, action{}},
		{"a job of an older server names it", unheld(lifecycle.Created), nil, true, action{}},
		{"its job failed with a message", held(lifecycle.Scaling), job(repository.JobFailed, `{"code":13,"message":"boom"}`), false,
			action{kind: recoverOrphan, reason: "operation j failed: boom", orphan: repository.Job{ID: "j"}}},
		{"its job failed without a message", held(lifecycle.Upgrading), job(repository.JobFailed, "not json"), false,
			action{kind: recoverOrphan, reason: "operation j is FAILED", orphan: repository.Job{ID: "j"}}},
		{"its job succeeded without releasing it", held(lifecycle.Starting), job(repository.JobSucceeded, ""), false,
			action{kind: recoverOrphan, reason: "operation j is SUCCEEDED", orphan: repository.Job{ID: "j"}}},
		{"its job does not exist", held(lifecycle.Stopping), nil, false,
			action{kind: recoverOrphan, reason: "operation j does not exist"}},
		{"held at rest by an ended job", held(lifecycle.Error), job(repository.JobFailed, ""), false,
			action{kind: recoverOrphan, reason: "operation j is FAILED", orphan: repository.Job{ID: "j"}}},
		{"unheld in an operation state", unheld(lifecycle.Starting), nil, false,
			action{kind: recoverOrphan, reason: "STARTING cluster held by no operation"}},
		{"unheld CREATED", unheld(lifecycle.Created), nil, false,
			action{kind: recoverOrphan, reason: "CREATED cluster held by no operation"}},
		{"unheld at rest", unheld(lifecycle.Running), nil, false, action{}},
		{"unheld ERROR", unheld(lifecycle.Error), nil, false, action{}},
		{"a failed destroy released it", unheld(lifecycle.Destroying), nil, false,
			action{kind: retryDestroy, reason: "DESTROYING cluster held by no operation", backoff: true}},
		{"its destroy died holding it", held(lifecycle.Destroying), job(repository.JobFailed, ""), false,
			action{kind: retryDestroy, reason: "operation j is FAILED"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideOrphan(tc.c, tc.jobs, tc.legacyHeld); !same(got, tc.want) {
				t.Errorf("decideOrphan = %+v; want %+v", got, tc.want)
			}
		})
	}
}

func TestDestroyBackoff(t *testing.T) {
	for _, tc := range []struct {
		attempts int
		want     time.Duration
	}{
		{1, 2 * time.Second}, {2, 4 * time.Second}, {8, 256 * time.Second}, {9, maxBackoff}, {16, maxBackoff}, {100, maxBackoff},
	} {
		if got := destroyBackoff(tc.attempts); got != tc.want {
			t.Errorf("destroyBackoff(%d) = %s; want %s", tc.attempts, got, tc.want)
		}
	}
}

// A destroy that keeps failing is retried at once, then after 2 s, then 4 s
// more, and never before its time.
func TestRetryTake(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var rt retry
	for _, step := range []struct {
		at      time.Duration
		due     bool
		retries int
	}{
		{0, true, 1},
		{time.Second, false, 1},
		{2*time.Second - time.Nanosecond, false, 1},
		{2 * time.Second, true, 2},
		{5 * time.Second, false, 2},
		{6 * time.Second, true, 3},
	} {
		var due bool
		rt, due = rt.take(t0.Add(step.at))
		if due != step.due || rt.attempts != step.retries {
			t.Fatalf("at +%s: due %v after %d retries; want due %v after %d", step.at, due, rt.attempts, step.due, step.retries)
		}
	}
}

func TestDecideReconcile(t *testing.T) {
	const v, other = "1.30.2", "1.30.5"
	m := func(id string, p infra.Power, joined bool, version string) infra.Machine {
		return infra.Machine{ID: id, ClusterID: "c", Power: p, Joined: joined, KubernetesVersion: version}
	}
	up := func(id string) infra.Machine { return m(id, infra.PowerRunning, true, v) }
	off := func(id string) infra.Machine { return m(id, infra.PowerStopped, true, v) }
	at := func(s lifecycle.State) repository.Cluster {
		return repository.Cluster{ID: "c", State: s, Spec: repository.Spec{KubernetesVersion: v}}
	}
	heldAt := func(s lifecycle.State) repository.Cluster { c := at(s); c.CurrentOperation = "j"; return c }
	const mismatch = "the machines do not match the record: "
	cases := []struct {
		name string
		c    repository.Cluster
		ms   []infra.Machine
		want action
	}{
		{"RUNNING, all fine", at(lifecycle.Running), []infra.Machine{up("m1"), up("m2")}, action{}},
		{"RUNNING, one stopped", at(lifecycle.Running), []infra.Machine{up("m1"), off("m2")},
			action{kind: markFaulty, reason: mismatch + "machine m2 is STOPPED"}},
		{"RUNNING, one not joined", at(lifecycle.Running), []infra.Machine{up("m1"), m("m2", infra.PowerRunning, false, v)},
			action{kind: markFaulty, reason: mismatch + "machine m2 has not joined"}},
		{"RUNNING, one at another version", at(lifecycle.Running), []infra.Machine{up("m1"), m("m2", infra.PowerRunning, true, other)},
			action{kind: markFaulty, reason: mismatch + "nodes run 1.30.2 on 1 node, 1.30.5 on 1 node, not the recorded 1.30.2"}},
		{"RUNNING, no machine listed", at(lifecycle.Running), nil, action{}},
		{"RUNNING, held by an operation", heldAt(lifecycle.Running), []infra.Machine{off("m1")}, action{}},
		{"STARTING, unheld, all off", at(lifecycle.Starting), []infra.Machine{off("m1")}, action{}},
		{"STOPPED, all off", at(lifecycle.Stopped), []infra.Machine{off("m1"), off("m2")}, action{}},
		{"STOPPED, one running", at(lifecycle.Stopped), []infra.Machine{off("m1"), up("m2")},
			action{kind: markFaulty, reason: "1 of 2 machines are not in the power state STOPPED wants"}},
		{"STOPPED, all off, one at another version", at(lifecycle.Stopped), []infra.Machine{off("m1"), m("m2", infra.PowerStopped, true, other)},
			action{kind: markFaulty, reason: mismatch + "nodes run 1.30.2 on 1 node, 1.30.5 on 1 node, not the recorded 1.30.2"}},
		{"ALERT, all fine", at(lifecycle.Alert), []infra.Machine{up("m1"), up("m2")},
			action{kind: recoverAlert, reason: "machines all running and nodes joined"}},
		{"ALERT, one stopped", at(lifecycle.Alert), []infra.Machine{up("m1"), off("m2")}, action{}},
		{"ALERT, one not joined", at(lifecycle.Alert), []infra.Machine{up("m1"), m("m2", infra.PowerRunning, false, v)}, action{}},
		{"ALERT, all running another version", at(lifecycle.Alert),
			[]infra.Machine{m("m1", infra.PowerRunning, true, other), m("m2", infra.PowerRunning, true, other)}, action{}},
		{"ALERT, all off", at(lifecycle.Alert), []infra.Machine{off("m1"), off("m2")},
			action{kind: stopAlert, reason: "every machine is off"}},
		{"ALERT, all off at another version", at(lifecycle.Alert),
			[]infra.Machine{m("m1", infra.PowerStopped, true, other), off("m2")}, action{}},
		{"ALERT, held by an operation", heldAt(lifecycle.Alert), []infra.Machine{up("m1")}, action{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideReconcile(tc.c, tc.ms); !same(got, tc.want) {
				t.Errorf("decideReconcile = %+v; want %+v", got, tc.want)
			}
		})
	}
}

func TestLivenessCutoff(t *testing.T) {
	began := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	const peer = 3 * time.Second
	graceful := repository.Stopped.Add(time.Second)
	for _, tc := range []struct {
		name      string
		heldSince time.Time
		want      time.Time
	}{
		{"no lease", time.Time{}, began.Add(-peer)},
		{"lease held for long", began.Add(-time.Hour), began.Add(-peer)},
		{"lease held for exactly a peer timeout", began.Add(-peer), began.Add(-peer)},
		{"lease held for less than a peer timeout", began.Add(-peer + time.Millisecond), graceful},
	} {
		if got := livenessCutoff(began, peer, tc.heldSince); !got.Equal(tc.want) {
			t.Errorf("%s: cutoff %s; want %s", tc.name, got, tc.want)
		}
	}
}

// A job is lost when two passes in a row found it IN_PROGRESS, not run by
// the runner, and unchanged.
func TestLivenessDue(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	cutoff := now.Add(-5 * time.Second)
	self := repository.Server{ID: "me", Incarnation: "me-2"}
	servers := map[string]repository.Server{
		"me":    {ID: "me", Incarnation: "me-2", HeartbeatTime: now.Add(-time.Hour)},
		"peer":  {ID: "peer", Incarnation: "peer-1", HeartbeatTime: now.Add(-time.Second)},
		"dead":  {ID: "dead", Incarnation: "dead-1", HeartbeatTime: cutoff.Add(-time.Microsecond)},
		"stop":  {ID: "stop", Incarnation: "stop-1", HeartbeatTime: repository.Stopped},
		"edge":  {ID: "edge", Incarnation: "edge-1", HeartbeatTime: cutoff},
		"fresh": {ID: "fresh", Incarnation: "fresh-1", HeartbeatTime: now},
	}
	owners := func(os ...repository.JobOwner) repository.Owners {
		return repository.Owners{Jobs: os, Servers: servers}
	}
	own := func(id, inc string) repository.JobOwner { return repository.JobOwner{ServerID: id, Incarnation: inc} }
	cases := []struct {
		name string
		o    repository.Owners
		want bool
	}{
		{"no job in progress", owners(), false},
		{"this incarnation's, whatever its heartbeat's age", owners(own("me", "me-2")), false},
		{"a live peer's", owners(own("peer", "peer-1"), own("fresh", "fresh-1")), false},
		{"a peer heartbeating at the cutoff", owners(own("edge", "edge-1")), false},
		{"a live peer's, written with no incarnation", owners(own("peer", "")), false},
		{"an earlier incarnation of this server", owners(own("me", "me-1"), own("me", "me-2")), true},
		{"this server's, written with no incarnation", owners(own("me", "")), true},
		{"a peer's earlier incarnation", owners(own("peer", "peer-0"), own("peer", "peer-1")), true},
		{"a dead peer's", owners(own("dead", "dead-1"), own("peer", "peer-1")), true},
		{"a stopped peer's", owners(own("stop", "stop-1")), true},
		{"a server with no row", owners(own("ghost", "ghost-1")), true},
		{"a handed-off job of a live peer", repository.Owners{Jobs: []repository.JobOwner{own("peer", "peer-1")}, Servers: servers, HandedOff: true}, true},
		{"more owners than were listed", repository.Owners{Jobs: []repository.JobOwner{own("peer", "peer-1")}, Servers: servers, More: true}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := livenessDue(tc.o, self, cutoff); got != tc.want {
				t.Errorf("livenessDue = %v; want %v", got, tc.want)
			}
		})
	}
}

func TestDecideLost(t *testing.T) {
	t1, t2 := time.Unix(100, 0), time.Unix(200, 0)
	own := []repository.JobStamp{{ID: "a", UpdateTime: t1}, {ID: "b", UpdateTime: t1}, {ID: "c", UpdateTime: t2}, {ID: "d", UpdateTime: t1}}
	cur := suspectJobs(own, []string{"d"})
	if want := map[string]time.Time{"a": t1, "b": t1, "c": t2}; len(cur) != len(want) || !cur["a"].Equal(t1) || !cur["c"].Equal(t2) || cur["d"] != (time.Time{}) {
		t.Fatalf("suspects = %v; want %v (the running job d left out)", cur, want)
	}
	prev := map[string]time.Time{"a": t1, "c": t1, "e": t1}
	if got, want := decideLost(prev, cur), []string{"a"}; !slices.Equal(got, want) {
		t.Errorf("lost = %v; want %v (b first suspected now, c written since, e no longer suspected)", got, want)
	}
	if got := decideLost(nil, cur); len(got) != 0 {
		t.Errorf("lost at the first pass = %v; want none", got)
	}
}

func TestPurgeCutoff(t *testing.T) {
	now := time.Date(2026, 1, 8, 0, 0, 0, 0, time.UTC)
	if got, want := purgeCutoff(now, 7*24*time.Hour), time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("purgeCutoff = %s; want %s", got, want)
	}
}

// The cursor sweeps at start, a page per pass, then reads what changed
// since the sweep began (less a margin), sweeps again after a full page of
// changes, an hour after the last sweep, and when asked to once the sweep
// under way is done.
func TestCursor(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const margin = 13 * time.Second
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	sweep := func(start time.Duration, after string) page { return page{sweepStart: at(start), after: after} }
	changes := func(since time.Time) page { return page{since: since} }
	var c cursor
	for i, step := range []struct {
		now   time.Duration
		again bool // Observe overflows before this step
		want  page
		full  bool
		last  string
	}{
		{now: 0, want: sweep(0, ""), full: true, last: "c1"},
		{now: 10 * time.Second, want: sweep(0, "c1"), full: true, last: "c2"},
		{now: 20 * time.Second, want: sweep(0, "c2"), last: "c3"},
		{now: 30 * time.Second, want: changes(at(-margin))},
		{now: 40 * time.Second, want: changes(at(30*time.Second - margin)), full: true, last: "c9"},
		{now: 50 * time.Second, want: sweep(50*time.Second, ""), full: true, last: "c1"},
		{now: 60 * time.Second, again: true, want: sweep(50*time.Second, "c1")},
		{now: 70 * time.Second, want: sweep(70*time.Second, "")},
		{now: 80 * time.Second, want: changes(at(70*time.Second - margin))},
		{now: 70*time.Second + sweepEvery - time.Nanosecond, want: changes(at(80*time.Second - margin))},
		{now: 70*time.Second + sweepEvery, want: sweep(70*time.Second+sweepEvery, "")},
	} {
		if step.again {
			c.again = true
		}
		var p page
		c, p = c.plan(at(step.now))
		if p != step.want {
			t.Fatalf("step %d (+%s): reads %+v; want %+v", i, step.now, p, step.want)
		}
		c = c.advance(p, at(step.now), margin, step.full, step.last)
	}
}

func TestDecideOrphanMachine(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const grace = 5 * time.Minute
	machine := func(cluster string, age time.Duration) infra.Machine {
		m := infra.Machine{ID: "m", ClusterID: cluster, Role: infra.RoleWorker}
		if age >= 0 {
			m.CreateTime = now.Add(-age)
		}
		return m
	}
	cluster := func(s lifecycle.State, op string) *repository.Cluster {
		return &repository.Cluster{ID: "c", State: s, CurrentOperation: op}
	}
	cases := []struct {
		name   string
		m      infra.Machine
		c      *repository.Cluster
		remove bool
		reason string
	}{
		{"a free machine", machine("", time.Hour), nil, false, ""},
		{"of a running cluster", machine("c", time.Hour), cluster(lifecycle.Running, ""), false, ""},
		{"of a cluster an operation holds", machine("c", time.Hour), cluster(lifecycle.Scaling, "j"), false, ""},
		{"of an ERROR cluster (recovery's leftovers)", machine("c", time.Hour), cluster(lifecycle.Error, ""), false, ""},
		{"of a cluster being destroyed", machine("c", time.Hour), cluster(lifecycle.Destroying, "j"), false, ""},
		{"of a DESTROYING cluster no operation holds (retried)", machine("c", time.Hour), cluster(lifecycle.Destroying, ""), false, ""},
		{"of a destroyed cluster", machine("c", time.Hour), cluster(lifecycle.Destroyed, ""), true,
			"machine m (WORKER, made 2026-01-02T02:04:05Z) outlived its cluster's destroy"},
		{"of a destroyed cluster an operation still names", machine("c", time.Hour), cluster(lifecycle.Destroyed, "j"), false, ""},
		{"of a destroyed cluster, within the grace", machine("c", grace-time.Second), cluster(lifecycle.Destroyed, ""), false, ""},
		{"of a destroyed cluster, at the grace", machine("c", grace), cluster(lifecycle.Destroyed, ""), true,
			"machine m (WORKER, made 2026-01-02T02:59:05Z) outlived its cluster's destroy"},
		{"of an unknown cluster", machine("c", time.Hour), nil, true,
			"machine m (WORKER, made 2026-01-02T02:04:05Z) names cluster c, which the database does not know"},
		{"of an unknown cluster, within the grace", machine("c", time.Minute), nil, false, ""},
		{"of unknown age", machine("c", -1), nil, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			remove, reason := decideOrphanMachine(tc.m, tc.c, now, grace)
			if remove != tc.remove || reason != tc.reason {
				t.Errorf("decideOrphanMachine = %v, %q; want %v, %q", remove, reason, tc.remove, tc.reason)
			}
		})
	}
}
