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
// or cannot take writes yet: every attempt, the open's and the lease's, is
// bounded by one deadline, DatabaseWait after the first, and each retry is
// logged with its error and waits a backoff that doubles up to 5s.
type startupWait struct {
	log      *slog.Logger
	wait     time.Duration
	began    time.Time
	deadline time.Time
	backoff  time.Duration
}

func newStartupWait(cfg Config) *startupWait {
	began := time.Now()
	return &startupWait{log: cfg.Logger, wait: cfg.DatabaseWait, began: began, deadline: began.Add(cfg.DatabaseWait), backoff: 500 * time.Millisecond}
}

// retry waits before attempt+1 after attempt failed with err, or returns
// the error start-up fails with: ctx ended, or the deadline passed.
func (w *startupWait) retry(ctx context.Context, what string, attempt int, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", what, ctx.Err())
	case !time.Now().Before(w.deadline):
		return fmt.Errorf("%s: database not reachable after %s (%d attempts, --database-wait %s): %w",
			what, time.Since(w.began).Round(time.Millisecond), attempt, w.wait, err)
	}
	pause := min(w.backoff, time.Until(w.deadline))
	w.log.Warn("database not reachable yet; waiting", "doing", what, "attempt", attempt, "error", err.Error(),
		"waited", time.Since(w.began).Round(time.Millisecond), "wait", w.wait, "next_in", pause.Round(time.Millisecond))
	select {
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, ctx.Err())
	case <-time.After(pause):
	}
	w.backoff = min(2*w.backoff, 5*time.Second)
	return nil
}

// reached logs, after a retry, that what got through.
func (w *startupWait) reached(what string, attempts int) {
	if attempts > 1 {
		w.log.Info("database reachable", "doing", what, "attempts", attempts, "waited", time.Since(w.began).Round(time.Millisecond))
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
		attemptCtx, cancel := context.WithTimeout(ctx, min(max(time.Until(w.deadline), time.Second), 10*time.Second))
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
			w.reached(what, attempt)
			return store, nil
		case errors.Is(err, repository.ErrInvalidDSN):
			return nil, err
		}
		if err := w.retry(ctx, what, attempt, err); err != nil {
			return nil, err
		}
	}
}

// acquirer takes this process's server id (lease.Lease).
type acquirer interface {
	Acquire(ctx context.Context) (repository.Server, error)
}

// acquireLease takes this process's server id, waiting on w while the
// database answers but cannot take the registration's write: a Galera node
// that is back before it rejoins a primary component reads, and refuses
// writes, for some seconds. A live holder of the id, or any other error,
// fails at once. A registration that committed but whose answer was lost
// is found by the next attempt as a process of this host and pid that does
// not beat, and taken over once the lease's probe window has passed.
func acquireLease(ctx context.Context, l acquirer, w *startupWait) (repository.Server, error) {
	const what = "acquire the server lease"
	for attempt := 1; ; attempt++ {
		self, err := l.Acquire(ctx)
		if err == nil {
			w.reached(what, attempt)
			return self, nil
		}
		if !errors.Is(err, repository.ErrUnavailable) {
			return repository.Server{}, err
		}
		if err := w.retry(ctx, what, attempt, err); err != nil {
			return repository.Server{}, err
		}
	}
}
