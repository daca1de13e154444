// Package scanner keeps clusters from staying stuck (SPEC §5). It runs on
// every server (whose heartbeat is package lease): a pass, at start and then
// every scan interval, that fails the jobs of dead servers, recovers
// orphaned operations, reconciles resting clusters against the
// infrastructure (every reconcile interval), retries destroys and purges old
// jobs. It only passes while the server holds its lease.
//
// Every write the scanner causes is the repository's compare-and-set on a
// cluster as the scanner read it; losing one is normal (another server, or a
// user, got there first) and is only counted and logged at debug level. The
// pass costs a fixed number of indexed queries whatever the number of
// clusters, each reading only what the pass acts on (orphans by an
// anti-join, reconciliation by what changed, purging by the end time's
// index); a sweep of every resting cluster, a page per pass, runs at start
// and every hour.
package scanner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lease"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/runner"
)

// Store is the part of the repository the scanner reads and writes.
type Store interface {
	AdoptableJobs(ctx context.Context, q repository.AdoptableQuery) ([]repository.Job, error)
	FailJobsOfDeadServers(ctx context.Context, self repository.Server, cutoff time.Time, offer *repository.Offer, restartedErr, stoppedErr string) (restarted, stopped int64, err error)
	OwnJobsInProgress(ctx context.Context, self repository.Server) ([]repository.Job, error)
	FailJobUnchanged(ctx context.Context, id string, seen time.Time, errJSON string) error
	Orphans(ctx context.Context, limit int) ([]repository.Cluster, map[string]repository.Job, error)
	InProgressJobsWithoutResource(ctx context.Context) ([]repository.Job, error)
	UnheldClusters(ctx context.Context, states []lifecycle.State, after string, limit int) ([]repository.Cluster, error)
	ChangedUnheldClusters(ctx context.Context, states []lifecycle.State, since time.Time, limit int) ([]repository.Cluster, error)
	PurgeJobs(ctx context.Context, cutoff time.Time, limit int) (int64, error)
}

// Recoverer starts the jobs that move clusters back (the service's
// operations, so the work is a job like any other and survives a crash).
type Recoverer interface {
	RecoverOrphan(ctx context.Context, c repository.Cluster, orphan repository.Job, reason string) error
	RetryDestroy(ctx context.Context, c repository.Cluster, reason string) error
	MarkFaulty(ctx context.Context, c repository.Cluster, reason string) error
	RecoverAlert(ctx context.Context, c repository.Cluster) error
	StopAlert(ctx context.Context, c repository.Cluster) error
}

// Machines reads the infrastructure for reconciliation.
type Machines interface {
	Machines(ctx context.Context, clusterIDs ...string) ([]infra.Machine, error)
}

// CallLogPurger is infrastructure that keeps a log of the calls made to it
// (the simulator's fencing log). The scanner purges it with the jobs, after
// the job retention, so it does not grow without end; infrastructure
// without such a log does not implement it.
type CallLogPurger interface {
	PurgeCallLog(ctx context.Context, cutoff time.Time, limit int) (int64, error)
}

// Lease says whether this server may act (package lease): the scanner
// passes only while it does, since without it this server's view may be
// stale and its peers may be recovering its own clusters.
type Lease interface {
	Check() error
	// HeldSince is when the server's current unbroken run of heartbeats
	// began (lease.Lease.HeldSince): peers are judged dead by their
	// heartbeats only for a peer timeout within it.
	HeldSince() time.Time
}

