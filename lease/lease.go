// Package lease is a server process's right to act for its server id: a
// registration in the servers table with a fresh incarnation, kept alive by
// a heartbeat. It is built first, before anything that acts, and handed to
// the job runner (which checks it before every step), the handlers (before
// every claim), the scanner (before every pass) and health (NOT_SERVING
// without it).
//
// A lease is held while the last heartbeat the database accepted is younger
// than the peer timeout: past that, peers count the server dead, fail its
// jobs and recover its clusters, so it must stop acting (its infrastructure
// calls are fenced anyway, SPEC §6). A lease is lost for good when another
// process takes the server id (superseded) or the server stops.
//
// # Identity
//
// Acquire refuses to start a second live process under one server id. A
// predecessor's row is taken over at once when its heartbeat is older than
// the peer timeout, when it stopped gracefully, when it ran on this host
// and its process is gone (a crash restart), or when it is this lease's own
// registration from an earlier attempt that was cut short and committed
// late (Acquire chooses its incarnations and remembers them). Otherwise its
// heartbeat is watched for two heartbeat intervals: if it advances, the id
// is in use and Acquire fails with an *InUseError; if it does not, the
// predecessor is taken for dead (or paused: when it wakes, its heartbeat
// finds the id taken, and its calls are fenced). The take-over is a
// compare-and-set on the row as seen, so of two processes starting together
// only one wins.
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// The liveness defaults: a heartbeat every 500 ms, a server dead when its
// last heartbeat is 2.5 s old. With the scanner's default pass every second
// (scanner.DefaultScanInterval), a killed server's operations are adopted
// by a peer at most PeerTimeout + ScanInterval (3.5 s) after its last
// heartbeat; fencing makes a false suspicion cost an adoption, never a
// double step. The timeout is five heartbeats, so a slow heartbeat or two
// on a busy machine does not lose the lease.
const (
	DefaultHeartbeatInterval = 500 * time.Millisecond
	DefaultPeerTimeout       = 2500 * time.Millisecond
)

// Store is the part of the repository the lease needs: the servers table.
type Store interface {
	GetServer(ctx context.Context, id string) (repository.Server, error)
	TakeOverServer(ctx context.Context, id string, seen *repository.Server, as repository.Registrant) (repository.Server, error)
	Heartbeat(ctx context.Context, srv repository.Server) (repository.Server, error)
	ReleaseServer(ctx context.Context, srv repository.Server) error
}

// Config is what a Lease needs. Zero durations take the defaults.
type Config struct {
	Store Store
	// ServerID is the id this process acts for among its peers.
	ServerID string
	// HeartbeatInterval and PeerTimeout (DefaultHeartbeatInterval and
	// DefaultPeerTimeout when zero) are the cluster's liveness settings;
	// every peer must use the same.
	HeartbeatInterval time.Duration
	PeerTimeout       time.Duration
	// Host and PID identify this process (default: os.Hostname, os.Getpid).
	Host string
	PID  int
	// Clock is time.Now unless a test says otherwise.
	Clock  func() time.Time
	Logger *slog.Logger
}

// InUseError refuses to start a process under a server id that a live
// process holds: its heartbeat advanced while Acquire watched it.
type InUseError struct {
	ServerID    string
	Incarnation string
	Host        string
	PID         int64
	// Age is how old its heartbeat was when last seen.
	Age time.Duration
}

// Error says who holds the id and what to do.
func (e *InUseError) Error() string {
	who := "another process"
	if e.Host != "" {
		who = fmt.Sprintf("process %d on host %s", e.PID, e.Host)
	}
	return fmt.Sprintf("server id %q is in use by a live clusterd (%s, incarnation %s, heartbeat %s ago and advancing); stop it, or give this process another --server-id",
		e.ServerID, who, e.Incarnation, e.Age.Round(time.Millisecond))
}

// Lease is one process's hold on its server id. It is safe for concurrent use.
type Lease struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	self atomic.Pointer[repository.Server]
	// lastBeat is when the last heartbeat the database accepted was sent
	// (unix nanos, by this lease's clock, read before sending: the lease
	// lapses no later than peers, who go by the time written, see it lapse).
	lastBeat atomic.Int64
	// heldSince is when the heartbeat that began the current unbroken run
	// of accepted heartbeats was sent (unix nanos; see HeldSince).
	heldSince atomic.Int64
	// lost is why the lease is gone for good (superseded, stopped); nil while not.
	lost atomic.Pointer[error]

	// sent holds every incarnation this lease has asked the database to
	// register. A registration cut short (its context ended, its answer
	// was lost) may still commit, later; a later Acquire that finds one of
	// these in the row finds this process, not a live predecessor.
	sentMu sync.Mutex
	sent   []string
}

