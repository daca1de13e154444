package repository

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/clusterd/clusterd/lifecycle"
)

// The change feed (table cluster_changes, migration 00011) is what watches
// read: one row, written in the same transaction as the change itself, for
// every change a watcher must see. A cluster's history entry (create,
// transition, end, adoption, hand-off, repair: every casCluster, and
// RecordEvent) writes a ChangeHistory row carrying the cluster's state,
// version and current operation as written and the entry's id; a job's
// progress a ChangeProgress row and its end a ChangeJobEnded row, each
// carrying the job's step, steps and status as written. A row's time is the
// database's clock at insert (NOW(6); SQLite's strftime), never a server's.
//
// Ids are auto-increment, so they commit out of order: a transaction that
// took id 7 may commit after the one that took id 8, and Galera interleaves
// the ids of its nodes. A reader therefore never trusts "everything up to
// the last id I read": it keeps a floor below which it has read everything,
// and the ids above the floor it has already delivered (see service's
// resume tokens), and moves the floor only past rows older than
// SettleWindow, by which time every row with a smaller id has committed.

// Change kinds, the feed's kind column.
const (
	// ChangeHistory: a cluster's history entry was written (Change.Event).
	ChangeHistory = "HISTORY"
	// ChangeProgress: a running job recorded its step.
	ChangeProgress = "PROGRESS"
	// ChangeJobEnded: a job ended (succeeded, failed, cancelled).
	ChangeJobEnded = "JOB_ENDED"
)

// SettleWindow is the longest a transaction that writes the feed may run
// (from its feed insert to its commit, plus Galera's replication to the
// reader's node) and still be seen by every watcher: a row older than this
// is taken to have every row with a smaller id committed before it. Writes
// that take longer than this (clusterd's take milliseconds; MariaDB's
// innodb_lock_wait_timeout is 5 s here) may be missed by a watcher that
// already moved its floor past them.
const SettleWindow = 10 * time.Second

// Change is one row of the feed.
type Change struct {
	ID        int64
	ClusterID string
	Account   string
	// Operation is the job the change is of, if any: the job of a history
	// entry, or the job whose progress or end it is.
	Operation string
	Kind      string
	Time      time.Time
	// Settled: the row was older than the query's settle window when read
	// (the database's clock), so every row with a smaller id had committed.
	Settled bool
	// Brief: only ID and Settled were read (ReadChangeMarks).
	Brief bool
	// State, Version and CurrentOperation are the cluster's as the change
	// left it (ChangeHistory only; zero otherwise).
	State            lifecycle.State
	Version          int64
	CurrentOperation string
	// Event is the history entry of a ChangeHistory row.
	Event *Event
	// Step, StepsDone, StepsTotal and Status are the job's as the change
	// left it (ChangeProgress and ChangeJobEnded only).
	Step       string
	StepsDone  int32
	StepsTotal int32
	Status     JobStatus
}

// dbNow is the database's current time in the feed's time format.
func (s *Store) dbNow() string {
	if s.backend == MySQL {
		return "NOW(6)"
	}
	return "strftime('%Y-%m-%d %H:%M:%f', 'now')"
}

// dbCutoff is the SQL for the database's time d ago, and its argument.
func (s *Store) dbCutoff(d time.Duration) (string, any) {
	if s.backend == MySQL {
		return "NOW(6) - INTERVAL ? MICROSECOND", d.Microseconds()
	}
	return "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)", fmt.Sprintf("-%.6f seconds", d.Seconds())
}

// recordClusterChange appends the feed row of the history entry just
// inserted on tx (its id is the connection's last insert id): the cluster's
// row as tx wrote it, read in the same statement. Only call it right after
// the history entry's insert.
func (s *Store) recordClusterChange(tx *gorm.DB, clusterID, operation string) error {
	last := "last_insert_rowid()"
	if s.backend == MySQL {
		last = "LAST_INSERT_ID()"
	}
	_, err := execDirect(tx, "INSERT INTO cluster_changes (cluster_id, account, operation, kind, time, state, version, current_operation, event_id)"+
		" SELECT id, account, ?, ?, "+s.dbNow()+", state, version, current_operation, "+last+" FROM clusters WHERE id = ?",
		operation, ChangeHistory, clusterID)
	if err != nil {
		return fmt.Errorf("record change of cluster %s: %w", clusterID, classify(err))
	}
	return nil
}