// Config is what a Scanner needs. Zero durations take the defaults.
type Config struct {
	Store     Store
	Recoverer Recoverer
	Infra     Machines
	// Self is this server's registration (its id and incarnation).
	Self repository.Server
	// Lease, optional, gates every pass (see Lease).
	Lease Lease
	// Running, optional, lists the jobs this process's runner runs; the
	// server's own IN_PROGRESS jobs missing from it are lost and failed.
	Running func() []string
	// Encode, optional, is the stored error of a job liveness fails, from
	// its cause (runner.ErrServerRestarted, ErrOwnerStopped, ErrJobLost):
	// the service's one mapping. Nil stores code and message only.
	Encode func(cause error) string
	// Adopter, optional, takes over the running jobs of dead servers and
	// earlier incarnations, and handed-off jobs, instead of their being
	// failed (SPEC §5 step 4, --on-owner-loss=resume). Without it they fail
	// and their clusters are recovered (--on-owner-loss=fail).
	Adopter Adopter
	// MaxAttempts (default 3): a job that has run this many times is failed,
	// not adopted again.
	MaxAttempts int32
	// PeerTimeout (default lease.DefaultPeerTimeout): a server whose
	// heartbeat is older is dead.
	PeerTimeout time.Duration
	// ScanInterval (default DefaultScanInterval): liveness and orphan recovery.
	ScanInterval time.Duration
	// ReconcileInterval (default 10s): reconciliation against the infrastructure.
	ReconcileInterval time.Duration
	// JobRetention (default 7 days): finished jobs older than this are
	// purged, and the infrastructure's log of calls with them (CallLogPurger).
	JobRetention time.Duration
	Clock        func() time.Time
	Logger       *slog.Logger
}

// DefaultScanInterval is how often liveness and orphan recovery run unless
// configured: with lease.DefaultPeerTimeout, a dead server's operations move
// again at most 3 s after its last heartbeat, plus one pass.
const DefaultScanInterval = 500 * time.Millisecond

// Limits per pass, so a pass stays bounded whatever the backlog.
const (
	orphanLimit    = 1000
	reconcileLimit = 1000
	destroyLimit   = 10
	purgeLimit     = 500
	maxBackoff     = 5 * time.Minute
)

// Scanner is one server's background recovery.
type Scanner struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	mu            sync.Mutex
	lastReconcile time.Time
	destroyRetry  map[string]retry
	// Reconciliation sweeps every resting cluster a page per pass (at start,
	// after a backlog, and every sweepEvery), and in between looks only at
	// the clusters that changed, or whose machines changed, since
	// reconcileSince. reconcileAfter is where the sweep's next page starts,
	// sweepStart when the sweep began (zero: not sweeping), lastSweep when
	// the last one ended.
	reconcileAfter string
	reconcileSince time.Time
	sweepStart     time.Time
	lastSweep      time.Time
	// suspects are this server's IN_PROGRESS jobs that the runner did not
	// run at the last pass, with the update time seen then.
	suspects map[string]time.Time

	metrics counters
}

// retry is the backoff of a destroy that keeps failing.
type retry struct {
	attempts int
	next     time.Time
}

