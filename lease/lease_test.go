package lease_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clusterd/clusterd/internal/syncbuf"
	"github.com/clusterd/clusterd/lease"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// Every test runs on the real servers table, on every backend, but the one
// that needs a slow heartbeat (slowStore).
func forEachBackend(t *testing.T, fn func(t *testing.T, s *repository.Store)) {
	t.Helper()
	for _, b := range repotest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) { fn(t, repotest.Open(t, b)) })
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newLease is a lease for server id "srv" with a short heartbeat.
func newLease(s *repository.Store, mutate ...func(*lease.Config)) *lease.Lease {
	cfg := lease.Config{Store: s, ServerID: "srv", HeartbeatInterval: 100 * time.Millisecond, PeerTimeout: 2 * time.Second, Logger: quiet()}
	for _, m := range mutate {
		m(&cfg)
	}
	return lease.New(cfg)
}

// run heartbeats l until the test ends.
func run(t *testing.T, l *lease.Lease) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

func TestAcquireAFreshID(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		l := newLease(s)
		if err := l.Check(); err == nil {
			t.Error("Check before Acquire = nil; want the lease not held")
		}
		self, err := l.Acquire(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Check(); err != nil {
			t.Errorf("Check after Acquire: %v", err)
		}
		row, _ := s.GetServer(ctxT(t), "srv")
		host, _ := os.Hostname()
		if row.Incarnation != self.Incarnation || row.Host != host || row.PID != int64(os.Getpid()) {
			t.Errorf("row = %+v; want incarnation %s, this host and pid", row, self.Incarnation)
		}
	})
}

// A live process heartbeats under the id: a second one is refused, with a
// message that names the holder and says what to do.
func TestAcquireRefusesALiveHolder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		live := newLease(s)
		if _, err := live.Acquire(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		run(t, live)
		// Same host and pid as the live one (one test process), so only its
		// heartbeat can tell: it advances.
		_, err := newLease(s).Acquire(ctxT(t))
		var inUse *lease.InUseError
		if !errors.As(err, &inUse) || !strings.Contains(err.Error(), "is in use by a live clusterd") || !strings.Contains(err.Error(), "--server-id") {
			t.Fatalf("Acquire under a live holder's id: %v; want an *InUseError naming it", err)
		}
		if err := live.Check(); err != nil {
			t.Errorf("the live holder lost its lease to a refused newcomer: %v", err)
		}
	})
}

// A predecessor that crashed on this host (its process is gone) is taken
// over at once, without watching its heartbeat, which is still recent.
func TestAcquireTakesOverACrashedProcessOnThisHostAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		host, _ := os.Hostname()
		gone := deadPID(t)
		old, err := s.TakeOverServer(ctxT(t), "srv", nil, repository.Registrant{Incarnation: repository.NewIncarnation(), Host: host, PID: gone})
		if err != nil {
			t.Fatal(err)
		}
		// A heartbeat interval of an hour: a watch would take two.
		l := newLease(s, func(c *lease.Config) { c.HeartbeatInterval, c.PeerTimeout = time.Hour, 6*time.Hour })
		self, err := l.Acquire(ctxT(t))
		if err != nil {
			t.Fatalf("Acquire after the holder's process died: %v", err)
		}
		if self.Incarnation == old.Incarnation {
			t.Error("Acquire kept the dead incarnation")
		}
		if _, err := s.Heartbeat(ctxT(t), old); !errors.Is(err, repository.ErrConflict) {
			t.Errorf("the dead incarnation's heartbeat: %v; want ErrConflict (superseded)", err)
		}
	})
}

