package repository

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Fence is the fencing token of an infrastructure call (SPEC §6): the job
// making it, its attempt, and the cluster it acts on. A call is let through
// only while the job still holds the cluster: the cluster names it as its
// current operation, the job is IN_PROGRESS, and (when Attempt is set) the
// job is still at that attempt, so a server whose job another server adopted
// is refused (SPEC §5 step 4). Step and MachineID only go to the log.
type Fence struct {
	ClusterID string
	JobID     string
	Attempt   int32
	Step      string
	MachineID string
}

// ErrFenced: an infrastructure call was refused because its job no longer
// holds the cluster (recovery failed the job, another operation took the
// cluster). Nothing was written.
var ErrFenced = errors.New("job no longer holds the cluster")

// FencedError says why a call was refused.
type FencedError struct {
	Fence
	// Reason is what was found instead: the holder, or the job's status.
	Reason string
}

// Error names the call, the job and what was found.
func (e *FencedError) Error() string {
	return fmt.Sprintf("%s by job %s on cluster %s refused: %s", e.Step, e.JobID, e.ClusterID, e.Reason)
}

// Unwrap makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Unwrap() error { return ErrFenced }

// simCallRow is one row of the simulator's fencing log (migration 00004).
type simCallRow struct {
	ID          int64 `gorm:"primaryKey;autoIncrement"`
	Time        time.Time
	ClusterID   string
	JobID       string
	Step        string
	MachineID   string
	LastEventID int64
	Refused     bool
	Reason      string
	Attempt     int32
	// Server is the server process that made the call (WithServerID).
	Server string
}

func (simCallRow) TableName() string { return "sim_calls" }

// SimCall is one infrastructure call the simulator let through or refused.
type SimCall struct {
	ID          int64
	Time        time.Time
	Fence       Fence
	LastEventID int64
	Refused     bool
	Reason      string
	// Server is the server process that made the call.
	Server string
}

// Fenced runs fn, the writes of one infrastructure call, in one transaction
// that first checks, with the cluster's and the job's rows locked, that
// f.JobID (at f.Attempt) still holds f.ClusterID; if it does not, fn does not
// run, nothing is written but the log entry, and the error is a *FencedError
// (ErrFenced). Either way the call is logged (SimCalls) in the same
// transaction, with the id of the cluster's latest history entry.
//
// The locks order the call against everything that could take the cluster
// from the job: a recovery failing the job, another server adopting it,
// another operation's claim and the job's own end all lock the same rows
// (cluster, then job: the order every writer uses), so they happen wholly
// before the call (which is then refused) or after it (the change was made
// while the job held the cluster). fn gets a Store bound to the transaction;
// its writes are retried with the whole transaction (see retrying), so fn
// must be safe to run again.
func (s *Store) Fenced(ctx context.Context, f Fence, fn func(tx *Store) error) error {
	if f.ClusterID == "" || f.JobID == "" {
		return &FencedError{Fence: f, Reason: "the call names no job or no cluster"}
	}
	var refused *FencedError
	err := s.transaction(ctx, func(tx *gorm.DB) error {
		refused = nil
		reason, err := s.holds(tx, f)
		if err != nil {
			return err
		}
		var last int64
		if err := tx.Model(&eventRow{}).Where("cluster_id = ?", f.ClusterID).
			Select("COALESCE(MAX(id), 0)").Scan(&last).Error; err != nil {
			return fmt.Errorf("read history of cluster %s: %w", f.ClusterID, classify(err))
		}
		call := simCallRow{
			Time: s.stamp(), ClusterID: f.ClusterID, JobID: f.JobID, Step: f.Step, MachineID: f.MachineID,
			LastEventID: last, Refused: reason != "", Reason: reason, Attempt: f.Attempt, Server: s.server,
		}
		if reason != "" {
			refused = &FencedError{Fence: f, Reason: reason}
		} else {
			bound := *s
			bound.db, bound.rdb, bound.inTx = tx, tx, true
			if err := fn(&bound); err != nil {
				return err
			}
		}
		if err := tx.Create(&call).Error; err != nil {
			return fmt.Errorf("log call: %w", classify(err))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if refused != nil {
		return refused
	}
	return nil
}

// holds locks the cluster's and the job's rows (MySQL; SQLite transactions
// are serial already) and says why the job does not hold the cluster, or ""
// if it does.
func (s *Store) holds(tx *gorm.DB, f Fence) (string, error) {
	lock := func(db *gorm.DB) *gorm.DB {
		if s.backend == MySQL {
			return db.Clauses(clause.Locking{Strength: "UPDATE"})
		}
		return db
	}
	var c clusterRow
	err := lock(tx.Select("id", "current_operation")).Where("id = ?", f.ClusterID).Take(&c).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return "the cluster does not exist", nil
	}
	if err != nil {
		return "", fmt.Errorf("lock cluster %s: %w", f.ClusterID, classify(err))
	}
	var j jobRow
	err = lock(tx.Select("id", "status", "attempt", "server_id")).Where("id = ?", f.JobID).Take(&j).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return "the job does not exist", nil
	}
	if err != nil {
		return "", fmt.Errorf("lock job %s: %w", f.JobID, classify(err))
	}
	switch {
	case c.CurrentOperation == "":
		return "no operation holds the cluster", nil
	case c.CurrentOperation != f.JobID:
		return "the cluster is held by operation " + c.CurrentOperation, nil
	case j.Status != string(JobInProgress):
		return "the job is " + j.Status, nil
	case f.Attempt > 0 && j.Attempt != f.Attempt:
		return fmt.Sprintf("the job was adopted: attempt %d runs on server %s, not attempt %d", j.Attempt, j.ServerID, f.Attempt), nil
	}
	return "", nil
}

// PurgeSimCalls deletes up to limit entries of the simulator's fencing log
// made before cutoff, so the log, one row per infrastructure call, does not
// grow without end; the scanner passes the job retention, so an entry goes
// when the job it records may. They are found oldest first on the time's
// index: nothing is sorted, and nothing is read when none is old enough.
func (s *Store) PurgeSimCalls(ctx context.Context, cutoff time.Time, limit int) (int64, error) {
	var ids []int64
	err := s.rdb.WithContext(ctx).Model(&simCallRow{}).Where("time < ?", dbTime(cutoff)).
		Order("time").Limit(limit).Pluck("id", &ids).Error
	if err != nil {
		return 0, fmt.Errorf("find simulator calls to purge: %w", classify(err))
	}
	if len(ids) == 0 {
		return 0, nil
	}
	n, err := s.deleteWhere(ctx, &simCallRow{}, "id IN ?", ids)
	if err != nil {
		return 0, fmt.Errorf("purge simulator calls: %w", err)
	}
	return n, nil
}

// SimCalls lists the simulator's fencing log in order (all clusters when
// clusterID is empty), so a checker can compare it with the histories.
func (s *Store) SimCalls(ctx context.Context, clusterID string) ([]SimCall, error) {
	db := s.rdb.WithContext(ctx)
	if clusterID != "" {
		db = db.Where("cluster_id = ?", clusterID)
	}
	var rows []simCallRow
	if err := db.Order("id").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list simulator calls: %w", classify(err))
	}
	out := make([]SimCall, len(rows))
	for i, r := range rows {
		out[i] = SimCall{
			ID: r.ID, Time: r.Time.UTC(), LastEventID: r.LastEventID, Refused: r.Refused, Reason: r.Reason, Server: r.Server,
			Fence: Fence{ClusterID: r.ClusterID, JobID: r.JobID, Attempt: r.Attempt, Step: r.Step, MachineID: r.MachineID},
		}
	}
	return out, nil
}
