package lease_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clusterd/clusterd/lease"
	"github.com/clusterd/clusterd/repository"
	"github.com/clusterd/clusterd/repository/repotest"
)

// Every test runs on the real servers table, on every backend.
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
		old, err := s.TakeOverServer(ctxT(t), "srv", nil, host, gone)
		if err != nil {
			t.Fatal(err)
		}
		// A heartbeat interval of an hour: a watch would take two.
		l := newLease(s, func(c *lease.Config) { c.HeartbeatInterval, c.PeerTimeout = time.Hour, 6*time.Hour })
		ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
		defer cancel()
		self, err := l.Acquire(ctx)
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