// A registration of this host and pid that this lease did not send (an
// earlier process of the same pid: a container's PID 1) has a heartbeat
// that does not advance: Acquire takes it over once the probe window has
// passed, and does not refuse it as a live holder.
func TestAcquireTakesOverASilentRegistrationOfThisHostAndPID(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		host, _ := os.Hostname()
		silent, err := s.TakeOverServer(ctxT(t), "srv", nil, repository.Registrant{Incarnation: repository.NewIncarnation(), Host: host, PID: os.Getpid()})
		if err != nil {
			t.Fatal(err)
		}
		l := newLease(s, func(c *lease.Config) { c.Host, c.PID = host, os.Getpid() })
		self, err := l.Acquire(ctxT(t))
		if err != nil {
			t.Fatalf("Acquire over a silent registration of this host and pid: %v; want it taken over", err)
		}
		if self.Incarnation == silent.Incarnation {
			t.Error("Acquire kept the silent registration's incarnation")
		}
	})
}

// lateStore is a servers table whose first registration is cut short (its
// caller's context ends while the database holds the write, as under Galera's
// flow control) and commits later, at the landAt-th read that follows the
// cut: before the caller's next attempt reads the row (1), or while it
// watches the row (2).
type lateStore struct {
	*repository.Store
	// cut ends the first registration's context.
	cut    context.CancelFunc
	landAt int

	mu       sync.Mutex
	hung     bool
	pending  func()
	reads    int
	landed   string
	takeOver int
}

func (s *lateStore) TakeOverServer(ctx context.Context, id string, seen *repository.Server, as repository.Registrant) (repository.Server, error) {
	s.mu.Lock()
	first := !s.hung
	s.hung = true
	s.takeOver++
	s.mu.Unlock()
	if !first {
		return s.Store.TakeOverServer(ctx, id, seen, as)
	}
	s.cut()
	<-ctx.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = func() {
		// The write the database held, as it was sent: the same
		// compare-and-set, the same incarnation.
		if _, err := s.Store.TakeOverServer(context.Background(), id, seen, as); err == nil {
			s.landed = as.Incarnation
		}
	}
	return repository.Server{}, fmt.Errorf("take over server %s: %w", id, ctx.Err())
}

func (s *lateStore) GetServer(ctx context.Context, id string) (repository.Server, error) {
	s.mu.Lock()
	if s.pending != nil {
		if s.reads++; s.reads == s.landAt {
			s.pending()
			s.pending = nil
		}
	}
	s.mu.Unlock()
	return s.Store.GetServer(ctx, id)
}

// A registration cut short that commits before the next attempt reads the
// row, or while that attempt watches the predecessor's heartbeat, is this
// process, not a live holder: Acquire takes the id (under a newer
// incarnation of its own) at once, with one take-over, instead of refusing
// to start or watching its own row.
func TestAcquireKnowsItsOwnRegistrationThatCommittedLate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		landAt int
	}{{"before the next read", 1}, {"while the next attempt watches", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, s *repository.Store) {
				// A predecessor elsewhere whose heartbeat is recent and stops.
				paused := newLease(s, func(c *lease.Config) { c.Host, c.PID = "elsewhere", 4242 })
				if _, err := paused.Acquire(ctxT(t)); err != nil {
					t.Fatal(err)
				}
				first, cut := context.WithCancel(ctxT(t))
				defer cut()
				ls := &lateStore{Store: s, cut: cut, landAt: tc.landAt}
				logs := &syncbuf.Buffer{}
				l := newLease(s, func(c *lease.Config) {
					c.Store, c.PeerTimeout = ls, time.Minute
					c.Logger = slog.New(slog.NewTextHandler(logs, nil))
				})
				if _, err := l.Acquire(first); !errors.Is(err, context.Canceled) {
					t.Fatalf("first Acquire = %v; want it cut short at its registration", err)
				}
				const watching = "watching its heartbeat"
				watchedBefore := strings.Count(logs.String(), watching)
				self, err := l.Acquire(ctxT(t))
				if err != nil {
					t.Fatalf("Acquire after this process's cut-short registration committed late: %v; want the id taken", err)
				}
				ls.mu.Lock()
				landed, takeOvers := ls.landed, ls.takeOver
				ls.mu.Unlock()
				if landed == "" {
					t.Fatal("the cut-short registration never committed: the test did not test the late commit")
				}
				row, err := s.GetServer(ctxT(t), "srv")
				if err != nil {
					t.Fatal(err)
				}
				if row.Incarnation != self.Incarnation || self.Incarnation == landed {
					t.Errorf("row incarnation %s, Acquire returned %s, late commit %s; want the row to be what Acquire returned, newer than the late commit",
						row.Incarnation, self.Incarnation, landed)
				}
				if takeOvers != 2 {
					t.Errorf("%d take-overs in the two Acquires; want 2: the one cut short, then one from the row as last read", takeOvers)
				}
				wantWatch := 1 // the predecessor's, before it landed
				if tc.landAt == 1 {
					wantWatch = 0 // its own row: nothing to watch
				}
				if n := strings.Count(logs.String(), watching) - watchedBefore; n != wantWatch {
					t.Errorf("the second Acquire watched a heartbeat %d times; want %d", n, wantWatch)
				}
				if err := l.Check(); err != nil {
					t.Errorf("lease after Acquire: %v", err)
				}
			})
		})
	}
}