// recordJobChanges appends a feed row of kind for each job of cond (a
// condition on jobs, aliased j, and its scalar arguments: a list is
// written out as placeholders) as tx wrote it. It reads
// only the jobs' rows, which the caller's write holds already, so it takes
// no lock a writer of progress did not take before.
func (s *Store) recordJobChanges(tx *gorm.DB, kind, cond string, args ...any) error {
	_, err := execDirect(tx, "INSERT INTO cluster_changes (cluster_id, account, operation, kind, time, step, steps_done, steps_total, status)"+
		" SELECT COALESCE(j.resource_id, ''), j.account, j.id, ?, "+s.dbNow()+", j.step, j.steps_done, j.steps_total, j.status"+
		" FROM jobs j WHERE "+cond, append([]any{kind}, args...)...)
	if err != nil {
		return fmt.Errorf("record %s change: %w", strings.ToLower(kind), classify(err))
	}
	return nil
}

// ChangeQuery selects rows of the feed, in id order.
type ChangeQuery struct {
	// After is the floor: only rows with a larger id are read.
	After int64
	// Account and ClusterID, when set, keep only that account's or that
	// cluster's rows.
	Account   string
	ClusterID string
	// Settle marks the rows older than it (Change.Settled); 0 means
	// SettleWindow.
	Settle time.Duration
	// Limit bounds the rows read; it must be positive.
	Limit int
}

// queryFeed runs SELECT cols FROM from WHERE f.id > q.After (and q's
// account and cluster) ORDER BY f.id LIMIT q.Limit, on the feed as f; cols
// may use {settled}: 1 for a row older than q's settle window, else 0.
func (s *Store) queryFeed(ctx context.Context, q ChangeQuery, cols, from string) (*sql.Rows, error) {
	if q.Limit <= 0 {
		return nil, fmt.Errorf("limit %d must be positive", q.Limit)
	}
	if q.Settle <= 0 {
		q.Settle = SettleWindow
	}
	cutoff, carg := s.dbCutoff(q.Settle)
	query := "SELECT " + strings.Replace(cols, "{settled}", "CASE WHEN f.time < "+cutoff+" THEN 1 ELSE 0 END", 1) +
		" FROM " + from + " WHERE f.id > ?"
	args := []any{carg, q.After}
	if q.Account != "" {
		query += " AND f.account = ?"
		args = append(args, q.Account)
	}
	if q.ClusterID != "" {
		query += " AND f.cluster_id = ?"
		args = append(args, q.ClusterID)
	}
	rows, err := s.readDB().QueryContext(ctx, query+" ORDER BY f.id LIMIT ?", append(args, q.Limit)...)
	if err != nil {
		return nil, classify(err)
	}
	return rows, nil
}