// New returns a Scanner; Run starts it.
func New(cfg Config) *Scanner {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.PeerTimeout, lease.DefaultPeerTimeout)
	def(&cfg.ScanInterval, DefaultScanInterval)
	def(&cfg.ReconcileInterval, 10*time.Second)
	def(&cfg.JobRetention, 7*24*time.Hour)
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	s := &Scanner{cfg: cfg, log: cfg.Logger, now: cfg.Clock, destroyRetry: map[string]retry{}}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// Run passes now and then every scan interval until ctx is done.
func (s *Scanner) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.ScanInterval)
	defer t.Stop()
	for {
		s.Pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass runs one scan: liveness, orphan recovery, and, when due,
// reconciliation and garbage collection. It returns what it did.
func (s *Scanner) Pass(ctx context.Context) Report {
	start := s.now()
	var r Report
	if ctx.Err() != nil {
		r.Skipped = "stopping"
		return r
	}
	if s.cfg.Lease != nil {
		if err := s.cfg.Lease.Check(); err != nil {
			// Without a lease this server's view may be stale and its peers
			// may be recovering its clusters: leave the work to them.
			r.Skipped = err.Error()
			return r
		}
	}
	s.liveness(ctx, &r)
	s.orphans(ctx, &r)
	s.mu.Lock()
	due := start.Sub(s.lastReconcile) >= s.cfg.ReconcileInterval
	if due {
		s.lastReconcile = start
	}
	s.mu.Unlock()
	if due {
		s.reconcile(ctx, &r)
		s.purge(ctx, &r)
	}
	r.Duration = s.now().Sub(start)
	s.metrics.record(r)
	for _, err := range r.Errors {
		if ctx.Err() == nil {
			s.log.Warn("scan pass error", "error", err.Error())
		}
	}
	if r.JobsFailed > 0 || r.Adopted > 0 || r.Recovered > 0 || r.Reconciled > 0 || len(r.Errors) > 0 {
		s.log.Info("scan pass", "jobs_failed", r.JobsFailed, "adopted", r.Adopted, "recovered", r.Recovered, "reconciled", r.Reconciled,
			"lost_races", r.LostRaces, "purged", r.Purged, "errors", len(r.Errors), "duration", r.Duration)
	}
	return r
}

// liveness fails the IN_PROGRESS jobs of this server's earlier incarnations
// and of servers whose heartbeat is older than the peer timeout; with an
// Adopter, those that may still be adopted are adopted first, so only the
// others (out of attempts or time, or of no cluster) fail.
func (s *Scanner) liveness(ctx context.Context, r *Report) {
	began := s.now()
	cutoff := s.cutoff(began)
	// With adoption, only the jobs that adoption will not take may fail in
	// this pass: a job that may still be adopted (created since the offer,
	// or whose owner died or restarted since) is offered next.
	var offer *repository.Offer
	if s.cfg.Adopter != nil {
		if offer = s.adopt(ctx, r, cutoff, began); offer == nil {
			s.lostJobs(ctx, r)
			return
		}
	}
	restarted, stopped, err := s.cfg.Store.FailJobsOfDeadServers(ctx, s.cfg.Self, cutoff, offer,
		s.encode(runner.ErrServerRestarted), s.encode(runner.ErrOwnerStopped))
	r.JobsFailed += int(restarted + stopped)
	if err != nil {
		r.fail(fmt.Errorf("liveness: %w", err))
	}
	if restarted+stopped > 0 {
		s.log.Info("failed the jobs of stopped servers", "server_restarted", restarted, "owner_stopped", stopped)
	}
	s.lostJobs(ctx, r)
}

// cutoff is the liveness cutoff of a pass that began at began: a server
// whose last heartbeat is older is dead. A peer is dead when it wrote no
// heartbeat for a peer timeout during which this server's own heartbeats
// were accepted (Lease.HeldSince). Until this server has held its lease
// that long (after its start, or after a heartbeat it missed, as in a
// database outage, when every peer's heartbeat is old too), only servers
// that stopped gracefully are dead; earlier incarnations of this server
// and handed-off jobs do not depend on the cutoff.
func (s *Scanner) cutoff(began time.Time) time.Time {
	cutoff := began.Add(-s.cfg.PeerTimeout)
	if s.cfg.Lease != nil && s.cfg.Lease.HeldSince().After(cutoff) {
		// Stopped servers' heartbeat is repository.Stopped; a second later
		// is still long before any live heartbeat, and survives the
		// database's time precision.
		return repository.Stopped.Add(time.Second)
	}
	return cutoff
}

// lostJobs fails this server's own IN_PROGRESS jobs that its runner no
// longer runs: a job whose end could not be written (the database was
// unreachable as it finished) would otherwise hold its cluster for as long
// as this server lives. A job is failed only if two passes in a row found it
// not running and it wrote nothing in between, so a job whose claim commits
// just as a pass runs (not yet handed to the runner) is never taken for lost.
// No job's age is involved.
func (s *Scanner) lostJobs(ctx context.Context, r *Report) {
	if s.cfg.Running == nil {
		return
	}
	running := map[string]bool{}
	for _, id := range s.cfg.Running() { // before the query: see above
		running[id] = true
	}
	own, err := s.cfg.Store.OwnJobsInProgress(ctx, s.cfg.Self)
	if err != nil {
		r.fail(fmt.Errorf("lost jobs: %w", err))
		return
	}
	cur := map[string]time.Time{}
	for _, j := range own {
		if !running[j.ID] {
			cur[j.ID] = j.UpdateTime
		}
	}
	s.mu.Lock()
	prev := s.suspects
	s.suspects = cur
	s.mu.Unlock()
	for id, seen := range cur {
		if before, ok := prev[id]; !ok || !before.Equal(seen) {
			continue
		}
		err := s.cfg.Store.FailJobUnchanged(ctx, id, seen, s.encode(runner.ErrJobLost))
		switch {
		case err == nil:
			r.JobsFailed++
			s.log.Warn("failed a job this server no longer runs", "job", id)
		case errors.Is(err, repository.ErrConflict):
			r.LostRaces++
		default:
			r.fail(fmt.Errorf("lost jobs: %w", err))
		}
	}
}

// encode is the stored error of a job liveness ends (Config.Encode).
func (s *Scanner) encode(cause error) string {
	if s.cfg.Encode == nil {
		return runner.EncodePlain(cause)
	}
	return s.cfg.Encode(cause)
}

// orphans recovers every cluster in an operation state, or naming a current
// operation, whose job is not IN_PROGRESS on a live server (SPEC §5.1). It
// reads the clusters, then their jobs, and CASes on what it read, so an
// operation that ends in between makes the write miss.
func (s *Scanner) orphans(ctx context.Context, r *Report) {
	clusters, jobs, err := s.cfg.Store.Orphans(ctx, orphanLimit)
	if err != nil {
		r.fail(fmt.Errorf("orphans: %w", err))
		return
	}
	legacy, err := s.cfg.Store.InProgressJobsWithoutResource(ctx)
	if err != nil {
		r.fail(fmt.Errorf("orphans: %w", err))
		return
	}
	all, held := legacyHolds(legacy)
	if all {
		r.Skipped = "a running job of an older server names no cluster: recovery leaves every cluster alone"
		return
	}
	destroys := 0
	for _, c := range clusters {
		if held[c.ID] {
			continue
		}
		j, named := jobs[c.CurrentOperation]
		if c.CurrentOperation != "" && named && j.Status == repository.JobInProgress {
			continue // alive: liveness already failed every job of a dead server
		}
		reason := orphanReason(c, j, named)
		if c.CurrentOperation == "" {
			if _, ok := lifecycle.OrphanEvent(c.State); !ok {
				continue
			}
			if ev, _ := lifecycle.OrphanEvent(c.State); ev == lifecycle.DestroyRequested {
				// Garbage collection: a destroy that failed waits here for
				// a retry, with backoff, a few per pass.
				if destroys >= destroyLimit || !s.destroyDue(c.ID) {
					continue
				}
				destroys++
			}
		}
		s.act(r, c, "recover orphan", func() error { return s.cfg.Recoverer.RecoverOrphan(ctx, c, j, reason) })
	}
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

// legacyHolds applies the mixed-version rule (SPEC §4): a running job written
// without a resource id acts on the cluster its parameters name; one whose
// parameters name none could act on any cluster, so all are left alone.
func legacyHolds(jobs []repository.Job) (all bool, held map[string]bool) {
	held = map[string]bool{}
	for _, j := range jobs {
		id := clusterOfParams(j.Params)
		if id == "" {
			return true, nil
		}
		held[id] = true
	}
	return false, held
}

// clusterOfParams finds a cluster id in an older server's job parameters.
func clusterOfParams(params string) string {
	var m map[string]any
	if json.Unmarshal([]byte(params), &m) != nil {
		return ""
	}
	for _, key := range []string{"cluster_id", "clusterId", "cluster", "resource_id", "name"} {
		if v, ok := m[key].(string); ok {
			v = strings.TrimPrefix(v, "clusters/")
			if _, err := uuid.Parse(v); err == nil {
				return strings.ToLower(v)
			}
		}
	}
	return ""
}

// destroyDue applies the backoff of a destroy that keeps failing.
func (s *Scanner) destroyDue(clusterID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	rt := s.destroyRetry[clusterID]
	if now.Before(rt.next) {
		return false
	}
	rt.attempts++
	rt.next = now.Add(min(maxBackoff, time.Duration(1<<min(rt.attempts, 16))*time.Second))
	s.destroyRetry[clusterID] = rt
	return true
}

// reconcile compares the clusters no operation holds with their machines
// (SPEC §5.2): RUNNING with a machine that is off, has not joined or runs
// another version than the record, or STOPPED with a machine on -> ALERT;
// ALERT whose machines all match the record (running, joined, at the
// recorded version) -> RECOVERING -> RUNNING; ALERT with every machine
// stopped -> STOPPING -> STOPPED.
func (s *Scanner) reconcile(ctx context.Context, r *Report) {
	clusters, err := s.reconcilePage(ctx)
	if err != nil || len(clusters) == 0 {
		if err != nil {
			r.fail(fmt.Errorf("reconcile: %w", err))
		}
		return
	}
	ids := make([]string, len(clusters))
	for i, c := range clusters {
		ids[i] = c.ID
	}
	all, err := s.cfg.Infra.Machines(ctx, ids...)
	if err != nil {
		r.fail(fmt.Errorf("reconcile: %w", err))
		return
	}
	byCluster := map[string][]infra.Machine{}
	for _, m := range all {
		byCluster[m.ClusterID] = append(byCluster[m.ClusterID], m)
	}
	for _, c := range clusters {
		ms := byCluster[c.ID]
		if len(ms) == 0 {
			continue
		}
		action, do := s.reconcileAction(ctx, c, ms)
		if do != nil {
			s.act(r, c, action, do)
			r.Reconciled++
		}
	}
}

// sweepEvery is how often reconciliation sweeps every resting cluster
// again, however little changed: a safety net under the change tracking
// (update times stamped by several servers' clocks).
const sweepEvery = time.Hour

// reconcilePage returns the clusters this pass reconciles: the next page of
// a sweep of every resting cluster, or, between sweeps, those that changed
// (or whose machines changed) since the last pass. Seeing a machine change
// relies on the infrastructure's machines being rows of clusterd's database,
// as the simulator's are; a driver whose machines live elsewhere would need
// a feed of its changes, or to sweep every pass.
//
// Between sweeps it looks back a margin that covers a write stamped before
// the last pass read but committed after it, and clocks that differ between
// servers. A pass that finds a full page of changes starts a sweep, so
// nothing is left behind.
func (s *Scanner) reconcilePage(ctx context.Context) ([]repository.Cluster, error) {
	states := []lifecycle.State{lifecycle.Running, lifecycle.Stopped, lifecycle.Alert}
	now := s.now()
	margin := s.cfg.PeerTimeout + s.cfg.ReconcileInterval
	s.mu.Lock()
	if s.sweepStart.IsZero() && (s.lastSweep.IsZero() || now.Sub(s.lastSweep) >= sweepEvery) {
		s.sweepStart, s.reconcileAfter = now, ""
	}
	sweepStart, after, since := s.sweepStart, s.reconcileAfter, s.reconcileSince
	s.mu.Unlock()
	if sweepStart.IsZero() {
		clusters, err := s.cfg.Store.ChangedUnheldClusters(ctx, states, since, reconcileLimit)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		if len(clusters) == reconcileLimit {
			s.lastSweep = time.Time{} // more than a page changed: sweep
		} else {
			s.reconcileSince = now.Add(-margin)
		}
		s.mu.Unlock()
		return clusters, nil
	}
	clusters, err := s.cfg.Store.UnheldClusters(ctx, states, after, reconcileLimit)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if len(clusters) == reconcileLimit {
		// A full page: the next pass goes on from its last cluster.
		s.reconcileAfter = clusters[len(clusters)-1].ID
	} else {
		// The sweep is done; from now on, what changed since it began.
		s.sweepStart, s.lastSweep, s.reconcileAfter = time.Time{}, now, ""
		s.reconcileSince = sweepStart.Add(-margin)
	}
	s.mu.Unlock()
	return clusters, nil
}

// reconcileAction picks what reconciliation does to a cluster, asking the
// state machine which events its state allows. A cluster that vouches for
// its machines (RUNNING, lifecycle.Healthy) is compared machine by machine
// with its record, not only with its other machines: each must run, have
// joined and run the recorded Kubernetes version (infra.Mismatch, the
// check an operation's end makes too), or the cluster goes to ALERT naming
// what does not match. An ALERT cluster is brought back only when its
// machines match the record, so nodes that all run a version the record
// does not (an upgrade cancelled after its last node) keep it in ALERT
// until an upgrade records it; nor is such a cluster stopped when its
// machines are all off. A STOPPED cluster's nodes are the record's too
// (lifecycle.Versioned): off, and at the recorded version.
func (s *Scanner) reconcileAction(ctx context.Context, c repository.Cluster, ms []infra.Machine) (string, func() error) {
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
			reason := "the machines do not match the record: " + mismatch
			return "faults detected", func() error { return s.cfg.Recoverer.MarkFaulty(ctx, c, reason) }
		}
	case allows(lifecycle.FaultsDetected):
		// STOPPED wants every machine off, at the recorded version.
		if running > 0 {
			reason := fmt.Sprintf("%d of %d machines are not in the power state %s wants", running, len(ms), c.State)
			return "faults detected", func() error { return s.cfg.Recoverer.MarkFaulty(ctx, c, reason) }
		}
		if v := versionsOff; v != "" && lifecycle.Versioned(c.State) {
			reason := "the machines do not match the record: " + v
			return "faults detected", func() error { return s.cfg.Recoverer.MarkFaulty(ctx, c, reason) }
		}
	case allows(lifecycle.RecoveryRequested) && mismatch == "":
		return "recover", func() error { return s.cfg.Recoverer.RecoverAlert(ctx, c) }
	case allows(lifecycle.StopRequested) && running == 0 && versionsOff == "":
		// Not on nodes the record does not describe: the stop would end
		// ALERT again (Settle); an upgrade is what brings such a cluster back.
		return "stop", func() error { return s.cfg.Recoverer.StopAlert(ctx, c) }
	}
	return "", nil
}

