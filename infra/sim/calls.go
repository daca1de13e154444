package sim

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/clusterd/clusterd/repository"
)

// The simulator's own tables (its fencing log, sim_calls), created by its
// own migrations through repository.Store.Migrate: clusterd's schema does
// not know them.
//
//go:embed migrations
var migrations embed.FS

// Call is one infrastructure call the simulator let through or refused: an
// entry of its fencing log.
type Call struct {
	ID    int64
	Time  time.Time
	Fence repository.Fence
	// LastEventID is the id of the cluster's latest history entry when the
	// call was made (read under the cluster's row lock for a call let
	// through), so a checker can replay the history up to it and see who
	// held the cluster.
	LastEventID int64
	Refused     bool
	// Reason is why a call was refused: the holder found, or the job's
	// status or attempt.
	Reason string
	// Server is the server process that made the call.
	Server string
}

// Migrate creates or updates the simulator's own tables. Open runs it; a
// process that only reads the log (Calls) of a database a simulator has
// used needs nothing.
func Migrate(ctx context.Context, store interface {
	Migrate(ctx context.Context, name string, dir fs.FS) error
}) error {
	dir, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("simulator schema: %w", err)
	}
	if err := store.Migrate(ctx, "sim", dir); err != nil {
		return fmt.Errorf("simulator schema: %w", err)
	}
	return nil
}

// logCall writes the call's log entry through db: inside the call's guarded
// transaction for a call let through, on its own for a refused one.
func (s *Simulator) logCall(ctx context.Context, db CallStore, f repository.Fence, refused string) error {
	last, err := db.LatestEventID(ctx, f.ClusterID)
	if err != nil {
		return err
	}
	_, err = db.Conn().ExecContext(ctx, "INSERT INTO sim_calls (time, cluster_id, job_id, step, machine_id, last_event_id, refused, reason, attempt, server)"+
		" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
		stamp(s.now()), f.ClusterID, f.JobID, f.Step, f.MachineID, last, refused != "", refused, f.Attempt, db.ServerID())
	if err != nil {
		return fmt.Errorf("log call: %w", err)
	}
	return nil
}

// CallStore is what the call log is written and read through: a
// repository.Store, bound to a guarded transaction or not.
type CallStore interface {
	Conn() repository.Conn
	LatestEventID(ctx context.Context, clusterID string) (int64, error)
	ServerID() string
}

// Calls lists the simulator's fencing log in order (all clusters when
// clusterID is empty), so a checker can compare it with the histories. db
// is any Store on the simulator's database.
func Calls(ctx context.Context, db CallStore, clusterID string) ([]Call, error) {
	q := "SELECT id, time, cluster_id, job_id, step, machine_id, last_event_id, refused, reason, attempt, server FROM sim_calls"
	var args []any
	if clusterID != "" {
		q += " WHERE cluster_id = ?"
		args = append(args, clusterID)
	}
	rows, err := db.Conn().QueryContext(ctx, q+" ORDER BY id", args...)
	if err != nil {
		return nil, fmt.Errorf("list simulator calls: %w", err)
	}
	defer rows.Close()
	out := []Call{}
	for rows.Next() {
		var c Call
		f := &c.Fence
		if err := rows.Scan(&c.ID, &c.Time, &f.ClusterID, &f.JobID, &f.Step, &f.MachineID, &c.LastEventID, &c.Refused, &c.Reason, &f.Attempt, &c.Server); err != nil {
			return nil, fmt.Errorf("list simulator calls: %w", err)
		}
		c.Time = c.Time.UTC()
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list simulator calls: %w", err)
	}
	return out, nil
}

// purgeCalls deletes up to limit entries of the log made before cutoff,
// found oldest first on the time's index: nothing is sorted, and nothing is
// read when none is old enough.
func purgeCalls(ctx context.Context, db CallStore, cutoff time.Time, limit int) (int64, error) {
	rows, err := db.Conn().QueryContext(ctx, "SELECT id FROM sim_calls WHERE time < ? ORDER BY time LIMIT ?", stamp(cutoff), limit)
	if err != nil {
		return 0, fmt.Errorf("find simulator calls to purge: %w", err)
	}
	var ids []any
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, fmt.Errorf("find simulator calls to purge: %w", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("find simulator calls to purge: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	res, err := db.Conn().ExecContext(ctx, "DELETE FROM sim_calls WHERE id IN (?"+strings.Repeat(", ?", len(ids)-1)+")", ids...)
	if err != nil {
		return 0, fmt.Errorf("purge simulator calls: %w", err)
	}
	return res.RowsAffected()
}

// stamp is a time as the log keeps it: UTC, at the microsecond precision
// MySQL keeps, so a bound compares as the values written do.
func stamp(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }
