// Package scanner keeps clusters from staying stuck (SPEC §5). It runs on
// every server (whose heartbeat is package lease): a pass, at start and then
// every scan interval, that fails the jobs of dead servers, recovers
// orphaned operations, reconciles resting clusters against the
// infrastructure (every reconcile interval), retries destroys, purges old
// jobs and removes orphan machines (machines.go). It only passes while the server holds its lease.
//
// Every write the scanner causes is the repository's compare-and-set on a
// cluster as the scanner read it; losing one is normal (another server, or a
// user, got there first) and is only counted and logged at debug level. The
// pass costs a fixed number of indexed queries whatever the number of
// clusters, each reading only what the pass acts on (liveness by the
// owners of the jobs in progress, and their jobs only when one is dead;
// orphans by an anti-join, reconciliation by what changed, purging by the
// end time's index); a sweep of every resting cluster, a page per pass,
// runs at start and every hour. A source of infrastructure events asks for a prompt
// reconciliation of the clusters it saw change (Scanner.Observe), which
// adds a read by primary key per cluster observed, a bounded number.
//
// What the scanner does is decided by pure functions of what it read and of
// the time (decide.go); the loops of liveness.go, orphans.go, reconcile.go,
// purge.go and machines.go read, ask them, and apply the result through the
// Store, the Recoverer and the MachineCollector.
package scanner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/clusterd/clusterd/infra"
	"github.com/clusterd/clusterd/lease"
	"github.com/clusterd/clusterd/lifecycle"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/runner"
)

// Store is the part of the repository the scanner reads and writes.
type Store interface {
	InProgressOwners(ctx context.Context) (repository.Owners, error)
	AdoptableJobs(ctx context.Context, q repository.AdoptableQuery) ([]repository.Job, error)
	FailJobsOfDeadServers(ctx context.Context, self repository.Server, cutoff time.Time, offer *repository.Offer, restartedErr, stoppedErr string) (restarted, stopped int64, err error)
	OwnJobsInProgress(ctx context.Context, self repository.Server) ([]repository.JobStamp, error)
	FailJobUnchanged(ctx context.Context, id string, seen time.Time, errJSON string) error
	Orphans(ctx context.Context, limit int) ([]repository.Cluster, map[string]repository.Job, error)
	OrphansSince(ctx context.Context, since time.Time, limit int) ([]repository.Cluster, map[string]repository.Job, error)
	InProgressJobsWithoutResource(ctx context.Context) ([]repository.Job, error)
	GetCluster(ctx context.Context, id string) (repository.Cluster, error)
	UnheldClusters(ctx context.Context, states []lifecycle.State, after string, limit int) ([]repository.Cluster, error)
	ChangedUnheldClusters(ctx context.Context, states []lifecycle.State, since time.Time, limit int) ([]repository.Cluster, error)
	PurgeJobs(ctx context.Context, cutoff time.Time, limit int) (int64, error)
	RecordEvent(ctx context.Context, e repository.Event) error
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

// MachineCollector is infrastructure whose machines outlive clusterd's
// records of them (the libvirt driver's domains), so a machine no
// operation will ever record again (decideOrphanMachine) must be removed
// by the scanner; infrastructure whose machines live in clusterd's
// database (the simulator) does not implement it.
type MachineCollector interface {
	// OwnMachines lists the machines this server may judge: those of its
	// own configuration (libvirt: its storage pool), not another's that
	// shares the infrastructure with another database.
	OwnMachines(ctx context.Context) ([]infra.Machine, error)
	// RemoveOrphan removes machine id, judged an orphan of cluster
	// clusterID, unless it no longer names that cluster; gone is removed.
	RemoveOrphan(ctx context.Context, id, clusterID string) error
}

// CallLogPurger is infrastructure that keeps a log of the calls made to it
// (the simulator's fencing log). The scanner purges it with the jobs, after
// the job retention, so it does not grow without end; infrastructure
// without such a log does not implement it.
type CallLogPurger interface {
	PurgeCallLog(ctx context.Context, cutoff time.Time, limit int) (int64, error)
}

// DefaultChangeRetention is how long the change feed keeps its rows.
const DefaultChangeRetention = time.Hour

// ChangePurger is a store that keeps a change feed for watches
// (repository.Store): the scanner deletes its rows older than
// ChangeRetention (by the database's clock) with the jobs it purges.
type ChangePurger interface {
	PurgeChanges(ctx context.Context, retention time.Duration, limit int) (int64, error)
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
	// ReconcileInterval (default 10s): reconciliation against the
	// infrastructure, and the search for jobs this server's runner lost.
	ReconcileInterval time.Duration
	// JobRetention (default 7 days): finished jobs older than this are
	// purged, and the infrastructure's log of calls with them (CallLogPurger).
	JobRetention time.Duration
	// ChangeRetention (default 1 hour): the change feed's rows older than
	// this are purged with the jobs (ChangePurger); a watch resumed from a
	// token older than this is refused (WATCH_EXPIRED).
	ChangeRetention time.Duration
	// Collector, optional, is the infrastructure's orphan machines'
	// collector (MachineCollector).
	Collector MachineCollector
	// OrphanMachineGrace (default DefaultOrphanMachineGrace): a machine
	// younger than this is never judged an orphan, and the collector runs
	// every half of it (at most every scan pass).
	OrphanMachineGrace time.Duration
	Clock              func() time.Time
	Logger             *slog.Logger
}

// DefaultScanInterval is how often liveness and orphan recovery run unless
// configured: with lease.DefaultPeerTimeout, a dead server's operations move
// again at most 3 s after its last heartbeat, plus one pass.
const DefaultScanInterval = 500 * time.Millisecond

// DefaultOrphanMachineGrace is how old a machine must be before it may be
// judged an orphan unless configured (--orphan-machine-grace).
const DefaultOrphanMachineGrace = 5 * time.Minute

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
	lastCollect   time.Time
	// orphansRead is when the last read of the orphans that returned all
	// of them began (zero: none did, and the next read is whole).
	orphansRead  time.Time
	destroyRetry map[string]retry
	// cursor is where reconciliation stands in its walk of the resting
	// clusters; observed are the clusters Observe asked it to look at in
	// the next pass.
	cursor   cursor
	observed map[string]bool
	// suspects are this server's IN_PROGRESS jobs that the runner did not
	// run at the last pass, with the update time seen then.
	suspects map[string]time.Time

	metrics counters
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
	def(&cfg.ChangeRetention, DefaultChangeRetention)
	def(&cfg.OrphanMachineGrace, DefaultOrphanMachineGrace)
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	s := &Scanner{cfg: cfg, log: cfg.Logger, now: cfg.Clock, destroyRetry: map[string]retry{}, observed: map[string]bool{}}
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

// Pass runs one scan: liveness, orphan recovery, reconciliation of the
// clusters observed since the last pass (Observe) and, when due, the
// search for lost jobs, reconciliation and garbage collection. It returns
// what it did.
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
	s.mu.Lock()
	due := start.Sub(s.lastReconcile) >= s.cfg.ReconcileInterval
	if due {
		s.lastReconcile = start
	}
	s.mu.Unlock()
	s.liveness(ctx, &r)
	if due {
		s.lostJobs(ctx, &r)
	}
	acted := s.orphans(ctx, &r, due)
	s.reconcile(ctx, &r, due, acted)
	if due {
		s.purge(ctx, &r)
	}
	s.mu.Lock()
	collect := s.cfg.Collector != nil && start.Sub(s.lastCollect) >= s.cfg.OrphanMachineGrace/2
	if collect {
		s.lastCollect = start
	}
	s.mu.Unlock()
	if collect {
		s.collectMachines(ctx, &r)
	}
	r.Duration = s.now().Sub(start)
	s.metrics.record(r)
	for _, err := range r.Errors {
		if ctx.Err() == nil {
			s.log.Warn("scan pass error", "error", err.Error())
		}
	}
	if r.JobsFailed > 0 || r.Adopted > 0 || r.Recovered > 0 || r.Reconciled > 0 || r.MachinesRemoved > 0 || len(r.Errors) > 0 {
		s.log.Info("scan pass", "jobs_failed", r.JobsFailed, "adopted", r.Adopted, "recovered", r.Recovered, "reconciled", r.Reconciled,
			"lost_races", r.LostRaces, "purged", r.Purged, "machines_removed", r.MachinesRemoved, "errors", len(r.Errors), "duration", r.Duration)
	}
	return r
}