// deadPID returns the pid of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Skipf("cannot start a process to get a dead pid: %v", err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	return p.Pid
}

// A holder elsewhere (or paused) whose heartbeat is recent but does not
// advance while watched is taken for dead; when it wakes, its heartbeat
// finds the id taken, and its lease is lost for good.
func TestAcquireTakesOverASilentHolderAfterWatching(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		paused := newLease(s, func(c *lease.Config) { c.Host, c.PID = "elsewhere", 4242 })
		if _, err := paused.Acquire(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		l := newLease(s)
		if _, err := l.Acquire(ctxT(t)); err != nil {
			t.Fatalf("Acquire from a silent holder: %v", err)
		}
		if took := time.Since(began); took < 200*time.Millisecond {
			t.Errorf("Acquire took %s; want it to watch the recent heartbeat (two intervals) first", took)
		}
		run(t, paused) // it wakes
		deadline := time.Now().Add(30 * time.Second)
		for paused.Check() == nil {
			if time.Now().After(deadline) {
				t.Fatal("the superseded holder kept its lease")
			}
			time.Sleep(10 * time.Millisecond) // observing, not synchronising
		}
		if err := paused.Check(); !errors.Is(err, lease.ErrLost) || !strings.Contains(err.Error(), "another process took server id") {
			t.Errorf("superseded holder's Check = %v; want ErrLost saying another process took the id", err)
		}
		if err := l.Check(); err != nil {
			t.Errorf("the new holder's lease: %v", err)
		}
	})
}

// The lease lapses when no heartbeat has been accepted for a peer timeout,
// and comes back with the next accepted one.
func TestLeaseLapsesWithoutHeartbeats(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		var mu sync.Mutex
		now := time.Now()
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		l := newLease(s, func(c *lease.Config) { c.Clock = clock })
		if _, err := l.Acquire(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		now = now.Add(2 * time.Second)
		mu.Unlock()
		if err := l.Check(); !errors.Is(err, lease.ErrLost) || !strings.Contains(err.Error(), "peer timeout") {
			t.Errorf("Check a peer timeout after the last heartbeat = %v; want ErrLost naming the peer timeout", err)
		}
	})
}

// A graceful stop gives the id up: the lease is lost, and the next process
// takes the id at once, without watching the old heartbeat: with an
// hour's heartbeat interval, watching (two intervals) would outlast
// Acquire's one-minute context.
func TestReleaseLetsTheNextProcessStartAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		first := newLease(s, func(c *lease.Config) { c.Host, c.PID = "elsewhere", 4242 })
		if _, err := first.Acquire(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if err := first.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if err := first.Check(); !errors.Is(err, lease.ErrLost) {
			t.Errorf("Check after Release = %v; want ErrLost", err)
		}
		l := newLease(s, func(c *lease.Config) { c.HeartbeatInterval, c.PeerTimeout = time.Hour, 6*time.Hour })
		if _, err := l.Acquire(ctxT(t)); err != nil {
			t.Fatalf("Acquire after a graceful stop: %v; want the id at once", err)
		}
	})
}

// slowStore is a servers table whose writes take slow by the test's clock:
// the database accepts each at some moment between its send and its return.
// It is a fake because what it tests is when the lease counts from, not a
// compare-and-set.
type slowStore struct {
	mu    sync.Mutex
	now   time.Time
	slow  time.Duration
	beats int
	// afterBeat runs as a heartbeat returns.
	afterBeat func()
}

func (s *slowStore) clock() time.Time { s.mu.Lock(); defer s.mu.Unlock(); return s.now }

func (s *slowStore) advance(d time.Duration) { s.mu.Lock(); defer s.mu.Unlock(); s.now = s.now.Add(d) }

func (s *slowStore) GetServer(context.Context, string) (repository.Server, error) {
	return repository.Server{}, repository.ErrNotFound
}

func (s *slowStore) TakeOverServer(_ context.Context, id string, _ *repository.Server, as repository.Registrant) (repository.Server, error) {
	s.advance(s.slow)
	return repository.Server{ID: id, Incarnation: as.Incarnation, Host: as.Host, PID: int64(as.PID), HeartbeatTime: s.clock()}, nil
}

func (s *slowStore) Heartbeat(_ context.Context, srv repository.Server) (repository.Server, error) {
	s.advance(s.slow)
	s.mu.Lock()
	s.beats++
	s.mu.Unlock()
	if s.afterBeat != nil {
		s.afterBeat()
	}
	srv.HeartbeatTime = s.clock()
	return srv, nil
}

func (s *slowStore) ReleaseServer(context.Context, repository.Server) error { return nil }

// The lease is counted from when a heartbeat (or the registration) was
// sent, not from when the database's answer came back: the database may
// have written it at any moment in between, and peers count the server dead
// a peer timeout after what was written. Counted from the answer, a slow
// heartbeat would let this server act after its peers have begun failing its
// jobs.
func TestLeaseCountsFromTheHeartbeatsSend(t *testing.T) {
	const peerTimeout, slow = 6 * time.Second, 4 * time.Second
	s := &slowStore{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), slow: slow}
	// A heartbeat interval of an hour: Run beats once, at once.
	l := lease.New(lease.Config{Store: s, ServerID: "srv", HeartbeatInterval: time.Hour, PeerTimeout: peerTimeout,
		Clock: s.clock, Logger: quiet()})

	sent := s.clock()
	if _, err := l.Acquire(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(); err != nil {
		t.Fatalf("Check as the registration returns, %s after its send: %v; want the lease held", slow, err)
	}
	s.advance(sent.Add(peerTimeout).Sub(s.clock()))
	if err := l.Check(); !errors.Is(err, lease.ErrLost) {
		t.Errorf("Check a peer timeout after the registration was sent (%s after it returned) = %v; want ErrLost",
			peerTimeout-slow, err)
	}

	// One heartbeat, sent now (the lease has lapsed): Run returns once it
	// has taken the answer in.
	sent = s.clock()
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	s.afterBeat = cancel
	l.Run(ctx)
	if s.beats != 1 {
		t.Fatalf("Run sent %d heartbeats; want 1", s.beats)
	}
	if err := l.Check(); err != nil {
		t.Fatalf("Check as the heartbeat returns, %s after its send: %v; want the lease held again", slow, err)
	}
	s.advance(sent.Add(peerTimeout).Sub(s.clock()))
	if err := l.Check(); !errors.Is(err, lease.ErrLost) || !strings.Contains(err.Error(), "peer timeout") {
		t.Errorf("Check a peer timeout after the heartbeat was sent (%s after it returned) = %v; want ErrLost naming the peer timeout",
			peerTimeout-slow, err)
	}
}

// steppedStore is the servers table with heartbeats the test answers one at
// a time: each Heartbeat call is handed to the test, which replies with the
// error it returns.
type steppedStore struct {
	*repository.Store
	calls chan chan error
}

func (s steppedStore) Heartbeat(ctx context.Context, srv repository.Server) (repository.Server, error) {
	reply := make(chan error)
	s.calls <- reply
	return srv, <-reply
}