// New returns a lease for cfg.ServerID; Acquire takes it.
func New(cfg Config) *Lease {
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.PeerTimeout <= 0 {
		cfg.PeerTimeout = DefaultPeerTimeout
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	if cfg.PID == 0 {
		cfg.PID = os.Getpid()
	}
	l := &Lease{cfg: cfg, log: cfg.Logger, now: cfg.Clock}
	if l.log == nil {
		l.log = slog.Default()
	}
	if l.now == nil {
		l.now = time.Now
	}
	notYet := errors.New("lease not acquired yet")
	l.lost.Store(&notYet)
	return l
}

// ErrLost wraps every reason Check gives: this server may not act.
var ErrLost = errors.New("server lease not held")

// ProbeWindow is how long Acquire watches a predecessor's heartbeat: two
// heartbeat intervals and a margin, so a live one beats at least once. A
// caller that bounds Acquire's time gives it this much beyond its reads and
// writes. Acquire watches again when the row changed under its take-over
// (up to three looks in all), so such a caller also retries an Acquire it
// cut short.
func (l *Lease) ProbeWindow() time.Duration {
	return 2*l.cfg.HeartbeatInterval + 500*time.Millisecond
}

// Acquire registers this process under its server id, unless a live process
// holds it (*InUseError). It must succeed once, before Run; a caller may call
// it again after it failed (a row that an earlier, cut-short call of this
// lease registered is this process's own and is taken over at once).
func (l *Lease) Acquire(ctx context.Context) (repository.Server, error) {
	id := l.cfg.ServerID
	if id == "" {
		return repository.Server{}, errors.New("acquire lease: no server id")
	}
	for attempt := 1; ; attempt++ {
		seen, err := l.cfg.Store.GetServer(ctx, id)
		var prev *repository.Server
		switch {
		case errors.Is(err, repository.ErrNotFound):
		case err != nil:
			return repository.Server{}, fmt.Errorf("acquire lease for server %s: %w", id, err)
		default:
			var why string
			why, prev, err = l.dead(ctx, seen)
			if err != nil {
				return repository.Server{}, err
			}
			level := slog.LevelWarn
			if why == ownRegistration {
				level = slog.LevelInfo
			}
			l.log.Log(ctx, level, "taking over the server id from an earlier registration", "server_id", id,
				"incarnation", seen.Incarnation, "host", seen.Host, "pid", seen.PID, "because", why)
		}
		as := repository.Registrant{Incarnation: repository.NewIncarnation(), Host: l.cfg.Host, PID: l.cfg.PID}
		l.remember(as.Incarnation)
		sent := l.now()
		srv, err := l.cfg.Store.TakeOverServer(ctx, id, prev, as)
		if errors.Is(err, repository.ErrConflict) && attempt < 3 {
			// Someone registered or heartbeat in between: look again.
			continue
		}
		if err != nil {
			return repository.Server{}, fmt.Errorf("acquire lease for server %s: %w", id, err)
		}
		l.self.Store(&srv)
		l.lastBeat.Store(sent.UnixNano())
		l.heldSince.Store(sent.UnixNano())
		l.lost.Store(nil)
		return srv, nil
	}
}

// dead says why the process behind row seen no longer holds its server id,
// and which row to take over from (seen, or what the watch last read; nil
// when the row is gone), or returns an *InUseError if it still holds it.
func (l *Lease) dead(ctx context.Context, seen repository.Server) (string, *repository.Server, error) {
	age := l.now().Sub(seen.HeartbeatTime)
	switch {
	case l.mine(seen.Incarnation):
		return ownRegistration, &seen, nil
	case !seen.HeartbeatTime.After(repository.Stopped):
		return "it stopped gracefully", &seen, nil
	case age >= l.cfg.PeerTimeout:
		return fmt.Sprintf("its last heartbeat is %s old (peer timeout %s)", age.Round(time.Millisecond), l.cfg.PeerTimeout), &seen, nil
	case seen.Host == l.cfg.Host && seen.PID > 0 && int(seen.PID) != l.cfg.PID && !processAlive(int(seen.PID)):
		return fmt.Sprintf("its process %d on this host is gone", seen.PID), &seen, nil
	}
	window := l.ProbeWindow()
	l.log.Info("server id registered by a process that may be alive; watching its heartbeat", "server_id", seen.ID,
		"incarnation", seen.Incarnation, "host", seen.Host, "pid", seen.PID, "heartbeat_age", age.Round(time.Millisecond), "watch", window)
	deadline := time.NewTimer(window)
	defer deadline.Stop()
	tick := time.NewTicker(max(20*time.Millisecond, l.cfg.HeartbeatInterval/10))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return "", nil, fmt.Errorf("acquire lease for server %s: %w", seen.ID, ctx.Err())
		case <-deadline.C:
			return fmt.Sprintf("its heartbeat did not advance for %s", window), &seen, nil
		case <-tick.C:
		}
		now, err := l.cfg.Store.GetServer(ctx, seen.ID)
		if errors.Is(err, repository.ErrNotFound) {
			return "its row was deleted", nil, nil
		}
		if err != nil {
			return "", nil, fmt.Errorf("acquire lease for server %s: %w", seen.ID, err)
		}
		if l.mine(now.Incarnation) {
			// This lease's own registration, cut short before it watched,
			// committed meanwhile: taken over from the row as it is now.
			return ownRegistration, &now, nil
		}
		if now.Incarnation != seen.Incarnation || !now.HeartbeatTime.Equal(seen.HeartbeatTime) {
			return "", nil, &InUseError{ServerID: now.ID, Incarnation: now.Incarnation, Host: now.Host, PID: now.PID, Age: l.now().Sub(now.HeartbeatTime)}
		}
	}
}