// ReadChanges reads up to q.Limit rows of the feed with an id above
// q.After, oldest id first, each with its history entry when it has one:
// one query.
func (s *Store) ReadChanges(ctx context.Context, q ChangeQuery) ([]Change, error) {
	rows, err := s.queryFeed(ctx, q, "f.id, f.cluster_id, f.account, f.operation, f.kind, f.time, {settled},"+
		" f.state, f.version, f.current_operation, f.step, f.steps_done, f.steps_total, f.status,"+
		" e.id, e.time, e.from_state, e.event, e.to_state, e.operation, e.server, e.message",
		"cluster_changes f LEFT JOIN cluster_events e ON e.id = f.event_id")
	if err != nil {
		return nil, fmt.Errorf("read changes after %d: %w", q.After, err)
	}
	defer rows.Close()
	out := []Change{}
	for rows.Next() {
		var (
			c              Change
			at, state, st  string
			settled        int
			evID           sql.NullInt64
			evTime         sql.NullString
			evFrom, evName sql.NullString
			evTo, evOp     sql.NullString
			evSrv, evMsg   sql.NullString
		)
		if err := rows.Scan(&c.ID, &c.ClusterID, &c.Account, &c.Operation, &c.Kind, &at, &settled,
			&state, &c.Version, &c.CurrentOperation, &c.Step, &c.StepsDone, &c.StepsTotal, &st,
			&evID, &evTime, &evFrom, &evName, &evTo, &evOp, &evSrv, &evMsg); err != nil {
			return nil, fmt.Errorf("read changes after %d: %w", q.After, classify(err))
		}
		c.Settled = settled == 1
		c.Status = JobStatus(st)
		c.Time = parseFeedTime(at)
		if state != "" {
			if c.State, err = lifecycle.ParseState(state); err != nil {
				return nil, fmt.Errorf("change %d: stored state: %w", c.ID, err)
			}
		}
		if evID.Valid {
			from, _ := lifecycle.ParseState(evFrom.String)
			to, _ := lifecycle.ParseState(evTo.String)
			c.Event = &Event{ID: evID.Int64, ClusterID: c.ClusterID, Time: parseFeedTime(evTime.String), From: from,
				Name: evName.String, To: to, Operation: evOp.String, Server: evSrv.String, Message: evMsg.String}
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read changes after %d: %w", q.After, classify(err))
	}
	return out, nil
}

// ReadChangeMarks reads up to q.Limit rows of the feed with an id above
// q.After, oldest id first, briefly (Change.Brief: their ID and Settled
// only): a reader that has read most of them already learns which are
// there and which have settled without reading them again.
func (s *Store) ReadChangeMarks(ctx context.Context, q ChangeQuery) ([]Change, error) {
	rows, err := s.queryFeed(ctx, q, "f.id, {settled}", "cluster_changes f")
	if err != nil {
		return nil, fmt.Errorf("read change marks after %d: %w", q.After, err)
	}
	defer rows.Close()
	out := []Change{}
	for rows.Next() {
		c := Change{Brief: true}
		var settled int
		if err := rows.Scan(&c.ID, &settled); err != nil {
			return nil, fmt.Errorf("read change marks after %d: %w", q.After, classify(err))
		}
		c.Settled = settled == 1
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read change marks after %d: %w", q.After, classify(err))
	}
	return out, nil
}

// parseFeedTime reads a time as the drivers return it as text: RFC 3339
// (MySQL's DATETIME, parsed by the driver and formatted by database/sql),
// SQLite's strftime, or SQLite's format of a Go time; the zero time if none.
func parseFeedTime(s string) time.Time {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999", "2006-01-02 15:04:05.999999999-07:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC()
		}
	}
	return time.Time{}
}

// ChangeHead is where a watch that starts now begins: every row up to
// Floor, and the rows Above it, are reflected in what a read made after
// ChangeHead returns.
type ChangeHead struct {
	Floor int64
	Above []int64
}

// maxHeadRows bounds the rows ChangeHead looks at.
const maxHeadRows = 1000