// HeldSince is when the current unbroken run of accepted heartbeats began:
// the acquisition, until a heartbeat is missed; then the next accepted one.
// The scanner judges peers only for a peer timeout within such a run, so
// that after a database outage (when it missed heartbeats, and every peer
// did too) no live peer is taken for dead.
func TestHeldSinceRestartsAfterAMissedHeartbeat(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s *repository.Store) {
		var mu sync.Mutex
		t0 := time.Now()
		now := t0
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		set := func(d time.Duration) { mu.Lock(); now = t0.Add(d); mu.Unlock() }
		store := steppedStore{Store: s, calls: make(chan chan error)}
		l := newLease(s, func(c *lease.Config) { c.Store, c.Clock, c.PeerTimeout = store, clock, time.Hour })
		if _, err := l.Acquire(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if got := l.HeldSince(); !got.Equal(t0) {
			t.Fatalf("HeldSince after Acquire = %s; want the acquisition, %s", got, t0)
		}
		next := func() chan error {
			t.Helper()
			select {
			case reply := <-store.calls:
				return reply
			case <-time.After(time.Minute):
				t.Fatal("no heartbeat within a minute")
				return nil
			}
		}
		set(100 * time.Millisecond)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); l.Run(ctx) }()
		defer func() {
			cancel()
			for {
				select {
				case reply := <-store.calls:
					reply <- context.Canceled
				case <-done:
					return
				}
			}
		}()

		// Sent at 100ms, one interval after the acquisition: the run goes on.
		reply := next()
		set(10 * time.Second)
		reply <- nil
		// Sent at 10s and refused: a missed heartbeat.
		reply = next()
		if got := l.HeldSince(); !got.Equal(t0) {
			t.Errorf("HeldSince after a heartbeat one interval on = %s; want still %s", got, t0)
		}
		set(10*time.Second + 100*time.Millisecond)
		reply <- errors.New("database unreachable")
		// Sent at 10.1s and accepted: a new run begins.
		reply = next()
		set(10*time.Second + 200*time.Millisecond)
		reply <- nil
		reply = next()
		if got, want := l.HeldSince(), t0.Add(10*time.Second+100*time.Millisecond); !got.Equal(want) {
			t.Errorf("HeldSince after a missed heartbeat and an accepted one = %s; want the accepted one's send, %s", got.Sub(t0), want.Sub(t0))
		}
		reply <- nil
	})
}

// realSlowStore answers every heartbeat after delay of real time, unless
// the heartbeat's context ends first.
type realSlowStore struct {
	slowStore
	delay time.Duration
}

func (s *realSlowStore) Heartbeat(ctx context.Context, srv repository.Server) (repository.Server, error) {
	select {
	case <-time.After(s.delay):
		srv.HeartbeatTime = time.Now()
		return srv, nil
	case <-ctx.Done():
		return repository.Server{}, ctx.Err()
	}
}

func (s *realSlowStore) TakeOverServer(_ context.Context, id string, _ *repository.Server, as repository.Registrant) (repository.Server, error) {
	return repository.Server{ID: id, Incarnation: as.Incarnation, Host: as.Host, PID: int64(as.PID), HeartbeatTime: time.Now()}, nil
}

// A database slower than a heartbeat interval to commit a beat (a loaded
// Galera node) does not cost the lease: a beat may take up to half the peer
// timeout, and each one accepted holds the lease from its send.
func TestSlowHeartbeatsKeepTheLease(t *testing.T) {
	const interval, peerTimeout = 100 * time.Millisecond, 3 * time.Second
	s := &realSlowStore{delay: 4 * interval}
	l := lease.New(lease.Config{Store: s, ServerID: "srv", HeartbeatInterval: interval, PeerTimeout: peerTimeout, Logger: quiet()})
	if _, err := l.Acquire(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(2 * peerTimeout)
	if err := l.Check(); err != nil {
		t.Fatalf("Check after %s of heartbeats each taking %s (interval %s): %v; want the lease held", 2*peerTimeout, s.delay, interval, err)
	}
}
