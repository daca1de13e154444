package repository

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
)

// errLockConflict marks a statement or transaction that InnoDB rolled back
// because it was chosen as a deadlock victim (1213, which Galera also returns
// at COMMIT for a certification failure) or waited too long for a lock
// (1205), or that SQLite failed with SQLITE_BUSY because another connection
// on the file held the write lock past the busy timeout (see isSQLiteBusy).
// Nothing it did was written, and nobody necessarily changed what it read:
// it lost no compare-and-set, only a lock. The Store runs it again (see
// retrying); only when every attempt fails does the caller see it, as
// ErrUnavailable (the database could not do the write just now; retry).
var errLockConflict = errors.New("lock conflict (deadlock or lock wait timeout)")

// Bounds of the retries of a lock conflict. A deadlock is detected at once,
// so it gets more attempts; a lock wait timeout has already waited
// innodb_lock_wait_timeout (5s unless the DSN says otherwise) each time, and
// SQLITE_BUSY SQLite's busy timeout (10s).
const (
	maxDeadlockAttempts = 5
	maxLockWaitAttempts = 3
)

// retrying runs op, which must be a whole transaction or a single statement
// outside one, again while it fails with a lock conflict, a bounded number
// of times, with a short jittered backoff. Inside a transaction (a Store
// bound to one, see Guarded) it runs op once: InnoDB rolls back the whole
// transaction on a deadlock, so only its outermost caller may run it again.
func (s *Store) retrying(ctx context.Context, op func() error) error {
	if s.inTx {
		return op()
	}
	for attempt := 1; ; attempt++ {
		err := op()
		if !errors.Is(err, errLockConflict) {
			if err != nil && attempt > 1 && ctx.Err() != nil {
				// The caller's deadline came while a write that had lost a
				// lock tried again (most often waiting for the lock anew):
				// given up for the lock as much as after the last attempt.
				s.conflicts.gaveUp.Add(1)
			}
			return err
		}
		limit := maxDeadlockAttempts
		if isLockWaitTimeout(err) {
			limit = maxLockWaitAttempts
		}
		s.conflicts.count(err)
		if s.onRetry != nil {
			s.onRetry(attempt, err)
		}
		if attempt >= limit {
			s.conflicts.gaveUp.Add(1)
			return fmt.Errorf("gave up after %d attempts: %w", attempt, err)
		}
		abandon := func() error {
			s.conflicts.gaveUp.Add(1)
			return fmt.Errorf("%w (retry abandoned: %w)", err, ctx.Err())
		}
		if ctx.Err() != nil {
			return abandon()
		}
		backoff := time.Duration(rand.Int64N(int64(5*time.Millisecond) << attempt))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return abandon()
		case <-t.C:
		}
	}
}

// transaction runs fn in one transaction, run again as a whole while it
// loses a lock conflict (see retrying). fn must be safe to run more than
// once: it must reset whatever it records outside the database. On a Store
// bound to a transaction (see Guarded) fn runs in that transaction as is: a
// savepoint would cost a statement and buy nothing, since an error rolls
// the whole transaction back.
func (s *Store) transaction(ctx context.Context, fn func(tx *gorm.DB) error) error {
	if s.inTx {
		return fn(s.db.WithContext(ctx))
	}
	return s.retrying(ctx, func() error {
		// Classified, so that a COMMIT that fails (Galera's certification
		// failure is a 1213 at COMMIT) is a lock conflict, run again, like
		// a deadlock inside the transaction.
		return classify(s.db.WithContext(ctx).Transaction(fn))
	})
}

// LockConflicts counts the lock conflicts a Store's writes met, so that
// operators see what contention costs: each is an attempt rolled back and
// run again, or the last attempt of a write given up. A Galera
// certification failure counts as a deadlock. A write that SQLite's group
// commit rolled back for another write's failure is not counted here
// (BatchStats.Undone counts it), only when it is given up.
type LockConflicts struct {
	// Deadlocks: MariaDB 1213 (a deadlock victim, or Galera's
	// certification failure at COMMIT).
	Deadlocks uint64
	// LockWaitTimeouts: MariaDB 1205, or SQLite busy past its busy timeout.
	LockWaitTimeouts uint64
	// Snapshots: SQLite's SQLITE_BUSY_SNAPSHOT (a deferred transaction's
	// write from a snapshot another connection committed over).
	Snapshots uint64
	// GaveUp: writes that failed after losing a lock conflict: every
	// attempt lost (ErrUnavailable), or their context ended before or
	// during the next. A write whose SQLite group commits were all rolled
	// back for others' failures counts here too.
	GaveUp uint64
}

// conflictCounts is LockConflicts as it is counted.
type conflictCounts struct {
	deadlocks, lockWaits, snapshots, gaveUp atomic.Uint64
}

// count counts err, a lock conflict, by its kind.
func (c *conflictCounts) count(err error) {
	switch {
	case errors.Is(err, errBatchLost):
		// Not a lock the database refused: BatchStats.Undone counts it.
	case isLockWaitTimeout(err):
		c.lockWaits.Add(1)
	case isSQLiteBusy(err):
		c.snapshots.Add(1)
	default:
		c.deadlocks.Add(1)
	}
}

// LockConflicts returns the lock conflicts this Store's writes met since
// it was opened (the clusterd_database_lock_conflicts_total counter).
func (s *Store) LockConflicts() LockConflicts {
	c := s.conflicts
	return LockConflicts{Deadlocks: c.deadlocks.Load(), LockWaitTimeouts: c.lockWaits.Load(), Snapshots: c.snapshots.Load(), GaveUp: c.gaveUp.Load()}
}

// WithRetryHook calls hook after every attempt of a write that lost a lock
// conflict (attempt counts from 1), before the Store decides whether to run
// it again. Tests use it to order events without sleeping.
func WithRetryHook(hook func(attempt int, err error)) Option {
	return func(s *Store) { s.onRetry = hook }
}