// purge deletes finished jobs past the retention period, and the
// infrastructure's log of the calls made before it (CallLogPurger).
func (s *Scanner) purge(ctx context.Context, r *Report) {
	cutoff := s.now().Add(-s.cfg.JobRetention)
	n, err := s.cfg.Store.PurgeJobs(ctx, cutoff, purgeLimit)
	r.Purged += int(n)
	if err != nil {
		r.fail(fmt.Errorf("purge: %w", err))
	}
	if p, ok := s.cfg.Infra.(CallLogPurger); ok {
		if _, err := p.PurgeCallLog(ctx, cutoff, purgeLimit); err != nil {
			r.fail(fmt.Errorf("purge the infrastructure's call log: %w", err))
		}
	}
}

// act runs one recovery write, counting a lost race as normal.
func (s *Scanner) act(r *Report, c repository.Cluster, what string, do func() error) {
	err := do()
	switch {
	case err == nil:
		r.Recovered++
		s.log.Info("scanner "+what, "cluster", c.ID, "state", c.State.String(), "operation", c.CurrentOperation)
	case errors.Is(err, repository.ErrConflict) || errors.Is(err, repository.ErrNotFound):
		r.LostRaces++
		s.log.Debug("scanner lost a race", "action", what, "cluster", c.ID, "error", err)
	default:
		r.fail(fmt.Errorf("%s %s: %w", what, c.ID, err))
	}
}