// ownRegistration is why a row this lease registered itself is taken over.
const ownRegistration = "it is this process's own registration from an attempt that was cut short"

// remember records inc as an incarnation this lease sent.
func (l *Lease) remember(inc string) {
	l.sentMu.Lock()
	defer l.sentMu.Unlock()
	l.sent = append(l.sent, inc)
}

// mine reports whether inc is an incarnation this lease sent.
func (l *Lease) mine(inc string) bool {
	l.sentMu.Lock()
	defer l.sentMu.Unlock()
	return slices.Contains(l.sent, inc)
}

// Self is this process's registration (its id and incarnation).
func (l *Lease) Self() repository.Server {
	if s := l.self.Load(); s != nil {
		return *s
	}
	return repository.Server{ID: l.cfg.ServerID}
}

// Check returns nil while this server may act, and otherwise an error
// wrapping ErrLost that says why: its last accepted heartbeat is a peer
// timeout old (peers may be failing its jobs), another process took its id,
// or it stopped.
func (l *Lease) Check() error {
	if lost := l.lost.Load(); lost != nil {
		return fmt.Errorf("%w: %w", ErrLost, *lost)
	}
	last := time.Unix(0, l.lastBeat.Load())
	if age := l.now().Sub(last); age >= l.cfg.PeerTimeout {
		return fmt.Errorf("%w: the last heartbeat of server %s the database accepted is %s old (peer timeout %s)",
			ErrLost, l.cfg.ServerID, age.Round(time.Millisecond), l.cfg.PeerTimeout)
	}
	return nil
}

// HeldSince is when this server's current unbroken run of heartbeats began:
// since then the database accepted one every heartbeat interval or so
// (none missed), from its acquisition or from its first heartbeat after a
// missed one. The scanner judges a peer dead only for a peer timeout spent
// within such a run: after a database outage every peer's heartbeat is old
// because none could be written, not because the peer is gone.
func (l *Lease) HeldSince() time.Time {
	return time.Unix(0, l.heldSince.Load())
}

// Run heartbeats at once and then every heartbeat interval until ctx is
// done or the lease is lost for good.
func (l *Lease) Run(ctx context.Context) {
	t := time.NewTicker(l.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		if l.lost.Load() != nil {
			return
		}
		l.beat(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// beatTimeout is how long one heartbeat may take: half the peer timeout (at
// least a heartbeat interval). A loaded database (a Galera node certifying
// on a busy machine) may take longer than an interval to commit a beat; the
// lease counts from its send, so a beat accepted late still holds it, while
// one cut at the interval would lose the lease to slowness alone.
func (l *Lease) beatTimeout() time.Duration {
	return max(l.cfg.HeartbeatInterval, l.cfg.PeerTimeout/2)
}

func (l *Lease) beat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, l.beatTimeout())
	defer cancel()
	self := l.Self()
	sent := l.now()
	_, err := l.cfg.Store.Heartbeat(ctx, self)
	switch {
	case err == nil:
		before := l.Check()
		if gap := sent.UnixNano() - l.lastBeat.Load(); gap >= int64(2*l.cfg.HeartbeatInterval) {
			// A heartbeat was missed: the database may have been out of
			// reach for everyone, peers included.
			l.heldSince.Store(sent.UnixNano())
		}
		l.lastBeat.Store(sent.UnixNano())
		if before != nil {
			l.log.Info("heartbeat accepted again: lease held", "server_id", self.ID)
		}
	case errors.Is(err, repository.ErrConflict):
		lost := fmt.Errorf("another process took server id %s (this is incarnation %s)", self.ID, self.Incarnation)
		l.lost.Store(&lost)
		l.log.Error("another process registered this server id: this one takes no more work and reports NOT_SERVING",
			"server_id", self.ID, "incarnation", self.Incarnation, "error", err)
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
	default:
		l.log.Warn("heartbeat failed", "server_id", self.ID, "error", err, "lease", describe(l.Check()))
	}
}

// Release gives the server id up at the end of a graceful stop: the lease is
// lost for good, and the row says the server stopped, so peers fail at once
// whatever jobs it could not end and a restart need not wait. Call it after
// Run has returned and every job has ended.
func (l *Lease) Release(ctx context.Context) error {
	stopped := errors.New("the server stopped")
	l.lost.Store(&stopped)
	self := l.self.Load()
	if self == nil {
		return nil
	}
	return l.cfg.Store.ReleaseServer(ctx, *self)
}

func describe(err error) string {
	if err == nil {
		return "held"
	}
	return err.Error()
}
