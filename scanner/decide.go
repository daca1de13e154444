package scanner

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
)

// This file holds the scanner's decisions: pure functions of what a pass
// read and of the time it was given, with no I/O and no clock, so each is
// tested by a table without a database. The loops of liveness.go,
// orphans.go, reconcile.go, purge.go and machines.go read, ask these, and
// apply what they return; where a decision moves a cluster it asks the state machine
// (package lifecycle) which events its state allows.

// actionKind is what a decision asks the scanner to do to one cluster. Each
// kind is one Recoverer call (Scanner.apply).
type actionKind int

const (
	// none leaves the cluster alone.
	none actionKind = iota
	// recoverOrphan takes over an operation whose job no live server runs
	// (Recoverer.RecoverOrphan).
	recoverOrphan
	// retryDestroy destroys a DESTROYING cluster again, in place
	// (Recoverer.RetryDestroy).
	retryDestroy
	// markFaulty sends FAULTS_DETECTED (Recoverer.MarkFaulty).
	markFaulty
	// recoverAlert sends RECOVERY_REQUESTED (Recoverer.RecoverAlert).
	recoverAlert
	// stopAlert sends STOP_REQUESTED to an ALERT cluster whose machines are
	// all off (Recoverer.StopAlert).
	stopAlert
)

// String names the kind in the scanner's log.
func (k actionKind) String() string {
	switch k {
	case recoverOrphan:
		return "recover orphan"
	case retryDestroy:
		return "retry destroy"
	case markFaulty:
		return "faults detected"
	case recoverAlert:
		return "recover"
	case stopAlert:
		return "stop"
	}
	return "nothing"
}

// action is one decision about one cluster: what to do, and why (the
// reason goes to the cluster's history).
type action struct {
	kind   actionKind
	reason string
	// orphan is the interrupted job a recoverOrphan takes over (zero when
	// the operation the cluster names does not exist).
	orphan repository.Job
	// backoff says a retryDestroy waits its turn (retry.take) and counts
	// against the pass's destroy budget: the destroy failed and released
	// the cluster, so it is garbage collection, not an orphan taken over.
	backoff bool
}

// decideOrphan decides what orphan recovery does to a cluster that the
// store's orphan query returned (SPEC §5.1): jobs maps the operations such
// clusters name to their jobs, and legacyHeld says a running job of an
// older server acts on this cluster (legacyHolds). A cluster whose job is
// IN_PROGRESS is alive (liveness already failed every job of a dead
// server); an unheld cluster is recovered only in a state with an orphan
// event (lifecycle.OrphanEvent); a DESTROYING one is destroyed again.
func decideOrphan(c repository.Cluster, jobs map[string]repository.Job, legacyHeld bool) action {
	if legacyHeld {
		return action{}
	}
	j, named := jobs[c.CurrentOperation]
	held := c.CurrentOperation != ""
	if held && named && j.Status == repository.JobInProgress {
		return action{}
	}
	ev, ok := lifecycle.OrphanEvent(c.State)
	if !held && !ok {
		return action{}
	}
	reason := orphanReason(c, j, named)
	if ok && ev == lifecycle.DestroyRequested {
		return action{kind: retryDestroy, reason: reason, backoff: !held}
	}
	return action{kind: recoverOrphan, reason: reason, orphan: j}
}

// orphanReason says why recovery takes a cluster over.
func orphanReason(c repository.Cluster, j repository.Job, named bool) string {
	switch {
	case c.CurrentOperation == "":
		return fmt.Sprintf("%s cluster held by no operation", c.State)
	case !named:
		return fmt.Sprintf("operation %s does not exist", c.CurrentOperation)
	case j.Status == repository.JobFailed && j.Error != "":
		var st struct{ Message string }
		if json.Unmarshal([]byte(j.Error), &st) == nil && st.Message != "" {
			return fmt.Sprintf("operation %s failed: %s", j.ID, st.Message)
		}
	}
	return fmt.Sprintf("operation %s is %s", j.ID, j.Status)
}