// ChangeHead reads the newest rows of the feed (at most 1000, by primary
// key) and returns the floor a new watch starts from: the newest settled
// row's id, and the unsettled ids above it. With more than 1000 rows within
// the settle window, the floor is below the oldest of them. An empty feed
// starts at the highest id purged.
func (s *Store) ChangeHead(ctx context.Context, settle time.Duration) (ChangeHead, error) {
	if settle <= 0 {
		settle = SettleWindow
	}
	cutoff, carg := s.dbCutoff(settle)
	rows, err := s.readDB().QueryContext(ctx, "SELECT id, CASE WHEN time < "+cutoff+" THEN 1 ELSE 0 END FROM cluster_changes ORDER BY id DESC LIMIT ?", carg, maxHeadRows)
	if err != nil {
		return ChangeHead{}, fmt.Errorf("read the feed's head: %w", classify(err))
	}
	defer rows.Close()
	var (
		head      ChangeHead
		unsettled []int64
		minID     int64
		found     bool
	)
	for rows.Next() {
		var id int64
		var settled int
		if err := rows.Scan(&id, &settled); err != nil {
			return ChangeHead{}, fmt.Errorf("read the feed's head: %w", classify(err))
		}
		minID = id
		if settled == 1 {
			head.Floor = max(head.Floor, id)
			found = true
		} else {
			unsettled = append(unsettled, id)
		}
	}
	if err := rows.Err(); err != nil {
		return ChangeHead{}, fmt.Errorf("read the feed's head: %w", classify(err))
	}
	if !found {
		if minID > 0 {
			head.Floor = minID - 1
		} else if head.Floor, err = s.ChangesPurgedThrough(ctx); err != nil {
			return ChangeHead{}, err
		}
	}
	for i := len(unsettled) - 1; i >= 0; i-- {
		if unsettled[i] > head.Floor {
			head.Above = append(head.Above, unsettled[i])
		}
	}
	return head, nil
}

// ChangesPurgedThrough is the highest id PurgeChanges has deleted (0 if
// none): a reader whose floor is below it may have missed purged rows.
func (s *Store) ChangesPurgedThrough(ctx context.Context) (int64, error) {
	var id sql.NullInt64
	err := s.readDB().QueryRowContext(ctx, "SELECT MAX(max_id) FROM cluster_changes_purged").Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("read the feed's purge mark: %w", classify(err))
	}
	return id.Int64, nil
}

// PurgeChanges deletes up to limit rows of the feed older than retention
// (by the database's clock), oldest first, and records the highest id it
// deleted (ChangesPurgedThrough), in one transaction. It returns how many
// rows it deleted.
func (s *Store) PurgeChanges(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	cutoff, carg := s.dbCutoff(retention)
	var ids []int64
	err := s.rdb.WithContext(ctx).Raw("SELECT id FROM cluster_changes WHERE time < "+cutoff+" ORDER BY time LIMIT ?", carg, limit).
		Scan(&ids).Error
	if err != nil {
		return 0, fmt.Errorf("find changes to purge: %w", classify(err))
	}
	if len(ids) == 0 {
		return 0, nil
	}
	top := ids[0]
	for _, id := range ids {
		top = max(top, id)
	}
	mark := "INSERT INTO cluster_changes_purged (id, max_id) VALUES (1, ?) ON CONFLICT(id) DO UPDATE SET max_id = MAX(max_id, excluded.max_id)"
	if s.backend == MySQL {
		mark = "INSERT INTO cluster_changes_purged (id, max_id) VALUES (1, ?) ON DUPLICATE KEY UPDATE max_id = GREATEST(max_id, VALUES(max_id))"
	}
	var n int64
	err = s.transaction(ctx, func(tx *gorm.DB) error {
		res := tx.Exec("DELETE FROM cluster_changes WHERE id IN ?", ids)
		if res.Error != nil {
			return classify(res.Error)
		}
		n = res.RowsAffected
		return classify(tx.Exec(mark, top).Error)
	})
	if err != nil {
		return 0, fmt.Errorf("purge changes: %w", err)
	}
	return n, nil
}

// ClustersByID reads the given clusters in one query (a watch's changes of
// one poll); missing ids are absent from the map.
func (s *Store) ClustersByID(ctx context.Context, ids []string) (map[string]Cluster, error) {
	out := map[string]Cluster{}
	if len(ids) == 0 {
		return out, nil
	}
	marks := strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ")
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	cs, err := s.readClusters(ctx, len(ids), "SELECT "+s.cols.cluster+" FROM clusters c WHERE c.id IN ("+marks+")", args...)
	if err != nil {
		return nil, fmt.Errorf("read %d clusters: %w", len(ids), classify(err))
	}
	for _, c := range cs {
		out[c.ID] = c
	}
	return out, nil
}
