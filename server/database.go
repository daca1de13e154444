package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// openDatabase opens the store (and migrates it), then runs prepare on it
// (the rest of start-up's database work: the simulator's schema, the
// catalog's seed), waiting up to DatabaseWait for a database that is down
// or not answering yet, as it is when clusterd and its database start
// together, or that goes away in the middle (a restart of the database
// while clusterd starts): an attempt that meets an unavailable database
// closes what it opened and is made again, bounded and logged with its
// error. A DSN that cannot be right, or any other error, fails at once.
func openDatabase(ctx context.Context, cfg Config, prepare func(context.Context, *repository.Store) error) (*repository.Store, error) {
	began := time.Now()
	deadline := began.Add(cfg.DatabaseWait)
	backoff := 500 * time.Millisecond
	for attempt := 1; ; attempt++ {
		left := time.Until(deadline)
		attemptCtx, cancel := context.WithTimeout(ctx, min(max(left, time.Second), 10*time.Second))
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
			if attempt > 1 {
				cfg.Logger.Info("database reachable", "attempts", attempt, "waited", time.Since(began).Round(time.Millisecond))
			}
			return store, nil
		case errors.Is(err, repository.ErrInvalidDSN):
			return nil, err
		case ctx.Err() != nil:
			return nil, fmt.Errorf("open database: %w", ctx.Err())
		case !time.Now().Before(deadline):
			return nil, fmt.Errorf("database not reachable after %s (%d attempts, --database-wait %s): %w",
				time.Since(began).Round(time.Millisecond), attempt, cfg.DatabaseWait, err)
		}
		pause := min(backoff, time.Until(deadline))
		cfg.Logger.Warn("database not reachable yet; waiting", "attempt", attempt, "error", err.Error(),
			"waited", time.Since(began).Round(time.Millisecond), "wait", cfg.DatabaseWait, "next_in", pause.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("open database: %w", ctx.Err())
		case <-time.After(pause):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