// retry is the backoff of a destroy that keeps failing: how many times the
// scanner retried it, and when it may next.
type retry struct {
	attempts int
	next     time.Time
}

// take decides whether a destroy with backoff rt is retried at now, and
// returns its backoff after that decision: unchanged when it is not due;
// one more attempt, and the next one destroyBackoff later, when it is.
func (rt retry) take(now time.Time) (retry, bool) {
	if now.Before(rt.next) {
		return rt, false
	}
	rt.attempts++
	rt.next = now.Add(destroyBackoff(rt.attempts))
	return rt, true
}

// destroyBackoff is the wait after a destroy's attempts-th retry: 2 s,
// doubling, up to maxBackoff.
func destroyBackoff(attempts int) time.Duration {
	return min(maxBackoff, time.Duration(1<<min(attempts, 16))*time.Second)
}

// restingStates are the states reconciliation compares with the machines:
// those no operation is meant to hold.
var restingStates = []lifecycle.State{lifecycle.Running, lifecycle.Stopped, lifecycle.Alert}

// reconcilable reports whether reconciliation may act on c: at rest, and
// held by no operation (the operation owns its machines until it ends).
func reconcilable(c repository.Cluster) bool {
	return c.CurrentOperation == "" && slices.Contains(restingStates, c.State)
}

// decideReconcile decides what reconciliation does to a cluster given the
// machines the infrastructure listed for it (SPEC §5.2), asking the state
// machine which events its state allows; a cluster that is not
// reconcilable, or of which no machine was listed, is left alone.
//
// A cluster that vouches for its machines (RUNNING, lifecycle.Healthy) is
// compared machine by machine with its record, not only with its other
// machines: each must run, have joined and run the recorded Kubernetes
// version (infra.Mismatch, the check an operation's end makes too), or the
// cluster goes to ALERT naming what does not match. An ALERT cluster is
// brought back only when its machines match the record, so nodes that all
// run a version the record does not (an upgrade cancelled after its last
// node) keep it in ALERT until an upgrade records it; nor is such a cluster
// stopped when its machines are all off. A STOPPED cluster's nodes are the
// record's too (lifecycle.Versioned): off, and at the recorded version.
func decideReconcile(c repository.Cluster, ms []infra.Machine) action {
	if !reconcilable(c) || len(ms) == 0 {
		return action{}
	}
	allows := func(e lifecycle.Event) bool { _, err := lifecycle.Next(c.State, e); return err == nil }
	running := 0
	for _, m := range ms {
		if m.Power == infra.PowerRunning {
			running++
		}
	}
	mismatch := infra.Mismatch(ms, c.Spec.KubernetesVersion)
	versionsOff := infra.VersionsOff(ms, c.Spec.KubernetesVersion)
	switch {
	case allows(lifecycle.FaultsDetected) && lifecycle.Healthy(c.State):
		if mismatch != "" {
			return action{kind: markFaulty, reason: "the machines do not match the record: " + mismatch}
		}
	case allows(lifecycle.FaultsDetected):
		// STOPPED wants every machine off, at the recorded version.
		if running > 0 {
			return action{kind: markFaulty,
				reason: fmt.Sprintf("%d of %d machines are not in the power state %s wants", running, len(ms), c.State)}
		}
		if versionsOff != "" && lifecycle.Versioned(c.State) {
			return action{kind: markFaulty, reason: "the machines do not match the record: " + versionsOff}
		}
	case allows(lifecycle.RecoveryRequested) && mismatch == "":
		return action{kind: recoverAlert, reason: "machines all running and nodes joined"}
	case allows(lifecycle.StopRequested) && running == 0 && versionsOff == "":
		// Not on nodes the record does not describe: the stop would end
		// ALERT again (Settle); an upgrade is what brings such a cluster back.
		return action{kind: stopAlert, reason: "every machine is off"}
	}
	return action{}
}