// apply carries out one decision through the Recoverer, counting a lost
// race as normal.
func (s *Scanner) apply(ctx context.Context, r *Report, c repository.Cluster, a action) {
	var err error
	switch a.kind {
	case recoverOrphan:
		err = s.cfg.Recoverer.RecoverOrphan(ctx, c, a.orphan, a.reason)
	case retryDestroy:
		err = s.cfg.Recoverer.RetryDestroy(ctx, c, a.reason)
	case markFaulty:
		err = s.cfg.Recoverer.MarkFaulty(ctx, c, a.reason)
	case recoverAlert:
		err = s.cfg.Recoverer.RecoverAlert(ctx, c)
	case stopAlert:
		err = s.cfg.Recoverer.StopAlert(ctx, c)
	default:
		return
	}
	switch {
	case err == nil:
		r.Recovered++
		s.log.Info("scanner "+a.kind.String(), "cluster", c.ID, "state", c.State.String(), "operation", c.CurrentOperation, "reason", a.reason)
	case errors.Is(err, repository.ErrConflict) || errors.Is(err, repository.ErrNotFound):
		r.LostRaces++
		s.log.Debug("scanner lost a race", "action", a.kind.String(), "cluster", c.ID, "error", err)
	default:
		r.fail(fmt.Errorf("%s %s: %w", a.kind, c.ID, err))
	}
}

// encode is the stored error of a job liveness ends (Config.Encode).
func (s *Scanner) encode(cause error) string {
	if s.cfg.Encode == nil {
		return runner.EncodePlain(cause)
	}
	return s.cfg.Encode(cause)
}
