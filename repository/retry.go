package repository

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
			return err
		}
		limit := maxDeadlockAttempts
		if isLockWaitTimeout(err) {
			limit = maxLockWaitAttempts
		}
		if s.onRetry != nil {
			s.onRetry(attempt, err)
		}
		if attempt >= limit {
			return fmt.Errorf("gave up after %d attempts: %w", attempt, err)
		}
		backoff := time.Duration(rand.Int64N(int64(5*time.Millisecond) << attempt))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (retry abandoned: %w)", err, ctx.Err())
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

// WithRetryHook calls hook after every attempt of a write that lost a lock
// conflict (attempt counts from 1), before the Store decides whether to run
// it again. Tests use it to order events without sleeping.
func WithRetryHook(hook func(attempt int, err error)) Option {
	return func(s *Store) { s.onRetry = hook }
}