// livenessCutoff is the liveness cutoff of a pass that began at began: a
// server whose last heartbeat is older is dead. A peer is dead when it
// wrote no heartbeat for peerTimeout during which this server's own
// heartbeats were accepted, since heldSince (Lease.HeldSince; zero without
// a lease). Until this server has held its lease that long (after its
// start, or after a heartbeat it missed, as in a database outage, when
// every peer's heartbeat is old too), only servers that stopped gracefully
// are dead; earlier incarnations of this server and handed-off jobs do not
// depend on the cutoff.
func livenessCutoff(began time.Time, peerTimeout time.Duration, heldSince time.Time) time.Time {
	cutoff := began.Add(-peerTimeout)
	if heldSince.After(cutoff) {
		// Stopped servers' heartbeat is repository.Stopped; a second later
		// is still long before any live heartbeat, and survives the
		// database's time precision.
		return repository.Stopped.Add(time.Second)
	}
	return cutoff
}

// livenessDue says whether a job in progress may be one that liveness
// adopts or fails, from the owners of the jobs in progress (o, read by
// repository.Store.InProgressOwners) judged as FailJobsOfDeadServers and
// AdoptableJobs judge a job's owner at cutoff: a job is handed off, or
// belongs to another incarnation of this server, or to a server with no
// row, with another incarnation in its row (a job that names none matches
// any), or with a heartbeat older than cutoff. Only then does a pass read
// the jobs themselves, which visits every job in progress; an owner that
// dies after o was read is judged by the next pass.
func livenessDue(o repository.Owners, self repository.Server, cutoff time.Time) bool {
	if o.HandedOff || o.More {
		return true
	}
	for _, j := range o.Jobs {
		if j.ServerID == self.ID {
			if j.Incarnation != self.Incarnation {
				return true
			}
			continue
		}
		srv, ok := o.Servers[j.ServerID]
		if !ok || (j.Incarnation != "" && j.Incarnation != srv.Incarnation) || srv.HeartbeatTime.Before(cutoff) {
			return true
		}
	}
	return false
}

// suspectJobs are this server's own IN_PROGRESS jobs (own) that its runner
// does not run (running, listed before own was read), with the update time
// each had.
func suspectJobs(own []repository.JobStamp, running []string) map[string]time.Time {
	runs := map[string]bool{}
	for _, id := range running {
		runs[id] = true
	}
	out := map[string]time.Time{}
	for _, j := range own {
		if !runs[j.ID] {
			out[j.ID] = j.UpdateTime
		}
	}
	return out
}

// decideLost picks, in id order, the suspects (suspectJobs) of this pass,
// cur, that the last pass suspected too, prev, and that wrote nothing in
// between: the jobs the runner has lost. A job whose claim commits just as
// a pass runs (not yet handed to the runner) is suspected once, then runs,
// so it is never taken for lost; no job's age is involved.
func decideLost(prev, cur map[string]time.Time) []string {
	var lost []string
	for id, seen := range cur {
		if before, ok := prev[id]; ok && before.Equal(seen) {
			lost = append(lost, id)
		}
	}
	sort.Strings(lost)
	return lost
}

// purgeCutoff is the time before which finished jobs (and the
// infrastructure's call log) are purged, for a pass at now.
func purgeCutoff(now time.Time, retention time.Duration) time.Time {
	return now.Add(-retention)
}

// sweepEvery is how often reconciliation sweeps every resting cluster
// again, however little changed: a safety net under the change tracking
// (update times stamped by several servers' clocks).
const sweepEvery = time.Hour

// cursor is where reconciliation stands in its walk of the resting
// clusters. It sweeps every one of them a page per pass (at start, after a
// backlog, when asked to, and every sweepEvery), and in between looks only
// at the clusters that changed, or whose machines changed, since since.
type cursor struct {
	// after is where the sweep's next page starts.
	after string
	// since is where the next read of changes starts.
	since time.Time
	// sweepStart is when the sweep began (zero: not sweeping), lastSweep
	// when the last one ended.
	sweepStart, lastSweep time.Time
	// again asks for a sweep once the current one, if any, is done (more
	// clusters were observed than Observe keeps).
	again bool
}

