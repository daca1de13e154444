package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/clusterd/clusterd/internal/syncbuf"
	"github.com/clusterd/clusterd/lease"
	"github.com/clusterd/clusterd/repository"
)

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer = syncbuf.Buffer

// A database that does not answer at start-up is waited for, up to
// DatabaseWait, with a log line per attempt, then New fails saying so. How
// long past DatabaseWait it gave up is logged, not asserted (the machine may
// be busy); a minute is the deadline of a New that would wait forever.
func TestStartWaitsForTheDatabase(t *testing.T) {
	logs := &lockedBuffer{}
	began := time.Now()
	err := newWithin(t, time.Minute, Config{
		// Nothing listens on port 1.
		Database: "mysql://u:p@127.0.0.1:1/db", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ServerID: "s",
		DatabaseWait: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	took := time.Since(began)
	if err == nil || !strings.Contains(err.Error(), "database not reachable after") {
		t.Fatalf("New on a database that never answers: %v; want it to give up saying so", err)
	}
	if took < 2*time.Second {
		t.Errorf("New gave up after %s; want it to wait the 2s it was told to", took)
	}
	t.Logf("New gave up after %s (DatabaseWait 2s)", took.Round(time.Millisecond))
	if n := strings.Count(logs.String(), "database not reachable yet; waiting"); n < 2 {
		t.Errorf("%d attempts logged; want one line per attempt:\n%s", n, logs)
	}
	// A DSN that cannot be right is not waited for: told to wait an hour,
	// New fails within the minute.
	if err := newWithin(t, time.Minute, Config{Database: "mysql://u:p@127.0.0.1:1/", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		ServerID: "s", DatabaseWait: time.Hour}); err == nil {
		t.Error("New accepted a DSN without a database name")
	}
}

// newWithin is New with a deadline: it fails the test if New has not
// returned within limit, and the test expects New to fail.
func newWithin(t *testing.T, limit time.Duration, cfg Config) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := New(ctx, cfg)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		cancel()
		<-done
		t.Fatalf("New still waiting for %s after %s", cfg.Database, limit)
		return nil
	}
}

