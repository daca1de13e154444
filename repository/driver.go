package repository

import (
	"context"
	"database/sql"
	"fmt"
)

// Conn sends a driver's own statements: those of the bookkeeping tables it
// owns (see Migrate), which clusterd's models do not know. It is the
// database/sql subset both backends share; arguments are '?' placeholders.
type Conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Conn is the handle a driver's statements go through: on a Store bound to
// a transaction (the tx Guarded gives fn) the transaction, so the driver's
// bookkeeping commits, or is rolled back, with the guard's check; otherwise
// the pool, one statement per transaction. A driver's statements are not
// retried on their own: a lock conflict inside Guarded runs the whole
// transaction again, and outside it is the caller's error to return.
func (s *Store) Conn() Conn {
	return s.db.Statement.ConnPool
}

// ServerID is the server process the Store writes for (WithServerID), so a
// driver's log can name who made a change.
func (s *Store) ServerID() string { return s.server }

// LatestEventID is the id of cluster clusterID's latest history entry (0
// when it has none). Inside Guarded it is read under the cluster's row lock,
// so a driver that records it beside a change says exactly which history the
// change was made under: a checker replays the history up to it to see who
// held the cluster.
func (s *Store) LatestEventID(ctx context.Context, clusterID string) (int64, error) {
	var last int64
	if err := rowDirect(s.rdb.WithContext(ctx), "SELECT COALESCE(MAX(id), 0) FROM cluster_events WHERE cluster_id = ?", clusterID).
		Scan(&last); err != nil {
		return 0, fmt.Errorf("read history of cluster %s: %w", clusterID, classify(err))
	}
	return last, nil
}