// page is the read one reconciliation makes: the sweep's page after after
// (sweepStart set), or the clusters changed since since.
type page struct {
	sweepStart time.Time
	after      string
	since      time.Time
}

// sweeping reports whether p is a page of a sweep.
func (p page) sweeping() bool { return !p.sweepStart.IsZero() }

// plan decides which page a reconciliation at now reads, and returns the
// cursor with the sweep it starts, if it starts one.
func (c cursor) plan(now time.Time) (cursor, page) {
	if c.sweepStart.IsZero() && (c.again || c.lastSweep.IsZero() || now.Sub(c.lastSweep) >= sweepEvery) {
		c.sweepStart, c.after, c.again = now, "", false
	}
	if c.sweepStart.IsZero() {
		return c, page{since: c.since}
	}
	return c, page{sweepStart: c.sweepStart, after: c.after}
}

// advance moves the cursor past page p, read at now: full says it came
// back with a whole page, last is the id of its last cluster. A full sweep
// page moves the sweep on; a short one ends it, and from then on the
// changes since it began are read. A short page of changes moves since to
// now; a full one (more changed than a page) starts a sweep, so nothing is
// left behind. Reads of changes look back margin, which covers a write
// stamped before the read but committed after it, and clocks that differ
// between servers.
func (c cursor) advance(p page, now time.Time, margin time.Duration, full bool, last string) cursor {
	switch {
	case !p.sweeping() && full:
		c.lastSweep = time.Time{}
	case !p.sweeping():
		c.since = now.Add(-margin)
	case full:
		c.after = last
	default:
		c.sweepStart, c.lastSweep, c.after = time.Time{}, now, ""
		c.since = p.sweepStart.Add(-margin)
	}
	return c
}

// decideOrphanMachine says whether machine m, listed by infrastructure
// whose machines outlive clusterd's records (MachineCollector), is an
// orphan to remove, and why; c is m's cluster as the store holds it, nil
// when the store has no cluster with that id.
//
// An operation records its machines by naming their cluster in the
// infrastructure (the metadata a machine is made with): from then on the
// cluster's listing (Machines) is the record of its nodes, which its
// operations, recovery (the leftovers of an interrupted operation) and
// reconciliation act on. So a machine whose cluster exists and is not
// DESTROYED is never an orphan here, held or not: an operation in
// progress, or its recovery, may still record it or remove it. A machine
// is an orphan when nothing ever will: its cluster is DESTROYED (its
// destroy listed and removed the machines it found; this one was made
// after, by a call that outlived its job, or survived a crash between
// its definition and the destroy) or unknown to the database (never
// recorded, or purged), and held by no operation. A cluster is recorded
// before any of its machines is made (a create's claim), and neither
// condition is ever left, so the decision cannot race an operation. A
// free machine (no cluster) is never an orphan: it waits to be taken. A
// machine younger than grace, or of unknown age, is left for later, so
// that a store read a moment ago cannot be older than the machine.
func decideOrphanMachine(m infra.Machine, c *repository.Cluster, now time.Time, grace time.Duration) (bool, string) {
	switch {
	case m.ClusterID == "":
		return false, ""
	case m.CreateTime.IsZero() || now.Sub(m.CreateTime) < grace:
		return false, ""
	case c == nil:
		return true, fmt.Sprintf("machine %s (%s, made %s) names cluster %s, which the database does not know",
			m.ID, m.Role, m.CreateTime.UTC().Format(time.RFC3339), m.ClusterID)
	case c.CurrentOperation != "":
		return false, ""
	case c.State == lifecycle.Destroyed:
		return true, fmt.Sprintf("machine %s (%s, made %s) outlived its cluster's destroy",
			m.ID, m.Role, m.CreateTime.UTC().Format(time.RFC3339))
	}
	return false, ""
}
