package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// startupWait paces start-up's attempts at a database that does not answer,
// or cannot take writes yet: the open's and the lease's retries share one
// deadline, DatabaseWait after the first attempt, past which no attempt is
// begun. An attempt is cut short after the time left, but at least a second
// and at most attemptTimeout (the lease's attempt gets its probe window
// besides), so start-up gives up at most about a second (and the probe
// window) past DatabaseWait.
// Each retry is logged with its error and waits a backoff that doubles up
// to 5s. The open's prepare (the simulator's schema, the catalog's seed)
// is not cut short: it runs on a database that just answered.
type startupWait struct {
	log            *slog.Logger
	wait           time.Duration
	began          time.Time
	deadline       time.Time
	backoff        time.Duration
	attemptTimeout time.Duration
}

func newStartupWait(cfg Config) *startupWait {
	began := time.Now()
	return &startupWait{log: cfg.Logger, wait: cfg.DatabaseWait, began: began, deadline: began.Add(cfg.DatabaseWait),
		backoff: 500 * time.Millisecond, attemptTimeout: 10 * time.Second}
}

// attempt is the context of one attempt: the time left until the deadline,
// at least a second, at most attemptTimeout; and extra beyond that, for an
// attempt that also waits on purpose (the lease's probe of a predecessor).
func (w *startupWait) attempt(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, min(max(time.Until(w.deadline), time.Second), w.attemptTimeout)+extra)
}

// retry waits before attempt+1 after attempt failed with err, or returns
// the error start-up fails with: ctx ended, or the deadline passed. notYet
// says what the database is not doing yet ("not reachable", "not taking
// writes"), in the log line and in the error.
func (w *startupWait) retry(ctx context.Context, what, notYet string, attempt int, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", what, ctx.Err())
	case !time.Now().Before(w.deadline):
		return fmt.Errorf("%s: database %s after %s (%d attempts, --database-wait %s): %w",
			what, notYet, time.Since(w.began).Round(time.Millisecond), attempt, w.wait, err)
	}
	pause := min(w.backoff, time.Until(w.deadline))
	w.log.Warn("database "+notYet+" yet; waiting", "doing", what, "attempt", attempt, "error", err.Error(),
		"waited", time.Since(w.began).Round(time.Millisecond), "wait", w.wait, "next_in", pause.Round(time.Millisecond))
	select {
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, ctx.Err())
	case <-time.After(pause):
	}
	w.backoff = min(2*w.backoff, 5*time.Second)
	return nil
}

// reached logs, after a retry, that what got through: the database is
// now as said ("reachable", "taking writes").
func (w *startupWait) reached(what, now string, attempts int) {
	if attempts > 1 {
		w.log.Info("database "+now, "doing", what, "attempts", attempts, "waited", time.Since(w.began).Round(time.Millisecond))
	}
}

// openDatabase opens the store (and migrates it), then runs prepare on it
// (the rest of start-up's database work: the simulator's schema, the
// catalog's seed), waiting on w for a database that is down or not
// answering yet, as it is when clusterd and its database start together, or
// that goes away in the middle (a restart of the database while clusterd
// starts): an attempt that meets an unavailable database closes what it
// opened and is made again. A DSN that cannot be right, or an error of
// prepare's other than an unavailable database, fails at once.
func openDatabase(ctx context.Context, cfg Config, w *startupWait, prepare func(context.Context, *repository.Store) error) (*repository.Store, error) {
	const what = "open database"
	for attempt := 1; ; attempt++ {
		attemptCtx, cancel := w.attempt(ctx, 0)
		store, err := repository.Open(attemptCtx, cfg.Database, repository.WithServerID(cfg.ServerID),
			// A frozen process's transaction must not keep its peers from
			// recovering what it held: MariaDB ends it well before they act.
			repository.WithIdleTransactionTimeout(cfg.PeerTimeout/2))
		cancel()
		if err == nil && prepare != nil {
			if err = prepare(ctx, store); err != nil {
				_ = store.Close()
				if !errors.Is(err, repository.ErrUnavailable) {
					return nil, err
				}
			}
		}
		switch {
		case err == nil:
			w.reached(what, "reachable", attempt)
			return store, nil
		case errors.Is(err, repository.ErrInvalidDSN):
			return nil, err
		}
		if err := w.retry(ctx, what, "not reachable", attempt, err); err != nil {
			return nil, err
		}
	}
}

// acquirer takes this process's server id (lease.Lease), watching an
// earlier holder's heartbeat for up to ProbeWindow on the way.
type acquirer interface {
	Acquire(ctx context.Context) (repository.Server, error)
	ProbeWindow() time.Duration
}

// acquireLease takes this process's server id, waiting on w while the
// database answers but cannot take the registration's write: a Galera node
// that is back before it rejoins a primary component reads, and refuses
// writes, for some seconds. An attempt that does not end within w's attempt
// bound (and the probe window) is cut short and made again. A live holder
// of the id, or any other error, fails at once. A registration that
// committed but whose answer was lost, or that commits after its attempt
// was cut short, is this lease's own incarnation: the next attempt takes it
// over at once (see lease.Lease.Acquire).
func acquireLease(ctx context.Context, l acquirer, w *startupWait) (repository.Server, error) {
	const what = "acquire the server lease"
	for attempt := 1; ; attempt++ {
		attemptCtx, cancel := w.attempt(ctx, l.ProbeWindow())
		self, err := l.Acquire(attemptCtx)
		timedOut := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		if err == nil {
			w.reached(what, "taking writes", attempt)
			return self, nil
		}
		if !errors.Is(err, repository.ErrUnavailable) && !timedOut {
			return repository.Server{}, err
		}
		if err := w.retry(ctx, what, "not taking writes", attempt, err); err != nil {
			return repository.Server{}, err
		}
	}
}