// Start-up's database work after the open (the simulator's schema, the
// catalog's seed) is waited for too: an attempt whose work meets an
// unavailable database (the database restarted while clusterd started)
// closes the store and is made again; any other error fails at once.
func TestStartRetriesWorkTheDatabaseCutShort(t *testing.T) {
	dsn := "sqlite:" + t.TempDir() + "/c.db"
	logs := &lockedBuffer{}
	cfg := Config{Database: dsn, ServerID: "s", DatabaseWait: time.Minute, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	calls := 0
	store, err := openDatabase(t.Context(), cfg, newStartupWait(cfg), func(ctx context.Context, s *repository.Store) error {
		calls++
		if calls == 1 {
			return fmt.Errorf("simulator schema: %w: invalid connection", repository.ErrUnavailable)
		}
		return s.SeedCatalog(ctx, nil, nil)
	})
	if err != nil {
		t.Fatalf("openDatabase: %v; want the second attempt to succeed", err)
	}
	_ = store.Close()
	if calls != 2 || !strings.Contains(logs.String(), "database not reachable yet; waiting") {
		t.Errorf("prepare ran %d times, log:\n%s\nwant 2 attempts, the first logged", calls, logs)
	}

	calls = 0
	boom := errors.New("catalog: a version is malformed")
	if _, err := openDatabase(t.Context(), cfg, newStartupWait(cfg), func(context.Context, *repository.Store) error { calls++; return boom }); !errors.Is(err, boom) || calls != 1 {
		t.Errorf("openDatabase with a failing prepare: %v after %d attempts; want %v at once", err, calls, boom)
	}
}

// flakyAcquirer refuses its first failures calls with err (or, with
// hangs, waits for its context to end on them), then registers.
type flakyAcquirer struct {
	failures, calls int
	err             error
	hangs           bool
	probe           time.Duration
	// deadlines are the deadlines of the calls that hung.
	deadlines []time.Time
}

func (a *flakyAcquirer) Acquire(ctx context.Context) (repository.Server, error) {
	a.calls++
	if a.calls <= a.failures {
		if a.hangs {
			dl, _ := ctx.Deadline()
			a.deadlines = append(a.deadlines, dl)
			<-ctx.Done()
			return repository.Server{}, fmt.Errorf("take over server s: %w", ctx.Err())
		}
		return repository.Server{}, a.err
	}
	return repository.Server{ID: "s", Incarnation: "7"}, nil
}

func (a *flakyAcquirer) ProbeWindow() time.Duration { return a.probe }

// A database that answers but cannot take the lease's write yet (a Galera
// node back from a restart before it rejoins a primary component refuses
// writes with 1180 for a few seconds) is waited for like one that does not
// answer, within the same DatabaseWait; a live holder of the server id is
// not: New fails at once.
func TestStartWaitsToTakeTheLease(t *testing.T) {
	logs := &lockedBuffer{}
	cfg := Config{DatabaseWait: time.Minute, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	notPrimary := fmt.Errorf("take over server s: %w: Error 1180: Not connected to Primary Component", repository.ErrUnavailable)
	a := &flakyAcquirer{failures: 2, err: notPrimary}
	self, err := acquireLease(t.Context(), a, newStartupWait(cfg))
	if err != nil || self.Incarnation != "7" || a.calls != 3 {
		t.Fatalf("acquireLease through 2 refused writes: %+v, %v after %d calls; want incarnation 7 on the third", self, err, a.calls)
	}
	if n := strings.Count(logs.String(), "database not taking writes yet; waiting"); n != 2 || !strings.Contains(logs.String(), "database taking writes") {
		t.Errorf("%d retries logged; want one line per refused attempt, then the success:\n%s", n, logs)
	}

	inUse := &lease.InUseError{ServerID: "s", Incarnation: "3", Host: "h", PID: 42}
	a = &flakyAcquirer{failures: 100, err: inUse}
	if _, err := acquireLease(t.Context(), a, newStartupWait(cfg)); !errors.As(err, new(*lease.InUseError)) || a.calls != 1 {
		t.Errorf("acquireLease under a live holder: %v after %d calls; want its InUseError at once", err, a.calls)
	}

	// Past DatabaseWait it gives up, saying so and with the last error:
	// attempts at 0, 0.5s, 1.5s and 3s (the backoff doubles, the last
	// pause is cut to the deadline).
	cfg.DatabaseWait = 3 * time.Second
	a = &flakyAcquirer{failures: 1000, err: notPrimary}
	_, err = acquireLease(t.Context(), a, newStartupWait(cfg))
	if !errors.Is(err, repository.ErrUnavailable) || !strings.Contains(err.Error(), "acquire the server lease: database not taking writes after") || a.calls != 4 {
		t.Errorf("acquireLease on a database that never takes the write: %v after %d calls; want it to give up after DatabaseWait's 4 attempts, saying so", err, a.calls)
	}
}

// An attempt at the lease that hangs (a write that never answers) is cut
// short after the attempt's bound and its probe window, and made again:
// it neither holds start-up past DatabaseWait nor fails it at once.
func TestStartCutsShortALeaseAttemptThatHangs(t *testing.T) {
	logs := &lockedBuffer{}
	cfg := Config{DatabaseWait: time.Minute, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	w := newStartupWait(cfg)
	w.attemptTimeout = 200 * time.Millisecond
	a := &flakyAcquirer{failures: 1, hangs: true, probe: 300 * time.Millisecond}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	began := time.Now()
	self, err := acquireLease(ctx, a, w)
	if err != nil || self.Incarnation != "7" || a.calls != 2 {
		t.Fatalf("acquireLease after a hanging attempt: %+v, %v after %d calls; want incarnation 7 on the second", self, err, a.calls)
	}
	if len(a.deadlines) != 1 {
		t.Fatalf("the hanging attempt's deadlines: %v; want one", a.deadlines)
	}
	if d := a.deadlines[0].Sub(began); d < 500*time.Millisecond {
		t.Errorf("the hanging attempt's deadline came %s after the start; want the attempt's bound and its probe window, 500ms", d)
	}
	if !strings.Contains(logs.String(), "deadline exceeded") {
		t.Errorf("the cut attempt was not logged with its error:\n%s", logs)
	}
}
